#!/usr/bin/env python3
"""The controls: slow but healthy requests, all at once, that must raise no finding.

    python3 controls.py --url http://127.0.0.1:PROXY --engine-url http://127.0.0.1:ENGINE
                        [--only a,b]

Run on the regular lab started with `lab.py up --mode regular --controls` (engines honour the
prompt directives and run at most 8 requests; the router's token bucket admits 30 at once).
Standard library only. Concurrently, from t = 0:

  long_prefill   a 6,000-word prompt with `[lab:prefill_s=60]`: chunked prefill keeps the
                 GPU working 60 s before its first byte
  slow_decode    `[lab:first_token_s=20]`: in the decode batch, first token after 20 s,
                 while the engine is busy with others (busy_others, the queue)
  busy_others    two streams, request after request, while the long prefill lasts
  slow_upload    a request whose body reaches the proxy 1/40 at a time over 40 s
  queue          at t = 3 s, a burst of 20 streams of 30 tokens: the engine's waiting queue
                 backs up (8 running at most) and drains
  router_queue   at t = 30 s, 180 requests at once: the router admits what its tokens allow and
                 puts the rest in its own admission queue, which (sglang-router 0.3.2,
                 measured) refuses them with 408 within tens of ms when no token frees

Prints one JSON object: {"elapsed_s", "controls": {name: {..., "ok", "happened"}}}; `ok`:
every request of the control was answered in full; `happened`: the control did what it is
for (the first byte came late, the queue was seen, the upload was slow), with the figures.
"""

import argparse
import json
import socket
import threading
import time
import urllib.request

WORDS = "plan route cache shard token batch queue tensor kernel stream agent reply".split()
BURST = 20
# Six bucketfuls: on a loaded machine the proxy hands a burst of 90 over in more than the
# bucket's refill (a run with four labs beside it saw all 90 admitted, none queued).
ROUTER_BURST = 180


def prompt(words, directive=""):
    body = " ".join(WORDS[k % len(WORDS)] for k in range(words))
    return f"{directive} {body}".strip()


def body_of(text, max_tokens):
    return json.dumps({"model": "lab-model", "stream": True, "max_tokens": max_tokens,
                       "messages": [{"role": "user", "content": text}]}).encode()


