//! Detectors: small pure functions over the correlated model, each producing findings with
//! a one-line summary, the component/role to blame, the requests concerned and evidence.
//!
//! One file per detector (its doc comment gives the rule, its section of docs/findings.md,
//! and the [`Thresholds`] fields it reads); this module holds what they share: the list of
//! detectors, [`run_all`] (ordering and folding of child findings) and evidence helpers.

use crate::correlate::blame::Blame;
use crate::correlate::GpuActivity;
use crate::correlate::{ComponentState, Correlator, CountSource, RequestView, View};
use crate::model::{Evidence, Finding, FindingKind, Role, StuckKind, ThreadState};
use std::collections::{BTreeMap, BTreeSet};

mod accumulating_state;
mod busy_without_progress;
mod config_changed;
mod endpoint_unresponsive;
mod kv_transfer_stalled;
mod pd_leg_failed;
mod process_restarted;
mod queue_not_draining;
mod ranks_diverged;
mod scheduler_stuck;
mod stalled_stream;
mod tokens_undelivered;
mod wedged_request;

pub use crate::model::Thresholds;
pub use accumulating_state::accumulating_state;
pub use busy_without_progress::busy_without_progress;
pub use config_changed::config_changed;
use config_changed::config_changed_detector;
pub use endpoint_unresponsive::endpoint_unresponsive;
pub use kv_transfer_stalled::kv_transfer_stalled;
pub use pd_leg_failed::pd_leg_failed;
pub use process_restarted::process_restarted;
pub use queue_not_draining::queue_not_draining;
pub use ranks_diverged::ranks_diverged;
pub use scheduler_stuck::scheduler_stuck;
pub use stalled_stream::stalled_stream;
pub use tokens_undelivered::tokens_undelivered;
pub use wedged_request::wedged_request;

/// A detector: a pure function over the model and its view at one instant.
pub type Detector = fn(&Correlator, &View) -> Vec<Finding>;

/// Every detector, by the finding kind it produces.
pub const DETECTORS: &[(FindingKind, Detector)] = &[
    (FindingKind::WedgedRequest, wedged_request),
    (FindingKind::KvTransferStalled, kv_transfer_stalled),
    (FindingKind::StalledStream, stalled_stream),
    (FindingKind::PdLegFailed, pd_leg_failed),
    (FindingKind::TokensUndelivered, tokens_undelivered),
    (FindingKind::BusyWithoutProgress, busy_without_progress),
    (FindingKind::QueueNotDraining, queue_not_draining),
    (FindingKind::SchedulerStuck, scheduler_stuck),
    (FindingKind::AccumulatingState, accumulating_state),
    (FindingKind::ProcessRestarted, process_restarted),
    (FindingKind::EndpointUnresponsive, endpoint_unresponsive),
    (FindingKind::ConfigChanged, config_changed_detector),
    (FindingKind::RanksDiverged, ranks_diverged),
];

/// Runs every detector; findings sorted most severe first, then by kind order above.
pub fn run_all(model: &Correlator, view: &View) -> Vec<Finding> {
    let mut out = Vec::new();
    for (i, (_, d)) in DETECTORS.iter().enumerate() {
        for f in d(model, view) {
            out.push((i, f));
        }
    }
    out.sort_by(|a, b| b.1.severity.cmp(&a.1.severity).then(a.0.cmp(&b.0)));
    fold_into_parents(model, out.into_iter().map(|(_, f)| f).collect())
}

/// Kinds whose findings on child processes (scheduler, detokenizer) only repeat their
/// engine's: children inherit the engine's environment and restart with it.
const FOLDED_KINDS: &[FindingKind] = &[FindingKind::ConfigChanged, FindingKind::ProcessRestarted];

/// Drops a child's finding when its parent has one of the same kind, and names the child
/// in the parent's summary instead: one restart of an engine is one finding, not three.
fn fold_into_parents(model: &Correlator, findings: Vec<Finding>) -> Vec<Finding> {
    let parent_of = |id: &str| {
        model
            .topology()
            .component(id)
            .and_then(|c| c.parent.clone())
    };
    let has = |kind: &FindingKind, comp: &str| {
        findings
            .iter()
            .any(|f| f.kind == *kind && f.component.as_deref() == Some(comp))
    };
    let mut folded: BTreeMap<(FindingKind, String), Vec<String>> = BTreeMap::new();
    let mut kept = Vec::new();
    for f in &findings {
        let parent = f.component.as_deref().and_then(parent_of);
        match parent {
            Some(p) if FOLDED_KINDS.contains(&f.kind) && has(&f.kind, &p) => {
                let child = f.component.clone().unwrap_or_default();
                folded.entry((f.kind.clone(), p)).or_default().push(child);
            }
            _ => kept.push(f.clone()),
        }
    }
    for f in &mut kept {
        let key = (f.kind.clone(), f.component.clone().unwrap_or_default());
        if let Some(children) = folded.get(&key) {
            let names: Vec<&str> = children
                .iter()
                .map(|c| c.split('@').next().unwrap_or(c))
                .collect();
            f.summary
                .push_str(&format!(" (and its {})", names.join(", ")));
            for c in children {
                f.evidence
                    .push(Evidence::new("topology", format!("same on child {c}")));
            }
        }
    }
    kept
}

/// "94 s", "2.5 s", "12 min".
pub fn secs(ms: i64) -> String {
    let s = ms as f64 / 1000.0;
    if s >= 600.0 {
        format!("{:.0} min", s / 60.0)
    } else if s >= 10.0 {
        format!("{s:.0} s")
    } else {
        format!("{s:.1} s")
    }
}

