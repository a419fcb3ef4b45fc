//! The daemon's state in the Prometheus text exposition format (0.0.4), for `--metrics-listen`
//! (the listener is `daemon::exporter`; names and families in docs/fleet.md "Exporter"). It
//! renders an [`Evaluation`] (one detector pass, built by the daemon, never per scrape) and the
//! sampler's [`SourceHealth`].
//!
//! Label values are host text: redacted ([`Redactor`]), neutralised, cut to [`MAX_LABEL`]
//! bytes and escaped. Families labelled by component ids hold at most [`MAX_SERIES`] series (a
//! host that starts look-alikes must not grow the scraper's); the rest goes to [`OVERFLOW`].

use crate::clock::Millis;
use crate::correlate::View;
use crate::model::{Finding, Role, Severity, SourceKind, Status, StuckKind, Topology, Verdict};
use crate::redact::{control, Redactor};
use std::collections::BTreeMap;
use std::fmt::Write;

/// The `Content-Type` of what [`render`] writes.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// Longest label value written, in bytes; a longer one is cut on a character boundary.
pub const MAX_LABEL: usize = 256;
/// Most series written per family labelled by component (`wedgewatch_findings`,
/// `wedgewatch_stuck_requests` and its age twin), the overflow series included. A node's
/// real stack has a few dozen components; 64 keeps every one of them with room to spare.
pub const MAX_SERIES: usize = 64;
/// The value of the free-text labels (`kind`, `component`, `entry`) of an overflow series.
pub const OVERFLOW: &str = "_overflow";

/// Open findings are counted by these labels.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct FindingKey {
    kind: String,
    severity: Severity,
    component: String,
    role: &'static str,
}

/// Stuck requests are counted at the hop they are stuck at (`component`, `role`), by where
/// they entered the stack (`entry`: the component whose client waits) and how.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct StuckKey {
    component: String,
    role: &'static str,
    entry: String,
    kind: StuckKind,
}

impl StuckKey {
    fn labels(&self) -> [(&str, &str); 4] {
        [
            ("component", self.component.as_str()),
            ("role", self.role),
            ("entry", self.entry.as_str()),
            ("kind", stuck_kind_str(self.kind)),
        ]
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct StuckCount {
    requests: u64,
    /// Age of the oldest stuck leg at this hop.
    oldest_ms: i64,
}

/// What one detector pass saw, its label values redacted.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Evaluation {
    /// When the pass looked (the model's `now`).
    pub at_ms: Millis,
    /// How long the pass took (view, detectors, this evaluation).
    pub took_ms: u64,
    findings: BTreeMap<FindingKey, u64>,
    stuck: BTreeMap<StuckKey, StuckCount>,
    /// Logical requests that are not probes, by verdict.
    requests: BTreeMap<Verdict, u64>,
    components: BTreeMap<&'static str, u64>,
    /// The findings [`MAX_SERIES`] left out of `findings`.
    findings_overflow: Option<FindingOverflow>,
    /// The stuck requests [`MAX_SERIES`] left out of `stuck`.
    stuck_overflow: Option<StuckOverflow>,
}

/// Findings summed into the overflow series of `wedgewatch_findings`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct FindingOverflow {
    /// Series left out.
    series: u64,
    findings: u64,
    /// The highest severity among them: the overflow series carries it, so that an alert on
    /// critical findings still sees critical findings that did not fit.
    severity: Severity,
}

/// Stuck requests summed into the overflow series of `wedgewatch_stuck_requests`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct StuckOverflow {
    /// Series left out.
    series: u64,
    count: StuckCount,
}

/// Keeps the [`MAX_SERIES`] `- 1` entries of `map` that `rank` puts first (greatest rank,
/// then key order) when it has more than [`MAX_SERIES`]; returns the others.
fn keep_top<K: Ord, V, R: Ord>(
    map: &mut BTreeMap<K, V>,
    rank: impl Fn(&K, &V) -> R,
) -> Vec<(K, V)> {
    if map.len() <= MAX_SERIES {
        return Vec::new();
    }
    let mut all: Vec<(K, V)> = std::mem::take(map).into_iter().collect();
    all.sort_by(|a, b| {
        rank(&b.0, &b.1)
            .cmp(&rank(&a.0, &a.1))
            .then_with(|| a.0.cmp(&b.0))
    });
    let rest = all.split_off(MAX_SERIES - 1);
    *map = all.into_iter().collect();
    rest
}

