//! The `wedgewatch` command line: a thin front over the library (see `cli/`).
//!
//! Everything that samples goes through `wedgewatch::attach`, so every verb samples the same
//! way. Exit codes: `cli::exit::code`, documented in `--help` and the README.

#![deny(clippy::unwrap_used, clippy::expect_used)]
// Rooms a reader can hold: thresholds in clippy.toml. Unit tests are exempt.
#![warn(clippy::too_many_lines, clippy::cognitive_complexity)]
#![cfg_attr(test, allow(clippy::too_many_lines, clippy::cognitive_complexity))]
// `export_name` hands jemalloc its options (below); nothing else here is unsafe.
#![allow(unsafe_code)]

use clap::error::ErrorKind;
use clap::Parser;
use std::io::Write;

/// jemalloc, not glibc's malloc: see `wedgewatch::alloc` for why and how it is tuned.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read at its first allocation (`_RJEM_MALLOC_CONF` in the environment
/// is read after them and wins: the operator's word).
#[export_name = "_rjem_malloc_conf"]
#[used]
static MALLOC_CONF: Option<&u8> = wedgewatch::alloc::JEMALLOC_CONF.first();

mod cli;
use cli::exit;

fn main() {
    cli::mark_start();
    // not env::args(): it panics on an argument that is not UTF-8
    let args: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let is_check = cli::verb_in(&args).as_deref() == Some("check");
    let parsed = match cli::Cli::try_parse_from(std::env::args_os()) {
        Ok(c) => c,
        Err(e) if is_help(e.kind()) => e.exit(),
        Err(e) => {
            let line = usage_line(&e);
            let _ = writeln!(std::io::stderr(), "wedgewatch: {line}");
            // a monitoring system reads stdout and must see UNKNOWN, not a CRITICAL 2
            let code = if is_check {
                let json = args.iter().any(|a| a == "--json");
                cli::check::unknown(json, &line)
            } else {
                exit::code::USAGE
            };
            std::process::exit(code);
        }
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
    // Log lines are written by a thread of their own: let it finish, but never hang on it.
    wedgewatch::logging::flush(std::time::Duration::from_millis(500));
    std::process::exit(code)
}

/// clap's error on one line: its message, the possible values and its tip, not the usage
/// block after them.
fn usage_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines.next().unwrap_or("usage error");
    let mut line = first.trim_start_matches("error: ").to_string();
    // "...were not provided:" lists what is missing on the lines after it
    let lines: Vec<&str> = lines.collect();
    if line.ends_with(':') {
        let listed = lines
            .iter()
            .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("tip:"));
        for l in listed {
            line.push(' ');
            line.push_str(l);
        }
    }
    for more in lines
        .iter()
        .filter(|l| l.starts_with("tip:") || l.starts_with("[possible values"))
    {
        line.push_str(&format!(" {more}"));
    }
    line.push_str("; see --help");
    // the message quotes the command line, which may hold a secret (a URL's password)
    wedgewatch::redact::log_line(&line)
}

fn is_help(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    )
}
