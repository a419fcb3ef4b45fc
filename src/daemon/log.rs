//! What the daemon logs of its own accord: findings opening, changing severity and closing,
//! sources (and discovery) degrading and recovering. Transitions only: a service's log is read
//! by people, in `journalctl -u wedgewatch`.
//!
//! A background task ([`watch`]) runs the one detector pass ([`Pass`]) every `log_every_ms`,
//! and the trackers here turn it and the sampler's source status into [`Event`]s that [`emit`]
//! logs through the redacting writer of [`crate::logging`] (taught the secrets of new processes
//! first). The same pass publishes the exporter's [`Evaluation`] and the adaptive stacks'
//! suspicion, so it runs whether or not anything is printed. Levels: a finding opens at its
//! severity (critical ERROR, warning WARN, info INFO) and closes at INFO; a source degrading is
//! WARN, recovering INFO.

use super::exporter::Published;
use super::kept_answer::KeptAnswer;
use super::pass::{Latest, Pass};
use super::Shared;
use crate::clock::{Clock, Millis};
use crate::export::prometheus::Evaluation;
use crate::model::{Finding, FindingKind, ProcessFacts, Role, Severity, SourceStatus, Status};
use crate::redact::Redactor;
use crate::sampler::pace::Pace;
use crate::sampler::StatsHandle;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Evaluations a finding may be missing from before it is logged as closed. A finding on
/// a threshold's edge (a stream that moves one byte, a queue that dips once) would
/// otherwise open and close every few seconds and bury the log.
pub const CLOSE_AFTER_ABSENT: u32 = 2;

/// One thing worth a log line.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    FindingOpened {
        kind: String,
        severity: Severity,
        component: Option<String>,
        role: Option<Role>,
        summary: String,
    },
    /// Still open, at another severity.
    FindingChanged {
        kind: String,
        from: Severity,
        to: Severity,
        component: Option<String>,
        role: Option<Role>,
        summary: String,
    },
    FindingClosed {
        kind: String,
        severity: Severity,
        component: Option<String>,
        role: Option<Role>,
        /// The last summary seen while it was open.
        summary: String,
        open_ms: i64,
    },
    /// A source (or discovery) is not ok, or went from degraded to unavailable or back.
    SourceDown {
        source: String,
        status: Status,
        reason: String,
    },
    SourceRecovered {
        source: String,
        down_ms: i64,
    },
}

/// A finding is the same finding while its kind and component are: summaries carry counts
/// and ages that change every evaluation.
type FindingKey = (String, Option<String>);

#[derive(Debug, Clone)]
struct OpenFinding {
    severity: Severity,
    role: Option<Role>,
    summary: String,
    since: Millis,
    absent: u32,
}

/// The findings open so far, compared with each evaluation's.
#[derive(Debug, Default)]
pub struct FindingTracker {
    open: BTreeMap<FindingKey, OpenFinding>,
}

impl FindingTracker {
    /// The events between the open findings and `findings` (sorted most severe first: of two
    /// with one key, the first counts). Without a fresh socket table (`sockets_fresh`),
    /// findings judged from sockets stay open as they are: not judged is not over.
    pub fn update(&mut self, findings: &[Finding], now: Millis, sockets_fresh: bool) -> Vec<Event> {
        let mut events = Vec::new();
        let mut seen = BTreeSet::new();
        for f in findings {
            let key = (f.kind.as_str().to_string(), f.component.clone());
            if !seen.insert(key.clone()) {
                continue;
            }
            match self.open.get_mut(&key) {
                None => {
                    events.push(Event::FindingOpened {
                        kind: key.0.clone(),
                        severity: f.severity,
                        component: key.1.clone(),
                        role: f.role,
                        summary: f.summary.clone(),
                    });
                    self.open.insert(
                        key,
                        OpenFinding {
                            severity: f.severity,
                            role: f.role,
                            summary: f.summary.clone(),
                            since: now,
                            absent: 0,
                        },
                    );
                }
                Some(o) => {
                    if o.severity != f.severity {
                        events.push(Event::FindingChanged {
                            kind: key.0.clone(),
                            from: o.severity,
                            to: f.severity,
                            component: key.1.clone(),
                            role: f.role,
                            summary: f.summary.clone(),
                        });
                    }
                    o.severity = f.severity;
                    o.role = f.role;
                    o.summary.clone_from(&f.summary);
                    o.absent = 0;
                }
            }
        }
        let mut closed = Vec::new();
        let unjudged = |k: &FindingKey| {
            !sockets_fresh && FindingKind::from(k.0.as_str()).judged_from_sockets()
        };
        for (key, o) in self
            .open
            .iter_mut()
            .filter(|(k, _)| !seen.contains(*k) && !unjudged(k))
        {
            o.absent += 1;
            if o.absent >= CLOSE_AFTER_ABSENT {
                closed.push(key.clone());
            }
        }
        for key in closed {
            if let Some(o) = self.open.remove(&key) {
                events.push(Event::FindingClosed {
                    kind: key.0,
                    severity: o.severity,
                    component: key.1,
                    role: o.role,
                    summary: o.summary,
                    open_ms: now - o.since,
                });
            }
        }
        events
    }

