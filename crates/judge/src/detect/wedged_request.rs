//! `wedged_request` (critical; warning when there is no activity data at all): a request
//! waited for its first response byte as long as its witnesses say and the deepest hop
//! holding it does no work for it (or, on a busy engine, did nothing since it arrived or let
//! later requests overtake it). Which requests are stuck is the correlator's verdict
//! (`correlate::requests`); this detector groups them by hop and words the finding, so its
//! count and ids are the report's and the TUI's. Rule and what to do: `wedged_request` in
//! docs/findings.md.
//!
//! Thresholds read: none directly (the verdict reads `wedged_after_ms`,
//! `wedged_unanimous_ms`, `wedged_overtaken_min` and, through the component state,
//! `rate_window_ms`).

use super::{chain_text, idle_evidence, logical_ids, role_of, secs, stuck_by_component};
use crate::correlate::{
    signals_text, BusyNote, ComponentState, Correlator, RequestView, View, Witnesses,
};
use crate::model::{Evidence, Finding, FindingKind, Role, Severity, StuckKind};

/// `wedged_request`: the requests the correlator judged stuck without a response byte, one
/// finding per hop they are stuck at.
pub fn wedged_request(m: &Correlator, v: &View) -> Vec<Finding> {
    let mut out = Vec::new();
    for (comp, ls) in stuck_by_component(v, StuckKind::NoResponse) {
        let consequences: Vec<&RequestView> = ls
            .iter()
            .filter_map(|r| v.logical_of(r).stuck.as_ref())
            .flat_map(|s| s.consequences.iter().map(|&i| &v.requests[i]))
            .collect();
        let busy = ls
            .first()
            .and_then(|r| v.logical_of(r).stuck.as_ref())
            .and_then(|s| s.busy.as_ref());
        let stuck = Stuck {
            comp: &comp,
            cs: v.components.get(&comp),
            ls: &ls,
            skipped_note: busy.map(busy_note),
        };
        out.push(stuck.finding(m, v, &consequences));
    }
    out
}

/// Why a busy engine is blamed anyway, in words.
fn busy_note(b: &BusyNote) -> String {
    match b {
        BusyNote::NothingSince { earlier } => format!(
            "no token generated and no forward time since they arrived (earlier: {})",
            signals_text(earlier)
        ),
        BusyNote::Overtaken { n, working } => format!(
            "{n} later requests answered meanwhile although the engine is busy ({})",
            signals_text(working)
        ),
    }
}

/// The requests found stuck at one component, and why a busy engine is blamed anyway.
struct Stuck<'a> {
    comp: &'a str,
    cs: Option<&'a ComponentState>,
    ls: &'a [&'a RequestView],
    skipped_note: Option<String>,
}

impl Stuck<'_> {
    /// The finding, its decode legs listed as consequences.
    fn finding(self, m: &Correlator, v: &View, consequences: &[&RequestView]) -> Finding {
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
        evidence.extend(consequences.iter().map(|d| pd_leg_evidence(d)));
        let judged = judged(v, ls);
        evidence.extend(
            judged
                .iter()
                .take(MAX_VERDICT_EVIDENCE)
                .map(|(r, w)| verdict_evidence(m, v, r, w)),
        );
        if !role.is_engine() {
            words.push("no request forwarded to the next hop".to_string());
        }
        let n = ls.len();
        let judged_on = judged_on(m, judged.first().map(|(_, w)| *w));
        let summary = format!(
            "{n} request{} accepted {} {} stuck at {comp}: {}{judged_on}",
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
            requests: logical_ids(v, ls),
            evidence,
            explanation: Some(format!(
                "The request reached {comp} ({role}) and nothing came back, while {comp} shows no work for it: it was accepted and forgotten there, not upstream (every hop above is only waiting for it). Look at {comp}: its scheduler stacks, its queues (/v1/loads), and what changed in its environment or command line (config_changed). Restarting proxies only hides it."
            )),
        }
    }
}

/// At most this many stuck legs have their witnesses listed one by one.
pub(super) const MAX_VERDICT_EVIDENCE: usize = 5;

