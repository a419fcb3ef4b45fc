"""The real-SGLang tier's fault hooks, on the PYTHONPATH of the decode server only
(`sglang_lab.py up` puts this directory there; the prefill and the router never see it).

Without the variables below in the environment it does nothing. Each patch is applied when
SGLang itself imports the module it patches (a meta path finder), so nothing of SGLang is
imported early; the processes SGLang spawns inherit the environment and this hook.

`LAB_SGLANG_FORGET_AFTER=N` (the "change since noon" on the decode server; its scheduler
processes inherit it): the scheduler's `Scheduler.handle_generate_request`
(sglang/srt/managers/scheduler.py) lets the first N requests through and silently drops every
later one (SGLang's own start-up warm-up request counts: N=2 lets it and one more through):
the HTTP server (tokenizer manager) has accepted the request and waits forever for
outputs that never come; the scheduler never queues it, so `sglang:num_running_reqs` and the
queues stay 0 and the scheduler idles. Health-check requests (rid `HEALTH_CHECK...`) always
pass, so `/health` and the router still call the decode healthy. With `--tp-size 2` every
rank sees the same requests in the same order, so all ranks drop the same ones.

`LAB_SGLANG_DETOKENIZER_GATE=PATH` (a stuck detokenizer, switched at run time): while the file
PATH exists, the detokenizer process (`sglang::detokenizer`) holds the next batch of token ids
it receives from the scheduler inside the real `DetokenizerManager.handle_batch_token_id_out`
(sglang/srt/managers/detokenizer_manager.py), before decoding it, until PATH is removed; then
it decodes that batch and every batch queued meanwhile, as usual. Its event loop is
single-threaded, so nothing reaches the HTTP server (tokenizer manager) meanwhile, health
checks included, while the scheduler keeps generating (its ZMQ PUSH socket has no high-water
mark). Without the file it only costs a stat per batch.
"""

import os
import sys
import time

_FORGET_VAR = "LAB_SGLANG_FORGET_AFTER"
_GATE_VAR = "LAB_SGLANG_DETOKENIZER_GATE"
_SCHEDULER = "sglang.srt.managers.scheduler"
_DETOKENIZER = "sglang.srt.managers.detokenizer_manager"


def _patch_scheduler(mod):
    import threading

    limit = int(os.environ[_FORGET_VAR])
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
            print(f"[lab-fault] {_FORGET_VAR}={limit}: request {n} ({rid}) forgotten",
                  file=sys.stderr, flush=True)
            return None
        return orig(self, recv_req, *args, **kwargs)

    handle_generate_request.__wrapped__ = orig
    cls.handle_generate_request = handle_generate_request


def _hold_while_gated(gate, what):
    """Returns once `gate` is gone (at once when it is not there)."""
    if not os.path.exists(gate):
        return
    print(f"[lab-fault] {_GATE_VAR}: detokenizer holds {what} while {gate} exists",
          file=sys.stderr, flush=True)
    t0 = time.time()
    while os.path.exists(gate):
        time.sleep(0.1)
    print(f"[lab-fault] {_GATE_VAR}: released after {time.time() - t0:.1f}s",
          file=sys.stderr, flush=True)


def _patch_detokenizer(mod):
    gate = os.environ[_GATE_VAR]
    cls = mod.DetokenizerManager
    orig = cls.handle_batch_token_id_out

    def handle_batch_token_id_out(self, recv_obj, *args, **kwargs):
        rids = list(getattr(recv_obj, "rids", None) or [])
        if rids:
            _hold_while_gated(gate, f"a batch of {len(rids)} request(s) {rids[:4]}")
        return orig(self, recv_obj, *args, **kwargs)

    handle_batch_token_id_out.__wrapped__ = orig
    cls.handle_batch_token_id_out = handle_batch_token_id_out


class _Finder:
    """Finds a patched module through the other finders and patches it once executed."""

    def __init__(self, patches):
        self.patches = patches

    def find_spec(self, name, path=None, target=None):
        patch = self.patches.get(name)
        if patch is None:
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
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


def _install():
    patches = {}
    val = os.environ.get(_FORGET_VAR)
    if val:
        try:
            int(val)
            patches[_SCHEDULER] = _patch_scheduler
        except ValueError:
            print(f"[lab-fault] ignoring {_FORGET_VAR}={val!r}: not an integer",
                  file=sys.stderr)
    if os.environ.get(_GATE_VAR):
        patches[_DETOKENIZER] = _patch_detokenizer
    for name in [n for n in patches if n in sys.modules]:
        patches.pop(name)(sys.modules[name])
    if patches:
        sys.meta_path.insert(0, _Finder(patches))


_install()
