//! Scenario tests for every detector, with synthetic samples on explicit timestamps.
//! Negative cases: healthy streaming load, idle keep-alive connections and a slow but
//! progressing stream must not produce wedged_request / stalled_stream /
//! busy_without_progress.

use correl_common::*;
use wedgewatch::clock::Millis;
use wedgewatch::detect::Thresholds;
use wedgewatch::model::*;
use wedgewatch_testkit::correl as correl_common;

const NEVER: [&str; 3] = ["wedged_request", "stalled_stream", "busy_without_progress"];

fn pd_request(sim: &mut Sim) -> [usize; 4] {
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
    [a, b, p, d]
}

/// Per-tick background: metrics every 1 s, GPU every tick, a stack dump every 5 s.
struct Env {
    decode_metrics: Vec<(&'static str, f64)>,
    forward_per_s: f64,
    gpu_util: u32,
    gpu_watts: u32,
    sched_state: &'static str,
    sched_top: &'static str,
    forward_total: f64,
    ticks: u64,
    /// Some(rate): export generation_tokens_total rising at this rate per metrics point.
    gen_per_point: Option<f64>,
    gen_total: f64,
}

impl Env {
    fn idle() -> Env {
        Env {
            decode_metrics: vec![("running", 0.0), ("queued", 0.0), ("http_active", 1.0)],
            forward_per_s: 0.0,
            gpu_util: 0,
            gpu_watts: 60,
            sched_state: "idle",
            sched_top: "maybe_sleep",
            forward_total: 100.0,
            ticks: 0,
            gen_per_point: None,
            gen_total: 0.0,
        }
    }
    fn busy(http_active: f64) -> Env {
        Env {
            decode_metrics: vec![
                ("running", http_active),
                ("queued", 0.0),
                ("http_active", http_active),
            ],
            forward_per_s: 0.8,
            gpu_util: 85,
            gpu_watts: 260,
            sched_state: "running_batch",
            sched_top: "forward_batch_generation",
            forward_total: 100.0,
            ticks: 0,
            gen_per_point: None,
            gen_total: 0.0,
        }
    }
    /// Its scheduler's dumps in `state`, `top` their innermost frame.
    fn scheduler_in(mut self, state: &'static str, top: &'static str) -> Env {
        (self.sched_state, self.sched_top) = (state, top);
        self
    }
    fn tick(&mut self, sim: &mut Sim) {
        self.ticks += 1;
        if self.ticks % 4 == 1 {
            self.forward_total += self.forward_per_s;
            let mut m = self.decode_metrics.clone();
            m.push(("forward_seconds_total", self.forward_total));
            if let Some(g) = self.gen_per_point {
                self.gen_total += g;
                m.push(("generation_tokens_total", self.gen_total));
            }
            sim.ingest(Payload::Metrics(vec![scrape(DECODE, &m)]));
        }
        sim.ingest(Payload::Gpu(gpu(&[
            (0, 0, 60),
            (1, self.gpu_util, self.gpu_watts),
        ])));
        if self.ticks % 20 == 1 {
            let now = sim.now;
            sim.ingest(Payload::Stacks(vec![stack(
                401,
                now,
                self.sched_state,
                self.sched_top,
            )]));
        }
    }
}

/// The one `wedged_request` among `fs` (fails when there is none or more than one).
fn one_wedge(fs: &[Finding]) -> &Finding {
    let w: Vec<&Finding> = fs.iter().filter(|f| f.kind == "wedged_request").collect();
    assert_eq!(w.len(), 1, "{fs:#?}");
    w[0]
}

fn findings(sim: &Sim) -> Vec<Finding> {
    wedgewatch::pipeline::parts(&sim.model, sim.now).findings
}

fn assert_none_of(fs: &[Finding], ks: &[&str]) {
    for f in fs {
        assert!(
            !ks.contains(&f.kind.as_str()),
            "unexpected {}: {}",
            f.kind,
            f.summary
        );
    }
}

/// The daemon's pass predicts when a waiting request turns wedged with no new sample (its
/// served answer is rebuilt at the first table after that instant): the detector agrees.
#[test]
fn the_pass_says_when_a_waiting_request_turns_wedged() {
    let mut sim = Sim::new(pd_topology());
    let mut env = Env::idle();
    let p = pd_request(&mut sim)[2];
    sim.run(250, |s| env.tick(s));
    sim.respond(p, 400);
    sim.run(5_000, |s| env.tick(s));
    let th = sim.model.thresholds.clone();
    let pass = wedgewatch::daemon::pass::Pass::run(&sim.model, sim.now);
    let turn = pass.next_turn_ms(&th).expect("requests wait");
    // The client's leg is the oldest: about 5.3 s of the soonest verdict's 10 s (every
    // witness of the idle engine says nothing works on it).
    assert!((4_000..=5_000).contains(&turn), "{turn}");
    let before = (turn - 250) / 250 * 250;
    sim.run(before, |s| env.tick(s));
    assert_none_of(&findings(&sim), &["wedged_request"]);
    // The prediction is the soonest a verdict can come; here the witnesses' second stack
    // dump since the request arrived (dumps every 5 s) is taken 0.3 s after it.
    sim.run(1_000, |s| env.tick(s));
    assert!(
        findings(&sim)
            .iter()
            .any(|f| f.kind == FindingKind::WedgedRequest),
        "wedged within a second of the predicted turn"
    );
    let after = wedgewatch::daemon::pass::Pass::run(&sim.model, sim.now).next_turn_ms(&th);
    assert_eq!(after, None, "the wedged requests turn no more");
}

#[test]
fn wedged_request_blames_the_decode_hop() {
    let mut sim = Sim::new(pd_topology());
    let mut env = Env::idle();
    let [a, b, p, d] = pd_request(&mut sim);
    let _ = (a, b, d);
    sim.run(250, |s| env.tick(s));
    sim.respond(p, 400); // prefill answers (headers + JSON body); the router now waits for decode
    sim.run(9_000, |s| env.tick(s));
    // Not yet: 9 s < 10 s, the wait when every witness says nothing works on it. But
    // suspicious already (silent past a third of that): the adaptive stack sampling dumps
    // decode's schedulers from now on, and only decode's.
    assert_none_of(&findings(&sim), &["wedged_request"]);
    let early = wedgewatch::policy::suspicion::of_model(&sim.model, sim.now);
    assert_eq!(
        early.engines().collect::<Vec<_>>(),
        vec![DECODE],
        "{early:?}"
    );
    assert!(
        early.reasons(DECODE).iter().any(
            |r| matches!(r, SuspicionReason::SilentRequest { silent_ms, request }
                if *silent_ms >= 3_300 && early.describe().contains(&request.id)
                    && request.bytes_in >= wedgewatch::correlate::MIN_INFERENCE_REQUEST_BYTES)
        ),
        "{early:?}"
    );
    sim.run(31_000, |s| env.tick(s));
    let late = wedgewatch::policy::suspicion::of_model(&sim.model, sim.now);
    assert!(
        late.reasons(DECODE)
            .contains(&SuspicionReason::FindingOpen(FindingKind::WedgedRequest)),
        "{late:?}"
    );

    let fs = findings(&sim);
    let f = one_wedge(&fs);
    println!("{}", f.summary);
    assert_eq!(f.component.as_deref(), Some(DECODE));
    assert_eq!(f.role, Some(Role::Decode));
    assert_eq!(f.severity, Severity::Critical);
    assert!(
        f.summary.starts_with(
            "1 request accepted 40 s ago is stuck at decode@127.0.0.1:31012: no response byte"
        ),
        "{}",
        f.summary
    );
    for want in [
        "GPU idle",
        "scheduler idle in",
        "/",
        // Over what time the dumps were taken: "k/k" alone does not say.
        " dumps over ",
        "engine reports 0 running",
        "no forward passes",
    ] {
        assert!(f.summary.contains(want), "{want} missing: {}", f.summary);
    }
    // One logical request, named once; its legs are the proxy, router, prefill (answered)
    // and decode exchanges, and it is stuck at the decode leg.
    let parts = wedgewatch::pipeline::parts(&sim.model, sim.now);
    assert_eq!(f.requests.len(), 1, "{:?}", f.requests);
    let l = parts
        .logical_requests
        .iter()
        .find(|l| l.id == f.requests[0])
        .expect("the named logical request");
    let comp_of = |id: &str| {
        parts
            .requests
            .iter()
            .find(|r| r.id == id)
            .map(|r| r.component.clone())
    };
    let comps: Vec<_> = l.legs.iter().filter_map(|id| comp_of(id)).collect();
    assert_eq!(
        comps,
        vec![
            PROXY.to_string(),
            ROUTER.to_string(),
            PREFILL.to_string(),
            DECODE.to_string()
        ]
    );
    assert_eq!(l.verdict, wedgewatch::model::Verdict::Stuck);
    assert_eq!(l.stuck_at.as_deref(), Some(DECODE));
    assert_eq!(l.stuck_leg, Some(format!("{}@decode", l.id)));
    assert!(f
        .evidence
        .iter()
        .any(|e| e.source == "sockets" && e.detail.contains("950 bytes in, 0 out")));
    assert!(f.explanation.is_some());
    assert_none_of(&fs, &["stalled_stream", "busy_without_progress"]);
}

#[test]
fn healthy_streaming_load_raises_nothing() {
    let mut sim = Sim::new(pd_topology());
    let mut env = Env::busy(6.0);
    let mut legs = Vec::new();
    for _ in 0..6 {
        legs.push(pd_request(&mut sim));
        sim.advance(30);
    }
    sim.run(500, |s| env.tick(s));
    for [_, _, p, _] in &legs {
        sim.respond(*p, 400); // a whole answer: headers + JSON body
    }
    // 60 s of streaming: every hop relays tokens every tick.
    sim.run(60_000, |s| {
        env.tick(s);
        for [a, b, _, d] in legs.clone() {
            s.respond(d, 40);
            s.respond(b, 40);
            s.respond(a, 40);
        }
    });
    let fs = findings(&sim);
    assert_none_of(&fs, &NEVER);
    assert!(fs.is_empty(), "{fs:#?}");
    // Nothing suspicious either: the adaptive stack sampling stays in its round-robin.
    let suspicion = wedgewatch::policy::suspicion::of_model(&sim.model, sim.now);
    assert!(suspicion.is_empty(), "{}", suspicion.describe());
    let parts = wedgewatch::pipeline::parts(&sim.model, sim.now);
    let streaming = parts
        .requests
        .iter()
        .filter(|r| r.state == RequestState::Streaming)
        .count();
    assert_eq!(streaming, 18, "6 x (proxy, router, decode) streaming");
}

#[test]
fn idle_keep_alive_connections_raise_nothing() {
    for with_metrics in [true, false] {
        let mut sim = Sim::new(pd_topology());
        let mut env = Env::idle();
        env.decode_metrics = vec![("running", 0.0), ("queued", 0.0), ("http_active", 0.0)];
        let [a, b, p, d] = pd_request(&mut sim);
        sim.run(250, |s| {
            if with_metrics {
                env.tick(s)
            }
        });
        sim.respond(p, 100);
        sim.respond(d, 500);
        sim.respond(b, 500);
        sim.respond(a, 500);
        // Connections stay open, nothing outstanding, for two minutes.
        sim.run(120_000, |s| {
            if with_metrics {
                env.tick(s)
            }
        });
        let parts = wedgewatch::pipeline::parts(&sim.model, sim.now);
        assert_none_of(&parts.findings, &NEVER);
        assert!(parts.findings.is_empty(), "{:#?}", parts.findings);
        let idle = parts
            .requests
            .iter()
            .filter(|r| r.state == RequestState::Idle)
            .count();
        assert_eq!(idle, 4, "one idle entry per open connection");
    }
}

#[test]
fn slow_but_progressing_stream_raises_nothing() {
    let mut sim = Sim::new(pd_topology());
    let mut env = Env::idle(); // a slow stream barely shows on the GPU
    let [a, b, p, d] = pd_request(&mut sim);
    sim.run(250, |s| env.tick(s));
    sim.respond(p, 100);
    let mut n = 0;
    sim.run(120_000, |s| {
        env.tick(s);
        n += 1;
        if n % 40 == 0 {
            // a token every 10 s
            s.respond(d, 20);
            s.respond(b, 20);
            s.respond(a, 20);
        }
    });
    let fs = findings(&sim);
    assert_none_of(&fs, &NEVER);
    let parts = wedgewatch::pipeline::parts(&sim.model, sim.now);
    let dreq = parts
        .requests
        .iter()
        .find(|r| r.component == DECODE)
        .expect("decode request");
    assert_eq!(dreq.state, RequestState::Streaming);
    assert!(dreq.bytes_out >= 220);
}

#[test]
fn stalled_stream_blames_the_deepest_stalled_hop() {
    let (sim, fs) = stream_then_stop(Env::idle(), 40_000, |_, _| {});
    let st = one_stalled(&fs);
    assert_eq!(st.component.as_deref(), Some(DECODE));
    assert!(st.summary.contains("stopped 40 s ago"), "{}", st.summary);
    assert_eq!(st.requests.len(), 1, "one request, whatever its hops");
    assert_none_of(&fs, &["wedged_request", "busy_without_progress"]);
    let parts = wedgewatch::pipeline::parts(&sim.model, sim.now);
    assert_eq!(
        parts
            .requests
            .iter()
            .filter(|r| r.state == RequestState::Stalled)
            .count(),
        3
    );

    // Same stop, but the engine says nothing is open: the response was complete.
    let mut env2 = Env::idle();
    env2.decode_metrics = vec![("running", 0.0), ("http_active", 0.0)];
    let (_, fs) = stream_then_stop(env2, 40_000, |_, _| {});
    assert_none_of(&fs, &NEVER);

    // Same stop while someone's metrics scrape (a 104-byte GET from outside the stack)
    // waits at the engine: the engine's in-flight count (1) is the stream, not the scrape.
    let mut sim3 = Sim::new(pd_topology());
    let mut env3 = Env::idle();
    let [a, b, p, d] = pd_request(&mut sim3);
    sim3.run(250, |s| env3.tick(s));
    sim3.respond(p, 100);
    sim3.run(2_000, |s| {
        env3.tick(s);
        s.respond(d, 50);
        s.respond(b, 50);
        s.respond(a, 50);
    });
    sim3.run(30_000, |s| env3.tick(s));
    let scrape = sim3.connect(None, 31012, 400);
    sim3.request(scrape, 104);
    sim3.run(10_000, |s| env3.tick(s));
    let fs = findings(&sim3);
    let st: Vec<_> = fs.iter().filter(|f| f.kind == "stalled_stream").collect();
    assert_eq!(st.len(), 1, "{fs:#?}");
    assert_eq!(st[0].component.as_deref(), Some(DECODE));
}

/// A PD request whose stream at decode (and up every hop) sent 2 s of bytes, then stopped
/// for `quiet_ms`; `env` ticks throughout and `during_quiet` may change it each tick.
fn stream_then_stop(
    mut env: Env,
    quiet_ms: Millis,
    mut during_quiet: impl FnMut(&mut Env, Millis),
) -> (Sim, Vec<Finding>) {
    let mut sim = Sim::new(pd_topology());
    let [a, b, p, d] = pd_request(&mut sim);
    sim.run(250, |s| env.tick(s));
    sim.respond(p, 100);
    sim.run(2_000, |s| {
        env.tick(s);
        s.respond(d, 50);
        s.respond(b, 50);
        s.respond(a, 50);
    });
    let stopped = sim.now;
    sim.run(quiet_ms, |s| {
        during_quiet(&mut env, s.now - stopped);
        env.tick(s);
    });
    let fs = findings(&sim);
    (sim, fs)
}

fn stalled_streams(fs: &[Finding]) -> Vec<&Finding> {
    fs.iter().filter(|f| f.kind == "stalled_stream").collect()
}

/// The one `stalled_stream` among `fs` (fails when there is none or more than one).
fn one_stalled(fs: &[Finding]) -> &Finding {
    let st = stalled_streams(fs);
    assert_eq!(st.len(), 1, "{fs:#?}");
    st[0]
}

/// A stream that stopped where every witness says nothing works on it (GPU idle, a PD
/// decode's loop polling its queues, counters frozen, no queue) is stalled after
/// `stall_unanimous_ms` (10 s), not `stall_after_ms` (30 s), and says what it was judged on.
#[test]
fn a_stopped_stream_is_stalled_as_soon_as_its_witnesses_agree() {
    let polling = || Env::idle().scheduler_in("pd_queue_polling", "process_decode_queue");
    let (sim, fs) = stream_then_stop(polling(), 8_000, |_, _| {});
    assert!(stalled_streams(&fs).is_empty(), "early at 8 s: {fs:#?}");
    let parts = wedgewatch::pipeline::parts(&sim.model, sim.now);
    let dreq = parts.requests.iter().find(|r| r.component == DECODE);
    assert_eq!(dreq.map(|r| r.state), Some(RequestState::Streaming));

    let (_, fs) = stream_then_stop(polling(), 14_000, |_, _| {});
    let st = one_stalled(&fs);
    assert_eq!(st.component.as_deref(), Some(DECODE));
    assert!(
        st.summary.contains("judged after 10 s on 5/5 witnesses"),
        "{}",
        st.summary
    );
    let verdict = st.evidence.iter().find(|e| e.source == "verdict");
    let verdict = verdict.map(|e| e.detail.as_str()).unwrap_or_default();
    assert!(
        verdict.contains("no byte since the stream's last")
            && verdict.contains("GPU idle from")
            && verdict.contains("(30 s on less evidence)"),
        "{verdict}"
    );
    assert_none_of(&fs, &["wedged_request", "busy_without_progress"]);
}

/// One engine witness short (no dump says the loop is idle), a quarter of the way on (15 s);
/// a witness that saw work since the stream stopped (a GPU burst), the slow rule (30 s).
#[test]
fn a_stopped_stream_waits_longer_on_less_evidence_and_never_early_after_work() {
    let unknown = || Env::idle().scheduler_in("unknown", "somewhere");
    let (_, fs) = stream_then_stop(unknown(), 13_000, |_, _| {});
    assert!(stalled_streams(&fs).is_empty(), "early at 13 s: {fs:#?}");
    let (_, fs) = stream_then_stop(unknown(), 17_000, |_, _| {});
    let st = one_stalled(&fs);
    assert!(
        st.summary.contains("judged after 15 s on 4/5 witnesses"),
        "{}",
        st.summary
    );

    // The GPU worked for half a second 4 s after the stop, then idled again.
    let burst = |env: &mut Env, quiet: Millis| {
        let working = (4_000..4_500).contains(&quiet);
        (env.gpu_util, env.gpu_watts) = if working { (85, 260) } else { (0, 60) };
    };
    let (_, fs) = stream_then_stop(Env::idle(), 25_000, burst);
    assert!(stalled_streams(&fs).is_empty(), "early after work: {fs:#?}");
    let (_, fs) = stream_then_stop(Env::idle(), 32_000, burst);
    let st = one_stalled(&fs);
    assert!(st.summary.contains("judged after 30 s"), "{}", st.summary);
}

/// A one-shot that sees a stream stop at an idle engine is told how much longer to look for
/// its verdict (as for a request waiting for its first byte); one whose engine worked since
/// the stop is not (its verdict is the slow rule's).
#[test]
fn a_one_shot_is_told_how_much_longer_to_look_at_a_stopped_stream() {
    let th = Thresholds::default();
    let silent = th.sampling.silent_after(th.correlate.stall_soonest_ms());
    let pending = |sim: &Sim| {
        let v = sim.model.view(sim.now);
        wedgewatch::correlate::pending_verdict(&sim.model, &v, silent, 10_000)
    };
    let (sim, _) = stream_then_stop(Env::idle(), 2_000, |_, _| {});
    assert_eq!(pending(&sim), None, "stopped too recently to be suspect");
    let (sim, _) = stream_then_stop(Env::idle(), 6_000, |_, _| {});
    let p = pending(&sim).expect("a stopped stream pending");
    assert_eq!(p.component, DECODE);
    assert_eq!(p.wait_ms, 10_000, "{p:?}");
    assert!((3_500..=4_500).contains(&p.more_ms), "{p:?}");

    let burst = |env: &mut Env, quiet: Millis| {
        let working = (3_000..3_500).contains(&quiet);
        (env.gpu_util, env.gpu_watts) = if working { (85, 260) } else { (0, 60) };
    };
    let (sim, _) = stream_then_stop(Env::idle(), 6_000, burst);
    assert_eq!(pending(&sim), None, "work seen since the stop");
}

#[test]
fn busy_without_progress_on_a_spinning_gpu() {
    let mut sim = Sim::new(pd_topology());
    let mut env = Env::idle();
    env.gpu_util = 100;
    env.gpu_watts = 40; // idle power at full "utilization": a spinning collective
    env.sched_state = "nccl_collective";
    env.sched_top = "all_reduce";
    let [_, _, p, _] = pd_request(&mut sim);
    sim.run(250, |s| env.tick(s));
    sim.respond(p, 100);
    sim.run(35_000, |s| env.tick(s));
    let fs = findings(&sim);
    let b: Vec<_> = fs
        .iter()
        .filter(|f| f.kind == "busy_without_progress")
        .collect();
    assert_eq!(b.len(), 1, "{fs:#?}");
    assert_eq!(b[0].component.as_deref(), Some(DECODE));
    assert!(b[0].summary.contains("idle power"), "{}", b[0].summary);
    assert_none_of(&fs, &["wedged_request"]);
}

#[test]
fn queue_not_draining_needs_a_persistent_queue_and_nothing_running() {
    let run = |running: f64| {
        let mut sim = Sim::new(pd_topology());
        let mut env = Env::idle();
        env.decode_metrics = vec![
            ("running", running),
            ("queued", 2.0),
            ("decode_prealloc_queue", 1.0),
        ];
        sim.run(40_000, |s| env.tick(s));
        findings(&sim)
    };
    let fs = run(0.0);
    let q: Vec<_> = fs
        .iter()
        .filter(|f| f.kind == "queue_not_draining")
        .collect();
    assert_eq!(q.len(), 1, "{fs:#?}");
    assert_eq!(q[0].component.as_deref(), Some(DECODE));
    assert!(q[0].summary.contains("3 queued"), "{}", q[0].summary);
    assert!(run(1.0).iter().all(|f| f.kind != "queue_not_draining"));
}

/// A scrape whose gauges say 0 running and 0 queued, with a fresh `/v1/loads` (republished
/// 50 ms before `now`) holding the PD queues `disaggregation`.
fn idle_with_loads(comp: &str, now: Millis, disaggregation: serde_json::Value) -> MetricsScrape {
    let mut sc = scrape(comp, &[("running", 0.0), ("queued", 0.0)]);
    let ts = now as f64 / 1000.0 - 0.05;
    sc.extra.insert(
        "v1_loads".into(),
        serde_json::json!({"loads": [{"dp_rank": 0, "num_running_reqs": 0, "num_waiting_reqs": 0,
            "timestamp": ts, "disaggregation": disaggregation}]}),
    );
    sc
}

#[test]
fn queue_not_draining_prefers_fresh_v1_loads_over_frozen_gauges() {
    let mut sim = Sim::new(pd_topology());
    sim.run(40_000, |s| {
        if (s.now - T0) % 1000 == 0 {
            // Frozen gauges say 0 queued; /v1/loads (republished, fresh) says 2 waiting in
            // the prealloc queue.
            let pd = serde_json::json!({"decode_prealloc_queue_reqs": 2});
            s.ingest(Payload::Metrics(vec![idle_with_loads(DECODE, s.now, pd)]));
        }
    });
    let fs = findings(&sim);
    let q: Vec<_> = fs
        .iter()
        .filter(|f| f.kind == "queue_not_draining")
        .collect();
    assert_eq!(q.len(), 1, "{fs:#?}");
    assert!(q[0].evidence[0].detail.contains("v1_loads"));
}

#[test]
fn queue_not_draining_ignores_a_load_snapshot_the_engine_stopped_republishing() {
    let mut sim = Sim::new(pd_topology());
    sim.run(40_000, |s| {
        if (s.now - T0) % 1000 == 0 {
            // The last snapshot, written at T0 while a request sat in the inflight queue,
            // served unchanged ever since (an idle engine that stopped republishing).
            let mut sc = scrape(DECODE, &[]);
            sc.extra.insert(
                "v1_loads".into(),
                serde_json::json!({"loads": [{"dp_rank": 0, "num_running_reqs": 0, "num_waiting_reqs": 0,
                    "timestamp": T0 as f64 / 1000.0, "disaggregation": {"prefill_inflight_queue_reqs": 1}}]}),
            );
            s.ingest(Payload::Metrics(vec![sc]));
        }
    });
    let fs = findings(&sim);
    assert!(fs.iter().all(|f| f.kind != "queue_not_draining"), "{fs:#?}");
}

#[test]
fn scheduler_stuck_in_the_same_frame_in_every_dump() {
    let run = |states: [&str; 3], tops: [&str; 3]| {
        let mut sim = Sim::new(pd_topology());
        for i in 0..3 {
            sim.advance(5_000);
            let now = sim.now;
            sim.ingest(Payload::Stacks(vec![stack(401, now, states[i], tops[i])]));
        }
        findings(&sim)
    };
    let fs = run(["stuck_outside_loop"; 3], ["evict_mamba"; 3]);
    let s: Vec<_> = fs.iter().filter(|f| f.kind == "scheduler_stuck").collect();
    assert_eq!(s.len(), 1, "{fs:#?}");
    assert!(s[0].summary.contains("evict_mamba"));
    assert_eq!(s[0].component.as_deref(), Some(DECODE));
    // Unknown state but the same deep frame every time also counts.
    assert!(run(["unknown"; 3], ["tree_cache_walk"; 3])
        .iter()
        .any(|f| f.kind == "scheduler_stuck"));
    // A scheduler that left its loop (`threading._shutdown`) is stuck, even as its frames
    // move; start-up only when the same frame is seen in every dump.
    assert!(run(["shutdown"; 3], ["_shutdown", "join", "_shutdown"])
        .iter()
        .any(|f| f.kind == "scheduler_stuck"));
    assert!(run(["startup"; 3], ["load_weights"; 3])
        .iter()
        .any(|f| f.kind == "scheduler_stuck"));
    assert!(run(["startup"; 3], ["a", "b", "c"]).is_empty());
    // An idle loop sitting in the same poll is not stuck; two dumps are not enough.
    assert!(run(["idle"; 3], ["maybe_sleep"; 3]).is_empty());
    assert!(run(
        ["stuck_outside_loop", "running_batch", "stuck_outside_loop"],
        ["a", "b", "a"]
    )
    .is_empty());
}

fn procs(t_fds: u32, start_ticks: u64, pid: i32) -> Vec<ProcessFacts> {
    vec![ProcessFacts {
        pid,
        start_ticks: Some(start_ticks),
        fd_count: Some(t_fds),
        ..Default::default()
    }]
}

#[test]
fn accumulating_state_on_growing_fds_only() {
    let run = |grow: u32| {
        let mut sim = Sim::new(pd_topology());
        for i in 0..40u32 {
            sim.advance(10_000);
            let fds = 100 + grow * i + (i % 3); // small noise
            sim.ingest(Payload::Processes(procs(fds, 1000, 400)));
        }
        findings(&sim)
    };
    let fs = run(10);
    let a: Vec<_> = fs
        .iter()
        .filter(|f| f.kind == "accumulating_state")
        .collect();
    assert_eq!(a.len(), 1, "{fs:#?}");
    assert!(a[0].summary.contains("open fds"), "{}", a[0].summary);
    assert_eq!(a[0].component.as_deref(), Some(DECODE));
    assert!(run(0).iter().all(|f| f.kind != "accumulating_state"));
}

#[test]
fn accumulating_close_wait_sockets() {
    let mut sim = Sim::new(pd_topology());
    for i in 0..40 {
        sim.advance(10_000);
        if i > 0 {
            let c = sim.connect(Some(200), 31012, 400);
            sim.conns[c].state = TcpState::CloseWait;
        }
        sim.sample_sockets();
    }
    let fs = findings(&sim);
    assert!(
        fs.iter()
            .any(|f| f.kind == "accumulating_state" && f.summary.contains("CLOSE_WAIT")),
        "{fs:#?}"
    );
}

#[test]
fn process_restarted_on_new_start_time_or_new_pid() {
    let mut sim = Sim::new(pd_topology());
    sim.ingest(Payload::Processes(procs(10, 1000, 400)));
    sim.advance(1000);
    sim.ingest(Payload::Processes(procs(10, 1000, 400)));
    assert!(findings(&sim).is_empty());
    sim.advance(1000);
    sim.ingest(Payload::Processes(procs(10, 2000, 400))); // same pid, new start: restarted
    let fs = findings(&sim);
    let r: Vec<_> = fs
        .iter()
        .filter(|f| f.kind == "process_restarted")
        .collect();
    assert_eq!(r.len(), 1, "{fs:#?}");
    assert!(
        r[0].summary.contains("400:1000") && r[0].summary.contains("400:2000"),
        "{}",
        r[0].summary
    );

    // Rediscovery with a new main pid.
    let mut sim = Sim::new(pd_topology());
    sim.ingest(Payload::Processes(procs(10, 1000, 400)));
    let mut t = pd_topology();
    t.components[3].pids = vec![500];
    t.components[3].main_pid = Some(500);
    sim.advance(1000);
    sim.model.set_topology(t);
    sim.ingest(Payload::Processes(procs(10, 3000, 500)));
    let fs = findings(&sim);
    assert_eq!(
        fs.iter().filter(|f| f.kind == "process_restarted").count(),
        1,
        "{fs:#?}"
    );
}

#[test]
fn endpoint_unresponsive_after_consecutive_failures() {
    let mut sim = Sim::new(pd_topology());
    let bad = |mut s: MetricsScrape| {
        if let Some(p) = s.metrics.as_mut() {
            p.outcome = FetchOutcome::Timeout;
            p.elapsed_ms = 2000;
        }
        s
    };
    sim.ingest(Payload::Metrics(vec![scrape(DECODE, &[])]));
    sim.advance(1000);
    sim.ingest(Payload::Metrics(vec![bad(scrape(DECODE, &[]))]));
    assert!(findings(&sim).is_empty(), "one failure is not enough");
    sim.advance(1000);
    sim.ingest(Payload::Metrics(vec![bad(scrape(DECODE, &[]))]));
    let fs = findings(&sim);
    let e: Vec<_> = fs
        .iter()
        .filter(|f| f.kind == "endpoint_unresponsive")
        .collect();
    assert_eq!(e.len(), 1, "{fs:#?}");
    // An endpoint an old build lacks (404 every time) answers: not unresponsive.
    let mut sim2 = Sim::new(pd_topology());
    for _ in 0..3 {
        sim2.advance(1000);
        let mut sc = scrape(DECODE, &[]);
        sc.extra_probes.push(EndpointProbe {
            url: "http://127.0.0.1:31012/v1/loads".into(),
            outcome: FetchOutcome::HttpError,
            http_status: Some(404),
            elapsed_ms: 2,
            body_bytes: 9,
            detail: None,
        });
        sim2.ingest(Payload::Metrics(vec![sc]));
    }
    assert!(findings(&sim2).is_empty());
    assert!(
        e[0].summary.contains("timed out after 2000 ms"),
        "{}",
        e[0].summary
    );
}

#[test]
fn config_changed_names_the_variable() {
    let mut sim = Sim::new(pd_topology());
    sim.model.set_config_changes(vec![Change {
        component: DECODE.into(),
        role: Role::Decode,
        field: "env".into(),
        key: Some("SGLANG_DECODE_SPLIT_TUNING".into()),
        before: None,
        after: Some("1".into()),
    }]);
    let fs = findings(&sim);
    assert_eq!(kinds(&fs), vec!["config_changed"]);
    assert!(
        fs[0].summary.contains("+ env SGLANG_DECODE_SPLIT_TUNING=1"),
        "{}",
        fs[0].summary
    );
    assert_eq!(fs[0].role, Some(Role::Decode));
}

#[test]
fn thresholds_load_from_toml_with_defaults_and_reject_unknown_keys() {
    let t = Thresholds::from_toml("wedged_after_ms = 5000\n").expect("parse");
    assert_eq!(t.correlate.wedged_after_ms, 5000);
    assert_eq!(
        t.correlate.stall_after_ms,
        Thresholds::default().correlate.stall_after_ms
    );
    let err = Thresholds::from_toml("wedge_after = 1\n").expect_err("unknown key");
    assert!(err.to_string().contains("wedge_after"), "{err}");
}

#[test]
fn thresholds_change_the_verdict() {
    let mut sim = Sim::new(pd_topology());
    sim.model.thresholds.correlate.wedged_after_ms = 5_000;
    let mut env = Env::idle();
    let d = sim.connect(Some(200), 31012, 400);
    // An inference-sized request (a 100-byte one is a probe: never stuck).
    sim.request(d, 500);
    sim.run(6_000, |s| env.tick(s));
    assert!(findings(&sim).iter().any(|f| f.kind == "wedged_request"));
}

#[test]
fn pd_both_legs_waiting_blames_prefill() {
    let mut sim = Sim::new(pd_topology());
    let mut env = Env::idle();
    pd_request(&mut sim);
    sim.run(40_000, |s| env.tick(s));
    let fs = findings(&sim);
    let w = one_wedge(&fs);
    assert_eq!(w.component.as_deref(), Some(PREFILL));
    assert_eq!(w.role, Some(Role::Prefill));
    assert_eq!(w.requests.len(), 1, "one request: {:?}", w.requests);
    let parts = wedgewatch::pipeline::parts(&sim.model, sim.now);
    let l = parts
        .logical_requests
        .iter()
        .find(|l| l.id == w.requests[0])
        .expect("named");
    assert_eq!(
        l.legs.len(),
        4,
        "proxy, router, prefill and the dependent decode leg"
    );
    assert_eq!(l.stuck_role, Some(Role::Prefill));
    assert!(w
        .evidence
        .iter()
        .any(|e| e.detail.contains("needs the KV cache from this prefill")));
}

/// The real SGLang pair (0.5.23, `tests/sglang_real.rs`): a decode that accepts a request
/// and forgets it never connects to prefill for it, and prefill holds the request in its
/// bootstrap queue (its `/v1/loads` says so; the gauge is updated only when a batch runs).
/// Both legs wait; the decode leg is the cause, the prefill leg its consequence.
#[test]
fn pd_both_legs_waiting_blames_decode_when_prefill_waits_for_it_to_connect() {
    let mut sim = Sim::new(pd_topology());
    let mut env = Env::idle();
    pd_request(&mut sim);
    let mut ticks = 0;
    sim.run(40_000, |s| {
        env.tick(s);
        ticks += 1;
        if ticks % 4 == 0 {
            let pd = serde_json::json!({"prefill_bootstrap_queue_reqs": 1});
            s.ingest(Payload::Metrics(vec![idle_with_loads(PREFILL, s.now, pd)]));
        }
    });
    let fs = findings(&sim);
    let w = one_wedge(&fs);
    assert_eq!(w.component.as_deref(), Some(DECODE), "{fs:#?}");
    assert_eq!(w.role, Some(Role::Decode));
    assert!(
        w.evidence
            .iter()
            .any(|e| e.detail.contains("prefill leg") && e.detail.contains("bootstrap queue")),
        "{:#?}",
        w.evidence
    );
    let parts = wedgewatch::pipeline::parts(&sim.model, sim.now);
    let l = parts
        .logical_requests
        .iter()
        .find(|l| l.id == w.requests[0])
        .expect("named");
    assert_eq!(l.stuck_role, Some(Role::Decode));
    // Prefill's bootstrap queue is no queue of its own that does not drain.
    assert!(
        !fs.iter()
            .any(|f| f.kind == "queue_not_draining" && f.component.as_deref() == Some(PREFILL)),
        "{fs:#?}"
    );
    // The adaptive stack sampling suspects decode only: the prefill's silent leg and its
    // bootstrap queue wait for decode.
    let s = wedgewatch::policy::suspicion::of_model(&sim.model, sim.now);
    assert!(s.contains(DECODE), "{}", s.describe());
    assert!(!s.contains(PREFILL), "{}", s.describe());
}

/// The same, with the router's decode leg linked to the wrong connection of its pool (one
/// that carried nothing and reads done): the prefill leg still waits for decode in prefill's
/// bootstrap queue, and is not a request that prefill forgot.
#[test]
fn a_prefill_leg_waiting_for_decode_is_not_wedged_at_prefill_without_its_decode_leg() {
    let mut sim = Sim::new(pd_topology());
    let mut env = Env::idle();
    let [_, _, _, d] = pd_request(&mut sim);
    sim.run(250, |_| {});
    sim.respond(d, 0);
    sim.close(d);
    let mut ticks = 0;
    sim.run(40_000, |s| {
        env.tick(s);
        ticks += 1;
        if ticks % 4 == 0 {
            let pd = serde_json::json!({"prefill_bootstrap_queue_reqs": 1});
            s.ingest(Payload::Metrics(vec![idle_with_loads(PREFILL, s.now, pd)]));
        }
    });
    let fs = findings(&sim);
    assert!(
        !fs.iter()
            .any(|f| f.kind == "wedged_request" && f.component.as_deref() == Some(PREFILL)),
        "{fs:#?}"
    );
}

/// A request of `stuck_bytes` waits at the busy decode engine while `overtakers` later ones
/// of `later_bytes` are answered; the findings 35 s after.
fn busy_decode_overtaken(stuck_bytes: u64, later_bytes: u64, overtakers: usize) -> Vec<Finding> {
    let mut sim = Sim::new(pd_topology());
    let mut env = Env::busy(4.0);
    let stuck = sim.connect(Some(200), 31012, 400);
    sim.request(stuck, stuck_bytes);
    sim.run(2_000, |s| env.tick(s));
    for _ in 0..overtakers {
        let c = sim.connect(Some(200), 31012, 400);
        sim.request(c, later_bytes);
        sim.run(500, |s| env.tick(s));
        sim.respond(c, 300);
        sim.run(250, |s| env.tick(s));
    }
    sim.run(35_000, |s| env.tick(s));
    findings(&sim)
}

#[test]
fn wedged_on_a_busy_engine_only_when_later_requests_overtook_it() {
    let fs = busy_decode_overtaken(500, 500, 6);
    let w = one_wedge(&fs);
    assert!(
        w.summary.contains("later requests answered meanwhile"),
        "{}",
        w.summary
    );
    // A busy engine with nothing overtaking: a queue, not a wedge.
    assert!(busy_decode_overtaken(500, 500, 1)
        .iter()
        .all(|f| f.kind != "wedged_request"));
}

/// On a busy engine, a kept-alive connection first seen in a jiffy tie (its last request
/// and response bytes in one tick) is an idle connection, not a request waiting since the
/// daemon started, whatever the engine's in-flight count says at the moment (it moves with
/// every batch). Seen on the big lab: a false `wedged_request` right after start.
#[test]
fn a_jiffy_tie_at_start_on_a_busy_engine_is_not_a_wedge() {
    let mut sim = Sim::new(pd_topology());
    let mut env = Env::busy(4.0);
    let idle = sim.connect(Some(200), 31012, 400);
    sim.request(idle, 500);
    sim.respond(idle, 300);
    sim.advance(3_000);
    sim.run(2_000, |s| env.tick(s));
    // Later requests answered meanwhile, each on a connection of its own, closed after.
    for _ in 0..8 {
        let c = sim.connect(Some(200), 31012, 400);
        sim.request(c, 500);
        sim.run(500, |s| env.tick(s));
        sim.respond(c, 300);
        sim.run(250, |s| env.tick(s));
        sim.close(c);
    }
    sim.run(40_000, |s| env.tick(s));
    let fs = findings(&sim);
    assert!(fs.iter().all(|f| f.kind != "wedged_request"), "{fs:#?}");
}

/// The incident's variable under load: the decode engine forgets a long prompt while it keeps
/// answering short ones. Decode does no prefill, so the short ones count as overtaking it
/// (before: only requests of at least half its size did, and none came: never reported).
#[test]
fn a_long_prompt_forgotten_by_a_busy_decode_is_wedged() {
    let fs = busy_decode_overtaken(42_000, 2_000, 6);
    let w = one_wedge(&fs);
    assert!(
        w.summary.contains("6 later requests answered meanwhile"),
        "{}",
        w.summary
    );
    assert!(busy_decode_overtaken(42_000, 2_000, 1)
        .iter()
        .all(|f| f.kind != "wedged_request"));
}

#[test]
fn own_metrics_scrape_in_http_active_does_not_make_a_stall() {
    // sglang:http_requests_active counts the /metrics request that reads it.
    let mut sim = Sim::new(pd_topology());
    let c = sim.connect(Some(200), 31012, 400);
    sim.request(c, 400);
    sim.run(250, |_| {});
    sim.respond(c, 900);
    sim.run(60_000, |s| {
        let mut sc = scrape(DECODE, &[("http_active", 1.0)]);
        sc.series.push(Series {
            name: "sglang:http_requests_active".into(),
            labels: [("endpoint".to_string(), "/metrics".to_string())]
                .into_iter()
                .collect(),
            value: 1.0,
        });
        sc.series.push(Series {
            name: "sglang:http_requests_active".into(),
            labels: [("endpoint".to_string(), "/generate".to_string())]
                .into_iter()
                .collect(),
            value: 0.0,
        });
        s.ingest(Payload::Metrics(vec![sc]));
    });
    let parts = wedgewatch::pipeline::parts(&sim.model, sim.now);
    assert!(parts.findings.is_empty(), "{:#?}", parts.findings);
    assert_eq!(parts.extras[DECODE].metrics.get("http_active"), Some(&1.0));
}

#[test]
fn long_non_streaming_generation_is_not_busy_without_progress() {
    let run = |tokens_per_s: f64| {
        let mut sim = Sim::new(pd_topology());
        let mut env = Env::busy(1.0);
        env.gen_per_point = Some(tokens_per_s);
        let c = sim.connect(Some(200), 31012, 400);
        sim.request(c, 500);
        sim.run(45_000, |s| env.tick(s));
        findings(&sim)
    };
    // Tokens are generated, nothing is sent until the whole answer is ready: healthy.
    let fs = run(40.0);
    assert_none_of(&fs, &NEVER);
    // GPU busy, the token counter flat, no bytes: work without progress.
    let fs = run(0.0);
    let b: Vec<_> = fs
        .iter()
        .filter(|f| f.kind == "busy_without_progress")
        .collect();
    assert_eq!(b.len(), 1, "{fs:#?}");
    assert!(
        b[0].summary.contains("0 tokens generated"),
        "{}",
        b[0].summary
    );
}

#[test]
fn engine_state_includes_its_scheduler_child_processes() {
    // Discovery may model the scheduler as its own component (parent = the engine); its
    // process holds the GPU and runs the loop, so the engine's verdict must include it.
    let mut topo = pd_topology();
    topo.components[3].pids = vec![400];
    topo.components[3].gpus = vec![];
    let mut sched = comp(
        "scheduler_TP0@decode@127.0.0.1:31012",
        Role::Scheduler,
        0,
        &[401],
        &[],
    );
    sched.listen.clear();
    sched.parent = Some(DECODE.to_string());
    topo.components.push(sched);
    let mut sim = Sim::new(topo);
    let d = sim.connect(Some(200), 31012, 400);
    sim.request(d, 900);
    let mut n = 0;
    sim.run(40_000, |s| {
        n += 1;
        let mut g = gpu(&[(1, 0, 60)]);
        g.devices[0].processes.push(GpuProcess {
            pid: 401,
            used_mem_bytes: Some(1 << 30),
            sm_util_pct: Some(0),
        });
        s.ingest(Payload::Gpu(g));
        if n % 20 == 1 {
            let now = s.now;
            s.ingest(Payload::Stacks(vec![stack(
                401,
                now,
                "idle",
                "maybe_sleep",
            )]));
        }
    });
    let fs = findings(&sim);
    let w = one_wedge(&fs);
    assert_eq!(w.component.as_deref(), Some(DECODE));
    assert!(
        w.summary.contains("GPU idle")
            && w.summary.contains("scheduler idle in 6/6 dumps over 25 s"),
        "{}",
        w.summary
    );
    let parts = wedgewatch::pipeline::parts(&sim.model, sim.now);
    let t = parts.threads.iter().find(|t| t.pid == 401).expect("thread");
    assert_eq!(
        t.component.as_deref(),
        Some("scheduler_TP0@decode@127.0.0.1:31012")
    );
    assert!(t.states_over_window.len() >= 3);
    assert_eq!(
        parts.gpus[0].processes[0].component.as_deref(),
        Some("scheduler_TP0@decode@127.0.0.1:31012")
    );
    // The TUI scales its power and memory sparklines to these.
    assert_eq!(parts.gpus[0].power_limit_w, Some(300.0));
    assert_eq!(parts.gpus[0].mem_total_bytes, Some(80 << 30));
}

#[test]
fn no_request_findings_when_the_sockets_source_went_silent() {
    let mut sim = Sim::new(pd_topology());
    let mut env = Env::idle();
    let d = sim.connect(Some(200), 31012, 400);
    sim.request(d, 900);
    sim.run(5_000, |s| env.tick(s));
    // The sockets source fails for 40 s: the request only looks old.
    for _ in 0..160 {
        sim.advance(250);
        env.tick(&mut sim);
        let s = Sample {
            t_ms: sim.now,
            status: SourceStatus::unavailable("netlink: permission denied"),
            took_ms: 1,
            payload: Payload::Sockets(SocketTable::default()),
        };
        sim.model.ingest(&s);
    }
    let parts = wedgewatch::pipeline::parts(&sim.model, sim.now);
    assert_none_of(&parts.findings, &NEVER);
    assert_eq!(
        parts.sources[&SourceKind::Sockets].status,
        Status::Unavailable
    );
}

/// The requests, findings, threads, GPUs and sources the correlator hands over fit the
/// snapshot contract (`wedgewatch.snapshot/1`), and every request id a finding names is in
/// `requests`.
#[test]
fn parts_fit_the_snapshot_contract() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/schema/snapshot-1.schema.json");
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("schema")).expect("json");
    let validator = jsonschema::validator_for(&schema).expect("compile schema");

    // A wedge with a separate scheduler, GPU and stacks, plus idle and done requests.
    let mut sim = Sim::new(pd_topology());
    let mut env = Env::idle();
    let [_, _, p, _] = pd_request(&mut sim);
    sim.run(250, |s| env.tick(s));
    sim.respond(p, 150);
    sim.run(40_000, |s| env.tick(s));
    let parts = wedgewatch::pipeline::parts(&sim.model, sim.now);
    assert!(parts.findings.iter().any(|f| f.kind == "wedged_request"));
    let components: Vec<serde_json::Value> = parts
        .topology
        .components
        .iter()
        .map(|c| serde_json::json!({"id": c.id, "role": c.role, "stack": c.stack, "pids": c.pids, "main_pid": c.main_pid, "listen": c.listen, "started_at": null, "cmdline": [], "env": {}, "gpus": c.gpus}))
        .collect();
    let snap = serde_json::json!({
        "schema": "wedgewatch.snapshot/1",
        "taken_at": wedgewatch::clock::rfc3339(parts.taken_at_ms),
        "window_ms": parts.window_ms,
        "sources": parts.sources,
        "components": components,
        "requests": parts.requests,
        "gpus": parts.gpus,
        "threads": parts.threads,
        "findings": parts.findings,
        "logical_requests": parts.logical_requests,
    });
    let errors: Vec<String> = validator
        .iter_errors(&snap)
        .map(|e| format!("{} at {}", e, e.instance_path))
        .collect();
    assert!(errors.is_empty(), "{errors:#?}");
    let ids: std::collections::BTreeSet<&str> =
        parts.requests.iter().map(|r| r.id.as_str()).collect();
    // Findings name logical requests, whose legs are exchanges of `requests`.
    let logical: std::collections::BTreeSet<&str> = parts
        .logical_requests
        .iter()
        .map(|l| l.id.as_str())
        .collect();
    for f in &parts.findings {
        for r in &f.requests {
            assert!(
                logical.contains(r.as_str()),
                "{} names {r}, not in logical_requests",
                f.kind
            );
        }
    }
    for l in &parts.logical_requests {
        for x in &l.legs {
            assert!(ids.contains(x.as_str()), "{} leg {x} not in requests", l.id);
        }
    }
    for r in &parts.requests {
        for l in &r.links {
            assert!(
                ids.contains(l.as_str()),
                "{} links to {l}, not in requests",
                r.id
            );
        }
    }
}

