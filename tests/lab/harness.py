"""Multi-agent harness: N agents doing multi-round streaming chat with growing context.

    python harness.py --url http://127.0.0.1:PROXY --agents N --rounds R [--timeout S]
                      [--max-tokens M] [--total-timeout T]
    python harness.py --url ... --agents 200 --duration S [--rounds R] [--think S] ...

Steady mode (--duration): every agent streams request after request for S seconds (new
connection each, so connections churn), its conversation starting over every R rounds;
prints {"completed_requests", "requests_per_s", "chunks", "chunks_per_s", "hung_requests",
"errored_requests", "error_samples", ...} instead of the per-agent report below; with
--progress S, also one {"t", "completed", "chunks"} line to stderr every S seconds.

Each agent keeps its conversation: every round appends the assistant reply and a new user
message, so the prompt grows every round. Agent i's user messages are 12 + 8*i words long
(so with SGLANG_DECODE_PREALLOC_SPLIT_TOKENS=100 the agents hang after 1-3 rounds).
Each request uses a fresh connection (like many agent frameworks), bounded by --timeout
seconds; the whole run is bounded by --total-timeout. Prints one JSON report to stdout:

{"url", "agents_requested", "rounds_requested", "elapsed_s",
 "summary": {"all_completed", "completed_agents", "hung_agents", "errored_agents"},
 "agents": [{"agent", "rounds_completed", "hung_round" (1-based or null),
             "hung_phase" ("no_response"|"mid_stream"|null), "errors": [str],
             "rounds": [{"round", "prompt_words", "status", "ttfb_s", "duration_s",
                         "bytes", "chunks", "outcome"}]}]}
"""

import argparse
import asyncio
import json
import sys
import time

import aiohttp

# Chunks received so far by every request, finished or not (--progress reports it): unlike
# completed requests, which come in beats (see steady_agent), chunks flow evenly.
STREAMED = {"chunks": 0}

VOCAB = ("plan route cache shard token batch queue tensor kernel stream agent reply context "
         "window budget schedule memory latency prefill decode").split()


def user_message(agent, rnd, words):
    body = " ".join(VOCAB[(agent * 7 + rnd * 3 + k) % len(VOCAB)] for k in range(words - 4))
    return f"agent {agent} round {rnd}: {body}"


def count_prompt_tokens(messages):
    return sum(len(m["content"].split()) + 4 for m in messages)


async def one_round(url, messages, max_tokens, timeout, rec):
    t0 = time.monotonic()
    payload = {"model": "lab-model", "messages": messages, "stream": True,
               "max_tokens": max_tokens, "stream_options": {"include_usage": True}}
    text = []
    done = False
    buf = b""
    conn = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=conn) as s:
        async with s.post(url + "/v1/chat/completions", json=payload,
                          timeout=aiohttp.ClientTimeout(total=None, sock_connect=5)) as r:
            rec["status"] = r.status
            rec["ttfb_s"] = round(time.monotonic() - t0, 3)
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}: {(await r.text())[:200]}")
            async for chunk in r.content.iter_any():
                rec["bytes"] += len(chunk)
                buf += chunk
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    line = event.decode(errors="replace").strip()
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        done = True
                        continue
                    rec["chunks"] += 1
                    STREAMED["chunks"] += 1
                    try:
                        obj = json.loads(data)
                    except ValueError:
                        raise RuntimeError(f"malformed SSE event: {data[:120]}")
                    for ch in obj.get("choices") or []:
                        text.append((ch.get("delta") or {}).get("content") or "")
    rec["duration_s"] = round(time.monotonic() - t0, 3)
    if not done:
        raise RuntimeError("stream ended without [DONE]")
    return "".join(text)


async def agent(i, url, rounds, max_tokens, timeout, report):
    messages = [{"role": "system",
                 "content": f"You are agent {i} of a planning swarm. Answer briefly please."}]
    for rnd in range(1, rounds + 1):
        messages.append({"role": "user", "content": user_message(i, rnd, 12 + 8 * i)})
        rec = {"round": rnd, "prompt_words": count_prompt_tokens(messages), "status": None,
               "ttfb_s": None, "duration_s": None, "bytes": 0, "chunks": 0, "outcome": None}
        report["rounds"].append(rec)
        try:
            reply = await asyncio.wait_for(one_round(url, messages, max_tokens, timeout, rec),
                                           timeout)
        except asyncio.TimeoutError:
            rec["outcome"] = "hung"
            report["hung_round"] = rnd
            report["hung_phase"] = "mid_stream" if rec["bytes"] > 0 else "no_response"
            return
        except (aiohttp.ClientError, RuntimeError, OSError) as e:
            rec["outcome"] = "error"
            report["errors"].append(f"round {rnd}: {type(e).__name__}: {e}")
            return
        rec["outcome"] = "ok"
        report["rounds_completed"] = rnd
        messages.append({"role": "assistant", "content": reply.strip()})


