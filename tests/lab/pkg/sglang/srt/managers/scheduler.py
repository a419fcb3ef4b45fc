"""Lab scheduler: the real SGLang event-loop *shape* (function and file names) with timed sleeps
instead of GPU work, so py-spy, NVML and /metrics look like a real scheduler's.

Frame names follow sglang 0.5.x `managers/scheduler.py` (see the lab docs): `event_loop_normal`
-> `recv_requests`, `process_input_requests`, `get_next_batch_to_run`, `run_batch` ->
`TpModelWorker.forward_batch_generation` -> `ModelRunner.forward`, `process_batch_result`,
`on_idle`; PD loops live in `disaggregation/decode.py` and `disaggregation/prefill.py`.

Faults (read from the environment the engine was started with):
  SGLANG_DECODE_PREALLOC_SPLIT_TOKENS=n  decode: silently drop requests whose prompt > n tokens
  LAB_FAULT_STALL_AFTER_TOKENS=k         stop emitting a request's tokens after k, forever
  LAB_FAULT_SPIN=1                       first forward enters a never-ending all_reduce
  LAB_FAULT_DIVERGE_RANK=k               TP > 1: rank 0's first forward enters the TP all_reduce
                                         and every rank but k follows it there; rank k stays
                                         at the request broadcast (sglang#33289's split)
  LAB_FAULT_TRANSFER_STUCK_AFTER=k       decode: the (k+1)-th and later requests never leave the
                                         transfer queue

Controls (slow but healthy requests, `lab.py up --controls`; regular mode):
  LAB_MAX_RUNNING_REQUESTS=n             at most n requests prefilling or running: the rest wait
                                         in the waiting queue (`num_queue_reqs`, /v1/loads)
  a request's `prefill_s` (prompt directive `[lab:prefill_s=S]`, see http_server.py)
                                         chunked prefill: CHUNK_S-long extend batches until S
                                         seconds after it arrived (GPU busy), a decode step of
                                         the others after each; its first token then
  a request's `first_token_s`            it runs in the decode batch but its tokens come only
                                         S seconds after it arrived (a slow decode)
"""

import ctypes
import logging
import os
import signal
import time

from sglang.srt.disaggregation.decode import (
    DecodePreallocQueue,
    DecodeTransferQueue,
    SchedulerDisaggregationDecodeMixin,
)
from sglang.srt.disaggregation.mooncake.conn import (
    MooncakeKVManagerDecode,
    MooncakeKVManagerPrefill,
)
from sglang.srt.disaggregation.prefill import (
    PrefillBootstrapQueue,
    SchedulerDisaggregationPrefillMixin,
)
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.utils.common import broadcast_pyobj
from sglang.srt.utils.lab_state import FakeGpu, StateDir

logger = logging.getLogger(__name__)

MAX_TOTAL_NUM_TOKENS = 500_000
IDLE_METRICS_INTERVAL_S = 30.0  # _maybe_log_idle_metrics: at most every 30 s, only fully idle
LOAD_STALL_REFRESH_S = 0.05  # like real SGLang: /v1/loads stays fresh during stalls
CHUNK_S = 0.1  # one chunk of a chunked prefill (`prefill_s`)


def env_int(name, default=None):
    v = os.environ.get(name, "").strip()
    if not v:
        return default
    try:
        return int(v)
    except ValueError:
        return default


class Req:
    __slots__ = ("rid", "prompt_tokens", "max_new_tokens", "output_ids", "bootstrap_room",
                 "bootstrap_host", "bootstrap_port", "kv_receiver", "seq", "prefill_until",
                 "hold_until")

    def __init__(self, msg, seq):
        self.rid = msg["rid"]
        self.prompt_tokens = int(msg.get("prompt_tokens", 1))
        self.max_new_tokens = max(1, int(msg.get("max_new_tokens", 16)))
        self.bootstrap_room = msg.get("bootstrap_room")
        self.bootstrap_host = msg.get("bootstrap_host")
        self.bootstrap_port = msg.get("bootstrap_port")
        self.kv_receiver = None
        self.output_ids = []
        self.seq = seq
        # Controls: chunked prefill until, and no token before, these monotonic times.
        prefill = float(msg.get("prefill_s") or 0.0)
        self.prefill_until = time.monotonic() + prefill if prefill > 0 else None
        first = float(msg.get("first_token_s") or 0.0)
        self.hold_until = time.monotonic() + first if first > 0 else None


