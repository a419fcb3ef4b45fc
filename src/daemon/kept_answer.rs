//! The newest `json` answer (the whole snapshot, assembled, redacted and serialized), kept
//! while clients keep asking.
//!
//! Why: on a big node one answer is ~50 ms of the daemon's CPU (the view of ~10,000
//! exchanges, 2,000 requests listed, 1-2 MB of JSON), and a client polling it back to back
//! on a loaded host waited 150-900 ms per call, each call building the same answer again
//! from the same samples. While someone asked within [`ACTIVE`], the daemon builds the
//! answer once after each socket table (the source of the requests' lifecycle) and serves
//! those bytes; a call that finds them older than the newest table, and no newer one being
//! built, builds its own fresh answer as before.
//!
//! How old a served answer can be: it reflects the newest socket table, or the one before
//! it while the answer of the newest is being built, and it was built at most [`MAX_AGE`]
//! before the call. Its `taken_at` says when. A client that asked nothing for [`ACTIVE`]
//! always gets a fresh answer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Answers are kept up to date for this long after the last `json` call.
pub const ACTIVE: Duration = Duration::from_secs(3);

/// The oldest kept answer served. A detector's verdict moves with the clock (a request
/// silent for 29.5 s is not yet wedged at 30 s, and is at 30.5 s), so a kept answer is
/// never more than this behind one built at the call, whatever the socket period.
pub const MAX_AGE: Duration = Duration::from_secs(1);

/// The kept answer and what it was built from.
#[derive(Debug, Default)]
pub struct KeptAnswer {
    /// Socket tables ingested so far.
    tables: AtomicU64,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    newest: Option<Built>,
    /// A build after the table numbered here is under way.
    building: Option<u64>,
    asked_at: Option<Instant>,
}

#[derive(Debug, Clone)]
struct Built {
    bytes: Arc<Vec<u8>>,
    /// The socket tables ingested when it was built.
    table: u64,
    /// When its build began (the model's instant it shows).
    taken: Instant,
}

/// A build [`KeptAnswer::start_build`] or [`KeptAnswer::ask`] handed out: the table count
/// it is of, to give back with its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket(u64);

/// What a `json` call gets.
#[derive(Debug)]
pub enum Asked {
    /// Bytes recent enough to serve.
    Kept(Arc<Vec<u8>>),
    /// None: build a fresh answer and [`KeptAnswer::store`] it.
    Build(Ticket),
}

impl KeptAnswer {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A socket table was ingested. Returns a ticket when a client asked within
    /// [`ACTIVE`] and no build is under way: the caller builds the answer now.
    pub fn on_table(&self, now: Instant) -> Option<Ticket> {
        let table = self.tables.fetch_add(1, Ordering::AcqRel) + 1;
        let mut st = self.state();
        let active = st
            .asked_at
            .is_some_and(|t| now.saturating_duration_since(t) < ACTIVE);
        if !active {
            // Nobody is asking: drop the bytes (1-2 MB) instead of keeping them stale.
            st.newest = None;
            return None;
        }
        if st.building.is_some() {
            return None;
        }
        st.building = Some(table);
        Some(Ticket(table))
    }

    /// A client asks for the answer at `now`.
    pub fn ask(&self, now: Instant) -> Asked {
        let tables = self.tables.load(Ordering::Acquire);
        let mut st = self.state();
        st.asked_at = Some(now);
        if let Some(b) = &st.newest {
            // Of the newest table; or of the one before while the newest one's is built.
            let behind = tables.saturating_sub(b.table);
            let young = now.saturating_duration_since(b.taken) <= MAX_AGE;
            if young && (behind == 0 || (behind == 1 && st.building == Some(tables))) {
                return Asked::Kept(b.bytes.clone());
            }
        }
        Asked::Build(Ticket(tables))
    }

    /// The bytes built for `ticket` from the model at `taken` (the build's start: its
    /// `taken_at`); kept unless newer ones already are. Ends the build `ticket` was handed
    /// out for, if it was one; when tables arrived during that build and a client is still
    /// asking at `now`, returns the ticket of the next one (the builder goes on).
    pub fn store(
        &self,
        ticket: Ticket,
        bytes: Arc<Vec<u8>>,
        taken: Instant,
        now: Instant,
    ) -> Option<Ticket> {
        let mut st = self.state();
        if st.newest.as_ref().is_none_or(|b| b.table <= ticket.0) {
            st.newest = Some(Built {
                bytes,
                table: ticket.0,
                taken,
            });
        }
        if st.building != Some(ticket.0) {
            return None;
        }
        let tables = self.tables.load(Ordering::Acquire);
        let active = st
            .asked_at
            .is_some_and(|t| now.saturating_duration_since(t) < ACTIVE);
        st.building = (tables > ticket.0 && active).then_some(tables);
        st.building.map(Ticket)
    }

