//! Detectors: small pure functions over the correlated model, each producing findings with
//! a one-line summary, the component/role to blame, the requests concerned and evidence.
//!
//! Every threshold is named in [`Thresholds`] (serde, so it can be loaded from TOML/JSON;
//! documented in `docs/findings.md`).

use crate::clock::Millis;
use crate::correlate::{probe_failed, ComponentState, Model, RequestView, View};
use crate::model::{Evidence, Finding, RequestState, Role, Severity};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Named, configurable thresholds (milliseconds unless the name says otherwise).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Thresholds {
    /// `wedged_request`: no response byte for this long after the request arrived.
    pub wedged_after_ms: i64,
    /// `wedged_request` on a busy engine: fire anyway when at least this many requests that
    /// arrived later at the same component were answered meanwhile (it was skipped).
    pub wedged_overtaken_min: usize,
    /// `stalled_stream` / request state `stalled`: no response bytes for this long after
    /// the response started, while the component says the request is still open.
    pub stall_after_ms: i64,
    /// A started response that moved no byte for this long is no longer "streaming"; it
    /// is `done` unless something says it is still open.
    pub done_quiet_ms: i64,
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
    /// `process_restarted`: report restarts this recent.
    pub restart_recent_ms: i64,
    /// `endpoint_unresponsive`: this many consecutive failed probes of one URL ...
    pub endpoint_failures: usize,
    /// ... or a probe that took at least this long.
    pub endpoint_slow_ms: u64,
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

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            wedged_after_ms: 30_000,
            wedged_overtaken_min: 5,
            stall_after_ms: 30_000,
            done_quiet_ms: 2_000,
            busy_after_ms: 20_000,
            queue_after_ms: 30_000,
            scheduler_min_dumps: 3,
            accumulate_window_ms: 300_000,
            accumulate_min_connections: 50,
            accumulate_min_close_wait: 10,
            accumulate_min_fds: 100,
            accumulate_min_threads: 20,
            restart_recent_ms: 600_000,
            endpoint_failures: 2,
            endpoint_slow_ms: 5_000,
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

impl Thresholds {
    /// Loads thresholds from TOML; missing keys keep their defaults, unknown keys and values
    /// out of range are an error naming the key (see [`Thresholds::validate`]).
    pub fn from_toml(text: &str) -> crate::Result<Thresholds> {
        let bad = |m: String| crate::Error::Other(m);
        let t: Thresholds =
            toml::from_str(text).map_err(|e| bad(crate::config_check::toml_message(text, &e)))?;
        t.validate().map_err(|e| bad(e.to_string()))?;
        Ok(t)
    }
}

/// A detector: a pure function over the model and its view at one instant.
pub type Detector = fn(&Model, &View) -> Vec<Finding>;

/// Every detector, by the finding kind it produces.
pub const DETECTORS: &[(&str, Detector)] = &[
    ("wedged_request", wedged_request),
    ("stalled_stream", stalled_stream),
    ("busy_without_progress", busy_without_progress),
    ("queue_not_draining", queue_not_draining),
    ("scheduler_stuck", scheduler_stuck),
    ("accumulating_state", accumulating_state),
    ("process_restarted", process_restarted),
    ("endpoint_unresponsive", endpoint_unresponsive),
    ("config_changed", config_changed_detector),
];

/// Runs every detector; findings sorted most severe first, then by kind order above.
pub fn run_all(model: &Model, view: &View) -> Vec<Finding> {
    let mut out = Vec::new();
    for (i, (_, d)) in DETECTORS.iter().enumerate() {
        for f in d(model, view) {
            out.push((i, f));
        }
    }
    out.sort_by(|a, b| b.1.severity.cmp(&a.1.severity).then(a.0.cmp(&b.0)));
    fold_into_parents(model, out.into_iter().map(|(_, f)| f).collect())
}

/// Kinds whose findings on child processes (scheduler, detokenizer) only repeat their
/// engine's: children inherit the engine's environment and restart with it.
const FOLDED_KINDS: &[&str] = &["config_changed", "process_restarted"];

/// Drops a child's finding when its parent has one of the same kind, and names the child
/// in the parent's summary instead: one restart of an engine is one finding, not three.
fn fold_into_parents(model: &Model, findings: Vec<Finding>) -> Vec<Finding> {
    let parent_of = |id: &str| {
        model
            .topology()
            .component(id)
            .and_then(|c| c.parent.clone())
    };
    let has = |kind: &str, comp: &str| {
        findings
            .iter()
            .any(|f| f.kind == kind && f.component.as_deref() == Some(comp))
    };
    let mut folded: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    let mut kept = Vec::new();
    for f in &findings {
        let parent = f.component.as_deref().and_then(parent_of);
        match parent {
            Some(p) if FOLDED_KINDS.contains(&f.kind.as_str()) && has(&f.kind, &p) => {
                let child = f.component.clone().unwrap_or_default();
                folded.entry((f.kind.clone(), p)).or_default().push(child);
            }
            _ => kept.push(f.clone()),
        }
    }
    for f in &mut kept {
        let key = (f.kind.clone(), f.component.clone().unwrap_or_default());
        if let Some(children) = folded.get(&key) {
            let names: Vec<&str> = children
                .iter()
                .map(|c| c.split('@').next().unwrap_or(c))
                .collect();
            f.summary
                .push_str(&format!(" (and its {})", names.join(", ")));
            for c in children {
                f.evidence
                    .push(Evidence::new("topology", format!("same on child {c}")));
            }
        }
    }
    kept
}

/// "94 s", "2.5 s", "12 min".
pub fn secs(ms: i64) -> String {
    let s = ms as f64 / 1000.0;
    if s >= 600.0 {
        format!("{:.0} min", s / 60.0)
    } else if s >= 10.0 {
        format!("{s:.0} s")
    } else {
        format!("{s:.1} s")
    }
}

fn outstanding_child<'a>(v: &'a View, r: &RequestView) -> Option<&'a RequestView> {
    r.x.links
        .iter()
        .filter_map(|l| v.request(l))
        .find(|c| View::is_outstanding(c))
}

