//! Issue 32 items 2 and 3 on synthetic samples (`correl_common`): a request that waits for
//! its first byte is blamed past the hop it waits at when the cause is proven there.
//! - `pd_leg_failed`: the decode leg waits while its prefill leg (same router exchange)
//!   already ended with an error status the prefill counted, or closed without an answer.
//! - `tokens_undelivered`: the engine's scheduler generated tokens since the request arrived
//!   and no inference answer left its HTTP server.
//!
//! Each positive case is the scenario that was `wedged_request` ("accepted and forgotten",
//! GPU idle) before; each negative case keeps what it was.

use correl_common::*;
use wedgewatch::model::*;
use wedgewatch_testkit::correl as correl_common;

/// proxy -> router -> prefill + decode, one request; returns the connections.
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

/// What the engines' metrics say at each scrape (every second).
#[derive(Clone, Copy, Default)]
struct Counts {
    /// Prefill's `http_errors_total`; `None`: the series is absent (no error answered yet).
    prefill_errors: Option<f64>,
    /// Decode's `scheduler_tokens_total`.
    decode_tokens: f64,
    /// Decode's `generation_tokens_total` (what its HTTP server received).
    decode_received: f64,
    /// Decode's queued requests (its transfer queue holding the waiting leg).
    decode_queued: f64,
}

/// Idle engines (GPU idle, no forward time), scraped every second with `counts`.
fn tick(sim: &mut Sim, ticks: &mut u64, counts: Counts) {
    *ticks += 1;
    if *ticks % 4 == 1 {
        let mut prefill = vec![("running", 0.0), ("forward_seconds_total", 10.0)];
        if let Some(e) = counts.prefill_errors {
            prefill.push(("http_errors_total", e));
        }
        let decode = [
            ("running", 0.0),
            ("queued", counts.decode_queued),
            ("http_active", 1.0),
            ("forward_seconds_total", 20.0),
            ("scheduler_tokens_total", counts.decode_tokens),
            ("generation_tokens_total", counts.decode_received),
        ];
        sim.ingest(Payload::Metrics(vec![
            scrape(PREFILL, &prefill),
            scrape(DECODE, &decode),
        ]));
    }
    sim.ingest(Payload::Gpu(gpu(&[(0, 0, 60), (1, 0, 60)])));
}

fn findings(sim: &Sim) -> Vec<Finding> {
    wedgewatch::pipeline::parts(&sim.model, sim.now).findings
}

fn of_kind<'a>(fs: &'a [Finding], kind: &str) -> Vec<&'a Finding> {
    fs.iter().filter(|f| f.kind == kind).collect()
}

/// The PD request; prefill answers `answer` bytes at 0.5 s (0: closes without an answer);
/// its error count goes from `before` to `after` at 1 s; the findings 40 s after.
fn prefill_answers(answer: u64, before: Option<f64>, after: Option<f64>) -> Vec<Finding> {
    prefill_answers_decode_queued(answer, before, after, 0.0)
}

/// [`prefill_answers`], decode reporting `queued` requests and none running all along.
fn prefill_answers_decode_queued(
    answer: u64,
    before: Option<f64>,
    after: Option<f64>,
    queued: f64,
) -> Vec<Finding> {
    prefill_answers_with(answer, before, after, queued, |_| {})
}

/// [`prefill_answers_decode_queued`], `last` done to the simulation 1 s before the findings.
fn prefill_answers_with(
    answer: u64,
    before: Option<f64>,
    after: Option<f64>,
    queued: f64,
    last: impl FnOnce(&mut Sim),
) -> Vec<Finding> {
    let mut sim = Sim::new(pd_topology());
    let mut ticks = 0;
    let mut counts = Counts {
        prefill_errors: before,
        decode_queued: queued,
        ..Counts::default()
    };
    tick(&mut sim, &mut ticks, counts); // a scrape from before the request
    let [_, _, p, _] = pd_request(&mut sim);
    sim.run(500, |s| tick(s, &mut ticks, counts));
    if answer == 0 {
        sim.close(p);
    } else {
        sim.respond(p, answer);
    }
    sim.run(500, |s| tick(s, &mut ticks, counts));
    counts.prefill_errors = after;
    sim.run(38_000, |s| tick(s, &mut ticks, counts));
    last(&mut sim);
    sim.run(1_000, |s| tick(s, &mut ticks, counts));
    findings(&sim)
}

