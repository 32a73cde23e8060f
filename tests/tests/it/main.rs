//! Every integration test of `uctel-tests` in one binary, a module per former `tests/*.rs`
//! file (one link step instead of one per file). One module alone:
//! `cargo test -p uctel-tests --test it -- fault_matrix::`.
//!
//! The heavy end-to-end modules (real Prometheus, VictoriaMetrics, ClickHouse, the fault
//! matrix, the pool's `/etc/hosts` names) take [`uctel_tests::exclusive`], so that they run
//! one at a time in this process as they did in their own binaries.

mod accounting;
mod clickhouse;
mod clickhouse_current;
mod dashboards;
mod demo;
mod e2e;
mod fast_counters;
mod fault_matrix;
mod hygiene;
mod kubernetes;
mod liveness;
mod log_copytruncate_down;
mod log_parse;
mod node_collectors;
mod node_ethtool;
mod node_exporter_full;
mod otlp;
mod pair;
mod pods;
mod pool;
mod pool_moves;
mod rc_lane;
mod reload_daemons;
mod remote_write;
mod rules;
mod scrape;
mod scrape_limits;
mod scrape_targets;
mod series_dictionary;
mod slurm;
mod status_api;
mod structure;
mod textfile;
