//! `wedgewatch fleet snapshot --nodes a,b,c --via TEMPLATE`: a snapshot of every node at
//! once through the user's transport, merged (`wedgewatch::fleet` runs them, `merge`
//! merges).

use super::duration;
use super::exit::{self, CouldNotSample};
use super::merge::MergeOutput;
use super::progress;
use clap::{Args, Subcommand};
use std::time::Duration;
use wedgewatch::fleet::{self, FleetPlan, Transport};
use wedgewatch::merge;

const EXAMPLES: &str = "\
Examples:
  wedgewatch fleet snapshot --nodes gpu-a,gpu-b --via 'ssh {node}' -o incident/
  wedgewatch fleet snapshot --nodes pod-a,pod-b --via 'kubectl exec -n infer {node} --' --json
  wedgewatch fleet snapshot --nodes nodea,nodeb --via 'ip netns exec {node}' \\
      --remote 'wedgewatch snapshot --json --no-daemon --window 3s'

The template is split into words by shell rules, never run by a shell; {node} is replaced in
each word. Each node runs `--remote` (default: `wedgewatch snapshot --json`) under --timeout;
it and everything it started are killed past it. A node that fails (no answer, not a
snapshot, a merged snapshot, or the identity of another node that is merged) is named with its
reason, on stderr and in the snapshot's fleet.failed, and the others are merged.

Exit status: 0 merged, 1 merged and a finding at or above --fail-on, 2 usage error (a bad
node name or template), 3 no node answered with a snapshot that can be merged.";

#[derive(Debug, Args)]
#[command(after_help = EXAMPLES)]
pub struct FleetArgs {
    #[command(subcommand)]
    pub verb: FleetVerb,
}

#[derive(Debug, Subcommand)]
pub enum FleetVerb {
    /// A snapshot of every node at once, merged into one.
    Snapshot(FleetSnapshotArgs),
}

#[derive(Debug, Args)]
#[command(after_help = EXAMPLES)]
pub struct FleetSnapshotArgs {
    /// The nodes, comma-separated: each is substituted for {node} and names its components.
    #[arg(long, value_name = "A,B,C", required = true)]
    pub nodes: String,
    /// How to run a command on a node: `ssh {node}`, `kubectl exec -n NS {node} --`.
    #[arg(long, value_name = "TEMPLATE", required = true)]
    pub via: String,
    /// What runs on each node after the transport (split by shell rules).
    #[arg(
        long,
        value_name = "COMMAND",
        default_value = "wedgewatch snapshot --json"
    )]
    pub remote: String,
    /// How long each node has to answer; its transport is killed past it.
    #[arg(long, value_name = "DURATION", default_value = "60s",
          value_parser = duration::at_most(Duration::from_secs(3600)))]
    pub timeout: Duration,
    #[command(flatten)]
    pub out: MergeOutput,
}

pub fn run(a: FleetArgs) -> anyhow::Result<i32> {
    match a.verb {
        FleetVerb::Snapshot(s) => snapshot(s),
    }
}

fn snapshot(a: FleetSnapshotArgs) -> anyhow::Result<i32> {
    a.out.check_target()?;
    let remote = shlex::split(&a.remote)
        .filter(|w| !w.is_empty())
        .ok_or_else(|| anyhow::anyhow!("--remote {:?}: not a command line", a.remote))?;
    let plan = FleetPlan {
        nodes: fleet::parse_nodes(&a.nodes)?,
        via: Transport::parse(&a.via)?,
        remote,
        timeout: a.timeout,
    };
    let (inputs, failed) = exit::block_on(progress::during(
        "collecting",
        a.timeout,
        fleet::collect(&plan),
    ))?;
    if inputs.is_empty() {
        let why: Vec<String> = failed
            .iter()
            .map(|f| format!("{}: {}", f.name, f.reason))
            .collect();
        return Err(
            CouldNotSample(anyhow::anyhow!("no node answered ({})", why.join("; "))).into(),
        );
    }
    let merged = merge::merge(inputs, failed)?;
    a.out.write(&merged)
}
