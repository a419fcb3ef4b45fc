//! How long a request with no response byte waits before it is judged stuck: the rule, once,
//! for every stuck kind of no response byte.
//!
//! The wait depends on independent witnesses: the stuck kind's own (`kind_witnesses.rs`) and
//! the engine's four (`engine_witnesses.rs`). All quiet: `unanimous_ms`; each engine witness
//! not quiet moves it a quarter of the way to `slow_ms`; a kind's own not quiet, or any that
//! saw work: `slow_ms`, so a slow request is never judged early. The table is "How long it
//! waits: the witnesses" (`wedged_request`) in docs/findings.md.

use super::engine_witnesses::{engine_witnesses, EngineLook};
use super::view::{RequestView, View};
use super::Correlator;
use crate::clock::Millis;

pub use super::engine_witnesses::{counters, MIN_IDLE_DUMPS, WORK_SETTLE_MS};

/// One independent witness that nothing moves a waiting request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Witness {
    /// No response byte on the waiting leg.
    NoByte,
    /// `kv_transfer_stalled`: no byte between the pair since prefill did the forward.
    TransferSilent,
    /// `pd_leg_failed`: the prefill leg closed, or answered an error its engine counted.
    PrefillFailed,
    /// `tokens_undelivered`: the scheduler generated tokens since it arrived, then stopped.
    TokensGenerated,
    /// `stalled_stream`: the response stream sent no byte since its last one.
    StreamStopped,
    GpuIdle,
    SchedulerIdle,
    CountersFrozen,
    NoQueue,
}

impl Witness {
    /// The engine's four, each a quarter of the way.
    pub const ENGINE: [Witness; 4] = [
        Witness::GpuIdle,
        Witness::SchedulerIdle,
        Witness::CountersFrozen,
        Witness::NoQueue,
    ];

    /// One of the engine's four (else a stuck kind's own).
    pub fn is_engines(self) -> bool {
        Witness::ENGINE.contains(&self)
    }

    /// What it says when quiet, and what it counted.
    fn words(self) -> (&'static str, &'static str) {
        match self {
            Witness::NoByte => ("no response byte", ""),
            Witness::TransferSilent => ("transfer silent", "connections"),
            Witness::PrefillFailed => ("prefill leg failed", "error(s) counted since"),
            Witness::TokensGenerated => ("tokens generated, then none", "tokens"),
            Witness::StreamStopped => ("no byte since the stream's last", ""),
            Witness::GpuIdle => ("GPU idle", "readings"),
            Witness::SchedulerIdle => ("scheduler idle", "dumps"),
            Witness::CountersFrozen => ("counters frozen", "scrapes"),
            Witness::NoQueue => ("no queue", "scrapes"),
        }
    }
}

/// What one witness says over the wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Testimony {
    /// Nothing moves it: quiet in all `seen` observations, enough of them since `turned_ms`.
    Quiet { turned_ms: Millis, seen: u32 },
    /// Work was seen.
    SawWork,
    /// Its source has data for this hop, too little since the request arrived (one dump).
    NotYet,
    /// No such data for this hop (no GPU reading of it, no counters, not an engine).
    NoData,
}

impl Testimony {
    pub fn is_quiet(self) -> bool {
        matches!(self, Testimony::Quiet { .. })
    }
}

/// Every witness's testimony on one waiting leg: its stuck kind's own, then the engine's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Witnesses {
    /// When the wait began (its last request byte; a stream's last response byte): the wait
    /// counts from here.
    pub arrived_ms: Millis,
    pub said: Vec<(Witness, Testimony)>,
}

impl Witnesses {
    /// `arrived_ms`'s leg's witnesses: its kind's own (`own`), and the engine's four as
    /// `look` sees them at `now`.
    pub fn new(
        m: &Correlator,
        arrived_ms: Millis,
        own: &[(Witness, Testimony)],
        look: EngineLook,
        now: Millis,
    ) -> Witnesses {
        let mut said = own.to_vec();
        said.extend(engine_witnesses(m, look, now));
        Witnesses { arrived_ms, said }
    }

    /// `wedged_request`'s witnesses on leg `r` (waiting for its first byte) at `v.now`: no
    /// byte, and the engine's from its last request byte.
    pub fn of_leg(m: &Correlator, v: &View, r: &RequestView) -> Witnesses {
        let arrived_ms = r.x.last_request_ms;
        let look = EngineLook {
            cs: v
                .components
                .get(&r.x.component)
                .filter(|c| c.role.is_engine()),
            from: arrived_ms + WORK_SETTLE_MS,
            pd_polling_idle: false,
        };
        Witnesses::new(m, arrived_ms, &[no_byte(arrived_ms)], look, v.now)
    }

    pub fn testimony(&self, w: Witness) -> Testimony {
        self.said
            .iter()
            .find(|(k, _)| *k == w)
            .map_or(Testimony::NoData, |(_, t)| *t)
    }

    pub fn quiet(&self) -> usize {
        self.said.iter().filter(|(_, t)| t.is_quiet()).count()
    }

    pub fn saw_work(&self) -> bool {
        self.said.iter().any(|(_, t)| *t == Testimony::SawWork)
    }

    /// How long after [`Witnesses::arrived_ms`] the request is judged stuck (the rule in the
    /// module doc; never above `slow_ms`).
    pub fn verdict_wait(&self, unanimous_ms: Millis, slow_ms: Millis) -> Millis {
        wait_for(&self.said, |t| t.is_quiet(), unanimous_ms, slow_ms)
    }

