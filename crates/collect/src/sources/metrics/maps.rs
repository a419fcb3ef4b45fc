//! Metric maps (`[[metric_map]]` in `probes/*.toml`): the series of an exposition reduced to
//! logical values (`running`, `queued`, ...), and counters (logical names ending in `_total`)
//! turned into per-second rates between two scrapes ([`rates`]).

use crate::error::{Error, Result};
use crate::model::{MetricsScrape, Role, Series};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Mutex;

/// Whether a logical value is a level or a monotonically growing count.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ValueKind {
    Gauge,
    Counter,
}

/// How several matching series are combined.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Aggregate {
    #[default]
    Sum,
    Max,
}

/// One logical value for one stack and a set of roles (`[[metric_map]]` in `probes/*.toml`; its
/// keys and their uses in docs/probes.md): the first present of `series`, filtered by `labels`
/// and `exclude_labels`, series differing only in `replica_labels` taken once (their max: ranks
/// reporting one shared batch), the rest combined by `aggregate`; a counter (named `*_total`)
/// also becomes `<name>_rate`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MetricMap {
    pub stack: String,
    pub roles: Vec<String>,
    pub name: String,
    pub kind: ValueKind,
    pub series: Vec<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub by_label: Option<String>,
    #[serde(default)]
    pub aggregate: Aggregate,
    #[serde(default)]
    pub exclude_labels: BTreeMap<String, String>,
    #[serde(default)]
    pub replica_labels: Vec<String>,
}

impl MetricMap {
    /// Checks what serde cannot: known roles, the counter naming rule, non-empty series.
    pub fn validate(&self) -> std::result::Result<(), String> {
        if self.roles.is_empty() {
            return Err(format!("metric_map {}: roles is empty", self.name));
        }
        for r in &self.roles {
            if Role::parse(r).is_none() {
                return Err(format!("metric_map {}: unknown role {r:?}", self.name));
            }
        }
        if self.series.is_empty() {
            return Err(format!("metric_map {}: series is empty", self.name));
        }
        if self.name.is_empty() || self.name.contains(['{', '}', '"']) {
            return Err(format!("metric_map {:?}: bad logical name", self.name));
        }
        for (label, re) in &self.exclude_labels {
            regex::Regex::new(re).map_err(|e| {
                format!(
                    "metric_map {}: exclude_labels.{label}: bad regex {re:?}: {}",
                    self.name,
                    crate::config::one_line(&e.to_string())
                )
            })?;
        }
        let counter_name = self.name.ends_with("_total");
        match (self.kind, counter_name) {
            (ValueKind::Counter, false) => Err(format!(
                "metric_map {}: a counter's logical name must end in _total",
                self.name
            )),
            (ValueKind::Gauge, true) => Err(format!(
                "metric_map {}: a gauge's logical name must not end in _total",
                self.name
            )),
            _ => Ok(()),
        }
    }

    /// Whether this map applies to a component.
    pub fn applies_to(&self, stack: &str, role: Role) -> bool {
        (self.stack == "*" || self.stack == stack) && self.roles.iter().any(|r| r == role.as_str())
    }
}

/// Checks a list of maps (e.g. `ProbeSet::metric_maps`), naming the first bad one.
pub fn validate_maps(maps: &[MetricMap]) -> Result<()> {
    for m in maps {
        m.validate().map_err(|message| Error::Probe {
            path: Path::new("probes").to_path_buf(),
            message,
        })?;
    }
    Ok(())
}

/// The mapped key of a per-label value: `name{label="value"}`.
pub fn labelled_key(name: &str, label: &str, value: &str) -> String {
    format!("{name}{{{label}=\"{value}\"}}")
}

/// Applies the maps that fit `(stack, role)` to parsed series.
pub fn apply_maps(
    maps: &[MetricMap],
    stack: &str,
    role: Role,
    series: &[Series],
) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for m in maps.iter().filter(|m| m.applies_to(stack, role)) {
        let excludes = exclude_regexes(m);
        let keep = |s: &Series| labels_match(m, s) && !excluded(&excludes, s);
        let Some(name) = m
            .series
            .iter()
            .find(|n| series.iter().any(|s| &s.name == *n && keep(s)))
        else {
            continue;
        };
        let chosen: Vec<&Series> = series
            .iter()
            .filter(|s| &s.name == name && keep(s) && !s.value.is_nan())
            .collect();
        if chosen.is_empty() {
            continue;
        }
        out.insert(m.name.clone(), reduce(m, &chosen));
        if let Some(label) = &m.by_label {
            let mut groups: BTreeMap<&str, Vec<&Series>> = BTreeMap::new();
            for s in &chosen {
                if let Some(v) = s.labels.get(label) {
                    groups.entry(v.as_str()).or_default().push(s);
                }
            }
            for (v, group) in groups {
                out.insert(labelled_key(&m.name, label, v), reduce(m, &group));
            }
        }
    }
    out
}

