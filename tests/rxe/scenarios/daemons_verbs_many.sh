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
# $MANY_LINES lines each (from the beginning), no /metrics endpoint of their own; agents and
# collector wait 60 s for a handshake (the default 5 s makes a loaded guest give handshakes
# up and start them over). Sizes from the host: MANY_AGENTS, MANY_LINES, MANY_CONNECT_SECONDS
# (run.sh SCENARIO_VARS). `progress` lines say at once on the console how many agents are
# connected, how many log lines arrived, the guest's load and free memory; a failed wait
# prints where the guest's CPU went (many_diag) and the collector's losses and drops.
. /scenarios/common.sh

AGENTS=${MANY_AGENTS:-64}
LINES=${MANY_LINES:-20}
# Seconds, per data path, for every agent to connect and deliver its lines.
CONNECT_SECONDS=${MANY_CONNECT_SECONDS:-180}

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
  # Under TCG a handshake with 64 agents starting together takes longer than the default
  # 5 s; an attempt given up redoes all its work (a new data plane on both sides).
  connect_timeout_seconds: 60
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

# since T: whole seconds from T (a `date +%s`) to now.
since() { echo $(($(date +%s) - $1)); }

# guest_load: the guest's 1-minute load average and available memory.
guest_load() {
  echo "load $(cut -d' ' -f1 /proc/loadavg)," \
    "$(awk '/^MemAvailable:/ { printf "%d", $2 / 1024 }' /proc/meminfo) MiB available"
}

# many_diag: where the guest's CPU goes: threads by state (R runnable, D waiting in the
# kernel), the kernel functions the D threads wait in, and CPU seconds per thread name
# summed over all processes (utime + stime of /proc/*/task/*/stat, 100 ticks/s). One awk
# over all the stat files: a process per thread would itself load the guest.
many_diag() {
  echo "--- guest threads by state; $(guest_load)"
  # grep -H, not awk on the files: a thread that ends between the glob and the read must not
  # stop the listing (busybox awk gives up at a file it cannot open).
  grep -H '' /proc/[0-9]*/task/[0-9]*/stat 2>/dev/null | awk '{
      i = index($0, ":"); file = substr($0, 1, i - 1)
      s = substr($0, i + 1); sub(/^[0-9]+ \(/, "", s)
      name = s; sub(/\) [^)]*$/, "", name); gsub(/ /, "_", name)
      sub(/^.*\) /, "", s); split(s, f, " ")
      st[f[1]]++; cpu[name] += (f[12] + f[13]) / 100; n[name]++
      if (f[1] == "D") { w = file; sub(/stat$/, "wchan", w); print w > "/tmp/many-d" }
    }
    END {
      for (k in st) printf "  %s %d\n", k, st[k]
      print "--- CPU seconds by thread name, summed over processes (threads)"
      for (k in cpu) printf "%9.1f s %4d %s\n", cpu[k], n[k], k | "sort -rn | head -n 12"
    }'
  if [ -s /tmp/many-d ]; then
    echo "--- kernel functions the D threads wait in"
    for w in $(cat /tmp/many-d); do cat "$w" 2>/dev/null; echo; done | sort | uniq -c | sort -rn | head -n 8
  fi
  rm -f /tmp/many-d
}

# alive PID...: how many of the processes PID... still run.
alive() {
  c=0
  for p in "$@"; do kill -0 "$p" 2>/dev/null && c=$((c + 1)); done
  echo "$c"
}

