//! The `wedgewatch` command line: a thin front over the library (see `cli/`).
//!
//! Everything that samples goes through `wedgewatch::attach`, so every verb samples the same
//! way. Exit codes: `cli::exit::code`, documented in `--help` and the README.

#![deny(clippy::unwrap_used, clippy::expect_used)]

use clap::error::ErrorKind;
use clap::Parser;
use std::io::Write;

mod cli;
use cli::exit;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let is_check = cli::verb_in(&args).as_deref() == Some("check");
    let parsed = match cli::Cli::try_parse_from(std::env::args_os()) {
        Ok(c) => c,
        Err(e) if is_check && !is_help(e.kind()) => {
            // a monitoring system reads stdout and must see UNKNOWN, not a CRITICAL 2
            let _ = e.print();
            let first = e.to_string();
            let first = first.lines().next().unwrap_or("usage error");
            let json = args.iter().any(|a| a == "--json");
            std::process::exit(cli::check::unknown(json, first.trim_start_matches("error: ")));
        }
        Err(e) => e.exit(),
    };
    let check_json = match &parsed.verb {
        Some(cli::Verb::Check(a)) => Some(a.json),
        _ => None,
    };
    let code = match cli::run(parsed) {
        Ok(code) => code,
        Err(e) => {
            let line = exit::one_line(&e);
            // Not eprintln!: it panics when stderr is gone.
            let _ = writeln!(std::io::stderr(), "wedgewatch: {line}");
            match check_json {
                Some(json) => cli::check::unknown(json, &line),
                None => exit::code_of(&e),
            }
        }
    };
    wedgewatch::children::kill_all();
    std::process::exit(code)
}

fn is_help(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    )
}
