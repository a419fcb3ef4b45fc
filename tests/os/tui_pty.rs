//! Smoke test of the real binary on a real pseudo-terminal: `wedgewatch tui --replay FILE`
//! runs under tmux on a recording of a wedged lab; we send keys and read the pane. Checks
//! that the Requests view shows the stuck requests (waiting at decode, with their age), that
//! `q` exits with status 0, and that the terminal is restored (the alternate screen is left).
//! Needs tmux; skipped loudly without it.
//!
//! The recording, `tests/fixtures/recordings/wedged-decode.rec`, is 15 s of
//! `wedgewatch record` on the lab (`lab.py up --decode-env
//! SGLANG_DECODE_PREALLOC_SPLIT_TOKENS=100`, then `lab.py load --agents 4 --rounds 5
//! --timeout 60`, recorded 8 s into the load): four agents' requests accepted and never
//! answered by decode. They are 8-23 s old in it, so the UI runs with
//! `short-hang-thresholds.toml` (`wedged_after_ms = 10000`; the default is 30 s).
//! To make it again: the same commands, then `FAKE_NVML_DIR=<run-dir>/nvml wedgewatch record
//! -o wedged-decode.rec --for 15s` while no other lab runs on the machine.
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

fn tmux_missing() -> bool {
    if Command::new("tmux").arg("-V").output().is_err() {
        eprintln!("SKIPPED: tmux not installed; the pseudo-terminal smoke test did not run");
        return true;
    }
    false
}

/// Starts `wedgewatch tui --replay` on the wedged recording in a detached 120x40 tmux session. A
/// shell prints a marker after the UI exits, so we can see the screen was restored and read
/// the exit status from the returned file.
fn start(tag: &str) -> (Session, PathBuf) {
    start_sized(tag, 120, 40)
}

/// [`start`] on a `width`x`height` terminal.
fn start_sized(tag: &str, width: u16, height: u16) -> (Session, PathBuf) {
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/recordings/wedged-decode.rec");
    start_on_sized(tag, &fixture, width, height)
}

/// [`start`] on any file `tui --replay` opens (a recording, a bundle, a snapshot.json).
fn start_on(tag: &str, fixture: &Path) -> (Session, PathBuf) {
    start_on_sized(tag, fixture, 120, 40)
}

/// [`start_on`] on a `width`x`height` terminal.
fn start_on_sized(tag: &str, fixture: &Path, width: u16, height: u16) -> (Session, PathBuf) {
    let bin = Path::new(env!("CARGO_BIN_EXE_wedgewatch"));
    let name = format!("ww-tui-{tag}-{}", std::process::id());
    let rc_file = std::env::temp_dir().join(format!("{name}.rc"));
    let _ = std::fs::remove_file(&rc_file);
    let thresholds = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/recordings/short-hang-thresholds.toml");
    let cmd = format!(
        "{} --thresholds {} tui --replay {}; echo $? > {}; echo UI-EXITED; sleep 30",
        bin.display(),
        thresholds.display(),
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
            &width.to_string(),
            "-y",
            &height.to_string(),
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

/// Rows of the Requests view flagged stuck (`!`) whose stuck hop is decode, waiting.
fn stuck_at_decode(pane: &str) -> Vec<String> {
    pane.lines()
        .filter(|l| l.starts_with("! "))
        .filter(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            words.contains(&"decode") && words.iter().any(|w| w.contains("wait"))
        })
        .map(str::to_string)
        .collect()
}

/// Seconds of an age cell like `21.8s` (None for `736ms` and other forms).
fn age_seconds(row: &str) -> Option<f64> {
    let words: Vec<&str> = row.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "decode")?;
    words.get(at + 1)?.strip_suffix('s')?.parse().ok()
}

