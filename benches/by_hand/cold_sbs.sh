#!/usr/bin/env bash
# Usage: cold_sbs.sh BIN [BIN...]   (env N=3 WARM=30 WINDOW=3s)
# Cold one-shot snapshots side by side: one big lab (TAG=cold, PORT=35000, brought up and down
# here) under 200 steady agents; after WARM s, N rounds of `BIN -v snapshot --json
# --no-daemon --window WINDOW` for each binary in turn. Prints each call's wall time (from
# before exec to exit, as the caller sees it), the steps its -v log names, and whether the
# snapshot found the stack's engines.
set -euo pipefail
N=${N:-3}; WARM=${WARM:-30}; WINDOW=${WINDOW:-3s}
REPO=${REPO:-$(cd "$(dirname "$0")/../.." && pwd)}
export REPO TAG=cold PORT=35000
LAB="$(dirname "$0")/biglab.sh"
NVML_LIB=$(ls "$REPO"/target/release/build/wedgewatch-*/out/fake_nvml/libnvidia-ml.so.1 | head -1)
LPID=""
cleanup() {
  [ -n "$LPID" ] && kill -- "-$LPID" 2>/dev/null || true
  "$LAB" down >/dev/null 2>&1 || true
}
trap cleanup EXIT
"$LAB" down >/dev/null 2>&1 || true
"$LAB" up >/dev/null
NVML_DIR=$("$LAB" nvml)
setsid "$LAB" load $((WARM + N * $# * 10 + 60)) >/tmp/cold-sbs-load.out 2>&1 &
LPID=$!
sleep "$WARM"
for round in $(seq "$N"); do
  for BIN in "$@"; do
    out=$(mktemp /tmp/cold-sbs.XXXXXX)
    t0=$(date +%s%N)
    WEDGEWATCH_NVML_LIB=$NVML_LIB FAKE_NVML_DIR=$NVML_DIR \
      WEDGEWATCH_PY_SPY=$REPO/tests/lab/.venv/bin/py-spy \
      "$BIN" -v snapshot --json --no-daemon --window "$WINDOW" >"$out.json" 2>"$out.log" || true
    t1=$(date +%s%N)
    steps=$(grep -o 'started_and_discovered_ms=[0-9]*\|discovery_ms=[0-9]*\|sampled_ms=[0-9]*' "$out.log" | tr '\n' ' ')
    engines=$(python3 -c "import json,sys;d=json.load(open(sys.argv[1]));print(len([c for c in d.get('components',[]) if c.get('role') in ('prefill','decode')]))" "$out.json" 2>/dev/null || echo "?")
    echo "round $round $(basename "$BIN"): wall $(( (t1 - t0) / 1000000 )) ms; $steps; engines $engines; $(wc -c <"$out.json") B"
    rm -f "$out" "$out.json" "$out.log"
    sleep 2
  done
done
uptime