/// The chain of exchanges from the first hop down to `r`: "proxy x3 -> router x7 -> decode x12".
fn chain<'a>(v: &'a View, r: &'a RequestView) -> Vec<&'a RequestView> {
    let mut out = vec![r];
    let mut cur = r;
    for _ in 0..16 {
        match cur.x.parent.as_deref().and_then(|p| v.request(p)) {
            Some(p) => {
                out.push(p);
                cur = p;
            }
            None => break,
        }
    }
    out.reverse();
    out
}

fn chain_text(chain: &[&RequestView]) -> String {
    chain
        .iter()
        .map(|r| {
            let conf =
                r.x.parent_confidence
                    .map(|c| format!(" (link {c:.2})"))
                    .unwrap_or_default();
            format!("{} {}{}", r.x.component, r.x.id, conf)
        })
        .collect::<Vec<_>>()
        .join(" -> ")
}

/// Is some request at a component whose client is `comp` still open? Then an unlinked
/// request at `comp` probably did reach the next hop and the link was missed.
fn downstream_open(v: &View, comp: &str) -> bool {
    v.requests
        .iter()
        .any(|r| r.x.client_component.as_deref() == Some(comp) && View::is_outstanding(r))
}

fn downstream_stalled(v: &View, comp: &str) -> bool {
    v.requests
        .iter()
        .any(|r| r.x.client_component.as_deref() == Some(comp) && r.state == RequestState::Stalled)
}

/// `idle, idle, idle, polling` -> `idle x3, polling`.
fn run_lengths(states: &[String]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < states.len() {
        let mut j = i;
        while j < states.len() && states[j] == states[i] {
            j += 1;
        }
        out.push(if j - i > 1 {
            format!("{} x{}", states[i], j - i)
        } else {
            states[i].clone()
        });
        i = j;
    }
    out.join(", ")
}

/// Idle-side evidence of an engine: what says it is doing nothing.
fn idle_evidence(cs: &ComponentState) -> (Vec<String>, Vec<Evidence>) {
    let mut words = Vec::new();
    let mut ev = Vec::new();
    ev.push(Evidence::new(
        "gpu",
        format!("GPU activity: {}", cs.gpu_activity),
    ));
    if cs.gpu_activity != "unknown" {
        words.push(format!("GPU {}", cs.gpu_activity));
    }
    if let Some(r) = cs.forward_rate {
        ev.push(Evidence::new(
            "metrics",
            format!("forward_seconds_total rate {r:.3} s/s"),
        ));
        if r <= 0.01 {
            words.push("no forward passes".to_string());
        }
    }
    if let Some(s) = cs.thread_summary() {
        let detail: Vec<String> = cs
            .threads
            .iter()
            // Threads no rule recognised (HTTP loops, helpers) say nothing about the work.
            .filter(|t| t.states.iter().any(|s| s != "unknown"))
            .map(|t| {
                format!(
                    "pid {} tid {} ({}): {}",
                    t.pid,
                    t.tid,
                    t.name.as_deref().unwrap_or("?"),
                    run_lengths(&t.states)
                )
            })
            .collect();
        ev.push(Evidence::new("stacks", detail.join("; ")));
        words.push(s);
    }
    if let Some((n, src)) = cs.running {
        let frozen = if src == "metrics" {
            " (gauge; may be frozen during a stall)"
        } else {
            ""
        };
        ev.push(Evidence::new(
            "metrics",
            format!("running {n} from {src}{frozen}"),
        ));
        words.push(format!("engine reports {n} running"));
    }
    if let Some((q, src)) = cs.queued {
        ev.push(Evidence::new("metrics", format!("queued {q} from {src}")));
    }
    if let Some(h) = cs.http_active {
        ev.push(Evidence::new("metrics", format!("http_active {h}")));
    }
    if let Some(a) = cs.router_active {
        ev.push(Evidence::new(
            "metrics",
            format!("router in-flight for this worker {a}"),
        ));
    }
    (words, ev)
}

