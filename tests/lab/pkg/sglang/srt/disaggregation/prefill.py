"""Prefill side of PD disaggregation (sglang/srt/disaggregation/prefill.py)."""

import time

from sglang.srt.disaggregation.utils import KVPoll, KvHandoff, poll_and_all_reduce

# A request without bootstrap information (sent to prefill directly, not by the router): its
# KV is taken as sent this long after its forward.
KV_SEND_S = 0.01


class PrefillBootstrapQueue:
    """Requests waiting for the decode side to connect (bootstrap handshake)."""

    def __init__(self, scheduler):
        self.scheduler = scheduler
        self.queue = []
        self.kv = KvHandoff()

    def add(self, req):
        self.queue.append(req)

    def pop_bootstrapped(self):
        """The requests whose decode side sent its TransferInfo (KVPoll.WaitingForInput);
        the others stay until it does."""
        manager = self.scheduler.kv_manager
        if not self.queue or manager is None:
            bootstrapped, self.queue = self.queue, []
            return bootstrapped

        def poll(req):
            ready = req.bootstrap_room is None or manager.bootstrapped(int(req.bootstrap_room))
            return KVPoll.WaitingForInput if ready else KVPoll.Bootstrapping

        polls = poll_and_all_reduce([lambda r=r: poll(r) for r in self.queue],
                                    done=KVPoll.WaitingForInput)
        bootstrapped = [r for r, s in zip(self.queue, polls) if s == KVPoll.WaitingForInput]
        self.queue = [r for r, s in zip(self.queue, polls) if s != KVPoll.WaitingForInput]
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
            if batch is None:
                self.gpu.set("idle")  # no kernels while it only polls its transfers
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
        manager = self.kv_manager
        for req, tok in zip(batch.reqs, result):
            req.output_ids.append(tok)
            if manager is not None and req.bootstrap_room is not None:
                manager.send(int(req.bootstrap_room))  # to the transfer worker
                self.disagg_prefill_inflight_queue.append((req, None))
            else:
                self.disagg_prefill_inflight_queue.append((req, done_at))
        self.report_prefill_stats(batch)
        self.maybe_publish_load(0.1)

    def process_disagg_prefill_inflight_queue(self):
        now = time.monotonic()
        manager = self.kv_manager

        def poll(req, t):
            ok = manager.poll_done(int(req.bootstrap_room)) if t is None else now >= t
            return KVPoll.Success if ok else KVPoll.Transferring

        polls = poll_and_all_reduce(
            [lambda r=r, t=t: poll(r, t) for r, t in self.disagg_prefill_inflight_queue])
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
