//! The command line: the verbs, their options, and how a run ends (exit codes).
//!
//! One file per verb (`snapshot`, `check`, `daemon`, `record`, `export`, `diff`, `doctor`,
//! `tui`, `demo`, `docs` for completions and man, `merge`, `fleet`, `incidents`). Shared
//! pieces: `options` (the sampling options, offered only by verbs that sample), `source`
//! (recording, daemon or sampling window), `duration` (the one duration grammar), `progress` (stderr while working),
//! `exit` (exit codes, signals, runtimes).

mod adopt;
pub mod check;
pub mod daemon;
pub mod demo;
pub mod diff;
pub mod docs;
pub mod doctor;
pub mod duration;
pub mod exit;
pub mod export;
pub mod fleet;
pub mod incidents;
pub mod man_page;
pub mod merge;
pub mod options;
pub mod progress;
pub mod record;
pub mod report;
pub mod snapshot;
pub mod source;
pub mod tui;
pub mod unseen;

use clap::{Parser, Subcommand};
use options::Sampling;

/// `--help`'s closing words: examples, and the exit codes every verb follows.
const EXIT_CODES: &str = "\
Examples:
  wedgewatch                                # the live UI on the stack found here
  wedgewatch snapshot -o bundle/            # snapshot.json + report.md, for an issue
  wedgewatch report bundle/                 # report.md again (--format text, --json)
  wedgewatch check --require stacks,metrics # a monitoring-plugin check
  wedgewatch daemon --metrics-listen 127.0.0.1:9466
  wedgewatch diff noon.json bundle/         # what changed since a good snapshot
  wedgewatch demo                           # the built-in lab, wedged like the incident

Exit status:
  0  nothing found (diff: no differences)
  1  found: findings at or above --fail-on (snapshot, check), differences (diff)
  2  usage or input error (bad flag, not a recording, --at outside the recording, ...)
  3  could not sample at all
`wedgewatch check` follows the monitoring-plugin convention instead: 0 OK, 1 WARNING,
2 CRITICAL, 3 UNKNOWN.

Durations everywhere (--window, --for, --at): 500ms, 90s, 5m, 1h30m; a bare number is seconds.
`-` as an output file (-o, --perfetto) is stdout.";

#[derive(Debug, Parser)]
#[command(
    name = "wedgewatch",
    version,
    about = "Attach to a running LLM inference stack (SGLang/vLLM) and find the requests that were accepted and forgotten",
    after_help = EXIT_CODES
)]
pub struct Cli {
    /// No progress or notes on stderr (errors are still printed).
    #[arg(short, long, global = true)]
    pub quiet: bool,
    /// More log detail on stderr: -v debug, -vv trace (default: the daemon logs info, other
    /// verbs warnings, --quiet only warnings; without these RUST_LOG decides).
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// Sampling options before the verb apply to it (and to the live UI without a verb).
    #[command(flatten)]
    pub sampling: Sampling,
    #[command(subcommand)]
    pub verb: Option<Verb>,
}

/// The verbs, in the order `--help` lists them: looking (the UI, a snapshot and its
/// report, a check, a diff), watching (daemon, record, export), many nodes, then the tools.
#[derive(Debug, Subcommand)]
pub enum Verb {
    /// The live terminal UI (also what `wedgewatch` alone runs).
    Tui(tui::TuiArgs),
    /// Sample the stack and write a snapshot (JSON + Markdown bundle).
    Snapshot(snapshot::SnapshotArgs),
    /// Render report.md (or text, or the verdict as JSON) again from a snapshot or bundle.
    Report(report::ReportArgs),
    /// A monitoring-plugin check: one line per finding, exit 0 OK / 1 WARNING / 2 CRITICAL /
    /// 3 UNKNOWN.
    Check(check::CheckArgs),
    /// What changed between two snapshots (env, cmdline, versions, topology, restarts).
    Diff(diff::DiffArgs),
    /// Sample continuously: bounded history, recording, baselines, live state on a socket.
    Daemon(daemon::DaemonArgs),
    /// Record samples to a file for a while, for replay elsewhere.
    Record(record::RecordArgs),
    /// Export the request timeline as Chrome trace-event JSON (opens in Perfetto).
    Export(export::ExportArgs),
    /// One snapshot of several nodes from their snapshots or bundles (hops joined across
    /// nodes, requests judged again).
    Merge(merge::MergeArgs),
    /// Many nodes at once: `fleet snapshot --nodes a,b --via 'ssh {node}'`.
    Fleet(fleet::FleetArgs),
    /// The incident bundles the daemon kept (a critical finding's moment and the minutes
    /// before it); `incidents latest -o DIR` copies the newest out to file it.
    Incidents(incidents::IncidentsArgs),
    /// What can be sampled here and why not.
    Doctor(doctor::DoctorArgs),
    /// Bring up the built-in lab stack, wedge it like the incident, and open the UI on it.
    Demo(demo::DemoArgs),
    /// Shell completions for bash, zsh, fish (elvish, powershell).
    Completions(docs::CompletionsArgs),
    /// The man page (roff).
    Man(docs::ManArgs),
}

