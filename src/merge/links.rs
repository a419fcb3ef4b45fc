//! Hops across nodes. A connection is joined exactly: the client's socket on one node
//! (`connections[]`: local, remote) is the server's on another (`requests[]`: client,
//! server) with the 4-tuple reversed. Which exchange at the client caused the exchange at
//! the server is inferred, as on one node, by timing (the child starts within
//! [`LINK_WINDOW_MS`] after its parent) and size (a forwarded body is about as large as the
//! one received). The newest exchange on a connection is timed by the client socket's last
//! send on the client's own clock; older ones by their start on clocks aligned by the skew
//! estimate.
//!
//! What it cannot see through: a VIP, a load balancer or a NAT between the nodes rewrites
//! the 4-tuple, so the client's remote is not the server's local address; such connections
//! stay unmatched and are named in the merge's notes.

use super::flat::{canon, Flat};
use crate::correlate::{JIFFY_TIE_MS, MIN_INFERENCE_REQUEST_BYTES};
use crate::model::{CrossLink, Request, RequestState, SnapConnection, Snapshot};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

/// The longest a hop takes to forward a request.
pub const LINK_WINDOW_MS: i64 = 2_000;
/// Parent candidates looked at, nearest first (a busy router has hundreds in its window;
/// the parent is among the nearest, and the rest only lower the confidence).
const MAX_CANDIDATES: usize = 32;

/// One client connection matched with the server's exchanges on another node.
#[derive(Debug, Clone)]
pub struct ConnMatch {
    /// The client's node and its index in that node's `connections`.
    pub client_node: usize,
    pub conn: usize,
    pub server_node: usize,
    /// Indices into `Flat::requests`, oldest first.
    pub exchanges: Vec<usize>,
    /// How many nodes held a server socket with this 4-tuple (more than one: overlapping
    /// private address spaces, and the match is ambiguous).
    pub candidates: usize,
}

/// Matches every node's outbound connections with the other nodes' server exchanges.
pub fn match_connections(snaps: &[Snapshot], flat: &Flat) -> (Vec<ConnMatch>, Vec<String>) {
    let mut by_tuple: HashMap<(Cow<str>, Cow<str>), Vec<usize>> = HashMap::new();
    for (i, r) in flat.requests.iter().enumerate() {
        by_tuple
            .entry((canon(&r.client), canon(&r.server)))
            .or_default()
            .push(i);
    }
    let mut out = Vec::new();
    let mut unmatched: BTreeMap<String, usize> = BTreeMap::new();
    for (n, s) in snaps.iter().enumerate() {
        for (ci, c) in s.connections.iter().enumerate() {
            let key = (canon(&c.local), canon(&c.remote));
            let hits: Vec<usize> = by_tuple
                .get(&key)
                .map(|v| v.iter().copied().filter(|&i| flat.node[i] != n).collect())
                .unwrap_or_default();
            let mut nodes: Vec<usize> = hits.iter().map(|&i| flat.node[i]).collect();
            nodes.dedup();
            match nodes.first() {
                Some(&server_node) => out.push(ConnMatch {
                    client_node: n,
                    conn: ci,
                    server_node,
                    exchanges: hits
                        .into_iter()
                        .filter(|&i| flat.node[i] == server_node)
                        .collect(),
                    candidates: nodes.len(),
                }),
                None => {
                    *unmatched
                        .entry(format!("{} -> {}", c.component, c.remote))
                        .or_default() += 1
                }
            }
        }
    }
    let notes = unmatched
        .into_iter()
        .map(|(what, k)| {
            format!("{k} connection(s) {what}: no merged node serves that address (a VIP, a NAT or a node not merged)")
        })
        .collect();
    (out, notes)
}

/// Sets the client component of matched exchanges, links each to its parent exchange at
/// the client (on clocks shifted by `offsets`, each node's clock minus the reference's),
/// and returns the cross-node links.
pub fn link(
    snaps: &[Snapshot],
    flat: &mut Flat,
    matches: &[ConnMatch],
    offsets: &[i64],
    tolerance_ms: i64,
) -> Vec<CrossLink> {
    let mut parents = ParentIndex::new(flat);
    let mut links = Vec::new();
    for m in matches {
        let c = &snaps[m.client_node].connections[m.conn];
        let mut parent_ids = Vec::new();
        let mut conf = if m.candidates == 1 { 0.95 } else { 0.5 };
        let newest = m
            .exchanges
            .iter()
            .copied()
            .max_by_key(|&x| flat.start_ms[x]);
        for &x in &m.exchanges {
            flat.requests[x].client_component = Some(c.component.clone());
            let shift = offsets[m.server_node] - offsets[m.client_node];
            // The newest exchange on the connection is what the client sent last: its time
            // on the client's own clock, no skew involved. Older ones by the aligned clocks.
            let is_newest = Some(x) == newest;
            let sent = c.last_send_at_ms.filter(|_| is_newest);
            let Some(start) = sent.or(flat.start_ms[x].map(|t| t - shift)) else {
                continue;
            };
            if let Some((p, pc)) = parents.find(flat, &c.component, start, x, tolerance_ms) {
                parents
                    .taken
                    .insert((p, comp_key(&flat.requests[x].component)));
                if is_newest && unanswered(c, &flat.requests[x]) {
                    flat.unanswered[p] = true;
                }
                let child_id = flat.requests[x].id.clone();
                if !flat.requests[p].links.contains(&child_id) {
                    flat.requests[p].links.push(child_id);
                }
                flat.requests[x].link_confidence = Some(pc);
                conf = f64::min(conf, pc);
                parent_ids.push(flat.requests[p].id.clone());
            }
        }
        links.push(CrossLink {
            client_component: c.component.clone(),
            client: c.local.clone(),
            server_component: m
                .exchanges
                .first()
                .map(|&x| flat.requests[x].component.clone())
                .unwrap_or_default(),
            server: c.remote.clone(),
            exchanges: m
                .exchanges
                .iter()
                .map(|&x| flat.requests[x].id.clone())
                .collect(),
            parent: parent_ids.last().cloned(),
            confidence: conf,
        });
    }
    links
}

