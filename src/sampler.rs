//! The sampler: runs each [`Source`] on its own cadence under its own timeout and streams
//! the samples into a tokio channel. Late ticks, timeouts and samples the consumer could not
//! take are counted per source ([`SourceStats`]) and shown, never silently lost: a timed-out
//! source still emits a sample whose status says `unavailable: timed out after N ms`.

pub mod adaptive;
pub mod kick;
pub mod pace;

mod ticker;

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
        // A big node's table can take over a second on a loaded host, and a timed-out sample is
        // a lost one (the wedge cannot be judged); the cadence holds while one runs.
        SourceKind::Sockets => (250, 2_500),
        // Longer than the GPU source's own timeout, which can say why (a hung driver).
        SourceKind::Gpu => (
            250,
            crate::sources::gpu::DEFAULT_TIMEOUT.as_millis() as u64 + 500,
        ),
        SourceKind::Metrics => (1_000, 2_000),
        SourceKind::Processes => (1_000, 2_000),
        // The stacks source keeps within its own budget (fewer dumps, said in its status); this
        // timeout is the backstop. Every 15 s: py-spy is most of the daemon's CPU and a wedge
        // lasts far longer; a one-shot dumps at its start.
        SourceKind::Stacks => (15_000, 8_000),
    }
}

/// One source and when to run it.
#[derive(Clone)]
pub struct Schedule {
    pub source: Arc<dyn Source>,
    pub every_ms: u64,
    pub timeout_ms: u64,
    /// Runs the source at once when kicked (the daemon's adaptive stacks, on a snapshot
    /// asked for while a suspicion is open), then on its cadence again.
    pub kick: Option<Arc<kick::StacksKick>>,
    /// Runs the source at this pace's period instead of `every_ms` (the daemon's sockets:
    /// slow while nothing is suspected).
    pub pace: Option<Arc<pace::Pace>>,
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
    /// Ticks missed because the previous sample overran its period, or because the
    /// consumer was behind (a source waits for a place in its queue before sampling).
    pub late: u64,
    /// Samples lost: timed out (an `unavailable` sample is sent instead).
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
    /// Set by [`Sampler::collect`]: no sample may run past this (a one-shot verb's window
    /// plus its grace). None: samples are cut short by `shutdown` instead.
    finish_by: Option<tokio::time::Instant>,
    /// How long a one-shot collection waits after its window for samples in flight
    /// ([`COLLECT_GRACE`] unless [`Sampler::with_grace`] said otherwise).
    grace: Duration,
}

