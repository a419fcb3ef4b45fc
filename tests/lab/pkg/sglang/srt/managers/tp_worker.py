"""TpModelWorker (sglang/srt/managers/tp_worker.py)."""

import os

from sglang.srt.model_executor.model_runner import ModelRunner


class TpModelWorker:
    def __init__(self, server_args, scheduler):
        # Seconds per decode step ("GPU time" for one token of every running request).
        self.token_interval = float(os.environ.get("LAB_TOKEN_INTERVAL_S", "0.03"))
        self.model_runner = ModelRunner(self.token_interval, scheduler)

    def forward_batch_generation(self, batch):
        return self.model_runner.forward(batch)
