//! `wedgewatch fleet snapshot` (issue 14): every node at once through a `--via` template,
//! a per-node timeout that kills the transport, failed nodes named with their reason while
//! the rest still merges; and the real binary as a node's command on the lab.

use wedgewatch_testkit::fleet;

use fleet::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn fake_node() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fleet/fake-node.sh")
}

fn fleet(dir: &Path, nodes: &str, extra: &[&str]) -> (Output, Duration) {
    let started = Instant::now();
    let via = format!("{} {{node}}", fake_node().display());
    let out = Command::new(env!("CARGO_BIN_EXE_wedgewatch"))
        .args(["fleet", "snapshot", "--nodes", nodes, "--via", &via])
        .args(extra)
        .env("FAKE_FLEET_DIR", dir)
        .output()
        .expect("run wedgewatch");
    (out, started.elapsed())
}

fn pid_alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "))
}

#[test]
fn nodes_are_collected_at_once_and_failures_are_named_while_the_rest_merges() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("nodea.json"), node_a(2).to_string()).unwrap();
    std::fs::write(
        d.path().join("nodeb.json"),
        node_b(2, 3_000, "waiting_first_byte", A_IP).to_string(),
    )
    .unwrap();
    let nodes = "nodea,nodeb,slow-1,fail-1,junk-1";
    let (out, took) = fleet(d.path(), nodes, &["--timeout", "3s", "--json"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // at once: one timeout, not one per node in turn
    assert!(took < Duration::from_secs(15), "took {took:?}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("merged JSON");
    let names: Vec<&str> = v["fleet"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["name"].as_str())
        .collect();
    assert_eq!(names, ["nodea", "nodeb"]);
    let failed: Vec<(String, String)> = v["fleet"]["failed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["name"].as_str().unwrap().to_string(),
                f["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let reason = |n: &str| {
        failed
            .iter()
            .find(|f| f.0 == n)
            .map(|f| f.1.clone())
            .unwrap_or_default()
    };
    assert!(
        reason("slow-1").contains("no answer within 3 s"),
        "{failed:?}"
    );
    assert!(
        reason("fail-1").contains("exit status 5")
            && reason("fail-1").contains("Connection refused"),
        "{failed:?}"
    );
    assert!(reason("junk-1").starts_with("not a snapshot"), "{failed:?}");
    for n in ["slow-1", "fail-1", "junk-1"] {
        assert!(err.contains(&format!("node {n} left out")), "{err}");
    }
    // the merge itself: the wedge at decode on node B
    assert_eq!(v["findings"][0]["kind"], "wedged_request");
    assert_eq!(v["findings"][0]["component"], format!("nodeb/{DECODE}"));
    // what we spawned is gone: the hanging transport was killed
    let pid: i32 = std::fs::read_to_string(d.path().join("slow-1.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        !pid_alive(pid),
        "the slow node's transport {pid} still runs"
    );
}

#[test]
fn collector_times_bound_the_skew_when_no_connection_is_joined() {
    let d = tempfile::tempdir().unwrap();
    // two nodes that share no connection: only the collector's clock can align them
    let mut a = node_a(1);
    a["connections"] = serde_json::json!([]);
    a["node"]["clock"]["wall_ms"] = serde_json::json!(now_ms());
    let mut b = node_b(1, 0, "waiting_first_byte", A_IP);
    b["node"]["clock"]["wall_ms"] = serde_json::json!(now_ms() + 60_000);
    std::fs::write(d.path().join("nodea.json"), a.to_string()).unwrap();
    std::fs::write(d.path().join("nodeb.json"), b.to_string()).unwrap();
    let (out, _) = fleet(d.path(), "nodea,nodeb", &["--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let nb = &v["fleet"]["nodes"][1];
    let skew = nb["skew_ms"].as_i64().expect("a skew");
    let err = nb["skew_error_ms"].as_i64().unwrap();
    assert!((skew - 60_000).abs() <= err + 100 && err < 5_000, "{nb}");
    assert!(nb["skew_basis"].as_str().unwrap().contains("collector"));
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[test]
fn usage_errors_exit_2_and_no_node_answering_exits_3() {
    let d = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_wedgewatch"))
            .args(["fleet", "snapshot"])
            .args(args)
            .env("FAKE_FLEET_DIR", d.path())
            .output()
            .unwrap()
    };
    let out = run(&["--nodes", "a", "--via", "ssh host"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not contain {node}"));
    let out = run(&["--nodes", "a;reboot", "--via", "ssh {node}"]);
    assert_eq!(out.status.code(), Some(2));
    let via = format!("{} {{node}}", fake_node().display());
    let out = run(&["--nodes", "fail-1,fail-2", "--via", &via, "--json"]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("no node answered"));
}

/// Issue 34 item 9: a node answering with another node's identity, or with a merged
/// snapshot, is left out and named; the others still merge (exit 0, not 2).
#[test]
fn a_node_answering_as_another_or_with_a_merged_snapshot_is_left_out_and_named() {
    let d = tempfile::tempdir().unwrap();
    let a = node_a(2);
    std::fs::write(d.path().join("nodea.json"), a.to_string()).unwrap();
    let b = node_b(2, 3_000, "waiting_first_byte", A_IP);
    std::fs::write(d.path().join("nodeb.json"), b.to_string()).unwrap();
    // imp-1 answers with node A's snapshot, identity and all (listed before node A)
    std::fs::write(d.path().join("imp-1.json"), a.to_string()).unwrap();
    let mut merged = b.clone();
    merged.as_object_mut().unwrap().remove("node");
    merged["fleet"] = serde_json::json!({"nodes": [
        {"name": "x", "source": "x.json", "taken_at": rfc(T0)},
        {"name": "y", "source": "y.json", "taken_at": rfc(T0)}]});
    std::fs::write(d.path().join("merged-1.json"), merged.to_string()).unwrap();
    let (out, _) = fleet(d.path(), "imp-1,nodea,nodeb,merged-1", &["--json"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("merged JSON");
    let names: Vec<&str> = v["fleet"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["name"].as_str())
        .collect();
    assert_eq!(names, ["nodea", "nodeb"], "the impostor is not merged");
    let reason = |n: &str| {
        v["fleet"]["failed"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == n)
            .and_then(|f| f["reason"].as_str())
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        reason("imp-1").contains("answered as node \"nodea\""),
        "{}",
        v["fleet"]["failed"]
    );
    assert!(
        reason("merged-1").contains("merged snapshot (of 2 nodes)"),
        "{}",
        v["fleet"]["failed"]
    );
    for n in ["imp-1", "merged-1"] {
        assert!(err.contains(&format!("node {n} left out: ")), "{err}");
    }
    assert_eq!(v["findings"][0]["component"], format!("nodeb/{DECODE}"));
}

/// Issue 34 item 13: a node name that would be an option (`-F...`) or a path's `.`/`..`
/// is refused on one line with exit 2, before any transport runs.
#[test]
fn node_names_that_are_options_or_dot_dirs_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let mark = d.path().join("ran");
    let via = format!("sh -c 'touch {}' {{node}}", mark.display());
    for nodes in ["a,-Fevil", "-oProxyCommand", ".", "a,..", "..,b"] {
        let out = Command::new(env!("CARGO_BIN_EXE_wedgewatch"))
            .args(["fleet", "snapshot", "--via", &via, "--json"])
            .arg(format!("--nodes={nodes}"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{nodes}: {err}");
        assert_eq!(err.lines().count(), 1, "{nodes}: one line: {err}");
        assert!(err.contains("node name"), "{nodes}: {err}");
        assert!(out.stdout.is_empty(), "{nodes}");
        assert!(!mark.exists(), "{nodes}: a transport ran");
    }
}

/// Issue 34 item 17: what a transport started in a session of its own (`setsid`, out of
/// the transport's process group), as its child or orphaned at once, is killed with it on
/// timeout, and does not outlive `fleet snapshot` when the transport answered and exited.
#[test]
fn nothing_a_transport_started_survives_even_in_a_session_of_its_own() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("nodea.json"), node_a(2).to_string()).unwrap();
    std::fs::write(d.path().join("leave-1.json"), node_a(2).to_string()).unwrap();
    let (out, took) = fleet(d.path(), "setsid-1,leave-1", &["--timeout", "3s", "--json"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(took < Duration::from_secs(20), "took {took:?}");
    assert!(
        err.contains("node setsid-1 left out: no answer within 3 s"),
        "{err}"
    );
    assert_none_survive(
        d.path(),
        &[
            "setsid-1.pid",
            "setsid-1.child",
            "setsid-1.orphan",
            "leave-1.child",
            "leave-1.orphan",
        ],
    );
}

/// The processes whose pids the fake node wrote in `files` (under `dir`) are all gone
/// (SIGKILL is sent before wedgewatch exits: the kernel gets a moment to finish each off);
/// any left is killed before the test fails (not ours to leave behind).
fn assert_none_survive(dir: &std::path::Path, files: &[&str]) {
    let mut pids = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(dir.join(f)).expect(f);
        pids.push((f, text.trim().parse::<i32>().expect(f)));
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while pids.iter().any(|&(_, p)| pid_alive(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let alive: Vec<_> = pids.iter().filter(|&&(_, p)| pid_alive(p)).collect();
    for &&(_, p) in &alive {
        let _ = Command::new("kill").args(["-9", &p.to_string()]).status();
    }
    assert!(alive.is_empty(), "still running: {alive:?}");
}

/// Issue 34 item 17: stopped by a signal while a transport hangs, `fleet snapshot` still
/// kills what that transport started in sessions of their own.
#[test]
fn a_signal_kills_what_transports_started_in_sessions_of_their_own() {
    let d = tempfile::tempdir().unwrap();
    let via = format!("{} {{node}}", fake_node().display());
    let mut child = Command::new(env!("CARGO_BIN_EXE_wedgewatch"))
        .args([
            "fleet", "snapshot", "--nodes", "setsid-2", "--via", &via, "--json",
        ])
        .args(["--timeout", "120s"])
        .env("FAKE_FLEET_DIR", d.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid_file = d.path().join("setsid-2.pid");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !pid_file.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(pid_file.exists(), "the transport never started");
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(128 + 15));
    assert_none_survive(
        d.path(),
        &["setsid-2.pid", "setsid-2.child", "setsid-2.orphan"],
    );
}
