//! The daemon: samples continuously, keeps the bounded in-memory [`Correlator`], writes a
//! rotated recording, takes baselines of every component's facts (on start, and when a
//! component appears or restarts), and serves its live state on a Unix socket readable by
//! its owner only.
//!
//! Socket protocol: one request line, one JSON answer line, then the daemon closes.
//! `snapshot [SECONDS]` -> `{schema, parts: SnapshotParts, sampler: {kind: SourceStats}}`
//! (requests of the last SECONDS, default the model's window);
//! `json [SECONDS]` -> the snapshot itself (`wedgewatch.snapshot/1`, assembled and redacted
//! here, pretty-printed: what `wedgewatch snapshot --json` prints; `json` alone is kept
//! and built ahead while clients poll it, [`kept_answer`]);
//! `perfetto [SECONDS]` -> Chrome trace-event JSON of the history (see `export`);
//! `baseline` -> `{oldest, latest, known_good, count}` (`latest` = newest facts of every
//! component, `known_good` = the newest that ran healthy, [`known_good`]);
//! `sources` -> sampler stats; `ping` -> `{ok, pid}`. Errors: `{error: "..."}`.
//! Requests are parsed by [`protocol::parse_request`]; both ends check the other's uid
//! ([`socket`]); one daemon per state directory ([`lock`]).

pub mod answer;
pub mod dirs;
pub mod exporter;
pub mod incidents;
pub mod kept_answer;
pub mod known_good;
pub mod lock;
pub mod log;
pub mod pass;
pub mod protocol;
pub mod socket;

use crate::clock::{Clock, Millis};
use crate::correlate::Correlator;
use crate::detect::Thresholds;
use crate::error::{Error, Result};
use crate::model::{Payload, Sample, SourceKind, Topology};
use crate::record::{Baseline, Record, RecordingWriter, RotationPolicy};
use crate::safe_fs;
use crate::sampler::kick::StacksKick;
use crate::sampler::pace::Pace;
use crate::sampler::{Sampler, StatsHandle};
use crate::sources::{BoxFuture, Source};
pub use dirs::{default_runtime_dir, default_state_dir};
use kept_answer::{BuildAhead, KeptAnswer};
use protocol::{parse_request, Request, MAX_REQUEST};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio::sync::{mpsc, watch};

pub const DAEMON_SCHEMA: &str = "wedgewatch.daemon/1";
/// Largest answer a client reads.
const MAX_ANSWER: u64 = 256 << 20;
/// Baselines kept in memory besides the first one.
const KEEP_BASELINES: usize = 16;
/// How long a stopping daemon waits for its incidents' thread to close what is open.
const INCIDENTS_STOP: Duration = Duration::from_secs(1);

/// Discovery hook: the integrator plugs in `discover::discover`.
pub type DiscoverFn = Arc<dyn Fn() -> BoxFuture<'static, Result<Topology>> + Send + Sync>;

#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// Holds the recording (`recording/`) and, by default, the socket.
    pub state_dir: PathBuf,
    pub socket_path: PathBuf,
    /// None: keep history in memory only.
    pub rotation: Option<RotationPolicy>,
    pub history_ms: i64,
    /// The history's byte budget (estimated; oldest entries of all buffers evicted first).
    pub history_bytes: usize,
    pub window_ms: i64,
    pub thresholds: Thresholds,
    pub rediscover_every_ms: u64,
    /// How often findings and source health are evaluated for the log ([`log`]) and the
    /// exporter.
    pub log_every_ms: u64,
    /// Serve `GET /metrics` (Prometheus text) here ([`exporter`]); `None`: no exporter.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Keep a bundle of each critical finding's moment ([`incidents`]); `None`: none.
    pub incidents: Option<incidents::IncidentPolicy>,
}

impl DaemonConfig {
    pub fn new(state_dir: PathBuf) -> DaemonConfig {
        DaemonConfig {
            socket_path: state_dir.join("daemon.sock"),
            state_dir,
            rotation: Some(RotationPolicy::default()),
            history_ms: 10 * 60 * 1000,
            history_bytes: crate::correlate::DEFAULT_HISTORY_BYTES,
            window_ms: 30 * 1000,
            thresholds: Thresholds::default(),
            rediscover_every_ms: 10_000,
            // Findings take 20-30 s to open (thresholds); a line 2 s late is fine, and one
            // detector pass every 2 s is a small cost beside sampling.
            log_every_ms: 2_000,
            metrics_listen: None,
            incidents: Some(incidents::IncidentPolicy::default()),
        }
    }
    pub fn recording_dir(&self) -> PathBuf {
        self.state_dir.join("recording")
    }
    /// Where incident bundles are kept ([`incidents`]).
    pub fn incidents_dir(&self) -> PathBuf {
        self.state_dir.join(incidents::INCIDENTS_DIR)
    }
}

