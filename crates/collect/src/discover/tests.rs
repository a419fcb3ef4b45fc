//! Unit tests of discovery's pure parts: flags, addresses, scrape addresses, worker lists.

use super::endpoints::{connect_host, endpoint_of, hosts_equivalent, worker_urls_from_json};
use super::*;
use std::net::SocketAddr;

fn v(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_string).collect()
}

#[test]
fn flags_parse_like_argparse() {
    let a = v("timeout 60 python -m sglang_router.launch_router --host 127.0.0.1 --port=30000 --pd-disaggregation --prefill http://127.0.0.1:31011 38998 --prefill http://127.0.0.1:31013 --decode http://127.0.0.1:31012 --disaggregation_mode decode");
    assert_eq!(flag_value(&a, "--host").as_deref(), Some("127.0.0.1"));
    assert_eq!(flag_value(&a, "--port").as_deref(), Some("30000"));
    assert_eq!(
        flag_value(&a, "--disaggregation-mode").as_deref(),
        Some("decode")
    );
    let p = flag_values(&a, "--prefill");
    assert_eq!(
        p,
        vec![
            v("http://127.0.0.1:31011 38998"),
            v("http://127.0.0.1:31013")
        ]
    );
    assert_eq!(
        flag_values(&a, "--decode"),
        vec![v("http://127.0.0.1:31012")]
    );
    assert!(flag_value(&a, "--nope").is_none());
}

#[test]
fn urls_and_hosts() {
    assert_eq!(
        endpoint_of("http://u:p@127.0.0.1:31012/x"),
        Some(("127.0.0.1".into(), 31012))
    );
    assert_eq!(endpoint_of("http://[::1]:8000"), Some(("::1".into(), 8000)));
    assert_eq!(endpoint_of("127.0.0.1:8000"), None);
    assert!(hosts_equivalent("0.0.0.0", "127.0.0.1"));
    assert!(hosts_equivalent("localhost", "127.0.0.1"));
    assert!(!hosts_equivalent("10.0.0.1", "10.0.0.2"));
    assert_eq!(connect_host("0.0.0.0"), "127.0.0.1");
    assert!(loopback_get("10.1.2.3", 80, "/", Duration::from_millis(10)).is_err());
}

#[test]
fn scrape_addresses_are_own_listening_sockets() {
    let sa = |s: &str| s.parse::<SocketAddr>().unwrap();
    let wild = [sa("0.0.0.0:30000")];
    assert_eq!(
        scrape_addr("10.1.2.3", 30000, &wild).as_deref(),
        Ok("127.0.0.1:30000")
    );
    let own = [sa("127.0.0.1:29000"), sa("10.9.9.9:30000")];
    assert_eq!(
        scrape_addr("10.9.9.9", 30000, &own).as_deref(),
        Ok("10.9.9.9:30000")
    );
    assert_eq!(
        scrape_addr("127.0.0.1", 29000, &own).as_deref(),
        Ok("127.0.0.1:29000")
    );
    let remote = scrape_addr("10.1.2.3", 31000, &own).unwrap_err();
    assert!(remote.contains("not on this host"), "{remote}");
    let squatted = scrape_addr("127.0.0.1", 31000, &own).unwrap_err();
    assert!(
        squatted.contains("not one of its listening sockets"),
        "{squatted}"
    );
    assert!(scrape_addr("localhost", 31000, &[]).is_err());
    let v6 = [sa("[::]:8000")];
    assert_eq!(scrape_addr("::", 8000, &v6).as_deref(), Ok("[::1]:8000"));
}

#[test]
fn workers_json_shapes() {
    assert_eq!(
        worker_urls_from_json(r#"{"workers":[{"url":"http://a:1"},{"url":"http://b:2"}]}"#),
        vec!["http://a:1", "http://b:2"]
    );
    assert_eq!(
        worker_urls_from_json(r#"[{"url":"http://a:1"}]"#),
        vec!["http://a:1"]
    );
    assert!(worker_urls_from_json("garbage").is_empty());
}

/// An engine started without `--port` that does not listen on the default: its serving port
/// is a socket of its own, never its PD bootstrap port (a channel: taken for the serving
/// port, every request would be hidden).
#[test]
fn the_fallback_serving_port_is_never_a_channel() {
    let probes = crate::probes::ProbeSet::builtin().expect("built-in probes");
    let prof = probes
        .profiles
        .iter()
        .find(|p| p.name == "sglang-engine")
        .expect("sglang-engine profile");
    let args = v("python -m sglang.launch_server --disaggregation-bootstrap-port 8998");
    let sockets: Vec<SocketAddr> = vec![
        "127.0.0.1:8998".parse().expect("addr"),
        "127.0.0.1:31000".parse().expect("addr"),
    ];
    assert_eq!(build::default_port(prof, &args, &sockets), Some(31000));
    let none: Vec<String> = Vec::new();
    assert_eq!(build::default_port(prof, &none, &sockets), Some(8998));
}