/// How long a one-shot collection waits, after its window, for samples still in flight
/// (a stacks window, a slow endpoint). Past it they are cut off and said so: a verb ends
/// within its window plus this, plus process start and exit.
pub const COLLECT_GRACE: Duration = Duration::from_millis(1_000);

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
            finish_by: None,
            grace: COLLECT_GRACE,
        }
    }

    /// A one-shot collection with this grace after its window instead of [`COLLECT_GRACE`]
    /// (a short window's verb must end close to it: `attach::collect_window`).
    pub fn with_grace(mut self, grace: Duration) -> Sampler {
        self.grace = grace;
        self
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
            kick: None,
            pace: None,
        });
    }

    /// The schedules of the sources of `kind`.
    fn schedules_of(&mut self, kind: SourceKind) -> impl Iterator<Item = &mut Schedule> {
        self.schedules
            .iter_mut()
            .filter(move |s| s.source.kind() == kind)
    }

    /// The source of `kind` also runs whenever `kick` is kicked.
    pub fn kick_with(&mut self, kind: SourceKind, kick: Arc<kick::StacksKick>) {
        self.schedules_of(kind)
            .for_each(|s| s.kick = Some(kick.clone()));
    }

    /// The source of `kind` runs at `pace`'s period, and at once when it turns alert.
    pub fn pace_with(&mut self, kind: SourceKind, pace: Arc<pace::Pace>) {
        self.schedules_of(kind)
            .for_each(|s| s.pace = Some(pace.clone()));
        if let Some(st) = lock(&self.stats).get_mut(&kind) {
            st.every_ms = pace.period_ms();
        }
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
            async move { take(s, &topo, clock.as_ref(), &stats, None).await.0 }
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
        let finish_by = self.finish_by;
        let grace = self.grace;
        for s in self.schedules {
            let clock = self.clock.clone();
            let mut topo = self.topology.clone();
            let stats = self.stats.clone();
            let tx = tx.clone();
            let mut shutdown = shutdown.clone();
            tasks.push(tokio::spawn(async move {
                let mut ticker = ticker::Ticker::new(&s);
                // Copied when it changes, not at every tick: a big node's topology (every
                // component's facts) is not small, and sources tick up to 4 times a second.
                let mut current = topo.borrow_and_update().clone();
                // A one-shot collection takes every source at least once, however short
                // its window (a 0 s snapshot still has processes, sockets, ...).
                let mut owed_first = finish_by.is_some();
                let mut delivered = false;
                let mut last_took = Duration::ZERO;
                loop {
                    if *shutdown.borrow() && !owed_first {
                        break;
                    }
                    if owed_first {
                        ticker.first().await;
                        owed_first = false;
                    } else {
                        tokio::select! {
                            _ = ticker.next() => {}
                            r = shutdown.changed() => { if r.is_err() || *shutdown.borrow() { break; } continue; }
                        }
                    }
                    let every_ms = ticker.period_ms();
                    if ticker.repaced() {
                        lock(&stats).entry(s.source.kind()).and_modify(|st| st.every_ms = every_ms);
                    }
                    // A place in the consumer's queue first: a source whose samples the
                    // consumer cannot take yet waits instead of sampling, so at most the
                    // channel's capacity of samples waits, whatever the consumer's lag.
                    let waiting = tokio::time::Instant::now();
                    let permit = tokio::select! {
                        p = tx.reserve() => p.ok(),
                        _ = shutdown.wait_for(|v| *v), if finish_by.is_none() => None,
                    };
                    let waited = waiting.elapsed().as_millis() as u64;
                    if waited >= every_ms {
                        lock(&stats).entry(s.source.kind()).and_modify(|st| st.late += waited / every_ms);
                    }
                    let Some(permit) = permit else { break };
                    if topo.has_changed().unwrap_or(false) {
                        current = topo.borrow_and_update().clone();
                    }
                    if delivered && !fits_in_window(finish_by, grace, last_took) {
                        // A one-shot window: a repeat that would end after the window adds
                        // nothing to it and only delays the snapshot.
                        break;
                    }
                    let sampled = take(&s, &current, clock.as_ref(), &stats, finish_by);
                    // Without a finish time, stopping cuts an in-flight sample short (its
                    // py-spy children die with the dropped future) instead of waiting for it.
                    let stopped = async {
                        match finish_by {
                            Some(_) => std::future::pending::<()>().await,
                            None => { let _ = shutdown.wait_for(|v| *v).await; }
                        }
                    };
                    let (sample, elapsed, cut) = tokio::select! {
                        r = sampled => r,
                        _ = stopped => break,
                    };
                    if cut && delivered {
                        // The window closed on a repeat sample: it carries nothing, and the
                        // source's last real sample stands (one late tick must not turn a
                        // snapshot's processes "unavailable").
                        continue;
                    }
                    delivered = true;
                    last_took = Duration::from_millis(elapsed);
                    if elapsed > every_ms {
                        lock(&stats).entry(s.source.kind()).and_modify(|st| st.late += elapsed / every_ms);
                    }
                    permit.send(sample);
                    lock(&stats).entry(s.source.kind()).and_modify(|st| st.samples += 1);
                }
            }));
        }
        drop(tx);
        for t in tasks {
            let _ = t.await;
        }
    }
}

/// Whether a sample that takes `took` (the source's last one), started now, ends within a
/// one-shot window that must be finished by `finish_by` (its end plus `grace`). Always true
/// outside a one-shot window.
fn fits_in_window(
    finish_by: Option<tokio::time::Instant>,
    grace: Duration,
    took: Duration,
) -> bool {
    finish_by.is_none_or(|f| tokio::time::Instant::now() + took <= f - grace)
}

