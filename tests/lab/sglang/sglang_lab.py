#!/usr/bin/env python3
"""The lab's real-SGLang tier: PyPI `sglang` 0.5.23 on the CPU, a real prefill/decode pair
(KV cache moved by Mooncake over TCP) behind the real `sglang-router`, on a tiny local model.

Standard library only; runs with the system python3. Subcommands:

  setup                      once (idempotent, markers make it a no-op afterwards):
                             tests/lab/.sglang-venv with torch 2.14.1 + sglang 0.5.23 (no deps;
                             its requirements filtered, see requirements.txt), the Mooncake
                             transfer engine, the router; Debian's libibverbs/libnl unpacked into
                             the venv; the `sgl_kernel` stand-in; the three CPU edits (each must
                             match exactly once); the model (../vllm/build_model.py). Prints the
                             seconds each step took. See ../../../docs/lab.md "Real SGLang tier".
  up --run-dir DIR [--decode-env K=V]... [--prefill-tp N] [--decode-tp N]
     [--prefill-context-length N]
                             start prefill and decode in parallel (own sessions, free ports),
                             wait for /health, then the router; one warm-up request through the
                             router; write and print DIR/sglang.json. With
                             --prefill-context-length the prefill refuses (HTTP 400) prompts
                             its smaller context cannot hold while decode accepts them.
  restart-decode --run-dir DIR [--decode-env K=V]...
                             stop the decode server and start it again on the same ports with
                             the given environment (the prefill and the router stay up)
  selftest-edits --dir DIR   `apply_edits` on made-up trees in DIR (no sglang needed): edited
                             once, then a no-op, and a missing or doubled text fails naming it
  down --run-dir DIR         SIGINT each recorded server, then SIGKILL its process group and
                             recorded children if still there; exits 1 if any remains
  chat --run-dir DIR [--max-tokens N] [--stream] [--timeout S] [--prompt-words N]
                             one chat completion through the router (status, bytes, seconds)

Faults (environment of the decode server only, read by fault/sitecustomize.py, which is on the
decode's PYTHONPATH and nobody else's):
  LAB_SGLANG_FORGET_AFTER=N  decode's scheduler takes the first N generate requests, then
                             silently drops every later one (health checks pass; SGLang's own
                             start-up warm-up and `restart-decode`'s warm-up count: N=2 forgets
                             every request after the restart)
  LAB_SGLANG_DETOKENIZER_GATE=PATH
                             while the file PATH exists, decode's detokenizer process holds the
                             next batch of token ids inside the real DetokenizerManager, before
                             decoding it; removing PATH lets it go on (a stuck detokenizer,
                             switched at run time without a restart)

All servers bind 127.0.0.1. Every wait is bounded. Nothing is ever killed by name.
"""

import argparse
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
LAB_DIR = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(LAB_DIR, "vllm"))
from vllm_lab import alive, cmdline, descendants, http_get, proc_stat  # noqa: E402

DEFAULT_VENV = os.path.join(LAB_DIR, ".sglang-venv")
VENV = os.environ.get("WEDGEWATCH_SGLANG_VENV") or DEFAULT_VENV
MODEL_DIR = os.path.join(VENV, "lab-model")
DEB_DIR = os.path.join(VENV, "debian-libs")
BUILD_MODEL = os.path.join(LAB_DIR, "vllm", "build_model.py")
SGLANG_VERSION = "0.5.23"
TORCH_PIN = "torch==2.14.1"
MODEL_NAME = "lab-tiny-llama"
FAULT_DIR = os.path.join(HERE, "fault")
FAULT_VARS = ["LAB_SGLANG_FORGET_AFTER", "LAB_SGLANG_DETOKENIZER_GATE"]
DEBIAN_PACKAGES = ["libibverbs1", "libnl-3-200", "libnl-route-3-200"]

