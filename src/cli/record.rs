//! `wedgewatch record -o FILE --for DURATION`: a portable recording of the incident.

use super::duration;
use super::exit::{self, code, CouldNotSample};
use super::options::Sampling;
use super::progress;
use super::snapshot::is_stdout;
use anyhow::{bail, Context};
use clap::Args;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use wedgewatch::attach;
use wedgewatch::clock::SystemClock;

const EXAMPLES: &str = "\
Examples:
  wedgewatch record -o incident.wwrec --for 5m
  wedgewatch record -o - --for 90s | ssh elsewhere 'cat > incident.wwrec'
  wedgewatch snapshot --from incident.wwrec --at 2m --json   # look at it later

Exit status: 0 recorded, 2 usage or input error, 3 could not sample at all.";

/// The longest recording one `record` makes (the daemon records without end).
const MAX_RECORD: Duration = Duration::from_secs(24 * 3600);

#[derive(Debug, Args)]
#[command(after_help = EXAMPLES)]
pub struct RecordArgs {
    /// The recording file to write (`-`: stdout, written when the recording ends).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: PathBuf,
    /// How long to record (500ms, 90s, 5m, 1h30m; a bare number is seconds).
    #[arg(long = "for", value_name = "DURATION", value_parser = duration::at_most(MAX_RECORD))]
    pub run_for: Duration,
    /// Print what was recorded as JSON (not with `-o -`).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub sampling: Sampling,
}

pub fn run(top: Sampling, a: RecordArgs) -> anyhow::Result<i32> {
    let s = Sampling::merge(top, a.sampling);
    if a.json && is_stdout(&a.output) {
        bail!("--json and -o - both write to stdout: pick one");
    }
    let opts = s.attach_options()?;
    // `-`: record to a private file, then copy it out whole (the writer needs a file)
    let tmp = is_stdout(&a.output)
        .then(|| super::tui::private_dir("wedgewatch-record"))
        .transpose()?;
    let path = match &tmp {
        Some(d) => d.path.join("stdout.wwrec"),
        None => a.output.clone(),
    };
    let n = exit::block_on(async {
        let topology = opts
            .discover()
            .await
            .map_err(|e| CouldNotSample(e.into()))?;
        let (_tx, rx) = tokio::sync::watch::channel(topology.clone());
        let sampler = opts.sampler(Arc::new(SystemClock), rx)?;
        let ms = duration::millis(a.run_for);
        let work = attach::record_to_file(sampler, &path, ms, &topology, Arc::new(SystemClock));
        let n = progress::during("recording", a.run_for, work).await?;
        anyhow::Ok(n)
    })
    .map_err(CouldNotSample)??;
    if tmp.is_some() {
        copy_to_stdout(&path)?;
    }
    let shown = if tmp.is_some() {
        "stdout".into()
    } else {
        a.output.display().to_string()
    };
    if a.json {
        let v = serde_json::json!({ "samples": n, "output": shown });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        progress::note(&format!("recorded {n} samples to {shown}"));
    }
    Ok(code::OK)
}

fn copy_to_stdout(path: &Path) -> anyhow::Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = std::io::stdout().lock();
    std::io::copy(&mut f, &mut out)
        .and_then(|_| out.flush())
        .context("writing the recording to stdout")?;
    Ok(())
}
