//! The controls (issue 33, item 3): slow but healthy requests must never be judged stuck,
//! now that a request whose witnesses all say nothing works on it is judged after 10 s.
//!
//! One regular lab `up --controls` (`tests/lab/controls.py`), all controls at once, about
//! 65 s: a long prompt whose chunked prefill keeps the GPU working 60 s before its first
//! byte; a decode whose first token comes after 20 s while the engine is busy with others; a
//! queue at the engine that backs up and drains; a client uploading its request over 40 s;
//! the router's own admission queue overflowing. A daemon (production thresholds) watches
//! throughout, its served snapshot is asked every few seconds, and cold one-shots are taken
//! during the run. None may show a stuck request of this lab (any stuck kind:
//! `wedged_request`, `stalled_stream`, ...) in a snapshot, nor open one in the daemon's log.
//! Each control must also have happened (its first byte late, its queue seen, ...), or the
//! test proves nothing.
//!
//! Discovery sees every stack on the machine: assertions are about this lab's components.

use crate::common::ww;
use wedgewatch_testkit::lab;

use lab::{Lab, LabOptions};
use serde_json::Value;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// Finding kinds that say a request is stuck (today's and those being added).
const STUCK_KINDS: [&str; 4] = [
    "wedged_request",
    "stalled_stream",
    "kv_transfer_stalled",
    "pd_leg_failed",
];

/// A `wedgewatch daemon` at production thresholds, killed on drop.
struct Daemon {
    child: Child,
    state_dir: tempfile::TempDir,
}

impl Daemon {
    fn start(lab: &Lab) -> Daemon {
        let state_dir = tempfile::Builder::new()
            .prefix("ww-controls-")
            .tempdir()
            .expect("state dir");
        let log = std::fs::File::create(state_dir.path().join("daemon.log")).expect("log");
        let child = ww(lab)
            .arg("--state-dir")
            .arg(state_dir.path())
            .args(["daemon", "--for", "300s"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn daemon");
        let d = Daemon { child, state_dir };
        // Up when its socket is there (bounded: discovery and the first samples).
        let t = Instant::now();
        while !d.socket_exists() {
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "daemon not up: {}",
                d.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        d
    }

    fn socket_exists(&self) -> bool {
        use std::os::unix::fs::FileTypeExt;
        std::fs::read_dir(self.state_dir.path())
            .map(|rd| {
                rd.flatten()
                    .any(|e| e.file_type().is_ok_and(|t| t.is_socket()))
            })
            .unwrap_or(false)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.state_dir.path().join("daemon.log")).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `wedgewatch snapshot --json` from the daemon, or a cold one (`--no-daemon`, default
/// window); None when it failed (said why).
fn snapshot(lab: &Lab, state_dir: Option<&Path>) -> Option<Value> {
    let mut c = ww(lab);
    match state_dir {
        Some(d) => c.arg("--state-dir").arg(d).args(["snapshot", "--json"]),
        None => c.args(["snapshot", "--json", "--no-daemon"]),
    };
    let out = c.stderr(Stdio::piped()).output().expect("run wedgewatch");
    if !out.status.success() {
        eprintln!(
            "snapshot failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

/// This lab's component ids in a snapshot (by main pid).
fn lab_ids(snap: &Value, lab: &Lab) -> Vec<String> {
    lab.info
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
        .collect()
}

/// What a snapshot says is stuck at this lab: stuck findings and stuck logical requests.
fn stuck_here(snap: &Value, lab: &Lab) -> Vec<String> {
    let ids = lab_ids(snap, lab);
    let mine = |c: &Value| c.as_str().is_some_and(|c| ids.iter().any(|i| i == c));
    let mut out: Vec<String> = snap["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| STUCK_KINDS.iter().any(|k| f["kind"] == *k) && mine(&f["component"]))
        .map(|f| format!("finding {}: {}", f["kind"], f["summary"]))
        .collect();
    out.extend(
        snap["logical_requests"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|l| l["verdict"] == "stuck" && mine(&l["stuck_at"]))
            .map(|l| format!("request {} stuck at {}", l["id"], l["stuck_at"])),
    );
    out
}

/// The daemon log's "finding opened" lines of a stuck kind at one of `ids`.
fn stuck_in_log(log: &str, ids: &[String]) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains("finding opened"))
        .filter(|l| STUCK_KINDS.iter().any(|k| l.contains(&format!("kind={k}"))))
        .filter(|l| ids.iter().any(|i| l.contains(i.as_str())))
        .map(str::to_string)
        .collect()
}

#[test]
fn slow_but_healthy_requests_are_never_judged_stuck() {
    let lab = Lab::up(&LabOptions::regular().controls()).expect("lab up");
    let daemon = Daemon::start(&lab);
    let mut controls = lab.controls().expect("controls");
    let started = Instant::now();
    let mut seen: Vec<String> = Vec::new();
    let mut served = 0;
    let mut ids: Vec<String> = Vec::new();
    // One-shots at about 14 s (the queue backed up, the slow decode waiting), 34 s (the long
    // prefill and the upload past 30 s) and 52 s; served snapshots in between. The run is
    // bounded by the controls' own bound (`Lab::controls`).
    let mut one_shots_at = vec![14u64, 34, 52];
    let mut one_shots = 0;
    let report = loop {
        let el = started.elapsed().as_secs();
        let (who, snap) = if one_shots_at.first().is_some_and(|&t| el >= t) {
            one_shots_at.remove(0);
            ("one-shot", snapshot(&lab, None))
        } else {
            ("daemon", snapshot(&lab, Some(daemon.state_dir.path())))
        };
        if let Some(s) = snap {
            match who {
                "daemon" => served += 1,
                _ => one_shots += 1,
            }
            if ids.is_empty() && who == "daemon" {
                ids = lab_ids(&s, &lab);
            }
            let stuck = stuck_here(&s, &lab);
            seen.extend(stuck.into_iter().map(|w| format!("{who} at {el} s: {w}")));
        }
        match controls.try_report() {
            Ok(Some(report)) => break report,
            Ok(None) => std::thread::sleep(Duration::from_secs(2)),
            Err(e) => panic!("controls: {e}"),
        }
    };
    // The daemon's last word on the run's end (its pass runs every few seconds).
    if let Some(s) = snapshot(&lab, Some(daemon.state_dir.path())) {
        seen.extend(
            stuck_here(&s, &lab)
                .into_iter()
                .map(|w| format!("daemon at the end: {w}")),
        );
    }
    println!("controls: {report}");
    println!("{served} served snapshots, {one_shots} one-shots");
    for (name, c) in report["controls"].as_object().expect("controls") {
        assert_eq!(c["ok"], true, "control {name} failed: {c}");
        assert_eq!(c["happened"], true, "control {name} did not happen: {c}");
    }
    assert_eq!(
        report["controls"].as_object().map(|m| m.len()),
        Some(6),
        "{report}"
    );
    assert!(
        served >= 10 && one_shots >= 2,
        "{served} served, {one_shots} one-shots"
    );
    assert!(!ids.is_empty(), "the daemon never saw this lab");
    let logged = stuck_in_log(&daemon.log(), &ids);
    assert!(
        seen.is_empty() && logged.is_empty(),
        "slow requests judged stuck:\n{}\n{}",
        seen.join("\n"),
        logged.join("\n")
    );
}
