#!/usr/bin/env bash
# Usage: served_sbs.sh BIN_A BIN_B   (env N=40 WARM=60 LOADSECS=200; TAG, PORT as biglab.sh)
# Two daemons (BIN_A, BIN_B) side by side on one big lab under 200 agents; after WARM s, N
# `snapshot --json` calls to each, alternating (A B, B A, ...): the CLI's wall time p50/p90/p99
# per binary, then each daemon's own debug timings (thread CPU of building the parts and of
# assembling). Leaves nothing running.
set -uo pipefail
REPO=${REPO:-$(cd "$(dirname "$0")/../.." && pwd)}; TAG=${TAG:-main}; PORT=${PORT:-31000}; export REPO TAG PORT
B=$REPO/benches/by_hand/biglab.sh
A_BIN=$1; B_BIN=$2; N=${N:-40}
cd $REPO
$B down >/dev/null 2>&1; $B up >/dev/null
NVML_LIB=$(ls $REPO/target/release/build/wedgewatch-*/out/fake_nvml/libnvidia-ml.so.1 | head -1)
# In its own process group: a plain kill leaves the harness's agents running.
setsid bash -c "AGENTS=200 $B load ${LOADSECS:-200} > /tmp/load-sbs.log 2>&1" &
LOADPID=$!
PIDS=(); STS=()
for BIN in $A_BIN $B_BIN; do
  ST=$(mktemp -d /tmp/ww-sbs-XXXX)
  WEDGEWATCH_NVML_LIB=$NVML_LIB FAKE_NVML_DIR=$($B nvml) WEDGEWATCH_PY_SPY=$REPO/tests/lab/.venv/bin/py-spy \
    RUST_LOG=wedgewatch=debug $BIN daemon --state-dir "$ST" > "$ST/daemon.log" 2>&1 &
  PIDS+=($!); STS+=($ST)
done
sleep ${WARM:-60}
python3 - "$A_BIN" "${STS[0]}" "$B_BIN" "${STS[1]}" "$N" <<'PY'
import subprocess, sys, time
a, sa, b, sb, n = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
res = {a: [], b: []}
for i in range(n):
    for bin_, st in ((a, sa), (b, sb)) if i % 2 == 0 else ((b, sb), (a, sa)):
        t = time.monotonic()
        p = subprocess.run([bin_, "--state-dir", st, "snapshot", "--json"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        res[bin_].append((time.monotonic() - t) * 1000)
        assert b"using the daemon" in p.stderr, p.stderr
for k, w in res.items():
    w.sort(); q = lambda f: w[min(len(w)-1, int(round(f*(len(w)-1))))]
    print(f"{k}: p50 {q(.5):.0f} p90 {q(.9):.0f} p99 {q(.99):.0f} max {w[-1]:.0f} ms")
PY
for i in 0 1; do
  grep -E "parts built" ${STS[$i]}/daemon.log | sed -E 's/.*parts_cpu_ms=([0-9.]+).*requests=([0-9]+)/\1 \2/' | sort -n | awk -v w=$i '{a[NR]=$1; r=$2} END{print w, "parts cpu p50",a[int(NR/2)],"max",a[NR], NR, "requests", r}'
  grep -E "snapshot assembled" ${STS[$i]}/daemon.log | sed -E 's/.*assemble_cpu_ms=([0-9.]+).*/\1/' | sort -n | awk -v w=$i '{a[NR]=$1} END{print w, "assemble cpu p50",a[int(NR/2)],"max",a[NR]}'
done
kill ${PIDS[@]}; wait ${PIDS[@]} 2>/dev/null; kill -- -$LOADPID 2>/dev/null; wait $LOADPID 2>/dev/null
$B down >/dev/null
