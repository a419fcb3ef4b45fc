//! Where a snapshot's parts come from: a recording (`--from FILE [--at TIME]`), a running
//! daemon, or a sampling window here. Shared by `snapshot`, `check` and `export`.
//!
//! The errors are what the exit code tells apart: a recording that is not one, or an
//! `--at` outside it, is bad input (exit 2); sampling that fails outright is
//! [`CouldNotSample`] (exit 3).

use super::duration::{self, At};
use super::exit::{self, CouldNotSample};
use super::options::Sampling;
use super::progress;
use anyhow::{bail, Context};
use clap::Args;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use wedgewatch::attach;
use wedgewatch::clock::{Clock, Millis, SystemClock};
use wedgewatch::daemon;
use wedgewatch::detect::Thresholds;
use wedgewatch::model::{RawFiles, SourceKind, Status};
use wedgewatch::record::{self, Record, Recording};
use wedgewatch::snapshot::SnapshotParts;

/// The longest sampling window a one-shot verb takes.
pub const MAX_WINDOW: Duration = Duration::from_secs(3600);

/// Where the parts come from (`snapshot`, `check`).
#[derive(Debug, Args, Clone)]
pub struct SourceArgs {
    /// How long to look when sampling here, finding the stack included (500ms, 90s, 5m; a
    /// bare number is seconds).
    #[arg(long, value_name = "DURATION", default_value = "3s",
          value_parser = duration::at_most(MAX_WINDOW))]
    pub window: Duration,
    /// Replay a recording (from `record` or the daemon's recording dir) instead of sampling.
    #[arg(long, value_name = "FILE")]
    pub from: Option<PathBuf>,
    /// With --from: the moment to look at: an offset from the recording's first sample
    /// (90s, +1m30s; a bare number is seconds), -DURATION before its last sample, or an
    /// RFC 3339 time. Default: its end.
    #[arg(long, value_name = "TIME", requires = "from", value_parser = At::parse,
          allow_hyphen_values = true)]
    pub at: Option<At>,
    /// Sample here even when a daemon is running.
    #[arg(long)]
    pub no_daemon: bool,
}

/// The parts `a` asks for. Sampled here, they carry the raw payloads `raw` says (a daemon's
/// and a recording's carry all).
pub fn parts(s: &Sampling, a: &SourceArgs, raw: RawFiles) -> anyhow::Result<SnapshotParts> {
    if let Some(f) = &a.from {
        return from_recording(f, a.at.as_ref(), s.thresholds()?);
    }
    let mut parts = match a.no_daemon {
        false => from_daemon(s),
        true => None,
    }
    .map_or_else(|| by_sampling(s, a.window, raw), Ok)?;
    // sampled here or by the daemon beside us: this node, its clocks now
    parts.node = Some(wedgewatch::sys::node::this_node());
    Ok(parts)
}

/// Parts from a running daemon, if one answers on its socket.
pub fn from_daemon(s: &Sampling) -> Option<SnapshotParts> {
    let cfg = s.daemon_config();
    if !cfg.socket_path.exists() {
        return None;
    }
    match daemon::snapshot_parts_blocking(&cfg.socket_path, 5000) {
        Ok(p) => {
            progress::note(&format!(
                "using the daemon at {} (its history and baseline)",
                cfg.socket_path.display()
            ));
            Some(p)
        }
        Err(e) => {
            let e = wedgewatch::redact::log_line(&e.to_string());
            progress::note(&format!("daemon not usable ({e}); sampling here instead"));
            None
        }
    }
}

/// What a daemon answered to `json`.
pub enum Served {
    /// The snapshot it assembled and redacted, to print as it is.
    Snapshot(daemon::answer::ServedSnapshot),
    /// No daemon runs here.
    NoDaemon,
    /// A daemon runs but did not answer (said on stderr): sample here.
    Unusable,
    /// It answered, not with a snapshot (a daemon older than `json`): ask it for parts.
    AskParts,
}

/// The snapshot a running daemon assembled and redacted itself (for `snapshot --json`, which
/// adds nothing to it: the client only prints the bytes).
pub fn served_json(s: &Sampling) -> Served {
    let cfg = s.daemon_config();
    if !cfg.socket_path.exists() {
        return Served::NoDaemon;
    }
    let bytes = match daemon::snapshot_json_blocking(&cfg.socket_path, 5000) {
        Ok(b) => b,
        Err(e) => {
            let e = wedgewatch::redact::log_line(&e.to_string());
            progress::note(&format!("daemon not usable ({e}); sampling here instead"));
            return Served::Unusable;
        }
    };
    match daemon::answer::check_snapshot_bytes(bytes, &cfg.socket_path) {
        Ok(snap) => {
            progress::note(&format!(
                "using the daemon at {} (its history and baseline)",
                cfg.socket_path.display()
            ));
            Served::Snapshot(snap)
        }
        Err(_) => Served::AskParts,
    }
}

