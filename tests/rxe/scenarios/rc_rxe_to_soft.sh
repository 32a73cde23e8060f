# RC under loss, kernel -> soft: an RC QP on rxe0 (10.77.0.1) sends 10,000 RC
# Write-with-immediate messages to the soft transport (UDP 10.77.0.2:4791, second namespace),
# whose link loses 2 % of the datagrams at random in both directions (rxe's data on the way
# in, the soft responder's ACKs and NAKs on the way out; rxe_uc --drop-percent). Twice: 1024 B
# messages (one packet at path MTU 1024), then 3000 B (FIRST, MIDDLE, LAST). Every message
# must arrive exactly once and in order at the soft receiver, so rxe, the requester here, must
# have retransmitted: its completer counts each retry it starts after a PSN sequence NAK or a
# retransmit timeout (completer_retry_err), and a sequence NAK also as rcvd_seq_err when it
# acknowledges packets its completer had not seen ACKed yet (rxe_comp.c check_ack: NAK PSN
# past comp.psn, so mostly for NAKs in the middle of a multi-packet message). rxe never gives
# up here (retry_cnt 7 is "retry forever" in rxe; retry_exceeded_err is printed, not checked).
. /scenarios/common.sh
N=10000
seed=11
for size in 1024 3000; do
  rc_lossy "rc rxe->soft write-imm $size B" rxe $size $N 2 $seed
  seed=$((seed + 1))
  s=$SOFT_RESULT
  naks=$(field rc_naks_sent "$s")
  [ $((RC_SEQ + RC_RETRY)) -gt 0 ] ||
    fail "$size B: rxe0 retransmitted nothing (rcvd_seq_err +$RC_SEQ, completer_retry_err +$RC_RETRY)"
  [ "$naks" -gt 0 ] || fail "$size B: the soft responder sent no NAK"
  # rxe counts a sequence NAK once it arrives (and moves its completer): at most what was sent.
  [ "$RC_SEQ" -le "$naks" ] || fail "$size B: rxe0 rcvd_seq_err +$RC_SEQ > the soft side's $naks NAKs sent"
  detail "$N x $size B exactly once in order, soft dropped $(field fault_dropped "$s") datagrams," \
    "sent $naks NAKs, saw $(field rc_duplicates "$s") duplicates;" \
    "rxe0 rcvd_seq_err +$RC_SEQ completer_retry_err +$RC_RETRY;"
done
