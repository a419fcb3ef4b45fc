//! wedgewatch: attach to a running LLM inference stack and find the requests that were
//! accepted and forgotten.
//!
//! Data flows one way: `sources` -> `model::Sample` -> `correlate` -> `detect` (findings)
//! -> outputs (`snapshot`, `diff`, `export`, and the terminal UI behind the `tui` feature).
//! Nothing in the core depends on a terminal library.

// No unwrap/expect in the library: a failed probe degrades, it never panics.
#![deny(clippy::unwrap_used, clippy::expect_used)]
// Rooms a reader can hold (issue 12): thresholds in clippy.toml. Unit tests are exempt,
// as tests/ and benches/ are (crate attributes do not reach them): the non-test build
// checks every other function.
#![warn(clippy::too_many_lines, clippy::cognitive_complexity)]
#![cfg_attr(test, allow(clippy::too_many_lines, clippy::cognitive_complexity))]

pub mod attach;
pub mod children;
pub mod clock;
pub mod config;
/// The former name of [`config`], kept for callers of earlier versions.
pub mod correlate;
pub mod daemon;
pub mod deadline;
pub mod detect;
pub mod diff;
pub mod discover;
pub mod doctor;
pub mod error;
pub mod export;
pub mod fleet;
pub mod fuzz_entry;
pub mod logging;
pub mod merge;
pub mod model;
pub mod pipeline;
pub mod probes;
pub mod prom;
pub mod record;
pub mod redact;
pub mod report;
pub mod safe_fs;
pub mod sampler;
pub mod snapshot;
pub mod sources;
pub mod sys;
#[cfg(feature = "tui")]
pub mod tui;

pub use error::{Error, Result};
/// The HTTP client, at its old path (it lives in the OS-access layer, [`sys::http`]).
pub use sys::http;
pub use sys::netns;
