#!/bin/sh
# A transport for `fleet snapshot` tests: `fake-node.sh NODE CMD...` plays node NODE.
# FAKE_FLEET_DIR holds NODE.json (printed as that node's snapshot); nodes named
#   slow-*  write their pid to FAKE_FLEET_DIR/NODE.pid and hang (the timeout must kill them),
#   fail-*  exit 5 with a reason on stderr,
#   junk-*  print something that is not a snapshot,
#   run-*   run CMD... for real with WEDGEWATCH_NODE=NODE (the real binary).
node="$1"; shift
case "$node" in
  slow-*) echo $$ > "$FAKE_FLEET_DIR/$node.pid"; exec sleep 300 ;;
  fail-*) echo "ssh: connect to host $node port 22: Connection refused" >&2; exit 5 ;;
  junk-*) echo "Welcome to $node! Last login: yesterday"; exit 0 ;;
  run-*)  WEDGEWATCH_NODE="$node" exec "$@" ;;
  *)      exec cat "$FAKE_FLEET_DIR/$node.json" ;;
esac