    /// A build for `ticket` failed or was dropped: another may start.
    pub fn abandon(&self, ticket: Ticket) {
        let mut st = self.state();
        if st.building == Some(ticket.0) {
            st.building = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(s: &str) -> Arc<Vec<u8>> {
        Arc::new(s.as_bytes().to_vec())
    }

    fn kept(a: Asked) -> Option<String> {
        match a {
            Asked::Kept(b) => Some(String::from_utf8_lossy(&b).into_owned()),
            Asked::Build(_) => None,
        }
    }

    fn build(k: &KeptAnswer, at: Instant) -> Ticket {
        match k.ask(at) {
            Asked::Build(t) => t,
            Asked::Kept(b) => panic!("kept {:?}, expected a build", String::from_utf8_lossy(&b)),
        }
    }

    #[test]
    fn nothing_is_built_ahead_while_nobody_asks() {
        let k = KeptAnswer::default();
        let t0 = Instant::now();
        assert_eq!(k.on_table(t0), None);
        let ticket = build(&k, t0);
        assert_eq!(k.store(ticket, bytes("a"), t0, t0), None, "a client's own build");
        assert_eq!(kept(k.ask(t0)).as_deref(), Some("a"), "same table: served");
        // Past ACTIVE without a call: no build, and the stale bytes are dropped.
        assert_eq!(k.on_table(t0 + ACTIVE + Duration::from_millis(1)), None);
        assert!(kept(k.ask(t0 + ACTIVE * 2)).is_none());
    }

    #[test]
    fn a_client_asking_gets_the_answer_of_the_newest_table_or_the_one_before_while_it_builds() {
        let k = KeptAnswer::default();
        let t0 = Instant::now();
        let first = build(&k, t0);
        k.store(first, bytes("table 0"), t0, t0);
        // A table arrives while the client is active: the daemon builds ahead.
        let ahead = k.on_table(t0).expect("a build ahead");
        assert_eq!(
            kept(k.ask(t0)).as_deref(),
            Some("table 0"),
            "one behind while the newest is built"
        );
        assert_eq!(k.on_table(t0), None, "one build at a time");
        // Two tables past the kept answer: too old, even while a build runs.
        assert!(kept(k.ask(t0)).is_none());
        // Table 2 arrived during the build of table 1's answer: the builder goes on.
        let next = k.store(ahead, bytes("table 1"), t0, t0).expect("the next build");
        assert_eq!(kept(k.ask(t0)).as_deref(), Some("table 1"));
        assert_eq!(k.store(next, bytes("table 2"), t0, t0), None, "caught up");
        assert_eq!(kept(k.ask(t0)).as_deref(), Some("table 2"));
        let ahead = k.on_table(t0).expect("a build ahead");
        k.abandon(ahead);
        assert!(kept(k.ask(t0)).is_none(), "one behind, nothing under way");
    }

    #[test]
    fn the_builder_stops_when_the_client_went_away() {
        let k = KeptAnswer::default();
        let t0 = Instant::now();
        let _ = k.ask(t0);
        let ahead = k.on_table(t0).expect("a build ahead");
        k.on_table(t0);
        let later = t0 + ACTIVE + Duration::from_millis(1);
        assert_eq!(k.store(ahead, bytes("table 1"), later, later), None);
        assert!(k.on_table(later).is_none());
    }

    #[test]
    fn an_answer_older_than_max_age_is_built_again_though_no_table_came() {
        let k = KeptAnswer::default();
        let t0 = Instant::now();
        let ticket = build(&k, t0);
        k.store(ticket, bytes("a"), t0, t0);
        assert_eq!(kept(k.ask(t0 + MAX_AGE)).as_deref(), Some("a"));
        let again = build(&k, t0 + MAX_AGE + Duration::from_millis(1));
        k.store(again, bytes("b"), t0 + MAX_AGE * 2, t0 + MAX_AGE * 2);
        assert_eq!(kept(k.ask(t0 + MAX_AGE * 2)).as_deref(), Some("b"));
    }

    #[test]
    fn an_older_build_never_replaces_a_newer_answer() {
        let k = KeptAnswer::default();
        let t0 = Instant::now();
        let old = build(&k, t0);
        let ahead = k.on_table(t0).expect("a build ahead");
        k.store(ahead, bytes("new"), t0, t0);
        k.store(old, bytes("old"), t0, t0);
        assert_eq!(kept(k.ask(t0)).as_deref(), Some("new"));
    }
}
