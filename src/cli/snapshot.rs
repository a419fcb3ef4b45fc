//! `wedgewatch snapshot`: the stack's state now (or at a moment of a recording) as JSON on
//! stdout and/or a bundle directory.

use super::check::FailOn;
use super::exit::code;
use super::options::Sampling;
use super::progress;
use super::source::{self, Served, SourceArgs};
use anyhow::{bail, Context};
use clap::Args;
use std::io::Write;
use std::path::{Path, PathBuf};
use wedgewatch::daemon::answer::ServedSnapshot;
use wedgewatch::model::{FindingKind, RawFiles};
use wedgewatch::snapshot::{self, AssembleOptions, Overwrite, SnapshotParts};
use wedgewatch::{detect, diff};

const EXAMPLES: &str = "\
Examples:
  wedgewatch snapshot -o bundle/          # snapshot.json + report.md + raw/ (a new directory)
  wedgewatch snapshot --json | jq .findings
  wedgewatch snapshot -o - > now.json     # `-` is stdout: the snapshot JSON
  wedgewatch snapshot --window 10s --no-daemon --json
  wedgewatch snapshot --baseline noon.json --json --fail-on warning
  wedgewatch snapshot --from rec.wwrec --at 90s --json   # 90 s into a recording

Exit status: 0 nothing at or above --fail-on (default: never fail on findings), 1 found,
2 usage or input error, 3 could not sample at all.";

#[derive(Debug, Args)]
#[command(after_help = EXAMPLES)]
pub struct SnapshotArgs {
    /// Print the snapshot JSON to stdout.
    #[arg(long)]
    pub json: bool,
    /// Write the bundle (snapshot.json, report.md, raw/) to DIR, atomically; an existing
    /// non-empty DIR is refused. `-o -` prints the snapshot JSON to stdout instead.
    #[arg(short = 'o', long = "output", value_name = "DIR")]
    pub output: Option<PathBuf>,
    /// With -o: replace a previous bundle's own files in DIR (anything else there is kept).
    #[arg(long, requires = "output")]
    pub force: bool,
    /// Compare with this earlier snapshot and report what changed (config_changed).
    #[arg(long, value_name = "FILE")]
    pub baseline: Option<PathBuf>,
    /// Exit 1 when a finding of at least this severity is found.
    #[arg(long, value_enum, default_value = "never", value_name = "SEVERITY")]
    pub fail_on: FailOn,
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub sampling: Sampling,
}

/// `-` as a path: stdout.
pub fn is_stdout(p: &Path) -> bool {
    p.as_os_str() == "-"
}

pub fn run(top: Sampling, a: SnapshotArgs) -> anyhow::Result<i32> {
    let s = Sampling::merge(top, a.sampling);
    let dir = a.output.as_deref().filter(|p| !is_stdout(p));
    let json = a.json || a.output.as_deref().is_some_and(is_stdout);
    if !json && dir.is_none() {
        bail!("say where the snapshot goes: --json or -o - (stdout) and/or -o DIR (bundle)");
    }
    let overwrite = if a.force {
        Overwrite::PreviousBundle
    } else {
        Overwrite::Refuse
    };
    if let Some(dir) = dir {
        // refuse before sampling, not after
        snapshot::check_bundle_target(dir, overwrite)?;
    }
    let mut from = a.source.clone();
    if json && dir.is_none() && a.baseline.is_none() && s.assemble().redact {
        if let Some(snap) = served(&s, &mut from) {
            return print_served(&snap, a.fail_on);
        }
    }
    // Only a bundle writes the raw socket table (most of the raw files' bytes).
    let raw = match dir {
        Some(_) => RawFiles::All,
        None => RawFiles::WithoutSockets,
    };
    let mut parts = source::parts(&s, &from, raw)?;
    let opts = s.assemble();
    if let Some(base) = &a.baseline {
        against_baseline(&mut parts, base, &opts)?;
    }
    let assembling = std::time::Instant::now();
    let bundle = snapshot::assemble_bundle(parts, &opts);
    tracing::debug!(
        took_ms = assembling.elapsed().as_millis() as u64,
        "snapshot assembled"
    );
    if let Some(dir) = dir {
        snapshot::write_bundle(&bundle.snapshot, &bundle.raw, dir, overwrite)
            .with_context(|| format!("writing the bundle to {}", dir.display()))?;
        progress::note(&format!("bundle written to {}", dir.display()));
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&bundle.snapshot)?);
    }
    Ok(match a.fail_on.worst(&bundle.snapshot.findings) {
        Some(_) => code::FOUND,
        None => code::OK,
    })
}

/// The snapshot a running daemon assembled and redacted, when it can serve this one (not a
/// recording, not `--no-daemon`). A daemon that did not answer is not asked again: `from`
/// then samples here.
fn served(s: &Sampling, from: &mut SourceArgs) -> Option<ServedSnapshot> {
    if from.from.is_some() || from.no_daemon {
        return None;
    }
    match source::served_json(s) {
        Served::Snapshot(snap) => Some(snap),
        Served::Unusable => {
            from.no_daemon = true;
            None
        }
        Served::NoDaemon | Served::AskParts => None,
    }
}

/// Prints a served snapshot's bytes as they came (a checked, whole document); the exit code
/// from its findings.
fn print_served(snap: &ServedSnapshot, fail_on: FailOn) -> anyhow::Result<i32> {
    let mut out = std::io::stdout().lock();
    out.write_all(&snap.bytes)?;
    out.write_all(b"\n")?;
    out.flush()?;
    Ok(match fail_on.worst(&snap.findings) {
        Some(_) => code::FOUND,
        None => code::OK,
    })
}

/// Replaces the parts' config_changed findings by the changes against `base`.
pub fn against_baseline(
    parts: &mut SnapshotParts,
    base: &Path,
    opts: &AssembleOptions,
) -> anyhow::Result<()> {
    let before = snapshot::read_snapshot(base)?;
    // compare like with like: the baseline was redacted (or not) the same way
    let now = snapshot::assemble(parts.clone(), opts);
    let d = diff::diff_snapshots(&before, &now);
    parts
        .findings
        .retain(|f| f.kind != FindingKind::ConfigChanged);
    parts.findings.extend(detect::config_changed(&d.changes));
    parts.config_changed = d.changes;
    Ok(())
}
