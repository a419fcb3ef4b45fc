//! Range and sanity checks for configuration read from files (`--thresholds`, probe TOML),
//! and the one-line form of a TOML error.
//!
//! Serde checks types, not meaning: a negative window or a duration of `i64::MAX` ms parses
//! fine and then panics deep in time arithmetic or slice bounds (issue 10, item 8). Every
//! value is checked here at load time instead, and a bad one is reported naming its key.

use crate::detect::Thresholds;
use crate::probes::ProbeFile;
use std::fmt::Display;
use std::io::Read;
use std::path::Path;

/// Longest duration a threshold may hold: 30 days. Thresholds are added to and subtracted
/// from epoch-millisecond timestamps; this keeps that arithmetic far from overflowing.
pub const MAX_DURATION_MS: i64 = 30 * 24 * 3600 * 1000;
/// Largest count a threshold may hold: far above anything a detector can see in a window.
pub const MAX_COUNT: u64 = 1_000_000;
/// Deepest `innermost_depth` of a stack rule (py-spy stacks are far shallower).
pub const MAX_STACK_DEPTH: usize = 10_000;

/// Largest configuration file read (probe TOML, thresholds): far above any real one, and a
/// bound on what a hostile file (or `/dev/zero`) can make us allocate.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Reads a configuration file of at most [`MAX_CONFIG_BYTES`] bytes of UTF-8.
pub fn read_config(path: &Path) -> crate::Result<String> {
    let io = |e| crate::Error::io(path, e);
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_CONFIG_BYTES + 1).read_to_string(&mut text))
        .map_err(io)?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        let msg = format!("larger than {MAX_CONFIG_BYTES} bytes: not a configuration file");
        return Err(io(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            msg,
        )));
    }
    Ok(text)
}

/// A configuration value outside its range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key} = {value}: expected {expected}")]
pub struct RangeError {
    pub key: String,
    pub value: String,
    pub expected: String,
}

/// `lo <= v <= hi`, else an error naming `key`.
fn in_range<T: PartialOrd + Display>(
    key: &str,
    v: T,
    lo: T,
    hi: T,
    unit: &str,
) -> Result<(), RangeError> {
    if lo <= v && v <= hi {
        return Ok(());
    }
    Err(RangeError {
        key: key.to_string(),
        value: v.to_string(),
        expected: format!("{lo} to {hi}{unit}"),
    })
}

fn duration_ms(key: &str, v: i64, lo: i64) -> Result<(), RangeError> {
    in_range(key, v, lo, MAX_DURATION_MS, " ms (at most 30 days)")
}

fn count(key: &str, v: u64) -> Result<(), RangeError> {
    in_range(key, v, 1, MAX_COUNT, "")
}

fn percent(key: &str, v: u32) -> Result<(), RangeError> {
    in_range(key, v, 1, 100, " (percent)")
}

