//! The discovery bench's second part: the daemon's CPU with and without the extra processes
//! (issue 15: within 1.1x). A fresh `wedgewatch daemon --no-record` (default cadences,
//! rediscovery every 10 s) runs on the host with the bench's fake stack; after a warm-up its
//! CPU (utime+stime, plus reaped and live children: py-spy) is measured over a block.
//! Blocks alternate, which arm goes first swapping every round.

use crate::proc_stat::{cpu_seconds, live_children_cpu};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running daemon; dropping it stops it (SIGTERM, then SIGKILL) and waits for it.
struct Daemon {
    child: Child,
    _state: tempfile::TempDir,
}

impl Daemon {
    fn start() -> Daemon {
        let state = tempfile::Builder::new()
            .prefix("ww-bench-discovery-")
            .tempdir()
            .expect("state dir");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_wedgewatch"));
        cmd.args(["daemon", "--no-record", "--state-dir"])
            .arg(state.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = cmd.spawn().expect("spawn wedgewatch daemon");
        Daemon {
            child,
            _state: state,
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        crate::stop::stop_child(&mut self.child);
    }
}

fn total_cpu(pid: u32) -> f64 {
    cpu_seconds(pid).unwrap_or(f64::NAN) + live_children_cpu(pid)
}

/// % of one core the daemon used over `secs` after `warmup` secs; panics when the daemon
/// did not live through it (its CPU would be a dead process's).
pub fn daemon_block(warmup: u64, secs: u64) -> f64 {
    let mut d = Daemon::start();
    let pid = d.child.id();
    std::thread::sleep(Duration::from_secs(warmup));
    let (t0, c0) = (Instant::now(), total_cpu(pid));
    std::thread::sleep(Duration::from_secs(secs));
    let (t1, c1) = (Instant::now(), total_cpu(pid));
    let status = d.child.try_wait();
    assert!(
        matches!(status, Ok(None)),
        "the daemon exited during its block: {status:?}"
    );
    drop(d);
    100.0 * (c1 - c0) / (t1 - t0).as_secs_f64()
}
