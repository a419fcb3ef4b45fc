//! A lenient, bounded Prometheus text-format parser. Our own: the published crates drop
//! `sglang:`/`vllm:` names or reject a real exposition over one `_created` line. Rules:
//! - metric names `[a-zA-Z_:][a-zA-Z0-9_:]*`; label names `[a-zA-Z_][a-zA-Z0-9_]*`;
//! - label values with `\"`, `\\`, `\n` escapes (unknown escapes kept literally);
//! - values: floats, `NaN`, `+Inf`, `-Inf`, `Inf`; an optional integer timestamp after;
//! - `# HELP` / `# TYPE` recorded; other comments and blank lines ignored; untyped samples and
//!   `_created`/`_bucket`/`_sum`/`_count` kept as plain series;
//! - anything else skipped and counted in `bad_lines`. Never panics, never fails.
//!
//! Bounded ([`parse_limited`]), since any local process can pose as an engine; what was
//! dropped is in [`Cut`].

use crate::model::Series;
use std::collections::BTreeMap;

/// Bounds of one parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParseLimits {
    /// Series kept at most (wanted and sampled together).
    pub max_series: usize,
    /// Series that are not wanted but kept anyway as a raw sample, at most.
    pub raw_sample: usize,
    /// Bytes of label names and values of one series; a series over it is dropped.
    pub max_label_bytes: usize,
}

impl Default for ParseLimits {
    fn default() -> Self {
        ParseLimits {
            max_series: 20_000,
            raw_sample: 256,
            max_label_bytes: 4096,
        }
    }
}

/// What a bounded parse left out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cut {
    /// Sample lines seen (kept, dropped, or bad after a name).
    pub seen: u64,
    /// Wanted series dropped because `max_series` were already kept.
    pub over_series_limit: u64,
    /// Series dropped because their labels exceed `max_label_bytes`.
    pub over_label_bytes: u64,
    /// Series neither wanted nor in the raw sample (by design, not a failure on its own).
    pub unsampled: u64,
}

impl Cut {
    /// Whether a limit (not just the sampling policy) removed something, or the exposition
    /// had more series than the limit: then the caller must say so.
    pub fn is_cut(&self, limits: &ParseLimits) -> bool {
        self.over_series_limit > 0
            || self.over_label_bytes > 0
            || self.seen > limits.max_series as u64
    }

    /// One sentence for a status.
    pub fn describe(&self, limits: &ParseLimits, kept: usize) -> String {
        let mut parts = vec![format!(
            "{} series seen, {kept} kept (limit {}, raw sample {})",
            self.seen, limits.max_series, limits.raw_sample
        )];
        if self.over_series_limit > 0 {
            parts.push(format!(
                "{} wanted series over the series limit dropped",
                self.over_series_limit
            ));
        }
        if self.over_label_bytes > 0 {
            parts.push(format!(
                "{} series over the {}-byte label limit dropped",
                self.over_label_bytes, limits.max_label_bytes
            ));
        }
        format!("series cut: {}", parts.join("; "))
    }
}

/// The kind a `# TYPE` line declared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    Counter,
    Gauge,
    Histogram,
    Summary,
    Untyped,
}

/// One parsed exposition.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Exposition {
    pub series: Vec<Series>,
    /// Lines that were neither a sample, a comment nor blank (among those looked at).
    pub bad_lines: u32,
    /// `# TYPE name kind`, by family name (at most `max_series` entries).
    pub types: BTreeMap<String, MetricType>,
    /// `# HELP name text`, by family name (at most `max_series` entries).
    pub help: BTreeMap<String, String>,
    /// What the limits left out.
    pub cut: Cut,
}

/// Parses a whole exposition, every series wanted, under the default limits. Invalid UTF-8
/// is replaced, never rejected.
pub fn parse(text: &str) -> Exposition {
    parse_limited(text.as_bytes(), false, &ParseLimits::default(), &|_| true)
}

/// Parses bytes (a possibly truncated body), every series wanted, under the default limits:
/// a partial last line is dropped, not counted.
pub fn parse_bytes(body: &[u8], truncated: bool) -> Exposition {
    parse_limited(body, truncated, &ParseLimits::default(), &|_| true)
}

