//! `kv_transfer_stalled`: PD requests wait at decode for their KV cache while the transfer
//! from prefill is silent (sglang issue 23342: Mooncake over TCP hangs; PR 31800: receivers
//! stuck in `Transferring` never time out). Positive: the sender stopped mid-slice (both legs
//! wait, prefill holds them in flight), and prefill done but decode's transfer queue frozen.
//! Negative: a decode that forgot the request (prefill waits for it in its bootstrap queue), a
//! transfer still moving, a decode holding nothing.

use correl_common::*;
use wedgewatch::clock::Millis;
use wedgewatch::model::*;
use wedgewatch_testkit::correl as correl_common;

pub(super) const PREFILL_SCHED: i32 = 301;
pub(super) const DECODE_SCHED: i32 = 401;
const KV_PORT: u16 = 41555;

/// The PD stack with its schedulers as children, decode's scheduler listening on its KV
/// transfer port (a child's port: a channel), the engines' KV sides from their flags.
pub(super) fn topology() -> Topology {
    let mut t = pd_topology();
    for c in &mut t.components {
        if c.id == PREFILL {
            c.labels.insert("kv_side".into(), "sender".into());
        }
        if c.id == DECODE {
            c.labels.insert("kv_side".into(), "receiver".into());
        }
    }
    let mut p = comp(
        "scheduler@prefill@127.0.0.1:31011",
        Role::Scheduler,
        0,
        &[PREFILL_SCHED],
        &[0],
    );
    p.parent = Some(PREFILL.into());
    p.listen.clear();
    p.http_url = None;
    let mut d = comp(
        "scheduler@decode@127.0.0.1:31012",
        Role::Scheduler,
        KV_PORT,
        &[DECODE_SCHED],
        &[1],
    );
    d.parent = Some(DECODE.into());
    d.http_url = None;
    d.channels.push(Channel {
        addr: format!("127.0.0.1:{KV_PORT}"),
        kind: ChannelKind::Internal,
    });
    t.components.extend([p, d]);
    t
}

/// client -> proxy -> router -> prefill + decode, as the router dispatches a PD request.
pub(super) fn pd_request(sim: &mut Sim) -> [usize; 4] {
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

/// The KV stream from prefill's scheduler to decode's: two earlier requests' pages, 82
/// slices each answered with 8 bytes (the real pair's shape).
pub(super) fn kv_stream(sim: &mut Sim) -> usize {
    let c = sim.connect(Some(PREFILL_SCHED), KV_PORT, DECODE_SCHED);
    for _ in 0..2 {
        for _ in 0..82 {
            sim.request(c, 24 + 132);
            sim.respond(c, 8);
        }
        sim.advance(250);
        sim.sample_sockets();
    }
    c
}

/// Both engines' scrapes: gauges 0, a fresh `/v1/loads` with these PD queues.
pub(super) fn loads(comp: &str, now: Millis, disaggregation: serde_json::Value) -> MetricsScrape {
    let mut sc = scrape(comp, &[("running", 0.0), ("queued", 0.0)]);
    let ts = now as f64 / 1000.0 - 0.05;
    sc.extra.insert(
        "v1_loads".into(),
        serde_json::json!({"loads": [{"dp_rank": 0, "num_running_reqs": 0, "num_waiting_reqs": 0,
            "timestamp": ts, "disaggregation": disaggregation}]}),
    );
    sc
}

/// What each engine says every second, both GPUs idle, decode's scheduler polling its
/// transfer queue.
struct Env {
    prefill: serde_json::Value,
    decode: serde_json::Value,
    ticks: u64,
    /// Prefill's `http_errors_total` (absent: no error answered yet).
    prefill_errors: Option<f64>,
}

impl Env {
    fn tick(&mut self, sim: &mut Sim) {
        self.ticks += 1;
        let now = sim.now;
        if self.ticks % 4 == 1 {
            let mut prefill = loads(PREFILL, now, self.prefill.clone());
            if let Some(e) = self.prefill_errors {
                prefill.mapped.insert("http_errors_total".into(), e);
            }
            sim.ingest(Payload::Metrics(vec![
                prefill,
                loads(DECODE, now, self.decode.clone()),
            ]));
        }
        sim.ingest(Payload::Gpu(gpu(&[(0, 0, 60), (1, 0, 60)])));
        if self.ticks % 20 == 1 {
            sim.ingest(Payload::Stacks(vec![
                stack(DECODE_SCHED, now, "pd_queue_polling", "pop_transferred"),
                stack(
                    PREFILL_SCHED,
                    now,
                    "pd_queue_polling",
                    "process_disagg_prefill_inflight_queue",
                ),
            ]));
        }
    }
}

fn parts(sim: &Sim) -> SnapshotParts {
    wedgewatch::pipeline::parts(&sim.model, sim.now)
}

fn of_kind<'a>(fs: &'a [Finding], kind: &str) -> Vec<&'a Finding> {
    fs.iter().filter(|f| f.kind == kind).collect()
}

