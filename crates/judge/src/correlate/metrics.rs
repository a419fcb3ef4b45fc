//! Metrics scrapes -> compact per-component points (mapped gauges and counters, `/v1/loads`,
//! the router's per-worker in-flight counts), counter rates and endpoint probe outcomes.

use super::Correlator;
use crate::clock::Millis;
use crate::model::{Component, EndpointProbe, FetchOutcome, MetricsScrape, Role};
use std::collections::BTreeMap;

/// Logical metric names for queues outside SGLang's `num_queue_reqs` (PD queues, and the
/// grammar queue of requests waiting for their grammar to compile), summed into one figure.
pub const PD_QUEUE_KEYS: [&str; 7] = [
    "prefill_bootstrap_queue",
    "prefill_inflight_queue",
    "decode_prealloc_queue",
    "decode_transfer_queue",
    "decode_retracted_queue",
    "decode_host_receive_queue",
    "grammar_queue",
];

/// A compact metrics observation of one component (raw series are kept only for the latest
/// scrape, to bound memory).
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsPoint {
    pub t_ms: Millis,
    pub mapped: BTreeMap<String, f64>,
    pub probe: Option<EndpointProbe>,
    pub extra_probes: Vec<EndpointProbe>,
    pub loads: Option<LoadsSummary>,
    /// Router only: in-flight requests per worker URL.
    pub worker_active: BTreeMap<String, f64>,
    /// In-flight HTTP requests on inference endpoints only, from the raw
    /// `sglang:http_requests_active{endpoint}` series (our own `/metrics` scrape and health
    /// or load probes excluded). None when the series is absent.
    pub http_active_inference: Option<f64>,
}

/// `/v1/loads` summed over DP ranks.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LoadsSummary {
    pub running: f64,
    pub waiting: f64,
    pub pd_queued: f64,
    /// Of those, prefill's bootstrap queue: requests waiting for their decode side to connect.
    pub pd_bootstrap: f64,
    /// Of those, prefill's inflight queue: forward done, KV transfer under way.
    pub pd_inflight: f64,
    /// Of those, decode's prealloc and transfer queues: requests waiting for their KV.
    pub pd_decode_held: f64,
    /// Newest `timestamp` (epoch seconds) of the load snapshots, when present.
    pub timestamp_s: Option<f64>,
}

impl Correlator {
    pub(super) fn ingest_metrics(&mut self, t: Millis, scrapes: &[MetricsScrape]) {
        for s in scrapes {
            let mut worker_active = BTreeMap::new();
            for ser in &s.series {
                if ser.name.ends_with("worker_requests_active")
                    || ser.name.ends_with("router_running_requests")
                {
                    if let Some(w) = ser.labels.get("worker") {
                        *worker_active.entry(w.clone()).or_insert(0.0) += ser.value;
                    }
                }
            }
            let loads = s.extra.get("v1_loads").and_then(summarize_loads);
            let mut http_active_inference: Option<f64> = None;
            for ser in &s.series {
                if ser.name.ends_with("http_requests_active") {
                    let ep = ser.labels.get("endpoint").map(String::as_str).unwrap_or("");
                    if !is_probe_endpoint(ep) {
                        http_active_inference =
                            Some(http_active_inference.unwrap_or(0.0) + ser.value);
                    }
                }
            }
            let p = MetricsPoint {
                t_ms: t,
                mapped: s.mapped.clone(),
                probe: s.metrics.clone(),
                extra_probes: s.extra_probes.clone(),
                loads,
                worker_active,
                http_active_inference,
            };
            self.metrics
                .entry(s.component.clone())
                .or_default()
                .push_back(p);
            self.latest_scrapes.insert(s.component.clone(), s.clone());
        }
    }

    /// Rate per second of a mapped counter over the rate window ending at `now`.
    pub fn rate(&self, component: &str, key: &str, now: Millis) -> Option<f64> {
        let q = self.metrics.get(component)?;
        let from = now - self.thresholds.correlate.rate_window_ms;
        let pts: Vec<(Millis, f64)> = q
            .iter()
            .filter(|p| p.t_ms >= from && p.t_ms <= now)
            .filter_map(|p| p.mapped.get(key).map(|v| (p.t_ms, *v)))
            .collect();
        let (t0, v0) = *pts.first()?;
        let (t1, v1) = *pts.last()?;
        if t1 <= t0 || v1 < v0 {
            return None; // one point, or a counter reset (restart)
        }
        Some((v1 - v0) / ((t1 - t0) as f64 / 1000.0))
    }

