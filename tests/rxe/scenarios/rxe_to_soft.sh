# Interop, kernel -> soft: a QP on rxe0 (10.77.0.1) sends UC Send, Send-with-immediate, RDMA
# Write and Write-with-immediate (3000 B, 3 packets each) to the project's soft transport in
# the second namespace (UDP 10.77.0.2:4791), which checks payload, immediates and byte counts.
. /scenarios/common.sh
for op in send-imm write-imm send write; do
  uc_pair "rxe->soft $op" ns2 root --listen 10.77.0.2:18600 --transport soft \
    --bind 10.77.0.2:4791 --op $op --size 3000 --count 100 -- \
    --connect 10.77.0.2:18600 --local-ip 10.77.0.1 --op $op --size 3000 --count 100
  [ "$(field lost "$UC_RECV_RESULT")" = 0 ] || fail "$op: lost $(field lost "$UC_RECV_RESULT")"
  detail "$op: $(field received "$UC_RECV_RESULT") x 3000 B;"
done
