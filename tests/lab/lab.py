#!/usr/bin/env python3
"""The wedgewatch lab: an SGLang-shaped inference stack for tests and demos.

    proxy (tests/lab/proxy.py)  ->  real sglang router (PyPI sglang-router==0.3.2)
        ->  prefill engine + decode engine (PD)   or   one engine (regular)
    engines = `python -m sglang.launch_server` from tests/lab/pkg (HTTP process +
              sglang::scheduler + sglang::detokenizer children, one fake GPU per scheduler)

Standard library only; runs with the system python3. Subcommands:

  setup                                   create tests/lab/.venv and pip install the pins
  up --run-dir DIR [--mode pd|regular] [--base-port N] [--token-interval S] [--tp-size N]
     [--decode-env K=V]... [--prefill-env K=V]... [--engine-env K=V]...
     [--router-env K=V]... [--proxy-env K=V]... [--router-arg ARG]... [--controls]
     [--router-api-key KEY]               (the router then answers /workers and inference
                                          only with `Authorization: Bearer KEY`; the lab's
                                          own probes send it, `load` does not)
                                          start everything, wait for readiness, write and
                                          print DIR/lab.json
  up --netns --run-dir DIR [--base-port N]
                                          containers on one host: two pods (own net + PID
                                          namespace, docker-like cgroup) with an engine each
                                          on one port, a router in pod-a, a decoy on the
                                          host's 127.0.0.1 at that port (netns_lab.py; root)
  up --two-node --run-dir DIR [--fault FAULT] [--decode-env K=V]... (and the other --*-env)
                                          two "machines" joined by a veth pair: proxy and
                                          router on node a (10.77.0.1), prefill and decode
                                          on node b (10.77.0.2), each node its own net + PID
                                          + mount namespace (two_node_lab.py; root)
  exec --run-dir DIR NODE -- CMD...       (two-node) run CMD inside node a or b
  controls --run-dir DIR [--only NAME,...]
                                          (a lab `up --controls`) the slow-but-healthy
                                          requests that must raise no finding, all at once
                                          (controls.py; CONTROLS below); prints their JSON
  load --run-dir DIR --agents N --rounds R [--timeout S] [--max-tokens M] [--total-timeout T]
       [--duration S [--think S] [--progress S]]
                                          run harness.py against the proxy, print its JSON
                                          (--duration: steady mode, e.g. 200 streams for S s)
  restart --run-dir DIR COMPONENT [--env K=V]... [--unset K]...
                                          stop one component (by recorded pid/process group)
                                          and start it again with changed env
  inject --run-dir DIR FAULT              restart the component a named fault lives on with
                                          the fault's env (see FAULTS below; `clear` undoes)
  status --run-dir DIR                    liveness and health of every component (JSON)
  down --run-dir DIR                      stop everything this lab started (recorded pids
                                          and their process groups only), verify it is gone

All servers bind 127.0.0.1. Every wait is bounded. Nothing is ever killed by name.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

LAB_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(LAB_DIR))
VENV = os.environ.get("WEDGEWATCH_LAB_VENV") or os.path.join(LAB_DIR, ".venv")
PKG = os.path.join(LAB_DIR, "pkg")
PINS = ["sglang-router==0.3.2", "aiohttp==3.14.5", "setproctitle==1.3.8", "py-spy==0.4.3"]
DEFAULT_SPLIT_TOKENS = "100"  # agents (harness.py) hang after 1-3 rounds with this

# fault name -> (component in PD mode, component in regular mode, env to set)
FAULTS = {
    "accepted-and-forgotten": ("decode", None, {"SGLANG_DECODE_PREALLOC_SPLIT_TOKENS": DEFAULT_SPLIT_TOKENS}),
    "stalled-stream": ("decode", "engine", {"LAB_FAULT_STALL_AFTER_TOKENS": "5"}),
    "busy-without-progress": ("decode", "engine", {"LAB_FAULT_SPIN": "1"}),
    "queue-not-draining": ("decode", None, {"LAB_FAULT_TRANSFER_STUCK_AFTER": "0"}),
    # Prefill's KV transfer worker stops mid-slice for good (a hung Mooncake TCP transfer):
    # decode's receiver waits for the rest forever, both requests' legs wait.
    "kv-transfer-stalled": ("prefill", None, {"LAB_FAULT_KV_SEND_STALL_AFTER": "0"}),
    "endpoint-unresponsive": ("decode", "engine", {"LAB_FAULT_HANG_METRICS": "1"}),
    # With --tp-size > 1: every rank but TP1 enters the forward's all_reduce, TP1 stays at
    # the request broadcast.
    "ranks-diverged": ("decode", "engine", {"LAB_FAULT_DIVERGE_RANK": "1"}),
    # Prefill answers prompts over 100 tokens with a 500 at once; their decode leg waits for
    # KV that never comes (smg issue 831), and the router waits for decode.
    "prefill-5xx": ("prefill", None, {"LAB_FAULT_ERROR_ABOVE_TOKENS": DEFAULT_SPLIT_TOKENS,
                                      "LAB_FAULT_ERROR_STATUS": "500"}),
    # The detokenizer hangs on its first batch: tokens are generated, none reaches the HTTP
    # server (the scheduler keeps going: its output queue is unbounded, as ZMQ's is).
    "detokenizer-stuck": ("decode", "engine", {"LAB_FAULT_DETOKENIZER_STUCK_AFTER": "0"}),
    "accumulating-state": ("proxy", "proxy", {"LAB_PROXY_LEAK": "1"}),
    # Upstream sockets left in CLOSE_WAIT; 24 leaks (above the one-shot detector's 20 by
    # default) before the proxy stops forwarding.
    "close-wait-leak": ("proxy", "proxy", {"LAB_PROXY_LEAK": "close_wait",
                                           "LAB_PROXY_LEAK_LIMIT": "24"}),
}
# `up --controls`: the engines honour prompt directives (`[lab:prefill_s=S]`,
# `[lab:first_token_s=S]`) and run at most CONTROLS_MAX_RUNNING requests (the rest queue);
# the router admits at most CONTROLS_ROUTER_CONCURRENT at once and queues the rest.
# The router's admission is a token bucket (sglang-router 0.3.2: capacity
# --max-concurrent-requests, refilled every second by --rate-limit-tokens-per-second, its
# default); a request finding it empty waits in the router's queue for the next refill (about
# a second, measured; then 408).
CONTROLS_MAX_RUNNING = 8
CONTROLS_ROUTER_CONCURRENT = 30
CONTROLS_ENV = {"LAB_CONTROLS": "1", "LAB_MAX_RUNNING_REQUESTS": str(CONTROLS_MAX_RUNNING)}
CONTROLS_ROUTER_ARGS = ["--max-concurrent-requests", str(CONTROLS_ROUTER_CONCURRENT),
                        "--queue-size", "100"]
FAULT_VARS = ["SGLANG_DECODE_PREALLOC_SPLIT_TOKENS", "LAB_FAULT_STALL_AFTER_TOKENS",
              "LAB_FAULT_SPIN", "LAB_FAULT_DIVERGE_RANK", "LAB_FAULT_TRANSFER_STUCK_AFTER",
              "LAB_FAULT_HANG_METRICS",
              "LAB_FAULT_HANG_SERVER_INFO", "LAB_PROXY_LEAK", "LAB_PROXY_LEAK_LIMIT",
              "LAB_FAULT_ERROR_ABOVE_TOKENS", "LAB_FAULT_ERROR_STATUS",
              "LAB_FAULT_DETOKENIZER_STUCK_AFTER", "LAB_FAULT_KV_SEND_STALL_AFTER"]


class LabError(Exception):
    pass


def log(msg):
    print(f"[lab] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------ setup
def venv_python():
    return os.path.join(VENV, "bin", "python")


def setup(quiet=False):
    # Parallel test threads may all call setup on a fresh checkout: serialise on a lock.
    import fcntl

    os.makedirs(VENV, exist_ok=True)
    with open(os.path.join(VENV, ".lab-setup.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _setup_locked(quiet)


def _setup_locked(quiet):
    marker = os.path.join(VENV, "lab-pins.txt")
    want = "\n".join(PINS) + "\n"
    try:
        with open(marker) as f:
            if f.read() == want and os.path.exists(os.path.join(VENV, "bin", "py-spy")):
                return
    except OSError:
        pass
    t0 = time.time()
    if not os.path.exists(venv_python()):  # (the directory may exist: it holds the lock)
        log(f"creating venv {VENV}")
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True, timeout=120)
    log(f"pip install {' '.join(PINS)}")
    r = subprocess.run([venv_python(), "-m", "pip", "install", "-q",
                        "--disable-pip-version-check", *PINS], timeout=600)
    if r.returncode != 0:
        raise LabError("pip install failed (see output above)")
    with open(marker, "w") as f:
        f.write(want)
    if not quiet:
        log(f"venv ready in {time.time() - t0:.1f}s")


# ------------------------------------------------------------------------------------ procs
def proc_stat(pid):
    """(state, ppid, pgrp, starttime) or None."""
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


def children_of(pid):
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(x) for x in f.read().split())
    except OSError:
        pass
    return out


def group_members(pgid):
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = proc_stat(int(d))
            if st and st[2] == pgid and st[0] not in ("Z", "X"):
                pids.append(int(d))
    return pids


def ephemeral_range():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
            return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def free_ports(n):
    """n distinct ports that are free now, chosen at random *below* the ephemeral range so
    that outgoing connections (which take ephemeral local ports) cannot grab them between
    now and the moment our servers bind. A remaining race with another lab starting at the
    same moment is handled by `up` retrying on EADDRINUSE."""
    import random

    lo_eph, _ = ephemeral_range()
    lo, hi = (20000, lo_eph - 1) if lo_eph > 21000 else (lo_eph, 60999)
    rng = random.SystemRandom()
    ports = []
    for _ in range(2000):
        if len(ports) == n:
            break
        port = rng.randrange(lo, hi)
        if port in ports:
            continue
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
            ports.append(port)
        except OSError:
            pass
        finally:
            s.close()
    if len(ports) < n:
        raise LabError("could not find free ports")
    return ports


def http_get(url, timeout=1.0, bearer=None):
    req = urllib.request.Request(url)
    if bearer:
        req.add_header("Authorization", "Bearer " + bearer)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (OSError, ValueError):
        return None, b""


def tail(path, n=30):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


# ------------------------------------------------------------------------------------ lab
def lab_json_path(run_dir):
    return os.path.join(run_dir, "lab.json")


def load_lab(run_dir):
    try:
        with open(lab_json_path(run_dir)) as f:
            return json.load(f)
    except OSError as e:
        raise LabError(f"no lab in {run_dir}: {e}")


def save_lab(lab):
    p = lab_json_path(lab["run_dir"])
    tmp = p + ".tmp"
    with open(tmp, "w") as f:
        json.dump(lab, f, indent=2)
    os.replace(tmp, p)


def parse_env(items):
    env = {}
    for it in items or []:
        if "=" not in it:
            raise LabError(f"expected K=V, got {it!r}")
        k, v = it.split("=", 1)
        env[k] = v
    return env


def component_env(lab, comp):
    env = dict(os.environ)
    env.pop("RUST_BACKTRACE", None)
    for k in FAULT_VARS:  # faults only come from the component's own recorded env
        env.pop(k, None)
    env.update({"PYTHONUNBUFFERED": "1", "FAKE_NVML_DIR": lab["nvml_dir"],
                "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "1"})
    if comp["role"] in ("prefill", "decode", "regular"):
        env["PYTHONPATH"] = PKG
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in engine_gpus(comp))
        env["SGLANG_LAB_STATE_DIR"] = os.path.join(lab["run_dir"], "state", comp["name"])
        if lab.get("mode") == "pd":  # decode waits for the KV its prefill sends (KvHandoff)
            env["LAB_KV_DIR"] = os.path.join(lab["run_dir"], "state", "kv")
    env.update(comp["env"])
    return env


def engine_gpus(comp):
    """The fake GPUs an engine's schedulers own: `gpus` (TP > 1) or its one `gpu`."""
    return comp.get("gpus") or [comp["gpu"]]