/// What stuck legs were judged on: "; judged after 10 s on 5/5 witnesses" (the first
/// judged one's, for a summary), and each one's witnesses (the first
/// [`MAX_VERDICT_EVIDENCE`]).
pub(super) fn verdicts(m: &Correlator, v: &View, ls: &[&RequestView]) -> (String, Vec<Evidence>) {
    let judged = judged(v, ls);
    let evidence = judged
        .iter()
        .take(MAX_VERDICT_EVIDENCE)
        .map(|(r, w)| verdict_evidence(m, v, r, w))
        .collect();
    (judged_on(m, judged.first().map(|(_, w)| *w)), evidence)
}

/// "; judged after 10 s on 5/5 witnesses", of a stuck leg's witnesses (none: "").
pub(super) fn judged_on(m: &Correlator, w: Option<&Witnesses>) -> String {
    w.map(|w| {
        format!(
            "; judged after {} on {}",
            secs(w.wedged_wait(&m.thresholds.correlate)),
            w.count_text()
        )
    })
    .unwrap_or_default()
}

/// The legs of `ls` judged stuck, each with the witnesses it was judged on.
pub(super) fn judged<'a>(
    v: &'a View,
    ls: &[&'a RequestView],
) -> Vec<(&'a RequestView, &'a Witnesses)> {
    ls.iter()
        .filter_map(|r| Some((*r, witnesses_of(v, r)?)))
        .collect()
}

/// The witnesses a stuck leg was judged on.
pub(super) fn witnesses_of<'a>(v: &'a View, r: &RequestView) -> Option<&'a Witnesses> {
    v.logical_of(r).stuck.as_ref()?.witnesses.as_ref()
}

/// "r17@decode waited 10.2 s since its last request byte, judged after 10 s on 5/5
/// witnesses (30 s on less evidence): no response byte since it arrived; GPU idle from
/// +2.0 s (33 readings); ...".
pub(super) fn verdict_evidence(
    m: &Correlator,
    v: &View,
    r: &RequestView,
    w: &Witnesses,
) -> Evidence {
    let th = &m.thresholds.correlate;
    Evidence::new(
        "verdict",
        format!(
            "{} waited {} since its last request byte, judged after {} on {} ({} on less \
             evidence): {}",
            r.leg,
            secs(v.now - w.arrived_ms),
            secs(w.wedged_wait(th)),
            w.count_text(),
            secs(th.wedged_after_ms),
            w.text()
        ),
    )
}

/// "42 s ago", or "31 s-94 s ago" when the waits differ by more than 5 s.
pub(super) fn age_text(ls: &[&RequestView]) -> String {
    let oldest = ls.iter().map(|r| r.age_ms).max().unwrap_or(0);
    let youngest = ls.iter().map(|r| r.age_ms).min().unwrap_or(0);
    if oldest - youngest > 5_000 {
        format!("{}-{} ago", secs(youngest), secs(oldest))
    } else {
        format!("{} ago", secs(oldest))
    }
}

/// One waiting request: its socket, bytes and age, and the path of hops down to it.
pub(super) fn waiting_evidence(v: &View, r: &RequestView) -> Evidence {
    Evidence::new(
        "sockets",
        format!(
            "{} ({}) {} -> {}: {} bytes in, {}, waiting {}{}; path: {}",
            r.leg,
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
            chain_text(&v.path(r))
        ),
    )
}

/// The other PD leg of a stuck request, waiting because of it.
fn pd_leg_evidence(d: &RequestView) -> Evidence {
    let why = match d.x.role {
        Role::Prefill => {
            "it holds the request in its bootstrap queue until this decode connects for it, \
             which it never did"
        }
        _ => "it needs the KV cache from this prefill",
    };
    Evidence::new(
        "sockets",
        format!(
            "{} leg {} ({}) at {} waits too ({}): {why}",
            d.x.role,
            d.leg,
            d.x.id,
            d.x.component,
            secs(d.age_ms)
        ),
    )
}
