#!/usr/bin/env bash
# Usage: served_anatomy.sh   (env BIN=target/release/wedgewatch N=40 WARM=60 LOADSECS=300 PERF=0; TAG, PORT as biglab.sh)
# One release daemon on the big lab under 200 agents; after WARM s, N served snapshots, each
# asked twice: by the CLI (`snapshot --json`, wall time) and straight on the daemon's socket
# (`json`, wall time: the answer without the CLI around it); then the daemon's own debug
# timings (thread CPU of the parts, of the view, detectors and parts inside them, of assembly
# and serialization). PERF=1 records `perf --call-graph dwarf` of the daemon during the calls
# into /tmp/sv.perf.data. Leaves nothing running.
set -uo pipefail
REPO=${REPO:-$(cd "$(dirname "$0")/../.." && pwd)}; TAG=${TAG:-sv}; PORT=${PORT:-32000}; export REPO TAG PORT
B=$REPO/benches/by_hand/biglab.sh
BIN=${BIN:-$REPO/target/release/wedgewatch}; N=${N:-40}
cd $REPO
$B down >/dev/null 2>&1; $B up >/dev/null
NVML_LIB=$(ls $REPO/target/release/build/wedgewatch-*/out/fake_nvml/libnvidia-ml.so.1 | head -1)
setsid bash -c "AGENTS=200 $B load ${LOADSECS:-300} > /tmp/load-sv.log 2>&1" &
LOADPGID=$!
ST=$(mktemp -d /tmp/ww-sv-XXXX)
WEDGEWATCH_NVML_LIB=$NVML_LIB FAKE_NVML_DIR=$($B nvml) WEDGEWATCH_PY_SPY=$REPO/tests/lab/.venv/bin/py-spy \
  RUST_LOG=info,wedgewatch::daemon::answer=debug,wedgewatch::pipeline=debug $BIN daemon --state-dir "$ST" > "$ST/daemon.log" 2>&1 &
DPID=$!
sleep ${WARM:-60}
echo "load $(cat /proc/loadavg)"
if [ "${PERF:-0}" = 1 ]; then perf record -F 299 --call-graph dwarf,16384 -p $DPID -o /tmp/sv.perf.data >/dev/null 2>&1 & PERFPID=$!; fi
python3 - "$BIN" "$ST" "$N" <<'PY'
import subprocess, sys, time, socket
bin_, st, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
def q(w, f): w=sorted(w); return w[min(len(w)-1, int(round(f*(len(w)-1))))]
cli, raw = [], []
for i in range(n):
    t = time.monotonic()
    p = subprocess.run([bin_, "--state-dir", st, "snapshot", "--json"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    cli.append((time.monotonic() - t) * 1000)
    assert b"using the daemon" in p.stderr, p.stderr
    time.sleep(0.3)
    t = time.monotonic()
    s = socket.socket(socket.AF_UNIX); s.connect(st + "/daemon.sock"); s.sendall(b"json\n")
    nb = 0
    while True:
        d = s.recv(1 << 20)
        if not d: break
        nb += len(d)
    s.close()
    raw.append((time.monotonic() - t) * 1000)
    time.sleep(0.3)
t = time.monotonic(); subprocess.run([bin_, "--version"], stdout=subprocess.DEVNULL); v = (time.monotonic()-t)*1000
for name, w in (("cli", cli), ("raw json", raw)):
    print(f"{name}: p50 {q(w,.5):.0f} p90 {q(w,.9):.0f} p99 {q(w,.99):.0f} max {max(w):.0f} ms; answer {nb} bytes")
print(f"--version {v:.0f} ms")
PY
echo "load $(cat /proc/loadavg)"
[ "${PERF:-0}" = 1 ] && kill -INT $PERFPID && wait $PERFPID
grep -E "parts built" $ST/daemon.log | sed -E 's/.*lock_wait_ms=([0-9.]+).*parts_ms=([0-9.]+).*parts_cpu_ms=([0-9.]+).*requests=([0-9]+).*/\1 \2 \3 \4/' | sort -k3 -n | awk '{w[NR]=$1; p[NR]=$2; c[NR]=$3; r=$4} END{print "parts: lock wait max", w[NR], "cpu p50", c[int(NR/2)], "max", c[NR], "n", NR, "requests", r}'
grep -E "parts for a snapshot" $ST/daemon.log | sed -E 's/.*view_cpu_ms=([0-9.]+) detect_cpu_ms=([0-9.]+) parts_with_cpu_ms=([0-9.]+).*in_view=([0-9]+) logical=([0-9]+).*/\1 \2 \3 \4 \5/' | sort -n | awk '{v[NR]=$1; d[NR]=$2; p[NR]=$3; x=$4; l=$5} END{print "inside the parts: view cpu p50", v[int((NR+1)/2)], "max", v[NR], "| detectors", d[int((NR+1)/2)], "| parts", p[int((NR+1)/2)], "| exchanges in the view", x, "logical", l}'
grep -E "snapshot assembled" $ST/daemon.log | sed -E 's/.*assemble_cpu_ms=([0-9.]+).*/\1/' | sort -n | awk '{a[NR]=$1} END{print "assemble cpu p50",a[int(NR/2)],"max",a[NR]}'
grep -E "snapshot serialized" $ST/daemon.log | sed -E 's/.*serialize_cpu_ms=([0-9.]+).*/\1/' | sort -n | awk '{a[NR]=$1} END{print "serialize cpu p50",a[int(NR/2)],"max",a[NR]}'
kill $DPID; wait $DPID 2>/dev/null; kill -- -$LOADPGID 2>/dev/null; sleep 1
$B down >/dev/null
rm -rf "$ST"