/// The bounded parse: one pass over `body`, line by line, allocating only for kept series.
/// `wanted(name)` says which series matter; they are kept up to `limits.max_series` wherever
/// they appear, the first `limits.raw_sample` others too. With `truncated`, a partial last
/// line is dropped, not counted. Pure: no I/O, never panics.
pub fn parse_limited(
    body: &[u8],
    truncated: bool,
    limits: &ParseLimits,
    wanted: &dyn Fn(&str) -> bool,
) -> Exposition {
    let mut p = Parser {
        out: Exposition::default(),
        limits,
        wanted,
        sampled: 0,
    };
    let mut lines = body.split(|&b| b == b'\n').peekable();
    while let Some(raw) = lines.next() {
        if truncated && lines.peek().is_none() {
            break;
        }
        p.line(&String::from_utf8_lossy(raw));
    }
    p.out
}

struct Parser<'a> {
    out: Exposition,
    limits: &'a ParseLimits,
    wanted: &'a dyn Fn(&str) -> bool,
    sampled: usize,
}

impl Parser<'_> {
    fn line(&mut self, raw: &str) {
        let line = raw.trim();
        if line.is_empty() {
            return;
        }
        if let Some(rest) = line.strip_prefix('#') {
            parse_comment(rest, &mut self.out, self.limits.max_series);
            return;
        }
        let name_end = metric_name_end(line);
        if name_end == 0 {
            self.bad();
            return;
        }
        let cut = &mut self.out.cut;
        cut.seen = cut.seen.saturating_add(1);
        let name = &line[..name_end];
        let full = self.out.series.len() >= self.limits.max_series;
        let is_wanted = (self.wanted)(name);
        if is_wanted && full {
            cut.over_series_limit += 1;
            return;
        }
        if !is_wanted && (full || self.sampled >= self.limits.raw_sample) {
            cut.unsampled += 1;
            return;
        }
        match parse_sample(line) {
            Some(s) if label_bytes(&s) > self.limits.max_label_bytes => {
                self.out.cut.over_label_bytes += 1;
            }
            Some(s) => {
                self.sampled += usize::from(!is_wanted);
                self.out.series.push(s);
            }
            None => self.bad(),
        }
    }

    fn bad(&mut self) {
        self.out.bad_lines = self.out.bad_lines.saturating_add(1);
    }
}

fn label_bytes(s: &Series) -> usize {
    s.labels.iter().map(|(k, v)| k.len() + v.len()).sum()
}

fn parse_comment(rest: &str, out: &mut Exposition, max: usize) {
    let rest = rest.trim_start();
    if let Some(r) = rest.strip_prefix("TYPE") {
        let mut it = r.split_whitespace();
        if let (Some(name), Some(kind)) = (it.next(), it.next()) {
            let t = match kind {
                "counter" => MetricType::Counter,
                "gauge" => MetricType::Gauge,
                "histogram" | "gaugehistogram" => MetricType::Histogram,
                "summary" => MetricType::Summary,
                _ => MetricType::Untyped,
            };
            if is_metric_name(name) && out.types.len() < max {
                out.types.insert(name.to_string(), t);
            }
        }
    } else if let Some(r) = rest.strip_prefix("HELP") {
        let r = r.trim_start();
        let (name, text) = match r.find(char::is_whitespace) {
            Some(i) => (&r[..i], r[i..].trim_start()),
            None => (r, ""),
        };
        if is_metric_name(name) && out.help.len() < max {
            out.help.insert(name.to_string(), text.to_string());
        }
    }
}

fn is_name_start(c: char, colon: bool) -> bool {
    c.is_ascii_alphabetic() || c == '_' || (colon && c == ':')
}

fn is_name_char(c: char, colon: bool) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || (colon && c == ':')
}

fn is_metric_name(s: &str) -> bool {
    let mut ch = s.chars();
    match ch.next() {
        Some(c) if is_name_start(c, true) => ch.all(|c| is_name_char(c, true)),
        _ => false,
    }
}

