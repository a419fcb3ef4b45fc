//! The view's cost on a big node's traffic (`cargo bench --bench view`; a plain binary,
//! `harness = false`). Issue 15: the daemon builds a view for every detector pass (every
//! 2 s) and every served snapshot, over a 30 s window that holds about 10,000 exchanges on
//! the big lab under 200 streams. The biglab bench measures the daemon whole, in half an
//! hour; this one measures the view alone, in seconds, on the same shape of traffic.
//!
//! A synthetic node: `WW_BENCH_AGENTS` (default 200) agents over two PD stacks (proxy ->
//! router -> prefill + decode, each hop a keep-alive connection of the agent's), each
//! sending a turn every 2 s: prefill answers at once, decode, router and proxy stream for
//! 1.25 s. That is 100 turns/s, 400 exchanges/s, about 12,000 in the window, linked across
//! hops by the correlator as a real run's are. `WW_BENCH_HISTORY_SECS` (default 90) of it
//! are fed through the model in 250 ms socket samples, then the view is timed
//! `WW_BENCH_ROUNDS` (default 40) times, beside its peer: one walk of the same exchanges
//! (the least any view over them costs). Printed: medians and 99th percentiles, the view's
//! size, its cost per exchange and the ratio to the walk. Quick mode (`cargo test --bench
//! view`, `common/mode.rs`): 20 agents, 10 s of history, 3 rounds; the same check.

use wedgewatch_testkit::correl as correl_common;
#[path = "common/env.rs"]
mod env;
#[path = "common/mode.rs"]
mod mode;

use correl_common::*;
use std::time::Instant;
use wedgewatch::model::*;

/// An agent's four keep-alive connections, one per hop.
struct Agent {
    proxy: usize,
    router: usize,
    prefill: usize,
    decode: usize,
    /// Its turns start this many 250 ms ticks into each 2 s period.
    phase: i64,
}

const STACKS: usize = 2;
const TICKS_PER_TURN: i64 = 8;

fn port(stack: usize, hop: usize) -> u16 {
    20000 + (stack * 4 + hop) as u16
}

fn pid(stack: usize, hop: usize) -> i32 {
    1000 + (stack * 4 + hop) as i32
}

fn big_node(agents: usize) -> (Sim, Vec<Agent>) {
    let mut topo = Topology::default();
    for s in 0..STACKS {
        let roles = [Role::Proxy, Role::Router, Role::Prefill, Role::Decode];
        for (hop, role) in roles.into_iter().enumerate() {
            let id = format!("{}@127.0.0.1:{}", role.as_str(), port(s, hop));
            topo.components
                .push(comp(&id, role, port(s, hop), &[pid(s, hop)], &[]));
        }
    }
    let mut sim = Sim::new(topo);
    let agents = (0..agents)
        .map(|i| {
            let s = i % STACKS;
            Agent {
                proxy: sim.connect(None, port(s, 0), pid(s, 0)),
                router: sim.connect(Some(pid(s, 0)), port(s, 1), pid(s, 1)),
                prefill: sim.connect(Some(pid(s, 1)), port(s, 2), pid(s, 2)),
                decode: sim.connect(Some(pid(s, 1)), port(s, 3), pid(s, 3)),
                phase: (i as i64) % TICKS_PER_TURN,
            }
        })
        .collect();
    (sim, agents)
}

/// One 250 ms tick of every agent's turn: the request down every hop, prefill's answer, then
/// the streams, then a pause.
fn tick(sim: &mut Sim, agents: &[Agent], n: i64) {
    for a in agents {
        match (n + a.phase) % TICKS_PER_TURN {
            0 => {
                sim.request(a.proxy, 900);
                sim.request(a.router, 930);
                sim.request(a.prefill, 1050);
                sim.request(a.decode, 1050);
            }
            1 => {
                sim.respond(a.prefill, 400);
                for c in [a.decode, a.router, a.proxy] {
                    sim.respond(c, 180);
                }
            }
            2..=5 => {
                for c in [a.decode, a.router, a.proxy] {
                    sim.respond(c, 120);
                }
            }
            _ => {}
        }
    }
}

/// (median, 99th percentile) in ms.
fn summary(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99))
}

fn main() {
    let mode = mode::Mode::from_args();
    let agents = mode.knob("WW_BENCH_AGENTS", 200, 20);
    let history_secs = mode.knob("WW_BENCH_HISTORY_SECS", 90, 10);
    let rounds = mode.knob("WW_BENCH_ROUNDS", 40, 3).max(1);
    let (mut sim, crowd) = big_node(agents);
    let fed = Instant::now();
    let mut n = 0;
    sim.run(history_secs * 1000, |s| {
        tick(s, &crowd, n);
        n += 1;
    });
    println!(
        "view bench: {agents} agents, {history_secs} s of history fed in {:.1} s",
        fed.elapsed().as_secs_f64()
    );
    let now = sim.now;
    let mut view_ms = Vec::with_capacity(rounds);
    let mut walk_ms = Vec::with_capacity(rounds);
    let mut size = (0, 0, 0);
    for _ in 0..rounds {
        // Side by side, alternating: the peer first, then the view.
        let t = Instant::now();
        let walked = sim.model.exchanges().filter(|x| x.bytes_in > 0).count();
        walk_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        let t = Instant::now();
        let v = sim.model.view(now);
        view_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        size = (walked, v.requests.len(), v.logical.len());
        std::hint::black_box(v);
    }
    let (walked, requests, logical) = size;
    let (view_p50, view_p99) = summary(view_ms);
    let (walk_p50, walk_p99) = summary(walk_ms);
    println!("history: {walked} exchanges; view: {requests} exchanges, {logical} logical requests");
    println!("view: p50 {view_p50:.2} ms, p99 {view_p99:.2} ms ({rounds} rounds)");
    println!("walk of the history (peer): p50 {walk_p50:.2} ms, p99 {walk_p99:.2} ms");
    println!(
        "per view exchange: {:.2} µs; view / walk: {:.1}x",
        view_p50 * 1000.0 / requests.max(1) as f64,
        view_p50 / walk_p50.max(1e-6)
    );
    if requests < agents * 4 {
        eprintln!("view bench: the view holds {requests} exchanges, fewer than the agents' hops: the traffic did not correlate");
        std::process::exit(1);
    }
}
