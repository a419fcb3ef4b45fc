//! Hop linking: the exchange a proxy or router receives is linked to the exchange(s) it
//! causes at the next hop.
//!
//! The client component of a connection is exact (the 4-tuple reversed, its pid); which
//! exchange caused which is inferred by timing and size ("One request, one id, one verdict"
//! in docs/findings.md). Each child has at most one parent; a parent at most one child per
//! downstream component. Each exchange is tried as a child on the two passes after it
//! appears (a parent's bytes may be counted one sample late); recent exchanges are
//! borrowed, not copied.

use super::exchange::{Conn, Exchange};
use super::view::{is_probe_sized, MIN_INFERENCE_REQUEST_BYTES};
use super::Correlator;
use super::{FastMap, FastSet};
use crate::clock::Millis;
use std::sync::Arc;

/// New links: child number -> (parent number, confidence).
type NewLinks = FastMap<u64, (u64, f64)>;

/// Links recently started exchanges to their parents. Existing links are kept.
pub(crate) fn link(model: &mut Correlator, now: Millis) {
    let window = model.thresholds.correlate.link_window_ms;
    // A long dump skews one hop's times against the next by up to its length: allowed
    // for, up to the window.
    let dump_ms = model
        .seen
        .get(&crate::model::SourceKind::Sockets)
        .map_or(0, |s| i64::try_from(s.took_ms).unwrap_or(i64::MAX));
    let slack = model.thresholds.correlate.link_slack_ms + dump_ms.min(window);
    let horizon = 10_000 + window + slack;
    let first_new = model.link_cursor.0;
    // Exchanges numbered from `first_new` appeared in the last two passes.
    let next_cursor = (model.link_cursor.1, model.next_exchange_num() + 1);
    let new_links = find_links(model, now, horizon, first_new, (window, slack));
    model.link_cursor = next_cursor;
    if !new_links.is_empty() {
        apply(model, now - horizon, &new_links);
    }
}

/// A connection's exchanges asked at or after `since`, and its unfinished one, oldest
/// first: a suffix, found from the newest back so the cost does not grow with its history.
fn recent_of(c: &Conn, since: Millis) -> std::collections::vec_deque::Iter<'_, Arc<Exchange>> {
    let n = c
        .exchanges
        .iter()
        .rev()
        .take_while(|x| x.request_ms >= since || x.end.is_none())
        .count();
    c.exchanges.range(c.exchanges.len() - n..)
}

/// The links the exchanges that appeared since `first_new` get, among the exchanges of
/// the last `horizon` ms (and every unfinished one).
fn find_links(
    model: &Correlator,
    now: Millis,
    horizon: Millis,
    first_new: u64,
    (window, slack): (Millis, Millis),
) -> NewLinks {
    let recent: Vec<&Exchange> = model
        .conns_since(now - horizon)
        .flat_map(|c| recent_of(c, now - horizon).map(Arc::as_ref))
        .collect();
    let mut taken: FastSet<(u64, &str)> = FastSet::default();
    for x in &recent {
        if let Some(p) = x.parent {
            taken.insert((p, x.component.as_str()));
        }
    }
    // Parent candidates per component, by request time.
    let mut index: FastMap<&str, Vec<(Millis, usize)>> = FastMap::default();
    for (i, x) in recent.iter().enumerate() {
        index
            .entry(x.component.as_str())
            .or_default()
            .push((x.request_ms, i));
    }
    let mut children: Vec<&Exchange> = recent
        .iter()
        .copied()
        .filter(|x| x.num >= first_new && x.parent.is_none() && x.client_component.is_some())
        .collect();
    if children.is_empty() {
        return NewLinks::default();
    }
    for v in index.values_mut() {
        v.sort_unstable();
    }
    children.sort_by_key(|x| x.request_ms);
    let pass = Pass {
        recent: &recent,
        index: &index,
        window,
        slack,
    };
    pass.best_parents(&children, &mut taken)
}

/// One pass's recent exchanges and their index by component.
struct Pass<'p, 'a> {
    recent: &'p [&'a Exchange],
    index: &'p FastMap<&'a str, Vec<(Millis, usize)>>,
    window: Millis,
    slack: Millis,
}

