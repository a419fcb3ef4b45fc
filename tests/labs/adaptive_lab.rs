//! Adaptive stack sampling on the lab (issue 15, item 2): the `wedgewatch daemon` binary with
//! `stacks_adaptive` on (the default), py-spy behind a wrapper that logs every invocation
//! (`WEDGEWATCH_PY_SPY`), so the test counts what the daemon really ran.
//!
//! Discovery sees every stack on the machine (other tests' labs too): assertions are about
//! the py-spy runs on this test's own lab's pids, and about runs per tick overall.

use wedgewatch_testkit::lab;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lab::{Lab, LabOptions};
use serde_json::Value;

/// The incident's tuning variable (the "change since noon").
const TUNING_VAR: &str = "SGLANG_DECODE_PREALLOC_SPLIT_TOKENS";
/// The stacks tick of these tests while something is suspected (the default is 5 s).
const TICK_MS: u64 = 2_000;
/// The stacks tick of these tests while nothing is (the default is 20 s).
const CALM_TICK_MS: u64 = 4_000;

fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ww-adaptive-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("tempdir");
    d
}

/// Fast detector thresholds (8 s wedge), adaptive stacks ticking every [`TICK_MS`] while
/// something is suspected, every [`CALM_TICK_MS`] while nothing is.
fn thresholds(dir: &Path) -> PathBuf {
    let p = dir.join("thresholds.toml");
    let fast =
        std::fs::read_to_string(lab::repo_root().join("tests/fixtures/thresholds-fast.toml"))
            .expect("fast thresholds");
    std::fs::write(
        &p,
        format!(
            "{fast}\nstacks_adaptive = true\nstacks_tick_ms = {TICK_MS}\n\
             stacks_calm_ms = {CALM_TICK_MS}\n"
        ),
    )
    .expect("write thresholds");
    p
}

/// A py-spy that appends "<unix time> <target pid>" to `log`, then runs the real one.
fn counting_py_spy(dir: &Path) -> (PathBuf, PathBuf) {
    let log = dir.join("py-spy.log");
    let script = dir.join("py-spy");
    let real = lab::venv_bin("py-spy");
    let text = format!(
        "#!/bin/sh\n\
         pid=\"\"; prev=\"\"\n\
         for a in \"$@\"; do [ \"$prev\" = \"--pid\" ] && pid=\"$a\"; prev=\"$a\"; done\n\
         echo \"$(date +%s.%N) $pid\" >> '{}'\n\
         exec '{}' \"$@\"\n",
        log.display(),
        real.display()
    );
    std::fs::write(&script, text).expect("write wrapper");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    (script, log)
}

/// (time in s, target pid) of every py-spy run so far.
fn runs(log: &Path) -> Vec<(f64, u32)> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (t, p) = l.split_once(' ')?;
            Some((t.parse().ok()?, p.trim().parse().ok()?))
        })
        .collect()
}

/// A `wedgewatch daemon` process, killed on drop.
struct Daemon {
    child: Child,
    state_dir: PathBuf,
}

