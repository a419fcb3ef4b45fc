"""Collective helpers (names as in sglang/srt/utils/common.py)."""

import time


def broadcast_pyobj(data, rank, src=0):
    """Non-zero TP ranks park here waiting for rank 0, like a gloo broadcast."""
    if rank != src:
        time.sleep(0.1)
    return data
