//! Logical requests and their verdicts again, over the merged exchanges.
//!
//! The legs are grouped again along every link (cross-node ones included); a stuck leg whose
//! request went on to another node where it is still open is *superseded* (its node could
//! not see further). Of the rest, the leg blamed follows the correlator's rules
//! (`StuckKind::blame_key`, `correlate::pd_cause`); without one, `Verdict::of_unstuck`. The
//! long version: docs/fleet.md "Merge".

use super::flat::Flat;
use crate::correlate::pd_cause;
use crate::model::{LogicalRequest, Role, StuckKind, Verdict};

/// The merged logical requests (and each exchange's new `request` and `leg`), from the
/// nodes' own verdicts (`Flat::stuck`, `Flat::probe`); with each one's stuck leg.
pub fn regroup(flat: &mut Flat) -> (Vec<LogicalRequest>, Vec<Option<usize>>) {
    let mut stuck: Vec<Option<StuckKind>> = vec![None; flat.requests.len()];
    for &(i, k) in &flat.stuck {
        stuck[i] = Some(k);
    }
    let groups = group(flat);
    let mut out = Vec::with_capacity(groups.len());
    let mut blamed_legs = Vec::with_capacity(groups.len());
    for legs in groups {
        let entry = &flat.requests[legs[0]].id;
        let num = entry.replacen("/x", "/r", 1);
        let id = if num == *entry {
            format!("r-{num}")
        } else {
            num
        };
        name_legs(flat, &id, &legs);
        let blamed = blame(flat, &legs, &stuck);
        let mut l = logical(flat, id, &legs, blamed);
        l.probe = legs.iter().any(|&i| flat.probe[i]);
        out.push(l);
        blamed_legs.push(blamed.map(|(i, _)| i));
    }
    (out, blamed_legs)
}

/// Legs of each request, its entry first (exchanges of a request only: idle connections
/// are none).
fn group(flat: &Flat) -> Vec<Vec<usize>> {
    let n = flat.requests.len();
    let mut has_parent = vec![false; n];
    for c in &flat.children {
        for &j in c {
            has_parent[j] = true;
        }
    }
    let in_request = |i: usize| flat.requests[i].request.is_some();
    let mut seen = vec![false; n];
    let mut out = Vec::new();
    let starts = (0..n).filter(|&i| !has_parent[i]).chain(0..n);
    for s in starts {
        if seen[s] || !in_request(s) {
            continue;
        }
        seen[s] = true;
        let mut legs = vec![s];
        let mut k = 0;
        while k < legs.len() {
            for &j in &flat.children[legs[k]] {
                if !seen[j] {
                    seen[j] = true;
                    legs.push(j);
                }
            }
            k += 1;
        }
        out.push(legs);
    }
    out
}

fn name_legs(flat: &mut Flat, id: &str, legs: &[usize]) {
    let mut count = [0usize; 16];
    for &i in legs {
        let r = &mut flat.requests[i];
        let role = r.role.unwrap_or(Role::Other);
        let k = count.get_mut(role as usize).map_or(1, |k| {
            *k += 1;
            *k
        });
        let name = role.as_str();
        let mut leg = String::with_capacity(id.len() + name.len() + 4);
        leg.push_str(id);
        leg.push('@');
        leg.push_str(name);
        if k > 1 {
            leg.push('.');
            leg.push_str(&k.to_string());
        }
        r.request = Some(id.to_string());
        r.leg = Some(leg);
    }
}

/// Whether leg `i` forwarded to another node where its request is still open, or on a
/// connection whose client socket has had no byte back since.
fn superseded(flat: &Flat, i: usize) -> bool {
    flat.unanswered[i]
        || flat.children[i]
            .iter()
            .any(|&j| flat.node[j] != flat.node[i] && flat.requests[j].state.is_open())
}

/// The leg the request is stuck at, if any.
fn blame(flat: &Flat, legs: &[usize], stuck: &[Option<StuckKind>]) -> Option<(usize, StuckKind)> {
    let mut c: Vec<(usize, StuckKind)> = legs
        .iter()
        .filter_map(|&i| stuck[i].map(|k| (i, k)))
        .filter(|&(i, _)| !superseded(flat, i))
        .collect();
    let role = |i: usize| flat.requests[i].role.unwrap_or(Role::Other);
    let both_pd_legs = [Role::Prefill, Role::Decode].iter().all(|want| {
        c.iter()
            .any(|&(i, k)| k == StuckKind::NoResponse && role(i) == *want)
    });
    if both_pd_legs {
        // Each node judged its own leg; a node's bootstrap queue does not reach the merge,
        // so the rule is read without it (a node that saw both legs applied it whole).
        let consequence = match pd_cause(false) {
            Role::Prefill => Role::Decode,
            _ => Role::Prefill,
        };
        c.retain(|&(i, _)| role(i) != consequence);
    }
    c.sort_by_key(|&(i, k)| k.blame_key(role(i)));
    c.first().copied()
}

fn logical(
    flat: &Flat,
    id: String,
    legs: &[usize],
    blamed: Option<(usize, StuckKind)>,
) -> LogicalRequest {
    let r = |i: usize| &flat.requests[i];
    let verdict = match blamed {
        Some(_) => Verdict::Stuck,
        None => Verdict::of_unstuck(legs.iter().map(|&i| r(i).state)),
    };
    let entry = r(legs[0]);
    LogicalRequest {
        id,
        legs: legs.iter().map(|&i| r(i).id.clone()).collect(),
        verdict,
        component: entry.component.clone(),
        age_ms: entry.age_ms,
        probe: false,
        stuck_leg: blamed.and_then(|(i, _)| r(i).leg.clone()),
        stuck_at: blamed.map(|(i, _)| r(i).component.clone()),
        stuck_role: blamed.and_then(|(i, _)| r(i).role),
        stuck_kind: blamed.map(|(_, k)| k),
        waiting_reason: None,
        waiting_leg: None,
    }
}
