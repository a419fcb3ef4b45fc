//! `wedgewatch tui`: the live UI. It always reads a daemon over its socket: a running one
//! if there is one, else a private in-process daemon started for the session, so live view,
//! snapshot and daemon share one code path. `--replay FILE` plays a recording instead, or
//! shows a snapshot file or bundle directory as a still frame.

use crate::{attach_options, daemon_config, runtime, thresholds, Global, TuiArgs};
use anyhow::Context;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Duration;
use wedgewatch::attach::{self, AttachOptions};
use wedgewatch::clock::{Clock, SystemClock};
use wedgewatch::daemon::{self, Daemon, DaemonConfig};
use wedgewatch::detect::Thresholds;
use wedgewatch::model::Snapshot;
use wedgewatch::record::Recording;
use wedgewatch::sampler::SourceStats;
use wedgewatch::snapshot::{self, AssembleOptions};
use wedgewatch::tui::{self, AppOptions, ChannelFeed, FeedFrame, ReplayFeed, SamplerHealth};

/// How often the UI asks the daemon for a fresh model.
const POLL_MS: u64 = 1000;

pub fn cmd_tui(g: &Global, a: TuiArgs) -> anyhow::Result<i32> {
    let assemble = AssembleOptions {
        redact: !g.no_redact,
        ..AssembleOptions::default()
    };
    if let Some(path) = &a.replay {
        return replay(path, assemble, thresholds(g)?);
    }
    let cfg = daemon_config(g);
    if !a.no_daemon && daemon_answers(&cfg.socket_path) {
        return watch_socket(&cfg.socket_path, assemble);
    }
    let opts = attach_options(g)?;
    let th = opts.thresholds.clone();
    let session = InProcessDaemon::start(&opts, th, 10_000)?;
    watch_socket(&session.socket, assemble)
}

fn daemon_answers(socket: &Path) -> bool {
    if !socket.exists() {
        return false;
    }
    match daemon::query_blocking(socket, "ping", 1000) {
        Ok(_) => true,
        Err(e) => {
            // e.g. a socket another user planted: say why it is not used
            eprintln!("wedgewatch: daemon not usable ({e}); sampling in-process instead");
            false
        }
    }
}

fn replay(path: &Path, assemble: AssembleOptions, th: Thresholds) -> anyhow::Result<i32> {
    // a bundle or snapshot.json (what a bug report carries) is one still frame
    if let Some(snap) = super::report::still_frame(path)? {
        let mut feed = ReplayFeed::still(snap);
        tui::run(&mut feed, app_options())?;
        return Ok(0);
    }
    let rec = Recording::open(path)?;
    let (frames, stats) = attach::replay_frames_counted(&rec, 1000, th)?;
    if frames.is_empty() {
        anyhow::bail!("{}: the recording holds no samples", path.display());
    }
    let snaps: Vec<Snapshot> = frames
        .into_iter()
        .map(|p| snapshot::assemble(p, &assemble))
        .collect();
    let mut feed = ReplayFeed::with_note(snaps, stats.brief());
    tui::run(&mut feed, app_options())?;
    Ok(0)
}

fn app_options() -> AppOptions {
    let mut o = AppOptions::from_env();
    o.snapshot_writer = Some(Box::new(|snap: &Snapshot| {
        let dir = PathBuf::from(format!(
            "wedgewatch-snapshot-{}",
            snap.taken_at.replace([':', '.'], "-")
        ));
        snapshot::write_bundle(snap, &Default::default(), &dir, snapshot::Overwrite::Refuse)
            .map(|_| dir)
            .map_err(|e| e.to_string())
    }));
    o
}

/// Runs the UI on a daemon socket until the user quits.
pub fn watch_socket(socket: &Path, assemble: AssembleOptions) -> anyhow::Result<i32> {
    let (tx, mut feed) = ChannelFeed::channel();
    let poller = spawn_poller(socket.to_path_buf(), assemble, tx);
    let r = tui::run(&mut feed, app_options());
    drop(feed); // the poller's next send fails and it ends
    let _ = poller.join();
    r?;
    Ok(0)
}

