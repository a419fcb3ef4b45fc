"""`lab.py up --netns`: the lab as containers on one host (issue 11 item 5).

    host  127.0.0.1:P   decoy: something unrelated on the engines' port (its /metrics says
                        sglang:num_running_reqs 999, model "decoy"); never to be scraped
    pod-a (own net + PID namespace, cgroup docker-<id>.scope)
          127.0.0.1:P   engine, served model "pod-a" (regular mode, fake GPU 0)
          127.0.0.1:R   router --worker-urls http://127.0.0.1:P, metrics on 127.0.0.1:M
    pod-b (own net + PID namespace, cgroup docker-<id>.scope)
          127.0.0.1:P   engine, served model "pod-b" (fake GPU 1)

Each pod is `unshare --net --pid --fork --mount-proc --kill-child python3 pod.py SPEC`
(needs root). Its cgroup is a directory named like Docker's systemd-driver scope, made in
a writable cgroup hierarchy (v2 at /sys/fs/cgroup, else v1 name=systemd) when there is one;
the pod is moved there before it execs, so all its processes are in it. `down` stops each
pod's process group (the pod's init exiting kills the rest of its PID namespace) and removes
the cgroup directories it made.
"""

import json
import os
import secrets
import subprocess
import time

NETNS_ROOTS = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/systemd"]
SLICE = "wedgewatch-lab.slice"

DECOY = r'''
import http.server, sys
BODY = b'# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{model_name="decoy",engine_type="unified",tp_rank="0",pp_rank="0"} 999\n'
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
'''


def cgroup_base():
    """A cgroup hierarchy we may create directories in and move processes into, or None."""
    for root in NETNS_ROOTS:
        if os.path.exists(os.path.join(root, "cgroup.procs")) and os.access(root, os.W_OK):
            return root
    return None


def make_cgroup(container_id):
    base = cgroup_base()
    if base is None:
        return None
    path = os.path.join(base, SLICE, f"docker-{container_id}.scope")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return None
    return path


def remove_cgroups(lab):
    for comp in lab["components"].values():
        path = comp.get("cgroup")
        if not path:
            continue
        for p in (path, os.path.dirname(path)):
            try:
                os.rmdir(p)  # only empty cgroups can be removed; a busy parent stays
            except OSError:
                pass


