//! Named, configurable thresholds, in two parts: what the correlator judges with (request
//! states and verdicts, hop linking, rates, staleness, GPU verdicts) and what only the
//! detectors read. Loaded from one flat TOML table (`--thresholds FILE`; the format of
//! earlier versions, every key optional, unknown keys an error) and range-checked at load.

use super::sampling::SamplingThresholds;
use super::{count, duration_ms, percent, toml_message, RangeError};
use serde::{Deserialize, Serialize};

/// Every threshold (milliseconds unless the name says otherwise). Serialized flat, as the
/// TOML file is written.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(from = "Flat", into = "Flat")]
pub struct Thresholds {
    pub correlate: CorrelateThresholds,
    pub detect: DetectThresholds,
    /// How the daemon samples stacks (`config/sampling.rs`).
    pub sampling: SamplingThresholds,
}

/// What the correlator judges with: exchange states, logical requests' verdicts (stuck or
/// not), hop links, counter rates, what is current, and GPU activity.
#[derive(Debug, Clone, PartialEq)]
pub struct CorrelateThresholds {
    /// `wedged_request`: no response byte for this long after the request arrived, unless
    /// the witnesses that nothing works on it say so sooner (`correlate::verdict`).
    pub wedged_after_ms: i64,
    /// `wedged_request`: the wait when every witness agrees nothing works on the request;
    /// with fewer, longer, up to `wedged_after_ms`.
    pub wedged_unanimous_ms: i64,
    /// `wedged_request` on a busy engine: fire anyway when at least this many requests that
    /// arrived later at the same component were answered meanwhile (it was skipped).
    pub wedged_overtaken_min: usize,
    /// `stalled_stream` / request state `stalled`: no response bytes for this long after
    /// the response started, while the component says the request is still open, unless
    /// the witnesses that nothing works on it say so sooner (`correlate::verdict`).
    pub stall_after_ms: i64,
    /// `stalled_stream`: the wait when every witness agrees nothing works on the stream;
    /// with fewer, longer, up to `stall_after_ms`.
    pub stall_unanimous_ms: i64,
    /// A started response that moved no byte for this long is no longer "streaming"; it
    /// is `done` unless something says it is still open.
    pub done_quiet_ms: i64,
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

/// What only the detectors read (each detector's file says which).
#[derive(Debug, Clone, PartialEq)]
pub struct DetectThresholds {
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
    pub accumulate_close_wait_silent_ms: i64,
    /// `process_restarted`: report restarts this recent.
    pub restart_recent_ms: i64,
    /// `endpoint_unresponsive`: this many consecutive failed probes of one URL ...
    pub endpoint_failures: usize,
    /// ... or a probe that took at least this long.
    pub endpoint_slow_ms: u64,
}

impl Default for CorrelateThresholds {
    fn default() -> Self {
        CorrelateThresholds {
            wedged_after_ms: 30_000,
            wedged_unanimous_ms: 10_000,
            wedged_overtaken_min: 5,
            stall_after_ms: 30_000,
            stall_unanimous_ms: 10_000,
            done_quiet_ms: 2_000,
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

impl CorrelateThresholds {
    /// The soonest a request with no response byte can be judged stuck: the unanimous
    /// witnesses' wait, never above `wedged_after_ms`.
    pub fn wedged_soonest_ms(&self) -> i64 {
        self.wedged_unanimous_ms.min(self.wedged_after_ms)
    }

    /// The soonest a response stream that stopped can be judged stalled: the unanimous
    /// witnesses' wait, never above `stall_after_ms`.
    pub fn stall_soonest_ms(&self) -> i64 {
        self.stall_unanimous_ms.min(self.stall_after_ms)
    }
}

impl Default for DetectThresholds {
    fn default() -> Self {
        DetectThresholds {
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
        }
    }
}

/// The on-disk form: one flat table, every key optional (missing keys keep their defaults),
/// unknown keys an error.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Flat {
    wedged_after_ms: i64,
    wedged_unanimous_ms: i64,
    wedged_overtaken_min: usize,
    stall_after_ms: i64,
    stall_unanimous_ms: i64,
    done_quiet_ms: i64,
    busy_after_ms: i64,
    queue_after_ms: i64,
    scheduler_min_dumps: usize,
    accumulate_window_ms: i64,
    accumulate_min_connections: u32,
    accumulate_min_close_wait: u32,
    accumulate_min_fds: u32,
    accumulate_min_threads: u32,
    accumulate_close_wait_silent_min: u32,
    accumulate_close_wait_silent_ms: i64,
    restart_recent_ms: i64,
    endpoint_failures: usize,
    endpoint_slow_ms: u64,
    link_window_ms: i64,
    link_slack_ms: i64,
    rate_window_ms: i64,
    stale_after_ms: i64,
    busy_util_pct: u32,
    busy_sm_pct: u32,
    spin_util_pct: u32,
    spin_power_frac: f64,
    stacks_adaptive: bool,
    stacks_tick_ms: i64,
    suspect_silent_pct: u32,
    suspect_gpu_idle_ms: i64,
    sockets_calm_ms: i64,
    gpu_calm_ms: i64,
    processes_calm_ms: i64,
    stacks_calm_ms: i64,
    pass_calm_ms: i64,
}

impl Default for Flat {
    fn default() -> Self {
        Thresholds::default().into()
    }
}

impl From<Thresholds> for Flat {
    fn from(t: Thresholds) -> Flat {
        Flat {
            wedged_after_ms: t.correlate.wedged_after_ms,
            wedged_unanimous_ms: t.correlate.wedged_unanimous_ms,
            wedged_overtaken_min: t.correlate.wedged_overtaken_min,
            stall_after_ms: t.correlate.stall_after_ms,
            stall_unanimous_ms: t.correlate.stall_unanimous_ms,
            done_quiet_ms: t.correlate.done_quiet_ms,
            busy_after_ms: t.detect.busy_after_ms,
            queue_after_ms: t.detect.queue_after_ms,
            scheduler_min_dumps: t.detect.scheduler_min_dumps,
            accumulate_window_ms: t.detect.accumulate_window_ms,
            accumulate_min_connections: t.detect.accumulate_min_connections,
            accumulate_min_close_wait: t.detect.accumulate_min_close_wait,
            accumulate_min_fds: t.detect.accumulate_min_fds,
            accumulate_min_threads: t.detect.accumulate_min_threads,
            accumulate_close_wait_silent_min: t.detect.accumulate_close_wait_silent_min,
            accumulate_close_wait_silent_ms: t.detect.accumulate_close_wait_silent_ms,
            restart_recent_ms: t.detect.restart_recent_ms,
            endpoint_failures: t.detect.endpoint_failures,
            endpoint_slow_ms: t.detect.endpoint_slow_ms,
            link_window_ms: t.correlate.link_window_ms,
            link_slack_ms: t.correlate.link_slack_ms,
            rate_window_ms: t.correlate.rate_window_ms,
            stale_after_ms: t.correlate.stale_after_ms,
            busy_util_pct: t.correlate.busy_util_pct,
            busy_sm_pct: t.correlate.busy_sm_pct,
            spin_util_pct: t.correlate.spin_util_pct,
            spin_power_frac: t.correlate.spin_power_frac,
            stacks_adaptive: t.sampling.stacks_adaptive,
            stacks_tick_ms: t.sampling.stacks_tick_ms,
            suspect_silent_pct: t.sampling.suspect_silent_pct,
            suspect_gpu_idle_ms: t.sampling.suspect_gpu_idle_ms,
            sockets_calm_ms: t.sampling.sockets_calm_ms,
            gpu_calm_ms: t.sampling.gpu_calm_ms,
            processes_calm_ms: t.sampling.processes_calm_ms,
            stacks_calm_ms: t.sampling.stacks_calm_ms,
            pass_calm_ms: t.sampling.pass_calm_ms,
        }
    }
}

impl From<Flat> for Thresholds {
    fn from(f: Flat) -> Thresholds {
        Thresholds {
            correlate: CorrelateThresholds {
                wedged_after_ms: f.wedged_after_ms,
                wedged_unanimous_ms: f.wedged_unanimous_ms,
                wedged_overtaken_min: f.wedged_overtaken_min,
                stall_after_ms: f.stall_after_ms,
                stall_unanimous_ms: f.stall_unanimous_ms,
                done_quiet_ms: f.done_quiet_ms,
                link_window_ms: f.link_window_ms,
                link_slack_ms: f.link_slack_ms,
                rate_window_ms: f.rate_window_ms,
                stale_after_ms: f.stale_after_ms,
                busy_util_pct: f.busy_util_pct,
                busy_sm_pct: f.busy_sm_pct,
                spin_util_pct: f.spin_util_pct,
                spin_power_frac: f.spin_power_frac,
            },
            detect: DetectThresholds {
                busy_after_ms: f.busy_after_ms,
                queue_after_ms: f.queue_after_ms,
                scheduler_min_dumps: f.scheduler_min_dumps,
                accumulate_window_ms: f.accumulate_window_ms,
                accumulate_min_connections: f.accumulate_min_connections,
                accumulate_min_close_wait: f.accumulate_min_close_wait,
                accumulate_min_fds: f.accumulate_min_fds,
                accumulate_min_threads: f.accumulate_min_threads,
                accumulate_close_wait_silent_min: f.accumulate_close_wait_silent_min,
                accumulate_close_wait_silent_ms: f.accumulate_close_wait_silent_ms,
                restart_recent_ms: f.restart_recent_ms,
                endpoint_failures: f.endpoint_failures,
                endpoint_slow_ms: f.endpoint_slow_ms,
            },
            sampling: SamplingThresholds {
                stacks_adaptive: f.stacks_adaptive,
                stacks_tick_ms: f.stacks_tick_ms,
                suspect_silent_pct: f.suspect_silent_pct,
                suspect_gpu_idle_ms: f.suspect_gpu_idle_ms,
                sockets_calm_ms: f.sockets_calm_ms,
                gpu_calm_ms: f.gpu_calm_ms,
                processes_calm_ms: f.processes_calm_ms,
                stacks_calm_ms: f.stacks_calm_ms,
                pass_calm_ms: f.pass_calm_ms,
            },
        }
    }
}

impl Thresholds {
    /// Loads thresholds from TOML; missing keys keep their defaults, unknown keys and values
    /// out of range are an error naming the key (see [`Thresholds::validate`]).
    pub fn from_toml(text: &str) -> crate::error::Result<Thresholds> {
        let bad = |m: String| crate::error::Error::Other(m);
        let t: Thresholds = toml::from_str(text).map_err(|e| bad(toml_message(text, &e)))?;
        t.validate().map_err(|e| bad(e.to_string()))?;
        Ok(t)
    }
    /// Every threshold in its range: durations positive and at most [`MAX_DURATION_MS`]
    /// (`link_slack_ms` may be 0), counts 1 to [`MAX_COUNT`], percentages 1 to 100,
    /// `spin_power_frac` in (0, 1].
    pub fn validate(&self) -> Result<(), RangeError> {
        for (key, v) in [
            ("wedged_after_ms", self.correlate.wedged_after_ms),
            ("wedged_unanimous_ms", self.correlate.wedged_unanimous_ms),
            ("stall_after_ms", self.correlate.stall_after_ms),
            ("stall_unanimous_ms", self.correlate.stall_unanimous_ms),
            ("done_quiet_ms", self.correlate.done_quiet_ms),
            ("busy_after_ms", self.detect.busy_after_ms),
            ("queue_after_ms", self.detect.queue_after_ms),
            ("accumulate_window_ms", self.detect.accumulate_window_ms),
            (
                "accumulate_close_wait_silent_ms",
                self.detect.accumulate_close_wait_silent_ms,
            ),
            ("restart_recent_ms", self.detect.restart_recent_ms),
            ("link_window_ms", self.correlate.link_window_ms),
            ("rate_window_ms", self.correlate.rate_window_ms),
            ("stale_after_ms", self.correlate.stale_after_ms),
            ("suspect_gpu_idle_ms", self.sampling.suspect_gpu_idle_ms),
        ] {
            duration_ms(key, v, 1)?;
        }
        duration_ms("link_slack_ms", self.correlate.link_slack_ms, 0)?;
        let slow = i64::try_from(self.detect.endpoint_slow_ms).unwrap_or(i64::MAX);
        duration_ms("endpoint_slow_ms", slow, 1)?;
        let wide = |v: usize| u64::try_from(v).unwrap_or(u64::MAX);
        for (key, v) in [
            (
                "wedged_overtaken_min",
                wide(self.correlate.wedged_overtaken_min),
            ),
            ("scheduler_min_dumps", wide(self.detect.scheduler_min_dumps)),
            ("endpoint_failures", wide(self.detect.endpoint_failures)),
            (
                "accumulate_min_connections",
                self.detect.accumulate_min_connections.into(),
            ),
            (
                "accumulate_min_close_wait",
                self.detect.accumulate_min_close_wait.into(),
            ),
            ("accumulate_min_fds", self.detect.accumulate_min_fds.into()),
            (
                "accumulate_min_threads",
                self.detect.accumulate_min_threads.into(),
            ),
            (
                "accumulate_close_wait_silent_min",
                self.detect.accumulate_close_wait_silent_min.into(),
            ),
        ] {
            count(key, v)?;
        }
        percent("busy_util_pct", self.correlate.busy_util_pct)?;
        percent("busy_sm_pct", self.correlate.busy_sm_pct)?;
        percent("spin_util_pct", self.correlate.spin_util_pct)?;
        percent("suspect_silent_pct", self.sampling.suspect_silent_pct)?;
        self.sampling.validate()?;
        let frac = self.correlate.spin_power_frac;
        if !(frac > 0.0 && frac <= 1.0) {
            return Err(RangeError {
                key: "spin_power_frac".into(),
                value: frac.to_string(),
                expected: "a fraction above 0 and at most 1".into(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flat_format_round_trips() {
        let text = "wedged_after_ms = 8000\nqueue_after_ms = 6000\n";
        let t = Thresholds::from_toml(text).expect("valid");
        assert_eq!(t.correlate.wedged_after_ms, 8000);
        assert_eq!(t.detect.queue_after_ms, 6000);
        assert_eq!(
            t.correlate.stall_after_ms, 30_000,
            "missing keys keep their defaults"
        );
        let back = toml::to_string(&t).expect("serializes");
        assert!(back.contains("wedged_after_ms = 8000"), "{back}");
        assert_eq!(Thresholds::from_toml(&back).expect("reloads"), t);
        assert!(Thresholds::from_toml("no_such_key = 1").is_err());
    }

    #[test]
    fn defaults_are_in_range() {
        assert_eq!(Thresholds::default().validate(), Ok(()));
    }

    #[test]
    fn each_bad_threshold_is_named() {
        let cases = [
            ("link_window_ms = -1000", "link_window_ms"),
            ("link_slack_ms = -1", "link_slack_ms"),
            ("wedged_after_ms = 0", "wedged_after_ms"),
            ("wedged_unanimous_ms = -10", "wedged_unanimous_ms"),
            ("stall_unanimous_ms = 0", "stall_unanimous_ms"),
            ("stale_after_ms = 9223372036854775807", "stale_after_ms"),
            (
                "endpoint_slow_ms = 18446744073709551615",
                "endpoint_slow_ms",
            ),
            ("scheduler_min_dumps = 0", "scheduler_min_dumps"),
            ("busy_util_pct = 101", "busy_util_pct"),
            ("suspect_silent_pct = 0", "suspect_silent_pct"),
            ("stacks_tick_ms = 10", "stacks_tick_ms"),
            ("sockets_calm_ms = 60000", "sockets_calm_ms"),
            ("stacks_calm_ms = 999", "stacks_calm_ms"),
            ("gpu_calm_ms = 5000", "gpu_calm_ms"),
            ("processes_calm_ms = 100", "processes_calm_ms"),
            ("pass_calm_ms = 20000", "pass_calm_ms"),
            ("spin_power_frac = nan", "spin_power_frac"),
            ("spin_power_frac = -0.5", "spin_power_frac"),
        ];
        for (text, key) in cases {
            let err = Thresholds::from_toml(text).expect_err(text).to_string();
            assert!(err.contains(key), "{text}: {err}");
            assert!(!err.contains('\n'), "{text}: one line: {err}");
        }
    }

    #[test]
    fn toml_type_errors_name_the_key_on_one_line() {
        let text = "wedged_after_ms = 1\nwedged_overtaken_min = -3\n";
        let err = Thresholds::from_toml(text).expect_err("negative usize");
        let msg = err.to_string();
        assert!(msg.contains("line 2: wedged_overtaken_min"), "{msg}");
        assert!(!msg.contains('\n'), "{msg}");
    }
}