# many_stuck: the collector's last lines, the agents that never logged a connection, and the
# last lines of the first of them.
many_stuck() {
  many_diag
  echo "--- collector: frames lost and dropped, credit writes, async events (summed over agents)"
  grep -E '^uctel_collector_(frames_(lost|received)_total|frames_dropped_total|credit_writes_total|rdma_async_events_total|connection_queues|qp_errors_total)[{ ]' \
    "$D/c.prom" | sed 's/agent="[^"]*",\{0,1\}//; s/stream="[^"]*",\{0,1\}//' |
    awk '{ v[$1] += $2 } END { for (k in v) if (v[k] != 0) print k, v[k] }' | sort
  echo "--- collector log (last 40 lines)"
  tail -n 40 "$D/collector.log"
  never=""
  i=0
  while [ "$i" -lt "$AGENTS" ]; do
    grep -q 'connected to the collector' "$D/a$i/agent.log" || never="$never $i"
    i=$((i + 1))
  done
  echo "--- agents that never connected:${never:- none}"
  for i in $never; do
    echo "--- agent $i log (last 20 lines)"
    tail -n 20 "$D/a$i/agent.log"
    break
  done
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
  # The collector waits as long for a handshake as the agents do.
  awk '{ print } /^  report_interval_seconds:/ { print "  handshake_timeout_seconds: 60" }' \
    "$D/collector.yaml" >"$D/collector.yaml.new" && mv "$D/collector.yaml.new" "$D/collector.yaml"
  uctel-collector --config "$D/collector.yaml" --check-config ||
    fail "$dp: collector --check-config refused $D/collector.yaml"
  i=0
  while [ "$i" -lt "$AGENTS" ]; do
    many_config_agent "$i" "$dp"
    i=$((i + 1))
  done
  uctel-agent --config "$D/a0/agent.yaml" --check-config ||
    fail "$dp: agent --check-config refused $D/a0/agent.yaml"
  t0=$(date +%s)
  uctel-collector --config "$D/collector.yaml" --log-level info >"$D/collector.log" 2>&1 &
  cpid=$!
  wait_listen 9470 || dfail "$dp: collector did not listen on 9470"
  progress "$dp: collector listening after $(since "$t0") s; starting $AGENTS agents"
  pids=""
  i=0
  while [ "$i" -lt "$AGENTS" ]; do
    uctel-agent --config "$D/a$i/agent.yaml" --log-level info >"$D/a$i/agent.log" 2>&1 &
    pids="$pids $!"
    i=$((i + 1))
  done
  progress "$dp: $AGENTS agents started after $(since "$t0") s; $(guest_load)"

  # Every agent connected and every log line arrived.
  want=$((AGENTS * LINES))
  shown=0 diag=0
  while :; do
    # A scrape the collector does not answer within 10 s reads as nothing: say so.
    seen="" ts=$(date +%s)
    scrape "$COLLECTOR_METRICS" "$D/c.prom" || { : >"$D/c.prom"; seen=" (/metrics did not answer in $(since "$ts") s)"; }
    conn=$(prom_sum "$D/c.prom" uctel_collector_agents_connected)
    got=$(prom_sum "$D/c.prom" uctel_collector_records_received_total stream=logs)
    t=$(since "$t0")
    [ "$conn" = "$AGENTS" ] && [ "$got" -ge "$want" ] && break
    if [ "$t" -ge "$shown" ]; then
      progress "$dp: ${t} s: $conn of $AGENTS agents connected, $got of $want log lines$seen," \
        "$(alive $pids) agent processes running; $(guest_load)"
      shown=$((t + 10))
      [ "$t" -lt 30 ] || [ "$diag" = 1 ] || { many_diag; diag=1; }
    fi
    [ "$t" -lt "$CONNECT_SECONDS" ] && kill -0 "$cpid" 2>/dev/null ||
      { many_stuck; fail "$dp: after $t s: $conn of $AGENTS agents connected, $got of $want log lines, $(alive $pids) agent processes running"; }
    usleep 200000
  done
  progress "$dp: ${t} s: all $AGENTS agents connected, all $want log lines in"
  many_diag
  # A few self-metrics rounds and credit grants on top.
  sleep 2
  scrape "$COLLECTOR_METRICS" "$D/c-live.prom" || fail "$dp: collector /metrics"
  q_mode=$(prom_sum "$D/c-live.prom" uctel_collector_connection_queues queues=$mode)
  q_all=$(prom_sum "$D/c-live.prom" uctel_collector_connection_queues)
  logged=$(grep "agent connected" "$D/collector.log" | grep -cE "queues=$mode( |\$)")
  writes=$(prom_sum "$D/c-live.prom" uctel_collector_credit_writes_total result=posted)
  refused=$(prom_sum "$D/c-live.prom" uctel_collector_credit_writes_total result=refused)

  # SIGTERM: every agent sends what it queued and says Goodbye.
  t1=$(date +%s)
  for p in $pids; do kill -TERM "$p" 2>/dev/null; done
  while [ "$(alive $pids)" != 0 ]; do
    [ "$(since "$t1")" -lt 30 ] ||
      fail "$dp: $(alive $pids) of $AGENTS agents still running 30 s after SIGTERM"
    usleep 200000
  done
  arcs=0
  for p in $pids; do
    wait "$p" || arcs=$((arcs + 1))
  done
  progress "$dp: every agent exited $(since "$t1") s after SIGTERM"
  while :; do
    scrape "$COLLECTOR_METRICS" "$D/c.prom" || : >"$D/c.prom"
    left=$(prom_sum "$D/c.prom" uctel_collector_agents_connected)
    [ "$left" = 0 ] && break
    [ "$(since "$t1")" -lt 30 ] ||
      fail "$dp: the collector still counts $left agents connected 30 s after the Goodbyes"
    usleep 200000
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
