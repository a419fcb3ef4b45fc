//! The daemon's paces: its socket table, detector pass and py-spy are its largest costs, and
//! none is needed fine unless something is suspected. Calm, each runs at a slow period; once a
//! detector pass suspects an engine (`policy::suspicion`), at its fast one until the suspicion
//! clears. The daemon sets [`Pace::set_alert`] at every pass; a paced loop reads
//! [`Pace::period_ms`] each tick and wakes at once on [`Pace::alerted`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[derive(Debug)]
pub struct Pace {
    calm_ms: u64,
    alert_ms: u64,
    alert: AtomicBool,
    notify: tokio::sync::Notify,
}

impl Pace {
    /// A pace of `calm_ms` while nothing is suspected, `alert_ms` while something is.
    pub fn new(calm_ms: u64, alert_ms: u64) -> Arc<Pace> {
        Arc::new(Pace {
            calm_ms: calm_ms.max(1),
            alert_ms: alert_ms.max(1),
            alert: AtomicBool::new(false),
            notify: tokio::sync::Notify::new(),
        })
    }

    /// A pace of `calm_ms` while calm and `fast_ms` while alert, when calm is the slower
    /// (a calm period at or below the fast one, or negative, needs no pace).
    pub fn calm_slower(calm_ms: i64, fast_ms: u64) -> Option<Arc<Pace>> {
        let calm = u64::try_from(calm_ms).ok()?;
        (calm > fast_ms).then(|| Pace::new(calm, fast_ms))
    }

    /// Whether anything is suspected now. Turning alert wakes the sampler at once.
    pub fn set_alert(&self, yes: bool) {
        let was = self.alert.swap(yes, Ordering::Relaxed);
        if yes && !was {
            self.notify.notify_one();
        }
    }

    pub fn is_alert(&self) -> bool {
        self.alert.load(Ordering::Relaxed)
    }

    /// The period while something is suspected.
    pub fn alert_period_ms(&self) -> u64 {
        self.alert_ms
    }

    /// The period to run at now.
    pub fn period_ms(&self) -> u64 {
        if self.is_alert() {
            self.alert_ms
        } else {
            self.calm_ms
        }
    }

    /// Resolves when the pace turns alert.
    pub async fn alerted(&self) {
        self.notify.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn the_period_follows_the_alert_and_turning_alert_wakes_the_sampler() {
        let pace = Pace::new(1_000, 250);
        assert_eq!(pace.period_ms(), 1_000, "calm at start");
        pace.set_alert(true);
        assert_eq!(pace.period_ms(), 250);
        tokio::time::timeout(Duration::from_secs(1), pace.alerted())
            .await
            .expect("woken by the alert");
        pace.set_alert(true);
        let again = tokio::time::timeout(Duration::from_millis(50), pace.alerted()).await;
        assert!(again.is_err(), "staying alert wakes no one again");
        pace.set_alert(false);
        assert_eq!(pace.period_ms(), 1_000);
    }
}
