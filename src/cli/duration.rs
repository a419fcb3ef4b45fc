//! The one duration grammar of every duration flag and of `--at`: humantime (`500ms`, `90s`,
//! `5m`, `1h30m`), and a bare number is seconds (`--window 3`, `demo --for 120` kept working).
//!
//! `--at` is a point in a recording: an offset from its start (`90s`, `+90s`), a time before
//! its end (`-10s`), or an RFC 3339 time. It is resolved against the recording's span by
//! [`At::resolve`], which refuses a time outside it naming the span.

use std::time::Duration;
use wedgewatch::clock::{self, Millis};

/// Parses a duration in the one grammar (clap value parser; clap names the flag and value).
pub fn parse(s: &str) -> Result<Duration, String> {
    parse_bare(s)
        .map_err(|e| format!("{e} (expected e.g. 500ms, 90s, 5m, 1h30m; a bare number is seconds)"))
}

/// [`parse`] without saying what is expected.
fn parse_bare(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("empty duration".into());
    }
    if let Ok(secs) = t.parse::<f64>() {
        return Duration::try_from_secs_f64(secs).map_err(|e| e.to_string());
    }
    humantime::parse_duration(t).map_err(|e| e.to_string())
}

/// A clap value parser for a duration of at most `max`.
pub fn at_most(max: Duration) -> impl Fn(&str) -> Result<Duration, String> + Clone {
    move |s: &str| {
        let d = parse(s)?;
        if d > max {
            return Err(format!("longer than {}", humantime::format_duration(max)));
        }
        Ok(d)
    }
}

/// Milliseconds of a duration, saturating (a `Duration` may exceed `u64` ms).
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A point in a recording as given to `--at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct At {
    /// As given, for messages.
    pub text: String,
    pub point: Point,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Point {
    /// From the recording's first sample.
    AfterStart(Duration),
    /// Before its last sample.
    BeforeEnd(Duration),
    /// Wall-clock time (RFC 3339), epoch ms.
    Time(Millis),
}

/// What `--help` says about `--at`.
pub const AT_GRAMMAR: &str =
    "an offset from the recording's first sample (90s, +1m30s; a bare number is seconds), \
     -DURATION before its last sample, or an RFC 3339 time";

impl At {
    /// Parses an `--at` value (clap value parser).
    pub fn parse(s: &str) -> Result<At, String> {
        let t = s.trim();
        let point = if let Some(ms) = clock::parse_rfc3339(t) {
            Point::Time(ms)
        } else {
            let (rest, from_end) = match (t.strip_prefix('+'), t.strip_prefix('-')) {
                (Some(r), _) => (r, false),
                (_, Some(r)) => (r, true),
                _ => (t, false),
            };
            let d = parse_bare(rest).map_err(|e| format!("{e}; expected {AT_GRAMMAR}"))?;
            if from_end {
                Point::BeforeEnd(d)
            } else {
                Point::AfterStart(d)
            }
        };
        Ok(At {
            text: s.to_string(),
            point,
        })
    }

    /// The epoch ms this points at in a recording whose samples span `[first, last]`;
    /// a point outside the span is an error that names the span.
    pub fn resolve(&self, first: Millis, last: Millis) -> Result<Millis, String> {
        let ms = |d: &Duration| i64::try_from(d.as_millis()).ok();
        let t = match &self.point {
            Point::AfterStart(d) => ms(d).and_then(|d| first.checked_add(d)),
            Point::BeforeEnd(d) => ms(d).and_then(|d| last.checked_sub(d)),
            Point::Time(t) => Some(*t),
        };
        match t {
            Some(t) if (first..=last).contains(&t) => Ok(t),
            _ => Err(format!(
                "--at {:?} is outside the recording: its samples span {} to {} ({})",
                self.text,
                clock::rfc3339(first),
                clock::rfc3339(last),
                human_ms(last.saturating_sub(first)),
            )),
        }
    }
}

/// `15s`, `1m 30s`: a span for people.
pub fn human_ms(ms: i64) -> String {
    let d = Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    // whole seconds unless shorter: 15.342s reads worse than 15s
    let d = if d >= Duration::from_secs(1) {
        Duration::from_secs(d.as_secs())
    } else {
        d
    };
    humantime::format_duration(d).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_grammar() {
        let s = Duration::from_secs;
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("90s"), Ok(s(90)));
        assert_eq!(parse("5m"), Ok(s(300)));
        assert_eq!(parse("1h30m"), Ok(s(5400)));
        assert_eq!(parse("1h 30m"), Ok(s(5400)));
        // old spellings: bare (fractional) seconds
        assert_eq!(parse("3"), Ok(s(3)));
        assert_eq!(parse("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("0"), Ok(s(0)));
        for bad in ["", "-3", "5x", "soon", "NaN", "inf", "1e400"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert!(at_most(s(3600))("2h").is_err());
        assert_eq!(at_most(s(3600))("1h"), Ok(s(3600)));
    }

    #[test]
    fn at_forms() {
        let s = Duration::from_secs;
        let p = |t: &str| At::parse(t).map(|a| a.point);
        assert_eq!(p("90s"), Ok(Point::AfterStart(s(90))));
        assert_eq!(p("+90s"), Ok(Point::AfterStart(s(90))));
        assert_eq!(p("+90"), Ok(Point::AfterStart(s(90))));
        assert_eq!(p("-10s"), Ok(Point::BeforeEnd(s(10))));
        assert!(matches!(p("2026-11-29T14:50:57.073Z"), Ok(Point::Time(_))));
        let e = At::parse("yesterday").expect_err("garbage");
        assert!(e.contains("RFC 3339"), "{e}");
        assert!(At::parse("+5x").is_err());
        assert!(At::parse("+99999999999999999999").is_err());
    }

    #[test]
    fn at_resolves_inside_the_span_only() {
        let (first, last) = (1_000_000, 1_015_000);
        let at = |s: &str| At::parse(s).expect("parse").resolve(first, last);
        assert_eq!(at("0s"), Ok(first));
        assert_eq!(at("15s"), Ok(last));
        assert_eq!(at("-5s"), Ok(last - 5000));
        let e = at("16s").expect_err("past the end");
        assert!(e.contains("samples span") && e.contains("(15s)"), "{e}");
        assert!(at("-16s").is_err());
        assert!(at("+9223372036854775807s").is_err());
    }
}
