# The real daemons on real verbs: uctel-collector and uctel-agent, both with transport.kind
# verbs on rxe0 in the root namespace (the agent's UC QP reaches the collector's through rxe0
# and back), once per data path: RDMA Write-with-immediate into the collector's ring, then UC
# Send into its posted receive buffers. The agent ships host metrics and a log file; after
# SIGTERM (Goodbye) the collector's /metrics must account for every frame (daemons_pipeline in
# common.sh).
. /scenarios/common.sh
for dp in write_with_imm send; do
  daemons_pipeline root verbs "$dp"
done
