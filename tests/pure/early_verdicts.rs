//! Issue 33 item 4: the stuck kinds past `wedged_request` come as early as its verdict when
//! their evidence is as unanimous (`correlate::kind_witnesses`): `kv_transfer_stalled`,
//! `pd_leg_failed` and `tokens_undelivered` at 10 s when their own facts and the engine's
//! four witnesses agree, a quarter of the way on to 30 s for each engine witness missing,
//! 30 s when their own is missing, and never early while a witness sees work (a transfer
//! still moving, a busy decode, a scheduler still generating). Each lists its witnesses.

use super::kv_transfer_stalled::{kv_stream, loads, pd_request, topology, DECODE_SCHED};
use correl_common::*;
use wedgewatch::clock::Millis;
use wedgewatch::model::*;
use wedgewatch_testkit::correl as correl_common;

/// What the engines show each 250 ms tick: metrics every second (PD queues in `/v1/loads`,
/// decode's counters), GPU readings, decode's scheduler dumped every `dump_every` ticks.
struct Env {
    prefill: serde_json::Value,
    decode: serde_json::Value,
    /// Prefill's `http_errors_total` (None: absent).
    prefill_errors: Option<f64>,
    /// Decode's scheduler tokens (`scheduler_tokens_total`), and what its HTTP server got.
    sched_tokens: f64,
    received: f64,
    /// Added to decode's forward time and generated tokens per scrape (0: frozen).
    decode_work: f64,
    forward: f64,
    gpu: bool,
    /// Decode's GPU busy (another request's batches).
    decode_busy: bool,
    dump_every: u64,
    /// Decode's scheduler state in its dumps.
    decode_state: &'static str,
    ticks: u64,
}

impl Env {
    fn idle(decode: serde_json::Value) -> Env {
        Env {
            prefill: serde_json::json!({}),
            decode,
            prefill_errors: Some(0.0),
            sched_tokens: 0.0,
            received: 0.0,
            decode_work: 0.0,
            forward: 20.0,
            gpu: true,
            decode_busy: false,
            dump_every: 10,
            decode_state: "pd_queue_polling",
            ticks: 0,
        }
    }

    fn tick(&mut self, sim: &mut Sim) {
        self.ticks += 1;
        let now = sim.now;
        if self.ticks % 4 == 1 {
            self.forward += self.decode_work;
            self.received += self.decode_work;
            let mut p = loads(PREFILL, now, self.prefill.clone());
            p.mapped.insert("forward_seconds_total".into(), 10.0);
            if let Some(e) = self.prefill_errors {
                p.mapped.insert("http_errors_total".into(), e);
            }
            let mut d = loads(DECODE, now, self.decode.clone());
            for (k, v) in [
                ("forward_seconds_total", self.forward),
                ("generation_tokens_total", self.received),
                ("scheduler_tokens_total", self.sched_tokens),
            ] {
                d.mapped.insert(k.into(), v);
            }
            sim.ingest(Payload::Metrics(vec![p, d]));
        }
        if self.gpu {
            let decode = if self.decode_busy {
                (1, 95, 280)
            } else {
                (1, 0, 60)
            };
            sim.ingest(Payload::Gpu(gpu(&[(0, 0, 60), decode])));
        }
        if self.ticks % self.dump_every == 1 {
            let top = match self.decode_state {
                "idle" => "maybe_sleep",
                "running_batch" => "forward_batch_generation",
                _ => "pop_transferred",
            };
            let s = stack(DECODE_SCHED, now, self.decode_state, top);
            sim.ingest(Payload::Stacks(vec![s]));
        }
    }
}

/// Runs until `at` ms after `arrived`.
fn run_to(sim: &mut Sim, env: &mut Env, arrived: Millis, at: Millis) {
    let left = arrived + at - sim.now;
    sim.run(left.max(0) / 250 * 250, |s| env.tick(s));
}

fn of_kind(sim: &Sim, kind: &str) -> Vec<Finding> {
    wedgewatch::pipeline::parts(&sim.model, sim.now)
        .findings
        .into_iter()
        .filter(|f| f.kind == kind)
        .collect()
}

/// The stuck kinds of no response byte found now.
fn stuck_kinds(sim: &Sim) -> Vec<String> {
    wedgewatch::pipeline::parts(&sim.model, sim.now)
        .findings
        .into_iter()
        .map(|f| f.kind.to_string())
        .filter(|k| {
            [
                "wedged_request",
                "kv_transfer_stalled",
                "pd_leg_failed",
                "tokens_undelivered",
            ]
            .contains(&k.as_str())
        })
        .collect()
}

