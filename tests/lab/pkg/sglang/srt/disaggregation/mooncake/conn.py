"""KV transfer between a PD pair over TCP (sglang/srt/disaggregation/mooncake/conn.py with
Mooncake's TCP transport), standard library only.

The flow, as the real 0.5.23 pair does it (tests/fixtures/sglang-real/shapes.md):
- The prefill scheduler listens on a PULL socket and registers it with its engine's bootstrap
  server (`PUT /route`, disaggregation/common/conn.py `CommonKVBootstrapServer`, run by the
  prefill HTTP process on `--disaggregation-bootstrap-port`).
- Every decode rank listens on a transfer port (Mooncake's TCP transport) and on a PULL socket
  for status. Decode rank 0 asks the bootstrap server once per prefill where its PULL socket
  is (`GET /route` on a kept-alive session; a second session sends `GET /health` every 5 s),
  connects a PUSH socket to it, and for each request it pre-allocated sends a TransferInfo
  (room, the ranks' transfer and status addresses, the bytes each rank expects).
- The prefill keeps a request in its bootstrap queue until decode's TransferInfo for its room
  arrived; after its forward, its transfer worker writes the pages into every decode rank's
  transfer port over a pool of connections (per slice a 24-byte header and the pages; the
  receiver answers each slice with 8 bytes; every queued transfer is written before any
  ack is read), then pushes "done" to each rank's status socket.
  The prefill answers its HTTP request once the transfer is done; decode's request leaves its
  transfer queue once its pages and the done status arrived.

Wire: "ZMQ" sockets write a 92-byte greeting each way on connect (ZMTP greeting + READY), then
the pusher writes length-prefixed JSON messages and the puller never writes again.

Faults (prefill's environment):
  LAB_FAULT_KV_SEND_STALL_AFTER=k   the (k+1)-th transfer stops mid-slice for good: the header
                                    and half its first slice are written, then the transfer
                                    worker waits forever (a hung Mooncake TCP transfer, sglang
                                    issue 23342); every later transfer queues behind it and
                                    decode's receiver waits for the rest of the slice forever.
Knobs: LAB_KV_BYTES_PER_TOKEN (per decode rank, default 512: the real tiny model's 2 layers x
K/V x 128 bytes), LAB_KV_LAYERS (one write per layer and K/V, default 8), LAB_KV_CONNS (pool
per decode rank, default 4 as Mooncake's).
"""

import http.client
import json
import logging
import os
import queue
import select
import socket
import struct
import threading
import time

logger = logging.getLogger(__name__)

# ZMTP 3.0 greeting (64 bytes) + READY command (28 bytes), as the real sockets' first 92 bytes.
GREETING = (b"\xff" + b"\x00" * 8 + b"\x7f\x03\x00NULL").ljust(64, b"\x00") + (
    b"\x04\x1a\x05READY\x0bSocket-Type\x00\x00\x00\x04PUSH").ljust(28, b"\x00")
SLICE_HEADER = struct.Struct("<QQQ")  # room, offset, length: 24 bytes
SLICE_STATUS = b"\x00\x00\x00\x00VTCM"  # what decode answers each slice with: 8 bytes
MAX_SLICE = 32 << 10
MAX_BATCH = 32  # transfers written before their acks are read
HEARTBEAT_S = 5.0  # SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL default
CONNECT_TIMEOUT_S = 5.0
ZEROS = memoryview(bytes(MAX_SLICE))


def _env_int(name, default):
    v = os.environ.get(name, "").strip()
    try:
        return int(v) if v else default
    except ValueError:
        return default


def kv_bytes(prompt_tokens):
    return max(1, prompt_tokens) * _env_int("LAB_KV_BYTES_PER_TOKEN", 512)


def _recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("peer closed")
        buf += chunk
    return bytes(buf)


def _listen(host):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, 0))
    s.listen(64)
    return s


def _serve(lsock, handler, name):
    def accept_loop():
        while True:
            try:
                conn, _ = lsock.accept()
            except OSError:
                return
            threading.Thread(target=handler, args=(conn,), name=name, daemon=True).start()

    threading.Thread(target=accept_loop, name=name + "_accept", daemon=True).start()


