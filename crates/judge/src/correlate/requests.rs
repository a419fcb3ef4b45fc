//! Logical requests and their verdicts, computed once per view.
//!
//! A logical request (`r17`) is the chain of exchanges, one leg per hop (`r17@proxy`,
//! `r17@decode`), that its client's request crossed. Its verdict (stuck / waiting / active /
//! done) and, when stuck, the leg it is stuck at are decided here once; detectors, report
//! and TUI only read them, so a finding's ids and the TUI's "(N stuck)" are one set.
//!
//! The rules per kind (no response byte, KV transfer stall, stopped stream, PD cause and
//! consequence, busy engines) are `wedged_request`, `kv_transfer_stalled` and
//! `stalled_stream` in docs/findings.md. Probes are never stuck.

use super::blame::{self, Blame};
use super::exchange::Exchange;
use super::kind_witnesses;
use super::state::{ComponentState, WorkSignal};
use super::verdict::{self, Witnesses, WORK_SETTLE_MS};
use super::view::{is_probe_sized, LegName, RequestView, View};
use super::Correlator;
use crate::clock::Millis;
use crate::correlate::GpuActivity;
use crate::model::{RequestState, Role, StuckKind, Verdict, WaitReason};
use std::collections::{BTreeMap, BTreeSet};

/// One logical request in a view.
#[derive(Debug, Clone, PartialEq)]
pub struct LogicalView {
    /// The number of its first leg's exchange: its id is `r<num>` ([`LogicalView::id`]).
    pub num: u64,
    /// Indices into `View::requests`, the entry hop first.
    pub legs: Vec<usize>,
    pub verdict: Verdict,
    /// Too small to be an inference request: never stuck.
    pub probe: bool,
    pub stuck: Option<StuckLeg>,
    /// When waiting: the leg it waits at (index into `View::requests`) and why it is not
    /// stuck there (`waiting::why`).
    pub waiting: Option<(usize, WaitReason)>,
}

impl LogicalView {
    /// `r` and the number of its first leg's exchange (`r17`).
    pub fn id(&self) -> String {
        format!("r{}", self.num)
    }
}

/// Where and how a stuck logical request is stuck.
#[derive(Debug, Clone, PartialEq)]
pub struct StuckLeg {
    /// Index into `View::requests`.
    pub leg: usize,
    pub kind: StuckKind,
    /// Why a busy engine is blamed anyway (shared by every request stuck at that engine).
    pub busy: Option<BusyNote>,
    /// PD: the other legs (indices into `View::requests`) that wait because of this one.
    pub consequences: Vec<usize>,
    /// No response byte: the witnesses its wait was judged on.
    pub witnesses: Option<Witnesses>,
    /// Whom its finding blames: the hop it waits at, or a cause past it (`blame.rs`).
    pub blame: Blame,
    /// A KV transfer stall (`StuckKind::KvTransfer`): the pair and what shows it.
    pub kv: Option<super::kv_stall::KvStall>,
}

/// Why requests at an engine that shows work are stuck anyway.
#[derive(Debug, Clone, PartialEq)]
pub enum BusyNote {
    /// The engine's work counters have not moved since they arrived; `earlier` is the work
    /// seen over the rate window.
    NothingSince { earlier: Vec<WorkSignal> },
    /// At least this many later comparable requests were answered meanwhile.
    Overtaken { n: usize, working: Vec<WorkSignal> },
}

/// Smallest request (bytes) that counts as "a later request answered meanwhile": health
/// checks and scrapes are smaller.
const OVERTAKE_MIN_BYTES_IN: u64 = 256;

