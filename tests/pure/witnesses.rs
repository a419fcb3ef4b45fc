//! The evidence-weighted verdict (issue 33, `correlate::verdict`): a request with no response
//! byte is judged after 10 s when every witness says nothing works on it (no byte, GPU idle,
//! scheduler idle in two dumps, counters frozen, no queue), later on less evidence (up to
//! `wedged_after_ms`), never early when a witness saw work; the wait counts from the
//! request's last byte; and a one-shot is told how much longer to look.

use correl_common::*;
use wedgewatch::clock::Millis;
use wedgewatch::model::*;
use wedgewatch_testkit::correl as correl_common;

/// The decode engine's background, one call per 250 ms tick: GPU readings, metrics every
/// second, a stack dump of its scheduler every `dump_every` ticks.
struct Decode {
    gpu: bool,
    metrics: bool,
    queued: f64,
    /// Tokens generated per metrics point (0: counters frozen).
    gen_per_point: f64,
    dump_every: u64,
    ticks: u64,
    gen: f64,
}

impl Decode {
    fn idle() -> Decode {
        Decode {
            gpu: true,
            metrics: true,
            queued: 0.0,
            gen_per_point: 0.0,
            dump_every: 10,
            ticks: 0,
            gen: 500.0,
        }
    }

    fn tick(&mut self, sim: &mut Sim) {
        self.ticks += 1;
        if self.metrics && self.ticks % 4 == 1 {
            self.gen += self.gen_per_point;
            let m = [
                ("running", 0.0),
                ("queued", self.queued),
                ("forward_seconds_total", 100.0),
                ("generation_tokens_total", self.gen),
            ];
            sim.ingest(Payload::Metrics(vec![scrape(DECODE, &m)]));
        }
        if self.gpu {
            sim.ingest(Payload::Gpu(gpu(&[(0, 0, 60), (1, 0, 60)])));
        }
        if self.ticks % self.dump_every == 1 {
            let now = sim.now;
            sim.ingest(Payload::Stacks(vec![stack(
                401,
                now,
                "idle",
                "maybe_sleep",
            )]));
        }
    }
}

/// proxy -> router -> prefill (answered) + decode (waiting); returns the decode leg's
/// connection. The decode request's last byte arrives at the returned time.
fn pd_request_prefill_answered(sim: &mut Sim) -> Millis {
    let a = sim.connect(None, 8000, 100);
    let b = sim.connect(Some(100), 30000, 200);
    let p = sim.connect(Some(200), 31011, 300);
    let d = sim.connect(Some(200), 31012, 400);
    sim.request(a, 800);
    sim.advance(20);
    sim.request(b, 830);
    sim.advance(25);
    sim.request(p, 950);
    sim.request(d, 950);
    let arrived = sim.now;
    sim.sample_sockets();
    sim.advance(100);
    sim.respond(p, 400);
    sim.sample_sockets();
    arrived
}

fn findings(sim: &Sim) -> Vec<Finding> {
    wedgewatch::pipeline::parts(&sim.model, sim.now).findings
}

fn wedges(sim: &Sim) -> Vec<Finding> {
    findings(sim)
        .into_iter()
        .filter(|f| f.kind == FindingKind::WedgedRequest)
        .collect()
}

/// Runs until `at` ms after `arrived`.
fn run_to(sim: &mut Sim, d: &mut Decode, arrived: Millis, at: Millis) {
    let left = arrived + at - sim.now;
    sim.run(left.max(0) / 250 * 250, |s| d.tick(s));
}

fn verdict_evidence(f: &Finding) -> String {
    f.evidence
        .iter()
        .filter(|e| e.source == "verdict")
        .map(|e| e.detail.clone())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn unanimous_witnesses_judge_at_ten_seconds_and_say_when_each_turned() {
    let mut sim = Sim::new(pd_topology());
    let mut d = Decode::idle();
    let arrived = pd_request_prefill_answered(&mut sim);
    run_to(&mut sim, &mut d, arrived, 9_750);
    assert!(
        wedges(&sim).is_empty(),
        "not before 10 s: {:?}",
        wedges(&sim)
    );
    run_to(&mut sim, &mut d, arrived, 10_500);
    let w = wedges(&sim);
    assert_eq!(w.len(), 1, "{w:#?}");
    let f = &w[0];
    assert_eq!(f.component.as_deref(), Some(DECODE));
    assert!(
        f.summary.ends_with("; judged after 10 s on 5/5 witnesses"),
        "{}",
        f.summary
    );
    let ev = verdict_evidence(f);
    for want in [
        "@decode waited 10 s since its last request byte, judged after 10 s on 5/5 witnesses (30 s on less evidence): ",
        "no response byte since it arrived",
        "GPU idle from +2.",
        "scheduler idle from +",
        "counters frozen from +",
        "no queue from +",
    ] {
        assert!(ev.contains(want), "{want:?} missing: {ev}");
    }
    // The scheduler witness turned at its second dump after the settling time (dumps every
    // 2.5 s): "from +4.x s (3 dumps)" or so, never from its first.
    let sched = ev
        .split("scheduler idle from +")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse::<f64>().ok())
        .expect("when the scheduler witness turned");
    assert!((4.0..=7.5).contains(&sched), "{ev}");
}