/// Prefill's transfer worker stopped mid-slice 40 s ago: both legs wait, prefill holds the
/// request in flight, decode in its transfer queue, the stream silent since.
fn sender_stopped_mid_slice() -> Sim {
    let mut sim = Sim::new(topology());
    let kv = kv_stream(&mut sim);
    pd_request(&mut sim);
    sim.request(kv, 24 + 66); // the header and half a slice, then nothing
    let mut env = Env {
        prefill: serde_json::json!({"prefill_inflight_queue_reqs": 1, "prefill_bootstrap_queue_reqs": 0}),
        decode: serde_json::json!({"decode_transfer_queue_reqs": 1}),
        ticks: 0,
        prefill_errors: None,
    };
    sim.run(40_000, |s| env.tick(s));
    sim
}

#[test]
fn a_sender_stopped_mid_slice_is_a_kv_transfer_stall_not_a_forgotten_request() {
    let sim = sender_stopped_mid_slice();
    let p = parts(&sim);
    let k = of_kind(&p.findings, "kv_transfer_stalled");
    assert_eq!(k.len(), 1, "{:?}", kinds(&p.findings));
    let f = k[0];
    assert_eq!(f.severity, Severity::Critical);
    assert_eq!(
        (f.component.as_deref(), f.role),
        (Some(DECODE), Some(Role::Decode))
    );
    assert!(
        f.summary.contains(PREFILL) && f.summary.contains(DECODE),
        "{}",
        f.summary
    );
    assert!(f.summary.contains("holds 1 in flight"), "{}", f.summary);
    assert_eq!(f.requests.len(), 1);
    // Evidence from each layer: both legs, the silent stream, both queues, GPUs, stacks.
    let has = |source: &str, text: &str| {
        f.evidence
            .iter()
            .any(|e| e.source == source && e.detail.contains(text))
    };
    assert!(
        has(
            "sockets",
            "at decode@127.0.0.1:31012: 950 bytes in, 0 out, waits for its first byte"
        ),
        "{:#?}",
        f.evidence
    );
    assert!(
        has(
            "sockets",
            "at prefill@127.0.0.1:31011: 950 bytes in, 0 out, waits too"
        ),
        "{:#?}",
        f.evidence
    );
    assert!(has(
        "sockets",
        "kv_transfer prefill@127.0.0.1:31011 -> decode@127.0.0.1:31012"
    ));
    assert!(has("metrics", "in its prealloc/transfer queues"));
    assert!(has("metrics", "in its inflight queue"));
    assert!(has("gpu", "GPU activity idle"));
    assert!(has("stacks", "pd_queue_polling"));
    // Not a wedge anywhere: the request's verdict is the stall, at decode.
    assert!(
        of_kind(&p.findings, "wedged_request").is_empty(),
        "{:?}",
        kinds(&p.findings)
    );
    let l = p
        .logical_requests
        .iter()
        .find(|l| l.id == f.requests[0])
        .expect("named");
    assert_eq!(l.stuck_kind, Some(StuckKind::KvTransfer));
    assert_eq!(l.stuck_role, Some(Role::Decode));
}

