//! A lenient Prometheus text-format parser.
//!
//! Our own because the published crates drop `sglang:`/`vllm:` names (colons) or reject a
//! whole real exposition over one `_created` line (see the reference notes). Rules:
//! - metric names `[a-zA-Z_:][a-zA-Z0-9_:]*`; label names `[a-zA-Z_][a-zA-Z0-9_]*`;
//! - label values with `\"`, `\\`, `\n` escapes (unknown escapes kept literally);
//! - values: floats, `NaN`, `+Inf`, `-Inf`, `Inf`; an optional integer timestamp after;
//! - `# HELP` / `# TYPE` lines recorded; other comments and blank lines ignored;
//! - untyped samples and `_created`/`_bucket`/`_sum`/`_count` series kept as plain series;
//! - anything else is skipped and counted in `bad_lines`. Never panics, never fails.

use crate::model::Series;
use std::collections::BTreeMap;

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
    /// Lines that were neither a sample, a comment nor blank.
    pub bad_lines: u32,
    /// `# TYPE name kind`, by family name.
    pub types: BTreeMap<String, MetricType>,
    /// `# HELP name text`, by family name.
    pub help: BTreeMap<String, String>,
}

/// Parses a whole exposition. Invalid UTF-8 is replaced, never rejected.
pub fn parse(text: &str) -> Exposition {
    let mut out = Exposition::default();
    for raw in text.lines() {
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix('#') {
            parse_comment(rest, &mut out);
            continue;
        }
        match parse_sample(line) {
            Some(s) => out.series.push(s),
            None => out.bad_lines = out.bad_lines.saturating_add(1),
        }
    }
    out
}

/// Parses bytes (a possibly truncated body): a partial last line is dropped, not counted.
pub fn parse_bytes(body: &[u8], truncated: bool) -> Exposition {
    let text = String::from_utf8_lossy(body);
    if truncated {
        match text.rfind('\n') {
            Some(i) => parse(&text[..i]),
            None => Exposition::default(),
        }
    } else {
        parse(&text)
    }
}

fn parse_comment(rest: &str, out: &mut Exposition) {
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
            if is_metric_name(name) {
                out.types.insert(name.to_string(), t);
            }
        }
    } else if let Some(r) = rest.strip_prefix("HELP") {
        let r = r.trim_start();
        let (name, text) = match r.find(char::is_whitespace) {
            Some(i) => (&r[..i], r[i..].trim_start()),
            None => (r, ""),
        };
        if is_metric_name(name) {
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

/// One sample line: `name{labels} value [timestamp]`.
fn parse_sample(line: &str) -> Option<Series> {
    let name_end = line
        .char_indices()
        .find(|&(i, c)| {
            if i == 0 {
                !is_name_start(c, true)
            } else {
                !is_name_char(c, true)
            }
        })
        .map(|(i, _)| i)
        .unwrap_or(line.len());
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
            // Rust's parser accepts "infinity"/"nan" spellings we already handled; reject
            // anything that is not a plain number so garbage is counted.
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

    #[test]
    fn truncated_body_drops_partial_line() {
        let e = parse_bytes(b"a 1\nb 2\nc 3", true);
        assert_eq!(e.series.len(), 2);
        assert_eq!(e.bad_lines, 0);
    }
}
