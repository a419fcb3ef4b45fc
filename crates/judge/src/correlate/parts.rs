//! The model's share of a snapshot: requests (exchanges and logical requests), sources,
//! GPUs, threads, extras and raw payloads at one instant, with the findings the pipeline
//! computed.

use super::gpu::device_activity;
use super::requests::LogicalView;
use super::view::View;
use super::Correlator;
use crate::clock::Millis;
use crate::model::{
    ComponentExtras, LogicalRequest, RawFiles, Request, SnapGpu, SnapGpuProcess, SnapThread,
    SnapshotParts, SourceKind, SourceStatus,
};
use std::collections::{BTreeMap, BTreeSet};

impl Correlator {
    /// Everything a snapshot needs, with the findings computed by the caller
    /// (`pipeline::parts`).
    pub fn parts_with(
        &self,
        now: Millis,
        view: &View,
        findings: Vec<crate::model::Finding>,
        raw: RawFiles,
    ) -> SnapshotParts {
        let listed = Listed::of(view, MAX_DONE_LISTED);
        let mut requests: Vec<Request> = view
            .requests
            .iter()
            .enumerate()
            .filter(|(i, _)| listed.exchange(*i))
            .map(|(_, r)| request_of(view, r))
            .collect();
        requests.extend(view.idle.iter().cloned());
        let extras = view
            .components
            .values()
            .map(|cs| {
                (
                    cs.id.clone(),
                    ComponentExtras {
                        sockets: cs.sockets.clone(),
                        metrics: cs.metrics.clone(),
                        gpu_activity: Some(cs.gpu_activity.as_str().to_string()),
                    },
                )
            })
            .collect();
        // Titled processes (setproctitle) keep their args and env in a launcher or parent:
        // those pids' facts are what the snapshot shows for them.
        let pids: BTreeSet<i32> = self.topology.pids().into_iter().collect();
        let processes = self
            .latest_processes
            .iter()
            .filter(|p| pids.contains(&p.pid))
            .cloned()
            .collect();
        let window_ms = match self.first_t {
            Some(f) => (now - f).clamp(0, self.window_ms) as u64,
            None => 0,
        };
        SnapshotParts {
            taken_at_ms: now,
            window_ms,
            sources: self.source_statuses(now),
            topology: self.topology_as_held(view),
            processes,
            requests,
            logical_requests: view
                .logical
                .iter()
                .enumerate()
                .filter(|(i, _)| listed.logical(*i))
                .map(|(_, l)| logical_of(view, l))
                .collect(),
            gpus: self.snap_gpus(now),
            threads: self.snap_threads(view),
            findings,
            extras,
            config_changed: self.config_changes.clone(),
            raw: self.raw_payloads(now, raw),
            node: None,
            connections: self.outbound_connections(),
            channels: self.channel_flows(now),
            elided: listed.elided,
        }
    }

    /// Each source's status, degraded when its last sample is too old.
    fn source_statuses(&self, now: Millis) -> BTreeMap<SourceKind, SourceStatus> {
        let mut sources = BTreeMap::new();
        for k in SourceKind::ALL {
            let st = match self.seen.get(&k) {
                Some(s) if now - s.last_t_ms > self.thresholds.correlate.stale_after_ms * 4 => {
                    SourceStatus::degraded(format!("last sample {} ms old", now - s.last_t_ms))
                        .worst(s.status.clone())
                }
                Some(s) => s.status.clone(),
                None => SourceStatus::unavailable("no sample yet"),
            };
            sources.insert(k, st);
        }
        sources
    }

    /// The topology with each component's GPUs as the view lists them (NVML's process list
    /// where it shows the component, else the discovery hint).
    fn topology_as_held(&self, view: &View) -> crate::model::Topology {
        let mut topo = self.topology.clone();
        for c in &mut topo.components {
            if let Some(cs) = view.components.get(&c.id) {
                c.gpus.clone_from(&cs.gpus);
            }
        }
        topo
    }

