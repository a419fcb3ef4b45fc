//! Hostile metrics endpoints (issue 10, items 4 and 6): any local process can pose as an
//! engine. Two million tiny series, a huge label, a parse that must not stall the runtime,
//! and host names whose resolution hangs (a resolver seam, and the real binary under an
//! `LD_PRELOAD` shim whose `getaddrinfo` sleeps 10 s).

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wedgewatch::clock::SystemClock;
use wedgewatch::model::{Component, FetchOutcome, MetricsScrape, Payload, Role, Sample, Topology};
use wedgewatch::probes::ProbeSet;
use wedgewatch::sources::metrics::{MetricsConfig, MetricsSource};
use wedgewatch::sources::Source;
use wedgewatch::sys::http::{self, Limits};
use wedgewatch_testkit::timing::within;

/// The series the sglang maps read, put last so a cut on the others must not lose them.
const MAPPED_TAIL: &str = "sglang:num_running_reqs{tp_rank=\"0\"} 7\nsglang_num_queue_reqs 3\n";

/// `n` lines `a 1`, `b 1`, ... (4 bytes each), then [`MAPPED_TAIL`].
fn tiny_series(n: usize) -> Vec<u8> {
    let letters: Vec<u8> = (b'a'..=b'z').chain(b'A'..=b'Z').collect();
    let mut b = Vec::with_capacity(n * 4 + MAPPED_TAIL.len());
    for i in 0..n {
        b.extend_from_slice(&[letters[i % letters.len()], b' ', b'1', b'\n']);
    }
    b.extend_from_slice(MAPPED_TAIL.as_bytes());
    b
}

/// Answers every connection with `body` (HTTP/1.0, Content-Length) from a thread.
fn serve(body: Vec<u8>) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    let body: Arc<[u8]> = body.into();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            let body = Arc::clone(&body);
            std::thread::spawn(move || {
                let mut req = [0u8; 4096];
                let _ = s.read(&mut req);
                let head = format!("HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
                let _ = s.write_all(head.as_bytes());
                let _ = s.write_all(&body);
            });
        }
    });
    port
}

fn decode_at(port: u16) -> Topology {
    let mut c = Component::new("decode", Role::Decode, "sglang");
    c.metrics_url = Some(format!("http://127.0.0.1:{port}/metrics"));
    Topology {
        components: vec![c],
        ..Default::default()
    }
}

fn source() -> MetricsSource {
    let maps = ProbeSet::builtin().expect("probes").metric_maps;
    let cfg = MetricsConfig {
        extras: false,
        ..MetricsConfig::default()
    };
    MetricsSource::new(maps, cfg).expect("source")
}

fn only_scrape(s: &Sample) -> &MetricsScrape {
    match &s.payload {
        Payload::Metrics(v) if v.len() == 1 => &v[0],
        other => panic!("payload {other:?}"),
    }
}

fn reason(s: &Sample) -> String {
    s.status.reason.clone().unwrap_or_default()
}

#[test]
fn two_million_series_are_cut_and_mapped_series_at_the_end_still_read() {
    let body = tiny_series(2_000_000);
    assert!(body.len() < Limits::default().cap, "inside the body cap");
    let port = serve(body);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let s = rt.block_on(source().sample(&decode_at(port), &SystemClock));
    let m = only_scrape(&s);
    assert_eq!(m.mapped.get("running"), Some(&7.0), "{:?}", m.mapped);
    assert_eq!(m.mapped.get("queued"), Some(&3.0));
    assert!(m.series.len() <= 20_000, "{} series kept", m.series.len());
    let p = m.metrics.as_ref().expect("probe");
    assert_eq!(p.outcome, FetchOutcome::TooLarge, "{p:?}");
    let r = reason(&s);
    assert!(
        r.contains("series cut") && r.contains("2000002 series seen"),
        "{r}"
    );
}

#[test]
fn label_bytes_per_series_are_bounded() {
    let huge = "x".repeat(100 * 1024);
    let body = format!(
        "sglang:num_running_reqs{{tp_rank=\"0\",junk=\"{huge}\"}} 5\n\
         sglang:num_running_reqs{{tp_rank=\"1\"}} 2\n"
    );
    let port = serve(body.into_bytes());
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let s = rt.block_on(source().sample(&decode_at(port), &SystemClock));
    let m = only_scrape(&s);
    assert_eq!(
        m.mapped.get("running"),
        Some(&2.0),
        "the huge series is dropped"
    );
    assert!(m
        .series
        .iter()
        .all(|x| x.labels.values().all(|v| v.len() < 4096)));
    let r = reason(&s);
    assert!(r.contains("4096-byte label limit"), "{r}");
}

/// One worker thread only: a parse on it would stop the ticker for the whole parse (seconds
/// in a debug build).
#[test]
fn a_huge_parse_leaves_the_runtime_responsive() {
    let port = serve(tiny_series(2_000_000));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (gap, took) = rt.block_on(async {
        let done = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&done);
        let ticker = tokio::spawn(async move {
            let mut worst = Duration::ZERO;
            let mut last = Instant::now();
            while !flag.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(5)).await;
                worst = worst.max(last.elapsed());
                last = Instant::now();
            }
            worst
        });
        let src = source();
        let topo = decode_at(port);
        let start = Instant::now();
        let s = src.sample(&topo, &SystemClock).await;
        let took = start.elapsed();
        done.store(true, Ordering::SeqCst);
        assert_eq!(only_scrape(&s).mapped.get("running"), Some(&7.0));
        (ticker.await.expect("ticker"), took)
    });
    eprintln!("scrape + parse took {took:?}; worst tick gap {gap:?}");
    // A debug build parses the 2M lines in seconds; on the worker it would stall the ticker
    // for most of the scrape. Half the scrape (at least a second) leaves room for a loaded
    // host's scheduling, which stretches the scrape too.
    let bound = (took / 2).max(Duration::from_secs(1));
    assert!(gap < bound, "runtime stalled {gap:?} of a {took:?} scrape");
}

