//! The stacks source with the adaptive policy of [`crate::policy::stacks`]: at each tick it
//! asks a [`SuspicionFn`] what is suspected, has the policy plan the tick, and has the plain
//! [`StackSource`] dump the plan. A snapshot asked of the daemon while something is
//! suspected runs a tick at once ([`super::kick::StacksKick`]).

use crate::clock::Clock;
use crate::model::{Sample, SourceKind, Suspicion, Topology};
use crate::policy::stacks::{StackPlan, StackPolicy};
use crate::sources::stacks::{window_sample, StackSource};
use crate::sources::{BoxFuture, Source};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The suspicion at this instant (the daemon's: derived from its correlator under its lock).
pub type SuspicionFn = Arc<dyn Fn() -> Suspicion + Send + Sync>;

/// The stacks source with the adaptive policy (the daemon's, with `stacks_adaptive`).
pub struct AdaptiveStacks {
    inner: StackSource,
    policy: Mutex<StackPolicy>,
    suspicion: SuspicionFn,
    /// The suspected engines at the last tick, to log when that changes.
    suspected: Mutex<Vec<String>>,
}

impl AdaptiveStacks {
    pub fn new(inner: StackSource, suspicion: SuspicionFn) -> AdaptiveStacks {
        AdaptiveStacks {
            inner,
            policy: Mutex::new(StackPolicy::new()),
            suspicion,
            suspected: Mutex::new(Vec::new()),
        }
    }

    /// This tick's plan (and a log line when the suspected engines changed).
    fn plan(&self, topo: &Topology) -> StackPlan {
        let suspicion = (self.suspicion)();
        let engines: Vec<String> = suspicion.engines().map(str::to_string).collect();
        let mut last = self.suspected.lock().unwrap_or_else(|p| p.into_inner());
        if *last != engines {
            if engines.is_empty() {
                tracing::info!("adaptive stacks: nothing suspected; round-robin");
            } else {
                tracing::info!(
                    "adaptive stacks: dumping the schedulers of {}",
                    suspicion.describe()
                );
            }
            *last = engines;
        }
        drop(last);
        let mut policy = self.policy.lock().unwrap_or_else(|p| p.into_inner());
        policy.plan(topo, &suspicion)
    }
}

impl Source for AdaptiveStacks {
    fn kind(&self) -> SourceKind {
        SourceKind::Stacks
    }

    fn sample<'a>(&'a self, topo: &'a Topology, clock: &'a dyn Clock) -> BoxFuture<'a, Sample> {
        Box::pin(async move {
            let t_ms = clock.now_ms();
            let started = Instant::now();
            let plan = self.plan(topo);
            let w = self
                .inner
                .capture_rounds(&plan.targets, plan.rounds, clock)
                .await;
            window_sample(t_ms, started, w)
        })
    }
}