/// The incident with a short threshold: the engine generated tokens for earlier requests
/// until just before these arrived (its token rate over `rate_window_ms` is still positive),
/// then nothing; the waiting requests are forgotten, not queued behind work.
#[test]
fn wedged_when_work_stopped_before_the_request_arrived() {
    let mut sim = Sim::new(pd_topology());
    sim.model.thresholds.correlate.wedged_after_ms = 8_000;
    let mut env = Env::busy(1.0);
    env.gen_per_point = Some(5.0);
    sim.run(5_000, |s| env.tick(s));
    // Work stops; the engine still counts the forgotten request in flight.
    let mut env = Env {
        gen_per_point: Some(0.0),
        gen_total: env.gen_total,
        forward_total: env.forward_total,
        ..Env::idle()
    };
    let d = sim.connect(Some(200), 31012, 400);
    sim.request(d, 900);
    sim.run(10_000, |s| env.tick(s));
    let fs = findings(&sim);
    let w = one_wedge(&fs);
    assert!(w.summary.contains("no token generated"), "{}", w.summary);
    // Still none while tokens keep flowing after the request arrived (a busy engine that
    // is slow, not forgetful).
    let mut sim = Sim::new(pd_topology());
    sim.model.thresholds.correlate.wedged_after_ms = 8_000;
    let mut env = Env::busy(2.0);
    env.gen_per_point = Some(5.0);
    let d = sim.connect(Some(200), 31012, 400);
    sim.request(d, 900);
    sim.run(10_000, |s| env.tick(s));
    assert_none_of(&findings(&sim), &["wedged_request"]);
}