/// None of `kind` before `at - 500` ms after `arrived`, one at `at + 500`; returns it.
fn comes_at(sim: &mut Sim, env: &mut Env, arrived: Millis, kind: &str, at: Millis) -> Finding {
    run_to(sim, env, arrived, at - 500);
    assert_eq!(stuck_kinds(sim), Vec::<String>::new(), "before {at} ms");
    run_to(sim, env, arrived, at + 500);
    let f = of_kind(sim, kind);
    assert_eq!(f.len(), 1, "{kind} at {at} ms: {:?}", stuck_kinds(sim));
    f[0].clone()
}

fn verdict_evidence(f: &Finding) -> String {
    f.evidence
        .iter()
        .filter(|e| e.source == "verdict")
        .map(|e| e.detail.clone())
        .collect::<Vec<_>>()
        .join("\n")
}

fn assert_lists(f: &Finding, wants: &[&str]) {
    let ev = verdict_evidence(f);
    for want in wants {
        assert!(ev.contains(want), "{want:?} missing: {ev}");
    }
}

// --- kv_transfer_stalled --------------------------------------------------------------

/// The sender stopped mid-slice as the request came: both legs wait, prefill holds it in
/// flight, decode in its transfer queue. Returns when the decode leg's last byte came.
fn kv_stalled(sim: &mut Sim) -> (Millis, usize) {
    let kv = kv_stream(sim);
    pd_request(sim);
    let arrived = sim.now;
    sim.request(kv, 24 + 66);
    (arrived, kv)
}

fn kv_env() -> Env {
    Env {
        prefill: serde_json::json!({"prefill_inflight_queue_reqs": 1, "prefill_bootstrap_queue_reqs": 0}),
        ..Env::idle(serde_json::json!({"decode_transfer_queue_reqs": 1}))
    }
}

#[test]
fn a_kv_transfer_stall_with_unanimous_witnesses_comes_at_ten_seconds() {
    let mut sim = Sim::new(topology());
    let mut env = kv_env();
    let (arrived, _) = kv_stalled(&mut sim);
    let f = comes_at(&mut sim, &mut env, arrived, "kv_transfer_stalled", 10_000);
    assert!(
        f.summary.ends_with("; judged after 10 s on 6/6 witnesses"),
        "{}",
        f.summary
    );
    assert_lists(
        &f,
        &[
            "@decode waited 10 s since its last request byte, judged after 10 s on 6/6 witnesses (30 s on less evidence): ",
            "no response byte since it arrived",
            "transfer silent from +2.",
            "GPU idle from +2.",
            "scheduler idle from +",
            "counters frozen from +",
            "no queue from +",
        ],
    );
}

#[test]
fn a_kv_transfer_stall_on_less_evidence_comes_later() {
    // No GPU reading: one engine witness missing, a quarter of the way on.
    let mut sim = Sim::new(topology());
    let mut env = Env {
        gpu: false,
        ..kv_env()
    };
    let (arrived, _) = kv_stalled(&mut sim);
    let f = comes_at(&mut sim, &mut env, arrived, "kv_transfer_stalled", 15_000);
    assert_lists(&f, &["on 5/6 witnesses", "GPU idle: no data"]);

    // No transfer on TCP to look at (RDMA), only prefill's inflight queue: its own witness
    // missing, the slow rule.
    let mut sim = Sim::new(topology());
    let mut env = kv_env();
    pd_request(&mut sim);
    let arrived = sim.now;
    let f = comes_at(&mut sim, &mut env, arrived, "kv_transfer_stalled", 30_000);
    assert_lists(&f, &["on 5/6 witnesses", "transfer silent: no data"]);
}

