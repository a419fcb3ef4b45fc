//! Incident bundles (issue 36) from a real daemon (its socket, its recording, its threads)
//! fed by scripted sources: a critical wedge opens an incident whose bundle holds the
//! moment; it closes as `requests_finished` when the requests go and as `process_restarted`
//! when the process is replaced; the bounds remove the oldest; a daemon that stops closes
//! what is open; and at start the daemon closes what a killed one left open and sweeps its
//! half-written bundles, never touching files it did not write. The lab version (a real
//! stack, kill -9 of the engine) is `tests/labs/incidents_lab.rs`.

use correl_common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use wedgewatch::clock::Clock;
use wedgewatch::daemon::incidents::{self, ClosedBy, Incident, Kept, RecordingPart};
use wedgewatch::daemon::{Daemon, DaemonConfig, DiscoverFn};
use wedgewatch::model::*;
use wedgewatch::sources::{BoxFuture, Source};
use wedgewatch_testkit::correl as correl_common;

/// A socket table the test changes while the daemon samples it.
struct Table(Arc<Mutex<SocketTable>>);
impl Source for Table {
    fn kind(&self) -> SourceKind {
        SourceKind::Sockets
    }
    fn sample<'a>(&'a self, _t: &'a Topology, clock: &'a dyn Clock) -> BoxFuture<'a, Sample> {
        let table = self.0.lock().map(|t| t.clone()).unwrap_or_default();
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

/// The router's process (pid 200); `gen` is its start time: a new one is a restart.
struct Router(Arc<AtomicU64>);
impl Source for Router {
    fn kind(&self) -> SourceKind {
        SourceKind::Processes
    }
    fn sample<'a>(&'a self, _t: &'a Topology, clock: &'a dyn Clock) -> BoxFuture<'a, Sample> {
        let start = 1_000 + self.0.load(Ordering::SeqCst);
        Box::pin(async move {
            Sample {
                t_ms: clock.now_ms(),
                status: SourceStatus::ok(),
                took_ms: 1,
                payload: Payload::Processes(vec![ProcessFacts {
                    pid: 200,
                    start_ticks: Some(start),
                    cmdline: Some(vec!["sglang-router".into()]),
                    ..Default::default()
                }]),
            }
        })
    }
}

/// A request accepted by the router and never forwarded: `wedged_request` at the router,
/// critical.
fn wedged() -> SocketTable {
    let mut sim = Sim::new(pd_topology());
    let c = sim.connect(None, 30000, 200);
    sim.request(c, 700);
    sim.socket_table()
}

fn idle() -> SocketTable {
    Sim::new(pd_topology()).socket_table()
}