/// A thread that asks the daemon for a snapshot every second and feeds the UI. It ends
/// when the UI is gone.
pub fn spawn_poller(
    socket: PathBuf,
    assemble: AssembleOptions,
    tx: Sender<FeedFrame>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || loop {
        let frame = match daemon::query_blocking(&socket, "snapshot", 5000) {
            Ok(v) => match daemon::parts_from_answer(&v) {
                Ok(parts) => {
                    let snap = snapshot::assemble(parts, &assemble);
                    let mut frame = FeedFrame::new(snap);
                    frame.sampler = sampler_health(v.get("sampler"));
                    Some(frame)
                }
                Err(e) => {
                    let _ = writeln!(std::io::stderr(), "wedgewatch: bad daemon answer: {e}");
                    None
                }
            },
            // A busy daemon is shown by the header's lag; try again next tick.
            Err(_) => None,
        };
        if let Some(f) = frame {
            if tx.send(f).is_err() {
                return;
            }
        }
        std::thread::sleep(Duration::from_millis(POLL_MS));
    })
}

/// Lag: how far the most overdue source is behind its cadence; dropped: samples lost.
fn sampler_health(v: Option<&serde_json::Value>) -> SamplerHealth {
    let now = SystemClock.now_ms();
    let stats: Vec<SourceStats> = v
        .and_then(|v| {
            serde_json::from_value::<std::collections::BTreeMap<String, SourceStats>>(v.clone())
                .ok()
        })
        .map(|m| m.into_values().collect())
        .unwrap_or_default();
    let lag = stats
        .iter()
        .filter_map(|s| {
            // the daemon's numbers, not ours: saturating, never a panic
            s.last_t_ms.map(|t| {
                now.saturating_sub(t)
                    .saturating_sub(i64::try_from(s.every_ms).unwrap_or(i64::MAX))
                    .max(0) as u64
            })
        })
        .max();
    let late: u64 = stats.iter().map(|s| s.late).sum();
    SamplerHealth {
        lag_ms: lag,
        dropped_samples: stats.iter().map(|s| s.dropped).sum(),
        note: (late > 0).then(|| format!("{late} late ticks")),
    }
}

/// A private daemon for this session: socket in a fresh 0700 temp dir, no recording.
/// Stopped and removed on drop.
pub struct InProcessDaemon {
    pub socket: PathBuf,
    dir: PathBuf,
    stop: tokio::sync::watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl InProcessDaemon {
    pub fn start(
        opts: &AttachOptions,
        thresholds: Thresholds,
        rediscover_every_ms: u64,
    ) -> anyhow::Result<InProcessDaemon> {
        let dir = session_dir()?;
        let mut cfg = DaemonConfig::new(dir.clone());
        cfg.rotation = None;
        cfg.thresholds = thresholds.clone();
        cfg.rediscover_every_ms = rediscover_every_ms;
        let socket = cfg.socket_path.clone();
        let (stop, rx) = tokio::sync::watch::channel(false);
        let rt = runtime()?;
        let mut opts = opts.clone();
        opts.thresholds = thresholds;
        let mut d = Daemon::new(cfg, Arc::new(SystemClock), opts.discover_fn());
        for s in opts.sources()? {
            d.add_default_source(s);
        }
        let thread = std::thread::Builder::new()
            .name("wedgewatch-daemon".into())
            .spawn(move || {
                if let Err(e) = rt.block_on(d.run(rx)) {
                    let _ = writeln!(
                        std::io::stderr(),
                        "wedgewatch: in-process sampler stopped: {e}"
                    );
                }
                // Never wait at exit for a thread stuck in a read.
                crate::cli::exit::shut_down(rt);
            })
            .context("starting the sampler thread")?;
        // Wait (bounded) for the socket so the first poll finds it.
        for _ in 0..100 {
            if socket.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(InProcessDaemon {
            socket,
            dir,
            stop,
            thread: Some(thread),
        })
    }
}

/// A new 0700 directory for the session's socket. Created exclusively (an existing one, e.g.
/// planted in a shared /tmp, is an error), so removing it on drop removes only what we made.
fn session_dir() -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir =
        std::env::temp_dir().join(format!("wedgewatch-session-{}-{stamp}", std::process::id()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .with_context(|| format!("creating the session directory {}", dir.display()))?;
    Ok(dir)
}

impl Drop for InProcessDaemon {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
