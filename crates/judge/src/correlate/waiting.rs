//! Why a waiting request is not judged stuck: the rule of `requests::judge` that kept its
//! deepest waiting leg out, told as a [`WaitReason`] (in the order `judge` applies them), so
//! no output gives a reason the evidence contradicts.

use super::requests::LogicalView;
use super::view::View;
use super::Correlator;
use crate::correlate::GpuActivity;
use crate::model::{RequestState, Role, WaitReason};

/// The leg (index into `View::requests`) a waiting request waits at, and why it is not
/// stuck there; `None` when no leg of it waits for a first byte.
pub(super) fn why(m: &Correlator, v: &View, l: &LogicalView) -> Option<(usize, WaitReason)> {
    let leg = deepest_waiting(v, l)?;
    let r = &v.requests[leg];
    let reason = if !v.sockets_fresh {
        WaitReason::SocketsStale
    } else if r.age_ms < m.thresholds.correlate.wedged_after_ms {
        WaitReason::Young
    } else if !r.x.role.is_engine() {
        WaitReason::DownstreamOpen
    } else {
        let cs = v.components.get(&r.x.component);
        match cs {
            Some(cs) if cs.gpu_activity == GpuActivity::Spinning => WaitReason::GpuSpinning,
            Some(cs) if cs.http_active == Some(0.0) && r.x.client_component.is_none() => {
                WaitReason::NotInference
            }
            _ => WaitReason::BusyEngine,
        }
    };
    Some((leg, reason))
}

/// The deepest leg waiting for its first byte with nothing open below it; in PD, a waiting
/// prefill leg before a waiting decode leg (the decode leg needs its KV cache).
fn deepest_waiting(v: &View, l: &LogicalView) -> Option<usize> {
    let rank = |role: Role| match role {
        Role::Prefill => u8::MAX,
        r => r.depth(),
    };
    l.legs
        .iter()
        .copied()
        .filter(|&i| {
            let r = &v.requests[i];
            r.state == RequestState::WaitingFirstByte && v.outstanding_child(r).is_none()
        })
        .max_by_key(|&i| rank(v.requests[i].x.role))
}
