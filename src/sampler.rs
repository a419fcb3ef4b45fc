//! The sampler: runs each [`Source`] on its own cadence under its own timeout and streams
//! the samples into a tokio channel. Late ticks, timeouts and samples the consumer could not
//! take are counted per source ([`SourceStats`]) and shown, never silently lost: a timed-out
//! source still emits a sample whose status says `unavailable: timed out after N ms`.

use crate::clock::{Clock, Millis};
use crate::model::{GpuReading, Payload, Sample, SocketTable, SourceKind, SourceStatus, Topology};
use crate::sources::Source;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// Default cadence and timeout of a source kind, in ms: sockets and GPU ~4 Hz, metrics
/// and processes ~1 Hz, stacks every 5 s (py-spy is the expensive one).
pub fn default_cadence(kind: SourceKind) -> (u64, u64) {
    match kind {
        SourceKind::Sockets => (250, 1_000),
        SourceKind::Gpu => (250, 1_000),
        SourceKind::Metrics => (1_000, 2_000),
        SourceKind::Processes => (1_000, 2_000),
        // Three dumps of every Python process of the stack: on a loaded 2-core box one dump
        // of 30 processes took 2.5 s. The stacks source keeps itself within a 6 s budget
        // (fewer dumps, said in its status); this timeout is the backstop.
        // Every 15 s: py-spy is most of the daemon's CPU (benches/daemon.rs), and a wedge
        // lasts far longer than that; a one-shot snapshot still dumps at its start.
        SourceKind::Stacks => (15_000, 8_000),
    }
}

/// One source and when to run it.
#[derive(Clone)]
pub struct Schedule {
    pub source: Arc<dyn Source>,
    pub every_ms: u64,
    pub timeout_ms: u64,
}

/// Per-source sampling health.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceStats {
    pub kind: SourceKind,
    pub every_ms: u64,
    pub timeout_ms: u64,
    pub last_t_ms: Option<Millis>,
    pub took_ms: u64,
    /// Samples handed to the consumer.
    pub samples: u64,
    /// Ticks missed because the previous sample overran its period.
    pub late: u64,
    /// Samples lost: timed out (an `unavailable` sample is sent instead) or the consumer's
    /// channel was full.
    pub dropped: u64,
    pub timeouts: u64,
    pub status: SourceStatus,
}

/// Shared, live view of every source's stats.
pub type StatsHandle = Arc<Mutex<BTreeMap<SourceKind, SourceStats>>>;

pub struct Sampler {
    clock: Arc<dyn Clock>,
    topology: watch::Receiver<Topology>,
    schedules: Vec<Schedule>,
    stats: StatsHandle,
}

/// An empty payload of a kind, for a sample that carries only a status.
pub fn empty_payload(kind: SourceKind) -> Payload {
    match kind {
        SourceKind::Processes => Payload::Processes(Vec::new()),
        SourceKind::Sockets => Payload::Sockets(SocketTable::default()),
        SourceKind::Stacks => Payload::Stacks(Vec::new()),
        SourceKind::Gpu => Payload::Gpu(GpuReading::default()),
        SourceKind::Metrics => Payload::Metrics(Vec::new()),
    }
}

fn lock(stats: &StatsHandle) -> std::sync::MutexGuard<'_, BTreeMap<SourceKind, SourceStats>> {
    // A panic elsewhere while holding the lock must not stop sampling: take the data anyway.
    stats.lock().unwrap_or_else(|p| p.into_inner())
}

impl Sampler {
    /// `topology` is read at every tick, so rediscovery takes effect immediately.
    pub fn new(clock: Arc<dyn Clock>, topology: watch::Receiver<Topology>) -> Sampler {
        Sampler {
            clock,
            topology,
            schedules: Vec::new(),
            stats: Arc::new(Mutex::new(BTreeMap::new())),
        }
    }

    /// Adds a source with its own cadence and timeout.
    pub fn add(&mut self, source: Arc<dyn Source>, every_ms: u64, timeout_ms: u64) {
        let kind = source.kind();
        lock(&self.stats).insert(
            kind,
            SourceStats {
                kind,
                every_ms,
                timeout_ms,
                last_t_ms: None,
                took_ms: 0,
                samples: 0,
                late: 0,
                dropped: 0,
                timeouts: 0,
                status: SourceStatus::unavailable("not sampled yet"),
            },
        );
        self.schedules.push(Schedule {
            source,
            every_ms: every_ms.max(1),
            timeout_ms: timeout_ms.max(1),
        });
    }

    /// Adds a source at its kind's default cadence.
    pub fn add_default(&mut self, source: Arc<dyn Source>) {
        let (every, timeout) = default_cadence(source.kind());
        self.add(source, every, timeout);
    }

