//! Configuration reload of the agent (`SIGHUP`, `POST /-/reload`; the rules are
//! `uctel_common::reload`'s): the file is read and validated whole (with `--agent-id` in
//! the place of the file's `agent_id`, as at start), and applied only when every changed key
//! is in [`LIVE_KEYS`]; a change to any other key is refused whole, with the keys named, and
//! the agent keeps running as it was (no session is dropped, no record lost).
//!
//! Live: `log_level` (the base of the log filter, `uctel_common::logging::LogLevel`) and
//! `sources.logs` (log sources added, removed or changed; [`crate::log_sources`] hands a
//! changed file over from its checkpoint). Every other key needs a restart (README
//! "Reload").

use std::path::PathBuf;

use uctel_common::logging::{BaseRule, LogLevel};
use uctel_common::reload::{ReloadFn, ReloadMetrics, Reloader};

use std::sync::Arc;

use crate::config::AgentConfig;
use crate::log_sources::LogSources;

/// The keys (and key prefixes) a reload applies without a restart.
pub const LIVE_KEYS: &[&str] = &["log_level", "sources.logs"];

/// The namespace of the reload metrics: `uctel_agent_config_last_reload_*`.
const NAMESPACE: &str = "uctel_agent";

/// Where a reload reads the configuration, and where the log filter's base comes from.
#[derive(Debug, Clone)]
pub struct ReloadSource {
    /// The configuration file (`--config`).
    pub path: PathBuf,
    /// `--agent-id` (or `UCTEL_AGENT_ID`), which takes the place of the file's `agent_id`.
    pub agent_id: Option<String>,
    /// `--log-level` and `RUST_LOG` as the agent started with them.
    pub log_rule: BaseRule,
}

/// The agent's reload from `source`, starting at `config`, applying the log filter to
/// `level` and the log sources to `log_sources`; registers `uctel_agent_config_last_reload_*` in `registry`.
///
/// # Errors
/// A registration conflict (called twice on one registry).
pub fn reloader(
    config: &AgentConfig,
    source: ReloadSource,
    level: LogLevel,
    registry: &prometheus::Registry,
    log_sources: Arc<LogSources>,
) -> Result<ReloadFn, prometheus::Error> {
    let metrics = ReloadMetrics::register(registry, NAMESPACE)?;
    let (path, agent_id) = (source.path.clone(), source.agent_id.clone());
    let load = Box::new(move || {
        AgentConfig::load_with_agent_id(&path, agent_id.as_deref())
            .map_err(|e| format!("{e}\n{}", e.summary()))
    });
    let rule = source.log_rule;
    let apply = Box::new(move |old: &AgentConfig, new: &AgentConfig| {
        // The log sources first: the one step that can fail (then nothing changed).
        log_sources.apply(old, new)?;
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
