//! Quick or full: how a bench binary was started. `cargo bench --bench NAME` passes `--bench`:
//! the full run, at its sizes (`WW_BENCH_*` knobs read), its goals judged. `cargo test --bench
//! NAME` (the test command: tests/lanes.sh) passes no `--bench`: a quick run, a few rounds at
//! small sizes, that fails when the bench no longer works (its own checks still hold) but
//! judges no performance goal (a loaded test machine; the figures are printed, not judged).
//! Shared by every bench (`#[path]`-included, beside `common/env.rs` as `env`).
#![allow(dead_code)]

use std::str::FromStr;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    Quick,
    Full,
}

impl Mode {
    /// The mode of this run, from its arguments (`--list`, libtest's probe: nothing to list,
    /// exit 0). Says so on stderr when quick.
    pub fn from_args() -> Mode {
        let args: Vec<String> = std::env::args().skip(1).collect();
        if args.iter().any(|a| a == "--list") {
            std::process::exit(0);
        }
        if args.iter().any(|a| a == "--bench") {
            return Mode::Full;
        }
        eprintln!(
            "quick mode (small sizes, goals not judged); the full run: cargo bench --bench {}",
            bench_name()
        );
        Mode::Quick
    }

    pub fn is_quick(self) -> bool {
        self == Mode::Quick
    }

    /// `full` or `quick`, by mode.
    pub fn pick<T>(self, full: T, quick: T) -> T {
        match self {
            Mode::Full => full,
            Mode::Quick => quick,
        }
    }

    /// A size or count: in the full run `$name` from the environment, else `full`; in the
    /// quick run `quick` (the environment is not read, so the test command stays quick).
    pub fn knob<T: FromStr>(self, name: &str, full: T, quick: T) -> T {
        match self {
            Mode::Full => crate::env::env_or(name, full),
            Mode::Quick => quick,
        }
    }

    /// Whether a performance goal's verdict fails the run: a missed goal does in the full run,
    /// never in the quick one.
    pub fn goal_fails(self, met: bool) -> bool {
        self == Mode::Full && !met
    }
}

/// This bench's name: its binary's file name without cargo's `-HASH` suffix.
fn bench_name() -> String {
    let exe = std::env::args().next().unwrap_or_default();
    let file = std::path::Path::new(&exe)
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    match file.rsplit_once('-') {
        Some((name, _)) => name.to_string(),
        None => file,
    }
}