    /// [`Witnesses::verdict_wait`] once the witnesses that only need a longer look
    /// ([`Testimony::NotYet`]) turned quiet: what a one-shot may wait for.
    pub fn wait_after_longer_look(&self, unanimous_ms: Millis, slow_ms: Millis) -> Millis {
        let turns = |t: Testimony| t.is_quiet() || t == Testimony::NotYet;
        wait_for(&self.said, turns, unanimous_ms, slow_ms)
    }

    /// The wait of every stuck kind of no response byte (`wedged_unanimous_ms`,
    /// `wedged_after_ms`).
    pub fn wedged_wait(&self, th: &crate::config::CorrelateThresholds) -> Millis {
        self.verdict_wait(th.wedged_soonest_ms(), th.wedged_after_ms)
    }

    /// The wait of a response stream that stopped (`stall_unanimous_ms`, `stall_after_ms`).
    pub fn stall_wait(&self, th: &crate::config::CorrelateThresholds) -> Millis {
        self.verdict_wait(th.stall_soonest_ms(), th.stall_after_ms)
    }

    /// "5/5 witnesses": how many were quiet.
    pub fn count_text(&self) -> String {
        format!("{}/{} witnesses", self.quiet(), self.said.len())
    }

    /// Each witness and when it turned, relative to the arrival: "no response byte since it
    /// arrived; GPU idle from +2.0 s (34 readings); scheduler idle: not yet (one dump); ...".
    pub fn text(&self) -> String {
        let rel = |t: Millis| format!("+{:.1} s", (t - self.arrived_ms) as f64 / 1000.0);
        self.said
            .iter()
            .map(|(w, t)| {
                let (name, unit) = w.words();
                match (w, t) {
                    (Witness::NoByte, Testimony::Quiet { .. }) => {
                        format!("{name} since it arrived")
                    }
                    (Witness::StreamStopped, Testimony::Quiet { .. }) => name.to_string(),
                    (Witness::PrefillFailed, Testimony::Quiet { turned_ms, seen: 0 }) => {
                        format!("{name} at {} (closed without an answer)", rel(*turned_ms))
                    }
                    (Witness::PrefillFailed, Testimony::Quiet { turned_ms, seen }) => {
                        format!("{name} at {} ({seen} {unit} it arrived)", rel(*turned_ms))
                    }
                    (_, Testimony::Quiet { turned_ms, seen }) => {
                        format!("{name} from {} ({seen} {unit})", rel(*turned_ms))
                    }
                    (_, Testimony::SawWork) => format!("{name}: no, work seen"),
                    (_, Testimony::NotYet) => format!("{name}: not yet (too few {unit})"),
                    (_, Testimony::NoData) => format!("{name}: no data"),
                }
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// The no-byte witness of a leg waiting since `arrived_ms`: quiet from the start.
pub fn no_byte(arrived_ms: Millis) -> (Witness, Testimony) {
    let t = Testimony::Quiet {
        turned_ms: arrived_ms,
        seen: 1,
    };
    (Witness::NoByte, t)
}

/// The wait with the witnesses `said`, `counts` saying which testimonies count as quiet (see
/// [`Witnesses::verdict_wait`]).
fn wait_for(
    said: &[(Witness, Testimony)],
    counts: impl Fn(Testimony) -> bool,
    unanimous_ms: Millis,
    slow_ms: Millis,
) -> Millis {
    let fast = unanimous_ms.min(slow_ms);
    let saw_work = said.iter().any(|(_, t)| *t == Testimony::SawWork);
    let own_quiet = said
        .iter()
        .filter(|(w, _)| !w.is_engines())
        .all(|(_, t)| counts(*t));
    if saw_work || !own_quiet {
        return slow_ms;
    }
    let engines_quiet = said
        .iter()
        .filter(|(w, t)| w.is_engines() && counts(*t))
        .count();
    let missing = Witness::ENGINE.len().saturating_sub(engines_quiet) as i64;
    fast + (slow_ms - fast) * missing / Witness::ENGINE.len() as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    const Q: Testimony = Testimony::Quiet {
        turned_ms: 0,
        seen: 1,
    };

    /// `own` of the kind's own witnesses quiet (of two), `engine` of the engine's four, one
    /// of the rest saw work or not.
    fn with(own_quiet: bool, engine: usize, saw_work: bool) -> Millis {
        let own = if own_quiet { Q } else { Testimony::NoData };
        let mut said = vec![(Witness::NoByte, Q), (Witness::TransferSilent, own)];
        for (k, w) in Witness::ENGINE.into_iter().enumerate() {
            let t = match k {
                _ if k < engine => Q,
                _ if saw_work => Testimony::SawWork,
                _ => Testimony::NotYet,
            };
            said.push((w, t));
        }
        wait_for(&said, |t| t.is_quiet(), 10_000, 30_000)
    }

    #[test]
    fn the_wait_shrinks_with_each_quiet_witness_and_never_on_work() {
        assert_eq!(with(true, 4, false), 10_000, "unanimous");
        assert_eq!(with(true, 3, false), 15_000);
        assert_eq!(with(true, 2, false), 20_000);
        assert_eq!(with(true, 0, false), 30_000, "only its own: as before");
        assert_eq!(with(true, 3, true), 30_000, "work seen: the slow rule");
        assert_eq!(with(false, 4, false), 30_000, "its own not quiet: slow");
        let said = [(Witness::NoByte, Q)];
        assert_eq!(
            wait_for(&said, |t| t.is_quiet(), 10_000, 8_000),
            8_000,
            "never above the slow threshold"
        );
    }
}