/// A label value as written: redacted, inert, bounded (escaping happens at rendering).
fn label(r: &mut Redactor, s: &str) -> String {
    let redacted = r.text(s);
    let inert = control::value(&redacted);
    let mut end = inert.len().min(MAX_LABEL);
    while !inert.is_char_boundary(end) {
        end -= 1;
    }
    inert[..end].to_string()
}

fn role_str(r: Option<Role>) -> &'static str {
    r.map(Role::as_str).unwrap_or("")
}

impl Evaluation {
    /// The evaluation of `view` and its `findings` (from `detect::run_all`). `redactor`
    /// has been taught the secrets of the model's processes.
    pub fn new(
        view: &View,
        findings: &[Finding],
        topology: &Topology,
        redactor: &mut Redactor,
    ) -> Evaluation {
        let mut e = Evaluation {
            at_ms: view.now,
            ..Evaluation::default()
        };
        for f in findings {
            let key = FindingKey {
                kind: label(redactor, f.kind.as_str()),
                severity: f.severity,
                component: label(redactor, f.component.as_deref().unwrap_or("")),
                role: role_str(f.role),
            };
            *e.findings.entry(key).or_default() += 1;
        }
        e.count_requests(view, redactor);
        for c in &topology.components {
            *e.components.entry(c.role.as_str()).or_default() += 1;
        }
        e.cap_series();
        e
    }

    /// Bounds the families labelled by component to [`MAX_SERIES`] series each: critical
    /// findings and the most stuck requests are kept, the rest summed into overflow.
    fn cap_series(&mut self) {
        let left = keep_top(&mut self.findings, |k, n| (k.severity, *n));
        self.findings_overflow =
            left.iter()
                .map(|(k, _)| k.severity)
                .max()
                .map(|severity| FindingOverflow {
                    series: left.len() as u64,
                    findings: left.iter().map(|(_, n)| n).sum(),
                    severity,
                });
        let left = keep_top(&mut self.stuck, |_, c| (c.requests, c.oldest_ms));
        self.stuck_overflow = (!left.is_empty()).then(|| StuckOverflow {
            series: left.len() as u64,
            count: StuckCount {
                requests: left.iter().map(|(_, c)| c.requests).sum(),
                oldest_ms: left.iter().map(|(_, c)| c.oldest_ms).max().unwrap_or(0),
            },
        });
    }

    fn count_requests(&mut self, view: &View, redactor: &mut Redactor) {
        for l in view.logical.iter().filter(|l| !l.probe) {
            *self.requests.entry(l.verdict).or_default() += 1;
            let (Some(s), Some(&entry)) = (&l.stuck, l.legs.first()) else {
                continue;
            };
            let (Some(at), Some(entry)) = (view.requests.get(s.leg), view.requests.get(entry))
            else {
                continue;
            };
            let key = StuckKey {
                component: label(redactor, &at.x.component),
                role: at.x.role.as_str(),
                entry: label(redactor, &entry.x.component),
                kind: s.kind,
            };
            let c = self.stuck.entry(key).or_default();
            c.requests += 1;
            c.oldest_ms = c.oldest_ms.max(at.age_ms);
        }
    }

    /// Stuck requests in all, over every hop (for tests and logs).
    pub fn stuck_requests(&self) -> u64 {
        let over = self.stuck_overflow.map_or(0, |o| o.count.requests);
        self.stuck.values().map(|c| c.requests).sum::<u64>() + over
    }
}

/// One source's health as the sampler reports it, read at the scrape.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceHealth {
    pub source: SourceKind,
    /// `None`: not sampled yet.
    pub status: Option<Status>,
    pub last_sample_ms: Option<Millis>,
    /// Configured period.
    pub every_ms: u64,
    /// How long its latest sample took.
    pub took_ms: u64,
    pub samples: u64,
    pub late: u64,
    pub dropped: u64,
    pub timeouts: u64,
}

fn status_str(s: Status) -> &'static str {
    match s {
        Status::Ok => "ok",
        Status::Degraded => "degraded",
        Status::Unavailable => "unavailable",
    }
}

fn stuck_kind_str(k: StuckKind) -> &'static str {
    match k {
        StuckKind::NoResponse => "no_response",
        StuckKind::StreamStalled => "stream_stalled",
        StuckKind::KvTransfer => "kv_transfer",
    }
}

/// `s` escaped as a label value: `\`, `"` and newline (the format's three escapes).
fn escape(s: &str, out: &mut String) {
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// A sample value as the format writes it.
fn value(v: f64, out: &mut String) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else {
        let _ = write!(out, "{v}");
    }
}