    pub fn stats(&self) -> StatsHandle {
        self.stats.clone()
    }

    /// Every source once, concurrently (for a one-shot snapshot without a daemon).
    pub async fn sample_once(&self) -> Vec<Sample> {
        let topo = self.topology.borrow().clone();
        let futs = self.schedules.iter().map(|s| {
            let topo = topo.clone();
            let clock = self.clock.clone();
            let stats = self.stats.clone();
            async move { take(s, &topo, clock.as_ref(), &stats).await.0 }
        });
        let mut out = Vec::new();
        for f in futs {
            out.push(f.await);
        }
        out
    }

    /// Runs until `shutdown` turns true (or is dropped) or the receiver goes away.
    pub async fn run(self, tx: mpsc::Sender<Sample>, shutdown: watch::Receiver<bool>) {
        let mut tasks = Vec::new();
        for s in self.schedules {
            let clock = self.clock.clone();
            let topo = self.topology.clone();
            let stats = self.stats.clone();
            let tx = tx.clone();
            let mut shutdown = shutdown.clone();
            tasks.push(tokio::spawn(async move {
                let mut iv = tokio::time::interval(Duration::from_millis(s.every_ms));
                iv.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                loop {
                    if *shutdown.borrow() {
                        break;
                    }
                    tokio::select! {
                        _ = iv.tick() => {}
                        r = shutdown.changed() => { if r.is_err() || *shutdown.borrow() { break; } continue; }
                    }
                    let t = topo.borrow().clone();
                    let (sample, elapsed) = take(&s, &t, clock.as_ref(), &stats).await;
                    if elapsed > s.every_ms {
                        lock(&stats).entry(s.source.kind()).and_modify(|st| st.late += elapsed / s.every_ms);
                    }
                    match tx.try_send(sample) {
                        Ok(()) => {
                            lock(&stats).entry(s.source.kind()).and_modify(|st| st.samples += 1);
                        }
                        Err(mpsc::error::TrySendError::Full(_)) => {
                            lock(&stats).entry(s.source.kind()).and_modify(|st| st.dropped += 1);
                        }
                        Err(mpsc::error::TrySendError::Closed(_)) => break,
                    }
                }
            }));
        }
        drop(tx);
        for t in tasks {
            let _ = t.await;
        }
    }
}

/// Takes one sample under the schedule's timeout; updates stats. Returns the sample and
/// the (tokio) time it took in ms.
async fn take(
    s: &Schedule,
    topo: &Topology,
    clock: &dyn Clock,
    stats: &StatsHandle,
) -> (Sample, u64) {
    let kind = s.source.kind();
    let start = tokio::time::Instant::now();
    let res = tokio::time::timeout(
        Duration::from_millis(s.timeout_ms),
        s.source.sample(topo, clock),
    )
    .await;
    let elapsed = start.elapsed().as_millis() as u64;
    let timed_out = res.is_err();
    let sample = match res {
        Ok(sample) => sample,
        Err(_) => Sample {
            t_ms: clock.now_ms(),
            status: SourceStatus::unavailable(format!(
                "{} timed out after {} ms",
                kind.as_str(),
                s.timeout_ms
            )),
            took_ms: elapsed,
            payload: empty_payload(kind),
        },
    };
    let mut g = lock(stats);
    if let Some(st) = g.get_mut(&kind) {
        st.last_t_ms = Some(sample.t_ms);
        st.took_ms = sample.took_ms.max(elapsed);
        st.status = sample.status.clone();
        if timed_out {
            st.timeouts += 1;
            st.dropped += 1;
        }
    }
    drop(g);
    (sample, elapsed)
}

impl Sampler {
    /// Samples for `duration_ms` (tokio time) into `model`, then stops: what a one-shot
    /// `snapshot` without a daemon does. Returns the number of samples ingested.
    /// The model takes the sampler's topology.
    pub async fn collect(self, model: &mut crate::correlate::Model, duration_ms: u64) -> u64 {
        let topo = self.topology.borrow().clone();
        if model.topology() != &topo {
            model.set_topology(topo);
        }
        let (tx, mut rx) = mpsc::channel(4096);
        let (stop_tx, stop_rx) = watch::channel(false);
        let task = tokio::spawn(self.run(tx, stop_rx));
        let deadline = tokio::time::Instant::now() + Duration::from_millis(duration_ms);
        let mut n = 0;
        while let Ok(Some(s)) = tokio::time::timeout_at(deadline, rx.recv()).await {
            model.ingest(&s);
            n += 1;
        }
        let _ = stop_tx.send(true);
        // Samples in flight at the deadline are still taken (bounded by their timeouts).
        while let Some(s) = rx.recv().await {
            model.ingest(&s);
            n += 1;
        }
        let _ = task.await;
        n
    }
}
