//! Sampler cadences, timeouts and drop counting with fake sources on tokio's paused clock
//! (virtual time: deterministic, no real sleeps); the daemon's Unix socket (0600) and a
//! query round trip.

use correl_common::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use wedgewatch::clock::{Clock, Millis};
use wedgewatch::model::*;
use wedgewatch::sampler::Sampler;
use wedgewatch::sources::{BoxFuture, Source};
use wedgewatch_testkit::correl as correl_common;

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
    Arc::new(FakeSource {
        kind,
        delay_ms,
        calls: AtomicU64::new(0),
    })
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
    assert!(
        (39..=41).contains(&sockets.len()),
        "4 Hz for 10 s: {}",
        sockets.len()
    );
    // Timestamps come from the injected clock.
    assert!(
        sockets.windows(2).all(|w| w[1].t_ms - w[0].t_ms == 250),
        "{:?}",
        sockets.iter().map(|s| s.t_ms).collect::<Vec<_>>()
    );
    let stacks = &by_kind[&SourceKind::Stacks];
    assert_eq!(stacks.len(), 2, "ticks at 0 and 5 s, both timed out");
    assert!(stacks.iter().all(|s| s.status.status == Status::Unavailable
        && s.status.reason.as_deref() == Some("stacks timed out after 3000 ms")));
    let st = stats.lock().expect("stats").clone();
    assert_eq!(st[&SourceKind::Stacks].timeouts, 2);
    assert_eq!(st[&SourceKind::Stacks].dropped, 2);
    assert!(
        st[&SourceKind::Gpu].late >= 10,
        "{:?}",
        st[&SourceKind::Gpu]
    );
    assert_eq!(st[&SourceKind::Sockets].late, 0);
    assert_eq!(st[&SourceKind::Sockets].samples as usize, sockets.len());
    assert_eq!(st[&SourceKind::Sockets].status.status, Status::Ok);
}

#[tokio::test(start_paused = true)]
async fn sampler_waits_for_a_consumer_that_does_not_take() {
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
    // nothing sampled only to be dropped: the ticks it waited through are late
    assert_eq!((st.samples, st.dropped), (2, 0), "{st:?}");
    assert!(st.late >= 6, "{st:?}");
}

/// Processes facts for the decode engine; `gen` switches to a "restarted with a new env
/// var" process.
struct ProcSource {
    gen: Arc<AtomicU64>,
}
impl Source for ProcSource {
    fn kind(&self) -> SourceKind {
        SourceKind::Processes
    }
    fn sample<'a>(&'a self, _topo: &'a Topology, clock: &'a dyn Clock) -> BoxFuture<'a, Sample> {
        Box::pin(async move {
            let g = self.gen.load(Ordering::SeqCst);
            let mut env: std::collections::BTreeMap<String, String> =
                [("PATH".to_string(), "/usr/bin".to_string())]
                    .into_iter()
                    .collect();
            if g > 0 {
                env.insert("SGLANG_DECODE_SPLIT_TUNING".into(), "1".into());
            }
            Sample {
                t_ms: clock.now_ms(),
                status: SourceStatus::ok(),
                took_ms: 1,
                payload: Payload::Processes(vec![ProcessFacts {
                    pid: 400,
                    start_ticks: Some(1000 + g),
                    env: Some(env),
                    cmdline: Some(vec![
                        "python3".into(),
                        "-m".into(),
                        "sglang.launch_server".into(),
                    ]),
                    ..Default::default()
                }]),
            }
        })
    }
}

/// A socket table with one request waiting at the decode engine.
struct SockSource {
    table: SocketTable,
}
impl Source for SockSource {
    fn kind(&self) -> SourceKind {
        SourceKind::Sockets
    }
    fn sample<'a>(&'a self, _topo: &'a Topology, clock: &'a dyn Clock) -> BoxFuture<'a, Sample> {
        Box::pin(async move {
            Sample {
                t_ms: clock.now_ms(),
                status: SourceStatus::ok(),
                took_ms: 1,
                payload: Payload::Sockets(self.table.clone()),
            }
        })
    }
}

