//! Attaching to a running stack: the one place that turns the user's options into discovery,
//! the five sources and a sampler. `snapshot`, `record`, `daemon`, `tui` and `demo` all go
//! through here, so they sample the same way.

use crate::clock::{Clock, Millis};
use crate::correlate::Correlator;
use crate::daemon::DiscoverFn;
use crate::detect::Thresholds;
use crate::discover::{self, DiscoverOptions, DiscoveryCache};
use crate::error::{Error, Result};
use crate::model::SourceKind;
use crate::model::Topology;
use crate::probes::ProbeSet;
use crate::record::{ReadStats, Record, Recording, Replayer};
use crate::sampler::adaptive::{AdaptiveStacks, SuspicionFn};
use crate::sampler::Sampler;
use crate::snapshot::SnapshotParts;
use crate::sources::gpu::{GpuConfig, GpuSource};
use crate::sources::metrics::{MetricsConfig, MetricsSource};
use crate::sources::processes::ProcessesSource;
use crate::sources::sockets::{SocketConfig, SocketOs, SocketSource};
use crate::sources::stacks::{StackSource, StacksConfig};
use crate::sources::Source;
use crate::sys::sock_diag::RecentDump;
use crate::sys::ProcFs;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, TryLockError};
use std::time::Duration;
use tokio::sync::watch;

/// A source with its cadence and timeout, in ms.
pub type Cadenced = (Arc<dyn Source>, u64, u64);

/// The daemon's discovery cache, shared by its rediscovery passes.
type SharedCache = Arc<Mutex<DiscoveryCache>>;

/// What to attach to and how.
#[derive(Debug, Clone)]
pub struct AttachOptions {
    pub proc_root: PathBuf,
    pub probes: ProbeSet,
    pub extra_pids: Vec<i32>,
    pub extra_urls: Vec<String>,
    /// `--within`: the processes whose trees are watched (empty: every process).
    pub within: Vec<i32>,
    /// `--nvml-lib`; None: `$WEDGEWATCH_NVML_LIB`, else the system library.
    pub nvml_lib: Option<PathBuf>,
    /// `--py-spy`; None: `$WEDGEWATCH_PY_SPY`, else `$PATH`.
    pub py_spy: Option<PathBuf>,
    /// `--native` stacks: pauses the targets; only on explicit request.
    pub native: bool,
    pub thresholds: Thresholds,
    /// Series kept per metrics scrape (`--max-series`): a hostile endpoint's millions of
    /// series are cut there, and the cut is said in the source status.
    pub max_series: usize,
    /// `--router-key-env NAME`: where else a router's API key may be found (its own
    /// `--api-key` is always tried first; see `sources::router_key`).
    pub router_key_env: Option<String>,
    /// The sockets source's latest dump, read by discovery while young enough (the
    /// daemon's: [`AttachOptions::sharing_socket_dumps`]).
    pub shared_dump: Option<Arc<RecentDump>>,
}

impl AttachOptions {
    pub fn new(probes: ProbeSet) -> AttachOptions {
        AttachOptions {
            proc_root: PathBuf::from(crate::sys::PROC_ROOT),
            probes,
            extra_pids: Vec::new(),
            extra_urls: Vec::new(),
            within: Vec::new(),
            nvml_lib: None,
            py_spy: None,
            native: false,
            thresholds: Thresholds::default(),
            max_series: crate::prom::ParseLimits::default().max_series,
            router_key_env: None,
            shared_dump: None,
        }
    }

    /// For a daemon: its rediscovery takes the sockets source's latest dump of our own
    /// namespace while it is at most one calm socket period and a second old, instead of
    /// walking the kernel's socket hash again; a new listener may be found that much later.
    pub fn sharing_socket_dumps(mut self) -> AttachOptions {
        let calm = u64::try_from(self.thresholds.sampling.sockets_calm_ms).unwrap_or(0);
        let max_age = Duration::from_millis(calm.saturating_add(1000));
        self.shared_dump = Some(Arc::new(RecentDump::new(max_age)));
        self
    }

    pub fn discover_options(&self) -> DiscoverOptions {
        DiscoverOptions {
            proc_root: self.proc_root.clone(),
            extra_pids: self.extra_pids.clone(),
            extra_urls: self.extra_urls.clone(),
            within: self.within.clone(),
            router_key_env: self.router_key_env.clone(),
            recent_dump: self.shared_dump.clone(),
            ..DiscoverOptions::default()
        }
    }

