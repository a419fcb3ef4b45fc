"""Lab-only plumbing (no real SGLang counterpart): atomic state files.

* The fake NVML state file `$FAKE_NVML_DIR/gpu<N>` that the lab's fake libnvidia-ml.so reads.
  Format (one `key=value` per line): name, uuid, util.gpu, util.memory, mem.total, mem.used,
  power.mw, power.limit.mw, procs=<pid>:<usedBytes>:<smPct>:<memPct>,..., optional
  error.<nvmlFunctionName>=<code> (preserved from the existing file so tests can inject them).
* The scheduler's metrics and load snapshots, read by the HTTP process. Real SGLang uses
  prometheus multiprocess mmap files and a /dev/shm load snapshot; plain JSON files with the
  same freshness semantics are enough here.
"""

import json
import os
import time

DEFAULT_NVML_DIR = "/tmp/wedgewatch-lab/nvml"
GIB = 1 << 30
MEM_TOTAL = 150754820096  # H200: 143771 MiB
IDLE_POWER_MW = 70000
BUSY_POWER_MW = 450000
POWER_LIMIT_MW = 700000


def atomic_write(path, text):
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def nvml_dir():
    return os.environ.get("FAKE_NVML_DIR") or DEFAULT_NVML_DIR


def gpu_uuid(index):
    return f"GPU-{0x1ab0c0de + index:08x}-1ab0-4c1d-9e2f-{index:012x}"


def render_gpu(index, util, mem_util, mem_used, power_mw, procs, extra_lines=()):
    lines = [
        "name=NVIDIA H200",
        f"uuid={gpu_uuid(index)}",
        f"util.gpu={int(util)}",
        f"util.memory={int(mem_util)}",
        f"mem.total={MEM_TOTAL}",
        f"mem.used={int(mem_used)}",
        f"power.mw={int(power_mw)}",
        f"power.limit.mw={POWER_LIMIT_MW}",
        "procs=" + ",".join(f"{pid}:{used}:{sm}:{mem}" for pid, used, sm, mem in procs),
    ]
    lines.extend(extra_lines)
    return "\n".join(lines) + "\n"


class FakeGpu:
    """The fake GPU one scheduler owns; rewritten on busy/idle transitions only."""

    # What "loaded weights + static KV pool" occupy, like SGLang's --mem-fraction-static.
    USED = int(MEM_TOTAL * 0.88)

    def __init__(self, index, mirror_path=None):
        self.index = index
        self.path = os.path.join(nvml_dir(), f"gpu{index}")
        self.state = None
        # TP rank 0 of a TP > 1 engine also writes its state here; the other ranks follow it
        # (in a real engine every rank runs the same kernels at the same time).
        self.mirror_path = mirror_path

    def _preserved_lines(self):
        try:
            with open(self.path) as f:
                return [ln.rstrip("\n") for ln in f if ln.startswith("error.")]
        except OSError:
            return []

    def set(self, state):
        """state: 'idle' | 'busy' | 'spin' (collective spinning: util ~100 % at idle power)."""
        if state == self.state:
            return
        self.state = state
        if self.mirror_path:
            try:
                atomic_write(self.mirror_path, state)
            except OSError:
                pass
        pid = os.getpid()
        if state == "busy":
            util, mem_util, power, sm = 93 + pid % 5, 61, BUSY_POWER_MW + (pid % 7) * 1000, 90
        elif state == "spin":
            util, mem_util, power, sm = 99, 0, IDLE_POWER_MW + 2000, 99
        else:
            util, mem_util, power, sm = 0, 0, IDLE_POWER_MW, 0
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            atomic_write(
                self.path,
                render_gpu(
                    self.index, util, mem_util, self.USED, power,
                    [(pid, self.USED, sm, mem_util)], self._preserved_lines(),
                ),
            )
        except OSError:
            pass  # the lab must not die because the NVML dir vanished


class StateDir:
    """Where scheduler -> HTTP-process snapshots live ($SGLANG_LAB_STATE_DIR)."""

    def __init__(self, path):
        self.path = path

    def write_json(self, name, obj):
        try:
            atomic_write(os.path.join(self.path, name), json.dumps(obj))
        except OSError:
            pass

    def read_json(self, name):
        try:
            with open(os.path.join(self.path, name)) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None


def now():
    return time.time()
