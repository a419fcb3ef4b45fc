//! `wedgewatch diff A B`: what changed between two snapshots. Like diff(1): exit 0 when
//! there is no difference, 1 when there is, 2 on bad input. Samples nothing, so it takes no
//! sampling options.

use super::exit::code;
use clap::Args;
use std::io::IsTerminal;
use std::path::PathBuf;
use wedgewatch::{diff, snapshot};

const EXAMPLES: &str = "\
Examples:
  wedgewatch diff noon.json now.json
  wedgewatch diff noon-bundle/ now-bundle/ --json | jq '.changes[] | select(.field == \"env\")'
  wedgewatch diff noon.json now.json >/dev/null || echo changed

Exit status (like diff(1)): 0 no differences, 1 differences, 2 usage or input error.";

#[derive(Debug, Args)]
#[command(after_help = EXAMPLES)]
pub struct DiffArgs {
    /// The baseline snapshot (file or bundle directory).
    pub a: PathBuf,
    /// The later snapshot (file or bundle directory).
    pub b: PathBuf,
    /// Print `wedgewatch.diff/1` JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: DiffArgs) -> anyhow::Result<i32> {
    let before = snapshot::read_snapshot(&a.a)?;
    let after = snapshot::read_snapshot(&a.b)?;
    let d = diff::diff_snapshots(&before, &after);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&d)?);
    } else {
        let color = std::io::stdout().is_terminal()
            && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
        print!("{}", diff::render_human(&d, color));
    }
    Ok(if d.changes.is_empty() {
        code::OK
    } else {
        code::FOUND
    })
}
