//! `uctel-agent`: coming with the agent issue.

pub mod sources;
