//! Build script: compiles the lab's fake `libnvidia-ml.so.1` (tests/lab/fake_nvml/fake_nvml.c)
//! with the system C compiler, for tests and the demo (no GPU on the build machines).

// A build script may fail loudly: a broken build environment is not a target to protect.
#![allow(clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    build_fake_nvml(&out);
}

fn build_fake_nvml(out: &Path) {
    let src = Path::new("tests/lab/fake_nvml/fake_nvml.c");
    println!("cargo:rerun-if-changed={}", src.display());
    let dir = out.join("fake_nvml");
    let lib = dir.join("libnvidia-ml.so.1");
    if !src.exists() {
        println!("cargo:rustc-env=FAKE_NVML_PATH=");
        return;
    }
    std::fs::create_dir_all(&dir).expect("create fake_nvml dir");
    let compiler = cc::Build::new().get_compiler();
    let status = Command::new(compiler.path())
        .args(["-shared", "-fPIC", "-O1", "-Wall", "-o"])
        .arg(&lib)
        .arg(src)
        .status();
    match status {
        Ok(s) if s.success() => {
            println!("cargo:rustc-env=FAKE_NVML_PATH={}", lib.display());
        }
        other => {
            println!("cargo:warning=fake NVML not built: {other:?}");
            println!("cargo:rustc-env=FAKE_NVML_PATH=");
        }
    }
}
