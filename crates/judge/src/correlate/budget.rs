//! The history's byte budget ([`Correlator::history_bytes`]): after the time bound, the
//! oldest entry of all history buffers goes first until their estimated bytes (each
//! [`Ring`]'s) fit. A buffer's newest entry always stays, so every source's latest word
//! survives a flood from another.

use super::ring::{Ring, Timed};
use super::Correlator;
use crate::clock::Millis;
use std::collections::BTreeMap;

/// The buffer whose oldest entry is the oldest of all.
enum Oldest {
    Gpu,
    Stacks,
    Closed,
    Metrics(String),
    Counts(String),
}

/// The key and front time of the map's ring with the oldest evictable entry.
fn oldest_in<T: Timed + super::footprint::Footprint>(
    m: &BTreeMap<String, Ring<T>>,
) -> Option<(Millis, &String)> {
    m.iter()
        .filter(|(_, r)| r.len() > 1)
        .filter_map(|(k, r)| r.front_t().map(|t| (t, k)))
        .min_by_key(|(t, _)| *t)
}

/// The front time of a ring with an evictable entry (more than its newest).
fn front<T: Timed + super::footprint::Footprint>(r: &Ring<T>) -> Option<Millis> {
    (r.len() > 1).then(|| r.front_t()).flatten()
}

impl Correlator {
    /// Estimated bytes the history holds now.
    pub fn history_bytes_used(&self) -> usize {
        self.gpu.bytes()
            + self.stacks.bytes()
            + self.closed.bytes()
            + self.metrics.values().map(Ring::bytes).sum::<usize>()
            + self.counts.values().map(Ring::bytes).sum::<usize>()
    }

    /// Evicts oldest-first until the history fits [`Correlator::history_bytes`].
    pub(super) fn evict_to_budget(&mut self) {
        let mut used = self.history_bytes_used();
        while used > self.history_bytes {
            let Some(which) = self.oldest() else { break };
            let freed = self.pop(which);
            if freed == 0 {
                break;
            }
            used = used.saturating_sub(freed);
        }
    }

    fn oldest(&self) -> Option<Oldest> {
        let mut best: Option<(Millis, Oldest)> = None;
        let mut consider = |t: Option<Millis>, w: Oldest| {
            if let Some(t) = t {
                if best.as_ref().is_none_or(|(b, _)| t < *b) {
                    best = Some((t, w));
                }
            }
        };
        consider(front(&self.gpu), Oldest::Gpu);
        consider(front(&self.stacks), Oldest::Stacks);
        consider(front(&self.closed), Oldest::Closed);
        if let Some((t, k)) = oldest_in(&self.metrics) {
            consider(Some(t), Oldest::Metrics(k.clone()));
        }
        if let Some((t, k)) = oldest_in(&self.counts) {
            consider(Some(t), Oldest::Counts(k.clone()));
        }
        best.map(|(_, w)| w)
    }

    /// Pops the front of `which`; the bytes freed.
    fn pop(&mut self, which: Oldest) -> usize {
        fn pop_ring<T>(r: &mut Ring<T>) -> usize {
            let before = r.bytes();
            r.pop_front();
            before - r.bytes()
        }
        match which {
            Oldest::Gpu => pop_ring(&mut self.gpu),
            Oldest::Stacks => pop_ring(&mut self.stacks),
            Oldest::Closed => pop_ring(&mut self.closed),
            Oldest::Metrics(k) => self.metrics.get_mut(&k).map_or(0, pop_ring),
            Oldest::Counts(k) => self.counts.get_mut(&k).map_or(0, pop_ring),
        }
    }
}

/// What the model holds, counted (a debug view of its memory: `Correlator::census`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Census {
    /// Connections in the open set, and their exchanges.
    pub open_conns: usize,
    pub open_exchanges: usize,
    /// Closed connections still in history, and their exchanges.
    pub closed_conns: usize,
    pub closed_exchanges: usize,
    /// Estimated bytes of the open connections (not history: the current state).
    pub open_bytes: usize,
    /// Estimated bytes of the history's buffers ([`Correlator::history_bytes_used`]).
    pub history_bytes: usize,
    /// Sockets in the model's copy of the latest table.
    pub latest_sockets: usize,
    /// Entries of the other buffers: metrics points, count points, stack captures, GPU
    /// readings.
    pub metrics_points: usize,
    pub count_points: usize,
    pub stacks: usize,
    pub gpu: usize,
}

impl Correlator {
    /// Counts of what the model holds now. Walks every connection: for tests and debug logs,
    /// not for every sample.
    pub fn census(&self) -> Census {
        use super::footprint::Footprint;
        Census {
            open_conns: self.conns.len(),
            open_exchanges: self.conns.values().map(|c| c.exchanges.len()).sum(),
            closed_conns: self.closed.len(),
            closed_exchanges: self.closed.iter().map(|c| c.exchanges.len()).sum(),
            open_bytes: self.conns.values().map(Footprint::footprint).sum(),
            history_bytes: self.history_bytes_used(),
            latest_sockets: self.latest_sockets.as_ref().map_or(0, |t| t.sockets.len()),
            metrics_points: self.metrics.values().map(|r| r.len()).sum(),
            count_points: self.counts.values().map(|r| r.len()).sum(),
            stacks: self.stacks.len(),
            gpu: self.gpu.len(),
        }
    }
}
