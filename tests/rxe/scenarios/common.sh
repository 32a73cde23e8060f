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
