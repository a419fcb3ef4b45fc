#!/usr/bin/env bash
# Installs the real Mermaid library for tests/report.rs (the stuck requests' diagram is
# checked by Mermaid's own parser): Node.js and jsdom from Debian, and mermaid.min.js
# 11.16.0 as the PyPI package artoo-mermaid vendors it (checked against its sha256) into
# tests/mermaid/.mermaid/. Idempotent; run by tests/run-all.sh (beside the Prometheus set-up: apt
# waits for its lock).
set -euo pipefail
cd "$(dirname "$0")"
want=74d7c46dabca328c2294733910a8aa1ed0c37451776e8d5295da38a2b758fb9b
js=.mermaid/mermaid.min.js
if [ ! -x /usr/bin/node ] || [ ! -d /usr/share/nodejs/jsdom ]; then
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends nodejs node-jsdom \
        || { $sudo apt-get update && $sudo env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends nodejs node-jsdom; }
fi
if [ -f "$js" ] && echo "$want  $js" | sha256sum -c --status; then
    echo "mermaid: $js present"
    exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# The wheel is pure data; its Python requirement (>= 3.12) does not matter to a download.
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
    --dest "$tmp" artoo-mermaid==11.16.0
python3 - "$tmp" <<'PY'
import glob, sys, zipfile
whl = glob.glob(sys.argv[1] + "/artoo_mermaid-11.16.0-*.whl")[0]
with zipfile.ZipFile(whl) as z:
    data = z.read("artoo_mermaid/assets/mermaid.min.js")
open(sys.argv[1] + "/mermaid.min.js", "wb").write(data)
PY
echo "$want  $tmp/mermaid.min.js" | sha256sum -c --status \
    || { echo "mermaid: mermaid.min.js does not match its sha256" >&2; exit 1; }
mkdir -p .mermaid
mv "$tmp/mermaid.min.js" "$js"
echo "mermaid: installed $js"