fn ids_with_ancestors(v: &View, leaves: &[&RequestView]) -> Vec<String> {
    let mut set = BTreeSet::new();
    let mut out = Vec::new();
    for l in leaves {
        for r in chain(v, l) {
            if set.insert(r.x.id.clone()) {
                out.push(r.x.id.clone());
            }
        }
    }
    out
}

fn group_by_component(leaves: Vec<&RequestView>) -> BTreeMap<String, Vec<&RequestView>> {
    let mut m: BTreeMap<String, Vec<&RequestView>> = BTreeMap::new();
    for l in leaves {
        m.entry(l.x.component.clone()).or_default().push(l);
    }
    m
}

fn role_of(m: &Model, comp: &str) -> Option<Role> {
    m.topology().component(comp).map(|c| c.role)
}

/// `wedged_request`: accepted, no response byte for >= `wedged_after_ms`, and the deepest
/// hop holding it does no work. Names the deepest hop.
/// After a request arrives, counters may still move for this long from batches already
/// under way (and the metrics scrape lags by up to a second).
const WORK_SETTLE_MS: Millis = 2000;

/// Whether the engine's own work counters (`generation_tokens_total`,
/// `forward_seconds_total`) stayed flat between `since` and `now`: `None` without at least
/// two scrapes carrying one of them in that stretch.
fn counters_flat_since(m: &Model, comp: &str, since: Millis, now: Millis) -> Option<bool> {
    let hist = m.metrics_history(comp)?;
    let pts: Vec<_> = hist
        .iter()
        .filter(|p| p.t_ms >= since && p.t_ms <= now)
        .collect();
    let (first, last) = (pts.first()?, pts.last()?);
    if pts.len() < 2 || last.t_ms - first.t_ms < 1000 {
        return None;
    }
    let mut known = false;
    for (key, tolerance) in [
        ("generation_tokens_total", 0.0),
        ("forward_seconds_total", 0.01),
    ] {
        if let (Some(a), Some(b)) = (first.mapped.get(key), last.mapped.get(key)) {
            known = true;
            if b - a > tolerance {
                return Some(false);
            }
        }
    }
    known.then_some(true)
}

/// Smallest request (bytes) that counts as "a later request answered meanwhile" when the
/// waiting request's own size is unknown: health checks and scrapes are smaller than this.
const OVERTAKE_MIN_BYTES_IN: u64 = 256;

