//! The view at one instant: every exchange's derived state, idle keep-alive connections,
//! and the component states the detectors and outputs read.

use super::exchange::{End, Exchange};
use super::requests::{self, LogicalView};
use super::state::{ComponentState, CountSource};
use super::Correlator;
use super::{FastMap, FastSet};
use crate::clock::Millis;
use crate::model::{Request, RequestState, Role};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Requests smaller than this (headers only: `GET /metrics`, `/health`, `/v1/loads`) are
/// probes, not inference requests (a POST with a JSON body is larger).
pub const MIN_INFERENCE_REQUEST_BYTES: u64 = 200;

/// A request of known size too small to be an inference request, or several such probes
/// cut as one exchange ([`Exchange::probe_unit`]).
pub fn is_probe_sized(x: &Exchange) -> bool {
    x.bytes_in > 0 && (x.bytes_in < MIN_INFERENCE_REQUEST_BYTES || x.probe_unit.is_some())
}

/// Two `tcp_info` "ms since" dates this close are the same kernel tick: their order is
/// unknown.
pub const JIFFY_TIE_MS: Millis = 10;

/// One exchange with its derived state at `now`.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestView {
    /// The model's exchange itself, shared.
    pub x: Arc<Exchange>,
    pub state: RequestState,
    pub age_ms: i64,
    pub idle_out_ms: i64,
    /// Index of its logical request in `View::logical`.
    pub request: usize,
    /// Its name as a leg of that request (`r17@decode`).
    pub leg: LegName,
}

/// A leg's name (`r17@decode`, `r17@proxy.2` for a second leg at the same kind of hop),
/// formatted only where it is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LegName {
    /// The number of the logical request (`r<n>`: its first leg's exchange number).
    pub request: u64,
    pub role: Role,
    /// 1 for the first leg at this kind of hop, 2 for the second...
    pub k: u32,
}

impl std::fmt::Display for LegName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "r{}@{}", self.request, self.role)?;
        if self.k > 1 {
            write!(f, ".{}", self.k)?;
        }
        Ok(())
    }
}

/// Everything detectors and outputs need at one instant.
#[derive(Debug, Clone)]
pub struct View {
    pub now: Millis,
    pub requests: Vec<RequestView>,
    /// Open connections with nothing outstanding (keep-alive idle), as `idle` requests.
    pub idle: Vec<Request>,
    pub components: BTreeMap<String, ComponentState>,
    /// Whether request states are current (a usable socket table within `stale_after_ms`);
    /// when false, request-based detectors stay silent.
    pub sockets_fresh: bool,
    /// Logical requests (each exchange is a leg of one) with their verdicts.
    pub logical: Vec<LogicalView>,
    /// Index into `requests` by exchange number (the `n` of `x<n>`).
    index: FastMap<u64, usize>,
}