    /// How many findings are open (for tests and the shutdown line).
    pub fn open_count(&self) -> usize {
        self.open.len()
    }
}

/// The health of named sources: logged when it changes, not when its reason's wording does
/// (reasons carry counts and timings: "3 of 30 dumps missed").
#[derive(Debug, Default)]
pub struct HealthTracker {
    state: BTreeMap<String, (Status, Millis)>,
}

impl HealthTracker {
    pub fn update(&mut self, source: &str, st: &SourceStatus, now: Millis) -> Option<Event> {
        let prev = self.state.get(source).copied();
        let down = |status| Event::SourceDown {
            source: source.to_string(),
            status,
            reason: st.reason.clone().unwrap_or_default(),
        };
        let event = match (prev, st.status) {
            (None, Status::Ok) => None,
            (None, s) => Some(down(s)),
            (Some((p, _)), s) if p == s => None,
            (Some((_, since)), Status::Ok) => Some(Event::SourceRecovered {
                source: source.to_string(),
                down_ms: now - since,
            }),
            (Some(_), s) => Some(down(s)),
        };
        // `since` is when the current state began: a change between two bad states keeps
        // counting the outage from its start.
        let since = match (prev, st.status) {
            (Some((p, since)), s) if p != Status::Ok && s != Status::Ok => since,
            (Some((p, since)), s) if p == s => since,
            _ => now,
        };
        self.state.insert(source.to_string(), (st.status, since));
        event
    }
}

/// `92s`, `5m12s`, `2h3m`: durations in a log line, to the second.
pub fn human_ms(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m{}s", s / 60, s % 60),
        _ => format!("{}h{}m", s / 3600, (s % 3600) / 60),
    }
}

fn status_str(s: Status) -> &'static str {
    match s {
        Status::Ok => "ok",
        Status::Degraded => "degraded",
        Status::Unavailable => "unavailable",
    }
}

/// Logs one event. The redaction happens in the log writer ([`crate::logging`]).
pub fn emit(e: &Event) {
    let opt = |c: &Option<String>| c.clone().unwrap_or_else(|| "-".into());
    let role = |r: &Option<Role>| r.map(Role::as_str).unwrap_or("-");
    match e {
        Event::FindingOpened {
            kind,
            severity,
            component,
            role: r,
            summary,
        } => {
            let (sev, c, r) = (severity.as_str(), opt(component), role(r));
            match severity {
                Severity::Critical => {
                    tracing::error!(kind = %kind, severity = %sev, component = %c, role = %r, "finding opened: {summary}")
                }
                Severity::Warning => {
                    tracing::warn!(kind = %kind, severity = %sev, component = %c, role = %r, "finding opened: {summary}")
                }
                Severity::Info => {
                    tracing::info!(kind = %kind, severity = %sev, component = %c, role = %r, "finding opened: {summary}")
                }
            }
        }
        Event::FindingChanged {
            kind,
            from,
            to,
            component,
            role: r,
            summary,
        } => {
            let (c, r) = (opt(component), role(r));
            let msg = format!(
                "finding now {} (was {}): {summary}",
                to.as_str(),
                from.as_str()
            );
            match to {
                Severity::Critical if to > from => {
                    tracing::error!(kind = %kind, severity = %to.as_str(), component = %c, role = %r, "{msg}")
                }
                Severity::Warning if to > from => {
                    tracing::warn!(kind = %kind, severity = %to.as_str(), component = %c, role = %r, "{msg}")
                }
                _ => {
                    tracing::info!(kind = %kind, severity = %to.as_str(), component = %c, role = %r, "{msg}")
                }
            }
        }
        Event::FindingClosed {
            kind,
            severity,
            component,
            role: r,
            summary,
            open_ms,
        } => tracing::info!(
            kind = %kind,
            severity = %severity.as_str(),
            component = %opt(component),
            role = %role(r),
            "finding closed after {}: {summary}",
            human_ms(*open_ms)
        ),
        Event::SourceDown {
            source,
            status,
            reason,
        } => tracing::warn!(
            source = %source,
            status = %status_str(*status),
            "source {source} {}: {reason}",
            status_str(*status)
        ),
        Event::SourceRecovered { source, down_ms } => tracing::info!(
            source = %source,
            "source {source} recovered after {}",
            human_ms(*down_ms)
        ),
    }
}

