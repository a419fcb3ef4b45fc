//! Judgement: samples in, findings out. The correlator (`correlate`) builds per-request
//! lifecycles across hops and component state over time; the detectors (`detect`) turn them
//! into findings with evidence; `pipeline` runs one after the other. No OS access and no
//! async runtime: the same samples always give the same answer.

// No unwrap/expect in library code: a failed probe degrades, it never panics.
#![deny(clippy::unwrap_used, clippy::expect_used)]
// Rooms a reader can hold: thresholds in clippy.toml. Unit tests are exempt.
#![warn(clippy::too_many_lines, clippy::cognitive_complexity)]
#![cfg_attr(test, allow(clippy::too_many_lines, clippy::cognitive_complexity))]

pub mod correlate;
pub mod detect;
pub mod pipeline;

use wedgewatch_model::{clock, config, model};
