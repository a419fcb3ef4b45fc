"""The real-vLLM tier's fault hook, imported at every interpreter start in the tier's venv
(`lab_vllm_fault.pth` in site-packages; `vllm_lab.py setup` installs both).

Without `LAB_VLLM_FORGET_AFTER` in the environment it does nothing. With
`LAB_VLLM_FORGET_AFTER=N` (on `vllm serve`; the engine core inherits it), the engine core's
`EngineCore.add_request` (vllm/v1/engine/core.py) lets the first N requests through and silently
drops every later one: the API server has already answered `200` (a stream: event-stream
headers, ~160 bytes) and waits forever for outputs that never come. The scheduler never sees
the request, so `vllm:num_requests_running`/`waiting` stay 0 and the engine's threads idle.

The patch is applied when vLLM itself imports `vllm.v1.engine.core` (a meta path finder), so
nothing of vLLM is imported early and other programs in the venv (pip, the model build) are
untouched.
"""

import os
import sys

_VAR = "LAB_VLLM_FORGET_AFTER"
_TARGET = "vllm.v1.engine.core"


def _patch(mod):
    import threading

    limit = int(os.environ[_VAR])
    cls = mod.EngineCore
    orig = cls.add_request
    lock = threading.Lock()
    seen = [0]

    def add_request(self, request, *args, **kwargs):
        with lock:
            seen[0] += 1
            n = seen[0]
        if n > limit:
            print(f"[lab-fault] {_VAR}={limit}: request {n} ({request.request_id}) forgotten",
                  file=sys.stderr, flush=True)
            return None
        return orig(self, request, *args, **kwargs)

    add_request.__wrapped__ = orig
    cls.add_request = add_request


class _Finder:
    """Finds `vllm.v1.engine.core` through the other finders and patches it once executed."""

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
        loader = spec.loader
        orig_exec = loader.exec_module

        def exec_module(module):
            orig_exec(module)
            _patch(module)

        loader.exec_module = exec_module
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
