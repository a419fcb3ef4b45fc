#!/usr/bin/env python3
"""Writes the seed inputs of every fuzz target into fuzz/seeds/<target>/ from real material
in the repository (fixtures, probes, expositions) plus a few hostile inputs.

The committed corpora (fuzz/corpus/) were grown from these seeds and minimised with
`cargo fuzz cmin`; see docs/reliability.md. Run from the repository root.
"""
import os
import re
import struct
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "fuzz" / "seeds"
MAX = 60 * 1024


def put(target, name, data):
    d = OUT / target
    d.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    (d / name).write_bytes(data[:MAX])


def prom():
    for src in ["tests/prom_fuzz.rs", "tests/metrics.rs"]:
        text = (ROOT / src).read_text()
        for i, m in enumerate(re.findall(r'r#"(.*?)"#', text, re.S)):
            if "# TYPE" in m or re.search(r"^\w+(\{.*\})? \S+$", m, re.M):
                put("prom", f"{Path(src).stem}-{i}", b"\0" + m.encode())
                put("prom", f"{Path(src).stem}-{i}-cut", b"\1" + m.encode()[: len(m) // 2])
    put("prom", "hostile-labels", b'\0m{a="\\',)
    put("prom", "hostile-nan", b"\0x NaN\ny +Inf -1\nz 1e999999 99999999999999999999\n")
    put("prom", "hostile-bytes", b"\0\xff\xfe# TYPE \xc3 counter\n\xc3\x28{}= 1\n")


def http():
    body = b"# TYPE x gauge\nx 1\n"
    ok = b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(body)
    put("http_response", "ok", ok + body)
    chunks = b"5\r\nhello\r\n3;ext=1\r\n xy\r\n0\r\n\r\n"
    put("http_response", "chunked",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks)
    put("http_response", "chunk-huge",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\nab\r\n")
    put("http_response", "not-found", b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
    put("http_response", "no-status", b"garbage\r\n\r\nbody")
    put("http_response", "torn-header", b"HTTP/1.0 200 OK\r\nContent-Le")
    put("http_response", "bad-length",
        b"HTTP/1.0 200\r\ncontent-length: -1\r\ncontent-length: 99999999999999999999\r\n\r\n")
    put("http_response", "status-bytes", b"HTTP/1.0 \xff\xfe 2\x00\n\r\n\r\n")


def pyspy():
    for p in sorted((ROOT / "tests/fixtures/pyspy").glob("*.json")):
        put("pyspy_json", p.stem, p.read_bytes())
    put("pyspy_json", "hostile-types",
        '[{"thread_id":1,"os_thread_id":-5,"thread_name":null,"active":true,"owns_gil":false,'
        '"frames":[{"name":"","filename":"","line":-1}]}]')
    put("pyspy_json", "hostile-deep", "[" * 5000)


def probes():
    for p in sorted((ROOT / "probes").glob("*.toml")):
        put("probe_toml", p.stem, p.read_bytes())
    put("probe_toml", "hostile-regex",
        '[[profile]]\nname="x"\nstack="s"\nrole="engine"\nmatch_comm=["(a{1000}){1000}"]\n')
    put("probe_toml", "hostile-depth",
        '[[stack_rule]]\nname="r"\nstate="idle"\ninnermost=["f"]\ninnermost_depth=0\n')
    put("probe_toml", "hostile-port",
        '[[profile]]\nname="x"\nstack="s"\nrole="engine"\nmatch_comm=["x"]\ndefault_port=0\n')


def thresholds():
    for p in ["tests/fixtures/thresholds-fast.toml",
              "tests/fixtures/recordings/short-hang-thresholds.toml"]:
        put("thresholds_toml", Path(p).stem, (ROOT / p).read_bytes())
    put("thresholds_toml", "negative-window", "link_window_ms = -1000\n")
    put("thresholds_toml", "huge", "stale_after_ms = 9223372036854775807\n")
    put("thresholds_toml", "nan", "spin_power_frac = nan\n")
    put("thresholds_toml", "type", 'wedged_after_ms = "30s"\n[x]\ny = 1\n')


def gz_member(lines):
    """A gzip member as the recording writer frames it: FNAME "wwrec", sync flush a line."""
    head = b"\x1f\x8b\x08\x08" + struct.pack("<I", 0) + b"\x00\xff" + b"wwrec\x00"
    z = zlib.compressobj(6, zlib.DEFLATED, -15)
    body = b"".join(z.compress(l) + z.flush(zlib.Z_SYNC_FLUSH) for l in lines)
    body += z.flush(zlib.Z_FINISH)
    raw = b"".join(lines)
    return head + body + struct.pack("<II", zlib.crc32(raw), len(raw) & 0xFFFFFFFF)


def recordings():
    rec = (ROOT / "tests/fixtures/recordings/wedged-decode.rec").read_bytes()
    lines = [l + b"\n" for l in rec.split(b"\n") if l]
    small = []
    for l in lines:
        if sum(map(len, small)) + len(l) > 40 * 1024:
            continue
        small.append(l)
    plain = b"".join(small)
    put("recording", "plain", plain)
    put("recording", "plain-torn", plain[: len(plain) * 2 // 3])
    put("recording", "plain-badcrc", b"00000000" + plain[8:])
    gz = gz_member(small[: len(small) // 2]) + gz_member(small[len(small) // 2:])
    put("recording", "gz-two-members", gz)
    put("recording", "gz-torn", gz[: len(gz) // 3])
    put("recording", "gz-damaged", gz[:200] + b"\x00\x00\xff\xff" + gz[210:])


def daemon():
    for i, line in enumerate([
        "snapshot\n", "snapshot 300\n", "perfetto 5\n", "baseline\n", "sources\n",
        "ping\n", "snapshot -1\n", "snapshot 9223372036854775807\n", "nope 1 2 3\n",
        "perfetto 99999999999999999999\n", "  \n",
    ]):
        put("daemon_request", f"req{i}", line)
    put("daemon_request", "not-utf8", b"snap\xffshot\n")
    put("daemon_request", "long", b"snapshot " + b"9" * 400)


def metrics_request():
    for i, head in enumerate([
        b"GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n", b"GET /metrics?x=1 HTTP/1.0\r\n\r\n",
        b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc", b"GET / HTTP/1.1\r\n\r\n",
        b"GET /metrics\r\n\r\n", b"GET  /metrics HTTP/1.1\n\n", b"\x16\x03\x01\x02\x00",
        b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n", b"GET /m\xffetrics HTTP/1.1\r\n\r\n",
    ]):
        # The first byte is the size of the pieces the head arrives in (fuzz_entry).
        for cut in (1, 16, 255):
            put("metrics_request", f"head{i}-{cut}", bytes([cut]) + head)


def snapshots():
    """The committed fixture snapshots, and, for `bundle`, each as every on-disk layout
    (first byte: snapshot.json and the manifest each a file, link, FIFO or directory)."""
    manifest = b'{"schema":"wedgewatch.bundle/1","files":["snapshot.json","report.md"]}'
    for f in sorted((ROOT / "tests/fixtures/snapshots").glob("*.json")):
        data = f.read_bytes()
        put("snapshot", f.stem, data)
        for kind in range(16):
            put("bundle", f"{f.stem}-{kind}", bytes([kind]) + manifest + b"\0" + data)
    put("snapshot", "schema-only", b'{"schema":"wedgewatch.snapshot/1"}')
    put("snapshot", "other-schema", b'{"schema":"other"}')
    put("bundle", "truncated", b"\0" + manifest + b"\0{")
    put("bundle", "fifo-and-dir", b"\x0a\0")


if __name__ == "__main__":
    for f in [prom, http, pyspy, probes, thresholds, recordings, daemon, metrics_request,
              snapshots]:
        f()
    for d in sorted(OUT.iterdir()):
        print(d.name, len(list(d.iterdir())))
