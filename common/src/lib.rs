//! `uctel-common`: plumbing shared by the two daemons (being written).
