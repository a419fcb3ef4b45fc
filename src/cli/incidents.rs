//! `wedgewatch incidents`: the incident bundles a daemon kept in its state directory
//! (`daemon::incidents`, docs/incidents.md), listed; `incidents latest -o DIR` copies the
//! newest out and prints the line that files it ([`latest`]).

mod latest;

use super::exit::code;
use super::options::Sampling;
use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use std::path::{Path, PathBuf};
use wedgewatch::clock::{Clock, SystemClock};
use wedgewatch::daemon::incidents::{self, Kept};
use wedgewatch::redact::control;

const EXAMPLES: &str = "\
Examples:
  wedgewatch incidents                      # when, kind, component, open/closed, how long, where
  wedgewatch incidents --json | jq -r '.incidents[-1].path'
  sudo wedgewatch incidents                 # the root daemon's (/var/lib/wedgewatch/incidents)
  wedgewatch incidents latest -o /tmp/inc   # the newest copied out, and the line that files it
  wedgewatch report INCIDENT_DIR            # each is a bundle: report, diff, tui --replay
  wedgewatch tui --replay INCIDENT_DIR/recording.wwrec   # the minutes before it

Exit status: 0 listed (none kept too) or copied, 2 usage or input error (a state directory
that cannot be read, -o DIR not empty), 3 none kept and no snapshot could be taken.";

pub const INCIDENTS_SCHEMA: &str = "wedgewatch.incidents/1";

#[derive(Debug, Args)]
#[command(after_help = EXAMPLES)]
pub struct IncidentsArgs {
    /// Print `wedgewatch.incidents/1` JSON.
    #[arg(long)]
    pub json: bool,
    /// The daemon's state directory (default: the one `daemon` uses, see `daemon --help`).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    #[command(subcommand)]
    pub what: Option<IncidentsVerb>,
}

#[derive(Debug, Subcommand)]
pub enum IncidentsVerb {
    /// Copy the newest kept incident's bundle to DIR (a fresh snapshot when none is kept) and
    /// print the `gh issue create` line that files it.
    Latest(latest::LatestArgs),
}

pub fn run(top: Sampling, a: IncidentsArgs) -> anyhow::Result<i32> {
    match a.what {
        Some(IncidentsVerb::Latest(l)) => {
            let mut s = Sampling::merge(top, l.sampling.clone());
            s.state_dir = s.state_dir.or(a.state_dir);
            latest::run(s, &l)
        }
        None => {
            if let Some(flag) = (Sampling {
                state_dir: None,
                ..top.clone()
            })
            .first_given()
            {
                bail!("{flag} does not apply to `incidents`");
            }
            let s = Sampling {
                state_dir: a.state_dir.or(top.state_dir),
                ..Sampling::default()
            };
            list(&s.daemon_config().incidents_dir(), a.json)
        }
    }
}

/// The incidents kept in `dir` (none when it does not exist), read only through links owned
/// by us or root.
pub fn kept(dir: &Path) -> anyhow::Result<Vec<Kept>> {
    if std::fs::symlink_metadata(dir).is_ok() {
        wedgewatch::safe_fs::open_trusted_dir(dir)?;
    }
    incidents::list(dir).with_context(|| {
        format!(
            "reading the incidents in {} (a root daemon's are root's: sudo wedgewatch incidents)",
            dir.display()
        )
    })
}

fn list(dir: &Path, json: bool) -> anyhow::Result<i32> {
    let kept = kept(dir)?;
    let now = SystemClock.now_ms();
    if json {
        let v = serde_json::json!({
            "schema": INCIDENTS_SCHEMA,
            "dir": dir,
            "incidents": kept.iter().map(|k| entry(k, now)).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else if kept.is_empty() {
        let hint = match wedgewatch::safe_fs::my_uid() {
            0 => "",
            _ => " (a root daemon keeps its own in /var/lib/wedgewatch: sudo wedgewatch incidents)",
        };
        let shown = dir.display().to_string();
        println!("no incidents kept in {}{hint}", control::value(&shown));
    } else {
        print!("{}", table(&kept, now));
    }
    Ok(code::OK)
}

/// One incident in the JSON listing: where, its state, how long, and its record.
fn entry(k: &Kept, now: i64) -> serde_json::Value {
    let i = &k.incident;
    serde_json::json!({
        "name": k.name,
        "path": k.path,
        "bytes": k.bytes,
        "state": if i.is_open() { "open" } else { "closed" },
        "closed_by": i.closed.as_ref().map(|c| c.by.as_str()),
        "lasted_ms": i.lasted_ms(now),
        "incident": i,
    })
}

/// `open`, or `closed: <what closed it>`.
fn state(i: &incidents::Incident) -> String {
    match &i.closed {
        None => "open".into(),
        Some(c) => format!("closed: {}", c.by.as_str()),
    }
}

fn lasted(i: &incidents::Incident, now: i64) -> String {
    let human = wedgewatch::daemon::log::human_ms;
    match (i.lasted_ms(now), i.is_open()) {
        (Some(ms), true) => format!("{} so far", human(ms)),
        (Some(ms), false) => human(ms),
        (None, _) => "?".into(),
    }
}

/// The human listing: one aligned row per incident, oldest first; every host string inert.
fn table(kept: &[Kept], now: i64) -> String {
    let rows: Vec<[String; 6]> = kept
        .iter()
        .map(|k| {
            let i = &k.incident;
            let opened = i.opened_at.replacen('T', " ", 1);
            [
                opened.split('.').next().unwrap_or(&opened).to_string(),
                i.kind.as_str().to_string(),
                i.component.clone().unwrap_or_else(|| "-".into()),
                state(i),
                lasted(i, now),
                k.path.display().to_string(),
            ]
            .map(|s| control::value(&s).into_owned())
        })
        .collect();
    let head = [
        "OPENED (UTC)",
        "KIND",
        "COMPONENT",
        "STATE",
        "LASTED",
        "PATH",
    ]
    .map(String::from);
    let width = |c: usize| {
        std::iter::once(&head)
            .chain(&rows)
            .map(|r| r[c].chars().count())
            .max()
            .unwrap_or(0)
    };
    let widths: Vec<usize> = (0..5).map(width).collect();
    let line = |r: &[String; 6]| {
        let mut l: String = (0..5)
            .map(|c| format!("{:<w$}  ", r[c], w = widths[c]))
            .collect();
        l.push_str(&r[5]);
        l.push('\n');
        l
    };
    std::iter::once(&head).chain(&rows).map(line).collect()
}
