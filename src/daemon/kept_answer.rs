//! The newest `json` answer (the whole snapshot, assembled, redacted and serialized), kept
//! while clients keep asking: on a big node an answer is tens of ms of the daemon's CPU, and
//! polling clients would each build the same one again. While someone asked within [`ACTIVE`],
//! the answer is built ahead after a socket table, at most once per [`REBUILD_AFTER`], and
//! those bytes are served.
//!
//! A served answer is at most its `max_age` old (one calm socket period and
//! [`BUILD_ALLOWANCE`]; its `taken_at` says when); an older one is built again by the call that
//! finds it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Answers are built ahead for this long after the last `json` call.
pub const ACTIVE: Duration = Duration::from_secs(3);

/// What a kept answer's age may exceed a socket period by: the build of the next one (on a
/// loaded big node, 100-800 ms of wall time). A daemon that suspects nothing builds one
/// answer per calm table, and serves every call from it.
pub const BUILD_ALLOWANCE: Duration = Duration::from_secs(1);

/// Answers built ahead at most this often, however fast tables come (four a second while
/// something is suspected): each is tens of ms of CPU on a big node.
pub const REBUILD_AFTER: Duration = Duration::from_millis(500);

/// The kept answer and whether one is being built ahead.
#[derive(Debug)]
pub struct KeptAnswer {
    /// The oldest kept answer served.
    max_age: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    newest: Option<Built>,
    building: bool,
    asked_at: Option<Instant>,
    /// When an open request's state next turns by time alone (the newest detector pass's
    /// word): an answer taken before it is due at the first table after it.
    news_at: Option<Instant>,
}

#[derive(Debug, Clone)]
struct Built {
    bytes: Arc<Vec<u8>>,
    /// When its build began (the instant of the model it shows).
    taken: Instant,
}

/// A build ahead [`KeptAnswer::on_table`] handed out. It ends when dropped, finished or
/// not: a build that panicked must not stop every later one.
#[derive(Debug)]
pub struct BuildAhead(Arc<KeptAnswer>);

impl BuildAhead {
    /// Keeps the bytes built from the model at `taken` ([`KeptAnswer::store`]).
    pub fn finish(self, bytes: Arc<Vec<u8>>, taken: Instant) {
        self.0.store(bytes, taken);
    }
}

impl Drop for BuildAhead {
    fn drop(&mut self) {
        self.0.state().building = false;
    }
}

impl KeptAnswer {
    /// Serves answers up to `max_age` old.
    pub fn new(max_age: Duration) -> KeptAnswer {
        KeptAnswer {
            max_age,
            state: Mutex::default(),
        }
    }

    /// Serves answers up to one socket period of `sockets_ms` and [`BUILD_ALLOWANCE`] old.
    pub fn for_socket_period(sockets_ms: i64) -> KeptAnswer {
        let period = Duration::from_millis(u64::try_from(sockets_ms).unwrap_or(0));
        KeptAnswer::new(period + BUILD_ALLOWANCE)
    }

