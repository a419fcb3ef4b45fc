//! What the lab tests share: the fast thresholds, and the wedgewatch binary set up for a lab.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use wedgewatch_testkit::lab::{self, Lab};

/// Thresholds that judge within seconds (`tests/fixtures/thresholds-fast.toml`).
pub fn fast_thresholds() -> PathBuf {
    lab::repo_root().join("tests/fixtures/thresholds-fast.toml")
}

/// The wedgewatch binary watching `lab` alone (`--within` its keeper), with the lab's fake
/// NVML and the venv's py-spy; the verb and its options follow.
pub fn ww(lab: &Lab) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_wedgewatch"));
    c.arg("--within")
        .arg(lab.root_pid().to_string())
        .env("WEDGEWATCH_NVML_LIB", env!("FAKE_NVML_PATH"))
        .env("FAKE_NVML_DIR", lab.nvml_dir())
        .env("WEDGEWATCH_PY_SPY", lab::venv_bin("py-spy"))
        .stdin(Stdio::null());
    c
}

/// The wedgewatch binary for verbs that read what was written (`incidents`, `report`,
/// `diff`): they take no sampling options.
pub fn ww_reader() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_wedgewatch"));
    c.stdin(Stdio::null());
    c
}
