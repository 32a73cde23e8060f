# Asynchronous events surface through the verbs transport as errors, not hangs:
#  1. a receive CQ left unpolled overflows: rxe raises IBV_EVENT_CQ_ERR, the receiving QP moves
#     to ERROR, and post_send on it is refused;
#  2. the netdev under rxe0 goes down and up: IBV_EVENT_PORT_ERR then IBV_EVENT_PORT_ACTIVE
#     arrive as port-change events; the port is ACTIVE again afterwards.
. /scenarios/common.sh
rxe_uc cq-overflow --timeout-ms 10000 >/tmp/ovf.log 2>&1
rc=$?
sed 's/^/  | /' /tmp/ovf.log
[ "$rc" -eq 0 ] || fail "cq-overflow: $(grep '^RESULT' /tmp/ovf.log | cut -c1-300)"
detail "CQ overflow: CQ error event, QP ERROR, send refused;"

rxe_uc port-events --timeout-ms 20000 >/tmp/port.log 2>&1 &
pid=$!
i=0
until grep -q '^READY' /tmp/port.log; do
  i=$((i + 1))
  [ "$i" -lt 100 ] || fail "port-events did not start"
  usleep 100000
done
/usr/sbin/ip link set v0 down
usleep 500000
/usr/sbin/ip link set v0 up
wait "$pid"
rc=$?
sed 's/^/  | /' /tmp/port.log
i=0
while [ "$(cat "$RXE_PORT_DIR/state")" != "4: ACTIVE" ] ||
  [ "$(cat "$RXE_PORT_DIR/gid_attrs/types/1" 2>/dev/null)" != "RoCE v2" ]; do
  i=$((i + 1))
  [ "$i" -lt 100 ] || fail "rxe0 did not come back ACTIVE with its RoCE v2 GID"
  usleep 100000
done
[ "$rc" -eq 0 ] || fail "port-events: $(grep '^RESULT' /tmp/port.log | cut -c1-300)"
detail "port down/up: both events;"
