//! Tests that start an SGLang-shaped stack (the lab of `tests/lab/lab.py`, a `wedgewatch
//! demo`, live processes discovery takes for SGLang), one module a file. One binary: one
//! link. `cargo test --test labs e2e_lab::` runs one module (docs/lab.md, "Tests").
//!
//! A test here watches its own lab only (`wedgewatch --within` the lab's keeper, `common::ww`)
//! and holds the machine's stacks shared (`Lab::up`, `lab::shared()`): such tests run side
//! by side. The tests whose wedgewatch discovers every stack on the machine are in `alone`,
//! each taking `lab::exclusive()` first; `tests/lanes.sh` runs them after the others.

mod adaptive_lab;
mod alone;
mod blame_lab;
mod common;
mod controls_lab;
mod demo_smoke;
mod e2e_lab;
mod gpu;
mod incidents_lab;
mod lab_selftest;
mod lab_tp;
mod oneshot_lab;
mod router_key;
mod stacks;
