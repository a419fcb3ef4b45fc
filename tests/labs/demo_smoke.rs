//! Smoke test of `wedgewatch demo --no-tui -o DIR`, the real binary end to end: it brings up
//! the lab, runs the agents healthy, restarts decode with the tuning variable, waits for the
//! wedge, writes the bundle and tears the lab down. Checks the exit status, that the bundle
//! names the stuck requests at decode and the added variable, and that no process of the
//! demo's lab is left.
//!
//! The demo's lab lives in `/tmp/wedgewatch-demo-<demo pid>` (removed on exit). Every lab
//! process has that path in its environment (`FAKE_NVML_DIR`, `SGLANG_LAB_STATE_DIR`) or
//! command line, so "nothing left" is checked by scanning `/proc/*/environ` and
//! `/proc/*/cmdline` for it: other labs on the machine are not counted, nothing is matched by
//! name. Takes ~50 s (the detector waits 30 s for a first byte before calling it wedged).
#![cfg(feature = "tui")]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use wedgewatch_testkit::lab;

/// Kills the demo (its own guard then tears the lab down) if the test fails early.
struct Demo(Child);

impl Drop for Demo {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            // SIGINT, like Ctrl-C: the demo tears its lab down on it.
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.0.id() as i32),
                nix::sys::signal::Signal::SIGINT,
            );
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.0.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Pids of live processes whose environment or command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return found;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == std::process::id() {
            continue;
        }
        let read = |f: &str| std::fs::read(e.path().join(f)).unwrap_or_default();
        let (env, cmd) = (read("environ"), read("cmdline"));
        let hit = |b: &[u8]| b.windows(needle.len()).any(|w| w == needle.as_bytes());
        if hit(&env) || hit(&cmd) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            // A zombie (exited, not yet reaped by its parent) holds nothing; skip it.
            let state = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            let zombie = state
                .rfind(')')
                .is_some_and(|i| state[i + 1..].trim_start().starts_with('Z'));
            if !zombie {
                found.push((pid, cmd));
            }
        }
    }
    found
}

fn venv_present() -> bool {
    let venv = std::env::var_os("WEDGEWATCH_LAB_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/lab/.venv"));
    if !venv.join("bin/python").exists() {
        eprintln!(
            "SKIPPED: no lab venv at {} (python3 tests/lab/lab.py setup); the demo smoke test did not run",
            venv.display()
        );
        return false;
    }
    true
}

#[test]
fn demo_without_ui_finds_the_wedge_and_leaves_nothing_behind() {
    let _lab = lab::shared();
    if !venv_present() {
        return;
    }
    let out = tempfile::tempdir().expect("tempdir");
    let bundle = out.path().join("bundle");
    let child = Command::new(env!("CARGO_BIN_EXE_wedgewatch"))
        .args(["demo", "--no-tui", "--for", "100", "-o"])
        .arg(&bundle)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn wedgewatch demo");
    let run_dir = format!("/tmp/wedgewatch-demo-{}", child.id());
    let mut demo = Demo(child);

    // While it runs, the lab is really up under the run dir (so the scan below can see
    // processes at all: a scan that never matches would prove nothing).
    let started = Instant::now();
    let mut seen_running = 0;
    let status = loop {
        if let Some(st) = demo.0.try_wait().expect("try_wait") {
            break st;
        }
        assert!(
            started.elapsed() < Duration::from_secs(150),
            "demo did not finish within 150 s"
        );
        seen_running = seen_running.max(processes_mentioning(&run_dir).len());
        std::thread::sleep(Duration::from_millis(500));
    };
    let mut stderr = String::new();
    if let Some(mut e) = demo.0.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut stderr);
    }
    eprintln!(
        "demo took {:.1} s; its log:\n{stderr}",
        started.elapsed().as_secs_f64()
    );
    assert!(
        status.success(),
        "demo exit status {status}; log:\n{stderr}"
    );
    assert!(
        seen_running >= 4,
        "expected the lab's processes (proxy, router, engines, children) under {run_dir} while the demo ran; saw {seen_running}"
    );

    // The bundle: the stuck requests at decode, and the variable added since the baseline.
    let snap: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(bundle.join("snapshot.json")).expect("snapshot.json written"),
    )
    .expect("snapshot.json is JSON");
    let findings = snap["findings"].as_array().expect("findings");
    let wedged = findings
        .iter()
        .find(|f| f["kind"] == "wedged_request")
        .unwrap_or_else(|| panic!("no wedged_request in {findings:#?}"));
    assert_eq!(wedged["role"], "decode", "{wedged:#}");
    assert!(
        wedged["component"]
            .as_str()
            .is_some_and(|c| c.starts_with("decode@127.0.0.1:")),
        "{wedged:#}"
    );
    assert!(
        !wedged["requests"].as_array().expect("requests").is_empty(),
        "{wedged:#}"
    );
    // Discovery sees every stack on the machine (a real tier may be running beside it):
    // the change this demo stages is decode's.
    let changed = findings
        .iter()
        .find(|f| f["kind"] == "config_changed" && f["role"] == "decode")
        .unwrap_or_else(|| panic!("no config_changed at decode in {findings:#?}"));
    assert!(
        changed
            .to_string()
            .contains("SGLANG_DECODE_PREALLOC_SPLIT_TOKENS"),
        "{changed:#}"
    );
    let report = std::fs::read_to_string(bundle.join("report.md")).expect("report.md written");
    assert!(report.contains("wedged_request"), "{report}");

    // Torn down: no process of this lab is left, and its run dir is gone.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = processes_mentioning(&run_dir);
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "lab processes left after the demo exited: {left:#?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        !Path::new(&run_dir).exists(),
        "run dir {run_dir} left behind"
    );
}

