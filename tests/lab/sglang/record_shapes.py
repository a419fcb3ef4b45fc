#!/usr/bin/env python3
"""Records the network shapes of a running real-SGLang tier (`sglang_lab.py up`) as the kernel
sees them: every listening socket of its processes, every TCP connection between them (or to
them) with the kernel's tcp_info sampled over time (`ss -tinpH`), and, optionally, the raw
bytes of the decode's bootstrap requests and of the prefill's bootstrap server (strace of
their send/recv calls, only on our own lab's processes).

  record_shapes.py --run-dir DIR --out FILE.json [--load-seconds 45] [--strace]
  record_shapes.py --summarize FILE.json --out SUMMARY.json
                             one entry per TCP connection: both ends' processes, what it is,
                             and its counters each time they changed (the fixture's form)

Standard library only. The stack must have been started with `up`; this sends its own
requests through the router (streaming chat completions, `ignore_eos`, 16 tokens each):
one with strace attached (the first after `up`'s warm-up), then light load for
--load-seconds, then 10 s of quiet, sampling `ss` every 0.25 s throughout.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from sglang_lab import SGLANG_VERSION, _read, cmdline, descendants  # noqa: E402

USERS = re.compile(r'\("([^"]*)",pid=(\d+),fd=(\d+)\)')
KV = re.compile(r"\b([a-z_]+):([0-9][0-9.]*(?:/[0-9.]+)?)")
KEEP = ["bytes_sent", "bytes_acked", "bytes_received", "segs_out", "segs_in", "data_segs_out",
        "data_segs_in", "lastsnd", "lastrcv", "lastack", "unacked", "retrans"]


def ss(args):
    out = subprocess.run(["ss", *args], capture_output=True, text=True, timeout=10).stdout
    rows, cur = [], None
    for line in out.splitlines():
        if line[:1] in (" ", "\t") and cur is not None:
            cur += " " + line.strip()
            continue
        if cur is not None:
            rows.append(cur)
        cur = line
    if cur is not None:
        rows.append(cur)
    parsed = []
    for r in rows:
        f = r.split()
        if len(f) < 5:
            continue
        users = [(n, int(p), int(fd)) for n, p, fd in USERS.findall(r)]
        info = {}
        for k, v in KV.findall(r):
            if k in KEEP:
                v = v.split("/")[0]  # retrans:now/total
                info[k] = float(v) if "." in v else int(v)
        parsed.append({"state": f[0], "local": f[3], "peer": f[4], "users": users,
                       "info": info})
    return parsed


def our_pids(state):
    pids = {}
    for name, srv in state["servers"].items():
        pids[srv["pid"]] = name
        for c in descendants(srv["pid"]):
            pids[c] = name
    return pids


def title(pid):
    return cmdline(pid)[:160]


class Sampler(threading.Thread):
    def __init__(self, pids, period=0.25):
        super().__init__(daemon=True)
        self.pids, self.period = pids, period
        self.samples = []
        self.stop = threading.Event()
        self.t0 = time.time()
        self.mark_list = []

    def mark(self, what):
        self.mark_list.append({"t": round(time.time() - self.t0, 2), "what": what})

    def run(self):
        while not self.stop.is_set():
            t = round(time.time() - self.t0, 2)
            for row in ss(["-tinpH"]):
                pid = next((p for _, p, _ in row["users"] if p in self.pids), None)
                if pid is None:
                    continue
                self.samples.append({"t": t, "pid": pid, "state": row["state"],
                                     "local": row["local"], "peer": row["peer"],
                                     **row["info"]})
            self.stop.wait(self.period)


def stream_chat(url, model, max_tokens=16, prompt="hello engine please answer"):
    body = json.dumps({"model": model, "max_tokens": max_tokens, "ignore_eos": True,
                       "stream": True, "temperature": 0,
                       "messages": [{"role": "user", "content": prompt}]}).encode()
    req = urllib.request.Request(f"{url}/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    t0 = time.time()
    with urllib.request.urlopen(req, timeout=120) as r:
        data = r.read()
    return {"status": r.status, "bytes": len(data), "seconds": round(time.time() - t0, 2)}


def start_strace(pids, path):
    args = ["strace", "-f", "-tt", "-s", "4096", "-xx", "-o", path,
            "-e", "trace=connect,accept,accept4,sendto,recvfrom,sendmsg,recvmsg,close"]
    for p in pids:
        args += ["-p", str(p)]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _norm(addr):
    return addr.replace("[::ffff:", "").replace("]", "")


def _kind(rec, srv, cli, port, listen_addr):
    """What a connection is, from who listens where (the tier's ports, the listener's process
    and address; SGLang's and Mooncake's own choices, read in their source and strace)."""
    named = {str(v): k for k, v in rec["ports"].items()}
    if port in named:
        return {"bootstrap": "pd_bootstrap_http", "prefill": "http_prefill",
                "decode": "http_decode", "router": "http_router",
                "router_metrics": "http_router_metrics", "nccl_prefill": "torch_tcpstore",
                "nccl_decode": "torch_tcpstore"}[named[port]]
    if cli is None:
        return "unknown"
    if srv["server"] == cli["server"]:
        return "tp_group_gloo"
    if listen_addr.startswith("*:") or listen_addr.startswith("[::]:"):
        return "kv_mooncake_tcp"
    return "pd_zmq"


def summarize(rec):
    procs = {int(k): v for k, v in rec["processes"].items()}
    listen = {}
    for l in rec["listeners"]:
        listen[l["addr"].rsplit(":", 1)[1]] = l
    series = {}
    for s in rec["samples"]:
        key = (s["pid"], _norm(s["local"]), _norm(s["peer"]))
        series.setdefault(key, []).append(s)
    out = []
    for (pid, lo, pe), ss in sorted(series.items()):
        port = lo.rsplit(":", 1)[1]
        l = listen.get(port)
        if not l or l["pid"] != pid:
            continue  # the client side: joined to its server side below
        cli_key = next((k for k in series if k[1] == pe and k[2] == lo), None)
        cli_pid = cli_key[0] if cli_key else None
        srv, cli = procs.get(pid), procs.get(cli_pid)
        points, last = [], None
        for x in ss:
            v = [x.get(k) for k in ("bytes_acked", "bytes_received", "data_segs_out",
                                    "data_segs_in")]
            if v != last or x is ss[-1]:
                points.append({k: x.get(k) for k in ("t", "state", "bytes_acked",
                                                      "bytes_received", "data_segs_out",
                                                      "data_segs_in", "lastsnd", "lastrcv")
                               if x.get(k) is not None})
                last = v
        out.append({"kind": _kind(rec, srv, cli, port, l["addr"]), "listen": l["addr"],
                    "server": {"pid": pid, **(srv or {})},
                    "client": {"pid": cli_pid, "addr": pe, **(cli or {})},
                    "server_side_samples": points})
    return {k: rec[k] for k in ("sglang", "recorded_utc", "ports", "tp", "listeners",
                                "requests", "marks")} | {
        "processes": rec["processes"], "connections": out}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--summarize")
    ap.add_argument("--run-dir")
    ap.add_argument("--out", required=True)
    ap.add_argument("--load-seconds", type=float, default=45)
    ap.add_argument("--strace", action="store_true")
    a = ap.parse_args()
    if a.summarize:
        with open(a.summarize) as f:
            rec = json.load(f)
        with open(a.out, "w") as f:
            json.dump(summarize(rec), f, indent=1)
        return
    if not a.run_dir:
        ap.error("--run-dir is required")
    state = json.loads(_read(os.path.join(a.run_dir, "sglang.json")) or "{}")
    pids = our_pids(state)
    listeners = []
    for row in ss(["-tlnpH"]):
        for _, pid, _ in row["users"]:
            if pid in pids:
                listeners.append({"addr": row["local"], "pid": pid, "server": pids[pid],
                                  "title": title(pid)})
    rec = {"sglang": SGLANG_VERSION, "recorded_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                   time.gmtime()),
           "ports": state["ports"], "tp": {n: s.get("tp") for n, s in state["servers"].items()},
           "processes": {str(p): {"server": n, "title": title(p)} for p, n in pids.items()},
           "listeners": listeners, "requests": []}
    sampler = Sampler(set(pids))
    sampler.start()
    time.sleep(2)
    sampler.mark("quiet after up (warm-up done)")
    tracer = None
    if a.strace:
        boot = [int(p) for p, v in rec["processes"].items()
                if v["server"] in ("decode", "prefill")]
        tracer = start_strace(boot, os.path.join(a.run_dir, "strace.txt"))
        time.sleep(3)
    sampler.mark("request 1 (strace)" if tracer else "request 1")
    rec["requests"].append(stream_chat(state["url"], state["model"]))
    time.sleep(3)
    if tracer:
        tracer.terminate()
        tracer.wait(timeout=30)
    sampler.mark("load start")
    t_end = time.time() + a.load_seconds
    n = 1
    while time.time() < t_end:
        n += 1
        rec["requests"].append(stream_chat(state["url"], state["model"],
                                           prompt=f"round {n}: hello engine"))
        time.sleep(1.5)
    sampler.mark("load end")
    time.sleep(10)
    sampler.mark("quiet end")
    sampler.stop.set()
    sampler.join(timeout=30)
    rec["marks"] = sampler.mark_list
    rec["samples"] = sampler.samples
    with open(a.out, "w") as f:
        json.dump(rec, f, indent=None, separators=(",", ":"))
    print(f"{len(sampler.samples)} samples, {len(rec['requests'])} requests -> {a.out}")


if __name__ == "__main__":
    main()
