//! What the views list, derived from the snapshot on screen once per frame, filter or sort
//! change (never while rendering): finding order, request chains and their hop lanes, and
//! each view's rows.

use super::SortKey;
use crate::model::{Request, RequestState, Role, Snapshot};
use std::collections::HashMap;

/// The hop lanes of the Requests view.
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

/// One exchange with what the Requests view needs about its chain, computed once per frame.
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
    /// The chain has a stuck hop.
    pub stuck: bool,
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
    /// Rows shown in the Requests view, in order (indices into `rows`).
    pub request_order: Vec<usize>,
    /// Members of each chain (indices into `snapshot.requests`), root first.
    pub chains: Vec<Vec<usize>>,
    /// Threads shown, grouped by component then pid, tid (indices into `snapshot.threads`).
    pub threads: Vec<usize>,
    /// Exchanges for the Sockets connection list, longest silence first.
    pub connections: Vec<usize>,
    /// Component id -> index.
    pub component_index: HashMap<String, usize>,
    /// Request id -> findings indices that name it.
    pub findings_by_request: HashMap<String, Vec<usize>>,
    /// Metrics view lines: (component index, metric name).
    pub metric_lines: Vec<(usize, String)>,
    /// Diff view: indices into `config_changed`.
    pub changes: Vec<usize>,
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

fn is_stuck(r: &Request, stuck_after_ms: f64) -> bool {
    matches!(
        r.state,
        RequestState::WaitingFirstByte | RequestState::Stalled
    ) && r.idle_out_ms >= stuck_after_ms
}

