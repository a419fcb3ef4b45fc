//! One look, no history (issue 11, item 4): a single `wedgewatch snapshot` (3 s window, no
//! daemon, production thresholds) on the lab names a proxy that holds its upstream sockets in
//! CLOSE_WAIT, from the kernel's per-socket clocks alone; and stays quiet on a healthy lab
//! under normal traffic.
//!
//! The fault is the lab proxy's `LAB_PROXY_LEAK=close_wait` (`tests/lab/proxy.py`): it asks
//! the router to close after each response and keeps a duplicate fd of the socket, so the
//! router hangs up and the proxy never does; after `LAB_PROXY_LEAK_LIMIT` requests its pool
//! is dry and it stops forwarding, and a restart unfreezes it. Discovery sees every stack on
//! the machine (other tests' labs too), so assertions are about this lab's components only.

use wedgewatch_testkit::lab;

use std::process::Stdio;
use std::time::{Duration, Instant};

use lab::{Lab, LabOptions};
use serde_json::Value;

/// `wedgewatch snapshot --json --no-daemon --window 3`, production thresholds, bounded.
fn one_look(lab: &Lab) -> Value {
    let mut c = crate::common::ww(lab);
    c.args(["snapshot", "--json", "--no-daemon", "--window", "3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = c.spawn().expect("spawn wedgewatch");
    // The verb bounds itself (window + 2 s); the test's own bound is generous on a busy box.
    let started = Instant::now();
    let out = child.wait_with_output().expect("wait wedgewatch");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "snapshot took {:?}",
        started.elapsed()
    );
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "snapshot failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let name = std::thread::current()
        .name()
        .unwrap_or("oneshot")
        .replace("::", "-");
    let _ = std::fs::write(
        std::env::temp_dir().join(format!("ww-oneshot-{name}.json")),
        &stdout,
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("snapshot is not JSON ({e})"))
}

fn comp_id(snap: &Value, pid: u32) -> String {
    snap["components"]
        .as_array()
        .expect("components")
        .iter()
        .find(|c| c["main_pid"].as_u64() == Some(u64::from(pid)))
        .and_then(|c| c["id"].as_str())
        .unwrap_or_else(|| panic!("no component with main pid {pid} in the snapshot"))
        .to_string()
}

/// This lab's findings (by its components' main pids).
fn lab_findings<'a>(snap: &'a Value, lab: &Lab) -> Vec<&'a Value> {
    let ids: Vec<String> = lab
        .info
        .components
        .values()
        .filter_map(|c| {
            snap["components"]
                .as_array()?
                .iter()
                .find(|s| s["main_pid"].as_u64() == Some(u64::from(c.pid)))
                .and_then(|s| s["id"].as_str())
                .map(str::to_string)
        })
        .collect();
    snap["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| {
            f["component"]
                .as_str()
                .is_some_and(|c| ids.iter().any(|i| i == c))
        })
        .collect()
}

fn summaries(fs: &[&Value]) -> String {
    fs.iter()
        .map(|f| format!("  {} {}: {}", f["kind"], f["component"], f["summary"]))
        .collect::<Vec<_>>()
        .join("\n")
}

fn evidence_lines(f: &Value) -> Vec<String> {
    f["evidence"]
        .as_array()
        .map(|es| {
            es.iter()
                .map(|e| format!("{}: {}", e["source"], e["detail"].as_str().unwrap_or("")))
                .collect()
        })
        .unwrap_or_default()
}

/// The proxy's own count of leaked connections (`GET /lab/proxy_status`).
fn proxy_status(lab: &Lab) -> Value {
    let url = format!("{}/lab/proxy_status", lab.proxy().url);
    let (st, body) = lab::http_get(&url, Duration::from_secs(3)).expect("proxy status");
    assert_eq!(st, 200, "{body}");
    serde_json::from_str(&body).expect("proxy status JSON")
}

