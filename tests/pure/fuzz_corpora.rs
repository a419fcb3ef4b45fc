//! Replays every committed fuzz corpus file (`fuzz/corpus/<target>/`) and crash reproducer
//! (`fuzz/regressions/<target>/`) through the same entry points the fuzz targets call (`wedgewatch::fuzz_entry`),
//! on stable and without libFuzzer: each input must return without a panic, in bounded time.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use wedgewatch::fuzz_entry::TARGETS;

/// Per input, unoptimised: libFuzzer runs the same inputs optimised with `-timeout=10`.
const MAX_PER_INPUT: Duration = Duration::from_secs(10);

/// The corpus, then the crash reproducers (`fuzz/regressions/<target>/`, kept apart so
/// that minimising the corpus never drops one).
fn corpus_files(target: &str) -> Vec<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut files = Vec::new();
    for (dir, required) in [("corpus", true), ("regressions", false)] {
        let dir = root.join(dir).join(target);
        let rd = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(_) if !required => continue,
            Err(e) => panic!("{}: {e}", dir.display()),
        };
        let mut found: Vec<PathBuf> = rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file())
            .collect();
        found.sort();
        files.extend(found);
    }
    files
}

fn replay(target: &str) {
    let run = TARGETS
        .iter()
        .find(|(name, _)| *name == target)
        .map(|(_, f)| *f)
        .unwrap_or_else(|| panic!("no entry point {target}"));
    let files = corpus_files(target);
    assert!(!files.is_empty(), "{target}: empty corpus");
    for f in files {
        let data = std::fs::read(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let start = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| run(&data)));
        let took = start.elapsed();
        assert!(outcome.is_ok(), "{target}: {} panicked", f.display());
        assert!(
            took < MAX_PER_INPUT,
            "{target}: {} took {took:?}",
            f.display()
        );
    }
}

#[test]
fn every_target_has_a_corpus_and_a_test() {
    let names: Vec<&str> = TARGETS.iter().map(|(n, _)| *n).collect();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    for n in &names {
        let src = root.join("fuzz_targets").join(format!("{n}.rs"));
        assert!(src.is_file(), "{}: missing fuzz target", src.display());
    }
    let tested = [
        "prom",
        "http_response",
        "pyspy_json",
        "probe_toml",
        "thresholds_toml",
        "recording",
        "daemon_request",
        "metrics_request",
        "snapshot",
        "bundle",
    ];
    assert_eq!(names, tested, "a new target needs its replay test below");
}

#[test]
fn prom_corpus() {
    replay("prom");
}

#[test]
fn http_response_corpus() {
    replay("http_response");
}

#[test]
fn pyspy_json_corpus() {
    replay("pyspy_json");
}

#[test]
fn probe_toml_corpus() {
    replay("probe_toml");
}

#[test]
fn thresholds_toml_corpus() {
    replay("thresholds_toml");
}

#[test]
fn recording_corpus() {
    replay("recording");
}

#[test]
fn daemon_request_corpus() {
    replay("daemon_request");
}

#[test]
fn metrics_request_corpus() {
    replay("metrics_request");
}

#[test]
fn snapshot_corpus() {
    replay("snapshot");
}

#[test]
fn bundle_corpus() {
    replay("bundle");
}