/// The map's `exclude_labels`, compiled ([`MetricMap::validate`] has checked them; one that
/// still fails to compile excludes nothing rather than everything).
fn exclude_regexes(m: &MetricMap) -> Vec<(&str, regex::Regex)> {
    m.exclude_labels
        .iter()
        .filter_map(|(label, re)| Some((label.as_str(), compiled(re)?)))
        .collect()
}

/// Most exclude patterns kept compiled (the probe files hold a few dozen).
const MAX_COMPILED: usize = 1024;

/// Exclude patterns compiled, by source: maps are applied at every scrape of every endpoint.
static COMPILED: std::sync::LazyLock<Mutex<HashMap<String, Option<regex::Regex>>>> =
    std::sync::LazyLock::new(Mutex::default);

/// `re` compiled once per process (while [`MAX_COMPILED`] holds; beyond, every time).
fn compiled(re: &str) -> Option<regex::Regex> {
    let mut memo = COMPILED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(r) = memo.get(re) {
        return r.clone();
    }
    let r = regex::Regex::new(re).ok();
    if memo.len() < MAX_COMPILED {
        memo.insert(re.to_string(), r.clone());
    }
    r
}

fn excluded(excludes: &[(&str, regex::Regex)], s: &Series) -> bool {
    excludes
        .iter()
        .any(|(label, re)| s.labels.get(*label).is_some_and(|v| re.is_match(v)))
}

/// One value from the chosen series: replicas (series equal but for `replica_labels`) count
/// once, as their max, then the groups are combined with the map's aggregate.
fn reduce(m: &MetricMap, chosen: &[&Series]) -> f64 {
    if m.replica_labels.is_empty() {
        return combine(m.aggregate, chosen.iter().map(|s| s.value));
    }
    let mut groups: BTreeMap<Vec<(&str, &str)>, f64> = BTreeMap::new();
    for s in chosen {
        let key: Vec<(&str, &str)> = s
            .labels
            .iter()
            .filter(|(k, _)| !m.replica_labels.contains(k))
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let slot = groups.entry(key).or_insert(f64::NEG_INFINITY);
        *slot = slot.max(s.value);
    }
    combine(m.aggregate, groups.into_values())
}

fn labels_match(m: &MetricMap, s: &Series) -> bool {
    m.labels.iter().all(|(k, v)| s.labels.get(k) == Some(v))
}

fn combine(agg: Aggregate, vals: impl Iterator<Item = f64>) -> f64 {
    match agg {
        Aggregate::Sum => vals.sum(),
        Aggregate::Max => vals.fold(f64::NEG_INFINITY, f64::max),
    }
}

/// Whether a mapped key is a counter: its logical name (before any `{label=..}`) ends in
/// `_total` (enforced by [`MetricMap::validate`]).
pub fn is_counter_key(key: &str) -> bool {
    key.split('{').next().is_some_and(|n| n.ends_with("_total"))
}

/// Per-second rates of the counters between two scrapes of the same component:
/// `<key>_rate` (for `name{l="v"}` keys: `name_rate{l="v"}`). A counter that went down was
/// reset (process restart): the rate counts from zero, as Prometheus does. Empty when
/// `dt_ms <= 0` or when either scrape failed to produce the value.
pub fn rates(prev: &MetricsScrape, cur: &MetricsScrape, dt_ms: i64) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    if dt_ms <= 0 {
        return out;
    }
    let dt_s = dt_ms as f64 / 1000.0;
    for (k, &v) in &cur.mapped {
        if !is_counter_key(k) || !v.is_finite() {
            continue;
        }
        let Some(&p) = prev.mapped.get(k) else {
            continue;
        };
        if !p.is_finite() {
            continue;
        }
        let delta = if v >= p { v - p } else { v };
        out.insert(rate_key(k), delta / dt_s);
    }
    out
}

