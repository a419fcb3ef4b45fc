//! The state of one component at an instant: GPU verdict, counter rates, in-flight counts,
//! thread windows, socket counts and selected metrics.

use super::gpu::{gpu_activity, listed_gpus, HeldGpus};
use super::metrics::{MetricsPoint, PD_QUEUE_KEYS};
use super::stacks::ThreadWindow;
use super::Correlator;
use super::FastMap;
use crate::clock::Millis;
use crate::correlate::GpuActivity;
use crate::model::{Component, Role, ThreadState};
use std::collections::BTreeMap;

/// The state of one component at `now`, derived from the history.
#[derive(Debug, Clone, PartialEq)]
pub struct ComponentState {
    pub id: String,
    pub role: Role,
    /// The GPUs it holds: NVML's process list (its children's folded in), else the topology's
    /// `CUDA_VISIBLE_DEVICES` / title-rank hint. The snapshot lists these.
    pub gpus: Vec<u32>,
    pub gpu_activity: GpuActivity,
    pub forward_rate: Option<f64>,
    pub idle_rate: Option<f64>,
    pub gen_rate: Option<f64>,
    /// Running requests and where the number came from.
    pub running: Option<(f64, CountSource)>,
    pub queued: Option<(f64, CountSource)>,
    /// Prefill: requests in its bootstrap queue, waiting for their decode side to connect
    /// (`/v1/loads`: the gauge is updated only when a batch runs).
    pub pd_bootstrap: Option<f64>,
    /// Prefill: requests in its inflight queue, their forward done and their KV transfer
    /// under way (`/v1/loads` only: the gauge freezes non-zero on an idle prefill).
    pub pd_inflight: Option<f64>,
    /// Decode: requests in its prealloc and transfer queues, waiting for their KV cache.
    pub pd_decode_held: Option<(f64, CountSource)>,
    pub http_active: Option<f64>,
    /// The router's in-flight count for this component (by its URL).
    pub router_active: Option<f64>,
    pub threads: Vec<ThreadWindow>,
    pub sockets: BTreeMap<String, u32>,
    pub metrics: BTreeMap<String, f64>,
}

/// Where an engine's running / queued count came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CountSource {
    /// `/v1/loads`: asked of the scheduler at each scrape, fresh during a stall.
    V1Loads,
    /// A Prometheus gauge: may be frozen while the scheduler is stuck.
    Metrics,
}

impl CountSource {
    pub fn as_str(self) -> &'static str {
        match self {
            CountSource::V1Loads => "v1_loads",
            CountSource::Metrics => "metrics",
        }
    }
}

impl std::fmt::Display for CountSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One piece of positive evidence that a component is doing work. Detectors decide on the
/// variant; outputs show its `Display` text.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum WorkSignal {
    /// The GPU verdict is `working`.
    GpuWorking,
    /// Forward-pass time accumulates (seconds per second).
    ForwardTime(f64),
    /// Tokens generated per second.
    Generating(f64),
    /// This many scheduler threads are inside a batch (running it, or waiting for its GPU
    /// result or its workers) in the newest dump.
    SchedulerBusy(usize),
}

impl WorkSignal {
    /// Work going on at this instant (not a rate over the rate window, which may reflect
    /// batches that finished before a request arrived).
    pub fn is_current(self) -> bool {
        matches!(self, WorkSignal::GpuWorking | WorkSignal::SchedulerBusy(_))
    }
}

impl std::fmt::Display for WorkSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WorkSignal::GpuWorking => write!(f, "GPU working"),
            WorkSignal::ForwardTime(r) => write!(f, "forward time rate {r:.2} s/s"),
            WorkSignal::Generating(r) => write!(f, "{r:.1} tokens/s generated"),
            WorkSignal::SchedulerBusy(n) => write!(f, "{n} scheduler thread(s) running a batch"),
        }
    }
}

