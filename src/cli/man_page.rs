//! The man pages: clap_mangen's sections (name, synopsis, description, options, commands)
//! from the parser's definition, then our own in the places a reader looks: each verb's
//! `--help` closing text split into EXAMPLES, EXIT STATUS and NOTES (clap_mangen would put it
//! all under EXTRA), and on the top page ENVIRONMENT, FILES and the UI's KEYS.

use clap::Command;
use std::io::{self, Write};

const ENVIRONMENT: &[(&str, &str)] = &[
    ("WEDGEWATCH_PY_SPY", "The py-spy binary to run (as --py-spy)."),
    ("WEDGEWATCH_NVML_LIB", "The libnvidia-ml.so to load (as --nvml-lib)."),
    (
        "WEDGEWATCH_NODE",
        "The node's name in snapshots, by which merge namespaces components (default: the hostname).",
    ),
    ("RUST_LOG", "The log filter, when neither -v nor --quiet is given."),
    ("NO_COLOR", "Set and not empty: the live UI without colours."),
    (
        "STATE_DIRECTORY, XDG_STATE_HOME, XDG_RUNTIME_DIR",
        "Where the daemon keeps its state and socket (see FILES and --state-dir).",
    ),
];

const FILES: &[(&str, &str)] = &[
    (
        "/var/lib/wedgewatch/ ($STATE_DIRECTORY)",
        "The daemon's state, run as root: recording/ (the rotated recording), the lock, known-good.json (the last facts that ran healthy, what config_changed compares against).",
    ),
    (
        "/run/wedgewatch/daemon.sock",
        "The daemon's socket, run as root (owner only).",
    ),
    (
        "$XDG_STATE_HOME/wedgewatch/, $XDG_RUNTIME_DIR/wedgewatch/daemon.sock",
        "The same for another user (~/.local/state/wedgewatch without XDG_STATE_HOME).",
    ),
    (
        "DIR/snapshot.json, DIR/report.md, DIR/raw/",
        "A bundle, as snapshot -o DIR writes it: the snapshot (schema wedgewatch.snapshot/1), the report for an issue, each source's raw payload.",
    ),
];

/// Text as roff: a backslash, a leading `.` or `'` and a minus are escaped.
fn roff_text(s: &str) -> String {
    let t = s.replace('\\', "\\e").replace('-', "\\-");
    if t.starts_with('.') || t.starts_with('\'') {
        format!("\\&{t}")
    } else {
        t
    }
}

/// A section of lines kept as they are (no filling: examples stay aligned).
fn literal(w: &mut dyn Write, heading: &str, lines: &[String]) -> io::Result<()> {
    writeln!(w, ".SH {heading}\n.nf")?;
    for l in lines {
        writeln!(w, "{}", roff_text(l))?;
    }
    writeln!(w, ".fi")
}

/// A section of `.TP` entries: a term in bold, its text below.
fn entries(w: &mut dyn Write, heading: &str, items: &[(&str, &str)]) -> io::Result<()> {
    writeln!(w, ".SH {heading}")?;
    for (term, text) in items {
        writeln!(w, ".TP\n\\fB{}\\fR\n{}", roff_text(term), roff_text(text))?;
    }
    Ok(())
}

/// The section a `--help` closing line opens (`Examples:`, `Exit status (...):`), and
/// what follows its colon on the same line.
fn heading(line: &str) -> Option<(&'static str, String)> {
    let (head, rest) = line.split_once(':')?;
    let (name, note) = match head.split_once(" (") {
        Some((n, note)) => (n, format!("({note} ")),
        None => (head, String::new()),
    };
    let section = match name {
        "Examples" => "EXAMPLES",
        "Exit status" => "EXIT STATUS",
        _ => return None,
    };
    Some((section, format!("{note}{}", rest.trim()).trim().to_string()))
}

/// The closing text split into sections: its headed parts, and paragraphs after them that
/// are no part of them (NOTES).
pub fn sections(after_help: &str) -> Vec<(&'static str, Vec<String>)> {
    let mut out: Vec<(&'static str, Vec<String>)> = Vec::new();
    let mut blank = true;
    for line in after_help.lines() {
        let top_level = !line.starts_with(' ') && !line.is_empty();
        match heading(line).filter(|_| top_level) {
            Some((name, rest)) => {
                let first = if rest.is_empty() { vec![] } else { vec![rest] };
                out.push((name, first));
            }
            None if top_level && blank || out.is_empty() => {
                if !line.is_empty() {
                    out.push(("NOTES", vec![line.to_string()]));
                }
            }
            None => {
                if let Some(last) = out.last_mut() {
                    last.1.push(line.to_string());
                }
            }
        }
        blank = line.is_empty();
    }
    for s in &mut out {
        while s.1.last().is_some_and(|l| l.is_empty()) {
            s.1.pop();
        }
    }
    out
}

/// The page of `cmd`; `top`: the program's own page, with ENVIRONMENT, FILES and KEYS.
pub fn render(cmd: Command, top: bool, w: &mut dyn Write) -> io::Result<()> {
    let after = cmd
        .get_after_help()
        .map(|h| h.to_string())
        .unwrap_or_default();
    let has_args = cmd.get_arguments().any(|a| !a.is_hide_set());
    let has_subs = cmd.get_subcommands().any(|s| !s.is_hide_set());
    let man = clap_mangen::Man::new(cmd.clone());
    man.render_title(w)?;
    man.render_name_section(w)?;
    man.render_synopsis_section(w)?;
    man.render_description_section(w)?;
    if has_args {
        man.render_options_section(w)?;
    }
    if has_subs {
        man.render_subcommands_section(w)?;
    }
    for (name, lines) in sections(&after) {
        literal(w, name, &lines)?;
    }
    if top {
        entries(w, "ENVIRONMENT", ENVIRONMENT)?;
        entries(w, "FILES", FILES)?;
        keys(w)?;
    }
    if cmd.get_version().is_some() {
        man.render_version_section(w)?;
    }
    Ok(())
}

/// The live UI's keys, as its `?` overlay lists them.
#[cfg(feature = "tui")]
fn keys(w: &mut dyn Write) -> io::Result<()> {
    entries(w, "KEYS (tui)", wedgewatch::tui::HELP)
}

#[cfg(not(feature = "tui"))]
fn keys(_w: &mut dyn Write) -> io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_text_is_split_into_sections() {
        let s = sections(
            "Examples:\n  a b   # c\n\nExit status (monitoring-plugin convention):\n  0 OK\n\nDurations: 5m.\n",
        );
        let names: Vec<&str> = s.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["EXAMPLES", "EXIT STATUS", "NOTES"], "{s:?}");
        assert_eq!(s[0].1, ["  a b   # c"]);
        assert_eq!(s[1].1, ["(monitoring-plugin convention)", "  0 OK"]);
        let s = sections("Exit status: 0 rendered, 2 usage error.");
        assert_eq!(
            s,
            [(
                "EXIT STATUS",
                vec!["0 rendered, 2 usage error.".to_string()]
            )]
        );
        assert_eq!(roff_text(".x -y \\z"), "\\&.x \\-y \\ez");
    }
}
