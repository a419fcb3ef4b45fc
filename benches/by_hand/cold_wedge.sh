#!/usr/bin/env bash
# Usage: cold_wedge.sh BIN [BIN...]   (env N=4, WINDOW: a --window for every call, e.g. 1s)
# Cold snapshots on the wedged big lab (TAG=cold, PORT=35000, brought up and down here): 200
# agents, one streamed request with a 6,000-word prompt (above the decode engine's split
# threshold) held open for 36 s, then N rounds of `BIN snapshot --json --no-daemon` for each
# binary in turn: wall time, wedged_request findings, the kinds found, requests seen. The
# load runs in its own process group, killed whole at the end (its harness outlives a plain kill).
set -euo pipefail
N=${N:-4}
REPO=${REPO:-$(cd "$(dirname "$0")/../.." && pwd)}
export REPO TAG=cold PORT=35000
LAB="$(dirname "$0")/biglab.sh"
NVML_LIB=$(ls "$REPO"/target/release/build/wedgewatch-*/out/fake_nvml/libnvidia-ml.so.1 | head -1)
$LAB down >/dev/null 2>&1 || true
$LAB up >/dev/null
NVML_DIR=$($LAB nvml)
ENTRY=$(python3 -c "import json;print(json.load(open('/tmp/biglab-cold/lab.json'))['entry_url'])")
setsid "$LAB" load 600 >/tmp/cold-wedge-load.out 2>&1 &
LPID=$!
WPID=""
trap 'kill -- -$LPID 2>/dev/null; [ -n "$WPID" ] && kill $WPID 2>/dev/null; "$LAB" down >/dev/null 2>&1' EXIT
sleep 10
python3 - "$ENTRY" <<'PY' &
import socket, sys, json, time
addr = sys.argv[1].replace('http://','')
host, port = addr.rsplit(':',1)
body = json.dumps({"model":"lab-model","stream":True,"max_tokens":8,"messages":[{"role":"user","content":" ".join(["tensor"]*6000)}]})
s = socket.create_connection((host,int(port)))
s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode())
time.sleep(900)
PY
WPID=$!
sleep 36
OUT=$(mktemp /tmp/cold-wedge.XXXXXX)
for round in $(seq $N); do
  for BIN in "$@"; do
    t0=$(date +%s%N)
    WEDGEWATCH_NVML_LIB=$NVML_LIB FAKE_NVML_DIR=$NVML_DIR WEDGEWATCH_PY_SPY=$REPO/tests/lab/.venv/bin/py-spy \
      $BIN snapshot --json --no-daemon ${WINDOW:+--window $WINDOW} >"$OUT.json" 2>"$OUT.err" || true
    t1=$(date +%s%N)
    python3 - "$round" "$(basename $BIN)" "$(( (t1-t0)/1000000 ))" "$OUT.json" <<'PY'
import json,sys
d=json.load(open(sys.argv[4]))
w=[f for f in d['findings'] if f['kind']=='wedged_request']
other=sorted(set(f['kind'] for f in d['findings']))
src={k: v.get('status') for k, v in d.get('sources', {}).items()}
print(f"round {sys.argv[1]} {sys.argv[2]}: wall {sys.argv[3]} ms wedged {len(w)} findings {other} reqs {len(d['requests'])} sources {src}")
PY
  done
done
rm -f "$OUT" "$OUT.json" "$OUT.err"
uptime