impl Default for DaemonConfig {
    /// The per-user (or, for root, the service) defaults of [`dirs`].
    fn default() -> Self {
        DaemonConfig {
            socket_path: default_runtime_dir().join("daemon.sock"),
            ..DaemonConfig::new(default_state_dir())
        }
    }
}

/// Samples waiting for the sampling loop, at most: a source waits for a place before it
/// samples, so a loop held up holds this many samples, not a growing queue of socket tables.
/// Five sources, one waiting sample each, and a second of the fast ones.
const SAMPLE_QUEUE: usize = 8;

/// What runs slower while the daemon suspects nothing (`sampler::pace`); every detector
/// pass sets their alert.
struct Paces {
    /// The sources whose calm period is slower than their own.
    sources: Vec<(SourceKind, Arc<Pace>)>,
    pass: Arc<Pace>,
}

impl Paces {
    fn all(&self) -> Vec<Arc<Pace>> {
        self.sources
            .iter()
            .map(|(_, p)| p)
            .chain([&self.pass])
            .cloned()
            .collect()
    }
}

/// What the daemon shares between its sampling loop and its socket.
#[derive(Debug)]
pub struct Shared {
    pub model: Correlator,
    /// The first baseline, then the most recent ones.
    pub baselines: Vec<Baseline>,
    /// Newest known facts of every component (baselines merged).
    pub latest_facts: Option<Baseline>,
    pub started_ms: Millis,
    /// The last known-good facts, what `config_changed` compares against ([`known_good`]).
    pub known_good: known_good::KnownGood,
    /// Where the known-good facts are kept (the state directory; `None`: not kept).
    pub state_dir: Option<PathBuf>,
    /// Known-good facts not yet written to the recording.
    pub unrecorded: Option<Baseline>,
}

impl Shared {
    /// A daemon's state before its first sample.
    pub fn new(model: Correlator, started_ms: Millis) -> Shared {
        let probation = model
            .thresholds
            .correlate
            .wedged_after_ms
            .max(model.thresholds.correlate.stall_after_ms);
        Shared {
            model,
            baselines: Vec::new(),
            latest_facts: None,
            started_ms,
            known_good: known_good::KnownGood::new(probation),
            state_dir: None,
            unrecorded: None,
        }
    }

    /// `config_changed` from the reference (the known-good facts, else the first
    /// baseline) to the newest facts.
    fn compare(&mut self) {
        let reference = self.known_good.reference(self.baselines.first());
        if let (Some(r), Some(latest)) = (reference, &self.latest_facts) {
            let changes = r.changes_to(latest);
            self.model.set_config_changes(changes);
        }
    }

    /// After a detector pass at `now`: facts that ran healthy become the known-good ones,
    /// compared against from now on, kept in the state directory and the recording.
    pub fn after_pass(&mut self, now: Millis, findings: &[crate::model::Finding]) {
        let Some(good) = self.known_good.on_pass(now, findings) else {
            return;
        };
        tracing::info!(components = good.components.len(), "known-good baseline");
        self.compare();
        if let Some(dir) = &self.state_dir {
            if let Err(e) = known_good::save(dir, &good) {
                tracing::warn!("known-good baseline not kept: {e}");
            }
        }
        self.unrecorded = Some(good);
    }
}

pub struct Daemon {
    config: DaemonConfig,
    clock: Arc<dyn Clock>,
    discover: DiscoverFn,
    sources: Vec<(Arc<dyn Source>, u64, u64)>,
    shared: Arc<Mutex<Shared>>,
    /// Runs the stacks source at once on a snapshot asked for while a suspicion is open.
    stacks_kick: Arc<StacksKick>,
    /// The newest detector pass ([`pass`]).
    latest: pass::Latest,
    /// The newest `json` answer, built ahead while clients ask ([`kept_answer`]).
    kept: Arc<KeptAnswer>,
}