# The three one-line edits SGLang 0.5.23 needs on a CPU (../../../docs/lab.md, "Real SGLang
# tier"): (name, file under sglang/, old text, new text). Each old text must be there exactly
# once (or the new one, already applied), else set-up fails naming the edit: a new release
# must be looked at, not patched blindly.
EDITS = [
    ("no pynccl on the CPU (else --tp-size 2: 'Expected a cuda device, but got: cpu')",
     "srt/distributed/parallel_state.py",
     'use_pynccl = not (_is_npu or _is_xpu or backend == "mooncake")',
     'use_pynccl = not (_is_npu or _is_xpu or _is_cpu or backend == "mooncake")'),
    ("no pinned host copy of CPU kv indices (else prefill: 'Found no NVIDIA driver')",
     "srt/disaggregation/prefill.py",
     'if getattr(sender, "supports_host_tensor_indices", False) and not (',
     'if getattr(sender, "supports_host_tensor_indices", False) and '
     'kv_indices.device.type != "cpu" and not ('),
    ("no CUDA event without CUDA (else prefill: 'expected stream to be a torch.Stream')",
     "srt/disaggregation/prefill.py",
     "        if self.enable_overlap:\n            ev = torch.cuda.Event()",
     "        if self.enable_overlap and torch.cuda.is_available():\n"
     "            ev = torch.cuda.Event()"),
]


class LabError(Exception):
    pass


def log(msg):
    print(f"[sglang-lab] {msg}", file=sys.stderr, flush=True)


def vpy():
    return os.path.join(VENV, "bin", "python")


def file_digest(*paths):
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            h.update(os.path.basename(p).encode() + b"\0" + f.read())
    return h.hexdigest()[:16]


def tree_digest(root):
    files = sorted(os.path.join(d, n) for d, _, ns in os.walk(root) for n in ns
                   if not n.endswith(".pyc"))
    return file_digest(*files)


def site_packages():
    out = subprocess.run([vpy(), "-c", "import sysconfig;print(sysconfig.get_paths()['purelib'])"],
                         check=True, capture_output=True, text=True, timeout=60)
    return out.stdout.strip()


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