async fn wait_for(
    sock: &std::path::Path,
    what: &str,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    // Bounded: real sockets and real (short) cadences, at most ~5 s.
    for _ in 0..250 {
        if let Ok(v) = wedgewatch::daemon::query(sock, what, 2000).await {
            if pred(&v) {
                return v;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("daemon never answered {what} as expected");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_serves_state_on_an_owner_only_socket_and_takes_baselines() {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    use wedgewatch::daemon::*;
    let dir = tempfile::tempdir().expect("tmp");
    let mut cfg = DaemonConfig::new(dir.path().join("state"));
    cfg.rotation = Some(wedgewatch::record::RotationPolicy {
        max_segment_bytes: 1 << 20,
        keep_segments: 2,
    });
    cfg.rediscover_every_ms = 100;
    let sock = cfg.socket_path.clone();
    let discover: DiscoverFn = Arc::new(|| Box::pin(async { Ok(pd_topology()) }));
    let mut sim = Sim::new(pd_topology());
    let d = sim.connect(Some(200), 31012, 400);
    sim.request(d, 900);
    let gen = Arc::new(AtomicU64::new(0));
    let mut daemon = Daemon::new(
        cfg.clone(),
        Arc::new(wedgewatch::clock::SystemClock),
        discover,
    );
    daemon.add_source(
        Arc::new(SockSource {
            table: sim.socket_table(),
        }),
        20,
        500,
    );
    daemon.add_source(Arc::new(ProcSource { gen: gen.clone() }), 20, 500);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(daemon.run(stop_rx));

    let v = wait_for(&sock, "snapshot", |v| {
        v["sampler"]["sockets"]["samples"].as_u64().unwrap_or(0) > 2
    })
    .await;
    let md = std::fs::metadata(&sock).expect("socket");
    assert!(md.file_type().is_socket());
    assert_eq!(md.permissions().mode() & 0o777, 0o600, "owner only");
    assert_eq!(
        std::fs::metadata(&cfg.state_dir)
            .expect("dir")
            .permissions()
            .mode()
            & 0o777,
        0o700
    );
    assert_eq!(v["schema"], DAEMON_SCHEMA);
    let parts = parts_from_answer(&v).expect("parts");
    assert_eq!(parts.topology.components.len(), 4);
    assert_eq!(parts.sources[&SourceKind::Sockets].status, Status::Ok);
    assert_eq!(
        parts
            .requests
            .iter()
            .filter(|r| r.component == DECODE && r.state == RequestState::WaitingFirstByte)
            .count(),
        1
    );

    let b = wait_for(&sock, "baseline", |v| v["count"].as_u64() == Some(1)).await;
    assert_eq!(b["oldest"]["reason"], "start");
    assert_eq!(b["oldest"]["components"][0]["env"]["PATH"], "/usr/bin");

    // The decode engine "restarts" with one added variable: a new baseline, and the
    // snapshot names the variable.
    gen.store(1, Ordering::SeqCst);
    let b = wait_for(&sock, "baseline", |v| v["count"].as_u64() == Some(2)).await;
    assert!(
        b["latest"]["reason"]
            .as_str()
            .unwrap_or("")
            .contains("restart of decode"),
        "{b}"
    );
    let v = wait_for(&sock, "snapshot", |v| {
        v["parts"]["findings"]
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f["kind"] == "config_changed"))
    })
    .await;
    let parts = parts_from_answer(&v).expect("parts");
    let f = parts
        .findings
        .iter()
        .find(|f| f.kind == "config_changed")
        .expect("config_changed");
    assert!(
        f.evidence
            .iter()
            .any(|e| e.detail.contains("+ env SGLANG_DECODE_SPLIT_TUNING=1")),
        "{f:#?}"
    );
    assert!(parts.findings.iter().any(|f| f.kind == "process_restarted"));

    let err = query(&sock, "bogus", 2000)
        .await
        .expect_err("unknown request");
    assert!(err.to_string().contains("unknown request"), "{err}");
    let wide = query(&sock, "snapshot 300", 2000)
        .await
        .expect("snapshot 300");
    assert!(parts_from_answer(&wide).is_ok());
    let trace = query(&sock, "perfetto", 2000).await.expect("perfetto");
    assert!(trace["traceEvents"]
        .as_array()
        .is_some_and(|a| !a.is_empty()));
    assert!(query(&sock, "snapshot -5", 2000).await.is_err());
    assert!(query(&sock, "ping", 2000).await.expect("ping")["ok"]
        .as_bool()
        .unwrap_or(false));

    let _ = stop_tx.send(true);
    task.await.expect("join").expect("daemon run");
    assert!(!sock.exists(), "socket removed on shutdown");
    // The recording replays with the baselines.
    let rec = wedgewatch::record::Recording::open(&cfg.recording_dir()).expect("recording");
    let r = wedgewatch::record::replay(&rec, None, Default::default()).expect("replay");
    assert_eq!(r.baselines.len(), 2);
    assert!(r
        .model
        .config_changes()
        .iter()
        .any(|c| c.key.as_deref() == Some("SGLANG_DECODE_SPLIT_TUNING")));
}

/// A socket table the test changes while the daemon samples it.
struct SwitchedSockSource {
    table: std::sync::Mutex<SocketTable>,
}
impl Source for SwitchedSockSource {
    fn kind(&self) -> SourceKind {
        SourceKind::Sockets
    }
    fn sample<'a>(&'a self, _topo: &'a Topology, clock: &'a dyn Clock) -> BoxFuture<'a, Sample> {
        let table = self.table.lock().map(|t| t.clone()).unwrap_or_default();
        Box::pin(async move {
            Sample {
                t_ms: clock.now_ms(),
                status: SourceStatus::ok(),
                took_ms: 1,
                payload: Payload::Sockets(table),
            }
        })
    }
}