/// Probes (a router's health check, a scrape: requests too small to be inference requests)
/// are never stuck requests, however long they wait; an inference request beside them is.
/// Every exchange is a leg of one logical request, named after it.
#[test]
fn probes_are_never_stuck_requests() {
    let mut sim = Sim::new(pd_topology());
    let mut env = Env::idle();
    let probe = sim.connect(Some(200), 31012, 400);
    sim.request(probe, 90);
    let real = sim.connect(Some(200), 31012, 400);
    sim.request(real, 900);
    sim.run(40_000, |s| env.tick(s));
    let parts = wedgewatch::pipeline::parts(&sim.model, sim.now);
    let w: Vec<_> = parts
        .findings
        .iter()
        .filter(|f| f.kind == "wedged_request")
        .collect();
    assert_eq!(w.len(), 1, "{:#?}", parts.findings);
    assert_eq!(w[0].requests.len(), 1, "{:?}", w[0].requests);
    let by_id = |id: &str| {
        parts
            .logical_requests
            .iter()
            .find(|l| l.id == id)
            .expect("logical request")
    };
    let stuck = by_id(&w[0].requests[0]);
    assert!(!stuck.probe && stuck.verdict == Verdict::Stuck);
    let probes: Vec<_> = parts.logical_requests.iter().filter(|l| l.probe).collect();
    assert_eq!(probes.len(), 1, "{:#?}", parts.logical_requests);
    assert_eq!(probes[0].verdict, Verdict::Waiting);
    for r in parts
        .requests
        .iter()
        .filter(|r| r.state != RequestState::Idle)
    {
        let id = r.request.as_deref().expect("a leg of a logical request");
        assert_eq!(r.leg.as_deref(), Some(format!("{id}@decode").as_str()));
        assert!(by_id(id).legs.contains(&r.id));
    }
}

