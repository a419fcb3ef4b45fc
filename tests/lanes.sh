#!/usr/bin/env bash
# The whole test suite (what `cargo test --no-fail-fast` runs), in two lanes side by side.
# Called by tests/run-all.sh once everything is built and set up.
#
# The tests wait on their labs far more than they compute (a whole run is about a third of a
# core on average), so lanes side by side cut the wall time. The lanes are the test binaries'
# groups (docs/architecture.md, "Tests"):
# - the lab lane: the `labs` binary (tests/labs/main.rs), every test that starts an
#   SGLang-shaped stack: first the tests of `alone::`, which see every stack on the machine,
#   each file's alone (`lab::exclusive()`, a lock file other binaries honour too); then the
#   others, which watch their own lab only (`--within` the lab's keeper) and run side by
#   side, four at a time; then the lab benches; then the real-SGLang tier
#   (tests/sglang_real.rs; it watches its own stack, but its engines' CPU would upset the
#   labs' timing). tests/os/test_groups.rs fails when a test outside tests/labs/ starts a lab.
# - the other lane: every other test binary (pure, os, the ones alone in a binary of their
#   own), then the real vLLM tier (its tests find their own server by its pid and retry a
#   window cut short by a busy machine).
#
# The benches run too, in their quick mode (`cargo test --bench NAME`: no `--bench` argument,
# benches/common/mode.rs), so a bench that no longer runs fails here; the full runs are
# `cargo bench --bench NAME` (docs/performance.md). LAB_BENCHES start a lab, a daemon that
# discovers every stack, or processes discovery takes for SGLang, and hold the machine alone:
# the lab lane; the others (stacks' fake schedulers match no discovery profile) the other lane.
set -uo pipefail
cd "$(dirname "$0")/.."

# The lab binary, and the real tiers (each alone in its binary).
LAB_TESTS=labs
REAL_TIERS=(vllm_real sglang_real)
# The benches that hold the machine alone (`lab::exclusive()` in the bench's own file: its
# daemon discovers every stack); tests/os/test_groups.rs checks that each that starts a lab does.
LAB_BENCHES=()
for file in benches/*.rs; do
    if grep -q 'lab::exclusive()' "$file"; then
        LAB_BENCHES+=("$(basename "$file" .rs)")
    fi
done

if [ ! -f "tests/$LAB_TESTS/main.rs" ]; then
    echo "lanes: tests/$LAB_TESTS/main.rs does not exist" >&2
    exit 1
fi
# Without a bench, a bare `cargo test --workspace` would run every test again.
if [ "${#LAB_BENCHES[@]}" = 0 ]; then
    echo "lanes: no bench in benches/ holds the machine alone; the lab benches are gone" >&2
    exit 1
fi
lab_args=(--workspace)
for name in "${LAB_BENCHES[@]}"; do
    lab_args+=(--bench "$name")
done
# Every other test binary; the real vLLM tier last, when the quick ones are done.
other_args=(--workspace --lib --bins --examples)
for file in tests/*.rs tests/*/main.rs; do
    name="$(basename "$file" .rs)"
    [ "$name" = main ] && name="$(basename "$(dirname "$file")")"
    case " $LAB_TESTS ${REAL_TIERS[*]} " in
    *" $name "*) ;;
    *) other_args+=(--test "$name") ;;
    esac
done
other_args+=(--test vllm_real)
# The lab-free benches (cargo runs bench targets after the test binaries).
for file in benches/*.rs; do
    name="$(basename "$file" .rs)"
    case " ${LAB_BENCHES[*]} " in
    *" $name "*) ;;
    *) other_args+=(--bench "$name") ;;
    esac
done

lane_dir="$(mktemp -d -t ww-lanes.XXXXXX)"
trap 'rm -rf "$lane_dir"' EXIT
started=$SECONDS
# Runs lane $1 (the rest: its steps, one argument each, each timed) in the background: its
# output in $lane_dir/$1.log, its exit status and time in $lane_dir/$1.rc and .secs.
lane() {
    local name=$1
    shift
    (
        rc=0
        for step in "$@"; do
            local at=$SECONDS
            eval "$step" || rc=1
            echo "lanes: $((SECONDS - at)) s: $step"
        done
        echo "$((SECONDS - started))" >"$lane_dir/$name.secs"
        echo "$rc" >"$lane_dir/$name.rc"
    ) >"$lane_dir/$name.log" 2>&1 &
}
lane other 'cargo test --no-fail-fast "${other_args[@]}"' 'cargo test --workspace --doc'
# The lab tests wait on their labs far more than they compute. First the ones that see every
# stack (each file's tests side by side), before the real vLLM tier's server is up in the other
# lane (it holds the stacks shared: they would wait for it); then the others, four at a time;
# then the lab benches; then the real SGLang tier (last: it gives its set-up the most time;
# beside the labs, its CPU-bound engines made the labs' timing fail on 2 cores).
lane labs 'RUST_TEST_THREADS=3 cargo test --no-fail-fast --workspace --test "$LAB_TESTS" -- alone::' \
    'RUST_TEST_THREADS=4 cargo test --no-fail-fast --workspace --test "$LAB_TESTS" -- --skip alone::' \
    'cargo test --no-fail-fast "${lab_args[@]}"' \
    'cargo test --workspace --no-fail-fast --test sglang_real'
wait
rc=0
summary="lanes:"
for name in labs other; do
    echo "=== lane $name ==="
    cat "$lane_dir/$name.log"
    lane_rc="$(cat "$lane_dir/$name.rc" 2>/dev/null || echo 1)"
    [ "$lane_rc" = 0 ] || rc=1
    summary="$summary $name exit $lane_rc after $(cat "$lane_dir/$name.secs" 2>/dev/null || echo '?') s;"
done
echo "$summary all done after $((SECONDS - started)) s"
exit "$rc"
