//! What the tabs list, derived from the snapshot on screen once per frame, filter or sort
//! change (never while rendering): finding order, request chains and their hop lanes, and
//! each tab's rows.
//!
//! Which exchanges make one request and whether it is stuck (and where) are the
//! correlator's (`snapshot.logical_requests`): read here, never judged again, so the
//! "(N stuck)" of the Requests tab is the findings' and the report's number. An exchange
//! that is no leg of one (an idle connection) is a request of its own, never stuck.

use super::SortKey;
use crate::model::{LogicalRequest, Request, RequestState, Role, Snapshot, Verdict};
use std::collections::{BTreeSet, HashMap};

/// The hop lanes of the Requests tab.
pub const LANES: [&str; 4] = ["proxy", "router", "prefill", "decode"];

/// Which lane a role's exchanges go in. A unified engine shares the decode lane: it is the
/// hop that serves the tokens.
pub fn lane_of(role: Role) -> usize {
    match role {
        Role::Client | Role::Proxy | Role::Other => 0,
        Role::Router => 1,
        Role::Prefill => 2,
        Role::Decode | Role::Engine | Role::Scheduler | Role::Detokenizer => 3,
    }
}

/// One hop of a request chain as shown in a lane.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lane {
    pub state: RequestState,
    pub idle_out_ms: f64,
    pub stuck: bool,
}

/// One exchange with what the Requests tab needs about its chain, computed once per frame.
#[derive(Debug, Clone)]
pub struct RequestRow {
    /// Index into `snapshot.requests`.
    pub index: usize,
    /// Index of the chain (request entering the stack) this exchange belongs to.
    pub chain: usize,
    /// Not the next hop of another exchange.
    pub is_root: bool,
    pub lane: usize,
    pub lanes: [Option<Lane>; 4],
    /// The chain's logical request is stuck (the correlator's verdict).
    pub stuck: bool,
    /// The chain's logical request waits for its first byte and is not stuck (yet); probes
    /// (health checks, scrapes) are not counted as waiting requests.
    pub waiting: bool,
    /// Deepest lane where the chain is stuck.
    pub stuck_at: Option<usize>,
    /// Lower-cased text the `/` filter matches against.
    search: String,
}

/// Everything derived from the displayed snapshot: recomputed on a new frame, a filter or a
/// sort change, never while rendering.
#[derive(Debug, Clone, Default)]
pub struct Derived {
    /// Findings indices, most severe first.
    pub findings: Vec<usize>,
    pub rows: Vec<RequestRow>,
    /// Rows shown in the Requests tab, in order (indices into `rows`).
    pub request_order: Vec<usize>,
    /// Members of each chain (indices into `snapshot.requests`), root first.
    pub chains: Vec<Vec<usize>>,
    /// The logical request of each chain (index into `snapshot.logical_requests`), if any.
    pub chain_request: Vec<Option<usize>>,
    /// Threads shown, grouped by component then pid, tid (indices into `snapshot.threads`).
    pub threads: Vec<usize>,
    /// Exchanges for the Sockets connection list, longest silence first.
    pub connections: Vec<usize>,
    /// Components in the Sockets tab's summary (those with sockets or exchanges; indices
    /// into `snapshot.components`).
    pub socket_components: Vec<usize>,
    /// Component id -> index.
    pub component_index: HashMap<String, usize>,
    /// Request id -> findings indices that name it.
    pub findings_by_request: HashMap<String, Vec<usize>>,
    /// Per finding (by index): the chain whose lanes its expansion shows: of the requests it
    /// names, the one with the most hops (the best-known path), the first of equals.
    pub finding_chains: Vec<Option<usize>>,
    /// Metrics tab lines: (component index, metric name).
    pub metric_lines: Vec<(usize, String)>,
    /// Diff tab: indices into `config_changed`, a child's repeat of its engine's change
    /// left out.
    pub changes: Vec<usize>,
    /// Diff tab: per change (index into `config_changed`), the child processes whose same
    /// change was folded into it.
    pub change_children: HashMap<usize, Vec<String>>,
    /// The header's cause line.
    pub cause: Option<super::cause::Cause>,
}

pub fn in_flight(state: RequestState) -> bool {
    matches!(
        state,
        RequestState::WaitingFirstByte | RequestState::Streaming | RequestState::Stalled
    )
}
/// Role of an exchange: its own, else its component's.
pub fn request_role(s: &Snapshot, index: &HashMap<String, usize>, r: &Request) -> Role {
    r.role
        .or_else(|| {
            index
                .get(&r.component)
                .and_then(|&i| s.components.get(i))
                .map(|c| c.role)
        })
        .unwrap_or(Role::Other)
}