fn lock(s: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether two topologies differ in what matters for baselines (components, main pids).
fn topology_key(t: &Topology) -> Vec<(String, Option<i32>, Vec<i32>)> {
    let mut v: Vec<_> = t
        .components
        .iter()
        .map(|c| (c.id.clone(), c.main_pid, c.pids.clone()))
        .collect();
    v.sort();
    v
}

impl Daemon {
    pub fn new(config: DaemonConfig, clock: Arc<dyn Clock>, discover: DiscoverFn) -> Daemon {
        let mut model = Correlator::new(config.thresholds.clone());
        model.history_ms = config.history_ms;
        model.history_bytes = config.history_bytes;
        model.window_ms = config.window_ms;
        let started_ms = clock.now_ms();
        let kept = Arc::new(KeptAnswer::for_socket_period(
            config.thresholds.sampling.sockets_calm_ms,
        ));
        // At most one kicked stacks tick per half tick, however often snapshots are asked.
        let half_tick = config.thresholds.sampling.stacks_tick_ms / 2;
        let stacks_kick = StacksKick::new(Duration::from_millis(
            u64::try_from(half_tick).unwrap_or(1_000),
        ));
        Daemon {
            config,
            clock,
            discover,
            sources: Vec::new(),
            stacks_kick,
            latest: pass::Latest::default(),
            kept,
            shared: Arc::new(Mutex::new(Shared::new(model, started_ms))),
        }
    }

    pub fn add_source(&mut self, source: Arc<dyn Source>, every_ms: u64, timeout_ms: u64) {
        self.sources.push((source, every_ms, timeout_ms));
    }

    pub fn add_default_source(&mut self, source: Arc<dyn Source>) {
        let (e, t) = crate::sampler::default_cadence(source.kind());
        self.add_source(source, e, t);
    }

    /// The suspicion of the daemon's model (`policy::suspicion`), for its adaptive stacks
    /// source: the newest detector pass's ([`pass`], at most `log_every_ms` old), read at
    /// each stacks tick without the model's lock or a view of its own.
    pub fn suspicion_fn(&self) -> crate::sampler::adaptive::SuspicionFn {
        let latest = self.latest.clone();
        let kick = self.stacks_kick.clone();
        Arc::new(move || {
            let s = latest.suspicion();
            kick.set_suspected(!s.is_empty());
            s
        })
    }

    /// The daemon's paces: its socket table, GPU, process facts, stacks tick and detector
    /// pass run slower while nothing is suspected (`sockets_calm_ms`, `gpu_calm_ms`,
    /// `processes_calm_ms`, `stacks_calm_ms`, `pass_calm_ms`).
    fn paces(&self) -> Paces {
        let sampling = &self.config.thresholds.sampling;
        let every_of = |kind: SourceKind| {
            self.sources
                .iter()
                .find(|(s, ..)| s.kind() == kind)
                .map(|(_, every, _)| *every)
        };
        let pass_every = self.config.log_every_ms.max(100);
        // A calm pass never outlasts the silence that makes a request suspect: the first
        // suspicion of a wedge (or stall) is seen within its fraction of the threshold.
        let t = &self.config.thresholds;
        let pass_calm = sampling.pass_calm_ms.min(
            sampling.silent_after(
                t.correlate
                    .wedged_soonest_ms()
                    .min(t.correlate.stall_after_ms),
            ),
        );
        let calm = [
            (SourceKind::Sockets, sampling.sockets_calm_ms),
            (SourceKind::Gpu, sampling.gpu_calm_ms),
            (SourceKind::Processes, sampling.processes_calm_ms),
            (SourceKind::Stacks, sampling.stacks_calm_ms),
        ];
        Paces {
            sources: calm
                .into_iter()
                .filter_map(|(kind, calm_ms)| {
                    let every = every_of(kind)?;
                    Some((kind, Pace::calm_slower(calm_ms, every)?))
                })
                .collect(),
            pass: Pace::calm_slower(pass_calm, pass_every)
                .unwrap_or_else(|| Pace::new(pass_every, pass_every)),
        }
    }

    /// The live state (for an in-process TUI).
    pub fn shared(&self) -> Arc<Mutex<Shared>> {
        self.shared.clone()
    }

    /// Runs until `shutdown` turns true. The socket file is removed on the way out if it is
    /// still ours. The state directory is verified (or created 0700) and locked first.
    pub async fn run(self, shutdown: watch::Receiver<bool>) -> Result<()> {
        let cfg = self.config.clone();
        let state_dir = safe_fs::private_dir(&cfg.state_dir)?;
        let _lock = lock::lock_state_dir(&state_dir)?;
        let (listener, bound) = socket::bind_private(&cfg.socket_path).await?;
        let exporter = match cfg.metrics_listen {
            Some(addr) => Some(exporter::bind(addr).await?),
            None => None,
        };
        let metrics_at = exporter
            .as_ref()
            .and_then(|l| l.local_addr().ok())
            .map_or_else(|| "off".to_string(), |a| format!("http://{a}/metrics"));
        let recording = match cfg.rotation {
            Some(_) => cfg.recording_dir().display().to_string(),
            None => "off".to_string(),
        };
        tracing::info!(
            socket = %cfg.socket_path.display(),
            recording = %recording,
            metrics = %metrics_at,
            pid = std::process::id(),
            "daemon started"
        );
        let result = self
            .serve_and_sample(listener, exporter, &state_dir, shutdown)
            .await;
        bound.remove_if_ours();
        match &result {
            Ok(()) => tracing::info!("daemon stopped"),
            Err(e) => tracing::error!("daemon stopped: {e}"),
        }
        result
    }

    async fn serve_and_sample(
        self,
        listener: UnixListener,
        exporter: Option<TcpListener>,
        state_dir: &Path,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<()> {
        let mut discovery = log::HealthTracker::default();
        let topo = self.first_topology(&mut discovery).await;
        let (topo_tx, topo_rx) = watch::channel(topo.clone());
        let paces = self.paces();
        let mut state = LoopState {
            writer: self.open_recording(state_dir, &topo)?,
            topo_key: topology_key(&topo),
            pending_reason: Some("start".to_string()),
            discovery,
            pace: paces.pass.clone(),
        };
        {
            let mut sh = lock(&self.shared);
            sh.model.set_topology(topo);
            // a daemon started after a bad change still compares against its last good state
            sh.known_good.good = known_good::load(state_dir);
            sh.state_dir = Some(state_dir.to_path_buf());
        }

        let mut sampler = Sampler::new(self.clock.clone(), topo_rx);
        for (s, e, t) in &self.sources {
            sampler.add(s.clone(), *e, *t);
        }
        sampler.kick_with(SourceKind::Stacks, self.stacks_kick.clone());
        for (kind, p) in &paces.sources {
            sampler.pace_with(*kind, p.clone());
        }
        let stats = sampler.stats();
        let (tx, mut rx) = mpsc::channel::<Sample>(SAMPLE_QUEUE);
        let (stop_tx, stop_rx) = watch::channel(false);
        let sampler_task = tokio::spawn(sampler.run(tx, stop_rx));
        let (incidents, incidents_stopped) = self
            .start_incidents(state_dir, state.writer.is_some())
            .unzip();
        let tasks = self.spawn_servers(listener, exporter, stats, paces, incidents);

        let every = Duration::from_millis(self.config.rediscover_every_ms.max(100));
        let mut rediscover = tokio::time::interval(every);
        // After the daemon was stopped or the host slept: one rediscovery, not one for
        // every period missed (the interval's default bursts them), as the sources' tickers.
        rediscover.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        rediscover.tick().await; // the first tick is immediate: discovery just ran
        loop {
            tokio::select! {
                r = shutdown.changed() => {
                    if r.is_err() || *shutdown.borrow() { break; }
                }
                s = rx.recv() => {
                    let Some(s) = s else { break };
                    if matches!(s.payload, Payload::Processes(_)) && tracing::enabled!(tracing::Level::DEBUG) {
                        let census = lock(&self.shared).model.census();
                        let lag_ms = self.clock.now_ms() - s.t_ms;
                        tracing::debug!(queued = rx.len(), lag_ms, ?census, "what the model holds");
                    }
                    self.on_sample(s, &mut state);
                }
                _ = rediscover.tick() => {
                    let found = (self.discover)().await;
                    log_discovery(&mut state.discovery, &found, self.clock.now_ms());
                    if let Ok(t) = found {
                        self.on_discovery(t, &mut state, &topo_tx);
                    }
                }
            }
        }
        let _ = stop_tx.send(true);
        drop(rx);
        let _ = sampler_task.await;
        tasks.into_iter().for_each(|t| t.abort());
        // What is open is closed as daemon_stopped, with its end, if it takes no longer.
        if let Some(s) = incidents_stopped {
            let _ = tokio::task::spawn_blocking(move || s.wait(INCIDENTS_STOP)).await;
        }
        Ok(())
    }

    /// The socket's server, the exporter's (with `exporter`) and the watch task: the one
    /// detector pass at its pace that logs findings, publishes them for the exporter, keeps
    /// the newest pass for the adaptive stacks, and sets every pace's alert.
    fn spawn_servers(
        &self,
        listener: UnixListener,
        exporter: Option<TcpListener>,
        stats: StatsHandle,
        paces: Paces,
        incidents: Option<incidents::Incidents>,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let mut tasks = Vec::new();
        let published = exporter.as_ref().map(|_| exporter::Published::default());
        tasks.push(tokio::spawn(log::watch(
            self.shared.clone(),
            stats.clone(),
            self.clock.clone(),
            paces.pass.clone(),
            log::Readers {
                publish: published.clone(),
                latest: self.latest.clone(),
                paces: paces.all(),
                kept: Some(self.kept.clone()),
                incidents,
            },
        )));
        if let (Some(l), Some(p)) = (exporter, published) {
            let clock = self.clock.clone();
            tasks.push(tokio::spawn(exporter::serve(l, p, stats.clone(), clock)));
        }
        tasks.push(tokio::spawn(serve(
            listener,
            Answering {
                shared: self.shared.clone(),
                stats,
                clock: self.clock.clone(),
                kick: self.stacks_kick.clone(),
                kept: self.kept.clone(),
            },
        )));
        tasks
    }

    /// The thread keeping incident bundles in `state_dir/incidents`, cut from the recording
    /// when there is one. A directory that cannot be used turns them off, said once: the
    /// live view and the recording go on.
    fn start_incidents(
        &self,
        state_dir: &Path,
        recording: bool,
    ) -> Option<(incidents::Incidents, incidents::Stopped)> {
        let policy = self.config.incidents?;
        let started = safe_fs::private_dir(&state_dir.join(incidents::INCIDENTS_DIR))
            .map_err(|e| e.to_string())
            .and_then(|dir| {
                let rec = recording.then(|| state_dir.join("recording"));
                incidents::Incidents::start(
                    dir,
                    policy,
                    rec,
                    self.shared.clone(),
                    self.clock.clone(),
                )
                .map_err(|e| e.to_string())
            });
        match started {
            Ok(i) => Some(i),
            Err(e) => {
                tracing::error!("incident bundles off: {e}");
                None
            }
        }
    }

    /// The topology to start with. Sampling an empty topology still records sockets and
    /// GPU, so a failed discovery is said and retried later, not fatal.
    async fn first_topology(&self, discovery: &mut log::HealthTracker) -> Topology {
        let found = (self.discover)().await;
        log_discovery(discovery, &found, self.clock.now_ms());
        found.unwrap_or_default()
    }

    /// The rotated recording in `state_dir/recording`, starting with the topology; `None`
    /// when the configuration keeps history in memory only.
    fn open_recording(&self, state_dir: &Path, topo: &Topology) -> Result<Option<RecordingWriter>> {
        let Some(policy) = self.config.rotation else {
            return Ok(None);
        };
        let dir = safe_fs::private_dir(&state_dir.join("recording"))?;
        let mut w = RecordingWriter::create_dir(&dir, policy, self.clock.now_ms())?;
        w.write(&Record::Topology {
            t_ms: self.clock.now_ms(),
            topology: topo.clone(),
        })?;
        Ok(Some(w))
    }

    /// One sample: recorded, ingested, and (process facts) possibly a new baseline.
    fn on_sample(&self, s: Sample, state: &mut LoopState) {
        if let Some(w) = state.writer.as_mut() {
            // The recording's cadence follows the suspicion (calm: fewer socket tables).
            w.set_alert(state.pace.is_alert());
            if let Err(e) = w.write_sample(&s) {
                // A full disk must not stop the live view; say so once.
                tracing::error!("recording stopped: {e}");
                state.writer = None;
            }
        }
        let is_table = matches!(s.payload, Payload::Sockets(_));
        let (baseline, good) = {
            let mut sh = lock(&self.shared);
            let b = match &s.payload {
                Payload::Processes(p) => {
                    sh.model.ingest(&s);
                    take_baseline(&mut sh, s.t_ms, p, state.pending_reason.take())
                }
                // The model keeps what it needs of the rest without copying it.
                _ => {
                    sh.model.ingest_owned(s);
                    None
                }
            };
            (b, sh.unrecorded.take())
        };
        if let Some(w) = state.writer.as_mut() {
            for b in [baseline, good].into_iter().flatten() {
                let _ = w.write(&Record::Baseline { baseline: b });
            }
        }
        if let Some(build) = is_table
            .then(|| self.kept.on_table(Instant::now()))
            .flatten()
        {
            let (shared, clock) = (self.shared.clone(), self.clock.clone());
            tokio::task::spawn_blocking(move || build_ahead(build, &shared, &*clock));
        }
    }

    /// A rediscovered topology: when components or their processes changed, the model, the
    /// recording and the sampler get it, and the next process sample is baselined.
    fn on_discovery(&self, t: Topology, state: &mut LoopState, topo_tx: &watch::Sender<Topology>) {
        let k = topology_key(&t);
        if k == state.topo_key {
            return;
        }
        state.topo_key = k;
        tracing::info!(components = t.components.len(), "topology changed");
        lock(&self.shared).model.set_topology(t.clone());
        if let Some(w) = state.writer.as_mut() {
            let _ = w.write(&Record::Topology {
                t_ms: self.clock.now_ms(),
                topology: t.clone(),
            });
        }
        let _ = topo_tx.send(t);
        state
            .pending_reason
            .get_or_insert_with(|| "topology changed".to_string());
    }
}

/// What the sampling loop carries from one event to the next.
struct LoopState {
    /// `None` without a recording, or after writing one failed.
    writer: Option<RecordingWriter>,
    topo_key: Vec<(String, Option<i32>, Vec<i32>)>,
    /// Why the next baseline is taken, when something asked for one.
    pending_reason: Option<String>,
    /// Whether discovery works, for the log.
    discovery: log::HealthTracker,
    /// The detector pass's pace, which says whether anything is suspected.
    pace: Arc<Pace>,
}

/// Discovery's failures are logged like a source's: when it starts failing and when it
/// works again, not at every retry.
fn log_discovery(t: &mut log::HealthTracker, found: &Result<Topology>, now: Millis) {
    let st = match found {
        Ok(_) => crate::model::SourceStatus::ok(),
        Err(e) => crate::model::SourceStatus::unavailable(e.to_string()),
    };
    if let Some(e) = t.update("discovery", &st, now) {
        log::emit(&e);
    }
}

/// Takes a baseline when a component is new or its process identity changed. Returns the
/// baseline to record.
fn take_baseline(
    sh: &mut Shared,
    t: Millis,
    procs: &[crate::model::ProcessFacts],
    reason: Option<String>,
) -> Option<Baseline> {
    let now = Baseline::take(t, sh.model.topology(), procs, "");
    if now.components.is_empty() {
        return None;
    }
    let mut why = Vec::new();
    for c in &now.components {
        match sh.latest_facts.as_ref().and_then(|l| l.component(&c.id)) {
            None => why.push(format!("new component {}", c.id)),
            Some(old) if old.identity != c.identity => why.push(format!("restart of {}", c.id)),
            _ => {}
        }
    }
    if why.is_empty() {
        return None;
    }
    let mut b = now;
    b.reason = match (sh.baselines.is_empty(), reason) {
        (true, _) => "start".to_string(),
        (false, Some(r)) if r != "start" => format!("{r}: {}", why.join(", ")),
        _ => why.join(", "),
    };
    let merged = match &sh.latest_facts {
        Some(l) => l.merged(&b),
        None => b.clone(),
    };
    tracing::info!(reason = %b.reason, "baseline taken");
    sh.known_good.on_baseline(&merged);
    sh.latest_facts = Some(merged);
    sh.baselines.push(b.clone());
    if sh.baselines.len() > KEEP_BASELINES + 1 {
        sh.baselines.remove(1); // keep the first: "since the daemon started"
    }
    sh.compare();
    Some(b)
}

/// What answering a client needs: the state, the sampler's stats, the clock, the kick
/// of the adaptive stacks source, and the `json` answer kept while clients ask.
#[derive(Clone)]
struct Answering {
    shared: Arc<Mutex<Shared>>,
    stats: StatsHandle,
    clock: Arc<dyn Clock>,
    kick: Arc<StacksKick>,
    kept: Arc<KeptAnswer>,
}

async fn serve(listener: UnixListener, with: Answering) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // e.g. out of fds: back off instead of spinning.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let with = with.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(10), answer(stream, with)).await;
        });
    }
}

