//! Hop linking: the exchange a proxy or router receives is linked to the exchange(s) it
//! causes at the next hop.
//!
//! Which component is the client of a connection is exact: the client's socket is the same
//! 4-tuple reversed, and its pid maps to a component. Which *exchange* on that client caused
//! which exchange at the server is inferred by timing (the child's request bytes arrive within
//! `link_window_ms` after the parent's) and byte counts (a forwarded body is about as large as
//! the one received; the PD router adds ~100 bytes of bootstrap fields). Each child has at
//! most one parent; a parent has at most one child per downstream component (PD: one at the
//! prefill, one at the decode engine).
//!
//! Cost: each exchange is tried as a child on the two sampling passes after it appears
//! (both ends of a hop come from the same socket sample, the second pass covers a parent
//! whose bytes were counted one sample late); parents are found by binary search in a
//! per-component index of recent exchanges.

use super::exchange::{End, Exchange};
use super::Model;
use crate::clock::Millis;
use std::collections::{BTreeMap, BTreeSet};

/// What linking needs of an exchange (no clone of the whole history per sample).
struct Lite {
    id: String,
    num: u64,
    component: String,
    client_component: Option<String>,
    request_ms: Millis,
    end_ms: Option<Millis>,
    bytes_in: u64,
    parent: Option<String>,
}

fn num_of(id: &str) -> u64 {
    id.strip_prefix('x')
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Links recently started exchanges to their parents. Existing links are kept.
pub(crate) fn link(model: &mut Model, now: Millis) {
    let window = model.thresholds.correlate.link_window_ms;
    let slack = model.thresholds.correlate.link_slack_ms;
    let horizon = 10_000 + window + slack;
    let first_new = model.link_cursor.0;
    let recent: Vec<Lite> = model
        .conns_since(now - horizon)
        .flat_map(|c| c.exchanges.iter())
        .filter(|x| now - x.request_ms <= horizon || x.end.is_none())
        .map(|x: &Exchange| Lite {
            id: x.id.clone(),
            num: num_of(&x.id),
            component: x.component.clone(),
            client_component: x.client_component.clone(),
            request_ms: x.request_ms,
            end_ms: match x.end {
                Some(End::Done(t)) | Some(End::Closed(t)) => Some(t),
                None => None,
            },
            bytes_in: x.bytes_in,
            parent: x.parent.clone(),
        })
        .collect();
    // Exchanges numbered from `first_new` appeared in the last two passes.
    model.link_cursor = (model.link_cursor.1, model.next_exchange_num() + 1);
    let mut taken: BTreeSet<(String, String)> = BTreeSet::new();
    for x in &recent {
        if let Some(p) = &x.parent {
            taken.insert((p.clone(), x.component.clone()));
        }
    }
    // Parent candidates per component, by request time.
    let mut index: BTreeMap<&str, Vec<(Millis, usize)>> = BTreeMap::new();
    for (i, x) in recent.iter().enumerate() {
        index
            .entry(x.component.as_str())
            .or_default()
            .push((x.request_ms, i));
    }
    for v in index.values_mut() {
        v.sort();
    }
    let mut children: Vec<&Lite> = recent
        .iter()
        .filter(|x| x.num >= first_new && x.parent.is_none() && x.client_component.is_some())
        .collect();
    children.sort_by_key(|x| x.request_ms);
    let new_links = best_parents(&recent, &index, &children, &mut taken, window, slack);
    if !new_links.is_empty() {
        apply(model, now - horizon, &new_links);
    }
}

/// For each child (oldest first), the best free parent among the candidates of its client
/// component: child id -> (parent id, confidence). `taken` holds (parent, child component)
/// pairs already linked: a parent has at most one child per downstream component.
fn best_parents(
    recent: &[Lite],
    index: &BTreeMap<&str, Vec<(Millis, usize)>>,
    children: &[&Lite],
    taken: &mut BTreeSet<(String, String)>,
    window: Millis,
    slack: Millis,
) -> BTreeMap<String, (String, f64)> {
    let mut new_links: BTreeMap<String, (String, f64)> = BTreeMap::new();
    for &child in children {
        let Some(cc) = child.client_component.as_deref() else {
            continue;
        };
        let Some(cands) = index.get(cc) else { continue };
        let lo = cands.partition_point(|(t, _)| *t < child.request_ms - window);
        let hi = cands.partition_point(|(t, _)| *t <= child.request_ms + slack);
        let free: Vec<&Lite> = cands[lo..hi]
            .iter()
            .map(|(_, i)| &recent[*i])
            .filter(|p| p.end_ms.is_none_or(|e| e + slack >= child.request_ms))
            .filter(|p| !taken.contains(&(p.id.clone(), child.component.clone())))
            .collect();
        let best = free
            .iter()
            .map(|p| (*p, score(p, child, window)))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        if let Some((p, s)) = best {
            // Several plausible parents: the pick is a guess among them.
            let conf = if free.len() > 1 { s * 0.6 } else { s };
            taken.insert((p.id.clone(), child.component.clone()));
            new_links.insert(
                child.id.clone(),
                (p.id.clone(), (conf * 100.0).round() / 100.0),
            );
        }
    }
    new_links
}

/// Writes new links into the exchanges (all on connections seen since `since`).
fn apply(model: &mut Model, since: Millis, new_links: &BTreeMap<String, (String, f64)>) {
    let mut parent_children: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (c, (p, _)) in new_links {
        parent_children
            .entry(p.clone())
            .or_default()
            .push(c.clone());
    }
    // Children and parents are all in `recent`, so on these connections.
    for conn in model.conns_since_mut(since) {
        for x in conn.exchanges.iter_mut() {
            if let Some((p, conf)) = new_links.get(&x.id) {
                x.parent = Some(p.clone());
                x.parent_confidence = Some(*conf);
            }
            if let Some(cs) = parent_children.get(&x.id) {
                for c in cs {
                    if !x.links.contains(c) {
                        x.links.push(c.clone());
                    }
                }
            }
        }
    }
}

/// 0..1: closeness in time, plus agreement of request sizes when both are known.
fn score(parent: &Lite, child: &Lite, window: i64) -> f64 {
    let dt = (child.request_ms - parent.request_ms).abs() as f64;
    let timing = 1.0 - (dt / window.max(1) as f64).min(1.0);
    let bytes = if parent.bytes_in > 0 && child.bytes_in > 0 {
        let (a, b) = (parent.bytes_in as f64, child.bytes_in as f64);
        // Forwarding rewrites headers and PD adds bootstrap fields: allow +-512 bytes / 2x.
        let diff = (a - b).abs();
        if diff <= 512.0 || (b / a > 0.5 && b / a < 2.0) {
            1.0
        } else {
            0.3
        }
    } else {
        0.6
    };
    0.5 + 0.3 * timing + 0.2 * bytes
}