fn waiting_at(v: &serde_json::Value, component: &str) -> usize {
    v["requests"].as_array().map_or(0, |r| {
        r.iter()
            .filter(|r| r["component"] == component && r["state"] == "waiting_first_byte")
            .count()
    })
}

/// A client polling `json` back to back is served the answer the daemon built after the
/// socket tables (not one built per call), never one older than its `max_age`, and a
/// request opened since shows up within a few socket periods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_polling_json_is_served_the_answer_built_after_each_table() {
    use wedgewatch::daemon::*;
    let dir = tempfile::tempdir().expect("tmp");
    let cfg = DaemonConfig::new(dir.path().join("state"));
    let sock = cfg.socket_path.clone();
    let discover: DiscoverFn = Arc::new(|| Box::pin(async { Ok(pd_topology()) }));
    let mut sim = Sim::new(pd_topology());
    let d = sim.connect(Some(200), 31012, 400);
    sim.request(d, 900);
    let source = Arc::new(SwitchedSockSource {
        table: std::sync::Mutex::new(sim.socket_table()),
    });
    let mut daemon = Daemon::new(
        cfg.clone(),
        Arc::new(wedgewatch::clock::SystemClock),
        discover,
    );
    daemon.add_source(source.clone(), 200, 500);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(daemon.run(stop_rx));
    let _ = wait_for(&sock, "json", |v| waiting_at(v, DECODE) == 1).await;

    let max_age = wedgewatch::daemon::kept_answer::KeptAnswer::for_socket_period(
        cfg.thresholds.sampling.sockets_calm_ms,
    )
    .max_age();
    let max_age_ms = i64::try_from(max_age.as_millis()).expect("ms");
    let (mut taken, started) = (Vec::new(), std::time::Instant::now());
    while started.elapsed() < std::time::Duration::from_millis(1_500) {
        let asked = wedgewatch::clock::SystemClock.now_ms();
        let v = query(&sock, "json", 2000).await.expect("json");
        let at = v["taken_at"].as_str().unwrap_or_default().to_string();
        let at_ms = wedgewatch::clock::parse_rfc3339(&at).expect("taken_at");
        assert!(asked - at_ms <= max_age_ms + 5, "{at} asked at {asked}");
        taken.push(at);
    }
    let distinct: std::collections::BTreeSet<&String> = taken.iter().collect();
    assert!(
        distinct.len() * 2 < taken.len(),
        "{} answers, {} built: one per call, none kept",
        taken.len(),
        distinct.len()
    );

    // A request opens at the prefill engine: the kept answer follows, sooner than its age
    // would make a call build its own (slack for a loaded machine, under that age).
    let p = sim.connect(Some(200), 31011, 300);
    sim.request(p, 700);
    *source.table.lock().expect("table") = sim.socket_table();
    let opened = std::time::Instant::now();
    let _ = wait_for(&sock, "json", |v| waiting_at(v, PREFILL) == 1).await;
    assert!(
        opened.elapsed() < max_age - std::time::Duration::from_millis(500),
        "the new request took {:?} to show",
        opened.elapsed()
    );
    let _ = stop_tx.send(true);
    task.await.expect("join").expect("daemon run");
}