impl View {
    pub fn request(&self, id: &str) -> Option<&RequestView> {
        self.index_of(id).map(|i| &self.requests[i])
    }
    /// The exchange numbered `n` (the `n` of `x<n>`), when the view reports it.
    pub fn request_by_num(&self, n: u64) -> Option<&RequestView> {
        self.index.get(&n).map(|&i| &self.requests[i])
    }
    /// Index into `requests` of exchange number `n`.
    pub fn index_of_num(&self, n: u64) -> Option<usize> {
        self.index.get(&n).copied()
    }
    /// Index into `requests` of an exchange id.
    pub fn index_of(&self, id: &str) -> Option<usize> {
        self.index.get(&super::exchange_num(id)?).copied()
    }
    /// The logical request an exchange is a leg of.
    pub fn logical_of(&self, r: &RequestView) -> &LogicalView {
        &self.logical[r.request]
    }
    /// Logical requests judged stuck.
    pub fn stuck(&self) -> impl Iterator<Item = &LogicalView> {
        self.logical.iter().filter(|l| l.stuck.is_some())
    }
    /// The hops from the entry hop down to `r`, following parent links.
    pub fn path<'a>(&'a self, r: &'a RequestView) -> Vec<&'a RequestView> {
        let mut out = vec![r];
        let mut cur = r;
        for _ in 0..16 {
            match cur.x.parent.and_then(|p| self.request_by_num(p)) {
                Some(p) => {
                    out.push(p);
                    cur = p;
                }
                None => break,
            }
        }
        out.reverse();
        out
    }
    /// An exchange `r` caused at the next hop that is still outstanding.
    pub fn outstanding_child(&self, r: &RequestView) -> Option<&RequestView> {
        r.x.links
            .iter()
            .filter_map(|&l| self.request_by_num(l))
            .find(|c| View::is_outstanding(c))
    }
    /// Is some request at a component whose client is `comp` still open? Then an unlinked
    /// request at `comp` probably did reach the next hop and the link was missed.
    pub fn downstream_open(&self, comp: &str) -> bool {
        self.requests
            .iter()
            .any(|r| r.x.client_component.as_deref() == Some(comp) && View::is_outstanding(r))
    }
    /// Is some request at a component whose client is `comp` stalled?
    pub fn downstream_stalled(&self, comp: &str) -> bool {
        self.requests.iter().any(|r| {
            r.x.client_component.as_deref() == Some(comp) && r.state == RequestState::Stalled
        })
    }
    /// Still waiting for, or receiving, a response.
    pub fn is_outstanding(r: &RequestView) -> bool {
        matches!(
            r.state,
            RequestState::WaitingFirstByte | RequestState::Streaming | RequestState::Stalled
        )
    }
}

impl Correlator {
    /// The derived state of every exchange at `now`, the component states, and the logical
    /// requests with their verdicts (`requests.rs`).
    pub fn view(&self, now: Millis) -> View {
        let sockets = self.socket_counts_by_component();
        let held = self.held_gpus(now);
        let components: BTreeMap<String, ComponentState> = self
            .topology
            .components
            .iter()
            .map(|c| {
                let counts = sockets.get(c.id.as_str()).cloned().unwrap_or_default();
                (
                    c.id.clone(),
                    self.component_state_with(c, now, counts, &held),
                )
            })
            .collect();
        let scope = self.in_scope(now - self.window_ms);
        let states = self.request_states(&components, &scope, now);
        let keep = kept(&scope, &states, now, now - self.window_ms);
        let mut requests = Vec::with_capacity(keep.iter().filter(|k| **k).count());
        // Where each exchange of the scope went in `requests`, if it did.
        let mut listed_at = vec![u32::MAX; scope.all.len()];
        for (i, x) in scope.all.iter().enumerate() {
            let Some(state) = states[i] else {
                continue;
            };
            if !keep[i] || x.request_ms > now {
                continue;
            }
            listed_at[i] = requests.len() as u32;
            let age_ms = now - x.request_ms;
            let idle_out_ms = now - x.last_out_ms.unwrap_or(x.request_ms).max(x.request_ms);
            requests.push(RequestView {
                x: Arc::clone(x),
                state,
                age_ms,
                idle_out_ms,
                request: 0,
                leg: LegName {
                    request: 0,
                    role: x.role,
                    k: 0,
                },
            });
        }
        let idle = self.idle_connections(&scope, &states, now);
        let index = scope.into_index(&listed_at);
        let sockets_fresh = self
            .last_sockets_ms
            .is_some_and(|t| now - t <= self.thresholds.correlate.stale_after_ms);
        let mut v = View {
            now,
            requests,
            idle,
            components,
            sockets_fresh,
            logical: Vec::new(),
            index,
        };
        requests::group(&mut v);
        requests::judge(self, &mut v);
        v
    }