impl Derived {
    /// The findings (indices, in order) that name `chain`'s logical request: what the
    /// Requests tab's hop detail lists below the hops.
    pub fn hop_findings(&self, s: &Snapshot, chain: usize) -> BTreeSet<usize> {
        self.chain_request
            .get(chain)
            .copied()
            .flatten()
            .and_then(|li| s.logical_requests.get(li))
            .and_then(|l| self.findings_by_request.get(l.id.as_str()))
            .into_iter()
            .flatten()
            .copied()
            .collect()
    }

    /// Lines of the Requests tab's hop detail for `chain`: its title, the column heads, one
    /// per hop, one per finding.
    pub fn hop_detail_len(&self, s: &Snapshot, chain: usize) -> usize {
        2 + self.chains.get(chain).map_or(0, Vec::len) + self.hop_findings(s, chain).len()
    }
}

/// Computes everything the tabs list, once per frame/filter/sort change.
pub fn derive(s: &Snapshot, filter: &str, sort: SortKey, all_hops: bool) -> Derived {
    let filter = filter.to_lowercase();
    let mut d = Derived::default();
    for (i, c) in s.components.iter().enumerate() {
        d.component_index.insert(c.id.clone(), i);
    }
    d.findings = finding_order(s, &filter);
    d.findings_by_request = findings_by_request(s);
    let (chains, chain_request, chain_of) = request_chains(s);
    d.chains = chains;
    d.chain_request = chain_request;
    d.finding_chains = finding_chains(s, &d);
    d.rows = request_rows(s, &d, &chain_of);
    d.request_order = request_order(s, &d.rows, &filter, sort, all_hops);
    d.threads = thread_order(s, &filter);
    d.connections = connection_order(s, &d.rows, &filter);
    d.socket_components = (0..s.components.len())
        .filter(|&i| {
            let c = &s.components[i];
            !c.sockets.is_empty() || s.requests.iter().any(|r| r.component == c.id)
        })
        .collect();
    d.metric_lines = metric_lines(s, &filter);
    d.changes = change_order(s, &filter);
    d.change_children = super::change_fold::fold_children(s, &mut d.changes);
    d.cause = super::cause::cause(s);
    d
}

/// The `/` filter (already lower-cased): empty matches everything, else any part contains it.
fn matches(filter: &str, parts: &[&str]) -> bool {
    filter.is_empty() || parts.iter().any(|p| p.to_lowercase().contains(filter))
}

/// Overview: findings that match the filter, most severe first.
fn finding_order(s: &Snapshot, filter: &str) -> Vec<usize> {
    let mut findings: Vec<usize> = (0..s.findings.len())
        .filter(|&i| {
            let f = &s.findings[i];
            matches(
                filter,
                &[
                    f.kind.as_str(),
                    f.component.as_deref().unwrap_or(""),
                    f.summary.as_str(),
                ],
            )
        })
        .collect();
    findings.sort_by_key(|&i| std::cmp::Reverse(s.findings[i].severity));
    findings
}

/// Request id -> the findings (all of them, unfiltered) that name it.
fn findings_by_request(s: &Snapshot) -> HashMap<String, Vec<usize>> {
    let mut by_request: HashMap<String, Vec<usize>> = HashMap::new();
    for (fi, f) in s.findings.iter().enumerate() {
        for r in &f.requests {
            by_request.entry(r.clone()).or_default().push(fi);
        }
    }
    by_request
}

/// See [`Derived::finding_chains`]. Findings name logical requests. Needs `d.chains` and
/// `d.chain_request`.
fn finding_chains(s: &Snapshot, d: &Derived) -> Vec<Option<usize>> {
    let by_id: HashMap<&str, usize> = d
        .chain_request
        .iter()
        .enumerate()
        .filter_map(|(c, li)| Some((s.logical_requests.get((*li)?)?.id.as_str(), c)))
        .collect();
    s.findings
        .iter()
        .map(|f| {
            f.requests
                .iter()
                .enumerate()
                .filter_map(|(k, id)| Some((k, *by_id.get(id.as_str())?)))
                .max_by_key(|&(k, c)| (d.chains.get(c).map_or(0, Vec::len), std::cmp::Reverse(k)))
                .map(|(_, c)| c)
        })
        .collect()
}

