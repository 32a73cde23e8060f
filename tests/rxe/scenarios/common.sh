# Helpers sourced by the scenario scripts (busybox sh). A scenario passes when its script
# exits 0; what it appends to $DETAIL becomes the detail of its SCENARIO line, and every
# line it prints that starts with "BENCH " is copied to the console.

RXE_PORT_DIR=/sys/class/infiniband/rxe0/ports/1
NS2_PID=$(cat /run/ns2.pid)

# detail TEXT...: add to the scenario's result line.
detail() { echo "$*" >>"$DETAIL"; }

# fail TEXT...: end the scenario as failed.
fail() {
  detail "$*"
  echo "FAIL: $*"
  exit 1
}

# progress TEXT...: print TEXT, and send it to the console at once as `INFO <scenario>: TEXT`
# (the host prints INFO lines as they arrive): where a long scenario stands, even when its
# time limit kills it before it prints anything else.
progress() {
  echo "$*"
  echo "INFO ${SCENARIO:-scenario}: $*" >/dev/console
}

# in_ns2 CMD...: run CMD in the second network namespace (v1, 10.77.0.2).
in_ns2() { nsenter -t "$NS2_PID" -n "$@"; }

# wait_listen PORT [TENTHS]: wait until a TCP socket listens on PORT (default 20 s).
wait_listen() {
  hex=$(printf '%04X' "$1")
  n=0
  while ! cat /proc/net/tcp /proc/net/tcp6 2>/dev/null |
    awk -v p=":$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { f = 1 } END { exit !f }'; do
    n=$((n + 1))
    [ "$n" -lt "${2:-200}" ] || return 1
    usleep 100000
  done
}

# counter NAME: one of rxe0's port hw_counters (0 when absent).
counter() { cat "$RXE_PORT_DIR/hw_counters/$1" 2>/dev/null || echo 0; }

# counters_snapshot FILE: save rxe0's port hw_counters (name value per line).
counters_snapshot() {
  for c in "$RXE_PORT_DIR"/hw_counters/*; do echo "${c##*/} $(cat "$c")"; done >"$1"
}

# counters_delta BEFORE AFTER: print the counters that changed, "name +delta".
counters_delta() {
  awk 'NR == FNR { b[$1] = $2; next } $2 != b[$1] { printf "  rxe0 %s +%d\n", $1, $2 - b[$1] }' "$1" "$2"
}

# uc_pair LABEL RECV_NS SEND_NS RECV_ARGS... -- SEND_ARGS...
#   Runs `rxe_uc recv RECV_ARGS` in the background and `rxe_uc send SEND_ARGS` in the
#   foreground, each in the root namespace ("root") or in ns2 ("ns2"), prints both outputs and
#   the rxe0 counters that changed, and fails unless both print "RESULT ok".
uc_pair() {
  label=$1 rns=$2 sns=$3
  shift 3
  rargs=""
  while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do rargs="$rargs $1"; shift; done
  [ "$#" -gt 0 ] && shift
  counters_snapshot /tmp/c_before
  if [ "$rns" = ns2 ]; then
    in_ns2 rxe_uc recv $rargs >/tmp/uc_recv.log 2>&1 &
  else
    rxe_uc recv $rargs >/tmp/uc_recv.log 2>&1 &
  fi
  rpid=$!
  if [ "$sns" = ns2 ]; then
    in_ns2 rxe_uc send "$@" >/tmp/uc_send.log 2>&1
  else
    rxe_uc send "$@" >/tmp/uc_send.log 2>&1
  fi
  src=$?
  wait "$rpid"
  rrc=$?
  counters_snapshot /tmp/c_after
  echo "--- $label: recv$rargs"
  sed 's/^/  | /' /tmp/uc_recv.log
  echo "--- $label: send $*"
  sed 's/^/  | /' /tmp/uc_send.log
  counters_delta /tmp/c_before /tmp/c_after
  [ "$rrc" -eq 0 ] && grep -q '^RESULT ok' /tmp/uc_recv.log ||
    fail "$label: receiver: $(grep '^RESULT' /tmp/uc_recv.log | cut -c1-300)"
  [ "$src" -eq 0 ] && grep -q '^RESULT ok' /tmp/uc_send.log ||
    fail "$label: sender: $(grep '^RESULT' /tmp/uc_send.log | cut -c1-300)"
  UC_RECV_RESULT=$(grep '^RESULT' /tmp/uc_recv.log)
  UC_SEND_RESULT=$(grep '^RESULT' /tmp/uc_send.log)
}

