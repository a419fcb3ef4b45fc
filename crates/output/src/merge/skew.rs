//! Clock skew between nodes, from the recorded clocks.
//!
//! From joined connections: each gives a sample of (server clock - client clock), off by the
//! network latency; their median is the estimate, their spread its error. From the collector
//! (`fleet snapshot`): each node's offset lies in the interval its transport took. Offsets
//! are against the first node's clock (docs/fleet.md "Merge").

use super::flat::Flat;
use super::links::ConnMatch;
use super::load::Collected;
use crate::model::{NodeClock, Snapshot};
use std::collections::HashMap;

/// Least error claimed for an estimate from sockets (tcp_info times are in jiffies).
const MIN_SOCKET_ERROR_MS: i64 = 10;

/// One node's estimated offset from the reference node's clock.
#[derive(Debug, Clone, PartialEq)]
pub struct Skew {
    /// This node's clock minus the reference's, ms.
    pub offset_ms: i64,
    /// ± ms.
    pub error_ms: i64,
    pub basis: String,
}

/// Offsets of every node against node 0 (None: cannot be told).
pub fn estimate(
    snaps: &[Snapshot],
    flat: &Flat,
    matches: &[ConnMatch],
    collected: &[Option<Collected>],
) -> Vec<Option<Skew>> {
    let n = snaps.len();
    let mut out: Vec<Option<Skew>> = vec![None; n];
    if n == 0 {
        return out;
    }
    out[0] = Some(Skew {
        offset_ms: 0,
        error_ms: 0,
        basis: "reference clock".to_string(),
    });
    let from_collector = collector(snaps, collected);
    let by_socket = chain(n, &socket_samples(snaps, flat, matches));
    for (i, slot) in out.iter_mut().enumerate().skip(1) {
        *slot = match (by_socket[i].clone(), from_collector[i].clone()) {
            (Some(a), Some(b)) if b.error_ms < a.error_ms => Some(b),
            (Some(a), _) => Some(a),
            (None, b) => b,
        };
    }
    out
}

/// Offsets against node 0 from the pairwise estimates, chained breadth first (a node
/// joined only to a node joined to the reference still gets one; errors add up).
fn chain(n: usize, samples: &Samples) -> Vec<Option<Skew>> {
    let mut out: Vec<Option<Skew>> = vec![None; n];
    let mut queue = std::collections::VecDeque::from([0usize]);
    let mut hops = vec![usize::MAX; n];
    hops[0] = 0;
    while let Some(i) = queue.pop_front() {
        for j in 0..n {
            if hops[j] != usize::MAX {
                continue;
            }
            let Some(p) = pair_skew(samples, i, j) else {
                continue;
            };
            let (base, base_err) = out[i]
                .as_ref()
                .map_or((0, 0), |s| (s.offset_ms, s.error_ms));
            hops[j] = hops[i] + 1;
            let via = if i == 0 {
                "the reference node".to_string()
            } else {
                format!("a node {} hop(s) from the reference", hops[i])
            };
            out[j] = Some(Skew {
                offset_ms: base + p.offset_ms,
                error_ms: base_err + p.error_ms,
                basis: format!(
                    "{} socket time(s) of connections joined with {via}",
                    p.basis
                ),
            });
            queue.push_back(j);
        }
    }
    out[0] = None;
    out
}

/// (client node, server node) -> server clock - client clock, per observation.
type Samples = HashMap<(usize, usize), Vec<i64>>;

fn socket_samples(snaps: &[Snapshot], flat: &Flat, matches: &[ConnMatch]) -> Samples {
    let mut out = Samples::new();
    let taken: Vec<Option<i64>> = snaps
        .iter()
        .map(|s| super::flat::parse_ms(&s.taken_at))
        .collect();
    for m in matches {
        let c = &snaps[m.client_node].connections[m.conn];
        let Some(&newest) = m.exchanges.iter().max_by_key(|&&x| flat.start_ms[x]) else {
            continue;
        };
        let pair = out.entry((m.client_node, m.server_node)).or_default();
        if let (Some(sent), Some(arrived)) = (c.last_send_at_ms, flat.start_ms[newest]) {
            pair.push(arrived - sent);
        }
        let r = &flat.requests[newest];
        if let (Some(recv), Some(t), true) =
            (c.last_recv_at_ms, taken[m.server_node], r.bytes_out > 0)
        {
            pair.push(t - r.idle_out_ms as i64 - recv);
        }
    }
    out
}

/// Node `j`'s clock minus node `i`'s from the samples between them (either direction);
/// `basis` holds the number of samples.
fn pair_skew(samples: &Samples, i: usize, j: usize) -> Option<Skew> {
    let fwd = samples.get(&(i, j)).into_iter().flatten().copied();
    let back = samples.get(&(j, i)).into_iter().flatten().map(|v| -v);
    let mut d: Vec<i64> = fwd.chain(back).collect();
    if d.is_empty() {
        return None;
    }
    d.sort_unstable();
    let median = d[d.len() / 2];
    let spread = (d[d.len() - 1] - d[0]) / 2;
    Some(Skew {
        offset_ms: median,
        error_ms: spread.max(MIN_SOCKET_ERROR_MS),
        basis: d.len().to_string(),
    })
}

/// Offsets from the collector's clock, made relative to node 0's.
fn collector(snaps: &[Snapshot], collected: &[Option<Collected>]) -> Vec<Option<Skew>> {
    let vs: Vec<Option<(i64, i64)>> = snaps
        .iter()
        .zip(collected)
        .map(|(s, c)| {
            let clock: NodeClock = s.node.as_ref()?.clock?;
            let c = (*c)?;
            // the clock was read between started and ended on the collector's clock
            let lo = clock.wall_ms - c.ended_ms;
            let hi = clock.wall_ms - c.started_ms;
            Some(((lo + hi) / 2, (hi - lo) / 2))
        })
        .collect();
    let Some((ref_mid, ref_err)) = vs.first().copied().flatten() else {
        return vec![None; snaps.len()];
    };
    vs.into_iter()
        .map(|v| {
            let (mid, err) = v?;
            Some(Skew {
                offset_ms: mid - ref_mid,
                error_ms: err + ref_err,
                basis: "the collector's clock around each node's transport".to_string(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_chain_through_nodes_not_joined_to_the_reference() {
        let mut s = Samples::new();
        s.insert((0, 1), vec![98, 100, 102]);
        // node 2 is a client of node 1: node 1's clock minus node 2's
        s.insert((2, 1), vec![-50]);
        let out = chain(4, &s);
        assert!(out[0].is_none(), "the reference is set by the caller");
        let one = out[1].clone().unwrap();
        assert_eq!((one.offset_ms, one.error_ms), (100, 10));
        let two = out[2].clone().unwrap();
        assert_eq!(two.offset_ms, 150, "1 = 0 + 100, 2 = 1 + 50");
        assert_eq!(two.error_ms, 20, "errors add up");
        assert!(
            two.basis.contains("1 hop(s) from the reference"),
            "{}",
            two.basis
        );
        assert!(out[3].is_none(), "joined to nobody");
    }
}
