//! Exporter cost (`cargo bench --bench exporter`; a plain binary, `harness = false`). Issue 14's
//! goal: a scrape of `/metrics` costs at most 5 ms.
//!
//! A synthetic wedge far larger than a node's stack: `WW_BENCH_STACKS` (default 16) PD stacks
//! (proxy, router, prefill, decode: 64 components), each decode holding `WW_BENCH_STUCK`
//! (default 8) requests accepted and forgotten, so the exposition carries a stuck series, an
//! age and a finding per decode. It times, over `WW_BENCH_ROUNDS` (default 500) rounds, medians and maxima:
//! - `Evaluation::new`: what each detector pass of the daemon adds (not per scrape);
//! - `render`: the exposition from the evaluation and five sources' health;
//! - a whole scrape over loopback HTTP against the daemon's own listener
//!   (`daemon::exporter::serve`): connect, `GET /metrics`, read to the end.
//!
//! Exits 1 when the median of a whole scrape is over 5 ms (the 99th percentile is printed: on
//! a loaded machine it measures the scheduler more than the exporter). Quick mode (`cargo
//! test --bench exporter`, `common/mode.rs`): 2 stacks x 2 hung requests, 5 rounds, the
//! goal not judged.

use wedgewatch_testkit::correl as correl_common;
#[path = "common/env.rs"]
mod env;
#[path = "common/mode.rs"]
mod mode;

use correl_common::*;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use wedgewatch::daemon::exporter;
use wedgewatch::export::prometheus::Evaluation;
use wedgewatch::model::*;
use wedgewatch::redact::Redactor;
use wedgewatch::sampler::SourceStats;

/// `stacks` PD stacks side by side (proxy -> router -> prefill, which answers, + decode,
/// which never does), `stuck` requests hung at each decode.
fn wedged(stacks: usize, stuck: usize) -> Sim {
    let mut topo = Topology::default();
    let port = |i: usize, k: usize| 20000 + (i * 4 + k) as u16;
    let pid = |i: usize, k: usize| 1000 + (i * 4 + k) as i32;
    for i in 0..stacks {
        let roles = [Role::Proxy, Role::Router, Role::Prefill, Role::Decode];
        for (k, role) in roles.into_iter().enumerate() {
            let id = format!("{}@127.0.0.1:{}", role.as_str(), port(i, k));
            topo.components
                .push(comp(&id, role, port(i, k), &[pid(i, k)], &[]));
        }
    }
    let mut sim = Sim::new(topo);
    let mut answered = Vec::new();
    for i in 0..stacks {
        for _ in 0..stuck {
            let a = sim.connect(None, port(i, 0), pid(i, 0));
            let b = sim.connect(Some(pid(i, 0)), port(i, 1), pid(i, 1));
            let p = sim.connect(Some(pid(i, 1)), port(i, 2), pid(i, 2));
            let d = sim.connect(Some(pid(i, 1)), port(i, 3), pid(i, 3));
            sim.request(a, 800);
            sim.advance(20);
            sim.request(b, 830);
            sim.advance(25);
            sim.request(p, 950);
            sim.request(d, 950);
            answered.push(p);
        }
    }
    sim.run(250, |_| {});
    for p in answered {
        sim.respond(p, 100);
    }
    sim.run(40_000, |_| {});
    sim
}

fn stats(now: i64) -> wedgewatch::sampler::StatsHandle {
    let mut m = BTreeMap::new();
    for kind in SourceKind::ALL {
        m.insert(
            kind,
            SourceStats {
                kind,
                every_ms: 1000,
                timeout_ms: 2000,
                last_t_ms: Some(now - 300),
                took_ms: 12,
                samples: 3600,
                late: 4,
                dropped: 1,
                timeouts: 1,
                status: SourceStatus::degraded("3 of 30 dumps missed"),
            },
        );
    }
    Arc::new(Mutex::new(m))
}

/// (median, 99th percentile, max) in ms.
fn summary(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99), at(1.0))
}

fn time<T>(rounds: usize, mut f: impl FnMut() -> T) -> (Vec<f64>, T) {
    let mut out = Vec::with_capacity(rounds);
    let mut last = None;
    for _ in 0..rounds {
        let t = Instant::now();
        last = Some(f());
        out.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    (out, last.expect("at least one round"))
}

fn http_scrape(addr: std::net::SocketAddr) -> usize {
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n")
        .expect("request");
    let mut buf = Vec::with_capacity(64 * 1024);
    s.read_to_end(&mut buf).expect("answer");
    assert!(buf.starts_with(b"HTTP/1.1 200 OK"), "not a 200");
    buf.len()
}

fn main() {
    let mode = mode::Mode::from_args();
    let engines = mode.knob("WW_BENCH_STACKS", 16, 2);
    let stuck = mode.knob("WW_BENCH_STUCK", 8, 2);
    let rounds = mode.knob("WW_BENCH_ROUNDS", 500, 5).max(1);
    let sim = wedged(engines, stuck);
    let view = sim.model.view(sim.now);
    let findings = wedgewatch::detect::run_all(&sim.model, &view);
    let topo = sim.model.topology().clone();
    let (eval_ms, evaluation) = time(rounds.min(100), || {
        Evaluation::new(&view, &findings, &topo, &mut Redactor::new())
    });
    let stuck_total = evaluation.stuck_requests();
    assert!(stuck_total > 0, "the synthetic wedge has stuck requests");
    let published: exporter::Published = Arc::new(Mutex::new(Some(evaluation)));
    let stats = stats(sim.now);
    let (render_ms, body) = time(rounds, || exporter::scrape(&published, &stats, sim.now));

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let listener = rt
        .block_on(exporter::bind("127.0.0.1:0".parse().expect("addr")))
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let clock: Arc<dyn wedgewatch::clock::Clock> = Arc::new(wedgewatch::clock::SystemClock);
    let server = rt.spawn(exporter::serve(listener, published, stats, clock));
    let (http_ms, bytes) = time(rounds, || http_scrape(addr));
    server.abort();

    println!(
        "exporter bench: {engines} PD stacks ({} components) x {stuck} hung requests ({stuck_total} judged stuck), {} findings, {} series, {} bytes; {rounds} rounds",
        topo.components.len(),
        findings.len(),
        body.lines().filter(|l| !l.starts_with('#')).count(),
        bytes
    );
    println!("| step | median ms | p99 ms | max ms |");
    println!("| --- | --- | --- | --- |");
    let mut over = false;
    for (name, v, goal) in [
        ("Evaluation::new (per detector pass)", eval_ms, false),
        ("render (per scrape)", render_ms, false),
        ("HTTP scrape over loopback (per scrape)", http_ms, true),
    ] {
        let (med, p99, max) = summary(v);
        println!("| {name} | {med:.3} | {p99:.3} | {max:.3} |");
        over |= goal && med > 5.0;
    }
    if over {
        println!("GOAL MISSED: a scrape over 5 ms");
    }
    if mode.goal_fails(!over) {
        std::process::exit(1);
    }
}