#[test]
fn each_witness_missing_moves_the_verdict_a_quarter_of_the_way_to_thirty_seconds() {
    // No GPU reading and no metrics: two witnesses (no byte, scheduler) of five.
    let mut sim = Sim::new(pd_topology());
    let mut d = Decode {
        gpu: false,
        metrics: false,
        ..Decode::idle()
    };
    let arrived = pd_request_prefill_answered(&mut sim);
    run_to(&mut sim, &mut d, arrived, 24_750);
    assert!(wedges(&sim).is_empty(), "{:?}", wedges(&sim));
    run_to(&mut sim, &mut d, arrived, 25_500);
    let w = wedges(&sim);
    assert_eq!(w.len(), 1, "{w:#?}");
    assert!(
        w[0].summary.ends_with("judged after 25 s on 2/5 witnesses"),
        "{}",
        w[0].summary
    );
    let ev = verdict_evidence(&w[0]);
    for want in [
        "GPU idle: no data",
        "counters frozen: no data",
        "no queue: no data",
    ] {
        assert!(ev.contains(want), "{want:?} missing: {ev}");
    }

    // One dump in the whole wait (every 20 s): the scheduler witness is not yet in, 15 s.
    let mut sim = Sim::new(pd_topology());
    let mut d = Decode {
        dump_every: 80,
        ..Decode::idle()
    };
    let arrived = pd_request_prefill_answered(&mut sim);
    run_to(&mut sim, &mut d, arrived, 14_750);
    assert!(wedges(&sim).is_empty(), "{:?}", wedges(&sim));
    run_to(&mut sim, &mut d, arrived, 15_500);
    let w = wedges(&sim);
    assert_eq!(w.len(), 1, "{w:#?}");
    let ev = verdict_evidence(&w[0]);
    assert!(
        ev.contains("judged after 15 s on 4/5 witnesses")
            && ev.contains("scheduler idle: not yet (too few dumps)"),
        "{ev}"
    );
}

#[test]
fn a_witness_that_saw_work_keeps_the_slow_rule() {
    // A queue in front of it (the engine counts requests waiting): never before 30 s.
    let mut sim = Sim::new(pd_topology());
    let mut d = Decode {
        queued: 2.0,
        ..Decode::idle()
    };
    let arrived = pd_request_prefill_answered(&mut sim);
    run_to(&mut sim, &mut d, arrived, 29_500);
    assert!(wedges(&sim).is_empty(), "{:?}", wedges(&sim));
    run_to(&mut sim, &mut d, arrived, 30_500);
    let w = wedges(&sim);
    assert_eq!(w.len(), 1, "{w:#?}");
    assert!(
        verdict_evidence(&w[0]).contains("no queue: no, work seen"),
        "{:?}",
        w[0].evidence
    );

    // Tokens generated meanwhile (for others) while the GPU reads idle between batches: a
    // busy engine. Not early, and at 30 s the busy-engine rule (nothing overtook it) holds.
    let mut sim = Sim::new(pd_topology());
    let mut d = Decode {
        gen_per_point: 40.0,
        ..Decode::idle()
    };
    let arrived = pd_request_prefill_answered(&mut sim);
    run_to(&mut sim, &mut d, arrived, 40_000);
    assert!(wedges(&sim).is_empty(), "{:?}", wedges(&sim));
}

#[test]
fn a_request_still_uploading_is_judged_from_its_last_byte() {
    // A client sends its body to the proxy 100 bytes a second for 40 s: the proxy waits
    // for the rest (nothing forwarded yet), which is no wedge however long it takes.
    let mut sim = Sim::new(pd_topology());
    let mut d = Decode::idle();
    let c = sim.connect(None, 8000, 100);
    for _ in 0..40 {
        sim.request(c, 100);
        sim.run(1_000, |s| d.tick(s));
    }
    assert!(
        wedges(&sim).is_empty(),
        "an upload in progress is no wedge: {:?}",
        wedges(&sim)
    );
    // Its last byte in (1 s ago), nothing forwarded and nothing back: the proxy forgot it,
    // 30 s on (a proxy has no other witness).
    sim.run(28_500, |s| d.tick(s));
    assert!(wedges(&sim).is_empty(), "{:?}", wedges(&sim));
    sim.run(1_000, |s| d.tick(s));
    let w = wedges(&sim);
    assert_eq!(w.len(), 1, "{w:#?}");
    assert_eq!(w[0].component.as_deref(), Some(PROXY));
    assert!(
        w[0].summary.ends_with("judged after 30 s on 1/5 witnesses"),
        "{}",
        w[0].summary
    );
}