/// The report's head and stuck table, the TUI's overview and the exporter's series name it.
#[test]
fn its_place_in_the_report_the_tui_and_the_exporter() {
    use wedgewatch::export::prometheus::{render, Evaluation};

    let sim = sender_stopped_mid_slice();
    let snap = wedgewatch::snapshot::assemble(parts(&sim), &Default::default());
    let md = wedgewatch::report::render(&snap);
    assert!(
        md.contains("kv_transfer_stalled at decode: 1 request waiting for their KV cache, the transfer silent"),
        "{md}"
    );
    assert!(md.contains("| KV transfer stalled |"), "{md}");
    assert!(md.contains("kv_transfer"), "{md}");

    let screen = wedgewatch_testkit::screen::overview(&snap, 200, 50);
    assert!(screen.contains("CRIT kv_transfer_stalled"), "{screen}");
    assert!(
        screen.contains("prefill@127.0.0.1:31011 -> decode@127.0.0.1:31012 kv_transfer"),
        "{screen}"
    );

    let view = sim.model.view(sim.now);
    let findings = wedgewatch::detect::run_all(&sim.model, &view);
    let mut redactor = wedgewatch::redact::Redactor::new();
    let e = Evaluation::new(&view, &findings, sim.model.topology(), &mut redactor);
    let text = render(Some(&e), &[], sim.now, "t");
    assert!(
        text.lines().any(|l| l.starts_with("wedgewatch_findings{")
            && l.contains("kind=\"kv_transfer_stalled\"")
            && l.contains("severity=\"critical\"")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("wedgewatch_stuck_requests{")
                && l.contains("kind=\"kv_transfer\"")
                && l.contains(DECODE)),
        "{text}"
    );
}

/// Prefill answered (its transfer went out), decode's transfer queue never lets the request
/// go and nothing moves between them since: a receiver stuck in `Transferring` (PR 31800).
#[test]
fn a_receiver_stuck_after_prefill_answered_is_a_kv_transfer_stall() {
    let mut sim = Sim::new(topology());
    kv_stream(&mut sim);
    let [_, _, p, _] = pd_request(&mut sim);
    sim.advance(300);
    sim.respond(p, 990); // prefill's one-token answer
    let mut env = Env {
        prefill: serde_json::json!({}),
        decode: serde_json::json!({"decode_transfer_queue_reqs": 1}),
        ticks: 0,
        prefill_errors: None,
    };
    sim.run(40_000, |s| env.tick(s));
    let p = parts(&sim);
    let k = of_kind(&p.findings, "kv_transfer_stalled");
    assert_eq!(k.len(), 1, "{:?}", kinds(&p.findings));
    assert!(k[0].summary.contains("answered them"), "{}", k[0].summary);
    assert!(
        of_kind(&p.findings, "wedged_request").is_empty(),
        "{:?}",
        kinds(&p.findings)
    );
}

/// Prefill refused the request (an error answer in one burst, its error count up by one)
/// while decode, which accepted it, holds it in its transfer queue and the pair's stream is
/// silent: the KV will never be sent, nothing stalled in the transfer. That is
/// `pd_leg_failed` at prefill (the real tier: a prompt longer than prefill's
/// `--context-length`, refused with a 400, while decode waits in its transfer queue), not a
/// KV transfer stall at decode.
#[test]
fn a_prefill_that_answered_an_error_is_a_failed_leg_not_a_kv_transfer_stall() {
    let mut sim = Sim::new(topology());
    kv_stream(&mut sim);
    let mut env = Env {
        prefill: serde_json::json!({}),
        decode: serde_json::json!({"decode_transfer_queue_reqs": 1}),
        ticks: 0,
        prefill_errors: None,
    };
    env.tick(&mut sim); // a scrape from before the request
    let [_, _, p, _] = pd_request(&mut sim);
    sim.advance(300);
    sim.respond(p, 330); // the 400 and its JSON error
    env.prefill_errors = Some(1.0);
    sim.run(40_000, |s| env.tick(s));
    let p = parts(&sim);
    assert!(
        of_kind(&p.findings, "kv_transfer_stalled").is_empty(),
        "{:?}",
        kinds(&p.findings)
    );
    let f = of_kind(&p.findings, "pd_leg_failed");
    assert_eq!(f.len(), 1, "{:?}", kinds(&p.findings));
    assert_eq!(f[0].component.as_deref(), Some(PREFILL));
    assert!(
        f[0].summary.contains(&format!("waits at {DECODE}")),
        "{}",
        f[0].summary
    );
    assert!(
        of_kind(&p.findings, "wedged_request").is_empty(),
        "{:?}",
        kinds(&p.findings)
    );
    let l = p
        .logical_requests
        .iter()
        .find(|l| l.id == f[0].requests[0])
        .expect("named");
    assert_ne!(l.stuck_kind, Some(StuckKind::KvTransfer));
    assert_eq!(l.stuck_role, Some(Role::Decode));
}

