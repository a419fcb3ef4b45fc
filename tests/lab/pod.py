#!/usr/bin/env python3
"""The init process of one lab "pod": PID 1 of its own network + PID namespace.

lab.py (`up --netns`) starts it as
    unshare --net --pid --fork --mount-proc --kill-child python3 pod.py SPEC.json
so it sees only its own processes and its own loopback, like a container. It brings the
loopback up, starts the services of SPEC in order (each waits until ready, probed from inside
the namespace), writes SPEC's `ready_file` (JSON: each service's pid *in the pod*), then
reaps children until SIGTERM. When it exits the kernel kills everything left in the pod, so
`lab.py down` only has to stop this process's group.

SPEC: {"name", "ready_file", "services": [{"name", "cmd", "env", "log", "ready": [paths],
       "port", "host" (default 127.0.0.1), "workers_healthy": bool}],
       optional "net": {"iface", "rename", "addr"} (the two-node lab: wait until the host has
       moved a veth end named `iface` into this namespace, rename it, give it `addr`, bring it
       up), optional "wait_urls": [urls] (each must answer 200 before services start),
       optional "hostname" (needs its own UTS namespace) and "machine_id_file" (bind-mounted
       over /etc/machine-id in the pod's own mount namespace)}.
Standard library only.
"""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request


def get(url, timeout=1.0):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (OSError, ValueError):
        return None, b""


def ready(svc):
    base = f"http://{svc.get('host', '127.0.0.1')}:{svc['port']}"
    for path in svc.get("ready", []):
        st, _ = get(base + path)
        if st != 200:
            return False
    if svc.get("workers_healthy"):
        st, body = get(base + "/workers")
        try:
            data = json.loads(body) if st == 200 else None
        except ValueError:
            data = None
        items = data.get("workers", data) if isinstance(data, dict) else data
        if not items or not all(isinstance(w, dict) and w.get("is_healthy") for w in items):
            return False
    return True


def ip(*args):
    return subprocess.run(["ip", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          timeout=10).returncode == 0


def setup_net(name, net, stopping):
    """Wait (bounded) for the host to move our veth end in, then configure it."""
    deadline = time.time() + 60
    while not ip("link", "show", "dev", net["iface"]):
        if stopping or time.time() > deadline:
            sys.exit(f"pod {name}: interface {net['iface']} never arrived")
        time.sleep(0.05)
    dev = net.get("rename") or net["iface"]
    if dev != net["iface"] and not ip("link", "set", "dev", net["iface"], "name", dev):
        sys.exit(f"pod {name}: cannot rename {net['iface']} to {dev}")
    if not (ip("addr", "add", net["addr"], "dev", dev) and ip("link", "set", dev, "up")):
        sys.exit(f"pod {name}: cannot configure {dev} with {net['addr']}")


def set_identity(spec):
    """A machine's name and id, inside the pod's own UTS and mount namespaces."""
    if spec.get("hostname"):
        with open("/proc/sys/kernel/hostname", "w") as f:
            f.write(spec["hostname"])
    mid = spec.get("machine_id_file")
    if mid and os.path.exists("/etc/machine-id"):
        r = subprocess.run(["mount", "--bind", mid, "/etc/machine-id"], timeout=10,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if r.returncode != 0:
            sys.exit(f"pod {spec['name']}: cannot bind-mount its machine-id")


def wait_urls(name, urls, stopping):
    deadline = time.time() + 90
    for url in urls:
        while get(url)[0] != 200:
            if stopping or time.time() > deadline:
                sys.exit(f"pod {name}: {url} did not answer 200 in time")
            time.sleep(0.1)


def main():
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    procs = []
    stopping = []

    def on_term(signum, frame):
        stopping.append(signum)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    # A fresh network namespace has only a loopback, and it is down.
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True, timeout=10)
    set_identity(spec)
    if spec.get("net"):
        setup_net(spec["name"], spec["net"], stopping)
    wait_urls(spec["name"], spec.get("wait_urls", []), stopping)
    pids = {}
    for svc in spec["services"]:
        logf = open(svc["log"], "ab")
        env = dict(os.environ)
        env.update(svc.get("env", {}))
        p = subprocess.Popen(svc["cmd"], env=env, stdout=logf, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL)
        logf.close()
        procs.append(p)
        deadline = time.time() + 60
        while not ready(svc):
            if p.poll() is not None or stopping:
                sys.exit(f"pod {spec['name']}: {svc['name']} exited or was stopped during start-up")
            if time.time() > deadline:
                sys.exit(f"pod {spec['name']}: {svc['name']} not ready in 60 s")
            time.sleep(0.1)
        pids[svc["name"]] = p.pid
    tmp = spec["ready_file"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"pids": pids}, f)
    os.replace(tmp, spec["ready_file"])
    while not stopping:
        try:
            # reap whatever exits (we are PID 1 of the pod: orphans come to us)
            os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.2)
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.time() + 2
    while time.time() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.05)
    # exiting kills the rest of the pod (PID namespace init)


if __name__ == "__main__":
    main()