#[test]
fn an_idle_decode_waits_for_its_busy_prefill_without_a_verdict() {
    // PD, both legs waiting: prefill computes a long prompt (GPU 0 busy, its forward time
    // rising); decode, idle, waits for the KV cache. Decode's witnesses are unanimous, but it
    // is prefill's consequence; prefill is busy, and nothing overtook it.
    let mut sim = Sim::new(pd_topology());
    let a = sim.connect(None, 8000, 100);
    let b = sim.connect(Some(100), 30000, 200);
    let p = sim.connect(Some(200), 31011, 300);
    let dc = sim.connect(Some(200), 31012, 400);
    sim.request(a, 90_000);
    sim.advance(20);
    sim.request(b, 90_030);
    sim.advance(25);
    sim.request(p, 90_150);
    sim.request(dc, 90_150);
    let mut d = Decode::idle();
    let mut forward = 10.0;
    let mut ticks = 0u64;
    sim.run(60_000, |s| {
        d.tick(s);
        ticks += 1;
        // Prefill: GPU 0 busy, forward time rising, its scheduler in a batch.
        s.ingest(Payload::Gpu(gpu(&[(0, 95, 280), (1, 0, 60)])));
        if ticks % 4 == 1 {
            forward += 0.9;
            let m = [
                ("running", 1.0),
                ("queued", 0.0),
                ("forward_seconds_total", forward),
            ];
            s.ingest(Payload::Metrics(vec![scrape(PREFILL, &m)]));
        }
        if ticks % 10 == 1 {
            let now = s.now;
            s.ingest(Payload::Stacks(vec![stack(
                301,
                now,
                "running_batch",
                "forward_batch_generation",
            )]));
        }
    });
    let fs = findings(&sim);
    assert!(
        !fs.iter()
            .any(|f| f.kind == FindingKind::WedgedRequest || f.kind == FindingKind::StalledStream),
        "{fs:#?}"
    );
}

#[test]
fn a_one_shot_is_told_how_much_longer_to_look() {
    let th = wedgewatch::detect::Thresholds::default();
    let silent = th.sampling.silent_after(th.correlate.wedged_soonest_ms());
    let pending = |sim: &Sim| {
        let v = sim.model.view(sim.now);
        wedgewatch::correlate::pending_verdict(&sim.model, &v, silent, 10_000)
    };
    let mut sim = Sim::new(pd_topology());
    let mut d = Decode::idle();
    let arrived = pd_request_prefill_answered(&mut sim);
    run_to(&mut sim, &mut d, arrived, 2_000);
    assert_eq!(pending(&sim), None, "too young to be suspect");
    run_to(&mut sim, &mut d, arrived, 6_000);
    let p = pending(&sim).expect("pending");
    assert_eq!(p.component, DECODE);
    assert_eq!(p.wait_ms, 10_000, "{p:?}");
    assert!((3_900..=4_400).contains(&p.more_ms), "{p:?}");
    run_to(&mut sim, &mut d, arrived, 10_500);
    assert_eq!(pending(&sim), None, "judged: nothing pending");
    assert_eq!(wedges(&sim).len(), 1);

    // Work seen: no verdict to wait for.
    let mut sim = Sim::new(pd_topology());
    let mut d = Decode {
        gen_per_point: 40.0,
        ..Decode::idle()
    };
    let arrived = pd_request_prefill_answered(&mut sim);
    run_to(&mut sim, &mut d, arrived, 6_000);
    assert_eq!(pending(&sim), None);
}

#[test]
fn the_daemon_suspects_a_silent_request_early_only_while_nothing_works_on_it() {
    let silent_early = |d: &mut Decode| {
        let mut sim = Sim::new(pd_topology());
        let arrived = pd_request_prefill_answered(&mut sim);
        run_to(&mut sim, d, arrived, 5_000);
        let s = wedgewatch::policy::suspicion::of_model(&sim.model, sim.now);
        s.reasons(DECODE)
            .iter()
            .any(|r| matches!(r, SuspicionReason::SilentRequest { .. }))
    };
    // Silent 5 s, past a third of the soonest verdict: its dumps must start now.
    assert!(silent_early(&mut Decode::idle()));
    // Tokens generated for others meanwhile: judged at 30 s, suspected at a third of that.
    assert!(!silent_early(&mut Decode {
        gen_per_point: 40.0,
        ..Decode::idle()
    }));
}
