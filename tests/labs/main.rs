//! Tests that start an SGLang-shaped stack (the lab of `tests/lab/lab.py`, a `wedgewatch
//! demo`, live processes discovery takes for SGLang), one module a file. Discovery sees every
//! stack on the machine, so each test first takes `lab::exclusive()`: the tests of one file
//! run side by side, those of different files one file at a time. One binary: one link.
//! `cargo test --test labs e2e_lab::` runs one module (docs/lab.md, "Tests").

mod adaptive_lab;
mod blame_lab;
mod common;
mod controls_lab;
mod demo_smoke;
mod discovery;
mod e2e_lab;
mod exporter_lab;
mod fleet_lab;
mod gpu;
mod incidents_lab;
mod lab_selftest;
mod lab_tp;
mod netns_lab;
mod oneshot_lab;
mod router_key;
mod router_key_lookalikes;
mod stacks;
mod tui_pty;
mod two_node_lab;
