//! The daemon's one detector pass: the model's view at an instant, the detectors over it,
//! and the adaptive stacks' suspicion derived from both, computed once per
//! `log_every_ms` by the watch task ([`super::log::watch`]) and read by everyone who needs
//! them: the log, the exporter's [`crate::export::prometheus::Evaluation`], the adaptive
//! stacks source (at each stacks tick). Served snapshots do not read it: a pass is up to
//! `log_every_ms` old, and a client asking now wants the requests open now (answering from
//! it was tried, and a daemon test caught a request missing from the answer).

use crate::clock::Millis;
use crate::correlate::{Model, View};
use crate::model::{Finding, Suspicion};
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
    pub fn run(model: &Model, now: Millis) -> Pass {
        let view = model.view(now);
        let findings = crate::detect::run_all(model, &view);
        let suspicion = crate::sampler::suspicion::derive(
            model.topology(),
            &view,
            &findings,
            &model.thresholds,
        );
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
}

/// The newest pass, shared by the watch task (writer) and its readers.
#[derive(Debug, Clone, Default)]
pub struct Latest(Arc<Mutex<Option<Arc<Pass>>>>);

impl Latest {
    pub fn set(&self, p: Arc<Pass>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(p);
    }

    pub fn get(&self) -> Option<Arc<Pass>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The newest pass's suspicion; none before the first pass.
    pub fn suspicion(&self) -> Suspicion {
        self.get()
            .map_or_else(Suspicion::none, |p| p.suspicion.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_pass_is_kept() {
        let latest = Latest::default();
        assert!(latest.get().is_none(), "no pass yet");
        assert!(latest.suspicion().is_empty());
        latest.set(Arc::new(Pass::run(&Model::default(), 10_000)));
        latest.set(Arc::new(Pass::run(&Model::default(), 12_000)));
        assert_eq!(latest.get().map(|p| p.at_ms()), Some(12_000));
    }
}