/// The log's own state across evaluations.
#[derive(Debug, Default)]
pub struct Watch {
    pub findings: FindingTracker,
    pub sources: HealthTracker,
    /// Processes (pid, start) whose secrets the log's redactor already knows.
    learned: BTreeSet<(i32, Option<u64>)>,
    /// The exporter's redactor (the log's is global): label values are scrubbed of every
    /// secret learned from those processes.
    labels: Redactor,
}

impl Watch {
    /// One evaluation: learn new processes' secrets, run the detectors over the model at `now`,
    /// compare sources' status; the events in the order to log them. The pass's [`Evaluation`]
    /// goes to `publish`, its suspicion to `latest`, and it sets the sockets' pace.
    pub fn pass(
        &mut self,
        shared: &Mutex<Shared>,
        stats: &StatsHandle,
        clock: &dyn Clock,
        to: &Readers,
    ) -> Vec<Event> {
        let started = std::time::Instant::now();
        let (pass, now, turn_at) = {
            let mut sh = super::lock(shared);
            // The time once the lock is held: samples ingested while this pass waited for
            // it are not from its future.
            let (now, locked) = (clock.now_ms(), std::time::Instant::now());
            self.learn(sh.model.latest_processes());
            let pass = Pass::run(&sh.model, now);
            sh.after_pass(now, &pass.findings);
            // Counted from the instant of the pass's view, not from before its lock wait.
            let turn_at = pass
                .next_turn_ms(&sh.model.thresholds)
                .map(|ms| locked + Duration::from_millis(ms.unsigned_abs()));
            if let Some(p) = &to.publish {
                let topology = sh.model.topology();
                let mut e = Evaluation::new(&pass.view, &pass.findings, topology, &mut self.labels);
                e.took_ms = started.elapsed().as_millis() as u64;
                *p.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
            }
            (pass, now, turn_at)
        };
        for p in &to.paces {
            p.set_alert(!pass.suspicion.is_empty());
        }
        to.latest.set(pass.suspicion.clone());
        if let Some(k) = &to.kept {
            k.expect_news(turn_at, std::time::Instant::now());
        }
        let findings = &pass.findings;
        let mut events = Vec::new();
        // Sources first: "metrics unavailable" explains the endpoint finding that follows.
        let statuses: Vec<_> = stats
            .lock()
            .map(|s| {
                s.values()
                    .filter(|st| st.last_t_ms.is_some()) // "not sampled yet" is no outage
                    .map(|st| (st.kind.as_str(), st.status.clone()))
                    .collect()
            })
            .unwrap_or_default();
        for (kind, st) in statuses {
            events.extend(self.sources.update(kind, &st, now));
        }
        events.extend(self.findings.update(findings, now, pass.view.sockets_fresh));
        events
    }

    fn learn(&mut self, procs: &[ProcessFacts]) {
        let new: Vec<&ProcessFacts> = procs
            .iter()
            .filter(|p| !self.learned.contains(&(p.pid, p.start_ticks)))
            .collect();
        if new.is_empty() {
            return;
        }
        crate::logging::learn_secrets(new.iter().copied());
        new.iter().for_each(|p| self.labels.learn(p));
        // Bounded like the redactor: a host that churns processes must not grow this set.
        if self.learned.len() > 65_536 {
            self.learned.clear();
        }
        self.learned
            .extend(new.iter().map(|p| (p.pid, p.start_ticks)));
    }
}

