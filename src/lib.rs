//! wedgewatch: attach to a running LLM inference stack and find the requests that were
//! accepted and forgotten.
//!
//! Data flows one way, one crate a layer: `wedgewatch-model` (the contract) <-
//! `wedgewatch-sys` (OS access) <- `wedgewatch-collect` (sources, probes, discovery) ->
//! samples -> `wedgewatch-judge` (correlate, detect) -> `wedgewatch-output` (snapshot,
//! report, diff, export, record, merge) and `wedgewatch-tui`. This crate is the runtime that
//! ties them together (attach, sampler, daemon, fleet, doctor) and the binary's CLI.

// No unwrap/expect in library code: a failed probe degrades, it never panics.
#![deny(clippy::unwrap_used, clippy::expect_used)]
// Rooms a reader can hold: thresholds in clippy.toml. Unit tests are exempt.
#![warn(clippy::too_many_lines, clippy::cognitive_complexity)]
#![cfg_attr(test, allow(clippy::too_many_lines, clippy::cognitive_complexity))]

pub mod alloc;
pub mod attach;
pub mod daemon;
pub mod doctor;
pub mod fleet;
pub mod fuzz_entry;
pub mod logging;
pub mod policy;
pub mod sampler;

// The layers, under the paths the binary, the tests and the benches name them by.
pub use wedgewatch_collect::{discover, probes, sources};
pub use wedgewatch_judge::{correlate, detect, pipeline};
pub use wedgewatch_model::{clock, config, error, model, prom, redact};
pub use wedgewatch_model::{Error, Result};
pub use wedgewatch_output::{diff, export, merge, record, report, snapshot};
pub use wedgewatch_sys::{children, deadline, safe_fs, sys};
#[cfg(feature = "tui")]
pub use wedgewatch_tui as tui;
