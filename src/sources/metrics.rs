//! Prometheus metrics, router `/workers` and engine `/v1/loads`.
//!
//! Each component with a `metrics_url` is scraped concurrently, each GET under its own
//! connect/total timeouts and body cap ([`crate::http`]), so a hung or oversized endpoint is
//! marked (`Timeout`/`TooLarge`) without delaying the others. The exposition is parsed by
//! [`crate::prom`] and reduced to logical values (`running`, `queued`, ...) by the metric maps
//! of `probes/*.toml`. Counters (logical names ending in `_total`) become per-second rates
//! between two scrapes with [`rates`].
//!
//! Any local process can pose as an engine, so a scrape is bounded twice: the body by the
//! HTTP cap, the series by [`ParseLimits`] (only the series the maps or the correlator read
//! are kept, plus a small raw sample; see [`crate::prom`]). Parsing runs on the blocking pool,
//! never on the runtime's workers, and a cut turns the probe into `TooLarge` with the cut in
//! its detail, hence in the source status. A component discovery refused to scrape (its
//! address is not one of its own listening sockets) is named in the status with the reason.

use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::http::{self, Limits};
use crate::model::{
    Component, EndpointProbe, FetchOutcome, MetricsScrape, Payload, Role, Sample, Series,
    SourceKind, SourceStatus, Topology,
};
use crate::prom::{self, Exposition, ParseLimits};
use crate::sources::router_key::{self, KeySources, Lookup};
use crate::sources::{BoxFuture, Source};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

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

/// One logical value for one stack and a set of roles (`[[metric_map]]` in `probes/*.toml`):
///
/// ```toml
/// [[metric_map]]
/// stack = "sglang"                 # component stack, or "*" for any
/// roles = ["engine", "prefill", "decode"]
/// name = "running"                 # logical name; counters must end in `_total`
/// kind = "gauge"                   # or "counter" (turned into `<name>_rate` per second)
/// series = ["sglang:num_running_reqs", "sglang_num_running_reqs"]  # alternatives, first present wins
/// labels = { engine_type = "decode" }   # optional: only series with these label values
/// by_label = "worker"              # optional: also `name{worker="<value>"}` per label value
/// aggregate = "sum"                # optional: "sum" (default) or "max" over matching series
/// exclude_labels = { path = "^/workers$" }   # optional: leave out series whose label matches
/// replica_labels = ["tp_rank"]     # optional: series differing only in these are one value
/// ```
///
/// `exclude_labels` (regexes over the label's value; a series without the label is kept) is
/// for series that count something we do ourselves (the router counts wedgewatch's own
/// `GET /workers`) or that repeat a total as a breakdown (SGLang's per-priority queues).
/// `replica_labels` is for the same quantity reported by several ranks (SGLang's
/// `--enable-metrics-for-all-schedulers`: every TP rank reports the batch it shares): the
/// series that differ only in those labels are one value (their max), and the groups left
/// are combined with `aggregate` (DP-attention ranks, which hold different batches, keep
/// their own `dp_rank` and are summed).
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
                    crate::config_check::one_line(&e.to_string())
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
        .filter_map(|(label, re)| Some((label.as_str(), regex::Regex::new(re).ok()?)))
        .collect()
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

// ---------------------------------------------------------------------------------------
// `--url` targets: what the exposition says it is

/// Name prefixes that say which exporter wrote an exposition: routers first (their
/// expositions never carry engine names; an engine's never carry `smg_`).
const EXPORTERS: [(&str, &str, Role); 6] = [
    ("smg_", "sglang", Role::Router),
    ("sgl_router_", "sglang", Role::Router),
    ("vllm_router_", "vllm", Role::Router),
    ("sglang:", "sglang", Role::Engine),
    ("vllm:", "vllm", Role::Engine),
    // the `sglang:` names as the router's /engine_metrics and some pipelines rewrite them
    ("sglang_", "sglang", Role::Engine),
];

