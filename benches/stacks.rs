//! Stacks source benchmark (`cargo bench --bench stacks`), harness = false.
//!
//! 1. Capture wall time: 8 Python processes of 20 threads each (the fake scheduler's 18
//!    workers, its mode watcher and its main loop; each process's count is read from
//!    /proc/PID/task once it runs, and every capture must hold that many), one parallel capture
//!    (`StackSource::capture_once`, 4 py-spy at once) vs a sequential loop of
//!    `py-spy dump --json --nonblocking --pid P` over the same pids, alternating, medians.
//! 2. Pause felt by a target: the largest stall of a tight loop in a 20-thread Python process,
//!    per 1 s window, without sampling, with `--nonblocking` sampling every 100 ms, and (for
//!    contrast) with `--native` sampling.
//!
//! Quick mode (`cargo test --bench stacks`, `common/mode.rs`): 2 processes, 1 round, every
//! pause phase once for 2 s; the same checks, no goal.
//!
//! py-spy: `$WEDGEWATCH_PY_SPY`, else `tests/lab/.venv/bin/py-spy`.

// rusage and clock_gettime through libc, which std does not wrap.
#![allow(unsafe_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use wedgewatch::clock::SystemClock;
use wedgewatch::sources::stacks::{StackSource, StackTarget, StacksConfig};

#[path = "common/env.rs"]
mod env;
#[path = "common/mode.rs"]
mod mode;
use mode::Mode;

/// The fake scheduler's worker threads (`--threads`); its main loop and mode watcher run
/// besides them.
const WORKERS: usize = 18;

/// How much the bench does: full (`cargo bench`) or quick (`cargo test`).
struct Plan {
    processes: usize,
    rounds: usize,
    /// Each pause phase's length.
    phase: Duration,
    /// The pause phases in order.
    phases: &'static [Phase],
}

impl Plan {
    fn new(mode: Mode) -> Plan {
        Plan {
            processes: mode.pick(8, 2),
            rounds: mode.pick(11, 1),
            phase: mode.pick(Duration::from_secs(6), Duration::from_secs(2)),
            phases: mode.pick(&FULL_PHASES, &QUICK_PHASES),
        }
    }
}

/// Each phase twice (`--native` once: it pauses the target).
const FULL_PHASES: [Phase; 9] = [
    Phase::None,
    Phase::Window,
    Phase::Nonblocking,
    Phase::Control,
    Phase::None,
    Phase::Window,
    Phase::Nonblocking,
    Phase::Control,
    Phase::Native,
];
const QUICK_PHASES: [Phase; 5] = [
    Phase::None,
    Phase::Window,
    Phase::Nonblocking,
    Phase::Control,
    Phase::Native,
];

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn py_spy() -> PathBuf {
    std::env::var_os("WEDGEWATCH_PY_SPY")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/lab/.venv/bin/py-spy"))
}