# ------------------------------------------------------------------------------------ setup
def setup():
    os.makedirs(VENV, exist_ok=True)
    with open(os.path.join(VENV, ".setup.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _setup_locked()


def _pip(*args, timeout=2400):
    cmd = [vpy(), "-m", "pip", "install", "-q", "--disable-pip-version-check",
           "--progress-bar", "off", *args]
    log(" ".join(cmd[3:]))
    r = subprocess.run(cmd, timeout=timeout)
    if r.returncode != 0:
        raise LabError(f"pip install failed ({r.returncode}); see output above")


def _install():
    _pip(TORCH_PIN, "-r", os.path.join(HERE, "requirements.txt"),
         "-c", os.path.join(HERE, "constraints.txt"))
    _pip("--no-deps", f"sglang=={SGLANG_VERSION}")


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


def _setup_deps(times):
    key = (file_digest(os.path.join(HERE, "requirements.txt"),
                       os.path.join(HERE, "constraints.txt")) + f" sglang=={SGLANG_VERSION}")
    marker = os.path.join(VENV, "lab-deps.txt")
    if _read(marker) == key:
        return key
    t0 = time.time()
    if not os.path.exists(vpy()):
        log(f"creating venv {VENV}")
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True, timeout=300)
    try:
        _install()
    except LabError as e:
        # A half-done install (a run interrupted) can leave distributions pip cannot read:
        # start once from empty, but only in the lab's own venv.
        if VENV != DEFAULT_VENV:
            raise LabError(f"{e}; if {VENV} holds a half-done install, remove it") from e
        log(f"{e}; emptying {VENV} and installing once more")
        _empty_venv()
        _install()
    times["install_s"] = round(time.time() - t0, 1)
    _write(marker, key)
    return key


def _system_has(soname):
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return soname in out.stdout


def _setup_debian_libs(times):
    """Mooncake's engine.so links libibverbs.so.1 even for TCP: Debian's packages, unpacked
    into the venv (no root, the system untouched) unless the system has them."""
    marker = os.path.join(DEB_DIR, "lab-debs.txt")
    key = " ".join(DEBIAN_PACKAGES)
    if _system_has("libibverbs.so.1") or _read(marker) == key:
        return
    t0 = time.time()
    shutil.rmtree(DEB_DIR, ignore_errors=True)
    dl = os.path.join(DEB_DIR, "debs")
    os.makedirs(dl)
    r = subprocess.run(["apt-get", "download", *DEBIAN_PACKAGES], cwd=dl, timeout=300)
    if r.returncode != 0:
        raise LabError(f"apt-get download {' '.join(DEBIAN_PACKAGES)} failed; install them "
                       "(apt-get install) or make apt-get download work")
    for deb in sorted(os.listdir(dl)):
        subprocess.run(["dpkg-deb", "-x", os.path.join(dl, deb), DEB_DIR], check=True,
                       timeout=120)
    shutil.rmtree(dl)
    _write(marker, key)
    times["debian_libs_s"] = round(time.time() - t0, 1)


def lib_path():
    """The folders with the unpacked Debian libraries (libnl-3 is under /lib, the others under
    /usr/lib), joined for LD_LIBRARY_PATH; None when the system has them."""
    dirs = [os.path.join(DEB_DIR, top, "lib", "x86_64-linux-gnu") for top in ("usr", "")]
    dirs = [os.path.normpath(d) for d in dirs if os.path.isdir(d)]
    return ":".join(dirs) or None


def _setup_standin(sp):
    """The `sgl_kernel` stand-in as a package of site-packages (see its docstring)."""
    src = os.path.join(HERE, "sgl_kernel_standin")
    dst = os.path.join(sp, "sgl_kernel")
    if os.path.isdir(dst) and not os.path.islink(dst) and tree_digest(dst) == tree_digest(src):
        return
    if os.path.islink(dst):
        os.remove(dst)
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))


def apply_edits(pkg_dir):
    """Applies EDITS to the installed sglang package; each must match exactly once (or be
    applied already). Returns the names of the edits made now."""
    made = []
    for name, rel, old, new in EDITS:
        path = os.path.join(pkg_dir, rel)
        text = _read(path)
        if text is None:
            raise LabError(f"edit '{name}': {path} is missing")
        n_old, n_new = text.count(old), text.count(new)
        if n_new == 1 and n_old == 0:
            continue
        if n_old != 1 or n_new != 0:
            raise LabError(f"edit '{name}' does not match exactly once in {path} "
                           f"(old text {n_old} times, edited text {n_new} times): a new "
                           f"sglang release? look at the file and the recipe")
        _write(path, text.replace(old, new))
        made.append(name)
    return made


def _setup_locked():
    times = {}
    deps_key = _setup_deps(times)
    _setup_debian_libs(times)
    sp = site_packages()
    _setup_standin(sp)
    made = apply_edits(os.path.join(sp, "sglang"))
    if made:
        log(f"edits applied: {made}")
    model_key = file_digest(BUILD_MODEL) + " " + deps_key
    model_marker = os.path.join(MODEL_DIR, "lab-model-key.txt")
    if _read(model_marker) != model_key:
        t0 = time.time()
        shutil.rmtree(MODEL_DIR, ignore_errors=True)
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        log(f"building the model in {MODEL_DIR}")
        r = subprocess.run([vpy(), BUILD_MODEL, MODEL_DIR], env=env, timeout=600)
        if r.returncode != 0:
            raise LabError("building the model failed; see output above")
        _write(model_marker, model_key)
        times["model_s"] = round(time.time() - t0, 1)
    return times