pub fn wedged_request(m: &Model, v: &View) -> Vec<Finding> {
    if !v.sockets_fresh {
        return Vec::new();
    }
    let th = &m.thresholds;
    let mut leaves: Vec<&RequestView> = v
        .requests
        .iter()
        .filter(|r| r.state == RequestState::WaitingFirstByte && r.age_ms >= th.wedged_after_ms)
        // A hung probe from outside the stack is endpoint_unresponsive's, not a forgotten
        // inference request.
        .filter(|r| !(r.x.client_component.is_none() && crate::correlate::is_probe_sized(&r.x)))
        .filter(|r| outstanding_child(v, r).is_none())
        .filter(|r| r.x.role.is_engine() || !downstream_open(v, &r.x.component))
        .collect();
    // PD: when both legs of one request wait, the prefill leg is the cause (the decode leg
    // needs its KV cache); the decode leg is reported with it, not on its own.
    let prefill_parents: BTreeSet<String> = leaves
        .iter()
        .filter(|r| r.x.role == Role::Prefill)
        .filter_map(|r| r.x.parent.clone())
        .collect();
    let mut consequences: Vec<&RequestView> = Vec::new();
    leaves.retain(|r| {
        let dependent = r.x.role == Role::Decode
            && r.x
                .parent
                .as_ref()
                .is_some_and(|p| prefill_parents.contains(p));
        if dependent {
            consequences.push(r);
        }
        !dependent
    });
    let mut out = Vec::new();
    for (comp, mut ls) in group_by_component(leaves) {
        let cs = v.components.get(&comp);
        if let Some(cs) = cs {
            // A spinning GPU is busy_without_progress's case, not a forgotten request.
            if cs.gpu_activity == "spinning" {
                continue;
            }
            // The engine counts its open inference requests and says none: a waiting
            // request from outside the stack (someone's hung probe of a non-inference
            // endpoint) is not a forgotten inference request.
            if cs.role.is_engine() && cs.http_active == Some(0.0) {
                ls.retain(|r| r.x.client_component.is_some());
                if ls.is_empty() {
                    continue;
                }
            }
        }
        // Requests that arrived later at the same component, from the same upstream hop, of
        // comparable size (so the upstream's health checks and metrics scrapes do not
        // count), and were answered meanwhile. (Whole history, not only the window: they
        // may have finished long ago.)
        let overtaken = |r: &RequestView| {
            let min_in = if r.x.bytes_in > 0 {
                r.x.bytes_in / 2
            } else {
                OVERTAKE_MIN_BYTES_IN
            };
            m.exchanges()
                .filter(|o| o.component == r.x.component && o.request_ms > r.x.request_ms + 1000)
                .filter(|o| o.client_component == r.x.client_component)
                .filter(|o| o.bytes_in >= min_in)
                .filter(|o| o.first_byte_ms.is_some())
                .count()
        };
        let mut skipped_note = None;
        if let Some(cs) = cs {
            // Busy engines are usually slow, not forgetful. Unless later requests were
            // served while these waited.
            let working = cs.working_evidence();
            // The rates behind "working" span `rate_window_ms`: tokens generated for other
            // requests just before these arrived are no work for these. An engine whose
            // counters have not moved since a request arrived (and whose GPU and scheduler
            // are not working now) did nothing for it.
            let working_now = cs.gpu_activity == "working"
                || working.iter().any(|w| w.contains("running a batch"));
            let idle_since: Vec<&RequestView> = if working_now {
                Vec::new()
            } else {
                ls.iter()
                    .copied()
                    .filter(|r| {
                        counters_flat_since(m, &comp, r.x.request_ms + WORK_SETTLE_MS, v.now)
                            == Some(true)
                    })
                    .collect()
            };
            if !working.is_empty() && !idle_since.is_empty() {
                ls = idle_since;
                skipped_note = Some(format!(
                    "no token generated and no forward time since they arrived (earlier: {})",
                    working.join(", ")
                ));
            } else if !working.is_empty() {
                ls.retain(|r| overtaken(r) >= th.wedged_overtaken_min);
                if ls.is_empty() {
                    continue;
                }
                let n = ls.iter().map(|r| overtaken(r)).min().unwrap_or(0);
                skipped_note = Some(format!(
                    "{n} later requests answered meanwhile although the engine is busy ({})",
                    working.join(", ")
                ));
            }
        }
        let oldest = ls.iter().map(|r| r.age_ms).max().unwrap_or(0);
        let youngest = ls.iter().map(|r| r.age_ms).min().unwrap_or(0);
        let n = ls.len();
        let role = role_of(m, &comp).unwrap_or(ls[0].x.role);
        let mut words = vec!["no response byte".to_string()];
        let mut evidence = Vec::new();
        for r in &ls {
            let ch = chain(v, r);
            evidence.push(Evidence::new(
                "sockets",
                format!(
                    "{} {} -> {}: {} bytes in, 0 out, waiting {}{}; path: {}",
                    r.x.id,
                    r.x.client,
                    r.x.server,
                    r.x.bytes_in,
                    secs(r.age_ms),
                    if r.x.seen_mid_flight {
                        " (age from tcp_info last_data_recv)"
                    } else {
                        ""
                    },
                    chain_text(&ch)
                ),
            ));
        }
        let mut has_idle_data = false;
        if let Some(note) = skipped_note {
            has_idle_data = true;
            words.push(note.clone());
            evidence.push(Evidence::new("sockets", note));
        } else if let Some(cs) = cs {
            let (w, ev) = idle_evidence(cs);
            has_idle_data = !w.is_empty();
            words.extend(w);
            evidence.extend(ev);
        }
        let deps: Vec<&RequestView> = consequences
            .iter()
            .copied()
            .filter(|d| {
                ls.iter()
                    .any(|l| l.x.parent.is_some() && l.x.parent == d.x.parent)
            })
            .collect();
        for d in &deps {
            evidence.push(Evidence::new(
                "sockets",
                format!(
                    "decode leg {} at {} waits too ({}): it needs the KV cache from this prefill",
                    d.x.id,
                    d.x.component,
                    secs(d.age_ms)
                ),
            ));
        }
        if !role.is_engine() {
            words.push("no request forwarded to the next hop".to_string());
        }
        let age = if oldest - youngest > 5_000 {
            format!("{}-{} ago", secs(youngest), secs(oldest))
        } else {
            format!("{} ago", secs(oldest))
        };
        let summary = format!(
            "{n} request{} accepted {age} {} stuck at {comp}: {}",
            if n == 1 { "" } else { "s" },
            if n == 1 { "is" } else { "are" },
            words.join(", ")
        );
        out.push(Finding {
            kind: "wedged_request".into(),
            severity: if has_idle_data || !role.is_engine() {
                Severity::Critical
            } else {
                Severity::Warning
            },
            component: Some(comp.clone()),
            role: Some(role),
            summary,
            requests: {
                let mut all = ls.clone();
                all.extend(deps.iter().copied());
                ids_with_ancestors(v, &all)
            },
            evidence,
            explanation: Some(format!(
                "The request reached {comp} ({role}) and nothing came back, while {comp} shows no work for it: it was accepted and forgotten there, not upstream (every hop above is only waiting for it). Look at {comp}: its scheduler stacks, its queues (/v1/loads), and what changed in its environment or command line (config_changed). Restarting proxies only hides it."
            )),
        });
    }
    out
}

