//! How the daemon spends py-spy (issue 15): adaptive stack sampling. Keys of the one flat
//! thresholds table (`--thresholds FILE`), like the correlator's and the detectors'.
//!
//! With `stacks_adaptive` on, the daemon's stacks source ticks every `stacks_tick_ms`. A tick
//! dumps every scheduler of each *suspected* engine once (so a wedge collects "idle in 6/6
//! dumps over 25 s" within one window), and otherwise one process of the stack, in a slow
//! round-robin. An engine is suspected when a request at it has been silent for
//! `suspect_silent_pct` of the wedge (or stall) threshold, when its GPU is idle and nothing
//! shows work while a request has been open `suspect_gpu_idle_ms`, when requests are queued
//! and none runs, or when a finding that implicates its schedulers is open. Off: every Python
//! process of the stack at each stacks period (15 s), three dumps of each scheduler, as
//! before. One-shot snapshots always take their full window of dumps.
//!
//! The daemon's socket table follows the same suspicion: every `sockets_calm_ms` while
//! nothing is suspected, at the sockets source's own period while something is.

/// The adaptive stack sampling policy's knobs (see the module doc).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingThresholds {
    /// The daemon samples stacks adaptively (suspected engines first, else round-robin).
    pub stacks_adaptive: bool,
    /// With `stacks_adaptive`: the period of one stacks tick.
    pub stacks_tick_ms: i64,
    /// A request silent for this percentage of `wedged_after_ms` (of `stall_after_ms` once
    /// its response started) makes its engine suspect.
    pub suspect_silent_pct: u32,
    /// An idle GPU with nothing showing work makes its engine suspect once a request has
    /// been open at it this long (shorter: a request between two batches).
    pub suspect_gpu_idle_ms: i64,
    /// The daemon's socket table every this many ms while nothing is suspected (at the
    /// sockets source's own period, 250 ms, while something is): the table is the
    /// daemon's largest cost on a big node, and only a suspicion needs it fine.
    pub sockets_calm_ms: i64,
}

impl Default for SamplingThresholds {
    fn default() -> Self {
        SamplingThresholds {
            stacks_adaptive: true,
            stacks_tick_ms: 5_000,
            suspect_silent_pct: 33,
            suspect_gpu_idle_ms: 3_000,
            sockets_calm_ms: 1_000,
        }
    }
}

impl SamplingThresholds {
    /// `pct` percent of `threshold_ms`: when a request silent that long is suspicious.
    pub fn silent_after(&self, threshold_ms: i64) -> i64 {
        threshold_ms.saturating_mul(i64::from(self.suspect_silent_pct)) / 100
    }
}
