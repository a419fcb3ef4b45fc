#!/usr/bin/env bash
# Usage: served_probe.sh BIN STATE_DIR [N=50] [EXTRA snapshot args...]
# Runs N `BIN --state-dir STATE_DIR snapshot --json > /dev/null` calls one after another against
# a running daemon and prints each call's wall time distribution (p50, p90, p99, max) in ms.
# A call not served by the daemon (stderr lacks "using the daemon") is counted and reported.
set -euo pipefail
BIN=$1; STATE=$2; N=${3:-50}; shift 3 || shift $#
python3 - "$BIN" "$STATE" "$N" "$@" <<'PY'
import subprocess, sys, time
bin_, state, n, extra = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
walls, not_served = [], 0
for _ in range(n):
    t = time.monotonic()
    p = subprocess.run([bin_, "--state-dir", state, "snapshot", "--json", *extra],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    walls.append((time.monotonic() - t) * 1000)
    if b"using the daemon" not in p.stderr or p.returncode != 0:
        not_served += 1
walls.sort()
q = lambda f: walls[min(len(walls) - 1, int(round(f * (len(walls) - 1))))]
print(f"{n} calls ({not_served} not served): p50 {q(.5):.0f} ms, p90 {q(.9):.0f} ms, "
      f"p99 {q(.99):.0f} ms, max {walls[-1]:.0f} ms, min {walls[0]:.0f} ms")
PY