/// CPU time (user + sys, ms) of this process and its reaped children so far.
fn cpu_ms() -> f64 {
    let get = |who| {
        // SAFETY: getrusage only writes the struct we pass.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        unsafe { libc::getrusage(who, &mut ru) };
        let tv = |t: libc::timeval| t.tv_sec as f64 * 1000.0 + t.tv_usec as f64 / 1000.0;
        tv(ru.ru_utime) + tv(ru.ru_stime)
    };
    get(libc::RUSAGE_SELF) + get(libc::RUSAGE_CHILDREN)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// `n` scheduler-shaped fakes, idle (their threads sleep, as most of a real scheduler's do),
/// each with the number of threads it runs once it acknowledged its mode (its loop runs: every
/// thread of it started).
fn start_schedulers(dir: &Path, n: usize) -> Vec<(Proc, usize)> {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pyspy/fake_sglang/scheduler.py");
    let procs: Vec<(Proc, PathBuf)> = (0..n)
        .map(|i| {
            let mode = dir.join(format!("mode{i}"));
            std::fs::write(&mode, "idle").unwrap();
            let child = Command::new("python3")
                .arg(&script)
                .arg(&mode)
                .arg("--threads")
                .arg(WORKERS.to_string())
                .stdin(Stdio::null())
                .spawn()
                .expect("python3");
            (Proc(child), mode.with_extension("ack"))
        })
        .collect();
    procs
        .into_iter()
        .map(|(p, ack)| {
            wait_for(&ack, Duration::from_secs(30));
            let threads = os_threads(p.0.id());
            assert!(
                threads > WORKERS,
                "pid {} runs {threads} threads, fewer than its {WORKERS} workers and main loop",
                p.0.id()
            );
            (p, threads)
        })
        .collect()
}

/// Waits until `path` exists; panics after `limit`.
fn wait_for(path: &Path, limit: Duration) {
    let start = Instant::now();
    while !path.exists() {
        assert!(
            start.elapsed() < limit,
            "{} not written within {limit:?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The threads of `pid` as the kernel counts them (/proc/PID/task).
fn os_threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Medians of (parallel wall, sequential wall, parallel CPU, sequential CPU), ms, and the
/// threads of each process.
fn capture_wall_time(
    py_spy: &Path,
    rt: &tokio::runtime::Runtime,
    plan: &Plan,
) -> ([f64; 4], Vec<usize>) {
    let dir = tempfile::tempdir().unwrap();
    let procs = start_schedulers(dir.path(), plan.processes);
    let threads = |pid: i32| {
        procs
            .iter()
            .find(|p| p.0 .0.id() as i32 == pid)
            .map(|p| p.1)
    };
    let targets: Vec<StackTarget> = procs
        .iter()
        .map(|(p, _)| StackTarget {
            pid: p.0.id() as i32,
            stack: Some("sglang".into()),
            component: None,
            whole_window: true,
        })
        .collect();
    let rules = wedgewatch::probes::ProbeSet::builtin().unwrap().stack_rules;
    let cfg = StacksConfig {
        py_spy: Some(py_spy.to_path_buf()),
        ..StacksConfig::from_env()
    };
    let src = StackSource::new(cfg, &rules).unwrap();
    let (mut par, mut seq) = (Vec::new(), Vec::new());
    let (mut par_cpu, mut seq_cpu) = (Vec::new(), Vec::new());
    for round in 0..plan.rounds {
        // Alternate which goes first, so drift on a noisy machine hits both alike.
        for which in if round % 2 == 0 { [0, 1] } else { [1, 0] } {
            let t = Instant::now();
            let cpu = cpu_ms();
            if which == 0 {
                let w = rt.block_on(src.capture_once(&targets, &SystemClock));
                assert_eq!(w.captures.len(), plan.processes);
                for c in &w.captures {
                    assert!(c.error.is_none(), "{c:?}");
                    let want = threads(c.pid);
                    assert_eq!(Some(c.threads.len()), want, "threads of pid {}", c.pid);
                }
                par.push(ms(t.elapsed()));
                par_cpu.push(cpu_ms() - cpu);
            } else {
                for tg in &targets {
                    let out = Command::new(py_spy)
                        .args(["dump", "--json", "--nonblocking", "--pid"])
                        .arg(tg.pid.to_string())
                        .env_remove("RUST_BACKTRACE")
                        .output()
                        .expect("py-spy");
                    assert!(out.status.success());
                }
                seq.push(ms(t.elapsed()));
                seq_cpu.push(cpu_ms() - cpu);
            }
        }
    }
    let medians = [
        median(&mut par),
        median(&mut seq),
        median(&mut par_cpu),
        median(&mut seq_cpu),
    ];
    (medians, procs.iter().map(|p| p.1).collect())
}

/// A process of about a py-spy dump's CPU cost (~12 ms here) that touches nothing.
const CONTROL_JOB: [&str; 4] = ["-I", "-S", "-c", "sum(range(400000))"];

const STALL_TARGET: &str = r#"
import sys, threading, time
def sleeper():
    while True:
        time.sleep(0.5)
for _ in range(19):
    threading.Thread(target=sleeper, daemon=True).start()
end = time.monotonic() + float(sys.argv[1])
start = last = time.monotonic()
worst = 0.0
while True:
    now = time.monotonic()
    if now - last > worst:
        worst = now - last
    last = now
    if now - start >= 1.0:
        print(f"{worst * 1000:.3f}", flush=True)
        worst = 0.0
        start = now
    if now > end:
        break
"#;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    None,
    /// The default window: 3 dumps 300 ms apart, once a second.
    Window,
    /// `--nonblocking` at 10 Hz.
    Nonblocking,
    /// Control: a process of similar CPU cost ([`CONTROL_JOB`]) at 10 Hz that never touches
    /// the target, to separate CPU contention on 2 cores from any pause by py-spy.
    Control,
    /// `--native` at 10 Hz: pauses the target.
    Native,
}

impl Phase {
    fn label(self) -> &'static str {
        match self {
            Phase::None => "no sampling",
            Phase::Window => "default window (3 dumps/s)",
            Phase::Nonblocking => "--nonblocking at 10 Hz",
            Phase::Control => "control: same-CPU job at 10 Hz",
            Phase::Native => "--native at 10 Hz",
        }
    }
}

fn pause_felt(py_spy: &Path, rt: &tokio::runtime::Runtime, plan: &Plan) -> Vec<(Phase, Vec<f64>)> {
    let total = plan.phase.as_secs() * plan.phases.len() as u64 + 3;
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(STALL_TARGET)
        .arg(total.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let stdout = child.stdout.take().unwrap();
    let target = Proc(child);
    let windows: Arc<Mutex<Vec<(Instant, f64)>>> = Arc::default();
    let w2 = Arc::clone(&windows);
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Ok(v) = line.trim().parse::<f64>() {
                w2.lock().unwrap().push((Instant::now(), v));
            }
        }
    });
    // The target runs its loop once it printed its first window.
    let start = Instant::now();
    while windows.lock().unwrap().is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the stall target printed nothing"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let rules = wedgewatch::probes::ProbeSet::builtin().unwrap().stack_rules;
    let make = |native| {
        StackSource::new(
            StacksConfig {
                py_spy: Some(py_spy.to_path_buf()),
                native,
                ..StacksConfig::from_env()
            },
            &rules,
        )
        .unwrap()
    };
    let (nonblocking, native) = (make(false), make(true));
    let targets = [StackTarget {
        pid: target.0.id() as i32,
        stack: None,
        component: None,
        whole_window: true,
    }];
    let mut spans = Vec::new();
    for &phase in plan.phases {
        let start = Instant::now();
        while start.elapsed() < plan.phase {
            let tick = Instant::now();
            let period = match phase {
                Phase::None => Duration::from_millis(100),
                Phase::Window => {
                    rt.block_on(nonblocking.capture_window(&targets, &SystemClock));
                    Duration::from_secs(1)
                }
                Phase::Nonblocking => {
                    rt.block_on(nonblocking.capture_once(&targets, &SystemClock));
                    Duration::from_millis(100)
                }
                Phase::Control => {
                    let _ = Command::new("python3").args(CONTROL_JOB).status();
                    Duration::from_millis(100)
                }
                Phase::Native => {
                    rt.block_on(native.capture_once(&targets, &SystemClock));
                    Duration::from_millis(100)
                }
            };
            if let Some(rest) = period.checked_sub(tick.elapsed()) {
                std::thread::sleep(rest);
            }
        }
        spans.push((phase, start, Instant::now()));
    }
    drop(target);
    let _ = reader.join();
    let windows = windows.lock().unwrap().clone();
    let mut out: Vec<(Phase, Vec<f64>)> = [
        Phase::None,
        Phase::Window,
        Phase::Nonblocking,
        Phase::Control,
        Phase::Native,
    ]
    .into_iter()
    .map(|p| (p, Vec::new()))
    .collect();
    for (at, v) in windows {
        // A window covers the second before its line; keep those inside one phase.
        let from = at.checked_sub(Duration::from_millis(1050)).unwrap_or(at);
        if let Some((p, _, _)) = spans.iter().find(|(_, s, e)| from >= *s && at <= *e) {
            if let Some(slot) = out.iter_mut().find(|(q, _)| q == p) {
                slot.1.push(v);
            }
        }
    }
    out
}

