//! Every integration test of `uctel-agent` in one binary, a module per former `tests/*.rs`
//! file (one link step instead of one per file). One module alone:
//! `cargo test -p uctel-agent --test it -- session::`.
//!
//! `idle` is in `tests/slow/`: it measures the CPU of the whole process, which the other
//! modules' threads would share here.

mod aligned;
mod cli;
mod config_files;
mod config_reference;
mod e2e_collector;
mod http_endpoints;
mod log_downtime;
mod log_records;
mod logrotate_cases;
mod operator_start;
mod packaging;
mod pod_resources;
mod rc_lane;
mod reload_sources;
mod session;
mod sources_host;
mod sources_journald;
mod sources_kmsg;
mod sources_logs;
mod sources_rdma;
mod support;