async fn answer(stream: UnixStream, with: Answering) -> std::io::Result<()> {
    let accepted = Instant::now();
    let refused = socket::refuse_client(&stream);
    let (r, mut w) = stream.into_split();
    // Read the line even from a refused client, so it gets the reason instead of EPIPE.
    let mut line = Vec::new();
    BufReader::new(r.take(MAX_REQUEST as u64 + 1))
        .read_until(b'\n', &mut line)
        .await?;
    let out = match (refused, parse_request(&line)) {
        (Some(why), _) => Arc::new(error_bytes(&why)),
        (None, Err(e)) => Arc::new(error_bytes(&e.to_string())),
        (None, Ok(req)) => answer_request(req, with).await,
    };
    let answered = accepted.elapsed();
    w.write_all(&out).await?;
    w.write_all(b"\n").await?;
    w.shutdown().await?;
    // Where a slow call's time went: the daemon's answer, or the client reading it.
    tracing::debug!(
        answer_ms = answered.as_secs_f64() * 1e3,
        written_ms = accepted.elapsed().as_secs_f64() * 1e3,
        bytes = out.len(),
        "client answered"
    );
    Ok(())
}

/// The bytes answering `req`. Building a snapshot of a large model takes a while and holds
/// the model's lock: it is done off the runtime's workers so sampling never waits behind a
/// client.
async fn answer_request(req: Request, with: Answering) -> Arc<Vec<u8>> {
    let Answering {
        shared,
        stats,
        clock,
        kick,
        kept,
    } = with;
    if matches!(req, Request::Snapshot { .. } | Request::Json { .. }) {
        // Answered from the model now; the suspected engines' fresh stacks follow.
        kick.on_snapshot();
    }
    let kept_json = matches!(req, Request::Json { window_s: None });
    if kept_json {
        if let Some(bytes) = kept.ask(Instant::now()) {
            return bytes;
        }
    }
    // A fresh view, not the newest detector pass: a pass is up to `log_every_ms` old, and a
    // client asking now wants the requests open now.
    let (taken, now) = (Instant::now(), clock.now_ms());
    tokio::task::spawn_blocking(move || {
        let bytes = Arc::new(respond_bytes(&req, &shared, &stats, now));
        if kept_json {
            kept.store(bytes.clone(), taken);
        }
        bytes
    })
    .await
    .unwrap_or_else(|e| Arc::new(error_bytes(&format!("answer failed: {e}"))))
}

