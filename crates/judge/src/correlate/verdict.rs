//! How long a request with no response byte waits before it is judged stuck: the rule, once.
//!
//! The wait depends on independent witnesses that nothing works on the request, each looking
//! at the hop holding it over the wait (from its last request byte, +[`WORK_SETTLE_MS`] for
//! batches already under way):
//! - no response byte (the stuck kind's own witness, there from the start);
//! - the engine's GPU idle in every reading;
//! - its scheduler loop idle in every stack dump, at least two, and no thread in a batch;
//! - its own work counters (tokens generated, forward time) frozen;
//! - no queue in front of it (`/v1/loads`, else the queue gauges, at 0 in every scrape).
//!
//! Each says quiet (and when it turned), saw work, not yet (its source has data, too little
//! since the request arrived: one dump), or nothing (no such data). Every one quiet: the
//! verdict after `unanimous_ms` (`wedged_unanimous_ms`, 10 s). Each one not quiet moves it a
//! quarter of the way to `slow_ms` (`wedged_after_ms`, 30 s). Any one that saw work:
//! `slow_ms`, and the busy-engine rules judge (`requests.rs`): a slow request is never judged
//! early. A hop that is no engine (proxy, router) has only the first witness, so 30 s.
//!
//! `requests.rs` judges `wedged_request`'s case with [`Witnesses::verdict_wait`]; another
//! stuck kind with the same sort of evidence calls it with its own thresholds.

use super::gpu::gpu_activity;
use super::state::{queued_of, ComponentState};
use super::view::{RequestView, View};
use super::Correlator;
use crate::clock::Millis;
use crate::correlate::GpuActivity;

/// After a request arrives, counters may still move, the GPU finish and the scheduler run a
/// batch already under way for this long (and the metrics scrape lags by up to a second).
pub const WORK_SETTLE_MS: Millis = 2000;

/// Stack dumps the scheduler witness needs: one dump is a guess, two agreeing are evidence.
pub const MIN_IDLE_DUMPS: u32 = 2;

/// One independent witness that nothing works on a waiting request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Witness {
    NoByte,
    GpuIdle,
    SchedulerIdle,
    CountersFrozen,
    NoQueue,
}

impl Witness {
    pub const ALL: [Witness; 5] = [
        Witness::NoByte,
        Witness::GpuIdle,
        Witness::SchedulerIdle,
        Witness::CountersFrozen,
        Witness::NoQueue,
    ];

