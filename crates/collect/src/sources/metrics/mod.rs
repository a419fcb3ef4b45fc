//! Prometheus metrics, router `/workers` and engine `/v1/loads` (the metric maps and counter
//! rates are in `maps.rs`, what a `--url` target is in `url_target.rs`).
//!
//! Every component with a `metrics_url` is scraped concurrently, each GET under its own
//! timeouts and body cap ([`crate::sys::http`]), so a hung or oversized endpoint is marked
//! without delaying the others. The exposition is parsed by [`crate::prom`] on the blocking
//! pool and reduced to logical values by the metric maps; counters become rates between two
//! scrapes ([`rates`]). Any local process can pose as an engine, so the series are bounded too
//! ([`ParseLimits`]): a cut turns the probe into `TooLarge`, said in the source status, as is a
//! component discovery refused to scrape (an address not among its own listening sockets).

use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::model::{
    Component, EndpointProbe, FetchOutcome, MetricsScrape, Payload, Role, Sample, SourceKind,
    SourceStatus, Topology,
};
use crate::prom::{self, Exposition, ParseLimits};
use crate::sources::router_key::{self, KeySources, Lookup};
use crate::sources::{BoxFuture, Source};
use crate::sys::http::{self, Limits};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

mod maps;
mod url_target;

pub use maps::{
    apply_maps, is_counter_key, labelled_key, rates, validate_maps, Aggregate, MetricMap, ValueKind,
};
pub use url_target::{infer_exporter, infer_url_component, is_url_target, LABEL_INFERRED_FROM};

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

/// netns: a component in another network namespace (a container) is
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