def up(a, lab_mod):
    L = lab_mod
    L.setup(quiet=True)
    run_dir = os.path.abspath(a.run_dir)
    if os.path.exists(L.lab_json_path(run_dir)):
        old = json.load(open(L.lab_json_path(run_dir)))
        if any(c.get("pid") and L.alive(c["pid"], c.get("start_time"))
               for c in old["components"].values()):
            raise L.LabError(f"a lab is already running in {run_dir}; run `down` first")
    os.makedirs(run_dir, exist_ok=True)
    model = os.path.join(run_dir, "model")
    os.makedirs(model, exist_ok=True)
    with open(os.path.join(model, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                   "hidden_size": 4096, "num_hidden_layers": 32}, f)
    nvml = os.path.join(run_dir, "nvml")
    os.makedirs(nvml, exist_ok=True)
    logs = os.path.join(run_dir, "logs")
    os.makedirs(logs, exist_ok=True)
    port, r_port, m_port = [a.base_port + i for i in range(3)] if a.base_port else L.free_ports(3)
    lab = {"version": 1, "mode": "netns", "run_dir": run_dir, "repo": L.REPO, "venv": L.VENV,
           "python": L.venv_python(), "nvml_dir": nvml, "model_path": model,
           "engine_port": port, "components": {}, "order": []}
    import sys
    sys.path.insert(0, os.path.join(L.PKG, "sglang", "srt", "utils"))
    import lab_state  # noqa: E402
    lab_state.atomic_write(os.path.join(nvml, "devices"),
                           "device_count=2\ndriver_version=550.54.15\n")
    for i in range(2):
        lab_state.atomic_write(os.path.join(nvml, f"gpu{i}"), lab_state.render_gpu(
            i, 0, 0, 0, lab_state.IDLE_POWER_MW, []))

    def engine(pod, gpu):
        cmd = L.engine_cmd(lab, "engine", "regular", port, None)
        cmd[cmd.index("lab-model")] = pod
        env = {"PYTHONPATH": L.PKG, "CUDA_VISIBLE_DEVICES": str(gpu),
               "SGLANG_LAB_STATE_DIR": os.path.join(run_dir, "state", pod)}
        return {"name": "engine", "cmd": cmd, "env": env, "port": port,
                "log": os.path.join(logs, f"{pod}-engine.log"), "ready": ["/health", "/v1/loads"]}

    router = {"name": "router", "port": r_port, "workers_healthy": True,
              "log": os.path.join(logs, "pod-a-router.log"), "ready": ["/readiness"], "env": {},
              "cmd": [L.venv_python(), "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                      "--port", str(r_port), "--worker-urls", f"http://127.0.0.1:{port}",
                      "--policy", "cache_aware", "--prometheus-host", "127.0.0.1",
                      "--prometheus-port", str(m_port), "--health-check-interval-secs", "1",
                      "--health-failure-threshold", "1", "--health-success-threshold", "1",
                      "--disable-retries", "--disable-circuit-breaker",
                      "--shutdown-grace-period-secs", "1", "--log-level", "info"]}
    pods = {"pod-a": [engine("pod-a", 0), router], "pod-b": [engine("pod-b", 1)]}
    lab["router_port"], lab["router_metrics_port"] = r_port, m_port

    base_env = L.component_env(lab, {"role": "pod", "env": {}})
    t0 = time.time()
    try:
        # the decoy first: it holds the host's 127.0.0.1:P, as an unrelated service would
        decoy_log = open(os.path.join(logs, "decoy.log"), "ab")
        d = subprocess.Popen([L.venv_python(), "-c", DECOY, str(port)], env=base_env,
                             stdout=decoy_log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        decoy_log.close()
        st = L.proc_stat(d.pid)
        lab["components"]["decoy"] = {"name": "decoy", "role": "decoy", "pid": d.pid,
                                      "pgid": d.pid, "start_time": st[3] if st else None,
                                      "port": port, "url": f"http://127.0.0.1:{port}",
                                      "env": {}, "children": []}
        lab["order"].append("decoy")
        for name, services in pods.items():
            cid = secrets.token_hex(32)
            cgroup = make_cgroup(cid)
            spec_path = os.path.join(run_dir, f"{name}.spec.json")
            ready_file = os.path.join(run_dir, f"{name}.ready.json")
            if os.path.exists(ready_file):
                os.unlink(ready_file)
            with open(spec_path, "w") as f:
                json.dump({"name": name, "ready_file": ready_file, "services": services}, f)
            procs_file = os.path.join(cgroup, "cgroup.procs") if cgroup else None

            def enter_cgroup(path=procs_file):
                if path:
                    with open(path, "w") as f:
                        f.write("0")

            logf = open(os.path.join(logs, f"{name}.log"), "ab")
            p = subprocess.Popen(
                ["unshare", "--net", "--pid", "--fork", "--mount-proc", "--kill-child",
                 L.venv_python(), os.path.join(L.LAB_DIR, "pod.py"), spec_path],
                env=base_env, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=run_dir, start_new_session=True, preexec_fn=enter_cgroup)
            logf.close()
            st = L.proc_stat(p.pid)
            lab["components"][name] = {
                "name": name, "role": "pod", "pid": p.pid, "pgid": p.pid,
                "start_time": st[3] if st else None, "port": port,
                "url": f"http://127.0.0.1:{port}", "cgroup": cgroup,
                "container_id": cid if cgroup else None, "env": {}, "children": [],
                "log": os.path.join(logs, f"{name}.log"), "services": {}}
            lab["order"].append(name)
        L.save_lab(lab)  # pids recorded early so `down` can always clean up
        for name in pods:
            comp = lab["components"][name]
            deadline = time.time() + 90
            ready_file = os.path.join(run_dir, f"{name}.ready.json")
            while not os.path.exists(ready_file):
                if not L.alive(comp["pid"], comp["start_time"]):
                    raise L.LabError(f"{name} exited during start-up; log tail:\n{L.tail(comp['log'])}"
                                     + "".join(L.tail(s["log"]) for s in pods[name]))
                if time.time() > deadline:
                    raise L.LabError(f"{name} not ready in time; log tail:\n{L.tail(comp['log'])}")
                time.sleep(0.1)
            comp["services"] = host_pids(L, comp["pid"], pods[name])
            engine_pid = comp["services"].get("engine", {}).get("pid")
            if engine_pid is None:
                raise L.LabError(f"{name}: its engine is not among the pod's processes")
            comp["netns"] = os.stat(f"/proc/{engine_pid}/ns/net").st_ino
    except BaseException:
        L.save_lab(lab)
        L.do_down(lab)
        remove_cgroups(lab)
        raise
    lab["up_seconds"] = round(time.time() - t0, 2)
    L.save_lab(lab)
    print(json.dumps(lab, indent=2))


def host_pids(L, unshare_pid, services):
    """The pods' services as the host sees them: unshare -> pod.py (PID 1) -> services."""
    out = {}
    inits = L.children_of(unshare_pid)
    kids = [k for i in inits for k in L.children_of(i)]
    for svc in services:
        marker = "sglang.launch_server" if svc["name"] == "engine" else "launch_router"
        for k in kids:
            if marker in L.cmdline(k) or (svc["name"] == "router" and "sglang::router" in L.cmdline(k)):
                st = L.proc_stat(k)
                out[svc["name"]] = {"pid": k, "port": svc["port"],
                                    "start_time": st[3] if st else None,
                                    "children": L.children_of(k)}
                break
    return out
