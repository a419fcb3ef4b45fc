#!/usr/bin/env python3
"""The test build's lint gate (tests/run-all.sh): reads `cargo test --no-run --message-format=json`
of a build linted by clippy-driver (RUSTC_WORKSPACE_WRAPPER) on stdin, prints every diagnostic
as rustc renders it, and exits 1 when any was a warning or an error: the same gate as
`cargo clippy --all-targets -- -D warnings`, without a second build of every dependency.

Cargo replays a fresh unit's cached diagnostics, so a warning is counted on every run until
it is fixed, not only on the run that compiled it."""
import json
import sys


def main():
    found = 0
    for line in sys.stdin:
        try:
            msg = json.loads(line)
        except ValueError:
            sys.stderr.write(line)
            continue
        if msg.get("reason") != "compiler-message":
            continue
        diag = msg.get("message") or {}
        sys.stderr.write(diag.get("rendered") or "")
        # "N warnings emitted" and "aborting due to" summaries carry no span.
        if diag.get("level") in ("warning", "error") and diag.get("spans"):
            found += 1
    if found:
        print(f"lint_gate: {found} warnings or errors (clippy --all-targets -D warnings)", file=sys.stderr)
        return 1
    print("lint_gate: no warnings (clippy lints on every target)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
