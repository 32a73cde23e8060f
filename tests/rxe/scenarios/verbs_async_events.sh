# Asynchronous events surface through the verbs transport as errors, not hangs:
#  1. a receive CQ left unpolled overflows: rxe raises IBV_EVENT_CQ_ERR, the receiving QP moves
#     to ERROR, and post_send on it is refused;
#  2. the netdev under rxe0 goes down and up: IBV_EVENT_PORT_ERR then IBV_EVENT_PORT_ACTIVE
#     arrive as port-change events; the port is ACTIVE again afterwards;
#  3. the same flap seen by uctel-agent's infiniband sub-collector (sysfs, every second; no
#     collector needed, host metrics run while the agent retries its connection):
#     uctel_agent_rdma_port_state_changes_total{device="rxe0",port="1"} counts to="down" then
#     to="active", logged once. (The async-event counters need a daemon's own QP in ERROR,
#     which only rxe_uc provokes here; daemons_verbs checks they exist and stay 0.)
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
port_back() {
  i=0
  while [ "$(cat "$RXE_PORT_DIR/state")" != "4: ACTIVE" ] ||
    [ "$(cat "$RXE_PORT_DIR/gid_attrs/types/1" 2>/dev/null)" != "RoCE v2" ]; do
    i=$((i + 1))
    [ "$i" -lt 100 ] || fail "rxe0 did not come back ACTIVE with its RoCE v2 GID"
    usleep 100000
  done
}
port_back
[ "$rc" -eq 0 ] || fail "port-events: $(grep '^RESULT' /tmp/port.log | cut -c1-300)"
detail "port down/up: both events;"

# 3. The agent's view of a flap.
rm -rf "$D"
mkdir -p "$D/agent-state"
: >"$D/input.log"
agent_config "$D/agent.yaml" verbs write_with_imm
uctel-agent --config "$D/agent.yaml" --log-level info >"$D/agent.log" 2>&1 &
apid=$!
wait_listen 9471 || fail "the agent did not listen on 9471"
# The baseline collection (at start) and one more.
usleep 2500000
changes() {
  scrape "$AGENT_METRICS" "$D/a.prom" || : >"$D/a.prom"
  prom_sum "$D/a.prom" uctel_agent_rdma_port_state_changes_total device=rxe0 port=1 "$@"
}
[ "$(changes)" = 0 ] || fail "agent: port state changes before the flap: $(grep rdma_port "$D/a.prom")"
/usr/sbin/ip link set v0 down
i=0
until [ "$(changes to=down)" -ge 1 ]; do
  i=$((i + 1))
  [ "$i" -lt 100 ] || { /usr/sbin/ip link set v0 up; fail "agent: no to=down change within 10 s"; }
  usleep 100000
done
/usr/sbin/ip link set v0 up
i=0
until [ "$(changes to=active)" -ge 1 ]; do
  i=$((i + 1))
  [ "$i" -lt 100 ] || fail "agent: no to=active change within 10 s"
  usleep 100000
done
gids=$(prom_sum "$D/a.prom" uctel_agent_rdma_gid_changes_total device=rxe0 port=1)
down=$(prom_sum "$D/a.prom" uctel_agent_rdma_port_state_changes_total device=rxe0 port=1 to=down)
up=$(prom_sum "$D/a.prom" uctel_agent_rdma_port_state_changes_total device=rxe0 port=1 to=active)
kill -TERM "$apid"
wait "$apid"
echo "--- agent RDMA series after the flap"
grep '^uctel_agent_rdma_' "$D/a.prom"
echo "--- agent log lines about it"
grep -F 'RDMA' "$D/agent.log"
logged=$(grep -c 'RDMA port state changed' "$D/agent.log")
[ "$logged" = 1 ] || fail "agent: $logged 'RDMA port state changed' log lines, want 1"
port_back
detail "agent: port state changes to down $down, to active $up, GID changes $gids, logged once;"
