//! Rediscovery benchmark (`cargo bench --bench discovery`; a plain binary, `harness = false`).
//!
//! Issue 15: rediscovery must not grow with unrelated processes. A small fake stack (an
//! engine `python3 -c ... -m sglang.launch_server --port P` listening on P, a router
//! `python3 -c ... -m sglang_router.launch_router --worker-urls http://127.0.0.1:P` holding a
//! connection to it, and a client holding one to the router) runs throughout. Each round
//! times, side by side (which goes first swaps every round), rediscovery passes
//! - without extra processes, and
//! - with `WW_BENCH_EXTRA` (2,000) extra `sleep` processes on the host (spawned for the
//!   block, killed after it),
//!
//! each with the daemon's cache (`discover_cached` with one `DiscoveryCache` for the block,
//! first pass excluded: that is the cold one, reported apart) and with the peer that reads
//! every process in full every pass (`DiscoveryCache::uncached()`, what discovery did
//! before). Wall time and CPU time (this process, all threads) per pass; medians over all
//! rounds. `query_endpoints` is off: only the /proc work is timed.
//!
//! Then the daemon's CPU, side by side (`discovery_parts/daemon_cpu.rs`): a fresh
//! `wedgewatch daemon --no-record` at default cadences on the same host, with and without
//! the extra processes, `WW_BENCH_DAEMON_ROUNDS` (2) pairs of blocks of
//! `WW_BENCH_DAEMON_SECS` (40) after a 15 s warm-up; means and their ratio (0: skipped).
//! Goals: the cached pass with the extras at most 50 ms, the daemon's CPU with them within
//! 1.1x of without; exits 1 when one is missed.
//! Env: `WW_BENCH_EXTRA` (2000), `WW_BENCH_ROUNDS` (5), `WW_BENCH_PASSES` (10 per block).
//! Quick mode (`cargo test --bench discovery`, `common/mode.rs`): 50 extras, 1 round of 2
//! passes, one pair of daemon blocks of 2 s after 2 s of warm-up; the fake engine must be
//! found in every pass and every daemon live through its block; no goal is judged.

// rusage and clock_gettime through libc, which std does not wrap.
#![allow(unsafe_code)]

#[path = "discovery_parts/daemon_cpu.rs"]
mod daemon_cpu;
#[path = "common/env.rs"]
mod env;
#[path = "common/mode.rs"]
mod mode;
#[path = "common/proc_stat.rs"]
mod proc_stat;
#[path = "common/stop.rs"]
mod stop;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use wedgewatch::discover::{self, DiscoverOptions, DiscoveryCache};
use wedgewatch::model::Role;
use wedgewatch::probes::ProbeSet;

const GOAL_MS: f64 = 50.0;
const GOAL_DAEMON_RATIO: f64 = 1.1;
/// Warm-up of each daemon block (startup discovery, first baselines): full, quick.
const DAEMON_WARMUP_S: (u64, u64) = (15, 2);

/// A listener that holds each connection it accepts until the peer closes it; with a target
/// port, also holds a connection to it. (Holding closed ones too, as it did, piled up the
/// daemons' probes: hundreds of CLOSE_WAIT sockets by the last daemon block, whose CPU grew
/// block after block with them.)
const SERVER: &str = r#"
import os, socket, sys, threading, time
threading.Timer(1800, lambda: os._exit(0)).start()
port = int(sys.argv[sys.argv.index('--port') + 1]) if '--port' in sys.argv else 0
s = socket.socket(); s.bind(('127.0.0.1', port)); s.listen(64)
held = []
if len(sys.argv) > 1 and sys.argv[1].isdigit():
    held.append(socket.create_connection(('127.0.0.1', int(sys.argv[1]))))
print(s.getsockname()[1], flush=True)
def hold(a):
    while a.recv(4096):
        pass
    a.close()
while True:
    a, _ = s.accept()
    threading.Thread(target=hold, args=(a,), daemon=True).start()
"#;

struct Guard(Vec<Child>);

impl Drop for Guard {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
        }
        for c in &mut self.0 {
            let _ = c.wait();
        }
    }
}

/// Starts `python3 -c SERVER <args>` and returns it with the port it listens on.
fn server(args: &[&str]) -> (Child, u16) {
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(SERVER)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let out = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line).expect("port");
    let port = line.trim().parse().expect("port number");
    (child, port)
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// The fake stack: engine, router (connected to it), a client of the router.
fn stack() -> (Guard, u16) {
    let (p, rp) = (free_port().to_string(), free_port().to_string());
    let (engine, p) = server(&["-", "-m", "sglang.launch_server", "--port", &p]);
    let url = format!("http://127.0.0.1:{p}");
    let ps = p.to_string();
    let router_args = [
        &ps,
        "-m",
        "sglang_router.launch_router",
        "--port",
        &rp,
        "--worker-urls",
        &url,
    ];
    let (router, r) = server(&router_args);
    let (client, _) = server(&[&r.to_string(), "client.py"]);
    (Guard(vec![engine, router, client]), p)
}

