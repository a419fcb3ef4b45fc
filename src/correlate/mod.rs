//! Correlation: samples -> exchanges (per-request lifecycle on each TCP connection), hop
//! links (client -> proxy -> router -> prefill + decode), and component state over time.
//!
//! [`Model`] is fed [`Sample`]s in time order (live from the sampler, or replayed from a
//! recording) and keeps a bounded history: time-bounded ring buffers per source. Everything
//! derived (request states, GPU verdicts, findings) is computed on demand by
//! [`Model::view`] / [`Model::parts_with`], so the same samples always give the same answer.
//!
//! Logical metric names consumed (from `MetricsScrape.mapped`, summed over series):
//! `running`, `queued`, `http_active`, `forward_seconds_total`, `idle_seconds_total`,
//! `generation_tokens_total`, `prefill_bootstrap_queue`, `prefill_inflight_queue`,
//! `decode_prealloc_queue`, `decode_transfer_queue`, `decode_retracted_queue`.
//! Extra keys: `extra["v1_loads"]` (engine `/v1/loads` JSON). Raw series read directly:
//! the router's per-worker in-flight gauge `smg_worker_requests_active{worker}` (or legacy
//! `sgl_router_running_requests{worker}`).

pub mod exchange;
pub mod links;

use crate::clock::Millis;
use crate::model::{
    Change, Component, EndpointProbe, FetchOutcome, GpuReading, MetricsScrape, Payload,
    ProcessFacts, Request, RequestState, Role, Sample, SnapGpu, SnapGpuProcess, SnapThread,
    SocketTable, SourceKind, SourceStatus, StackCapture, Status, Topology,
};
use crate::model::{ComponentExtras, SnapshotParts, ThreadState, Thresholds};
use exchange::{Conn, ConnKey, End, Exchange, Obs};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

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

/// What the latest sample of a source said, as the model saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceSeen {
    pub status: SourceStatus,
    pub last_t_ms: Millis,
    pub took_ms: u64,
    pub samples: u64,
}

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
    /// Newest `timestamp` (epoch seconds) of the load snapshots, when present.
    pub timestamp_s: Option<f64>,
}

/// Requests smaller than this (headers only: `GET /metrics`, `/health`, `/v1/loads`) are
/// probes, not inference requests (a POST with a JSON body is larger).
pub const MIN_INFERENCE_REQUEST_BYTES: u64 = 200;

/// A request of known size too small to be an inference request.
pub fn is_probe_sized(x: &Exchange) -> bool {
    x.bytes_in > 0 && x.bytes_in < MIN_INFERENCE_REQUEST_BYTES
}

/// Two `tcp_info` "ms since" dates this close are the same kernel tick (4 ms at HZ=250,
/// 10 ms at HZ=100): their order is unknown.
const JIFFY_TIE_MS: Millis = 10;

/// A process identity change of a component.
#[derive(Debug, Clone, PartialEq)]
pub struct RestartEvent {
    pub t_ms: Millis,
    pub component: String,
    pub role: Role,
    pub before: String,
    /// None: the process is gone and no successor is known yet.
    pub after: Option<String>,
}

/// Per-component counts over time for `accumulating_state`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CountPoint {
    pub t_ms: Millis,
    pub established: Option<u32>,
    pub close_wait: Option<u32>,
    pub fds: Option<u32>,
    pub threads: Option<u32>,
}

/// One scheduler (or other) thread across the stack dumps of the window.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadWindow {
    pub pid: i32,
    pub tid: i32,
    pub name: Option<String>,
    /// Classified state per dump, oldest first.
    pub states: Vec<ThreadState>,
    /// Innermost frame per dump, oldest first.
    pub top_frames: Vec<String>,
    /// Frames of the latest dump, rendered.
    pub frames: Vec<String>,
    /// The rule that decided the latest dump's state, and the frame it matched.
    pub rule: Option<String>,
    pub decided_by: Option<String>,
}

