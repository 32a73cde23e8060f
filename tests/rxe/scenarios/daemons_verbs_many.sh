# 64 uctel-agent processes on verbs (rxe0) against one uctel-collector on verbs, once per data
# path: every agent's UC QP completes into the collector worker's one shared receive CQ, and on
# the Write-with-immediate path takes its receive WRs from the worker's one shared receive queue
# (ibv_create_srq on rxe0; the Send path keeps per-connection buffers on the shared CQ,
# DESIGN.md §4/§6). Asserted from the collector itself: its `agent connected` log lines
# (queues=shared_cq_srq / shared_cq) and uctel_collector_connection_queues{queues}; credit
# words written into the agents' memory (uctel_collector_credit_writes_total{result="posted"}
# > 0); after the Goodbyes exact accounting per agent against its `goodbye sent frames=N` line
# (N = received + lost + dropped after tracking, and N = received + dropped + connection
# frames lost), 0 lost, and frames sent = received over all agents; no async event.
#
# The agents are small: no host metrics, self-metrics every second, one log file of
# $MANY_LINES lines each (from the beginning), no /metrics endpoint of their own.
. /scenarios/common.sh

AGENTS=${MANY_AGENTS:-64}
LINES=${MANY_LINES:-20}

many_config_agent() {
  i=$1 dp=$2
  dir="$D/a$i"
  mkdir -p "$dir/state"
  cat >"$dir/agent.yaml" <<YAML
agent_id: many-$i
collector:
  control: $COLLECTOR_CONTROL
  reconnect_initial_seconds: 0.5
  reconnect_max_seconds: 4
auth:
  token: $TOKEN
sources:
  host_metrics:
    enabled: false
  self_metrics:
    interval_seconds: 1
  logs:
    - path: $dir/input.log
      start_at: beginning
  state_directory: $dir/state
streams:
  metrics:
    data_path: $dp
  logs:
    data_path: $dp
transport:
  kind: verbs
  verbs:
    device: rxe0
    port: 1
YAML
  seq 1 "$LINES" | awk -v a="$i" '{ printf "many-agents line %d of agent %d\n", $1, a }' >"$dir/input.log"
}

