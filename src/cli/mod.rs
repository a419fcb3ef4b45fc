//! Binary-side front ends: `tui` and `demo` (they need the terminal UI), and how every
//! verb's async work ends (`exit`).

pub mod demo;
pub mod exit;
pub mod report;
pub mod tui;