/// How the demo sits in the terminal that gets killed.
#[derive(Clone, Copy)]
enum Pane {
    /// `exec wedgewatch demo`: the demo leads the session and gets the kernel's SIGHUP.
    Direct,
    /// Under a shell that survives the hang-up (it traps SIGHUP and waits): the kernel
    /// signals the session leader only, so the demo gets no signal, just a dead tty.
    UnderAShell,
}

/// A demo whose terminal window is killed (tmux session gone: SIGHUP, a dead tty) must not
/// leave its lab running: the UI's hang-up path ends the process without unwinding, so the
/// demo registers its teardown there too.
#[test]
fn demo_in_a_killed_terminal_leaves_nothing_behind() {
    let _lab = lab::shared();
    killed_terminal(Pane::Direct);
}

/// The same with no signal at all, only the dead tty: the UI notices the terminal is gone
/// (it used to spin a core in crossterm's poll forever, the lab left running).
#[test]
fn demo_under_a_shell_in_a_killed_terminal_leaves_nothing_behind() {
    let _lab = lab::shared();
    killed_terminal(Pane::UnderAShell);
}

fn killed_terminal(pane: Pane) {
    if !venv_present() {
        return;
    }
    if Command::new("tmux").arg("-V").output().is_err() {
        eprintln!("SKIPPED: tmux not installed; the killed-terminal demo test did not run");
        return;
    }
    let name = format!("ww-demo-hup-{}-{}", std::process::id(), pane as u8);
    let log = std::env::temp_dir().join(format!("{name}.log"));
    let _ = std::fs::remove_file(&log);
    let demo = format!(
        "{} demo 2>>{}",
        env!("CARGO_BIN_EXE_wedgewatch"),
        log.display()
    );
    let cmd = match pane {
        Pane::Direct => format!("exec {demo}"),
        Pane::UnderAShell => format!("exec sh -c 'trap : HUP; {demo}; true'"),
    };
    let tmux = |args: &[&str]| {
        let out = Command::new("tmux").args(args).output().expect("tmux runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    tmux(&[
        "new-session",
        "-d",
        "-s",
        &name,
        "-x",
        "120",
        "-y",
        "40",
        &cmd,
    ]);
    let pane_pid = tmux(&["display-message", "-p", "-t", &name, "#{pane_pid}"]);
    let pane_pid = pane_pid.trim().to_string();
    assert!(!pane_pid.is_empty(), "the pane runs");
    // Wait for the UI (the lab is up and the agents are running by then).
    let started = Instant::now();
    let (demo_pid, run_dir) = loop {
        let pane_text = tmux(&["capture-pane", "-p", "-t", &name]);
        if let Some(demo_pid) = demo_pid_in(&pane_pid, pane) {
            let run_dir = format!("/tmp/wedgewatch-demo-{demo_pid}");
            if pane_text.contains("Overview") && processes_mentioning(&run_dir).len() >= 4 {
                break (demo_pid, run_dir);
            }
        }
        if started.elapsed() > Duration::from_secs(120) {
            let _ = tmux(&["kill-session", "-t", &name]);
            panic!("the demo's UI did not come up; pane:\n{pane_text}");
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    // Kill the terminal, as closing its window does.
    tmux(&["kill-session", "-t", &name]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        // With the demo leading the session more hang-ups arrive late (tmux signals the
        // pane's group, the kernel the session when the pty closes); on a loaded machine one
        // can land after the UI has returned, while the demo stops its daemon: it must not
        // end the demo before the teardown. Sent until the demo is gone.
        let demo_alive = Path::new(&format!("/proc/{demo_pid}")).exists();
        if demo_alive && matches!(pane, Pane::Direct) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(demo_pid),
                nix::sys::signal::Signal::SIGHUP,
            );
        }
        let left = processes_mentioning(&run_dir);
        if !demo_alive && left.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            let said = std::fs::read_to_string(&log).unwrap_or_default();
            if demo_alive {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(demo_pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            let _ = Command::new("python3")
                .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/lab/lab.py"))
                .args(["down", "--run-dir", &run_dir])
                .output();
            panic!(
                "30 s after its terminal died: demo alive {demo_alive}, lab processes left \
                 {left:?}; the demo's stderr:\n{said}"
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(!Path::new(&run_dir).exists(), "{run_dir} removed");
    let _ = std::fs::remove_file(&log);
}

/// The demo's pid: the pane's process itself, or the shell's one child.
fn demo_pid_in(pane_pid: &str, pane: Pane) -> Option<i32> {
    let pid: i32 = pane_pid.parse().ok()?;
    match pane {
        Pane::Direct => Some(pid),
        Pane::UnderAShell => {
            let children =
                std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
            children.split_whitespace().next()?.parse().ok()
        }
    }
}