def selftest_edits(root):
    """Checks `apply_edits` on made-up package trees under `root` (no sglang needed): a tree
    with each old text once is edited, a second pass changes nothing, and a tree where an
    edit's text is missing or twice there fails naming that edit. Returns a JSON-able report."""
    files = {}
    for _, rel, old, _ in EDITS:
        files.setdefault(rel, []).append(old)
    def tree(name, mutate=None):
        pkg = os.path.join(root, name)
        for rel, olds in files.items():
            os.makedirs(os.path.dirname(os.path.join(pkg, rel)), exist_ok=True)
            text = "# head\n" + "\n# between\n".join(olds) + "\n# tail\n"
            _write(os.path.join(pkg, rel), mutate(rel, text) if mutate else text)
        return pkg
    report = {}
    pkg = tree("pristine")
    report["first_pass"] = apply_edits(pkg)
    report["second_pass"] = apply_edits(pkg)
    report["broken"] = []
    for i, (name, rel0, old0, _) in enumerate(EDITS):
        errors = {"edit": name}
        for case, how in (("twice", lambda t, o: t + o + "\n"),
                          ("missing", lambda t, o: t.replace(o, ""))):
            pkg = tree(f"{case}-{i}",
                       lambda rel, text: how(text, old0) if rel == rel0 else text)
            try:
                apply_edits(pkg)
                errors[case] = None
            except LabError as e:
                errors[case] = str(e)
        report["broken"].append(errors)
    return report


# ------------------------------------------------------------------------------------ up/down
SERVER_NICE = 10


