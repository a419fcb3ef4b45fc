//! `wedgewatch tui`: the live UI. It always reads a daemon over its socket: a running one
//! if there is one, else a private in-process daemon started for the session, so live view,
//! snapshot and daemon share one code path. `--replay FILE` plays a recording instead, or
//! shows a snapshot file or bundle directory as a still frame.

use super::exit::{code, runtime};
use super::options::Sampling;
use anyhow::{bail, Context};
use clap::Args;
use std::io::{IsTerminal, Write};
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

const EXAMPLES: &str = "\
Examples:
  wedgewatch                              # the same as `wedgewatch tui`
  wedgewatch tui --replay incident.wwrec  # space pause, ./, step, [/] seek, +/- speed
  wedgewatch tui --replay bundle/         # a bundle or snapshot.json: every view, one still frame
  wedgewatch tui --no-daemon --pid 4242   # sample here, adding a process discovery missed

It needs a terminal; without one use `wedgewatch snapshot` (or `check`).
Exit status: 0 quit, 2 usage or input error (or no terminal), 3 could not sample at all.";

#[derive(Debug, Args, Default)]
#[command(after_help = EXAMPLES)]
pub struct TuiArgs {
    /// Play a recording instead of watching live, or show a snapshot file or bundle
    /// directory as a still frame.
    #[arg(long, value_name = "FILE")]
    pub replay: Option<PathBuf>,
    /// Sample in-process even when a daemon is running.
    #[arg(long)]
    pub no_daemon: bool,
    #[command(flatten)]
    pub sampling: Sampling,
}

/// The UI draws with escape codes on stdout and reads keys from stdin: without a terminal
/// on both it would write garbage into a pipe or wait on keys that never come.
pub fn need_terminal(alternative: &str) -> anyhow::Result<()> {
    if !(std::io::stdout().is_terminal() && std::io::stdin().is_terminal()) {
        bail!("not a terminal: use {alternative}");
    }
    Ok(())
}

pub fn cmd_tui(top: Sampling, a: TuiArgs) -> anyhow::Result<i32> {
    let s = Sampling::merge(top, a.sampling);
    let assemble = s.assemble();
    if let Some(path) = &a.replay {
        return replay(path, assemble, s.thresholds()?);
    }
    need_terminal("`wedgewatch snapshot`")?;
    let cfg = s.daemon_config();
    if !a.no_daemon && daemon_answers(&cfg.socket_path) {
        return watch_socket(&cfg.socket_path, assemble);
    }
    let opts = s.attach_options()?;
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
            let e = wedgewatch::redact::log_line(&e.to_string());
            super::progress::note(&format!(
                "daemon not usable ({e}); sampling in-process instead"
            ));
            false
        }
    }
}

fn replay(path: &Path, assemble: AssembleOptions, th: Thresholds) -> anyhow::Result<i32> {
    // a bundle or snapshot.json (what a bug report carries) is one still frame
    if let Some(snap) = super::report::still_frame(path)? {
        need_terminal("`wedgewatch report FILE`")?;
        let mut feed = ReplayFeed::still(snap);
        tui::run(&mut feed, app_options())?;
        return Ok(code::OK);
    }
    let rec = Recording::open(path)?;
    let (frames, stats) = attach::replay_frames_counted(&rec, 1000, th)?;
    if frames.is_empty() {
        bail!("{}: the recording holds no samples", path.display());
    }
    // after the input checks: a bad file is named even without a terminal
    need_terminal("`wedgewatch snapshot --from FILE --at TIME`")?;
    let snaps: Vec<Snapshot> = frames
        .into_iter()
        .map(|p| snapshot::assemble(p, &assemble))
        .collect();
    let mut feed = ReplayFeed::with_note(snaps, stats.brief());
    tui::run(&mut feed, app_options())?;
    Ok(code::OK)
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
    Ok(code::OK)
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
    /// Removed on drop, after the daemon thread has ended (fields drop after `drop`).
    _dir: PrivateDir,
    stop: tokio::sync::watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl InProcessDaemon {
    pub fn start(
        opts: &AttachOptions,
        thresholds: Thresholds,
        rediscover_every_ms: u64,
    ) -> anyhow::Result<InProcessDaemon> {
        let dir = private_dir("wedgewatch-session")?;
        let mut cfg = DaemonConfig::new(dir.path.clone());
        cfg.rotation = None;
        // the session's directory goes with the session: no incident bundles kept in it
        cfg.incidents = None;
        cfg.thresholds = thresholds.clone();
        cfg.rediscover_every_ms = rediscover_every_ms;
        let socket = cfg.socket_path.clone();
        let (stop, rx) = tokio::sync::watch::channel(false);
        let rt = runtime()?;
        let mut opts = opts.clone();
        opts.thresholds = thresholds;
        let opts = opts.sharing_socket_dumps();
        let mut d = Daemon::new(cfg, Arc::new(SystemClock), opts.discover_fn());
        for (s, every, timeout) in opts.daemon_sources(d.suspicion_fn())? {
            d.add_source(s, every, timeout);
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
            _dir: dir,
            stop,
            thread: Some(thread),
        })
    }
}

/// A directory of our own, removed with what is in it on drop.
pub struct PrivateDir {
    pub path: PathBuf,
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A new 0700 directory in the temp dir. Created exclusively (an existing one, e.g. planted
/// in a shared /tmp, is an error), so removing it on drop removes only what we made.
pub fn private_dir(prefix: &str) -> anyhow::Result<PrivateDir> {
    use std::os::unix::fs::DirBuilderExt;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let path = std::env::temp_dir().join(format!("{prefix}-{}-{stamp}", std::process::id()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&path)
        .with_context(|| format!("creating the private directory {}", path.display()))?;
    Ok(PrivateDir { path })
}

impl Drop for InProcessDaemon {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
