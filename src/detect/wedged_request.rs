//! `wedged_request` (critical; warning when there is no activity data at all).
//!
//! Fires when a request has waited `wedged_after_ms` for its first response byte and the
//! deepest hop holding it does no work for it (no GPU work, no forward time, no tokens, no
//! scheduler thread running a batch, GPU not spinning). On a busy engine it fires anyway when
//! the engine's work counters have not moved since the request arrived, or when at least
//! `wedged_overtaken_min` later, comparable requests from the same upstream hop were answered
//! meanwhile (it was skipped, not queued). In PD, when both legs wait, the prefill leg is blamed
//! and the decode leg is listed as its consequence.
//!
//! What to do: look at the blamed engine, not the proxies (restarting a proxy only drops the
//! waiting client): its scheduler stacks, `/v1/loads`, and what changed in its environment or
//! command line (`config_changed`).
//!
//! Thresholds read: `wedged_after_ms`, `wedged_overtaken_min` (and, through the component
//! state, `rate_window_ms`).

use super::{
    chain, chain_text, downstream_open, group_by_component, idle_evidence, ids_with_ancestors,
    outstanding_child, role_of, secs,
};
use crate::clock::Millis;
use crate::correlate::{ComponentState, Model, RequestView, View};
use crate::model::{Evidence, Finding, FindingKind, RequestState, Role, Severity};
use std::collections::BTreeSet;

/// After a request arrives, counters may still move for this long from batches already
/// under way (and the metrics scrape lags by up to a second).
const WORK_SETTLE_MS: Millis = 2000;

/// Whether the engine's own work counters (`generation_tokens_total`,
/// `forward_seconds_total`) stayed flat between `since` and `now`: `None` without at least
/// two scrapes carrying one of them in that stretch.
fn counters_flat_since(m: &Model, comp: &str, since: Millis, now: Millis) -> Option<bool> {
    let hist = m.metrics_history(comp)?;
    let pts: Vec<_> = hist
        .iter()
        .filter(|p| p.t_ms >= since && p.t_ms <= now)
        .collect();
    let (first, last) = (pts.first()?, pts.last()?);
    if pts.len() < 2 || last.t_ms - first.t_ms < 1000 {
        return None;
    }
    let mut known = false;
    for (key, tolerance) in [
        ("generation_tokens_total", 0.0),
        ("forward_seconds_total", 0.01),
    ] {
        if let (Some(a), Some(b)) = (first.mapped.get(key), last.mapped.get(key)) {
            known = true;
            if b - a > tolerance {
                return Some(false);
            }
        }
    }
    known.then_some(true)
}

/// Smallest request (bytes) that counts as "a later request answered meanwhile" when the
/// waiting request's own size is unknown: health checks and scrapes are smaller than this.
const OVERTAKE_MIN_BYTES_IN: u64 = 256;

/// `wedged_request`: accepted, no response byte for >= `wedged_after_ms`, and the deepest
/// hop holding it does no work. Names the deepest hop.
pub fn wedged_request(m: &Model, v: &View) -> Vec<Finding> {
    if !v.sockets_fresh {
        return Vec::new();
    }
    let (leaves, consequences) = split_off_decode_legs(waiting_leaves(m, v));
    let mut out = Vec::new();
    for (comp, ls) in group_by_component(leaves) {
        let cs = v.components.get(&comp);
        let Some(ls) = drop_excused(cs, ls) else {
            continue;
        };
        let (ls, skipped_note) = match cs {
            Some(cs) => match judge_busy_engine(m, v, &comp, cs, ls) {
                Some(judged) => judged,
                None => continue,
            },
            None => (ls, None),
        };
        let stuck = Stuck {
            comp: &comp,
            cs,
            ls: &ls,
            skipped_note,
        };
        out.push(stuck.finding(m, v, &consequences));
    }
    out
}

/// Step 1: requests waiting for their first byte for `wedged_after_ms` at the deepest hop
/// holding them (no outstanding child; a proxy/router only if nothing it sent downstream is
/// open).
fn waiting_leaves<'a>(m: &Model, v: &'a View) -> Vec<&'a RequestView> {
    let th = &m.thresholds;
    v.requests
        .iter()
        .filter(|r| r.state == RequestState::WaitingFirstByte && r.age_ms >= th.wedged_after_ms)
        // A hung probe from outside the stack is endpoint_unresponsive's, not a forgotten
        // inference request.
        .filter(|r| !(r.x.client_component.is_none() && crate::correlate::is_probe_sized(&r.x)))
        .filter(|r| outstanding_child(v, r).is_none())
        .filter(|r| r.x.role.is_engine() || !downstream_open(v, &r.x.component))
        .collect()
}

