"""PD helpers (sglang/srt/disaggregation/utils.py)."""

import time


class KVPoll:
    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


def poll_and_all_reduce(pollers, done=KVPoll.Success):
    """Poll every KV receiver/sender and MIN-reduce across TP ranks (gloo in real SGLang).

    While something is still transferring the lab waits a few ms here, so a scheduler polling
    a stuck queue shows this frame under pop_transferred / the inflight queue in py-spy."""
    polls = [p() for p in pollers]
    if any(s != done for s in polls):
        time.sleep(0.01)
    return polls