    /// Discovery once, off the async threads (it reads /proc and may GET `/workers`), on a
    /// detached thread under [`discover::DISCOVERY_DEADLINE`]: a read that blocks past every
    /// inner deadline fails discovery with a reason instead of hanging the verb.
    pub async fn discover(&self) -> Result<Topology> {
        self.discover_with(None).await
    }

    /// [`Self::discover`], remembering what it read in `cache` for the next call (the
    /// daemon's rediscovery: `discover::discover_cached`). A cache still held by an earlier
    /// discovery that outlived its deadline is not waited for: this one starts afresh.
    async fn discover_with(&self, cache: Option<SharedCache>) -> Result<Topology> {
        let probes = self.probes.clone();
        let opts = self.discover_options();
        let root = opts.proc_root.clone();
        let run = move || {
            // Poisoned (a pass panicked): its cache was taken out, an empty one is left.
            let guard = cache.as_ref().and_then(|c| match c.try_lock() {
                Ok(g) => Some(g),
                Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
                Err(TryLockError::WouldBlock) => None,
            });
            match guard {
                Some(mut c) => discover::discover_cached(&probes, &opts, &mut c),
                None => discover::discover(&probes, &opts),
            }
        };
        tokio::task::spawn_blocking(move || {
            crate::deadline::call(&root, discover::DISCOVERY_DEADLINE, run)
        })
        .await
        .map_err(|e| Error::Other(format!("discovery task failed: {e}")))?
        .map_err(|reason| Error::Other(format!("discovery: {reason}")))?
    }

    fn metrics_config(&self) -> MetricsConfig {
        let mut cfg = MetricsConfig::default();
        cfg.parse.max_series = self.max_series;
        cfg
    }

    /// Discovery as the daemon's re-discovery hook: one [`DiscoveryCache`] for all its
    /// passes, so a pass reads only new processes in full.
    pub fn discover_fn(&self) -> DiscoverFn {
        let me = Arc::new(self.clone());
        let cache: SharedCache = Arc::new(Mutex::new(DiscoveryCache::new()));
        Arc::new(move || {
            let (me, cache) = (me.clone(), cache.clone());
            Box::pin(async move { me.discover_with(Some(cache)).await })
        })
    }

    /// The five sources, configured from the options. A source that cannot work here (no
    /// py-spy, no NVML) still exists and reports `unavailable` with its reason.
    pub fn sources(&self) -> Result<Vec<Arc<dyn Source>>> {
        let mut gpu = GpuConfig::from_env();
        if let Some(p) = &self.nvml_lib {
            gpu.lib_path = Some(p.clone());
        }
        Ok(vec![
            Arc::new(ProcessesSource::new(self.proc_root.clone())),
            Arc::new(SocketSource::with_os(
                SocketConfig::default(),
                SocketOs::kernel_sharing(ProcFs::new(&self.proc_root), self.shared_dump.clone()),
            )),
            Arc::new(
                MetricsSource::new(self.probes.metric_maps.clone(), self.metrics_config())?
                    .with_router_keys(crate::sources::router_key::KeySources {
                        proc: ProcFs::new(&self.proc_root),
                        env_name: self.router_key_env.clone(),
                    }),
            ),
            // Not `proc_root`: py-spy reads the kernel's `/proc` whatever our root is, and
            // whether a target is Python or has exited is a question about what py-spy sees.
            Arc::new(self.stack_source()?),
            Arc::new(GpuSource::new(gpu)),
        ])
    }

    /// The daemon's sources with their cadences (every ms, timeout ms): the five at their
    /// default cadences, the stacks source adaptive ([`crate::sampler::adaptive`]), `suspicion`
    /// asked at each of its ticks.
    pub fn daemon_sources(&self, suspicion: SuspicionFn) -> Result<Vec<Cadenced>> {
        let sampling = &self.thresholds.sampling;
        let mut out = Vec::new();
        for src in self.sources()? {
            let (every, timeout) = crate::sampler::default_cadence(src.kind());
            out.push((src, every, timeout));
        }
        if sampling.stacks_adaptive {
            let tick = u64::try_from(sampling.stacks_tick_ms).unwrap_or(u64::MAX);
            let stacks = self.stack_source_with(|c| c.concurrency = daemon_py_spy_concurrency())?;
            for s in out.iter_mut().filter(|s| s.0.kind() == SourceKind::Stacks) {
                let adaptive = AdaptiveStacks::new(stacks.clone(), suspicion.clone());
                *s = (Arc::new(adaptive), tick, s.2);
            }
        }
        Ok(out)
    }

