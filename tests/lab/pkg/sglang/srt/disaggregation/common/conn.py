"""The PD bootstrap server (sglang/srt/disaggregation/common/conn.py `CommonKVBootstrapServer`):
an aiohttp app the prefill HTTP process serves on `--disaggregation-bootstrap-port`. Prefill
ranks register their PULL address (`PUT /route`); decode ranks ask for it (`GET /route`, then
keep the session) and send a heartbeat (`GET /health`) every few seconds."""

from aiohttp import web


class CommonKVBootstrapServer:
    def __init__(self, server_args):
        self.args = server_args
        self.prefill_port_table = {}  # tp_rank -> {"rank_ip", "rank_port"}

    async def _handle_route(self, request):
        if request.method == "PUT":
            try:
                body = await request.json()
                rank = int(body.get("tp_rank", 0))
                self.prefill_port_table[rank] = {"rank_ip": body["rank_ip"],
                                                 "rank_port": int(body["rank_port"])}
            except (ValueError, KeyError, TypeError):
                return web.Response(status=400, text="bad registration")
            return web.Response(status=200, text="OK")
        target = request.query.get("target_tp_rank", "0")
        if target == "-1":
            a = self.args
            return web.json_response({"prefill_attn_tp_size": a.tp_size, "prefill_dp_size": 1,
                                      "prefill_pp_size": 1, "prefill_page_size": 1,
                                      "transfer_backend": a.disaggregation_transfer_backend})
        try:
            info = self.prefill_port_table.get(int(target))
        except ValueError:
            info = None
        if info is None:
            return web.Response(status=404, text="prefill rank not registered")
        return web.json_response(info)

    async def _handle_health(self, request):
        return web.Response(status=200, text="OK")

    def app(self):
        app = web.Application()
        app.router.add_route("*", "/route", self._handle_route)
        app.router.add_get("/health", self._handle_health)
        return app
