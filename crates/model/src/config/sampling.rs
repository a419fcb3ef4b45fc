//! How the daemon spends its sampling: keys of the one flat thresholds table (`--thresholds
//! FILE`; each key in docs/findings.md "Thresholds").
//!
//! With `stacks_adaptive` on, each stacks tick dumps every scheduler of each *suspected*
//! engine once, and otherwise one process of the stack in a slow round-robin; off, every
//! Python process at each stacks period. One-shot snapshots always take their full window.
//! The daemon's other periodic work runs at its `*_calm_ms` period while nothing is
//! suspected, at its own period while something is. Why: a healthy node needs none of it
//! fine, and a wedge is suspected at a third of its threshold, before a calm period could
//! hide it. When an engine is suspected: `policy::suspicion`.

/// The adaptive stack sampling policy's knobs (see the module doc).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingThresholds {
    /// The daemon samples stacks adaptively (suspected engines first, else round-robin).
    pub stacks_adaptive: bool,
    /// With `stacks_adaptive`: the period of one stacks tick.
    pub stacks_tick_ms: i64,
    /// A request silent for this percentage of the soonest wedge verdict
    /// (`wedged_unanimous_ms`, at most `wedged_after_ms`; of `stall_after_ms` once
    /// its response started) makes its engine suspect.
    pub suspect_silent_pct: u32,
    /// An idle GPU with nothing showing work makes its engine suspect once a request has
    /// been open at it this long (shorter: a request between two batches).
    pub suspect_gpu_idle_ms: i64,
    /// The daemon's socket table every this many ms while nothing is suspected (at the
    /// sockets source's own period, 250 ms, while something is): the table is the
    /// daemon's largest cost on a big node, and only a suspicion needs it fine.
    pub sockets_calm_ms: i64,
    /// The daemon's GPU source every this many ms while nothing is suspected.
    pub gpu_calm_ms: i64,
    /// The daemon's process facts (restarts, fds, threads) every this many ms while
    /// nothing is suspected; rediscovery still runs every 10 s.
    pub processes_calm_ms: i64,
    /// The daemon's stacks tick every this many ms while nothing is suspected (one
    /// process of the round-robin per tick); at `stacks_tick_ms` while something is.
    pub stacks_calm_ms: i64,
    /// The daemon's detector pass (log, exporter, suspicion) every this many ms while
    /// nothing is suspected; every 2 s while something is.
    pub pass_calm_ms: i64,
}

impl Default for SamplingThresholds {
    fn default() -> Self {
        SamplingThresholds {
            stacks_adaptive: true,
            stacks_tick_ms: 5_000,
            suspect_silent_pct: 33,
            suspect_gpu_idle_ms: 3_000,
            sockets_calm_ms: 2_000,
            gpu_calm_ms: 1_000,
            processes_calm_ms: 5_000,
            stacks_calm_ms: 20_000,
            pass_calm_ms: 6_000,
        }
    }
}

impl SamplingThresholds {
    /// Every period in its range (see the keys' docs in docs/findings.md).
    pub fn validate(&self) -> Result<(), super::RangeError> {
        // A tick below a second would dump faster than py-spy answers on a loaded box.
        super::in_range(
            "stacks_tick_ms",
            self.stacks_tick_ms,
            1_000,
            3_600_000,
            " ms",
        )?;
        // Calm still sees a request within the suspicion's fraction of the wedge threshold.
        super::in_range("sockets_calm_ms", self.sockets_calm_ms, 250, 10_000, " ms")?;
        // A GPU idle while a request is open makes its engine suspect after 3 s.
        super::in_range("gpu_calm_ms", self.gpu_calm_ms, 250, 3_000, " ms")?;
        super::in_range(
            "processes_calm_ms",
            self.processes_calm_ms,
            1_000,
            60_000,
            " ms",
        )?;
        super::in_range(
            "stacks_calm_ms",
            self.stacks_calm_ms,
            1_000,
            3_600_000,
            " ms",
        )?;
        // Calm, the suspicion itself is derived once per pass: a pass slower than the
        // suspicion's fraction of the wedge threshold (10 s of 30 s) would delay the alert.
        super::in_range("pass_calm_ms", self.pass_calm_ms, 500, 10_000, " ms")?;
        Ok(())
    }

    /// `pct` percent of `threshold_ms`: when a request silent that long is suspicious.
    pub fn silent_after(&self, threshold_ms: i64) -> i64 {
        threshold_ms.saturating_mul(i64::from(self.suspect_silent_pct)) / 100
    }
}
