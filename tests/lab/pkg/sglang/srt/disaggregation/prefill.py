"""Prefill side of PD disaggregation (sglang/srt/disaggregation/prefill.py)."""

import time

from sglang.srt.disaggregation.utils import KVPoll, KvHandoff, poll_and_all_reduce

KV_SEND_S = 0.01  # simulated time to push the KV cache to the decode engine


class PrefillBootstrapQueue:
    """Requests waiting for the decode side to connect (bootstrap handshake)."""

    def __init__(self, scheduler):
        self.scheduler = scheduler
        self.queue = []
        self.kv = KvHandoff()

    def add(self, req):
        self.queue.append(req)

    def pop_bootstrapped(self):
        bootstrapped, self.queue = self.queue, []
        return bootstrapped


class SchedulerDisaggregationPrefillMixin:
    def event_loop_normal_disagg_prefill(self):
        while True:
            recv_reqs = self.recv_requests()
            self.process_input_requests(recv_reqs)
            self.waiting_queue.extend(self.disagg_prefill_bootstrap_queue.pop_bootstrapped())
            batch = self.get_next_disagg_prefill_batch_to_run()
            self.cur_batch = batch
            if batch:
                result = self.run_batch(batch)
                self.process_batch_result_disagg_prefill(batch, result)
            if len(self.disagg_prefill_inflight_queue) > 0:
                self.process_disagg_prefill_inflight_queue()
            if batch is None and len(self.disagg_prefill_inflight_queue) == 0:
                self.on_idle()
            self.last_batch = batch

    def get_next_disagg_prefill_batch_to_run(self):
        if not self.waiting_queue:
            return None
        return self.get_new_batch_prefill()

    def process_batch_result_disagg_prefill(self, batch, result):
        done_at = time.monotonic() + KV_SEND_S
        for req, tok in zip(batch.reqs, result):
            req.output_ids.append(tok)
            self.disagg_prefill_inflight_queue.append((req, done_at))
        self.report_prefill_stats(batch)
        self.maybe_publish_load(0.1)

    def process_disagg_prefill_inflight_queue(self):
        now = time.monotonic()
        polls = poll_and_all_reduce(
            [lambda t=t: KVPoll.Success if now >= t else KVPoll.Transferring
             for _, t in self.disagg_prefill_inflight_queue])
        outs, undone = [], []
        for (req, t), s in zip(self.disagg_prefill_inflight_queue, polls):
            if s == KVPoll.Success:
                self.disagg_prefill_bootstrap_queue.kv.sent(req.bootstrap_room)
                # The prefill engine's answer: one token, finished (the decode engine streams).
                outs.append({"rid": req.rid, "ids": req.output_ids[:1], "finished": True,
                             "reason": "length", "prompt_tokens": req.prompt_tokens,
                             "completion_tokens": 1})
                self.counters["generation_tokens"] += 1
            else:
                undone.append((req, t))
        self.disagg_prefill_inflight_queue = undone
        self._send_outputs(outs)
        self._flush_metrics()
