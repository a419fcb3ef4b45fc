//! Merge benchmark (`cargo bench --bench merge`; a plain binary, `harness = false`).
//!
//! 16 synthetic node snapshots (`tests/common/fleet.rs`): 8 pairs of a proxy+router node and
//! a prefill+decode node, each with 10,000 exchanges (node A: 5,000 requests through proxy
//! and router, 10,000 outbound connections; node B: the 10,000 engine legs), one request
//! of each pair stuck at decode. Times `merge::merge` (namespacing, 4-tuple joins, skew,
//! regrouping, verdicts, findings) on parsed snapshots, and parse + merge from JSON text.
//! Goal: the merge under 1 s with margin (500 ms of CPU). Prints medians; exits 1 when the
//! goal is missed.
//! Env: `WW_BENCH_ROUNDS` (default 5), `WW_BENCH_EXCHANGES` (default 10000). Quick mode
//! (`cargo test --bench merge`, `common/mode.rs`): 1 round of 400 exchanges a node, the
//! wedges still checked, the goal not judged.

// rusage and clock_gettime through libc, which std does not wrap.
#![allow(unsafe_code)]

#[path = "common/env.rs"]
mod env;
use wedgewatch_testkit::fleet;
#[path = "common/mode.rs"]
mod mode;

use std::time::Instant;
use wedgewatch::merge::{self, NodeInput};
use wedgewatch::model::{FindingKind, Snapshot};

/// Half the 1 s: the margin that keeps the wall time under 1 s on a loaded machine.
const GOAL_CPU_MS: f64 = 500.0;

fn texts(exchanges: usize) -> Vec<String> {
    let n = exchanges / 2;
    let (a, b) = (
        fleet::node_a(n),
        fleet::node_b(n, 1_500, "waiting_first_byte", fleet::A_IP),
    );
    let mut out = Vec::new();
    for p in 0..8 {
        let (ai, bi) = (format!("10.77.{}.1", p + 1), format!("10.77.{}.2", p + 1));
        let a = fleet::moved(&a, fleet::A_IP, &ai, "nodea", &format!("nodea{p}"));
        let a = fleet::moved(&a, fleet::B_IP, &bi, "nodeb", &format!("nodeb{p}"));
        let b = fleet::moved(&b, fleet::A_IP, &ai, "nodeb", &format!("nodeb{p}"));
        let b = fleet::moved(&b, fleet::B_IP, &bi, "nodea", &format!("nodea{p}"));
        out.push(a.to_string());
        out.push(b.to_string());
    }
    out
}

fn inputs(snaps: &[Snapshot]) -> Vec<NodeInput> {
    snaps
        .iter()
        .enumerate()
        .map(|(i, s)| NodeInput {
            source: format!("node{i}.json"),
            snapshot: s.clone(),
            name: None,
            collected: None,
        })
        .collect()
}

/// CPU time of this thread (ms): what a merge costs, without the time the thread sat
/// preempted on a loaded machine (this one is shared by several builds).
fn thread_cpu_ms() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 * 1e3 + ts.tv_nsec as f64 / 1e6
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let mode = mode::Mode::from_args();
    let rounds = mode.knob("WW_BENCH_ROUNDS", 5, 1).max(1);
    let exchanges = mode.knob("WW_BENCH_EXCHANGES", 10_000, 400);
    let texts = texts(exchanges);
    let parse = |texts: &[String]| -> Vec<Snapshot> {
        texts
            .iter()
            .map(|t| serde_json::from_str(t).expect("snapshot"))
            .collect()
    };
    let snaps = parse(&texts);
    let total: usize = snaps.iter().map(|s| s.requests.len()).sum();
    let (mut merge_ms, mut with_parse_ms, mut cpu_ms) = (Vec::new(), Vec::new(), Vec::new());
    let mut last = None;
    for _ in 0..rounds {
        let ins = inputs(&snaps);
        let (t, c) = (Instant::now(), thread_cpu_ms());
        let m = merge::merge(ins, vec![]).expect("merges");
        merge_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        cpu_ms.push(thread_cpu_ms() - c);
        last = Some(m);
        let t = Instant::now();
        let m = merge::merge(inputs(&parse(&texts)), vec![]).expect("merges");
        with_parse_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        drop(m);
    }
    let m = last.expect("one round");
    let fleet = m.fleet.as_ref().expect("fleet");
    let wedged: Vec<&str> = m
        .findings
        .iter()
        .filter(|f| f.kind == FindingKind::WedgedRequest)
        .filter_map(|f| f.component.as_deref())
        .collect();
    let merge_med = median(&mut merge_ms);
    let cpu_med = median(&mut cpu_ms);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "merge: {} nodes, {total} exchanges, {} cross-node links, {} logical requests",
        fleet.nodes.len(),
        fleet.links.len(),
        m.logical_requests.len()
    );
    println!(
        "  merge (parsed snapshots): median {merge_med:.0} ms wall, {cpu_med:.0} ms CPU over {rounds} rounds (load average {})",
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
    println!(
        "  parse + merge (JSON text): median {:.0} ms",
        median(&mut with_parse_ms)
    );
    println!("  wedged_request at: {wedged:?}");
    let pairs_ok = wedged.len() == 8 && wedged.iter().all(|w| w.contains("/decode@"));
    if !pairs_ok {
        eprintln!("FAIL: expected one wedge at decode per pair, got {wedged:?}");
        std::process::exit(1);
    }
    // The goal (issue 14: under 1 s, with margin) is on the merge's own CPU time: wall time
    // on this shared machine is mostly waiting for a core (both are printed).
    if cpu_med >= GOAL_CPU_MS {
        eprintln!("merge took {cpu_med:.0} ms of CPU (goal: under {GOAL_CPU_MS} ms)");
    }
    if mode.goal_fails(cpu_med < GOAL_CPU_MS) {
        std::process::exit(1);
    }
}
