//! `wedgewatch report FILE`: report.md (or text, or the verdict as JSON) rendered again
//! from a snapshot file or bundle directory, so whoever receives a bundle can read it; and
//! [`still_frame`], which lets `tui --replay` open a snapshot or bundle as one frame.

use clap::{Args, ValueEnum};
use std::path::{Path, PathBuf};
use wedgewatch::error::Error;
use wedgewatch::model::Snapshot;
use wedgewatch::record::{NotARecording, Recording};
use wedgewatch::{report, snapshot};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// report.md, GitHub-flavoured Markdown (at most 60,000 characters).
    Md,
    /// The verdict and the findings as plain text.
    Text,
    /// The verdict as JSON.
    Json,
}

const EXAMPLES: &str = "\
Examples:
  wedgewatch report bundle/                  # report.md again, to paste into a GitHub issue
  wedgewatch report snapshot.json --format text
  wedgewatch report bundle/ --json | jq -r .title
  wedgewatch tui --replay bundle/            # the same snapshot in the UI

Exit status: 0 rendered, 2 usage or input error (not a snapshot, unreadable).";

#[derive(Debug, Args)]
#[command(after_help = EXAMPLES)]
pub struct ReportArgs {
    /// A snapshot file (`snapshot.json`) or a bundle directory (`snapshot -o DIR`).
    pub file: PathBuf,
    /// What to print.
    #[arg(long, value_enum, default_value = "md")]
    pub format: Format,
    /// Shorthand for `--format json`.
    #[arg(long, conflicts_with = "format")]
    pub json: bool,
    /// Write to FILE instead of stdout.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
}

pub fn cmd_report(a: ReportArgs) -> anyhow::Result<i32> {
    let snap = snapshot::read_snapshot(&a.file)?;
    let format = if a.json { Format::Json } else { a.format };
    let text = match format {
        Format::Md => report::render(&snap),
        Format::Text => report::render_text(&snap),
        Format::Json => format!("{:#}\n", report::render_json(&snap)),
    };
    match &a.output {
        Some(p) if p.as_os_str() != "-" => wedgewatch::safe_fs::write_output(p, text.as_bytes())?,
        _ => print!("{text}"),
    }
    Ok(super::exit::code::OK)
}

/// The snapshot in `path` when it is a bundle directory or a snapshot file (None: it is
/// meant as a recording). A recording is recognised by its first bytes, so a big one is
/// never read whole as a would-be snapshot.
pub fn still_frame(path: &Path) -> anyhow::Result<Option<Snapshot>> {
    let bundle_entry = std::fs::symlink_metadata(path.join("snapshot.json")).is_ok();
    if bundle_entry && wedgewatch::safe_fs::is_input_dir(path) {
        return Ok(Some(snapshot::read_snapshot(path)?));
    }
    match Recording::open(path) {
        Ok(_) => Ok(None),
        Err(Error::NotARecording {
            why: NotARecording::Snapshot | NotARecording::Json,
            ..
        }) => Ok(Some(snapshot::read_snapshot(path)?)),
        Err(e) => Err(e.into()),
    }
}