/// The times of a recording's first and last samples (None: it holds none).
fn sample_span(rec: &Recording) -> Option<(Millis, Millis)> {
    let mut span: Option<(Millis, Millis)> = None;
    // Streamed: one record in memory at a time. Damage is counted by the replay itself.
    for r in rec.records().map_while(Result::ok) {
        if let Record::Sample { sample, .. } = r {
            let t = sample.t_ms;
            span = Some(span.map_or((t, t), |(a, b)| (a.min(t), b.max(t))));
        }
    }
    span
}

/// Parts replayed from a recording up to `at` (default: its end).
pub fn from_recording(
    path: &Path,
    at: Option<&At>,
    th: Thresholds,
) -> anyhow::Result<SnapshotParts> {
    let rec = Recording::open(path)?;
    let Some((first, last)) = sample_span(&rec) else {
        bail!("{}: the recording holds no samples", path.display());
    };
    let at_ms = match at {
        None => None,
        Some(a) => Some(
            a.resolve(first, last)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?,
        ),
    };
    let replayed = record::replay(&rec, at_ms, th)?;
    if let Some(skipped) = replayed.stats.summary() {
        progress::note(&format!("{}: {skipped}", path.display()));
    }
    if let Some(ms) = replayed
        .every_ms
        .get(&SourceKind::Sockets)
        .filter(|ms| **ms > 1000)
    {
        progress::note(&format!(
            "{}: sockets were recorded every {} s then (calm): connections opened and closed \
             between two records are not in it",
            path.display(),
            *ms as f64 / 1000.0
        ));
    }
    let mut parts = wedgewatch::pipeline::parts(&replayed.model, replayed.at_ms);
    // the recorded node, not this one (its clocks: when its segment began)
    parts.node = replayed.node;
    Ok(parts)
}

/// A one-shot's window grows while a request at an engine that nothing is seen working for
/// nears its verdict (`correlate::pending_verdict`: waiting for its first byte or its stream
/// stopped, silent for a third of the soonest verdict, due within what is left), by at most
/// the soonest verdict's wait in all (`wedged_unanimous_ms`, `stall_unanimous_ms`); each
/// step said on stderr. Why: the verdict needs two stack dumps over the wait and the wait
/// itself, which a 3 s window started early may not hold.
fn look_longer_for_verdicts(
    opts: &attach::AttachOptions,
    mut model: wedgewatch::correlate::Correlator,
) -> anyhow::Result<wedgewatch::correlate::Correlator> {
    let th = &opts.thresholds;
    let (wedge, stall) = (
        th.correlate.wedged_soonest_ms(),
        th.correlate.stall_soonest_ms(),
    );
    let silent = th.sampling.silent_after(wedge.min(stall));
    let mut left = wedge.max(stall);
    while left >= 1000 {
        let view = model.view(SystemClock.now_ms());
        let Some(p) = wedgewatch::correlate::pending_verdict(&model, &view, silent, left) else {
            break;
        };
        drop(view);
        let ms = p.more_ms.min(left);
        let secs = wedgewatch::detect::secs;
        progress::note(&wedgewatch::redact::log_line(&format!(
            "{} at {} has waited {} with nothing seen working on it: looking {} more for its \
             verdict (due after {} on its witnesses)",
            p.leg,
            p.component,
            secs(p.waited_ms),
            secs(ms),
            secs(p.wait_ms)
        )));
        let more = Duration::from_millis(u64::try_from(ms).unwrap_or(0));
        exit::block_on(progress::during(
            "looking longer",
            more,
            attach::collect_more(
                opts,
                &mut model,
                duration::millis(more),
                Arc::new(SystemClock),
            ),
        ))
        .context("starting the runtime")
        .map_err(CouldNotSample)?
        .map_err(|e| CouldNotSample(e.into()))?;
        left -= ms;
    }
    Ok(model)
}

/// Samples here for `window`; a failure to sample at all is [`CouldNotSample`].
pub fn by_sampling(s: &Sampling, window: Duration, raw: RawFiles) -> anyhow::Result<SnapshotParts> {
    // bad options (probes, thresholds, a --pid that does not exist) are usage errors
    let opts = s.attach_options()?;
    let ms = duration::millis(window);
    let model = exit::block_on(progress::during(
        "sampling",
        window,
        attach::collect_window(&opts, ms, Arc::new(SystemClock), super::started()),
    ))
    .context("starting the runtime")
    .map_err(CouldNotSample)?
    .map_err(|e| CouldNotSample(e.into()))?;
    let model = look_longer_for_verdicts(&opts, model)?;
    let parts = wedgewatch::pipeline::parts_for(&model, SystemClock.now_ms(), raw);
    if let Some(st) = parts.sources.get(&SourceKind::Processes) {
        if st.status == Status::Unavailable {
            // without processes there is no topology: nothing else means anything
            let why = st.reason.clone().unwrap_or_default();
            return Err(CouldNotSample(anyhow::anyhow!("processes: {why}")).into());
        }
    }
    Ok(parts)
}
