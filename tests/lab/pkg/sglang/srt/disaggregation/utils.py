"""PD helpers (sglang/srt/disaggregation/utils.py)."""

import os
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


class KvHandoff:
    """Lab-only: the KV cache of one request (its bootstrap room) handed from prefill to decode.

    Real SGLang moves the KV with Mooncake/NIXL and decode polls its KVReceiver; here the
    prefill engine marks a room done (a file in the shared `LAB_KV_DIR`, set by lab.py for a PD
    pair) and decode waits for that mark, so decode's request waits for its prefill like the
    real one: a request its prefill never ran (it answered an error) is never ready on decode.
    Without `LAB_KV_DIR` (or a room), KV is ready at once (the old lab behaviour)."""

    def __init__(self):
        self.dir = os.environ.get("LAB_KV_DIR") or None
        if self.dir:
            os.makedirs(self.dir, exist_ok=True)

    def _path(self, room):
        return os.path.join(self.dir, f"room-{room}")

    def _tracked(self, room):
        # One request's room is an int; a batch's list is not modelled (ready at once).
        return self.dir is not None and isinstance(room, int)

    def sent(self, room):
        """Prefill: the KV of `room` reached decode."""
        if not self._tracked(room):
            return
        with open(self._path(room), "w"):
            pass

    def arrived(self, room):
        """Decode: whether the KV of `room` is here (and forget the mark once it is)."""
        if not self._tracked(room):
            return True
        try:
            os.unlink(self._path(room))
            return True
        except FileNotFoundError:
            return False