/// Whether the client socket `c` says its last request, `newest` at the server, has had no
/// byte back: nothing received after the last send, or within the same kernel tick
/// (`tcp_info` times are jiffies: a request sent on a pooled connection just as the
/// previous answer ended reads as a tie, and the server's correlator, first seeing it
/// mid-flight, may take it for that answer). Not when the server saw response bytes go
/// out, nor on a connection that never carried an inference-sized request (a probe's
/// answer comes in the same tick).
fn unanswered(c: &SnapConnection, newest: &Request) -> bool {
    let Some(sent) = c.last_send_at_ms else {
        return false;
    };
    let quiet = c.last_recv_at_ms.is_none_or(|r| r <= sent + JIFFY_TIE_MS);
    let asked = c
        .bytes_sent
        .is_none_or(|b| b >= MIN_INFERENCE_REQUEST_BYTES);
    let silent = newest.bytes_out == 0
        && matches!(
            newest.state,
            RequestState::WaitingFirstByte | RequestState::Done | RequestState::Idle
        );
    quiet && asked && silent
}

/// The exchanges served by each component, by start time: the parent candidates; and the
/// (parent, child component) pairs linked so far (one child per downstream component).
struct ParentIndex {
    by_comp: HashMap<String, Vec<(i64, usize)>>,
    taken: std::collections::HashSet<(usize, u64)>,
}

impl ParentIndex {
    fn new(flat: &Flat) -> Self {
        let mut by_comp: HashMap<String, Vec<(i64, usize)>> = HashMap::new();
        for (i, r) in flat.requests.iter().enumerate() {
            if let Some(t) = flat.start_ms[i] {
                by_comp.entry(r.component.clone()).or_default().push((t, i));
            }
        }
        by_comp.values_mut().for_each(|v| v.sort_unstable());
        ParentIndex {
            by_comp,
            taken: Default::default(),
        }
    }

    /// The parent of `child` (starting at `start` on the client's clock) at `comp`: the
    /// latest exchange there that started at most [`LINK_WINDOW_MS`] before it (or, failing
    /// that, within `tol`, the skew's error, after it) and has no child at the child's
    /// component yet, preferring one of about the same size; with the link's confidence.
    fn find(
        &self,
        flat: &Flat,
        comp: &str,
        start: i64,
        child: usize,
        tol: i64,
    ) -> Option<(usize, f64)> {
        let v = self.by_comp.get(comp)?;
        let hi = v.partition_point(|&(t, _)| t <= start + tol);
        let mid = v.partition_point(|&(t, _)| t <= start);
        let lo = v.partition_point(|&(t, _)| t < start - LINK_WINDOW_MS - tol);
        let cr = &flat.requests[child];
        // one child per downstream component: a node's own links are to its own
        // components, so only the cross-node ones made here can be in the way
        let key = comp_key(&cr.component);
        let free = |p: usize| !self.taken.contains(&(p, key));
        let sized = |p: usize| similar(flat.requests[p].bytes_in, cr.bytes_in);
        let (mut first, mut best, mut n) = (None, None, 0);
        // nearest first on the aligned clocks, before the child or within the skew's error
        // after it (tcp_info times are jiffies: a parent's start read on one socket can be a
        // tick after its child's send read on another)
        let nearest = nearest(v, lo..hi.max(mid), mid, start).filter(|&i| i != child);
        for p in nearest.take(MAX_CANDIDATES) {
            if !free(p) {
                continue;
            }
            n += 1;
            first = first.or(Some(p));
            if best.is_none() && sized(p) {
                best = Some(p);
            }
            if best.is_some() && n > 1 {
                break;
            }
        }
        match (best, first) {
            (Some(p), _) if n == 1 => Some((p, 0.9)),
            (Some(p), _) => Some((p, 0.7)),
            (None, Some(p)) => Some((p, 0.4)),
            (None, None) => None,
        }
    }
}

/// The entries of `v[range]` (sorted by time), nearest `t` first (`mid`: the first after
/// `t`); of two as near, the one before.
fn nearest(
    v: &[(i64, usize)],
    range: std::ops::Range<usize>,
    mid: usize,
    t: i64,
) -> impl Iterator<Item = usize> + '_ {
    let (mut b, mut a) = (mid, mid);
    std::iter::from_fn(move || {
        let before = (b > range.start).then(|| t - v[b - 1].0);
        let after = (a < range.end).then(|| v[a].0 - t);
        match (before, after) {
            (Some(db), Some(da)) if da < db => a += 1,
            (Some(_), _) => {
                b -= 1;
                return Some(v[b].1);
            }
            (None, Some(_)) => a += 1,
            (None, None) => return None,
        }
        Some(v[a - 1].1)
    })
}

/// A component's id as a set key (a collision only lowers a link's chance, never makes one).
fn comp_key(c: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    c.hash(&mut h);
    h.finish()
}

/// Whether a forwarded body's size is about the received one's (routers add fields); a
/// size not known (0: an exchange first seen mid-flight) is no evidence either way.
fn similar(parent_in: u64, child_in: u64) -> bool {
    if parent_in == 0 || child_in == 0 {
        return true;
    }
    let d = parent_in.abs_diff(child_in);
    d <= 512 || d <= parent_in / 4
}