#[test]
fn a_decode_leg_waiting_on_a_prefill_that_answered_an_error_is_pd_leg_failed() {
    let fs = prefill_answers(320, None, Some(1.0));
    let f = of_kind(&fs, "pd_leg_failed");
    assert_eq!(f.len(), 1, "{fs:#?}");
    let f = f[0];
    assert_eq!(f.component.as_deref(), Some(PREFILL));
    assert_eq!(f.role, Some(Role::Prefill));
    assert_eq!(f.severity, Severity::Critical);
    assert_eq!(f.requests.len(), 1, "{:?}", f.requests);
    for want in [
        "1 PD request failed at prefill@127.0.0.1:31011 (answered an error)",
        "waits at decode@127.0.0.1:31012 for KV that will not come",
        "router@127.0.0.1:30000 holds the client",
    ] {
        assert!(f.summary.contains(want), "{want} missing: {}", f.summary);
    }
    let ev: Vec<String> = f.evidence.iter().map(|e| e.detail.clone()).collect();
    assert!(
        ev.iter()
            .any(|e| e.contains("prefill leg") && e.contains("320 bytes")),
        "{ev:#?}"
    );
    assert!(
        ev.iter().any(
            |e| e.contains("counted 1 inference answer(s) with an error status")
                && e.contains("since these requests arrived")
        ),
        "{ev:#?}"
    );
    // Not "accepted and forgotten" at decode: decode only waits.
    assert!(of_kind(&fs, "wedged_request").is_empty(), "{fs:#?}");
}

#[test]
fn the_requests_stuck_at_decode_are_the_findings_and_the_report_says_where_it_failed() {
    let mut sim = Sim::new(pd_topology());
    let mut ticks = 0;
    let mut counts = Counts::default();
    tick(&mut sim, &mut ticks, counts);
    let [_, _, p, _] = pd_request(&mut sim);
    sim.run(500, |s| tick(s, &mut ticks, counts));
    sim.respond(p, 320);
    counts.prefill_errors = Some(1.0);
    sim.run(40_000, |s| tick(s, &mut ticks, counts));
    let parts = wedgewatch::pipeline::parts(&sim.model, sim.now);
    let f = parts
        .findings
        .iter()
        .find(|f| f.kind == "pd_leg_failed")
        .expect("pd_leg_failed");
    let l = parts
        .logical_requests
        .iter()
        .find(|l| l.id == f.requests[0])
        .expect("its logical request");
    assert_eq!(l.verdict, Verdict::Stuck);
    assert_eq!(l.stuck_at.as_deref(), Some(DECODE), "it waits at decode");
    let snap = Snapshot {
        findings: parts.findings.clone(),
        logical_requests: parts.logical_requests.clone(),
        requests: parts.requests.clone(),
        taken_at: wedgewatch::clock::rfc3339(sim.now),
        ..serde_json::from_str(include_str!("../fixtures/snapshots/healthy.json")).expect("fixture")
    };
    #[cfg(feature = "tui")]
    tui_headline_names_it(&snap);
    let report = wedgewatch::report::render_text(&snap);
    let title = report.lines().next().unwrap_or_default();
    assert!(
        title.starts_with("pd_leg_failed at prefill: 1 PD request failed at prefill"),
        "{report}"
    );
    // The exporter: the finding at prefill, the stuck request at decode.
    let view = sim.model.view(sim.now);
    let mut r = wedgewatch::redact::Redactor::new();
    let e = wedgewatch::export::prometheus::Evaluation::new(
        &view,
        &parts.findings,
        sim.model.topology(),
        &mut r,
    );
    let text = wedgewatch::export::prometheus::render(Some(&e), &[], sim.now, "test");
    for want in [
        "wedgewatch_findings{kind=\"pd_leg_failed\",severity=\"critical\",component=\"prefill@127.0.0.1:31011\",role=\"prefill\"} 1",
        "wedgewatch_stuck_requests{component=\"decode@127.0.0.1:31012\",role=\"decode\"",
    ] {
        assert!(text.contains(want), "{want} missing:\n{text}");
    }
}

/// The TUI's headline (on every view) leads with the finding at prefill.
#[cfg(feature = "tui")]
fn tui_headline_names_it(snap: &Snapshot) {
    use ratatui::backend::TestBackend;
    use wedgewatch::tui::{App, AppOptions, FeedFrame, SamplerHealth};
    let mut app = App::new(AppOptions::default());
    app.ingest(FeedFrame {
        snapshot: snap.clone(),
        sampler: SamplerHealth {
            lag_ms: Some(100),
            dropped_samples: 0,
            note: None,
        },
    });
    let mut t = ratatui::Terminal::new(TestBackend::new(160, 30)).expect("test terminal");
    t.draw(|f| app.render(f)).expect("draw");
    let screen = t.backend().to_string();
    assert!(
        screen.contains("CRIT pd_leg_failed at prefill@127.0.0.1:31011"),
        "{screen}"
    );
}

