//! uctel end-to-end test support: everything the integration tests in `tests/tests/` need to
//! run the real `uctel-collector` and `uctel-agent` binaries, configured by YAML files the way
//! an operator writes them, on loopback with the soft RoCEv2 transport, and to check them
//! from the outside (their `/metrics`, a real Prometheus, `promtool`).
//!
//! Layout:
//! - [`bins`]: finds (and, once per test binary, builds) the daemon binaries.
//! - [`net`]: free loopback ports for listeners the tests configure.
//! - [`exposition`]: a parser for the Prometheus text exposition format and a scrape helper.
//! - [`daemon`]: a child process with its YAML config and log file, signalled like systemd
//!   does (SIGTERM, SIGKILL), killed on drop so no test leaks a process.
//! - [`configs`]: collector and agent configurations derived from the examples in `config/`.
//! - [`pipeline`]: a collector plus agents as one fixture, with the per-agent accounting
//!   (`sent == received + lost + dropped`) read from both sides.
//! - [`prometheus`]: a real Prometheus server (`/usr/bin/prometheus`) on a free port with a
//!   temporary configuration and TSDB, queried through its HTTP API; `promtool`.
//! - [`dashboards`]: the Grafana dashboards in `dashboards/`, their panel queries with the
//!   template variables substituted as Grafana would.
//! - [`faults`]: the fault matrix's rows: seeded numbered log lines as the source, the JSON
//!   Lines sink read back, the conservation law per agent and stream as a table, and the
//!   OS-level faults (nft drop rule, network namespace, tmpfs).
//! - [`pair`]: the agent's sans-IO sender and the collector's connection ingest wired back to
//!   back through a seeded lossy link on a virtual clock, with the same accounting laws (no
//!   binaries, no sockets).
//!
//! Every wait in this crate is bounded by a deadline and fails with what it last saw.

pub mod bins;
pub mod configs;
pub mod daemon;
pub mod dashboards;
pub mod exposition;
pub mod faults;
pub mod net;
pub mod pair;
pub mod pipeline;
pub mod prometheus;

use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The workspace root (the directory holding `config/`, `dashboards/`, `scripts/`).
pub fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map_or(manifest.clone(), PathBuf::from)
}

/// Polls `probe` every `every` until it returns `Ok(value)` or `timeout` passes; on timeout
/// returns the last error, prefixed with `what`.
///
/// # Errors
/// `what: <last error>` when the deadline passed.
pub fn wait_for<T>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut probe: impl FnMut() -> Result<T, String>,
) -> Result<T, String> {
    let deadline = Instant::now() + timeout;
    loop {
        match probe() {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() >= deadline => {
                return Err(format!("{what}: not reached after {timeout:?}: {e}"))
            }
            Err(_) => std::thread::sleep(every),
        }
    }
}

/// Serialises the heavy end-to-end tests inside one test binary: the machine has few cores
/// and each test runs several daemons, so running them side by side only makes them slower
/// and their timing noisier.
pub fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