    /// The stacks source, configured from the options.
    fn stack_source(&self) -> Result<StackSource> {
        self.stack_source_with(|_| {})
    }

    /// [`AttachOptions::stack_source`] with `adjust` applied to its configuration.
    fn stack_source_with(&self, adjust: impl FnOnce(&mut StacksConfig)) -> Result<StackSource> {
        let mut stacks = StacksConfig::from_env();
        if let Some(p) = &self.py_spy {
            stacks.py_spy = Some(p.clone());
        }
        stacks.native = self.native;
        adjust(&mut stacks);
        StackSource::new(stacks, &self.probes.stack_rules)
    }

    /// A sampler over every source at its default cadence.
    pub fn sampler(
        &self,
        clock: Arc<dyn Clock>,
        topology: watch::Receiver<Topology>,
    ) -> Result<Sampler> {
        let mut s = Sampler::new(clock, topology);
        for src in self.sources()? {
            s.add_default(src);
        }
        Ok(s)
    }
}

/// How many py-spy dumps a daemon runs at once: a quarter of the host's cores, between 1 and
/// the one-shot's 4. A one-shot must sample its window fast, a daemon must go unnoticed (a
/// burst of dumps takes a small host's cores from the clients it serves); dumps accumulate
/// across ticks, so one at a time loses no evidence.
pub fn daemon_py_spy_concurrency() -> usize {
    py_spy_concurrency_for(std::thread::available_parallelism().map_or(1, usize::from))
}

fn py_spy_concurrency_for(cores: usize) -> usize {
    (cores / 4).clamp(1, 4)
}

/// What a one-shot window keeps for what follows sampling: building the parts, assembling and
/// redacting the snapshot, printing it, stopping the runtime and exiting.
const ASSEMBLY_RESERVE_MS: u64 = 350;

/// How long a one-shot window of `window_ms` waits, inside it, for samples still in flight at
/// its sampling's end (a py-spy dump of a loaded scheduler): a tenth of it, between 0.2 and 1 s
/// ([`crate::sampler::COLLECT_GRACE`]).
pub fn one_shot_grace(window_ms: u64) -> std::time::Duration {
    std::time::Duration::from_millis((window_ms / 10).clamp(200, 1_000))
}

/// Finds the stack and samples it so that the verb that began at `started` ends within
/// `window_ms`: discovery and assembly included, at least half of it sampled, every source
/// at least once. Returns the model.
pub async fn collect_window(
    opts: &AttachOptions,
    window_ms: u64,
    clock: Arc<dyn Clock>,
    started: std::time::Instant,
) -> Result<Correlator> {
    let topology = opts.discover().await?;
    let discovered = started.elapsed();
    let (_tx, rx) = watch::channel(topology.clone());
    let sampler = opts.sampler(clock, rx)?;
    let mut model = Correlator::new(opts.thresholds.clone());
    model.set_topology(topology);
    // The window is the verb's time to look, from the process's start to its exit:
    // `--window 3s` is a snapshot in about 3 s, however long starting and finding the stack
    // took (at least half of it is sampled).
    let grace = one_shot_grace(window_ms);
    let spent_ms = discovered.as_millis() as u64 + ASSEMBLY_RESERVE_MS + grace.as_millis() as u64;
    let left_ms = window_ms.saturating_sub(spent_ms);
    let samples = sampler
        .with_grace(grace)
        .collect(&mut model, left_ms.max(window_ms / 2))
        .await;
    tracing::debug!(
        started_and_discovered_ms = discovered.as_millis() as u64,
        window_ms,
        grace_ms = grace.as_millis() as u64,
        sampled_ms = (started.elapsed() - discovered).as_millis() as u64,
        samples,
        "one-shot window sampled"
    );
    Ok(model)
}