/// `GPU working, 12.0 tokens/s generated`.
pub fn signals_text(signals: &[WorkSignal]) -> String {
    signals
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

impl ComponentState {
    /// Busy: at least one of its [`work_signals`](Self::work_signals).
    pub fn shows_work(&self) -> bool {
        !self.work_signals().is_empty()
    }

    /// Positive evidence that the engine is doing work (any one suffices).
    pub fn work_signals(&self) -> Vec<WorkSignal> {
        let mut v = Vec::new();
        if self.gpu_activity == GpuActivity::Working {
            v.push(WorkSignal::GpuWorking);
        }
        if let Some(r) = self.forward_rate.filter(|r| *r > 0.01) {
            v.push(WorkSignal::ForwardTime(r));
        }
        if let Some(r) = self.gen_rate.filter(|r| *r > 0.0) {
            v.push(WorkSignal::Generating(r));
        }
        let busy = self
            .threads
            .iter()
            .filter(|t| t.states.last().is_some_and(ThreadState::is_working))
            .count();
        if busy > 0 {
            v.push(WorkSignal::SchedulerBusy(busy));
        }
        v
    }

    /// The thread that runs the engine's loop: the scheduler's main thread of the lowest pid
    /// (TP rank 0).
    pub fn loop_thread(&self) -> Option<&ThreadWindow> {
        self.threads
            .iter()
            .filter(|t| !t.states.is_empty())
            .max_by_key(|t| {
                (
                    // A thread some scheduler rule recognised (the loop), before the engine's
                    // HTTP thread, which no rule knows.
                    t.states.iter().any(|s| !s.is_uninformative()),
                    t.name.as_deref() == Some("MainThread"),
                    t.states.len(),
                    std::cmp::Reverse(t.pid),
                )
            })
    }

    /// The dominant thread state over the window as "idle in 3/3 dumps over 12 s", if any
    /// dumps.
    pub fn thread_summary(&self) -> Option<String> {
        let t = self.loop_thread()?;
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for s in &t.states {
            *counts.entry(s.as_str()).or_default() += 1;
        }
        let (state, n) = counts.into_iter().max_by_key(|(_, n)| *n)?;
        Some(format!("scheduler {state} {}", t.dumps_text(n)))
    }
}

/// Requests queued at an engine in one metrics point, and where the number came from:
/// `/v1/loads` (waiting and PD queues, fresh during a stall), else the queue gauges.
pub(super) fn queued_of(p: &MetricsPoint) -> Option<(f64, CountSource)> {
    if let Some(l) = p.loads {
        return Some((l.waiting + l.pd_queued, CountSource::V1Loads));
    }
    let pd: Option<f64> = PD_QUEUE_KEYS
        .iter()
        .filter_map(|k| p.mapped.get(*k).copied())
        .fold(None, |a, v| Some(a.unwrap_or(0.0) + v));
    let q = p.mapped.get("queued").copied();
    (q.is_some() || pd.is_some())
        .then(|| (q.unwrap_or(0.0) + pd.unwrap_or(0.0), CountSource::Metrics))
}

impl Correlator {
    /// A component with its children's pids and GPUs folded in: an engine's scheduler
    /// processes hold its GPUs and run its event loop.
    pub fn with_children(&self, c: &Component) -> Component {
        let mut f = c.clone();
        for ch in
            self.topology.components.iter().filter(|o| {
                o.parent.as_deref() == Some(c.id.as_str()) || c.children.contains(&o.id)
            })
        {
            for p in &ch.pids {
                if !f.pids.contains(p) {
                    f.pids.push(*p);
                }
            }
            for g in &ch.gpus {
                if !f.gpus.contains(g) {
                    f.gpus.push(*g);
                }
            }
        }
        f
    }

    /// Component state at `now`.
    pub fn component_state(&self, c: &Component, now: Millis) -> ComponentState {
        self.component_state_with(c, now, self.socket_counts(c), &self.held_gpus(now))
    }

    /// The socket counts by state of every component, in one pass over the newest socket
    /// table; a socket counts for the most specific component holding its pid.
    pub(super) fn socket_counts_by_component(&self) -> FastMap<&str, BTreeMap<String, u32>> {
        let mut counts: FastMap<&str, BTreeMap<String, u32>> = FastMap::default();
        let Some(t) = &self.latest_sockets else {
            return counts;
        };
        let mut owner: FastMap<i32, Option<&str>> = FastMap::default();
        for e in &t.sockets {
            let Some(pid) = e.pid else { continue };
            let o = *owner
                .entry(pid)
                .or_insert_with(|| self.topology.component_of_pid(pid).map(|c| c.id.as_str()));
            if let Some(id) = o {
                *counts
                    .entry(id)
                    .or_default()
                    .entry(e.state.as_str().to_string())
                    .or_default() += 1;
            }
        }
        counts
    }

    /// Component state at `now`, with its socket counts already taken.
    pub(super) fn component_state_with(
        &self,
        c: &Component,
        now: Millis,
        sockets: BTreeMap<String, u32>,
        held: &HeldGpus,
    ) -> ComponentState {
        let latest = self.latest_metrics(&c.id, now);
        let mapped = |k: &str| latest.and_then(|p| p.mapped.get(k).copied());
        let loads = latest.and_then(|p| p.loads);
        let running = match (loads, mapped("running")) {
            (Some(l), _) => Some((l.running, CountSource::V1Loads)),
            (None, Some(v)) => Some((v, CountSource::Metrics)),
            _ => None,
        };
        let queued = latest.and_then(queued_of);
        let mut whole = self.with_children(c);
        whole.gpus = listed_gpus(&whole, held);
        let gpu_activity = match self.latest_gpu(now) {
            Some(g) => gpu_activity(&whole, g, &self.thresholds),
            None => GpuActivity::Unknown,
        };
        let forward_rate = self.rate(&c.id, "forward_seconds_total", now);
        let idle_rate = self.rate(&c.id, "idle_seconds_total", now);
        let gen_rate = self.rate(&c.id, "generation_tokens_total", now);
        let mut metrics = BTreeMap::new();
        if let Some(p) = latest {
            for (k, v) in &p.mapped {
                metrics.insert(k.clone(), *v);
                if k.ends_with("_total") {
                    if let Some(r) = self.rate(&c.id, k, now) {
                        metrics.insert(format!("{k}_rate"), r);
                    }
                }
            }
            if let Some(l) = p.loads {
                metrics.insert("v1_loads_running".into(), l.running);
                metrics.insert("v1_loads_waiting".into(), l.waiting);
                metrics.insert("v1_loads_pd_queued".into(), l.pd_queued);
            }
        }
        ComponentState {
            id: c.id.clone(),
            role: c.role,
            gpus: whole.gpus.clone(),
            gpu_activity,
            forward_rate,
            idle_rate,
            gen_rate,
            running,
            queued,
            pd_bootstrap: loads.map(|l| l.pd_bootstrap),
            pd_inflight: loads.map(|l| l.pd_inflight),
            pd_decode_held: match (
                loads,
                mapped("decode_prealloc_queue"),
                mapped("decode_transfer_queue"),
            ) {
                (Some(l), _, _) => Some((l.pd_decode_held, CountSource::V1Loads)),
                (None, None, None) => None,
                (None, a, b) => Some((a.unwrap_or(0.0) + b.unwrap_or(0.0), CountSource::Metrics)),
            },
            http_active: latest
                .and_then(|p| p.http_active_inference)
                .or_else(|| mapped("http_active")),
            router_active: self.router_active_for(c, now),
            threads: self.thread_windows(&whole, now),
            sockets,
            metrics,
        }
    }
}
