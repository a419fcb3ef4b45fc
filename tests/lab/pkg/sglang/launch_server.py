"""`python -m sglang.launch_server ...`: same entry point name as real SGLang."""

from sglang.srt.entrypoints.http_server import launch_server
from sglang.srt.server_args import prepare_server_args

if __name__ == "__main__":
    import sys

    launch_server(prepare_server_args(sys.argv[1:]))