/// Builds the `json` answer ahead ([`KeptAnswer::on_table`] handed out `build`). Blocking.
fn build_ahead(build: BuildAhead, shared: &Mutex<Shared>, clock: &dyn Clock) {
    let (taken, now) = (Instant::now(), clock.now_ms());
    let bytes = answer::snapshot_json_bytes(shared, None, now);
    build.finish(Arc::new(bytes), taken);
}

/// The model a request reads: the daemon's own, or a copy widened to the asked window
/// (never beyond the history kept).
fn windowed(model: &Correlator, window_ms: Option<i64>) -> std::borrow::Cow<'_, Correlator> {
    match window_ms {
        None => std::borrow::Cow::Borrowed(model),
        Some(w) => {
            let mut m = model.clone();
            m.window_ms = w.min(m.history_ms);
            std::borrow::Cow::Owned(m)
        }
    }
}

/// The answer to one parsed request (also usable in-process).
pub fn respond(
    req: &Request,
    shared: &Mutex<Shared>,
    stats: &StatsHandle,
    now: Millis,
) -> serde_json::Value {
    let sampler = stats.lock().map(|s| s.clone()).unwrap_or_default();
    match req {
        Request::Perfetto { .. } => {
            let sh = lock(shared);
            crate::export::perfetto_model(&windowed(&sh.model, req.window_ms()), now)
        }
        Request::Json { .. } => {
            let snapshot = answer::snapshot_now(shared, req.window_ms(), now);
            serde_json::to_value(&snapshot)
                .unwrap_or_else(|e| serde_json::json!({ "error": e.to_string() }))
        }
        Request::Snapshot { .. } => {
            let (parts, daemon) =
                answer::parts_now(shared, req.window_ms(), now, crate::model::RawFiles::All);
            let a = answer::SnapshotAnswer {
                schema: DAEMON_SCHEMA,
                parts: &parts,
                sampler: &sampler,
                daemon,
            };
            serde_json::to_value(&a)
                .unwrap_or_else(|e| serde_json::json!({ "error": e.to_string() }))
        }
        Request::Baseline => {
            let sh = lock(shared);
            serde_json::json!({
                "schema": DAEMON_SCHEMA,
                "oldest": sh.baselines.first(),
                "latest": sh.latest_facts,
                "known_good": sh.known_good.good,
                "count": sh.baselines.len(),
            })
        }
        Request::Sources => serde_json::json!({ "schema": DAEMON_SCHEMA, "sampler": sampler }),
        Request::Ping => serde_json::json!({ "ok": true, "pid": std::process::id() }),
    }
}