/// A daemon stopped (SIGSTOP, a host asleep) misses many rediscovery periods at once: it then
/// rediscovers once, not once per period missed (tokio's interval bursts them by default).
#[tokio::test(start_paused = true)]
async fn a_daemon_that_missed_a_minute_rediscovers_once_not_once_per_period() {
    use wedgewatch::daemon::*;
    let dir = tempfile::tempdir().expect("tmp");
    let mut cfg = DaemonConfig::new(dir.path().join("state"));
    cfg.rediscover_every_ms = 1_000;
    cfg.rotation = None;
    let found = Arc::new(AtomicU64::new(0));
    let counter = found.clone();
    let discover: DiscoverFn = Arc::new(move || {
        counter.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Ok(pd_topology()) })
    });
    let mut daemon = Daemon::new(
        cfg,
        Arc::new(TokioClock(tokio::time::Instant::now())),
        discover,
    );
    daemon.add_source(fake(SourceKind::Gpu, 1), 1_000, 500);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(daemon.run(stop_rx));
    tokio::time::sleep(std::time::Duration::from_millis(5_500)).await;
    let before = found.load(Ordering::SeqCst);
    assert!(
        (5..=8).contains(&before),
        "about one discovery a second: {before}"
    );
    // A minute passes with nothing run (the daemon stopped), then it runs again.
    tokio::time::advance(std::time::Duration::from_secs(60)).await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let after = found.load(Ordering::SeqCst);
    assert!(
        after - before <= 2,
        "{} rediscoveries right after the missed minute",
        after - before
    );
    stop_tx.send(true).expect("stop");
    task.await.expect("join").expect("daemon ran");
}

