#!/usr/bin/env bash
# Big lab + 200 agents + release daemon; measures daemon CPU (own + children) over MEASURE s
# after WARM s, and its own share. PERF=1: perf record PERF_SECS (20) s at PERF_FREQ (199) Hz into
# /tmp/prof.data. Leaves nothing running.
# env: REPO (default: this checkout), TAG, PORT, WARM (60), MEASURE (120), KEEP_LAB=1
set -uo pipefail
REPO=${REPO:-$(cd "$(dirname "$0")/../.." && pwd)}; TAG=${TAG:-main}; PORT=${PORT:-31000}
WARM=${WARM:-60}; MEASURE=${MEASURE:-120}
export REPO TAG PORT
B="$(dirname "$0")/biglab.sh"
cd "$REPO"
[ "${REUSE:-0}" = 1 ] || { $B down >/dev/null 2>&1; $B up >/dev/null; }
NVML_LIB=$(ls "$REPO"/target/release/build/wedgewatch-*/out/fake_nvml/libnvidia-ml.so.1 | head -1)
AGENTS=${AGENTS:-200} setsid $B load $((WARM+MEASURE+60)) > /tmp/load-$TAG.log 2>&1 &
LOADPID=$!
ST=$(mktemp -d /tmp/ww-prof-XXXX)
WEDGEWATCH_NVML_LIB=$NVML_LIB FAKE_NVML_DIR=$($B nvml) WEDGEWATCH_PY_SPY=$REPO/tests/lab/.venv/bin/py-spy \
  RUST_LOG=${RUST_LOG:-info} "$REPO/target/release/wedgewatch" daemon --state-dir "$ST" > "$ST/daemon.log" 2>&1 &
D=$!
sleep "$WARM"
tick() { awk '{print $14+$15+$16+$17}' /proc/$D/stat; }
own() { awk '{print $14+$15}' /proc/$D/stat; }
c0=$(tick); o0=$(own); r0=$(du -sb "$ST/recording" | cut -f1); t0=$(date +%s.%N)
if [ "${PERF:-0}" = 1 ]; then perf record -F "${PERF_FREQ:-199}" --call-graph dwarf -p $D -o /tmp/prof.data -- sleep "${PERF_SECS:-20}" >/dev/null 2>&1; fi
sleep "$MEASURE"
c1=$(tick); o1=$(own); r1=$(du -sb "$ST/recording" | cut -f1); t1=$(date +%s.%N)
rss=$(awk '/VmRSS/{print $2}' /proc/$D/status); hwm=$(awk '/VmHWM/{print $2}' /proc/$D/status)
python3 - <<PY
hz=100; dt=$t1-$t0
print(f"cpu {($c1-$c0)/hz/dt*100:.2f}% of a core (own+reaped children) over {dt:.0f}s; own {($o1-$o0)/hz/dt*100:.2f}%, children {(($c1-$c0)-($o1-$o0))/hz/dt*100:.2f}%")
print(f"recording {($r1-$r0)/dt*3600/2**20:.1f} MiB/h; rss {$rss/1024:.1f} MiB hwm {$hwm/1024:.1f} MiB")
PY
kill $D; wait $D 2>/dev/null; kill -- -$LOADPID 2>/dev/null; wait $LOADPID 2>/dev/null
tail -3 /tmp/load-$TAG.log
grep -c "" "$ST/daemon.log" >/dev/null
echo "state dir $ST"
[ "${KEEP_LAB:-0}" = 1 ] || $B down >/dev/null
