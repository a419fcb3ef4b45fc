//! `endpoint_unresponsive` (warning): the last `endpoint_failures` probes of one URL all
//! failed or took at least `endpoint_slow_ms`. See `endpoint_unresponsive` in
//! docs/findings.md.
//!
//! Thresholds read: `endpoint_failures`, `endpoint_slow_ms`.

use crate::clock::Millis;
use crate::correlate::{probe_failed, Correlator, View};
use crate::model::{Evidence, Finding, FindingKind, Severity};
use std::collections::BTreeMap;

/// `endpoint_unresponsive`: a metrics/health endpoint failed `endpoint_failures` times in a
/// row (or answered slower than `endpoint_slow_ms`).
pub fn endpoint_unresponsive(m: &Correlator, v: &View) -> Vec<Finding> {
    let th = &m.thresholds;
    let mut out = Vec::new();
    for c in &m.topology().components {
        let probes = m.endpoint_probes(&c.id, v.now);
        let mut by_url: BTreeMap<&str, Vec<&(Millis, crate::model::EndpointProbe)>> =
            BTreeMap::new();
        for p in &probes {
            by_url.entry(p.1.url.as_str()).or_default().push(p);
        }
        for (url, ps) in by_url {
            let n = th.detect.endpoint_failures.max(1);
            let tail: Vec<_> = ps.iter().rev().take(n).collect();
            let bad = |p: &crate::model::EndpointProbe| {
                probe_failed(p) || p.elapsed_ms >= th.detect.endpoint_slow_ms
            };
            if tail.len() < n || !tail.iter().all(|p| bad(&p.1)) {
                continue;
            }
            let last = &tail[0].1;
            let what = match last.outcome {
                crate::model::FetchOutcome::Timeout => {
                    format!("timed out after {} ms", last.elapsed_ms)
                }
                crate::model::FetchOutcome::Refused => "refused the connection".to_string(),
                crate::model::FetchOutcome::HttpError => {
                    format!("answered HTTP {}", last.http_status.unwrap_or(0))
                }
                crate::model::FetchOutcome::Ok | crate::model::FetchOutcome::TooLarge => {
                    format!("took {} ms", last.elapsed_ms)
                }
                crate::model::FetchOutcome::Error => {
                    format!("failed: {}", last.detail.as_deref().unwrap_or("error"))
                }
            };
            out.push(Finding {
                kind: FindingKind::EndpointUnresponsive,
                severity: Severity::Warning,
                component: Some(c.id.clone()),
                role: Some(c.role),
                summary: format!("{} endpoint {url} {what} ({n} probes in a row)", c.id),
                requests: Vec::new(),
                evidence: tail
                    .iter()
                    .map(|p| Evidence::new("metrics", format!("{} {:?} {} ms {}", p.1.url, p.1.outcome, p.1.elapsed_ms, p.1.detail.as_deref().unwrap_or(""))))
                    .collect(),
                explanation: Some("An endpoint that stops answering is itself a symptom: the HTTP server's event loop is blocked, or an endpoint that calls into the scheduler waits on a stuck scheduler. Metrics from it are missing, not zero.".into()),
            });
        }
    }
    out
}
