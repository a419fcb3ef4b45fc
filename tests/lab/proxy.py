"""Streaming passthrough proxy in front of the router (the incident's "proxies").

    python proxy.py --listen-port P --upstream http://127.0.0.1:R [--host 127.0.0.1]

Every request is forwarded to the upstream with its method, path, query and body; the
response status, headers and body are relayed chunk by chunk (SSE is not re-buffered).
Upstream response headers are relayed only when the upstream sends them, so a request the
engines never answer shows zero response bytes all the way to the client.

Fault (accumulating state): LAB_PROXY_LEAK=1 leaks one upstream connection per request (a new
client session per request, never closed, and its pool slot never returned). After
LAB_PROXY_LEAK_LIMIT (default 6) requests the pool is exhausted and new requests are accepted
but never forwarded. Restarting the proxy frees everything.

Fault (CLOSE_WAIT leak): LAB_PROXY_LEAK=close_wait asks the upstream to close each connection
after its response (`Connection: close`) and keeps a duplicate of the upstream socket's fd that
is never closed (the classic fd leak: a dup, or a child that inherited it). The router hangs
up, the proxy never does, so every forwarded request leaves one upstream socket in CLOSE_WAIT
held by the proxy. Its pool slot is never returned either: after LAB_PROXY_LEAK_LIMIT requests
new ones are accepted but never forwarded, and a restart unfreezes it for that many more.

GET /lab/proxy_status answers locally: {"leak": bool, "leaked": n, "limit": n, "waiting": n}.
"""

import argparse
import asyncio
import os
import signal

import aiohttp
from aiohttp import web

HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
       "trailers", "transfer-encoding", "upgrade", "host", "content-length"}


class Proxy:
    def __init__(self, upstream):
        self.upstream = upstream.rstrip("/")
        mode = os.environ.get("LAB_PROXY_LEAK", "")
        self.leak = mode not in ("", "0")
        self.close_wait = mode == "close_wait"
        self.held_fds = []  # close_wait mode: duplicated upstream fds, never closed
        self.limit = int(os.environ.get("LAB_PROXY_LEAK_LIMIT", "6") or 6)
        self.leaked = []
        self.waiting = 0
        self.slots = asyncio.Semaphore(self.limit) if self.leak else None
        self.session = None

    async def start(self):
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=256),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5), auto_decompress=False)

    async def status(self, request):
        leaked = len(self.held_fds) if self.close_wait else len(self.leaked)
        return web.json_response({"leak": self.leak, "close_wait": self.close_wait,
                                  "leaked": leaked,
                                  "limit": self.limit, "waiting": self.waiting,
                                  "upstream": self.upstream})

    async def _session_for_request(self):
        if not self.leak:
            return self.session
        self.waiting += 1
        try:
            await self.slots.acquire()  # never released: the leaked pool slot
        finally:
            self.waiting -= 1
        if self.close_wait:
            return self.session
        s = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=1, keepalive_timeout=3600),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5), auto_decompress=False)
        self.leaked.append(s)  # never closed: its connection stays open
        return s

    def _hold_upstream_fd(self, up):
        """close_wait mode: keep a second fd on the upstream socket. aiohttp closes its own
        fd after the response, but the socket lives while any fd refers to it, so no FIN is
        ever sent: when the router hangs up, the socket sits in CLOSE_WAIT."""
        conn = up.connection
        sock = conn.transport.get_extra_info("socket") if conn and conn.transport else None
        if sock is not None:
            self.held_fds.append(os.dup(sock.fileno()))

    async def forward(self, request):
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        session = await self._session_for_request()
        url = self.upstream + request.rel_url.path_qs
        if self.close_wait:
            # The upstream closes after this response; aiohttp does not pool the connection.
            headers["Connection"] = "close"
        try:
            up = await session.request(request.method, url, data=body, headers=headers)
        except aiohttp.ClientError as e:
            return web.json_response({"error": f"proxy: upstream unreachable: {e}"}, status=502)
        if self.close_wait:
            self._hold_upstream_fd(up)
        try:
            resp = web.StreamResponse(status=up.status, reason=up.reason)
            for k, v in up.headers.items():
                if k.lower() not in HOP:
                    resp.headers.add(k, v)
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp
        except (aiohttp.ClientError, ConnectionResetError, asyncio.CancelledError):
            up.close()
            raise
        finally:
            up.release()


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--listen-port", type=int, required=True)
    ap.add_argument("--upstream", required=True)
    a = ap.parse_args()
    proxy = Proxy(a.upstream)
    await proxy.start()
    app = web.Application(client_max_size=64 << 20)
    app.router.add_get("/lab/proxy_status", proxy.status)
    app.router.add_route("*", "/{tail:.*}", proxy.forward)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, a.host, a.listen_port, reuse_address=True).start()
    print(f"proxy listening on {a.host}:{a.listen_port} -> {a.upstream} leak={proxy.leak} "
          f"close_wait={proxy.close_wait}",
          flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    try:
        await asyncio.wait_for(runner.cleanup(), 2)
    except asyncio.TimeoutError:
        pass


if __name__ == "__main__":
    asyncio.run(main())
