//! `tokens_undelivered` (critical): requests wait for their first byte at an engine whose
//! scheduler generated tokens since they arrived while no byte left its HTTP server on any
//! inference request: the tokens are lost on their way out (detokenizer, tokenizer manager).
//! The verdict is the correlator's (`correlate::blame`). Rule and what to do:
//! `tokens_undelivered` in docs/findings.md.
//!
//! Thresholds read: none directly (the verdict reads `wedged_unanimous_ms`,
//! `wedged_after_ms`).

use super::wedged_request::{age_text, verdicts, waiting_evidence};
use super::{join_states, logical_ids, secs};
use crate::clock::Millis;
use crate::correlate::blame::{Blame, Undelivered};
use crate::correlate::{ComponentState, Correlator, RequestView, View};
use crate::model::{Evidence, Finding, FindingKind, Role, Severity};
use std::collections::BTreeMap;

/// `tokens_undelivered`: requests whose engine generated tokens that never left it, one
/// finding per engine.
pub fn tokens_undelivered(m: &Correlator, v: &View) -> Vec<Finding> {
    let mut by_engine: BTreeMap<&str, Vec<(&RequestView, Undelivered)>> = BTreeMap::new();
    for s in v.stuck().filter_map(|l| l.stuck.as_ref()) {
        if let Blame::Undelivered(u) = s.blame {
            let r = &v.requests[s.leg];
            by_engine
                .entry(r.x.component.as_str())
                .or_default()
                .push((r, u));
        }
    }
    by_engine
        .into_iter()
        .map(|(engine, legs)| finding(m, v, engine, &legs))
        .collect()
}

fn finding(
    m: &Correlator,
    v: &View,
    engine: &str,
    legs: &[(&RequestView, Undelivered)],
) -> Finding {
    let ls: Vec<&RequestView> = legs.iter().map(|(r, _)| *r).collect();
    // The oldest request's figures: everything since it arrived.
    let u = legs
        .iter()
        .max_by_key(|(r, _)| r.age_ms)
        .map(|(_, u)| *u)
        .unwrap_or(legs[0].1);
    let n = ls.len();
    let places = places(m, engine);
    let (judged_on, verdict_evidence) = verdicts(m, v, &ls);
    let mut evidence: Vec<Evidence> = ls.iter().map(|r| waiting_evidence(v, r)).collect();
    evidence.push(Evidence::new("metrics", counts_text(&u)));
    if let Some(cs) = v.components.get(engine) {
        evidence.extend(output_path_evidence(m, cs, v.now));
    }
    evidence.extend(verdict_evidence);
    Finding {
        kind: FindingKind::TokensUndelivered,
        severity: Severity::Critical,
        component: Some(engine.to_string()),
        role: Some(Role::Detokenizer),
        summary: format!(
            "{n} request{} accepted {} at {engine} got no byte although its scheduler generated {:.0} tokens since: they are lost past the scheduler, in {places}{judged_on}",
            if n == 1 { "" } else { "s" },
            age_text(&ls),
            u.tokens,
        ),
        requests: logical_ids(v, &ls),
        evidence,
        explanation: Some(format!(
            "{engine}'s scheduler worked: it generated tokens after these requests arrived, yet its HTTP server sent no byte to any inference request since. The output is lost between the scheduler and the HTTP server: in the detokenizer (token ids to text) or the tokenizer manager (text to each request). Take py-spy dumps of {places} and read the engine's log; the GPU and the scheduler are not the cause, and restarting the engine drops the requests."
        )),
    }
}

/// "its detokenizer (pid 12) or its tokenizer manager (the HTTP process, pid 10)".
fn places(m: &Correlator, engine: &str) -> String {
    let topo = m.topology();
    let detok = topo
        .components
        .iter()
        .find(|c| c.parent.as_deref() == Some(engine) && c.role == Role::Detokenizer)
        .and_then(|c| c.main_pid.or_else(|| c.pids.first().copied()));
    let http = topo.component(engine).and_then(|c| c.main_pid);
    let detok = detok.map(|p| format!(" (pid {p})")).unwrap_or_default();
    let http = http.map(|p| format!(", pid {p}")).unwrap_or_default();
    format!("its detokenizer{detok} or its tokenizer manager (the HTTP process{http})")
}

/// "scheduler generated 8 tokens since the oldest arrived; its HTTP server received 0".
fn counts_text(u: &Undelivered) -> String {
    let received = u
        .received
        .map(|r| {
            format!(
                "; its HTTP server's tokenizer manager received {r:.0} (generation_tokens_total)"
            )
        })
        .unwrap_or_default();
    format!(
        "scheduler generated {:.0} tokens since the oldest arrived (realtime_tokens_total, decode){received}; no inference request at the engine got a response byte since",
        u.tokens
    )
}

/// The detokenizer's thread states, and the GPU's (idle now is no excuse here).
fn output_path_evidence(m: &Correlator, cs: &ComponentState, now: Millis) -> Vec<Evidence> {
    let mut ev = vec![Evidence::new(
        "gpu",
        format!(
            "GPU activity: {} (the scheduler finished its work)",
            cs.gpu_activity
        ),
    )];
    let detok: Vec<i32> = m
        .topology()
        .components
        .iter()
        .filter(|c| c.parent.as_deref() == Some(cs.id.as_str()) && c.role == Role::Detokenizer)
        .flat_map(|c| c.pids.iter().copied())
        .collect();
    for t in cs.threads.iter().filter(|t| detok.contains(&t.pid)) {
        let age = t
            .times
            .last()
            .map(|&at| format!(" ({} ago)", secs(now - at)))
            .unwrap_or_default();
        ev.push(Evidence::new(
            "stacks",
            format!(
                "detokenizer pid {} tid {} ({}): {}; latest stack{age}: {}",
                t.pid,
                t.tid,
                t.name.as_deref().unwrap_or("?"),
                join_states(&t.states),
                t.frames.join(" <- ")
            ),
        ));
    }
    ev
}