/// `stalled_stream`: a response started, then stopped for >= `stall_after_ms` while the
/// component still has the request open and does no work.
pub fn stalled_stream(m: &Model, v: &View) -> Vec<Finding> {
    if !v.sockets_fresh {
        return Vec::new();
    }
    let leaves: Vec<&RequestView> = v
        .requests
        .iter()
        .filter(|r| r.state == RequestState::Stalled && outstanding_child(v, r).is_none())
        // A proxy/router stream that stopped while a request it sent downstream stopped
        // too is that request's consequence, even when the hop link was not made (e.g. a
        // keep-alive connection first seen mid-stream): blame the deepest stalled hop.
        .filter(|r| r.x.role.is_engine() || !downstream_stalled(v, &r.x.component))
        .collect();
    let mut out = Vec::new();
    for (comp, ls) in group_by_component(leaves) {
        let cs = v.components.get(&comp);
        if cs.is_some_and(|cs| !cs.working_evidence().is_empty() || cs.gpu_activity == "spinning") {
            continue;
        }
        let role = role_of(m, &comp).unwrap_or(ls[0].x.role);
        let quiet = ls.iter().map(|r| r.idle_out_ms).max().unwrap_or(0);
        let mut words = Vec::new();
        let mut evidence: Vec<Evidence> = ls
            .iter()
            .map(|r| {
                Evidence::new(
                    "sockets",
                    format!(
                        "{} {} -> {}: {} bytes out, then nothing for {}; path: {}",
                        r.x.id,
                        r.x.client,
                        r.x.server,
                        r.x.bytes_out,
                        secs(r.idle_out_ms),
                        chain_text(&chain(v, r))
                    ),
                )
            })
            .collect();
        if let Some(cs) = cs {
            let (w, ev) = idle_evidence(cs);
            words.extend(w);
            evidence.extend(ev);
        }
        let n = ls.len();
        out.push(Finding {
            kind: "stalled_stream".into(),
            severity: Severity::Critical,
            component: Some(comp.clone()),
            role: Some(role),
            summary: format!(
                "{n} response stream{} at {comp} stopped {} ago and {} still open{}{}",
                if n == 1 { "" } else { "s" },
                secs(quiet),
                if n == 1 { "is" } else { "are" },
                if words.is_empty() { "" } else { ": " },
                words.join(", ")
            ),
            requests: ids_with_ancestors(v, &ls),
            evidence,
            explanation: Some(format!(
                "{comp} began answering, then stopped sending while it still counts the request as in flight and is not working on it. Check its scheduler and detokenizer stacks; a stream that stops mid-way with an idle engine usually means the request was dropped from the running batch (retraction, abort lost, or an output path stuck)."
            )),
        });
    }
    out
}

/// `busy_without_progress`: the GPU is busy (or spinning in a collective) yet no response
/// bytes move at the component for >= `busy_after_ms`.
pub fn busy_without_progress(m: &Model, v: &View) -> Vec<Finding> {
    if !v.sockets_fresh {
        return Vec::new();
    }
    let th = &m.thresholds;
    let mut out = Vec::new();
    for cs in v.components.values().filter(|c| c.role.is_engine()) {
        let mine: Vec<&RequestView> = v
            .requests
            .iter()
            .filter(|r| r.x.component == cs.id)
            .collect();
        let open: Vec<&RequestView> = mine
            .iter()
            .copied()
            .filter(|r| View::is_outstanding(r) && r.age_ms >= th.busy_after_ms)
            .collect();
        if open.is_empty() {
            continue;
        }
        let last_out = mine.iter().filter_map(|r| r.x.last_out_ms).max();
        // Bytes moving are progress, unless the engine's own token counter is flat: then
        // they are answers to health checks and scrapes, not generated tokens.
        let tokens_flat = cs.gen_rate.is_some_and(|r| r <= 0.0);
        if !tokens_flat && last_out.is_some_and(|t| v.now - t < th.busy_after_ms) {
            continue; // bytes are moving: progress
        }
        let collective = cs.threads.iter().find(|t| {
            t.states.len() >= th.scheduler_min_dumps
                && t.states.iter().all(|s| s == "nccl_collective")
        });
        // Plain "GPU working" with no bytes out is also a long non-streaming generation;
        // count it only when the engine's own token counter says nothing is generated.
        let no_tokens = cs.gen_rate.is_some_and(|r| r <= 0.0);
        let busy = match (cs.gpu_activity, collective) {
            ("spinning", _) => {
                Some("GPU at high utilization but idle power (kernel spinning)".to_string())
            }
            (_, Some(t)) => Some(format!(
                "scheduler tid {} in an NCCL collective in {}/{} dumps",
                t.tid,
                t.states.len(),
                t.states.len()
            )),
            ("working", _) if no_tokens => Some("GPU working, 0 tokens generated".to_string()),
            _ if no_tokens => cs
                .forward_rate
                .filter(|r| *r > 0.01)
                .map(|r| format!("forward time rate {r:.2} s/s, 0 tokens generated")),
            _ => None,
        };
        let Some(busy) = busy else { continue };
        let quiet = last_out.map_or_else(
            || open.iter().map(|r| r.age_ms).max().unwrap_or(0),
            |t| v.now - t,
        );
        let mut evidence = vec![Evidence::new(
            "gpu",
            format!("GPU activity: {}", cs.gpu_activity),
        )];
        evidence.extend(open.iter().map(|r| {
            Evidence::new(
                "sockets",
                format!(
                    "{} {} -> {}: state {}, {} bytes out, age {}",
                    r.x.id,
                    r.x.client,
                    r.x.server,
                    r.state.as_str(),
                    r.x.bytes_out,
                    secs(r.age_ms)
                ),
            )
        }));
        if let Some(s) = cs.thread_summary() {
            evidence.push(Evidence::new("stacks", s));
        }
        out.push(Finding {
            kind: "busy_without_progress".into(),
            severity: Severity::Critical,
            component: Some(cs.id.clone()),
            role: Some(cs.role),
            summary: format!(
                "{} is busy ({busy}) but sent no response byte for {} with {} request(s) open",
                cs.id,
                secs(quiet),
                open.len()
            ),
            requests: open.iter().map(|r| r.x.id.clone()).collect(),
            evidence,
            explanation: Some("Work without output: a hung collective (NCCL/gloo: one rank missing) or a loop that never finishes a batch. Compare all TP ranks' stacks; NCCL RAS or power draw tells a spinning kernel from real compute.".into()),
        });
    }
    out
}

