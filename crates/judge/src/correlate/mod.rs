//! Correlation: samples -> exchanges (per-request lifecycle on each TCP connection), hop
//! links (client -> proxy -> router -> prefill + decode), and component state over time.
//!
//! [`Correlator`] is fed [`Sample`]s in time order (live or replayed) and keeps a bounded
//! history. Everything derived is computed on demand by [`Correlator::view`] /
//! [`Correlator::parts_with`], so the same samples always give the same answer.
//!
//! The metrics it reads are listed in docs/findings.md ("Inputs the correlator consumes");
//! its files in docs/architecture.md ("judge").

pub mod blame;
mod budget;
mod channels;
pub use budget::Census;
mod engine_witnesses;
mod exchange;
mod footprint;
mod gpu;
mod gpu_pids;
mod gpu_verdict;
pub mod kind_witnesses;
mod kv_stall;
mod links;
mod lookup;
mod metrics;
mod outbound;
mod parts;
pub use parts::MAX_DONE_LISTED;
mod probe_units;
mod processes;
mod raw_sockets;
mod requests;
mod ring;
mod sockets;
mod stacks;
mod state;
pub mod verdict;
mod view;
mod waiting;

pub use engine_witnesses::EngineLook;
pub use exchange::HEADERS_ONLY_MAX_BYTES;
pub use gpu::{device_activity, gpu_activity};
pub use gpu_pids::{component_gpus, map_gpu_pids, GpuPidMapping};
pub use gpu_verdict::{component_activity, ActivityThresholds, GpuActivity};
pub use kind_witnesses::LegWitnesses;
pub use kv_stall::{kv_stall_due, KvStall};
pub use metrics::{
    is_probe_endpoint, probe_failed, summarize_loads, LoadsSummary, MetricsPoint, PD_QUEUE_KEYS,
};
pub use requests::{pd_cause, pending_verdict, BusyNote, LogicalView, PendingVerdict, StuckLeg};
pub use stacks::{span_text, ThreadWindow};
pub use state::{signals_text, ComponentState, CountSource, WorkSignal};
pub use verdict::{Testimony, Witness, Witnesses};
pub use view::{
    is_probe_sized, LegName, RequestView, View, JIFFY_TIE_MS, MIN_INFERENCE_REQUEST_BYTES,
};

use crate::clock::Millis;
use crate::model::{
    Change, GpuReading, MetricsScrape, Payload, ProcessFacts, Role, Sample, SocketTable,
    SourceKind, SourceStatus, StackCapture, Status, Thresholds, Topology,
};
use exchange::{Conn, ConnKey, Exchange};
use ring::Ring;
use std::borrow::Cow;
use std::collections::{BTreeMap, VecDeque};

/// What the latest sample of a source said, as the model saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceSeen {
    pub status: SourceStatus,
    pub last_t_ms: Millis,
    pub took_ms: u64,
    pub samples: u64,
}

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

/// The correlator.
#[derive(Debug, Clone)]
pub struct Correlator {
    pub thresholds: Thresholds,
    /// How much history is kept (ring buffers are cut by time).
    pub history_ms: i64,
    /// And by estimated bytes over all buffers, oldest entry first (each buffer keeps its
    /// newest). See `footprint.rs`.
    pub history_bytes: usize,
    /// The snapshot window: stack dumps, rates and done requests within it are reported.
    pub window_ms: i64,
    /// Client pids whose connections are not requests (the tool's own metrics scrapes).
    pub ignore_client_pids: Vec<i32>,
    topology: Topology,
    conns: BTreeMap<ConnKey, Conn>,
    closed: Ring<Conn>,
    next_x: u64,
    next_conn: u64,
    /// Socket tables tracked so far (the number of the newest: `Conn::in_table`).
    tables: u64,
    last_t: Millis,
    first_t: Option<Millis>,
    seen: BTreeMap<SourceKind, SourceSeen>,
    latest_processes: Vec<ProcessFacts>,
    identities: BTreeMap<String, String>,
    restarts: VecDeque<RestartEvent>,
    counts: BTreeMap<String, Ring<CountPoint>>,
    gpu: Ring<(Millis, GpuReading)>,
    stacks: Ring<StackCapture>,
    metrics: BTreeMap<String, Ring<MetricsPoint>>,
    latest_scrapes: BTreeMap<String, MetricsScrape>,
    latest_sockets: Option<SocketTable>,
    /// Each component's socket counts by TCP state in `latest_sockets`.
    latest_socket_counts: sockets::SocketCounts,
    config_changes: Vec<Change>,
    /// Hop linking: exchange numbers from `.0` are tried this pass (`.1` next pass).
    pub(crate) link_cursor: (u64, u64),
    /// Time of the newest usable socket table.
    last_sockets_ms: Option<Millis>,
    /// The probe sizes each server component has answered (`probe_units.rs`).
    probe_units: FastMap<String, probe_units::ProbeUnits>,
    /// Channel ports (component id, port) whose connections were seen to be KV transfer
    /// streams (`channels.rs`): once seen, for as long as the component listens there.
    kv_ports: FastSet<(String, u16)>,
}

impl Default for Correlator {
    fn default() -> Self {
        Correlator::new(Thresholds::default())
    }
}

/// The number `n` of an exchange id `x<n>` (the model's ids, made in `Conn::new_exchange`).
pub(crate) fn exchange_num(id: &str) -> Option<u64> {
    id.strip_prefix('x')?.parse().ok()
}