/// Length of the metric name at the start of `line` (0: none).
fn metric_name_end(line: &str) -> usize {
    line.char_indices()
        .find(|&(i, c)| {
            if i == 0 {
                !is_name_start(c, true)
            } else {
                !is_name_char(c, true)
            }
        })
        .map(|(i, _)| i)
        .unwrap_or(line.len())
}

/// One sample line: `name{labels} value [timestamp]`.
fn parse_sample(line: &str) -> Option<Series> {
    let name_end = metric_name_end(line);
    if name_end == 0 {
        return None;
    }
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(r) = rest.trim_start().strip_prefix('{') {
        let (l, after) = parse_labels(r)?;
        labels = l;
        rest = after;
    }
    // A value must be separated from the name/labels by whitespace (or follow `}`).
    let rest_trim = rest.trim_start();
    if rest_trim.len() == rest.len() && !line[..line.len() - rest.len()].ends_with('}') {
        return None;
    }
    let mut fields = rest_trim.split_whitespace();
    let value = parse_value(fields.next()?)?;
    if let Some(ts) = fields.next() {
        // Timestamps are integers (ms); OpenMetrics allows floats: accept either, ignore it.
        ts.parse::<f64>().ok()?;
    }
    if fields.next().is_some() {
        return None;
    }
    Some(Series {
        name: name.to_string(),
        labels,
        value,
    })
}

/// Parses label pairs after `{` up to and including `}`; returns the rest after `}`.
fn parse_labels(s: &str) -> Option<(BTreeMap<String, String>, &str)> {
    let mut labels = BTreeMap::new();
    let mut rest = s;
    loop {
        rest = rest.trim_start();
        if let Some(r) = rest.strip_prefix('}') {
            return Some((labels, r));
        }
        let name_end = rest
            .char_indices()
            .find(|&(i, c)| {
                if i == 0 {
                    !is_name_start(c, false)
                } else {
                    !is_name_char(c, false)
                }
            })
            .map(|(i, _)| i)
            .unwrap_or(rest.len());
        if name_end == 0 {
            return None;
        }
        let lname = &rest[..name_end];
        rest = rest[name_end..].trim_start().strip_prefix('=')?;
        rest = rest.trim_start().strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let close = loop {
            let (i, c) = chars.next()?;
            match c {
                '"' => break i,
                '\\' => match chars.next()? {
                    (_, 'n') => value.push('\n'),
                    (_, '"') => value.push('"'),
                    (_, '\\') => value.push('\\'),
                    (_, other) => {
                        value.push('\\');
                        value.push(other);
                    }
                },
                c => value.push(c),
            }
        };
        labels.insert(lname.to_string(), value);
        rest = rest[close + 1..].trim_start();
        if let Some(r) = rest.strip_prefix(',') {
            rest = r;
        } else if !rest.starts_with('}') {
            return None;
        }
    }
}

