//! Python stacks through py-spy, one subprocess per pid, classified by probe rules.
//!
//! One `py-spy dump` per pid (`--subprocesses` drops children and aborts on a non-Python
//! one), in parallel with bounded concurrency, each under a hard timeout that kills py-spy's
//! process group. Periodic sampling never pauses the target (`--nonblocking`); `--native`
//! only when configured. One dump is a guess: [`StackSource::capture_window`] takes several,
//! and [`summarize_window`] says which threads sat in the same state in every one. This file
//! holds the configuration and which pids to dump (the other files: docs/architecture.md).

mod evidence;
mod not_python;
mod pyspy;
mod rules;
mod sampler;

pub use evidence::{summarize_window, ThreadEvidence};
pub use pyspy::{MAX_PY_SPY_STDERR, MAX_PY_SPY_STDOUT};
pub use rules::{classify, Classification, RuleSet, StackRule};
pub use sampler::{window_sample, StackSource, StackWindow};

use crate::model::{Role, Topology};
use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

// py-spy JSON (its own module; re-exported here)
pub use crate::sources::pyspy_json::{parse_dump, parse_pyspy_json, MAX_FRAMES, MAX_THREADS};

/// Environment variable naming the py-spy binary.
pub const PY_SPY_ENV: &str = "WEDGEWATCH_PY_SPY";

/// How the stacks source runs py-spy.
#[derive(Debug, Clone)]
pub struct StacksConfig {
    /// Explicit py-spy binary; wins over everything else.
    pub py_spy: Option<PathBuf>,
    /// `$WEDGEWATCH_PY_SPY`, captured by [`StacksConfig::from_env`].
    pub py_spy_env: Option<PathBuf>,
    /// Directories searched for `py-spy` (`$PATH`, captured by `from_env`).
    pub search_path: Option<OsString>,
    /// Dumps per window (one dump is a guess; agreeing dumps are evidence).
    pub dumps_per_window: u32,
    /// Spacing between the starts of two dumps of a window.
    pub dump_interval: Duration,
    /// Hard timeout of one `py-spy dump --nonblocking`.
    pub timeout: Duration,
    /// At most this many py-spy processes at once.
    pub concurrency: usize,
    /// `--native`: pauses the target. Only on explicit request.
    pub native: bool,
    /// Hard timeout of one `--native` dump (slower: it unwinds native stacks).
    pub native_timeout: Duration,
    /// Upper bound on pids sampled per dump; the rest are reported as skipped.
    pub max_pids: usize,
    /// Time budget of one window: no further dump starts when the next one would end past
    /// it, so a loaded machine gets fewer dumps instead of a window the sampler throws away.
    /// Keep it under the sampler's stacks timeout.
    pub window_budget: Duration,
}

impl StacksConfig {
    /// Defaults, with py-spy looked up through `$WEDGEWATCH_PY_SPY` and `$PATH`.
    pub fn from_env() -> StacksConfig {
        StacksConfig {
            py_spy: None,
            py_spy_env: std::env::var_os(PY_SPY_ENV)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            search_path: std::env::var_os("PATH"),
            dumps_per_window: 3,
            dump_interval: Duration::from_millis(300),
            timeout: Duration::from_secs(2),
            concurrency: 4,
            native: false,
            native_timeout: Duration::from_secs(5),
            max_pids: 64,
            window_budget: Duration::from_millis(6_000),
        }
    }

    /// Which py-spy to run, or why there is none (with the install hint).
    pub fn resolve_py_spy(&self) -> std::result::Result<PathBuf, String> {
        for (origin, p) in [("--py-spy", &self.py_spy), (PY_SPY_ENV, &self.py_spy_env)] {
            if let Some(p) = p {
                return if crate::sys::exec::is_executable_file(p) {
                    Ok(p.clone())
                } else {
                    Err(format!(
                        "py-spy not found: {origin}={} is not an executable file \
                         (install with `pip install py-spy`)",
                        p.display()
                    ))
                };
            }
        }
        if let Some(path) = &self.search_path {
            for dir in std::env::split_paths(path) {
                let cand = dir.join("py-spy");
                if crate::sys::exec::is_executable_file(&cand) {
                    return Ok(cand);
                }
            }
        }
        Err(format!(
            "py-spy not found in PATH (install with `pip install py-spy`, or point {PY_SPY_ENV} \
             at the binary)"
        ))
    }
}

impl Default for StacksConfig {
    fn default() -> Self {
        StacksConfig::from_env()
    }
}

/// One process to dump, with the stack kind of its component (selects the rules).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackTarget {
    pub pid: i32,
    pub stack: Option<String>,
    pub component: Option<String>,
    /// Dumped on every round of a window, not only the first: schedulers, whose state across
    /// the window is the wedge evidence; for the others one dump shows where they are.
    pub whole_window: bool,
}

/// Every process of the topology that may run Python (all roles but `client`), once each.
pub fn targets_from_topology(topo: &Topology) -> Vec<StackTarget> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for c in &topo.components {
        if c.role == Role::Client {
            continue;
        }
        for &pid in &c.pids {
            if seen.insert(pid) {
                // The most specific component owns the pid (a scheduler before its engine).
                let owner = topo.component_of_pid(pid).unwrap_or(c);
                out.push(StackTarget {
                    pid,
                    stack: Some(owner.stack.clone()),
                    component: Some(owner.id.clone()),
                    whole_window: owner.role == Role::Scheduler,
                });
            }
        }
    }
    out
}
