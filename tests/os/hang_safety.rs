//! Nothing the tool reads or runs can keep it alive past its window, and nothing it spawned
//! outlives it: /proc reads that block (a FIFO in a fake procfs tree blocks `open` forever,
//! like a read behind a process's held mmap lock), and SIGTERM/SIGINT to a one-shot verb.

use wedgewatch_testkit::shapes;

use shapes::{fixture_proc, wedgewatch};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use wedgewatch_testkit::timing::within;

/// Copies a fixture procfs tree (files, directories, symlinks).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let (src, dst) = (e.path(), to.join(e.file_name()));
        let ft = e.file_type().unwrap();
        if ft.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&src).unwrap(), &dst).unwrap();
        } else if ft.is_dir() {
            copy_tree(&src, &dst);
        } else {
            std::fs::copy(&src, &dst).unwrap();
        }
    }
}

/// Replaces a file with a FIFO nobody writes to.
fn block(path: &Path) {
    std::fs::remove_file(path).unwrap();
    nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
}

/// Waits for `child` at most `limit`; kills it past that. Returns how long it ran and its
/// exit code (None: killed by us).
fn wait_at_most(child: &mut Child, limit: Duration) -> (Duration, Option<i32>) {
    let t0 = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return (t0.elapsed(), s.code());
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return (t0.elapsed(), None);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn snapshot_ends_within_window_plus_2s_when_proc_reads_block() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("proc");
    copy_tree(&fixture_proc("container"), &root);
    // Discovery reads 104's cmdline; the processes source reads 101's environ.
    block(&root.join("104/cmdline"));
    block(&root.join("101/environ"));
    let mut child = wedgewatch()
        .args([
            "snapshot",
            "--json",
            "--window",
            "3",
            "--no-daemon",
            "--proc-root",
        ])
        .arg(&root)
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .env("WEDGEWATCH_PY_SPY", "/nonexistent/py-spy")
        .env("WEDGEWATCH_NVML_LIB", "/nonexistent/libnvidia-ml.so.1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut s);
        s
    });
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut out, &mut s);
        s
    });
    let (took, code) = wait_at_most(&mut child, Duration::from_secs(30));
    let json = reader.join().unwrap();
    let stderr = err_reader.join().unwrap();
    assert_eq!(code, Some(0), "ran {took:?}: {stderr}");
    // Window 3 s + 2 s, plus slack; the blocked reads never end. (A 1 s window on a
    // loaded 2-core machine can end before the processes source's first read timed out.)
    assert!(took < within(Duration::from_secs(5)), "took {took:?}");
    // The first tick times out on the read; later ticks say it is still blocked.
    assert!(
        json.contains("timed out reading") || json.contains("still blocked reading"),
        "{json:.2000}"
    );
}

#[test]
fn discovery_gives_up_on_a_blocked_cmdline_and_finds_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    copy_tree(&fixture_proc("container"), dir.path());
    block(&dir.path().join("104/cmdline"));
    let opts = wedgewatch::discover::DiscoverOptions {
        proc_root: dir.path().to_path_buf(),
        query_endpoints: false,
        ..Default::default()
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let probes = wedgewatch::probes::ProbeSet::builtin().unwrap();
        let _ = tx.send(wedgewatch::discover::discover(&probes, &opts));
    });
    let topo = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("discovery hung on a blocked read")
        .unwrap();
    assert!(
        topo.component("decode@127.0.0.1:31012").is_some(),
        "{topo:?}"
    );
}

/// A fake py-spy that records its pid and sleeps "forever".
fn sleeping_py_spy(dir: &Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join("py-spy");
    let pids = dir.join("pids");
    std::fs::write(
        &p,
        format!("#!/bin/sh\necho $$ >> {}\nexec sleep 600\n", pids.display()),
    )
    .unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

fn pids_in(file: &Path) -> Vec<i32> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

#[test]
fn sigterm_sigint_and_sigkill_to_snapshot_kill_its_py_spy_children() {
    // A Python target for py-spy (/usr/bin/python3: not a shim that execs later).
    let mut target = Command::new("/usr/bin/python3")
        .args(["-c", "import time; time.sleep(120)"])
        .spawn()
        .unwrap();
    use nix::sys::signal::{SIGINT, SIGKILL, SIGTERM};
    // SIGKILL cannot be handled: the children die by PR_SET_PDEATHSIG alone.
    for (sig, code) in [(SIGTERM, Some(143)), (SIGINT, Some(130)), (SIGKILL, None)] {
        let dir = tempfile::tempdir().unwrap();
        let py_spy = sleeping_py_spy(dir.path());
        let mut ww = wedgewatch()
            .args([
                "snapshot",
                "--json",
                "--window",
                "60",
                "--no-daemon",
                "--pid",
            ])
            .arg(target.id().to_string())
            .arg("--py-spy")
            .arg(&py_spy)
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .env("WEDGEWATCH_NVML_LIB", "/nonexistent/libnvidia-ml.so.1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Signal while a fake py-spy is running (each lives up to the 2 s dump timeout).
        let pids = dir.path().join("pids");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !pids_in(&pids).into_iter().any(alive) {
            assert!(Instant::now() < deadline, "py-spy never started");
            std::thread::sleep(Duration::from_millis(10));
        }
        let me = nix::unistd::Pid::from_raw(ww.id() as i32);
        nix::sys::signal::kill(me, sig).unwrap();
        let (_, exit) = wait_at_most(&mut ww, Duration::from_secs(20));
        assert_eq!(exit, code, "{sig}: exit status");
        // Orphans are reparented and reaped; give that a moment on a loaded box.
        let deadline = Instant::now() + Duration::from_secs(10);
        while pids_in(&pids).into_iter().any(alive) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let left: Vec<i32> = pids_in(&pids).into_iter().filter(|&p| alive(p)).collect();
        for &p in &left {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), nix::sys::signal::SIGKILL);
        }
        assert!(
            left.is_empty(),
            "{sig}: py-spy children outlived wedgewatch: {left:?}"
        );
    }
    let _ = target.kill();
    let _ = target.wait();
}
