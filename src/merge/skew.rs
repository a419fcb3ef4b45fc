//! Clock skew between nodes, from the recorded clocks.
//!
//! From joined connections (the tighter estimate): a client's last send on its node's
//! clock is the newest exchange's arrival at the server on the server's clock, and the
//! client's last receive is the server's last byte out; each matched connection gives a
//! sample of (server clock - client clock), off by the network latency. Their median is the
//! estimate, their spread its error. From the collector (`fleet snapshot`): each node's
//! clock was read between the collector starting and finishing its transport, so its
//! offset from the collector's clock lies in that interval. Offsets are against the first
//! node's clock (the reference).

use super::flat::Flat;
use super::links::ConnMatch;
use super::load::Collected;
use crate::model::{NodeClock, Snapshot};

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
    let pairs = socket_samples(snaps, flat, matches);
    for (i, slot) in out.iter_mut().enumerate().skip(1) {
        let by_socket = pair_skew(&pairs, i);
        *slot = match (by_socket, from_collector[i].clone()) {
            (Some(a), Some(b)) if b.error_ms < a.error_ms => Some(b),
            (Some(a), _) => Some(a),
            (None, b) => b,
        };
    }
    out
}

/// (client node, server node, server clock - client clock) per observation.
type Samples = Vec<(usize, usize, i64)>;

fn socket_samples(snaps: &[Snapshot], flat: &Flat, matches: &[ConnMatch]) -> Samples {
    let mut out = Vec::new();
    for m in matches {
        let c = &snaps[m.client_node].connections[m.conn];
        let Some(&newest) = m.exchanges.iter().max_by_key(|&&x| flat.start_ms[x]) else {
            continue;
        };
        let pair = |d: i64| (m.client_node, m.server_node, d);
        if let (Some(sent), Some(arrived)) = (c.last_send_at_ms, flat.start_ms[newest]) {
            out.push(pair(arrived - sent));
        }
        let r = &flat.requests[newest];
        let taken = super::flat::parse_ms(&snaps[m.server_node].taken_at);
        if let (Some(recv), Some(t), true) = (c.last_recv_at_ms, taken, r.bytes_out > 0) {
            out.push(pair(t - r.idle_out_ms as i64 - recv));
        }
    }
    out
}

/// Node `i` against node 0 from the samples between them (either direction).
fn pair_skew(samples: &Samples, i: usize) -> Option<Skew> {
    let mut d: Vec<i64> = samples
        .iter()
        .filter_map(|&(c, s, v)| match (c, s) {
            (0, s) if s == i => Some(v),
            (c, 0) if c == i => Some(-v),
            _ => None,
        })
        .collect();
    if d.is_empty() {
        return None;
    }
    d.sort_unstable();
    let median = d[d.len() / 2];
    let spread = (d[d.len() - 1] - d[0]) / 2;
    Some(Skew {
        offset_ms: median,
        error_ms: spread.max(MIN_SOCKET_ERROR_MS),
        basis: format!(
            "{} socket time(s) of connections joined with the reference node",
            d.len()
        ),
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