/// What an exposition's own names say its exporter is: (stack, role, evidence). For a
/// `--url` target no process explains. An SGLang engine's `engine_type` label refines the
/// role to prefill or decode.
pub fn infer_exporter(series: &[Series]) -> Option<(&'static str, Role, String)> {
    for (prefix, stack, role) in EXPORTERS {
        let Some(s) = series.iter().find(|s| s.name.starts_with(prefix)) else {
            continue;
        };
        let mode = s.labels.get("engine_type").map(String::as_str);
        let role = match (role, mode) {
            (Role::Engine, Some("prefill")) => Role::Prefill,
            (Role::Engine, Some("decode")) => Role::Decode,
            _ => role,
        };
        let why = match mode {
            Some(m) if role != Role::Router => {
                format!("metric names {prefix}* (engine_type={m})")
            }
            _ => format!("metric names {prefix}*"),
        };
        return Some((stack, role, why));
    }
    None
}

/// Whether a component is a `--url` target (no process behind it).
pub fn is_url_target(c: &Component) -> bool {
    c.labels
        .get(crate::model::topology::labels::LABEL_FOUND_BY)
        .is_some_and(|f| f.starts_with("--url"))
}

/// Label: what a `--url` target's stack and role were inferred from.
pub const LABEL_INFERRED_FROM: &str = "inferred_from";

/// Discovery's look at a `--url` target that no process explains: GET its metrics (bounded:
/// `timeout`, 1 MiB, 64 series) and, when the names say whose exposition it is, give it that
/// stack and role (and the id `role@address`). Only for an address given as an IP literal or
/// `localhost`: a host name would make discovery wait on DNS. Without an answer the target
/// stays `other`, and the metrics source still maps it by what each scrape says.
pub fn infer_url_component(c: &mut Component, timeout: std::time::Duration) {
    if c.role != Role::Other || !is_url_target(c) {
        return;
    }
    let Some(url) = c.metrics_url.clone() else {
        return;
    };
    let literal = crate::sys::Url::parse(&url).is_ok_and(|u| match u.host() {
        Some(url::Host::Domain(d)) => d == "localhost",
        Some(url::Host::Ipv4(_) | url::Host::Ipv6(_)) => true,
        None => false,
    });
    if !literal {
        return;
    }
    let limits = Limits {
        connect: timeout,
        total: timeout,
        cap: 1 << 20,
    };
    let r = http::get_blocking(&url, limits);
    if r.body.is_empty() || r.status.is_some_and(|s| s != 200) {
        return;
    }
    let parse = ParseLimits {
        max_series: 64,
        raw_sample: 0,
        ..ParseLimits::default()
    };
    let known = |n: &str| EXPORTERS.iter().any(|(p, _, _)| n.starts_with(p));
    let e = prom::parse_limited(&r.body, r.outcome != FetchOutcome::Ok, &parse, &known);
    let Some((stack, role, why)) = infer_exporter(&e.series) else {
        return;
    };
    c.stack = stack.to_string();
    c.role = role;
    if let Some(addr) = c.listen.first() {
        c.id = format!("{role}@{addr}");
    }
    c.labels.insert(LABEL_INFERRED_FROM.into(), why);
}

// ---------------------------------------------------------------------------------------
// the source

/// Options of the metrics source.
#[derive(Debug, Clone, Copy)]
pub struct MetricsConfig {
    /// Per-GET limits (defaults: connect 300 ms, total 1500 ms, cap 8 MiB).
    pub limits: Limits,
    /// Also GET the router's `/workers` and SGLang engines' `/v1/loads`.
    pub extras: bool,
    /// Series kept per scrape (default 20,000), raw sample, label bytes per series.
    pub parse: ParseLimits,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            limits: Limits::default(),
            extras: true,
            parse: ParseLimits::default(),
        }
    }
}

/// Series the correlator reads by name rather than through a map (per-worker and per-endpoint
/// breakdowns); kept like mapped series.
const READ_RAW_SUFFIXES: [&str; 3] = [
    "http_requests_active",
    "worker_requests_active",
    "router_running_requests",
];

