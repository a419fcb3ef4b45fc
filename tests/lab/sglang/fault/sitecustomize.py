"""The real-SGLang tier's fault hook, on the PYTHONPATH of the decode server only
(`sglang_lab.py up` puts this directory there; the prefill and the router never see it).

Without `LAB_SGLANG_FORGET_AFTER` in the environment it does nothing. With
`LAB_SGLANG_FORGET_AFTER=N` (the "change since noon" on the decode server; its scheduler
processes inherit it), the scheduler's `Scheduler.handle_generate_request`
(sglang/srt/managers/scheduler.py) lets the first N requests through and silently drops every
later one (SGLang's own start-up warm-up request counts: N=2 lets it and one more through):
the HTTP server (tokenizer manager) has accepted the request and waits forever for
outputs that never come; the scheduler never queues it, so `sglang:num_running_reqs` and the
queues stay 0 and the scheduler idles. Health-check requests (rid `HEALTH_CHECK...`) always
pass, so `/health` and the router still call the decode healthy. With `--tp-size 2` every
rank sees the same requests in the same order, so all ranks drop the same ones.

The patch is applied when SGLang itself imports `sglang.srt.managers.scheduler` (a meta path
finder), so nothing of SGLang is imported early.
"""

import os
import sys

_VAR = "LAB_SGLANG_FORGET_AFTER"
_TARGET = "sglang.srt.managers.scheduler"


def _patch(mod):
    import threading

    limit = int(os.environ[_VAR])
    cls = mod.Scheduler
    orig = cls.handle_generate_request
    lock = threading.Lock()
    seen = [0]

    def handle_generate_request(self, recv_req, *args, **kwargs):
        rid = str(getattr(recv_req, "rid", ""))
        if rid.startswith("HEALTH_CHECK"):
            return orig(self, recv_req, *args, **kwargs)
        with lock:
            seen[0] += 1
            n = seen[0]
        if n > limit:
            print(f"[lab-fault] {_VAR}={limit}: request {n} ({rid}) forgotten",
                  file=sys.stderr, flush=True)
            return None
        return orig(self, recv_req, *args, **kwargs)

    handle_generate_request.__wrapped__ = orig
    cls.handle_generate_request = handle_generate_request


class _Finder:
    """Finds the scheduler module through the other finders and patches it once executed."""

    def find_spec(self, name, path=None, target=None):
        if name != _TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                break
        else:
            return None
        orig_exec = spec.loader.exec_module

        def exec_module(module):
            orig_exec(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


def _install():
    val = os.environ.get(_VAR)
    if not val:
        return
    try:
        int(val)
    except ValueError:
        print(f"[lab-fault] ignoring {_VAR}={val!r}: not an integer", file=sys.stderr)
        return
    if _TARGET in sys.modules:
        _patch(sys.modules[_TARGET])
    else:
        sys.meta_path.insert(0, _Finder())


_install()