/// The state of one component at `now`, derived from the history.
#[derive(Debug, Clone, PartialEq)]
pub struct ComponentState {
    pub id: String,
    pub role: Role,
    pub gpu_activity: &'static str,
    pub forward_rate: Option<f64>,
    pub idle_rate: Option<f64>,
    pub gen_rate: Option<f64>,
    /// Running requests and where the number came from (`v1_loads` is fresh during a stall,
    /// the `metrics` gauge may be frozen).
    pub running: Option<(f64, &'static str)>,
    pub queued: Option<(f64, &'static str)>,
    pub http_active: Option<f64>,
    /// The router's in-flight count for this component (by its URL).
    pub router_active: Option<f64>,
    pub threads: Vec<ThreadWindow>,
    pub sockets: BTreeMap<String, u32>,
    pub metrics: BTreeMap<String, f64>,
}

impl ComponentState {
    /// Positive evidence that the engine is doing work (any one suffices).
    pub fn working_evidence(&self) -> Vec<String> {
        let mut v = Vec::new();
        if self.gpu_activity == "working" {
            v.push("GPU working".to_string());
        }
        if let Some(r) = self.forward_rate.filter(|r| *r > 0.01) {
            v.push(format!("forward time rate {r:.2} s/s"));
        }
        if let Some(r) = self.gen_rate.filter(|r| *r > 0.0) {
            v.push(format!("{r:.1} tokens/s generated"));
        }
        let busy = self
            .threads
            .iter()
            .filter(|t| t.states.last().is_some_and(ThreadState::is_working))
            .count();
        if busy > 0 {
            v.push(format!("{busy} scheduler thread(s) running a batch"));
        }
        v
    }

    /// The dominant thread state over the window as "idle in 3/3 dumps", if any dumps.
    pub fn thread_summary(&self) -> Option<String> {
        // The scheduler's main thread of the lowest pid (TP rank 0 starts first): other
        // ranks idle inside a gloo broadcast, helper threads say little.
        let t = self
            .threads
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
            })?;
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for s in &t.states {
            *counts.entry(s.as_str()).or_default() += 1;
        }
        let (state, n) = counts.into_iter().max_by_key(|(_, n)| *n)?;
        Some(format!("scheduler {state} in {n}/{} dumps", t.states.len()))
    }
}

/// One exchange with its derived state at `now`.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestView {
    pub x: Exchange,
    pub state: RequestState,
    pub age_ms: i64,
    pub idle_out_ms: i64,
}

/// Everything detectors and outputs need at one instant.
#[derive(Debug, Clone)]
pub struct View {
    pub now: Millis,
    pub requests: Vec<RequestView>,
    /// Open connections with nothing outstanding (keep-alive idle), as `idle` requests.
    pub idle: Vec<Request>,
    pub components: BTreeMap<String, ComponentState>,
    /// Whether request states are current: a usable socket table within `stale_after_ms`.
    /// When false, a request only *looks* old because nobody looked; request-based
    /// detectors stay silent (the sockets source status says why).
    pub sockets_fresh: bool,
    index: std::collections::HashMap<String, usize>,
}

impl View {
    pub fn request(&self, id: &str) -> Option<&RequestView> {
        self.index.get(id).map(|i| &self.requests[*i])
    }
    /// Still waiting for, or receiving, a response.
    pub fn is_outstanding(r: &RequestView) -> bool {
        matches!(
            r.state,
            RequestState::WaitingFirstByte | RequestState::Streaming | RequestState::Stalled
        )
    }
}

/// The correlator.
#[derive(Debug, Clone)]
pub struct Model {
    pub thresholds: Thresholds,
    /// How much history is kept (ring buffers are cut by time).
    pub history_ms: i64,
    /// The snapshot window: stack dumps, rates and done requests within it are reported.
    pub window_ms: i64,
    /// Client pids whose connections are not requests (the tool's own metrics scrapes).
    pub ignore_client_pids: Vec<i32>,
    topology: Topology,
    conns: BTreeMap<ConnKey, Conn>,
    closed: VecDeque<Conn>,
    next_x: u64,
    next_conn: u64,
    last_t: Millis,
    first_t: Option<Millis>,
    seen: BTreeMap<SourceKind, SourceSeen>,
    latest_processes: Vec<ProcessFacts>,
    identities: BTreeMap<String, String>,
    restarts: VecDeque<RestartEvent>,
    counts: BTreeMap<String, VecDeque<CountPoint>>,
    gpu: VecDeque<(Millis, GpuReading)>,
    stacks: VecDeque<StackCapture>,
    metrics: BTreeMap<String, VecDeque<MetricsPoint>>,
    latest_scrapes: BTreeMap<String, MetricsScrape>,
    latest_sockets: Option<SocketTable>,
    config_changes: Vec<Change>,
    /// Hop linking: exchange numbers from `.0` are tried this pass (`.1` next pass).
    pub(crate) link_cursor: (u64, u64),
    /// Time of the newest usable socket table.
    last_sockets_ms: Option<Millis>,
}

impl Default for Model {
    fn default() -> Self {
        Model::new(Thresholds::default())
    }
}

/// Most closed connections kept (on top of the time bound).
const MAX_CLOSED_CONNS: usize = 4096;
/// Most metrics points per component / GPU readings / stack captures kept.
const MAX_POINTS: usize = 4096;

impl Model {
    pub fn new(thresholds: Thresholds) -> Model {
        Model {
            thresholds,
            history_ms: 10 * 60 * 1000,
            window_ms: 30 * 1000,
            ignore_client_pids: vec![std::process::id() as i32],
            topology: Topology::default(),
            conns: BTreeMap::new(),
            closed: VecDeque::new(),
            next_x: 0,
            next_conn: 0,
            last_t: 0,
            first_t: None,
            seen: BTreeMap::new(),
            latest_processes: Vec::new(),
            identities: BTreeMap::new(),
            restarts: VecDeque::new(),
            counts: BTreeMap::new(),
            gpu: VecDeque::new(),
            stacks: VecDeque::new(),
            metrics: BTreeMap::new(),
            latest_scrapes: BTreeMap::new(),
            latest_sockets: None,
            config_changes: Vec::new(),
            link_cursor: (0, 0),
            last_sockets_ms: None,
        }
    }

    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Time of the newest sample ingested.
    pub fn last_t(&self) -> Millis {
        self.last_t
    }

