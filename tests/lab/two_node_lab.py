"""`lab.py up --two-node`: the PD stack spread over two "machines" (issue 14 item 5).

    node a  10.77.0.1 (own net + PID + mount namespace, /proc of its own)
            proxy  10.77.0.1:8080  ->  router 10.77.0.1:8000 (PD, metrics 10.77.0.1:29000)
            the harness (`lab.py load`) runs here too
        |  veth pair (eth0 in each node)
    node b  10.77.0.2
            prefill 10.77.0.2:30000 (bootstrap 8998, fake GPU 0)
            decode  10.77.0.2:30001 (fake GPU 1)

Each node is `unshare --net --pid --uts --fork --mount-proc --kill-child python3 pod.py
SPEC` (root), with its own hostname (node-a, node-b) and /etc/machine-id (bind-mounted in its
mount namespace; the kernel, so the boot id and the clocks, are shared). The host makes a veth pair and moves one end into each node's network namespace;
each node's init (pod.py) renames its end to eth0, gives it the node's address and waits
(node a: until node b's engines answer /health across the link) before starting its
services. Each node has its own fake-NVML directory (node a: no GPU; node b: two), so a
wedgewatch run inside a node (`lab.py exec --run-dir DIR a -- wedgewatch ...`) sees that
node's processes, sockets and GPUs only. Ports are fixed: every node has its own network.

`down` stops both nodes' process groups (a node's init exiting kills the rest of its PID
namespace, and the veth pair goes with the namespaces).
"""

import json
import os
import secrets
import subprocess
import sys
import time

ADDR = {"a": "10.77.0.1", "b": "10.77.0.2"}
PORTS = {"prefill": 30000, "decode": 30001, "bootstrap": 8998, "router": 8000,
         "router_metrics": 29000, "proxy": 8080}
# which node each service runs on, in start order
SERVICES = {"b": ["prefill", "decode"], "a": ["router", "proxy"]}


def node_of(service):
    return next(n for n, s in SERVICES.items() if service in s)


def url(service, port_key=None):
    return f"http://{ADDR[node_of(service)]}:{PORTS[port_key or service]}"


def engine_service(L, lab, name, env):
    cmd = L.engine_cmd(lab, name, name, PORTS[name], PORTS["bootstrap"])
    cmd[cmd.index("--host") + 1] = ADDR["b"]
    gpu = 0 if name == "prefill" else 1
    return {"name": name, "cmd": cmd, "host": ADDR["b"], "port": PORTS[name],
            "env": {"PYTHONPATH": L.PKG, "CUDA_VISIBLE_DEVICES": str(gpu),
                    "SGLANG_LAB_STATE_DIR": os.path.join(lab["run_dir"], "state", name), **env},
            "log": os.path.join(lab["run_dir"], "logs", f"{name}.log"),
            "ready": ["/health", "/v1/loads"]}


def front_services(L, lab, router_env, proxy_env):
    a = ADDR["a"]
    router = {"name": "router", "host": a, "port": PORTS["router"], "workers_healthy": True,
              "env": router_env, "log": os.path.join(lab["run_dir"], "logs", "router.log"),
              "ready": ["/readiness"],
              "cmd": [L.venv_python(), "-m", "sglang_router.launch_router", "--host", a,
                      "--port", str(PORTS["router"]), "--pd-disaggregation",
                      "--prefill", url("prefill"), str(PORTS["bootstrap"]),
                      "--decode", url("decode"), "--prometheus-host", a,
                      "--prometheus-port", str(PORTS["router_metrics"]),
                      "--health-check-interval-secs", "1", "--health-failure-threshold", "1",
                      "--health-success-threshold", "1", "--disable-retries",
                      "--disable-circuit-breaker", "--shutdown-grace-period-secs", "1",
                      "--log-level", "info"]}
    proxy = {"name": "proxy", "host": a, "port": PORTS["proxy"], "env": proxy_env,
             "log": os.path.join(lab["run_dir"], "logs", "proxy.log"),
             "ready": ["/lab/proxy_status"],
             "cmd": [L.venv_python(), os.path.join(L.LAB_DIR, "proxy.py"), "--host", a,
                     "--listen-port", str(PORTS["proxy"]), "--upstream", url("router")]}
    return [router, proxy]