/// Takes one sample under the schedule's timeout, and never past `finish_by`; updates
/// stats. Returns the sample, the (tokio) time it took in ms, and whether the window's end
/// cut it short (then a source that already delivered keeps its last status).
async fn take(
    s: &Schedule,
    topo: &Topology,
    clock: &dyn Clock,
    stats: &StatsHandle,
    finish_by: Option<tokio::time::Instant>,
) -> (Sample, u64, bool) {
    let kind = s.source.kind();
    let start = tokio::time::Instant::now();
    let mut timeout = Duration::from_millis(s.timeout_ms);
    let mut cut_by_window = false;
    // The first processes sample is never cut by the window, only by its own timeout:
    // without it there is no topology and nothing else means anything.
    let first_processes =
        kind == SourceKind::Processes && lock(stats).get(&kind).is_none_or(|st| st.samples == 0);
    let window_end = finish_by.filter(|_| !first_processes);
    if let Some(left) = window_end.map(|f| f.saturating_duration_since(start)) {
        if left < timeout {
            (timeout, cut_by_window) = (left, true);
        }
    }
    let sample = crate::sources::window::until(window_end, s.source.sample(topo, clock));
    let res = tokio::time::timeout(timeout, sample).await;
    let elapsed = start.elapsed().as_millis() as u64;
    let timed_out = res.is_err();
    let sample = match res {
        Ok(sample) => sample,
        Err(_) => Sample {
            t_ms: clock.now_ms(),
            status: SourceStatus::unavailable(if cut_by_window {
                format!(
                    "{} cut off after {elapsed} ms: still running at the end of the window",
                    kind.as_str()
                )
            } else {
                format!("{} timed out after {} ms", kind.as_str(), s.timeout_ms)
            }),
            took_ms: elapsed,
            payload: empty_payload(kind),
        },
    };
    let cut = timed_out && cut_by_window;
    let mut g = lock(stats);
    if let Some(st) = g.get_mut(&kind).filter(|st| !(cut && st.samples > 0)) {
        st.last_t_ms = Some(sample.t_ms);
        st.took_ms = sample.took_ms.max(elapsed);
        st.status = sample.status.clone();
        if timed_out {
            st.timeouts += 1;
            st.dropped += 1;
        }
    }
    drop(g);
    (sample, elapsed, cut)
}