/// The answer's bytes to one parsed request: a snapshot's parts serialized once, outside the
/// model's lock; any other answer through [`respond`].
pub fn respond_bytes(
    req: &Request,
    shared: &Mutex<Shared>,
    stats: &StatsHandle,
    now: Millis,
) -> Vec<u8> {
    match req {
        Request::Snapshot { .. } => {
            let sampler = stats.lock().map(|s| s.clone()).unwrap_or_default();
            answer::snapshot_bytes(shared, &sampler, req.window_ms(), now)
        }
        Request::Json { .. } => answer::snapshot_json_bytes(shared, req.window_ms(), now),
        _ => serde_json::to_vec(&respond(req, shared, stats, now))
            .unwrap_or_else(|e| error_bytes(&e.to_string())),
    }
}

/// `{"error": why}` as bytes.
fn error_bytes(why: &str) -> Vec<u8> {
    serde_json::json!({ "error": why }).to_string().into_bytes()
}

/// Asks a running daemon (one running as us or root: see [`socket::check_daemon`]).
/// `what` is a request line, e.g. `snapshot`, `baseline`, `sources` or `ping`.
pub async fn query(socket_path: &Path, what: &str, timeout_ms: u64) -> Result<serde_json::Value> {
    let buf = query_bytes(socket_path, what, timeout_ms).await?;
    let v: serde_json::Value = serde_json::from_slice(&buf)?;
    if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
        return Err(Error::Other(format!(
            "daemon at {}: {e}",
            socket_path.display()
        )));
    }
    Ok(v)
}