fn parse_value(s: &str) -> Option<f64> {
    match s {
        "NaN" | "nan" => Some(f64::NAN),
        "+Inf" | "Inf" | "+inf" | "inf" => Some(f64::INFINITY),
        "-Inf" | "-inf" => Some(f64::NEG_INFINITY),
        _ => {
            // Only plain numbers: other spellings Rust accepts count as garbage.
            if s.bytes()
                .any(|b| b.is_ascii_alphabetic() && b != b'e' && b != b'E')
            {
                return None;
            }
            s.parse::<f64>().ok()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REAL: &str = r#"# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="decode",model_name="M",tp_rank="0"} 3.0
sglang_num_queue_reqs{model_name="M"} 2
# TYPE vllm:request_success counter
vllm:request_success_total{finished_reason="stop",model_name="m"} 7.0
vllm:request_success_created{finished_reason="stop",model_name="m"} 1.7e9
untyped_thing 1 1700000000000
weird{path="a\"b\\c\nd"} NaN
inf_gauge +Inf
neg_inf -Inf
smg_http_connections_active 0
this is not a metric line
bad_value{x="1"} abc
"#;

    #[test]
    fn parses_real_shapes() {
        let e = parse(REAL);
        assert_eq!(e.bad_lines, 2, "{e:?}");
        assert_eq!(e.series.len(), 9);
        assert_eq!(e.series[0].name, "sglang:num_running_reqs");
        assert_eq!(e.series[0].labels["engine_type"], "decode");
        assert_eq!(e.series[0].value, 3.0);
        assert_eq!(e.series[1].name, "sglang_num_queue_reqs");
        assert_eq!(e.series[3].name, "vllm:request_success_created");
        assert_eq!(e.series[5].labels["path"], "a\"b\\c\nd");
        assert!(e.series[5].value.is_nan());
        assert_eq!(e.series[6].value, f64::INFINITY);
        assert_eq!(e.series[7].value, f64::NEG_INFINITY);
        assert_eq!(e.types["sglang:num_running_reqs"], MetricType::Gauge);
        assert_eq!(e.types["vllm:request_success"], MetricType::Counter);
        assert_eq!(
            e.help["sglang:num_running_reqs"],
            "The number of running requests."
        );
    }

    #[test]
    fn rejects_half_lines() {
        for l in [
            "x{a=\"1\"",
            "x{a=1} 2",
            "x{=\"1\"} 2",
            "x 1 2 3",
            "x",
            "{a=\"b\"} 1",
            "1x 2",
        ] {
            assert_eq!(parse(l).bad_lines, 1, "{l}");
        }
        assert_eq!(parse("x{a=\"1\",} 2").series.len(), 1);
        assert_eq!(parse("x{} 2").series.len(), 1);
    }

    /// The cut falls on unwanted series; a wanted one at the end is kept.
    #[test]
    fn wanted_series_survive_a_cut_on_unwanted_ones() {
        let mut body = String::new();
        for i in 0..100_000 {
            body.push_str(&format!("# TYPE junk_{i} gauge\njunk_{i}{{i=\"{i}\"}} 1\n"));
        }
        body.push_str("sglang:num_running_reqs{tp_rank=\"0\"} 7\n");
        let limits = ParseLimits {
            max_series: 1000,
            raw_sample: 10,
            max_label_bytes: 64,
        };
        let e = parse_limited(body.as_bytes(), false, &limits, &|n| {
            n.starts_with("sglang:")
        });
        assert_eq!(e.series.len(), 11);
        assert_eq!(e.series[10].name, "sglang:num_running_reqs");
        assert_eq!(e.cut.seen, 100_001);
        assert_eq!(e.cut.unsampled, 99_990);
        assert!(e.cut.is_cut(&limits));
        assert!(e.types.len() <= 1000);
        assert!(e.cut.describe(&limits, 11).contains("100001 series seen"));
    }

    #[test]
    fn wanted_series_are_bounded_too() {
        let body: String = (0..50).map(|i| format!("w{{i=\"{i}\"}} 1\n")).collect();
        let limits = ParseLimits {
            max_series: 20,
            ..ParseLimits::default()
        };
        let e = parse_limited(body.as_bytes(), false, &limits, &|_| true);
        assert_eq!(e.series.len(), 20);
        assert_eq!(e.cut.over_series_limit, 30);
        assert!(e.cut.describe(&limits, 20).contains("30 wanted"));
    }

    #[test]
    fn label_bytes_are_bounded() {
        let long = "v".repeat(5000);
        let body = format!("a{{x=\"{long}\"}} 1\nb{{x=\"short\"}} 2\n");
        let e = parse_limited(body.as_bytes(), false, &ParseLimits::default(), &|_| true);
        assert_eq!(e.series.len(), 1);
        assert_eq!(e.series[0].name, "b");
        assert_eq!(e.cut.over_label_bytes, 1);
        assert!(e.cut.is_cut(&ParseLimits::default()));
        assert!(e
            .cut
            .describe(&ParseLimits::default(), 1)
            .contains("4096-byte label limit"));
    }

    #[test]
    fn truncated_body_drops_partial_line() {
        let e = parse_bytes(b"a 1\nb 2\nc 3", true);
        assert_eq!(e.series.len(), 2);
        assert_eq!(e.bad_lines, 0);
    }
}
