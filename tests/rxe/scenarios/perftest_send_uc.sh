# perftest `ib_send_bw -c UC`, 1024-byte messages (the project's frame size), server and
# client on rxe0: the baseline message rate for this boot. Prints
#   BENCH perftest_send_uc_msg_rate <messages/s> msg/s   (client side, sender rate)
. /scenarios/common.sh
ITERS=${PERFTEST_ITERS:-20000}
ARGS="-d rxe0 -i 1 -x 1 -c UC -s 1024 -n $ITERS -F"

ib_send_bw $ARGS >/tmp/bw_server.log 2>&1 &
srv=$!
wait_listen 18515 || fail "server did not listen on 18515"
ib_send_bw $ARGS 127.0.0.1 >/tmp/bw_client.log 2>&1
crc=$?
wait "$srv"
src=$?
echo "--- server"; cat /tmp/bw_server.log
echo "--- client"; cat /tmp/bw_client.log
[ "$crc" -eq 0 ] || fail "client exit $crc"
[ "$src" -eq 0 ] || fail "server exit $src"
# Result row: #bytes #iterations BW-peak BW-average MsgRate[Mpps]
rate=$(awk '$1 == 1024 && $2 == '"$ITERS"' && NF >= 5 { printf "%.0f", $5 * 1e6 }' /tmp/bw_client.log)
[ -n "$rate" ] && [ "$rate" -gt 0 ] || fail "no message rate in the client's report"
echo "BENCH perftest_send_uc_msg_rate $rate msg/s"
detail "$ITERS x 1024 B, client $rate msg/s"
