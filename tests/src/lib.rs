//! uctel end-to-end test support: everything the integration tests in `tests/tests/` need to
//! run the real `uctel-collector` and `uctel-agent` binaries, configured by YAML files the way
//! an operator writes them, on loopback with the soft RoCEv2 transport, and to check them
//! from the outside (their `/metrics`, a real Prometheus, `promtool`).
//!
//! Layout:
//! - [`bins`]: finds (and, once per test binary, builds) the daemon binaries.
//! - [`net`]: free loopback ports for listeners the tests configure.
//! - [`exposition`]: the Prometheus text exposition parser and scrape helper of
//!   `uctel-testkit` (the one the bench and every test use), re-exported.
//! - [`daemon`]: a child process with its YAML config and log file, signalled like systemd
//!   does (SIGTERM, SIGKILL), killed on drop so no test leaks a process.
//! - [`configs`]: collector and agent configurations derived from the examples in `config/`.
//! - [`pipeline`]: a collector plus agents as one fixture, with the per-agent accounting
//!   (`sent == received + lost + dropped`) read from both sides.
//! - [`prometheus`]: a real Prometheus server (`/usr/bin/prometheus`) on a free port with a
//!   temporary configuration and TSDB, queried through its HTTP API; `promtool`.
//! - [`dashboards`]: the Grafana dashboards in `dashboards/`, their panel queries with the
//!   template variables substituted as Grafana would.
//! - [`fabric`]: the ConnectX sysfs fixture, fast counters and mlx5 pause statistics for an
//!   agent, so that the fabric dashboard's series exist.
//! - [`faults`]: the fault matrix's rows: seeded numbered log lines as the source, the JSON
//!   Lines sink read back, the conservation law per agent and stream as a table, and the
//!   OS-level faults (nft drop rule, network namespace, tmpfs).
//! - [`pair`]: the agent's sans-IO sender and the collector's connection ingest wired back to
//!   back through a seeded lossy link on a virtual clock, with the same accounting laws (no
//!   binaries, no sockets).
//! - [`targets`]: small HTTP scrape targets answering what a test says (text, a large chunked
//!   answer without `Content-Length`, a status), counting what they served.
//!
//! Every wait in this crate is bounded by a deadline and fails with what it last saw: it is
//! [`wait_for`], `uctel-testkit`'s one wait.

#![forbid(unsafe_code)]

pub mod bins;
pub mod clickhouse;
pub mod configs;
pub mod daemon;
pub mod dashboards;
pub mod fabric;
pub mod faults;
pub mod kubelet;
pub mod net;
pub mod node_exporter;
pub mod otlp;
pub mod pair;
pub mod pipeline;
pub mod pool;
pub mod prometheus;
pub mod targets;
pub mod victoria;

pub use uctel_testkit::exposition;
pub use uctel_testkit::wait_for;

use std::path::PathBuf;

/// The workspace root (the directory holding `config/`, `dashboards/`, `scripts/`).
pub fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map_or(manifest.clone(), PathBuf::from)
}

/// Serialises the heavy end-to-end tests inside one test binary: the machine has few cores
/// and each test runs several daemons, so running them side by side only makes them slower
/// and their timing noisier.
pub fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