/// Groups the view's exchanges into logical requests by the hop links and names each leg.
/// Every exchange is a leg of exactly one (leftovers of a link cycle start their own).
pub(super) fn group(v: &mut View) {
    let n = v.requests.len();
    let mut of = vec![usize::MAX; n];
    let mut logical: Vec<LogicalView> = Vec::new();
    let is_entry = |r: &RequestView| r.x.parent.and_then(|p| v.index_of_num(p)).is_none();
    let starts: Vec<usize> = (0..n)
        .filter(|&i| is_entry(&v.requests[i]))
        .chain(0..n)
        .collect();
    for start in starts {
        if of[start] != usize::MAX {
            continue;
        }
        let li = logical.len();
        of[start] = li;
        let mut legs = vec![start];
        let mut k = 0;
        while k < legs.len() {
            for &l in &v.requests[legs[k]].x.links {
                if let Some(j) = v.index_of_num(l).filter(|&j| of[j] == usize::MAX) {
                    of[j] = li;
                    legs.push(j);
                }
            }
            k += 1;
        }
        logical.push(LogicalView {
            num: v.requests[start].x.num,
            probe: legs.iter().any(|&i| is_probe_sized(&v.requests[i].x)),
            legs,
            verdict: Verdict::Done,
            stuck: None,
            waiting: None,
        });
    }
    // Legs per kind of hop so far in one logical request (one list reused for all).
    let mut seen: Vec<(Role, u32)> = Vec::new();
    for l in &logical {
        seen.clear();
        for &i in &l.legs {
            let r = &mut v.requests[i];
            let at = match seen.iter().position(|(role, _)| *role == r.x.role) {
                Some(at) => at,
                None => {
                    seen.push((r.x.role, 0));
                    seen.len() - 1
                }
            };
            seen[at].1 += 1;
            // A second leg at the same kind of hop (a retry, two proxies): numbered.
            r.leg = LegName {
                request: l.num,
                role: r.x.role,
                k: seen[at].1,
            };
        }
    }
    for (li, l) in logical.iter().enumerate() {
        for &i in &l.legs {
            v.requests[i].request = li;
        }
    }
    v.logical = logical;
}

/// Decides every logical request's verdict at `v.now`.
pub(super) fn judge(m: &Correlator, v: &mut View) {
    let mut stuck: BTreeMap<usize, StuckLeg> = BTreeMap::new();
    // Stale sockets: a request only looks old because nobody looked.
    if v.sockets_fresh {
        let mut found: Vec<StuckLeg> = no_response(m, v);
        found.extend(stalled(m, v));
        // No response before stalled, then the deepest hop first.
        found.sort_by_key(|s| s.kind.blame_key(v.requests[s.leg].x.role));
        // A KV transfer stall first: it replaces the verdicts of its legs.
        for s in super::kv_stall::kv_stalled(m, v).into_iter().chain(found) {
            let li = v.requests[s.leg].request;
            // One leg per logical request: the first judged.
            stuck.entry(li).or_insert(s);
        }
    }
    for li in 0..v.logical.len() {
        let s = stuck.remove(&li);
        let verdict = if s.is_some() {
            Verdict::Stuck
        } else {
            Verdict::of_unstuck(v.logical[li].legs.iter().map(|&i| v.requests[i].state))
        };
        v.logical[li].verdict = verdict;
        v.logical[li].stuck = s;
        v.logical[li].waiting = match verdict {
            Verdict::Waiting => super::waiting::why(m, v, &v.logical[li]),
            _ => None,
        };
    }
}

/// Legs stuck without a response byte.
fn no_response(m: &Correlator, v: &View) -> Vec<StuckLeg> {
    let waiting = waiting_at_deepest_hop(v);
    let mut witnessed = waited_long_enough(m, v, &waiting);
    let leaves = witnessed.keys().copied().collect();
    let (leaves, consequences) = split_off_decode_legs(v, &waiting, leaves);
    let mut out = Vec::new();
    for (comp, ls) in by_component(v, leaves) {
        let cs = v.components.get(&comp);
        let Some(ls) = drop_excused(v, cs, ls) else {
            continue;
        };
        let ls = stuck_past_hop(ls, &mut witnessed, &mut out);
        if ls.is_empty() {
            continue;
        }
        let (ls, busy) = match cs {
            Some(cs) => match judge_busy_engine(m, v, &comp, cs, ls) {
                Some(judged) => judged,
                None => continue,
            },
            None => (ls, None),
        };
        for &leg in &ls {
            let parent = v.requests[leg].x.parent;
            let deps = consequences
                .iter()
                .copied()
                .filter(|&d| parent.is_some() && v.requests[d].x.parent == parent)
                .collect();
            out.push(StuckLeg {
                leg,
                kind: StuckKind::NoResponse,
                busy: busy.clone(),
                consequences: deps,
                witnesses: witnessed.remove(&leg).map(|(w, _)| w),
                blame: Blame::Here,
                kv: None,
            });
        }
    }
    out
}