fn sleepers(n: usize) -> Guard {
    let kids = (0..n)
        .map(|_| {
            Command::new("sleep")
                .arg("1800")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("sleep")
        })
        .collect();
    Guard(kids)
}

/// CPU time of this process, all threads (ms).
fn cpu_ms() -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let ms = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
    ms(u.ru_utime) + ms(u.ru_stime)
}

/// Wall and CPU ms of one pass; checks the fake engine was found.
fn one_pass(
    probes: &ProbeSet,
    opts: &DiscoverOptions,
    cache: &mut DiscoveryCache,
    port: u16,
) -> (f64, f64) {
    let (t, c) = (Instant::now(), cpu_ms());
    let topo = discover::discover_cached(probes, opts, cache).expect("discover");
    let out = (t.elapsed().as_secs_f64() * 1e3, cpu_ms() - c);
    let want = format!(":{port}");
    assert!(
        topo.components
            .iter()
            .any(|c| c.role == Role::Engine && c.listen.iter().any(|l| l.ends_with(&want))),
        "the fake engine was not discovered"
    );
    out
}

/// Samples (wall, cpu) of each mode for one state of the host.
#[derive(Default)]
struct Block {
    cached: Vec<(f64, f64)>,
    cold: Vec<(f64, f64)>,
    uncached: Vec<(f64, f64)>,
    /// `stat` lines read and skipped by the cached passes, and how many passes.
    stats: (u64, u64, u64),
}

fn block(b: &mut Block, probes: &ProbeSet, opts: &DiscoverOptions, port: u16, passes: usize) {
    let mut cache = DiscoveryCache::new();
    b.cold.push(one_pass(probes, opts, &mut cache, port));
    let before = cache.stats();
    for _ in 0..passes {
        b.cached.push(one_pass(probes, opts, &mut cache, port));
        b.uncached.push(one_pass(
            probes,
            opts,
            &mut DiscoveryCache::uncached(),
            port,
        ));
    }
    let after = cache.stats();
    b.stats.0 += after.stat_reads - before.stat_reads;
    b.stats.1 += after.stat_skips - before.stat_skips;
    b.stats.2 += passes as u64;
}

fn median(v: &[(f64, f64)], pick: impl Fn(&(f64, f64)) -> f64) -> f64 {
    let mut xs: Vec<f64> = v.iter().map(pick).collect();
    xs.sort_by(|a, b| a.total_cmp(b));
    xs.get(xs.len() / 2).copied().unwrap_or(f64::NAN)
}

fn main() {
    // Its daemon discovers every stack on the machine: no other test's stack runs beside it.
    let _alone = wedgewatch_testkit::lab::exclusive();
    let mode = mode::Mode::from_args();
    let extra = mode.knob("WW_BENCH_EXTRA", 2000, 50);
    let rounds = mode.knob("WW_BENCH_ROUNDS", 5, 1);
    let passes = mode.knob("WW_BENCH_PASSES", 10, 2);
    let probes = ProbeSet::builtin().expect("probes");
    let opts = DiscoverOptions {
        query_endpoints: false,
        ..DiscoverOptions::default()
    };
    let (stack, port) = stack();
    std::thread::sleep(Duration::from_millis(300));
    let (mut without, mut with) = (Block::default(), Block::default());
    for round in 0..rounds {
        for with_first in [round % 2 == 1, round % 2 == 0] {
            if with_first {
                let extras = sleepers(extra);
                std::thread::sleep(Duration::from_millis(300));
                block(&mut with, &probes, &opts, port, passes);
                drop(extras);
            } else {
                block(&mut without, &probes, &opts, port, passes);
            }
        }
        let procs = std::fs::read_dir("/proc").map(|d| d.count()).unwrap_or(0);
        eprintln!("round {round}: {procs} /proc entries after the round");
    }
    let daemon = daemon_blocks(mode, extra, &stack);
    // before `report`, which may exit(1) without running destructors
    drop(stack);
    let ok = report(&without, &with, extra);
    let ok = report_daemon(&daemon, extra) && ok;
    if mode.goal_fails(ok) {
        std::process::exit(1);
    }
}

