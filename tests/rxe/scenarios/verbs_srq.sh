# The verbs transport's shared receive queue and shared CQs on rxe0: `rxe_uc srq-many`, one
# process, 64 UC QP pairs. The 64 senders share one send CQ; the 64 receivers share one
# receive CQ and take their receive WRs from one SRQ (ibv_create_srq; rxe accepts an SRQ on
# UC QPs, rxe_qp_chk_init). 30 rounds of one message per sender, then one more past the armed
# SRQ limit: every completion's qp_num names the receiver its immediate's sender is connected
# to, every message arrives once and whole (opcode, byte_len, payload), a QP on the SRQ
# refuses post_recv, and IBV_EVENT_SRQ_LIMIT_REACHED names the SRQ exactly once.
# Write-with-immediate (zero-length SRQ WRs, ring slots) and Send-with-immediate (SRQ buffers).
. /scenarios/common.sh
for op in write-imm send-imm; do
  counters_snapshot /tmp/c_before
  rxe_uc srq-many --op $op --qps 64 --count 30 --size 1024 --timeout-ms 20000 >/tmp/srq.log 2>&1
  rc=$?
  counters_snapshot /tmp/c_after
  echo "--- srq-many $op"
  sed 's/^/  | /' /tmp/srq.log
  counters_delta /tmp/c_before /tmp/c_after
  [ "$rc" -eq 0 ] && grep -q '^RESULT ok' /tmp/srq.log ||
    fail "srq-many $op: $(grep '^RESULT' /tmp/srq.log | cut -c1-400)"
  r=$(grep '^RESULT' /tmp/srq.log)
  detail "$op: 64 QPs on one CQ/SRQ, $(field received "$r") received, $(field limit_events "$r") limit event;"
done
