//! When a schedule's next sample is due: its interval (missed ticks skipped), at its
//! pace's current period when it has one, and at once when it is kicked or its pace turns
//! alert.

use super::kick::StacksKick;
use super::pace::Pace;
use super::Schedule;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::{Instant, Interval, MissedTickBehavior};

pub(super) struct Ticker {
    iv: Interval,
    period_ms: u64,
    /// The period changed at the last tick (the stats say the new one).
    repaced: bool,
    pace: Option<Arc<Pace>>,
    kick: Option<Arc<StacksKick>>,
}

fn interval(first: Instant, period_ms: u64) -> Interval {
    let mut iv = tokio::time::interval_at(first, Duration::from_millis(period_ms.max(1)));
    iv.set_missed_tick_behavior(MissedTickBehavior::Skip);
    iv
}

impl Ticker {
    pub(super) fn new(s: &Schedule) -> Ticker {
        let period_ms = s.pace.as_ref().map_or(s.every_ms, |p| p.period_ms());
        Ticker {
            iv: interval(Instant::now(), period_ms),
            period_ms,
            repaced: false,
            pace: s.pace.clone(),
            kick: s.kick.clone(),
        }
    }

    /// The first tick (at once).
    pub(super) async fn first(&mut self) {
        self.iv.tick().await;
    }

    /// The next tick: the interval's, or at once on a kick or an alert. Cancel-safe.
    pub(super) async fn next(&mut self) {
        let kick = self.kick.clone();
        let pace = self.pace.clone();
        tokio::select! {
            _ = self.iv.tick() => {}
            _ = kicked(kick.as_deref()) => self.iv.reset(),
            _ = alerted(pace.as_deref()) => self.iv.reset(),
        }
        self.repace();
    }

    /// The period in force (the pace's, read at the last tick).
    pub(super) fn period_ms(&self) -> u64 {
        self.period_ms
    }

    /// Whether the last tick changed the period.
    pub(super) fn repaced(&self) -> bool {
        self.repaced
    }

    /// Follows the pace: a new period counts from this tick.
    fn repace(&mut self) {
        let want = self.pace.as_ref().map_or(self.period_ms, |p| p.period_ms());
        self.repaced = want != self.period_ms;
        if self.repaced {
            self.period_ms = want;
            self.iv = interval(Instant::now() + Duration::from_millis(want), want);
        }
    }
}

/// Resolves when `kick` is kicked; never without one.
async fn kicked(kick: Option<&StacksKick>) {
    match kick {
        Some(k) => k.kicked().await,
        None => std::future::pending().await,
    }
}

/// Resolves when `pace` turns alert; never without one.
async fn alerted(pace: Option<&Pace>) {
    match pace {
        Some(p) => p.alerted().await,
        None => std::future::pending().await,
    }
}