    pub(super) fn latest_metrics(&self, component: &str, now: Millis) -> Option<&MetricsPoint> {
        self.metrics
            .get(component)?
            .iter()
            .rev()
            .find(|p| p.t_ms <= now && now - p.t_ms <= self.thresholds.correlate.stale_after_ms)
    }

    /// The router's in-flight count for a component, by the component's URL.
    pub(super) fn router_active_for(&self, c: &Component, now: Millis) -> Option<f64> {
        let url = c.http_url.as_deref()?.trim_end_matches('/');
        let mut found = None;
        for r in self
            .topology
            .components
            .iter()
            .filter(|r| r.role == Role::Router)
        {
            if let Some(p) = self.latest_metrics(&r.id, now) {
                for (w, v) in &p.worker_active {
                    if w.trim_end_matches('/') == url {
                        found = Some(found.unwrap_or(0.0) + v);
                    }
                }
            }
        }
        found
    }

    /// Failed endpoint probes of a component within the window (newest last).
    pub fn endpoint_probes(&self, component: &str, now: Millis) -> Vec<(Millis, EndpointProbe)> {
        let from = now - self.window_ms;
        self.metrics
            .get(component)
            .map(|q| {
                q.iter()
                    .filter(|p| p.t_ms >= from && p.t_ms <= now)
                    .flat_map(|p| {
                        p.probe
                            .iter()
                            .chain(p.extra_probes.iter())
                            .map(move |e| (p.t_ms, e.clone()))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Sums `/v1/loads` JSON (a list of per-DP snapshots, or an object holding them) into
/// running / waiting / PD-queued counts. Unknown shapes give None.
pub fn summarize_loads(v: &serde_json::Value) -> Option<LoadsSummary> {
    fn walk(v: &serde_json::Value, s: &mut LoadsSummary, found: &mut bool) {
        match v {
            serde_json::Value::Array(a) => a.iter().for_each(|x| walk(x, s, found)),
            serde_json::Value::Object(o) => {
                if let Some(r) = o.get("num_running_reqs").and_then(|x| x.as_f64()) {
                    *found = true;
                    s.running += r;
                    s.waiting += o
                        .get("num_waiting_reqs")
                        .and_then(|x| x.as_f64())
                        .unwrap_or(0.0);
                    if let Some(ts) = o.get("timestamp").and_then(|x| x.as_f64()) {
                        s.timestamp_s = Some(s.timestamp_s.map_or(ts, |t: f64| t.max(ts)));
                    }
                }
                if let Some(d) = o.get("disaggregation").and_then(|x| x.as_object()) {
                    for k in [
                        "prefill_bootstrap_queue_reqs",
                        "prefill_inflight_queue_reqs",
                        "decode_prealloc_queue_reqs",
                        "decode_transfer_queue_reqs",
                        "decode_retracted_queue_reqs",
                    ] {
                        s.pd_queued += d.get(k).and_then(|x| x.as_f64()).unwrap_or(0.0);
                    }
                    let n = |k: &str| d.get(k).and_then(|x| x.as_f64()).unwrap_or(0.0);
                    s.pd_bootstrap += n("prefill_bootstrap_queue_reqs");
                    s.pd_inflight += n("prefill_inflight_queue_reqs");
                    s.pd_decode_held +=
                        n("decode_prealloc_queue_reqs") + n("decode_transfer_queue_reqs");
                }
                for (k, x) in o {
                    if k != "disaggregation" && (x.is_array() || x.is_object()) {
                        walk(x, s, found);
                    }
                }
            }
            _ => {}
        }
    }
    let mut s = LoadsSummary::default();
    let mut found = false;
    walk(v, &mut s, &mut found);
    found.then_some(s)
}

/// Endpoints that are probes (ours or a health checker's), not inference requests.
pub fn is_probe_endpoint(ep: &str) -> bool {
    let ep = ep.trim_end_matches('/');
    ep.ends_with("/metrics")
        || ep.contains("health")
        || ep.contains("load")
        || ep.ends_with("/workers")
        || ep.contains("server_info")
        || ep.ends_with("/v1/models")
        || ep == "/metrics"
}

/// Whether a fetch outcome means the endpoint did not answer properly. A 4xx answer is an
/// answer (an old build without `/v1/loads` says 404 promptly): only 5xx counts.
pub fn probe_failed(p: &EndpointProbe) -> bool {
    match p.outcome {
        FetchOutcome::Ok | FetchOutcome::TooLarge => false,
        FetchOutcome::HttpError => !p.http_status.is_some_and(|s| (400..500).contains(&s)),
        FetchOutcome::Timeout | FetchOutcome::Refused | FetchOutcome::Error => true,
    }
}