/// The series names a component's scrape keeps in full (besides [`READ_RAW_SUFFIXES`]): what
/// its maps read, sorted and deduplicated for [`is_wanted`].
pub fn wanted_names(maps: &[MetricMap], stack: &str, role: Role) -> Vec<String> {
    let mut names: Vec<String> = maps
        .iter()
        .filter(|m| m.applies_to(stack, role))
        .flat_map(|m| m.series.iter().cloned())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Every series name any map reads (sorted, deduplicated), for a scrape whose exporter is
/// not known beforehand.
pub fn all_wanted_names(maps: &[MetricMap]) -> Vec<String> {
    let mut names: Vec<String> = maps.iter().flat_map(|m| m.series.iter().cloned()).collect();
    names.sort();
    names.dedup();
    names
}

/// Whether a series is kept in full. Runs once per line of a possibly hostile exposition
/// (millions), hence the binary search over [`wanted_names`].
pub fn is_wanted(wanted: &[String], name: &str) -> bool {
    wanted.binary_search_by(|w| w.as_str().cmp(name)).is_ok()
        || READ_RAW_SUFFIXES.iter().any(|s| name.ends_with(s))
}

/// Parses a body under `limits`, on the blocking pool: a hostile 8 MiB exposition takes
/// CPU time that must not stall the runtime's workers (other sources, the daemon's socket).
pub async fn parse_off_runtime(
    body: Vec<u8>,
    truncated: bool,
    limits: ParseLimits,
    wanted: Vec<String>,
) -> Result<Exposition> {
    tokio::task::spawn_blocking(move || {
        prom::parse_limited(&body, truncated, &limits, &|n| is_wanted(&wanted, n))
    })
    .await
    .map_err(|e| Error::Other(format!("parse task failed: {e}")))
}

/// Scrapes every component's metrics endpoint (and `/workers`, `/v1/loads`) concurrently.
#[derive(Debug, Clone)]
pub struct MetricsSource {
    maps: Vec<MetricMap>,
    cfg: MetricsConfig,
    keys: Arc<KeySources>,
}

impl MetricsSource {
    /// `maps`: usually `ProbeSet::metric_maps`. Fails on an invalid map.
    pub fn new(maps: Vec<MetricMap>, cfg: MetricsConfig) -> Result<Self> {
        validate_maps(&maps)?;
        Ok(MetricsSource {
            maps,
            cfg,
            keys: Arc::new(KeySources {
                proc: crate::sys::ProcFs::real(),
                env_name: None,
            }),
        })
    }

    /// Where a router's API key is looked for (its arguments and environment under this
    /// procfs root, and `--router-key-env NAME`): see [`router_key`].
    pub fn with_router_keys(mut self, keys: KeySources) -> Self {
        self.keys = Arc::new(keys);
        self
    }

    /// Scrapes one component (metrics + extras concurrently).
    pub async fn scrape_component(&self, c: &Component) -> MetricsScrape {
        scrape_one(c.clone(), self.maps.clone(), self.cfg, self.keys.clone()).await
    }
}

/// Start of the detail of a router endpoint that answered 401/403 when we had no key for it:
/// that endpoint alone is unreadable, the source is not degraded for it ([`status_of`]).
pub const NEEDS_KEY: &str = "needs the router's API key";

/// The extra JSON endpoints of a component: (key in `extra`, URL).
pub fn extra_endpoints(c: &Component) -> Vec<(String, String)> {
    let Some(base) = c.http_url.as_deref() else {
        return Vec::new();
    };
    let base = base.trim_end_matches('/');
    if c.role == Role::Router {
        vec![("workers".into(), format!("{base}/workers"))]
    } else if c.role.is_engine() && c.stack == "sglang" {
        vec![(
            "v1_loads".into(),
            format!("{base}/v1/loads?include=core,disagg,queues"),
        )]
    } else {
        Vec::new()
    }
}

fn probe_of(url: &str, r: &http::Response) -> EndpointProbe {
    EndpointProbe {
        url: url.to_string(),
        outcome: r.outcome.clone(),
        http_status: r.status,
        elapsed_ms: r.elapsed.as_millis() as u64,
        body_bytes: r.body.len() as u64,
        detail: r.detail.clone(),
    }
}

/// netns (issue 11 item 5): a component in another network namespace (a container) is
/// scraped in there, through the namespace discovery saw its main process in; its URL's
/// address means something only in there (see [`crate::sys::netns`]).
fn netns_of(c: &Component) -> Option<crate::sys::netns::Netns> {
    Some(crate::sys::netns::Netns {
        pid: c.main_pid?,
        inode: c.netns?,
    })
}

/// Body cap of the JSON endpoints: real `/workers` and `/v1/loads` answers are kilobytes, and
/// a JSON tree costs many times its text, so a poser's 8 MiB answer is never parsed.
const EXTRA_CAP: usize = 1 << 20;

async fn scrape_one(
    c: Component,
    maps: Vec<MetricMap>,
    cfg: MetricsConfig,
    keys: Arc<KeySources>,
) -> MetricsScrape {
    let metrics_fut = async {
        match c.metrics_url.as_deref() {
            Some(u) => Some((
                u.to_string(),
                http::get_routed(u, cfg.limits, crate::sys::netns::route(netns_of(&c)), None).await,
            )),
            None => None,
        }
    };
    let (metrics, extras) = tokio::join!(metrics_fut, get_extras(&c, cfg, keys));
    let mut scrape = MetricsScrape {
        component: c.id.clone(),
        metrics: None,
        series: Vec::new(),
        bad_lines: 0,
        mapped: BTreeMap::new(),
        extra: BTreeMap::new(),
        extra_probes: Vec::new(),
    };
    if let Some((url, r)) = metrics {
        read_metrics(&mut scrape, &c, &maps, cfg.parse, &url, r).await;
    }
    for (key, url, r) in extras {
        read_extra(&mut scrape, key, &url, r).await;
    }
    scrape
}

/// GETs the component's JSON endpoints concurrently: (key, url, response), in their order.
/// A router's endpoints are asked with its own API key when it has one ([`router_key`]).
async fn get_extras(
    c: &Component,
    cfg: MetricsConfig,
    keys: Arc<KeySources>,
) -> Vec<(String, String, http::Response)> {
    if !cfg.extras {
        return Vec::new();
    }
    let endpoints = extra_endpoints(c);
    if endpoints.is_empty() {
        return Vec::new();
    }
    let limits = Limits {
        cap: cfg.limits.cap.min(EXTRA_CAP),
        ..cfg.limits
    };
    let key = if c.role == Role::Router {
        Some(Arc::new(lookup_key(c, keys).await))
    } else {
        None
    };
    let mut set = tokio::task::JoinSet::new();
    let netns = netns_of(c);
    for (i, (name, url)) in endpoints.into_iter().enumerate() {
        let key = key.clone();
        set.spawn(async move {
            let route = crate::sys::netns::route(netns);
            let r = match key.as_deref() {
                Some(Lookup::Found(k, _)) => {
                    let auth = k.bearer();
                    http::get_routed(&url, limits, route, Some(&auth)).await
                }
                _ => http::get_routed(&url, limits, route, None).await,
            };
            (i, name, url, explain_auth(r, key.as_deref()))
        });
    }
    let mut got = Vec::new();
    while let Some(r) = set.join_next().await {
        if let Ok(r) = r {
            got.push(r);
        }
    }
    got.sort_by_key(|r| r.0);
    got.into_iter().map(|(_, k, u, r)| (k, u, r)).collect()
}

/// The router's key, read from `/proc` off the runtime's workers (the reads may block; they
/// are bounded by [`crate::deadline`]).
async fn lookup_key(c: &Component, keys: Arc<KeySources>) -> Lookup {
    let c = c.clone();
    let own_env = |name: &str| std::env::var(name).ok();
    tokio::task::spawn_blocking(move || router_key::lookup(&c, &keys, &own_env))
        .await
        .unwrap_or_else(|e| Lookup::None(format!("key look-up failed: {e}")))
}

/// A 401/403 from a router says why: no key found (where we looked), or its own key refused.
fn explain_auth(mut r: http::Response, key: Option<&Lookup>) -> http::Response {
    let denied = r.outcome == FetchOutcome::HttpError && matches!(r.status, Some(401 | 403));
    match (denied, key) {
        (true, Some(Lookup::None(why))) => {
            r.detail = Some(format!(
                "{NEEDS_KEY} (HTTP {}; {why})",
                r.status.unwrap_or_default()
            ));
        }
        (true, Some(Lookup::Found(_, from))) => {
            r.detail = Some(format!(
                "the router refused its API key (HTTP {}; key from {from})",
                r.status.unwrap_or_default()
            ));
        }
        _ => {}
    }
    r
}

/// Parses whatever arrived (a truncated body still carries the first series) and maps it.
async fn read_metrics(
    scrape: &mut MetricsScrape,
    c: &Component,
    maps: &[MetricMap],
    limits: ParseLimits,
    url: &str,
    r: http::Response,
) {
    let mut probe = probe_of(url, &r);
    let parsable = matches!(r.outcome, FetchOutcome::Ok | FetchOutcome::TooLarge)
        || (r.outcome == FetchOutcome::Timeout && !r.body.is_empty());
    if parsable {
        let truncated = r.outcome != FetchOutcome::Ok;
        // A `--url` target discovery could not place may be any exporter: keep what any map
        // reads, and map by what the exposition says it is.
        let unplaced = c.role == Role::Other && is_url_target(c);
        let wanted = if unplaced {
            all_wanted_names(maps)
        } else {
            wanted_names(maps, &c.stack, c.role)
        };
        match parse_off_runtime(r.body, truncated, limits, wanted).await {
            Ok(e) => {
                note_cut(&mut probe, &e, &limits);
                scrape.bad_lines = e.bad_lines;
                let (stack, role) = match infer_exporter(&e.series).filter(|_| unplaced) {
                    Some((stack, role, _)) => (stack.to_string(), role),
                    None => (c.stack.clone(), c.role),
                };
                scrape.mapped = apply_maps(maps, &stack, role, &e.series);
                scrape.series = e.series;
            }
            Err(e) => {
                probe.outcome = FetchOutcome::Error;
                probe.detail = Some(e.to_string());
            }
        }
    }
    scrape.metrics = Some(probe);
}

/// Reads a JSON endpoint's answer, on the blocking pool like the expositions.
async fn read_extra(scrape: &mut MetricsScrape, key: String, url: &str, r: http::Response) {
    let mut probe = probe_of(url, &r);
    if r.outcome == FetchOutcome::Ok {
        let body = r.body;
        let parsed =
            tokio::task::spawn_blocking(move || serde_json::from_slice::<serde_json::Value>(&body))
                .await;
        match parsed {
            Ok(Ok(v)) => {
                scrape.extra.insert(key, v);
            }
            Ok(Err(e)) => {
                probe.outcome = FetchOutcome::Error;
                probe.detail = Some(format!("not JSON: {e}"));
            }
            Err(e) => {
                probe.outcome = FetchOutcome::Error;
                probe.detail = Some(format!("parse task failed: {e}"));
            }
        }
    }
    scrape.extra_probes.push(probe);
}

/// A cut exposition is `TooLarge` (parsed in part, as with a body over the cap), and the
/// cut is said in the detail.
fn note_cut(probe: &mut EndpointProbe, e: &Exposition, limits: &ParseLimits) {
    if !e.cut.is_cut(limits) {
        return;
    }
    let said = e.cut.describe(limits, e.series.len());
    if probe.outcome == FetchOutcome::Ok {
        probe.outcome = FetchOutcome::TooLarge;
    }
    probe.detail = Some(match probe.detail.take() {
        Some(d) => format!("{d}; {said}"),
        None => said,
    });
}

/// The status a set of scrapes deserves: degraded naming each endpoint that failed. A 404 on
/// an extra endpoint is "not present in this version", not a failure.
pub fn status_of(scrapes: &[MetricsScrape]) -> SourceStatus {
    let mut problems = Vec::new();
    for s in scrapes {
        if let Some(p) = &s.metrics {
            if p.outcome != FetchOutcome::Ok {
                problems.push(describe(&s.component, p));
            }
        }
        for p in &s.extra_probes {
            let absent = p.outcome == FetchOutcome::HttpError && p.http_status == Some(404);
            // Said on the endpoint itself; the rest of the source is fine.
            let needs_key = p.outcome == FetchOutcome::HttpError
                && p.detail
                    .as_deref()
                    .is_some_and(|d| d.starts_with(NEEDS_KEY));
            if p.outcome != FetchOutcome::Ok && !absent && !needs_key {
                problems.push(describe(&s.component, p));
            }
        }
    }
    if problems.is_empty() {
        SourceStatus::ok()
    } else {
        SourceStatus::degraded(problems.join("; "))
    }
}

/// Components discovery would not scrape, with why (`metrics_unscraped` label).
fn unscraped(topo: &Topology) -> Option<String> {
    let all: Vec<String> = topo
        .components
        .iter()
        .filter_map(|c| {
            let why = c
                .labels
                .get(crate::model::topology::labels::LABEL_METRICS_UNSCRAPED)?;
            Some(format!("{}: {why}", c.id))
        })
        .collect();
    (!all.is_empty()).then(|| all.join("; "))
}

fn describe(component: &str, p: &EndpointProbe) -> String {
    let outcome = match p.outcome {
        FetchOutcome::Ok => "ok",
        FetchOutcome::Timeout => "timeout",
        FetchOutcome::Refused => "refused",
        FetchOutcome::TooLarge => "too large",
        FetchOutcome::HttpError => "http error",
        FetchOutcome::Error => "error",
    };
    match &p.detail {
        Some(d) => format!(
            "{component}: {} {outcome} after {} ms ({d})",
            p.url, p.elapsed_ms
        ),
        None => format!("{component}: {} {outcome} after {} ms", p.url, p.elapsed_ms),
    }
}

impl Source for MetricsSource {
    fn kind(&self) -> SourceKind {
        SourceKind::Metrics
    }

    fn sample<'a>(&'a self, topo: &'a Topology, clock: &'a dyn Clock) -> BoxFuture<'a, Sample> {
        Box::pin(async move {
            let t_ms = clock.now_ms();
            let start = Instant::now();
            let targets: Vec<Component> = topo
                .components
                .iter()
                .filter(|c| {
                    c.metrics_url.is_some() || (self.cfg.extras && !extra_endpoints(c).is_empty())
                })
                .cloned()
                .collect();
            let refused = unscraped(topo);
            if targets.is_empty() {
                let why = match refused {
                    Some(r) => format!("no component has a scrapable endpoint ({r})"),
                    None => "no component has a metrics endpoint or an HTTP API".into(),
                };
                return Sample {
                    t_ms,
                    status: SourceStatus::unavailable(why),
                    took_ms: start.elapsed().as_millis() as u64,
                    payload: Payload::Metrics(Vec::new()),
                };
            }
            let mut set = tokio::task::JoinSet::new();
            for (i, c) in targets.into_iter().enumerate() {
                let maps = self.maps.clone();
                let cfg = self.cfg;
                let keys = self.keys.clone();
                set.spawn(async move { (i, scrape_one(c, maps, cfg, keys).await) });
            }
            let mut scrapes = Vec::new();
            let mut failed = Vec::new();
            while let Some(r) = set.join_next().await {
                match r {
                    Ok(s) => scrapes.push(s),
                    Err(e) => failed.push(format!("scrape task failed: {e}")),
                }
            }
            scrapes.sort_by_key(|s| s.0);
            let scrapes: Vec<MetricsScrape> = scrapes.into_iter().map(|s| s.1).collect();
            let mut status = status_of(&scrapes);
            if !failed.is_empty() {
                status = status.worst(SourceStatus::degraded(failed.join("; ")));
            }
            if let Some(r) = refused {
                status = status.worst(SourceStatus::degraded(r));
            }
            Sample {
                t_ms,
                status,
                took_ms: start.elapsed().as_millis() as u64,
                payload: Payload::Metrics(scrapes),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