/// Computes everything the views list, once per frame/filter/sort change.
pub fn derive(
    s: &Snapshot,
    filter: &str,
    sort: SortKey,
    all_hops: bool,
    stuck_after_ms: f64,
) -> Derived {
    let filter = filter.to_lowercase();
    let mut d = Derived::default();
    for (i, c) in s.components.iter().enumerate() {
        d.component_index.insert(c.id.clone(), i);
    }

    let mut findings: Vec<usize> = (0..s.findings.len())
        .filter(|&i| {
            let f = &s.findings[i];
            filter.is_empty()
                || [
                    f.kind.as_str(),
                    f.component.as_deref().unwrap_or(""),
                    f.summary.as_str(),
                ]
                .iter()
                .any(|p| p.to_lowercase().contains(&filter))
        })
        .collect();
    findings.sort_by_key(|&i| std::cmp::Reverse(s.findings[i].severity));
    d.findings = findings;
    for (fi, f) in s.findings.iter().enumerate() {
        for r in &f.requests {
            d.findings_by_request.entry(r.clone()).or_default().push(fi);
        }
    }

    // Chains: roots are exchanges nobody links to; walk links breadth first. Exchanges left
    // over (a link cycle) start their own chain, so every exchange is in exactly one.
    let by_id: HashMap<&str, usize> = s
        .requests
        .iter()
        .enumerate()
        .map(|(i, r)| (r.id.as_str(), i))
        .collect();
    let mut linked = vec![false; s.requests.len()];
    for r in &s.requests {
        for l in &r.links {
            if let Some(&j) = by_id.get(l.as_str()) {
                linked[j] = true;
            }
        }
    }
    let mut chain_of = vec![usize::MAX; s.requests.len()];
    let starts = (0..s.requests.len())
        .filter(|&i| !linked[i])
        .chain(0..s.requests.len());
    for start in starts {
        if chain_of[start] != usize::MAX {
            continue;
        }
        let chain = d.chains.len();
        let mut members = vec![start];
        chain_of[start] = chain;
        let mut k = 0;
        while k < members.len() {
            let r = &s.requests[members[k]];
            for l in &r.links {
                if let Some(&j) = by_id.get(l.as_str()) {
                    if chain_of[j] == usize::MAX {
                        chain_of[j] = chain;
                        members.push(j);
                    }
                }
            }
            k += 1;
        }
        d.chains.push(members);
    }

    // Lanes per chain.
    let roles: Vec<Role> = s
        .requests
        .iter()
        .map(|r| request_role(s, &d.component_index, r))
        .collect();
    let mut chain_lanes: Vec<[Option<Lane>; 4]> = Vec::with_capacity(d.chains.len());
    let mut chain_stuck_at: Vec<Option<usize>> = Vec::with_capacity(d.chains.len());
    for members in &d.chains {
        let mut lanes: [Option<Lane>; 4] = [None; 4];
        let mut stuck_at = None;
        for &m in members {
            let r = &s.requests[m];
            let lane = lane_of(roles[m]);
            let stuck = is_stuck(r, stuck_after_ms) || d.findings_by_request.contains_key(&r.id);
            let stuck = stuck && r.state != RequestState::Done && r.state != RequestState::Closed;
            // Several exchanges in one lane (retries): the stuck or the most silent one shows.
            let replace = match lanes[lane] {
                None => true,
                Some(l) => (stuck, r.idle_out_ms) > (l.stuck, l.idle_out_ms),
            };
            if replace {
                lanes[lane] = Some(Lane {
                    state: r.state,
                    idle_out_ms: r.idle_out_ms,
                    stuck,
                });
            }
            if stuck {
                stuck_at = Some(stuck_at.map_or(lane, |s: usize| s.max(lane)));
            }
        }
        chain_lanes.push(lanes);
        chain_stuck_at.push(stuck_at);
    }

    d.rows = s
        .requests
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let chain = chain_of[i];
            let stuck_at = chain_stuck_at[chain];
            let mut search = String::with_capacity(96);
            for part in [
                r.id.as_str(),
                r.component.as_str(),
                r.client.as_str(),
                r.server.as_str(),
                r.state.as_str(),
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
                lanes: chain_lanes[chain],
                stuck: stuck_at.is_some(),
                stuck_at,
                search,
            }
        })
        .collect();

    let mut order: Vec<usize> = d
        .rows
        .iter()
        .enumerate()
        .filter(|(_, row)| all_hops || row.is_root)
        .filter(|(_, row)| filter.is_empty() || row.search.contains(&filter))
        .map(|(i, _)| i)
        .collect();
    let key_req = |i: usize| &s.requests[d.rows[i].index];
    match sort {
        SortKey::Stuck => order.sort_by(|&a, &b| {
            let (ra, rb) = (&d.rows[a], &d.rows[b]);
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
        }),
        SortKey::Age => order.sort_by(|&a, &b| {
            key_req(b)
                .age_ms
                .total_cmp(&key_req(a).age_ms)
                .then(key_req(a).id.cmp(&key_req(b).id))
        }),
        SortKey::Silence => order.sort_by(|&a, &b| {
            key_req(b)
                .idle_out_ms
                .total_cmp(&key_req(a).idle_out_ms)
                .then(key_req(a).id.cmp(&key_req(b).id))
        }),
        SortKey::Component => order.sort_by(|&a, &b| {
            key_req(a)
                .component
                .cmp(&key_req(b).component)
                .then(key_req(a).id.cmp(&key_req(b).id))
        }),
        SortKey::Id => order.sort_by(|&a, &b| key_req(a).id.cmp(&key_req(b).id)),
    }
    d.request_order = order;

    let matches = |parts: &[&str]| {
        filter.is_empty() || parts.iter().any(|p| p.to_lowercase().contains(&filter))
    };

    let mut threads: Vec<usize> = (0..s.threads.len())
        .filter(|&i| {
            let t = &s.threads[i];
            matches(&[
                t.component.as_deref().unwrap_or(""),
                t.name.as_deref().unwrap_or(""),
                &t.state,
                &t.pid.to_string(),
            ])
        })
        .collect();
    threads.sort_by(|&a, &b| {
        let (ta, tb) = (&s.threads[a], &s.threads[b]);
        (ta.component.as_deref(), ta.pid, ta.tid).cmp(&(tb.component.as_deref(), tb.pid, tb.tid))
    });
    d.threads = threads;

    let mut conns: Vec<usize> = (0..s.requests.len())
        .filter(|&i| d.rows[i].search.contains(&filter))
        .collect();
    conns.sort_by(|&a, &b| {
        let (ra, rb) = (&s.requests[a], &s.requests[b]);
        in_flight(rb.state)
            .cmp(&in_flight(ra.state))
            .then(rb.idle_out_ms.total_cmp(&ra.idle_out_ms))
            .then(ra.id.cmp(&rb.id))
    });
    d.connections = conns;

    for (ci, c) in s.components.iter().enumerate() {
        for name in c.metrics.keys() {
            // Rates are shown next to their metric, not as lines of their own.
            if name.ends_with("_rate") && c.metrics.contains_key(name.trim_end_matches("_rate")) {
                continue;
            }
            if matches(&[&c.id, name]) {
                d.metric_lines.push((ci, name.clone()));
            }
        }
    }

    d.changes = (0..s.config_changed.len())
        .filter(|&i| {
            let ch = &s.config_changed[i];
            matches(&[
                &ch.component,
                &ch.field,
                ch.key.as_deref().unwrap_or(""),
                ch.after.as_deref().unwrap_or(""),
            ])
        })
        .collect();
    d
}
