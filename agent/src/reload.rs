//! Configuration reload of the agent (`SIGHUP`, `POST /-/reload`; the rules are
//! `uctel_common::reload`'s): the file is read and validated whole (with `--agent-id` in
//! the place of the file's `agent_id`, as at start), and applied only when every changed key
//! is in [`LIVE_KEYS`]; a change to any other key is refused whole, with the keys named, and
//! the agent keeps running as it was (no session is dropped, no record lost).
//!
//! Live: `log_level` (the base of the log filter, `uctel_common::logging::LogLevel`);
//! `sources.logs`, `sources.journald` and `sources.kmsg` ([`crate::log_sources`] hands a
//! changed source over from its checkpoint, cursor or sequence number); the metric sources
//! `sources.host_metrics`, `self_metrics`, `scrape`, `textfile`, `fast_counters` (changed,
//! not added or removed: that needs a restart), `slurm` and `pod_resources` (changed, not
//! added or removed), and `sources.wake_scheduling` (the host metrics and fast counters
//! start again under it) ([`crate::metric_sources`]).
//! Every other key needs a restart (README "Reload").

use std::path::PathBuf;

use uctel_common::logging::{BaseRule, LogLevel};
use uctel_common::reload::{ReloadFn, ReloadMetrics, Reloader};

use std::sync::Arc;

use crate::config::AgentConfig;
use crate::log_sources::LogSources;
use crate::metric_sources::MetricSources;
use crate::runners::Queues;
use crate::stream::Stream;

/// The changed keys of `new` that [`LIVE_KEYS`] lists but whose new value needs a restart:
/// `sources.fast_counters` or `sources.pod_resources` added or removed, a smaller
/// `streams.metrics.buffer_while_disconnected_records`.
pub fn restart_keys(old: &AgentConfig, new: &AgentConfig) -> Vec<String> {
    let mut keys = crate::metric_sources::restart_keys(old, new);
    let buffer = |c: &AgentConfig| c.streams.buffer_while_disconnected_records();
    if buffer(new) < buffer(old) {
        keys.push("streams.metrics.buffer_while_disconnected_records (smaller)".to_owned());
    }
    keys
}

/// Puts the queue sizes of `new` in force on `queues`.
fn apply_limits(queues: &Queues, new: &AgentConfig) {
    let s = &new.streams;
    queues
        .metrics
        .set_capacity(s.queue_records(Stream::Metrics));
    queues.logs.set_capacity(s.queue_records(Stream::Logs));
    queues
        .fast_counters
        .set_capacity(s.queue_records(Stream::FastCounters));
    queues
        .metrics_buffer
        .grow(s.buffer_while_disconnected_records());
}

/// The running sources (and the queues) a reload changes.
#[derive(Debug, Clone)]
pub struct Sources {
    /// The queues between the sources and the sender (their sizes).
    pub queues: Queues,
    /// The log tailers, the journald and the kmsg source.
    pub logs: Arc<LogSources>,
    /// The metric sources.
    pub metrics: Arc<MetricSources>,
}

/// The keys (and key prefixes) a reload applies without a restart: the log level, the
/// sources (but `sources.state_directory`), the queue sizes (`streams.*.queue_records`:
/// larger or smaller, nothing queued is dropped, [`crate::queue::RecordQueue::set_capacity`])
/// and a larger `streams.metrics.buffer_while_disconnected_records` (a smaller one needs a
/// restart: it would drop samples held; [`restart_keys`]). Not among them:
/// `sources.state_directory` (the checkpoints of every log source live there), the
/// collector's address, authentication and identity (`collector`, `auth`, `agent_id`), the
/// data path (`transport`, `streams`, `max_frame_bytes`, `pacing`) and `listen`: those need
/// a restart, and so does `sources.fast_counters` added or removed (whether its stream
/// travels is settled when the session starts; [`crate::metric_sources::restart_keys`]).
/// The pacing rates are the running session's: they need a restart too.
pub const LIVE_KEYS: &[&str] = &[
    "log_level",
    "streams.metrics.queue_records",
    "streams.logs.queue_records",
    "streams.fast_counters.queue_records",
    "streams.metrics.buffer_while_disconnected_records",
    "sources.logs",
    "sources.journald",
    "sources.kmsg",
    "sources.host_metrics",
    "sources.self_metrics",
    "sources.scrape",
    "sources.textfile",
    "sources.fast_counters",
    "sources.slurm",
    "sources.pod_resources",
    "sources.wake_scheduling",
];

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
/// `level` and the sources to `sources`; registers `uctel_agent_config_last_reload_*` in `registry`.
///
/// # Errors
/// A registration conflict (called twice on one registry).
pub fn reloader(
    config: &AgentConfig,
    source: ReloadSource,
    level: LogLevel,
    registry: &prometheus::Registry,
    sources: Sources,
) -> Result<ReloadFn, prometheus::Error> {
    let metrics = ReloadMetrics::register(registry, NAMESPACE)?;
    let (path, agent_id) = (source.path.clone(), source.agent_id.clone());
    let load = Box::new(move || {
        AgentConfig::load_with_agent_id(&path, agent_id.as_deref())
            .map_err(|e| format!("{e}\n{}", e.summary()))
    });
    let rule = source.log_rule;
    let apply = Box::new(move |old: &AgentConfig, new: &AgentConfig| {
        // The log sources first: the step that can fail (then nothing changed). If the
        // metric sources fail after them, the log sources go back: nothing half-applied.
        sources.logs.apply(old, new)?;
        if let Err(e) = sources.metrics.apply(old, new) {
            if let Err(back) = sources.logs.apply(new, old) {
                tracing::error!(error = %back, "the log sources could not be put back after a failed reload");
            }
            return Err(e);
        }
        apply_limits(&sources.queues, new);
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
    // What needs a restart among the live keys' changes is refused (409, `NeedsRestart`)
    // before anything is applied.
    Ok(
        Reloader::new(config.clone(), load, LIVE_KEYS, apply, metrics)
            .with_restart_keys(Box::new(restart_keys))
            .into_fn(),
    )
}
