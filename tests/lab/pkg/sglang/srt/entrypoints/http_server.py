"""HTTP server + TokenizerManager (sglang/srt/entrypoints/http_server.py).

The main process keeps its original cmdline and environment (no setproctitle), serves HTTP
with aiohttp, and talks to its scheduler and detokenizer children over pipes (real SGLang:
ZMQ ipc sockets).

Faults: LAB_FAULT_HANG_METRICS=1 (/metrics accepts and never answers),
LAB_FAULT_HANG_SERVER_INFO=1 (same for /server_info and /get_server_info; note the router
calls /server_info once when it registers the worker),
LAB_FAULT_ERROR_ABOVE_TOKENS=n (inference requests whose prompt is over n tokens are answered
at once with an error, status LAB_FAULT_ERROR_STATUS, default 500, in SGLang's OpenAI error
shape, without reaching the scheduler: on a PD prefill, its decode then waits for KV that
never comes).

Controls (LAB_CONTROLS=1, `lab.py up --controls`): a prompt may carry directives
`[lab:prefill_s=S]` (chunked prefill of S seconds before its first token) and
`[lab:first_token_s=S]` (its first token S seconds after it arrived), passed to the scheduler
with the request.
"""

import asyncio
import json
import logging
import re
import multiprocessing as mp
import os
import queue
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid

from aiohttp import web

import sglang
from sglang.srt.disaggregation.common.conn import CommonKVBootstrapServer
from sglang.srt.managers.detokenizer_manager import run_detokenizer_process
from sglang.srt.managers.scheduler import run_scheduler_process
from sglang.srt.utils.lab_state import StateDir

logger = logging.getLogger("sglang.srt.entrypoints.http_server")

REQUEST_STATE_WAIT_TIMEOUT = 4.0  # SGLANG_REQUEST_STATE_WAIT_TIMEOUT: disconnect check period


def _flag(name):
    return os.environ.get(name, "") not in ("", "0", "false", "False")


CONTROL_KEYS = ("prefill_s", "first_token_s")
DIRECTIVE = re.compile(r"\[lab:(\w+)=([0-9.]+)\]")


def controls_of(texts):
    """The control directives in a request's prompt texts (only with LAB_CONTROLS=1)."""
    if not _flag("LAB_CONTROLS"):
        return {}
    out = {}
    for t in texts:
        for k, v in DIRECTIVE.findall(t or ""):
            if k in CONTROL_KEYS:
                out[k] = float(v)
    return out


def chat_texts(messages):
    out = []
    for m in messages or []:
        c = m.get("content")
        if isinstance(c, str):
            out.append(c)
        elif isinstance(c, list):
            out.extend(p.get("text", "") for p in c if isinstance(p, dict))
    return out


def _env_int(name):
    try:
        return int(os.environ.get(name, "").strip())
    except ValueError:
        return None


def count_tokens(text):
    return len(text.split())


def prompt_tokens_of_chat(messages):
    n = 0
    for m in messages or []:
        c = m.get("content")
        if isinstance(c, str):
            n += count_tokens(c)
        elif isinstance(c, list):
            n += sum(count_tokens(p.get("text", "")) for p in c if isinstance(p, dict))
        n += 4  # role/template tokens
    return max(1, n)


class ReqState:
    __slots__ = ("queue", "created", "first_token_at")

    def __init__(self):
        self.queue = asyncio.Queue()
        self.created = time.time()
        self.first_token_at = None


