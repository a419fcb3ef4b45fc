//! Configuration read from files: the thresholds (`thresholds.rs`), bounded reading, range
//! checks and the one-line form of a TOML error. Serde checks types, not meaning: every value
//! is range-checked at load, a bad one reported by its key, so no absurd duration reaches
//! time arithmetic.

pub mod sampling;
pub mod thresholds;

pub use sampling::SamplingThresholds;
pub use thresholds::{CorrelateThresholds, DetectThresholds, Thresholds};

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
pub fn read_config(path: &Path) -> crate::error::Result<String> {
    let io = |e| crate::error::Error::io(path, e);
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
pub fn in_range<T: PartialOrd + Display>(
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

pub(crate) fn duration_ms(key: &str, v: i64, lo: i64) -> Result<(), RangeError> {
    in_range(key, v, lo, MAX_DURATION_MS, " ms (at most 30 days)")
}

pub(crate) fn count(key: &str, v: u64) -> Result<(), RangeError> {
    in_range(key, v, 1, MAX_COUNT, "")
}

pub(crate) fn percent(key: &str, v: u32) -> Result<(), RangeError> {
    in_range(key, v, 1, 100, " (percent)")
}

/// `s` with every run of whitespace (line breaks included) turned into one space.
pub fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A TOML error on one line: `line N: KEY: message`, the key taken from the offending line
/// (a serde type error does not name it).
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