#[test]
fn real_terminal_shows_stuck_requests_and_quits_cleanly() {
    if tmux_missing() {
        return;
    }
    let (session, rc_file) = start("keys");
    wait_for(&session.0, "the Overview with the finding", |p| {
        p.contains("CRIT wedged_request")
    });
    tmux(&["send-keys", "-t", &session.0, "2"]);
    // The recording holds four requests accepted by the proxy and never answered (the decode
    // engine dropped them); they are on top, flagged, stuck at decode, waiting, with an age.
    let pane = wait_for(&session.0, "the Requests view", |p| {
        p.contains("4 stuck") && stuck_at_decode(p).len() == 4
    });
    let lines: Vec<&str> = pane.lines().collect();
    let header = lines
        .iter()
        .position(|l| l.contains("STUCK AT") && l.contains("AGE"))
        .expect("Requests header");
    for (i, row) in stuck_at_decode(&pane).iter().enumerate() {
        assert_eq!(lines[header + 1 + i], row, "stuck rows first:\n{pane}");
        assert!(row.contains("proxy@127.0.0.1:"), "{row}");
        let age = age_seconds(row).unwrap_or_else(|| panic!("age of {row}"));
        assert!(age >= 5.0, "stuck for seconds already: {row}");
    }

    tmux(&["send-keys", "-t", &session.0, "?"]);
    wait_for(&session.0, "the help overlay", |p| {
        p.contains("freeze the display")
    });
    tmux(&["send-keys", "-t", &session.0, "Escape"]);
    tmux(&["send-keys", "-t", &session.0, "q"]);
    let pane = wait_for(&session.0, "the UI to exit", |p| p.contains("UI-EXITED"));
    // Back on the normal screen: the UI's rows are gone.
    assert!(
        !pane.contains("STUCK AT") && !pane.contains("4 stuck"),
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

/// At 80x24 the evidence of the finding is below the bottom of the pane: j scrolls through
/// it (before, j/k/PgDn left the pane unchanged and the GPU, stack and metrics evidence
/// never showed), and the Threads view puts the wedged scheduler first.
#[test]
fn at_80x24_the_evidence_scrolls_into_sight() {
    if tmux_missing() {
        return;
    }
    let (session, rc_file) = start_sized("small", 80, 24);
    let t = session.0.as_str();
    wait_for(t, "the UI", |p| p.contains("REPLAY"));
    for _ in 0..3 {
        tmux(&["send-keys", "-t", t, "+"]);
    }
    // The last frame: four requests stuck, more evidence than the pane holds. The replay
    // stays on it, so the findings no longer change under the keys.
    wait_for(t, "the last frame with the finding", |p| {
        p.contains("REPLAY 15/15") && p.contains("CRIT wedged_request")
    });
    tmux(&["send-keys", "-t", t, "Enter"]);
    let first = wait_for(t, "the evidence", |p| p.contains("▾ CRIT wedged_request"));
    assert!(
        !first.contains("[stacks]"),
        "the stack evidence starts below the pane:\n{first}"
    );
    let mut seen = first.clone();
    let mut last = first.clone();
    for _ in 0..40 {
        tmux(&["send-keys", "-t", t, "j"]);
        std::thread::sleep(Duration::from_millis(150));
        last = capture(t);
        seen.push_str(&last);
        if ["[gpu]", "[metrics]", "[stacks]"]
            .iter()
            .all(|e| seen.contains(e))
        {
            break;
        }
    }
    assert_ne!(first, last, "j changes the pane");
    for e in ["[gpu]", "[metrics]", "[stacks]"] {
        assert!(
            seen.contains(e),
            "{e} never scrolled into sight; last pane:\n{last}"
        );
    }
    // Every view's header names the finding; the wedged scheduler is the first thread.
    tmux(&["send-keys", "-t", t, "3"]);
    let pane = wait_for(t, "the Threads view", |p| p.contains("COMPONENT"));
    let lines: Vec<&str> = pane.lines().collect();
    assert!(
        lines[1].starts_with("CRIT wedged_request at decode@"),
        "{pane}"
    );
    let head = lines
        .iter()
        .position(|l| l.starts_with("COMPONENT"))
        .expect("column heads");
    assert!(
        lines[head + 1].starts_with("scheduler@decode"),
        "the wedged scheduler first:\n{pane}"
    );
    tmux(&["send-keys", "-t", t, "q"]);
    wait_for(t, "the UI to exit", |p| p.contains("UI-EXITED"));
    assert_eq!(exit_status(&rc_file), "0");
}

/// The bug-report loop on a real terminal: a bundle written by `snapshot -o` opens with
/// `tui --replay DIR` (or its `snapshot.json`) as a still frame (the finding, the stuck requests), and `q` exits 0.
#[test]
fn a_bundle_replays_as_a_still_frame() {
    if tmux_missing() {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("bundle");
    let snap = wedgewatch::snapshot::read_snapshot(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/snapshots/wedged.json"),
    )
    .expect("fixture");
    wedgewatch::snapshot::write_bundle(
        &snap,
        &Default::default(),
        &dir,
        wedgewatch::snapshot::Overwrite::Refuse,
    )
    .expect("bundle");
    // the directory, then its snapshot.json alone
    for (tag, path) in [
        ("bundle", dir.clone()),
        ("snapjson", dir.join("snapshot.json")),
    ] {
        let (session, rc_file) = start_on(tag, &path);
        wait_for(&session.0, "the Overview of the bundle", |p| {
            p.contains("REPLAY 1/1") && p.contains("wedged_request")
        });
        tmux(&["send-keys", "-t", &session.0, "2"]);
        wait_for(&session.0, "the stuck requests", |p| p.contains("r0311"));
        tmux(&["send-keys", "-t", &session.0, "q"]);
        wait_for(&session.0, "the UI to exit", |p| p.contains("UI-EXITED"));
        assert_eq!(exit_status(&rc_file), "0");
    }
}