def fault_env(L, a):
    """Per-service env: the --*-env options plus the named --fault."""
    env = {"prefill": L.parse_env(a.prefill_env), "decode": L.parse_env(a.decode_env),
           "router": L.parse_env(a.router_env), "proxy": L.parse_env(a.proxy_env)}
    if a.fault:
        if a.fault not in L.FAULTS or L.FAULTS[a.fault][0] is None:
            raise L.LabError(f"unknown fault {a.fault!r}; known: {sorted(L.FAULTS)}")
        comp, _, fenv = L.FAULTS[a.fault]
        env[comp].update(fenv)
    return env


def write_nvml(L, lab):
    sys.path.insert(0, os.path.join(L.PKG, "sglang", "srt", "utils"))
    import lab_state  # noqa: E402  (stdlib-only module from the lab package)
    for node, count in (("a", 0), ("b", 2)):
        d = os.path.join(lab["run_dir"], f"nvml-{node}")
        os.makedirs(d, exist_ok=True)
        lab_state.atomic_write(os.path.join(d, "devices"),
                               f"device_count={count}\ndriver_version=550.54.15\n")
        for i in range(count):
            lab_state.atomic_write(os.path.join(d, f"gpu{i}"), lab_state.render_gpu(
                i, 0, 0, 0, lab_state.IDLE_POWER_MW, []))


def prepare(L, a):
    L.setup(quiet=True)
    run_dir = os.path.abspath(a.run_dir)
    if os.path.exists(L.lab_json_path(run_dir)):
        old = json.load(open(L.lab_json_path(run_dir)))
        if any(c.get("pid") and L.alive(c["pid"], c.get("start_time"))
               for c in old["components"].values()):
            raise L.LabError(f"a lab is already running in {run_dir}; run `down` first")
    for sub in ("model", "logs"):
        os.makedirs(os.path.join(run_dir, sub), exist_ok=True)
    model = os.path.join(run_dir, "model")
    with open(os.path.join(model, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                   "hidden_size": 4096, "num_hidden_layers": 32}, f)
    lab = {"version": 1, "mode": "two-node", "run_dir": run_dir, "repo": L.REPO,
           "venv": L.VENV, "python": L.venv_python(), "model_path": model,
           "nvml_dir": os.path.join(run_dir, "nvml-b"), "addresses": dict(ADDR),
           "ports": dict(PORTS), "entry_url": url("proxy"), "router_url": url("router"),
           "nodes": {}, "components": {}, "order": []}
    write_nvml(L, lab)
    return lab


def node_specs(L, lab, a, tag):
    env = fault_env(L, a)
    specs = {}
    for node in ("b", "a"):
        if node == "b":
            services = [engine_service(L, lab, n, env[n]) for n in SERVICES["b"]]
            waits = []
        else:
            services = front_services(L, lab, env["router"], env["proxy"])
            waits = [url(n) + "/health" for n in SERVICES["b"]]
        mid = os.path.join(lab["run_dir"], f"node-{node}.machine-id")
        with open(mid, "w") as f:
            f.write(secrets.token_hex(16) + "\n")
        specs[node] = {"name": f"node-{node}", "services": services, "wait_urls": waits,
                       "hostname": f"node-{node}", "machine_id_file": mid,
                       "ready_file": os.path.join(lab["run_dir"], f"node-{node}.ready.json"),
                       "net": {"iface": f"w2n{tag}{node}", "rename": "eth0",
                               "addr": f"{ADDR[node]}/24"}}
    return specs


def start_node(L, lab, node, spec):
    spec_path = os.path.join(lab["run_dir"], f"node-{node}.spec.json")
    if os.path.exists(spec["ready_file"]):
        os.unlink(spec["ready_file"])
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    env = L.component_env(lab, {"role": "node", "env": {}})
    env["FAKE_NVML_DIR"] = os.path.join(lab["run_dir"], f"nvml-{node}")
    log = os.path.join(lab["run_dir"], "logs", f"node-{node}.log")
    logf = open(log, "ab")
    p = subprocess.Popen(
        ["unshare", "--net", "--pid", "--uts", "--fork", "--mount-proc", "--kill-child",
         L.venv_python(), os.path.join(L.LAB_DIR, "pod.py"), spec_path],
        env=env, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        cwd=lab["run_dir"], start_new_session=True)
    logf.close()
    p.returncode = 0  # never waited on from this short-lived CLI
    st = L.proc_stat(p.pid)
    name = f"node-{node}"
    lab["components"][name] = {"name": name, "role": "node", "node": node, "pid": p.pid,
                               "pgid": p.pid, "start_time": st[3] if st else None,
                               "address": ADDR[node], "log": log, "env": {}, "children": [],
                               "url": None}
    lab["order"].append(name)