/// Who reads each pass besides the log: the exporter (when there is one), the newest
/// pass's reader (the adaptive stacks) and the daemon's paces (alert while anything is
/// suspected).
#[derive(Debug, Clone, Default)]
pub struct Readers {
    pub publish: Option<Published>,
    pub latest: Latest,
    pub paces: Vec<Arc<Pace>>,
    /// The served `json` answer, told when the pass expects an open request to turn.
    pub kept: Option<Arc<KeptAnswer>>,
    /// The incident bundles' writer, told every finding's events ([`super::incidents`]).
    pub incidents: Option<super::incidents::Incidents>,
}

/// Passes at the fast period after the daemon starts, before its pace decides.
const STARTING_PASSES: u32 = 3;

/// Logs findings and source health at `pace` until the task is aborted, publishing each pass's
/// evaluation and keeping the newest pass in `to.latest`. The detectors run off the runtime's
/// workers: a large model holds the lock a while.
pub async fn watch(
    shared: Arc<Mutex<Shared>>,
    stats: StatsHandle,
    clock: Arc<dyn Clock>,
    pace: Arc<Pace>,
    to: Readers,
) {
    let mut state = Some(Watch::default());
    // The first passes at the fast period: a daemon just started tells the health of its
    // sources' first samples (a GPU source unavailable, ...) in seconds, calm or not.
    let mut starting = STARTING_PASSES;
    loop {
        let Some(mut w) = state.take() else {
            return;
        };
        let (shared, stats, to, clock) = (shared.clone(), stats.clone(), to.clone(), clock.clone());
        let done = tokio::task::spawn_blocking(move || {
            let events = w.pass(&shared, &stats, clock.as_ref(), &to);
            events.iter().for_each(emit);
            if let Some(i) = &to.incidents {
                i.tell(&events);
            }
            w
        })
        .await;
        match done {
            Ok(w) => state = Some(w),
            // A detector panicked: say so once and stop logging findings rather than
            // take the daemon down with it.
            Err(e) => {
                tracing::error!("finding log stopped: {e}");
                return;
            }
        }
        // The period from the end of a pass (a slow pass never queues another behind it).
        let period_ms = if starting > 0 {
            starting -= 1;
            pace.alert_period_ms()
        } else {
            pace.period_ms()
        };
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(period_ms)) => {}
            _ = pace.alerted() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finding(kind: FindingKind, sev: Severity, comp: &str, summary: &str) -> Finding {
        Finding {
            kind,
            severity: sev,
            component: Some(comp.to_string()),
            role: Some(Role::Decode),
            summary: summary.to_string(),
            requests: Vec::new(),
            evidence: Vec::new(),
            explanation: None,
        }
    }

    #[test]
    fn a_finding_opens_once_changes_severity_and_closes_after_two_absent_passes() {
        let mut t = FindingTracker::default();
        let w = |n: &str, s| finding(FindingKind::WedgedRequest, s, "decode", n);
        let ev = t.update(&[w("2 requests", Severity::Warning)], 1_000, true);
        assert!(
            matches!(&ev[..], [Event::FindingOpened { kind, severity: Severity::Warning, summary, .. }]
                if kind == "wedged_request" && summary == "2 requests"),
            "{ev:?}"
        );
        assert!(
            t.update(&[w("3 requests", Severity::Warning)], 2_000, true)
                .is_empty(),
            "same key, new count: no line"
        );
        let ev = t.update(&[w("3 requests", Severity::Critical)], 3_000, true);
        assert!(
            matches!(
                &ev[..],
                [Event::FindingChanged {
                    from: Severity::Warning,
                    to: Severity::Critical,
                    ..
                }]
            ),
            "{ev:?}"
        );
        assert!(
            t.update(&[], 4_000, true).is_empty(),
            "one absent pass is not a close"
        );
        assert!(
            t.update(&[w("3 requests", Severity::Critical)], 5_000, true)
                .is_empty(),
            "back: still the same open finding"
        );
        assert!(t.update(&[], 6_000, true).is_empty());
        let ev = t.update(&[], 7_000, true);
        assert!(
            matches!(&ev[..], [Event::FindingClosed { open_ms: 6_000, summary, .. }] if summary == "3 requests"),
            "{ev:?}"
        );
        assert_eq!(t.open_count(), 0);
    }

    #[test]
    fn a_finding_judged_from_sockets_stays_open_while_the_table_is_stale() {
        let mut t = FindingTracker::default();
        let wedged = finding(
            FindingKind::WedgedRequest,
            Severity::Critical,
            "decode",
            "1 request",
        );
        let changed = finding(
            FindingKind::ConfigChanged,
            Severity::Warning,
            "decode",
            "env",
        );
        assert_eq!(t.update(&[wedged.clone(), changed], 0, true).len(), 2);
        // No socket table for three passes: the wedge was not judged, so it is not over;
        // a kind judged from other sources closes as usual.
        let mut closed = Vec::new();
        for i in 1..=3 {
            closed.extend(t.update(&[], i * 2_000, false));
        }
        assert_eq!(closed.len(), 1, "{closed:?}");
        assert!(
            matches!(&closed[0], Event::FindingClosed { kind, .. } if kind == "config_changed")
        );
        assert_eq!(t.open_count(), 1);
        // Judged again and still there: no new "opened" line.
        assert!(t.update(&[wedged], 8_000, true).is_empty());
        // Judged and gone: closes after the usual absent passes.
        assert!(t.update(&[], 10_000, true).is_empty());
        assert_eq!(t.update(&[], 12_000, true).len(), 1);
    }

    #[test]
    fn findings_are_told_apart_by_kind_and_component() {
        let mut t = FindingTracker::default();
        let a = finding(
            FindingKind::WedgedRequest,
            Severity::Critical,
            "decode",
            "a",
        );
        let b = finding(
            FindingKind::WedgedRequest,
            Severity::Critical,
            "prefill",
            "b",
        );
        let c = finding(FindingKind::ConfigChanged, Severity::Warning, "decode", "c");
        let dup = finding(
            FindingKind::WedgedRequest,
            Severity::Warning,
            "decode",
            "dup",
        );
        let ev = t.update(&[a, b, c, dup], 0, true);
        assert_eq!(ev.len(), 3, "{ev:?}");
        assert_eq!(t.open_count(), 3);
    }

    #[test]
    fn a_source_is_logged_when_it_goes_down_and_when_it_recovers_not_every_tick() {
        let mut h = HealthTracker::default();
        let ok = SourceStatus::ok();
        assert_eq!(
            h.update("gpu", &ok, 0),
            None,
            "ok from the start: nothing to say"
        );
        let bad = SourceStatus::degraded("ptrace: 3 of 30 dumps missed");
        assert!(matches!(
            h.update("gpu", &bad, 1_000),
            Some(Event::SourceDown {
                status: Status::Degraded,
                ..
            })
        ));
        for t in 2..10 {
            let reworded = SourceStatus::degraded(format!("ptrace: {t} of 30 dumps missed"));
            assert_eq!(h.update("gpu", &reworded, t * 1_000), None, "tick {t}");
        }
        assert!(matches!(
            h.update("gpu", &SourceStatus::unavailable("driver hung"), 10_000),
            Some(Event::SourceDown { status: Status::Unavailable, ref reason, .. }) if reason == "driver hung"
        ));
        assert_eq!(
            h.update("gpu", &ok, 12_000),
            Some(Event::SourceRecovered {
                source: "gpu".into(),
                down_ms: 11_000
            }),
            "the outage counts from its start"
        );
        assert_eq!(h.update("gpu", &ok, 13_000), None);
        assert!(matches!(
            h.update("stacks", &SourceStatus::unavailable("py-spy not found"), 0),
            Some(Event::SourceDown { .. })
        ));
    }

    #[test]
    fn durations_read_in_seconds_minutes_and_hours() {
        assert_eq!(human_ms(-5), "0s");
        assert_eq!(human_ms(92_400), "92s");
        assert_eq!(human_ms(312_000), "5m12s");
        assert_eq!(human_ms(7_380_000), "2h3m");
    }
}