/// Chains: the snapshot's logical requests, their legs in order. Exchanges that are no leg
/// (idle connections) are chains of their own, so every
/// exchange is in exactly one. Returns the chains (members, entry hop first), each chain's
/// logical request and each exchange's chain.
fn request_chains(s: &Snapshot) -> (Vec<Vec<usize>>, Vec<Option<usize>>, Vec<usize>) {
    let by_id: HashMap<&str, usize> = s
        .requests
        .iter()
        .enumerate()
        .map(|(i, r)| (r.id.as_str(), i))
        .collect();
    let mut chains: Vec<Vec<usize>> = Vec::new();
    let mut chain_request = Vec::new();
    let mut chain_of = vec![usize::MAX; s.requests.len()];
    for (li, l) in s.logical_requests.iter().enumerate() {
        let members: Vec<usize> = l
            .legs
            .iter()
            .filter_map(|id| by_id.get(id.as_str()).copied())
            .filter(|&j| chain_of[j] == usize::MAX)
            .collect();
        if members.is_empty() {
            continue;
        }
        for &j in &members {
            chain_of[j] = chains.len();
        }
        chains.push(members);
        chain_request.push(Some(li));
    }
    for (j, c) in chain_of.iter_mut().enumerate() {
        if *c == usize::MAX {
            *c = chains.len();
            chains.push(vec![j]);
            chain_request.push(None);
        }
    }
    (chains, chain_request, chain_of)
}

/// One chain's hop lanes and the lane where its logical request is stuck.
fn chain_lanes(
    s: &Snapshot,
    members: &[usize],
    roles: &[Role],
    logical: Option<&LogicalRequest>,
) -> ([Option<Lane>; 4], Option<usize>) {
    let stuck = logical.is_some_and(|l| l.verdict == Verdict::Stuck);
    let mut lanes: [Option<Lane>; 4] = [None; 4];
    let mut stuck_at = None;
    for &m in members {
        let r = &s.requests[m];
        let lane = lane_of(roles[m]);
        // Every hop still holding a stuck request waits on the hop it is stuck at.
        let held = stuck && in_flight(r.state) && r.state != RequestState::Streaming;
        if logical.is_some_and(|l| l.stuck_leg.is_some() && l.stuck_leg == r.leg) {
            stuck_at = Some(lane);
        }
        // Several exchanges in one lane (retries): the stuck or the most silent one shows.
        let replace = match lanes[lane] {
            None => true,
            Some(l) => (held, r.idle_out_ms) > (l.stuck, l.idle_out_ms),
        };
        if replace {
            lanes[lane] = Some(Lane {
                state: r.state,
                idle_out_ms: r.idle_out_ms,
                stuck: held,
            });
        }
    }
    if stuck && stuck_at.is_none() {
        stuck_at = logical.and_then(|l| l.stuck_role).map(lane_of);
    }
    (lanes, stuck_at)
}

/// One row per exchange, with its chain's lanes and the text the filter matches against.
/// Needs `d.component_index`, `d.chains` and `d.chain_request`.
fn request_rows(s: &Snapshot, d: &Derived, chain_of: &[usize]) -> Vec<RequestRow> {
    let roles: Vec<Role> = s
        .requests
        .iter()
        .map(|r| request_role(s, &d.component_index, r))
        .collect();
    let logical = |chain: usize| d.chain_request[chain].and_then(|li| s.logical_requests.get(li));
    let per_chain: Vec<([Option<Lane>; 4], Option<usize>)> = d
        .chains
        .iter()
        .enumerate()
        .map(|(c, members)| chain_lanes(s, members, &roles, logical(c)))
        .collect();
    s.requests
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let chain = chain_of[i];
            let (lanes, stuck_at) = per_chain[chain];
            let verdict = logical(chain).map(|l| l.verdict);
            let probe = logical(chain).is_some_and(|l| l.probe);
            let mut search = String::with_capacity(96);
            for part in [
                r.id.as_str(),
                r.request.as_deref().unwrap_or(""),
                r.leg.as_deref().unwrap_or(""),
                r.component.as_str(),
                r.client.as_str(),
                r.server.as_str(),
                r.state.as_str(),
                verdict.map_or("", Verdict::as_str),
                stuck_at.map_or("", |l| LANES[l]),
            ] {
                search.push_str(&part.to_lowercase());
                search.push(' ');
            }
            RequestRow {
                index: i,
                chain,
                is_root: d.chains[chain].first() == Some(&i),
                lane: lane_of(roles[i]),
                lanes,
                stuck: verdict == Some(Verdict::Stuck),
                waiting: verdict == Some(Verdict::Waiting) && !probe,
                stuck_at,
                search,
            }
        })
        .collect()
}

/// Requests tab: the rows shown (roots only unless `all_hops`), filtered and sorted.
fn request_order(
    s: &Snapshot,
    rows: &[RequestRow],
    filter: &str,
    sort: SortKey,
    all_hops: bool,
) -> Vec<usize> {
    let mut order: Vec<usize> = rows
        .iter()
        .enumerate()
        .filter(|(_, row)| all_hops || row.is_root)
        .filter(|(_, row)| filter.is_empty() || row.search.contains(filter))
        .map(|(i, _)| i)
        .collect();
    order.sort_by(|&a, &b| compare_rows(s, rows, sort, a, b));
    order
}