/// `queue_not_draining`: queue non-empty, nothing running, GPU idle, for >= `queue_after_ms`.
/// A `/v1/loads` snapshot older than this when scraped is frozen (SGLang republishes it
/// continuously while its loop cycles, stalls included).
const LOADS_FRESH_MS: f64 = 3000.0;

pub fn queue_not_draining(m: &Model, v: &View) -> Vec<Finding> {
    let th = &m.thresholds;
    let mut out = Vec::new();
    for cs in v.components.values().filter(|c| c.role.is_engine()) {
        if cs.gpu_activity == "working" || cs.forward_rate.is_some_and(|r| r > 0.01) {
            continue;
        }
        let Some(hist) = m.metrics_history(&cs.id) else {
            continue;
        };
        let since = v.now - th.queue_after_ms;
        // The last point at or before `since` starts the judged stretch.
        let Some(start) = hist.iter().rposition(|p| p.t_ms <= since) else {
            continue;
        };
        let pts: Vec<_> = hist
            .iter()
            .skip(start)
            .filter(|p| p.t_ms <= v.now)
            .collect();
        let judge = |p: &crate::correlate::MetricsPoint| -> Option<(f64, f64, &'static str)> {
            if let Some(l) = p.loads {
                // A load snapshot the engine stopped republishing says what was queued
                // when it was written, not now: no verdict from it (nor from the gauges,
                // which freeze the same way).
                let stale = l
                    .timestamp_s
                    .is_some_and(|ts| p.t_ms as f64 - ts * 1000.0 > LOADS_FRESH_MS);
                if stale {
                    return None;
                }
                return Some((l.waiting + l.pd_queued, l.running, "v1_loads"));
            }
            // The prefill inflight gauge is last written by the prefill batch report, the
            // moment that batch enters the inflight queue, and then freezes while the engine
            // idles: it reads non-zero on a healthy idle prefill engine. Only /v1/loads
            // (fresh) is trusted for that queue.
            let q: f64 = std::iter::once("queued")
                .chain(crate::correlate::PD_QUEUE_KEYS)
                .filter(|k| *k != "prefill_inflight_queue")
                .filter_map(|k| p.mapped.get(k))
                .sum();
            let r = p.mapped.get("running").copied()?;
            Some((q, r, "metrics"))
        };
        let judged: Vec<(Millis, f64, f64, &str)> = pts
            .iter()
            .filter_map(|p| judge(p).map(|(q, r, s)| (p.t_ms, q, r, s)))
            .collect();
        if judged.len() < 2 || !judged.iter().all(|(_, q, r, _)| *q > 0.0 && *r == 0.0) {
            continue;
        }
        let (t0, q0, _, _) = judged[0];
        let (_, q1, _, src) = judged[judged.len() - 1];
        let mut evidence = vec![Evidence::new(
            "metrics",
            format!(
                "queued {q0} -> {q1}, running 0 in all {} points over {} (from {src}{})",
                judged.len(),
                secs(v.now - t0),
                if src == "metrics" {
                    "; gauges may be frozen during a stall, counters agree"
                } else {
                    ""
                }
            ),
        )];
        evidence.push(Evidence::new(
            "gpu",
            format!("GPU activity: {}", cs.gpu_activity),
        ));
        if let Some(r) = cs.forward_rate {
            evidence.push(Evidence::new(
                "metrics",
                format!("forward_seconds_total rate {r:.3} s/s"),
            ));
        }
        if let Some(s) = cs.thread_summary() {
            evidence.push(Evidence::new("stacks", s));
        }
        let waiting: Vec<String> = v
            .requests
            .iter()
            .filter(|r| r.x.component == cs.id && View::is_outstanding(r))
            .map(|r| r.x.id.clone())
            .collect();
        out.push(Finding {
            kind: "queue_not_draining".into(),
            severity: Severity::Critical,
            component: Some(cs.id.clone()),
            role: Some(cs.role),
            summary: format!(
                "{} has {q1} queued request(s) and 0 running for {}; GPU {}",
                cs.id,
                secs(v.now - t0),
                cs.gpu_activity
            ),
            requests: waiting,
            evidence,
            explanation: Some("Requests wait in the engine's queues (waiting / PD bootstrap / prealloc / transfer) and the scheduler never forms a batch. In PD, check the other leg (KV transfer, bootstrap) and the scheduler's PD queue polling in the stacks.".into()),
        });
    }
    out
}

