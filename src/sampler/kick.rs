//! The kick of the daemon's stacks source: a snapshot asked for while a suspicion is open
//! runs the adaptive stacks tick at once (`sampler::adaptive`), instead of at its cadence.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A snapshot asked for while a suspicion is open runs the stacks tick at once (the
/// suspected engines' schedulers first, as every tick does), at most once per `min_gap`:
/// the next snapshot then has fresh stacks of the engine in trouble. The daemon marks
/// whether anything is suspected at each tick and calls [`StacksKick::on_snapshot`]; the
/// sampler waits on [`StacksKick::kicked`] beside its interval.
#[derive(Debug)]
pub struct StacksKick {
    notify: tokio::sync::Notify,
    suspected: AtomicBool,
    min_gap: Duration,
    last: Mutex<Option<Instant>>,
}

impl StacksKick {
    pub fn new(min_gap: Duration) -> Arc<StacksKick> {
        Arc::new(StacksKick {
            notify: tokio::sync::Notify::new(),
            suspected: AtomicBool::new(false),
            min_gap,
            last: Mutex::new(None),
        })
    }

    /// Whether the last tick's suspicion named any engine.
    pub fn set_suspected(&self, yes: bool) {
        self.suspected.store(yes, Ordering::Relaxed);
    }

    /// A snapshot was asked for: kicks the stacks source when something is suspected and
    /// it was not kicked within `min_gap`. Returns whether it kicked.
    pub fn on_snapshot(&self) -> bool {
        if !self.suspected.load(Ordering::Relaxed) {
            return false;
        }
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|t| t.elapsed() < self.min_gap) {
            return false;
        }
        *last = Some(Instant::now());
        self.notify.notify_one();
        true
    }

    /// Resolves at the next kick.
    pub async fn kicked(&self) {
        self.notify.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_snapshot_kicks_the_stacks_tick_only_while_suspected_and_not_too_often() {
        let kick = StacksKick::new(Duration::from_secs(60));
        assert!(!kick.on_snapshot(), "nothing suspected: no kick");
        kick.set_suspected(true);
        assert!(kick.on_snapshot());
        // The stored permit wakes the sampler's next wait at once.
        tokio::time::timeout(Duration::from_secs(1), kick.kicked())
            .await
            .expect("kicked");
        assert!(!kick.on_snapshot(), "at most once per min_gap");
    }
}
