//! Collection: the sources (py-spy stacks, NVML, sockets with tcp_info, metrics, processes),
//! the declarative probe profiles of `probes/*.toml` (`probes`) and topology discovery
//! (`discover`). Everything here reads the OS through `wedgewatch-sys` and hands samples of
//! the model up; nothing here judges them.

// No unwrap/expect in library code: a failed probe degrades, it never panics.
#![deny(clippy::unwrap_used, clippy::expect_used)]
// Rooms a reader can hold: thresholds in clippy.toml. Unit tests are exempt.
#![warn(clippy::too_many_lines, clippy::cognitive_complexity)]
#![cfg_attr(test, allow(clippy::too_many_lines, clippy::cognitive_complexity))]

pub mod discover;
pub mod probes;
pub mod sources;

use wedgewatch_model::{clock, config, error, model, prom, redact};
use wedgewatch_sys::{children, deadline, sys};