#[tokio::test]
async fn query_without_a_daemon_fails_clearly() {
    let dir = tempfile::tempdir().expect("tmp");
    let err = wedgewatch::daemon::query(&dir.path().join("none.sock"), "snapshot", 500)
        .await
        .expect_err("no daemon");
    assert!(err.to_string().contains("none.sock"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn collect_samples_a_window_into_a_model() {
    let clock: Arc<dyn Clock> = Arc::new(TokioClock(tokio::time::Instant::now()));
    let (_topo_tx, topo_rx) = tokio::sync::watch::channel(pd_topology());
    let mut sampler = Sampler::new(clock.clone(), topo_rx);
    let mut sim = Sim::new(pd_topology());
    let d = sim.connect(Some(200), 31012, 400);
    sim.request(d, 900);
    sampler.add(
        Arc::new(SockSource {
            table: sim.socket_table(),
        }),
        250,
        1000,
    );
    sampler.add(fake(SourceKind::Gpu, 5), 250, 1000);
    let mut model = wedgewatch::correlate::Correlator::default();
    let n = sampler.collect(&mut model, 3_000).await;
    assert!((24..=26).contains(&n), "{n}");
    let parts = wedgewatch::pipeline::parts(&model, clock.now_ms());
    assert_eq!(parts.sources[&SourceKind::Sockets].status, Status::Ok);
    assert_eq!(
        parts
            .requests
            .iter()
            .filter(|r| r.state == RequestState::WaitingFirstByte)
            .count(),
        1
    );
}

/// A socket table that can be swapped while the daemon runs.
struct SwitchSockSource {
    table: Arc<std::sync::Mutex<SocketTable>>,
}
impl Source for SwitchSockSource {
    fn kind(&self) -> SourceKind {
        SourceKind::Sockets
    }
    fn sample<'a>(&'a self, _topo: &'a Topology, clock: &'a dyn Clock) -> BoxFuture<'a, Sample> {
        Box::pin(async move {
            let table = self.table.lock().map(|t| t.clone()).unwrap_or_default();
            Sample {
                t_ms: clock.now_ms(),
                status: SourceStatus::ok(),
                took_ms: 1,
                payload: Payload::Sockets(table),
            }
        })
    }
}

/// The incident, compressed: the daemon watches a healthy stack; the decode engine restarts
/// with one added variable; a request then hangs at decode behind proxy and router. The
/// daemon's snapshot leads with the wedged request at decode and names the variable from
/// its own baseline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incident_wedge_at_decode_with_the_added_variable() {
    use wedgewatch::daemon::*;
    let dir = tempfile::tempdir().expect("tmp");
    let mut cfg = DaemonConfig::new(dir.path().join("state"));
    cfg.rotation = None;
    cfg.thresholds.correlate.wedged_after_ms = 400; // the real default is 30 s
                                                    // Process facts come at their calm pace (5 s) until a pass suspects the wedge: a pass
                                                    // every 200 ms sees it at once, and the restart is read at the fast pace after.
    cfg.log_every_ms = 200;
    let sock = cfg.socket_path.clone();
    let discover: DiscoverFn = Arc::new(|| Box::pin(async { Ok(pd_topology()) }));
    let idle = Sim::new(pd_topology()).socket_table();
    let table = Arc::new(std::sync::Mutex::new(idle));
    let gen = Arc::new(AtomicU64::new(0));
    let mut daemon = Daemon::new(
        cfg.clone(),
        Arc::new(wedgewatch::clock::SystemClock),
        discover,
    );
    daemon.add_source(
        Arc::new(SwitchSockSource {
            table: table.clone(),
        }),
        20,
        500,
    );
    daemon.add_source(Arc::new(ProcSource { gen: gen.clone() }), 20, 500);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(daemon.run(stop_rx));
    wait_for(&sock, "baseline", |v| v["count"].as_u64() == Some(1)).await;

    gen.store(1, Ordering::SeqCst); // decode restarted with SGLANG_DECODE_SPLIT_TUNING=1
    let mut sim = Sim::new(pd_topology());
    let a = sim.connect(None, 8000, 100);
    let b = sim.connect(Some(100), 30000, 200);
    let d = sim.connect(Some(200), 31012, 400);
    sim.request(a, 700);
    sim.request(b, 720);
    sim.request(d, 800);
    *table.lock().expect("table") = sim.socket_table();

    let v = wait_for(&sock, "snapshot", |v| {
        v["parts"]["findings"].as_array().is_some_and(|f| {
            f.iter().any(|f| f["kind"] == "wedged_request")
                && f.iter().any(|f| f["kind"] == "config_changed")
        })
    })
    .await;
    let parts = parts_from_answer(&v).expect("parts");
    let first = &parts.findings[0];
    assert_eq!(first.kind, "wedged_request", "{:#?}", parts.findings);
    assert_eq!(first.component.as_deref(), Some(DECODE));
    assert_eq!(first.role, Some(Role::Decode));
    // One request (named once), whose legs are the proxy, router and decode exchanges.
    assert_eq!(first.requests.len(), 1, "{:?}", first.requests);
    let l = parts
        .logical_requests
        .iter()
        .find(|l| l.id == first.requests[0])
        .expect("the named request");
    assert_eq!(l.legs.len(), 3, "proxy, router and decode legs: {l:?}");
    let cc = parts
        .findings
        .iter()
        .find(|f| f.kind == "config_changed")
        .expect("config_changed");
    assert!(
        cc.summary.contains("SGLANG_DECODE_SPLIT_TUNING"),
        "{}",
        cc.summary
    );
    let _ = stop_tx.send(true);
    task.await.expect("join").expect("daemon run");
}

#[tokio::test(start_paused = true)]
async fn record_to_file_then_replay() {
    let clock: Arc<dyn Clock> = Arc::new(TokioClock(tokio::time::Instant::now()));
    let (_topo_tx, topo_rx) = tokio::sync::watch::channel(pd_topology());
    let mut sampler = Sampler::new(clock.clone(), topo_rx);
    let mut sim = Sim::new(pd_topology());
    let d = sim.connect(Some(200), 31012, 400);
    sim.request(d, 900);
    sampler.add(
        Arc::new(SockSource {
            table: sim.socket_table(),
        }),
        250,
        1000,
    );
    sampler.add(
        Arc::new(ProcSource {
            gen: Arc::new(AtomicU64::new(0)),
        }),
        1000,
        1000,
    );
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("incident.wwrec");
    let n =
        wedgewatch::attach::record_to_file(sampler, &path, 40_000, &pd_topology(), clock.clone())
            .await
            .expect("record");
    assert!(
        (70..=90).contains(&n),
        "1 Hz sockets + 1 Hz processes for 40 s: {n}"
    );
    let rec = wedgewatch::record::Recording::open(&path).expect("open");
    let r = wedgewatch::record::replay(&rec, None, Default::default()).expect("replay");
    assert_eq!(r.baselines.len(), 1);
    let parts = wedgewatch::pipeline::parts(&r.model, r.at_ms);
    let w: Vec<_> = parts
        .findings
        .iter()
        .filter(|f| f.kind == "wedged_request")
        .collect();
    assert_eq!(w.len(), 1, "{:#?}", parts.findings);
    assert_eq!(w[0].component.as_deref(), Some(DECODE));
}