/// Waits (bounded: a loaded machine's slack over seconds of daemon passes) until the kept
/// incidents satisfy `pred`.
fn wait_until(dir: &Path, what: &str, pred: impl Fn(&[Kept]) -> bool) -> Vec<Kept> {
    let started = Instant::now();
    loop {
        let kept = incidents::list(dir).expect("list");
        if pred(&kept) {
            return kept;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{what}: never came; kept {:#?}",
            kept.iter()
                .map(|k| (&k.name, &k.incident))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn closed_by(k: &Kept) -> Option<ClosedBy> {
    k.incident.closed.as_ref().map(|c| c.by)
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p)
        .expect("stat")
        .permissions()
        .mode()
        & 0o7777
}

/// 2020-09-13: before any incident the test's daemon opens.
const LONG_AGO: i64 = 1_600_000_000_000;

/// What a daemon killed with -9 leaves: an incident still open, and a bundle half written.
fn plant_leftovers(dir: &Path) -> (String, PathBuf) {
    std::fs::create_dir_all(dir).expect("mkdir");
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let open = Incident::opened(
        FindingKind::WedgedRequest,
        Some(DECODE.into()),
        "left open".into(),
        LONG_AGO,
    );
    let name = incidents::names::dir_name(LONG_AGO, &open.kind, Some(DECODE), 1);
    let staged = wedgewatch::safe_fs::staged::StagedDir::beside(&dir.join(&name)).expect("stage");
    let json = serde_json::to_vec(&open).expect("json");
    staged.write_file("incident.json", &json).expect("write");
    staged.commit().expect("commit");
    let half = incidents::names::dir_name(LONG_AGO + 1_000, &open.kind, Some(DECODE), 1);
    let half = wedgewatch::safe_fs::staged::StagedDir::beside(&dir.join(half)).expect("stage");
    half.write_file("snapshot.json", b"{").expect("write");
    let half_path = half.path().to_path_buf();
    std::mem::forget(half); // the daemon died before the rename
    (name, half_path)
}

fn start(cfg: &DaemonConfig, table: &Arc<Mutex<SocketTable>>, gen: &Arc<AtomicU64>) -> Daemon {
    let discover: DiscoverFn = Arc::new(|| Box::pin(async { Ok(pd_topology()) }));
    let mut d = Daemon::new(
        cfg.clone(),
        Arc::new(wedgewatch::clock::SystemClock),
        discover,
    );
    d.add_source(Arc::new(Table(table.clone())), 20, 500);
    d.add_source(Arc::new(Router(gen.clone())), 20, 500);
    d
}

fn config(state: &Path) -> DaemonConfig {
    let mut cfg = DaemonConfig::new(state.to_path_buf());
    cfg.rotation = Some(wedgewatch::record::RotationPolicy {
        max_segment_bytes: 1 << 20,
        keep_segments: 4,
    });
    cfg.thresholds.correlate.wedged_after_ms = 400; // the real default is 30 s
    cfg.log_every_ms = 200;
    cfg.incidents = Some(incidents::IncidentPolicy {
        keep: 2,
        max_bytes: 64 << 20,
        before_ms: 60_000,
    });
    cfg
}

/// The first incident's bundle: the moment (the wedge at the router), its report, a
/// recording that replays, owner-only.
fn check_bundle(k: &Kept) {
    assert_eq!(k.incident.kind, FindingKind::WedgedRequest);
    assert_eq!(k.incident.component.as_deref(), Some(ROUTER));
    assert!(
        k.name.ends_with("-wedged_request-router_127.0.0.1_30000"),
        "{}",
        k.name
    );
    assert_eq!(mode(&k.path), 0o700);
    for f in [
        "snapshot.json",
        "report.md",
        "recording.wwrec",
        "incident.json",
    ] {
        assert_eq!(mode(&k.path.join(f)), 0o600, "{f}");
    }
    let snap = wedgewatch::snapshot::read_snapshot(&k.path).expect("the bundle reads as one");
    assert!(
        snap.findings
            .iter()
            .any(|f| f.kind == FindingKind::WedgedRequest && f.component.as_deref() == Some(ROUTER)),
        "{:#?}",
        snap.findings
    );
    let report = std::fs::read_to_string(k.path.join("report.md")).expect("report");
    assert!(report.starts_with("> **Incident**"), "{report}");
    assert!(report.contains("wedged_request"), "{report}");
    let RecordingPart::Kept { samples, .. } = &k.incident.recording else {
        panic!("no recording: {:?}", k.incident.recording);
    };
    assert!(*samples > 0);
    let rec = wedgewatch::record::Recording::open(&k.path.join("recording.wwrec")).expect("rec");
    let r = wedgewatch::record::replay(&rec, None, Default::default()).expect("replay");
    assert_eq!(
        r.model.topology().components.len(),
        4,
        "it replays on its own"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn critical_findings_become_bundles_closed_by_what_ended_them_and_bounded() {
    let tmp = tempfile::tempdir().expect("tmp");
    let state = tmp.path().join("state");
    let dir = state.join("incidents");
    let (left_open, half) = plant_leftovers(&dir);
    std::fs::write(dir.join("notes.txt"), "someone's").expect("notes");
    let cfg = config(&state);
    let table = Arc::new(Mutex::new(idle()));
    let gen = Arc::new(AtomicU64::new(0));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(start(&cfg, &table, &gen).run(stop_rx));
    let wait = |what: &'static str, pred: fn(&[Kept]) -> bool| {
        let dir = dir.clone();
        tokio::task::spawn_blocking(move || wait_until(&dir, what, pred))
    };

    // At start: the incident a killed daemon left open is closed, its half bundle swept.
    let kept = wait("the leftover closed", |k| {
        k.len() == 1 && k[0].incident.closed.is_some()
    })
    .await
    .expect("join");
    assert_eq!(kept[0].name, left_open);
    assert_eq!(closed_by(&kept[0]), Some(ClosedBy::DaemonStopped));
    assert!(!half.exists(), "half-written bundle swept");

    // A wedge: a bundle of its moment, open.
    *table.lock().expect("table") = wedged();
    let kept = wait("a first incident", |k| k.len() == 2)
        .await
        .expect("join");
    check_bundle(&kept[1]);
    assert!(kept[1].incident.is_open());
    // Its requests go: closed, how long it lasted said.
    *table.lock().expect("table") = idle();
    let kept = wait("closed", |k| k.len() == 2 && !k[1].incident.is_open())
        .await
        .expect("join");
    assert_eq!(closed_by(&kept[1]), Some(ClosedBy::RequestsFinished));
    assert!(kept[1].incident.lasted_ms(0).is_some_and(|ms| ms > 0));
    let report = std::fs::read_to_string(kept[1].path.join("report.md")).expect("report");
    assert!(report.contains("requests_finished"), "{report}");

    // A second wedge, ended by a restart of the router: a second incident, closed as
    // process_restarted; the bound (2) removes the oldest, the daemon_stopped one.
    *table.lock().expect("table") = wedged();
    let kept = wait("a second incident", |k| {
        k.len() == 2 && k[1].incident.is_open()
    })
    .await
    .expect("join");
    assert!(kept.iter().all(|k| k.name != left_open));
    gen.store(1, Ordering::SeqCst);
    *table.lock().expect("table") = idle();
    let kept = wait("restart closes it", |k| {
        k.iter().all(|k| !k.incident.is_open())
    })
    .await
    .expect("join");
    let second = kept.last().expect("second");
    assert_eq!(
        closed_by(second),
        Some(ClosedBy::ProcessRestarted),
        "{:?}",
        second.incident
    );
    let detail = second
        .incident
        .closed
        .as_ref()
        .and_then(|c| c.detail.clone());
    assert!(
        detail.is_some_and(|d| d.contains("200:1000")),
        "{:?}",
        second.incident
    );

    // A third, open when the daemon stops: closed as daemon_stopped, with its end.
    *table.lock().expect("table") = wedged();
    wait("a third incident", |k| {
        k.last().is_some_and(|k| k.incident.is_open())
    })
    .await
    .expect("join");
    let _ = stop_tx.send(true);
    task.await.expect("join").expect("daemon run");
    let kept = wait("stopped closes it", |k| {
        k.iter().all(|k| !k.incident.is_open())
    })
    .await
    .expect("join");
    assert_eq!(kept.len(), 2);
    let third = kept.last().expect("third");
    assert_eq!(closed_by(third), Some(ClosedBy::DaemonStopped));
    assert!(third.incident.lasted_ms(0).is_some(), "its end was seen");
    assert_eq!(
        std::fs::read_to_string(dir.join("notes.txt")).expect("kept"),
        "someone's",
        "a file the daemon did not write"
    );
}