def wait_init(L, comp):
    """The node's init (pod.py, its PID 1), once it is inside its own network namespace."""
    own = os.stat("/proc/self/ns/net").st_ino
    deadline = time.time() + 20
    while time.time() < deadline:
        if not L.alive(comp["pid"], comp["start_time"]):
            raise L.LabError(f"{comp['name']} exited at once; log tail:\n{L.tail(comp['log'])}")
        for k in L.children_of(comp["pid"]):
            try:
                if os.stat(f"/proc/{k}/ns/net").st_ino != own:
                    st = L.proc_stat(k)
                    comp["init_pid"], comp["init_start_time"] = k, st[3] if st else None
                    comp["netns"] = os.stat(f"/proc/{k}/ns/net").st_ino
                    comp["pidns"] = os.stat(f"/proc/{k}/ns/pid").st_ino
                    comp["children"] = [{"pid": k, "title": "pod.py", "start_time": comp["init_start_time"]}]
                    return k
            except OSError:
                pass
        time.sleep(0.02)
    raise L.LabError(f"{comp['name']}: its init never entered a new network namespace")


def link_nodes(L, lab, specs):
    a_if, b_if = specs["a"]["net"]["iface"], specs["b"]["net"]["iface"]
    pa = wait_init(L, lab["components"]["node-a"])
    pb = wait_init(L, lab["components"]["node-b"])
    for args in (["link", "add", a_if, "type", "veth", "peer", "name", b_if],
                 ["link", "set", a_if, "netns", str(pa)], ["link", "set", b_if, "netns", str(pb)]):
        r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)
        if r.returncode != 0:
            subprocess.run(["ip", "link", "del", a_if], capture_output=True, timeout=10)
            raise L.LabError(f"ip {' '.join(args)}: {r.stderr.strip()}")


