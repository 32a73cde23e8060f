# The project's verbs transport, UC RDMA Write-with-immediate into a registered ring between
# two processes on rxe0: one-packet (1024 B) and three-packet (3000 B) messages, each completing
# a zero-length receive WR with opcode RECV_RDMA_WITH_IMM, immediate = sequence, byte_len and
# ring contents checked; then plain RDMA WRITE (no immediate, no receive WR, no completion at
# the receiver), checked in the ring once the sender is done.
. /scenarios/common.sh
L=127.0.0.1:18600
for size in 1024 3000; do
  uc_pair "write-imm $size" root root --listen $L --op write-imm --size $size --count 300 -- \
    --connect $L --op write-imm --size $size --count 300
  detail "$size B: $(field received "$UC_RECV_RESULT") received, $(field payload_checked "$UC_RECV_RESULT") checked;"
done
# RDMA WRITE without immediate: no receive WR, no completion; the ring is checked afterwards.
uc_pair "write 3000" root root --listen $L --op write --size 3000 --count 300 -- \
  --connect $L --op write --size 3000 --count 300
[ "$(field lost "$UC_RECV_RESULT")" = 0 ] || fail "write: lost $(field lost "$UC_RECV_RESULT")"
detail "plain write 3000 B: $(field payload_checked "$UC_RECV_RESULT") slots checked;"