fn rate_key(k: &str) -> String {
    match k.split_once('{') {
        Some((n, rest)) => format!("{n}_rate{{{rest}"),
        None => format!("{k}_rate"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exclude_patterns_are_compiled_once() {
        let re = "^/compiled-once-[0-9]+$";
        assert!(!COMPILED.lock().unwrap().contains_key(re));
        let first = compiled(re).expect("compiles");
        assert!(first.is_match("/compiled-once-42"));
        assert!(COMPILED.lock().unwrap().contains_key(re), "kept");
        assert_eq!(
            compiled(re).map(|r| r.as_str().to_string()),
            Some(re.into())
        );
        assert!(
            compiled("(unclosed").is_none(),
            "a bad one excludes nothing"
        );
    }

    fn map(name: &str, kind: ValueKind, series: &[&str]) -> MetricMap {
        MetricMap {
            stack: "sglang".into(),
            roles: vec!["decode".into()],
            name: name.into(),
            kind,
            series: series.iter().map(|s| s.to_string()).collect(),
            labels: BTreeMap::new(),
            by_label: None,
            aggregate: Aggregate::Sum,
            exclude_labels: BTreeMap::new(),
            replica_labels: Vec::new(),
        }
    }

    fn ser(name: &str, labels: &[(&str, &str)], value: f64) -> Series {
        Series {
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            value,
        }
    }

    #[test]
    fn builtin_maps_load_and_validate() {
        let set = crate::probes::ProbeSet::builtin().unwrap();
        validate_maps(&set.metric_maps).unwrap();
        let names: Vec<&str> = set.metric_maps.iter().map(|m| m.name.as_str()).collect();
        for n in [
            "running",
            "queued",
            "http_active",
            "worker_in_flight",
            "forward_seconds_total",
        ] {
            assert!(names.contains(&n), "{n} missing");
        }
        let s = vec![
            ser("sglang_num_prefill_prealloc_queue_reqs", &[], 4.0),
            ser("sglang:num_running_reqs", &[("tp_rank", "0")], 1.0),
        ];
        let out = apply_maps(&set.metric_maps, "sglang", Role::Prefill, &s);
        assert_eq!(out["prefill_bootstrap_queue"], 4.0);
        assert_eq!(out["running"], 1.0);
        let v = vec![ser("vllm:num_requests_waiting", &[("engine", "0")], 2.0)];
        assert_eq!(
            apply_maps(&set.metric_maps, "vllm", Role::Engine, &v)["queued"],
            2.0
        );
    }

    #[test]
    fn validation_enforces_counter_naming() {
        assert!(map("running", ValueKind::Gauge, &["x"]).validate().is_ok());
        assert!(map("running", ValueKind::Counter, &["x"])
            .validate()
            .is_err());
        assert!(map("a_total", ValueKind::Gauge, &["x"]).validate().is_err());
        let mut m = map("a_total", ValueKind::Counter, &["x"]);
        assert!(m.validate().is_ok());
        m.roles = vec!["chef".into()];
        assert!(m.validate().is_err());
    }

    #[test]
    fn first_present_alternative_wins_and_by_label_splits() {
        let mut m = map(
            "worker_in_flight",
            ValueKind::Gauge,
            &["smg_worker_requests_active", "sgl_router_running_requests"],
        );
        m.by_label = Some("worker".into());
        let s = vec![
            ser("sgl_router_running_requests", &[("worker", "a")], 9.0),
            ser("smg_worker_requests_active", &[("worker", "a")], 2.0),
            ser("smg_worker_requests_active", &[("worker", "b")], 3.0),
        ];
        let out = apply_maps(&[m], "sglang", Role::Decode, &s);
        assert_eq!(out["worker_in_flight"], 5.0);
        assert_eq!(out[&labelled_key("worker_in_flight", "worker", "a")], 2.0);
        assert_eq!(out[&labelled_key("worker_in_flight", "worker", "b")], 3.0);
        assert!(apply_maps(&[], "sglang", Role::Decode, &s).is_empty());
    }

    #[test]
    fn excludes_and_replicas() {
        let mut m = map("queued", ValueKind::Gauge, &["q"]);
        m.exclude_labels.insert("priority".into(), ".+".into());
        m.replica_labels = vec!["tp_rank".into()];
        m.by_label = Some("dp_rank".into());
        let s = vec![
            ser(
                "q",
                &[("tp_rank", "0"), ("dp_rank", "0"), ("priority", "")],
                3.0,
            ),
            ser(
                "q",
                &[("tp_rank", "1"), ("dp_rank", "0"), ("priority", "")],
                3.0,
            ),
            ser(
                "q",
                &[("tp_rank", "0"), ("dp_rank", "0"), ("priority", "5")],
                3.0,
            ),
            ser(
                "q",
                &[("tp_rank", "2"), ("dp_rank", "1"), ("priority", "")],
                2.0,
            ),
        ];
        let out = apply_maps(&[m.clone()], "sglang", Role::Decode, &s);
        assert_eq!(out["queued"], 5.0, "{out:?}");
        assert_eq!(out[&labelled_key("queued", "dp_rank", "0")], 3.0);
        assert_eq!(out[&labelled_key("queued", "dp_rank", "1")], 2.0);
        m.exclude_labels.insert("path".into(), "(".into());
        let err = m.validate().expect_err("bad regex");
        assert!(err.contains("exclude_labels.path"), "{err}");
    }

    #[test]
    fn rates_handle_resets_and_gauges() {
        let mk = |pairs: &[(&str, f64)]| MetricsScrape {
            component: "c".into(),
            metrics: None,
            series: vec![],
            bad_lines: 0,
            mapped: pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            extra: BTreeMap::new(),
            extra_probes: vec![],
        };
        let a = mk(&[
            ("forward_seconds_total", 10.0),
            ("running", 3.0),
            ("requests_total{worker=\"w\"}", 100.0),
        ]);
        let b = mk(&[
            ("forward_seconds_total", 11.0),
            ("running", 4.0),
            ("requests_total{worker=\"w\"}", 5.0),
        ]);
        let r = rates(&a, &b, 2000);
        assert_eq!(r["forward_seconds_total_rate"], 0.5);
        assert_eq!(r["requests_total_rate{worker=\"w\"}"], 2.5);
        assert!(!r.contains_key("running_rate"));
        assert!(rates(&a, &b, 0).is_empty());
    }
}
