//! `uctel-testkit`: the one test harness of the workspace, shared by the agent's and the
//! collector's integration tests, the end-to-end tests (`uctel-tests`) and the bench.
//!
//! Layout:
//! - [`wait`]: the one bounded wait ([`wait_for`], its tokio form and the panicking
//!   [`wait::until`] / [`wait::eventually`]); a probe says `bool`, `Option` or `Result`.
//! - [`exposition`]: the Prometheus text exposition parser (strict: a malformed line is an
//!   error), lookups by name and labels, the blocking scrape of `/metrics`.
//! - [`http`]: blocking GETs (`ureq`) and a raw one-request client on tokio.
//! - [`promtool`]: `promtool check metrics` with the one accepted lint exception.
//! - [`running`]: [`RunningAgent`] and [`RunningCollector`], the in-process daemons whose
//!   `stop()` asserts how they ended.
//!
//! The crate depends on `uctel-agent` and `uctel-collector` for the fixtures, and those
//! crates dev-depend on it: Cargo allows that cycle for integration tests (`tests/*.rs`),
//! which link the same library build as this crate. Unit tests inside `agent/src` or
//! `collector/src` are compiled as a second copy of their crate, so they must not use the
//! fixtures (the types would not match); they have no need to.

#![forbid(unsafe_code)]

pub mod exposition;
pub mod http;
pub mod promtool;
pub mod running;
pub mod wait;

pub use exposition::{Sample, Scrape};
pub use running::{RunningAgent, RunningCollector};
pub use wait::{eventually, wait_for, wait_for_async};
