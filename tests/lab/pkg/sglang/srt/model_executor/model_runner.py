"""ModelRunner (sglang/srt/model_executor/model_runner.py): a forward is wall time spent in
this frame, so py-spy sees `forward`/`_forward_raw` while a batch runs."""

import os
import time

from sglang.srt.distributed.parallel_state import get_tp_group


class ModelRunner:
    def __init__(self, token_interval, scheduler):
        self.token_interval = token_interval
        self.scheduler = scheduler
        # LAB_FAULT_DIVERGE_RANK implies the spin: the ranks that run a forward never leave
        # its all_reduce (the one rank that stays at the request broadcast never joins).
        self.spin_fault = (os.environ.get("LAB_FAULT_SPIN", "") not in ("", "0")
                           or os.environ.get("LAB_FAULT_DIVERGE_RANK", "") != "")
        self.step = 0

    def forward(self, batch):
        return self._forward_raw(batch)

    def _forward_raw(self, batch):
        if self.spin_fault:
            # LAB_FAULT_SPIN: a tensor-parallel all_reduce that never completes. The GPU
            # reads ~100 % utilisation at idle power (a spinning NCCL kernel).
            self.scheduler.gpu.set("spin")
            get_tp_group().all_reduce(None)
        if batch.forward_mode == "chunk":
            from sglang.srt.managers.scheduler import CHUNK_S

            self.replay(CHUNK_S)  # one chunk of a chunked prefill (controls' `prefill_s`)
        elif batch.forward_mode == "extend":
            tokens = sum(r.prompt_tokens for r in batch.reqs)
            self.replay(0.005 + tokens * 0.00002)
        else:
            self.replay(self.token_interval)
        out = []
        for r in batch.reqs:
            self.step += 1
            out.append((r.seq * 7 + len(r.output_ids) * 3 + self.step) % 26)
        return out

    def replay(self, seconds):
        """CUDA-graph replay stand-in."""
        time.sleep(seconds)
