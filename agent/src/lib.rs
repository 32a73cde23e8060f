//! `uctel-agent`: coming with the agent issue.
