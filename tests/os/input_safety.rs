//! Every reader of snapshot files, bundles and recordings (`report`, `merge`, `diff`,
//! `export --from`, `tui --replay`) takes regular files only, opened without following a
//! link (issue 34, item 11): a FIFO planted as a bundle's `snapshot.json` ends the verb with
//! a one-line error and exit 2 within a bounded time instead of hanging it, and a link to a
//! root-only file is refused, not read as root.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Far above a refused open (milliseconds); a hang is killed here and fails the test.
const LIMIT: Duration = Duration::from_secs(30);

fn snapshot_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/snapshots/wedged.json")
}

/// Runs wedgewatch with `args`; kills it past [`LIMIT`]. Exit code (None: killed), stderr.
fn run_bounded(args: &[&std::ffi::OsStr]) -> (Option<i32>, String) {
    let mut child: Child = Command::new(env!("CARGO_BIN_EXE_wedgewatch"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run wedgewatch");
    let t0 = Instant::now();
    let code = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s.code();
        }
        if t0.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    (code, err)
}

/// Every verb that reads `input` as a snapshot, a bundle or a recording.
fn readers(input: &Path) -> Vec<Vec<std::ffi::OsString>> {
    let good = snapshot_file();
    let v = |a: &[&std::ffi::OsStr]| a.iter().map(|s| s.to_os_string()).collect::<Vec<_>>();
    let i = input.as_os_str();
    vec![
        v(&["report".as_ref(), i]),
        v(&["merge".as_ref(), i, good.as_os_str()]),
        v(&["diff".as_ref(), good.as_os_str(), i]),
        v(&[
            "export".as_ref(),
            "--perfetto".as_ref(),
            "-".as_ref(),
            "--from".as_ref(),
            i,
        ]),
    ]
}

fn assert_all_refused(input: &Path, says: &str) {
    for args in readers(input) {
        let a: Vec<&std::ffi::OsStr> = args.iter().map(|s| s.as_os_str()).collect();
        let (code, err) = run_bounded(&a);
        let verb = args[0].to_string_lossy();
        assert_eq!(code, Some(2), "{verb}: not refused (None: hung): {err}");
        assert_eq!(err.trim().lines().count(), 1, "{verb}: one line: {err}");
        assert!(err.contains(says), "{verb}: {err}");
    }
}

#[test]
fn a_fifo_as_a_bundles_snapshot_is_refused_without_hanging() {
    let tmp = tempfile::tempdir().expect("tmp");
    let bundle = tmp.path().join("bundle");
    std::fs::create_dir(&bundle).expect("mkdir");
    let fifo = bundle.join("snapshot.json");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).expect("fifo");
    assert_all_refused(&bundle, "is not a regular file");
    assert_all_refused(&fifo, "is not a regular file");
}

#[test]
fn a_link_in_a_bundle_to_a_root_only_file_is_not_read() {
    let tmp = tempfile::tempdir().expect("tmp");
    // stands for /etc/shadow: a root-only file, here one that would parse as a snapshot
    let secret = tmp.path().join("root-only.json");
    std::fs::copy(snapshot_file(), &secret).expect("copy");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let bundle = tmp.path().join("bundle");
    std::fs::create_dir(&bundle).expect("mkdir");
    let link = bundle.join("snapshot.json");
    std::os::unix::fs::symlink(&secret, &link).expect("ln");
    assert_all_refused(&bundle, "symbolic link");
    assert_all_refused(&link, "symbolic link");
}
