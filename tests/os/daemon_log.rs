//! The daemon's log, from the real binary's stderr: a finding is logged when it opens, with
//! kind, severity, component and summary; `RUST_LOG=warn` leaves only warnings and errors;
//! a secret from a component's environment never appears, whatever the finding says.
//!
//! The stack is a copy of the `container` fixture /proc tree, so no live process or port
//! of the host matters; the decode engine "restarts" (its start time changes) with two
//! added variables holding one planted secret, which opens `config_changed` and
//! `process_restarted` on it.

use wedgewatch_testkit::shapes;

use shapes::{fixture_proc, wedgewatch};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const PLANTED: &str = "plantedlogsecret-7e1c";
const FIXTURE_SECRET: &str = "hf_fixture_secret";

/// A `wedgewatch daemon` whose stderr lines arrive on a channel; killed (by its pid) on drop.
struct LoggingDaemon {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl LoggingDaemon {
    fn start(proc_root: &Path, state: &Path, env: &[(&str, &str)]) -> LoggingDaemon {
        let mut cmd = wedgewatch();
        cmd.args(["daemon", "--no-record", "--state-dir"])
            .arg(state)
            .arg("--proc-root")
            .arg(proc_root)
            // no NVML wherever the suite runs: the GPU source is reliably unavailable
            .args(["--nvml-lib", "/nonexistent/libnvidia-ml.so.1"])
            .env_remove("RUST_LOG")
            .env_remove("JOURNAL_STREAM")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn daemon");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        LoggingDaemon {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits (bounded) for a line matching `pred`; every line read is kept in `seen`.
    fn wait_for(&mut self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        if let Some(l) = self.seen.iter().find(|l| pred(l)) {
            return l.clone();
        }
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.seen.push(l.clone());
                    if pred(&l) {
                        return l;
                    }
                }
                Err(_) => break,
            }
        }
        panic!(
            "no log line {what} in 30 s; the log:\n{}",
            self.seen.join("\n")
        );
    }

    /// Stops it (SIGTERM, like systemd) and returns everything it logged.
    fn stop(mut self) -> Vec<String> {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
        // the reader thread ends at EOF
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.seen.push(l);
        }
        std::mem::take(&mut self.seen)
    }
}

impl Drop for LoggingDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn copy_tree(from: &Path, to: &Path) {
    let ok = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .expect("cp");
    assert!(ok.success(), "cp -a {} {}", from.display(), to.display());
}

/// Replaces `path` atomically (the daemon may be reading it).
fn replace(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, bytes).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

/// The decode engine (pid 100) restarts: a new start time, and two added variables
/// holding one secret (one under a secret-looking name, one under a harmless one).
fn restart_decode_with_a_secret(proc_root: &Path) {
    let pid = proc_root.join("100");
    let stat = std::fs::read_to_string(pid.join("stat")).expect("stat");
    assert!(
        stat.contains(" 123456 "),
        "the fixture's start time: {stat}"
    );
    replace(
        &pid.join("stat"),
        stat.replace(" 123456 ", " 223456 ").as_bytes(),
    );
    let mut env = std::fs::read(pid.join("environ")).expect("environ");
    for kv in [
        format!("WW_DB_PASSWORD={PLANTED}"),
        format!("MODEL_NOTE={PLANTED}"),
    ] {
        env.extend_from_slice(kv.as_bytes());
        env.push(0);
    }
    replace(&pid.join("environ"), &env);
}

fn level_of(line: &str) -> Option<&str> {
    // `2026-12-01T20:46:09.164810Z  INFO daemon started ...`
    line.split_whitespace().nth(1)
}