    pub fn first_t(&self) -> Option<Millis> {
        self.first_t
    }

    /// Replaces the topology. A component whose main pid changed is a restart.
    pub fn set_topology(&mut self, topology: Topology) {
        for c in &topology.components {
            if let (Some(old), Some(new_pid)) = (self.topology.component(&c.id), c.main_pid) {
                if old.main_pid.is_some() && old.main_pid != Some(new_pid) {
                    // The identity with start ticks is settled by the next processes sample;
                    // note the pid change now so a restart is never missed.
                    let before = self
                        .identities
                        .get(&c.id)
                        .cloned()
                        .unwrap_or_else(|| format!("{}", old.main_pid.unwrap_or_default()));
                    if !before.starts_with(&format!("{new_pid}:")) {
                        self.push_restart(RestartEvent {
                            t_ms: self.last_t,
                            component: c.id.clone(),
                            role: c.role,
                            before,
                            after: Some(new_pid.to_string()),
                        });
                        self.identities.remove(&c.id);
                    }
                }
            }
        }
        self.topology = topology;
    }

    /// Changes against the baseline (from `diff`), reported as `config_changed`.
    pub fn set_config_changes(&mut self, changes: Vec<Change>) {
        self.config_changes = changes;
    }

    pub fn config_changes(&self) -> &[Change] {
        &self.config_changes
    }

    pub fn restarts(&self) -> impl Iterator<Item = &RestartEvent> {
        self.restarts.iter()
    }

    pub fn counts(&self, component: &str) -> Option<&VecDeque<CountPoint>> {
        self.counts.get(component)
    }

    pub fn metrics_history(&self, component: &str) -> Option<&VecDeque<MetricsPoint>> {
        self.metrics.get(component)
    }

    pub fn latest_processes(&self) -> &[ProcessFacts] {
        &self.latest_processes
    }

    /// The newest usable socket table and when it was taken: point-in-time evidence
    /// (`accumulating_state` without history reads socket states and `tcp_info` silences).
    pub fn latest_sockets(&self) -> Option<(Millis, &SocketTable)> {
        Some((self.last_sockets_ms?, self.latest_sockets.as_ref()?))
    }

    pub fn sources_seen(&self) -> &BTreeMap<SourceKind, SourceSeen> {
        &self.seen
    }

    /// Every exchange still in history (open and closed connections), oldest connection
    /// first.
    pub fn exchanges(&self) -> impl Iterator<Item = &Exchange> {
        self.closed
            .iter()
            .chain(self.conns.values())
            .flat_map(|c| c.exchanges.iter())
    }

    /// The number of the newest exchange created so far.
    pub(crate) fn next_exchange_num(&self) -> u64 {
        self.next_x
    }

    fn next_exchange_id(counter: &mut u64) -> String {
        *counter += 1;
        format!("x{counter}")
    }

    fn push_restart(&mut self, e: RestartEvent) {
        self.restarts.push_back(e);
        while self.restarts.len() > 256 {
            self.restarts.pop_front();
        }
    }

    /// Feeds one sample. Samples should come in time order; an older one is still applied
    /// (its data is real) but never moves the model's clock backwards.
    pub fn ingest(&mut self, s: &Sample) {
        let t = s.t_ms;
        self.first_t = Some(self.first_t.map_or(t, |f| f.min(t)));
        self.last_t = self.last_t.max(t);
        let kind = s.kind();
        let e = self.seen.entry(kind).or_insert(SourceSeen {
            status: s.status.clone(),
            last_t_ms: t,
            took_ms: s.took_ms,
            samples: 0,
        });
        e.status = s.status.clone();
        e.last_t_ms = t;
        e.took_ms = s.took_ms;
        e.samples += 1;
        let usable = s.status.status != Status::Unavailable;
        match &s.payload {
            Payload::Sockets(table) if usable => {
                self.last_sockets_ms = Some(self.last_sockets_ms.map_or(t, |l| l.max(t)));
                self.ingest_sockets(t, table, s.status.status)
            }
            Payload::Processes(p) if usable => self.ingest_processes(t, p),
            Payload::Gpu(g) if usable => {
                self.gpu.push_back((t, g.clone()));
            }
            Payload::Stacks(caps) if usable => {
                for c in caps {
                    let mut c = c.clone();
                    if c.t_ms == 0 {
                        c.t_ms = t;
                    }
                    self.stacks.push_back(c);
                }
            }
            Payload::Metrics(scrapes) => self.ingest_metrics(t, scrapes),
            _ => {}
        }
        self.evict();
    }

