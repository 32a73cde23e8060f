# The reliability class per stream on the real daemons (DESIGN.md §8b): uctel-agent with
# `streams.logs.reliability: rc` and metrics on UC, uctel-collector on verbs (rxe0).
#
#   1. verbs agent (rxe0, root namespace) on a clean link: both daemons create RC QPs through
#      rdma-core and rxe carries the logs lane; the pipeline checks of daemons_verbs hold.
#   2. soft agent in ns2 (UDP 10.77.0.2:4791) with 2 % of its datagrams dropped both ways
#      (data to rxe0, rxe0's acknowledgements back; the guest has no nftables, so the drop is
#      the soft side's fault injector): every one of the LINES log lines arrives (records and
#      sink), the logs stream loses no frame, and what the metrics streams (still UC) lose is
#      counted: the accounting is exact against the agent's Goodbye. (A few hundred UC frames
#      at 2 % may lose none, so no count of UC loss is required.)
#
# On top of daemons_pipeline (common.sh): the collector served rc_gap_frames_total{agent} and
# it is 0, it logged the lane's QP (rc_qpn), the agent exports its 9 RC QP event series, and
# on the lossy link the soft RC QP retransmitted and rxe0's responder saw the gaps
# (out_of_seq_request or duplicate_request moved).
. /scenarios/common.sh

rc_checks() {
  label=$1 lossy=$2
  n=$(prom_count "$D/c.prom" uctel_collector_rc_gap_frames_total agent=$AGENT_ID)
  [ "$n" = 1 ] || fail "$label: uctel_collector_rc_gap_frames_total{agent=\"$AGENT_ID\"} served $n times (no RC lane?)"
  gaps=$(prom_sum "$D/c.prom" uctel_collector_rc_gap_frames_total agent=$AGENT_ID)
  [ "$gaps" = 0 ] || fail "$label: $gaps frames missing on the RC lane"
  rcq=$(log_field "$D/collector.log" 'agent connected' rc_qpn)
  [ -n "$rcq" ] || fail "$label: the collector logged no rc_qpn at 'agent connected'"
  ev=$(prom_count "$D/a.prom" uctel_agent_rc_qp_events_total)
  [ "$ev" = 9 ] || fail "$label: the agent exports $ev uctel_agent_rc_qp_events_total series, want 9"
  retx=$(prom_sum "$D/a.prom" uctel_agent_rc_qp_events_total event=packets_retransmitted)
  naks=$(prom_sum "$D/a.prom" uctel_agent_rc_qp_events_total event=naks_received)
  oos=$(awk 'NR == FNR { b[$1] = $2; next } $1 == "out_of_seq_request" || $1 == "duplicate_request" { d += $2 - b[$1] } END { print d + 0 }' \
    "$D/rxe.before" "$D/rxe.after")
  mlost=$(prom_sum "$D/c.prom" uctel_collector_frames_lost_total agent=$AGENT_ID stream=metrics)
  flost=$(prom_sum "$D/c.prom" uctel_collector_frames_lost_total agent=$AGENT_ID stream=fast_counters)
  llost=$(prom_sum "$D/c.prom" uctel_collector_frames_lost_total agent=$AGENT_ID stream=logs)
  lrx=$(prom_sum "$D/c.prom" uctel_collector_frames_received_total agent=$AGENT_ID stream=logs)
  echo "--- $label: logs (RC) frames received $lrx lost $llost; UC lost metrics $mlost fast_counters $flost;" \
    "agent RC QP retransmitted $retx, NAKs received $naks; rxe0 out_of_seq_request+duplicate_request +$oos"
  [ "$llost" = 0 ] || fail "$label: the logs stream on RC lost $llost frames"
  if [ "$lossy" = lossy ]; then
    [ "$retx" -gt 0 ] || fail "$label: no RC retransmission under 2 % loss"
    [ "$oos" -gt 0 ] || fail "$label: rxe0's RC responder saw no gap under 2 % loss"
  fi
  detail "$label: logs on RC $lrx frames, 0 lost, rc_gap 0; UC lost $((mlost + flost)); retransmitted $retx, rxe0 +$oos;"
}

LOGS_RELIABILITY=rc
daemons_pipeline root verbs write_with_imm
rc_checks "verbs agent, clean" clean
AGENT_FAULT='{ drop_ratio: 0.02, seed: 7, direction: both }'
daemons_pipeline ns2 soft write_with_imm 10.77.0.2:4791
rc_checks "soft agent, 2 % loss" lossy