impl Sampler {
    /// Samples for `duration_ms` (tokio time) into `model`, then stops: what a one-shot
    /// `snapshot` without a daemon does. Returns the number of samples ingested.
    /// The model takes the sampler's topology.
    pub async fn collect(
        mut self,
        model: &mut crate::correlate::Correlator,
        duration_ms: u64,
    ) -> u64 {
        let topo = self.topology.borrow().clone();
        if model.topology() != &topo {
            model.set_topology(topo);
        }
        let deadline = tokio::time::Instant::now() + Duration::from_millis(duration_ms);
        let finish_by = deadline + self.grace;
        self.finish_by = Some(finish_by);
        let (tx, mut rx) = mpsc::channel(4096);
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut task = tokio::spawn(self.run(tx, stop_rx));
        let mut n = 0;
        while let Ok(Some(s)) = tokio::time::timeout_at(deadline, rx.recv()).await {
            model.ingest_owned(s);
            n += 1;
        }
        let _ = stop_tx.send(true);
        // Samples in flight at the deadline are still taken (each cut off at `finish_by`).
        while let Ok(Some(s)) = tokio::time::timeout_at(finish_by, rx.recv()).await {
            model.ingest_owned(s);
            n += 1;
        }
        // Every take ends by `finish_by`; a source that blocks its thread instead of
        // awaiting would not, and is abandoned (its future dropped) rather than waited for.
        let backstop = finish_by + Duration::from_millis(250);
        if tokio::time::timeout_at(backstop, &mut task).await.is_err() {
            task.abort();
        }
        while let Ok(s) = rx.try_recv() {
            model.ingest_owned(s);
            n += 1;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::BoxFuture;

    /// A source whose sample never completes (a hung driver, a py-spy that never exits).
    struct Hangs;

    impl Source for Hangs {
        fn kind(&self) -> SourceKind {
            SourceKind::Stacks
        }
        fn sample<'a>(&'a self, _: &'a Topology, _: &'a dyn Clock) -> BoxFuture<'a, Sample> {
            Box::pin(std::future::pending())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn collect_ends_within_window_plus_grace_whatever_hangs() {
        let (_tx, rx) = watch::channel(Topology::default());
        let mut s = Sampler::new(Arc::new(crate::clock::FakeClock::new(0)), rx);
        // Its own timeout is far past the window: the window must win.
        s.add(Arc::new(Hangs), 15_000, 60_000);
        let stats = s.stats();
        let mut model = crate::correlate::Correlator::new(Default::default());
        let t0 = tokio::time::Instant::now();
        s.collect(&mut model, 1_000).await;
        let took = t0.elapsed();
        assert!(took <= Duration::from_millis(2_500), "{took:?}");
        let st = lock(&stats)[&SourceKind::Stacks].status.clone();
        assert!(
            st.reason
                .as_deref()
                .is_some_and(|r| r.contains("end of the window")),
            "{st:?}"
        );
    }

    /// A shorter grace ends a one-shot collection that much sooner.
    #[tokio::test(start_paused = true)]
    async fn a_shorter_grace_ends_a_hung_collection_sooner() {
        let (_tx, rx) = watch::channel(Topology::default());
        let mut s = Sampler::new(Arc::new(crate::clock::FakeClock::new(0)), rx);
        s.add(Arc::new(Hangs), 15_000, 60_000);
        let mut model = crate::correlate::Correlator::new(Default::default());
        let t0 = tokio::time::Instant::now();
        s.with_grace(Duration::from_millis(300))
            .collect(&mut model, 1_000)
            .await;
        let took = t0.elapsed();
        assert!(
            (Duration::from_millis(1_300)..Duration::from_millis(1_600)).contains(&took),
            "{took:?}"
        );
    }

    /// Takes 600 ms per sample (a py-spy dump of a busy scheduler).
    struct Slow;

    impl Source for Slow {
        fn kind(&self) -> SourceKind {
            SourceKind::Stacks
        }
        fn sample<'a>(&'a self, _: &'a Topology, c: &'a dyn Clock) -> BoxFuture<'a, Sample> {
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(600)).await;
                Sample {
                    t_ms: c.now_ms(),
                    status: SourceStatus::ok(),
                    took_ms: 600,
                    payload: empty_payload(SourceKind::Stacks),
                }
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_one_shot_starts_no_repeat_that_would_end_after_its_window() {
        let (_tx, rx) = watch::channel(Topology::default());
        let mut s = Sampler::new(Arc::new(crate::clock::FakeClock::new(0)), rx);
        s.add(Arc::new(Slow), 100, 5_000);
        let mut model = crate::correlate::Correlator::new(Default::default());
        let t0 = tokio::time::Instant::now();
        let n = s.collect(&mut model, 1_000).await;
        let took = t0.elapsed();
        // The second would run from 600 to 1,200 ms: not started, so the snapshot is ready
        // when the first ends instead of 200 ms after its window.
        assert_eq!(n, 1);
        assert!(took <= Duration::from_millis(1_000), "{took:?}");
    }

    /// Answers at once the first time, then hangs (a /proc read stuck behind a busy host).
    struct FirstOnly(std::sync::atomic::AtomicU32);

    impl Source for FirstOnly {
        fn kind(&self) -> SourceKind {
            SourceKind::Processes
        }
        fn sample<'a>(&'a self, _: &'a Topology, c: &'a dyn Clock) -> BoxFuture<'a, Sample> {
            let n = self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Box::pin(async move {
                if n > 0 {
                    std::future::pending::<()>().await;
                }
                Sample {
                    t_ms: c.now_ms(),
                    status: SourceStatus::ok(),
                    took_ms: 0,
                    payload: empty_payload(SourceKind::Processes),
                }
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_repeat_sample_cut_by_the_window_keeps_the_first_ones_status() {
        let (_tx, rx) = watch::channel(Topology::default());
        let mut s = Sampler::new(Arc::new(crate::clock::FakeClock::new(0)), rx);
        s.add(Arc::new(FirstOnly(Default::default())), 1_000, 60_000);
        let stats = s.stats();
        let mut model = crate::correlate::Correlator::new(Default::default());
        let n = s.collect(&mut model, 1_500).await;
        assert_eq!(n, 1, "only the real sample is ingested");
        let st = lock(&stats)[&SourceKind::Processes].clone();
        assert_eq!(st.status, SourceStatus::ok(), "{st:?}");
        assert_eq!(st.samples, 1);
    }

    /// A source that answers at once with an empty sample.
    struct Quick;

    impl Source for Quick {
        fn kind(&self) -> SourceKind {
            SourceKind::Stacks
        }
        fn sample<'a>(&'a self, _: &'a Topology, c: &'a dyn Clock) -> BoxFuture<'a, Sample> {
            Box::pin(async move {
                Sample {
                    t_ms: c.now_ms(),
                    status: SourceStatus::ok(),
                    took_ms: 0,
                    payload: empty_payload(SourceKind::Stacks),
                }
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_kicked_source_runs_at_once_between_its_ticks() {
        let (_tx, rx) = watch::channel(Topology::default());
        let mut s = Sampler::new(Arc::new(crate::clock::FakeClock::new(0)), rx);
        s.add(Arc::new(Quick), 60_000, 1_000);
        let kick = kick::StacksKick::new(Duration::from_secs(1));
        s.kick_with(SourceKind::Stacks, kick.clone());
        let (tx, mut samples) = mpsc::channel(16);
        let (_stop_tx, stop_rx) = watch::channel(false);
        let _task = tokio::spawn(s.run(tx, stop_rx));
        assert!(
            samples.recv().await.is_some(),
            "the first tick is immediate"
        );
        let none = tokio::time::timeout(Duration::from_secs(5), samples.recv()).await;
        assert!(none.is_err(), "not before its next tick unless kicked");
        kick.set_suspected(true);
        assert!(kick.on_snapshot());
        let kicked = tokio::time::timeout(Duration::from_secs(1), samples.recv()).await;
        assert!(matches!(kicked, Ok(Some(_))), "a kick runs it at once");
    }

    /// How many samples arrive within `ms`.
    async fn count_for(rx: &mut mpsc::Receiver<Sample>, ms: u64) -> usize {
        let end = tokio::time::Instant::now() + Duration::from_millis(ms);
        let mut n = 0;
        while let Ok(Some(_)) = tokio::time::timeout_at(end, rx.recv()).await {
            n += 1;
        }
        n
    }

    #[tokio::test(start_paused = true)]
    async fn a_paced_source_runs_slow_while_calm_and_at_once_then_fast_when_alerted() {
        let (_tx, rx) = watch::channel(Topology::default());
        let mut s = Sampler::new(Arc::new(crate::clock::FakeClock::new(0)), rx);
        s.add(Arc::new(Quick), 250, 1_000);
        let pace = pace::Pace::new(1_000, 250);
        s.pace_with(SourceKind::Stacks, pace.clone());
        let stats = s.stats();
        assert_eq!(lock(&stats)[&SourceKind::Stacks].every_ms, 1_000);
        let (tx, mut samples) = mpsc::channel(64);
        let (_stop_tx, stop_rx) = watch::channel(false);
        let _task = tokio::spawn(s.run(tx, stop_rx));
        // calm: the first tick at once, then one a second
        assert_eq!(count_for(&mut samples, 2_900).await, 3);
        pace.set_alert(true);
        let woken = tokio::time::timeout(Duration::from_millis(10), samples.recv()).await;
        assert!(matches!(woken, Ok(Some(_))), "the alert runs it at once");
        assert_eq!(
            count_for(&mut samples, 2_010).await,
            8,
            "then four a second"
        );
        assert_eq!(lock(&stats)[&SourceKind::Stacks].every_ms, 250);
        pace.set_alert(false);
        let _ = count_for(&mut samples, 300).await; // the tick already due at the fast period
        assert_eq!(count_for(&mut samples, 3_000).await, 3, "calm again");
    }

    /// Counts how often it was asked for a sample.
    struct Counting(std::sync::atomic::AtomicU32);

    impl Source for Counting {
        fn kind(&self) -> SourceKind {
            SourceKind::Sockets
        }
        fn sample<'a>(&'a self, _: &'a Topology, c: &'a dyn Clock) -> BoxFuture<'a, Sample> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Box::pin(async move {
                Sample {
                    t_ms: c.now_ms(),
                    status: SourceStatus::ok(),
                    took_ms: 0,
                    payload: empty_payload(SourceKind::Sockets),
                }
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_consumer_behind_holds_at_most_the_queue_and_nothing_is_sampled_for_nothing() {
        let (_tx, rx) = watch::channel(Topology::default());
        let mut s = Sampler::new(Arc::new(crate::clock::FakeClock::new(0)), rx);
        let source = Arc::new(Counting(Default::default()));
        s.add(source.clone(), 10, 1_000);
        let stats = s.stats();
        let (tx, mut samples) = mpsc::channel(4);
        let (_stop_tx, stop_rx) = watch::channel(false);
        let _task = tokio::spawn(s.run(tx, stop_rx));
        // the consumer is held up for a second: 100 ticks
        tokio::time::sleep(Duration::from_secs(1)).await;
        let asked = || source.0.load(std::sync::atomic::Ordering::SeqCst);
        assert!(asked() <= 4, "sampled {} times for a queue of 4", asked());
        assert_eq!(samples.len(), 4);
        let st = lock(&stats)[&SourceKind::Sockets].clone();
        assert_eq!((st.dropped, st.samples), (0, 4), "{st:?}");
        // it catches up: samples flow again, the held-up ticks counted as late
        for _ in 0..10 {
            assert!(samples.recv().await.is_some());
        }
        assert!(asked() >= 10);
        assert!(lock(&stats)[&SourceKind::Sockets].late >= 90);
    }

    #[tokio::test(start_paused = true)]
    async fn stopping_run_cuts_an_in_flight_sample_short() {
        let (_tx, rx) = watch::channel(Topology::default());
        let mut s = Sampler::new(Arc::new(crate::clock::FakeClock::new(0)), rx);
        s.add(Arc::new(Hangs), 15_000, 60_000);
        let (tx, _samples) = mpsc::channel(16);
        let (stop_tx, stop_rx) = watch::channel(false);
        let t0 = tokio::time::Instant::now();
        let task = tokio::spawn(s.run(tx, stop_rx));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let _ = stop_tx.send(true);
        let _ = task.await;
        assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    }
}
