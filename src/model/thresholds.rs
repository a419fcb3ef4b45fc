//! Named, configurable detector thresholds. Each detector's file says which fields it reads.
//! They live in the model layer because the correlator reads them too (staleness, hop
//! linking, GPU verdicts); loading them from TOML (`from_toml`) stays in `detect::thresholds`.

use serde::{Deserialize, Serialize};

/// Named, configurable thresholds (milliseconds unless the name says otherwise).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Thresholds {
    /// `wedged_request`: no response byte for this long after the request arrived.
    pub wedged_after_ms: i64,
    /// `wedged_request` on a busy engine: fire anyway when at least this many requests that
    /// arrived later at the same component were answered meanwhile (it was skipped).
    pub wedged_overtaken_min: usize,
    /// `stalled_stream` / request state `stalled`: no response bytes for this long after
    /// the response started, while the component says the request is still open.
    pub stall_after_ms: i64,
    /// A started response that moved no byte for this long is no longer "streaming"; it
    /// is `done` unless something says it is still open.
    pub done_quiet_ms: i64,
    /// `busy_without_progress`: GPU busy and no response byte at the component for this long.
    pub busy_after_ms: i64,
    /// `queue_not_draining`: queue non-empty, nothing running, for this long.
    pub queue_after_ms: i64,
    /// `scheduler_stuck`: at least this many dumps in the window must agree.
    pub scheduler_min_dumps: usize,
    /// `accumulating_state`: the window over which growth is judged.
    pub accumulate_window_ms: i64,
    pub accumulate_min_connections: u32,
    pub accumulate_min_close_wait: u32,
    pub accumulate_min_fds: u32,
    pub accumulate_min_threads: u32,
    /// `accumulating_state` from one look (no history): at least this many sockets of a
    /// component in CLOSE_WAIT (the peer hung up, the component never closed) ...
    pub accumulate_close_wait_silent_min: u32,
    /// ... each silent (no byte or ACK either way, from `tcp_info`) for at least this long.
    /// A normal close leaves CLOSE_WAIT within milliseconds; a client pool that closes idle
    /// connections lazily holds a few, bounded by its size.
    pub accumulate_close_wait_silent_ms: i64,
    /// `process_restarted`: report restarts this recent.
    pub restart_recent_ms: i64,
    /// `endpoint_unresponsive`: this many consecutive failed probes of one URL ...
    pub endpoint_failures: usize,
    /// ... or a probe that took at least this long.
    pub endpoint_slow_ms: u64,
    /// Hop linking: a child request may arrive up to this long after its parent ...
    pub link_window_ms: i64,
    /// ... or this much before it (the two estimates come from different sockets).
    pub link_slack_ms: i64,
    /// Counter rates are taken over this window.
    pub rate_window_ms: i64,
    /// A metrics point or GPU reading older than this is not used as "current".
    pub stale_after_ms: i64,
    /// GPU: utilization at or above this is "working".
    pub busy_util_pct: u32,
    /// GPU: a process's SM utilization at or above this is "working".
    pub busy_sm_pct: u32,
    /// GPU: utilization at or above this at less than `spin_power_frac` of the power limit
    /// is "spinning" (a kernel spinning, e.g. a hung NCCL collective).
    pub spin_util_pct: u32,
    pub spin_power_frac: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            wedged_after_ms: 30_000,
            wedged_overtaken_min: 5,
            stall_after_ms: 30_000,
            done_quiet_ms: 2_000,
            busy_after_ms: 20_000,
            queue_after_ms: 30_000,
            scheduler_min_dumps: 3,
            accumulate_window_ms: 300_000,
            accumulate_min_connections: 50,
            accumulate_min_close_wait: 10,
            accumulate_min_fds: 100,
            accumulate_min_threads: 20,
            accumulate_close_wait_silent_min: 20,
            accumulate_close_wait_silent_ms: 30_000,
            restart_recent_ms: 600_000,
            endpoint_failures: 2,
            endpoint_slow_ms: 5_000,
            link_window_ms: 500,
            link_slack_ms: 100,
            rate_window_ms: 15_000,
            stale_after_ms: 10_000,
            busy_util_pct: 10,
            busy_sm_pct: 5,
            spin_util_pct: 90,
            spin_power_frac: 0.3,
        }
    }
}