/// Open fds of the fake stack's processes (the daemons' probes must not pile up in them).
fn stack_fds(stack: &Guard) -> usize {
    let fds =
        |c: &Child| std::fs::read_dir(format!("/proc/{}/fd", c.id())).map_or(0, |d| d.count());
    stack.0.iter().map(fds).sum()
}

/// Daemon CPU (% of a core) per block: (without, with) the extras.
fn daemon_blocks(mode: mode::Mode, extra: usize, stack: &Guard) -> (Vec<f64>, Vec<f64>) {
    let rounds = mode.knob("WW_BENCH_DAEMON_ROUNDS", 2, 1);
    let secs = mode.knob("WW_BENCH_DAEMON_SECS", 40, 2);
    let warmup = mode.pick(DAEMON_WARMUP_S.0, DAEMON_WARMUP_S.1);
    let (mut without, mut with) = (Vec::new(), Vec::new());
    if secs == 0 {
        return (without, with);
    }
    for round in 0..rounds {
        for with_first in [round % 2 == 1, round % 2 == 0] {
            if with_first {
                let extras = sleepers(extra);
                with.push(daemon_cpu::daemon_block(warmup, secs));
                drop(extras);
            } else {
                without.push(daemon_cpu::daemon_block(warmup, secs));
            }
        }
        eprintln!(
            "daemon round {round}: without {without:.2?} with {with:.2?} (% of a core); \
             the stack's fds: {}",
            stack_fds(stack)
        );
    }
    (without, with)
}

fn median1(v: &[f64]) -> f64 {
    let mut xs = v.to_vec();
    xs.sort_by(|a, b| a.total_cmp(b));
    xs.get(xs.len() / 2).copied().unwrap_or(f64::NAN)
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

/// Prints the daemon's figures; true when within the goal (or skipped). The goal is on the
/// means: blocks are of equal length, so a mean is the daemon's CPU over all its blocks. A
/// median of two blocks is the larger one, and a block's py-spy dumps (a few tens of ms of
/// CPU each, one per tick on this small stack) make blocks of one arm differ by a third.
fn report_daemon((without, with): &(Vec<f64>, Vec<f64>), extra: usize) -> bool {
    if without.is_empty() {
        println!("daemon CPU: skipped (WW_BENCH_DAEMON_SECS=0)");
        return true;
    }
    let (a, b) = (mean(without), mean(with));
    let ratio = b / a;
    println!(
        "daemon CPU (% of one core, mean of {} blocks each): without {a:.3}, with {extra}: {b:.3}; \
         ratio {ratio:.2}, goal <= {GOAL_DAEMON_RATIO} {}",
        without.len(),
        if ratio <= GOAL_DAEMON_RATIO { "OK" } else { "MISSED" }
    );
    let (ma, mb) = (median1(without), median1(with));
    println!(
        "  medians: without {ma:.2}, with {mb:.2} (ratio {:.2}); blocks without: {without:.2?}; with: {with:.2?}",
        mb / ma
    );
    ratio <= GOAL_DAEMON_RATIO
}

/// Prints the discovery figures; true when within the goal.
fn report(without: &Block, with: &Block, extra: usize) -> bool {
    println!("rediscovery, per pass (median ms; wall / cpu), {extra} extra sleep processes:");
    println!("| mode | without: wall | cpu | with: wall | cpu | ratio wall | ratio cpu |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    let mut cached_with = f64::NAN;
    for (name, a, b) in [
        ("cached (daemon)", &without.cached, &with.cached),
        ("cold (first pass)", &without.cold, &with.cold),
        ("uncached (before)", &without.uncached, &with.uncached),
    ] {
        let (aw, ac) = (median(a, |s| s.0), median(a, |s| s.1));
        let (bw, bc) = (median(b, |s| s.0), median(b, |s| s.1));
        if name.starts_with("cached") {
            cached_with = bw;
        }
        println!(
            "| {name} | {aw:.1} | {ac:.1} | {bw:.1} | {bc:.1} | {:.2} | {:.2} |",
            bw / aw,
            bc / ac
        );
    }
    for (name, b) in [("without", without), ("with", with)] {
        let (reads, skips, n) = b.stats;
        let n = n.max(1) as f64;
        println!(
            "cached passes {name} the extras: {:.0} stat reads, {:.0} skipped per pass",
            reads as f64 / n,
            skips as f64 / n
        );
    }
    let vs = median(&with.cached, |s| s.0) / median(&with.uncached, |s| s.0);
    println!("cached / uncached with the extras (wall): {vs:.3}");
    let ok = cached_with <= GOAL_MS;
    println!(
        "cached pass with {extra} extra processes: {cached_with:.1} ms, goal <= {GOAL_MS} {}",
        if ok { "OK" } else { "MISSED" }
    );
    ok
}