#[test]
fn the_daemon_logs_a_finding_when_it_opens_and_never_a_secret() {
    let tmp = tempfile::tempdir().expect("tmp");
    let proc_root = tmp.path().join("proc");
    copy_tree(&fixture_proc("container"), &proc_root);
    let mut d = LoggingDaemon::start(&proc_root, &tmp.path().join("state"), &[]);

    let started = d.wait_for("daemon started", |l| l.contains("daemon started"));
    assert_eq!(level_of(&started), Some("INFO"), "{started}");
    assert!(
        started.starts_with("20")
            && started
                .split_whitespace()
                .next()
                .is_some_and(|t| t.ends_with('Z')),
        "a UTC timestamp first: {started}"
    );
    assert!(started.contains("socket="), "{started}");
    d.wait_for("the first baseline", |l| {
        l.contains("baseline taken") && l.contains("reason=start")
    });

    restart_decode_with_a_secret(&proc_root);
    let opened = d.wait_for("config_changed opened", |l| {
        l.contains("finding opened") && l.contains("kind=config_changed")
    });
    assert_eq!(
        level_of(&opened),
        Some("WARN"),
        "a warning finding: {opened}"
    );
    for field in ["severity=warning", "component=", "role=decode"] {
        assert!(opened.contains(field), "{field} in {opened}");
    }
    assert!(
        opened.contains("MODEL_NOTE"),
        "the summary names the change: {opened}"
    );
    d.wait_for("process_restarted opened", |l| {
        l.contains("finding opened") && l.contains("kind=process_restarted")
    });
    // Degradations are logged once, not at every sample: the GPU has no library for the
    // whole run (a few seconds, ~10 samples a second).
    let log = d.stop();
    let gpu_down = log
        .iter()
        .filter(|l| l.contains("source gpu unavailable"))
        .count();
    assert_eq!(gpu_down, 1, "{}", log.join("\n"));
    assert!(
        log.iter().any(|l| l.contains("daemon stopped")),
        "{}",
        log.join("\n")
    );
    for l in &log {
        assert!(
            !l.contains(PLANTED) && !l.contains(FIXTURE_SECRET),
            "a secret in the log: {l}"
        );
        assert!(level_of(l).is_some(), "every line has a level: {l}");
    }
}

#[test]
fn rust_log_warn_silences_info_lines() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut d = LoggingDaemon::start(
        &fixture_proc("container"),
        &tmp.path().join("state"),
        &[("RUST_LOG", "warn")],
    );
    d.wait_for("the GPU source unavailable", |l| {
        l.contains("source gpu unavailable")
    });
    // long enough for the start, the first baseline and a few log passes
    std::thread::sleep(Duration::from_millis(2_500));
    let log = d.stop();
    assert!(!log.is_empty());
    for l in &log {
        assert!(
            matches!(level_of(l), Some("WARN" | "ERROR")),
            "RUST_LOG=warn: {l}\n{}",
            log.join("\n")
        );
    }
    assert!(
        !log.iter().any(|l| l.contains("daemon started")),
        "{}",
        log.join("\n")
    );
}

#[test]
fn a_bad_rust_log_is_a_usage_error_naming_it() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = wedgewatch()
        .args(["daemon", "--no-record", "--for", "1s", "--state-dir"])
        .arg(tmp.path().join("state"))
        .env("RUST_LOG", "wedgewatch=loud")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("RUST_LOG"), "{err}");
    assert!(!tmp.path().join("state").exists(), "nothing started");
}

/// `daemon --for 5s` with `args` and `RUST_LOG`: its stderr. (Long enough for two log
/// passes, 2 s apart, after the first samples, on a loaded machine.)
fn daemon_log_of(args: &[&str], rust_log: &str) -> String {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = wedgewatch()
        .args(args)
        .args(["daemon", "--no-record", "--for", "5s", "--state-dir"])
        .arg(tmp.path().join("state"))
        .arg("--proc-root")
        .arg(fixture_proc("container"))
        .args(["--nvml-lib", "/nonexistent/libnvidia-ml.so.1"])
        .env("RUST_LOG", rust_log)
        .env_remove("JOURNAL_STREAM")
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    err
}

#[test]
fn the_command_line_wins_over_rust_log() {
    let quiet = daemon_log_of(&["--quiet"], "info");
    assert!(
        quiet.contains("source gpu unavailable"),
        "--quiet keeps warnings: {quiet}"
    );
    assert!(
        !quiet.contains(" INFO "),
        "--quiet over RUST_LOG=info: {quiet}"
    );
    let verbose = daemon_log_of(&["-v"], "warn");
    assert!(
        verbose.contains("INFO daemon started"),
        "-v over RUST_LOG=warn: {verbose}"
    );
}
