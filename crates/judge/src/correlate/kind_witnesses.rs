//! The witnesses of the stuck kinds past `wedged_request` (`kv_transfer_stalled`,
//! `pd_leg_failed`, `tokens_undelivered`): each kind's own facts and the engine's four, as
//! listed under each kind's "When" in docs/findings.md; `verdict.rs` weighs them.
//!
//! [`LegWitnesses::of`] gives a waiting leg the witnesses of the kind it heads for, so the
//! judge, a one-shot's longer look and the daemon's suspicion read one answer.

use super::blame::{self, Blame, FailedLeg, LegFailure, Undelivered};
use super::engine_witnesses::{EngineLook, WORK_SETTLE_MS};
use super::kv_stall::{self, KvStall};
use super::state::ComponentState;
use super::verdict::{no_byte, Testimony, Witness, Witnesses};
use super::view::{RequestView, View};
use super::Correlator;
use crate::clock::Millis;
use crate::model::{ChannelFlow, RequestState, Role};
use std::cell::{OnceCell, RefCell};
use std::collections::BTreeMap;

/// `kv_transfer_stalled`'s witnesses on decode leg `d`, whose prefill leg is `p`.
pub fn of_kv_stall(
    m: &Correlator,
    v: &View,
    d: &RequestView,
    p: &RequestView,
    stall: &KvStall,
) -> Witnesses {
    let arrived = d.x.last_request_ms;
    let done = prefill_done_ms(m, p, &stall.prefill);
    let own = [
        no_byte(arrived),
        (Witness::TransferSilent, transfer(stall, done, v.now)),
    ];
    Witnesses::new(m, arrived, &own, waiting_for_kv(v, d), v.now)
}

/// `pd_leg_failed`'s witnesses on decode leg `d`, whose prefill leg failed as `f` says.
pub fn of_failed_prefill(m: &Correlator, v: &View, d: &RequestView, f: &FailedLeg) -> Witnesses {
    let arrived = d.x.last_request_ms;
    // An unseen leg failed right after the request reached it (a refusal takes milliseconds).
    let ended = f.leg.map_or(arrived, |i| {
        let p = &v.requests[i].x;
        p.end_ms().or(p.last_out_ms).unwrap_or(p.last_request_ms)
    });
    let failed = match f.how {
        LegFailure::Closed => Testimony::Quiet {
            turned_ms: ended,
            seen: 0,
        },
        LegFailure::ErrorStatus { n } => Testimony::Quiet {
            turned_ms: ended,
            seen: n.max(1.0) as u32,
        },
        LegFailure::ErrorsSinceStart { .. } => Testimony::NoData,
    };
    let own = [no_byte(arrived), (Witness::PrefillFailed, failed)];
    Witnesses::new(m, arrived, &own, waiting_for_kv(v, d), v.now)
}

/// `tokens_undelivered`'s witnesses on leg `r`, its engine's tokens as `u` says.
pub fn of_undelivered(m: &Correlator, v: &View, r: &RequestView, u: &Undelivered) -> Witnesses {
    let arrived = r.x.last_request_ms;
    let generated = if v.now - u.last_rise_ms < WORK_SETTLE_MS {
        // Still generating: a long answer on its way, not yet a lost one.
        Testimony::SawWork
    } else {
        Testimony::Quiet {
            turned_ms: u.last_rise_ms,
            seen: u.tokens as u32,
        }
    };
    let look = EngineLook {
        cs: v.components.get(&r.x.component),
        from: u.last_rise_ms.max(arrived) + WORK_SETTLE_MS,
        pd_polling_idle: false,
    };
    let own = [no_byte(arrived), (Witness::TokensGenerated, generated)];
    Witnesses::new(m, arrived, &own, look, v.now)
}

/// `stalled_stream`'s witnesses on a response stream whose last byte left at `last_out_ms`
/// from `cs` (an engine, else no engine witness has data): the stream stopped, and the
/// engine's four from then (+settle).
pub fn of_stopped_stream(
    m: &Correlator,
    cs: &ComponentState,
    last_out_ms: Millis,
    now: Millis,
) -> Witnesses {
    let stopped = Testimony::Quiet {
        turned_ms: last_out_ms,
        seen: 1,
    };
    let look = EngineLook {
        cs: Some(cs).filter(|c| c.role.is_engine()),
        from: last_out_ms + WORK_SETTLE_MS,
        pd_polling_idle: cs.role == Role::Decode,
    };
    let own = [(Witness::StreamStopped, stopped)];
    Witnesses::new(m, last_out_ms, &own, look, now)
}

