//! OS access: `/proc` readers that take a root, sock_diag, network namespaces, the one HTTP
//! client (`sys`); files opened and written without following what we did not create
//! (`safe_fs`); hard deadlines on blocking calls (`deadline`); the processes we spawn and
//! their descendants (`children`).

// No unwrap/expect in library code: a failed probe degrades, it never panics.
#![deny(clippy::unwrap_used, clippy::expect_used)]
// Rooms a reader can hold: thresholds in clippy.toml. Unit tests are exempt.
#![warn(clippy::too_many_lines, clippy::cognitive_complexity)]
#![cfg_attr(test, allow(clippy::too_many_lines, clippy::cognitive_complexity))]
// `children` kills and reaps what we spawn through libc where nix has no safe call.
#![allow(unsafe_code)]

pub mod children;
pub mod deadline;
pub mod safe_fs;
pub mod sys;

use wedgewatch_model::{error, model};