/// A one-shot of one second on a busy decode engine: the forgotten request (36 s old, on a
/// kept-alive connection) and the later ones were all under way before the first look, so
/// no later request's size is known. `flowing`: their answers keep streaming through the
/// second; else each answer had left whole before the first look.
fn cold_look_at_busy_decode(flowing: bool) -> Vec<Finding> {
    let mut sim = Sim::new(pd_topology());
    let mut env = Env::busy(9.0);
    let stuck = sim.connect(Some(200), 31012, 400);
    sim.request(stuck, 500);
    sim.respond(stuck, 900);
    sim.advance(1_000);
    sim.request(stuck, 42_000);
    sim.advance(36_000);
    let later: Vec<usize> = (0..8)
        .map(|_| {
            let c = sim.connect(Some(200), 31012, 400);
            sim.request(c, 2_000);
            c
        })
        .collect();
    sim.advance(300);
    for &c in &later {
        sim.respond(c, 400);
    }
    sim.advance(50);
    sim.run(1_000, |s| {
        env.tick(s);
        if flowing {
            for &c in &later {
                s.respond(c, 120);
            }
        }
    });
    findings(&sim)
}

/// Seen on the big lab: `snapshot --window 1s` on the wedged lab under 200 streams found the
/// wedge in about half the runs. The engine is busy, so the wedge rests on later requests
/// answered meanwhile, and in one second only the requests it saw begin had a size: some
/// seconds none of those was answered yet (requests there complete in beats), while ~160
/// streams flowed. Streams seen flowing now count as answered later requests.
#[test]
fn a_one_second_look_at_a_busy_decode_counts_the_streams_it_sees_flowing() {
    let fs = cold_look_at_busy_decode(true);
    let w = one_wedge(&fs);
    assert!(
        w.summary.contains("8 later requests answered meanwhile"),
        "{}",
        w.summary
    );
    // Answers that had left whole before the first look could be a probe's: not counted.
    let fs = cold_look_at_busy_decode(false);
    assert!(fs.iter().all(|f| f.kind != "wedged_request"), "{fs:#?}");
}