many_run() {
  dp=$1
  case "$dp" in
    write_with_imm) mode=shared_cq_srq ;;
    *) mode=shared_cq ;;
  esac
  rm -rf "$D"
  mkdir -p "$D"
  collector_verbs_config "$D/collector.yaml" "$dp"
  uctel-collector --config "$D/collector.yaml" --check-config ||
    fail "$dp: collector --check-config refused $D/collector.yaml"
  i=0
  while [ "$i" -lt "$AGENTS" ]; do
    many_config_agent "$i" "$dp"
    i=$((i + 1))
  done
  uctel-agent --config "$D/a0/agent.yaml" --check-config ||
    fail "$dp: agent --check-config refused $D/a0/agent.yaml"
  uctel-collector --config "$D/collector.yaml" --log-level info >"$D/collector.log" 2>&1 &
  cpid=$!
  wait_listen 9470 || dfail "$dp: collector did not listen on 9470"
  pids=""
  i=0
  while [ "$i" -lt "$AGENTS" ]; do
    uctel-agent --config "$D/a$i/agent.yaml" --log-level info >"$D/a$i/agent.log" 2>&1 &
    pids="$pids $!"
    i=$((i + 1))
  done

  # Every agent connected and every log line arrived.
  want=$((AGENTS * LINES))
  n=0
  while :; do
    scrape "$COLLECTOR_METRICS" "$D/c.prom" || : >"$D/c.prom"
    conn=$(prom_sum "$D/c.prom" uctel_collector_agents_connected)
    got=$(prom_sum "$D/c.prom" uctel_collector_records_received_total stream=logs)
    [ "$conn" = "$AGENTS" ] && [ "$got" -ge "$want" ] && break
    n=$((n + 1))
    [ "$n" -lt 1200 ] && kill -0 "$cpid" 2>/dev/null ||
      { tail -n 40 "$D/collector.log"; fail "$dp: after $((n / 10)) s: $conn of $AGENTS agents connected, $got of $want log lines"; }
    usleep 100000
  done
  # A few self-metrics rounds and credit grants on top.
  sleep 2
  scrape "$COLLECTOR_METRICS" "$D/c-live.prom" || fail "$dp: collector /metrics"
  q_mode=$(prom_sum "$D/c-live.prom" uctel_collector_connection_queues queues=$mode)
  q_all=$(prom_sum "$D/c-live.prom" uctel_collector_connection_queues)
  logged=$(grep "agent connected" "$D/collector.log" | grep -cE "queues=$mode( |\$)")
  writes=$(prom_sum "$D/c-live.prom" uctel_collector_credit_writes_total result=posted)
  refused=$(prom_sum "$D/c-live.prom" uctel_collector_credit_writes_total result=refused)

  for p in $pids; do kill -TERM "$p" 2>/dev/null; done
  arcs=0
  for p in $pids; do
    wait "$p" || arcs=$((arcs + 1))
  done
  n=0
  while :; do
    scrape "$COLLECTOR_METRICS" "$D/c.prom" || : >"$D/c.prom"
    [ "$(prom_sum "$D/c.prom" uctel_collector_agents_connected)" = 0 ] && break
    n=$((n + 1))
    [ "$n" -lt 300 ] || fail "$dp: the collector still counts agents connected 30 s after the Goodbyes"
    usleep 100000
  done
  usleep 1500000
  scrape "$COLLECTOR_METRICS" "$D/c.prom" || fail "$dp: collector /metrics after the Goodbyes"
  kill -TERM "$cpid"
  wait "$cpid"
  crc=$?

  echo "=== $AGENTS verbs agents -> verbs collector, $dp"
  grep -E 'SRQ|shared receive|shared CQ|refused|WARN|ERROR' "$D/collector.log" | head -20
  grep 'agent connected' "$D/collector.log" | head -3
  grep -E '^uctel_collector_(connection_queues|credit_writes_total|rdma_async_events_total|agents_connected)' "$D/c-live.prom"
  [ "$crc" -eq 0 ] || fail "$dp: collector exit status $crc"
  [ "$arcs" = 0 ] || fail "$dp: $arcs agents exited non-zero after SIGTERM"
  [ "$q_mode" = "$AGENTS" ] && [ "$q_all" = "$AGENTS" ] ||
    fail "$dp: connection_queues{queues=\"$mode\"} $q_mode of $q_all connections, want all $AGENTS"
  [ "$logged" = "$AGENTS" ] || fail "$dp: $logged 'agent connected' lines say queues=$mode, want $AGENTS"
  [ "$writes" -gt 0 ] || fail "$dp: no credit write posted (refused $refused)"
  n=$(prom_count "$D/c.prom" uctel_collector_rdma_async_events_total)
  s=$(prom_sum "$D/c.prom" uctel_collector_rdma_async_events_total)
  [ "$n" = 6 ] && [ "$s" = 0 ] || fail "$dp: rdma_async_events_total: $n series, $s events"

  # Exact accounting per agent, and over all of them.
  p() { prom_sum "$D/c.prom" "$@"; }
  total_sent=0 total_rx=0
  i=0
  while [ "$i" -lt "$AGENTS" ]; do
    a=many-$i
    sent=$(log_field "$D/a$i/agent.log" 'goodbye sent' frames)
    [ -n "$sent" ] || { tail -n 20 "$D/a$i/agent.log"; fail "$dp: $a logged no 'goodbye sent frames=N'"; }
    rx=$(p uctel_collector_frames_received_total agent=$a)
    lost=$(p uctel_collector_frames_lost_total agent=$a)
    dropped=$(p uctel_collector_frames_dropped_total agent=$a)
    after=0
    for r in malformed_payload limit_exceeded stale_frame; do
      after=$((after + $(p uctel_collector_frames_dropped_total agent=$a reason=$r)))
    done
    conn_lost=$(p uctel_collector_connection_frames_lost_total agent=$a)
    lines_rx=$(p uctel_collector_records_received_total agent=$a stream=logs)
    [ "$lost" = 0 ] || fail "$dp: $a lost $lost frames on a clean link"
    [ "$sent" -eq $((rx + lost + after)) ] ||
      fail "$dp: $a sent $sent != received $rx + lost $lost + dropped after tracking $after"
    [ "$sent" -eq $((rx + dropped + conn_lost)) ] ||
      fail "$dp: $a sent $sent != received $rx + dropped $dropped + connection lost $conn_lost"
    [ "$lines_rx" = "$LINES" ] || fail "$dp: $a: $lines_rx of $LINES log lines"
    total_sent=$((total_sent + sent))
    total_rx=$((total_rx + rx))
    i=$((i + 1))
  done
  all_rx=$(p uctel_collector_frames_received_total)
  all_lost=$(p uctel_collector_frames_lost_total)
  qp_err=$(p uctel_collector_qp_errors_total)
  echo "$dp: agents sent $total_sent frames, collector received $total_rx (all $all_rx), lost $all_lost, qp_errors $qp_err, credit writes $writes"
  [ "$total_sent" = "$total_rx" ] && [ "$all_rx" = "$total_rx" ] ||
    fail "$dp: frames sent $total_sent, received $total_rx (collector total $all_rx)"
  [ "$all_lost" = 0 ] && [ "$qp_err" = 0 ] || fail "$dp: lost $all_lost, qp_errors $qp_err"
  detail "$dp: $AGENTS agents on $mode, $total_sent frames sent = received, 0 lost, $writes credit writes;"
}

for dp in write_with_imm send; do
  many_run "$dp"
done