/// Step 2 (PD): when both legs of one request wait, the prefill leg is the cause (the decode
/// leg needs its KV cache); the decode leg is reported with it, not on its own. Returns the
/// leaves to judge and the decode legs set aside as consequences.
fn split_off_decode_legs(mut leaves: Vec<&RequestView>) -> (Vec<&RequestView>, Vec<&RequestView>) {
    let prefill_parents: BTreeSet<String> = leaves
        .iter()
        .filter(|r| r.x.role == Role::Prefill)
        .filter_map(|r| r.x.parent.clone())
        .collect();
    let mut consequences: Vec<&RequestView> = Vec::new();
    leaves.retain(|r| {
        let dependent = r.x.role == Role::Decode
            && r.x
                .parent
                .as_ref()
                .is_some_and(|p| prefill_parents.contains(p));
        if dependent {
            consequences.push(r);
        }
        !dependent
    });
    (leaves, consequences)
}

/// Step 3: drops what is another detector's or no inference request at all; `None` when
/// nothing is left at this component.
fn drop_excused<'a>(
    cs: Option<&ComponentState>,
    mut ls: Vec<&'a RequestView>,
) -> Option<Vec<&'a RequestView>> {
    if let Some(cs) = cs {
        // A spinning GPU is busy_without_progress's case, not a forgotten request.
        if cs.gpu_activity == "spinning" {
            return None;
        }
        // The engine counts its open inference requests and says none: a waiting
        // request from outside the stack (someone's hung probe of a non-inference
        // endpoint) is not a forgotten inference request.
        if cs.role.is_engine() && cs.http_active == Some(0.0) {
            ls.retain(|r| r.x.client_component.is_some());
            if ls.is_empty() {
                return None;
            }
        }
    }
    Some(ls)
}

/// Requests that arrived later at the same component, from the same upstream hop, of
/// comparable size (so the upstream's health checks and metrics scrapes do not count), and
/// were answered meanwhile. (Whole history, not only the window: they may have finished long
/// ago.)
fn overtaken(m: &Model, r: &RequestView) -> usize {
    let min_in = if r.x.bytes_in > 0 {
        r.x.bytes_in / 2
    } else {
        OVERTAKE_MIN_BYTES_IN
    };
    m.exchanges()
        .filter(|o| o.component == r.x.component && o.request_ms > r.x.request_ms + 1000)
        .filter(|o| o.client_component == r.x.client_component)
        .filter(|o| o.bytes_in >= min_in)
        .filter(|o| o.answered())
        .count()
}

/// Step 4: busy engines are usually slow, not forgetful. On an engine with work evidence,
/// keeps only the requests it did nothing for since they arrived, or else those skipped by at
/// least `wedged_overtaken_min` later ones, with a note saying which; `None` when none is
/// left. An engine without work evidence keeps all of them, without a note.
fn judge_busy_engine<'a>(
    m: &Model,
    v: &View,
    comp: &str,
    cs: &ComponentState,
    mut ls: Vec<&'a RequestView>,
) -> Option<(Vec<&'a RequestView>, Option<String>)> {
    let working = cs.working_evidence();
    if working.is_empty() {
        return Some((ls, None));
    }
    // The rates behind "working" span `rate_window_ms`: tokens generated for other
    // requests just before these arrived are no work for these. An engine whose
    // counters have not moved since a request arrived (and whose GPU and scheduler
    // are not working now) did nothing for it.
    let working_now =
        cs.gpu_activity == "working" || working.iter().any(|w| w.contains("running a batch"));
    let idle_since: Vec<&RequestView> = if working_now {
        Vec::new()
    } else {
        ls.iter()
            .copied()
            .filter(|r| {
                counters_flat_since(m, comp, r.x.request_ms + WORK_SETTLE_MS, v.now) == Some(true)
            })
            .collect()
    };
    if !idle_since.is_empty() {
        let note = format!(
            "no token generated and no forward time since they arrived (earlier: {})",
            working.join(", ")
        );
        return Some((idle_since, Some(note)));
    }
    // Unless later requests were served while these waited.
    ls.retain(|r| overtaken(m, r) >= m.thresholds.wedged_overtaken_min);
    if ls.is_empty() {
        return None;
    }
    let n = ls.iter().map(|r| overtaken(m, r)).min().unwrap_or(0);
    let note = format!(
        "{n} later requests answered meanwhile although the engine is busy ({})",
        working.join(", ")
    );
    Some((ls, Some(note)))
}