impl<'a> Pass<'_, 'a> {
    /// For each child (oldest first), the best free parent among the candidates of its
    /// client component. `taken` holds (parent, child component) pairs already linked: a
    /// parent has at most one child per downstream component.
    fn best_parents(
        &self,
        children: &[&'a Exchange],
        taken: &mut FastSet<(u64, &'a str)>,
    ) -> NewLinks {
        let mut new_links = NewLinks::default();
        for &c in children {
            let Some(cands) = c
                .client_component
                .as_deref()
                .and_then(|cc| self.index.get(cc))
            else {
                continue;
            };
            let lo = cands.partition_point(|(t, _)| *t < c.request_ms - self.window);
            let hi = cands.partition_point(|(t, _)| *t <= c.request_ms + self.slack);
            let mut free = 0usize;
            let mut best: Option<(&'a Exchange, f64)> = None;
            for (_, i) in &cands[lo..hi] {
                let p = self.recent[*i];
                if p.end_ms().is_some_and(|e| e + self.slack < c.request_ms)
                    || taken.contains(&(p.num, c.component.as_str()))
                    || probe_under_inference(p, c)
                {
                    continue;
                }
                free += 1;
                let s = score(p, c, self.window);
                // The last of equal scores, as `Iterator::max_by` picks.
                if best.is_none_or(|(_, b)| s.total_cmp(&b).is_ge()) {
                    best = Some((p, s));
                }
            }
            if let Some((p, s)) = best {
                // Several plausible parents: the pick is a guess among them.
                let conf = if free > 1 { s * 0.6 } else { s };
                taken.insert((p.num, c.component.as_str()));
                new_links.insert(c.num, (p.num, (conf * 100.0).round() / 100.0));
            }
        }
        new_links
    }
}

/// Writes new links into the exchanges (all on connections seen since `since`).
fn apply(model: &mut Correlator, since: Millis, new_links: &NewLinks) {
    let mut parent_children: FastMap<u64, Vec<u64>> = FastMap::default();
    for (c, (p, _)) in new_links {
        parent_children.entry(*p).or_default().push(*c);
    }
    // Children in the order they appeared.
    for cs in parent_children.values_mut() {
        cs.sort_unstable();
    }
    // Children and parents are all in `recent`, so on these connections.
    for conn in model.conns_since_mut(since) {
        let from = conn.exchanges.len() - recent_of(conn, since).len();
        for x in conn.exchanges.range_mut(from..) {
            if let Some((p, conf)) = new_links.get(&x.num) {
                let x = Arc::make_mut(x);
                x.parent = Some(*p);
                x.parent_confidence = Some(*conf);
            }
            if let Some(cs) = parent_children.get(&x.num) {
                for c in cs {
                    if !x.links.contains(c) {
                        Arc::make_mut(x).links.push(*c);
                    }
                }
            }
        }
    }
}

/// A probe is no hop of a client's inference request, however close in time (linked, it
/// would take the real leg's place).
fn probe_under_inference(parent: &Exchange, child: &Exchange) -> bool {
    is_probe_sized(child) && parent.bytes_in >= MIN_INFERENCE_REQUEST_BYTES
}

/// 0..1: closeness in time, plus agreement of request sizes when both are known.
fn score(parent: &Exchange, child: &Exchange, window: i64) -> f64 {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::correlate::exchange::{ConnKey, End};
    use crate::model::{Role, TcpState};
    use std::collections::VecDeque;

    /// A keep-alive connection with requests at `asked` (ms), each ended by the next; the
    /// last one still unfinished when `last_open`.
    fn conn(asked: &[Millis], last_open: bool) -> Conn {
        let mut c = Conn {
            id: 1,
            key: ConnKey::default(),
            component: "decode".into(),
            role: Role::Decode,
            client_pid: None,
            client_component: None,
            first_seen_ms: 0,
            last_seen_ms: 0,
            closed_ms: None,
            tcp_state: TcpState::Established,
            in_total: 0,
            out_total: 0,
            last_in_ms: None,
            last_out_ms: None,
            in_table: 0,
            exchanges: VecDeque::new(),
        };
        for (i, &t) in asked.iter().enumerate() {
            let mut x = c.new_exchange(i as u64 + 1, t, 0, 0);
            if i + 1 < asked.len() || !last_open {
                x.end = Some(End::Done(t + 500));
            }
            c.exchanges.push_back(Arc::new(x));
        }
        c
    }

    fn asked(c: &Conn, since: Millis) -> Vec<Millis> {
        recent_of(c, since).map(|x| x.request_ms).collect()
    }

    #[test]
    fn a_connections_recent_exchanges_are_its_newest_and_its_unfinished_one() {
        let c = conn(&[0, 1_000, 2_000, 3_000, 4_000], false);
        assert_eq!(asked(&c, 2_500), vec![3_000, 4_000], "oldest first");
        assert_eq!(asked(&c, 3_000), vec![3_000, 4_000], "at `since` counts");
        assert!(asked(&c, 5_000).is_empty());
        // An idle keep-alive connection's unfinished request is recent however old.
        let idle = conn(&[0, 1_000, 2_000], true);
        assert_eq!(asked(&idle, 60_000), vec![2_000]);
        assert_eq!(asked(&idle, 1_000), vec![1_000, 2_000]);
    }
}
