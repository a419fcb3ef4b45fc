#!/usr/bin/env bash
# Usage: served_wedge.sh BIN   (env SECS=40: how long calls go on after the wedge;
#   RUST_LOG=wedgewatch::daemon=debug: the daemon's log, kept and named at the end, times each answer)
# The bench's served-snapshot phase by hand, in three minutes: the big lab (TAG=sw,
# PORT=34000) under 200 agents, one release daemon warmed 60 s, one `snapshot --json`, then
# the wedge (a long prompt held open) and 40 s of calls 300 ms apart. Prints p50/p90/p99
# (nearest rank) and the six slowest calls in the order asked, each with the most py-spy
# processes seen running during it (counted from /proc every 30 ms). Leaves nothing running.
set -u
REPO=${REPO:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$REPO"
export TAG=sw PORT=34000
B=benches/by_hand/biglab.sh
BIN=$1
$B down >/dev/null 2>&1; $B up >/dev/null
setsid bash -c "AGENTS=200 $B load $((${SECS:-40} + 360)) > /tmp/load-sw.log 2>&1" & LP=$!
NVML_LIB=$(ls target/release/build/wedgewatch-*/out/fake_nvml/libnvidia-ml.so.1 | head -1)
ST=$(mktemp -d /tmp/ww-sw-XXXX)
WEDGEWATCH_NVML_LIB=$NVML_LIB FAKE_NVML_DIR=$($B nvml) WEDGEWATCH_PY_SPY=$PWD/tests/lab/.venv/bin/py-spy setsid $BIN daemon --state-dir $ST > $ST/d.log 2>&1 & DP=$!
sleep 60
ENTRY=$(python3 -c "import json;print(json.load(open('/tmp/biglab-sw/lab.json'))['entry_url'])")
python3 - "$BIN" "$ST" "$ENTRY" "${SECS:-40}" <<'PY'
import subprocess,time,threading,os,sys,socket,json
bin_,st,entry,secs=sys.argv[1:5]
spy=[];stop=False
def watch():
    while not stop:
        n=0
        for p in os.listdir('/proc'):
            if p.isdigit():
                try:
                    if open(f'/proc/{p}/comm').read().startswith('py-spy'): n+=1
                except Exception: pass
        spy.append((time.monotonic(),n)); time.sleep(0.03)
th=threading.Thread(target=watch,daemon=True); th.start()
def call():
    t=time.monotonic()
    p=subprocess.run([bin_,"--state-dir",st,"snapshot","--json"],stdout=subprocess.PIPE,stderr=subprocess.DEVNULL)
    e=time.monotonic()
    mx=max([n for (ts,n) in spy if t<=ts<=e] or [0])
    return (e-t)*1000, mx, b'"wedged_request"' in p.stdout, time.time()
w=[call()]
addr=entry.replace('http://',''); host,port=addr.rsplit(':',1)
body=json.dumps({"model":"lab-model","stream":True,"max_tokens":8,"messages":[{"role":"user","content":" ".join(["tensor"]*6000)}]})
s=socket.create_connection((host,int(port)))
s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode())
t0=time.monotonic()
while time.monotonic()-t0<float(secs):
    w.append(call()); time.sleep(0.3)
stop=True
lat=sorted(x[0] for x in w)
import math
q=lambda f: lat[max(1,math.ceil(f*len(lat)))-1]
print(f"{len(w)} calls p50 {q(.5):.0f} p90 {q(.9):.0f} p99 {q(.99):.0f} max {lat[-1]:.0f}; wedged in {sum(x[2] for x in w)}")
sl=sorted(enumerate(w),key=lambda x:-x[1][0])[:6]
print("slowest:", ", ".join(f"call {i+1} {v[0]:.0f} ms (py-spy {v[1]}, ended {time.strftime('%H:%M:%S', time.gmtime(v[3]))}.{int(v[3]*1000)%1000:03d})" for i,v in sl))
PY
echo "load $(cat /proc/loadavg)"
kill $DP; kill -- -$LP 2>/dev/null; sleep 1
$B down >/dev/null
if [ -n "${RUST_LOG:-}" ]; then KEPT=$(mktemp /tmp/served-wedge-daemon-XXXX.log); cp $ST/d.log "$KEPT"; echo "daemon log: $KEPT"; fi
rm -rf $ST