# hw_delta NAME: how much rxe0's hw_counter NAME moved during the last uc_pair.
hw_delta() {
  awk -v n="$1" 'NR == FNR { if ($1 == n) b = $2; next } $1 == n { d = $2 - b } END { print d + 0 }' \
    /tmp/c_before /tmp/c_after
}

# rc_lossy LABEL SEND_SIDE SIZE COUNT PERCENT SEED
#   RC Write-with-immediate between the soft transport (UDP 10.77.0.2:4791, ns2) and a QP on
#   rxe0 (10.77.0.1), SEND_SIDE soft (soft -> rxe) or rxe (rxe -> soft), COUNT messages of
#   SIZE bytes; the soft side loses PERCENT % of its datagrams at random in both directions
#   (rxe_uc --drop-percent, seeded with SEED), data and ACKs/NAKs alike. rxe_uc's receiver
#   fails unless every message arrives exactly once and in order. Prints rxe0's RC counters
#   that the run moved (RC_* variables below) and sets SOFT_RESULT to the soft side's RESULT
#   line (its QP's rc_* counters and fault_dropped=).
rc_lossy() {
  label=$1 side=$2 size=$3 n=$4 pct=$5 seed=$6
  common="--qp rc --op write-imm --size $size --count $n --timeout-ms 30000"
  if [ "$side" = soft ]; then
    uc_pair "$label" root ns2 --listen 10.77.0.1:18600 --local-ip 10.77.0.1 $common -- \
      --connect 10.77.0.1:18600 --transport soft --bind 10.77.0.2:4791 $common \
      --drop-percent "$pct" --seed "$seed"
    SOFT_RESULT=$UC_SEND_RESULT
  else
    uc_pair "$label" ns2 root --listen 10.77.0.2:18600 --transport soft --bind 10.77.0.2:4791 \
      $common --drop-percent "$pct" --seed "$seed" -- \
      --connect 10.77.0.2:18600 --local-ip 10.77.0.1 $common
    SOFT_RESULT=$UC_RECV_RESULT
  fi
  r=$UC_RECV_RESULT
  [ "$(field received "$r")" = "$n" ] && [ "$(field lost "$r")" = 0 ] &&
    [ "$(field order_errors "$r")" = 0 ] ||
    fail "$label: received $(field received "$r") of $n, lost $(field lost "$r"), out of order $(field order_errors "$r")"
  RC_DUP=$(hw_delta duplicate_request)
  RC_OOS=$(hw_delta out_of_seq_request)
  RC_SEQ=$(hw_delta rcvd_seq_err)
  RC_RETRY=$(hw_delta completer_retry_err)
  RC_EXC=$(hw_delta retry_exceeded_err)
  RC_RNR_SENT=$(hw_delta send_rnr_err)
  RC_RNR_RCVD=$(hw_delta rcvd_rnr_err)
  echo "rxe0 RC counters, $label: duplicate_request +$RC_DUP out_of_seq_request +$RC_OOS" \
    "rcvd_seq_err +$RC_SEQ completer_retry_err +$RC_RETRY retry_exceeded_err +$RC_EXC" \
    "send_rnr_err +$RC_RNR_SENT rcvd_rnr_err +$RC_RNR_RCVD sent_pkts +$(hw_delta sent_pkts)" \
    "rcvd_pkts +$(hw_delta rcvd_pkts)"
  echo "soft side, $label: $(echo "$SOFT_RESULT" | tr ' ' '\n' | grep -E '^(rc_|fault_)' | tr '\n' ' ')"
  [ "$(field fault_dropped "$SOFT_RESULT")" -gt 0 ] ||
    fail "$label: the soft side's fault injector dropped nothing"
}

# field NAME LINE: the value of NAME=value in LINE.
field() { echo "$2" | tr ' ' '\n' | sed -n "s/^$1=//p" | head -n 1; }

