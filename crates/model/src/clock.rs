//! Injectable time. Every timestamp in samples, the correlator and the UI comes from a
//! [`Clock`], so tests drive time by hand instead of sleeping.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Milliseconds since the Unix epoch.
pub type Millis = i64;

pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now_ms(&self) -> Millis;
}

#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> Millis {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        d.as_millis() as Millis
    }
}

/// What a loaded machine may add to a wall-time bound a test asserts: on a 2-core machine
/// a thread can wait seconds for a core.
pub const TEST_SLACK: Duration = Duration::from_secs(5);

/// The latest a test may see a step bounded by `timeout` end: `timeout` plus [`TEST_SLACK`]
/// (`wedgewatch_testkit::timing::within` for integration tests). What the step waits for
/// when the timeout is not kept must outlast it, so that the assert can still fail.
pub fn test_bound(timeout: Duration) -> Duration {
    timeout + TEST_SLACK
}

/// A clock tests move by hand.
#[derive(Debug, Clone, Default)]
pub struct FakeClock(Arc<AtomicI64>);

impl FakeClock {
    pub fn new(start_ms: Millis) -> Self {
        FakeClock(Arc::new(AtomicI64::new(start_ms)))
    }
    pub fn advance(&self, ms: i64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
    pub fn set(&self, ms: Millis) {
        self.0.store(ms, Ordering::SeqCst);
    }
}

impl Clock for FakeClock {
    fn now_ms(&self) -> Millis {
        self.0.load(Ordering::SeqCst)
    }
}

/// CPU time the calling thread has used, in ms (0 if the clock cannot be read): what a piece
/// of work costs on a machine whose wall clock is mostly waiting for a core.
pub fn thread_cpu_ms() -> f64 {
    use nix::time::{clock_gettime, ClockId};
    clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID).map_or(0.0, |t| {
        t.tv_sec() as f64 * 1000.0 + t.tv_nsec() as f64 / 1e6
    })
}

/// RFC 3339 (UTC, millisecond precision) for a Unix-epoch millisecond timestamp.
pub fn rfc3339(ms: Millis) -> String {
    let nanos = i128::from(ms) * 1_000_000;
    match time::OffsetDateTime::from_unix_timestamp_nanos(nanos) {
        Ok(t) => {
            let fmt = time::macros::format_description!(
                "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
            );
            t.format(&fmt).unwrap_or_else(|_| ms.to_string())
        }
        Err(_) => ms.to_string(),
    }
}

/// Parses RFC 3339 back to epoch milliseconds.
pub fn parse_rfc3339(s: &str) -> Option<Millis> {
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
    Some((t.unix_timestamp_nanos() / 1_000_000) as Millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trips() {
        let ms = 1_795_963_857_073;
        let s = rfc3339(ms);
        assert_eq!(s, "2026-11-29T14:50:57.073Z");
        assert_eq!(parse_rfc3339(&s), Some(ms));
    }

    #[test]
    fn fake_clock_moves_only_by_hand() {
        let c = FakeClock::new(1000);
        assert_eq!(c.now_ms(), 1000);
        c.advance(250);
        assert_eq!(c.now_ms(), 1250);
    }
}
