#!/usr/bin/env bash
# Runs every fuzz target for RUNS executions (default 1,000,000), one process at a time (the
# build machine has 2 shared cores), growing fuzz/corpus/<target>/, then minimises each corpus
# with `cargo fuzz cmin`. libFuzzer's output goes to fuzz/logs/<target>.log; its last
# `#N DONE cov: .. ft: .. corp: ..` line and `stat::` lines are the figures in
# docs/reliability.md. Usage, from the repository root: fuzz/run.sh [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-1000000}
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(prom http_response pyspy_json probe_toml thresholds_toml recording daemon_request metrics_request snapshot bundle)
max_len() {
    case $1 in
        recording) echo 4096 ;;
        prom | pyspy_json) echo 16384 ;;
        probe_toml | http_response) echo 8192 ;;
        thresholds_toml) echo 2048 ;;
        daemon_request) echo 512 ;;
        metrics_request) echo 16384 ;;
        snapshot) echo 32768 ;;
        bundle) echo 32768 ;;
    esac
}
mkdir -p fuzz/logs
for t in "${targets[@]}"; do
    # -s none: the code under test is safe Rust; no sanitizer keeps exec/s up on 2 cores.
    # Overflow checks and debug assertions stay on (cargo fuzz's default).
    cargo +nightly fuzz run -s none "$t" "fuzz/corpus/$t" -- \
        -runs="$RUNS" -max_len="$(max_len "$t")" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 >"fuzz/logs/$t.log" 2>&1 || { echo "$t: FAILED, see fuzz/logs/$t.log"; continue; }
    # In place: keeps the smallest inputs that together reach every feature seen.
    cargo +nightly fuzz cmin -s none "$t" "fuzz/corpus/$t" -- -max_len="$(max_len "$t")" \
        >"fuzz/logs/$t.cmin.log" 2>&1
    # Then edge coverage only: drops inputs that add nothing but hit-count buckets, so the
    # committed corpus stays at a few hundred small files.
    bin="fuzz/target/x86_64-unknown-linux-gnu/release/$t"
    rm -rf "fuzz/edge/$t" && mkdir -p "fuzz/edge/$t"
    "$bin" -merge=1 -use_counters=0 -max_len="$(max_len "$t")" "fuzz/edge/$t" "fuzz/corpus/$t" \
        >"fuzz/logs/$t.edge.log" 2>&1
    rm -rf "fuzz/corpus/$t" && mv "fuzz/edge/$t" "fuzz/corpus/$t"
    echo "$t: $(grep -E '^#[0-9]+[[:space:]]+DONE' "fuzz/logs/$t.log" | tail -1)"
done