#[test]
fn a_prefill_that_closed_without_an_answer_failed_its_leg() {
    let fs = prefill_answers(0, None, None);
    let f = of_kind(&fs, "pd_leg_failed");
    assert_eq!(f.len(), 1, "{fs:#?}");
    assert!(
        f[0].summary
            .contains("(closed the connection without an answer)"),
        "{}",
        f[0].summary
    );
    assert!(of_kind(&fs, "wedged_request").is_empty(), "{fs:#?}");
}

/// The real tier: prefill answers its 400 within milliseconds and the router closes the
/// connection, both between two socket samples; the leg is seen closed with no byte out. The
/// engine's error count says it answered an error.
#[test]
fn a_prefill_leg_seen_closed_while_prefill_counted_an_error_answered_an_error() {
    let fs = prefill_answers(0, None, Some(1.0));
    let f = of_kind(&fs, "pd_leg_failed");
    assert_eq!(f.len(), 1, "{fs:#?}");
    assert!(
        f[0].summary.contains("(answered an error)"),
        "{}",
        f[0].summary
    );
    let ev: Vec<&str> = f[0].evidence.iter().map(|e| e.detail.as_str()).collect();
    assert!(
        ev.iter()
            .any(|e| e.contains("prefill leg") && e.contains("closed with its answer unseen")),
        "{ev:#?}"
    );
    assert!(
        ev.iter()
            .any(|e| e.contains("counted 1 inference answer(s) with an error status")),
        "{ev:#?}"
    );
    assert!(of_kind(&fs, "wedged_request").is_empty(), "{fs:#?}");
}

#[test]
fn errors_counted_before_any_scrape_are_errors_since_start() {
    // The first scrape the model has comes after the leg ended: its count is all it knows.
    let mut sim = Sim::new(pd_topology());
    let [_, _, p, _] = pd_request(&mut sim);
    sim.run(500, |_| {});
    sim.respond(p, 320);
    let mut ticks = 0;
    let counts = Counts {
        prefill_errors: Some(2.0),
        ..Counts::default()
    };
    sim.run(40_000, |s| tick(s, &mut ticks, counts));
    let fs = findings(&sim);
    let f = of_kind(&fs, "pd_leg_failed");
    assert_eq!(f.len(), 1, "{fs:#?}");
    assert!(
        f[0].evidence.iter().any(|e| e
            .detail
            .contains("2 inference request(s) with an error status")
            && e.detail.contains("since it started")),
        "{:#?}",
        f[0].evidence
    );
}

#[test]
fn a_prefill_that_answered_without_an_error_is_not_a_failed_leg() {
    // Its count exists and stays flat: it answered 2xx. Decode waiting is decode's.
    for (before, after) in [(Some(3.0), Some(3.0)), (None, None)] {
        let fs = prefill_answers(320, before, after);
        assert!(of_kind(&fs, "pd_leg_failed").is_empty(), "{fs:#?}");
        let w = of_kind(&fs, "wedged_request");
        assert_eq!(w.len(), 1, "{fs:#?}");
        assert_eq!(w[0].component.as_deref(), Some(DECODE));
    }
}

#[test]
fn a_decode_queue_holding_only_a_failed_legs_request_is_not_also_queue_not_draining() {
    // The router's health check of decode under way then (the real tier's snapshot caught
    // one streaming): it waits in no queue.
    let health_check = |sim: &mut Sim| {
        let hd = sim.connect(Some(200), 31012, 400);
        sim.request(hd, 60);
        sim.sample_sockets();
        sim.advance(2);
        sim.respond(hd, 106);
    };
    let fs = prefill_answers_with(320, None, Some(1.0), 1.0, health_check);
    assert_eq!(of_kind(&fs, "pd_leg_failed").len(), 1, "{fs:#?}");
    assert!(of_kind(&fs, "queue_not_draining").is_empty(), "{fs:#?}");
    // The same queue when the request is forgotten at decode: decode is where it waits.
    let fs = prefill_answers_decode_queued(320, Some(3.0), Some(3.0), 1.0);
    assert_eq!(of_kind(&fs, "wedged_request").len(), 1, "{fs:#?}");
    let q = of_kind(&fs, "queue_not_draining");
    assert_eq!(q.len(), 1, "{fs:#?}");
    assert_eq!(q[0].component.as_deref(), Some(DECODE));
}