/// The path of hops down to a leg: "proxy r3@proxy -> router r3@router (link 0.90) -> ...".
fn chain_text(chain: &[&RequestView]) -> String {
    chain
        .iter()
        .map(|r| {
            let conf =
                r.x.parent_confidence
                    .map(|c| format!(" (link {c:.2})"))
                    .unwrap_or_default();
            format!("{} {}{}", r.x.component, r.leg, conf)
        })
        .collect::<Vec<_>>()
        .join(" -> ")
}

/// `idle, idle` -> `idle, idle`: the states of a window as the evidence text lists them.
pub(crate) fn join_states(states: &[ThreadState]) -> String {
    let names: Vec<&str> = states.iter().map(ThreadState::as_str).collect();
    names.join(", ")
}

/// `idle, idle, idle, polling` -> `idle x3, polling`.
fn run_lengths(states: &[ThreadState]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < states.len() {
        let mut j = i;
        while j < states.len() && states[j] == states[i] {
            j += 1;
        }
        out.push(if j - i > 1 {
            format!("{} x{}", states[i], j - i)
        } else {
            states[i].to_string()
        });
        i = j;
    }
    out.join(", ")
}

/// " over 12 s": how long a thread's dumps span (nothing for a single dump).
fn over_span(t: &crate::correlate::ThreadWindow) -> String {
    if t.times.len() < 2 {
        return String::new();
    }
    format!(" over {}", crate::correlate::span_text(t.span_ms()))
}

/// Idle-side evidence of an engine: what says it is doing nothing.
fn idle_evidence(cs: &ComponentState) -> (Vec<String>, Vec<Evidence>) {
    let mut words = Vec::new();
    let mut ev = Vec::new();
    ev.push(Evidence::new(
        "gpu",
        format!("GPU activity: {}", cs.gpu_activity),
    ));
    if cs.gpu_activity != GpuActivity::Unknown {
        words.push(format!("GPU {}", cs.gpu_activity));
    }
    if let Some(r) = cs.forward_rate {
        ev.push(Evidence::new(
            "metrics",
            format!("forward_seconds_total rate {r:.3} s/s"),
        ));
        if r <= 0.01 {
            words.push("no forward passes".to_string());
        }
    }
    if let Some(s) = cs.thread_summary() {
        let detail: Vec<String> = cs
            .threads
            .iter()
            // Threads no rule recognised (HTTP loops, helpers) say nothing about the work.
            .filter(|t| t.states.iter().any(|s| !s.is_uninformative()))
            .map(|t| {
                format!(
                    "pid {} tid {} ({}): {}{}",
                    t.pid,
                    t.tid,
                    t.name.as_deref().unwrap_or("?"),
                    run_lengths(&t.states),
                    over_span(t)
                )
            })
            .collect();
        ev.push(Evidence::new("stacks", detail.join("; ")));
        words.push(s);
    }
    if let Some((n, src)) = cs.running {
        let frozen = if src == CountSource::Metrics {
            " (gauge; may be frozen during a stall)"
        } else {
            ""
        };
        ev.push(Evidence::new(
            "metrics",
            format!("running {n} from {src}{frozen}"),
        ));
        words.push(format!("engine reports {n} running"));
    }
    if let Some((q, src)) = cs.queued {
        ev.push(Evidence::new("metrics", format!("queued {q} from {src}")));
    }
    if let Some(h) = cs.http_active {
        ev.push(Evidence::new("metrics", format!("http_active {h}")));
    }
    if let Some(a) = cs.router_active {
        ev.push(Evidence::new(
            "metrics",
            format!("router in-flight for this worker {a}"),
        ));
    }
    (words, ev)
}

/// The legs the correlator judged stuck (`kind`) and blamed on the hop they wait at, by the
/// component they are stuck at: one leg per logical request. (Legs with a cause past their
/// hop are `pd_leg_failed`'s and `tokens_undelivered`'s.)
fn stuck_by_component(v: &View, kind: StuckKind) -> BTreeMap<String, Vec<&RequestView>> {
    let mut m: BTreeMap<String, Vec<&RequestView>> = BTreeMap::new();
    for s in v.stuck().filter_map(|l| l.stuck.as_ref()) {
        if s.kind == kind && s.blame == Blame::Here {
            let r = &v.requests[s.leg];
            m.entry(r.x.component.clone()).or_default().push(r);
        }
    }
    m
}

/// The logical requests (`r17`) the exchanges are legs of, each once, in order.
fn logical_ids(v: &View, legs: &[&RequestView]) -> Vec<String> {
    let mut seen = BTreeSet::new();
    legs.iter()
        .map(|r| v.logical_of(r).id())
        .filter(|id| seen.insert(id.clone()))
        .collect()
}

fn role_of(m: &Correlator, comp: &str) -> Option<Role> {
    m.topology().component(comp).map(|c| c.role)
}

#[cfg(test)]
mod tests {
    use super::DETECTORS;
    use crate::model::FindingKind;

    #[test]
    fn every_known_kind_has_its_detector_in_order() {
        let kinds: Vec<&FindingKind> = DETECTORS.iter().map(|(k, _)| k).collect();
        let known: Vec<&FindingKind> = FindingKind::KNOWN.iter().collect();
        assert_eq!(kinds, known);
    }
}
