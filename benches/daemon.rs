//! Daemon cost on the lab (`cargo bench --bench daemon`), harness = false. Issue 6 goals:
//! CPU of the daemon (py-spy children included) < 3 % of one core, RSS < 64 MiB after 30 min,
//! recording growth < 10 MiB/h, harness throughput with the daemon >= 0.98x without it.
//!
//! 1. Throughput, side by side: `WW_BENCH_PAIRS` (default 3) pairs of blocks of
//!    `WW_BENCH_BLOCK_SECS` (default 60) under the harness's steady load (4 agents, 4 rounds a
//!    run, runs back to back), one block without a daemon and one with a fresh
//!    `wedgewatch daemon` (default cadences, recording on); which goes first swaps every pair.
//!    Requests/s = completed rounds / wall time of the block's harness runs.
//! 2. Steady state: one daemon for `WW_BENCH_MINUTES` (default 3) under the same load,
//!    sampled every 10 s: CPU (utime+stime of the daemon plus cutime+cstime, i.e. the reaped
//!    py-spy children) as % of one core, VmRSS, bytes in the state dir (the recording).
//!    The first minute (startup, history filling) is reported separately.
//!
//! The binary is `CARGO_BIN_EXE_wedgewatch` (the bench profile's build of this crate).
//! NVML is the lab's fake library (`FAKE_NVML_PATH`, built by build.rs), py-spy
//! `tests/lab/.venv/bin/py-spy`. Exits 1 when a goal is missed.
//!
//! Quick mode (`cargo test --bench daemon`, `common/mode.rs`): one pair of 3 s blocks, 5 s
//! of steady state, one sample; it fails when the daemon exits early or a block
//! completes no request, and judges no goal.

#[path = "common/env.rs"]
mod env;
use wedgewatch_testkit::lab;
#[path = "common/mode.rs"]
mod mode;
#[path = "common/proc_stat.rs"]
mod proc_stat;
#[path = "common/stop.rs"]
mod stop;
use proc_stat::{cpu_seconds, dir_bytes, live_children_cpu, rss_kib};

use serde_json::Value;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const AGENTS: u32 = 4;
const ROUNDS: u32 = 4;

/// A running `wedgewatch daemon`; dropping it stops it (SIGTERM, then SIGKILL after 10 s).
struct Daemon {
    child: Child,
    state_dir: tempfile::TempDir,
}