    /// The oldest answer served.
    pub fn max_age(&self) -> Duration {
        self.max_age
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A socket table was ingested at `now`. A build for the caller to run when a client
    /// asked within [`ACTIVE`], none is being built, and the kept answer is
    /// [`REBUILD_AFTER`] old.
    pub fn on_table(self: &Arc<Self>, now: Instant) -> Option<BuildAhead> {
        let mut st = self.state();
        let active = st
            .asked_at
            .is_some_and(|t| now.saturating_duration_since(t) < ACTIVE);
        if !active {
            // Nobody is asking: drop the bytes (1-2 MB) instead of keeping them stale.
            st.newest = None;
            return None;
        }
        let news_at = st.news_at;
        let due = st.newest.as_ref().is_none_or(|b| {
            now.saturating_duration_since(b.taken) >= REBUILD_AFTER
                || news_at.is_some_and(|n| b.taken < n && n <= now)
        });
        if st.building || !due {
            return None;
        }
        st.building = true;
        Some(BuildAhead(self.clone()))
    }

    /// The newest detector pass says an open request's state turns at `at` (a wedge or stall
    /// threshold reached; `None`: nothing turns). The first table after it builds an answer
    /// however young the kept one is, so the finding shows a socket period after it is true. A
    /// turn already past stays pending until an answer shows it (a later pass no longer sees it
    /// coming).
    pub fn expect_news(&self, at: Option<Instant>, now: Instant) {
        let mut st = self.state();
        let unshown = st
            .news_at
            .filter(|n| *n <= now && st.newest.as_ref().is_some_and(|b| b.taken < *n));
        st.news_at = unshown.or(at);
    }

    /// A client asks at `now`: the kept bytes when at most `max_age` old, else None (the
    /// call builds them and [`KeptAnswer::store`]s them).
    pub fn ask(&self, now: Instant) -> Option<Arc<Vec<u8>>> {
        let mut st = self.state();
        st.asked_at = Some(now);
        st.newest
            .as_ref()
            .filter(|b| now.saturating_duration_since(b.taken) <= self.max_age)
            .map(|b| b.bytes.clone())
    }

    /// Bytes built from the model at `taken` (the build's start: its `taken_at`), kept
    /// unless younger ones already are.
    pub fn store(&self, bytes: Arc<Vec<u8>>, taken: Instant) {
        let mut st = self.state();
        if st.newest.as_ref().is_none_or(|b| b.taken <= taken) {
            st.newest = Some(Built { bytes, taken });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(s: &str) -> Arc<Vec<u8>> {
        Arc::new(s.as_bytes().to_vec())
    }

    fn text(b: Option<Arc<Vec<u8>>>) -> Option<String> {
        b.map(|b| String::from_utf8_lossy(&b).into_owned())
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    const MAX_AGE: Duration = Duration::from_secs(3);

    fn kept() -> Arc<KeptAnswer> {
        Arc::new(KeptAnswer::for_socket_period(2_000))
    }

    #[test]
    fn nothing_is_built_ahead_while_nobody_asks() {
        let k = kept();
        let t0 = Instant::now();
        assert!(k.on_table(t0).is_none());
        assert!(k.ask(t0).is_none(), "nothing kept yet: the call builds");
        k.store(bytes("a"), t0);
        assert_eq!(text(k.ask(t0 + ms(10))).as_deref(), Some("a"));
        // ACTIVE without a call: no build, and the stale bytes are dropped.
        assert!(k.on_table(t0 + ms(10) + ACTIVE).is_none());
        assert!(k.ask(t0 + ms(20) + ACTIVE).is_none());
    }

    #[test]
    fn while_a_client_asks_one_answer_is_built_ahead_per_table_at_most_every_rebuild_period() {
        let k = kept();
        let t0 = Instant::now();
        assert!(k.ask(t0).is_none());
        k.store(bytes("call"), t0);
        assert!(
            k.on_table(t0 + ms(250)).is_none(),
            "younger than REBUILD_AFTER"
        );
        let ahead = k.on_table(t0 + REBUILD_AFTER).expect("a build ahead");
        assert!(k.on_table(t0 + ms(750)).is_none(), "one build at a time");
        assert_eq!(text(k.ask(t0 + ms(800))).as_deref(), Some("call"));
        ahead.finish(bytes("ahead"), t0 + REBUILD_AFTER);
        assert_eq!(text(k.ask(t0 + ms(900))).as_deref(), Some("ahead"));
        let next = k.on_table(t0 + REBUILD_AFTER * 2).expect("the next one");
        drop(next);
        assert!(
            k.on_table(t0 + REBUILD_AFTER * 2).is_some(),
            "after one dropped unfinished"
        );
    }

    #[test]
    fn a_request_turning_wedged_builds_at_the_first_table_after_it_however_young_the_answer() {
        let k = kept();
        let t0 = Instant::now();
        k.ask(t0);
        k.store(bytes("before"), t0);
        k.expect_news(Some(t0 + ms(200)), t0);
        assert!(k.on_table(t0 + ms(150)).is_none(), "not turned yet");
        // A pass after the turn, before the next table: the request no longer turns.
        k.expect_news(None, t0 + ms(220));
        let ahead = k.on_table(t0 + ms(250)).expect("built: the turn is past");
        ahead.finish(bytes("after"), t0 + ms(250));
        assert!(
            k.on_table(t0 + ms(400)).is_none(),
            "the answer is younger than the turn and than REBUILD_AFTER"
        );
        k.expect_news(None, t0 + ms(300));
        assert!(k.on_table(t0 + ms(700)).is_none(), "no news, young answer");
        assert!(k.on_table(t0 + ms(250) + REBUILD_AFTER).is_some());
    }

    #[test]
    fn an_answer_older_than_max_age_is_never_served() {
        let k = kept();
        assert_eq!(k.max_age(), MAX_AGE, "a calm period and the allowance");
        let t0 = Instant::now();
        k.ask(t0);
        k.store(bytes("a"), t0);
        assert_eq!(text(k.ask(t0 + MAX_AGE)).as_deref(), Some("a"));
        assert!(k.ask(t0 + MAX_AGE + ms(1)).is_none());
    }

    #[test]
    fn an_older_build_never_replaces_a_younger_answer() {
        let k = kept();
        let t0 = Instant::now();
        k.ask(t0);
        let ahead = k.on_table(t0).expect("a build ahead");
        k.store(bytes("young"), t0 + ms(100));
        ahead.finish(bytes("old"), t0);
        assert_eq!(text(k.ask(t0 + ms(200))).as_deref(), Some("young"));
        assert!(k.on_table(t0 + ms(600)).is_some(), "the build ahead ended");
    }
}
