#!/bin/bash
# Ad-hoc measure of adaptive stack sampling (docs/performance.md, "Adaptive stack sampling"):
# the daemon on the default PD lab under the harness's steady load (4 agents), adaptive stacks on or off;
# py-spy behind a wrapper that logs each target pid. usage: measure_stacks.sh true|false SECS OUTDIR
set -u
A=$1; SECS=$2; OUT=$3
rm -rf "$OUT"; mkdir -p "$OUT"
REPO=$(cd "$(dirname "$0")/../.." && pwd)
WW=${WW:-$REPO/target/debug/wedgewatch}
LAB=$REPO/tests/lab/lab.py
RUN=$OUT/lab
NVML=$(find $REPO/target/debug/build -name libnvidia-ml.so.1 | head -1)
python3 $LAB up --run-dir $RUN --mode pd > $OUT/up.json || exit 1
python3 $LAB load --run-dir $RUN --agents 4 --rounds 100000 --timeout 20 > $OUT/load.json 2>&1 &
LOADPID=$!
printf '#!/bin/sh\nprev=""; for a in "$@"; do [ "$prev" = "--pid" ] && echo "$a" >> %s; prev="$a"; done\nexec %s "$@"\n' \
  "$OUT/pyspy.log" ${WEDGEWATCH_PY_SPY:-$REPO/tests/lab/.venv/bin/py-spy} > $OUT/py-spy
chmod +x $OUT/py-spy; touch $OUT/pyspy.log
printf 'stacks_adaptive = %s\n' "$A" > $OUT/th.toml
WEDGEWATCH_NVML_LIB=$NVML FAKE_NVML_DIR=$RUN/nvml WEDGEWATCH_PY_SPY=$OUT/py-spy RUST_LOG=info \
  $WW --thresholds $OUT/th.toml --state-dir $OUT/state daemon --no-record --for $((SECS+60))s 2> $OUT/daemon.log &
DPID=$!
sleep 30
cpu() { awk '{print $14+$15+$16+$17}' /proc/$DPID/stat; }
c0=$(cpu); n0=$(wc -l < $OUT/pyspy.log); t0=$(date +%s.%N)
sleep $SECS
c1=$(cpu); n1=$(wc -l < $OUT/pyspy.log); t1=$(date +%s.%N)
kill $DPID; wait $DPID 2>/dev/null
kill $LOADPID; wait $LOADPID 2>/dev/null
mine=$(python3 -c "import json;d=json.load(open('$RUN/lab.json'));import sys
ps=set()
def walk(v):
  if isinstance(v,dict):
    for k,x in v.items():
      if k in('pid','scheduler_pids','detokenizer_pid'):
        for p in (x if isinstance(x,list) else [x]):
          if isinstance(p,int): ps.add(p)
      walk(x)
  elif isinstance(v,list):
    for x in v: walk(x)
walk(d);print(' '.join(map(str,ps)))")
python3 $LAB down --run-dir $RUN > /dev/null 2>&1
tail -n +$((n0+1)) $OUT/pyspy.log | head -n $((n1-n0)) > $OUT/window.log
own=$(for p in $mine; do grep -cx "$p" $OUT/window.log; done | paste -sd+ | bc)
python3 - "$A" "$c0" "$c1" "$n0" "$n1" "$t0" "$t1" "$own" "$(sort -u $OUT/window.log | wc -l)" <<'PY'
import sys
a,c0,c1,n0,n1,t0,t1,own,distinct=sys.argv[1:]
wall=float(t1)-float(t0); cpu=(float(c1)-float(c0))/100
n=int(n1)-int(n0)
print(f"adaptive={a} wall={wall:.0f}s daemon+children CPU={100*cpu/wall:.2f}% of a core; py-spy runs {n} ({60*n/wall:.1f}/min; {60*int(own)/wall:.1f}/min on this lab's pids; {distinct} distinct pids)")
PY