impl Daemon {
    fn start(lab: &lab::Lab) -> Daemon {
        let state_dir = tempfile::Builder::new()
            .prefix("ww-bench-daemon-")
            .tempdir()
            .expect("state dir");
        let log = std::fs::File::create(state_dir.path().join("daemon.log")).expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_wedgewatch"))
            .args(["daemon", "--state-dir"])
            .arg(state_dir.path())
            .env("WEDGEWATCH_NVML_LIB", env!("FAKE_NVML_PATH"))
            .env("FAKE_NVML_DIR", lab.nvml_dir())
            .env("WEDGEWATCH_PY_SPY", lab::venv_bin("py-spy"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn wedgewatch daemon");
        Daemon { child, state_dir }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn stop(&mut self) {
        stop::stop_child(&mut self.child);
    }

    fn log_tail(&self) -> String {
        let text =
            std::fs::read_to_string(self.state_dir.path().join("daemon.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(10)..].join("\n")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// The harness's steady load: runs back to back on a thread, counting completed rounds.
struct Load {
    stop: Arc<AtomicBool>,
    rounds: Arc<AtomicU64>,
    failures: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn completed_rounds(report: &Value) -> u64 {
    report["agents"]
        .as_array()
        .map(|agents| {
            agents
                .iter()
                .map(|a| a["rounds_completed"].as_u64().unwrap_or(0))
                .sum()
        })
        .unwrap_or(0)
}

/// One harness run: (completed rounds, whether it was incomplete).
fn load_once(lab: &lab::Lab) -> (u64, bool) {
    match lab.load(AGENTS, ROUNDS, 20.0) {
        Ok(r) => (
            completed_rounds(&r),
            r["summary"]["all_completed"] != Value::Bool(true),
        ),
        Err(e) => {
            eprintln!("daemon bench: harness run failed: {e}");
            (0, true)
        }
    }
}

/// Harness runs back to back until `secs` have passed (the last run is finished, not cut):
/// (completed rounds, wall seconds, incomplete runs).
fn load_block(lab: &lab::Lab, secs: f64) -> (u64, f64, u64) {
    let start = Instant::now();
    let (mut rounds, mut failed) = (0, 0);
    while start.elapsed().as_secs_f64() < secs {
        let (n, bad) = load_once(lab);
        rounds += n;
        failed += u64::from(bad);
    }
    (rounds, start.elapsed().as_secs_f64(), failed)
}

impl Load {
    fn start(lab: Arc<lab::Lab>) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(AtomicU64::new(0));
        let (s, r, f) = (stop.clone(), rounds.clone(), failures.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let (n, bad) = load_once(&lab);
                r.fetch_add(n, Ordering::Relaxed);
                f.fetch_add(u64::from(bad), Ordering::Relaxed);
            }
        });
        Load {
            stop,
            rounds,
            failures,
            thread: Some(thread),
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

fn main() {
    // Its daemon discovers every stack on the machine: no other test's stack runs beside it.
    let _alone = wedgewatch_testkit::lab::exclusive();
    let mode = mode::Mode::from_args();
    let pairs = mode.knob("WW_BENCH_PAIRS", 3.0, 1.0) as usize;
    let block_secs = mode.knob("WW_BENCH_BLOCK_SECS", 60.0, 3.0);
    let minutes = mode.knob("WW_BENCH_MINUTES", 3.0, 5.0 / 60.0);
    // The steady state's sampling period, and the daemon's start before a block counts.
    let every = mode.pick(Duration::from_secs(10), Duration::from_secs(5));
    let settle = mode.pick(Duration::from_secs(5), Duration::from_secs(2));
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "daemon bench: binary {}, {cores} cores, load average {} at start",
        env!("CARGO_BIN_EXE_wedgewatch"),
        loadavg()
    );
    let lab = Arc::new(lab::Lab::up(&lab::LabOptions::pd()).expect("lab up"));
    // `ok`: every goal met; `broken`: the bench itself failed (fails a quick run too).
    let (mut ok, mut broken) = (true, false);

    // 1. Throughput, alternating.
    let mut ratios = Vec::new();
    let (mut off_all, mut on_all) = (Vec::new(), Vec::new());
    for pair in 0..pairs {
        let mut rates = [0.0f64; 2]; // [off, on]
        let order = if pair % 2 == 0 { [0, 1] } else { [1, 0] };
        for which in order {
            let daemon = (which == 1).then(|| Daemon::start(&lab));
            if daemon.is_some() {
                // Let the daemon discover and take its first samples before counting.
                std::thread::sleep(settle);
            }
            let (n, secs, failed) = load_block(&lab, block_secs);
            rates[which] = n as f64 / secs;
            broken |= n == 0;
            if let Some(mut d) = daemon {
                if let Ok(Some(st)) = d.child.try_wait() {
                    println!("daemon exited early ({st}):\n{}", d.log_tail());
                    broken = true;
                }
                d.stop();
            }
            println!(
                "  pair {pair} {}: {n} requests in {secs:.1} s = {:.2} req/s ({failed} runs incomplete), load {}",
                if which == 1 { "with daemon   " } else { "without daemon" },
                rates[which],
                loadavg()
            );
        }
        off_all.push(rates[0]);
        on_all.push(rates[1]);
        ratios.push(rates[1] / rates[0]);
    }
    if pairs > 0 {
        let r = median(&mut ratios.clone());
        let (lo, hi) = ratios
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        println!(
            "throughput: without {:.2} req/s, with {:.2} req/s (medians); ratio median {r:.3} (range {lo:.3}-{hi:.3}) goal >= 0.98 {}",
            median(&mut off_all),
            median(&mut on_all),
            if r >= 0.98 { "OK" } else { "MISSED" }
        );
        ok &= r >= 0.98;
    }

    // 2. Steady state.
    if minutes > 0.0 {
        let mut daemon = Daemon::start(&lab);
        let pid = daemon.pid();
        let load = Load::start(lab.clone());
        let t0 = Instant::now();
        let cpu0 = cpu_seconds(pid).unwrap_or(0.0);
        let mut warm: Option<(Instant, f64, u64)> = None; // after the first minute
        let total = Duration::from_secs_f64(minutes * 60.0);
        let mut last_print = Instant::now() - Duration::from_secs(3600);
        let mut rss_max = 0;
        let mut rss_last = 0;
        let mut cpu_last = cpu0;
        while t0.elapsed() < total {
            std::thread::sleep(every);
            if let Ok(Some(st)) = daemon.child.try_wait() {
                println!("daemon exited early ({st}):\n{}", daemon.log_tail());
                std::process::exit(1);
            }
            let cpu = cpu_seconds(pid).unwrap_or(0.0) + live_children_cpu(pid);
            cpu_last = cpu;
            let rss = rss_kib(pid).unwrap_or(0);
            rss_last = rss;
            rss_max = rss_max.max(rss);
            let bytes = dir_bytes(daemon.state_dir.path());
            let el = t0.elapsed().as_secs_f64();
            if warm.is_none() && el >= 60.0 {
                warm = Some((Instant::now(), cpu, bytes));
            }
            if last_print.elapsed() >= Duration::from_secs(60) || t0.elapsed() >= total {
                last_print = Instant::now();
                println!(
                    "  t={:5.0}s cpu {:5.2} % of a core (cumulative), rss {:6.1} MiB, recording {:8.1} KiB, requests {}, load {}",
                    el,
                    (cpu - cpu0) / el * 100.0,
                    rss as f64 / 1024.0,
                    bytes as f64 / 1024.0,
                    load.rounds.load(Ordering::Relaxed),
                    loadavg()
                );
            }
        }
        let bytes_end = dir_bytes(daemon.state_dir.path());
        let el = t0.elapsed().as_secs_f64();
        let (cpu_pct, growth_mib_h) = match warm {
            Some((tw, cw, bw)) => {
                let dt = tw.elapsed().as_secs_f64();
                (
                    (cpu_last - cw) / dt * 100.0,
                    (bytes_end.saturating_sub(bw)) as f64 / dt * 3600.0 / 1048576.0,
                )
            }
            None => (
                (cpu_last - cpu0) / el * 100.0,
                bytes_end as f64 / el * 3600.0 / 1048576.0,
            ),
        };
        let requests = load.rounds.load(Ordering::Relaxed);
        let failures = load.failures.load(Ordering::Relaxed);
        drop(load);
        daemon.stop();
        let rss_mib = rss_last as f64 / 1024.0;
        println!(
            "steady state over {:.1} min ({requests} requests, {failures} harness runs incomplete), after the first minute:",
            el / 60.0
        );
        println!(
            "  CPU {cpu_pct:.2} % of one core (daemon + py-spy children) goal < 3 {}",
            if cpu_pct < 3.0 { "OK" } else { "MISSED" }
        );
        println!(
            "  RSS at end {rss_mib:.1} MiB (max {:.1}) goal < 64 {}",
            rss_max as f64 / 1024.0,
            if rss_mib < 64.0 { "OK" } else { "MISSED" }
        );
        println!(
            "  recording {:.1} KiB total, growth {growth_mib_h:.2} MiB/h goal < 10 {}",
            bytes_end as f64 / 1024.0,
            if growth_mib_h < 10.0 { "OK" } else { "MISSED" }
        );
        ok &= cpu_pct < 3.0 && rss_mib < 64.0 && growth_mib_h < 10.0;
        broken |= requests == 0;
    }
    println!("load average at end {}", loadavg());
    drop(lab);
    if broken || mode.goal_fails(ok) {
        std::process::exit(1);
    }
}
