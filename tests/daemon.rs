//! Sampler cadences, timeouts and drop counting with fake sources on tokio's paused clock
//! (virtual time: deterministic, no real sleeps); the daemon's Unix socket (0600) and a
//! query round trip.

mod correl_common;
use correl_common::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use wedgewatch::clock::{Clock, Millis};
use wedgewatch::model::*;
use wedgewatch::sampler::Sampler;
use wedgewatch::sources::{BoxFuture, Source};

/// A clock that follows tokio's (paused, virtual) time.
#[derive(Debug)]
struct TokioClock(tokio::time::Instant);
impl Clock for TokioClock {
    fn now_ms(&self) -> Millis {
        T0 + self.0.elapsed().as_millis() as Millis
    }
}

/// A source that takes `delay_ms` (virtual) and returns an empty payload of its kind.
struct FakeSource {
    kind: SourceKind,
    delay_ms: u64,
    calls: AtomicU64,
}
impl Source for FakeSource {
    fn kind(&self) -> SourceKind {
        self.kind
    }
    fn sample<'a>(&'a self, _topo: &'a Topology, clock: &'a dyn Clock) -> BoxFuture<'a, Sample> {
        Box::pin(async move {
            self.calls.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(std::time::Duration::from_millis(self.delay_ms)).await;
            Sample {
                t_ms: clock.now_ms(),
                status: SourceStatus::ok(),
                took_ms: self.delay_ms,
                payload: wedgewatch::sampler::empty_payload(self.kind),
            }
        })
    }
}

fn fake(kind: SourceKind, delay_ms: u64) -> Arc<FakeSource> {
    Arc::new(FakeSource { kind, delay_ms, calls: AtomicU64::new(0) })
}

#[tokio::test(start_paused = true)]
async fn sampler_runs_each_source_on_its_cadence_and_counts_trouble() {
    let clock: Arc<dyn Clock> = Arc::new(TokioClock(tokio::time::Instant::now()));
    let (_topo_tx, topo_rx) = tokio::sync::watch::channel(pd_topology());
    let mut sampler = Sampler::new(clock.clone(), topo_rx);
    sampler.add(fake(SourceKind::Sockets, 5), 250, 1000);
    sampler.add(fake(SourceKind::Gpu, 600), 250, 1000); // overruns its period: late
    sampler.add(fake(SourceKind::Stacks, 9000), 5000, 3000); // always times out
    let stats = sampler.stats();
    let (tx, mut rx) = tokio::sync::mpsc::channel(10_000);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let run = tokio::spawn(sampler.run(tx, stop_rx));
    tokio::time::sleep(std::time::Duration::from_millis(9_900)).await;
    let _ = stop_tx.send(true);
    run.await.expect("sampler task");

    let mut by_kind: std::collections::BTreeMap<SourceKind, Vec<Sample>> = Default::default();
    while let Ok(s) = rx.try_recv() {
        by_kind.entry(s.kind()).or_default().push(s);
    }
    let sockets = &by_kind[&SourceKind::Sockets];
    assert!((39..=41).contains(&sockets.len()), "4 Hz for 10 s: {}", sockets.len());
    // Timestamps come from the injected clock.
    assert!(sockets.windows(2).all(|w| w[1].t_ms - w[0].t_ms == 250), "{:?}", sockets.iter().map(|s| s.t_ms).collect::<Vec<_>>());
    let stacks = &by_kind[&SourceKind::Stacks];
    assert_eq!(stacks.len(), 2, "ticks at 0 and 5 s, both timed out");
    assert!(stacks.iter().all(|s| s.status.status == Status::Unavailable
        && s.status.reason.as_deref() == Some("stacks timed out after 3000 ms")));
    let st = stats.lock().expect("stats").clone();
    assert_eq!(st[&SourceKind::Stacks].timeouts, 2);
    assert_eq!(st[&SourceKind::Stacks].dropped, 2);
    assert!(st[&SourceKind::Gpu].late >= 10, "{:?}", st[&SourceKind::Gpu]);
    assert_eq!(st[&SourceKind::Sockets].late, 0);
    assert_eq!(st[&SourceKind::Sockets].samples as usize, sockets.len());
    assert_eq!(st[&SourceKind::Sockets].status.status, Status::Ok);
}

#[tokio::test(start_paused = true)]
async fn sampler_counts_samples_the_consumer_could_not_take() {
    let clock: Arc<dyn Clock> = Arc::new(TokioClock(tokio::time::Instant::now()));
    let (_topo_tx, topo_rx) = tokio::sync::watch::channel(Topology::default());
    let mut sampler = Sampler::new(clock, topo_rx);
    sampler.add(fake(SourceKind::Sockets, 1), 250, 1000);
    let stats = sampler.stats();
    let (tx, _rx) = tokio::sync::mpsc::channel(2); // nobody reads
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let run = tokio::spawn(sampler.run(tx, stop_rx));
    tokio::time::sleep(std::time::Duration::from_millis(2_000)).await;
    let _ = stop_tx.send(true);
    run.await.expect("sampler task");
    let st = stats.lock().expect("stats")[&SourceKind::Sockets].clone();
    assert_eq!(st.samples, 2);
    assert!(st.dropped >= 6, "{st:?}");
}
