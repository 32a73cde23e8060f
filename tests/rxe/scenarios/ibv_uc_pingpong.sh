# rdma-core's ibv_uc_pingpong between two processes on rxe0: proves the guest's UC data path
# (RoCE v2 GID index 1, path MTU 1024, 1024-byte messages) before the project's own binaries.
. /scenarios/common.sh
ITERS=200
ARGS="-d rxe0 -i 1 -g 1 -s 1024 -m 1024 -n $ITERS"

ibv_uc_pingpong $ARGS >/tmp/pp_server.log 2>&1 &
srv=$!
wait_listen 18515 || fail "server did not listen on 18515"
ibv_uc_pingpong $ARGS 127.0.0.1 >/tmp/pp_client.log 2>&1
crc=$?
wait "$srv"
src=$?
echo "--- server"; cat /tmp/pp_server.log
echo "--- client"; cat /tmp/pp_client.log
[ "$crc" -eq 0 ] || fail "client exit $crc"
[ "$src" -eq 0 ] || fail "server exit $src"
grep -q "^$ITERS iters in" /tmp/pp_client.log || fail "client did not report $ITERS iters"
grep -q "^$ITERS iters in" /tmp/pp_server.log || fail "server did not report $ITERS iters"
detail "$ITERS round trips of 1024 B, $(awk '/iters in/ {print $(NF-1), $NF}' /tmp/pp_client.log)"