def _slices(nbytes, layers):
    """(offset, length) of each write of `nbytes` of pages: one per layer and K/V, none
    longer than MAX_SLICE."""
    per = max(1, -(-nbytes // (2 * max(1, layers))))
    out, offset = [], 0
    while offset < nbytes:
        n = min(per, MAX_SLICE, nbytes - offset)
        out.append((offset, n))
        offset += n
    return out


class PullSocket:
    """A ZMQ PULL stand-in: every message pushed to it goes to `on_message(dict)`."""

    def __init__(self, host, on_message, name):
        self.sock = _listen(host)
        self.addr = self.sock.getsockname()
        self.on_message = on_message
        _serve(self.sock, self._conn, name)

    def _conn(self, conn):
        try:
            conn.sendall(GREETING)
            _recv_exact(conn, len(GREETING))
            while True:
                (n,) = struct.unpack("<I", _recv_exact(conn, 4))
                self.on_message(json.loads(_recv_exact(conn, n)))
        except (OSError, ConnectionError, ValueError):
            conn.close()


class PushSocket:
    """A ZMQ PUSH stand-in, connected on first send and again after an error."""

    def __init__(self, addr):
        self.addr = tuple(addr)
        self.sock = None
        self.lock = threading.Lock()

    def send(self, msg):
        data = json.dumps(msg).encode()
        with self.lock:
            if self.sock is not None and select.select([self.sock], [], [], 0)[0]:
                self.close()  # the puller never writes: readable = closed or reset
            for attempt in range(2):
                try:
                    if self.sock is None:
                        s = socket.create_connection(self.addr, timeout=CONNECT_TIMEOUT_S)
                        s.sendall(GREETING)
                        _recv_exact(s, len(GREETING))
                        s.settimeout(None)
                        self.sock = s
                    self.sock.sendall(struct.pack("<I", len(data)) + data)
                    return True
                except (OSError, ConnectionError):
                    self.close()
            return False

    def close(self):
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
        self.sock = None


# ------------------------------------------------------------------------------------ decode
class MooncakeKVReceiverRank:
    """One decode rank's receiving side: its Mooncake TCP transport port (pages in, 8-byte
    status per slice out) and its PULL socket for the prefill's transfer status."""

    def __init__(self, host, state, tp_rank):
        self.lock = threading.Lock()
        self.received = {}  # room -> bytes of pages received
        self.done = set()
        self.transport = _listen(host)
        _serve(self.transport, self._transport_conn, "mooncake_tcp_transport")
        self.status = PullSocket(host, self._status, "decode_thread")
        # Rank 0 sends every rank's addresses: the engine's HTTP pid tells this start's files
        # from a previous one's.
        state.write_json(f"kv_rank_tp{tp_rank}.json", {**self.addrs(), "engine": os.getppid()})

    def addrs(self):
        return {"transport": list(self.transport.getsockname()), "status": list(self.status.addr)}

    def _transport_conn(self, conn):
        try:
            while True:
                room, _offset, length = SLICE_HEADER.unpack(_recv_exact(conn, SLICE_HEADER.size))
                left = length
                while left:
                    chunk = conn.recv(min(left, 1 << 16))
                    if not chunk:
                        raise ConnectionError("peer closed mid-slice")
                    left -= len(chunk)
                with self.lock:
                    self.received[room] = self.received.get(room, 0) + length
                conn.sendall(SLICE_STATUS)
        except (OSError, ConnectionError):
            conn.close()

    def _status(self, msg):
        with self.lock:
            if msg.get("status") == "done":
                self.done.add(int(msg["room"]))

    def arrived(self, room, expected):
        with self.lock:
            return room in self.done and self.received.get(room, 0) >= expected

    def forget(self, room):
        with self.lock:
            self.done.discard(room)
            self.received.pop(room, None)


class DecodeBootstrapClient:
    """Decode rank 0's sessions with each prefill's bootstrap server: one `GET /route` per
    prefill on a kept-alive connection, then a `GET /health` heartbeat session every 5 s."""

    def __init__(self):
        self.routes = {}  # (host, port) -> PushSocket to the prefill's PULL
        self.route_conns = {}
        self.heartbeats = set()
        self.lock = threading.Lock()

    def push_for(self, host, port):
        key = (host, int(port))
        with self.lock:
            push = self.routes.get(key)
        if push is not None:
            return push
        conn = self.route_conns.get(key) or http.client.HTTPConnection(
            host, key[1], timeout=CONNECT_TIMEOUT_S)
        self.route_conns[key] = conn
        try:
            conn.request("GET", "/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0"
                                "&target_pp_rank=0", headers={"Connection": "keep-alive"})
            info = json.loads(conn.getresponse().read())
        except (OSError, http.client.HTTPException, ValueError):
            self.route_conns.pop(key, None)
            conn.close()
            return None
        if not isinstance(info, dict) or "rank_port" not in info:
            return None
        push = PushSocket((info["rank_ip"], info["rank_port"]))
        with self.lock:
            self.routes[key] = push
        if key not in self.heartbeats:
            self.heartbeats.add(key)
            threading.Thread(target=self._heartbeat, args=key, name="heartbeat_checker",
                             daemon=True).start()
        return push

    def drop(self, host, port):
        with self.lock:
            push = self.routes.pop((host, int(port)), None)
        if push is not None:
            push.close()

    def _heartbeat(self, host, port):
        conn = None
        while True:
            time.sleep(HEARTBEAT_S)
            try:
                if conn is None:
                    conn = http.client.HTTPConnection(host, port, timeout=CONNECT_TIMEOUT_S)
                conn.request("GET", "/health", headers={"Connection": "keep-alive"})
                conn.getresponse().read()
            except (OSError, http.client.HTTPException):
                if conn is not None:
                    conn.close()
                conn = None


class MooncakeKVReceiver:
    """Decode rank 0's view of one request's transfer (KVPoll over its own rank's pages)."""

    def __init__(self, manager, req):
        self.manager = manager
        self.req = req
        self.expected = kv_bytes(req.prompt_tokens)
        self.sent = False

    def init(self):
        """Sends the TransferInfo to the prefill; False when it cannot be sent (yet)."""
        r = self.req
        if r.bootstrap_room is None or not r.bootstrap_host:
            return False
        info = {"room": int(r.bootstrap_room), "ranks": self.manager.rank_addrs(),
                "bytes": self.expected}
        for _ in range(2):
            push = self.manager.bootstrap.push_for(r.bootstrap_host, r.bootstrap_port)
            if push is not None and push.send(info):
                self.sent = True
                return True
            # The prefill restarted: ask its bootstrap server again.
            self.manager.bootstrap.drop(r.bootstrap_host, r.bootstrap_port)
        return False

    def poll_done(self):
        return self.manager.rank.arrived(int(self.req.bootstrap_room), self.expected)

    def clear(self):
        self.manager.rank.forget(int(self.req.bootstrap_room))


class MooncakeKVManagerDecode:
    def __init__(self, scheduler):
        self.state = scheduler.state
        self.tp_size = scheduler.server_args.tp_size
        self.rank = MooncakeKVReceiverRank(scheduler.server_args.host, self.state,
                                           scheduler.tp_rank)
        self.bootstrap = DecodeBootstrapClient()
        self._ranks = None

    def rank_addrs(self):
        if self._ranks is None:
            ranks = [self.state.read_json(f"kv_rank_tp{r}.json") for r in range(self.tp_size)]
            if any(x is None or x.get("engine") != os.getppid() for x in ranks):
                return [self.rank.addrs()]  # (the other ranks are still starting)
            self._ranks = [{"transport": x["transport"], "status": x["status"]} for x in ranks]
        return self._ranks


# ------------------------------------------------------------------------------------ prefill
class MooncakeKVManagerPrefill:
    """The prefill rank's PULL socket for TransferInfos (`bootstrap_thread`) and its transfer
    worker writing pages to decode ranks over pooled connections."""

    def __init__(self, scheduler):
        args = scheduler.server_args
        self.lock = threading.Lock()
        self.infos = {}  # room -> TransferInfo
        self.done = set()
        self.pull = PullSocket(args.host, self._transfer_info, "bootstrap_thread")
        self.pools = {}  # (host, port) -> [socket]
        self.status_push = {}  # (host, port) -> PushSocket (cached, as the real _connect)
        self.conns_per_rank = max(1, _env_int("LAB_KV_CONNS", 4))
        self.stall_after = _env_int("LAB_FAULT_KV_SEND_STALL_AFTER", None)
        self.transfers = 0
        self.jobs = queue.Queue()
        threading.Thread(target=self.transfer_worker, name="transfer_worker", daemon=True).start()
        threading.Thread(target=self._register, args=(args.host, args.disaggregation_bootstrap_port),
                         name="register_to_bootstrap", daemon=True).start()

    def _register(self, host, port):
        body = json.dumps({"role": "Prefill", "rank_ip": self.pull.addr[0],
                           "rank_port": self.pull.addr[1], "tp_rank": 0}).encode()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                c = http.client.HTTPConnection(host, port, timeout=CONNECT_TIMEOUT_S)
                c.request("PUT", "/route", body=body, headers={"Content-Type": "application/json"})
                if c.getresponse().status == 200:
                    c.close()
                    return
                c.close()
            except (OSError, http.client.HTTPException):
                pass
            time.sleep(0.2)
        logger.error("could not register with the bootstrap server at %s:%s", host, port)

    def _transfer_info(self, msg):
        with self.lock:
            self.infos[int(msg["room"])] = msg

    def bootstrapped(self, room):
        with self.lock:
            return room in self.infos

    def send(self, room):
        with self.lock:
            info = self.infos.get(room)
        if info is not None:
            self.jobs.put(info)

    def poll_done(self, room):
        with self.lock:
            if room in self.done:
                self.done.discard(room)
                self.infos.pop(room, None)
                return True
            return False

    def transfer_worker(self):
        """Takes every queued transfer at once (at most MAX_BATCH), as Mooncake's transfer
        threads run them side by side: writing them all before reading any ack keeps one
        round trip per batch, not one per request and decode rank."""
        while True:
            batch = [self.jobs.get()]
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self.jobs.get_nowait())
                except queue.Empty:
                    break
            for i, info in enumerate(batch):
                self.transfers += 1
                if self.stall_after is not None and self.transfers > self.stall_after:
                    self._send_batch(batch[:i])
                    self._stall(info)
            self._send_batch(batch)

    def _send_batch(self, batch):
        """Every slice of every transfer in `batch` to every decode rank, then every ack,
        then "done" to each rank's status socket; after an error (decode restarted) each
        transfer again on its own."""
        if not batch:
            return
        try:
            pending = {}
            for info in batch:
                for rank in info["ranks"]:
                    self._write_slices(info["room"], tuple(rank["transport"]), info["bytes"],
                                       pending)
            for sock, count in pending.items():
                _recv_exact(sock, len(SLICE_STATUS) * count)
        except (OSError, ConnectionError):
            for info in batch:
                for rank in info["ranks"]:
                    self._drop(tuple(rank["transport"]))
            for info in batch:
                for rank in info["ranks"]:
                    self.send_kvcache(info["room"], tuple(rank["transport"]), info["bytes"])
        for info in batch:
            for rank in info["ranks"]:
                addr = tuple(rank["status"])
                push = self.status_push.setdefault(addr, PushSocket(addr))
                push.send({"room": info["room"], "status": "done"})
            with self.lock:
                self.done.add(info["room"])

    def _stall(self, info):
        """LAB_FAULT_KV_SEND_STALL_AFTER: the header and half the first slice to the first
        decode rank, then nothing, for good."""
        addr = tuple(info["ranks"][0]["transport"])
        n = _slices(info["bytes"], _env_int("LAB_KV_LAYERS", 8))[0][1]
        sock = self._pooled(addr, 0)
        sock.sendall(SLICE_HEADER.pack(info["room"], 0, n))
        sock.sendall(ZEROS[:n // 2])
        logger.warning("LAB_FAULT_KV_SEND_STALL_AFTER: transfer of room %s stops mid-slice",
                       info["room"])
        threading.Event().wait()

    def _write_slices(self, room, addr, nbytes, pending):
        """A request's pages to one decode rank: a slice per layer and K/V (split at
        MAX_SLICE), round-robin over the pool; counts each socket's acks due in `pending`."""
        for k, (offset, n) in enumerate(_slices(nbytes, _env_int("LAB_KV_LAYERS", 8))):
            sock = self._pooled(addr, k)
            sock.sendall(SLICE_HEADER.pack(room, offset, n))
            sock.sendall(ZEROS[:n])
            pending[sock] = pending.get(sock, 0) + 1

    def send_kvcache(self, room, addr, nbytes):
        """One request's pages to one decode rank, then its acks; connects again once after
        an error."""
        for attempt in range(2):
            try:
                pending = {}
                self._write_slices(room, addr, nbytes, pending)
                for sock, count in pending.items():
                    _recv_exact(sock, len(SLICE_STATUS) * count)
                return
            except (OSError, ConnectionError):
                self._drop(addr)

    def _pooled(self, addr, k):
        pool = self.pools.setdefault(addr, [])
        i = k % self.conns_per_rank
        while len(pool) <= i:
            s = socket.create_connection(addr, timeout=CONNECT_TIMEOUT_S)
            s.settimeout(None)
            pool.append(s)
        return pool[i]

    def _drop(self, addr):
        for s in self.pools.pop(addr, []):
            try:
                s.close()
            except OSError:
                pass