/// `scheduler_stuck`: a scheduler thread in the same frame outside its loop in every dump.
pub fn scheduler_stuck(m: &Model, v: &View) -> Vec<Finding> {
    let th = &m.thresholds;
    let mut out = Vec::new();
    for cs in v.components.values() {
        if !(cs.role.is_engine() || cs.role == Role::Scheduler) {
            continue;
        }
        let engine_main = m.topology().component(&cs.id).and_then(|c| c.main_pid);
        for t in &cs.threads {
            // Only scheduler processes run the loop this judges: an engine's own HTTP
            // process legitimately sits in one frame (epoll, queue waits) forever.
            if cs.role.is_engine() && Some(t.pid) == engine_main {
                continue;
            }
            // Threads are judged under their most specific component only.
            if m.topology().component_of_pid(t.pid).map(|c| c.id.as_str()) != Some(cs.id.as_str()) {
                continue;
            }
            // The loop runs on the main thread; watchdogs and transfer threads wait by design.
            if t.tid != t.pid && t.name.as_deref() != Some("MainThread") {
                continue;
            }
            if t.states.len() < th.scheduler_min_dumps {
                continue;
            }
            let all_stuck = t.states.iter().all(|s| s == "stuck_outside_loop");
            let same_frame = t
                .top_frames
                .iter()
                .all(|f| !f.is_empty() && *f == t.top_frames[0])
                && t.states
                    .iter()
                    .all(|s| s == "stuck_outside_loop" || s == "unknown");
            if !(all_stuck || same_frame) {
                continue;
            }
            let frame = t.top_frames.last().cloned().unwrap_or_default();
            out.push(Finding {
                kind: "scheduler_stuck".into(),
                severity: Severity::Critical,
                component: Some(cs.id.clone()),
                role: Some(cs.role),
                summary: format!(
                    "{} thread {} ({}) is stuck in {frame} in {}/{} dumps, outside the scheduler loop",
                    cs.id,
                    t.tid,
                    t.name.as_deref().unwrap_or("?"),
                    t.states.len(),
                    t.states.len()
                ),
                requests: v
                    .requests
                    .iter()
                    .filter(|r| r.x.component == cs.id && View::is_outstanding(r))
                    .map(|r| r.x.id.clone())
                    .collect(),
                evidence: vec![
                    Evidence::new("stacks", format!("states: {}", t.states.join(", "))),
                    Evidence::new("stacks", format!("latest stack: {}", t.frames.join(" <- "))),
                    Evidence::new("gpu", format!("GPU activity: {}", cs.gpu_activity)),
                ],
                explanation: Some("The scheduler's main thread is not cycling its event loop: a long or infinite operation (eviction, tree cache, grammar, a lock) holds it. /health may still answer. Capture a native stack (py-spy dump --native) and the frame's source.".into()),
            });
        }
    }
    out
}

/// `accumulating_state`: connections, CLOSE_WAIT sockets, fds or threads keep growing.
pub fn accumulating_state(m: &Model, v: &View) -> Vec<Finding> {
    let th = &m.thresholds;
    let mut out = Vec::new();
    for c in &m.topology().components {
        let Some(q) = m.counts(&c.id) else { continue };
        let from = v.now - th.accumulate_window_ms;
        type Pick = fn(&crate::correlate::CountPoint) -> Option<u32>;
        let metrics: [(&str, Pick, u32); 4] = [
            (
                "established connections",
                |p| p.established,
                th.accumulate_min_connections,
            ),
            (
                "CLOSE_WAIT sockets",
                |p| p.close_wait,
                th.accumulate_min_close_wait,
            ),
            ("open fds", |p| p.fds, th.accumulate_min_fds),
            ("threads", |p| p.threads, th.accumulate_min_threads),
        ];
        for (what, pick, min_growth) in metrics {
            let pts: Vec<(Millis, u32)> = q
                .iter()
                .filter(|p| p.t_ms >= from && p.t_ms <= v.now)
                .filter_map(|p| pick(p).map(|x| (p.t_ms, x)))
                .collect();
            if pts.len() < 6 || pts[pts.len() - 1].0 - pts[0].0 < th.accumulate_window_ms / 2 {
                continue;
            }
            let third = pts.len() / 3;
            let early_max = pts[..third].iter().map(|p| p.1).max().unwrap_or(0);
            let late_min = pts[pts.len() - third..]
                .iter()
                .map(|p| p.1)
                .min()
                .unwrap_or(0);
            let rises = pts.windows(2).filter(|w| w[1].1 >= w[0].1).count();
            if late_min < early_max.saturating_add(min_growth) || rises * 10 < (pts.len() - 1) * 8 {
                continue;
            }
            let (t0, v0) = pts[0];
            let (t1, v1) = pts[pts.len() - 1];
            out.push(Finding {
                kind: "accumulating_state".into(),
                severity: Severity::Warning,
                component: Some(c.id.clone()),
                role: Some(c.role),
                summary: format!("{} {what} grew from {v0} to {v1} in {} and keep growing", c.id, secs(t1 - t0)),
                requests: Vec::new(),
                evidence: vec![Evidence::new(
                    if what.contains("fds") || what == "threads" { "processes" } else { "sockets" },
                    format!("{what}: {v0} at start, {early_max} max early, {late_min} min late, {v1} now ({} points)", pts.len()),
                )],
                explanation: Some("Something is opened and never released: leaked connections (CLOSE_WAIT means the peer hung up and this process never closed), fds or threads. Each leaked connection may be a forgotten request.".into()),
            });
        }
    }
    out
}