def spawn(lab, comp):
    os.makedirs(os.path.dirname(comp["log"]), exist_ok=True)
    logf = open(comp["log"], "ab")
    p = subprocess.Popen(comp["cmd"], env=component_env(lab, comp), stdout=logf,
                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         cwd=lab["run_dir"], start_new_session=True)
    logf.close()
    st = proc_stat(p.pid)
    comp["pid"] = p.pid
    comp["pgid"] = p.pid
    comp["start_time"] = st[3] if st else None
    comp["children"] = []
    p.returncode = 0  # we never wait() on it from this short-lived CLI; silence the warning
    return p


def wait_ready(lab, comp, deadline):
    said = False
    while time.time() < deadline:
        if not alive(comp["pid"], comp["start_time"]):
            raise LabError(f"{comp['name']} exited during startup; log tail:\n{tail(comp['log'])}")
        if comp["role"] in ("prefill", "decode", "regular"):
            st, _ = http_get(comp["url"] + "/health")
            st2, _ = http_get(comp["url"] + "/v1/loads") if st == 200 else (None, b"")
            if st == 200 and st2 == 200:
                record_children(comp)
                titles = [k["title"] for k in comp["children"]]
                if (len(comp["scheduler_pids"]) == int(comp.get("tp_size", 1))
                        and comp["detokenizer_pid"] is not None):
                    return
                if not said:
                    log(f"{comp['name']}: waiting for titled children, have {titles}")
                    said = True
        elif comp["role"] == "router":
            st, body = http_get(comp["url"] + "/readiness")
            if st == 200 and b"ready" in body and workers_healthy(lab, comp):
                return
        elif comp["role"] == "proxy":
            st, _ = http_get(comp["url"] + "/lab/proxy_status")
            if st == 200:
                return
        time.sleep(0.1)
    raise LabError(f"{comp['name']} not ready in time; log tail:\n{tail(comp['log'])}")


