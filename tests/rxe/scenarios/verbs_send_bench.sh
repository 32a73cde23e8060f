# Message rate of the project's verbs sender (UC Send, 1024 B, send queue 128, a signaled WR
# every 64, the receiver reposting receive WRs as perftest's does) against perftest
# `ib_send_bw -c UC` with the same size and count. TCG speed drifts with the host's load, so the
# two run back to back in pairs (perftest, then ours) and the median of the per-pair ratios is
# the result. Prints
#   BENCH verbs_send_uc_msg_rate <median msg/s>
#   BENCH perftest_send_uc_median_msg_rate <median msg/s>
#   BENCH verbs_vs_perftest_ratio <median over pairs of ours / perftest>
. /scenarios/common.sh
N=${BENCH_ITERS:-10000}
PAIRS=${BENCH_PAIRS:-4}
L=127.0.0.1:18600
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
: >/tmp/perftest.rates
: >/tmp/ours.rates
: >/tmp/ratios
i=0
while [ "$i" -lt "$PAIRS" ]; do
  i=$((i + 1))
  perftest_send 1024 "$N" || fail "perftest failed"
  uc_pair "bench" root root --listen $L --op send --size 1024 --count "$N" --bench -- \
    --connect $L --op send --size 1024 --count "$N" --bench
  r=$(awk '/BENCH verbs_send_uc_msg_rate/ {print $(NF - 1)}' /tmp/uc_send.log)
  [ -n "$r" ] || fail "no rate from rxe_uc"
  echo "$r" >>/tmp/ours.rates
  awk -v a="$r" -v b="$PT_RATE" 'BEGIN { printf "%.3f\n", a / b }' >>/tmp/ratios
  echo "pair $i: perftest $PT_RATE msg/s, ours $r msg/s"
done
m_ours=$(median </tmp/ours.rates)
m_pt=$(median </tmp/perftest.rates)
ratio=$(median </tmp/ratios | awk '{ printf "%.2f", $1 }')
echo "BENCH verbs_send_uc_msg_rate $m_ours msg/s"
echo "BENCH perftest_send_uc_median_msg_rate $m_pt msg/s"
echo "BENCH verbs_vs_perftest_ratio $ratio"
detail "perftest $(tr '\n' ' ' </tmp/perftest.rates)msg/s; ours $(tr '\n' ' ' </tmp/ours.rates)msg/s; median pair ratio $ratio"