#[test]
fn query_blocking_works_outside_a_runtime_and_refuses_inside() {
    let dir = tempfile::tempdir().expect("tmp");
    let err = wedgewatch::daemon::query_blocking(&dir.path().join("none.sock"), "ping", 500)
        .expect_err("no daemon");
    assert!(err.to_string().contains("none.sock"), "{err}");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    let inside = rt.block_on(async {
        wedgewatch::daemon::query_blocking(&dir.path().join("none.sock"), "ping", 500)
    });
    assert!(inside
        .expect_err("inside")
        .to_string()
        .contains("inside a tokio runtime"));
}

/// Runs a daemon on `state` with `gen`'s processes and no request in flight, until `until`
/// holds for its `baseline` answer; returns that answer and its snapshot's findings.
async fn run_daemon_until(
    state: &std::path::Path,
    gen: Arc<AtomicU64>,
    until: impl Fn(&serde_json::Value) -> bool,
) -> (serde_json::Value, Vec<Finding>) {
    use wedgewatch::daemon::*;
    let mut cfg = DaemonConfig::new(state.to_path_buf());
    // a state runs healthy for 300 ms before it is known good
    cfg.thresholds.correlate.wedged_after_ms = 300;
    cfg.thresholds.correlate.stall_after_ms = 300;
    cfg.log_every_ms = 50;
    let sock = cfg.socket_path.clone();
    let discover: DiscoverFn = Arc::new(|| Box::pin(async { Ok(pd_topology()) }));
    let mut daemon = Daemon::new(cfg, Arc::new(wedgewatch::clock::SystemClock), discover);
    let table = Sim::new(pd_topology()).socket_table();
    daemon.add_source(Arc::new(SockSource { table }), 20, 500);
    daemon.add_source(Arc::new(ProcSource { gen }), 20, 500);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(daemon.run(stop_rx));
    let b = wait_for(&sock, "baseline", until).await;
    let v = wait_for(&sock, "snapshot", |v| v["parts"]["findings"].is_array()).await;
    let findings = parts_from_answer(&v).expect("parts").findings;
    let _ = stop_tx.send(true);
    task.await.expect("join").expect("daemon run");
    (b, findings)
}

/// Last known good (issue 37): a daemon keeps the newest facts that ran healthy, in its
/// state directory, and compares against them; restarted after a bad change (the decode
/// engine now has an added variable), it still names the change, where comparing with its
/// own start would compare bad with bad.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_started_after_a_bad_change_compares_with_the_last_known_good_state() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tmp");
    let state = dir.path().join("state");
    let gen = Arc::new(AtomicU64::new(0));
    let (b, findings) =
        run_daemon_until(&state, gen.clone(), |v| v["known_good"].is_object()).await;
    assert_eq!(b["known_good"]["known_good"], true, "{b}");
    assert!(
        findings.iter().all(|f| f.kind != "config_changed"),
        "{findings:#?}"
    );
    let file = state.join("known-good.json");
    let mode = std::fs::metadata(&file).expect("kept").permissions().mode();
    assert_eq!(mode & 0o777, 0o600);

    // the bad change while no daemon ran
    gen.store(1, Ordering::SeqCst);
    let (b, findings) = run_daemon_until(&state, gen, |v| v["count"].as_u64() == Some(1)).await;
    assert_eq!(b["oldest"]["reason"], "start");
    assert_eq!(
        b["oldest"]["components"][0]["env"]["SGLANG_DECODE_SPLIT_TUNING"],
        "1"
    );
    let changed = findings
        .iter()
        .find(|f| f.kind == "config_changed")
        .unwrap_or_else(|| panic!("the change against the known-good state: {findings:#?}"));
    assert!(
        changed
            .evidence
            .iter()
            .any(|e| e.detail.contains("+ env SGLANG_DECODE_SPLIT_TUNING=1")),
        "{changed:#?}"
    );
}