    /// The exchanges a view at a window starting `from` can report: every unfinished one,
    /// those that ended at or after `from`, and their relatives (as far as [`kept`] follows
    /// them) however old. A view judges its window, not the whole history.
    fn in_scope(&self, from: Millis) -> Scope<'_> {
        // Relatives end close together: with this margin, one outside it is rare.
        let recent = |x: &Exchange| x.end_ms().is_none_or(|t| t >= from - SCOPE_MARGIN_MS);
        // One walk of the history; relatives are sought among the numbers noted.
        let mut scope: Vec<&Arc<Exchange>> = Vec::new();
        let mut older: Vec<(u64, &Arc<Exchange>)> = Vec::new();
        for x in self.exchanges_shared() {
            if recent(x) {
                scope.push(x);
            } else {
                older.push((x.num, x));
            }
        }
        // An idle connection's last exchange never ends, so most views seek old relatives.
        // A link to an evicted exchange is sought once.
        let mut scope = Scope::new(scope);
        let mut evicted: FastSet<u64> = FastSet::default();
        let mut from_ix = 0;
        for _ in 0..KEPT_DEPTH {
            let wanted: FastSet<u64> = scope.all[from_ix..]
                .iter()
                .flat_map(|x| x.links.iter().copied().chain(x.parent))
                .filter(|n| scope.pos(*n).is_none() && !evicted.contains(n))
                .collect();
            if wanted.is_empty() {
                break;
            }
            from_ix = scope.all.len();
            for (n, x) in &older {
                if wanted.contains(n) {
                    scope.push(x);
                }
            }
            evicted.extend(wanted.into_iter().filter(|n| scope.pos(*n).is_none()));
        }
        scope
    }

    /// The state of every exchange of the scope at `now`, by its place in the scope.
    /// Components are judged deepest hop first: a parent is outstanding while a child is.
    fn request_states(
        &self,
        components: &BTreeMap<String, ComponentState>,
        scope: &Scope,
        now: Millis,
    ) -> States {
        let mut states: States = vec![None; scope.all.len()];
        // Each component's exchanges in history order, in one pass.
        let mut by_comp: FastMap<&str, Vec<(usize, &Exchange)>> = FastMap::default();
        let mut run: Option<(&str, Vec<(usize, &Exchange)>)> = None;
        for (i, x) in scope.all.iter().enumerate() {
            match &mut run {
                Some((comp, xs)) if *comp == x.component.as_str() => xs.push((i, x)),
                _ => {
                    if let Some((comp, xs)) = run.take() {
                        by_comp.entry(comp).or_default().extend(xs);
                    }
                    run = Some((x.component.as_str(), vec![(i, Arc::as_ref(x))]));
                }
            }
        }
        if let Some((comp, xs)) = run {
            by_comp.entry(comp).or_default().extend(xs);
        }
        let mut comp_order: Vec<(&String, u8)> = components
            .iter()
            .map(|(id, s)| (id, s.role.depth()))
            .collect();
        comp_order.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        for (cid, _) in comp_order {
            let mine = by_comp.remove(cid.as_str()).unwrap_or_default();
            self.component_request_states(&components[cid], &mine, scope, now, &mut states);
        }
        states
    }

    /// The states of one component's exchanges (`mine`), given those of deeper hops.
    fn component_request_states(
        &self,
        cs: &ComponentState,
        mine: &[(usize, &Exchange)],
        scope: &Scope,
        now: Millis,
        states: &mut States,
    ) {
        let th = &self.thresholds;
        let mut quiet: Vec<(usize, &Exchange)> = Vec::new();
        let mut explained = 0.0;
        for &(i, x) in mine {
            let st = match x.end {
                Some(End::Done(_)) => RequestState::Done,
                Some(End::Closed(_)) => RequestState::Closed,
                // Nothing sent yet, or only response headers: waiting on the server.
                None if x.awaiting_body() => {
                    // The in-flight count covers inference requests only, not probes.
                    if !is_probe_sized(x) {
                        explained += 1.0;
                    }
                    RequestState::WaitingFirstByte
                }
                None => {
                    let q = now - x.last_out_ms.unwrap_or(now);
                    if q < th.correlate.done_quiet_ms {
                        explained += 1.0;
                        RequestState::Streaming
                    } else {
                        quiet.push((i, x));
                        continue;
                    }
                }
            };
            states[i] = Some(st);
        }
        // Quiet responses: outstanding if a child still is, or if the component's own
        // in-flight count says more requests are open than we can otherwise explain.
        quiet.sort_by_key(|(_, x)| std::cmp::Reverse(x.last_out_ms));
        let mut unexplained = outstanding_signal(cs).map_or(0.0, |o| o - explained);
        // The in-flight count is read at another instant than the sockets and cannot say
        // which quiet connection holds a request: an exchange first seen in a jiffy tie
        // (most likely idle keep-alive) is not made outstanding by it.
        let busy = cs.shows_work();
        for (i, x) in quiet {
            // (Every state is of an exchange in scope: a link to one evicted has none.)
            let child_open = x.links.iter().any(|&l| {
                scope.pos(l).and_then(|p| states[p]).is_some_and(|s| {
                    matches!(
                        s,
                        RequestState::WaitingFirstByte
                            | RequestState::Streaming
                            | RequestState::Stalled
                    )
                })
            });
            let outstanding = if child_open {
                true
            } else if busy && jiffy_tie(x) {
                false
            } else if unexplained >= 1.0 {
                unexplained -= 1.0;
                true
            } else {
                false
            };
            let st = if !outstanding {
                RequestState::Done
            } else if jiffy_tie(x) {
                RequestState::WaitingFirstByte
            } else if self.stopped_long_enough(cs, x.last_out_ms.unwrap_or(now), now) {
                RequestState::Stalled
            } else {
                RequestState::Streaming
            };
            states[i] = Some(st);
        }
    }

    /// Whether an outstanding response stream at `cs` whose last byte left at `last_out_ms`
    /// has stopped for as long as its witnesses say (`verdict.rs`): `stall_after_ms`, sooner
    /// while nothing at its engine works.
    fn stopped_long_enough(&self, cs: &ComponentState, last_out_ms: Millis, now: Millis) -> bool {
        let th = &self.thresholds.correlate;
        let quiet = now - last_out_ms;
        // Most streams stop here, cheaply; past the slow rule no witness can say otherwise.
        if quiet < th.stall_soonest_ms() {
            return false;
        }
        if quiet >= th.stall_after_ms {
            return true;
        }
        let w = super::kind_witnesses::of_stopped_stream(self, cs, last_out_ms, now);
        quiet >= w.stall_wait(th)
    }

    /// Open connections with nothing outstanding (keep-alive idle), as `idle` requests.
    fn idle_connections(&self, scope: &Scope, states: &States, now: Millis) -> Vec<Request> {
        let mut idle = Vec::new();
        for c in self.conns.values().filter(|c| c.closed_ms.is_none()) {
            let busy = c.exchanges.back().is_some_and(|x| {
                scope
                    .pos(x.num)
                    .and_then(|p| states[p])
                    .is_some_and(|s| !matches!(s, RequestState::Done | RequestState::Closed))
            });
            if busy {
                continue;
            }
            let last = c.last_in_ms.max(c.last_out_ms).unwrap_or(c.first_seen_ms);
            idle.push(Request {
                id: format!("c{}", c.id),
                component: c.component.clone(),
                client: c.key.remote.clone(),
                server: c.key.local.clone(),
                state: RequestState::Idle,
                age_ms: (now - c.first_seen_ms).max(0) as f64,
                bytes_in: 0,
                bytes_out: 0,
                idle_out_ms: (now - last).max(0) as f64,
                links: Vec::new(),
                role: Some(c.role),
                client_component: c.client_component.clone(),
                link_confidence: None,
                started_at: None,
                request: None,
                leg: None,
            });
        }
        idle
    }
}