def stream(url, body, chunk_s=0.0, pieces=1, timeout=150.0):
    """POST `body` to `url` (/v1/chat/completions), in `pieces` parts `chunk_s` apart; read
    the streamed answer to its end. Returns {upload_s, first_byte_s (from the last body
    byte), done_s, ok, bytes}."""
    host, port = url.replace("http://", "").split(":")
    t0 = time.monotonic()
    out = {"ok": False, "bytes": 0}
    try:
        s = socket.create_connection((host, int(port)), timeout=timeout)
    except OSError as e:
        out["error"] = str(e)
        return out
    with s:
        s.settimeout(timeout)
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n").encode()
        try:
            s.sendall(head)
            step = max(1, -(-len(body) // pieces))
            for i in range(0, len(body), step):
                if i:
                    time.sleep(chunk_s)
                s.sendall(body[i:i + step])
            sent_at = time.monotonic()
            out["upload_s"] = round(sent_at - t0, 2)
            data = b""
            while True:
                b = s.recv(65536)
                if not b:
                    break
                if not data:
                    out["first_byte_s"] = round(time.monotonic() - sent_at, 2)
                data += b
            out["done_s"] = round(time.monotonic() - t0, 2)
            out["bytes"] = len(data)
            status = data.split(b" ", 2)[1:2]
            out["status"] = int(status[0]) if status and status[0].isdigit() else None
            out["ok"] = data.startswith(b"HTTP/1.1 200") and b"[DONE]" in data
        except OSError as e:
            out["error"] = str(e)
    return out


def get(url, timeout=2.0):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read()
    except (OSError, ValueError):
        return None


class Run:
    def __init__(self, a):
        self.a = a
        self.results = {}
        self.lock = threading.Lock()
        self.done = threading.Event()  # the long prefill (the run's longest control) ended

    def put(self, name, value):
        with self.lock:
            self.results[name] = value

    def long_prefill(self):
        r = stream(self.a.url, body_of(prompt(6000, "[lab:prefill_s=60]"), 4))
        r["happened"] = r.get("first_byte_s", 0) >= 59.0
        self.put("long_prefill", r)
        self.done.set()

    def slow_decode(self):
        r = stream(self.a.url, body_of(prompt(40, "[lab:first_token_s=20]"), 8))
        r["happened"] = r.get("first_byte_s", 0) >= 19.5
        self.put("slow_decode", r)

    def busy_others(self):
        out = {"requests": 0, "answered": 0, "refused_408": 0, "errors": []}

        def one_stream():
            while not self.done.is_set():
                r = stream(self.a.url, body_of(prompt(30), 40))
                with self.lock:
                    out["requests"] += 1
                    out["answered"] += int(r["ok"])
                    # The router refuses what its queue held past a refill (router_queue).
                    out["refused_408"] += int(r.get("status") == 408)
                    if not r["ok"] and r.get("status") != 408:
                        out["errors"].append(r.get("error", f"status {r.get('status')}"))

        ts = [threading.Thread(target=one_stream) for _ in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        out["ok"] = out["requests"] > 0 and not out["errors"]
        out["happened"] = out["answered"] >= 4
        self.put("busy_others", out)

    def slow_upload(self):
        r = stream(self.a.url, body_of(prompt(400), 8), chunk_s=1.0, pieces=41)
        r["happened"] = r.get("upload_s", 0) >= 38.0
        self.put("slow_upload", r)

    def queue(self):
        time.sleep(3.0)
        seen = {"engine_waiting_max": 0}
        stop = threading.Event()

        def watch():
            loads = self.a.engine_url + "/v1/loads"
            while not stop.is_set():
                raw = get(loads)
                if raw:
                    try:
                        w = sum(x.get("num_waiting_reqs", 0) for x in json.loads(raw)["loads"])
                        seen["engine_waiting_max"] = max(seen["engine_waiting_max"], w)
                    except (ValueError, KeyError, TypeError):
                        pass
                time.sleep(0.3)

        def one():
            r = stream(self.a.url, body_of(prompt(20), 30))
            with self.lock:
                rs.append(r)

        rs = []
        w = threading.Thread(target=watch)
        w.start()
        ts = [threading.Thread(target=one) for _ in range(BURST)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        stop.set()
        w.join()
        firsts = sorted(r.get("first_byte_s", -1) for r in rs)
        out = {"requests": len(rs), "answered": sum(r["ok"] for r in rs),
               "first_byte_s_max": firsts[-1] if firsts else None,
               "first_byte_s_median": firsts[len(firsts) // 2] if firsts else None, **seen}
        out["ok"] = out["answered"] == len(rs) == BURST
        out["happened"] = seen["engine_waiting_max"] >= 1 and (out["first_byte_s_max"] or 0) >= 10
        self.put("queue", out)

    def router_queue(self):
        """At t = 30 s, more requests at once than the router's token bucket holds: it admits
        what its tokens allow and queues the rest, admitting or refusing them (408)."""
        time.sleep(30.0)
        rs = []
        # All at the same instant: threads started one by one on a loaded machine would
        # spread over a refill and all be admitted.
        start = threading.Barrier(ROUTER_BURST)

        def one():
            try:
                start.wait(timeout=30.0)
            except threading.BrokenBarrierError:
                pass
            r = stream(self.a.url, body_of(prompt(10), 1), timeout=60.0)
            with self.lock:
                rs.append(r)

        ts = [threading.Thread(target=one) for _ in range(ROUTER_BURST)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        refused = [r for r in rs if r.get("status") in (408, 429)]
        self.put("router_queue", {
            "requests": len(rs),
            "answered_200": sum(r.get("status") == 200 for r in rs),
            "refused_by_router_queue": len(refused),
            "refused_after_s_max": max((r["done_s"] for r in refused), default=None),
            # Every request got an answer (200, or the router queue's refusal), none hung.
            "ok": all(r.get("status") in (200, 408, 429) for r in rs),
            "happened": len(refused) >= 1,
        })


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--engine-url", required=True)
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    run = Run(a)
    names = ["long_prefill", "slow_decode", "busy_others", "slow_upload", "queue",
             "router_queue"]
    only = [n for n in a.only.split(",") if n]
    if only and "long_prefill" not in only:
        run.done.set()  # busy_others streams until the long prefill ends
    t0 = time.monotonic()
    ts = [threading.Thread(target=getattr(run, n)) for n in names if not only or n in only]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    print(json.dumps({"elapsed_s": round(time.monotonic() - t0, 1),
                      "controls": run.results}, indent=1), flush=True)


if __name__ == "__main__":
    main()
