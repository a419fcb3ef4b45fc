#!/usr/bin/env bash
# The project's one test command (README "Set-up", and what .ci/run calls).
# Installs what the tests need (the lab's venv: the real sglang-router, py-spy, aiohttp,
# setproctitle from PyPI), then runs formatting, lints and the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 tests/lab/lab.py setup
export WEDGEWATCH_PY_SPY="$PWD/tests/lab/.venv/bin/py-spy"

cargo fmt --check
cargo clippy --all-targets -- -D warnings
cargo test --no-fail-fast