async def steady_agent(i, url, a, deadline, stats):
    """Duration mode: round after round until the deadline (the last request is finished,
    not cut); the conversation starts over every --rounds rounds, so prompts stay bounded.
    Agent i's user messages are 12 + 8 * (i % 10) words. Agent i's first conversation is
    i % rounds rounds shorter, so the agents' conversations do not all start over together:
    in step, the load beats (short prompts, then long ones) every `rounds` requests, and a
    throughput counted over any stretch but whole beats is off by a part of one."""
    rnd = i % a.rounds
    messages = None
    while time.monotonic() < deadline:
        if messages is None or rnd % a.rounds == 0:
            messages = [{"role": "system",
                         "content": f"You are agent {i} of a planning swarm. Answer briefly please."}]
        rnd += 1
        messages.append({"role": "user", "content": user_message(i, rnd, 12 + 8 * (i % 10))})
        rec = {"bytes": 0, "chunks": 0, "status": None, "ttfb_s": None, "duration_s": None}
        try:
            reply = await asyncio.wait_for(one_round(url, messages, a.max_tokens, a.timeout, rec),
                                           a.timeout)
        except asyncio.TimeoutError:
            stats["hung"] += 1
            rnd = 0
            continue
        except (aiohttp.ClientError, RuntimeError, OSError) as e:
            stats["errors"] += 1
            if len(stats["error_samples"]) < 5:
                stats["error_samples"].append(f"agent {i}: {type(e).__name__}: {e}")
            rnd = 0
            await asyncio.sleep(0.2)
            continue
        stats["completed"] += 1
        stats["chunks"] += rec["chunks"]
        messages.append({"role": "assistant", "content": reply.strip()})
        if a.think > 0:
            await asyncio.sleep(a.think)


async def progress(every, t0, stats):
    """`--progress S`: one line to stderr every S seconds, the completed requests and the
    chunks streamed so far: {"t": seconds since the start (monotonic), "completed": count,
    "chunks": count}. A reader can cut one long run into blocks of its own (the bench's
    daemon on and off) without a harness starting up at every block."""
    n = 0
    while True:
        n += 1
        await asyncio.sleep(max(0.0, t0 + n * every - time.monotonic()))
        sys.stderr.write(json.dumps({"t": round(time.monotonic() - t0, 3),
                                     "completed": stats["completed"],
                                     "chunks": STREAMED["chunks"]}) + "\n")
        sys.stderr.flush()


async def steady(a):
    """`--duration S`: a.agents agents (streams) for S seconds; prints throughput."""
    t0 = time.monotonic()
    stats = {"completed": 0, "chunks": 0, "hung": 0, "errors": 0, "error_samples": []}
    url = a.url.rstrip("/")
    tasks = [asyncio.create_task(steady_agent(i, url, a, t0 + a.duration, stats))
             for i in range(a.agents)]
    if a.progress > 0:
        asyncio.get_running_loop().create_task(progress(a.progress, t0, stats))
    bound = a.total_timeout or a.duration + a.timeout + 5
    _, pending = await asyncio.wait(tasks, timeout=bound)
    for t in pending:
        t.cancel()
    elapsed = time.monotonic() - t0
    out = {"url": a.url, "agents_requested": a.agents, "duration_s": a.duration,
           "elapsed_s": round(elapsed, 3), "completed_requests": stats["completed"],
           "requests_per_s": round(stats["completed"] / elapsed, 3),
           "chunks": stats["chunks"], "chunks_per_s": round(stats["chunks"] / elapsed, 1),
           "hung_requests": stats["hung"], "errored_requests": stats["errors"],
           "error_samples": stats["error_samples"], "cut_agents": len(pending)}
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--agents", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=10.0, help="per request, seconds")
    ap.add_argument("--max-tokens", type=int, default=12)
    ap.add_argument("--total-timeout", type=float, default=None)
    ap.add_argument("--duration", type=float, default=0.0,
                    help="steady mode: keep every agent busy for this many seconds")
    ap.add_argument("--think", type=float, default=0.0,
                    help="steady mode: seconds an agent waits between its requests")
    ap.add_argument("--progress", type=float, default=0.0,
                    help="steady mode: print the completed requests and streamed chunks "
                         "to stderr every S seconds")
    a = ap.parse_args()
    if a.duration > 0:
        return await steady(a)
    total = a.total_timeout or a.rounds * a.timeout + 5
    t0 = time.monotonic()
    reports = [{"agent": i, "rounds_completed": 0, "hung_round": None, "hung_phase": None,
                "errors": [], "rounds": []} for i in range(a.agents)]
    tasks = [asyncio.create_task(agent(i, a.url.rstrip("/"), a.rounds, a.max_tokens,
                                       a.timeout, reports[i])) for i in range(a.agents)]
    done, pending = await asyncio.wait(tasks, timeout=total)
    for t in pending:
        t.cancel()
    for i, t in enumerate(tasks):
        if t in pending:
            reports[i]["errors"].append("total timeout reached")
        elif t.exception() is not None:
            reports[i]["errors"].append(f"agent crashed: {t.exception()!r}")
    completed = sum(1 for r in reports if r["rounds_completed"] == a.rounds)
    out = {"url": a.url, "agents_requested": a.agents, "rounds_requested": a.rounds,
           "elapsed_s": round(time.monotonic() - t0, 3),
           "summary": {"all_completed": completed == a.agents, "completed_agents": completed,
                       "hung_agents": sum(1 for r in reports if r["hung_round"] is not None),
                       "errored_agents": sum(1 for r in reports if r["errors"])},
           "agents": reports}
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    asyncio.run(main())
