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