class TokenizerManager:
    def __init__(self, server_args, send_conn, recv_conn):
        self.server_args = server_args
        self.recv_from_detokenizer = recv_conn
        self.rid_to_state = {}
        # A sender thread so a wedged scheduler (full pipe) can never block the event loop.
        self._outbox = queue.Queue()
        self._send_conn = send_conn
        threading.Thread(target=self._send_loop, name="send_to_scheduler", daemon=True).start()
        self.counters = {"num_requests": 0, "num_aborted_requests": 0, "prompt_tokens": 0,
                         "generation_tokens": 0}

    def _send_loop(self):
        while True:
            msg = self._outbox.get()
            try:
                self._send_conn.send(msg)
            except (OSError, ValueError):
                return

    def start(self, loop):
        loop.add_reader(self.recv_from_detokenizer.fileno(), self.handle_loop)

    def handle_loop(self):
        try:
            while self.recv_from_detokenizer.poll():
                for out in self.recv_from_detokenizer.recv():
                    state = self.rid_to_state.get(out["rid"])
                    if state is not None:
                        state.queue.put_nowait(out)
        except (EOFError, OSError):
            logger.error("detokenizer is gone; exiting")
            os._exit(1)

    async def generate_request(self, request, prompt_tokens, max_new_tokens, body,
                               controls=None):
        rid = body.get("rid") or uuid.uuid4().hex
        state = ReqState()
        self.rid_to_state[rid] = state
        self.counters["num_requests"] += 1
        self.counters["prompt_tokens"] += prompt_tokens
        self._outbox.put({"type": "req", "rid": rid, "prompt_tokens": prompt_tokens,
                          "max_new_tokens": max_new_tokens,
                          "bootstrap_room": body.get("bootstrap_room"),
                          "bootstrap_host": body.get("bootstrap_host"),
                          "bootstrap_port": body.get("bootstrap_port"), **(controls or {})})
        try:
            while True:
                out = await self._wait_one_response(request, rid, state)
                self.counters["generation_tokens"] += 1
                yield rid, out
                if out["finished"]:
                    return
        finally:
            self.rid_to_state.pop(rid, None)

    async def _wait_one_response(self, request, rid, state):
        # Like real SGLang: no server-side deadline, only a periodic client-disconnect check.
        while True:
            try:
                return await asyncio.wait_for(state.queue.get(), REQUEST_STATE_WAIT_TIMEOUT)
            except asyncio.TimeoutError:
                t = request.transport
                if t is None or t.is_closing():
                    self.abort_request(rid)
                    raise ConnectionResetError("client disconnected")

    def abort_request(self, rid):
        self.counters["num_aborted_requests"] += 1
        self._outbox.put({"type": "abort", "rid": rid})


def sse(obj):
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