def workers_healthy(lab, router):
    st, body = http_get(router["url"] + "/workers", bearer=router.get("api_key"))
    if st != 200:
        return False
    try:
        data = json.loads(body)
    except ValueError:
        return False
    items = data.get("workers", data) if isinstance(data, dict) else data
    urls = {w.get("url"): w.get("is_healthy") for w in items if isinstance(w, dict)}
    engines = [c for c in lab["components"].values() if c["role"] in ("prefill", "decode", "regular")]
    return all(urls.get(e["url"]) for e in engines)


def tp_rank_of(title):
    """`sglang::scheduler_TP3` -> 3; a TP 1 engine's `sglang::scheduler` -> 0."""
    _, sep, rank = title.partition("_TP")
    digits = rank.split()[0] if sep and rank.split() else ""
    return int(digits) if digits.isdigit() else 0


def record_children(comp):
    kids = []
    for pid in children_of(comp["pid"]):
        st = proc_stat(pid)
        if st is None:
            continue
        kids.append({"pid": pid, "title": cmdline(pid), "start_time": st[3]})
    comp["children"] = kids
    scheds = [k for k in kids if k["title"].startswith("sglang::scheduler")]
    scheds.sort(key=lambda k: tp_rank_of(k["title"]))
    comp["scheduler_pids"] = [k["pid"] for k in scheds]  # TP rank order
    det = [k["pid"] for k in kids if k["title"].startswith("sglang::detokenizer")]
    comp["detokenizer_pid"] = det[0] if det else None


