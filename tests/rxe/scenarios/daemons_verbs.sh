# The real daemons on real verbs: uctel-collector and uctel-agent, both with transport.kind
# verbs on rxe0 in the root namespace (the agent's UC QP reaches the collector's through rxe0
# and back), once per data path: RDMA Write-with-immediate into the collector's ring, then UC
# Send into its posted receive buffers. The agent ships host metrics and a log file; after
# SIGTERM (Goodbye) the collector's /metrics must account for every frame (daemons_pipeline in
# common.sh).
#
# Then, per data path, the RDMA series of this run: rxe0's real hw_counters shipped by the
# agent's infiniband sub-collector (node_infiniband_<file>{device="rxe0",port="1"}, one per
# file of ports/1/hw_counters), and the async-event counters of both daemons, every event at
# zero on this clean link (agent /metrics, the agent's shipped self-metrics, collector
# /metrics).
. /scenarios/common.sh

rdma_series() {
  dp=$1
  files=$(ls "$RXE_PORT_DIR/hw_counters" | wc -l)
  shipped=0
  for f in $(ls "$RXE_PORT_DIR/hw_counters"); do
    n=$(prom_count "$D/c-live.prom" "node_infiniband_$f" agent=$AGENT_ID device=rxe0 port=1)
    [ "$n" = 1 ] || fail "$dp: node_infiniband_$f{device=\"rxe0\",port=\"1\"} shipped $n times"
    shipped=$((shipped + 1))
  done
  [ "$files" -gt 0 ] && [ "$shipped" = "$files" ] || fail "$dp: $shipped of $files rxe0 hw_counters shipped"
  for f in rcvd_pkts sent_pkts; do
    v=$(prom_sum "$D/c-live.prom" "node_infiniband_$f" agent=$AGENT_ID device=rxe0 port=1)
    [ "$v" -gt 0 ] || fail "$dp: node_infiniband_$f{device=\"rxe0\"} is $v"
  done
  # The netdev under rxe0 through the ethtool collector (veth: peer_ifindex is its first
  # statistic), and the fast counters: latest value and 1 s rate at the collector.
  n=$(prom_count "$D/c-live.prom" node_ethtool_peer_ifindex agent=$AGENT_ID device=v0)
  [ "$n" = 1 ] || fail "$dp: node_ethtool_peer_ifindex{device=\"v0\"} shipped $n times"
  for f in rcvd_pkts sent_pkts; do
    n=$(prom_count "$D/c-live.prom" "node_infiniband_${f}_per_second" agent=$AGENT_ID device=rxe0 port=1)
    [ "$n" = 1 ] || fail "$dp: node_infiniband_${f}_per_second{device=\"rxe0\"} served $n times"
  done
  fs=$(prom_sum "$D/c.prom" uctel_collector_records_received_total agent=$AGENT_ID stream=fast_counters)
  [ "$fs" -gt 0 ] || fail "$dp: no fast_counters samples received"
  echo "--- RDMA series ($dp)"
  grep -E '^node_infiniband_(rcvd_pkts|sent_pkts|state_id)(_per_second)?\{' "$D/c-live.prom"
  grep -E '^node_ethtool_[a-z_]*\{.*device="v0"' "$D/c-live.prom" | head -5
  grep -E '^uctel_(agent|collector)_rdma_' "$D/a.prom" "$D/c-live.prom"
  for where in "a.prom uctel_agent_rdma_async_events_total" \
    "c-live.prom uctel_agent_rdma_async_events_total agent=$AGENT_ID" \
    "c.prom uctel_collector_rdma_async_events_total"; do
    # shellcheck disable=SC2086
    set -- $where
    file=$1
    shift
    n=$(prom_count "$D/$file" "$@")
    s=$(prom_sum "$D/$file" "$@")
    # The collector's two more: srq_limit and srq_error (it creates an SRQ; the agent none).
    want=4
    [ "$1" != uctel_collector_rdma_async_events_total ] || want=6
    [ "$n" = "$want" ] || fail "$dp: $* in $file: $n samples, want $want (one per event)"
    [ "$s" = 0 ] || fail "$dp: $* in $file: $s async events on a clean link"
  done
  detail "$dp: $fs fast_counters samples received, $shipped rxe0 hw_counters shipped (rcvd_pkts $(prom_sum "$D/c-live.prom" node_infiniband_rcvd_pkts agent=$AGENT_ID device=rxe0)), async events 0/0;"
}

for dp in write_with_imm send; do
  daemons_pipeline root verbs "$dp"
  rdma_series "$dp"
done
