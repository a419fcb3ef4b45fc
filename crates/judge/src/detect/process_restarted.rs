//! `process_restarted` (warning): a component's main process identity (`pid:start_ticks`)
//! changed within `restart_recent_ms`; children's restarts fold into their engine's. See
//! `process_restarted` in docs/findings.md.
//!
//! Thresholds read: `restart_recent_ms`.

use super::secs;
use crate::correlate::{Correlator, View};
use crate::model::{Evidence, Finding, FindingKind, Severity};

/// `process_restarted`: a component's process changed (pid or start time).
pub fn process_restarted(m: &Correlator, v: &View) -> Vec<Finding> {
    let th = &m.thresholds;
    m.restarts()
        .filter(|r| r.t_ms <= v.now && v.now - r.t_ms <= th.detect.restart_recent_ms)
        .map(|r| {
            let what = match &r.after {
                Some(a) => format!("process {} was replaced by {a}", r.before),
                None => format!("process {} is gone", r.before),
            };
            Finding {
                kind: FindingKind::ProcessRestarted,
                severity: Severity::Warning,
                component: Some(r.component.clone()),
                role: Some(r.role),
                summary: format!("{} restarted {} ago: {what}", r.component, secs(v.now - r.t_ms)),
                requests: Vec::new(),
                evidence: vec![Evidence::new(
                    "processes",
                    format!("identity (pid:start_ticks) {} -> {}", r.before, r.after.as_deref().unwrap_or("none")),
                )],
                explanation: Some("A restart changes more than the pid: compare its environment and command line with the baseline (config_changed). Requests in flight at the restart were lost.".into()),
            }
        })
        .collect()
}