/// The answer's bytes to `what` (at most [`MAX_ANSWER`]), unparsed.
async fn query_bytes(socket_path: &Path, what: &str, timeout_ms: u64) -> Result<Vec<u8>> {
    let fut = async {
        let mut s = UnixStream::connect(socket_path)
            .await
            .map_err(|e| Error::io(socket_path, e))?;
        socket::check_daemon(&s, socket_path)?;
        s.write_all(format!("{what}\n").as_bytes())
            .await
            .map_err(|e| Error::io(socket_path, e))?;
        let mut buf = Vec::new();
        s.take(MAX_ANSWER)
            .read_to_end(&mut buf)
            .await
            .map_err(|e| Error::io(socket_path, e))?;
        Ok(buf)
    };
    tokio::time::timeout(Duration::from_millis(timeout_ms), fut)
        .await
        .map_err(|_| Error::Timeout {
            what: format!("daemon query {what:?} at {}", socket_path.display()),
            ms: timeout_ms,
        })?
}

/// `query` for synchronous callers (the CLI, the TUI): runs on a small current-thread runtime.
pub fn query_blocking(
    socket_path: &Path,
    what: &str,
    timeout_ms: u64,
) -> Result<serde_json::Value> {
    blocking(query(socket_path, what, timeout_ms))
}