/// How many requests the component itself says are open: its inference in-flight gauge,
/// else `/v1/loads` (fresh during a stall, unlike the gauges), else the router's count for
/// it (not for a prefill: the router counts a PD request against its decode worker).
fn outstanding_signal(cs: &ComponentState) -> Option<f64> {
    cs.http_active
        .or_else(|| {
            cs.running
                .filter(|r| r.1 == CountSource::V1Loads)
                .map(|r| r.0 + cs.queued.map_or(0.0, |q| q.0))
        })
        .or(if cs.role == Role::Prefill {
            None
        } else {
            cs.router_active
        })
}

/// First seen with the request's and the previous response's last bytes in one kernel tick,
/// and no byte out since: if open, a request waiting for its first byte, not a stopped
/// stream.
fn jiffy_tie(x: &Exchange) -> bool {
    x.seen_mid_flight
        && x.bytes_out == 0
        && x.first_byte_ms
            .is_some_and(|f| (f - x.request_ms).abs() <= JIFFY_TIE_MS)
}

/// How long before its window a finished exchange stays in a view's scope without being
/// sought as a relative.
const SCOPE_MARGIN_MS: Millis = 5_000;

/// How many links deep a reported exchange pulls in its relatives.
const KEPT_DEPTH: usize = 8;

