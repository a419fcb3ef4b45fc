//! `queue_not_draining` (critical): an engine reports queued requests and 0 running over
//! `queue_after_ms`, GPU not working, no forward time (a fresh `/v1/loads` preferred over
//! gauges that freeze; a prefill's bootstrap queue does not count), unless every request seen
//! waiting there is another hop's finding. See `queue_not_draining` in
//! docs/findings.md.
//!
//! Thresholds read: `queue_after_ms`.

use super::secs;
use crate::clock::Millis;
use crate::correlate::blame::Blame;
use crate::correlate::GpuActivity;
use crate::correlate::{ComponentState, Correlator, MetricsPoint, RequestView, View};
use crate::model::{Evidence, Finding, FindingKind, Severity};

/// A `/v1/loads` snapshot older than this when scraped is frozen (SGLang republishes it
/// continuously while its loop cycles, stalls included).
const LOADS_FRESH_MS: f64 = 3000.0;

/// `queue_not_draining`: queue non-empty, nothing running, GPU idle, for >= `queue_after_ms`.
pub fn queue_not_draining(m: &Correlator, v: &View) -> Vec<Finding> {
    let mut out = Vec::new();
    for cs in v.components.values().filter(|c| c.role.is_engine()) {
        if cs.gpu_activity == GpuActivity::Working || cs.forward_rate.is_some_and(|r| r > 0.01) {
            continue;
        }
        let Some(judged) = judged_stretch(m, &cs.id, v.now) else {
            continue;
        };
        let (t0, _, _, _) = judged[0];
        let (_, q1, _, _) = judged[judged.len() - 1];
        let evidence = queue_evidence(cs, &judged, v.now);
        let waiting = v
            .requests
            .iter()
            .filter(|r| r.x.component == cs.id && View::is_outstanding(r))
            .filter(|r| !v.logical_of(r).probe) // health checks queue nowhere
            .collect::<Vec<_>>();
        if !waiting.is_empty() && waiting.iter().all(|r| explained_elsewhere(v, r, &cs.id)) {
            continue;
        }
        let waiting = super::logical_ids(v, &waiting);
        out.push(Finding {
            kind: FindingKind::QueueNotDraining,
            severity: Severity::Critical,
            component: Some(cs.id.clone()),
            role: Some(cs.role),
            summary: format!(
                "{} has {q1} queued request(s) and 0 running for {}; GPU {}",
                cs.id,
                secs(v.now - t0),
                cs.gpu_activity
            ),
            requests: waiting,
            evidence,
            explanation: Some("Requests wait in the engine's queues (waiting / PD bootstrap / prealloc / transfer) and the scheduler never forms a batch. In PD, check the other leg (KV transfer, bootstrap) and the scheduler's PD queue polling in the stacks.".into()),
        });
    }
    out
}

/// Whether a request waiting at `comp` is another hop's finding: its request is stuck at
/// another hop, or waits here for a prefill leg that failed (`pd_leg_failed` at prefill; a
/// second finding here would blame the engine that only waits).
fn explained_elsewhere(v: &View, r: &RequestView, comp: &str) -> bool {
    let Some(s) = &v.logical_of(r).stuck else {
        return false;
    };
    v.requests[s.leg].x.component != comp || matches!(s.blame, Blame::PrefillFailed(_))
}

/// (time, queued, running, source) of one judged metrics point.
type Judged = (Millis, f64, f64, &'static str);

/// The metrics points of `comp` from the last one at or before `queue_after_ms` ago up to
/// `now` that say something current, when there are at least two and all say "queued,
/// nothing running".
fn judged_stretch(m: &Correlator, comp: &str, now: Millis) -> Option<Vec<Judged>> {
    let hist = m.metrics_history(comp)?;
    let since = now - m.thresholds.detect.queue_after_ms;
    // The last point at or before `since` starts the judged stretch.
    let start = hist.iter().rposition(|p| p.t_ms <= since)?;
    let pts: Vec<_> = hist.iter().skip(start).filter(|p| p.t_ms <= now).collect();
    let judged: Vec<Judged> = pts
        .iter()
        .filter_map(|p| judge_point(p).map(|(q, r, s)| (p.t_ms, q, r, s)))
        .collect();
    if judged.len() < 2 || !judged.iter().all(|(_, q, r, _)| *q > 0.0 && *r == 0.0) {
        return None;
    }
    Some(judged)
}

/// One metrics point's verdict: (queued, running, source), or `None` when it says nothing
/// current.
fn judge_point(p: &MetricsPoint) -> Option<(f64, f64, &'static str)> {
    if let Some(l) = p.loads {
        // A load snapshot no longer republished is old news: no verdict from it (nor
        // from the gauges, frozen the same way).
        let stale = l
            .timestamp_s
            .is_some_and(|ts| p.t_ms as f64 - ts * 1000.0 > LOADS_FRESH_MS);
        if stale {
            return None;
        }
        return Some((
            l.waiting + l.pd_queued - l.pd_bootstrap,
            l.running,
            "v1_loads",
        ));
    }
    // The prefill inflight gauge freezes non-zero on an idle prefill: only /v1/loads is
    // trusted for that queue.
    let q: f64 = std::iter::once("queued")
        .chain(crate::correlate::PD_QUEUE_KEYS)
        .filter(|k| *k != "prefill_inflight_queue" && *k != "prefill_bootstrap_queue")
        .filter_map(|k| p.mapped.get(k))
        .sum();
    let r = p.mapped.get("running").copied()?;
    Some((q, r, "metrics"))
}

/// The judged stretch (from where, how long, how many points), then the engine's GPU, forward
/// time and threads.
fn queue_evidence(cs: &ComponentState, judged: &[Judged], now: Millis) -> Vec<Evidence> {
    let (t0, q0, _, _) = judged[0];
    let (_, q1, _, src) = judged[judged.len() - 1];
    let mut evidence = vec![Evidence::new(
        "metrics",
        format!(
            "queued {q0} -> {q1}, running 0 in all {} points over {} (from {src}{})",
            judged.len(),
            secs(now - t0),
            if src == "metrics" {
                "; gauges may be frozen during a stall, counters agree"
            } else {
                ""
            }
        ),
    )];
    evidence.push(Evidence::new(
        "gpu",
        format!("GPU activity: {}", cs.gpu_activity),
    ));
    if let Some(r) = cs.forward_rate {
        evidence.push(Evidence::new(
            "metrics",
            format!("forward_seconds_total rate {r:.3} s/s"),
        ));
    }
    if let Some(s) = cs.thread_summary() {
        evidence.push(Evidence::new("stacks", s));
    }
    evidence
}