/// Adds to `out` the legs of `ls` with a cause past their hop (`blame.rs`): stuck whatever
/// the engine's load, since they cannot move. Returns the others.
fn stuck_past_hop(
    ls: Vec<usize>,
    witnessed: &mut BTreeMap<usize, (Witnesses, Blame)>,
    out: &mut Vec<StuckLeg>,
) -> Vec<usize> {
    let mut rest = Vec::new();
    for leg in ls {
        match witnessed.remove(&leg) {
            Some((w, b)) if b != Blame::Here => out.push(StuckLeg {
                leg,
                kind: StuckKind::NoResponse,
                busy: None,
                consequences: Vec::new(),
                witnesses: Some(w),
                blame: b,
                kv: None,
            }),
            found => {
                if let Some(found) = found {
                    witnessed.insert(leg, found);
                }
                rest.push(leg);
            }
        }
    }
    rest
}

/// Requests waiting for their first byte at the deepest hop holding them (no outstanding
/// child; a proxy/router only if nothing it sent downstream is open), probes left out.
fn waiting_at_deepest_hop(v: &View) -> Vec<usize> {
    (0..v.requests.len())
        .filter(|&i| {
            let r = &v.requests[i];
            r.state == RequestState::WaitingFirstByte
                && !v.logical[r.request].probe
                && v.outstanding_child(r).is_none()
                && (r.x.role.is_engine() || !v.downstream_open(&r.x.component))
        })
        .collect()
}

/// PD: when both legs of one request wait, the leg that is the cause: prefill, unless
/// prefill waits for decode to connect (its bootstrap queue).
pub fn pd_cause(prefill_waits_for_decode: bool) -> Role {
    if prefill_waits_for_decode {
        Role::Decode
    } else {
        Role::Prefill
    }
}

/// Of `waiting`, those that waited since their last request byte as long as their witnesses
/// say (`verdict.rs`), with those witnesses and their cause ([`Blame::Here`]: at their hop).
fn waited_long_enough(
    m: &Correlator,
    v: &View,
    waiting: &[usize],
) -> BTreeMap<usize, (Witnesses, Blame)> {
    let th = &m.thresholds.correlate;
    let mut last_sent: BTreeMap<&str, Option<Millis>> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for &i in waiting {
        let r = &v.requests[i];
        let waited = v.now - r.x.last_request_ms;
        // Most waiting requests stop here, cheaply.
        if waited < th.wedged_soonest_ms() {
            continue;
        }
        let comp = r.x.component.as_str();
        let sent = *last_sent
            .entry(comp)
            .or_insert_with(|| blame::last_answer_byte(m, comp));
        let b = blame::past_hop(m, v, i, sent).unwrap_or(Blame::Here);
        let w = kind_witnesses::of_blamed(m, v, i, &b);
        if waited >= w.wedged_wait(th) {
            out.insert(i, (w, b));
        }
    }
    out
}

/// A leg at an engine nothing is seen working for, not judged yet, that a longer look may
/// judge.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingVerdict {
    /// The leg (`r17@decode`) and where it waits.
    pub leg: LegName,
    pub component: String,
    pub waited_ms: Millis,
    /// Its wait once the witnesses that need a longer look (a second dump) turned.
    pub wait_ms: Millis,
    /// How much longer to look for its verdict (at least 1 s).
    pub more_ms: Millis,
}

/// The pending verdict that needs the longest look, if any: a leg at an engine silent for
/// at least `silent_ms` (waiting for its first byte, or its response stream stopped), no
/// witness of its kind saw work, its verdict due within `within_ms`.
pub fn pending_verdict(
    m: &Correlator,
    v: &View,
    silent_ms: Millis,
    within_ms: Millis,
) -> Option<PendingVerdict> {
    if !v.sockets_fresh {
        return None;
    }
    let th = &m.thresholds.correlate;
    let witnesses = kind_witnesses::LegWitnesses::new(m, v);
    let eligible = |&(i, waited_ms): &(usize, Millis)| {
        let r = &v.requests[i];
        r.x.role.is_engine() && v.logical_of(r).stuck.is_none() && waited_ms >= silent_ms
    };
    // (leg, how long it waited, whether work was seen, its wait after a longer look)
    let waiting = waiting_at_deepest_hop(v)
        .into_iter()
        .map(|i| (i, v.now - v.requests[i].x.last_request_ms))
        .filter(eligible)
        .map(|(i, waited_ms)| {
            let w = witnesses.of(i);
            let wait = w.wait_after_longer_look(th.wedged_soonest_ms(), th.wedged_after_ms);
            (i, waited_ms, w.saw_work(), wait)
        });
    let streams = stopped_streams(v, th.done_quiet_ms)
        .into_iter()
        .filter_map(|i| Some((i, v.now - v.requests[i].x.last_out_ms?)))
        .filter(eligible)
        .filter_map(|(i, waited_ms)| {
            let w = witnesses.of_stream(i)?;
            let wait = w.wait_after_longer_look(th.stall_soonest_ms(), th.stall_after_ms);
            Some((i, waited_ms, w.saw_work(), wait))
        });
    waiting
        .chain(streams)
        .filter(|(_, _, saw_work, _)| !saw_work)
        .filter_map(|(i, waited_ms, _, wait_ms)| {
            let r = &v.requests[i];
            let more_ms = (wait_ms - waited_ms).max(1000);
            (more_ms <= within_ms).then(|| PendingVerdict {
                leg: r.leg,
                component: r.x.component.clone(),
                waited_ms,
                wait_ms,
                more_ms,
            })
        })
        .max_by_key(|p| p.more_ms)
}