def ns_pid(host_pid):
    """The pid as the process's own (innermost) PID namespace sees it."""
    try:
        with open(f"/proc/{host_pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        pass
    return None


def record_services(L, lab, node, spec):
    comp = lab["components"][f"node-{node}"]
    with open(spec["ready_file"]) as f:
        inner = json.load(f)["pids"]
    by_inner = {ns_pid(k): k for k in L.children_of(comp["init_pid"])}
    services = {}
    for svc in spec["services"]:
        name = svc["name"]
        host = by_inner.get(inner.get(name))
        if host is None:
            raise L.LabError(f"node-{node}: {name} is not among its processes")
        st = L.proc_stat(host)
        kids = []
        for k in L.children_of(host):
            kst = L.proc_stat(k)
            kids.append({"pid": k, "node_pid": ns_pid(k), "title": L.cmdline(k),
                         "start_time": kst[3] if kst else None})
        services[name] = {"name": name, "role": name, "node": node, "pid": host,
                          "node_pid": inner[name], "start_time": st[3] if st else None,
                          "address": svc["host"], "port": svc["port"],
                          "url": f"http://{svc['host']}:{svc['port']}", "env": svc["env"],
                          "log": svc["log"], "children": kids,
                          "scheduler_pids": [k["pid"] for k in kids
                                             if k["title"].startswith("sglang::scheduler")],
                          "scheduler_node_pids": [k["node_pid"] for k in kids
                                                  if k["title"].startswith("sglang::scheduler")]}
        if name == "router":
            services[name]["metrics_url"] = url("router", "router_metrics") + "/metrics"
        elif name in ("prefill", "decode"):
            services[name]["metrics_url"] = services[name]["url"] + "/metrics"
    lab["nodes"][node] = {"name": node, "address": ADDR[node], "init_pid": comp["init_pid"],
                          "init_start_time": comp["init_start_time"], "netns": comp["netns"],
                          "pidns": comp["pidns"],
                          "nvml_dir": os.path.join(lab["run_dir"], f"nvml-{node}"),
                          "services": services}


def wait_ready(L, lab, node, spec, deadline):
    comp = lab["components"][f"node-{node}"]
    while not os.path.exists(spec["ready_file"]):
        if not L.alive(comp["pid"], comp["start_time"]):
            logs = "".join(L.tail(s["log"]) for s in spec["services"])
            raise L.LabError(f"node-{node} exited during start-up; log tail:\n"
                             f"{L.tail(comp['log'])}{logs}")
        if time.time() > deadline:
            raise L.LabError(f"node-{node} not ready in time; log tail:\n{L.tail(comp['log'])}")
        time.sleep(0.1)


def up(a, L):
    lab = prepare(L, a)
    specs = node_specs(L, lab, a, secrets.token_hex(4))
    t0 = time.time()
    try:
        for node in ("b", "a"):
            start_node(L, lab, node, specs[node])
        L.save_lab(lab)  # pids recorded early so `down` can always clean up
        link_nodes(L, lab, specs)
        L.save_lab(lab)
        for node in ("b", "a"):
            wait_ready(L, lab, node, specs[node], time.time() + 120)
            record_services(L, lab, node, specs[node])
    except BaseException:
        L.save_lab(lab)
        L.do_down(lab)
        raise
    lab["up_seconds"] = round(time.time() - t0, 2)
    L.save_lab(lab)
    print(json.dumps(lab, indent=2))


def node_or_die(L, lab, node):
    if lab.get("mode") != "two-node":
        raise L.LabError("not a two-node lab (start it with `up --two-node`)")
    n = lab["nodes"].get(node)
    if n is None:
        raise L.LabError(f"unknown node {node!r}; have {sorted(lab['nodes'])}")
    if not L.alive(n["init_pid"], n["init_start_time"]):
        raise L.LabError(f"node {node} is not running")
    return n


def enter_argv(n):
    """nsenter into a node: its network, PID, UTS and mount namespaces (its own /proc,
    hostname and machine-id)."""
    return ["nsenter", "-t", str(n["init_pid"]), "--net", "--pid", "--uts", "--mount", "--"]


def cmd_exec(a, L):
    """Run CMD inside a node, like on that machine (exec: the caller owns the process)."""
    lab = L.load_lab(os.path.abspath(a.run_dir))
    n = node_or_die(L, lab, a.node)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        raise L.LabError("exec needs a command after the node name")
    os.environ["FAKE_NVML_DIR"] = n["nvml_dir"]
    argv = enter_argv(n) + cmd
    sys.stdout.flush()
    os.execvp(argv[0], argv)


def cmd_load(a, L):
    """The harness on node a, against the proxy at 10.77.0.1."""
    lab = L.load_lab(os.path.abspath(a.run_dir))
    n = node_or_die(L, lab, "a")
    cmd = enter_argv(n) + [
        lab["python"], os.path.join(L.LAB_DIR, "harness.py"), "--url", a.url or lab["entry_url"],
        "--agents", str(a.agents), "--rounds", str(a.rounds), "--timeout", str(a.timeout),
        "--max-tokens", str(a.max_tokens)]
    if a.total_timeout:
        cmd += ["--total-timeout", str(a.total_timeout)]
    sys.stdout.flush()
    os.execvp(cmd[0], cmd)


PROBE = ("import sys, urllib.request\n"
         "for u in sys.argv[1:]:\n"
         "    try:\n"
         "        print(urllib.request.urlopen(u, timeout=1).status)\n"
         "    except Exception as e:\n"
         "        print(getattr(e, 'code', None))\n")


def status(lab, L):
    out = {}
    for node, n in sorted(lab["nodes"].items()):
        up_ = L.alive(n["init_pid"], n["init_start_time"])
        probes = {"router": "/readiness", "proxy": "/lab/proxy_status"}
        svcs = n["services"]
        codes = []
        if up_:
            urls = [s["url"] + probes.get(name, "/health") for name, s in svcs.items()]
            r = subprocess.run(["nsenter", "-t", str(n["init_pid"]), "--net", "--",
                                sys.executable, "-c", PROBE, *urls],
                               capture_output=True, text=True, timeout=15)
            codes = r.stdout.split()
        out[node] = {"address": n["address"], "alive": up_, "services": {
            name: {"pid": s["pid"], "node_pid": s["node_pid"],
                   "alive": L.alive(s["pid"], s["start_time"]),
                   "http_status": int(codes[i]) if i < len(codes) and codes[i].isdigit() else None}
            for i, (name, s) in enumerate(svcs.items())}}
    print(json.dumps(out, indent=2))
