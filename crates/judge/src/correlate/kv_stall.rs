//! PD KV transfer stalls: a decode leg waits for KV that prefill has computed while the
//! transfer between the pair is silent, so the request is neither forgotten at decode nor at
//! prefill. The rule is `kv_transfer_stalled` in docs/findings.md; its timing is one
//! function, [`kv_stall_due`].
//!
//! A prefill leg that answered an error never started a transfer (decode waits in its
//! transfer queue all the same on the real 0.5.23 pair): that is `pd_leg_failed`.

use super::requests::StuckLeg;
use super::state::{ComponentState, CountSource};
use super::view::{RequestView, View};
use super::Correlator;
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

    /// A transfer is seen under way: on TCP between the pair, or (none on TCP) prefill holds
    /// requests in flight.
    pub fn shows(&self) -> bool {
        !self.transfer.is_empty() || self.prefill_inflight.is_some_and(|n| n > 0.0)
    }
}

/// The stall's timing rule: a decode leg waiting `wait_ms` for its first byte (its
/// witnesses' wait) while the transfer from its prefill has been silent as long
/// (`transfer_idle_ms`; None: no transfer on TCP to look at).
pub fn kv_stall_due(waited_ms: i64, transfer_idle_ms: Option<u64>, wait_ms: i64) -> bool {
    waited_ms >= wait_ms && transfer_idle_ms.is_none_or(|idle| idle as i64 >= wait_ms)
}

/// The logical requests stuck in a KV transfer, one leg each (the decode leg; the prefill
/// leg, when it waits too, is its consequence).
pub(super) fn kv_stalled(m: &Correlator, v: &View) -> Vec<StuckLeg> {
    let th = &m.thresholds.correlate;
    let candidates: Vec<(usize, usize)> = (0..v.requests.len())
        .filter(|&i| v.now - v.requests[i].x.last_request_ms >= th.wedged_soonest_ms())
        .filter_map(|i| Some((i, candidate(m, v, i)?)))
        .collect();
    if candidates.is_empty() {
        return Vec::new();
    }
    // The pairs' transfers, from the latest socket table (once per view, only when needed).
    let flows = m.channel_flows(v.now);
    let mut out = Vec::new();
    for (d, p) in candidates {
        let (dr, pr) = (&v.requests[d], &v.requests[p]);
        // With no transfer on TCP, only a prefill holding them in flight says it is one.
        let Some(stall) = pair_stall(v, &flows, dr, pr).filter(KvStall::shows) else {
            continue;
        };
        let w = super::kind_witnesses::of_kv_stall(m, v, dr, pr, &stall);
        let waited = v.now - dr.x.last_request_ms;
        if !kv_stall_due(waited, stall.transfer_idle_ms(), w.wedged_wait(th)) {
            continue;
        }
        let waits = pr.state == RequestState::WaitingFirstByte;
        out.push(StuckLeg {
            leg: d,
            kind: StuckKind::KvTransfer,
            busy: None,
            consequences: if waits { vec![p] } else { Vec::new() },
            witnesses: Some(w),
            blame: super::blame::Blame::Here,
            kv: Some(stall),
        });
    }
    out
}

/// Decode leg `d`'s prefill leg, when `d` may be stuck in its KV transfer
/// ([`waiting_at_decode`]) and that leg did not fail (that is `pd_leg_failed`).
pub(super) fn candidate(m: &Correlator, v: &View, d: usize) -> Option<usize> {
    if !waiting_at_decode(v, &v.requests[d]) || super::blame::failed_prefill_leg(m, v, d).is_some()
    {
        return None;
    }
    prefill_leg(v, d)
}

/// A decode leg waiting for its first byte at a decode engine that holds requests waiting
/// for their KV and whose GPU is not spinning.
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
pub(super) fn pair_stall(
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
        for w in [10_000, 30_000] {
            assert!(kv_stall_due(w, Some(w as u64), w));
            assert!(kv_stall_due(w, None, w), "no transfer on TCP to look at");
            assert!(!kv_stall_due(w - 1, Some(w as u64), w), "not waited enough");
            assert!(
                !kv_stall_due(w, Some(w as u64 - 1), w),
                "the transfer moved"
            );
        }
    }
}