/// The requests found stuck at one component, and why a busy engine is blamed anyway.
struct Stuck<'a> {
    comp: &'a str,
    cs: Option<&'a ComponentState>,
    ls: &'a [&'a RequestView],
    skipped_note: Option<String>,
}

impl Stuck<'_> {
    /// Step 5: the finding, its decode legs listed as consequences.
    fn finding(self, m: &Model, v: &View, consequences: &[&RequestView]) -> Finding {
        let comp = self.comp;
        let ls = self.ls;
        let role = role_of(m, comp).unwrap_or(ls[0].x.role);
        let mut words = vec![if ls.iter().all(|r| r.x.headers_only()) {
            "response headers only, no body byte".to_string()
        } else {
            "no response byte".to_string()
        }];
        let mut evidence: Vec<Evidence> = ls.iter().map(|r| waiting_evidence(v, r)).collect();
        let has_idle_data = if let Some(note) = self.skipped_note {
            words.push(note.clone());
            evidence.push(Evidence::new("sockets", note));
            true
        } else if let Some(cs) = self.cs {
            let (w, ev) = idle_evidence(cs);
            let has = !w.is_empty();
            words.extend(w);
            evidence.extend(ev);
            has
        } else {
            false
        };
        let deps = dependent_decode_legs(consequences, ls);
        evidence.extend(deps.iter().map(|d| decode_leg_evidence(d)));
        if !role.is_engine() {
            words.push("no request forwarded to the next hop".to_string());
        }
        let n = ls.len();
        let summary = format!(
            "{n} request{} accepted {} {} stuck at {comp}: {}",
            if n == 1 { "" } else { "s" },
            age_text(ls),
            if n == 1 { "is" } else { "are" },
            words.join(", ")
        );
        Finding {
            kind: FindingKind::WedgedRequest,
            severity: if has_idle_data || !role.is_engine() {
                Severity::Critical
            } else {
                Severity::Warning
            },
            component: Some(comp.to_string()),
            role: Some(role),
            summary,
            requests: {
                let mut all = ls.to_vec();
                all.extend(deps.iter().copied());
                ids_with_ancestors(v, &all)
            },
            evidence,
            explanation: Some(format!(
                "The request reached {comp} ({role}) and nothing came back, while {comp} shows no work for it: it was accepted and forgotten there, not upstream (every hop above is only waiting for it). Look at {comp}: its scheduler stacks, its queues (/v1/loads), and what changed in its environment or command line (config_changed). Restarting proxies only hides it."
            )),
        }
    }
}

/// "42 s ago", or "31 s-94 s ago" when the waits differ by more than 5 s.
fn age_text(ls: &[&RequestView]) -> String {
    let oldest = ls.iter().map(|r| r.age_ms).max().unwrap_or(0);
    let youngest = ls.iter().map(|r| r.age_ms).min().unwrap_or(0);
    if oldest - youngest > 5_000 {
        format!("{}-{} ago", secs(youngest), secs(oldest))
    } else {
        format!("{} ago", secs(oldest))
    }
}

/// One waiting request: its socket, bytes and age, and the path of hops down to it.
fn waiting_evidence(v: &View, r: &RequestView) -> Evidence {
    Evidence::new(
        "sockets",
        format!(
            "{} {} -> {}: {} bytes in, {}, waiting {}{}; path: {}",
            r.x.id,
            r.x.client,
            r.x.server,
            r.x.bytes_in,
            r.x.out_text(),
            secs(r.age_ms),
            if r.x.seen_mid_flight {
                " (age from tcp_info last_data_recv)"
            } else {
                ""
            },
            chain_text(&chain(v, r))
        ),
    )
}

/// The decode legs set aside in step 2 whose prefill leg (same parent) is among `ls`.
fn dependent_decode_legs<'a>(
    consequences: &[&'a RequestView],
    ls: &[&RequestView],
) -> Vec<&'a RequestView> {
    consequences
        .iter()
        .copied()
        .filter(|d| {
            ls.iter()
                .any(|l| l.x.parent.is_some() && l.x.parent == d.x.parent)
        })
        .collect()
}

fn decode_leg_evidence(d: &RequestView) -> Evidence {
    Evidence::new(
        "sockets",
        format!(
            "decode leg {} at {} waits too ({}): it needs the KV cache from this prefill",
            d.x.id,
            d.x.component,
            secs(d.age_ms)
        ),
    )
}