/// The witnesses of a leg judged (or heading) for `blame`.
pub fn of_blamed(m: &Correlator, v: &View, leg: usize, blame: &Blame) -> Witnesses {
    let r = &v.requests[leg];
    match blame {
        Blame::Here => Witnesses::of_leg(m, v, r),
        Blame::PrefillFailed(f) => of_failed_prefill(m, v, r, f),
        Blame::Undelivered(u) => of_undelivered(m, v, r, u),
    }
}

/// Decode's four from the leg's arrival, read as a decode waiting for its KV.
fn waiting_for_kv<'a>(v: &'a View, d: &RequestView) -> EngineLook<'a> {
    EngineLook {
        cs: v.components.get(&d.x.component),
        from: d.x.last_request_ms + WORK_SETTLE_MS,
        pd_polling_idle: true,
    }
}

/// When prefill did the forward of leg `p`: its answer, else the first scrape since the leg
/// arrived that shows requests in its inflight queue (`None`: not seen yet).
fn prefill_done_ms(m: &Correlator, p: &RequestView, prefill: &str) -> Option<Millis> {
    if p.state != RequestState::WaitingFirstByte {
        return p.x.first_byte_ms.or(p.x.last_out_ms).or(p.x.end_ms());
    }
    m.metrics_history(prefill)?
        .iter()
        .filter(|pt| pt.t_ms >= p.x.last_request_ms)
        .find(|pt| pt.loads.is_some_and(|l| l.pd_inflight > 0.0))
        .map(|pt| pt.t_ms)
}

/// The transfer between the pair silent since prefill did the forward (`done`, +settle):
/// no TCP transfer to look at is no data; a byte since, work seen.
fn transfer(stall: &KvStall, done: Option<Millis>, now: Millis) -> Testimony {
    if stall.transfer.is_empty() {
        return Testimony::NoData;
    }
    let Some(from) = done.map(|t| t + WORK_SETTLE_MS) else {
        return Testimony::NotYet;
    };
    let last_byte = stall.transfer_idle_ms().map(|idle| now - idle as Millis);
    if last_byte.is_some_and(|t| t > from) {
        return Testimony::SawWork;
    }
    if now < from {
        return Testimony::NotYet;
    }
    Testimony::Quiet {
        turned_ms: from,
        seen: stall.transfer.iter().map(|f| f.connections).sum(),
    }
}

/// Each waiting leg's witnesses, for the kind it heads for: a KV transfer stall, a cause past
/// its hop (`blame.rs`), else `wedged_request`'s. Shared inputs are read once per pass.
pub struct LegWitnesses<'a> {
    m: &'a Correlator,
    v: &'a View,
    flows: OnceCell<Vec<ChannelFlow>>,
    last_sent: RefCell<BTreeMap<String, Option<Millis>>>,
}

impl<'a> LegWitnesses<'a> {
    pub fn new(m: &'a Correlator, v: &'a View) -> LegWitnesses<'a> {
        LegWitnesses {
            m,
            v,
            flows: OnceCell::new(),
            last_sent: RefCell::new(BTreeMap::new()),
        }
    }

    /// Leg `leg`'s witnesses as a response stream that stopped (none: no such component).
    pub fn of_stream(&self, leg: usize) -> Option<Witnesses> {
        let (m, v) = (self.m, self.v);
        let r = &v.requests[leg];
        let cs = v.components.get(&r.x.component)?;
        let last_out = r.x.last_out_ms.unwrap_or(v.now);
        Some(of_stopped_stream(m, cs, last_out, v.now))
    }

    /// Leg `leg`'s witnesses (it waits for its first byte).
    pub fn of(&self, leg: usize) -> Witnesses {
        let (m, v) = (self.m, self.v);
        if let Some(p) = kv_stall::candidate(m, v, leg) {
            let flows = self.flows.get_or_init(|| m.channel_flows(v.now));
            let (d, p) = (&v.requests[leg], &v.requests[p]);
            if let Some(stall) = kv_stall::pair_stall(v, flows, d, p).filter(KvStall::shows) {
                return of_kv_stall(m, v, d, p, &stall);
            }
        }
        let comp = &v.requests[leg].x.component;
        let last_sent = *self
            .last_sent
            .borrow_mut()
            .entry(comp.clone())
            .or_insert_with(|| blame::last_answer_byte(m, comp));
        let blame = blame::past_hop(m, v, leg, last_sent).unwrap_or(Blame::Here);
        of_blamed(m, v, leg, &blame)
    }
}