#[test]
fn a_streamed_or_large_prefill_answer_is_no_error_answer() {
    // Errors counted meanwhile, but this leg's answer is a 6 KB body: someone else's error.
    let fs = prefill_answers(6_000, Some(0.0), Some(1.0));
    assert!(of_kind(&fs, "pd_leg_failed").is_empty(), "{fs:#?}");
    assert_eq!(of_kind(&fs, "wedged_request").len(), 1, "{fs:#?}");
}

/// The PD request; prefill answers at 0.5 s without error; decode's scheduler generates
/// `generated` tokens at 1 s (and its HTTP server receives `received` of them); decode's
/// connection gets `decode_bytes` at 1.2 s. The findings 40 s after, with the first scrape
/// at `first_scrape_ms`.
fn decode_generates(
    generated: f64,
    received: f64,
    decode_bytes: u64,
    first_scrape_ms: i64,
) -> Vec<Finding> {
    let mut sim = Sim::new(pd_topology());
    let mut ticks = 0;
    let mut counts = Counts {
        prefill_errors: Some(0.0),
        ..Counts::default()
    };
    let start = sim.now;
    let scrape_from = |s: &Sim| s.now - start >= first_scrape_ms;
    if first_scrape_ms == 0 {
        tick(&mut sim, &mut ticks, counts); // a scrape from before the request
    }
    let [_, _, p, d] = pd_request(&mut sim);
    sim.run(500, |s| {
        if scrape_from(s) {
            tick(s, &mut ticks, counts)
        }
    });
    sim.respond(p, 320);
    sim.run(500, |s| {
        if scrape_from(s) {
            tick(s, &mut ticks, counts)
        }
    });
    counts.decode_tokens = generated;
    counts.decode_received = received;
    sim.run(250, |s| {
        if scrape_from(s) {
            tick(s, &mut ticks, counts)
        }
    });
    if decode_bytes > 0 {
        sim.respond(d, decode_bytes);
    }
    sim.run(39_000, |s| {
        if scrape_from(s) {
            tick(s, &mut ticks, counts)
        }
    });
    findings(&sim)
}

#[test]
fn tokens_generated_that_never_left_the_engine_are_tokens_undelivered() {
    let fs = decode_generates(8.0, 0.0, 0, 0);
    let f = of_kind(&fs, "tokens_undelivered");
    assert_eq!(f.len(), 1, "{fs:#?}");
    let f = f[0];
    assert_eq!(f.component.as_deref(), Some(DECODE));
    assert_eq!(f.role, Some(Role::Detokenizer));
    for want in [
        "1 request accepted",
        "at decode@127.0.0.1:31012 got no byte although its scheduler generated 8 tokens since",
        "lost past the scheduler, in its detokenizer",
        "tokenizer manager (the HTTP process, pid 400)",
    ] {
        assert!(f.summary.contains(want), "{want} missing: {}", f.summary);
    }
    assert!(
        f.evidence
            .iter()
            .any(|e| e.detail.contains("tokenizer manager received 0")),
        "{:#?}",
        f.evidence
    );
    // Not an idle-GPU wedge, and not a spinning collective.
    assert!(of_kind(&fs, "wedged_request").is_empty(), "{fs:#?}");
    assert!(of_kind(&fs, "busy_without_progress").is_empty(), "{fs:#?}");
}

#[test]
fn tokens_that_left_the_engine_or_were_never_generated_are_not_undelivered() {
    // The scheduler generated nothing: accepted and forgotten, as before.
    let fs = decode_generates(0.0, 0.0, 0, 0);
    assert!(of_kind(&fs, "tokens_undelivered").is_empty(), "{fs:#?}");
    assert_eq!(of_kind(&fs, "wedged_request").len(), 1, "{fs:#?}");
    // Generated and sent (the stream then stopped): not lost on the way out.
    let fs = decode_generates(8.0, 8.0, 600, 0);
    assert!(of_kind(&fs, "tokens_undelivered").is_empty(), "{fs:#?}");
    // Generated, but the first scrape came after: the rise cannot be dated to this request.
    let fs = decode_generates(8.0, 0.0, 0, 5_000);
    assert!(of_kind(&fs, "tokens_undelivered").is_empty(), "{fs:#?}");
}