/// Writes one family at a time: its `# HELP` and `# TYPE`, then samples.
struct Out {
    text: String,
}

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP {name} {help}");
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], v: f64) {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (k, val)) in labels.iter().enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                self.text.push_str(k);
                self.text.push_str("=\"");
                escape(val, &mut self.text);
                self.text.push('"');
            }
            self.text.push('}');
        }
        self.text.push(' ');
        value(v, &mut self.text);
        self.text.push('\n');
    }
}

fn secs(ms: i64) -> f64 {
    ms as f64 / 1000.0
}

/// The exposition at `now`: build info, source health, and, once the daemon has evaluated
/// its model, findings, stuck requests, verdicts and components.
pub fn render(
    evaluation: Option<&Evaluation>,
    sources: &[SourceHealth],
    now: Millis,
    version: &str,
) -> String {
    let mut out = Out {
        text: String::with_capacity(4096),
    };
    out.family(
        "wedgewatch_build_info",
        "gauge",
        "The running wedgewatch; always 1.",
    );
    let mut r = Redactor::new();
    out.sample(
        "wedgewatch_build_info",
        &[("version", &label(&mut r, version))],
        1.0,
    );
    render_sources(&mut out, sources, now);
    if let Some(e) = evaluation {
        render_evaluation(&mut out, e, now);
    }
    out.text
}

fn render_sources(out: &mut Out, sources: &[SourceHealth], now: Millis) {
    const STATES: [Status; 3] = [Status::Ok, Status::Degraded, Status::Unavailable];
    out.family(
        "wedgewatch_source_status",
        "gauge",
        "1 for a source's current status (ok, degraded, unavailable), else 0; no series before its first sample.",
    );
    for s in sources {
        let Some(st) = s.status else { continue };
        for candidate in STATES {
            let v = if candidate == st { 1.0 } else { 0.0 };
            let labels = [
                ("source", s.source.as_str()),
                ("status", status_str(candidate)),
            ];
            out.sample("wedgewatch_source_status", &labels, v);
        }
    }
    out.family(
        "wedgewatch_source_up",
        "gauge",
        "1 while the source can be sampled (ok or degraded), 0 while it is unavailable: what the findings could not see; no series before its first sample.",
    );
    for s in sources {
        let Some(st) = s.status else { continue };
        let up = if st == Status::Unavailable { 0.0 } else { 1.0 };
        out.sample("wedgewatch_source_up", &[("source", s.source.as_str())], up);
    }
    out.family(
        "wedgewatch_source_last_sample_age_seconds",
        "gauge",
        "Sampling lag: seconds since the source's latest sample.",
    );
    for s in sources {
        if let Some(t) = s.last_sample_ms {
            let labels = [("source", s.source.as_str())];
            let age = secs((now - t).max(0));
            out.sample("wedgewatch_source_last_sample_age_seconds", &labels, age);
        }
    }
    render_source_gauges(out, sources);
    render_source_counters(out, sources);
}

/// A per-source family: its name, help, and the value of one source.
type Column<T> = (&'static str, &'static str, fn(&SourceHealth) -> T);

fn render_source_gauges(out: &mut Out, sources: &[SourceHealth]) {
    let gauges: [Column<f64>; 2] = [
        (
            "wedgewatch_source_interval_seconds",
            "The source's configured sampling period.",
            |s| s.every_ms as f64 / 1000.0,
        ),
        (
            "wedgewatch_source_sample_duration_seconds",
            "How long the source's latest sample took.",
            |s| s.took_ms as f64 / 1000.0,
        ),
    ];
    for (name, help, get) in gauges {
        out.family(name, "gauge", help);
        for s in sources {
            out.sample(name, &[("source", s.source.as_str())], get(s));
        }
    }
}

fn render_source_counters(out: &mut Out, sources: &[SourceHealth]) {
    let counters: [Column<u64>; 4] = [
        ("wedgewatch_source_samples_total", "Samples taken.", |s| {
            s.samples
        }),
        (
            "wedgewatch_source_late_total",
            "Ticks missed because the previous sample overran its period.",
            |s| s.late,
        ),
        (
            "wedgewatch_source_timeouts_total",
            "Samples cut short by their timeout.",
            |s| s.timeouts,
        ),
        (
            "wedgewatch_source_dropped_total",
            "Samples lost (timed out, or the daemon could not take them).",
            |s| s.dropped,
        ),
    ];
    for (name, help, get) in counters {
        out.family(name, "counter", help);
        for s in sources {
            out.sample(name, &[("source", s.source.as_str())], get(s) as f64);
        }
    }
}