/// Held CLOSE_WAIT: 24 upstream sockets silent past 30 s are named in one look, with each
/// socket's silence; a restart of the proxy frees them and it forwards again.
#[test]
fn one_snapshot_names_the_proxy_holding_close_wait_sockets() {
    const LEAKS: u64 = 24;
    let mut lab = Lab::up(
        &LabOptions::pd()
            .proxy_env("LAB_PROXY_LEAK", "close_wait")
            .proxy_env("LAB_PROXY_LEAK_LIMIT", &LEAKS.to_string()),
    )
    .expect("lab up");
    // 8 agents: 3 rounds pass (24 requests, each leaves a socket), the 4th hangs at the proxy.
    let load = lab.load_background(8, 4, 120.0).expect("harness");
    let started = Instant::now();
    let status = loop {
        let s = proxy_status(&lab);
        if s["leaked"].as_u64() == Some(LEAKS) && s["waiting"].as_u64() >= Some(1) {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the proxy did not leak {LEAKS} connections: {s}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(status["close_wait"], true, "{status}");
    // Past the production silence threshold (30 s) with a margin for a slow socket sample.
    std::thread::sleep(Duration::from_secs(33));

    let snap = one_look(&lab);
    let proxy = comp_id(&snap, lab.proxy().pid);
    let router = comp_id(&snap, lab.router().pid);
    let mine = lab_findings(&snap, &lab);
    let f = mine
        .iter()
        .find(|f| f["kind"] == "accumulating_state" && f["component"] == proxy.as_str())
        .unwrap_or_else(|| {
            panic!(
                "no accumulating_state on the proxy; this lab's findings:\n{}",
                summaries(&mine)
            )
        });
    assert_eq!(f["role"], "proxy");
    assert_eq!(f["severity"], "warning");
    let summary = f["summary"].as_str().expect("summary");
    assert!(
        summary.contains(&format!(
            "holds {LEAKS} sockets in CLOSE_WAIT ({LEAKS} to {router})"
        )),
        "{summary}"
    );
    let ev = evidence_lines(f);
    let all = ev.join("\n");
    assert!(all.contains("one look, no history needed"), "{all}");
    // Each listed socket: its 4-tuple to the router, its silence from tcp_info, the fd holder.
    let router_port = lab.router().port;
    let per_socket: Vec<&String> = ev
        .iter()
        .filter(|l| {
            l.contains(&format!(
                "-> 127.0.0.1:{router_port} (to {router}): CLOSE_WAIT"
            ))
        })
        .collect();
    assert_eq!(per_socket.len(), 8, "{all}");
    for l in &per_socket {
        assert!(
            l.contains(", silent ")
                && l.contains("last byte in ")
                && l.contains(&format!("fd held by pid {}", lab.proxy().pid)),
            "{l}"
        );
        // Silent at least the threshold: "silent 3x s".
        let secs: f64 = l
            .split(", silent ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no silence in {l}"));
        assert!(secs >= 30.0, "{l}");
    }
    assert!(
        all.contains(&format!(
            "fds held against peers that are gone: {LEAKS} of {LEAKS}"
        )),
        "{all}"
    );
    // The one-look path, not the 5-minute growth one, fired (the window was 3 s).
    assert!(!summary.contains("grew from"), "{summary}");
    // Nothing else in the lab is said to accumulate.
    assert!(
        !mine
            .iter()
            .any(|f| f["kind"] == "accumulating_state" && f["component"] != proxy.as_str()),
        "{}",
        summaries(&mine)
    );

    // The incident's "a restart unfreezes it": the old sockets go with the old process.
    drop(load);
    lab.restart("proxy", &[]).expect("restart proxy");
    assert_eq!(proxy_status(&lab)["leaked"], 0);
    let report = lab.load(2, 2, 10.0).expect("load after restart");
    assert_eq!(report["summary"]["all_completed"], true, "{report}");
}

/// Healthy lab under normal traffic: CLOSE_WAIT comes and goes within milliseconds, so one
/// look finds nothing accumulating.
#[test]
fn one_snapshot_of_a_healthy_lab_under_load_has_no_accumulating_state() {
    let lab = Lab::up(&LabOptions::pd()).expect("lab up");
    let load = lab.load_background(4, 40, 20.0).expect("harness");
    std::thread::sleep(Duration::from_secs(3));
    let snap = one_look(&lab);
    drop(load);
    let mine = lab_findings(&snap, &lab);
    assert!(
        !mine.iter().any(|f| f["kind"] == "accumulating_state"),
        "false positive on a healthy lab:\n{}",
        summaries(&mine)
    );
    // The traffic was there and seen.
    let proxy = comp_id(&snap, lab.proxy().pid);
    let seen = snap["requests"]
        .as_array()
        .expect("requests")
        .iter()
        .filter(|r| r["component"] == proxy.as_str())
        .count();
    assert!(seen >= 4, "only {seen} requests seen at the proxy");
}