#[test]
fn a_kv_transfer_still_moving_or_a_busy_decode_is_never_judged_early() {
    // Pages still move between the pair every 2 s: a slow transfer, no stall at all.
    let mut sim = Sim::new(topology());
    let mut env = kv_env();
    let (arrived, kv) = kv_stalled(&mut sim);
    let mut t = 0;
    sim.run(40_000, |s| {
        env.tick(s);
        t += 250;
        if t % 2_000 == 0 {
            s.request(kv, 24 + 132);
            s.respond(kv, 8);
        }
        if s.now - arrived < 29_500 {
            assert_eq!(stuck_kinds(s), Vec::<String>::new(), "at {t} ms");
        }
    });
    assert!(of_kind(&sim, "kv_transfer_stalled").is_empty());

    // Decode busy with other requests (GPU working, counters rising) while the transfer is
    // silent: the slow rule, 30 s.
    let mut sim = Sim::new(topology());
    let mut env = Env {
        decode_busy: true,
        decode_work: 0.9,
        decode_state: "running_batch",
        ..kv_env()
    };
    let (arrived, _) = kv_stalled(&mut sim);
    let f = comes_at(&mut sim, &mut env, arrived, "kv_transfer_stalled", 30_000);
    assert_lists(
        &f,
        &["GPU idle: no, work seen", "counters frozen: no, work seen"],
    );
}

// --- pd_leg_failed ---------------------------------------------------------------------

/// The PD request; prefill answers an error (320 bytes) at 0.5 s and counts it at 1 s;
/// decode holds the request in its prealloc queue. Returns the decode leg's arrival.
fn prefill_failed(sim: &mut Sim, env: &mut Env) -> Millis {
    env.tick(sim); // a scrape from before the request
    let [_, _, p, _] = pd_request(sim);
    let arrived = sim.now;
    sim.run(500, |s| env.tick(s));
    sim.respond(p, 320);
    sim.run(500, |s| env.tick(s));
    env.prefill_errors = Some(1.0);
    arrived
}

fn failed_env() -> Env {
    Env::idle(serde_json::json!({"decode_prealloc_queue_reqs": 1}))
}

#[test]
fn a_failed_prefill_leg_with_unanimous_witnesses_comes_at_ten_seconds() {
    let mut sim = Sim::new(pd_topology());
    let mut env = failed_env();
    let arrived = prefill_failed(&mut sim, &mut env);
    let f = comes_at(&mut sim, &mut env, arrived, "pd_leg_failed", 10_000);
    assert!(
        f.summary
            .ends_with("holds the client; judged after 10 s on 6/6 witnesses"),
        "{}",
        f.summary
    );
    assert_lists(
        &f,
        &[
            "judged after 10 s on 6/6 witnesses",
            "prefill leg failed at +0.5 s (1 error(s) counted since it arrived)",
            "scheduler idle from +",
            "no queue from +",
        ],
    );
}

#[test]
fn a_failed_prefill_leg_on_less_evidence_comes_later() {
    // One dump of decode, before the request: its scheduler witness is not in, 15 s.
    let mut sim = Sim::new(pd_topology());
    let mut env = Env {
        dump_every: 1_000_000,
        ..failed_env()
    };
    let arrived = prefill_failed(&mut sim, &mut env);
    let f = comes_at(&mut sim, &mut env, arrived, "pd_leg_failed", 15_000);
    assert_lists(&f, &["on 5/6 witnesses", "scheduler idle: not yet"]);

    // Errors counted before any scrape of prefill: not dated to this leg, the slow rule.
    let mut sim = Sim::new(pd_topology());
    let mut env = Env {
        prefill_errors: None,
        ..failed_env()
    };
    let [_, _, p, _] = pd_request(&mut sim);
    let arrived = sim.now;
    sim.run(500, |_| {});
    sim.respond(p, 320);
    env.prefill_errors = Some(2.0);
    let f = comes_at(&mut sim, &mut env, arrived, "pd_leg_failed", 30_000);
    assert_lists(&f, &["prefill leg failed: no data"]);
}

#[test]
fn a_failed_prefill_leg_at_a_busy_decode_is_never_judged_early() {
    let mut sim = Sim::new(pd_topology());
    let mut env = Env {
        decode_busy: true,
        decode_work: 0.9,
        ..failed_env()
    };
    let arrived = prefill_failed(&mut sim, &mut env);
    let f = comes_at(&mut sim, &mut env, arrived, "pd_leg_failed", 30_000);
    assert_lists(&f, &["GPU idle: no, work seen"]);
}

// --- tokens_undelivered ---------------------------------------------------------------

/// The PD request; prefill answers at 0.5 s; decode's scheduler generates 8 tokens by 1 s
/// (`more`: and 8 more each second after), none leaves its HTTP server. Returns the decode
/// leg's arrival.
fn undelivered(sim: &mut Sim, env: &mut Env) -> Millis {
    env.tick(sim); // a scrape from before the request
    let [_, _, p, _] = pd_request(sim);
    let arrived = sim.now;
    sim.run(500, |s| env.tick(s));
    sim.respond(p, 990);
    sim.run(500, |s| env.tick(s));
    env.sched_tokens = 8.0;
    arrived
}