def free_ports(n):
    """n distinct free loopback ports (all held open while picking, so no two coincide)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def server_env(extra, tp):
    env = dict(os.environ)
    for k in FAULT_VARS:
        env.pop(k, None)
    cpus = sorted(os.sched_getaffinity(0))
    bind = "|".join(str(c) for c in cpus[:tp]) if tp > 1 and len(cpus) >= tp else "all"
    env.update({
        "SGLANG_USE_CPU_ENGINE": "1",
        "SGLANG_CPU_OMP_THREADS_BIND": bind,
        "CUDA_VISIBLE_DEVICES": "",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_ENDPOINT": "http://127.0.0.1:9",
        "MC_FORCE_TCP": "1",
        "MOONCAKE_PROTOCOL": "tcp",
        "DO_NOT_TRACK": "1",
        "PYTHONUNBUFFERED": "1",
    })
    libs = lib_path()
    if libs:
        env["LD_LIBRARY_PATH"] = libs + (":" + env["LD_LIBRARY_PATH"]
                                         if env.get("LD_LIBRARY_PATH") else "")
    env.update(extra)
    return env


def engine_cmd(port, nccl_port, tp, mode, bootstrap_port=None, context_length=None):
    cmd = [vpy(), "-m", "sglang.launch_server", "--model-path", MODEL_DIR,
           "--served-model-name", MODEL_NAME, "--device", "cpu", "--host", "127.0.0.1",
           "--port", str(port), "--nccl-port", str(nccl_port), "--enable-metrics",
           "--max-total-tokens", "8192", "--max-running-requests", "8", "--tp-size", str(tp),
           "--disaggregation-mode", mode, "--disaggregation-transfer-backend", "mooncake_tcp"]
    if context_length:
        cmd += ["--context-length", str(context_length)]
    if mode == "prefill":
        cmd += ["--disaggregation-bootstrap-port", str(bootstrap_port)]
    else:
        cmd += ["--disaggregation-decode-retraction-backup", "cpu_tensor"]
    return cmd


def router_cmd(ports):
    # Health checks every 5 s (default 60): a restarted decode is taken back within seconds,
    # not after two minutes.
    return [vpy(), "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
            "--port", str(ports["router"]), "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(ports["router_metrics"]),
            "--health-check-interval-secs", "5", "--pd-disaggregation",
            "--prefill", f"http://127.0.0.1:{ports['prefill']}", str(ports["bootstrap"]),
            "--decode", f"http://127.0.0.1:{ports['decode']}"]


def _spawn(run_dir, name, cmd, env):
    logp = os.path.join(run_dir, "logs", f"{name}.log")
    with open(logp, "ab") as lf:
        proc = subprocess.Popen(cmd, env=env, stdout=lf, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, cwd=run_dir,
                                preexec_fn=lambda: os.nice(SERVER_NICE))
    st = proc_stat(proc.pid)
    return proc, {"pid": proc.pid, "pgid": proc.pid, "start_time": st[3] if st else None,
                  "cmd": cmd, "log": logp, "children": []}


def _record_children(info):
    kids = []
    for c in descendants(info["pid"]):
        st = proc_stat(c)
        kids.append({"pid": c, "cmdline": cmdline(c), "start_time": st[3] if st else None})
    info["children"] = kids


def _tail(path, n=40):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def _wait_healthy(procs, infos, deadline):
    """Waits until every named server answers /health 200; raises naming the first that
    exits or the ones still not healthy at the deadline."""
    pending = set(procs)
    while pending and time.time() < deadline:
        for name in sorted(pending):
            p = procs[name]
            if p.poll() is not None:
                raise LabError(f"{name} exited with {p.returncode} during start-up; tail of "
                               f"{infos[name]['log']}:\n{_tail(infos[name]['log'])}")
            code, _ = http_get(f"{infos[name]['url']}/health", 1.0)
            if code == 200:
                infos[name]["healthy_after_s"] = round(time.time() - infos[name]["t0"], 1)
                pending.discard(name)
        time.sleep(0.5)
    if pending:
        name = sorted(pending)[0]
        raise LabError(f"{sorted(pending)} not healthy in time; tail of {infos[name]['log']}:"
                       f"\n{_tail(infos[name]['log'])}")


def up(run_dir, decode_env, prefill_tp=1, decode_tp=2, timeout=480.0,
       prefill_context_length=None):
    os.makedirs(os.path.join(run_dir, "logs"), exist_ok=True)
    path = os.path.join(run_dir, "sglang.json")
    names = ["prefill", "bootstrap", "decode", "router", "router_metrics", "nccl_prefill",
             "nccl_decode"]
    ports = dict(zip(names, free_ports(len(names))))
    t0 = time.time()
    state = {"version": 1, "ports": ports, "model": MODEL_NAME, "model_path": MODEL_DIR,
             "venv": VENV, "run_dir": run_dir, "decode_env": dict(decode_env),
             "prefill_context_length": prefill_context_length,
             "url": f"http://127.0.0.1:{ports['router']}", "servers": {}}
    procs, infos = {}, state["servers"]
    specs = [("prefill", engine_cmd(ports["prefill"], ports["nccl_prefill"], prefill_tp,
                                    "prefill", ports["bootstrap"], prefill_context_length),
              server_env({}, prefill_tp),
              ports["prefill"], prefill_tp),
             _decode_spec(ports, decode_env, decode_tp)]
    try:
        for name, cmd, env, port, tp in specs:
            procs[name], infos[name] = _spawn(run_dir, name, cmd, env)
            infos[name].update(port=port, url=f"http://127.0.0.1:{port}", tp=tp, t0=time.time())
        infos["prefill"]["bootstrap_port"] = ports["bootstrap"]
        _write(path, json.dumps(state, indent=1))  # so `down` can clean up a failed start
        _wait_healthy(procs, infos, t0 + timeout)
        procs["router"], infos["router"] = _spawn(run_dir, "router", router_cmd(ports),
                                                  server_env({}, 1))
        infos["router"].update(port=ports["router"], url=state["url"], t0=time.time(),
                               metrics_port=ports["router_metrics"])
        _write(path, json.dumps(state, indent=1))
        _wait_healthy({"router": procs["router"]}, infos, time.time() + 120)
        # Warm-up through the router (the router may take a moment to see its workers).
        _warm_up(state, deadline=time.time() + 180)
    except (LabError, OSError, urllib.error.URLError) as e:
        left = _down_state(state)
        raise LabError(f"{e}" + (f"\nstill alive after cleanup: {left}" if left else "")) from e
    for name, info in infos.items():
        _record_children(info)
        info.pop("t0", None)
    state["up_seconds"] = round(time.time() - t0, 1)
    _write(path, json.dumps(state, indent=1))
    return state


def _decode_spec(ports, decode_env, tp):
    """(name, cmd, env, port, tp) of the decode server: the fault hook's directory on its
    PYTHONPATH (and nobody else's), inert unless a fault variable is set."""
    env = server_env(decode_env, tp)
    env["PYTHONPATH"] = FAULT_DIR + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return ("decode", engine_cmd(ports["decode"], ports["nccl_decode"], tp, "decode"), env,
            ports["decode"], tp)


def restart_decode(run_dir, decode_env, timeout=480.0):
    """Stops the recorded decode server and starts it again on the same ports with
    `decode_env` (the change since noon); the prefill and the router stay up. Waits for
    /health and for one request through the router (the router sees it healthy again)."""
    path = os.path.join(run_dir, "sglang.json")
    state = json.loads(_read(path) or "{}")
    old = state["servers"]["decode"]
    left = _down_state({"servers": {"decode": old}})
    if left:
        raise LabError(f"the old decode server is still alive: {left}")
    name, cmd, env, port, tp = _decode_spec(state["ports"], decode_env, old.get("tp", 2))
    t0 = time.time()
    proc, info = _spawn(run_dir, name, cmd, env)
    info.update(port=port, url=f"http://127.0.0.1:{port}", tp=tp, t0=t0)
    state["servers"]["decode"] = info
    state["decode_env"] = dict(decode_env)
    _write(path, json.dumps(state, indent=1))
    try:
        _wait_healthy({"decode": proc}, state["servers"], t0 + timeout)
        # The router takes the restarted decode back after two good health checks.
        _warm_up(state, deadline=time.time() + 300)
    except (LabError, OSError) as e:
        left = _down_state({"servers": {"decode": info}})
        raise LabError(f"{e}" + (f"\nstill alive after cleanup: {left}" if left else "")) from e
    _record_children(info)
    info.pop("t0", None)
    state["restart_seconds"] = round(time.time() - t0, 1)
    _write(path, json.dumps(state, indent=1))
    return state


def _warm_up(state, deadline):
    last = None
    while time.time() < deadline:
        try:
            got = chat(state, max_tokens=2, timeout=60)
            if got["status"] == 200:
                return got
            last = got
        except (OSError, urllib.error.URLError) as e:
            last = e
        time.sleep(2)
    raise LabError(f"the warm-up request through the router failed: {last}")


def _interrupt(info):
    """SIGINT the server (SGLang's clean stop); its pid, start time and the members of its
    tree (recorded and live) for the SIGKILL that follows if they outlive the grace."""
    pid, start = info["pid"], info.get("start_time")
    members = [(k["pid"], k.get("start_time")) for k in info.get("children", [])]
    if alive(pid, start):
        members += [(c, proc_stat(c)[3] if proc_stat(c) else None) for c in descendants(pid)]
        try:
            os.kill(pid, signal.SIGINT)
        except ProcessLookupError:
            pass
    return pid, start, members


def _down_state(state, grace=8.0):
    """Stops every server of the state in parallel; the pids still alive afterwards."""
    servers = list(state.get("servers", {}).values())
    groups = [_interrupt(info) for info in servers]
    end = time.time() + grace
    while time.time() < end and any(alive(p, s) for p, s, _ in groups):
        time.sleep(0.1)
    for info in servers:
        try:
            os.killpg(info["pgid"], signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    everyone = [(p, s) for p, s, ms in groups for (p, s) in [(p, s)] + ms]
    for c, st in everyone:
        if alive(c, st):
            try:
                os.kill(c, signal.SIGKILL)
            except ProcessLookupError:
                pass
    end = time.time() + 5
    while time.time() < end:
        left = [p for p, st in everyone if alive(p, st)]
        if not left:
            return []
        time.sleep(0.1)
    return left


def down(run_dir):
    state = json.loads(_read(os.path.join(run_dir, "sglang.json")) or "{}")
    return _down_state(state)


def chat(state, max_tokens=16, stream=False, timeout=60.0, prompt="hello engine please answer"):
    """One chat completion through the router: status, bytes and seconds (an HTTP error
    status too, with its body's first bytes)."""
    body = json.dumps({"model": state["model"], "max_tokens": max_tokens, "ignore_eos": True,
                       "stream": stream, "temperature": 0,
                       "messages": [{"role": "user", "content": prompt}]}).encode()
    req = urllib.request.Request(f"{state['url']}/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    t0 = time.time()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            data = r.read()
            return {"status": r.status, "bytes": len(data),
                    "seconds": round(time.time() - t0, 3)}
    except urllib.error.HTTPError as e:
        data = e.read()
        return {"status": e.code, "bytes": len(data), "seconds": round(time.time() - t0, 3),
                "body": data[:300].decode(errors="replace")}


# ------------------------------------------------------------------------------------ cli
def _env_pairs(items):
    out = {}
    for kv in items:
        if "=" not in kv or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", kv):
            raise LabError(f"--decode-env {kv!r}: expected NAME=VALUE")
        k, v = kv.split("=", 1)
        out[k] = v
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("setup")
    e = sub.add_parser("selftest-edits")
    e.add_argument("--dir", required=True)
    u = sub.add_parser("up")
    u.add_argument("--run-dir", required=True)
    u.add_argument("--decode-env", action="append", default=[])
    u.add_argument("--prefill-tp", type=int, default=1)
    u.add_argument("--decode-tp", type=int, default=2)
    u.add_argument("--timeout", type=float, default=480.0)
    u.add_argument("--prefill-context-length", type=int, default=None)
    r = sub.add_parser("restart-decode")
    r.add_argument("--run-dir", required=True)
    r.add_argument("--decode-env", action="append", default=[])
    r.add_argument("--timeout", type=float, default=480.0)
    d = sub.add_parser("down")
    d.add_argument("--run-dir", required=True)
    c = sub.add_parser("chat")
    c.add_argument("--run-dir", required=True)
    c.add_argument("--max-tokens", type=int, default=16)
    c.add_argument("--stream", action="store_true")
    c.add_argument("--timeout", type=float, default=60.0)
    c.add_argument("--prompt-words", type=int, default=0,
                   help="a prompt of this many words instead of the short default")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "setup":
            t0 = time.time()
            times = setup()
            times["total_s"] = round(time.time() - t0, 1)
            print(json.dumps(times))
        elif a.cmd == "selftest-edits":
            print(json.dumps(selftest_edits(os.path.abspath(a.dir))))
        elif a.cmd == "up":
            env = _env_pairs(a.decode_env)
            setup()
            st = up(os.path.abspath(a.run_dir), env, a.prefill_tp, a.decode_tp, a.timeout,
                    a.prefill_context_length)
            print(json.dumps(st, indent=1))
        elif a.cmd == "restart-decode":
            st = restart_decode(os.path.abspath(a.run_dir), _env_pairs(a.decode_env),
                                a.timeout)
            print(json.dumps(st, indent=1))
        elif a.cmd == "down":
            left = down(os.path.abspath(a.run_dir))
            if left:
                log(f"still alive: {left}")
                return 1
        elif a.cmd == "chat":
            state = json.loads(_read(os.path.join(a.run_dir, "sglang.json")) or "{}")
            kw = {"prompt": " ".join(["w"] * a.prompt_words)} if a.prompt_words else {}
            print(json.dumps(chat(state, a.max_tokens, a.stream, a.timeout, **kw)))
    except LabError as e:
        log(f"error: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