/// Decode with four TP rank processes (pids 401..404) as scheduler children, each dumped
/// `dumps` times in the place `place(rank, dump)` gives: (state, rule, deciding frame).
fn tp_ranks_dumped(
    dumps: usize,
    place: impl Fn(usize, usize) -> (&'static str, &'static str, &'static str),
) -> Vec<Finding> {
    findings(&tp_ranks_sim(dumps, place))
        .into_iter()
        .filter(|f| f.kind == "ranks_diverged")
        .collect()
}

/// The simulation behind [`tp_ranks_dumped`].
fn tp_ranks_sim(
    dumps: usize,
    place: impl Fn(usize, usize) -> (&'static str, &'static str, &'static str),
) -> Sim {
    tp_ranks_generating(dumps, place, 0.0)
}

/// [`tp_ranks_sim`], decode's `generation_tokens_total` scraped with each dump and rising by
/// `tokens_per_dump` (0: no metrics).
fn tp_ranks_generating(
    dumps: usize,
    place: impl Fn(usize, usize) -> (&'static str, &'static str, &'static str),
    tokens_per_dump: f64,
) -> Sim {
    let mut topo = pd_topology();
    topo.components[3].pids = vec![400];
    for rank in 0..4 {
        let pid = 401 + rank;
        let mut s = comp(
            &format!("scheduler_TP{rank}@{DECODE}"),
            Role::Scheduler,
            0,
            &[pid],
            &[],
        );
        s.listen.clear();
        s.parent = Some(DECODE.to_string());
        s.title = Some(format!("sglang::scheduler_TP{rank}"));
        topo.components[3].children.push(s.id.clone());
        topo.components.push(s);
    }
    let mut sim = Sim::new(topo);
    for d in 0..dumps {
        sim.advance(3_000);
        let now = sim.now;
        let caps = (0..4)
            .map(|rank| {
                let (state, rule, frame) = place(rank, d);
                let mut c = stack(401 + rank as i32, now, state, frame);
                c.threads[0].rule = Some(rule.to_string());
                c.threads[0].decided_by = Some(format!("{frame} (x.py:1)"));
                c
            })
            .collect();
        sim.ingest(Payload::Stacks(caps));
        if tokens_per_dump > 0.0 {
            let tokens = tokens_per_dump * (d + 1) as f64;
            let m = [("generation_tokens_total", tokens)];
            sim.ingest(Payload::Metrics(vec![scrape(DECODE, &m)]));
        }
    }
    sim
}

/// A healthy TP engine on a slow machine (seen on the real SGLang tier's TP2 decode on the
/// CPU): one rank still in its forward in every dump while the other waits in the
/// all-reduce, and tokens come out: the ranks take turns, nothing diverged.
#[test]
fn ranks_taking_turns_while_tokens_come_out_have_not_diverged() {
    let lagging = |rank, _| {
        if rank == 0 {
            ("running_batch", "sglang.running_batch", "_forward_raw")
        } else {
            IN_ALL_REDUCE
        }
    };
    let generating = tp_ranks_generating(4, lagging, 40.0);
    let fs = findings(&generating);
    assert!(fs.iter().all(|f| f.kind != "ranks_diverged"), "{fs:#?}");
    // The same split with no token coming out is the hang.
    let hung = tp_ranks_generating(4, lagging, 0.0);
    let fs = findings(&hung);
    assert!(fs.iter().any(|f| f.kind == "ranks_diverged"), "{fs:#?}");
}

const IN_ALL_REDUCE: (&str, &str, &str) = (
    "nccl_collective",
    "sglang.nccl_collective",
    "_all_reduce_out_place",
);
const AT_BROADCAST: (&str, &str, &str) = (
    "gloo_collective",
    "sglang.gloo_collective",
    "broadcast_pyobj",
);

#[test]
fn ranks_diverged_names_the_rank_outside_the_collective_the_others_wait_in() {
    // sglang#33289's shape: three ranks in the forward's all-reduce, TP2 back at the request
    // broadcast.
    let fs = tp_ranks_dumped(3, |rank, _| {
        if rank == 2 {
            AT_BROADCAST
        } else {
            IN_ALL_REDUCE
        }
    });
    assert_eq!(fs.len(), 1, "{fs:#?}");
    let f = &fs[0];
    assert_eq!(f.component.as_deref(), Some(DECODE));
    assert_eq!(f.severity, Severity::Critical);
    assert!(
        f.summary.contains(
            "3 of 4 ranks (TP0, TP1, TP3) wait in nccl_collective in _all_reduce_out_place"
        ) && f
            .summary
            .contains("TP2 (pid 403) is gloo_collective in broadcast_pyobj"),
        "{}",
        f.summary
    );
    let ev: Vec<&str> = f.evidence.iter().map(|e| e.detail.as_str()).collect();
    assert!(
        ev.iter()
            .any(|e| e.starts_with("TP2 stack: broadcast_pyobj")),
        "{ev:#?}"
    );
    // sglang#22607's shape: TP0 in another collective (HiCache's all_reduce) while the others
    // wait at the request broadcast: TP0 is the odd one.
    let fs = tp_ranks_dumped(3, |rank, _| {
        if rank == 0 {
            ("collective", "collective.all_reduce", "all_reduce")
        } else {
            AT_BROADCAST
        }
    });
    assert_eq!(fs.len(), 1, "{fs:#?}");
    assert!(
        fs[0]
            .summary
            .contains("TP0 (pid 401) is collective in all_reduce"),
        "{}",
        fs[0].summary
    );
}

/// The report, the TUI's overview, `check` and the exporter name the odd rank.
#[test]
fn ranks_diverged_in_the_report_the_tui_check_and_the_exporter() {
    use wedgewatch::export::prometheus::{render, Evaluation};

    let sim = tp_ranks_sim(3, |rank, _| {
        if rank == 2 {
            AT_BROADCAST
        } else {
            IN_ALL_REDUCE
        }
    });
    let parts = wedgewatch::pipeline::parts(&sim.model, sim.now);
    let snap = wedgewatch::snapshot::assemble(parts, &Default::default());
    let md = wedgewatch::report::render(&snap);
    assert!(
        md.contains("ranks_diverged") && md.contains("TP2 (pid 403)"),
        "{md}"
    );

    let json = serde_json::to_vec(&snap).expect("snapshot JSON");
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("snapshot.json");
    std::fs::write(&file, json).expect("write");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_wedgewatch"))
        .args(["check", "--from"])
        .arg(&file)
        .output()
        .expect("run check");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "CRITICAL: {text}");
    assert!(
        text.contains("ranks_diverged") && text.contains("TP2 (pid 403)"),
        "{text}"
    );

    let screen = wedgewatch_testkit::screen::overview(&snap, 200, 50);
    assert!(screen.contains("CRIT ranks_diverged"), "{screen}");

    let view = sim.model.view(sim.now);
    let findings = wedgewatch::detect::run_all(&sim.model, &view);
    let mut redactor = wedgewatch::redact::Redactor::new();
    let e = Evaluation::new(&view, &findings, sim.model.topology(), &mut redactor);
    let text = render(Some(&e), &[], sim.now, "t");
    assert!(
        text.lines().any(|l| l.starts_with("wedgewatch_findings{")
            && l.contains("kind=\"ranks_diverged\"")
            && l.contains("severity=\"critical\"")),
        "{text}"
    );
}

#[test]
fn ranks_in_step_or_following_rank_0_are_not_diverged() {
    // TP ranks > 0 wait at the request broadcast while rank 0 cycles its loop: healthy.
    for tp0 in [
        ("idle", "sglang.idle", "on_idle"),
        ("running_batch", "sglang.running_batch", "run_batch"),
        // A PD prefill's rank 0 polling its transfers (the biglab's healthy prefill).
        (
            "pd_queue_polling",
            "sglang.pd_queue_polling",
            "process_disagg_prefill_inflight_queue",
        ),
    ] {
        let fs = tp_ranks_dumped(3, |rank, _| if rank == 0 { tp0 } else { AT_BROADCAST });
        assert!(fs.is_empty(), "{fs:#?}");
    }
    // Every rank in the same collective: the ranks agree (a hang elsewhere, not a split).
    assert!(tp_ranks_dumped(3, |_, _| IN_ALL_REDUCE).is_empty());
    // One rank of four in a collective is not "most".
    let one = tp_ranks_dumped(3, |rank, _| match rank {
        0 => IN_ALL_REDUCE,
        1 => ("idle", "sglang.idle", "on_idle"),
        2 => ("running_batch", "sglang.running_batch", "run_batch"),
        _ => ("unknown", "", "mystery"),
    });
    assert!(one.is_empty(), "{one:#?}");
    // The odd rank still moving between dumps, or too few dumps: not judged.
    let moving = tp_ranks_dumped(3, |rank, d| match (rank, d) {
        (2, 1) => ("running_batch", "sglang.running_batch", "run_batch"),
        (2, _) => AT_BROADCAST,
        _ => IN_ALL_REDUCE,
    });
    assert!(moving.is_empty(), "{moving:#?}");
    let short = tp_ranks_dumped(2, |rank, _| {
        if rank == 2 {
            AT_BROADCAST
        } else {
            IN_ALL_REDUCE
        }
    });
    assert!(short.is_empty(), "{short:#?}");
}
