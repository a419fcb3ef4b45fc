//! `busy_without_progress` (critical): an engine with requests open and no response byte for
//! `busy_after_ms` that is busy anyway (GPU spinning, a scheduler in an NCCL collective, or
//! forward time with no token). Rule and what to do: `busy_without_progress` in
//! docs/findings.md.
//!
//! Thresholds read: `busy_after_ms`, `scheduler_min_dumps` (GPU `spinning` comes from
//! `spin_util_pct` / `spin_power_frac` in `correlate`).

use super::secs;
use crate::correlate::blame::SCHEDULER_TOKENS_KEY;
use crate::correlate::GpuActivity;
use crate::correlate::{ComponentState, Correlator, RequestView, View};
use crate::model::{Evidence, Finding, FindingKind, Severity, ThreadState};

/// `busy_without_progress`: the GPU is busy (or spinning in a collective) yet no response
/// bytes move at the component for >= `busy_after_ms`.
pub fn busy_without_progress(m: &Correlator, v: &View) -> Vec<Finding> {
    if !v.sockets_fresh {
        return Vec::new();
    }
    let th = &m.thresholds;
    let mut out = Vec::new();
    for cs in v.components.values().filter(|c| c.role.is_engine()) {
        let mine: Vec<&RequestView> = v
            .requests
            .iter()
            .filter(|r| r.x.component == cs.id)
            .collect();
        let open: Vec<&RequestView> = mine
            .iter()
            .copied()
            .filter(|r| View::is_outstanding(r) && r.age_ms >= th.detect.busy_after_ms)
            .collect();
        if open.is_empty() {
            continue;
        }
        let last_out = mine.iter().filter_map(|r| r.x.last_out_ms).max();
        // Bytes moving are progress, unless the engine's own token counter is flat: then
        // they are answers to health checks and scrapes, not generated tokens.
        let tokens_flat = cs.gen_rate.is_some_and(|r| r <= 0.0);
        if !tokens_flat && last_out.is_some_and(|t| v.now - t < th.detect.busy_after_ms) {
            continue; // bytes are moving: progress
        }
        let Some(busy) = busy_reason(cs, th.detect.scheduler_min_dumps) else {
            continue;
        };
        let quiet = last_out.map_or_else(
            || open.iter().map(|r| r.age_ms).max().unwrap_or(0),
            |t| v.now - t,
        );
        let evidence = busy_evidence(cs, &open);
        out.push(Finding {
            kind: FindingKind::BusyWithoutProgress,
            severity: Severity::Critical,
            component: Some(cs.id.clone()),
            role: Some(cs.role),
            summary: format!(
                "{} is busy ({busy}) but sent no response byte for {} with {} request(s) open",
                cs.id,
                secs(quiet),
                open.len()
            ),
            requests: super::logical_ids(v, &open),
            evidence,
            explanation: Some("Work without output: a hung collective (NCCL/gloo: one rank missing) or a loop that never finishes a batch. Compare all TP ranks' stacks; NCCL RAS or power draw tells a spinning kernel from real compute.".into()),
        });
    }
    out
}

/// What says the engine is busy: a spinning GPU, a scheduler thread in an NCCL collective in
/// every one of at least `min_dumps` dumps, or GPU work / forward time with no token generated.
fn busy_reason(cs: &ComponentState, min_dumps: usize) -> Option<String> {
    let collective = cs.threads.iter().find(|t| {
        t.states.len() >= min_dumps && t.states.iter().all(|s| *s == ThreadState::NcclCollective)
    });
    // Plain "GPU working" with no bytes out is also a long non-streaming generation: only
    // with no token generated (tokens that never reached HTTP are `tokens_undelivered`'s).
    let scheduler_generated = cs
        .metrics
        .get(&format!("{SCHEDULER_TOKENS_KEY}_rate"))
        .is_some_and(|r| *r > 0.0);
    let no_tokens = cs.gen_rate.is_some_and(|r| r <= 0.0) && !scheduler_generated;
    match (cs.gpu_activity, collective) {
        (GpuActivity::Spinning, _) => {
            Some("GPU at high utilization but idle power (kernel spinning)".to_string())
        }
        (_, Some(t)) => Some(format!(
            "scheduler tid {} in an NCCL collective {}",
            t.tid,
            t.dumps_text(t.states.len()),
        )),
        (GpuActivity::Working, _) if no_tokens => {
            Some("GPU working, 0 tokens generated".to_string())
        }
        _ if no_tokens => cs
            .forward_rate
            .filter(|r| *r > 0.01)
            .map(|r| format!("forward time rate {r:.2} s/s, 0 tokens generated")),
        _ => None,
    }
}

/// The GPU's activity, the open requests and the engine's threads.
fn busy_evidence(cs: &ComponentState, open: &[&RequestView]) -> Vec<Evidence> {
    let mut evidence = vec![Evidence::new(
        "gpu",
        format!("GPU activity: {}", cs.gpu_activity),
    )];
    evidence.extend(open.iter().map(|r| {
        Evidence::new(
            "sockets",
            format!(
                "{} {} -> {}: state {}, {} bytes out, age {}",
                r.x.id,
                r.x.client,
                r.x.server,
                r.state.as_str(),
                r.x.bytes_out,
                secs(r.age_ms)
            ),
        )
    }));
    if let Some(s) = cs.thread_summary() {
        evidence.push(Evidence::new("stacks", s));
    }
    evidence
}