    fn evict(&mut self) {
        let cut = self.last_t - self.history_ms;
        while self.gpu.len() > MAX_POINTS || self.gpu.front().is_some_and(|(t, _)| *t < cut) {
            self.gpu.pop_front();
        }
        while self.stacks.len() > MAX_POINTS || self.stacks.front().is_some_and(|c| c.t_ms < cut) {
            self.stacks.pop_front();
        }
        for q in self.metrics.values_mut() {
            while q.len() > MAX_POINTS || q.front().is_some_and(|p| p.t_ms < cut) {
                q.pop_front();
            }
        }
        for q in self.counts.values_mut() {
            while q.len() > MAX_POINTS || q.front().is_some_and(|p| p.t_ms < cut) {
                q.pop_front();
            }
        }
        while self.closed.len() > MAX_CLOSED_CONNS
            || self
                .closed
                .front()
                .is_some_and(|c| c.closed_ms.unwrap_or(c.last_seen_ms) < cut)
        {
            self.closed.pop_front();
        }
        for c in self.conns.values_mut() {
            while c.exchanges.len() > 1
                && c.exchanges
                    .front()
                    .is_some_and(|x| x.end_ms().is_some_and(|e| e < cut))
            {
                c.exchanges.pop_front();
            }
        }
        while self.restarts.front().is_some_and(|r| r.t_ms < cut) {
            self.restarts.pop_front();
        }
    }

    fn ingest_sockets(&mut self, t: Millis, table: &SocketTable, status: Status) {
        // Client side of each connection, by (netns, local, remote): the outbound connection
        // of a proxy IS the router's inbound connection with the 4-tuple reversed.
        let mut client_pid: BTreeMap<(Option<u64>, &str, &str), i32> = BTreeMap::new();
        for e in &table.sockets {
            if let Some(pid) = e.pid {
                client_pid.insert((e.netns, e.local.as_str(), e.remote.as_str()), pid);
            }
        }
        let mut present: BTreeSet<ConnKey> = BTreeSet::new();
        let mut per_comp: BTreeMap<String, BTreeMap<String, u32>> = BTreeMap::new();
        for e in &table.sockets {
            if let Some(pid) = e.pid {
                if let Some(c) = self.topology.component_of_pid(pid) {
                    *per_comp
                        .entry(c.id.clone())
                        .or_default()
                        .entry(e.state.as_str().to_string())
                        .or_default() += 1;
                }
            }
            if e.state == crate::model::TcpState::Listen {
                continue;
            }
            let Some(port) = e.local_port() else { continue };
            let Some(server) = self.topology.component_listening_on(port) else {
                continue;
            };
            // A socket on the listen port owned by another component's pid is that other
            // component's outbound connection, not this server's inbound one.
            if let (Some(pid), false) = (e.pid, server.pids.is_empty()) {
                if !server.pids.contains(&pid) {
                    continue;
                }
            }
            let cpid = client_pid
                .get(&(e.netns, e.remote.as_str(), e.local.as_str()))
                .copied();
            if cpid.is_some_and(|p| self.ignore_client_pids.contains(&p)) {
                continue;
            }
            let Some(obs) = Obs::from_entry(t, e) else {
                continue;
            };
            let key = ConnKey {
                netns: e.netns,
                local: e.local.clone(),
                remote: e.remote.clone(),
            };
            present.insert(key.clone());
            let client_component = cpid
                .and_then(|p| self.topology.component_of_pid(p))
                .map(|c| c.id.clone());
            let next_x = &mut self.next_x;
            let mut idgen = || Model::next_exchange_id(next_x);
            match self.conns.get_mut(&key) {
                Some(conn) => {
                    if conn.client_component.is_none() && client_component.is_some() {
                        conn.client_component = client_component.clone();
                        for x in conn.exchanges.iter_mut() {
                            x.client_component = client_component.clone();
                        }
                    }
                    conn.client_pid = conn.client_pid.or(cpid);
                    conn.observe(&obs, &mut idgen);
                }
                None => {
                    self.next_conn += 1;
                    let mut conn = Conn {
                        id: self.next_conn,
                        key: key.clone(),
                        component: server.id.clone(),
                        role: server.role,
                        server_pid: e.pid,
                        client_pid: cpid,
                        client_component,
                        first_seen_ms: t,
                        last_seen_ms: t,
                        closed_ms: None,
                        tcp_state: e.state,
                        in_total: 0,
                        out_total: 0,
                        last_in_ms: None,
                        last_out_ms: None,
                        exchanges: VecDeque::new(),
                    };
                    conn.first_observation(&obs, &mut idgen);
                    self.conns.insert(key, conn);
                }
            }
        }
        // A degraded table may be missing namespaces: only a complete one proves a close.
        if status == Status::Ok {
            let gone: Vec<ConnKey> = self
                .conns
                .keys()
                .filter(|k| !present.contains(*k))
                .cloned()
                .collect();
            for k in gone {
                if let Some(mut c) = self.conns.remove(&k) {
                    c.close(t);
                    self.closed.push_back(c);
                }
            }
        }
        let closed_now: Vec<ConnKey> = self
            .conns
            .iter()
            .filter(|(_, c)| c.closed_ms.is_some() && !present.contains(&c.key))
            .map(|(k, _)| k.clone())
            .collect();
        for k in closed_now {
            if let Some(c) = self.conns.remove(&k) {
                self.closed.push_back(c);
            }
        }
        links::link(self, t);
        for c in &self.topology.components {
            let counts = per_comp.get(&c.id);
            let pt = CountPoint {
                t_ms: t,
                established: Some(
                    counts
                        .and_then(|m| m.get("ESTABLISHED"))
                        .copied()
                        .unwrap_or(0),
                ),
                close_wait: Some(
                    counts
                        .and_then(|m| m.get("CLOSE_WAIT"))
                        .copied()
                        .unwrap_or(0),
                ),
                fds: None,
                threads: None,
            };
            self.counts.entry(c.id.clone()).or_default().push_back(pt);
        }
        self.latest_sockets = Some(table.clone());
    }