def stop_components(comps, grace=3.0):
    """SIGTERM the components' process groups (all at once), then SIGKILL what is left.
    A pid is only signalled while it is still the process we started (start times match);
    a process group is only signalled while it still has members."""
    members = []
    pgids = []
    for comp in comps:
        members.append((comp["pid"], comp.get("start_time")))
        members += [(k["pid"], k["start_time"]) for k in comp.get("children", [])]
        if comp.get("pgid"):
            pgids.append(comp["pgid"])
    if not any(alive(p, t) for p, t in members) and not any(group_members(g) for g in pgids):
        return []

    def remaining():
        left = [p for p, t in members if alive(p, t)]
        for g in pgids:
            left += group_members(g)
        return sorted(set(left))

    def signal_all(sig):
        for g in pgids:
            if group_members(g):
                try:
                    os.killpg(g, sig)
                except ProcessLookupError:
                    pass
        for p, t in members:
            if alive(p, t):
                try:
                    os.kill(p, sig)
                except ProcessLookupError:
                    pass

    signal_all(signal.SIGTERM)
    deadline = time.time() + grace
    while time.time() < deadline:
        if not remaining():
            return []
        time.sleep(0.05)
    signal_all(signal.SIGKILL)
    deadline = time.time() + 3
    while time.time() < deadline:
        if not remaining():
            return []
        time.sleep(0.05)
    return remaining()


def stop_component(comp, grace=3.0):
    return stop_components([comp], grace)


def engine_cmd(lab, name, mode, port, boot_port, tp_size=1):
    cmd = [venv_python(), "-m", "sglang.launch_server", "--model-path", lab["model_path"],
           "--host", "127.0.0.1", "--port", str(port), "--tp-size", str(tp_size),
           "--served-model-name", "lab-model", "--enable-metrics",
           "--decode-log-interval", "5", "--mem-fraction-static", "0.88"]
    if mode in ("prefill", "decode"):
        cmd += ["--disaggregation-mode", mode, "--disaggregation-transfer-backend", "mooncake"]
        if mode == "prefill":
            cmd += ["--disaggregation-bootstrap-port", str(boot_port)]
    return cmd