impl Daemon {
    fn start(lab: &Lab, dir: &Path, py_spy: &Path) -> Daemon {
        let state_dir = dir.join("state");
        std::fs::create_dir_all(&state_dir).expect("state dir");
        let log = std::fs::File::create(dir.join("daemon.log")).expect("daemon log");
        let child = ww(lab, py_spy)
            .arg("--thresholds")
            .arg(thresholds(dir))
            .arg("--state-dir")
            .arg(&state_dir)
            .args(["daemon", "--no-record", "--for", "240s"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn wedgewatch daemon");
        Daemon { child, state_dir }
    }

    /// The daemon's snapshot (bounded; retried until its socket answers). The verb runs
    /// the real py-spy: should it sample by itself, its dumps are not counted as the daemon's.
    fn snapshot(&self, lab: &Lab) -> Value {
        let started = Instant::now();
        loop {
            if !self.socket_exists() {
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "no daemon socket"
                );
                std::thread::sleep(Duration::from_millis(300));
                continue;
            }
            let out = ww(lab, &lab::venv_bin("py-spy"))
                .arg("--state-dir")
                .arg(&self.state_dir)
                .args(["snapshot", "--json"])
                .stderr(Stdio::null())
                .output()
                .expect("run snapshot");
            if let Ok(v) = serde_json::from_slice::<Value>(&out.stdout) {
                if v["window_ms"].as_f64().unwrap_or(0.0) > 0.0 {
                    return v;
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "daemon did not answer"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

impl Daemon {
    /// A source's period now (`sockets`, `stacks`), from the daemon's `sources` answer.
    fn every_ms(&self, source: &str) -> u64 {
        use std::io::{Read, Write};
        let mut c = std::os::unix::net::UnixStream::connect(self.state_dir.join("daemon.sock"))
            .expect("connect to the daemon");
        c.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        c.write_all(b"sources\n").expect("ask");
        let mut out = String::new();
        c.read_to_string(&mut out).expect("answer");
        let v: Value = serde_json::from_str(&out).expect("json answer");
        v["sampler"][source]["every_ms"]
            .as_u64()
            .unwrap_or_else(|| panic!("no {source} cadence in {out}"))
    }

    fn socket_exists(&self) -> bool {
        use std::os::unix::fs::FileTypeExt;
        std::fs::symlink_metadata(self.state_dir.join("daemon.sock"))
            .is_ok_and(|m| m.file_type().is_socket())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// [`crate::common::ww`] with py-spy `py_spy` and info logs.
fn ww(lab: &Lab, py_spy: &Path) -> Command {
    let mut c = crate::common::ww(lab);
    c.env("WEDGEWATCH_PY_SPY", py_spy).env("RUST_LOG", "info");
    c
}

/// Every pid of this lab (components, schedulers, detokenizers, children).
fn lab_pids(lab: &Lab) -> BTreeSet<u32> {
    lab.info.all_pids().into_iter().collect()
}

/// One test at a time: the wedged lab of one would be suspected by the other's daemon
/// (discovery sees every stack on the machine).
static ONE_LAB: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// With nothing suspicious (an idle healthy stack), one process per tick: py-spy runs come
/// in single file, a tick apart, and the rotation walks this lab's processes one at a time;
/// the socket table and the stacks tick at their calm paces.
#[test]
fn quiet_stack_is_dumped_one_process_per_tick() {
    let _one = ONE_LAB.lock().unwrap_or_else(|p| p.into_inner());
    let lab = Lab::up(&LabOptions::pd()).expect("lab up");
    let dir = tempdir("quiet");
    let (py_spy, log) = counting_py_spy(&dir);
    let daemon = Daemon::start(&lab, &dir, &py_spy);
    let _ = daemon.snapshot(&lab);
    let (t0, from) = (Instant::now(), unix_now());
    std::thread::sleep(Duration::from_secs(20));
    let secs = t0.elapsed().as_secs_f64();
    let daemon_log = std::fs::read_to_string(dir.join("daemon.log")).unwrap_or_default();
    let sockets_every_ms = daemon.every_ms("sockets");
    let stacks_every_ms = daemon.every_ms("stacks");
    let all = runs(&log);
    drop(daemon);
    let window: Vec<(f64, u32)> = all.into_iter().filter(|r| r.0 >= from).collect();
    // Runs of one tick: within 1 s of each other (a retry of a racy read is the same pid).
    let mut ticks: Vec<Vec<u32>> = Vec::new();
    let mut prev = f64::MIN;
    for (t, pid) in &window {
        if *t - prev > 1.0 {
            ticks.push(Vec::new());
        }
        prev = *t;
        if let Some(tick) = ticks.last_mut() {
            tick.push(*pid);
        }
    }
    let foreign_suspicion = daemon_log.contains("adaptive stacks: dumping the schedulers");
    // What was suspected, and of which request (`--nocapture` shows it on success too).
    for l in daemon_log
        .lines()
        .filter(|l| l.contains("adaptive stacks:"))
    {
        eprintln!("{l}");
    }
    // This quiet lab itself is sometimes suspected for a few seconds ("GPU idle with a
    // request open", 3-4.5 s, both engines at once): its router health-checks both engines
    // every second over keep-alive connections the daemon reads every 2 s while calm. Two
    // checks between two tables are known as probes (`Exchange::probe_unit`), also on a
    // connection that carried a request just before (probe sizes per server). The suspicion
    // names its request in the log (printed above); a real one (a request slow on a loaded
    // machine) may still come. A suspected engine's schedulers are rightly dumped together;
    // the one-process-per-tick rule holds while nothing of this lab is suspected.
    let own_suspicion = [lab.prefill().port, lab.decode().port].iter().any(|p| {
        daemon_log
            .lines()
            .any(|l| l.contains("dumping the schedulers") && l.contains(&format!(":{p}")))
    });
    let tick_ms = if foreign_suspicion {
        TICK_MS
    } else {
        CALM_TICK_MS
    };
    // A suspicion may last a few seconds of the 20: at least half the calm ticks, at most
    // every tick at the pace seen.
    let ticks_expected = secs * 1000.0 / tick_ms as f64;
    let calm_ticks = secs * 1000.0 / CALM_TICK_MS as f64;
    assert!(
        ticks.len() as f64 >= calm_ticks * 0.5 && ticks.len() as f64 <= ticks_expected + 2.0,
        "{} ticks with py-spy runs in {secs:.0} s (tick {tick_ms} ms): {window:?}",
        ticks.len()
    );
    if !foreign_suspicion {
        assert_eq!(
            sockets_every_ms, 2_000,
            "nothing suspected: the calm socket pace"
        );
        assert_eq!(
            stacks_every_ms, CALM_TICK_MS,
            "nothing suspected: the calm stacks tick"
        );
    }
    let mine = lab_pids(&lab);
    for tick in &ticks {
        let distinct: BTreeSet<&u32> = tick.iter().collect();
        let of_mine = distinct.iter().filter(|p| mine.contains(p)).count();
        assert!(
            of_mine <= 1 || own_suspicion,
            "more than one of this lab's pids in a tick: {tick:?}\n{daemon_log}"
        );
        if !foreign_suspicion {
            assert_eq!(
                distinct.len(),
                1,
                "one process per tick: {tick:?}\n{daemon_log}"
            );
        }
    }
    // The rotation moves on: no pid twice in a row.
    let firsts: Vec<u32> = ticks.iter().filter_map(|t| t.first().copied()).collect();
    assert!(
        firsts.windows(2).all(|w| w[0] != w[1]) || foreign_suspicion,
        "the round-robin stood still: {firsts:?}"
    );
}

/// The noon wedge with adaptive sampling: `wedged_request` at decode with stack evidence,
/// its scheduler dumped tick after tick once suspected, the healthy prefill's far less, and
/// the socket table at its fast pace.
#[test]
fn noon_wedge_yields_wedged_request_with_stack_evidence() {
    let _one = ONE_LAB.lock().unwrap_or_else(|p| p.into_inner());
    let lab = Lab::up(&LabOptions::pd().decode_env(TUNING_VAR, "100")).expect("lab up");
    let dir = tempdir("wedge");
    let (py_spy, log) = counting_py_spy(&dir);
    let daemon = Daemon::start(&lab, &dir, &py_spy);
    let _ = daemon.snapshot(&lab);
    let _load = lab.load_background(3, 6, 90.0).expect("harness");
    // Past the 8 s wedge threshold and a few ticks of the suspected engine's schedulers.
    let snap = wait_for_wedge(&lab, &daemon, Duration::from_secs(60));
    assert_eq!(
        daemon.every_ms("sockets"),
        250,
        "a wedge suspected: the socket table at its fast pace"
    );
    assert_eq!(
        daemon.every_ms("stacks"),
        TICK_MS,
        "a wedge suspected: the stacks tick at its fast pace"
    );
    let daemon_log = std::fs::read_to_string(dir.join("daemon.log")).unwrap_or_default();
    let decode_pid = lab.decode().pid;
    let decode = component_of(&snap, decode_pid);
    let wedged = snap["findings"]
        .as_array()
        .and_then(|fs| {
            fs.iter()
                .find(|f| f["kind"] == "wedged_request" && f["component"] == decode.as_str())
        })
        .cloned()
        .unwrap_or_else(|| panic!("no wedged_request at {decode}: {}", snap["findings"]));
    let ev = wedged["evidence"].to_string();
    assert!(
        ev.contains("\"source\":\"stacks\""),
        "no stack evidence: {ev}"
    );
    // "idle in k/k dumps over N s": the span says what k/k means.
    let summary = wedged["summary"].as_str().unwrap_or_default().to_string();
    assert!(
        summary.contains(" dumps over ") || ev.contains(" dumps over "),
        "no span in {summary} / {ev}"
    );
    assert!(
        daemon_log.contains("adaptive stacks: dumping the schedulers of")
            && daemon_log.contains(&decode),
        "the daemon never said it suspected {decode}:\n{daemon_log}"
    );
    let all = runs(&log);
    let count = |pid: u32| all.iter().filter(|r| r.1 == pid).count();
    let (dsched, psched) = (
        lab.decode().scheduler_pids[0],
        lab.prefill().scheduler_pids[0],
    );
    assert!(
        count(dsched) >= 3,
        "decode's scheduler dumped {} times: {all:?}",
        count(dsched)
    );
    assert!(
        count(dsched) > count(psched),
        "decode's scheduler {} vs prefill's {}",
        count(dsched),
        count(psched)
    );
}

/// The daemon's snapshot once it has `wedged_request` at decode (polled, bounded).
fn wait_for_wedge(lab: &Lab, daemon: &Daemon, bound: Duration) -> Value {
    let started = Instant::now();
    loop {
        let snap = daemon.snapshot(lab);
        let decode = component_of(&snap, lab.decode().pid);
        let stacks_evidence = snap["findings"].as_array().is_some_and(|fs| {
            fs.iter().any(|f| {
                f["kind"] == "wedged_request"
                    && f["component"] == decode.as_str()
                    && f["summary"]
                        .as_str()
                        .is_some_and(|s| s.contains(" dumps over "))
            })
        });
        if stacks_evidence || started.elapsed() > bound {
            return snap;
        }
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// The id of the component whose main pid is `pid`.
fn component_of(snap: &Value, pid: u32) -> String {
    snap["components"]
        .as_array()
        .and_then(|cs| {
            cs.iter()
                .find(|c| c["main_pid"].as_u64() == Some(u64::from(pid)))
        })
        .and_then(|c| c["id"].as_str())
        .unwrap_or("?")
        .to_string()
}
