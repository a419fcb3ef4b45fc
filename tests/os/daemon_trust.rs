//! The daemon trusts no directory, socket or request another user controls. The suite runs
//! as root; "another user" is uid 65534 (nobody): directories chowned to it, and processes
//! started with `Command::uid` (no setuid in the test process itself).

use wedgewatch_testkit::shapes;

use shapes::{fixture_proc, wedgewatch};
use std::os::unix::fs::{chown, MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;
use wedgewatch::clock::Clock;
use wedgewatch::daemon::{query, Daemon, DaemonConfig, DiscoverFn};
use wedgewatch::model::{Sample, SourceKind, SourceStatus, Topology};
use wedgewatch::sources::{BoxFuture, Source};

const NOBODY: u32 = 65534;

/// Playing "another user" needs root (chown, `Command::uid`); the suite runs as root.
fn not_root() -> bool {
    let skip = !nix::unistd::geteuid().is_root();
    if skip {
        eprintln!("skipped: needs root to play another user");
    }
    skip
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// A `wedgewatch daemon` process, killed (by its pid) on drop.
struct DaemonProcess(Child);
impl Drop for DaemonProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn daemon_cmd(state: &Path) -> Command {
    let mut cmd = wedgewatch();
    cmd.args(["daemon", "--no-record", "--state-dir"])
        .arg(state)
        .arg("--proc-root")
        .arg(fixture_proc("container"))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd
}

fn wait_for_socket(sock: &Path) {
    for _ in 0..200 {
        if sock.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("no socket at {}", sock.display());
}

/// `snapshot --json` against the daemon of `state`, optionally as another uid: (stdout, stderr).
fn snapshot_via(state: &Path, uid: Option<u32>) -> (String, String) {
    let mut cmd = wedgewatch();
    cmd.args(["snapshot", "--json", "--window", "0", "--state-dir"])
        .arg(state)
        .arg("--proc-root")
        .arg(fixture_proc("container"));
    if let Some(u) = uid {
        cmd.uid(u).gid(u).env("HOME", "/");
    }
    let out = cmd.output().expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_world_writable_state_dir_of_another_user_is_refused() {
    if not_root() {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let state = tmp.path().join("state");
    std::fs::create_dir(&state).expect("mkdir");
    chown(&state, Some(NOBODY), Some(NOBODY)).expect("chown");
    chmod(&state, 0o777);
    let out = daemon_cmd(&state)
        .args(["--for", "2s"])
        .stderr(Stdio::piped())
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("owned by uid 65534"), "{err}");
    assert_eq!(
        std::fs::read_dir(&state).expect("ls").count(),
        0,
        "nothing written"
    );
}

#[test]
fn a_symlinked_recording_dir_is_refused() {
    let tmp = tempfile::tempdir().expect("tmp");
    let state = tmp.path().join("state");
    std::fs::create_dir(&state).expect("mkdir");
    chmod(&state, 0o700);
    let chosen = tmp.path().join("chosen-by-someone-else");
    std::fs::create_dir(&chosen).expect("mkdir");
    std::os::unix::fs::symlink(&chosen, state.join("recording")).expect("ln");
    let mut cmd = wedgewatch();
    cmd.args(["daemon", "--for", "2s", "--state-dir"])
        .arg(&state)
        .arg("--proc-root")
        .arg(fixture_proc("container"));
    let out = cmd.output().expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("recording: is a symbolic link"), "{err}");
    assert_eq!(
        std::fs::read_dir(&chosen).expect("ls").count(),
        0,
        "nothing written"
    );
    assert!(
        !state.join("daemon.sock").exists(),
        "socket removed on the way out"
    );
}

/// A traversable directory owned by nobody, holding nobody's state dir.
fn nobodys_state_dir(tmp: &Path) -> PathBuf {
    chmod(tmp, 0o755);
    let state = tmp.join("planted");
    std::fs::create_dir(&state).expect("mkdir");
    chown(&state, Some(NOBODY), Some(NOBODY)).expect("chown");
    chmod(&state, 0o700);
    state
}

#[test]
fn a_socket_planted_by_another_user_is_not_trusted() {
    if not_root() {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let state = nobodys_state_dir(tmp.path());
    let _planted = DaemonProcess(
        daemon_cmd(&state)
            .args(["--for", "60s"])
            .uid(NOBODY)
            .gid(NOBODY)
            .env("HOME", "/")
            .spawn()
            .expect("spawn"),
    );
    let sock = state.join("daemon.sock");
    wait_for_socket(&sock);
    assert_eq!(std::fs::metadata(&sock).expect("stat").uid(), NOBODY);
    // root's client: a clear warning, then it samples here instead of believing the socket
    let (stdout, stderr) = snapshot_via(&state, None);
    assert!(stderr.contains("runs as uid 65534"), "{stderr}");
    assert!(stderr.contains("sampling here instead"), "{stderr}");
    assert!(!stderr.contains("using the daemon"), "{stderr}");
    assert!(stdout.contains("wedgewatch.snapshot/1"));
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let e = rt
        .block_on(query(&sock, "snapshot", 2000))
        .expect_err("untrusted");
    assert!(e.to_string().contains("not trusting it"), "{e}");
}

#[test]
fn the_daemon_refuses_clients_of_another_uid() {
    if not_root() {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    chmod(tmp.path(), 0o755);
    let state = tmp.path().join("state");
    std::fs::create_dir(&state).expect("mkdir");
    chmod(&state, 0o711); // others may traverse, not write: accepted as a state dir
    let _daemon = DaemonProcess(
        daemon_cmd(&state)
            .args(["--for", "60s"])
            .spawn()
            .expect("spawn"),
    );
    let sock = state.join("daemon.sock");
    wait_for_socket(&sock);
    // Only the peer check stands between nobody and the daemon now.
    chmod(&sock, 0o666);
    let (_, stderr) = snapshot_via(&state, Some(NOBODY));
    assert!(
        stderr.contains("uid 65534 may not use this daemon"),
        "{stderr}"
    );
    assert!(!stderr.contains("using the daemon"), "{stderr}");
    let (_, stderr) = snapshot_via(&state, None);
    assert!(
        stderr.contains("using the daemon"),
        "root is served: {stderr}"
    );
}

/// A source that returns an empty sample (a daemon with no source at all stops at once).
struct Idle;
impl Source for Idle {
    fn kind(&self) -> SourceKind {
        SourceKind::Gpu
    }
    fn sample<'a>(&'a self, _: &'a Topology, clock: &'a dyn Clock) -> BoxFuture<'a, Sample> {
        Box::pin(async move {
            Sample {
                t_ms: clock.now_ms(),
                status: SourceStatus::ok(),
                took_ms: 0,
                payload: wedgewatch::sampler::empty_payload(SourceKind::Gpu),
            }
        })
    }
}

fn in_process_daemon(state: &Path) -> (tokio::sync::watch::Sender<bool>, Daemon) {
    let mut cfg = DaemonConfig::new(state.to_path_buf());
    cfg.rotation = None;
    let discover: DiscoverFn = Arc::new(|| Box::pin(async { Ok(Default::default()) }));
    let mut d = Daemon::new(cfg, Arc::new(wedgewatch::clock::SystemClock), discover);
    d.add_source(Arc::new(Idle), 100, 500);
    let (tx, _) = tokio::sync::watch::channel(false);
    (tx, d)
}

async fn wait_for_ping(sock: &Path) {
    for _ in 0..200 {
        if query(sock, "ping", 500).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("daemon never answered ping");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_daemon_on_the_same_state_dir_is_refused_by_the_lock() {
    let tmp = tempfile::tempdir().expect("tmp");
    let state = tmp.path().join("state");
    let (stop, first) = in_process_daemon(&state);
    let first = tokio::spawn(first.run(stop.subscribe()));
    wait_for_ping(&state.join("daemon.sock")).await;
    // A deleted socket used to let a second daemon share the directory.
    std::fs::remove_file(state.join("daemon.sock")).expect("rm");
    let (stop2, second) = in_process_daemon(&state);
    let r = tokio::time::timeout(Duration::from_secs(5), second.run(stop2.subscribe()))
        .await
        .expect("refused at once, not running");
    let e = r.expect_err("locked");
    assert!(
        e.to_string().contains("another wedgewatch daemon (pid"),
        "{e}"
    );
    let _ = stop.send(true);
    first.await.expect("join").expect("first daemon");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_leaves_a_socket_that_replaced_its_own() {
    let tmp = tempfile::tempdir().expect("tmp");
    let state = tmp.path().join("state");
    let sock = state.join("daemon.sock");
    let (stop, d) = in_process_daemon(&state);
    let task = tokio::spawn(d.run(stop.subscribe()));
    wait_for_ping(&sock).await;
    std::fs::remove_file(&sock).expect("rm");
    let _other = std::os::unix::net::UnixListener::bind(&sock).expect("bind");
    let other_ino = std::fs::metadata(&sock).expect("stat").ino();
    let _ = stop.send(true);
    task.await.expect("join").expect("daemon");
    let md = std::fs::symlink_metadata(&sock).expect("the other socket is still there");
    assert_eq!(md.ino(), other_ino);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overflowing_window_gets_an_error_reply_not_a_panic() {
    let tmp = tempfile::tempdir().expect("tmp");
    let state = tmp.path().join("state");
    let sock = state.join("daemon.sock");
    let (stop, d) = in_process_daemon(&state);
    let task = tokio::spawn(d.run(stop.subscribe()));
    wait_for_ping(&sock).await;
    for bad in ["snapshot 9223372036854776", "perfetto 18446744073709551616"] {
        let e = query(&sock, bad, 2000).await.expect_err(bad);
        let msg = e.to_string();
        assert!(msg.contains("bad window"), "{bad}: {msg}");
        assert!(!msg.contains("panic"), "{bad}: {msg}");
    }
    let ok = query(&sock, "snapshot 604800", 2000)
        .await
        .expect("clamped");
    assert!(ok.get("parts").is_some());
    let _ = stop.send(true);
    task.await.expect("join").expect("daemon");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_at_the_socket_path_is_never_removed() {
    let tmp = tempfile::tempdir().expect("tmp");
    let state = tmp.path().join("state");
    std::fs::create_dir(&state).expect("mkdir");
    chmod(&state, 0o700);
    let sock = state.join("daemon.sock");
    std::fs::write(&sock, "not wedgewatch's").expect("write");
    let (stop, d) = in_process_daemon(&state);
    let e = tokio::time::timeout(Duration::from_secs(5), d.run(stop.subscribe()))
        .await
        .expect("refused at once")
        .expect_err("not a socket");
    assert!(e.to_string().contains("is not a socket"), "{e}");
    assert_eq!(
        std::fs::read_to_string(&sock).expect("kept"),
        "not wedgewatch's"
    );
}