#[test]
fn a_window_begun_after_the_request_still_counts_the_tokens_generated_in_it() {
    // A one-shot started after the request arrived: its first scrape (300 ms) comes before
    // the scheduler's count rose (1 s), and that rise is this request's tokens undelivered.
    let fs = decode_generates(8.0, 0.0, 0, 300);
    let f = of_kind(&fs, "tokens_undelivered");
    assert_eq!(f.len(), 1, "{fs:#?}");
    assert!(
        f[0].summary.contains("generated 8 tokens since"),
        "{}",
        f[0].summary
    );
    assert!(of_kind(&fs, "wedged_request").is_empty(), "{fs:#?}");
}

/// The two counts on real SGLang 0.5.23 expositions (`tests/fixtures/sglang-real/metrics`):
/// the scheduler's own decode tokens, and no error answer where only a GET /health (start-up
/// 503s) and an HTTP/2 preface (404) failed; with one inference 500 added, one error.
#[test]
fn the_counts_map_on_real_sglang_expositions() {
    use wedgewatch::probes::ProbeSet;
    let maps = ProbeSet::builtin().expect("built-in probes").metric_maps;
    let mapped = |file: &str, extra: &str, role: Role| {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/sglang-real/metrics")
            .join(file);
        let text = std::fs::read_to_string(&path).expect("fixture") + extra;
        let e = wedgewatch::prom::parse(&text);
        wedgewatch::sources::metrics::apply_maps(&maps, "sglang", role, &e.series)
    };
    let decode = mapped("metrics-decode-gen.txt", "", Role::Decode);
    assert_eq!(
        decode.get("scheduler_tokens_total"),
        Some(&335.0),
        "{decode:?}"
    );
    assert_eq!(decode.get("generation_tokens_total"), Some(&282.0));
    assert_eq!(decode.get("http_errors_total"), None, "{decode:?}");
    let prefill = mapped("metrics-prefill-gen.txt", "", Role::Prefill);
    assert_eq!(
        prefill.get("scheduler_tokens_total"),
        None,
        "no decode tokens at prefill"
    );
    let failed = mapped(
        "metrics-prefill-gen.txt",
        "sglang:http_responses_total{endpoint=\"/v1/chat/completions\",method=\"POST\",status_code=\"500\"} 1.0\n",
        Role::Prefill,
    );
    assert_eq!(failed.get("http_errors_total"), Some(&1.0), "{failed:?}");
}

/// The router's health checks of prefill and decode just before a client's request reaches
/// it (the lab's router checks every second): they are not that request's legs, or they
/// would take the places of its real prefill and decode legs (seen on the lab: the decode
/// leg then waited unlinked, and the failed prefill leg was nobody's).
#[test]
fn the_routers_health_checks_are_not_the_legs_of_a_request_that_came_just_after() {
    let mut sim = Sim::new(pd_topology());
    let mut ticks = 0;
    let mut counts = Counts::default();
    tick(&mut sim, &mut ticks, counts);
    let hp = sim.connect(Some(200), 31011, 300);
    let hd = sim.connect(Some(200), 31012, 400);
    sim.request(hp, 60);
    sim.request(hd, 60);
    sim.sample_sockets(); // seen asked: their sizes are known
    sim.advance(2);
    sim.respond(hp, 111);
    sim.respond(hd, 111);
    sim.advance(68);
    let [_, _, p, _] = pd_request(&mut sim);
    sim.run(500, |s| tick(s, &mut ticks, counts));
    sim.respond(p, 320);
    counts.prefill_errors = Some(1.0);
    sim.run(40_000, |s| tick(s, &mut ticks, counts));
    let fs = findings(&sim);
    assert_eq!(of_kind(&fs, "pd_leg_failed").len(), 1, "{fs:#?}");
    assert!(of_kind(&fs, "wedged_request").is_empty(), "{fs:#?}");
}

