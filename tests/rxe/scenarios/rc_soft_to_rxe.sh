# RC under loss, soft -> kernel: the soft transport (UDP 10.77.0.2:4791, second namespace) sends
# 10,000 RC Write-with-immediate messages to an RC QP on rxe0 (10.77.0.1) while its link loses
# 2 % of the datagrams at random in both directions (data on the way out, rxe's ACKs and NAKs
# on the way in; rxe_uc --drop-percent, next to the soft side's UDP socket: the guest has no
# nftables). Twice: 1024 B messages (one packet at path MTU 1024), then 3000 B (FIRST, MIDDLE,
# LAST). IBTA 9.7: every message must arrive exactly once and in order (rxe_uc's receiver
# fails on a gap, a duplicate or a reordering), so the soft requester must have retransmitted
# (its QP's rc_packets_retransmitted), after rxe's PSN sequence NAKs (rxe0 out_of_seq_request,
# one per NAK: rxe_resp.c check_psn) or its own ACK timeout.
. /scenarios/common.sh
N=10000
seed=1
for size in 1024 3000; do
  rc_lossy "rc soft->rxe write-imm $size B" soft $size $N 2 $seed
  seed=$((seed + 1))
  s=$SOFT_RESULT
  retx=$(field rc_packets_retransmitted "$s")
  naks=$(field rc_naks_received "$s")
  [ "$retx" -gt 0 ] || fail "$size B: the soft requester retransmitted nothing"
  [ "$RC_OOS" -gt 0 ] || fail "$size B: rxe0 NAKed no out-of-sequence request (out_of_seq_request +0)"
  # Every NAK the soft side received is one rxe sent (sequence or RNR), minus those lost.
  [ "$naks" -le $((RC_OOS + RC_RNR_SENT)) ] ||
    fail "$size B: the soft side received $naks NAKs, rxe0 sent $RC_OOS sequence + $RC_RNR_SENT RNR NAKs"
  detail "$N x $size B exactly once in order, soft dropped $(field fault_dropped "$s") datagrams," \
    "retransmitted $retx packets ($(field rc_timeouts "$s") timeouts, $naks NAKs received)," \
    "rxe0 out_of_seq_request +$RC_OOS duplicate_request +$RC_DUP;"
done