class Server:
    def __init__(self, server_args, tm, state_dir, child_pids):
        self.args = server_args
        self.tm = tm
        self.state = StateDir(state_dir)
        self.child_pids = child_pids
        self.http_active = {}
        self.http_total = {}
        self.http_responses = {}
        self.started = time.time()

    # ------------------------------------------------------------ middleware
    @web.middleware
    async def track(self, request, handler):
        if request.path == "/metrics":
            return await handler(request)
        key = (request.path, request.method)
        self.http_active[key] = self.http_active.get(key, 0) + 1
        self.http_total[key] = self.http_total.get(key, 0) + 1
        status = 500
        try:
            resp = await handler(request)
            status = resp.status
            return resp
        except web.HTTPException as e:
            status = e.status
            raise
        finally:
            self.http_active[key] -= 1
            rk = (request.path, str(status), request.method)
            self.http_responses[rk] = self.http_responses.get(rk, 0) + 1

    # ------------------------------------------------------------ info endpoints
    async def health(self, request):
        return web.Response(status=200)

    def _server_info(self):
        a = self.args
        loads = self.state.read_json("loads_dp0.json") or {}
        return {
            "model_path": a.model_path, "tokenizer_path": a.model_path,
            "served_model_name": a.served_model_name, "host": a.host, "port": a.port,
            "tp_size": a.tp_size, "dp_size": a.dp_size, "base_gpu_id": a.base_gpu_id,
            "disaggregation_mode": a.disaggregation_mode,
            "disaggregation_bootstrap_port": a.disaggregation_bootstrap_port,
            "disaggregation_transfer_backend": a.disaggregation_transfer_backend,
            "enable_metrics": a.enable_metrics, "decode_log_interval": a.decode_log_interval,
            "mem_fraction_static": a.mem_fraction_static,
            "max_running_requests": a.max_running_requests, "context_length": a.context_length,
            "version": sglang.__version__,
            "internal_states": [{"last_gen_throughput": loads.get("gen_throughput", 0.0),
                                 "max_total_num_tokens": loads.get("max_total_num_tokens")}],
        }

    async def server_info(self, request):
        if _flag("LAB_FAULT_HANG_SERVER_INFO"):
            await asyncio.Event().wait()
        return web.json_response(self._server_info())

    async def model_info(self, request):
        return web.json_response({
            "model_path": self.args.model_path, "tokenizer_path": self.args.model_path,
            "is_generation": True, "preferred_sampling_params": None,
            "weight_version": "default", "has_image_understanding": False,
            "has_audio_understanding": False, "model_type": "llama",
            "architectures": ["LlamaForCausalLM"]})

    async def v1_models(self, request):
        return web.json_response({"object": "list", "data": [{
            "id": self.args.served_model_name, "object": "model", "created": int(self.started),
            "owned_by": "sglang", "root": self.args.served_model_name,
            "max_model_len": self.args.context_length}]})

    async def v1_loads(self, request):
        snap = self.state.read_json("loads_dp0.json")
        if snap is None:
            return web.json_response({"error": "no load snapshot yet"}, status=503)
        return web.json_response({"timestamp": time.time(), "dp_size": 1, "loads": [snap]})

    async def get_load(self, request):
        snap = self.state.read_json("loads_dp0.json") or {}
        return web.json_response([{
            "dp_rank": 0, "num_reqs": snap.get("num_running_reqs", 0),
            "num_waiting_reqs": snap.get("num_waiting_reqs", 0),
            "num_tokens": snap.get("num_used_tokens", 0)}])

    # ------------------------------------------------------------ metrics
    async def metrics(self, request):
        if _flag("LAB_FAULT_HANG_METRICS"):
            await asyncio.Event().wait()
        return web.Response(text=self.render_metrics(),
                            content_type="text/plain", charset="utf-8")

    def render_metrics(self):
        a = self.args
        out = []

        def lab(d):
            return "{" + ",".join(f'{k}="{v}"' for k, v in d.items()) + "}"

        def family(name, typ, help_, samples):
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} {typ}")
            for labels, value in samples:
                out.append(f"{name}{lab(labels)} {float(value)}")

        tok_labels = {"engine_type": a.engine_type, "model_name": a.served_model_name}
        family("sglang:num_requests_total", "counter", "Number of requests processed.",
               [(tok_labels, self.tm.counters["num_requests"])])
        family("sglang:num_aborted_requests_total", "counter", "Number of requests aborted.",
               [(tok_labels, self.tm.counters["num_aborted_requests"])])
        family("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
               [(tok_labels, self.tm.counters["prompt_tokens"])])
        family("sglang:generation_tokens_total", "counter",
               "Number of generation tokens processed.",
               [(tok_labels, self.tm.counters["generation_tokens"])])
        family("sglang:http_requests_active", "gauge", "Number of HTTP requests in flight.",
               [({"endpoint": p, "method": m}, v) for (p, m), v in sorted(self.http_active.items())])
        family("sglang:http_requests_total", "counter", "Total number of HTTP requests.",
               [({"endpoint": p, "method": m}, v) for (p, m), v in sorted(self.http_total.items())])
        family("sglang:http_responses_total", "counter", "Total number of HTTP responses.",
               [({"endpoint": p, "status_code": s, "method": m}, v)
                for (p, s, m), v in sorted(self.http_responses.items())])

        scheds = []
        for rank in range(a.tp_size):
            s = self.state.read_json(f"scheduler_metrics_tp{rank}.json")
            if s is not None and (rank == 0):  # only attn_tp_rank 0 records scheduler metrics
                scheds.append(s)
        gauges = [
            ("num_running_reqs", "The number of running requests."),
            ("num_queue_reqs", "The number of requests in the waiting queue."),
            ("num_used_tokens", "The number of used tokens."),
            ("token_usage", "The token usage."),
            ("gen_throughput", "The generation throughput (token/s)."),
            ("max_total_num_tokens", "Maximum total number of tokens in the KV cache pool."),
            ("num_prefill_bootstrap_queue_reqs", "The number of requests in the prefill bootstrap queue."),
            ("num_prefill_inflight_queue_reqs", "The number of requests in the prefill inflight queue."),
            ("num_decode_prealloc_queue_reqs", "The number of requests in the decode prealloc queue."),
            ("num_decode_transfer_queue_reqs", "The number of requests in the decode transfer queue."),
        ]
        for name, help_ in gauges:
            family(f"sglang:{name}", "gauge", help_,
                   [(s["labels"], s["gauges"].get(name, 0)) for s in scheds])
        family("sglang:forward_execution_seconds_total", "counter",
               "Total time that GPU is busy executing model forward passes.",
               [(dict(s["labels"], category=c), s["counters"][f"forward_{c}"])
                for s in scheds for c in ("extend", "decode")])
        family("sglang:scheduler_idle_seconds_total", "counter",
               "Total wall time while the scheduler has no runnable or queued work.",
               [(s["labels"], s["counters"]["idle"]) for s in scheds])
        family("sglang:realtime_tokens_total", "counter",
               "Total number of tokens processed by the scheduler.",
               [(dict(s["labels"], mode=m), s["counters"][k]) for s in scheds
                for m, k in (("prefill_compute", "prompt_tokens"), ("decode", "generation_tokens"))])
        return "\n".join(out) + "\n"

    # ------------------------------------------------------------ inference
    def _fault_error(self, prompt_tokens):
        """LAB_FAULT_ERROR_ABOVE_TOKENS: the error answer for a prompt over the limit, else
        None. The shape of SGLang's `create_error_response` (OpenAI style)."""
        limit = _env_int("LAB_FAULT_ERROR_ABOVE_TOKENS")
        if limit is None or prompt_tokens <= limit:
            return None
        status = _env_int("LAB_FAULT_ERROR_STATUS") or 500
        logger.error("lab fault: refusing a request of %d prompt tokens with %d",
                     prompt_tokens, status)
        return web.json_response({"object": "error", "message": "Internal server error: "
                                  f"lab fault (prompt of {prompt_tokens} tokens)",
                                  "type": "InternalServerError", "param": None,
                                  "code": status}, status=status)

    async def _read_json(self, request):
        try:
            return await request.json()
        except (ValueError, UnicodeDecodeError):
            raise web.HTTPBadRequest(text=json.dumps({"error": "invalid JSON body"}),
                                     content_type="application/json")

    async def _stream(self, request, gen, make_chunk, tail):
        """Headers go out with the first token, so a request that never produces one shows
        zero response bytes on its socket."""
        resp = None
        last = None
        try:
            async for rid, out in gen:
                if resp is None:
                    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                                       "Cache-Control": "no-cache"})
                    await resp.prepare(request)
                last = out
                await resp.write(make_chunk(rid, out))
            for chunk in tail(last):
                await resp.write(chunk)
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            await gen.aclose()
            raise
        return resp

    async def generate(self, request):
        body = await self._read_json(request)
        sp = body.get("sampling_params") or {}
        max_new = int(sp.get("max_new_tokens") or 16)
        if "input_ids" in body and body["input_ids"]:
            ptoks = len(body["input_ids"])
        else:
            ptoks = count_tokens(body.get("text") or "")
        refused = self._fault_error(max(1, ptoks))
        if refused is not None:
            return refused
        gen = self.tm.generate_request(request, max(1, ptoks), max_new, body)
        text = []

        def chunk(rid, out):
            text.append(out["text"])
            return sse({"text": "".join(text), "meta_info": {
                "id": rid, "finish_reason": ({"type": out["reason"]} if out["finished"] else None),
                "prompt_tokens": out["prompt_tokens"],
                "completion_tokens": out["completion_tokens"]}})

        if body.get("stream"):
            return await self._stream(request, gen, chunk, lambda last: [])
        last = None
        async for rid, out in gen:
            chunk(rid, out)
            last = (rid, out)
        rid, out = last
        return web.json_response({"text": "".join(text), "meta_info": {
            "id": rid, "finish_reason": {"type": out["reason"]},
            "prompt_tokens": out["prompt_tokens"], "completion_tokens": out["completion_tokens"]}})

    async def chat_completions(self, request):
        body = await self._read_json(request)
        max_new = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        ptoks = prompt_tokens_of_chat(body.get("messages"))
        refused = self._fault_error(ptoks)
        if refused is not None:
            return refused
        gen = self.tm.generate_request(request, ptoks, max_new, body,
                                       controls_of(chat_texts(body.get("messages"))))
        created = int(time.time())
        model = body.get("model") or self.args.served_model_name
        first = [True]

        def chunk(rid, out):
            delta = {"content": out["text"]}
            if first[0]:
                delta["role"] = "assistant"
                first[0] = False
            return sse({"id": rid, "object": "chat.completion.chunk", "created": created,
                        "model": model, "choices": [{"index": 0, "delta": delta,
                                                     "logprobs": None,
                                                     "finish_reason": out["reason"]}]})

        def tail(last):
            if last and (body.get("stream_options") or {}).get("include_usage"):
                return [sse({"id": last["rid"], "object": "chat.completion.chunk",
                             "created": created, "model": model, "choices": [],
                             "usage": {"prompt_tokens": last["prompt_tokens"],
                                       "completion_tokens": last["completion_tokens"],
                                       "total_tokens": last["prompt_tokens"] + last["completion_tokens"]}})]
            return []

        if body.get("stream"):
            return await self._stream(request, gen, chunk, tail)
        text, last, rid = [], None, None
        async for rid, out in gen:
            text.append(out["text"])
            last = out
        return web.json_response({
            "id": rid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(text)},
                         "logprobs": None, "finish_reason": last["reason"]}],
            "usage": {"prompt_tokens": last["prompt_tokens"],
                      "completion_tokens": last["completion_tokens"],
                      "total_tokens": last["prompt_tokens"] + last["completion_tokens"]}})

    async def completions(self, request):
        body = await self._read_json(request)
        max_new = int(body.get("max_tokens") or 16)
        prompt = body.get("prompt") or ""
        if isinstance(prompt, list):
            prompt = " ".join(str(p) for p in prompt)
        refused = self._fault_error(max(1, count_tokens(prompt)))
        if refused is not None:
            return refused
        gen = self.tm.generate_request(request, max(1, count_tokens(prompt)), max_new, body)
        created = int(time.time())
        model = body.get("model") or self.args.served_model_name

        def chunk(rid, out):
            return sse({"id": rid, "object": "text_completion", "created": created,
                        "model": model, "choices": [{"index": 0, "text": out["text"],
                                                     "logprobs": None,
                                                     "finish_reason": out["reason"]}]})

        if body.get("stream"):
            return await self._stream(request, gen, chunk, lambda last: [])
        text, last, rid = [], None, None
        async for rid, out in gen:
            text.append(out["text"])
            last = out
        return web.json_response({
            "id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": "".join(text), "logprobs": None,
                         "finish_reason": last["reason"]}]})

    def app(self):
        app = web.Application(middlewares=[self.track], client_max_size=64 << 20)
        r = app.router
        r.add_get("/health", self.health)
        r.add_get("/health_generate", self.health)
        r.add_get("/server_info", self.server_info)
        r.add_get("/get_server_info", self.server_info)
        r.add_get("/model_info", self.model_info)
        r.add_get("/get_model_info", self.model_info)
        r.add_get("/v1/models", self.v1_models)
        r.add_get("/v1/loads", self.v1_loads)
        r.add_get("/get_load", self.get_load)
        r.add_get("/metrics", self.metrics)
        r.add_post("/generate", self.generate)
        r.add_post("/v1/chat/completions", self.chat_completions)
        r.add_post("/v1/completions", self.completions)
        return app