/// The Requests tab's order of rows `a` and `b` under `sort`; ties end on the id.
fn compare_rows(
    s: &Snapshot,
    rows: &[RequestRow],
    sort: SortKey,
    a: usize,
    b: usize,
) -> std::cmp::Ordering {
    let key_req = |i: usize| &s.requests[rows[i].index];
    match sort {
        SortKey::Stuck => {
            let (ra, rb) = (&rows[a], &rows[b]);
            rb.stuck
                .cmp(&ra.stuck)
                .then(rb.stuck_at.cmp(&ra.stuck_at))
                // All-hops mode: the deepest hop of a chain first (where it is stuck).
                .then(if ra.stuck && rb.stuck {
                    rb.lane.cmp(&ra.lane)
                } else {
                    std::cmp::Ordering::Equal
                })
                .then(in_flight(key_req(b).state).cmp(&in_flight(key_req(a).state)))
                .then(key_req(b).idle_out_ms.total_cmp(&key_req(a).idle_out_ms))
                .then(key_req(b).age_ms.total_cmp(&key_req(a).age_ms))
                .then(key_req(a).id.cmp(&key_req(b).id))
        }
        SortKey::Age => key_req(b)
            .age_ms
            .total_cmp(&key_req(a).age_ms)
            .then(key_req(a).id.cmp(&key_req(b).id)),
        SortKey::Silence => key_req(b)
            .idle_out_ms
            .total_cmp(&key_req(a).idle_out_ms)
            .then(key_req(a).id.cmp(&key_req(b).id)),
        SortKey::Component => key_req(a)
            .component
            .cmp(&key_req(b).component)
            .then(key_req(a).id.cmp(&key_req(b).id)),
        SortKey::Id => key_req(a).id.cmp(&key_req(b).id),
    }
}

/// Threads tab: threads that match the filter, grouped by component, then pid, tid.
fn thread_order(s: &Snapshot, filter: &str) -> Vec<usize> {
    let mut threads: Vec<usize> = (0..s.threads.len())
        .filter(|&i| {
            let t = &s.threads[i];
            matches(
                filter,
                &[
                    t.component.as_deref().unwrap_or(""),
                    t.name.as_deref().unwrap_or(""),
                    t.state.as_str(),
                    &t.pid.to_string(),
                ],
            )
        })
        .collect();
    threads.sort_by(|&a, &b| {
        let (ta, tb) = (&s.threads[a], &s.threads[b]);
        (ta.component.as_deref(), ta.pid, ta.tid).cmp(&(tb.component.as_deref(), tb.pid, tb.tid))
    });
    threads
}

/// Sockets tab: every exchange that matches the filter, in flight and most silent first.
fn connection_order(s: &Snapshot, rows: &[RequestRow], filter: &str) -> Vec<usize> {
    let mut conns: Vec<usize> = (0..s.requests.len())
        .filter(|&i| rows[i].search.contains(filter))
        .collect();
    conns.sort_by(|&a, &b| {
        let (ra, rb) = (&s.requests[a], &s.requests[b]);
        in_flight(rb.state)
            .cmp(&in_flight(ra.state))
            .then(rb.idle_out_ms.total_cmp(&ra.idle_out_ms))
            .then(ra.id.cmp(&rb.id))
    });
    conns
}

/// Metrics tab: (component, metric) lines that match the filter.
fn metric_lines(s: &Snapshot, filter: &str) -> Vec<(usize, String)> {
    let mut lines = Vec::new();
    for (ci, c) in s.components.iter().enumerate() {
        for name in c.metrics.keys() {
            // Rates are shown next to their metric, not as lines of their own.
            if name.ends_with("_rate") && c.metrics.contains_key(name.trim_end_matches("_rate")) {
                continue;
            }
            if matches(filter, &[&c.id, name]) {
                lines.push((ci, name.clone()));
            }
        }
    }
    lines
}

/// Diff tab: configuration changes that match the filter.
fn change_order(s: &Snapshot, filter: &str) -> Vec<usize> {
    (0..s.config_changed.len())
        .filter(|&i| {
            let ch = &s.config_changed[i];
            matches(
                filter,
                &[
                    &ch.component,
                    &ch.field,
                    ch.key.as_deref().unwrap_or(""),
                    ch.after.as_deref().unwrap_or(""),
                ],
            )
        })
        .collect()
}
