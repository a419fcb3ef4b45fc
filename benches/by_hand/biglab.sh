#!/usr/bin/env bash
# Usage: biglab.sh up|load SECS|down   (run dir /tmp/biglab-$TAG, base port from $PORT)
# Brings up the 2 x TP8 lab (issue 15's big node) from the repo in $REPO (default: this checkout).
set -euo pipefail
REPO=${REPO:-$(cd "$(dirname "$0")/../.." && pwd)}
TAG=${TAG:-main}
PORT=${PORT:-31000}
RUN=/tmp/biglab-$TAG
case "$1" in
  up) python3 "$REPO/tests/lab/lab.py" up --run-dir "$RUN" --tp-size 8 --base-port "$PORT" \
        --decode-env SGLANG_DECODE_PREALLOC_SPLIT_TOKENS=4000 >/dev/null && echo "$RUN/lab.json";;
  load) python3 "$REPO/tests/lab/lab.py" load --run-dir "$RUN" --agents "${AGENTS:-200}" \
        --max-tokens 32 --duration "$2";;
  down) python3 "$REPO/tests/lab/lab.py" down --run-dir "$RUN";;
  nvml) python3 -c "import json;print(json.load(open('$RUN/lab.json'))['nvml_dir'])";;
esac