    /// What it says when quiet, and what it counted.
    fn words(self) -> (&'static str, &'static str) {
        match self {
            Witness::NoByte => ("no response byte", ""),
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
    /// Nothing works on it: quiet in all `seen` observations, enough of them since `turned_ms`.
    Quiet { turned_ms: Millis, seen: u32 },
    /// Work was seen (the engine is busy, or a queue stands in front of the request).
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

/// Every witness's testimony on one waiting leg.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Witnesses {
    /// When its last request byte arrived: the wait counts from here.
    pub arrived_ms: Millis,
    pub said: [(Witness, Testimony); 5],
}

impl Witnesses {
    /// The witnesses on leg `r` (waiting for its first byte) at `v.now`.
    pub fn of_leg(m: &Correlator, v: &View, r: &RequestView) -> Witnesses {
        let arrived_ms = r.x.last_request_ms;
        let from = arrived_ms + WORK_SETTLE_MS;
        let cs = v
            .components
            .get(&r.x.component)
            .filter(|c| c.role.is_engine());
        let said = Witness::ALL.map(|w| {
            let t = match (w, cs) {
                (Witness::NoByte, _) => Testimony::Quiet {
                    turned_ms: arrived_ms,
                    seen: 1,
                },
                (_, None) => Testimony::NoData,
                (Witness::GpuIdle, Some(cs)) => gpu(m, cs, from, v.now),
                (Witness::SchedulerIdle, Some(cs)) => scheduler(cs, from),
                (Witness::CountersFrozen, Some(cs)) => counters(m, &cs.id, from, v.now),
                (Witness::NoQueue, Some(cs)) => queue(m, &cs.id, from, v.now),
            };
            (w, t)
        });
        Witnesses { arrived_ms, said }
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

    /// How long after [`Witnesses::arrived_ms`] the request is judged stuck: `unanimous_ms`
    /// when every witness is quiet, a quarter of the way on to `slow_ms` for each one that
    /// is not, `slow_ms` when any saw work (and never above it).
    pub fn verdict_wait(&self, unanimous_ms: Millis, slow_ms: Millis) -> Millis {
        wait_for(self.quiet(), self.saw_work(), unanimous_ms, slow_ms)
    }

    /// [`Witnesses::verdict_wait`] once the witnesses that only need a longer look
    /// ([`Testimony::NotYet`]) turned quiet: what a one-shot may wait for.
    pub fn wait_after_longer_look(&self, unanimous_ms: Millis, slow_ms: Millis) -> Millis {
        let quiet = self
            .said
            .iter()
            .filter(|(_, t)| t.is_quiet() || *t == Testimony::NotYet)
            .count();
        wait_for(quiet, self.saw_work(), unanimous_ms, slow_ms)
    }

    /// `wedged_request`'s wait (`wedged_unanimous_ms`, `wedged_after_ms`).
    pub fn wedged_wait(&self, th: &crate::config::CorrelateThresholds) -> Millis {
        self.verdict_wait(th.wedged_soonest_ms(), th.wedged_after_ms)
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

/// The wait with `quiet` of the five witnesses quiet (see [`Witnesses::verdict_wait`]).
fn wait_for(quiet: usize, saw_work: bool, unanimous_ms: Millis, slow_ms: Millis) -> Millis {
    let fast = unanimous_ms.min(slow_ms);
    if saw_work {
        return slow_ms;
    }
    let missing = (Witness::ALL.len() - quiet.min(Witness::ALL.len())) as i64;
    // Four witnesses beside the stuck kind's own: each missing one is a quarter of the way.
    fast + (slow_ms - fast) * missing.min(4) / 4
}

/// The entries of a history buffer (oldest first, in time order) from `from` to `now`,
/// found by bisection: a daemon's history holds minutes of readings, the wait seconds.
fn between<'a, T>(
    q: &'a std::collections::VecDeque<T>,
    t: impl Fn(&T) -> Millis + Copy + 'a,
    from: Millis,
    now: Millis,
) -> impl Iterator<Item = &'a T> + 'a {
    let start = q.partition_point(|x| t(x) < from);
    q.range(start..).take_while(move |x| t(x) <= now)
}

/// Counts quiet observations; the testimony turns at the `need`-th.
struct Tally {
    need: u32,
    seen: u32,
    turned_ms: Option<Millis>,
}

impl Tally {
    fn new(need: u32) -> Tally {
        Tally {
            need,
            seen: 0,
            turned_ms: None,
        }
    }

    fn saw(&mut self, t: Millis) {
        self.seen += 1;
        if self.seen == self.need {
            self.turned_ms = Some(t);
        }
    }

    /// Quiet when enough; else not yet (`any_data`: its source has data for the hop) or no
    /// data.
    fn testimony(self, any_data: bool) -> Testimony {
        match self.turned_ms {
            Some(turned_ms) => Testimony::Quiet {
                turned_ms,
                seen: self.seen,
            },
            None if any_data || self.seen > 0 => Testimony::NotYet,
            None => Testimony::NoData,
        }
    }
}

/// The engine's GPU idle in every reading from `from` to `now` (and now).
fn gpu(m: &Correlator, cs: &ComponentState, from: Millis, now: Millis) -> Testimony {
    match cs.gpu_activity {
        GpuActivity::Idle => {}
        GpuActivity::Working | GpuActivity::Spinning => return Testimony::SawWork,
        GpuActivity::Unknown => return Testimony::NoData,
    }
    let Some(c) = m.topology.component(&cs.id) else {
        return Testimony::NoData;
    };
    let c = m.with_children(c);
    let mut tally = Tally::new(1);
    for (t, g) in between(&m.gpu, |(t, _)| *t, from, now) {
        match gpu_activity(&c, g, &m.thresholds) {
            GpuActivity::Idle => tally.saw(*t),
            GpuActivity::Working | GpuActivity::Spinning => return Testimony::SawWork,
            GpuActivity::Unknown => {}
        }
    }
    tally.testimony(true)
}

/// The engine's loop thread idle in every dump since `from`, at least [`MIN_IDLE_DUMPS`],
/// and no thread of it working in any of them.
fn scheduler(cs: &ComponentState, from: Millis) -> Testimony {
    let since = |t: &super::ThreadWindow| {
        t.states
            .iter()
            .zip(&t.times)
            .filter(|(_, at)| **at >= from)
            .map(|(s, at)| (s.clone(), *at))
            .collect::<Vec<_>>()
    };
    if cs
        .threads
        .iter()
        .any(|t| since(t).iter().any(|(s, _)| s.is_working()))
    {
        return Testimony::SawWork;
    }
    let Some(lt) = cs.loop_thread() else {
        return Testimony::NoData;
    };
    let mut tally = Tally::new(MIN_IDLE_DUMPS);
    for (s, at) in since(lt) {
        if s != crate::model::ThreadState::Idle {
            // Not working, not idle (polling a PD queue, in a collective): says nothing.
            return Testimony::NotYet;
        }
        tally.saw(at);
    }
    tally.testimony(true)
}

/// Counters of an engine's work: each with the rise that is still no work (rounding of a
/// float the engine adds idle loop time to).
const WORK_COUNTERS: [(&str, f64); 2] = [
    ("generation_tokens_total", 0.0),
    ("forward_seconds_total", 0.01),
];

/// The engine's own work counters flat from `from` to `now`: quiet once two scrapes carrying
/// one of them span at least 1 s (turned at the later one), work seen when one rose.
pub fn counters(m: &Correlator, comp: &str, from: Millis, now: Millis) -> Testimony {
    let Some(hist) = m.metrics_history(comp) else {
        return Testimony::NoData;
    };
    let carries =
        |p: &super::MetricsPoint| WORK_COUNTERS.iter().any(|(k, _)| p.mapped.contains_key(*k));
    let any_data = hist.iter().any(carries);
    let pts: Vec<_> = between(hist, |p| p.t_ms, from, now)
        .filter(|p| carries(p))
        .collect();
    let (Some(first), Some(last)) = (pts.first(), pts.last()) else {
        return Tally::new(1).testimony(any_data);
    };
    for (key, tolerance) in WORK_COUNTERS {
        if let (Some(a), Some(b)) = (first.mapped.get(key), last.mapped.get(key)) {
            if b - a > tolerance {
                return Testimony::SawWork;
            }
        }
    }
    match pts.iter().find(|p| p.t_ms - first.t_ms >= 1000) {
        Some(p) => Testimony::Quiet {
            turned_ms: p.t_ms,
            seen: pts.len() as u32,
        },
        None => Testimony::NotYet,
    }
}

/// No request queued at the engine in any scrape from `from` to `now`.
fn queue(m: &Correlator, comp: &str, from: Millis, now: Millis) -> Testimony {
    let Some(hist) = m.metrics_history(comp) else {
        return Testimony::NoData;
    };
    let any_data = hist.iter().any(|p| queued_of(p).is_some());
    let mut tally = Tally::new(1);
    for p in between(hist, |p| p.t_ms, from, now) {
        match queued_of(p) {
            Some((q, _)) if q > 0.0 => return Testimony::SawWork,
            Some(_) => tally.saw(p.t_ms),
            None => {}
        }
    }
    tally.testimony(any_data)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(quiet: usize, saw_work: bool) -> Millis {
        wait_for(quiet, saw_work, 10_000, 30_000)
    }

    #[test]
    fn the_wait_shrinks_with_each_quiet_witness_and_never_on_work() {
        assert_eq!(with(5, false), 10_000, "unanimous");
        assert_eq!(with(4, false), 15_000);
        assert_eq!(with(3, false), 20_000);
        assert_eq!(with(1, false), 30_000, "only no byte: as before");
        assert_eq!(with(4, true), 30_000, "work seen: the slow rule");
        assert_eq!(
            wait_for(5, false, 10_000, 8_000),
            8_000,
            "never above the slow threshold"
        );
    }

    #[test]
    fn a_tally_turns_at_its_nth_observation() {
        let mut t = Tally::new(2);
        t.saw(100);
        assert_eq!(t.testimony(true), Testimony::NotYet);
        let mut t = Tally::new(2);
        t.saw(100);
        t.saw(400);
        t.saw(900);
        assert_eq!(
            t.testimony(true),
            Testimony::Quiet {
                turned_ms: 400,
                seen: 3
            }
        );
        assert_eq!(Tally::new(1).testimony(false), Testimony::NoData);
    }
}
