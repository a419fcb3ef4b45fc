//! Binary-side front ends that need the terminal UI: `tui` and `demo`.

pub mod demo;
pub mod tui;