/// The id of exchange number `n` (`x<n>`), as outputs name it.
pub(crate) fn exchange_id(n: u64) -> String {
    format!("x{n}")
}

/// The correlator's hash maps: foldhash (seeded per process), since its keys are its own ids
/// and addresses, probed thousands of times per view.
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
pub(crate) type FastSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

/// Most closed connections kept (on top of the time bound).
const MAX_CLOSED_CONNS: usize = 4096;
/// Most metrics points per component / GPU readings / stack captures kept.
const MAX_POINTS: usize = 4096;
/// Default byte budget of the history ([`Correlator::history_bytes`]).
pub const DEFAULT_HISTORY_BYTES: usize = 32 << 20;

impl Correlator {
    pub fn new(thresholds: Thresholds) -> Correlator {
        Correlator {
            thresholds,
            history_ms: 10 * 60 * 1000,
            history_bytes: DEFAULT_HISTORY_BYTES,
            window_ms: 30 * 1000,
            ignore_client_pids: vec![std::process::id() as i32],
            topology: Topology::default(),
            conns: BTreeMap::new(),
            closed: Ring::default(),
            next_x: 0,
            next_conn: 0,
            tables: 0,
            last_t: 0,
            first_t: None,
            seen: BTreeMap::new(),
            latest_processes: Vec::new(),
            identities: BTreeMap::new(),
            restarts: VecDeque::new(),
            counts: BTreeMap::new(),
            gpu: Ring::default(),
            stacks: Ring::default(),
            metrics: BTreeMap::new(),
            latest_scrapes: BTreeMap::new(),
            latest_sockets: None,
            latest_socket_counts: BTreeMap::new(),
            config_changes: Vec::new(),
            link_cursor: (0, 0),
            last_sockets_ms: None,
            probe_units: FastMap::default(),
            kv_ports: FastSet::default(),
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
                    // Note the pid change now so a restart is never missed.
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
        self.recount_sockets();
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
        self.counts.get(component).map(Ring::as_deque)
    }

    pub fn metrics_history(&self, component: &str) -> Option<&VecDeque<MetricsPoint>> {
        self.metrics.get(component).map(Ring::as_deque)
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
        self.exchanges_shared().map(std::sync::Arc::as_ref)
    }

    /// [`Correlator::exchanges`], each as the shared allocation a view's request holds.
    pub(crate) fn exchanges_shared(&self) -> impl Iterator<Item = &std::sync::Arc<Exchange>> {
        self.closed
            .iter()
            .chain(self.conns.values())
            .flat_map(|c| c.exchanges.iter())
    }

    /// Connections the model keeps state for (open, and closed ones still in history): only
    /// the stack's (the server side of a component's listen address).
    pub fn connections_tracked(&self) -> usize {
        self.conns.len() + self.closed.len()
    }

    /// The number of the newest exchange created so far.
    pub(crate) fn next_exchange_num(&self) -> u64 {
        self.next_x
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
        self.note_seen(s);
        self.ingest_payload(s.t_ms, s.status.status, Cow::Borrowed(&s.payload));
    }

    /// [`Correlator::ingest`] of a sample the caller is done with: what the model keeps of it
    /// (the stack's sockets, a GPU reading) is moved in, not copied.
    pub fn ingest_owned(&mut self, s: Sample) {
        self.note_seen(&s);
        self.ingest_payload(s.t_ms, s.status.status, Cow::Owned(s.payload));
    }

    /// One payload into its source's part of the model; kept parts are copied only when
    /// the payload is borrowed.
    fn ingest_payload(&mut self, t: Millis, status: Status, payload: Cow<'_, Payload>) {
        let usable = status != Status::Unavailable;
        match payload {
            Cow::Borrowed(Payload::Sockets(table)) if usable => {
                self.ingest_sockets(t, Cow::Borrowed(table), status)
            }
            Cow::Owned(Payload::Sockets(table)) if usable => {
                self.ingest_sockets(t, Cow::Owned(table), status)
            }
            Cow::Borrowed(Payload::Gpu(g)) if usable => self.gpu.push_back((t, g.clone())),
            Cow::Owned(Payload::Gpu(g)) if usable => self.gpu.push_back((t, g)),
            other => match &*other {
                Payload::Processes(p) if usable => self.ingest_processes(t, p),
                Payload::Stacks(caps) if usable => self.ingest_stacks(t, caps),
                Payload::Metrics(scrapes) => self.ingest_metrics(t, scrapes),
                _ => {}
            },
        }
        self.evict();
    }

    /// A sample's time, status and duration, kept per source whatever its payload.
    fn note_seen(&mut self, s: &Sample) {
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
        if matches!(s.payload, Payload::Sockets(_)) && s.status.status != Status::Unavailable {
            self.last_sockets_ms = Some(self.last_sockets_ms.map_or(t, |l| l.max(t)));
        }
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
        // components gone for longer than the history leave no empty buffer behind
        self.metrics.retain(|_, q| !q.is_empty());
        self.counts.retain(|_, q| !q.is_empty());
        self.evict_to_budget();
    }

    /// Open connections and those closed at or after `since`: every exchange that started
    /// at or after `since` is on one of them. Per-sample work iterates these, so its cost
    /// follows recent traffic, not the history's length.
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
}
