"""Decode side of PD disaggregation (sglang/srt/disaggregation/decode.py)."""

import logging
import os
import time

from sglang.srt.disaggregation.mooncake.conn import MooncakeKVReceiver
from sglang.srt.disaggregation.utils import KVPoll, KvHandoff, poll_and_all_reduce

logger = logging.getLogger(__name__)

# A request whose KV does not come over a transfer stream (sent to decode directly, not by the
# router, or a lab without the stream): its KV is taken as ready this long after
# pre-allocation, once its prefill marked it sent (`KvHandoff`, when the lab shares a KV dir).
KV_TRANSFER_S = 0.02
# SGLANG_DISAGGREGATION_WAITING_TIMEOUT (mooncake/conn.py, default 300 s): a request whose KV
# never arrives fails with KVPoll.Failed after this long and is aborted.
WAITING_TIMEOUT_S = float(os.environ.get("SGLANG_DISAGGREGATION_WAITING_TIMEOUT") or 300)


def _env_int(name):
    v = os.environ.get(name, "").strip()
    try:
        return int(v) if v else None
    except ValueError:
        return None


class DecodePreallocQueue:
    """Requests waiting for KV-cache pre-allocation on the decode side."""

    def __init__(self, scheduler):
        self.scheduler = scheduler
        self.queue = []
        # The "tuning variable": chunk pre-allocation for long prompts. When set, prompts
        # longer than this are handed to a split path that never completes: the request is
        # dropped without an error, a log line or a metric (accepted and forgotten).
        self.split_tokens = _env_int("SGLANG_DECODE_PREALLOC_SPLIT_TOKENS")

    def add(self, req):
        manager = self.scheduler.kv_manager
        if manager is not None and req.bootstrap_room is not None:
            req.kv_receiver = MooncakeKVReceiver(manager, req)
        self.queue.append(req)

    def pop_preallocated(self):
        preallocated = []
        for req in self.queue:
            if self.split_tokens is not None and req.prompt_tokens > self.split_tokens:
                self._pre_alloc_split(req)
                continue
            if req.kv_receiver is not None:
                # KV memory is ours now: tell the prefill where to write (TransferInfo).
                req.kv_receiver.init()
            preallocated.append(req)
        self.queue = []
        return preallocated

    def _pre_alloc_split(self, req):
        pass  # the bug: the split request is never re-queued


class DecodeTransferQueue:
    """Requests whose KV cache is being transferred from the prefill engine."""

    def __init__(self, scheduler):
        self.scheduler = scheduler
        self.queue = []  # (req, ready_at): ready_at None = when its pages and status arrived
        self.stuck_after = _env_int("LAB_FAULT_TRANSFER_STUCK_AFTER")
        self.admitted = 0
        self.kv = KvHandoff()
        self.failed = []  # waited WAITING_TIMEOUT_S for KV that never came

    def extend(self, reqs):
        now = time.monotonic()
        for req in reqs:
            self.admitted += 1
            stuck = self.stuck_after is not None and self.admitted > self.stuck_after
            if stuck:
                ready_at = float("inf")
            elif req.kv_receiver is not None and req.kv_receiver.sent:
                ready_at = None
            else:
                ready_at = now + KV_TRANSFER_S
            self.queue.append((req, ready_at))

    def pop_transferred(self):
        if not self.queue:
            return []
        now = time.monotonic()
        polls = poll_and_all_reduce([lambda r=r, t=t: self.poll(r, t, now) for r, t in self.queue])
        done = [r for (r, _), s in zip(self.queue, polls) if s == KVPoll.Success]
        for r in done:
            if r.kv_receiver is not None:
                r.kv_receiver.clear()
        self.failed += [r for (r, _), s in zip(self.queue, polls) if s == KVPoll.Failed]
        self.queue = [(r, t) for (r, t), s in zip(self.queue, polls)
                      if s not in (KVPoll.Success, KVPoll.Failed)]
        return done

    def poll(self, req, ready_at, now):
        """The receiver's state. Over a transfer stream (ready_at None): Success once its
        pages and status arrived, else Transferring (the real receiver has no timeout while
        it transfers: sglang PR 31800). Otherwise: Success once the transfer time passed and
        prefill sent the KV; Failed after the waiting timeout; WaitingForInput until then."""
        if ready_at is None:
            return KVPoll.Success if req.kv_receiver.poll_done() else KVPoll.Transferring
        if now < ready_at:
            return KVPoll.Transferring
        if self.kv.arrived(req.bootstrap_room):
            return KVPoll.Success
        if now - ready_at >= WAITING_TIMEOUT_S:
            return KVPoll.Failed
        return KVPoll.WaitingForInput


class SchedulerDisaggregationDecodeMixin:
    def event_loop_normal_disagg_decode(self):
        while True:
            recv_reqs = self.recv_requests()
            self.process_input_requests(recv_reqs)
            self.process_decode_queue()
            batch = self.get_next_disagg_decode_batch_to_run()
            self.cur_batch = batch
            if batch:
                result = self.run_batch(batch)
                self.process_batch_result(batch, result)
            else:
                self.on_idle()
            self.last_batch = batch

    def process_decode_queue(self):
        req_conns = self.disagg_decode_prealloc_queue.pop_preallocated()
        self.disagg_decode_transfer_queue.extend(req_conns)
        alloc_reqs = self.disagg_decode_transfer_queue.pop_transferred()
        self.waiting_queue.extend(alloc_reqs)
        failed, self.disagg_decode_transfer_queue.failed = (
            self.disagg_decode_transfer_queue.failed, [])
        if failed:  # real: prepare_abort(req, ...) and stream_output: the client gets an error
            logger.error("KV transfer failed for %d request(s): waited %.0f s", len(failed),
                         WAITING_TIMEOUT_S)
            self._send_outputs([{"rid": r.rid, "ids": [], "finished": True, "reason": "abort",
                                 "prompt_tokens": r.prompt_tokens, "completion_tokens": 0}
                                for r in failed])

    def get_next_disagg_decode_batch_to_run(self):
        new_prebuilt_batch = self.get_new_prebuilt_batch()
        if new_prebuilt_batch:
            self.running_batch.extend(new_prebuilt_batch)
        return self.update_running_batch()

    def get_new_prebuilt_batch(self):
        reqs, self.waiting_queue = self.waiting_queue, []
        return reqs