# perftest_send SIZE ITERS: perftest `ib_send_bw -c UC` server and client on rxe0 (GID index
# 1). Sets PT_RATE to the client's (sender's) message rate in messages/s and appends it to
# /tmp/perftest.rates; returns non-zero when either side fails. perftest derives rates from
# the TSC and a CPU-MHz estimate that TCG sometimes spoils ("Correlation coefficient r^2 <
# 0.9", rate 0): such a run is repeated, up to three tries.
perftest_send() {
  for try in 1 2 3; do
    perftest_send_once "$1" "$2" || return 1
    if [ "$PT_RATE" -gt 0 ]; then
      echo "$PT_RATE" >>/tmp/perftest.rates
      return 0
    fi
    echo "perftest reported no rate (try $try)"
  done
  return 1
}

perftest_send_once() {
  args="-d rxe0 -i 1 -x 1 -c UC -s $1 -n $2 -F"
  ib_send_bw $args >/tmp/bw_server.log 2>&1 &
  pt_srv=$!
  wait_listen 18515 || { echo "perftest server did not listen on 18515"; return 1; }
  ib_send_bw $args 127.0.0.1 >/tmp/bw_client.log 2>&1
  pt_crc=$?
  wait "$pt_srv"
  pt_src=$?
  echo "--- perftest server"
  sed 's/^/  | /' /tmp/bw_server.log
  echo "--- perftest client"
  sed 's/^/  | /' /tmp/bw_client.log
  [ "$pt_crc" -eq 0 ] && [ "$pt_src" -eq 0 ] || return 1
  # Result row: #bytes #iterations BW-peak BW-average MsgRate[Mpps]
  PT_RATE=$(awk -v s="$1" -v n="$2" '$1 == s && $2 == n && NF >= 5 { printf "%.0f", $5 * 1e6 }' \
    /tmp/bw_client.log)
  [ -n "$PT_RATE" ] || return 1
}

# ---------------------------------------------------------------- the daemons (uctel-collector, uctel-agent)

