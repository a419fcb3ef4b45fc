//! The contract every layer speaks: samples, topology, findings, snapshots (`model`), the
//! thresholds and sampling settings (`config`), time (`clock`), the error type, redaction
//! of secrets (`redact`) and the Prometheus text parser (`prom`). No OS access but the clock.

// No unwrap/expect in library code: a failed probe degrades, it never panics.
#![deny(clippy::unwrap_used, clippy::expect_used)]
// Rooms a reader can hold: thresholds in clippy.toml. Unit tests are exempt.
#![warn(clippy::too_many_lines, clippy::cognitive_complexity)]
#![cfg_attr(test, allow(clippy::too_many_lines, clippy::cognitive_complexity))]

pub mod clock;
pub mod config;
pub mod error;
pub mod model;
pub mod prom;
pub mod redact;

pub use error::{Error, Result};