impl Thresholds {
    /// Every threshold in its range: durations positive and at most [`MAX_DURATION_MS`]
    /// (`link_slack_ms` may be 0), counts 1 to [`MAX_COUNT`], percentages 1 to 100,
    /// `spin_power_frac` in (0, 1].
    pub fn validate(&self) -> Result<(), RangeError> {
        for (key, v) in [
            ("wedged_after_ms", self.wedged_after_ms),
            ("stall_after_ms", self.stall_after_ms),
            ("done_quiet_ms", self.done_quiet_ms),
            ("busy_after_ms", self.busy_after_ms),
            ("queue_after_ms", self.queue_after_ms),
            ("accumulate_window_ms", self.accumulate_window_ms),
            (
                "accumulate_close_wait_silent_ms",
                self.accumulate_close_wait_silent_ms,
            ),
            ("restart_recent_ms", self.restart_recent_ms),
            ("link_window_ms", self.link_window_ms),
            ("rate_window_ms", self.rate_window_ms),
            ("stale_after_ms", self.stale_after_ms),
        ] {
            duration_ms(key, v, 1)?;
        }
        duration_ms("link_slack_ms", self.link_slack_ms, 0)?;
        let slow = i64::try_from(self.endpoint_slow_ms).unwrap_or(i64::MAX);
        duration_ms("endpoint_slow_ms", slow, 1)?;
        let wide = |v: usize| u64::try_from(v).unwrap_or(u64::MAX);
        for (key, v) in [
            ("wedged_overtaken_min", wide(self.wedged_overtaken_min)),
            ("scheduler_min_dumps", wide(self.scheduler_min_dumps)),
            ("endpoint_failures", wide(self.endpoint_failures)),
            (
                "accumulate_min_connections",
                self.accumulate_min_connections.into(),
            ),
            (
                "accumulate_min_close_wait",
                self.accumulate_min_close_wait.into(),
            ),
            ("accumulate_min_fds", self.accumulate_min_fds.into()),
            ("accumulate_min_threads", self.accumulate_min_threads.into()),
            (
                "accumulate_close_wait_silent_min",
                self.accumulate_close_wait_silent_min.into(),
            ),
        ] {
            count(key, v)?;
        }
        percent("busy_util_pct", self.busy_util_pct)?;
        percent("busy_sm_pct", self.busy_sm_pct)?;
        percent("spin_util_pct", self.spin_util_pct)?;
        let frac = self.spin_power_frac;
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

/// What serde cannot check in a probe file: ports, paths and depths that make sense.
/// (Regexes and roles are checked by the profile and stack-rule loaders.)
pub fn check_probe_file(file: &ProbeFile) -> Result<(), String> {
    for p in &file.profile {
        let ctx = |e: RangeError| format!("profile {:?}: {e}", p.name);
        if p.name.trim().is_empty() {
            return Err("profile with an empty name".into());
        }
        for (key, port) in [
            ("default_port", p.default_port),
            ("metrics_default_port", p.metrics_default_port),
        ] {
            if let Some(port) = port {
                in_range(key, port, 1, u16::MAX, "").map_err(ctx)?;
            }
        }
        for (key, path) in [
            ("metrics_path", &p.metrics_path),
            ("workers_endpoint", &p.workers_endpoint),
        ] {
            if let Some(path) = path.as_deref().filter(|s| !s.starts_with('/')) {
                return Err(format!(
                    "profile {:?}: {key} = {path:?}: expected a path starting with /",
                    p.name
                ));
            }
        }
    }
    for m in &file.metric_map {
        m.validate()?;
    }
    for r in &file.stack_rule {
        in_range("innermost_depth", r.innermost_depth, 1, MAX_STACK_DEPTH, "")
            .map_err(|e| format!("stack_rule {:?}: {e}", r.name))?;
    }
    Ok(())
}

/// `s` with every run of whitespace (line breaks included) turned into one space.
pub fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A TOML error on one line: `line N: KEY: message`. The `toml` crate's own rendering
/// spans several lines (a source excerpt with a caret), and a serde type error does not
/// name the key; the key is taken from the offending line instead.
pub fn toml_message(text: &str, e: &toml::de::Error) -> String {
    let msg = one_line(e.message());
    let Some(before) = e.span().and_then(|s| text.get(..s.start)) else {
        return msg;
    };
    let line_no = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line = text.get(line_start..).and_then(|t| t.lines().next());
    match line.and_then(key_of) {
        Some(key) if !msg.contains(key) => format!("line {line_no}: {key}: {msg}"),
        _ => format!("line {line_no}: {msg}"),
    }
}

/// The key of a `key = value` line, if it has a plain one.
fn key_of(line: &str) -> Option<&str> {
    let (key, _) = line.split_once('=')?;
    let key = key.trim();
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
    (!key.is_empty() && key.chars().all(plain)).then_some(key)
}

#[cfg(test)]
mod tests {
    use super::*;

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
            ("stale_after_ms = 9223372036854775807", "stale_after_ms"),
            (
                "endpoint_slow_ms = 18446744073709551615",
                "endpoint_slow_ms",
            ),
            ("scheduler_min_dumps = 0", "scheduler_min_dumps"),
            ("busy_util_pct = 101", "busy_util_pct"),
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