def _gpu_id(server_args, tp_rank):
    local = server_args.base_gpu_id + tp_rank * server_args.gpu_id_step
    cvd = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if local < len(cvd) and cvd[local].isdigit():
        return int(cvd[local])
    return local


def _launch_subprocesses(server_args, state_dir):
    ctx = mp.get_context("spawn")  # like SGLang: children are fresh interpreters
    sched_recv, tok_send = ctx.Pipe(duplex=False)
    detok_recv, sched_send = ctx.Pipe(duplex=False)
    tok_recv, detok_send = ctx.Pipe(duplex=False)
    procs = []
    readers = []
    for tp_rank in range(server_args.tp_size):
        reader, writer = ctx.Pipe(duplex=False)
        p = ctx.Process(target=run_scheduler_process, daemon=True,
                        args=(server_args, None, _gpu_id(server_args, tp_rank), tp_rank, writer,
                              sched_recv, sched_send, state_dir))
        p.start()
        procs.append(p)
        readers.append(reader)
    d = ctx.Process(target=run_detokenizer_process, daemon=True,
                    args=(server_args, None, detok_recv, detok_send))
    d.start()
    procs.append(d)
    for r in readers:
        if not r.poll(120):
            raise RuntimeError("scheduler did not become ready within 120 s")
        info = r.recv()
        logger.info("scheduler ready: %s", info)
    return procs, tok_send, tok_recv


