//! The binary runs on jemalloc with the options of `alloc::JEMALLOC_CONF` (the daemon's
//! CPU and RSS on a big node depend on both; docs/performance.md "jemalloc"). jemalloc's own
//! statistics, printed at exit when asked through the environment, show the options in
//! force: a binary on glibc's malloc, or one whose options symbol was not linked, fails here.

use std::process::Command;

fn option(stats: &str, name: &str) -> Option<String> {
    stats
        .lines()
        .find_map(|l| l.trim().strip_prefix(&format!("opt.{name}: ")))
        .map(|v| v.split_whitespace().next().unwrap_or_default().to_string())
}

#[test]
fn the_binary_runs_on_jemalloc_with_our_options() {
    let out = Command::new(env!("CARGO_BIN_EXE_wedgewatch"))
        .arg("--version")
        .env("_RJEM_MALLOC_CONF", "stats_print:true")
        .output()
        .expect("runs");
    assert!(out.status.success());
    let stats = String::from_utf8_lossy(&out.stderr);
    assert!(stats.contains("Begin jemalloc statistics"), "{stats}");
    let conf = std::str::from_utf8(wedgewatch::alloc::JEMALLOC_CONF)
        .expect("ASCII")
        .trim_end_matches('\0');
    for opt in conf.split(',') {
        let (k, v) = opt.split_once(':').expect("key:value");
        assert_eq!(option(&stats, k).as_deref(), Some(v), "opt.{k} in\n{stats}");
    }
}
