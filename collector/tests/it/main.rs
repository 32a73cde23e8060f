//! Every integration test of `uctel-collector` in one binary, a module per former `tests/*.rs`
//! file (one link step instead of one per file). One module alone:
//! `cargo test -p uctel-collector --test it -- acceptance::`.
//!
//! Kept apart: `idle` (`tests/slow/`) measures the CPU of the whole process, which the other
//! modules' threads would share here; `operator` (`tests/operator/`) installs a global log
//! subscriber and counts the warnings of the whole process, which other modules' collectors
//! (an agent id `twin` in `adversarial_control` too) would add to.

mod acceptance;
mod adversarial_control;
mod adversarial_frames;
mod adversarial_http;
mod adversarial_udp;
mod binary;
mod config_files;
mod credit_batch;
mod descriptor_queue;
mod http_endpoints;
mod logsink_disk_full;
mod operator_start;
mod otlp_http;
mod packaging;
mod rc_lane;
mod reload;
mod remote_write_http;
mod remote_write_reload;
mod shared_queues;
mod support;