    fn snap_gpus(&self, now: Millis) -> Vec<SnapGpu> {
        let mut gpus = Vec::new();
        if let Some(g) = self.latest_gpu(now) {
            // Each NVML process's component, through any PID namespace.
            let owner: BTreeMap<(u32, u32), String> =
                super::map_gpu_pids(&self.topology, &self.latest_processes, g)
                    .into_iter()
                    .filter_map(|m| Some(((m.gpu_index, m.nvml_pid), m.component?)))
                    .collect();
            for d in &g.devices {
                gpus.push(SnapGpu {
                    index: d.index,
                    name: d.name.clone().unwrap_or_default(),
                    util_pct: d.util_gpu_pct.map(f64::from),
                    power_w: d.power_mw.map(|p| f64::from(p) / 1000.0),
                    processes: d
                        .processes
                        .iter()
                        .map(|p| SnapGpuProcess {
                            pid: i64::from(p.pid),
                            used_mem_bytes: p.used_mem_bytes,
                            sm_util_pct: p.sm_util_pct,
                            component: owner.get(&(d.index, p.pid)).cloned(),
                        })
                        .collect(),
                    uuid: d.uuid.clone(),
                    mem_used_bytes: d.mem_used_bytes,
                    activity: Some(device_activity(d, &self.thresholds).as_str().to_string()),
                    power_limit_w: d.power_limit_mw.map(|p| f64::from(p) / 1000.0),
                    mem_total_bytes: d.mem_total_bytes,
                });
            }
        }
        gpus
    }

    fn snap_threads(&self, view: &View) -> Vec<SnapThread> {
        let mut threads = Vec::new();
        for cs in view.components.values() {
            for t in &cs.threads {
                // Threads are reported once, under their most specific component.
                let owner = self.topology.component_of_pid(t.pid).map(|c| c.id.clone());
                if owner.as_deref() != Some(cs.id.as_str()) {
                    continue;
                }
                threads.push(SnapThread {
                    pid: t.pid,
                    tid: t.tid,
                    name: t.name.clone(),
                    state: t.states.last().cloned().unwrap_or_default(),
                    frames: t.frames.clone(),
                    component: owner,
                    states_over_window: t.states.clone(),
                    rule: t.rule.clone(),
                    decided_by: t.decided_by.clone(),
                });
            }
        }
        threads
    }

    /// The latest sockets, GPU and metrics payloads, for the bundle's raw files (no sockets
    /// for [`RawFiles::WithoutSockets`]).
    fn raw_payloads(&self, now: Millis, which: RawFiles) -> BTreeMap<String, serde_json::Value> {
        let mut raw = BTreeMap::new();
        if which == RawFiles::All {
            if let Some(s) = self.raw_sockets() {
                raw.insert("sockets".to_string(), s);
            }
        }
        if let Some(g) = self.latest_gpu(now) {
            raw.insert(
                "gpu".to_string(),
                serde_json::to_value(g).unwrap_or_default(),
            );
        }
        if !self.latest_scrapes.is_empty() {
            raw.insert(
                "metrics".to_string(),
                serde_json::to_value(&self.latest_scrapes).unwrap_or_default(),
            );
        }
        raw
    }
}

/// One exchange of the view as the contract's request, with its logical request and leg.
fn request_of(view: &View, r: &super::RequestView) -> Request {
    let conf =
        r.x.links
            .iter()
            .filter_map(|&l| view.request_by_num(l).and_then(|c| c.x.parent_confidence))
            .fold(None, |a: Option<f64>, c| Some(a.map_or(c, |a| a.min(c))));
    Request {
        id: r.x.id.clone(),
        component: r.x.component.clone(),
        client: r.x.client.clone(),
        server: r.x.server.clone(),
        state: r.state,
        age_ms: r.age_ms.max(0) as f64,
        bytes_in: r.x.bytes_in,
        bytes_out: r.x.bytes_out,
        idle_out_ms: r.idle_out_ms.max(0) as f64,
        links: r.x.links.iter().map(|&n| super::exchange_id(n)).collect(),
        role: Some(r.x.role),
        client_component: r.x.client_component.clone(),
        link_confidence: conf,
        started_at: Some(crate::clock::rfc3339(r.x.request_ms)),
        request: Some(view.logical_of(r).id()),
        leg: Some(r.leg.to_string()),
    }
}