def cmd_up(a):
    if a.two_node:
        import two_node_lab  # two machines (issue 14 item 5): see its docstring
        return two_node_lab.up(a, sys.modules[__name__])
    if a.netns:
        import netns_lab  # containers on one host (issue 11 item 5): see its docstring
        return netns_lab.up(a, sys.modules[__name__])
    for attempt in range(3):
        try:
            return cmd_up_once(a)
        except LabError as e:
            # Python says "Address already in use", aiohttp "address already in use"
            if "address already in use" not in str(e).lower() or a.base_port or attempt == 2:
                raise
            log(f"port collision, retrying with new ports: {str(e).splitlines()[0]}")


def cmd_up_once(a):
    setup(quiet=True)
    run_dir = os.path.abspath(a.run_dir)
    if os.path.exists(lab_json_path(run_dir)):
        old = json.load(open(lab_json_path(run_dir)))
        if any(c.get("pid") and alive(c["pid"], c.get("start_time")) for c in old["components"].values()):
            raise LabError(f"a lab is already running in {run_dir}; run `down` first")
    os.makedirs(run_dir, exist_ok=True)
    model = os.path.join(run_dir, "model")
    os.makedirs(model, exist_ok=True)
    with open(os.path.join(model, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                   "hidden_size": 4096, "num_hidden_layers": 32}, f)
    nvml = os.path.join(run_dir, "nvml")
    os.makedirs(nvml, exist_ok=True)
    if a.base_port:
        ports = [a.base_port + i for i in range(6)]
    else:
        ports = free_ports(6)
    p_port, d_port, r_port, m_port, x_port, b_port = ports
    lab = {"version": 1, "mode": a.mode, "run_dir": run_dir, "repo": REPO, "venv": VENV,
           "python": venv_python(), "nvml_dir": nvml, "model_path": model,
           "entry_url": f"http://127.0.0.1:{x_port}", "components": {}, "order": []}

    # fake NVML: one H200 per scheduler (2 in the default lab; 2 x tp in PD mode, like a
    # prefill node and a decode node of tp GPUs each seen from one host), idle until the
    # schedulers write their own files
    tp = max(1, a.tp_size)
    n_gpus = tp * (2 if a.mode == "pd" else 1)
    if tp == 1:
        n_gpus = 2  # the default lab keeps its two GPUs (regular mode leaves gpu1 unused)
    sys.path.insert(0, os.path.join(PKG, "sglang", "srt", "utils"))
    import lab_state  # noqa: E402  (stdlib-only module from the lab package)
    lab_state.atomic_write(os.path.join(nvml, "devices"),
                           f"device_count={n_gpus}\ndriver_version=550.54.15\n")
    for i in range(n_gpus):
        lab_state.atomic_write(os.path.join(nvml, f"gpu{i}"), lab_state.render_gpu(
            i, 0, 0, 0, lab_state.IDLE_POWER_MW, []))

    logs = os.path.join(run_dir, "logs")
    token_env = {"LAB_TOKEN_INTERVAL_S": str(a.token_interval)} if a.token_interval else {}
    if a.controls:
        token_env.update(CONTROLS_ENV)
        lab["controls"] = True

    def add(comp):
        comp.setdefault("log", os.path.join(logs, comp["name"] + ".log"))
        lab["components"][comp["name"]] = comp
        lab["order"].append(comp["name"])
        return comp

    def tp_fields(first_gpu):
        if tp == 1:
            return {"gpu": first_gpu}
        return {"gpu": first_gpu, "gpus": list(range(first_gpu, first_gpu + tp)), "tp_size": tp}

    if a.mode == "pd":
        engines = [
            add({"name": "prefill", "role": "prefill", "port": p_port, **tp_fields(0),
                 "url": f"http://127.0.0.1:{p_port}", "bootstrap_port": b_port,
                 "metrics_url": f"http://127.0.0.1:{p_port}/metrics",
                 "cmd": engine_cmd(lab, "prefill", "prefill", p_port, b_port, tp),
                 "env": {**token_env, **parse_env(a.prefill_env)}}),
            add({"name": "decode", "role": "decode", "port": d_port,
                 **tp_fields(1 if tp == 1 else tp),
                 "url": f"http://127.0.0.1:{d_port}", "bootstrap_port": None,
                 "metrics_url": f"http://127.0.0.1:{d_port}/metrics",
                 "cmd": engine_cmd(lab, "decode", "decode", d_port, None, tp),
                 "env": {**token_env, **parse_env(a.decode_env)}}),
        ]
        worker_args = ["--pd-disaggregation", "--prefill", engines[0]["url"], str(b_port),
                       "--decode", engines[1]["url"]]
    else:
        engines = [add({"name": "engine", "role": "regular", "port": p_port, **tp_fields(0),
                        "url": f"http://127.0.0.1:{p_port}", "bootstrap_port": None,
                        "metrics_url": f"http://127.0.0.1:{p_port}/metrics",
                        "cmd": engine_cmd(lab, "engine", "regular", p_port, None, tp),
                        "env": {**token_env, **parse_env(a.engine_env)}})]
        worker_args = ["--worker-urls", engines[0]["url"], "--policy", "cache_aware"]
    router = add({
        "name": "router", "role": "router", "port": r_port, "url": f"http://127.0.0.1:{r_port}",
        "prometheus_port": m_port, "metrics_url": f"http://127.0.0.1:{m_port}/metrics",
        "cmd": [venv_python(), "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                "--port", str(r_port), *worker_args, "--prometheus-host", "127.0.0.1",
                "--prometheus-port", str(m_port), "--health-check-interval-secs", "1",
                "--health-failure-threshold", "1", "--health-success-threshold", "1",
                "--disable-retries", "--disable-circuit-breaker",
                "--shutdown-grace-period-secs", "1", "--log-level", "info",
                *(CONTROLS_ROUTER_ARGS if a.controls else []), *a.router_arg,
                *(["--api-key", a.router_api_key] if a.router_api_key else [])],
        "env": parse_env(a.router_env)})
    if a.router_api_key:
        router["api_key"] = a.router_api_key
    proxy = add({
        "name": "proxy", "role": "proxy", "port": x_port, "url": f"http://127.0.0.1:{x_port}",
        "upstream": router["url"],
        "cmd": [venv_python(), os.path.join(LAB_DIR, "proxy.py"), "--host", "127.0.0.1",
                "--listen-port", str(x_port), "--upstream", router["url"]],
        "env": parse_env(a.proxy_env)})
    lab["router_url"] = router["url"]
    t0 = time.time()
    try:
        for e in engines:
            spawn(lab, e)
        save_lab(lab)  # record pids as early as possible so `down` can always clean up
        for e in engines:  # N schedulers are N fresh interpreters: allow for a busy host
            wait_ready(lab, e, time.time() + 60 + 10 * tp)
        spawn(lab, router)
        spawn(lab, proxy)
        save_lab(lab)
        wait_ready(lab, router, time.time() + 60)
        wait_ready(lab, proxy, time.time() + 30)
    except BaseException:
        save_lab(lab)
        do_down(lab)
        raise
    lab["up_seconds"] = round(time.time() - t0, 2)
    save_lab(lab)
    print(json.dumps(lab, indent=2))