    fn ingest_processes(&mut self, t: Millis, procs: &[ProcessFacts]) {
        let comps: Vec<Component> = self.topology.components.clone();
        for c in &comps {
            let Some(main) = c.main_pid else { continue };
            let facts = procs.iter().find(|p| p.pid == main);
            let ident = facts.map(|p| match p.start_ticks {
                Some(st) => format!("{}:{}", p.pid, st),
                None => p.pid.to_string(),
            });
            match (self.identities.get(&c.id).cloned(), ident) {
                // The start time could not be read this time (a transient /proc error): the
                // same pid is the same process until a readable start time says otherwise.
                (Some(before), Some(after))
                    if !after.contains(':') && before.starts_with(&format!("{after}:")) => {}
                (Some(before), Some(after)) if before != after => {
                    // "123" (pid only, from a topology change) -> "123:456" is no restart.
                    if !after.starts_with(&format!("{before}:")) {
                        self.push_restart(RestartEvent {
                            t_ms: t,
                            component: c.id.clone(),
                            role: c.role,
                            before,
                            after: Some(after.clone()),
                        });
                    }
                    self.identities.insert(c.id.clone(), after);
                }
                (None, Some(after)) => {
                    self.identities.insert(c.id.clone(), after);
                }
                // Main process gone. Report once; discovery will bring the successor.
                (Some(before), None) if facts.is_none() && !before.ends_with(":gone") => {
                    self.push_restart(RestartEvent {
                        t_ms: t,
                        component: c.id.clone(),
                        role: c.role,
                        before: before.clone(),
                        after: None,
                    });
                    self.identities
                        .insert(c.id.clone(), format!("{before}:gone"));
                }
                _ => {}
            }
            let mut fds = 0u32;
            let mut threads = 0u32;
            let mut any = false;
            for p in procs.iter().filter(|p| c.pids.contains(&p.pid)) {
                if let Some(f) = p.fd_count {
                    fds += f;
                    any = true;
                }
                if let Some(th) = &p.threads {
                    threads += th.len() as u32;
                }
            }
            let q = self.counts.entry(c.id.clone()).or_default();
            q.push_back(CountPoint {
                t_ms: t,
                established: None,
                close_wait: None,
                fds: any.then_some(fds),
                threads: (threads > 0).then_some(threads),
            });
        }
        self.latest_processes = procs.to_vec();
    }