/// An agent's next turn follows its last reply at once: tokens the scheduler counted
/// between the scrape before the request and the request itself were the reply's, which
/// left. Seen on the lab's incident (decode forgets long prompts): its short replies' tokens
/// read as generated for the forgotten request.
#[test]
fn tokens_of_a_reply_that_left_just_before_the_request_are_not_undelivered() {
    let mut sim = Sim::new(pd_topology());
    let mut ticks = 0;
    let mut counts = Counts {
        prefill_errors: Some(0.0),
        ..Counts::default()
    };
    tick(&mut sim, &mut ticks, counts); // the scrape before: 0 tokens
    let reply = sim.connect(Some(200), 31012, 400);
    sim.request(reply, 600);
    sim.sample_sockets();
    sim.advance(200);
    sim.respond(reply, 700);
    counts.decode_tokens = 8.0; // the reply's tokens, counted by the next scrape
    counts.decode_received = 8.0;
    sim.sample_sockets();
    sim.advance(100);
    let [_, _, p, _] = pd_request(&mut sim);
    sim.run(500, |s| tick(s, &mut ticks, counts));
    sim.respond(p, 320);
    sim.run(40_000, |s| tick(s, &mut ticks, counts));
    let fs = findings(&sim);
    assert!(of_kind(&fs, "tokens_undelivered").is_empty(), "{fs:#?}");
    assert_eq!(of_kind(&fs, "wedged_request").len(), 1, "{fs:#?}");
}

/// The same reply, over before any socket sample saw it (shorter than their period): no
/// answer byte is seen leave, but the tokenizer manager received the tokens, so they left.
/// Seen on the lab's incident under a daemon (its short replies between two samples).
#[test]
fn tokens_the_http_server_received_are_not_undelivered_when_no_sample_saw_them_leave() {
    let mut sim = Sim::new(pd_topology());
    let mut ticks = 0;
    let mut counts = Counts {
        prefill_errors: Some(0.0),
        ..Counts::default()
    };
    tick(&mut sim, &mut ticks, counts); // the scrape before: 0 tokens
    sim.advance(300); // the reply came and went between two samples
    counts.decode_tokens = 8.0;
    counts.decode_received = 8.0;
    let [_, _, p, _] = pd_request(&mut sim);
    sim.run(500, |s| tick(s, &mut ticks, counts));
    sim.respond(p, 320);
    sim.run(40_000, |s| tick(s, &mut ticks, counts));
    let fs = findings(&sim);
    assert!(of_kind(&fs, "tokens_undelivered").is_empty(), "{fs:#?}");
    assert_eq!(of_kind(&fs, "wedged_request").len(), 1, "{fs:#?}");
}

/// The prefill leg refused in milliseconds and closed between two socket samples: no sample
/// saw it. The router's one configured prefill counted an error since the decode leg
/// arrived: still `pd_leg_failed`, its evidence saying the leg was not seen.
#[test]
fn a_prefill_leg_no_sample_saw_is_failed_by_the_prefills_error_count() {
    let unseen = |errors_after: f64, prefills: &[&str]| {
        let mut topo = pd_topology();
        for to in prefills.iter().chain([&DECODE]) {
            topo.edges.push(Edge {
                from: ROUTER.into(),
                to: to.to_string(),
                origin: EdgeOrigin::Config,
                connections: None,
            });
        }
        let mut sim = Sim::new(topo);
        let mut ticks = 0;
        let mut counts = Counts {
            prefill_errors: Some(0.0),
            ..Counts::default()
        };
        tick(&mut sim, &mut ticks, counts); // a scrape from before the request
        let a = sim.connect(None, 8000, 100);
        let b = sim.connect(Some(100), 30000, 200);
        let d = sim.connect(Some(200), 31012, 400);
        sim.request(a, 800);
        sim.advance(20);
        sim.request(b, 830);
        sim.advance(25);
        sim.request(d, 950);
        counts.prefill_errors = Some(errors_after);
        sim.run(40_000, |s| tick(s, &mut ticks, counts));
        findings(&sim)
    };
    let fs = unseen(1.0, &[PREFILL]);
    let f = of_kind(&fs, "pd_leg_failed");
    assert_eq!(f.len(), 1, "{fs:#?}");
    assert_eq!(f[0].component.as_deref(), Some(PREFILL));
    assert!(
        f[0].evidence
            .iter()
            .any(|e| e.detail.contains("not seen on a socket")),
        "{:#?}",
        f[0].evidence
    );
    assert!(of_kind(&fs, "wedged_request").is_empty(), "{fs:#?}");
    // No error counted: the request is forgotten at decode, as before.
    let fs = unseen(0.0, &[PREFILL]);
    assert!(of_kind(&fs, "pd_leg_failed").is_empty(), "{fs:#?}");
    assert_eq!(of_kind(&fs, "wedged_request").len(), 1, "{fs:#?}");
    // Not configured with that prefill (no edge): which leg failed is unknown.
    let fs = unseen(1.0, &[]);
    assert!(of_kind(&fs, "pd_leg_failed").is_empty(), "{fs:#?}");
}
