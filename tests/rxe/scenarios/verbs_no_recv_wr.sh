# UC has no RNR NAK: a message that finds no receive WR is dropped silently by rxe. The
# receiver posts WRs for messages 0..9 only, the sender sends 0..14, so 10..14 must vanish
# without a completion or an error; after the receiver posts again, 15..39 arrive. The loss is
# seen as exactly one sequence gap of 5, and nothing hangs.
. /scenarios/common.sh
L=127.0.0.1:18600
for op in write-imm send-imm; do
  uc_pair "$op hold" root root --listen $L --op $op --size 1024 --count 40 --hold 10:5 -- \
    --connect $L --op $op --size 1024 --count 40
  lost=$(field lost "$UC_RECV_RESULT") gaps=$(field gaps "$UC_RECV_RESULT")
  [ "$lost" = 5 ] && [ "$gaps" = 1 ] || fail "$op: lost $lost in $gaps gaps, expected 5 in 1"
  detail "$op: $(field received "$UC_RECV_RESULT") received, gap of $lost;"
done