def do_down(lab):
    # Proxy and router first (clients see connections close, not engines vanish), then
    # the engines; each stage signals its components together to keep `down` fast.
    comps = [lab["components"][n] for n in reversed(lab["order"])]
    front = [c for c in comps if c["role"] in ("proxy", "router") and c.get("pid")]
    engines = [c for c in comps if c["role"] not in ("proxy", "router") and c.get("pid")]
    left = stop_components(front, grace=2.0) + stop_components(engines, grace=2.0)
    # verify: no recorded pid (with its start time) and no recorded process group remains
    for comp in lab["components"].values():
        if comp.get("pid") and alive(comp["pid"], comp.get("start_time")):
            left.append(comp["pid"])
        for k in comp.get("children", []):
            if alive(k["pid"], k["start_time"]):
                left.append(k["pid"])
        if comp.get("pgid"):
            left += group_members(comp["pgid"])
    return sorted(set(left))


def cmd_down(a):
    lab = load_lab(os.path.abspath(a.run_dir))
    left = do_down(lab)
    if lab.get("mode") == "netns":
        import netns_lab
        netns_lab.remove_cgroups(lab)
    if left:
        raise LabError(f"processes still running after down: {left}")
    print(json.dumps({"down": True, "run_dir": lab["run_dir"]}))