def launch_server(server_args):
    logging.basicConfig(level=getattr(logging, server_args.log_level.upper(), logging.INFO),
                        format="[%(asctime)s] %(message)s")
    own_state_dir = not os.environ.get("SGLANG_LAB_STATE_DIR")
    state_dir = os.environ.get("SGLANG_LAB_STATE_DIR") or tempfile.mkdtemp(prefix="sglang_lab_")
    os.makedirs(state_dir, exist_ok=True)
    procs, tok_send, tok_recv = _launch_subprocesses(server_args, state_dir)

    def cleanup(*_):
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(2)
        if own_state_dir:
            shutil.rmtree(state_dir, ignore_errors=True)

    tm = TokenizerManager(server_args, tok_send, tok_recv)
    server = Server(server_args, tm, state_dir, [p.pid for p in procs])

    async def main():
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        tm.start(loop)
        runner = web.AppRunner(server.app(), access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, server_args.host, server_args.port, reuse_address=True)
        await site.start()
        boot = None
        if server_args.disaggregation_mode == "prefill":
            # The PD bootstrap server lives in the prefill HTTP process, on its own port.
            boot = web.AppRunner(CommonKVBootstrapServer(server_args).app(), access_log=None,
                                 handle_signals=False)
            await boot.setup()
            await web.TCPSite(boot, server_args.host, server_args.disaggregation_bootstrap_port,
                              reuse_address=True).start()
        logger.info("The server is fired up and ready to roll! %s:%s (%s)",
                    server_args.host, server_args.port, server_args.disaggregation_mode)
        await stop.wait()
        await asyncio.wait_for(runner.cleanup(), 2)
        if boot is not None:
            await asyncio.wait_for(boot.cleanup(), 2)

    try:
        asyncio.run(main())
    except (asyncio.TimeoutError, KeyboardInterrupt):
        pass
    finally:
        cleanup()
    sys.exit(0)
