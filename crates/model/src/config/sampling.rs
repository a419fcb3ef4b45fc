//! How the daemon spends its sampling: keys of the one flat thresholds table (`--thresholds
//! FILE`; each key in docs/findings.md "Thresholds").
//!
//! The daemon samples finely only what is suspected: with `stacks_adaptive`, each stacks
//! tick dumps every scheduler of a suspected engine, else one process in a slow round-robin;
//! sockets, GPU, processes, stacks and the detector pass run at their `*_calm_ms` periods
//! while nothing is suspected. A healthy node needs none of them fine, and suspicion comes at
//! a fraction of the wedge threshold, long before a calm period could hide a wedge.

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
    /// The daemon's socket table every this many ms while nothing is suspected (its largest
    /// cost on a big node).
    pub sockets_calm_ms: i64,
    /// The daemon's GPU source every this many ms while nothing is suspected.
    pub gpu_calm_ms: i64,
    /// The daemon's process facts every this many ms while nothing is suspected.
    pub processes_calm_ms: i64,
    /// The daemon's stacks tick every this many ms while nothing is suspected.
    pub stacks_calm_ms: i64,
    /// The daemon's detector pass every this many ms while nothing is suspected.
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
        // The suspicion is derived once per pass: a slower pass would delay the alert.
        super::in_range("pass_calm_ms", self.pass_calm_ms, 500, 10_000, " ms")?;
        Ok(())
    }

    /// `pct` percent of `threshold_ms`: when a request silent that long is suspicious.
    pub fn silent_after(&self, threshold_ms: i64) -> i64 {
        threshold_ms.saturating_mul(i64::from(self.suspect_silent_pct)) / 100
    }
}