    fn ingest_metrics(&mut self, t: Millis, scrapes: &[MetricsScrape]) {
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
        let from = now - self.thresholds.rate_window_ms;
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

    fn latest_metrics(&self, component: &str, now: Millis) -> Option<&MetricsPoint> {
        self.metrics
            .get(component)?
            .iter()
            .rev()
            .find(|p| p.t_ms <= now && now - p.t_ms <= self.thresholds.stale_after_ms)
    }

    /// The router's in-flight count for a component, by the component's URL.
    fn router_active_for(&self, c: &Component, now: Millis) -> Option<f64> {
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

    fn thread_windows(&self, c: &Component, now: Millis) -> Vec<ThreadWindow> {
        let from = now - self.window_ms;
        let mut by_tid: BTreeMap<(i32, i32), ThreadWindow> = BTreeMap::new();
        for cap in self
            .stacks
            .iter()
            .filter(|s| s.t_ms >= from && s.t_ms <= now && c.pids.contains(&s.pid))
        {
            if cap.error.is_some() || cap.skipped.is_some() {
                continue;
            }
            for th in &cap.threads {
                let w = by_tid.entry((cap.pid, th.tid)).or_insert(ThreadWindow {
                    pid: cap.pid,
                    tid: th.tid,
                    name: th.name.clone(),
                    states: Vec::new(),
                    top_frames: Vec::new(),
                    frames: Vec::new(),
                    rule: None,
                    decided_by: None,
                });
                w.states.push(th.state.clone());
                w.rule.clone_from(&th.rule);
                w.decided_by.clone_from(&th.decided_by);
                w.top_frames
                    .push(th.frames.first().map(|f| f.render()).unwrap_or_default());
                w.frames = th.frames.iter().map(|f| f.render()).collect();
            }
        }
        by_tid.into_values().collect()
    }

    fn latest_gpu(&self, now: Millis) -> Option<&GpuReading> {
        self.gpu
            .iter()
            .rev()
            .find(|(t, _)| *t <= now && now - *t <= self.thresholds.stale_after_ms)
            .map(|(_, g)| g)
    }

    /// Component state at `now`.
    pub fn component_state(&self, c: &Component, now: Millis) -> ComponentState {
        let latest = self.latest_metrics(&c.id, now);
        let mapped = |k: &str| latest.and_then(|p| p.mapped.get(k).copied());
        let loads = latest.and_then(|p| p.loads);
        let pd_mapped: Option<f64> = PD_QUEUE_KEYS
            .iter()
            .filter_map(|k| mapped(k))
            .fold(None, |a, v| Some(a.unwrap_or(0.0) + v));
        let running = match (loads, mapped("running")) {
            (Some(l), _) => Some((l.running, "v1_loads")),
            (None, Some(v)) => Some((v, "metrics")),
            _ => None,
        };
        let queued = match (loads, mapped("queued"), pd_mapped) {
            (Some(l), _, _) => Some((l.waiting + l.pd_queued, "v1_loads")),
            (None, q, pd) if q.is_some() || pd.is_some() => {
                Some((q.unwrap_or(0.0) + pd.unwrap_or(0.0), "metrics"))
            }
            _ => None,
        };
        let gpu_activity = match self.latest_gpu(now) {
            Some(g) => gpu_activity(&self.with_children(c), g, &self.thresholds),
            None => "unknown",
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
        let sockets = self.socket_counts(c);
        ComponentState {
            id: c.id.clone(),
            role: c.role,
            gpu_activity,
            forward_rate,
            idle_rate,
            gen_rate,
            running,
            queued,
            http_active: latest
                .and_then(|p| p.http_active_inference)
                .or_else(|| mapped("http_active")),
            router_active: self.router_active_for(c, now),
            threads: self.thread_windows(&self.with_children(c), now),
            sockets,
            metrics,
        }
    }

    fn socket_counts(&self, c: &Component) -> BTreeMap<String, u32> {
        let mut m = BTreeMap::new();
        if let Some(t) = &self.latest_sockets {
            for e in &t.sockets {
                if e.pid
                    .and_then(|p| self.topology.component_of_pid(p))
                    .is_some_and(|o| o.id == c.id)
                {
                    *m.entry(e.state.as_str().to_string()).or_default() += 1;
                }
            }
        }
        m
    }

    /// The derived state of every exchange at `now` (see the module doc of `exchange`).
    pub fn view(&self, now: Millis) -> View {
        let th = &self.thresholds;
        let components: BTreeMap<String, ComponentState> = self
            .topology
            .components
            .iter()
            .map(|c| (c.id.clone(), self.component_state(c, now)))
            .collect();
        let from = now - self.window_ms;
        let mut states: BTreeMap<String, RequestState> = BTreeMap::new();
        let all: Vec<&Exchange> = self.exchanges().collect();
        let by_id: BTreeMap<&str, &Exchange> = all.iter().map(|x| (x.id.as_str(), *x)).collect();
        // Deepest hops first: a parent is outstanding while a child is.
        let mut comp_order: Vec<(&String, u8)> = components
            .iter()
            .map(|(id, s)| (id, s.role.depth()))
            .collect();
        comp_order.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        for (cid, _) in comp_order {
            let cs = &components[cid];
            let mine: Vec<&Exchange> = all
                .iter()
                .copied()
                .filter(|x| &x.component == cid)
                .collect();
            let mut quiet: Vec<&Exchange> = Vec::new();
            let mut explained = 0.0;
            for x in &mine {
                let st = match x.end {
                    Some(End::Done(_)) => RequestState::Done,
                    Some(End::Closed(_)) => RequestState::Closed,
                    None if !x.started() => {
                        // The in-flight count covers inference requests only; a small GET
                        // (a scrape, a health or load probe) waiting here is not one of them.
                        if !is_probe_sized(x) {
                            explained += 1.0;
                        }
                        RequestState::WaitingFirstByte
                    }
                    None => {
                        let q = now - x.last_out_ms.unwrap_or(now);
                        if q < th.done_quiet_ms {
                            explained += 1.0;
                            RequestState::Streaming
                        } else {
                            quiet.push(x);
                            continue;
                        }
                    }
                };
                states.insert(x.id.clone(), st);
            }
            // Quiet responses: outstanding if a child still is, or if the component's own
            // in-flight count says more requests are open than we can otherwise explain.
            let outstanding_signal = cs
                .http_active
                .or_else(|| {
                    cs.running
                        .filter(|r| r.1 == "v1_loads")
                        .map(|r| r.0 + cs.queued.map_or(0.0, |q| q.0))
                })
                .or(if cs.role == Role::Prefill {
                    None
                } else {
                    cs.router_active
                });
            quiet.sort_by_key(|x| std::cmp::Reverse(x.last_out_ms));
            let mut unexplained = outstanding_signal.map_or(0.0, |o| o - explained);
            for x in quiet {
                let child_open = x.links.iter().any(|l| {
                    states.get(l).is_some_and(|s| {
                        matches!(
                            s,
                            RequestState::WaitingFirstByte
                                | RequestState::Streaming
                                | RequestState::Stalled
                        )
                    }) && by_id.contains_key(l.as_str())
                });
                let outstanding = if child_open {
                    true
                } else if unexplained >= 1.0 {
                    unexplained -= 1.0;
                    true
                } else {
                    false
                };
                let q = now - x.last_out_ms.unwrap_or(now);
                // First seen with the request's last byte and the previous response's last
                // byte in the same kernel tick (tcp_info dates them in jiffies), and no byte
                // out since: an open one is a request waiting for its first byte (agents
                // send the next turn the moment a reply ends), not a stopped stream.
                let tie = x.seen_mid_flight
                    && x.bytes_out == 0
                    && x.first_byte_ms
                        .is_some_and(|f| (f - x.request_ms).abs() <= JIFFY_TIE_MS);
                let st = if !outstanding {
                    RequestState::Done
                } else if tie {
                    RequestState::WaitingFirstByte
                } else if q >= th.stall_after_ms {
                    RequestState::Stalled
                } else {
                    RequestState::Streaming
                };
                states.insert(x.id.clone(), st);
            }
        }
        // Finished requests older than the window are left out, unless a reported request
        // links to them (or they link to one): a chain is shown whole.
        let mut keep: BTreeSet<&str> = BTreeSet::new();
        for x in &all {
            let Some(state) = states.get(&x.id) else {
                continue;
            };
            let finished = matches!(state, RequestState::Done | RequestState::Closed);
            if x.request_ms <= now
                && !(finished && x.end_ms().unwrap_or(x.last_activity_ms()) < from)
            {
                keep.insert(x.id.as_str());
            }
        }
        let mut frontier: Vec<&str> = keep.iter().copied().collect();
        for _ in 0..8 {
            let mut next = Vec::new();
            for id in frontier {
                let Some(x) = by_id.get(id) else { continue };
                for rel in x
                    .links
                    .iter()
                    .map(String::as_str)
                    .chain(x.parent.as_deref())
                {
                    if by_id.contains_key(rel) && keep.insert(rel) {
                        next.push(rel);
                    }
                }
            }
            if next.is_empty() {
                break;
            }
            frontier = next;
        }
        let mut requests = Vec::new();
        for x in &all {
            let Some(state) = states.get(&x.id).copied() else {
                continue;
            };
            if !keep.contains(x.id.as_str()) || x.request_ms > now {
                continue;
            }
            let age_ms = now - x.request_ms;
            let idle_out_ms = now - x.last_out_ms.unwrap_or(x.request_ms).max(x.request_ms);
            requests.push(RequestView {
                x: (*x).clone(),
                state,
                age_ms,
                idle_out_ms,
            });
        }
        let mut idle = Vec::new();
        for c in self.conns.values().filter(|c| c.closed_ms.is_none()) {
            let busy = c.exchanges.back().is_some_and(|x| {
                states
                    .get(&x.id)
                    .is_some_and(|s| !matches!(s, RequestState::Done | RequestState::Closed))
            });
            if busy {
                continue;
            }
            let last = c.last_in_ms.max(c.last_out_ms).unwrap_or(c.first_seen_ms);
            idle.push(Request {
                id: format!("c{}", c.id),
                component: c.component.clone(),
                client: c.key.remote.clone(),
                server: c.key.local.clone(),
                state: RequestState::Idle,
                age_ms: (now - c.first_seen_ms).max(0) as f64,
                bytes_in: 0,
                bytes_out: 0,
                idle_out_ms: (now - last).max(0) as f64,
                links: Vec::new(),
                role: Some(c.role),
                client_component: c.client_component.clone(),
                link_confidence: None,
                started_at: None,
            });
        }
        let index = requests
            .iter()
            .enumerate()
            .map(|(i, r)| (r.x.id.clone(), i))
            .collect();
        let sockets_fresh = self
            .last_sockets_ms
            .is_some_and(|t| now - t <= self.thresholds.stale_after_ms);
        View {
            now,
            requests,
            idle,
            components,
            sockets_fresh,
            index,
        }
    }

    /// Everything a snapshot needs, with the findings computed by the caller (the pipeline
    /// step `pipeline::parts` runs the detectors over `view` and calls this).
    pub fn parts_with(
        &self,
        now: Millis,
        view: &View,
        findings: Vec<crate::model::Finding>,
    ) -> SnapshotParts {
        let mut requests: Vec<Request> = view
            .requests
            .iter()
            .map(|r| {
                let conf =
                    r.x.links
                        .iter()
                        .filter_map(|l| view.request(l).and_then(|c| c.x.parent_confidence))
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
                    links: r.x.links.clone(),
                    role: Some(r.x.role),
                    client_component: r.x.client_component.clone(),
                    link_confidence: conf,
                    started_at: Some(crate::clock::rfc3339(r.x.request_ms)),
                }
            })
            .collect();
        requests.extend(view.idle.iter().cloned());
        let mut sources = BTreeMap::new();
        for k in SourceKind::ALL {
            let st = match self.seen.get(&k) {
                Some(s) if now - s.last_t_ms > self.thresholds.stale_after_ms * 4 => {
                    SourceStatus::degraded(format!("last sample {} ms old", now - s.last_t_ms))
                        .worst(s.status.clone())
                }
                Some(s) => s.status.clone(),
                None => SourceStatus::unavailable("no sample yet"),
            };
            sources.insert(k, st);
        }
        let mut gpus = Vec::new();
        if let Some(g) = self.latest_gpu(now) {
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
                            component: self
                                .topology
                                .component_of_pid(p.pid as i32)
                                .map(|c| c.id.clone()),
                        })
                        .collect(),
                    uuid: d.uuid.clone(),
                    mem_used_bytes: d.mem_used_bytes,
                    activity: Some(device_activity(d, &self.thresholds).to_string()),
                });
            }
        }
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
        let extras = view
            .components
            .values()
            .map(|cs| {
                (
                    cs.id.clone(),
                    ComponentExtras {
                        sockets: cs.sockets.clone(),
                        metrics: cs.metrics.clone(),
                        gpu_activity: Some(cs.gpu_activity.to_string()),
                    },
                )
            })
            .collect();
        // Titled processes (setproctitle) keep their args and env in a launcher or parent:
        // those pids' facts are what the snapshot shows for them.
        let pids: BTreeSet<i32> = crate::sources::processes::topology_pids(&self.topology)
            .into_iter()
            .collect();
        let processes = self
            .latest_processes
            .iter()
            .filter(|p| pids.contains(&p.pid))
            .cloned()
            .collect();
        let mut raw = BTreeMap::new();
        if let Some(s) = &self.latest_sockets {
            raw.insert(
                "sockets".to_string(),
                serde_json::to_value(s).unwrap_or_default(),
            );
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
        let window_ms = match self.first_t {
            Some(f) => (now - f).clamp(0, self.window_ms) as u64,
            None => 0,
        };
        SnapshotParts {
            taken_at_ms: now,
            window_ms,
            sources,
            topology: self.topology.clone(),
            processes,
            requests,
            gpus,
            threads,
            findings,
            extras,
            config_changed: self.config_changes.clone(),
            raw,
        }
    }

    /// Open connections and those closed at or after `since`: every exchange that started
    /// at or after `since` is on one of them (a connection is last seen no earlier than
    /// its newest exchange started). What per-sample work iterates, so its cost follows
    /// the traffic of the last seconds, not the length of the history.
    pub(crate) fn conns_since(&self, since: Millis) -> impl Iterator<Item = &Conn> {
        self.closed
            .iter()
            .filter(move |c| c.last_seen_ms >= since)
            .chain(self.conns.values())
    }

    pub(crate) fn conns_since_mut(&mut self, since: Millis) -> impl Iterator<Item = &mut Conn> {
        self.closed
            .iter_mut()
            .filter(move |c| c.last_seen_ms >= since)
            .chain(self.conns.values_mut())
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

/// The GPU source's thresholds, from the detectors' named ones.
fn activity_thresholds(th: &Thresholds) -> crate::sources::gpu::ActivityThresholds {
    crate::sources::gpu::ActivityThresholds {
        busy_util_pct: th.busy_util_pct,
        spin_util_pct: th.spin_util_pct,
        idle_power_ratio: th.spin_power_frac,
    }
}

/// GPU activity of one device (every process on it), by the GPU source's verdict.
pub fn device_activity(d: &crate::model::GpuDevice, th: &Thresholds) -> &'static str {
    let inputs = crate::sources::gpu::ActivityInputs::from_device(d, &[], None);
    crate::sources::gpu::gpu_activity(&inputs, &activity_thresholds(th))
        .0
        .as_str()
}

/// GPU activity of a component: its GPUs (from the topology, or NVML's process list),
/// judged by the GPU source's verdict (`sources::gpu::component_activity`), so the snapshot
/// and the detectors agree with what the GPU view shows.
pub fn gpu_activity(c: &Component, g: &GpuReading, th: &Thresholds) -> &'static str {
    let gpus: Vec<u32> = g
        .devices
        .iter()
        .filter(|d| {
            c.gpus.contains(&d.index)
                || d.processes.iter().any(|p| c.pids.contains(&(p.pid as i32)))
        })
        .map(|d| d.index)
        .collect();
    if gpus.is_empty() {
        return "unknown";
    }
    let pids: Vec<u32> = c.pids.iter().map(|p| *p as u32).collect();
    crate::sources::gpu::component_activity(g, &gpus, &pids, None, &activity_thresholds(th))
        .0
        .as_str()
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
