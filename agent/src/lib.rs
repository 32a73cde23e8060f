//! `uctel-agent`: coming with the agent issue.

pub mod config;
pub mod control;
pub mod credits;
pub mod datapath;
pub mod dryrun;
pub mod pacing;
pub mod queue;
pub mod run;
pub mod runners;
pub mod selfmetrics;
pub mod sender;
pub mod sources;
pub mod stream;