def cmd_status(a):
    lab = load_lab(os.path.abspath(a.run_dir))
    if lab.get("mode") == "two-node":
        import two_node_lab
        return two_node_lab.status(lab, sys.modules[__name__])
    out = {}
    for name in lab["order"]:
        c = lab["components"][name]
        probe = {"router": "/readiness", "proxy": "/lab/proxy_status"}.get(c["role"], "/health")
        st, _ = http_get(c["url"] + probe, timeout=1.0)
        out[name] = {"pid": c.get("pid"), "alive": bool(c.get("pid")) and alive(c["pid"], c.get("start_time")),
                     "http_status": st,
                     "children_alive": [k["pid"] for k in c.get("children", [])
                                        if alive(k["pid"], k["start_time"])]}
    print(json.dumps(out, indent=2))


def do_restart(lab, name, env_set, env_unset):
    if lab.get("mode") in ("netns", "two-node"):
        raise LabError(f"restart and inject are for the one-host lab, not mode {lab['mode']} "
                       "(start it with the fault: `up --two-node --fault NAME`)")
    if name not in lab["components"]:
        raise LabError(f"unknown component {name!r}; have {lab['order']}")
    comp = lab["components"][name]
    left = stop_component(comp)
    if left:
        raise LabError(f"could not stop {name}: {left}")
    for k in env_unset:
        comp["env"].pop(k, None)
    comp["env"].update(env_set)
    comp["restarts"] = comp.get("restarts", 0) + 1
    spawn(lab, comp)
    save_lab(lab)
    wait_ready(lab, comp, time.time() + 60)
    if comp["role"] in ("prefill", "decode", "regular"):
        # wait until the router has seen the new engine healthy again
        router = lab["components"]["router"]
        deadline = time.time() + 20
        while time.time() < deadline and not workers_healthy(lab, router):
            time.sleep(0.2)
    save_lab(lab)


def cmd_restart(a):
    lab = load_lab(os.path.abspath(a.run_dir))
    do_restart(lab, a.component, parse_env(a.env), a.unset or [])
    print(json.dumps(lab, indent=2))


def cmd_inject(a):
    lab = load_lab(os.path.abspath(a.run_dir))
    if lab.get("mode") in ("netns", "two-node"):
        raise LabError(f"inject is for the one-host lab, not mode {lab['mode']} "
                       "(start the two-node lab with `up --two-node --fault NAME`)")
    if a.fault == "clear":
        for name in lab["order"]:
            c = lab["components"][name]
            if any(k in c["env"] for k in FAULT_VARS):
                do_restart(lab, name, {}, FAULT_VARS)
    else:
        if a.fault not in FAULTS:
            raise LabError(f"unknown fault {a.fault!r}; known: {sorted(FAULTS)} or clear")
        pd_comp, reg_comp, env = FAULTS[a.fault]
        comp = pd_comp if lab["mode"] == "pd" else reg_comp
        if comp is None:
            raise LabError(f"fault {a.fault} needs --mode pd")
        do_restart(lab, comp, env, [])
    print(json.dumps(lab, indent=2))


def cmd_load(a):
    lab = load_lab(os.path.abspath(a.run_dir))
    if lab.get("mode") == "two-node":
        import two_node_lab  # the harness runs on node a
        return two_node_lab.cmd_load(a, sys.modules[__name__])
    url = a.url or lab["entry_url"]
    cmd = [lab["python"], os.path.join(LAB_DIR, "harness.py"), "--url", url,
           "--agents", str(a.agents), "--rounds", str(a.rounds), "--timeout", str(a.timeout),
           "--max-tokens", str(a.max_tokens)]
    if a.total_timeout:
        cmd += ["--total-timeout", str(a.total_timeout)]
    if a.duration:
        cmd += ["--duration", str(a.duration), "--think", str(a.think)]
        if a.progress:
            cmd += ["--progress", str(a.progress)]
    # exec, not a child: whoever runs `lab.py load` owns (and can kill) the harness itself;
    # the harness bounds its own run time (--total-timeout, default rounds*timeout+5).
    sys.stdout.flush()
    os.execv(cmd[0], cmd)


def cmd_controls(a):
    lab = load_lab(os.path.abspath(a.run_dir))
    if not lab.get("controls"):
        raise LabError("the controls need a lab started with `up --controls`")
    engine = lab["components"].get("engine")
    if engine is None:
        raise LabError("the controls run on the regular lab (`up --mode regular --controls`)")
    cmd = [sys.executable, os.path.join(LAB_DIR, "controls.py"), "--url", lab["entry_url"],
           "--engine-url", engine["url"]]
    if a.only:
        cmd += ["--only", a.only]
    sys.stdout.flush()
    os.execv(cmd[0], cmd)