class ScheduleBatch:
    __slots__ = ("reqs", "forward_mode")

    def __init__(self, reqs, forward_mode):
        self.reqs = reqs
        self.forward_mode = forward_mode  # "extend" (prefill) or "decode"


class IdleSleeper:
    """`--sleep-on-idle` behaviour: park until a request arrives (bounded), no busy spin."""

    def __init__(self, conn):
        self.conn = conn

    def maybe_sleep(self):
        self.conn.poll(0.1)


class Scheduler(SchedulerDisaggregationDecodeMixin, SchedulerDisaggregationPrefillMixin):
    def __init__(self, server_args, tp_rank, gpu_id, recv_conn, detok_conn, state_dir):
        self.server_args = server_args
        self.tp_rank = tp_rank
        self.gpu_id = gpu_id
        self.recv_from_tokenizer = recv_conn
        self.send_to_detokenizer = detok_conn
        self.state = StateDir(state_dir)
        self.gpu_mirror = os.path.join(state_dir, "tp0_gpu_state")
        self.gpu = FakeGpu(gpu_id, self.gpu_mirror if tp_rank == 0 and server_args.tp_size > 1
                           else None)
        self.disaggregation_mode = server_args.disaggregation_mode
        self.tp_worker = TpModelWorker(server_args, self)
        self.waiting_queue = []
        self.running_batch = []
        self.chunking = []  # requests in a chunked prefill (controls' `prefill_s`)
        self.max_running = env_int("LAB_MAX_RUNNING_REQUESTS")
        self.cur_batch = None
        self.last_batch = None
        self.idle_sleeper = IdleSleeper(recv_conn)
        self.req_seq = 0
        self.forward_ct_decode = 0
        self.num_generated_tokens = 0
        self.labels = {
            "engine_type": server_args.engine_type,
            "model_name": server_args.served_model_name,
            "tp_rank": str(tp_rank),
            "pp_rank": "0",
            "moe_ep_rank": "0",
        }
        # Counters are live (real SGLang increments mmap'd prometheus values directly);
        # gauges only change when a report_* function runs, so they freeze in a stall.
        self.counters = {"forward_extend": 0.0, "forward_decode": 0.0, "idle": 0.0,
                         "prompt_tokens": 0, "generation_tokens": 0}
        self.gauges = self._current_stats()
        self.last_idle_metrics = 0.0
        self.was_fully_idle = False
        self.last_metrics_flush = 0.0
        self.last_load_publish = 0.0
        self.stall_after_tokens = env_int("LAB_FAULT_STALL_AFTER_TOKENS")
        self.kv_manager = self._init_kv_manager()
        self.disagg_decode_prealloc_queue = DecodePreallocQueue(self)
        self.disagg_decode_transfer_queue = DecodeTransferQueue(self)
        self.disagg_prefill_bootstrap_queue = PrefillBootstrapQueue(self)
        self.disagg_prefill_inflight_queue = []

    def _init_kv_manager(self):
        """PD: every decode rank receives its KV pages over TCP; prefill rank 0 sends them
        (the lab's stand-in for each prefill rank sending its own shard)."""
        if self.disaggregation_mode == "decode":
            return MooncakeKVManagerDecode(self)
        if self.disaggregation_mode == "prefill" and self.tp_rank == 0:
            return MooncakeKVManagerPrefill(self)
        return None

    # ---------------------------------------------------------------- loop selection
    def run_event_loop(self):
        self.gpu.set("idle")
        self.publish_load_snapshot()
        self._flush_metrics(force=True)
        self.dispatch_event_loop()

    def dispatch_event_loop(self):
        if self.tp_rank != 0:
            # Non-zero TP ranks only mirror rank 0: they wait inside broadcast_pyobj, and
            # their GPU does what rank 0's does.
            diverge = env_int("LAB_FAULT_DIVERGE_RANK")
            while True:
                broadcast_pyobj([], self.tp_rank)
                state = self.follow_tp0_gpu()
                if diverge is not None and self.tp_rank != diverge and state == "spin":
                    # Rank 0 is in its forward's all_reduce: join it (and stay, like rank 0).
                    self.run_batch(ScheduleBatch([], "decode"))
        if self.disaggregation_mode == "decode":
            self.event_loop_normal_disagg_decode()
        elif self.disaggregation_mode == "prefill":
            self.event_loop_normal_disagg_prefill()
        else:
            self.event_loop_normal()

    def event_loop_normal(self):
        while True:
            recv_reqs = self.recv_requests()
            self.process_input_requests(recv_reqs)
            batch = self.get_next_batch_to_run()
            self.cur_batch = batch
            if batch:
                result = self.run_batch(batch)
                self.process_batch_result(batch, result)
            else:
                self.on_idle()
            self.last_batch = batch

    def follow_tp0_gpu(self):
        """Mirror rank 0's GPU state; returns it (None when unreadable)."""
        try:
            with open(self.gpu_mirror) as f:
                state = f.read().strip()
        except OSError:
            return None
        if state in ("idle", "busy", "spin"):
            self.gpu.set(state)
        return state

    # ---------------------------------------------------------------- requests
    def recv_requests(self):
        reqs = []
        # zmq.NOBLOCK equivalent; bounded so a flood cannot starve the loop
        while len(reqs) < 256 and self.recv_from_tokenizer.poll(0):
            try:
                reqs.append(self.recv_from_tokenizer.recv())
            except EOFError:
                os._exit(0)  # tokenizer (HTTP process) is gone
        return reqs

    def process_input_requests(self, recv_reqs):
        for msg in recv_reqs:
            if msg.get("type") == "abort":
                self.abort_request(msg["rid"])
                continue
            self.req_seq += 1
            req = Req(msg, self.req_seq)
            self.counters["prompt_tokens"] += req.prompt_tokens
            if self.disaggregation_mode == "decode":
                self.disagg_decode_prealloc_queue.add(req)
            elif self.disaggregation_mode == "prefill":
                self.disagg_prefill_bootstrap_queue.add(req)
            else:
                self.waiting_queue.append(req)

    def abort_request(self, rid):
        keep = lambda r: r.rid != rid  # noqa: E731
        self.waiting_queue = [r for r in self.waiting_queue if keep(r)]
        self.running_batch = [r for r in self.running_batch if keep(r)]
        self.disagg_decode_prealloc_queue.queue = [
            r for r in self.disagg_decode_prealloc_queue.queue if keep(r)]
        self.disagg_decode_transfer_queue.queue = [
            (r, t) for r, t in self.disagg_decode_transfer_queue.queue if keep(r)]
        self.disagg_prefill_bootstrap_queue.queue = [
            r for r in self.disagg_prefill_bootstrap_queue.queue if keep(r)]
        self.disagg_prefill_inflight_queue = [
            (r, t) for r, t in self.disagg_prefill_inflight_queue if keep(r)]

    # ---------------------------------------------------------------- batches
    def get_next_batch_to_run(self):
        if self.waiting_queue and self.free_slots() > 0:
            batch = self.get_new_batch_prefill()
            if batch is not None:
                return batch
        # A chunk of a chunked prefill, then a decode step of the others, in turn.
        last_chunk = self.last_batch is not None and self.last_batch.forward_mode == "chunk"
        if self.chunking and (not last_chunk or not self.running_batch):
            return ScheduleBatch(list(self.chunking), "chunk")
        return self.update_running_batch()

    def free_slots(self):
        if self.max_running is None:
            return len(self.waiting_queue)
        return self.max_running - len(self.running_batch) - len(self.chunking)

    def get_new_batch_prefill(self):
        n = self.free_slots()
        reqs, self.waiting_queue = self.waiting_queue[:n], self.waiting_queue[n:]
        self.chunking.extend(r for r in reqs if r.prefill_until is not None)
        reqs = [r for r in reqs if r.prefill_until is None]
        return ScheduleBatch(reqs, "extend") if reqs else None

    def update_running_batch(self):
        if not self.running_batch:
            return None
        return ScheduleBatch(list(self.running_batch), "decode")

    def run_batch(self, batch):
        self.gpu.set("busy")
        t0 = time.monotonic()
        result = self.tp_worker.forward_batch_generation(batch)
        key = "forward_decode" if batch.forward_mode == "decode" else "forward_extend"
        self.counters[key] += time.monotonic() - t0
        return result

    def process_batch_result(self, batch, result):
        if batch.forward_mode == "chunk":
            self.process_batch_result_chunk(batch, result)
        elif batch.forward_mode == "extend":
            self.process_batch_result_prefill(batch, result)
        else:
            self.process_batch_result_decode(batch, result)
        self._flush_metrics()
        self.maybe_publish_load(0.1)

    def process_batch_result_prefill(self, batch, result):
        outs = []
        for req, tok in zip(batch.reqs, result):
            req.output_ids.append(tok)
            if self._emit(req, tok, outs):
                self.running_batch.append(req)
        self._send_outputs(outs)
        self.report_prefill_stats(batch)

    def process_batch_result_chunk(self, batch, result):
        """A chunk of each chunked prefill is done; those done with their prompt get their
        first token, as a prefill batch gives it."""
        now = time.monotonic()
        done = [r for r in batch.reqs if now >= r.prefill_until]
        self.chunking = [r for r in self.chunking if r not in done]
        if done:
            self.process_batch_result_prefill(ScheduleBatch(done, "extend"), result[:len(done)])

    def process_batch_result_decode(self, batch, result):
        outs = []
        still = []
        for req, tok in zip(batch.reqs, result):
            req.output_ids.append(tok)
            if self._emit(req, tok, outs):
                still.append(req)
        self.running_batch = still
        self._send_outputs(outs)
        self.forward_ct_decode += 1
        if self.forward_ct_decode % max(1, self.server_args.decode_log_interval) == 0:
            self.report_decode_stats()

    def _emit(self, req, tok, outs):
        """Queue `tok` for the detokenizer; return True while `req` keeps running."""
        if req.hold_until is not None and time.monotonic() < req.hold_until:
            # `first_token_s`: a slow decode; this step made no token of it yet.
            req.output_ids.pop()
            return True
        n = len(req.output_ids)
        if self.stall_after_tokens is not None and n > self.stall_after_tokens:
            # LAB_FAULT_STALL_AFTER_TOKENS: the request silently falls out of the batch
            # mid-stream; the client keeps waiting for more tokens forever.
            return False
        finished = n >= req.max_new_tokens
        outs.append({"rid": req.rid, "ids": [tok], "finished": finished,
                     "reason": "length" if finished else None,
                     "prompt_tokens": req.prompt_tokens, "completion_tokens": n})
        self.counters["generation_tokens"] += 1
        return not finished

    def _send_outputs(self, outs):
        if outs:
            self.send_to_detokenizer.send(outs)

    # ---------------------------------------------------------------- idle
    def is_fully_idle(self):
        return not (self.waiting_queue or self.running_batch or self.chunking
                    or self.disagg_decode_prealloc_queue.queue
                    or self.disagg_decode_transfer_queue.queue
                    or self.disagg_prefill_bootstrap_queue.queue
                    or self.disagg_prefill_inflight_queue)

    def on_idle(self):
        self.gpu.set("idle")
        if not self.is_fully_idle():
            # Stall path: queued work but no batch. Real SGLang records itself active and
            # republishes the load snapshot every 50 ms; gauges are NOT refreshed here.
            self.was_fully_idle = False
            self.maybe_publish_load(LOAD_STALL_REFRESH_S)
            self._flush_metrics()
            time.sleep(0.001)  # real: time.sleep(0); the lab must not burn a core
            return
        t0 = time.monotonic()
        self._maybe_log_idle_metrics()
        self.maybe_publish_load(0.5)
        self.maybe_sleep_on_idle()
        self.counters["idle"] += time.monotonic() - t0
        self._flush_metrics()

    def maybe_sleep_on_idle(self):
        self.idle_sleeper.maybe_sleep()

    def _maybe_log_idle_metrics(self):
        now = time.monotonic()
        if not self.was_fully_idle or now - self.last_idle_metrics >= IDLE_METRICS_INTERVAL_S:
            self.was_fully_idle = True
            self.last_idle_metrics = now
            self.gauges = self._current_stats()
            self._flush_metrics(force=True)
            self.publish_load_snapshot()

    # ---------------------------------------------------------------- metrics / load
    def _current_stats(self):
        used = sum(r.prompt_tokens + len(r.output_ids) for r in self.running_batch)
        pd = lambda name: len(getattr(self, name).queue) if hasattr(self, name) else 0  # noqa
        return {
            "num_running_reqs": len(self.running_batch) + len(getattr(self, "chunking", [])),
            "num_queue_reqs": len(self.waiting_queue),
            "num_used_tokens": used,
            "token_usage": round(used / MAX_TOTAL_NUM_TOKENS, 6),
            "gen_throughput": 0.0 if not self.running_batch else round(
                len(self.running_batch) / self.tp_worker.token_interval, 3),
            "num_prefill_bootstrap_queue_reqs": pd("disagg_prefill_bootstrap_queue"),
            "num_prefill_inflight_queue_reqs": len(getattr(self, "disagg_prefill_inflight_queue", [])),
            "num_decode_prealloc_queue_reqs": pd("disagg_decode_prealloc_queue"),
            "num_decode_transfer_queue_reqs": pd("disagg_decode_transfer_queue"),
            "max_total_num_tokens": MAX_TOTAL_NUM_TOKENS,
        }

    def report_prefill_stats(self, batch=None):
        self.gauges = self._current_stats()
        self._flush_metrics(force=True)

    def report_decode_stats(self):
        self.gauges = self._current_stats()
        self._flush_metrics(force=True)

    def _flush_metrics(self, force=False):
        now = time.monotonic()
        if not force and now - self.last_metrics_flush < 0.2:
            return
        self.last_metrics_flush = now
        self.state.write_json(f"scheduler_metrics_tp{self.tp_rank}.json", {
            "labels": self.labels, "gauges": self.gauges, "counters": self.counters,
            "pid": os.getpid()})

    def maybe_publish_load(self, interval):
        if time.monotonic() - self.last_load_publish >= interval:
            self.publish_load_snapshot()

    def publish_load_snapshot(self):
        self.last_load_publish = time.monotonic()
        s = self._current_stats()
        mode = self.disaggregation_mode
        self.state.write_json("loads_dp0.json", {
            "timestamp": time.time(), "dp_rank": 0,
            "num_running_reqs": s["num_running_reqs"],
            "num_waiting_reqs": s["num_queue_reqs"],
            "num_waiting_uncached_tokens": sum(r.prompt_tokens for r in self.waiting_queue),
            "num_used_tokens": s["num_used_tokens"], "num_total_tokens": MAX_TOTAL_NUM_TOKENS,
            "num_active_tokens": s["num_used_tokens"], "num_prealloc_ready_tokens": 0,
            "max_total_num_tokens": MAX_TOTAL_NUM_TOKENS,
            "max_running_requests": self.server_args.max_running_requests,
            "token_usage": s["token_usage"], "gen_throughput": s["gen_throughput"],
            "cache_hit_rate": 0.0,
            "utilization": 1.0 if self.running_batch else 0.0,
            "total_prefill_uncached_tokens": self.counters["prompt_tokens"],
            "total_prefill_busy_us": int(self.counters["forward_extend"] * 1e6),
            "decode_moments": None,
            "disaggregation": {
                "mode": mode,
                "prefill_bootstrap_queue_reqs": s["num_prefill_bootstrap_queue_reqs"],
                "prefill_inflight_queue_reqs": s["num_prefill_inflight_queue_reqs"],
                "decode_prealloc_queue_reqs": s["num_decode_prealloc_queue_reqs"],
                "decode_transfer_queue_reqs": s["num_decode_transfer_queue_reqs"],
                "decode_retracted_queue_reqs": 0,
                "kv_transfer_speed_gb_s": 0.0, "kv_transfer_latency_ms": 0.0,
            },
            "queues": {"waiting": s["num_queue_reqs"], "grammar": 0, "paused": 0,
                       "retracted": 0, "prealloc_ready": 0},
            "memory": {"weight_gb": 16.1, "kv_cache_gb": 108.4, "graph_gb": 2.3,
                       "token_capacity": MAX_TOTAL_NUM_TOKENS},
        })


def _die_with_parent():
    # PR_SET_PDEATHSIG = 1: the kernel kills us if the HTTP process dies, like SGLang's
    # kill_itself_when_parent_died(). Best effort.
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except OSError:
        pass


def configure_scheduler_process(server_args, tp_rank):
    from setproctitle import setproctitle

    suffix = f" TP{tp_rank}" if server_args.tp_size > 1 else ""
    setproctitle(f"sglang::scheduler{suffix.replace(' ', '_')}")


def run_scheduler_process(server_args, port_args, gpu_id, tp_rank, pipe_writer,
                          recv_conn, detok_conn, state_dir):
    _die_with_parent()
    configure_scheduler_process(server_args, tp_rank)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    scheduler = Scheduler(server_args, tp_rank, gpu_id, recv_conn, detok_conn, state_dir)
    pipe_writer.send({"status": "ready", "max_total_num_tokens": MAX_TOTAL_NUM_TOKENS,
                      "pid": os.getpid(), "gpu_id": gpu_id})
    scheduler.run_event_loop()
