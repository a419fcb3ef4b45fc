"""Server arguments: the subset of real SGLang flags the lab understands.

Unknown flags are accepted and ignored so that real-looking command lines still start.
"""

import argparse
import dataclasses
import logging

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class ServerArgs:
    model_path: str
    host: str = "127.0.0.1"
    port: int = 30000
    served_model_name: str = ""
    tp_size: int = 1
    dp_size: int = 1
    base_gpu_id: int = 0
    gpu_id_step: int = 1
    disaggregation_mode: str = "null"
    disaggregation_bootstrap_port: int = 8998
    disaggregation_transfer_backend: str = "mooncake"
    enable_metrics: bool = False
    decode_log_interval: int = 40
    mem_fraction_static: float = 0.88
    max_running_requests: int = 256
    context_length: int = 32768
    log_level: str = "info"
    unknown_args: list = dataclasses.field(default_factory=list)

    @property
    def engine_type(self) -> str:
        # DisaggregationMode.to_engine_type: null -> unified
        return {"prefill": "prefill", "decode": "decode"}.get(self.disaggregation_mode, "unified")


def prepare_server_args(argv):
    p = argparse.ArgumentParser(prog="sglang.launch_server")
    p.add_argument("--model-path", "--model", dest="model_path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--served-model-name", default="")
    p.add_argument("--tp-size", "--tp", dest="tp_size", type=int, default=1)
    p.add_argument("--dp-size", "--dp", dest="dp_size", type=int, default=1)
    p.add_argument("--base-gpu-id", type=int, default=0)
    p.add_argument("--gpu-id-step", type=int, default=1)
    p.add_argument("--disaggregation-mode", default="null", choices=["null", "prefill", "decode"])
    p.add_argument("--disaggregation-bootstrap-port", type=int, default=8998)
    p.add_argument("--disaggregation-transfer-backend", default="mooncake")
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--decode-log-interval", type=int, default=40)
    p.add_argument("--mem-fraction-static", type=float, default=0.88)
    p.add_argument("--max-running-requests", type=int, default=256)
    p.add_argument("--context-length", type=int, default=32768)
    p.add_argument("--log-level", default="info")
    ns, unknown = p.parse_known_args(argv)
    args = ServerArgs(**vars(ns), unknown_args=unknown)
    if not args.served_model_name:
        args.served_model_name = args.model_path
    if unknown:
        logger.warning("lab sglang: ignoring unsupported arguments %s", unknown)
    return args
