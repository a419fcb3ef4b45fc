//! `wedgewatch completions SHELL` and `wedgewatch man`: generated from the same clap
//! definition as the parser, so they cannot drift from it.

use super::exit::code;
use anyhow::Context;
use clap::{Args, CommandFactory};
use std::io::Write;
use std::path::PathBuf;

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

pub fn man(a: ManArgs) -> anyhow::Result<i32> {
    let cmd = super::Cli::command();
    match &a.dir {
        Some(dir) => {
            clap_mangen::generate_to(cmd, dir)
                .with_context(|| format!("writing man pages to {}", dir.display()))?;
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