def cmd_exec(a):
    import two_node_lab
    return two_node_lab.cmd_exec(a, sys.modules[__name__])


def main(argv=None):
    ap = argparse.ArgumentParser(prog="lab.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("setup")
    up = sub.add_parser("up")
    up.add_argument("--run-dir", required=True)
    up.add_argument("--mode", choices=["pd", "regular"], default="pd")
    up.add_argument("--base-port", type=int, default=0)
    up.add_argument("--token-interval", type=float, default=0.0,
                    help="seconds per decode step (engine env LAB_TOKEN_INTERVAL_S; default 0.03)")
    for opt in ("--decode-env", "--prefill-env", "--engine-env", "--router-env", "--proxy-env"):
        up.add_argument(opt, action="append", default=[], metavar="K=V")
    up.add_argument("--tp-size", type=int, default=1, metavar="N",
                    help="every engine runs N schedulers (sglang::scheduler_TP0..N-1), each on "
                         "its own fake GPU (PD: prefill GPUs 0..N-1, decode N..2N-1)")
    up.add_argument("--router-api-key", default=None, metavar="KEY",
                    help="start the router with --api-key KEY (production norm)")
    up.add_argument("--router-arg", action="append", default=[],
                    help="extra argument for the router (repeat)")
    up.add_argument("--netns", action="store_true",
                    help="containers on one host: two pods (own net + PID namespace) with an "
                         "engine each on one port, a router in pod-a, and a decoy on the "
                         "host's 127.0.0.1 at that port (see netns_lab.py); root only")
    up.add_argument("--two-node", action="store_true",
                    help="two machines (own net + PID namespace each, joined by a veth pair): "
                         "proxy and router on node a, prefill and decode on node b "
                         "(see two_node_lab.py); root only")
    up.add_argument("--controls", action="store_true",
                    help="the engines honour the controls' prompt directives and run at most "
                         f"{CONTROLS_MAX_RUNNING} requests; the router admits "
                         f"{CONTROLS_ROUTER_CONCURRENT} at once (see `controls`)")
    up.add_argument("--fault", default=None,
                    help="(--two-node) start with this fault switched on (see FAULTS)")
    ld = sub.add_parser("load")
    ld.add_argument("--run-dir", required=True)
    ld.add_argument("--agents", type=int, default=3)
    ld.add_argument("--rounds", type=int, default=4)
    ld.add_argument("--timeout", type=float, default=10.0)
    ld.add_argument("--max-tokens", type=int, default=12)
    ld.add_argument("--total-timeout", type=float, default=0.0)
    ld.add_argument("--url", default=None, help="default: the proxy (entry_url)")
    ld.add_argument("--duration", type=float, default=0.0,
                    help="steady mode: every agent streams back to back for this many seconds "
                         "(conversations start over every --rounds rounds); prints throughput")
    ld.add_argument("--think", type=float, default=0.0,
                    help="steady mode: seconds between an agent's requests")
    ld.add_argument("--progress", type=float, default=0.0,
                    help="steady mode: the completed requests and streamed chunks to stderr "
                         "every S seconds")
    rs = sub.add_parser("restart")
    rs.add_argument("--run-dir", required=True)
    rs.add_argument("component")
    rs.add_argument("--env", action="append", default=[], metavar="K=V")
    rs.add_argument("--unset", action="append", default=[], metavar="K")
    inj = sub.add_parser("inject")
    inj.add_argument("--run-dir", required=True)
    inj.add_argument("fault", help=f"one of {sorted(FAULTS)} or clear")
    ct = sub.add_parser("controls", help="run the controls (a lab `up --controls`)")
    ct.add_argument("--run-dir", required=True)
    ct.add_argument("--only", default=None, help="comma-separated control names")
    ex = sub.add_parser("exec", help="(two-node) run a command inside node a or b")
    ex.add_argument("--run-dir", required=True)
    ex.add_argument("node", help="a or b")
    ex.add_argument("command", nargs=argparse.REMAINDER)
    for name in ("down", "status"):
        p = sub.add_parser(name)
        p.add_argument("--run-dir", required=True)
    a = ap.parse_args(argv)
    try:
        {"setup": lambda a: setup(), "up": cmd_up, "load": cmd_load, "restart": cmd_restart,
         "inject": cmd_inject, "down": cmd_down, "status": cmd_status,
         "exec": cmd_exec, "controls": cmd_controls}[a.cmd](a)
    except LabError as e:
        print(f"lab.py {a.cmd}: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