impl Verb {
    /// Whether this verb takes sampling options (given before it, they must mean something).
    fn samples(&self) -> bool {
        !matches!(
            self,
            Verb::Diff(_)
                | Verb::Completions(_)
                | Verb::Man(_)
                | Verb::Doctor(_)
                | Verb::Report(_)
                | Verb::Merge(_)
                | Verb::Fleet(_)
        )
    }
}

/// When this process began its work (set first thing in `main`): a one-shot window counts
/// from here, so `snapshot --window 3s` is 3 s of the caller's wall clock.
static STARTED: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

/// Marks the process's start (the first call wins).
pub fn mark_start() {
    STARTED.get_or_init(std::time::Instant::now);
}

/// The process's start, as [`mark_start`] marked it (now, if it never was).
pub fn started() -> std::time::Instant {
    *STARTED.get_or_init(std::time::Instant::now)
}

/// Runs the verb; the exit code on success.
pub fn run(cli: Cli) -> anyhow::Result<i32> {
    progress::set_quiet(cli.quiet);
    let top = cli.sampling;
    let verb = cli.verb.unwrap_or(Verb::Tui(tui::TuiArgs::default()));
    init_logging(cli.verbose, cli.quiet, &verb)?;
    if !verb.samples() {
        refuse_sampling_options(&top, &verb)?;
    }
    match verb {
        Verb::Tui(a) => tui::cmd_tui(top, a),
        Verb::Snapshot(a) => snapshot::run(top, a),
        Verb::Check(a) => check::run(top, a),
        Verb::Daemon(a) => daemon::run(top, a),
        Verb::Record(a) => record::run(top, a),
        Verb::Export(a) => export::run(top, a),
        Verb::Demo(a) => demo::cmd_demo(top, a),
        Verb::Diff(a) => diff::run(a),
        Verb::Doctor(a) => doctor::run(top.targets, a),
        Verb::Completions(a) => docs::completions(a),
        Verb::Man(a) => docs::man(a),
        Verb::Report(a) => report::cmd_report(a),
        Verb::Merge(a) => merge::run(a),
        Verb::Fleet(a) => fleet::run(a),
        Verb::Incidents(a) => incidents::run(top, a),
    }
}

/// Logs (`tracing`, see `wedgewatch::logging`) for every verb but the terminal UI's, whose
/// screen a log line on stderr would tear. The daemon logs at info by default: its log is
/// all a service says.
fn init_logging(verbose: u8, quiet: bool, verb: &Verb) -> anyhow::Result<()> {
    let default_level = match verb {
        Verb::Tui(_) | Verb::Demo(_) => return Ok(()),
        Verb::Daemon(_) => tracing::Level::INFO,
        _ => tracing::Level::WARN,
    };
    wedgewatch::logging::init(&wedgewatch::logging::LogOptions {
        verbose,
        quiet,
        default_level,
    })?;
    Ok(())
}

/// `wedgewatch --native diff a b`: an option the verb has no use for is a usage error, not
/// silently ignored. Doctor takes the target options only.
fn refuse_sampling_options(top: &Sampling, verb: &Verb) -> anyhow::Result<()> {
    let given = match verb {
        Verb::Doctor(_) => Sampling {
            targets: Default::default(),
            ..top.clone()
        }
        .first_given(),
        _ => top.first_given(),
    };
    match given {
        Some(flag) => anyhow::bail!("{flag} does not apply to `{}`", verb_name(verb)),
        None => Ok(()),
    }
}

fn verb_name(verb: &Verb) -> &'static str {
    match verb {
        Verb::Tui(_) => "tui",
        Verb::Snapshot(_) => "snapshot",
        Verb::Check(_) => "check",
        Verb::Daemon(_) => "daemon",
        Verb::Record(_) => "record",
        Verb::Export(_) => "export",
        Verb::Demo(_) => "demo",
        Verb::Diff(_) => "diff",
        Verb::Doctor(_) => "doctor",
        Verb::Completions(_) => "completions",
        Verb::Man(_) => "man",
        Verb::Report(_) => "report",
        Verb::Merge(_) => "merge",
        Verb::Fleet(_) => "fleet",
        Verb::Incidents(_) => "incidents",
    }
}

/// The verb an argument list names, as far as it can be told without parsing it (for a
/// usage error of `check`, which must exit 3, not 2). Values of top-level options that take
/// one are skipped.
pub fn verb_in(args: &[String]) -> Option<String> {
    use clap::CommandFactory;
    let cmd = Cli::command();
    let takes_value = |flag: &str| {
        let name = flag.trim_start_matches('-');
        cmd.get_arguments().any(|a| {
            a.get_action().takes_values()
                && (a.get_long() == Some(name)
                    || (flag.len() == 2 && a.get_short() == name.chars().next()))
        })
    };
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        if a == "--" {
            return it.next().cloned();
        }
        if a.starts_with('-') {
            if !a.contains('=') && takes_value(a) {
                it.next();
            }
            continue;
        }
        return Some(a.clone());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn the_verb_is_found_past_top_level_values() {
        assert_eq!(verb_in(&args("ww check")).as_deref(), Some("check"));
        assert_eq!(
            verb_in(&args("ww --pid 5 --native check --bogus")).as_deref(),
            Some("check")
        );
        assert_eq!(
            verb_in(&args("ww --pid=5 -q snapshot")).as_deref(),
            Some("snapshot")
        );
        assert_eq!(verb_in(&args("ww --quiet")), None);
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
