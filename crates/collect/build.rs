//! Build script: embeds every `probes/*.toml` of the repository so the library carries its
//! built-in profiles.

// A build script may fail loudly: a broken build environment is not a target to protect.
#![allow(clippy::expect_used)]

use std::path::{Path, PathBuf};

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    embed_probes(&out);
}

fn embed_probes(out: &Path) {
    println!("cargo:rerun-if-changed=../../probes");
    let mut files: Vec<PathBuf> = std::fs::read_dir("../../probes")
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|e| e == "toml"));
    files.sort();
    let mut code = String::from("/// Built-in probe profiles: (file name, contents).\npub const BUILTIN_PROBES: &[(&str, &str)] = &[\n");
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
        let abs = std::fs::canonicalize(f).expect("canonicalize probe file");
        let name = f.file_name().and_then(|n| n.to_str()).unwrap_or("?");
        code.push_str(&format!(
            "    ({name:?}, include_str!({:?})),\n",
            abs.display().to_string()
        ));
    }
    code.push_str("];\n");
    std::fs::write(out.join("builtin_probes.rs"), code).expect("write builtin_probes.rs");
}
