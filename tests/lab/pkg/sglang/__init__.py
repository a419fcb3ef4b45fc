"""Lab stand-in for the `sglang` package (wedgewatch test lab, tests/lab/).

It reproduces the *observable surface* of an SGLang engine (cmdline, process titles, Python
frame names, HTTP endpoints, Prometheus names) without torch or a GPU. Nothing here computes
anything: forwards are timed sleeps and tokens are words.
"""

__version__ = "0.5.23.lab"
