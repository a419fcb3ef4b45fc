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

pub fn completions(a: CompletionsArgs) -> anyhow::Result<i32> {
    let mut cmd = super::Cli::command();
    let mut out = std::io::stdout().lock();
    clap_complete::generate(a.shell, &mut cmd, "wedgewatch", &mut out);
    out.flush().context("writing the completions")?;
    Ok(code::OK)
}

/// The page of `cmd` and of each visible subcommand, as `clap_mangen::generate_to` names
/// them, each written by [`wedgewatch::safe_fs::write_public_output`] (never through a
/// planted link, never over another user's file: `DIR` may be shared).
fn write_pages(cmd: clap::Command, dir: &Path) -> anyhow::Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned() {
        write_pages(sub, dir)?;
    }
    let man = clap_mangen::Man::new(cmd);
    let mut page = Vec::new();
    man.render(&mut page).context("rendering a man page")?;
    wedgewatch::safe_fs::write_public_output(&dir.join(man.get_filename()), &page)?;
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
            let mut out = std::io::stdout().lock();
            clap_mangen::Man::new(cmd)
                .render(&mut out)
                .and_then(|_| out.flush())
                .context("writing the man page")?;
        }
    }
    Ok(code::OK)
}