/// The bytes a running daemon answers to `json` (check them with
/// [`answer::check_snapshot_bytes`]: an error answer, e.g. from a daemon older than the
/// request, is not a transport error).
pub fn snapshot_json_blocking(socket_path: &Path, timeout_ms: u64) -> Result<Vec<u8>> {
    blocking(query_bytes(socket_path, "json", timeout_ms))
}

/// The snapshot parts a running daemon answers to `snapshot`, read straight from its bytes
/// (for synchronous callers, like [`query_blocking`]).
pub fn snapshot_parts_blocking(
    socket_path: &Path,
    timeout_ms: u64,
) -> Result<crate::snapshot::SnapshotParts> {
    let buf = blocking(query_bytes(socket_path, "snapshot", timeout_ms))?;
    answer::parts_from_bytes(&buf, socket_path)
}

/// Runs `fut` on a small current-thread runtime; refused inside a runtime.
fn blocking<T>(fut: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    if tokio::runtime::Handle::try_current().is_ok() {
        // block_on inside a runtime would panic: say what to do instead.
        return Err(Error::Other(
            "daemon::query_blocking called inside a tokio runtime; use daemon::query(..).await"
                .into(),
        ));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Other(format!("tokio runtime: {e}")))?;
    rt.block_on(fut)
}

/// The snapshot parts from a daemon answer to `snapshot`.
pub fn parts_from_answer(v: &serde_json::Value) -> Result<crate::snapshot::SnapshotParts> {
    let p = v
        .get("parts")
        .ok_or_else(|| Error::Other("daemon answer has no parts".into()))?;
    // read from the tree in place, not from a copy of it
    Ok(serde::Deserialize::deserialize(p)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SystemClock;

    struct Kind(SourceKind);
    impl Source for Kind {
        fn kind(&self) -> SourceKind {
            self.0
        }
        fn sample<'a>(&'a self, _: &'a Topology, _: &'a dyn Clock) -> BoxFuture<'a, Sample> {
            Box::pin(std::future::pending())
        }
    }

    fn daemon(thresholds: Thresholds) -> Daemon {
        let mut cfg = DaemonConfig::new(PathBuf::from("/nonexistent"));
        cfg.thresholds = thresholds;
        let discover: DiscoverFn = Arc::new(|| Box::pin(async { Ok(Topology::default()) }));
        let mut d = Daemon::new(cfg, Arc::new(SystemClock), discover);
        for kind in [SourceKind::Sockets, SourceKind::Gpu, SourceKind::Processes] {
            d.add_default_source(Arc::new(Kind(kind)));
        }
        d.add_source(Arc::new(Kind(SourceKind::Stacks)), 5_000, 8_000);
        d.add_default_source(Arc::new(Kind(SourceKind::Metrics)));
        d
    }

    fn periods(p: &Paces) -> Vec<(SourceKind, u64, u64)> {
        p.sources
            .iter()
            .map(|(k, pace)| {
                let calm = pace.period_ms();
                pace.set_alert(true);
                let alert = pace.period_ms();
                pace.set_alert(false);
                (*k, calm, alert)
            })
            .collect()
    }

    #[test]
    fn calm_paces_follow_the_thresholds_and_the_pass_never_outlasts_the_suspicion() {
        let d = daemon(Thresholds::default());
        let p = d.paces();
        assert_eq!(
            periods(&p),
            vec![
                (SourceKind::Sockets, 2_000, 250),
                (SourceKind::Gpu, 1_000, 250),
                (SourceKind::Processes, 5_000, 1_000),
                (SourceKind::Stacks, 20_000, 5_000),
            ],
            "metrics keep their own period: a queue not draining is read from them"
        );
        // The soonest wedge verdict (10 s, every witness quiet) is suspected at 33 % of it:
        // the calm pass comes that often, so the second dump can be in by the verdict.
        assert_eq!(p.pass.period_ms(), 3_300);
        assert_eq!(p.all().len(), 5, "every pace is set by the pass");
        // An 8 s wedge threshold (below the unanimous 10 s) is suspected at 33 % of it.
        let mut fast = Thresholds::default();
        fast.correlate.wedged_after_ms = 8_000;
        assert_eq!(daemon(fast).paces().pass.period_ms(), 2_640);
        // A calm period at or below a source's own needs no pace.
        let mut unpaced = Thresholds::default();
        unpaced.sampling.sockets_calm_ms = 250;
        let kinds: Vec<SourceKind> = daemon(unpaced)
            .paces()
            .sources
            .iter()
            .map(|s| s.0)
            .collect();
        assert!(!kinds.contains(&SourceKind::Sockets), "{kinds:?}");
    }
}
