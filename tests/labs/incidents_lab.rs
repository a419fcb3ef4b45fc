//! Issue 36 on the lab (`tests/lab/`, fixture `crates/testkit/src/lab.rs`): the evidence of a wedge
//! outlives what on-call does about it. A daemon watches the lab; decode is wedged (the
//! incident's tuning variable, clients hang); the daemon keeps an incident bundle; decode is
//! killed with SIGKILL (its whole process group, as a failed liveness probe's container kill)
//! and started again. The bundle still names the wedge with its evidence from before the
//! kill, the incident closes as `process_restarted`, a later snapshot shows the restart, and
//! the next wedge is a second incident. The incidents outlive the daemon's own SIGKILL too,
//! and `incidents latest -o DIR` copies the newest out with the line that files it.
//!
//! Runs the wedgewatch binary as a user runs it; lab tests of different files run one file at
//! a time (`lab::exclusive`).

use crate::common::{fast_thresholds, ww, ww_reader};
use wedgewatch_testkit::lab;

use lab::{Lab, LabOptions};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The incident's tuning variable: decode accepts requests and forgets them.
const TUNING_VAR: &str = "SGLANG_DECODE_PREALLOC_SPLIT_TOKENS";

/// Runs a wedgewatch command to its end, bounded; its stdout (it must succeed). Output goes
/// to files: a pipe nobody reads until the end would stall a large answer.
fn run(mut cmd: Command, bound: Duration) -> String {
    let out = tempfile::NamedTempFile::new().expect("stdout file");
    let err = tempfile::NamedTempFile::new().expect("stderr file");
    let mut child = cmd
        .stdout(out.reopen().expect("stdout"))
        .stderr(err.reopen().expect("stderr"))
        .spawn()
        .expect("spawn wedgewatch");
    let started = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if started.elapsed() > bound {
            let _ = child.kill();
            let _ = child.wait();
            panic!("wedgewatch {cmd:?} did not finish within {bound:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stderr = std::fs::read_to_string(err.path()).unwrap_or_default();
    assert!(status.success(), "wedgewatch {cmd:?}: {stderr}");
    std::fs::read_to_string(out.path()).expect("stdout")
}

/// A `wedgewatch daemon` on the lab, SIGKILLed on drop.
struct Daemon(Child);

impl Daemon {
    fn start(lab: &Lab, state: &Path) -> Daemon {
        std::fs::create_dir_all(state).expect("state dir");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(state.with_extension("log"))
            .expect("daemon log");
        let child = ww(lab)
            .arg("--thresholds")
            .arg(fast_thresholds())
            .arg("--state-dir")
            .arg(state)
            .args(["daemon", "--for", "900s"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn daemon");
        let d = Daemon(child);
        let started = Instant::now();
        while !state.join("daemon.sock").exists() {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "daemon did not come up: {}",
                daemon_log(state)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        d
    }

    fn sigkill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.sigkill();
    }
}

fn daemon_log(state: &Path) -> String {
    std::fs::read_to_string(state.with_extension("log")).unwrap_or_default()
}

/// The daemon's snapshot now (`snapshot --json --state-dir`).
fn served(lab: &Lab, state: &Path) -> Value {
    let mut c = ww(lab);
    c.arg("--state-dir").arg(state).args(["snapshot", "--json"]);
    serde_json::from_str(&run(c, Duration::from_secs(60))).expect("snapshot JSON")
}

/// `incidents --json --state-dir`.
fn incidents(state: &Path) -> Vec<Value> {
    let mut c = ww_reader();
    c.args(["incidents", "--json", "--state-dir"]).arg(state);
    let v: Value = serde_json::from_str(&run(c, Duration::from_secs(30))).expect("JSON");
    assert_eq!(v["schema"], "wedgewatch.incidents/1");
    v["incidents"].as_array().cloned().unwrap_or_default()
}

/// Whether an incident is about a wedge at `component` (opened by it, or joined by it).
fn wedge_at(i: &Value, component: &str) -> bool {
    let inc = &i["incident"];
    let kinds: Vec<&Value> = std::iter::once(&inc["kind"])
        .chain(inc["joined"].as_array().into_iter().flatten())
        .collect();
    inc["component"] == component && kinds.iter().any(|k| *k == "wedged_request")
}

/// Waits (bounded) until the listed incidents satisfy `pred`; returns the one it picks.
fn wait_incident(
    state: &Path,
    what: &str,
    bound: Duration,
    pick: impl Fn(&[Value]) -> Option<Value>,
) -> Value {
    let started = Instant::now();
    loop {
        let all = incidents(state);
        if let Some(i) = pick(&all) {
            return i;
        }
        assert!(
            started.elapsed() < bound,
            "{what}: not within {bound:?}; incidents {all:#?}\ndaemon log:\n{}",
            daemon_log(state)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The snapshot's component id of the lab's decode engine (by its main pid).
fn decode_id(snap: &Value, pid: u32) -> String {
    snap["components"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["main_pid"].as_u64() == Some(u64::from(pid)))
        .and_then(|c| c["id"].as_str())
        .unwrap_or_else(|| panic!("no component with main pid {pid}"))
        .to_string()
}

fn has_finding(snap: &Value, kind: &str, component: &str) -> bool {
    snap["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|f| f["kind"] == kind && f["component"] == component)
}

/// SIGKILL to the engine's whole process group (the lab starts each in a session of its
/// own), as a container runtime kills a pod whose liveness probe failed; waits until it is
/// gone.
fn kill_9(c: &lab::Component) {
    use nix::sys::signal::{killpg, Signal};
    use nix::unistd::{getpgrp, Pid};
    assert!(
        c.pgid > 1 && Pid::from_raw(c.pgid as i32) != getpgrp(),
        "{c:?}"
    );
    killpg(Pid::from_raw(c.pgid as i32), Signal::SIGKILL).expect("kill -9");
    let started = Instant::now();
    while lab::pid_alive(c.pid) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "decode survived kill -9"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The evidence of the incident as it is on disk.
fn evidence(i: &Value) -> (PathBuf, Vec<u8>, Vec<u8>) {
    let path = PathBuf::from(i["path"].as_str().expect("path"));
    let snap = std::fs::read(path.join("snapshot.json")).expect("snapshot.json");
    let rec = std::fs::read(path.join("recording.wwrec")).expect("recording.wwrec");
    (path, snap, rec)
}

#[test]
fn an_incident_bundle_outlives_kill_9_of_the_engine_and_the_next_wedge_is_a_second_incident() {
    let mut lab = Lab::up(&LabOptions::pd()).expect("lab up");
    let tmp = tempfile::tempdir().expect("tmp");
    let state = tmp.path().join("state");
    let mut daemon = Daemon::start(&lab, &state);
    let healthy = lab.load(2, 1, 30.0).expect("healthy load");
    assert!(healthy.to_string().contains("rounds"), "{healthy}");
    let decode = decode_id(&served(&lab, &state), lab.decode().pid);
    // (Other stacks on the machine are seen too: only this lab's decode counts.)
    assert!(
        !incidents(&state)
            .iter()
            .any(|i| i["incident"]["component"] == decode.as_str()),
        "a healthy decode keeps none"
    );

    // The wedge: decode restarted with the tuning variable, clients hang.
    lab.restart("decode", &[(TUNING_VAR, "100")])
        .expect("restart decode");
    let wedged_pid = lab.decode().pid;
    let load = lab.load_background(3, 4, 120.0).expect("harness");
    let first = wait_incident(
        &state,
        "the wedge's incident",
        Duration::from_secs(120),
        |all| all.iter().find(|i| wedge_at(i, &decode)).cloned(),
    );
    let (path, snap_bytes, rec_bytes) = evidence(&first);
    let snap: Value = serde_json::from_slice(&snap_bytes).expect("snapshot.json");
    assert!(
        has_finding(&snap, "wedged_request", &decode)
            || first["incident"]["kind"] != "wedged_request"
    );
    assert_eq!(
        decode_id(&snap, wedged_pid),
        decode,
        "the moment names the wedged process"
    );
    assert!(
        first["incident"]["recording"]["state"] == "kept" && !rec_bytes.is_empty(),
        "{first:#}"
    );

    // kill -9, then started again as a liveness probe's restart would.
    kill_9(lab.decode());
    drop(load);
    lab.restart("decode", &[]).expect("start decode again");
    assert_ne!(lab.decode().pid, wedged_pid);
    let name = first["name"].clone();
    let closed = wait_incident(
        &state,
        "the incident closed",
        Duration::from_secs(90),
        |all| {
            all.iter()
                .find(|i| i["name"] == name && i["state"] == "closed")
                .cloned()
        },
    );
    assert_eq!(closed["closed_by"], "process_restarted", "{closed:#}");
    assert!(
        closed["lasted_ms"].as_i64().is_some_and(|ms| ms > 0),
        "{closed:#}"
    );
    // The evidence from before the kill is all still there, unchanged.
    let (_, snap_after, rec_after) = evidence(&closed);
    assert_eq!(
        snap_after, snap_bytes,
        "snapshot.json is the moment, never rewritten"
    );
    assert_eq!(
        rec_after, rec_bytes,
        "recording.wwrec is the minutes before, never rewritten"
    );
    let mut c = ww(&lab);
    c.arg("--thresholds")
        .arg(fast_thresholds())
        .args(["snapshot", "--json", "--from"])
        .arg(path.join("recording.wwrec"));
    let replay: Value = serde_json::from_str(&run(c, Duration::from_secs(60))).expect("replay");
    assert!(
        has_finding(&replay, "wedged_request", &decode),
        "the recording replays to the wedge: {:#}",
        replay["findings"]
    );
    let mut c = ww_reader();
    c.arg("report").arg(&path);
    let report = run(c, Duration::from_secs(30));
    assert!(report.contains("wedged_request"), "{report}");
    let md = std::fs::read_to_string(path.join("report.md")).expect("report.md");
    assert!(
        md.contains("process_restarted"),
        "the report says what closed it"
    );

    // A later snapshot shows the restart.
    let started = Instant::now();
    while !has_finding(&served(&lab, &state), "process_restarted", &decode) {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no process_restarted at {decode}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }

    // The next wedge is a second incident.
    let _load = lab.load_background(3, 4, 120.0).expect("harness");
    let second = wait_incident(
        &state,
        "a second incident",
        Duration::from_secs(120),
        |all| {
            all.iter()
                .find(|i| wedge_at(i, &decode) && i["name"] != name)
                .cloned()
        },
    );
    assert!(
        second["incident"]["opened_ms"].as_i64() > first["incident"]["opened_ms"].as_i64(),
        "{second:#}"
    );
    let mut c = ww_reader();
    c.arg("diff")
        .arg(&path)
        .arg(second["path"].as_str().expect("path"));
    let diff = c.output().expect("diff");
    assert_eq!(
        diff.status.code(),
        Some(1),
        "two moments differ (the restart)"
    );

    // The daemon itself killed and started again: both incidents are still there.
    daemon.sigkill();
    let _daemon = Daemon::start(&lab, &state);
    let all = incidents(&state);
    // Kept for reading after a run.
    let _ = std::fs::write(
        std::env::temp_dir().join("ww-incidents-lab.json"),
        format!("{all:#?}\n{}", daemon_log(&state)),
    );
    for want in [&first, &second] {
        assert!(all.iter().any(|i| i["name"] == want["name"]), "{all:#?}");
    }
    let (_, snap_later, _) = evidence(&closed);
    assert_eq!(snap_later, snap_bytes);

    // The newest copied out, with the line that files it.
    let out = tmp.path().join("out");
    let mut c = ww_reader();
    c.args(["incidents", "latest", "--state-dir"])
        .arg(&state)
        .arg("-o")
        .arg(&out);
    let line = run(c, Duration::from_secs(30));
    let words = shlex::split(line.trim()).expect("one shell line");
    assert_eq!(&words[..4], ["gh", "issue", "create", "--title"], "{line}");
    assert_eq!(words[6], out.join("report.md").display().to_string());
    assert!(out.join("snapshot.json").is_file() && out.join("recording.wwrec").is_file());
}
