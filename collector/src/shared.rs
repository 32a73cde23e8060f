//! State shared by the collector's tasks: the configuration, telemetry, the outputs, the
//! data plane and the accounting of finished connections.
//!
//! A leaf of the daemon's wiring: the daemon module builds it, the control plane reads it,
//! and it imports neither, so they do not import each other. (The control plane's own
//! state, tokens and live sessions, stays in the control plane.)

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::config::Config;
use crate::dataplane::DataPlane;
use crate::ingest::{DeliveredLogs, StreamLedger};
use crate::outputs::Outputs;
use crate::telemetry::Telemetry;

/// Cumulative per-stream accounting of closed connections, by `(agent, stream)`.
pub type Ledger = Arc<Mutex<HashMap<(String, u32), StreamLedger>>>;

/// Shared state of a running collector, handed to every task.
#[derive(Debug, Clone)]
pub struct Shared {
    /// The configuration it was started with.
    pub config: Arc<Config>,
    /// Self-metrics.
    pub telemetry: Telemetry,
    /// Where accepted records go: the series store, the log sink and the configured
    /// asynchronous outputs, built once ([`Outputs::start`]).
    pub outputs: Outputs,
    /// The receive data path (device, worker).
    pub plane: Arc<DataPlane>,
    /// Per-stream accounting of finished connections.
    pub ledger: Ledger,
    /// Log offsets each agent delivered in its earlier epochs (replays are discarded).
    pub delivered: DeliveredLogs,
    /// The collector-wide credit budget (DESIGN.md §4).
    pub credits: Arc<crate::credits::CreditBudget>,
    /// The live sessions as the status API shows them (`crate::status`).
    pub sessions: crate::status::Board,
    /// Fires the drain (`SIGUSR1`, `POST /-/drain`); the control plane subscribes to it.
    pub drain: uctel_common::shutdown::ShutdownTrigger,
}