fn hangs(_: &str) -> std::io::Result<Vec<std::net::SocketAddr>> {
    std::thread::sleep(Duration::from_secs(10));
    Err(std::io::Error::other("too late"))
}

/// Through the resolver seam: the lookup costs the connect timeout, and the runtime's exit
/// does not wait for the abandoned lookup.
#[test]
fn a_hanging_resolver_costs_the_connect_timeout_not_the_exit() {
    let start = Instant::now();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let lim = Limits {
        connect: Duration::from_millis(300),
        total: Duration::from_millis(1000),
        cap: 4096,
    };
    let r = rt.block_on(http::get_via("http://slow.invalid:9/metrics", lim, hangs));
    assert_eq!(r.outcome, FetchOutcome::Error, "{r:?}");
    let d = r.detail.unwrap_or_default();
    assert!(d.contains("no answer within 300 ms"), "{d}");
    // The lookup hangs 10 s, longer than the bounds.
    assert!(r.elapsed < within(lim.connect), "{:?}", r.elapsed);
    drop(rt);
    assert!(
        start.elapsed() < within(lim.connect),
        "{:?}",
        start.elapsed()
    );
}

/// `wedgewatch snapshot --window 1 --url <name>` on an empty procfs root (only the URL is a
/// target); returns its wall time and stdout.
fn snapshot_with_url(url: &str, env: &[(&str, &Path)]) -> (Duration, String) {
    let root = tempfile::tempdir().expect("empty proc root");
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_wedgewatch"))
        .args([
            "snapshot",
            "--no-daemon",
            "--json",
            "--window",
            "1",
            "--url",
            url,
        ])
        .arg("--proc-root")
        .arg(root.path())
        .envs(env.iter().map(|(k, v)| (*k, *v)))
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .expect("run wedgewatch");
    (
        start.elapsed(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

const SHIM: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
typedef int (*gai_t)(const char *, const char *, const struct addrinfo *, struct addrinfo **);
int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
                struct addrinfo **res) {
    if (node && strstr(node, ".hang.invalid")) {
        const char *mark = getenv("WW_SHIM_MARK");
        if (mark) { int fd = open(mark, O_WRONLY | O_CREAT, 0600); if (fd >= 0) close(fd); }
        sleep(10);
        return EAI_AGAIN;
    }
    gai_t real = (gai_t)dlsym(RTLD_NEXT, "getaddrinfo");
    return real(node, service, hints, res);
}
"#;

/// The real binary, a name whose resolution hangs 10 s (`getaddrinfo` replaced by an
/// `LD_PRELOAD` shim): the snapshot still ends within its window + 2 s.
#[test]
fn snapshot_with_a_hanging_hostname_ends_within_window_plus_2s() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (c, so, mark) = (
        dir.path().join("shim.c"),
        dir.path().join("shim.so"),
        dir.path().join("called"),
    );
    std::fs::write(&c, SHIM).expect("write shim");
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(&c)
        .arg("-ldl")
        .status();
    if !built.is_ok_and(|s| s.success()) {
        eprintln!("SKIPPED: no C compiler to build the getaddrinfo shim");
        return;
    }
    let env = [
        ("LD_PRELOAD", so.as_path()),
        ("WW_SHIM_MARK", mark.as_path()),
    ];
    let (took, json) = snapshot_with_url("http://metrics.hang.invalid:9/metrics", &env);
    eprintln!("hanging name: snapshot took {took:?}");
    assert!(
        mark.exists(),
        "the shim was not called: the test proves nothing"
    );
    // The window (1 s) + 2 s, plus slack: still under the shim's 10 s.
    assert!(took < within(Duration::from_secs(3)), "took {took:?}");
    assert!(json.contains("resolve metrics.hang.invalid:9"), "{json}");
}

/// The same with a name that does not exist (how long the resolver takes to say so depends on
/// the host's DNS; the bound holds either way).
#[test]
fn snapshot_with_a_nonexistent_hostname_ends_within_window_plus_2s() {
    let (took, json) = snapshot_with_url("http://nonexistent.invalid:9/metrics", &[]);
    eprintln!("nonexistent name: snapshot took {took:?}");
    assert!(took < within(Duration::from_secs(3)), "took {took:?}");
    assert!(json.contains("nonexistent.invalid"), "{json}");
}

/// `--max-series` sets the cut of the real binary's scrapes, and the status says so.
#[test]
fn max_series_flag_sets_the_cut() {
    let port = serve(tiny_series(5_000));
    let root = tempfile::tempdir().expect("empty proc root");
    let out = Command::new(env!("CARGO_BIN_EXE_wedgewatch"))
        .args(["snapshot", "--json", "--no-daemon", "--window", "1"])
        .args(["--max-series", "100", "--url"])
        .arg(format!("http://127.0.0.1:{port}/metrics"))
        .arg("--proc-root")
        .arg(root.path())
        .stdin(Stdio::null())
        .output()
        .expect("run");
    let json = String::from_utf8_lossy(&out.stdout);
    assert!(
        json.contains("series cut"),
        "{json}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bad = Command::new(env!("CARGO_BIN_EXE_wedgewatch"))
        .args(["snapshot", "--json", "--max-series", "0"])
        .output()
        .expect("run");
    assert_eq!(bad.status.code(), Some(2));
}