fn render_evaluation(out: &mut Out, e: &Evaluation, now: Millis) {
    out.family(
        "wedgewatch_evaluation_age_seconds",
        "gauge",
        "Seconds since the daemon last ran its detectors (what the series below are as of).",
    );
    out.sample(
        "wedgewatch_evaluation_age_seconds",
        &[],
        secs((now - e.at_ms).max(0)),
    );
    out.family(
        "wedgewatch_evaluation_duration_seconds",
        "gauge",
        "How long the latest detector pass took.",
    );
    let took = e.took_ms as f64 / 1000.0;
    out.sample("wedgewatch_evaluation_duration_seconds", &[], took);
    render_findings(out, e);
    render_stuck(out, e);
    render_overflow(out, e);
    render_counts(out, e);
}

fn render_findings(out: &mut Out, e: &Evaluation) {
    out.family(
        "wedgewatch_findings",
        "gauge",
        "Open findings by kind, severity, component and role.",
    );
    for (k, n) in &e.findings {
        let labels = [
            ("kind", k.kind.as_str()),
            ("severity", k.severity.as_str()),
            ("component", k.component.as_str()),
            ("role", k.role),
        ];
        out.sample("wedgewatch_findings", &labels, *n as f64);
    }
    if let Some(o) = &e.findings_overflow {
        let labels = [
            ("kind", OVERFLOW),
            ("severity", o.severity.as_str()),
            ("component", OVERFLOW),
            ("role", ""),
        ];
        out.sample("wedgewatch_findings", &labels, o.findings as f64);
    }
}

/// The labels of the overflow series of the stuck-request families.
const STUCK_OVERFLOW_LABELS: [(&str, &str); 4] = [
    ("component", OVERFLOW),
    ("role", ""),
    ("entry", OVERFLOW),
    ("kind", OVERFLOW),
];

fn render_overflow(out: &mut Out, e: &Evaluation) {
    let name = "wedgewatch_series_overflow";
    out.family(
        name,
        "gauge",
        "Series left out of a family by its cap (docs/fleet.md) and summed into its overflow series.",
    );
    let findings = e.findings_overflow.map_or(0, |o| o.series);
    out.sample(name, &[("family", "wedgewatch_findings")], findings as f64);
    let stuck = e.stuck_overflow.map_or(0, |o| o.series);
    for family in [
        "wedgewatch_stuck_requests",
        "wedgewatch_stuck_request_oldest_age_seconds",
    ] {
        out.sample(name, &[("family", family)], stuck as f64);
    }
}

fn render_stuck(out: &mut Out, e: &Evaluation) {
    out.family(
        "wedgewatch_stuck_requests",
        "gauge",
        "Requests judged stuck, by the hop they are stuck at (component, role), where they entered (entry) and how (kind).",
    );
    for (k, c) in &e.stuck {
        out.sample("wedgewatch_stuck_requests", &k.labels(), c.requests as f64);
    }
    if let Some(o) = &e.stuck_overflow {
        let n = o.count.requests as f64;
        out.sample("wedgewatch_stuck_requests", &STUCK_OVERFLOW_LABELS, n);
    }
    out.family(
        "wedgewatch_stuck_request_oldest_age_seconds",
        "gauge",
        "Age of the oldest stuck request at the hop, in seconds.",
    );
    for (k, c) in &e.stuck {
        let name = "wedgewatch_stuck_request_oldest_age_seconds";
        out.sample(name, &k.labels(), secs(c.oldest_ms.max(0)));
    }
    if let Some(o) = &e.stuck_overflow {
        let age = secs(o.count.oldest_ms.max(0));
        let name = "wedgewatch_stuck_request_oldest_age_seconds";
        out.sample(name, &STUCK_OVERFLOW_LABELS, age);
    }
}

fn render_counts(out: &mut Out, e: &Evaluation) {
    out.family(
        "wedgewatch_requests",
        "gauge",
        "Requests in the daemon's window (probes excluded), by verdict.",
    );
    for (v, n) in &e.requests {
        out.sample("wedgewatch_requests", &[("verdict", v.as_str())], *n as f64);
    }
    out.family(
        "wedgewatch_components",
        "gauge",
        "Components discovered, by role.",
    );
    for (role, n) in &e.components {
        out.sample("wedgewatch_components", &[("role", role)], *n as f64);
    }
}
