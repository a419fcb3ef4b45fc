//! The exporter's exposition (`export::prometheus`), parsed back with the repo's own
//! Prometheus parser (`wedgewatch::prom`): a wedge at decode behind proxy and router is a
//! stuck-request series at decode with its age, findings by kind/severity/component/role,
//! source health and lag; hostile component names are escaped and scrubbed of secrets.

use correl_common::*;
use std::collections::BTreeMap;
use wedgewatch::export::prometheus::{render, Evaluation, SourceHealth};
use wedgewatch::model::*;
use wedgewatch::prom::{self, MetricType};
use wedgewatch::redact::Redactor;
use wedgewatch_testkit::correl as correl_common;

const PLANTED: &str = "plantedexportsecret-93f1";

/// proxy -> router -> prefill (answers) + decode (never answers), 40 s on.
fn wedged(topology: Topology) -> Sim {
    let mut sim = Sim::new(topology);
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
    sim.run(250, |_| {});
    sim.respond(p, 100);
    sim.run(40_000, |_| {});
    sim
}

fn evaluate(sim: &Sim, redactor: &mut Redactor) -> (Evaluation, Vec<Finding>) {
    let view = sim.model.view(sim.now);
    let findings = wedgewatch::detect::run_all(&sim.model, &view);
    let e = Evaluation::new(&view, &findings, sim.model.topology(), redactor);
    (e, findings)
}

