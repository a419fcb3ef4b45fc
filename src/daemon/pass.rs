//! The daemon's one detector pass: the model's view at an instant, the detectors over it and
//! the adaptive stacks' suspicion, computed once per `log_every_ms` by the watch task
//! ([`super::log::watch`]) and read by the log, the exporter's
//! [`crate::export::prometheus::Evaluation`] and the stacks ticks. Served snapshots build their
//! own view: a pass is up to `log_every_ms` old, and a client asking now wants the requests
//! open now.

use crate::clock::Millis;
use crate::config::Thresholds;
use crate::correlate::{Correlator, View};
use crate::model::{Finding, RequestState, Suspicion};
use std::sync::{Arc, Mutex};

/// One pass: the view at `view.now`, its findings and the suspicion they imply.
#[derive(Debug)]
pub struct Pass {
    pub view: View,
    pub findings: Vec<Finding>,
    pub suspicion: Suspicion,
}

impl Pass {
    /// The pass over `model` at `now`.
    pub fn run(model: &Correlator, now: Millis) -> Pass {
        let view = model.view(now);
        let findings = crate::detect::run_all(model, &view);
        let suspicion = crate::policy::suspicion::derive(model, &view, &findings);
        Pass {
            view,
            findings,
            suspicion,
        }
    }

    /// When it looked.
    pub fn at_ms(&self) -> Millis {
        self.view.now
    }

    /// In how many ms after this pass an open request's state may turn by time alone, with
    /// no new sample: one waiting for its first byte reaches the soonest wedge verdict
    /// (`wedged_unanimous_ms` after its last request byte; its witnesses may ask for longer),
    /// a streaming one the soonest stall verdict (`stall_unanimous_ms`). Why: an answer built ahead before that instant cannot show
    /// the finding, so the daemon builds the next one at the first table after it
    /// ([`super::kept_answer::KeptAnswer::expect_news`]) instead of up to a rebuild period
    /// later. Probes are left out, as the detectors leave them out.
    pub fn next_turn_ms(&self, th: &Thresholds) -> Option<i64> {
        let v = &self.view;
        v.requests
            .iter()
            .filter(|r| !v.logical_of(r).probe)
            .filter_map(|r| match r.state {
                RequestState::WaitingFirstByte => {
                    Some(th.correlate.wedged_soonest_ms() - (v.now - r.x.last_request_ms))
                }
                RequestState::Streaming => Some(th.correlate.stall_soonest_ms() - r.idle_out_ms),
                _ => None,
            })
            .filter(|&ms| ms > 0)
            .min()
    }
}

/// The newest pass's suspicion, shared by the watch task (writer) and the adaptive stacks
/// (reader). Only the suspicion is kept: the view and findings are read within the pass,
/// and a big node's view need not live on until the next one.
#[derive(Debug, Clone, Default)]
pub struct Latest(Arc<Mutex<Option<Suspicion>>>);

impl Latest {
    pub fn set(&self, s: Suspicion) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(s);
    }

    /// The newest pass's suspicion; none before the first pass.
    pub fn suspicion(&self) -> Suspicion {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_else(Suspicion::none)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SuspicionReason;

    #[test]
    fn the_newest_suspicion_is_kept() {
        let latest = Latest::default();
        assert!(latest.suspicion().is_empty(), "no pass yet");
        let pass = Pass::run(&Correlator::default(), 10_000);
        assert_eq!(pass.at_ms(), 10_000);
        latest.set(pass.suspicion.clone());
        assert_eq!(latest.suspicion(), pass.suspicion);
        let mut s = Suspicion::none();
        s.add(
            "decode@:30001",
            SuspicionReason::QueueNotDraining { queued: 2.0 },
        );
        latest.set(s.clone());
        assert_eq!(latest.suspicion(), s);
        assert!(!latest.suspicion().is_empty());
    }
}