/// `process_restarted`: a component's process changed (pid or start time).
pub fn process_restarted(m: &Model, v: &View) -> Vec<Finding> {
    let th = &m.thresholds;
    m.restarts()
        .filter(|r| r.t_ms <= v.now && v.now - r.t_ms <= th.restart_recent_ms)
        .map(|r| {
            let what = match &r.after {
                Some(a) => format!("process {} was replaced by {a}", r.before),
                None => format!("process {} is gone", r.before),
            };
            Finding {
                kind: "process_restarted".into(),
                severity: Severity::Warning,
                component: Some(r.component.clone()),
                role: Some(r.role),
                summary: format!("{} restarted {} ago: {what}", r.component, secs(v.now - r.t_ms)),
                requests: Vec::new(),
                evidence: vec![Evidence::new(
                    "processes",
                    format!("identity (pid:start_ticks) {} -> {}", r.before, r.after.as_deref().unwrap_or("none")),
                )],
                explanation: Some("A restart changes more than the pid: compare its environment and command line with the baseline (config_changed). Requests in flight at the restart were lost.".into()),
            }
        })
        .collect()
}

/// `endpoint_unresponsive`: a metrics/health endpoint failed `endpoint_failures` times in a
/// row (or answered slower than `endpoint_slow_ms`).
pub fn endpoint_unresponsive(m: &Model, v: &View) -> Vec<Finding> {
    let th = &m.thresholds;
    let mut out = Vec::new();
    for c in &m.topology().components {
        let probes = m.endpoint_probes(&c.id, v.now);
        let mut by_url: BTreeMap<&str, Vec<&(Millis, crate::model::EndpointProbe)>> =
            BTreeMap::new();
        for p in &probes {
            by_url.entry(p.1.url.as_str()).or_default().push(p);
        }
        for (url, ps) in by_url {
            let n = th.endpoint_failures.max(1);
            let tail: Vec<_> = ps.iter().rev().take(n).collect();
            let bad = |p: &crate::model::EndpointProbe| {
                probe_failed(p) || p.elapsed_ms >= th.endpoint_slow_ms
            };
            if tail.len() < n || !tail.iter().all(|p| bad(&p.1)) {
                continue;
            }
            let last = &tail[0].1;
            let what = match last.outcome {
                crate::model::FetchOutcome::Timeout => {
                    format!("timed out after {} ms", last.elapsed_ms)
                }
                crate::model::FetchOutcome::Refused => "refused the connection".to_string(),
                crate::model::FetchOutcome::HttpError => {
                    format!("answered HTTP {}", last.http_status.unwrap_or(0))
                }
                crate::model::FetchOutcome::Ok | crate::model::FetchOutcome::TooLarge => {
                    format!("took {} ms", last.elapsed_ms)
                }
                crate::model::FetchOutcome::Error => {
                    format!("failed: {}", last.detail.as_deref().unwrap_or("error"))
                }
            };
            out.push(Finding {
                kind: "endpoint_unresponsive".into(),
                severity: Severity::Warning,
                component: Some(c.id.clone()),
                role: Some(c.role),
                summary: format!("{} endpoint {url} {what} ({n} probes in a row)", c.id),
                requests: Vec::new(),
                evidence: tail
                    .iter()
                    .map(|p| Evidence::new("metrics", format!("{} {:?} {} ms {}", p.1.url, p.1.outcome, p.1.elapsed_ms, p.1.detail.as_deref().unwrap_or(""))))
                    .collect(),
                explanation: Some("An endpoint that stops answering is itself a symptom: the HTTP server's event loop is blocked, or an endpoint that calls into the scheduler waits on a stuck scheduler. Metrics from it are missing, not zero.".into()),
            });
        }
    }
    out
}

fn config_changed_detector(m: &Model, _v: &View) -> Vec<Finding> {
    config_changed(m.config_changes())
}

/// `config_changed`: one finding per component with changes against the baseline.
pub fn config_changed(changes: &[crate::model::Change]) -> Vec<Finding> {
    // One rendering of changes for `diff`, `snapshot --baseline` and the daemon's baseline:
    // env/cmdline/version/config only (restarts are `process_restarted`).
    crate::diff::findings_from_changes(changes)
}
