# A host without RDMA shipping to an RDMA collector: uctel-agent on the soft transport in the
# second namespace (UDP 10.77.0.2:4791, RoCEv2 over v1) and uctel-collector on verbs (rxe0,
# 10.77.0.1), once per data path. Same pipeline and checks as daemons_verbs
# (daemons_pipeline in common.sh).
. /scenarios/common.sh
for dp in write_with_imm send; do
  daemons_pipeline ns2 soft "$dp" 10.77.0.2:4791
done
