//! Configuration reload of the collector (`SIGHUP`, `POST /-/reload`; the rules are
//! `uctel_common::reload`'s): the file is read and validated whole, and applied only when
//! every changed key is in [`LIVE_KEYS`]; a change to any other key is refused whole, with
//! the keys named, and the collector keeps running as it was.
//!
//! Live: see [`LIVE_KEYS`]. Every other key needs a restart (README "Reload").

use std::path::PathBuf;

use uctel_common::logging::{BaseRule, LogLevel};
use uctel_common::reload::{ReloadFn, ReloadMetrics, Reloader};

use crate::config::Config;
use crate::outputs::Outputs;
use crate::shared::LiveLimits;
use crate::telemetry::{Telemetry, NAMESPACE};
use std::sync::Arc;

/// The keys (and key prefixes) a reload applies without a restart:
///
/// - `log_level`: the base of the log filter (`uctel_common::logging::LogLevel`);
/// - `outputs.remote_write`, `outputs.clickhouse`, `outputs.otlp`: endpoints added,
///   removed or changed (each record goes to exactly the endpoints in force when the worker
///   accepted it; a removed or changed endpoint drains within its grace period and counts
///   what it could not send `reason="reload"`; its successor sends once it has finished:
///   `crate::outputs::handover`);
/// - `series_cap_per_agent`: the series store's and remote-write's bound on series per
///   agent; a lower cap refuses new series only (counted `series_cap` as always), series
///   already held stay until they end;
/// - `control.max_agents`: the next connections are admitted or refused against the new
///   value; a lower value sends no connected agent away.
///
/// Everything else needs a restart, and a reload that changes it is refused whole:
/// `listen.*` (bound sockets), `transport.*` and `ring.*` (the device and the data-plane
/// rings), `auth.*` (tokens), the rest of `control.*` (timers of running sessions),
/// `max_frame_bytes`, `staleness_seconds`, `metrics.*`, the reorder and dropout windows,
/// `logs.*` (the log sink's open file).
pub const LIVE_KEYS: &[&str] = &[
    "log_level",
    "outputs.clickhouse",
    "outputs.otlp",
    "outputs.remote_write",
    "series_cap_per_agent",
    "control.max_agents",
];

/// Where a reload reads the configuration, and where the log filter's base comes from.
#[derive(Debug, Clone)]
pub struct ReloadSource {
    /// The configuration file (`--config`).
    pub path: PathBuf,
    /// `--log-level` and `RUST_LOG` as the collector started with them.
    pub log_rule: BaseRule,
}

/// The collector's reload from `source`, starting at `config`, applying the log filter to
/// `level`, the outputs' changes to `outputs` and the limits to `limits`; registers `uctel_collector_config_last_reload_*` in `telemetry`.
///
/// # Errors
/// A registration conflict (called twice on one registry).
pub fn reloader(
    config: &Config,
    source: ReloadSource,
    level: LogLevel,
    telemetry: &Telemetry,
    outputs: Outputs,
    limits: Arc<LiveLimits>,
) -> Result<ReloadFn, prometheus::Error> {
    let metrics = ReloadMetrics::register(telemetry.registry(), NAMESPACE)?;
    let path = source.path.clone();
    let load =
        Box::new(move || crate::config::load(&path).map_err(|e| format!("{e}\n{}", e.summary())));
    let rule = source.log_rule;
    let apply = Box::new(move |old: &Config, new: &Config| {
        // The outputs first: the one part that can fail on a valid file (a secret file
        // that became unreadable), and then nothing has changed.
        if old.outputs != new.outputs {
            let lines = outputs
                .reconfigure(&old.outputs, &new.outputs)
                .map_err(|e| e.to_string())?;
            for line in lines {
                tracing::info!("reload: {line}");
            }
        }
        if old.series_cap_per_agent != new.series_cap_per_agent {
            let cap = new.series_cap_per_agent.0;
            outputs.store.set_cap_per_agent(cap);
            outputs.remote_write.set_series_cap(cap);
        }
        if old.control.max_agents != new.control.max_agents {
            limits.set_max_agents(new.control.max_agents);
        }
        if old.log_level != new.log_level {
            if rule.flag.is_some() {
                tracing::warn!(
                    "log_level changed in the file, but --log-level given at start wins over it"
                );
            }
            level
                .set_base(&rule.directives(new.log_level.as_deref()))
                .map_err(|e| format!("log_level: {e}"))?;
        }
        Ok(())
    });
    Ok(Reloader::new(config.clone(), load, LIVE_KEYS, apply, metrics).into_fn())
}
