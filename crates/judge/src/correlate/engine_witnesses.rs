//! The four witnesses at an engine that it does nothing for a waiting request: its GPU idle,
//! its scheduler loop idle, its work counters frozen, no queue in front of the request. Each
//! looks from a time its stuck kind chooses (the request's arrival, or when its tokens
//! stopped, +[`WORK_SETTLE_MS`]) to now; `verdict.rs` weighs what they say.

use super::gpu::gpu_activity;
use super::metrics::MetricsPoint;
use super::state::{queued_of, ComponentState};
use super::verdict::{Testimony, Witness};
use super::Correlator;
use crate::clock::Millis;
use crate::correlate::GpuActivity;
use crate::model::ThreadState;

/// How long after a request arrives a batch already under way may still show as work.
pub const WORK_SETTLE_MS: Millis = 2000;

/// Stack dumps the scheduler witness needs: one dump is a guess, two agreeing are evidence.
pub const MIN_IDLE_DUMPS: u32 = 2;

/// Where the engine's witnesses look, from when, and how they read a PD decode that holds
/// the request waiting for its KV cache.
#[derive(Clone, Copy)]
pub struct EngineLook<'a> {
    /// The engine holding the request (None: the hop is no engine, none of them has data).
    pub cs: Option<&'a ComponentState>,
    /// Work seen from here on is work for the request.
    pub from: Millis,
    /// At this decode the PD queues are not in front of the request (it waits for its own
    /// KV, or its stream is past them): its loop polling them is idle, and what its
    /// prealloc/transfer queues hold is not queued ahead of it.
    pub pd_polling_idle: bool,
}

/// The four witnesses, in [`Witness::ENGINE`]'s order.
pub fn engine_witnesses(
    m: &Correlator,
    look: EngineLook,
    now: Millis,
) -> [(Witness, Testimony); 4] {
    Witness::ENGINE.map(|w| {
        let t = match (w, look.cs) {
            (_, None) => Testimony::NoData,
            (Witness::GpuIdle, Some(cs)) => gpu(m, cs, look.from, now),
            (Witness::SchedulerIdle, Some(cs)) => scheduler(cs, look.from, look.pd_polling_idle),
            (Witness::CountersFrozen, Some(cs)) => counters(m, &cs.id, look.from, now),
            (_, Some(cs)) => queue(m, &cs.id, look.from, now, look.pd_polling_idle),
        };
        (w, t)
    })
}

/// The entries of a history buffer (oldest first) from `from` to `now`, found by bisection.
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
pub(super) struct Tally {
    need: u32,
    seen: u32,
    turned_ms: Option<Millis>,
}

impl Tally {
    pub(super) fn new(need: u32) -> Tally {
        Tally {
            need,
            seen: 0,
            turned_ms: None,
        }
    }

    pub(super) fn saw(&mut self, t: Millis) {
        self.seen += 1;
        if self.seen == self.need {
            self.turned_ms = Some(t);
        }
    }

    /// Quiet when enough; else not yet (`any_data`: its source has data for the hop) or no
    /// data.
    pub(super) fn testimony(self, any_data: bool) -> Testimony {
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
/// and no thread of it working in any of them (`pd_polling_idle`: polling the PD queues is idle).
fn scheduler(cs: &ComponentState, from: Millis, pd_polling_idle: bool) -> Testimony {
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
    let idle = |s: &ThreadState| {
        *s == ThreadState::Idle || (pd_polling_idle && *s == ThreadState::PdQueuePolling)
    };
    let mut tally = Tally::new(MIN_IDLE_DUMPS);
    for (s, at) in since(lt) {
        if !idle(&s) {
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
    let carries = |p: &MetricsPoint| WORK_COUNTERS.iter().any(|(k, _)| p.mapped.contains_key(*k));
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

/// No request queued at the engine in any scrape from `from` to `now` (`pd_polling_idle`: besides
/// those a decode holds waiting for their KV).
fn queue(
    m: &Correlator,
    comp: &str,
    from: Millis,
    now: Millis,
    pd_polling_idle: bool,
) -> Testimony {
    let Some(hist) = m.metrics_history(comp) else {
        return Testimony::NoData;
    };
    let queued = |p: &MetricsPoint| {
        let (q, _) = queued_of(p)?;
        Some(if pd_polling_idle {
            q - decode_held(p)
        } else {
            q
        })
    };
    let any_data = hist.iter().any(|p| queued(p).is_some());
    let mut tally = Tally::new(1);
    for p in between(hist, |p| p.t_ms, from, now) {
        match queued(p) {
            Some(q) if q > 0.0 => return Testimony::SawWork,
            Some(_) => tally.saw(p.t_ms),
            None => {}
        }
    }
    tally.testimony(any_data)
}

/// Requests a decode holds in its prealloc and transfer queues in one scrape.
fn decode_held(p: &MetricsPoint) -> f64 {
    match p.loads {
        Some(l) => l.pd_decode_held,
        None => ["decode_prealloc_queue", "decode_transfer_queue"]
            .iter()
            .filter_map(|k| p.mapped.get(*k))
            .sum(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