fn main() {
    let mode = Mode::from_args();
    let plan = Plan::new(mode);
    let py_spy = py_spy();
    assert!(
        py_spy.exists(),
        "py-spy not found at {} (set WEDGEWATCH_PY_SPY or create tests/lab/.venv)",
        py_spy.display()
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let (processes, rounds) = (plan.processes, plan.rounds);
    println!("stacks benchmark: {processes} Python processes ({WORKERS} workers each), {cores} cores, {rounds} rounds, loadavg {}", load.trim());
    let ([par, seq, par_cpu, seq_cpu], threads) = capture_wall_time(&py_spy, &rt, &plan);
    println!("threads per process (/proc/PID/task, as every capture found them): {threads:?}");
    println!("capture wall time, median: parallel (4 at once) {par:.1} ms | sequential py-spy loop {seq:.1} ms | ratio {:.2}x (goal <= 0.6x)", par / seq);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    // py-spy is CPU-bound (its sequential wall time is about its CPU time), so the parallel
    // capture can at best spread that CPU over the cores the machine gives it.
    println!(
        "cores the capture got on average (CPU / wall): parallel {:.2}, sequential {:.2} (of {cores})",
        par_cpu / par,
        seq_cpu / seq
    );
    println!("CPU (user+sys incl. py-spy children) per capture, median: parallel {par_cpu:.1} ms | sequential {seq_cpu:.1} ms");
    println!("loadavg after the capture runs: {}", load.trim());
    println!("pause felt by a 20-thread target (largest stall of a tight loop per 1 s window):");
    let pauses = pause_felt(&py_spy, &rt, &plan);
    for (phase, mut v) in pauses.clone() {
        if v.is_empty() {
            println!("  {}: no complete windows", phase.label());
            continue;
        }
        let max = v.iter().copied().fold(0.0, f64::max);
        let med = median(&mut v);
        let label = phase.label();
        println!(
            "  {label:<32} windows {:>2}  median {med:6.2} ms  max {max:6.2} ms",
            v.len()
        );
    }
    assert!(
        pauses.iter().any(|(_, v)| !v.is_empty()),
        "no phase held a complete window of the stall target"
    );
}
