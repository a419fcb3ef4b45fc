//! `stalled_stream` (critical): a response started, then no byte for as long as its
//! witnesses say (`stall_unanimous_ms` when all agree nothing works on it, up to
//! `stall_after_ms`) while the component still counts it open and does no work; the deepest
//! stalled hop is blamed. The verdict is the correlator's (`correlate::requests`); this
//! detector only words it. See `stalled_stream` in docs/findings.md.
//!
//! Thresholds read: `stall_after_ms` (to word the slow rule; it and `done_quiet_ms` judge in
//! `correlate`).

use super::wedged_request::{judged, MAX_VERDICT_EVIDENCE};
use super::{chain_text, idle_evidence, logical_ids, role_of, secs, stuck_by_component};
use crate::correlate::{Correlator, RequestView, View, Witnesses};
use crate::model::{Evidence, Finding, FindingKind, Severity, StuckKind};

/// `stalled_stream`: the requests the correlator judged stuck with a stopped stream
/// (`correlate::requests`), one finding per component they are stuck at.
pub fn stalled_stream(m: &Correlator, v: &View) -> Vec<Finding> {
    let mut out = Vec::new();
    for (comp, ls) in stuck_by_component(v, StuckKind::StreamStalled) {
        let cs = v.components.get(&comp);
        let role = role_of(m, &comp).unwrap_or(ls[0].x.role);
        let quiet = ls.iter().map(|r| r.idle_out_ms).max().unwrap_or(0);
        let mut words = Vec::new();
        let mut evidence: Vec<Evidence> = ls
            .iter()
            .map(|r| {
                Evidence::new(
                    "sockets",
                    format!(
                        "{} ({}) {} -> {}: {} bytes out, then nothing for {}; path: {}",
                        r.leg,
                        r.x.id,
                        r.x.client,
                        r.x.server,
                        r.x.bytes_out,
                        secs(r.idle_out_ms),
                        chain_text(&v.path(r))
                    ),
                )
            })
            .collect();
        if let Some(cs) = cs {
            let (w, ev) = idle_evidence(cs);
            words.extend(w);
            evidence.extend(ev);
        }
        let judged = judged(v, &ls);
        evidence.extend(
            judged
                .iter()
                .take(MAX_VERDICT_EVIDENCE)
                .map(|(r, w)| verdict_evidence(m, r, w)),
        );
        let judged_on = judged
            .first()
            .map(|(_, w)| {
                let wait = w.stall_wait(&m.thresholds.correlate);
                format!("; judged after {} on {}", secs(wait), w.count_text())
            })
            .unwrap_or_default();
        let n = ls.len();
        out.push(Finding {
            kind: FindingKind::StalledStream,
            severity: Severity::Critical,
            component: Some(comp.clone()),
            role: Some(role),
            summary: format!(
                "{n} response stream{} at {comp} stopped {} ago and {} still open{}{}{judged_on}",
                if n == 1 { "" } else { "s" },
                secs(quiet),
                if n == 1 { "is" } else { "are" },
                if words.is_empty() { "" } else { ": " },
                words.join(", ")
            ),
            requests: logical_ids(v, &ls),
            evidence,
            explanation: Some(format!(
                "{comp} began answering, then stopped sending while it still counts the request as in flight and is not working on it. Check its scheduler and detokenizer stacks; a stream that stops mid-way with an idle engine usually means the request was dropped from the running batch (retraction, abort lost, or an output path stuck)."
            )),
        });
    }
    out
}

/// "r17@decode sent its last byte 10.2 s ago, judged after 10 s on 5/5 witnesses (30 s on
/// less evidence): no byte since the stream's last; GPU idle from +2.0 s (33 readings); ...".
fn verdict_evidence(m: &Correlator, r: &RequestView, w: &Witnesses) -> Evidence {
    let th = &m.thresholds.correlate;
    Evidence::new(
        "verdict",
        format!(
            "{} sent its last byte {} ago, judged after {} on {} ({} on less evidence): {}",
            r.leg,
            secs(r.idle_out_ms),
            secs(w.stall_wait(th)),
            w.count_text(),
            secs(th.stall_after_ms),
            w.text()
        ),
    )
}