/// Response streams still open whose bytes stopped (`done_quiet_ms` ago or more) at the
/// deepest hop holding them, not judged stalled yet, probes left out.
fn stopped_streams(v: &View, done_quiet_ms: Millis) -> Vec<usize> {
    (0..v.requests.len())
        .filter(|&i| {
            let r = &v.requests[i];
            r.state == RequestState::Streaming
                && r.x.last_out_ms.is_some_and(|t| v.now - t >= done_quiet_ms)
                && !v.logical[r.request].probe
                && v.outstanding_child(r).is_none()
        })
        .collect()
}

/// PD: when both legs of one request wait, sets aside the consequence ([`pd_cause`] names
/// the cause); a prefill's waiting legs up to its bootstrap queue's count are set aside too,
/// since a mislinked decode leg may hide them. Returns the leaves to judge and those set aside.
fn split_off_decode_legs(
    v: &View,
    waiting: &[usize],
    mut leaves: Vec<usize>,
) -> (Vec<usize>, Vec<usize>) {
    let bootstrap_of = |x: &Exchange| {
        v.components
            .get(&x.component)
            .and_then(|cs| cs.pd_bootstrap)
            .unwrap_or(0.0)
    };
    let waits_for_decode = |x: &Exchange| bootstrap_of(x) > 0.0;
    let parents_of = |legs: &[usize], keep: &dyn Fn(&Exchange) -> bool| -> BTreeSet<u64> {
        legs.iter()
            .map(|&i| &v.requests[i].x)
            .filter(|x| keep(x))
            .filter_map(|x| x.parent)
            .collect()
    };
    let blamed_prefill = parents_of(waiting, &|x| {
        x.role == Role::Prefill && pd_cause(waits_for_decode(x)) == Role::Prefill
    });
    let waiting_prefill = parents_of(&leaves, &|x| {
        x.role == Role::Prefill && pd_cause(waits_for_decode(x)) == Role::Decode
    });
    let decode = parents_of(&leaves, &|x| x.role == Role::Decode);
    let mut consequences = Vec::new();
    leaves.retain(|&i| {
        let x = &v.requests[i].x;
        let dependent = match (x.role, x.parent) {
            (Role::Decode, Some(p)) => blamed_prefill.contains(&p),
            (Role::Prefill, Some(p)) => waiting_prefill.contains(&p) && decode.contains(&p),
            _ => false,
        };
        if dependent {
            consequences.push(i);
        }
        !dependent
    });
    let mut held: BTreeMap<&str, f64> = BTreeMap::new();
    leaves.retain(|&i| {
        let x = &v.requests[i].x;
        if x.role != Role::Prefill || !waits_for_decode(x) {
            return true;
        }
        let n = held.entry(x.component.as_str()).or_insert(0.0);
        *n += 1.0;
        *n > bootstrap_of(x)
    });
    (leaves, consequences)
}

fn by_component(v: &View, leaves: Vec<usize>) -> BTreeMap<String, Vec<usize>> {
    let mut m: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for l in leaves {
        m.entry(v.requests[l].x.component.clone())
            .or_default()
            .push(l);
    }
    m
}

/// Drops what is another detector's or no inference request at all; `None` when nothing is
/// left at this component.
fn drop_excused(v: &View, cs: Option<&ComponentState>, mut ls: Vec<usize>) -> Option<Vec<usize>> {
    if let Some(cs) = cs {
        // A spinning GPU is busy_without_progress's case, not a forgotten request.
        if cs.gpu_activity == GpuActivity::Spinning {
            return None;
        }
        // The engine counts no open inference request: a waiting request from outside the
        // stack is a hung probe, not a forgotten inference request.
        if cs.role.is_engine() && cs.http_active == Some(0.0) {
            ls.retain(|&i| v.requests[i].x.client_component.is_some());
            if ls.is_empty() {
                return None;
            }
        }
    }
    Some(ls)
}

