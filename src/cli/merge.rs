//! `wedgewatch merge SNAPSHOT...`: one snapshot of several nodes, from their bundles or
//! `snapshot --json` files. Samples nothing. The output options are shared with `fleet
//! snapshot`, which merges what it collects the same way.

use super::exit::code;
use super::progress;
use super::snapshot::is_stdout;
use anyhow::Context;
use clap::Args;
use std::path::PathBuf;
use wedgewatch::merge;
use wedgewatch::model::{FailedNode, Snapshot};
use wedgewatch::report;
use wedgewatch::snapshot::{self, Overwrite};

const EXAMPLES: &str = "\
Examples:
  wedgewatch merge node-a.json node-b.json            # report.md of the merged picture on stdout
  wedgewatch merge bundle-a/ bundle-b/ -o merged/     # a bundle: snapshot.json + report.md
  wedgewatch merge a.json b.json --json | jq '.fleet.nodes[] | {name, skew_ms}'

Components are named by node (`nodeb/decode@10.77.0.2:30002`); hops are joined across nodes
by TCP 4-tuple (a VIP or NAT between nodes hides the match: said in the notes); requests are
judged again over the merged picture, so `wedged_request` names the deepest hop whichever
node it is on. Clock skew between nodes is estimated and said.

Exit status: 0 merged, 1 merged and a finding at or above --fail-on, 2 bad input (a missing
file, not a snapshot, more than a snapshot ever holds, two snapshots of one node, a merged
snapshot).";

/// Where a merged snapshot goes (`merge`, `fleet snapshot`).
#[derive(Debug, Args, Clone)]
pub struct MergeOutput {
    /// Print the merged snapshot JSON (`wedgewatch.snapshot/1` with a `fleet` field).
    #[arg(long)]
    pub json: bool,
    /// Write a bundle (snapshot.json, report.md) to DIR; `-o -` prints the JSON.
    #[arg(short = 'o', long = "output", value_name = "DIR")]
    pub output: Option<PathBuf>,
    /// With -o: replace a previous bundle's own files in DIR.
    #[arg(long, requires = "output")]
    pub force: bool,
    /// Exit 1 when a finding of at least this severity is found.
    #[arg(long, value_enum, default_value = "never", value_name = "SEVERITY")]
    pub fail_on: super::check::FailOn,
}

#[derive(Debug, Args)]
#[command(after_help = EXAMPLES)]
pub struct MergeArgs {
    /// Snapshots to merge, one per node: `snapshot --json` files or bundle directories.
    #[arg(value_name = "SNAPSHOT", required = true)]
    pub inputs: Vec<PathBuf>,
    #[command(flatten)]
    pub out: MergeOutput,
}

pub fn run(a: MergeArgs) -> anyhow::Result<i32> {
    a.out.check_target()?;
    let budget = snapshot::ParseBudget::new();
    let inputs = a
        .inputs
        .iter()
        .map(|p| merge::load(p, &budget))
        .collect::<Result<Vec<_>, _>>()?;
    let merged = merge::merge(inputs, Vec::new())?;
    a.out.write(&merged)
}

impl MergeOutput {
    fn dir(&self) -> Option<&std::path::Path> {
        self.output.as_deref().filter(|p| !is_stdout(p))
    }

    fn overwrite(&self) -> Overwrite {
        if self.force {
            Overwrite::PreviousBundle
        } else {
            Overwrite::Refuse
        }
    }

    /// Refuses an unusable `-o DIR` before any work.
    pub fn check_target(&self) -> anyhow::Result<()> {
        if let Some(dir) = self.dir() {
            snapshot::check_bundle_target(dir, self.overwrite())?;
        }
        Ok(())
    }

    /// Writes the merged snapshot where asked (the report on stdout when nowhere);
    /// the exit code by `--fail-on`. Every output is of the snapshot redacted again with
    /// today's rules: a node's file may be hand-made or redacted by older ones.
    pub fn write(&self, merged: &Snapshot) -> anyhow::Result<i32> {
        let merged = &wedgewatch::redact::for_output(&[merged], merged.redacted)
            .and_then(|mut v| v.pop())
            .context("the merged snapshot could not be redacted: nothing written")?;
        let json = self.json || self.output.as_deref().is_some_and(is_stdout);
        if let Some(dir) = self.dir() {
            snapshot::write_bundle(merged, &Default::default(), dir, self.overwrite())
                .with_context(|| format!("writing the bundle to {}", dir.display()))?;
            progress::note(&format!("merged bundle written to {}", dir.display()));
        }
        if json {
            println!("{}", serde_json::to_string_pretty(merged)?);
        } else if self.dir().is_none() {
            print!("{}", report::render(merged));
        }
        say_failed(merged.fleet.as_ref().map_or(&[][..], |f| &f.failed));
        Ok(match self.fail_on.worst(&merged.findings) {
            Some(_) => code::FOUND,
            None => code::OK,
        })
    }
}

/// Nodes that could not be read, on stderr (they are in the snapshot's `fleet.failed` too).
/// (Printed under --quiet too: like an error, it changes what the output means.)
fn say_failed(failed: &[FailedNode]) {
    use std::io::Write;
    let mut err = std::io::stderr();
    for f in failed {
        let _ = writeln!(err, "wedgewatch: node {} left out: {}", f.name, f.reason);
    }
}