fn undelivered_env() -> Env {
    Env {
        decode_state: "idle",
        ..Env::idle(serde_json::json!({}))
    }
}

#[test]
fn undelivered_tokens_with_unanimous_witnesses_come_at_ten_seconds() {
    let mut sim = Sim::new(pd_topology());
    let mut env = undelivered_env();
    let arrived = undelivered(&mut sim, &mut env);
    let f = comes_at(&mut sim, &mut env, arrived, "tokens_undelivered", 10_000);
    assert!(
        f.summary.ends_with("; judged after 10 s on 6/6 witnesses"),
        "{}",
        f.summary
    );
    assert_lists(
        &f,
        &[
            "tokens generated, then none from +2.0 s (8 tokens)",
            "GPU idle from +4.",
            "scheduler idle from +",
        ],
    );

    // One dump, before the request: 15 s.
    let mut sim = Sim::new(pd_topology());
    let mut env = Env {
        dump_every: 1_000_000,
        ..undelivered_env()
    };
    let arrived = undelivered(&mut sim, &mut env);
    let f = comes_at(&mut sim, &mut env, arrived, "tokens_undelivered", 15_000);
    assert_lists(&f, &["on 5/6 witnesses"]);
}

#[test]
fn a_scheduler_still_generating_is_never_judged_early() {
    // A long answer on its way (not streamed): the scheduler's tokens rise every second,
    // nothing leaves yet; its GPU reads idle between batches.
    let mut sim = Sim::new(pd_topology());
    let mut env = undelivered_env();
    let arrived = undelivered(&mut sim, &mut env);
    sim.run(28_500, |s| {
        env.sched_tokens += 2.0;
        env.tick(s);
        assert_eq!(
            stuck_kinds(s),
            Vec::<String>::new(),
            "at {} ms",
            s.now - arrived
        );
    });
}

// --- the daemon's suspicion and a one-shot's longer look --------------------------------

/// At 6 s, a request heading for one of these kinds on unanimous evidence makes the daemon
/// suspect its engine (its dumps start) and a one-shot look longer for its verdict at 10 s;
/// decode's KV queue, which holds the request itself, is no work seen.
#[test]
fn the_daemon_and_a_one_shot_wait_for_these_verdicts_as_for_a_wedge() {
    let th = wedgewatch::detect::Thresholds::default();
    let silent = th.sampling.silent_after(th.correlate.wedged_soonest_ms());
    let check = |sim: &Sim, what: &str| {
        let v = sim.model.view(sim.now);
        let p = wedgewatch::correlate::pending_verdict(&sim.model, &v, silent, 10_000)
            .unwrap_or_else(|| panic!("{what}: no pending verdict"));
        assert_eq!(
            (p.component.as_str(), p.wait_ms),
            (DECODE, 10_000),
            "{what}"
        );
        let s = wedgewatch::policy::suspicion::of_model(&sim.model, sim.now);
        assert!(
            s.reasons(DECODE)
                .iter()
                .any(|r| matches!(r, SuspicionReason::SilentRequest { .. })),
            "{what}: decode not suspected"
        );
    };
    let mut sim = Sim::new(topology());
    let mut env = kv_env();
    let (arrived, _) = kv_stalled(&mut sim);
    run_to(&mut sim, &mut env, arrived, 6_000);
    check(&sim, "kv_transfer_stalled");

    let mut sim = Sim::new(pd_topology());
    let mut env = failed_env();
    let arrived = prefill_failed(&mut sim, &mut env);
    run_to(&mut sim, &mut env, arrived, 6_000);
    check(&sim, "pd_leg_failed");

    // Decode busy: judged at 30 s, nothing to look longer for.
    let mut sim = Sim::new(pd_topology());
    let mut env = Env {
        decode_busy: true,
        decode_work: 0.9,
        ..failed_env()
    };
    let arrived = prefill_failed(&mut sim, &mut env);
    run_to(&mut sim, &mut env, arrived, 6_000);
    let v = sim.model.view(sim.now);
    assert_eq!(
        wedgewatch::correlate::pending_verdict(&sim.model, &v, silent, 10_000),
        None
    );
}