# prom_sum FILE NAME [LABEL=VALUE...]: the sum of the samples of metric NAME in the Prometheus
# text exposition FILE whose labels include every LABEL="VALUE" (0 when none matches). The
# collector exposes relayed samples with their timestamp after the value: not summed.
prom_sum() {
  pf=$1 pn=$2
  shift 2
  awk -v n="$pn" -v want="$*" '
    BEGIN { k = split(want, w, " ") }
    /^#/ { next }
    {
      name = $1; sub(/\{.*/, "", name)
      if (name != n) next
      for (i = 1; i <= k; i++) {
        eq = index(w[i], "=")
        pat = "[{,]" substr(w[i], 1, eq - 1) "=\"" substr(w[i], eq + 1) "\"[,}]"
        if ($0 !~ pat) next
      }
      # The value follows the labels; a timestamp (ms) may follow it.
      rest = $0
      if (index(rest, "{")) sub(/^[^{]*\{.*\}[ \t]+/, "", rest)
      else sub(/^[^ \t]+[ \t]+/, "", rest)
      split(rest, f, " ")
      s += f[1]
    }
    END { printf "%.0f\n", s }' "$pf"
}

# prom_count FILE NAME [LABEL=VALUE...]: how many samples of NAME match (as prom_sum).
prom_count() {
  pf=$1 pn=$2
  shift 2
  awk -v n="$pn" -v want="$*" '
    BEGIN { k = split(want, w, " ") }
    /^#/ { next }
    {
      name = $1; sub(/\{.*/, "", name)
      if (name != n) next
      for (i = 1; i <= k; i++) {
        eq = index(w[i], "=")
        pat = "[{,]" substr(w[i], 1, eq - 1) "=\"" substr(w[i], eq + 1) "\"[,}]"
        if ($0 !~ pat) next
      }
      c++
    }
    END { print c + 0 }' "$pf"
}

# scrape ADDR FILE [ns2]: GET http://ADDR/metrics into FILE (from ns2 with the third argument).
# Time-limited with `timeout`: busybox 1.35's own `wget -T` crashes (segfault at 0).
scrape() {
  if [ "${3:-}" = ns2 ]; then
    in_ns2 timeout 10 wget -q -O "$2" "http://$1/metrics"
  else
    timeout 10 wget -q -O "$2" "http://$1/metrics"
  fi
}

# log_field LOG MESSAGE KEY: the value of KEY=value on the last line of LOG containing MESSAGE
# (the daemons log `message key=value ...` lines; NO_COLOR keeps them free of escapes).
log_field() {
  grep -F "$2" "$1" | tail -n 1 | tr ' ' '\n' | sed -n "s/^$3=//p" | tr -d '"' | head -n 1
}

# The two daemons' files and addresses in the daemon scenarios.
D=/tmp/daemons
COLLECTOR_CONTROL=10.77.0.1:7400
COLLECTOR_METRICS=127.0.0.1:9470
AGENT_METRICS=127.0.0.1:9471
AGENT_ID=vm-agent
TOKEN=uctel-rxe-suite-token
# The daemons log without ANSI colours, so the scenario can read their key=value fields.
export NO_COLOR=1

# collector_verbs_config FILE DATA_PATH: a collector on rxe0 (transport.kind verbs, the RoCE v2
# GID of 10.77.0.1) that sets up DATA_PATH (write_with_imm or send) for every agent, reports
# every second and writes the logs it receives to a JSON Lines file.
collector_verbs_config() {
  cat >"$1" <<YAML
listen:
  control: $COLLECTOR_CONTROL
  metrics: $COLLECTOR_METRICS
transport:
  kind: verbs
  verbs:
    device: rxe0
    port: 1
    local_ip: 10.77.0.1
ring:
  data_path: $2
auth:
  shared:
    token: $TOKEN
control:
  report_interval_seconds: 1
logs:
  sink: file
  file:
    path: $D/collector-logs.jsonl
YAML
}

# agent_config FILE KIND DATA_PATH [SOFT_BIND]: an agent shipping host metrics (every second,
# with the ethtool collector on v0, rxe0's netdev), its self-metrics, $D/input.log (from the
# beginning) and fast counters (rxe0's rcvd_pkts and sent_pkts, v0's ethtool peer_ifindex,
# every 10 ms) to the collector at
# $COLLECTOR_CONTROL over transport KIND (verbs: rxe0 port 1, the GID of the control
# connection's address; soft: UDP SOFT_BIND), both streams on DATA_PATH. The logs stream's
# reliability is $LOGS_RELIABILITY (default uc); a soft agent injects $AGENT_FAULT (a
# transport.soft.fault mapping) when set.
agent_config() {
  {
    cat <<YAML
agent_id: $AGENT_ID
collector:
  control: $COLLECTOR_CONTROL
  reconnect_initial_seconds: 0.2
  reconnect_max_seconds: 2
  # Fast counters every 10 ms and a 3,000-line log backlog: far above the default 32
  # frames/s, so this agent announces what it sends (its ring and credits follow).
  expected_frames_per_second: 512
listen:
  metrics: $AGENT_METRICS
auth:
  token: $TOKEN
sources:
  host_metrics:
    interval_seconds: 1
    ethtool: { device_include: "^v0\$" }
  self_metrics:
    interval_seconds: 1
  logs:
    - path: $D/input.log
      start_at: beginning
  fast_counters:
    interval_milliseconds: 10
    counters:
      - path: $RXE_PORT_DIR/hw_counters/rcvd_pkts
      - path: $RXE_PORT_DIR/hw_counters/sent_pkts
      - ethtool: { device: v0, stat: peer_ifindex }
  state_directory: $D/agent-state
streams:
  metrics:
    data_path: $3
  logs:
    data_path: $3
    reliability: ${LOGS_RELIABILITY:-uc}
YAML
    if [ "$2" = verbs ]; then
      printf 'transport:\n  kind: verbs\n  verbs:\n    device: rxe0\n    port: 1\n'
    else
      printf 'transport:\n  kind: soft\n  soft:\n    bind: %s\n' "$4"
      [ -z "${AGENT_FAULT:-}" ] || printf '    fault: %s\n' "$AGENT_FAULT"
    fi
  } >"$1"
}

# write_lines FIRST LAST: append numbered lines FIRST..LAST to the agent's input log.
write_lines() {
  seq "$1" "$2" |
    awk '{ printf "rxe-suite line %d of the daemons scenario, padded to look like a real log line\n", $1 }' \
      >>"$D/input.log"
}

# daemon_logs: print both daemons' logs and their non-zero self-metrics (last scrapes).
daemon_logs() {
  echo "--- collector log"; cat "$D/collector.log" 2>/dev/null
  echo "--- agent log"; cat "$D/agent.log" 2>/dev/null
  echo "--- collector self-metrics"; grep '^uctel_collector_' "$D/c.prom" 2>/dev/null | grep -v ' 0$'
  echo "--- agent self-metrics"; grep '^uctel_agent_' "$D/a.prom" 2>/dev/null | grep -v ' 0$'
}

# dfail TEXT...: fail a daemon scenario, with the daemons' logs.
dfail() {
  daemon_logs
  fail "$@"
}

# daemons_pipeline AGENT_NS AGENT_KIND DATA_PATH [SOFT_BIND]
#   The real daemons end to end: uctel-collector on rxe0 (verbs) in the root namespace and one
#   uctel-agent in AGENT_NS (root or ns2) on transport AGENT_KIND, data path DATA_PATH
#   (write_with_imm or send), shipping host metrics and LINES log lines written over about
#   3 s. Once everything arrived, the agent gets SIGTERM (Goodbye) and the collector's
#   /metrics, its log and its log sink are checked:
#     - the agent connected on DATA_PATH (collector log); every log line arrived (records and
#       sink); node_cpu_seconds_total carries the agent's labels; frames received > 0;
#     - clean link: frames and records lost 0, no QP error; with $AGENT_FAULT (lossy link) the
#       logs stream still loses nothing when it is on RC ($LOGS_RELIABILITY=rc), and what
#       the UC streams lose is counted (the identities below);
#     - exact accounting against the agent's Goodbye total (`goodbye sent frames=N`):
#         sent = received + lost + dropped after tracking
#         sent = received + dropped + connection-sequence gaps
#       and per stream, frames and records, when the agent logs per-stream figures
#       (`metrics_frames=`, `logs_records=`, ...);
#     - rxe0 received exactly one RoCEv2 packet per frame sent (the agent caps frames at the
#       path MTU, 1024 here), so nothing was dropped below the daemons either (UC only: RC
#       adds acknowledgements and retransmissions).
daemons_pipeline() {
  ans=$1 akind=$2 dp=$3
  LINES=${DAEMON_LINES:-3000}
  rm -rf "$D"
  mkdir -p "$D/agent-state"
  : >"$D/input.log"
  : >"$D/c.prom"
  : >"$D/a.prom"
  collector_verbs_config "$D/collector.yaml" "$dp"
  agent_config "$D/agent.yaml" "$akind" "$dp" "${4:-}"
  uctel-collector --config "$D/collector.yaml" --check-config ||
    fail "collector --check-config refused $D/collector.yaml"
  # Checked where it runs: the check refuses addresses no local interface has.
  if [ "$ans" = ns2 ]; then
    nsenter -t "$NS2_PID" -n uctel-agent --config "$D/agent.yaml" --check-config ||
      fail "agent --check-config refused $D/agent.yaml (in ns2)"
  else
    uctel-agent --config "$D/agent.yaml" --check-config ||
      fail "agent --check-config refused $D/agent.yaml"
  fi

  uctel-collector --config "$D/collector.yaml" --log-level "${COLLECTOR_LOG:-info}" \
    >"$D/collector.log" 2>&1 &
  cpid=$!
  wait_listen 9470 || dfail "collector did not listen on 9470"
  counters_snapshot "$D/rxe.before"
  if [ "$ans" = ns2 ]; then
    # nsenter itself, not the in_ns2 function: a backgrounded function is a subshell, and
    # SIGTERM must reach the agent (nsenter execs it, keeping its pid).
    nsenter -t "$NS2_PID" -n uctel-agent --config "$D/agent.yaml" \
      --log-level "${AGENT_LOG:-info}" >"$D/agent.log" 2>&1 &
  else
    uctel-agent --config "$D/agent.yaml" --log-level "${AGENT_LOG:-info}" \
      >"$D/agent.log" 2>&1 &
  fi
  apid=$!

  # Log lines in bursts while host metrics flow, then wait until the collector has them all
  # and at least one host collection.
  first=1
  while [ "$first" -le "$LINES" ]; do
    last=$((first + 499))
    [ "$last" -le "$LINES" ] || last=$LINES
    write_lines "$first" "$last"
    first=$((last + 1))
    usleep 500000
  done
  i=0
  while :; do
    scrape "$COLLECTOR_METRICS" "$D/c.prom" || : >"$D/c.prom"
    got=$(prom_sum "$D/c.prom" uctel_collector_records_received_total agent=$AGENT_ID stream=logs)
    cpu=$(prom_count "$D/c.prom" node_cpu_seconds_total agent=$AGENT_ID)
    [ "$got" -ge "$LINES" ] && [ "$cpu" -gt 0 ] && break
    i=$((i + 1))
    if [ "$i" -ge 300 ] || ! kill -0 "$apid" 2>/dev/null || ! kill -0 "$cpid" 2>/dev/null; then
      dfail "$dp: after $((i / 10)) s: $got of $LINES log lines, $cpu node_cpu_seconds_total series at the collector"
    fi
    usleep 100000
  done
  scrape "$AGENT_METRICS" "$D/a.prom" "$ans" || : >"$D/a.prom"

  # The agent's series as served while it is connected: they leave /metrics at its Goodbye
  # (the accounting below reads the collector's counters after it).
  scrape "$COLLECTOR_METRICS" "$D/c-live.prom" || : >"$D/c-live.prom"

  # SIGTERM: the agent sends what it queued, closes the epoch and says Goodbye.
  kill -TERM "$apid"
  i=0
  while kill -0 "$apid" 2>/dev/null; do
    i=$((i + 1))
    [ "$i" -lt 300 ] || dfail "$dp: agent still running 30 s after SIGTERM"
    usleep 100000
  done
  wait "$apid"
  arc=$?
  i=0
  while :; do
    scrape "$COLLECTOR_METRICS" "$D/c.prom" || : >"$D/c.prom"
    [ "$(prom_sum "$D/c.prom" uctel_collector_agents_connected)" = 0 ] && break
    i=$((i + 1))
    [ "$i" -lt 100 ] || dfail "$dp: the collector still counts the agent connected 10 s after its Goodbye"
    usleep 100000
  done
  # One report interval for the collector to settle the Goodbye.
  usleep 1500000
  scrape "$COLLECTOR_METRICS" "$D/c.prom" || dfail "$dp: collector /metrics after the Goodbye"
  counters_snapshot "$D/rxe.after"
  kill -TERM "$cpid"
  wait "$cpid"
  crc=$?

  echo "=== $akind agent ($ans) -> verbs collector, $dp"
  daemon_logs
  echo "--- rxe0 counters that moved"
  counters_delta "$D/rxe.before" "$D/rxe.after"
  [ "$arc" -eq 0 ] || fail "$dp: agent exit status $arc after SIGTERM"
  [ "$crc" -eq 0 ] || fail "$dp: collector exit status $crc after SIGTERM"
  grep 'agent connected' "$D/collector.log" | grep -q "agent=$AGENT_ID" ||
    fail "$dp: the collector never logged 'agent connected' for $AGENT_ID"
  path=$(log_field "$D/collector.log" 'agent connected' data_path)
  sent=$(log_field "$D/agent.log" 'goodbye sent' frames)
  [ -n "$sent" ] || fail "$dp: no 'goodbye sent frames=N' in the agent log"
  p() { prom_sum "$D/c.prom" "$@"; }
  rx=$(p uctel_collector_frames_received_total agent=$AGENT_ID)
  lost=$(p uctel_collector_frames_lost_total agent=$AGENT_ID)
  rlost=$(p uctel_collector_records_lost_total agent=$AGENT_ID)
  dropped=$(p uctel_collector_frames_dropped_total agent=$AGENT_ID)
  after=0
  for r in malformed_payload limit_exceeded stale_frame; do
    after=$((after + $(p uctel_collector_frames_dropped_total agent=$AGENT_ID reason=$r)))
  done
  conn_lost=$(p uctel_collector_connection_frames_lost_total agent=$AGENT_ID)
  qp_err=$(p uctel_collector_qp_errors_total agent=$AGENT_ID)
  lines_rx=$(p uctel_collector_records_received_total agent=$AGENT_ID stream=logs)
  sink=$(grep -c 'rxe-suite line' "$D/collector-logs.jsonl" 2>/dev/null || echo 0)
  labels=$(grep '^node_cpu_seconds_total{' "$D/c-live.prom" | head -n 1 | sed 's/^[^{]*//; s/} .*/}/')
  pkts=$(awk '$1 == "rcvd_pkts" { b = $2 } END { print b + 0 }' "$D/rxe.before")
  pkts=$(awk -v b="$pkts" '$1 == "rcvd_pkts" { print $2 - b }' "$D/rxe.after")
  echo "agent: $(grep -F 'goodbye sent' "$D/agent.log" | tail -n 1 | sed 's/.*goodbye sent //')"
  echo "collector: data_path=$path received=$rx lost=$lost records_lost=$rlost dropped=$dropped" \
    "(after tracking $after) connection_lost=$conn_lost qp_errors=$qp_err log records=$lines_rx sink=$sink"
  echo "rxe0: rcvd_pkts +$pkts; node_cpu_seconds_total labels: $labels"

  case "$dp:$path" in
    write_with_imm:WriteWithImm | send:Send) ;;
    *) fail "$dp: the collector chose data path '$path'" ;;
  esac
  [ "$rx" -gt 0 ] || fail "$dp: no frames received"
  case "$labels" in
    *agent=\"$AGENT_ID\"*) ;;
    *) fail "$dp: node_cpu_seconds_total without agent=\"$AGENT_ID\": $labels" ;;
  esac
  case "$labels" in
    *instance=\"$(hostname)\"*) ;;
    *) fail "$dp: node_cpu_seconds_total without instance=\"$(hostname)\": $labels" ;;
  esac
  case "$labels" in
    *cpu=\"*mode=\"*) ;;
    *) fail "$dp: node_cpu_seconds_total without cpu and mode: $labels" ;;
  esac
  [ "$lines_rx" = "$LINES" ] || fail "$dp: log records received $lines_rx, want $LINES"
  [ "$sink" = "$LINES" ] || fail "$dp: the log sink holds $sink of $LINES lines"
  if [ -z "${AGENT_FAULT:-}" ]; then
    [ "$lost" = 0 ] && [ "$rlost" = 0 ] || fail "$dp: the clean link lost $lost frames, $rlost records"
  else
    llost=$(p uctel_collector_frames_lost_total agent=$AGENT_ID stream=logs)
    [ "${LOGS_RELIABILITY:-uc}" != rc ] || [ "$llost" = 0 ] ||
      fail "$dp: the logs stream on RC lost $llost frames"
  fi
  [ "$qp_err" = 0 ] || fail "$dp: $qp_err QP errors"
  [ "$sent" -eq $((rx + lost + after)) ] ||
    fail "$dp: sent $sent != received $rx + lost $lost + dropped after tracking $after"
  [ "$sent" -eq $((rx + dropped + conn_lost)) ] ||
    fail "$dp: sent $sent != received $rx + dropped $dropped + connection lost $conn_lost"
  # Both sides name the streams alike (stream="metrics", "logs", "fast_counters").
  for st in metrics logs fast_counters; do
    sf=$(log_field "$D/agent.log" 'goodbye sent' "${st}_frames")
    [ -n "$sf" ] || continue
    srx=$(p uctel_collector_frames_received_total agent=$AGENT_ID stream=$st)
    slost=$(p uctel_collector_frames_lost_total agent=$AGENT_ID stream=$st)
    [ "$sf" -eq $((srx + slost)) ] || [ "$after" -gt 0 ] ||
      fail "$dp: stream $st: sent $sf != received $srx + lost $slost"
    sr=$(log_field "$D/agent.log" 'goodbye sent' "${st}_records")
    rrx=$(p uctel_collector_records_received_total agent=$AGENT_ID stream=$st)
    rlo=$(p uctel_collector_records_lost_total agent=$AGENT_ID stream=$st)
    [ -z "$sr" ] || [ "$sr" -eq $((rrx + rlo)) ] ||
      fail "$dp: stream $st: $sr records sent != received $rrx + lost $rlo"
  done
  # One packet per frame; where the agent's QP also sits on rxe0, the collector's credit
  # words (one UC RDMA WRITE packet each, DESIGN.md §4) arrive there too.
  writes=$(p uctel_collector_credit_writes_total result=posted)
  [ "${LOGS_RELIABILITY:-uc}" = rc ] || [ -n "${AGENT_FAULT:-}" ] ||
    { [ "$pkts" -ge "$sent" ] && [ "$pkts" -le $((sent + writes)) ]; } ||
    fail "$dp: rxe0 received $pkts packets for $sent frames and $writes credit writes"
  detail "$dp: sent $sent = received $rx + lost $lost + dropped $dropped (rxe0 +$pkts pkts)," \
    "$LINES log lines, $(prom_count "$D/c-live.prom" node_cpu_seconds_total agent=$AGENT_ID) node_cpu series;"
}
