//! What the integration tests share: the lab stack (`lab`), recorded correlator inputs
//! (`correl`), live processes with SGLang's shapes (`shapes`), fleet nodes (`fleet`), the
//! one-story fixture (`story`), a Python that says when it is ready (`ready_python`),
//! what a run wrote (`written`) and the bounds a test may assert on wall time (`timing`).
//! Test code: it may panic on a broken fixture.

use std::path::PathBuf;

pub mod correl;
pub mod fleet;
pub mod lab;
pub mod ready_python;
pub mod screen;
pub mod shapes;
pub mod story;
pub mod timing;
pub mod written;

/// The repository root (where `tests/` and `tests/lab/lab.py` live).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}
