# The project's verbs transport, UC Send and Send-with-immediate between two processes on
# rxe0: 3000-byte messages (3 packets at MTU 1024), payload, immediates and byte counts checked
# end to end by the receiver.
. /scenarios/common.sh
L=127.0.0.1:18600
for op in send send-imm; do
  uc_pair "$op" root root --listen $L --op $op --size 3000 --count 300 -- \
    --connect $L --op $op --size 3000 --count 300
  [ "$(field lost "$UC_RECV_RESULT")" = 0 ] || fail "$op: lost $(field lost "$UC_RECV_RESULT")"
  detail "$op: $(field received "$UC_RECV_RESULT") x 3000 B, $(field imm_checked "$UC_RECV_RESULT") imm;"
done
