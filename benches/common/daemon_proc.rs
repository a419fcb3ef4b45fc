//! A `wedgewatch daemon` under measurement, and what /proc says about it: CPU (its own and
//! its py-spy children's), RSS, the bytes of its state dir. Shared by the bench binaries
//! that run the daemon on a lab (`#[path]`-included).
#![allow(dead_code)]

use crate::proc_stat::{cpu_seconds, dir_bytes, live_children_cpu, rss_kib};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A running `wedgewatch daemon` at default cadences, recording on, logging to
/// `<state dir>/daemon.log`; dropping it stops it (SIGTERM, then SIGKILL after 10 s).
pub struct Daemon {
    pub child: Child,
    pub state_dir: tempfile::TempDir,
}

/// The wedgewatch binary with the lab's fake NVML and the venv's py-spy, and
/// `--thresholds FILE` when given (e.g. `stacks_adaptive = false`).
pub fn wedgewatch(nvml_dir: &Path, py_spy: &Path, thresholds: Option<&Path>) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_wedgewatch"));
    c.env("WEDGEWATCH_NVML_LIB", env!("FAKE_NVML_PATH"))
        .env("FAKE_NVML_DIR", nvml_dir)
        .env("WEDGEWATCH_PY_SPY", py_spy)
        .stdin(Stdio::null());
    if let Some(t) = thresholds {
        c.arg("--thresholds").arg(t);
    }
    c
}

impl Daemon {
    pub fn start(nvml_dir: &Path, py_spy: &Path, thresholds: Option<&Path>) -> Daemon {
        let state_dir = tempfile::Builder::new()
            .prefix("ww-bench-daemon-")
            .tempdir()
            .expect("state dir");
        let log = std::fs::File::create(state_dir.path().join("daemon.log")).expect("log file");
        let child = wedgewatch(nvml_dir, py_spy, thresholds)
            .args(["daemon", "--state-dir"])
            .arg(state_dir.path())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn wedgewatch daemon");
        Daemon { child, state_dir }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_path(&self) -> PathBuf {
        self.state_dir.path().join("daemon.log")
    }

    /// True while the daemon has not exited.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn stop(&mut self) {
        crate::stop::stop_child(&mut self.child);
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(10)..].join("\n")
    }

    /// CPU seconds of the daemon, its reaped children and its live ones (py-spy mid-dump).
    pub fn cpu_seconds(&self) -> f64 {
        cpu_seconds(self.pid()).unwrap_or(0.0) + live_children_cpu(self.pid())
    }

    pub fn rss_kib(&self) -> u64 {
        rss_kib(self.pid()).unwrap_or(0)
    }

    /// Bytes under the state dir but the log: the recording (and baselines).
    pub fn recording_bytes(&self) -> u64 {
        dir_bytes(self.state_dir.path())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

pub fn env_f64(name: &str, default: f64) -> f64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The value at quantile `q` (0..=1) of `v` (sorted here; nearest rank).
pub fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}
