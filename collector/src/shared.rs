//! State shared by the collector's tasks: the configuration, telemetry, the outputs, the
//! data plane and the accounting of finished connections.
//!
//! A leaf of the daemon's wiring: the daemon module builds it, the control plane reads it,
//! and it imports neither, so they do not import each other. (The control plane's own
//! state, tokens and live sessions, stays in the control plane.)

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
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
    /// The limits a reload changes live (`crate::reload::LIVE_KEYS`).
    pub limits: Arc<LiveLimits>,
}

/// The control plane's limits a reload changes live (`crate::reload::LIVE_KEYS`): read at
/// each use instead of from [`Shared::config`].
#[derive(Debug)]
pub struct LiveLimits {
    /// `control.max_agents`; `u64::MAX` for none.
    max_agents: AtomicU64,
}

impl LiveLimits {
    /// The limits of `config`.
    pub fn new(config: &Config) -> LiveLimits {
        let limits = LiveLimits {
            max_agents: AtomicU64::new(u64::MAX),
        };
        limits.set_max_agents(config.control.max_agents);
        limits
    }

    /// `control.max_agents` in force: with that many agents connected a new one is refused
    /// (`crate::control` module docs). Lowering it refuses new agents only: none connected
    /// is sent away.
    pub fn max_agents(&self) -> Option<u32> {
        u32::try_from(self.max_agents.load(Ordering::Relaxed)).ok()
    }

    /// Puts `max` in force for the next connections.
    pub fn set_max_agents(&self, max: Option<u32>) {
        self.max_agents
            .store(max.map_or(u64::MAX, u64::from), Ordering::Relaxed);
    }
}