/// Busy engines are usually slow, not forgetful: on an engine with work signals, keeps only
/// the requests it did nothing for since they arrived, or else those overtaken by at least
/// `wedged_overtaken_min` later ones, with a note saying which; `None` when none is left.
fn judge_busy_engine(
    m: &Correlator,
    v: &View,
    comp: &str,
    cs: &ComponentState,
    mut ls: Vec<usize>,
) -> Option<(Vec<usize>, Option<BusyNote>)> {
    let working = cs.work_signals();
    if working.is_empty() {
        return Some((ls, None));
    }
    // The rates span `rate_window_ms`, so may show work done before these arrived: ask the
    // counters since each arrival.
    let working_now = working.iter().any(|w| w.is_current());
    let idle_since: Vec<usize> = if working_now {
        Vec::new()
    } else {
        ls.iter()
            .copied()
            .filter(|&i| {
                let since = v.requests[i].x.last_request_ms + WORK_SETTLE_MS;
                verdict::counters(m, comp, since, v.now).is_quiet()
            })
            .collect()
    };
    if !idle_since.is_empty() {
        let note = BusyNote::NothingSince { earlier: working };
        return Some((idle_since, Some(note)));
    }
    // Unless later requests were served while these waited.
    ls.retain(|&i| overtaken(m, &v.requests[i]) >= m.thresholds.correlate.wedged_overtaken_min);
    let n = ls.iter().map(|&i| overtaken(m, &v.requests[i])).min()?;
    Some((ls, Some(BusyNote::Overtaken { n, working })))
}

/// Requests that arrived later at the same component from the same upstream hop, of
/// comparable size, and were answered meanwhile (whole history, not only the window).
/// "Comparable" is in `wedged_request` in docs/findings.md: half the size where the engine
/// prefills (none when its size is unknown); any inference-sized request at a PD decode,
/// including a stream first seen under way ([`super::exchange::Exchange::seen_streaming`]).
fn overtaken(m: &Correlator, r: &RequestView) -> usize {
    let any_inference = r.x.role == Role::Decode;
    if !any_inference && r.x.bytes_in == 0 {
        // Size unknown (first seen under way) where the engine prefills: it may be a long
        // prompt that shorter later ones rightly pass in chunked prefill.
        return 0;
    }
    let min_in = if any_inference {
        OVERTAKE_MIN_BYTES_IN
    } else {
        (r.x.bytes_in / 2).max(OVERTAKE_MIN_BYTES_IN)
    };
    m.exchanges()
        .filter(|o| o.component == r.x.component && o.request_ms > r.x.request_ms + 1000)
        .filter(|o| o.client_component == r.x.client_component)
        .filter(|o| o.bytes_in >= min_in || (any_inference && o.seen_streaming()))
        .filter(|o| o.answered())
        .count()
}

/// Legs whose response stream stopped: stalled at the deepest stalled hop, at a component
/// that shows no work and whose GPU is not spinning, with the witnesses that judged them.
fn stalled(m: &Correlator, v: &View) -> Vec<StuckLeg> {
    let leaves: Vec<usize> = (0..v.requests.len())
        .filter(|&i| {
            let r = &v.requests[i];
            r.state == RequestState::Stalled
                && !v.logical[r.request].probe
                && v.outstanding_child(r).is_none()
                // A proxy/router stream stopped with one downstream is its consequence,
                // linked or not.
                && (r.x.role.is_engine() || !v.downstream_stalled(&r.x.component))
        })
        .collect();
    let mut out = Vec::new();
    for (comp, ls) in by_component(v, leaves) {
        let cs = v.components.get(&comp);
        if cs.is_some_and(|cs| cs.shows_work() || cs.gpu_activity == GpuActivity::Spinning) {
            continue;
        }
        out.extend(ls.into_iter().map(|leg| {
            let last_out = v.requests[leg].x.last_out_ms.unwrap_or(v.now);
            StuckLeg {
                leg,
                kind: StuckKind::StreamStalled,
                busy: None,
                consequences: Vec::new(),
                witnesses: cs.map(|cs| kind_witnesses::of_stopped_stream(m, cs, last_out, v.now)),
                blame: Blame::Here,
                kv: None,
            }
        }));
    }
    out
}
