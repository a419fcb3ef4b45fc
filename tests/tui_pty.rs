//! Smoke test of `tui::run` on a real pseudo-terminal: the `tui_replay` example runs under
//! tmux on the wedged fixture; we send keys and read the pane. Checks that the Requests view
//! shows the stuck requests, that `q` exits with status 0, and that the terminal is restored
//! (the alternate screen is left). Needs tmux; skipped loudly without it.
#![cfg(feature = "tui")]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Kills the tmux session on every exit path.
struct Session(String);

impl Drop for Session {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &self.0])
            .output();
    }
}

fn tmux(args: &[&str]) -> String {
    let out = Command::new("tmux").args(args).output().expect("tmux runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn capture(session: &str) -> String {
    tmux(&["capture-pane", "-p", "-t", session])
}

/// Polls the pane until `pred` holds (bounded: 20 s).
fn wait_for(session: &str, what: &str, pred: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let pane = capture(session);
        if pred(&pane) {
            return pane;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; pane:\n{pane}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn example_binary() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let status = Command::new(cargo)
        .args(["build", "--quiet", "--example", "tui_replay"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("cargo build runs");
    assert!(status.success(), "building the tui_replay example failed");
    // target/debug/deps/<this test> -> target/debug/examples/tui_replay
    let exe = std::env::current_exe().expect("current exe");
    let debug = exe
        .parent()
        .and_then(Path::parent)
        .expect("target dir layout");
    debug.join("examples").join("tui_replay")
}

fn tmux_missing() -> bool {
    if Command::new("tmux").arg("-V").output().is_err() {
        eprintln!("SKIPPED: tmux not installed; the pseudo-terminal smoke test did not run");
        return true;
    }
    false
}

/// Starts the replay example on the wedged fixture in a detached 120x32 tmux session. A
/// shell prints a marker after the UI exits, so we can see the screen was restored and read
/// the exit status from the returned file.
fn start(tag: &str) -> (Session, PathBuf) {
    let bin = example_binary();
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/snapshots/wedged.json");
    let name = format!("ww-tui-{tag}-{}", std::process::id());
    let rc_file = std::env::temp_dir().join(format!("{name}.rc"));
    let _ = std::fs::remove_file(&rc_file);
    let cmd = format!(
        "{} {}; echo $? > {}; echo UI-EXITED; sleep 30",
        bin.display(),
        fixture.display(),
        rc_file.display()
    );
    let out = Command::new("tmux")
        .args([
            "new-session",
            "-d",
            "-s",
            &name,
            "-x",
            "120",
            "-y",
            "32",
            &cmd,
        ])
        .output()
        .expect("tmux new-session");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (Session(name), rc_file)
}

fn exit_status(rc_file: &Path) -> String {
    let rc = std::fs::read_to_string(rc_file).expect("exit status written");
    let _ = std::fs::remove_file(rc_file);
    rc.trim().to_string()
}

#[test]
fn real_terminal_shows_stuck_requests_and_quits_cleanly() {
    if tmux_missing() {
        return;
    }
    let (session, rc_file) = start("keys");
    wait_for(&session.0, "the Overview", |p| {
        p.contains("CRIT wedged_request")
    });
    tmux(&["send-keys", "-t", &session.0, "2"]);
    let pane = wait_for(&session.0, "the Requests view", |p| p.contains("2 stuck"));
    let lines: Vec<&str> = pane.lines().collect();
    let first = lines
        .iter()
        .position(|l| l.contains("ex-0311-p"))
        .expect("stuck request shown");
    assert!(lines[first].contains("decode"), "{}", lines[first]);
    assert!(lines.iter().position(|l| l.contains("ex-0305-p")) > Some(first));

    tmux(&["send-keys", "-t", &session.0, "?"]);
    wait_for(&session.0, "the help overlay", |p| {
        p.contains("freeze the display")
    });
    tmux(&["send-keys", "-t", &session.0, "Escape"]);
    tmux(&["send-keys", "-t", &session.0, "q"]);
    let pane = wait_for(&session.0, "the UI to exit", |p| p.contains("UI-EXITED"));
    // Back on the normal screen: the UI's rows are gone.
    assert!(
        !pane.contains("2 stuck"),
        "alternate screen not left:\n{pane}"
    );
    assert_eq!(exit_status(&rc_file), "0");
}

#[test]
fn sigterm_from_outside_restores_the_terminal() {
    if tmux_missing() {
        return;
    }
    let (session, rc_file) = start("term");
    wait_for(&session.0, "the Overview", |p| {
        p.contains("CRIT wedged_request")
    });
    // The pane runs `sh -c`; the UI is its child.
    let shell = tmux(&["display-message", "-p", "-t", &session.0, "#{pane_pid}"]);
    let shell = shell.trim();
    let children = std::fs::read_to_string(format!("/proc/{shell}/task/{shell}/children"))
        .expect("children of the pane shell");
    let ui: i32 = children
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .expect("UI process is the shell's child");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(ui),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("signal the UI we started");
    let pane = wait_for(&session.0, "the UI to exit", |p| p.contains("UI-EXITED"));
    assert!(
        !pane.contains("CRIT wedged_request"),
        "alternate screen not left:\n{pane}"
    );
    assert_eq!(exit_status(&rc_file), "0", "a stop signal is a clean exit");
}
