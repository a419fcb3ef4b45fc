//! The test binaries' groups (docs/architecture.md, "Tests"), which `tests/lanes.sh` runs by
//! binary: what starts an SGLang-shaped stack is in the lab binary (`tests/labs/`) and holds
//! the machine's stacks, shared (its wedgewatch watches its own lab) or, in `labs/alone`
//! only, exclusively (it sees every stack, so nothing else may run beside it); a bench that
//! starts a lab holds the machine alone (which puts it in the lab lane); and every file of a
//! grouped binary is one of its modules (a file left out never runs).

use std::path::{Path, PathBuf};

/// What starts a lab, or holds the machine's stacks. Built with `concat!` so this file does
/// not name them itself.
const STARTS_A_LAB: [&str; 4] = [
    concat!("Lab::", "up("),
    concat!("lab::", "exclusive("),
    concat!("tests/lab/", "lab.py"),
    concat!("lab::", "shared("),
];

/// The lab tests that see every stack on the machine (`lab::exclusive`).
const ALONE: &str = "tests/labs/alone/";

/// The grouped binaries' folders and the file that declares their modules.
const GROUPS: [(&str, &str); 4] = [
    ("pure", "main.rs"),
    ("os", "main.rs"),
    ("labs", "main.rs"),
    ("labs/alone", "mod.rs"),
];

/// The real tiers start servers of their own, seen by every discovery; `tests/lanes.sh`
/// places them (sglang_real after the labs).
const REAL_TIERS: [&str; 2] = ["tests/sglang_real.rs", "tests/vllm_real.rs"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `.rs` files under `dir`, recursively, relative to the repository root.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path.strip_prefix(root()).unwrap_or(&path).to_path_buf());
        }
    }
}

fn read(rel: &Path) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{}: {e}", rel.display()))
}

#[test]
fn only_the_lab_binary_starts_a_lab() {
    let mut files = Vec::new();
    rust_files(&root().join("tests"), &mut files);
    assert!(files.len() > 50, "too few test files found: {files:?}");
    let mut outside = Vec::new();
    for rel in &files {
        let name = rel.to_string_lossy();
        if name.starts_with("tests/labs/") || REAL_TIERS.contains(&name.as_ref()) {
            continue;
        }
        let text = read(rel);
        for what in STARTS_A_LAB {
            if text.contains(what) {
                outside.push(format!("{name} ({what})"));
            }
        }
    }
    assert!(
        outside.is_empty(),
        "these start a lab outside the lab binary; move them to a module of tests/labs/: \
         {outside:#?}"
    );
}

/// Every test of the lab binary holds the machine's stacks: in `alone`, exclusively first;
/// elsewhere shared (`lab::shared`, or a lab started in its body, which takes it), never
/// exclusively. Read as the text from one `#[test]` to the next.
#[test]
fn every_lab_test_holds_the_machines_stacks() {
    let mut files = Vec::new();
    rust_files(&root().join("tests/labs"), &mut files);
    let mut bare = Vec::new();
    for rel in files.iter().filter(|f| !f.ends_with("main.rs")) {
        let text = read(rel);
        // The text before the first test is no test.
        let mut pieces: Vec<&str> = text.split("#[test]").skip(1).collect();
        pieces.extend(text.split("#[tokio::test").skip(1));
        for piece in pieces {
            let name = piece
                .split("fn ")
                .nth(1)
                .and_then(|s| s.split('(').next())
                .unwrap_or("?");
            let alone = rel.to_string_lossy().starts_with(ALONE);
            let exclusive = piece.contains(STARTS_A_LAB[1]);
            let shared = piece.contains(STARTS_A_LAB[0]) || piece.contains(STARTS_A_LAB[3]);
            if alone != exclusive || !(exclusive || shared) {
                bare.push(format!("{}: {name}", rel.display()));
            }
        }
    }
    assert!(
        bare.is_empty(),
        "these lab tests do not hold the stacks as their place says (exclusively in \
         {ALONE}, shared elsewhere): {bare:#?}"
    );
}

#[test]
fn every_file_of_a_grouped_binary_is_one_of_its_modules() {
    for (group, declares) in GROUPS {
        let dir = root().join("tests").join(group);
        let main = read(&Path::new("tests").join(group).join(declares));
        let mut missing = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{group}: {e}")) {
            let path = entry.expect("dir entry").path();
            let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
                continue;
            };
            if path.extension().is_some_and(|e| e == "rs")
                && stem != "main"
                && stem != "mod"
                && !main.contains(&format!("mod {stem};"))
            {
                missing.push(stem.to_string());
            }
        }
        assert!(
            missing.is_empty(),
            "tests/{group}/{declares} does not declare {missing:?}: they never run"
        );
    }
}

#[test]
fn a_bench_that_starts_a_lab_holds_the_machine_alone() {
    let mut files = Vec::new();
    rust_files(&root().join("benches"), &mut files);
    let mut bare = Vec::new();
    for rel in &files {
        if !STARTS_A_LAB.iter().any(|w| read(rel).contains(w)) {
            continue;
        }
        // A bench's parts (benches/NAME_parts/) belong to bench NAME, whose own file holds it
        // (and puts it in the lab lane: tests/lanes.sh reads the same words).
        let top = rel.iter().nth(1).and_then(|s| s.to_str()).unwrap_or("");
        let name = top.trim_end_matches(".rs").trim_end_matches("_parts");
        let main = Path::new("benches").join(format!("{name}.rs"));
        if !root().join(&main).exists() || !read(&main).contains(STARTS_A_LAB[1]) {
            bare.push(rel.display().to_string());
        }
    }
    assert!(
        bare.is_empty(),
        "these benches start a lab but their bench does not hold the machine alone \
         (`lab::exclusive` in its main), so tests/lanes.sh would not run it in the lab lane: \
         {bare:?}"
    );
}