/// A decode that forgot the request never sends prefill where to write its KV: prefill holds
/// it in its bootstrap queue, decode holds nothing. That is a forgotten request at decode.
#[test]
fn a_forgotten_request_is_no_kv_transfer_stall() {
    let mut sim = Sim::new(topology());
    kv_stream(&mut sim);
    pd_request(&mut sim);
    let mut env = Env {
        prefill: serde_json::json!({"prefill_bootstrap_queue_reqs": 1}),
        decode: serde_json::json!({}),
        ticks: 0,
        prefill_errors: None,
    };
    sim.run(40_000, |s| env.tick(s));
    let p = parts(&sim);
    assert!(
        of_kind(&p.findings, "kv_transfer_stalled").is_empty(),
        "{:?}",
        kinds(&p.findings)
    );
    let w = of_kind(&p.findings, "wedged_request");
    assert_eq!(w.len(), 1, "{:?}", kinds(&p.findings));
    assert_eq!(w[0].component.as_deref(), Some(DECODE));
}

/// The same queues while pages still move between the pair (a slow transfer, not a stalled
/// one): no stall.
#[test]
fn a_transfer_still_moving_is_no_stall() {
    let mut sim = Sim::new(topology());
    let kv = kv_stream(&mut sim);
    pd_request(&mut sim);
    let mut env = Env {
        prefill: serde_json::json!({"prefill_inflight_queue_reqs": 1, "prefill_bootstrap_queue_reqs": 0}),
        decode: serde_json::json!({"decode_transfer_queue_reqs": 1}),
        ticks: 0,
        prefill_errors: None,
    };
    sim.run(40_000, |s| {
        env.tick(s);
        s.request(kv, 24 + 132);
        s.respond(kv, 8);
    });
    let p = parts(&sim);
    assert!(
        of_kind(&p.findings, "kv_transfer_stalled").is_empty(),
        "{:?}",
        kinds(&p.findings)
    );
}

/// Decode holds nothing waiting for KV (its queues empty) while prefill answered: whatever
/// keeps the decode leg waiting, it is not the transfer.
#[test]
fn a_decode_holding_nothing_is_no_stall() {
    let mut sim = Sim::new(topology());
    kv_stream(&mut sim);
    let [_, _, p, _] = pd_request(&mut sim);
    sim.advance(300);
    sim.respond(p, 990);
    let mut env = Env {
        prefill: serde_json::json!({}),
        decode: serde_json::json!({}),
        ticks: 0,
        prefill_errors: None,
    };
    sim.run(40_000, |s| env.tick(s));
    let p = parts(&sim);
    assert!(
        of_kind(&p.findings, "kv_transfer_stalled").is_empty(),
        "{:?}",
        kinds(&p.findings)
    );
    assert_eq!(
        of_kind(&p.findings, "wedged_request").len(),
        1,
        "{:?}",
        kinds(&p.findings)
    );
}

/// Prefill answered an error (its error count rose) and decode's transfer queue holds the
/// request: no KV will ever be sent, so it is the failed leg (`pd_leg_failed`), not a stall.
#[test]
fn a_prefill_that_answered_an_error_is_a_failed_leg_not_a_stall() {
    let mut sim = Sim::new(topology());
    kv_stream(&mut sim);
    let errors = std::cell::Cell::new(0.0);
    let tick = |s: &mut Sim, ticks: &mut u64| {
        *ticks += 1;
        if *ticks % 4 == 1 {
            let mut pf = loads(PREFILL, s.now, serde_json::json!({}));
            pf.mapped.insert("http_errors_total".into(), errors.get());
            s.ingest(Payload::Metrics(vec![
                pf,
                loads(
                    DECODE,
                    s.now,
                    serde_json::json!({"decode_transfer_queue_reqs": 1}),
                ),
            ]));
        }
        s.ingest(Payload::Gpu(gpu(&[(0, 0, 60), (1, 0, 60)])));
    };
    let mut ticks = 0;
    tick(&mut sim, &mut ticks); // a scrape from before the request
    let [_, _, p, _] = pd_request(&mut sim);
    sim.advance(300);
    sim.respond(p, 327); // the 500's headers and JSON body
    errors.set(1.0);
    sim.run(40_000, |s| tick(s, &mut ticks));
    let parts = parts(&sim);
    assert!(
        of_kind(&parts.findings, "kv_transfer_stalled").is_empty(),
        "{:?}",
        kinds(&parts.findings)
    );
    assert_eq!(
        of_kind(&parts.findings, "pd_leg_failed").len(),
        1,
        "{:?}",
        kinds(&parts.findings)
    );
}