/// One logical request of the view as the contract's.
fn logical_of(view: &View, l: &LogicalView) -> LogicalRequest {
    let entry = l.legs.first().map(|&i| &view.requests[i]);
    let stuck = l.stuck.as_ref().map(|s| (s, &view.requests[s.leg]));
    LogicalRequest {
        id: l.id(),
        legs: l
            .legs
            .iter()
            .map(|&i| view.requests[i].x.id.clone())
            .collect(),
        verdict: l.verdict,
        component: entry.map(|r| r.x.component.clone()).unwrap_or_default(),
        age_ms: entry.map_or(0.0, |r| r.age_ms.max(0) as f64),
        probe: l.probe,
        stuck_leg: stuck.map(|(_, r)| r.leg.to_string()),
        stuck_at: stuck.map(|(_, r)| r.x.component.clone()),
        stuck_role: stuck.map(|(_, r)| r.x.role),
        stuck_kind: stuck.map(|(s, _)| s.kind),
        waiting_reason: l.waiting.map(|(_, w)| w),
        waiting_leg: l.waiting.map(|(i, _)| view.requests[i].leg.to_string()),
    }
}

/// Finished logical requests a snapshot lists at most (the newest), to bound its size.
/// Unfinished ones are always listed.
pub const MAX_DONE_LISTED: usize = 500;

/// Which of a view's logical requests and exchanges a snapshot lists.
struct Listed {
    /// Per logical request (index into `View::logical`).
    logical: Vec<bool>,
    /// Per exchange (index into `View::requests`).
    exchanges: Vec<bool>,
    elided: Option<crate::model::Elided>,
}

impl Listed {
    /// Every unfinished logical request, and the newest `max_done` finished ones (by their
    /// entry leg's start), each with all its legs.
    fn of(view: &View, max_done: usize) -> Listed {
        let mut done: Vec<(Millis, usize)> = view
            .logical
            .iter()
            .enumerate()
            .filter(|(_, l)| l.verdict == crate::model::Verdict::Done)
            .map(|(i, l)| (entry_start(view, l), i))
            .collect();
        let mut logical = vec![true; view.logical.len()];
        let mut exchanges = vec![true; view.requests.len()];
        if done.len() <= max_done {
            return Listed {
                logical,
                exchanges,
                elided: None,
            };
        }
        done.sort_unstable_by(|a, b| b.cmp(a));
        let mut legs = 0u64;
        for &(_, i) in &done[max_done..] {
            logical[i] = false;
            for &x in &view.logical[i].legs {
                if let Some(e) = exchanges.get_mut(x) {
                    *e = false;
                    legs += 1;
                }
            }
        }
        let elided = crate::model::Elided {
            done_requests: (done.len() - max_done) as u64,
            exchanges: legs,
            kept_done: max_done as u64,
        };
        Listed {
            logical,
            exchanges,
            elided: Some(elided),
        }
    }

    fn logical(&self, i: usize) -> bool {
        self.logical.get(i).copied().unwrap_or(true)
    }

    fn exchange(&self, i: usize) -> bool {
        self.exchanges.get(i).copied().unwrap_or(true)
    }
}

fn entry_start(view: &View, l: &LogicalView) -> Millis {
    l.legs
        .first()
        .and_then(|&i| view.requests.get(i))
        .map_or(Millis::MIN, |r| r.x.request_ms)
}
