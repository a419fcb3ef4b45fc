#!/usr/bin/env python3
"""A lab's parent: a child subreaper that runs the lab's commands and adopts what they start.

`lab.py up` and `restart` start components in sessions of their own and exit; run under
the keeper, those components are reparented to it rather than to init, so a whole lab,
restarts included, is the keeper's process tree, and `wedgewatch --within KEEPER_PID`
watches that lab alone on a machine where other labs run side by side.

Protocol: one JSON array per line on stdin, a command to run (e.g. `["python3",
"lab.py", "up", ...]`), or `{"argv": [...], "timeout": SECONDS}` for one killed (its
process group) past that; one JSON object per line on stdout when it ends:
`{"rc": N, "out": "...", "err": "..."}`. End of stdin: the keeper exits; the lab is down by
then, and anything still below it (its test ended without taking the lab down: killed, or
a panic past its cleanup) is terminated, then killed, so no lab outlives its test. Adopted
processes are reaped as they die, so a stopped component is gone, not a zombie, while
`down` checks that nothing is left.
"""

import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

PR_SET_CHILD_SUBREAPER = 36
# What the processes left at the end get after SIGTERM before SIGKILL (the testkit kills the
# keeper itself 5 s after closing its stdin).
END_TERM_GRACE_S = 2.0


def reap_adopted(running):
    """Reaps every dead child but the command being run (its Popen reaps it)."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid == 0 or info.si_pid == running:
            return
        try:
            os.waitpid(info.si_pid, 0)
        except ChildProcessError:
            return


def run(argv, timeout, lock, state):
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        # started under the lock: the reaper must not take the command's own exit for an
        # adopted process's
        with lock:
            try:
                p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                     start_new_session=timeout is not None)
            except OSError as e:
                return {"rc": 127, "out": "", "err": f"keeper: cannot run {argv!r}: {e}"}
            state["running"] = p.pid
        late = ""
        try:
            rc = p.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            rc = p.wait()
            late = f"\nkeeper: killed after {timeout} s"
        finally:
            with lock:
                state["running"] = None
        out.seek(0)
        err.seek(0)
        return {"rc": rc, "out": out.read().decode(errors="replace"),
                "err": err.read().decode(errors="replace") + late}


def descendants(root):
    """Every live process below `root`, from /proc (parents before children)."""
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # after the command's closing parenthesis: state, then ppid
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 1 and fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(name))
    out, todo = [], [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            out.append(pid)
            todo.append(pid)
    return out


def end_what_is_left():
    """Terminates, then kills, every process still below the keeper; the dead are reaped."""
    me = os.getpid()
    for sig, grace in ((signal.SIGTERM, END_TERM_GRACE_S), (signal.SIGKILL, 1.0)):
        left = descendants(me)
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and descendants(me):
            reap_adopted(None)
            time.sleep(0.05)
    reap_adopted(None)


def reaper(lock, state, stop):
    while not stop.wait(0.05):
        with lock:
            reap_adopted(state["running"])


def main():
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        sys.exit(f"keeper: prctl(PR_SET_CHILD_SUBREAPER): errno {ctypes.get_errno()}")
    lock = threading.Lock()
    state = {"running": None}
    stop = threading.Event()
    threading.Thread(target=reaper, args=(lock, state, stop), daemon=True).start()
    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        if isinstance(cmd, dict):
            argv, timeout = cmd["argv"], cmd.get("timeout")
        else:
            argv, timeout = cmd, None
        print(json.dumps(run(argv, timeout, lock, state)), flush=True)
    stop.set()
    end_what_is_left()


if __name__ == "__main__":
    main()
