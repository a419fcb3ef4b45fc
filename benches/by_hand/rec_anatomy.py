#!/usr/bin/env python3
"""What a recording dir's bytes are: per record type/kind, and of socket deltas per part.
Usage: rec_anatomy.py RECORDING_DIR"""
import sys, os, zlib, json, collections
def lines(path):
    data = open(path, 'rb').read()
    out = b''
    while data:
        d = zlib.decompressobj(31)
        try:
            out += d.decompress(data)
        except zlib.error:
            break
        data = d.unused_data
        if not d.eof:
            break
    return out.split(b'\n')
sz = collections.Counter(); n = collections.Counter(); parts = collections.Counter()
gz = 0
for f in sorted(os.listdir(sys.argv[1])):
    p = os.path.join(sys.argv[1], f); gz += os.path.getsize(p)
    for l in lines(p):
        if len(l) < 10: continue
        r = json.loads(l[9:])
        k = (r['type'], r.get('kind'), r.get('key'))
        sz[k] += len(l); n[k] += 1
        if r['type'] == 'delta' and r['kind'] == 'sockets' and not r['key']:
            socks = r['data'].get('$p', {}).get('sockets', {})
            for part, v in socks.items():
                parts[part] += len(json.dumps(v, separators=(',', ':')))
                if part == '$n': parts['#new'] += len(v)
                if part == '$r': parts['#removed'] += len(v)
                if part == '$u': parts['#updated'] += len(v)
print(f"compressed {gz} B, raw {sum(sz.values())} B")
for k, v in sz.most_common():
    print(f"  {k}: {n[k]} records, {v} B raw")
print("socket delta parts (raw bytes / counts):", dict(parts))