/// Samples `ms` more into `model`: a one-shot's window grown for a verdict due soon
/// (`correlate::pending_verdict`). Every source runs again at its default cadence, the stacks
/// source dumping at once; the model keeps its topology and what it holds.
pub async fn collect_more(
    opts: &AttachOptions,
    model: &mut Correlator,
    ms: u64,
    clock: Arc<dyn Clock>,
) -> Result<u64> {
    let (_tx, rx) = watch::channel(model.topology().clone());
    let sampler = opts.sampler(clock, rx)?;
    Ok(sampler
        .with_grace(one_shot_grace(ms))
        .collect(model, ms)
        .await)
}

/// `wedgewatch record -o FILE --for DURATION` in one call: runs `sampler` for
/// `duration_ms` (tokio time) and writes its samples, the topology and a baseline to `path`
/// ([`crate::record::record_samples`]). Returns the samples written.
pub async fn record_to_file(
    sampler: Sampler,
    path: &std::path::Path,
    duration_ms: u64,
    topology: &Topology,
    clock: Arc<dyn Clock>,
) -> Result<u64> {
    let (tx, mut rx) = tokio::sync::mpsc::channel(4096);
    let (stop_tx, stop_rx) = watch::channel(false);
    let task = tokio::spawn(sampler.run(tx, stop_rx));
    let until = tokio::time::Instant::now() + std::time::Duration::from_millis(duration_ms);
    let result = crate::record::record_samples(&mut rx, path, until, topology, &*clock).await;
    // Stopped on every outcome: a write error must not leave the sampler running.
    let _ = stop_tx.send(true);
    drop(rx);
    let _ = task.await;
    result
}

/// Replays a recording as a sequence of snapshot parts, one every `step_ms` of recorded
/// time, through the same correlator and detectors as live sampling (for `tui --replay`).
pub fn replay_frames(
    rec: &Recording,
    step_ms: i64,
    thresholds: Thresholds,
) -> Result<Vec<SnapshotParts>> {
    replay_frames_counted(rec, step_ms, thresholds).map(|(frames, _)| frames)
}

/// [`replay_frames`], and what reading the recording skipped (for the UI's header).
pub fn replay_frames_counted(
    rec: &Recording,
    step_ms: i64,
    thresholds: Thresholds,
) -> Result<(Vec<SnapshotParts>, ReadStats)> {
    let mut r = Replayer::new(thresholds);
    let mut frames = Vec::new();
    let step = step_ms.max(100);
    let mut next_frame: Option<Millis> = None;
    let mut records = rec.records();
    for rec in records.by_ref() {
        let rec = rec?;
        // A frame shows the model as it was just before the first sample past its time.
        if let (Record::Sample { sample, .. }, Some(due)) = (&rec, next_frame) {
            if sample.t_ms >= due {
                frames.push(crate::pipeline::parts(&r.model, due));
                // Saturating: times in a recording from a stranger can be anything.
                let steps = sample.t_ms.saturating_sub(due) / step + 1;
                next_frame = Some(due.saturating_add(step.saturating_mul(steps)));
            }
        }
        if let Some(t) = r.apply(rec) {
            next_frame.get_or_insert(t.saturating_add(step));
        }
    }
    if let Some(t) = r.last_sample_ms {
        frames.push(crate::pipeline::parts(&r.model, t));
    }
    Ok((frames, records.stats()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_one_shot_grace_is_a_tenth_of_its_window_within_bounds() {
        let ms = |w| one_shot_grace(w).as_millis();
        assert_eq!(ms(3_000), 300);
        assert_eq!(ms(500), 200, "at least 0.2 s: a py-spy dump in flight");
        assert_eq!(ms(90_000), 1_000, "at most the sampler's whole grace");
    }

    #[test]
    fn a_daemon_dumps_with_a_quarter_of_the_cores_between_one_and_the_one_shots_four() {
        assert_eq!(py_spy_concurrency_for(1), 1);
        assert_eq!(py_spy_concurrency_for(2), 1, "the big lab's machine");
        assert_eq!(py_spy_concurrency_for(8), 2);
        assert_eq!(py_spy_concurrency_for(128), 4, "never more than a one-shot");
        assert_eq!(
            StacksConfig::from_env().concurrency,
            4,
            "a one-shot keeps its own"
        );
    }
}
