#!/usr/bin/env bash
# Usage: rec_probe.sh BIN [BIN...]   (env WARM=60 MEAS=300 LOAD_BLOCK=)
# Recording growth and CPU of `wedgewatch daemon`s, one per binary given, run side by side
# on one big lab (TAG=rec, PORT=33000, brought up and down here) under 200 steady agents:
# after WARM s of warm-up each daemon's recording/ bytes and CPU are read, then again after
# MEAS s. Prints MiB/h, % of one core (own utime+stime; and with reaped children, py-spy) and
# RSS at the end. LOAD_BLOCK=SECS runs the load as the biglab bench does: a new harness
# process every SECS seconds (each a new client process for discovery to meet).
set -euo pipefail
WARM=${WARM:-60}
MEAS=${MEAS:-300}
REPO=${REPO:-$(cd "$(dirname "$0")/../.." && pwd)}
export REPO TAG=rec PORT=33000
LAB="$(dirname "$0")/biglab.sh"
HZ=$(getconf CLK_TCK)
NVML_LIB=$(ls "$REPO"/target/release/build/wedgewatch-*/out/fake_nvml/libnvidia-ml.so.1 | head -1)
PIDS=(); STATES=(); LPID=""
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  [ -n "$LPID" ] && kill -- "-$LPID" 2>/dev/null || true
  "$LAB" down >/dev/null 2>&1 || true
}
trap cleanup EXIT
# The base port lies in the ephemeral range: a client socket of a busy lab may hold it.
up=""
for try in 1 2 3 4 5; do
  if "$LAB" up >/dev/null 2>/tmp/rec-probe-up.err; then up=1; break; fi
  "$LAB" down >/dev/null 2>&1 || true; sleep 5
done
[ -n "$up" ] || { echo "lab would not come up: $(tail -1 /tmp/rec-probe-up.err)"; exit 1; }
NVML_DIR=$("$LAB" nvml)
if [ -n "${LOAD_BLOCK:-}" ]; then
  END=$(( $(date +%s) + WARM + MEAS + 30 ))
  setsid bash -c "while [ \$(date +%s) -lt $END ]; do '$LAB' load $LOAD_BLOCK; done" >/tmp/rec-probe-load.out 2>&1 &
else
  setsid "$LAB" load $((WARM + MEAS + 30)) >/tmp/rec-probe-load.out 2>&1 &
fi
LPID=$!
sleep 2
for BIN in "$@"; do
  STATE=$(mktemp -d /tmp/rec-probe-state.XXXXXX)
  WEDGEWATCH_NVML_LIB=$NVML_LIB FAKE_NVML_DIR=$NVML_DIR \
    WEDGEWATCH_PY_SPY=$REPO/tests/lab/.venv/bin/py-spy \
    "$BIN" daemon --state-dir "$STATE" </dev/null >/dev/null 2>"$STATE.log" &
  PIDS+=($!); STATES+=("$STATE")
done
# own = utime+stime, all = + cutime+cstime (fields 14-17 of /proc/PID/stat, after the comm)
cpu() { awk '{sub(/.*\) /,""); print $12+$13, $12+$13+$14+$15}' "/proc/$1/stat"; }
bytes() { du -sb "$1/recording" | cut -f1; }
sleep "$WARM"
declare -A O0 A0 B0
for i in "${!PIDS[@]}"; do read -r O0[$i] A0[$i] < <(cpu "${PIDS[$i]}"); B0[$i]=$(bytes "${STATES[$i]}"); done
t0=$(date +%s.%N)
sleep "$MEAS"
t1=$(date +%s.%N)
for i in "${!PIDS[@]}"; do
  read -r o1 a1 < <(cpu "${PIDS[$i]}"); b1=$(bytes "${STATES[$i]}")
  rss=$(awk '/VmRSS/{print $2}' "/proc/${PIDS[$i]}/status"); hwm=$(awk '/VmHWM/{print $2}' "/proc/${PIDS[$i]}/status")
  echo "== $(basename "${@:$((i+1)):1}") (state ${STATES[$i]}): RSS $((rss/1024)) MiB, peak $((hwm/1024)) MiB"
  python3 - "${O0[$i]}" "${A0[$i]}" "${B0[$i]}" "$t0" "$o1" "$a1" "$b1" "$t1" "$HZ" <<'PY'
import sys
o0, a0, b0, t0, o1, a1, b1, t1, hz = map(float, sys.argv[1:])
dt = t1 - t0
print(f"window {dt:.0f} s: recording {b0/2**20:.2f} -> {b1/2**20:.2f} MiB, "
      f"growth {(b1-b0)/2**20/dt*3600:.1f} MiB/h")
print(f"daemon CPU: own {(o1-o0)/hz/dt*100:.2f} % of a core, with children "
      f"{(a1-a0)/hz/dt*100:.2f} %")
PY
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
wait "$LPID" || true; LPID=""
python3 -c "import json,sys; d=json.loads(open('/tmp/rec-probe-load.out').read().strip().splitlines()[-1]); print('load:', {k: d[k] for k in ['completed_requests', 'requests_per_s', 'errored_requests', 'hung_requests']})"
