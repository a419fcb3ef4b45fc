//! Outputs: the snapshot bundle (`snapshot`), report.md (`report`), deployment diffs
//! (`diff`), the Prometheus exporter (`export`), recordings (`record`) and the fleet merge
//! (`merge`). Each reads the model and the judgement; secrets never leave (`redact`).

// No unwrap/expect in library code: a failed probe degrades, it never panics.
#![deny(clippy::unwrap_used, clippy::expect_used)]
// Rooms a reader can hold: thresholds in clippy.toml. Unit tests are exempt.
#![warn(clippy::too_many_lines, clippy::cognitive_complexity)]
#![cfg_attr(test, allow(clippy::too_many_lines, clippy::cognitive_complexity))]

pub mod diff;
pub mod export;
pub mod merge;
pub mod record;
pub mod report;
pub mod snapshot;

use wedgewatch_judge::{correlate, detect, pipeline};
use wedgewatch_model::{clock, error, model, redact};
use wedgewatch_sys::{deadline, safe_fs, sys};
