//! Hops across nodes. A connection is joined exactly: the client's socket on one node
//! (`connections[]`) is the server's on another (`requests[]`) with the 4-tuple reversed.
//! Which exchange at the client caused the one at the server is inferred, as on one node, by
//! timing ([`LINK_WINDOW_MS`]) and size. A VIP or NAT between the nodes rewrites the 4-tuple:
//! such connections stay unmatched, named in the merge's notes. The long version:
//! docs/fleet.md "Merge".

use super::flat::{canon, Flat, IndexSet};
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

/// At most this many connections with one 4-tuple are looked at (TCP makes a 4-tuple unique
/// on a node; more are nodes sharing a private address space, or a forged snapshot).
const MAX_SAME_TUPLE: usize = 16;

/// Matches every node's outbound connections with the other nodes' server exchanges.
pub fn match_connections(snaps: &[Snapshot], flat: &Flat) -> (Vec<ConnMatch>, Vec<String>) {
    let conns: Vec<(usize, usize)> = snaps
        .iter()
        .enumerate()
        .flat_map(|(n, s)| (0..s.connections.len()).map(move |ci| (n, ci)))
        .collect();
    // (the tuples are a stranger's strings: the default, DoS-resistant hasher)
    let mut by_tuple: HashMap<(Cow<str>, Cow<str>), usize> = HashMap::with_capacity(conns.len());
    // the previous connection with the same tuple (usize::MAX: none)
    let mut same = vec![usize::MAX; conns.len()];
    for (k, &(n, ci)) in conns.iter().enumerate() {
        let c = &snaps[n].connections[ci];
        if let Some(prev) = by_tuple.insert((canon(&c.local), canon(&c.remote)), k) {
            same[k] = prev;
        }
    }
    // each connection's exchanges on other nodes, in `flat` order (by node, then as listed)
    let mut hits: Vec<Vec<usize>> = vec![Vec::new(); conns.len()];
    for (i, r) in flat.requests.iter().enumerate() {
        let mut k = match by_tuple.get(&(canon(&r.client), canon(&r.server))) {
            Some(&k) => k,
            None => continue,
        };
        for _ in 0..MAX_SAME_TUPLE {
            if conns[k].0 != flat.node[i] {
                hits[k].push(i);
            }
            k = same[k];
            if k == usize::MAX {
                break;
            }
        }
    }
    let mut out = Vec::new();
    let mut unmatched: BTreeMap<String, usize> = BTreeMap::new();
    for (&(n, ci), h) in conns.iter().zip(hits) {
        match conn_match(flat, n, ci, h) {
            Some(m) => out.push(m),
            None => {
                let c = &snaps[n].connections[ci];
                *unmatched
                    .entry(format!("{} -> {}", c.component, c.remote))
                    .or_default() += 1
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

/// Connection `ci` of node `n` and the exchanges with its 4-tuple on other nodes (`hits`,
/// grouped by node): those of the first such node.
fn conn_match(flat: &Flat, n: usize, ci: usize, hits: Vec<usize>) -> Option<ConnMatch> {
    let server_node = flat.node[*hits.first()?];
    let candidates = 1 + hits
        .windows(2)
        .filter(|w| flat.node[w[0]] != flat.node[w[1]])
        .count();
    let exchanges = if candidates == 1 {
        hits
    } else {
        hits.into_iter()
            .filter(|&i| flat.node[i] == server_node)
            .collect()
    };
    Some(ConnMatch {
        client_node: n,
        conn: ci,
        server_node,
        exchanges,
        candidates,
    })
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
    let mut links = Vec::with_capacity(matches.len());
    for m in matches {
        let c = &snaps[m.client_node].connections[m.conn];
        let comp = parents.comp_index(&c.component);
        let mut parent = None;
        let mut conf = if m.candidates == 1 { 0.95 } else { 0.5 };
        let newest = m
            .exchanges
            .iter()
            .copied()
            .max_by_key(|&x| flat.start_ms[x]);
        let shift = offsets[m.server_node] - offsets[m.client_node];
        for &x in &m.exchanges {
            flat.requests[x].client_component = Some(c.component.clone());
            // The newest exchange on the connection is what the client sent last: its time
            // on the client's own clock, no skew involved. Older ones by the aligned clocks.
            let is_newest = Some(x) == newest;
            let sent = c.last_send_at_ms.filter(|_| is_newest);
            let Some(start) = sent.or(flat.start_ms[x].map(|t| t - shift)) else {
                continue;
            };
            let Some((p, pc)) = comp.and_then(|k| parents.find(flat, k, start, x, tolerance_ms))
            else {
                continue;
            };
            parents.taken.insert((p, parents.comp[x]));
            if is_newest && unanswered(c, &flat.requests[x]) {
                flat.unanswered[p] = true;
            }
            if !flat.children[p].contains(&x) {
                flat.children[p].push(x);
                let child_id = flat.requests[x].id.clone();
                flat.requests[p].links.push(child_id);
            }
            flat.requests[x].link_confidence = Some(pc);
            conf = f64::min(conf, pc);
            parent = Some(p);
        }
        links.push(cross_link(flat, c, m, parent, conf));
    }
    links
}

fn cross_link(
    flat: &Flat,
    c: &SnapConnection,
    m: &ConnMatch,
    parent: Option<usize>,
    confidence: f64,
) -> CrossLink {
    CrossLink {
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
        parent: parent.map(|p| flat.requests[p].id.clone()),
        confidence,
    }
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
    /// Each request's component, as an index.
    comp: Vec<u32>,
    /// Component id -> index (a stranger's strings: the default hasher).
    names: HashMap<String, u32>,
    by_comp: Vec<Vec<(i64, usize)>>,
    taken: IndexSet<(usize, u32)>,
}

impl ParentIndex {
    fn new(flat: &Flat) -> Self {
        let mut names: HashMap<String, u32> = HashMap::new();
        let mut comp = Vec::with_capacity(flat.requests.len());
        let mut last: Option<(&str, u32)> = None;
        for r in &flat.requests {
            // a node lists a component's exchanges together: mostly the last one again
            let k = match last {
                Some((name, k)) if name == r.component => k,
                _ => match names.get(r.component.as_str()) {
                    Some(&k) => k,
                    None => {
                        let k = u32::try_from(names.len()).unwrap_or(u32::MAX);
                        names.insert(r.component.clone(), k);
                        k
                    }
                },
            };
            last = Some((r.component.as_str(), k));
            comp.push(k);
        }
        let mut by_comp: Vec<Vec<(i64, usize)>> = vec![Vec::new(); names.len()];
        for (i, &k) in comp.iter().enumerate() {
            if let (Some(t), Some(v)) = (flat.start_ms[i], by_comp.get_mut(k as usize)) {
                v.push((t, i));
            }
        }
        by_comp.iter_mut().for_each(|v| v.sort_unstable());
        ParentIndex {
            comp,
            names,
            by_comp,
            taken: IndexSet::default(),
        }
    }

    fn comp_index(&self, name: &str) -> Option<u32> {
        self.names.get(name).copied()
    }

    /// The parent of `child` (starting at `start` on the client's clock) at component `comp`:
    /// of the exchanges there that started at most [`LINK_WINDOW_MS`] before it or within
    /// `tol`, the skew's error, after it, and have no child at the child's component yet, the
    /// nearest, preferring one of about the same size; with the link's confidence.
    fn find(
        &self,
        flat: &Flat,
        comp: u32,
        start: i64,
        child: usize,
        tol: i64,
    ) -> Option<(usize, f64)> {
        let v = self.by_comp.get(comp as usize)?;
        let hi = v.partition_point(|&(t, _)| t <= start + tol);
        let mid = v.partition_point(|&(t, _)| t <= start);
        let lo = v.partition_point(|&(t, _)| t < start - LINK_WINDOW_MS - tol);
        let cr = &flat.requests[child];
        // one child per downstream component: a node's own links are to its own
        // components, so only the cross-node ones made here can be in the way
        let key = self.comp[child];
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

/// Whether a forwarded body's size is about the received one's (routers add fields); a
/// size not known (0: an exchange first seen mid-flight) is no evidence either way.
fn similar(parent_in: u64, child_in: u64) -> bool {
    if parent_in == 0 || child_in == 0 {
        return true;
    }
    let d = parent_in.abs_diff(child_in);
    d <= 512 || d <= parent_in / 4
}
