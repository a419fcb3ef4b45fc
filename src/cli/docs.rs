//! `wedgewatch completions SHELL` and `wedgewatch man`: generated from the same clap
//! definition as the parser, so they cannot drift from it.

use super::exit::code;
use anyhow::Context;
use clap::{Args, CommandFactory};
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  wedgewatch completions bash > /etc/bash_completion.d/wedgewatch
  wedgewatch completions zsh > \"${fpath[1]}/_wedgewatch\"
  wedgewatch completions fish > ~/.config/fish/completions/wedgewatch.fish")]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  wedgewatch man | man -l -
  wedgewatch man --dir /usr/local/share/man/man1   # wedgewatch.1 and one page per verb")]
pub struct ManArgs {
    /// Write wedgewatch.1 and a page per verb (wedgewatch-snapshot.1, ...) into DIR
    /// instead of printing wedgewatch.1.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// `cmd` (built: its global and generated arguments in place) without its hidden
/// arguments and subcommands: the shells' generators offer whatever they are given, and a
/// hidden option (`--proc-root`, for tests) is not for people.
fn shown(cmd: &clap::Command) -> clap::Command {
    // a `Command`'s name and version are `'static` (without clap's `string` feature): the
    // few of one completions run are leaked, the process ends right after
    let leak = |s: &str| -> &'static str { Box::leak(s.to_string().into_boxed_str()) };
    let mut c = clap::Command::new(leak(cmd.get_name()))
        .disable_help_flag(true)
        .disable_version_flag(true)
        .disable_help_subcommand(true)
        .args(cmd.get_arguments().filter(|a| !a.is_hide_set()).cloned())
        .subcommands(
            cmd.get_subcommands()
                .filter(|s| !s.is_hide_set())
                .map(shown),
        );
    if let Some(about) = cmd.get_about() {
        c = c.about(about.clone());
    }
    if let Some(bin) = cmd.get_bin_name() {
        c = c.bin_name(bin.to_string());
    }
    if let Some(v) = cmd.get_version() {
        c = c.version(leak(v));
    }
    c
}

pub fn completions(a: CompletionsArgs) -> anyhow::Result<i32> {
    let mut built = super::Cli::command();
    built.build();
    let mut cmd = shown(&built);
    // into memory first: the generator panics on a write error (a closed pipe)
    let mut script = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "wedgewatch", &mut script);
    let mut out = std::io::stdout().lock();
    out.write_all(&script)
        .and_then(|_| out.flush())
        .context("writing the completions")?;
    Ok(code::OK)
}

/// The page of `cmd` and of each visible subcommand, as `clap_mangen::generate_to` names
/// them, each written by [`wedgewatch::safe_fs::write_public_output`] (never through a
/// planted link, never over another user's file: `DIR` may be shared).
fn write_pages(cmd: clap::Command, dir: &Path) -> anyhow::Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned() {
        write_pages(sub, dir)?;
    }
    let name = clap_mangen::Man::new(cmd.clone()).get_filename();
    let top = cmd.get_bin_name().is_none_or(|b| b == "wedgewatch");
    let mut page = Vec::new();
    super::man_page::render(cmd, top, &mut page).context("rendering a man page")?;
    wedgewatch::safe_fs::write_public_output(&dir.join(name), &page)?;
    Ok(())
}

pub fn man(a: ManArgs) -> anyhow::Result<i32> {
    let cmd = super::Cli::command();
    match &a.dir {
        Some(dir) => {
            let mut cmd = cmd.disable_help_subcommand(true);
            cmd.build();
            write_pages(cmd, dir)?;
        }
        None => {
            let mut page = Vec::new();
            super::man_page::render(cmd, true, &mut page).context("rendering the man page")?;
            let mut out = std::io::stdout().lock();
            out.write_all(&page)
                .and_then(|_| out.flush())
                .context("writing the man page")?;
        }
    }
    Ok(code::OK)
}
