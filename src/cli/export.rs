//! `wedgewatch export --perfetto FILE`: the request timeline as Chrome trace-event JSON, from
//! a snapshot, a recording, the running daemon, or a fresh sample.

use super::duration;
use super::exit::code;
use super::options::Sampling;
use super::progress;
use super::snapshot::is_stdout;
use super::source::{self, MAX_WINDOW};
use anyhow::Context;
use clap::Args;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;
use wedgewatch::error::Error;
use wedgewatch::record::{NotARecording, Recording};
use wedgewatch::{export, snapshot};

const EXAMPLES: &str = "\
Examples:
  wedgewatch export --perfetto trace.json                   # then open ui.perfetto.dev
  wedgewatch export --perfetto trace.json --from bundle/    # a snapshot file or bundle
  wedgewatch export --perfetto - --from rec.wwrec | gzip > trace.json.gz

Exit status: 0 written, 2 usage or input error, 3 could not sample at all.";

#[derive(Debug, Args)]
#[command(after_help = EXAMPLES)]
pub struct ExportArgs {
    /// Write Chrome trace-event JSON to FILE (`-`: stdout).
    #[arg(long, value_name = "FILE")]
    pub perfetto: PathBuf,
    /// From a snapshot file or bundle, or a recording; default: the running daemon, else
    /// a fresh sample of --window.
    #[arg(long, value_name = "FILE")]
    pub from: Option<PathBuf>,
    /// How long to sample when sampling here (500ms, 90s, 5m; a bare number is seconds).
    #[arg(long, value_name = "DURATION", default_value = "3s",
          value_parser = duration::at_most(MAX_WINDOW))]
    pub window: Duration,
    /// Sample here even when a daemon is running.
    #[arg(long)]
    pub no_daemon: bool,
    #[command(flatten)]
    pub sampling: Sampling,
}

pub fn run(top: Sampling, a: ExportArgs) -> anyhow::Result<i32> {
    let s = Sampling::merge(top, a.sampling);
    let trace = match &a.from {
        Some(f) => from_file(&s, f)?,
        None => {
            let daemon = (!a.no_daemon).then(|| source::from_daemon(&s)).flatten();
            let parts = match daemon {
                Some(p) => p,
                None => source::by_sampling(&s, a.window, wedgewatch::model::RawFiles::All)?,
            };
            export::perfetto(&parts)
        }
    };
    let bytes = serde_json::to_vec(&trace)?;
    if is_stdout(&a.perfetto) {
        let mut out = std::io::stdout().lock();
        out.write_all(&bytes)
            .and_then(|_| out.write_all(b"\n"))
            .and_then(|_| out.flush())
            .context("writing the trace to stdout")?;
    } else {
        wedgewatch::safe_fs::write_output(&a.perfetto, &bytes)?;
        progress::note(&format!(
            "trace written to {} (open it at ui.perfetto.dev)",
            a.perfetto.display()
        ));
    }
    Ok(code::OK)
}

/// The trace of a recording, a snapshot file or a bundle directory.
fn from_file(s: &Sampling, f: &Path) -> anyhow::Result<serde_json::Value> {
    // A recording is recognised by its first bytes: check that first, so a big
    // recording is never read whole as a would-be snapshot.
    Ok(match Recording::open(f) {
        Ok(_) => export::perfetto(&source::from_recording(f, None, s.thresholds()?)?),
        Err(Error::NotARecording {
            why: NotARecording::Snapshot | NotARecording::Json,
            ..
        }) => export::perfetto_snapshot(&snapshot::read_snapshot(f)?),
        Err(e) if wedgewatch::safe_fs::is_input_dir(f) => match snapshot::read_snapshot(f) {
            Ok(snap) => export::perfetto_snapshot(&snap),
            Err(_) => return Err(e.into()),
        },
        Err(e) => return Err(e.into()),
    })
}
