# perftest `ib_send_bw -c UC`, 1024-byte messages (the project's frame size), server and
# client on rxe0: the baseline message rate for this boot. Prints
#   BENCH perftest_send_uc_msg_rate <messages/s> msg/s   (client side, sender rate)
. /scenarios/common.sh
N=${PERFTEST_ITERS:-20000}
perftest_send 1024 "$N" || fail "ib_send_bw failed"
echo "BENCH perftest_send_uc_msg_rate $PT_RATE msg/s"
detail "$N x 1024 B, client $PT_RATE msg/s"
