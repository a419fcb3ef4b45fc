#!/bin/sh
# A transport for `fleet snapshot` tests: `fake-node.sh NODE CMD...` plays node NODE.
# FAKE_FLEET_DIR holds NODE.json (printed as that node's snapshot); nodes named
#   slow-*  write their pid to FAKE_FLEET_DIR/NODE.pid and hang (the timeout must kill them),
#   fail-*  exit 5 with a reason on stderr,
#   junk-*  print something that is not a snapshot,
#   run-*   run CMD... for real with WEDGEWATCH_NODE=NODE (the real binary),
#   setsid-* leave two sleepers in sessions of their own (one its child, one orphaned at
#            once), each writing its pid to FAKE_FLEET_DIR/NODE.child and NODE.orphan, then hang,
#   leave-*  the same sleepers (stdout closed), then answer with NODE.json and exit.
node="$1"; shift
d="$FAKE_FLEET_DIR"
sleepers() {
  setsid sh -c 'echo $$ > "$0"; exec sleep 300' "$d/$node.child" </dev/null >/dev/null 2>&1 &
  setsid sh -c 'sh -c '\''echo $$ > "$0"; exec sleep 300'\'' "$0" & exit 0' "$d/$node.orphan" \
    </dev/null >/dev/null 2>&1 &
  while [ ! -s "$d/$node.child" ] || [ ! -s "$d/$node.orphan" ]; do sleep 0.1; done
}
case "$node" in
  setsid-*) sleepers; echo $$ > "$d/$node.pid"; exec sleep 300 ;;
  leave-*)  sleepers; exec cat "$d/$node.json" ;;
  slow-*) echo $$ > "$FAKE_FLEET_DIR/$node.pid"; exec sleep 300 ;;
  fail-*) echo "ssh: connect to host $node port 22: Connection refused" >&2; exit 5 ;;
  junk-*) echo "Welcome to $node! Last login: yesterday"; exit 0 ;;
  run-*)  WEDGEWATCH_NODE="$node" exec "$@" ;;
  *)      exec cat "$FAKE_FLEET_DIR/$node.json" ;;
esac