/// Each exchange's state by its place in the scope (none: evicted relatives' states are
/// not judged).
type States = Vec<Option<RequestState>>;

/// The exchanges a view judges, and where each one's number is among them (the one map a
/// view builds; the rest are arrays by place).
struct Scope<'m> {
    all: Vec<&'m Arc<Exchange>>,
    at: FastMap<u64, usize>,
}

impl<'m> Scope<'m> {
    fn new(all: Vec<&'m Arc<Exchange>>) -> Scope<'m> {
        let at = all.iter().enumerate().map(|(i, x)| (x.num, i)).collect();
        Scope { all, at }
    }

    fn push(&mut self, x: &'m Arc<Exchange>) {
        self.at.insert(x.num, self.all.len());
        self.all.push(x);
    }

    /// The place of exchange number `n`, when in scope.
    fn pos(&self, n: u64) -> Option<usize> {
        self.at.get(&n).copied()
    }

    /// The view's index (exchange number -> place in its requests) from where each place was
    /// listed (`u32::MAX`: not listed).
    fn into_index(self, listed_at: &[u32]) -> FastMap<u64, usize> {
        let mut index = self.at;
        index.retain(|_, p| match listed_at[*p] {
            u32::MAX => false,
            at => {
                *p = at as usize;
                true
            }
        });
        index
    }
}

/// Exchanges reported at `now`, by place in the scope: those with a state, except finished
/// ones older than the window (`from`), unless a reported exchange links to them (or they
/// link to one): a chain is shown whole.
fn kept(scope: &Scope, states: &States, now: Millis, from: Millis) -> Vec<bool> {
    let mut keep = vec![false; scope.all.len()];
    let mut frontier: Vec<usize> = Vec::new();
    for (i, x) in scope.all.iter().enumerate() {
        let Some(state) = states[i] else {
            continue;
        };
        let finished = matches!(state, RequestState::Done | RequestState::Closed);
        if x.request_ms <= now && !(finished && x.end_ms().unwrap_or(x.last_activity_ms()) < from) {
            keep[i] = true;
            frontier.push(i);
        }
    }
    for _ in 0..KEPT_DEPTH {
        let mut next = Vec::new();
        for i in frontier {
            let x = scope.all[i];
            for rel in x.links.iter().copied().chain(x.parent) {
                if let Some(p) = scope.pos(rel).filter(|&p| !keep[p]) {
                    keep[p] = true;
                    next.push(p);
                }
            }
        }
        if next.is_empty() {
            break;
        }
        frontier = next;
    }
    keep
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leg_name_numbers_only_a_second_leg_at_one_kind_of_hop() {
        let leg = |k| LegName {
            request: 17,
            role: Role::Decode,
            k,
        };
        assert_eq!(leg(1).to_string(), "r17@decode");
        assert_eq!(leg(2).to_string(), "r17@decode.2");
    }
}
