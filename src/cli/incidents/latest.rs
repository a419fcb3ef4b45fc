//! `wedgewatch incidents latest -o DIR`: the newest kept incident's bundle copied to DIR (a
//! fresh snapshot's when none is kept, said on stderr), then on stdout the one line that
//! files it: `gh issue create --title '...' --body-file 'DIR/report.md'`. The title is built
//! from redacted fields, redacted again and made inert; every word of the line is quoted for
//! a POSIX shell, so a hostile component name stays text.

use super::super::exit::code;
use super::super::options::Sampling;
use super::super::progress;
use super::super::source::{self, SourceArgs};
use anyhow::Context;
use clap::Args;
use std::io::Write;
use std::path::{Path, PathBuf};
use wedgewatch::daemon::incidents::{store, Kept};
use wedgewatch::model::{RawFiles, Snapshot};
use wedgewatch::safe_fs::staged::StagedDir;
use wedgewatch::snapshot::{self, Overwrite};

/// Longest title (GitHub takes 256 characters).
const MAX_TITLE: usize = 200;

const EXAMPLES: &str = "\
Examples:
  wedgewatch incidents latest -o /tmp/incident
  sh -c \"$(wedgewatch incidents latest -o /tmp/incident)\"   # files it with the gh CLI

Exit status: 0 copied (or a fresh snapshot written), 2 usage or input error (DIR not empty, a
state directory that cannot be read), 3 none kept and no snapshot could be taken.";

#[derive(Debug, Args, Clone)]
#[command(after_help = EXAMPLES)]
pub struct LatestArgs {
    /// Where the bundle goes: a new directory (an existing one must be empty).
    #[arg(short = 'o', long = "output", value_name = "DIR")]
    pub output: PathBuf,
    /// For the fresh snapshot taken when no incident is kept (and `--state-dir`: whose
    /// incidents).
    #[command(flatten)]
    pub sampling: Sampling,
}

pub fn run(s: Sampling, a: &LatestArgs) -> anyhow::Result<i32> {
    let out = &a.output;
    if super::super::snapshot::is_stdout(out) {
        anyhow::bail!("-o - (stdout): `incidents latest` writes a bundle directory; name one");
    }
    // refused before anything is read or sampled
    snapshot::check_bundle_target(out, Overwrite::Refuse)?;
    let dir = s.daemon_config().incidents_dir();
    let title = match super::kept(&dir)?.pop() {
        Some(k) => {
            copy_out(&k, out)?;
            progress::note(&format!("copied incident {} to {}", k.name, out.display()));
            incident_title(&k)
        }
        None => {
            progress::note(&format!(
                "no incident kept in {}; took a fresh snapshot instead",
                dir.display()
            ));
            snapshot_title(&fresh(&s, out)?)
        }
    };
    let line = gh_line(&title, &out.join(store::REPORT_FILE))?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}")?;
    stdout.flush()?;
    Ok(code::OK)
}

/// Copies an incident's own files (regular files, never through a link) into a new `out`,
/// which appears whole.
fn copy_out(k: &Kept, out: &Path) -> anyhow::Result<()> {
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    let staged = StagedDir::beside(out)?;
    for name in store::FILES {
        let from = k.path.join(name);
        if std::fs::symlink_metadata(&from).is_err() {
            continue; // e.g. no recording: the daemon kept none
        }
        let mut src = wedgewatch::safe_fs::open_input(&from)?;
        let to = staged.path().join(name);
        let mut dst = wedgewatch::safe_fs::create_new_private_file(&to)
            .with_context(|| format!("creating {}", to.display()))?;
        std::io::copy(&mut src, &mut dst)
            .and_then(|_| dst.sync_all())
            .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    }
    staged
        .commit()
        .with_context(|| format!("writing {}", out.display()))?;
    Ok(())
}

/// A snapshot now (from the daemon when one runs, else sampled here), written to `out` as a
/// bundle.
fn fresh(s: &Sampling, out: &Path) -> anyhow::Result<Snapshot> {
    let from = SourceArgs {
        window: std::time::Duration::from_secs(3),
        from: None,
        at: None,
        no_daemon: false,
    };
    let parts = source::parts(s, &from, RawFiles::All)?;
    let bundle = snapshot::assemble_bundle(parts, &s.assemble());
    snapshot::write_bundle(&bundle.snapshot, &bundle.raw, out, Overwrite::Refuse)
        .with_context(|| format!("writing the bundle to {}", out.display()))?;
    Ok(bundle.snapshot)
}

fn incident_title(k: &Kept) -> String {
    let i = &k.incident;
    let at = i.component.as_deref().unwrap_or("-");
    clean_title(&format!(
        "wedgewatch incident: {} at {at} ({})",
        i.kind, i.opened_at
    ))
}

fn snapshot_title(s: &Snapshot) -> String {
    let v = wedgewatch::report::render_json(s);
    let t = v["title"].as_str().unwrap_or("wedgewatch snapshot");
    clean_title(&format!("wedgewatch: {t}"))
}

/// A title as it may leave: redacted (structure and shape: tokens, URL userinfo, ...), every
/// control character escaped, at most [`MAX_TITLE`] characters.
fn clean_title(t: &str) -> String {
    let redacted = wedgewatch::redact::Redactor::new().text(t);
    let inert = wedgewatch::redact::control::value(&redacted);
    inert.chars().take(MAX_TITLE).collect()
}

/// `gh issue create --title TITLE --body-file REPORT`, each word quoted for a POSIX shell.
fn gh_line(title: &str, report: &Path) -> anyhow::Result<String> {
    let report = report.to_string_lossy();
    if report.chars().any(char::is_control) {
        anyhow::bail!("-o names a path with control characters; choose another");
    }
    let words = [
        "gh",
        "issue",
        "create",
        "--title",
        title,
        "--body-file",
        &report,
    ];
    shlex::try_join(words).context("a title or path that no shell can quote (a NUL byte)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_is_one_shell_command_whatever_the_component_is_called() {
        let title = clean_title(
            "wedgewatch incident: wedged_request at decode';rm -rf ~;'$(id)`x`\n(2026)",
        );
        let line = gh_line(&title, Path::new("/tmp/it's here/report.md")).expect("line");
        assert_eq!(line.lines().count(), 1, "{line}");
        let words = shlex::split(&line).expect("one shell line");
        assert_eq!(words.len(), 7, "{words:?}");
        assert_eq!(words[4], title);
        assert_eq!(words[6], "/tmp/it's here/report.md");
        assert!(!title.contains('\n'), "{title}");
    }

    #[test]
    fn titles_carry_no_secrets() {
        let t = clean_title(
            "wedgewatch incident: wedged_request at decode@http://u:hunter2pass@h:1 hf_abcdefghijklmnopqrstuvwxyz0123",
        );
        assert!(
            !t.contains("hunter2pass") && !t.contains("hf_abcdefghij"),
            "{t}"
        );
        assert!(clean_title(&"x".repeat(1_000)).chars().count() <= MAX_TITLE);
    }
}
