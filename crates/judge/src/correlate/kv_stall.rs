//! PD KV transfer stalls (`kv_transfer_stalled`): a request's decode leg waits for its first
//! byte while decode holds requests waiting for their KV cache (its prealloc or transfer
//! queue), prefill has done their forward (it answered, or holds them in its inflight queue
//! with none waiting for decode to connect), and the transfer from that prefill to that decode
//! is silent. Then the request is not forgotten at decode (nor at prefill): its KV never
//! arrived. Seen on real pairs as Mooncake TCP transfers that hang (sglang issue 23342) and KV
//! receivers stuck in `Transferring` forever (sglang PR 31800).
//!
//! The transfer is what the socket table shows between the pair (`channels.rs`: the KV
//! streams and the status messages from prefill to decode); with none on TCP at all (RDMA),
//! only a prefill still holding requests in its inflight queue says their transfer is under
//! way. The timing is one rule, [`kv_stall_due`].
//!
//! A prefill leg that answered an error (`blame::failed_prefill_leg`) never started a
//! transfer: decode waits in its transfer queue all the same (the real 0.5.23 pair, a prompt
//! over prefill's `--context-length`), but that is `pd_leg_failed`, not a stall here.

use super::requests::StuckLeg;
use super::state::{ComponentState, CountSource};
use super::view::{RequestView, View};
use super::Correlator;
use crate::config::Thresholds;
use crate::correlate::GpuActivity;
use crate::model::{ChannelFlow, ChannelKind, RequestState, Role, StuckKind};

/// Why the requests of one PD pair are judged stuck in their KV transfer (the same for every
/// request of the pair in one view).
#[derive(Debug, Clone, PartialEq)]
pub struct KvStall {
    pub prefill: String,
    pub decode: String,
    /// Decode's prealloc + transfer queue, and where the count came from.
    pub decode_held: (f64, CountSource),
    /// Prefill's inflight queue (`/v1/loads`), when known.
    pub prefill_inflight: Option<f64>,
    /// The channel flows from prefill to decode (KV streams, status messages); empty: no
    /// transfer on TCP between them (RDMA, or never connected).
    pub transfer: Vec<ChannelFlow>,
}

impl KvStall {
    /// Since the last byte of the transfer between the pair (None: none on TCP, or never a
    /// byte seen move on its connections).
    pub fn transfer_idle_ms(&self) -> Option<u64> {
        self.transfer.iter().filter_map(|f| f.idle_ms).min()
    }
}

/// The stall's timing rule: a decode leg waiting `wedged_after_ms` for its first byte while
/// the transfer from its prefill has been silent as long (`transfer_idle_ms`; None: no
/// transfer on TCP to look at). The one place the stall's timing is decided.
pub fn kv_stall_due(waited_ms: i64, transfer_idle_ms: Option<u64>, th: &Thresholds) -> bool {
    let limit = th.correlate.wedged_after_ms;
    waited_ms >= limit && transfer_idle_ms.is_none_or(|idle| idle as i64 >= limit)
}

/// The logical requests stuck in a KV transfer, one leg each (the decode leg; the prefill
/// leg, when it waits too, is its consequence).
pub(super) fn kv_stalled(m: &Correlator, v: &View) -> Vec<StuckLeg> {
    let candidates: Vec<(usize, Option<usize>)> = (0..v.requests.len())
        .filter(|&i| waiting_at_decode(v, &v.requests[i]))
        .map(|i| (i, prefill_leg(v, i)))
        .filter(|(_, p)| p.is_some())
        .collect();
    if candidates.is_empty() {
        return Vec::new();
    }
    // The pairs' transfers, from the latest socket table (once per view, only when needed).
    let flows = m.channel_flows(v.now);
    let mut out = Vec::new();
    for (d, p) in candidates {
        let Some(p) = p else { continue };
        if super::blame::failed_prefill_leg(m, v, d).is_some() {
            continue;
        }
        let (dr, pr) = (&v.requests[d], &v.requests[p]);
        let Some(stall) = pair_stall(v, &flows, dr, pr) else {
            continue;
        };
        let idle = stall.transfer_idle_ms();
        // With no transfer on TCP, only a prefill holding them in flight says it is one.
        let seen = !stall.transfer.is_empty() || stall.prefill_inflight.is_some_and(|n| n > 0.0);
        if !seen || !kv_stall_due(dr.age_ms, idle, &m.thresholds) {
            continue;
        }
        let waits = pr.state == RequestState::WaitingFirstByte;
        out.push(StuckLeg {
            leg: d,
            kind: StuckKind::KvTransfer,
            busy: None,
            consequences: if waits { vec![p] } else { Vec::new() },
            witnesses: None,
            blame: super::blame::Blame::Here,
            kv: Some(stall),
        });
    }
    out
}

/// A decode leg waiting for its first byte, not a probe, not forwarded further, at a decode
/// engine that holds requests waiting for their KV and whose GPU is not spinning (that is
/// `busy_without_progress`).
fn waiting_at_decode(v: &View, r: &RequestView) -> bool {
    r.x.role == Role::Decode
        && r.state == RequestState::WaitingFirstByte
        && !v.logical[r.request].probe
        && v.outstanding_child(r).is_none()
        && v.components.get(&r.x.component).is_some_and(|cs| {
            cs.gpu_activity != GpuActivity::Spinning
                && cs.pd_decode_held.is_some_and(|(n, _)| n > 0.0)
        })
}

/// The prefill leg of the same logical request, sent by the same hop (the router's PD
/// dispatch).
fn prefill_leg(v: &View, d: usize) -> Option<usize> {
    let dr = &v.requests[d];
    let parent = dr.x.parent?;
    v.logical[dr.request]
        .legs
        .iter()
        .copied()
        .find(|&i| v.requests[i].x.role == Role::Prefill && v.requests[i].x.parent == Some(parent))
}

/// The pair's stall facts when prefill is done with the request's forward: it answered, or it
/// holds requests in its inflight queue and none waits for decode to connect.
fn pair_stall(
    v: &View,
    flows: &[ChannelFlow],
    d: &RequestView,
    p: &RequestView,
) -> Option<KvStall> {
    let dc = v.components.get(&d.x.component)?;
    let pc = v.components.get(&p.x.component)?;
    if !prefill_done(p, pc) {
        return None;
    }
    let transfer = flows
        .iter()
        .filter(|f| f.from.as_deref() == Some(pc.id.as_str()) && f.to == dc.id)
        .filter(|f| f.kind != ChannelKind::Bootstrap)
        .cloned()
        .collect();
    Some(KvStall {
        prefill: pc.id.clone(),
        decode: dc.id.clone(),
        decode_held: dc.pd_decode_held?,
        prefill_inflight: pc.pd_inflight,
        transfer,
    })
}

/// Prefill finished the request's forward: its leg answered, or it waits while prefill holds
/// requests in its inflight queue and none in its bootstrap queue (`/v1/loads`).
fn prefill_done(p: &RequestView, pc: &ComponentState) -> bool {
    p.state != RequestState::WaitingFirstByte
        || (pc.pd_inflight.is_some_and(|n| n > 0.0) && pc.pd_bootstrap == Some(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timing_rule() {
        let th = Thresholds::default();
        let w = th.correlate.wedged_after_ms;
        assert!(kv_stall_due(w, Some(w as u64), &th));
        assert!(kv_stall_due(w, None, &th), "no transfer on TCP to look at");
        assert!(
            !kv_stall_due(w - 1, Some(w as u64), &th),
            "not waited long enough"
        );
        assert!(
            !kv_stall_due(w, Some(w as u64 - 1), &th),
            "the transfer moved"
        );
    }
}
