#!/usr/bin/env bash
# The whole test suite (what `cargo test --no-fail-fast` runs), in two lanes side by side.
# Called by tests/run-all.sh once everything is built and set up.
#
# The tests wait on their labs far more than they compute (a whole run is about a third of a
# core on average), so two lanes nearly halve the wall time. The lanes are the test binaries'
# groups (docs/architecture.md, "Tests"):
# - the lab lane: the `labs` binary (tests/labs/main.rs), every test that starts an
#   SGLang-shaped stack. Discovery sees every stack on the machine, so a lab test's daemon
#   must not watch another test's wedge: each test takes `lab::exclusive()` (one test file's
#   tests at a time), and nothing else that starts a stack runs beside it. tests/os/
#   test_groups.rs fails when a test outside tests/labs/ starts a lab. The real-SGLang tier
#   (tests/sglang_real.rs) runs in this lane after the labs: its servers are seen by every
#   discovery, and last gives its set-up (beside the build and the lanes) the most time.
# - the other lane: every other test binary (pure, os, the ones alone in a binary of their
#   own), then the real vLLM tier (its tests find their own server by its pid and retry a
#   window cut short by a busy machine).
#
# The benches run too, in their quick mode (`cargo test --bench NAME`: no `--bench` argument,
# benches/common/mode.rs), so a bench that no longer runs fails here; the full runs are
# `cargo bench --bench NAME` (docs/performance.md). LAB_BENCHES start a lab, a daemon that
# discovers every stack, or processes discovery takes for SGLang: the lab lane; the others
# (stacks' fake schedulers match no discovery profile) the other lane.
set -uo pipefail
cd "$(dirname "$0")/.."

# The lab binary, and the real tiers (each alone in its binary).
LAB_TESTS=labs
REAL_TIERS=(vllm_real sglang_real)
LAB_BENCHES=(discovery daemon biglab verdict)

if [ ! -f "tests/$LAB_TESTS/main.rs" ]; then
    echo "lanes: tests/$LAB_TESTS/main.rs does not exist" >&2
    exit 1
fi
lab_args=(--workspace --test "$LAB_TESTS")
for name in "${LAB_BENCHES[@]}"; do
    if [ ! -f "benches/$name.rs" ]; then
        echo "lanes: benches/$name.rs is in LAB_BENCHES but does not exist" >&2
        exit 1
    fi
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

other_log="$(mktemp -t ww-lane.XXXXXX)"
other_secs="$(mktemp -t ww-lane-secs.XXXXXX)"
trap 'rm -f "$other_log" "$other_secs"' EXIT
started=$SECONDS
(
    cargo test --no-fail-fast "${other_args[@]}"
    rc=$?
    cargo test --workspace --doc || rc=1
    echo "$((SECONDS - started))" >"$other_secs"
    exit "$rc"
) >"$other_log" 2>&1 &
other_pid=$!
# Three lab tests at a time (of one file, lab::exclusive): they wait on their labs far more
# than they compute (the labs binary: 433 s at three, about 490 s at two).
RUST_TEST_THREADS=3 cargo test --no-fail-fast "${lab_args[@]}"
lab_rc=$?
labs_secs=$((SECONDS - started))
cargo test --workspace --no-fail-fast --test sglang_real || lab_rc=1
lab_secs=$((SECONDS - started))
wait "$other_pid"
other_rc=$?
echo "=== the other lane (lab-free tests and the real-vLLM tier) ==="
cat "$other_log"
echo "lanes: lab lane exit $lab_rc after ${lab_secs} s (labs and lab benches ${labs_secs} s, real SGLang $((lab_secs - labs_secs)) s); other lane exit $other_rc after $(cat "$other_secs") s; both done after $((SECONDS - started)) s"
[ "$lab_rc" = 0 ] && [ "$other_rc" = 0 ]
