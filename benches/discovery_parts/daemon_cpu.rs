//! The discovery bench's second part: the daemon's CPU with and without the extra processes
//! (issue 15: within 1.1x). A fresh `wedgewatch daemon --no-record` (default cadences,
//! rediscovery every 10 s) runs on the host with the bench's fake stack; after a warm-up its
//! CPU (utime+stime, plus reaped and live children: py-spy) is measured over a block.
//! Blocks alternate, which arm goes first swapping every round.

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

/// CPU seconds of `pid` and its reaped children (stat fields 14-17).
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f
        .get(11..15)?
        .iter()
        .filter_map(|v| v.parse::<u64>().ok())
        .sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some(ticks as f64 / hz)
}

/// CPU seconds of the live (not yet reaped) children of `pid` (py-spy mid-dump).
fn live_children_cpu(pid: u32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0.0;
    };
    let mut total = 0.0;
    for t in tasks.flatten() {
        let children = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
        for c in children.split_whitespace().filter_map(|c| c.parse().ok()) {
            total += cpu_seconds(c).unwrap_or(0.0);
        }
    }
    total
}

fn total_cpu(pid: u32) -> f64 {
    cpu_seconds(pid).unwrap_or(f64::NAN) + live_children_cpu(pid)
}

/// % of one core the daemon used over `secs` after `warmup` secs.
pub fn daemon_block(warmup: u64, secs: u64) -> f64 {
    let d = Daemon::start();
    let pid = d.child.id();
    std::thread::sleep(Duration::from_secs(warmup));
    let (t0, c0) = (Instant::now(), total_cpu(pid));
    std::thread::sleep(Duration::from_secs(secs));
    let (t1, c1) = (Instant::now(), total_cpu(pid));
    drop(d);
    100.0 * (c1 - c0) / (t1 - t0).as_secs_f64()
}
