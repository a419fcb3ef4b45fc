//! `pd_leg_failed` (critical): a PD request's decode leg waits for KV its prefill leg will
//! never send, since that leg already ended with an error (`correlate::blame`). One finding
//! per prefill engine. Rule and what to do: `pd_leg_failed` in docs/findings.md.
//!
//! Thresholds read: none directly (the verdict reads `wedged_unanimous_ms`,
//! `wedged_after_ms`).

use super::wedged_request::{age_text, verdicts, waiting_evidence};
use super::{logical_ids, secs};
use crate::correlate::blame::{answer_size_unknown, Blame, FailedLeg, LegFailure};
use crate::correlate::{Correlator, RequestView, View};
use crate::model::{Evidence, Finding, FindingKind, RequestState, Role, Severity};
use std::collections::BTreeMap;

/// `pd_leg_failed`: decode legs waiting for KV from a prefill leg that failed, one finding
/// per prefill engine.
pub fn pd_leg_failed(m: &Correlator, v: &View) -> Vec<Finding> {
    let mut by_prefill: BTreeMap<&str, Vec<(&RequestView, &FailedLeg)>> = BTreeMap::new();
    for s in v.stuck().filter_map(|l| l.stuck.as_ref()) {
        if let Blame::PrefillFailed(f) = &s.blame {
            let prefill = f.prefill.as_str();
            by_prefill
                .entry(prefill)
                .or_default()
                .push((&v.requests[s.leg], f));
        }
    }
    by_prefill
        .into_iter()
        .map(|(prefill, legs)| finding(m, v, prefill, &legs))
        .collect()
}

fn finding(
    m: &Correlator,
    v: &View,
    prefill: &str,
    legs: &[(&RequestView, &FailedLeg)],
) -> Finding {
    let decode_legs: Vec<&RequestView> = legs.iter().map(|(d, _)| *d).collect();
    let (judged_on, verdict_evidence) = verdicts(m, v, &decode_legs);
    let mut evidence = evidence(v, legs);
    evidence.extend(verdict_evidence);
    let n = legs.len();
    let decode = hops(decode_legs.iter().map(|d| d.x.component.as_str()));
    let routers = hops(decode_legs.iter().filter_map(|d| holder(v, d)));
    let plural = if n == 1 { "" } else { "s" };
    let holders = if routers.is_empty() {
        "the router".to_string()
    } else {
        routers
    };
    Finding {
        kind: FindingKind::PdLegFailed,
        severity: Severity::Critical,
        component: Some(prefill.to_string()),
        role: Some(Role::Prefill),
        summary: format!(
            "{n} PD request{plural} failed at {prefill} ({}) and {} at {decode} for KV that will not come, accepted {}; {holders} holds the client{plural}{judged_on}",
            failures_text(legs),
            if n == 1 { "waits" } else { "wait" },
            age_text(&decode_legs),
        ),
        requests: logical_ids(v, &decode_legs),
        evidence,
        explanation: Some(format!(
            "The prefill leg of each request ended with an error at {prefill}, so its KV cache will never be sent; the decode engine holds the request waiting for it (until SGLANG_DISAGGREGATION_WAITING_TIMEOUT, 300 s by default), and the router, which answers the client only from decode, holds the client as long. Read {prefill}'s log for the error it answered; restarting decode or the router only drops the waiting requests."
        )),
    }
}

/// Each request's prefill leg and waiting decode leg, the prefill's error count, and what
/// decode holds.
fn evidence(v: &View, legs: &[(&RequestView, &FailedLeg)]) -> Vec<Evidence> {
    let mut evidence = Vec::new();
    for (d, f) in legs {
        evidence.push(prefill_evidence(v, f));
        evidence.push(waiting_evidence(v, d));
    }
    evidence.extend(errors_evidence(legs));
    let decode = legs
        .first()
        .and_then(|(d, _)| v.components.get(&d.x.component));
    if let Some((cs, (q, src))) = decode.and_then(|cs| Some((cs, cs.queued?))) {
        evidence.push(Evidence::new(
            "metrics",
            format!("{} queued {q} from {src} (waiting for KV)", cs.id),
        ));
    }
    evidence
}

/// The distinct hops of a list, joined: "decode@..., decode2@...".
fn hops<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let mut seen: Vec<&str> = Vec::new();
    for n in names {
        if !seen.contains(&n) {
            seen.push(n);
        }
    }
    seen.join(", ")
}

/// The hop holding the client of a decode leg: its parent (the router's exchange).
fn holder<'a>(v: &'a View, d: &RequestView) -> Option<&'a str> {
    let p = v.request_by_num(d.x.parent?)?;
    Some(p.x.component.as_str())
}

/// "connection closed without an answer", "answered an error", or both.
fn failures_text(legs: &[(&RequestView, &FailedLeg)]) -> String {
    let closed = legs.iter().any(|(_, f)| f.how == LegFailure::Closed);
    let answered = legs.iter().any(|(_, f)| f.how != LegFailure::Closed);
    match (closed, answered) {
        (true, true) => "answered an error or closed the connection without an answer",
        (true, false) => "closed the connection without an answer",
        _ => "answered an error",
    }
    .to_string()
}

/// The prefill leg: what it sent and how it ended.
fn prefill_evidence(v: &View, f: &FailedLeg) -> Evidence {
    let Some(p) = f.leg.map(|i| &v.requests[i]) else {
        return Evidence::new(
            "sockets",
            format!(
                "prefill leg to {}: not seen on a socket (answered and closed between two samples); its error is the engine's own count",
                f.prefill
            ),
        );
    };
    let how = match f.how {
        LegFailure::Closed => "closed before any answer".to_string(),
        _ if p.state == RequestState::Closed => {
            "closed with its answer unseen (sent between two socket samples)".to_string()
        }
        _ if answer_size_unknown(&p.x) => {
            "answered in one burst (already answered when first seen)".to_string()
        }
        _ => format!("answered {} bytes in one burst", p.x.bytes_out),
    };
    let ended =
        p.x.end_ms()
            .map(|t| format!(", ended {} ago", secs(v.now - t)))
            .unwrap_or_default();
    Evidence::new(
        "sockets",
        format!(
            "prefill leg {} ({}) {} -> {}: {} bytes in, {how}{ended}",
            p.leg, p.x.id, p.x.client, p.x.server, p.x.bytes_in
        ),
    )
}

/// What the prefill engine's own error count says (the largest figure of the legs').
fn errors_evidence(legs: &[(&RequestView, &FailedLeg)]) -> Option<Evidence> {
    let mut during: Option<f64> = None;
    let mut since_start: Option<f64> = None;
    for (_, f) in legs {
        match f.how {
            LegFailure::ErrorStatus { n } => during = Some(during.unwrap_or(0.0).max(n)),
            LegFailure::ErrorsSinceStart { n } => {
                since_start = Some(since_start.unwrap_or(0.0).max(n))
            }
            LegFailure::Closed => {}
        }
    }
    let text = match (during, since_start) {
        (Some(n), _) => format!(
            "prefill counted {n:.0} inference answer(s) with an error status (4xx/5xx) since these requests arrived"
        ),
        (None, Some(n)) => format!(
            "prefill has answered {n:.0} inference request(s) with an error status (4xx/5xx) since it started"
        ),
        (None, None) => return None,
    };
    Some(Evidence::new("metrics", text))
}