fn sources(now: i64) -> Vec<SourceHealth> {
    let h = |source, status, last: Option<i64>| SourceHealth {
        source,
        status,
        last_sample_ms: last,
        every_ms: 250,
        took_ms: 12,
        samples: 160,
        late: 3,
        dropped: 1,
        timeouts: 1,
    };
    vec![
        h(SourceKind::Sockets, Some(Status::Ok), Some(now - 250)),
        h(
            SourceKind::Stacks,
            Some(Status::Degraded),
            Some(now - 4_500),
        ),
        h(SourceKind::Gpu, None, None),
    ]
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn value(e: &prom::Exposition, name: &str, want: &[(&str, &str)]) -> Option<f64> {
    let want = labels(want);
    e.series
        .iter()
        .find(|s| s.name == name && s.labels == want)
        .map(|s| s.value)
}

#[test]
fn a_wedge_at_decode_is_a_stuck_request_series_with_its_age() {
    let sim = wedged(pd_topology());
    let (e, findings) = evaluate(&sim, &mut Redactor::new());
    let text = render(Some(&e), &sources(sim.now), sim.now + 1_500, "9.9.9");
    let x = prom::parse(&text);
    assert_eq!(x.bad_lines, 0, "{text}");
    assert_eq!(x.cut.seen as usize, x.series.len(), "nothing cut: {text}");

    assert_eq!(
        value(&x, "wedgewatch_build_info", &[("version", "9.9.9")]),
        Some(1.0)
    );
    let stuck = [
        ("component", DECODE),
        ("role", "decode"),
        ("entry", PROXY),
        ("kind", "no_response"),
    ];
    assert_eq!(
        value(&x, "wedgewatch_stuck_requests", &stuck),
        Some(1.0),
        "{text}"
    );
    let age = value(&x, "wedgewatch_stuck_request_oldest_age_seconds", &stuck).expect("age");
    assert!((38.0..=42.0).contains(&age), "decode waited ~40 s: {age}");
    // Only the deepest hop is named: no stuck series at the proxy or router.
    let stuck_at: Vec<_> = x
        .series
        .iter()
        .filter(|s| s.name == "wedgewatch_stuck_requests")
        .map(|s| s.labels["component"].clone())
        .collect();
    assert_eq!(stuck_at, vec![DECODE.to_string()], "{text}");

    let w = findings
        .iter()
        .find(|f| f.kind == "wedged_request")
        .expect("wedged_request");
    let f = [
        ("kind", "wedged_request"),
        ("severity", w.severity.as_str()),
        ("component", DECODE),
        ("role", "decode"),
    ];
    assert_eq!(value(&x, "wedgewatch_findings", &f), Some(1.0), "{text}");
    let open: f64 = x
        .series
        .iter()
        .filter(|s| s.name == "wedgewatch_findings")
        .map(|s| s.value)
        .sum();
    assert_eq!(
        open as usize,
        findings.len(),
        "every open finding counted once"
    );
    assert_eq!(
        value(&x, "wedgewatch_requests", &[("verdict", "stuck")]),
        Some(1.0)
    );
    assert_eq!(
        value(&x, "wedgewatch_components", &[("role", "decode")]),
        Some(1.0)
    );
    assert_eq!(
        value(&x, "wedgewatch_evaluation_age_seconds", &[]),
        Some(1.5)
    );
}

#[test]
fn source_health_and_lag_are_series_of_each_source() {
    let now = T0 + 60_000;
    let text = render(None, &sources(now), now, "1.0.0");
    let x = prom::parse(&text);
    assert_eq!(x.bad_lines, 0, "{text}");
    let st = |s, st| {
        value(
            &x,
            "wedgewatch_source_status",
            &[("source", s), ("status", st)],
        )
    };
    assert_eq!(st("sockets", "ok"), Some(1.0));
    assert_eq!(st("sockets", "degraded"), Some(0.0));
    assert_eq!(st("stacks", "degraded"), Some(1.0));
    assert_eq!(st("stacks", "unavailable"), Some(0.0));
    assert_eq!(st("gpu", "ok"), None, "not sampled yet: no status");
    let lag = |s| {
        value(
            &x,
            "wedgewatch_source_last_sample_age_seconds",
            &[("source", s)],
        )
    };
    assert_eq!(lag("sockets"), Some(0.25));
    assert_eq!(lag("stacks"), Some(4.5));
    assert_eq!(lag("gpu"), None);
    let one = |n| value(&x, n, &[("source", "stacks")]);
    assert_eq!(one("wedgewatch_source_late_total"), Some(3.0));
    assert_eq!(one("wedgewatch_source_timeouts_total"), Some(1.0));
    assert_eq!(one("wedgewatch_source_samples_total"), Some(160.0));
    assert_eq!(
        one("wedgewatch_source_sample_duration_seconds"),
        Some(0.012)
    );
    assert_eq!(
        x.types.get("wedgewatch_source_late_total"),
        Some(&MetricType::Counter)
    );
    assert_eq!(
        x.types.get("wedgewatch_source_status"),
        Some(&MetricType::Gauge)
    );
    // Which sources are down, one gauge each: degraded still sees.
    let up = |s| value(&x, "wedgewatch_source_up", &[("source", s)]);
    assert_eq!(
        (up("sockets"), up("stacks"), up("gpu")),
        (Some(1.0), Some(1.0), None)
    );
    let mut down = sources(now);
    down[1].status = Some(Status::Unavailable);
    let x2 = prom::parse(&render(None, &down, now, "1.0.0"));
    assert_eq!(
        value(&x2, "wedgewatch_source_up", &[("source", "stacks")]),
        Some(0.0)
    );
    assert_eq!(
        x2.types.get("wedgewatch_source_up"),
        Some(&MetricType::Gauge)
    );
    // Before the first evaluation there is no finding or stuck series (no false zeros).
    assert!(!text.contains("wedgewatch_stuck_requests{"), "{text}");
    assert!(
        !text.contains("wedgewatch_evaluation_age_seconds "),
        "{text}"
    );
    // Every family is declared once, with help.
    for s in &x.series {
        let family = s.name.as_str();
        assert!(x.types.contains_key(family), "no TYPE for {family}");
        assert!(x.help.contains_key(family), "no HELP for {family}");
    }
}

/// A component whose id carries quotes, a backslash, a newline, a control character and a
/// secret from a process's environment: its label parses back escaped-and-equal, and the
/// secret is not in the exposition.
#[test]
fn hostile_component_names_are_escaped_and_scrubbed_of_secrets() {
    let hostile = format!("decode \"x\" \\y\nz\u{7} {PLANTED}@127.0.0.1:31012");
    let mut topo = pd_topology();
    topo.components[3] = comp(&hostile, Role::Decode, 31012, &[400, 401], &[1]);
    let sim = wedged(topo);
    let mut r = Redactor::new();
    let facts = ProcessFacts {
        pid: 400,
        env: Some(BTreeMap::from([(
            "HF_TOKEN".to_string(),
            PLANTED.to_string(),
        )])),
        ..ProcessFacts::default()
    };
    r.learn(&facts);
    let (e, _) = evaluate(&sim, &mut r);
    let text = render(Some(&e), &[], sim.now, "1.0.0");
    assert!(!text.contains(PLANTED), "{text}");
    let x = prom::parse(&text);
    assert_eq!(x.bad_lines, 0, "{text}");
    let s = x
        .series
        .iter()
        .find(|s| s.name == "wedgewatch_stuck_requests")
        .expect("a stuck series");
    let c = &s.labels["component"];
    assert_eq!(
        c, "decode \"x\" \\y\\x0az\\x07 <redacted>@127.0.0.1:31012",
        "newline and BEL neutralised before escaping, secret redacted: {text}"
    );
    // One sample a line: the newline did not break the line.
    let lines = text.lines().filter(|l| l.contains("decode \\\"x")).count();
    assert!(lines >= 2, "stuck and age lines: {text}");
}

#[test]
fn label_values_are_bounded() {
    let long = format!("decode{}@127.0.0.1:31012", "é".repeat(400));
    let mut topo = pd_topology();
    topo.components[3] = comp(&long, Role::Decode, 31012, &[400, 401], &[1]);
    let sim = wedged(topo);
    let (e, _) = evaluate(&sim, &mut Redactor::new());
    let x = prom::parse(&render(Some(&e), &[], sim.now, "1.0.0"));
    let s = x
        .series
        .iter()
        .find(|s| s.name == "wedgewatch_stuck_requests")
        .expect("a stuck series");
    let c = &s.labels["component"];
    assert!(
        c.len() <= wedgewatch::export::prometheus::MAX_LABEL,
        "{}",
        c.len()
    );
    assert!(c.starts_with("decodeé"), "cut on a character boundary: {c}");
}

/// Issue 34 item 10: a host that keeps starting look-alikes (each restart a new component id)
/// must not grow the exposition without bound. Three times the cap of findings on distinct
/// components and twice the cap of engines each holding a stuck request: each family keeps at
/// most `MAX_SERIES` series, the critical finding and the most stuck hop keep their own, the
/// rest are summed into one overflow series, counted in `wedgewatch_series_overflow`, and the
/// sums over each family stay exact.
#[test]
fn series_are_capped_per_family_and_the_overflow_is_counted() {
    use wedgewatch::export::prometheus::{MAX_SERIES, OVERFLOW};
    let engines = 2 * MAX_SERIES;
    let topo = Topology {
        components: (0..engines)
            .map(|i| {
                let port = 40_000 + i as u16;
                let id = format!("lookalike{i:03}@127.0.0.1:{port}");
                comp(&id, Role::Engine, port, &[1000 + i as i32], &[])
            })
            .collect(),
        edges: Vec::new(),
    };
    let mut sim = Sim::new(topo);
    let conns: Vec<usize> = (0..engines)
        .map(|i| sim.connect(None, 40_000 + i as u16, 1000 + i as i32))
        .collect();
    for (i, c) in conns.iter().enumerate() {
        sim.request(*c, 800);
        // The last engine holds two stuck requests: the most stuck hop keeps its series.
        if i == engines - 1 {
            let extra = sim.connect(None, 40_000 + i as u16, 1000 + i as i32);
            sim.request(extra, 800);
        }
    }
    sim.run(40_000, |_| {});
    let view = sim.model.view(sim.now);
    let restarted = |i: usize, severity| Finding {
        kind: FindingKind::ProcessRestarted,
        severity,
        component: Some(format!("lookalike-restart{i:03}@127.0.0.1:1")),
        role: Some(Role::Engine),
        summary: "restarted".into(),
        requests: Vec::new(),
        evidence: Vec::new(),
        explanation: None,
    };
    let n_findings = 3 * MAX_SERIES;
    // The critical one sorts last by component: kept for its severity, not its name.
    let findings: Vec<Finding> = (0..n_findings)
        .map(|i| {
            let sev = if i == n_findings - 1 {
                Severity::Critical
            } else {
                Severity::Warning
            };
            restarted(i, sev)
        })
        .collect();
    let e = Evaluation::new(&view, &findings, sim.model.topology(), &mut Redactor::new());
    let text = render(Some(&e), &[], sim.now, "1.0.0");
    let x = prom::parse(&text);
    assert_eq!(x.bad_lines, 0, "{text}");
    let of = |name: &str| -> Vec<&Series> { x.series.iter().filter(|s| s.name == name).collect() };

    let f = of("wedgewatch_findings");
    assert!(f.len() <= MAX_SERIES, "{} findings series", f.len());
    let total: f64 = f.iter().map(|s| s.value).sum();
    assert_eq!(total, n_findings as f64, "the sum stays exact");
    let crit = format!("lookalike-restart{:03}@127.0.0.1:1", n_findings - 1);
    assert!(
        f.iter()
            .any(|s| s.labels["component"] == crit && s.labels["severity"] == "critical"),
        "the critical finding keeps its series"
    );
    let over: Vec<_> = f
        .iter()
        .filter(|s| s.labels["component"] == OVERFLOW)
        .collect();
    assert_eq!(over.len(), 1, "one overflow series: {over:?}");
    assert_eq!(over[0].labels["kind"], OVERFLOW);
    assert_eq!(over[0].labels["severity"], "warning");
    let left = (n_findings - (MAX_SERIES - 1)) as f64;
    assert_eq!(over[0].value, left);
    let counted = value(
        &x,
        "wedgewatch_series_overflow",
        &[("family", "wedgewatch_findings")],
    );
    assert_eq!(counted, Some(left), "{text}");

    for name in [
        "wedgewatch_stuck_requests",
        "wedgewatch_stuck_request_oldest_age_seconds",
    ] {
        let s = of(name);
        assert!(s.len() <= MAX_SERIES, "{name}: {} series", s.len());
        assert!(
            s.iter().any(|s| s.labels["component"] == OVERFLOW),
            "{name}"
        );
        let counted = value(&x, "wedgewatch_series_overflow", &[("family", name)]);
        assert_eq!(counted, Some((engines - (MAX_SERIES - 1)) as f64), "{name}");
    }
    let stuck = of("wedgewatch_stuck_requests");
    let total: f64 = stuck.iter().map(|s| s.value).sum();
    assert_eq!(total, e.stuck_requests() as f64, "the sum stays exact");
    assert_eq!(
        e.stuck_requests(),
        engines as u64 + 1,
        "every request stuck"
    );
    let most = format!(
        "lookalike{:03}@127.0.0.1:{}",
        engines - 1,
        40_000 + engines - 1
    );
    assert!(
        stuck
            .iter()
            .any(|s| s.labels["component"] == most && s.value == 2.0),
        "the most stuck hop keeps its series"
    );
}
