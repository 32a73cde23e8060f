//! The running metric sources (`sources.host_metrics`, `self_metrics`, each `scrape`
//! target, `textfile`, `fast_counters`, `slurm`, `pod_resources`), one task per *unit*, and how a reload
//! changes them without a restart ([`MetricSources::apply`]).
//!
//! A unit is one source entry: `host_metrics` (with whether a textfile source exists, which
//! decides its `node_textfile_scrape_error` sample), `self_metrics`, `textfile`,
//! `fast_counters`, `slurm`, and each `scrape` target. Units are compared whole (their
//! configuration serialised): a unit in both the old and the new configuration keeps its
//! task, and with it its state (a scrape target's series and staleness, the Slurm source's
//! jobs); a unit gone is stopped (a collection under way is abandoned, nothing of it was
//! queued); a new or changed unit starts, and samples at the next instant of its grid
//! ([`crate::pacing::grid`]). Records the sources queued before stay queued and are sent.
//!
//! `sources.fast_counters` added or removed needs a restart: whether the `fast_counters`
//! stream travels on a lane is settled when the session starts ([`crate::lane::carries`]);
//! a change of an existing section is live. So does `sources.pod_resources` added or
//! removed: the pod labels it writes are shared with the host-metrics and fast-counter
//! threads from their start; a change of an existing section is live (the labels stay
//! until the new source's first answer replaces them).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use uctel_common::shutdown::{self, Shutdown, ShutdownTrigger};

use crate::config::{seconds, AgentConfig};
use crate::pacing::grid::Grid;
use crate::runners::{
    fast_counters_loop, host_config, host_metrics_loop, pod_resources::pod_resources_loop,
    scrape_loop, self_metrics_loop, slurm::slurm_loop, textfile_loop, FastCounterMetrics, Queues,
    RoundMetrics,
};
use crate::selfmetrics::SelfMetrics;
use crate::sources::pod_resources::PodLabels;

/// Longest wait at a reload for a stopped unit's task to end (a host-metrics collection or
/// a Slurm round under way finishes first).
const STOP_WAIT: Duration = Duration::from_secs(30);

/// What one unit runs.
#[derive(Debug, Clone)]
enum Spec {
    Host(Box<AgentConfig>),
    SelfMetrics(crate::config::SelfMetricsSection),
    Scrape(crate::sources::scrape::ScrapeTarget),
    Textfile(crate::sources::textfile::TextfileSection),
    FastCounters(
        crate::sources::fast_counters::FastCountersSection,
        crate::config::WakeScheduling,
    ),
    Slurm(crate::sources::slurm::SlurmSection),
    PodResources(crate::sources::pod_resources::PodResourcesSection),
}

/// One unit of a configuration: its kind, its identity (the kind and the serialised entry),
/// and what it runs.
#[derive(Debug, Clone)]
struct UnitSpec {
    kind: &'static str,
    key: String,
    spec: Spec,
}

/// One running unit.
#[derive(Debug)]
struct Unit {
    kind: &'static str,
    key: String,
    stop: ShutdownTrigger,
    done: std::sync::mpsc::Receiver<()>,
    task: tokio::task::JoinHandle<()>,
}

fn yaml<T: serde::Serialize>(v: &T) -> String {
    serde_yaml::to_string(v).unwrap_or_default()
}

/// The metric source units of `config`, in start order.
fn units(config: &AgentConfig) -> Vec<UnitSpec> {
    let s = &config.sources;
    let mut out = Vec::new();
    if s.host_metrics.enabled {
        out.push(UnitSpec {
            kind: "host_metrics",
            key: format!(
                "{}textfile: {}\nwake_scheduling: {:?}",
                yaml(&s.host_metrics),
                s.textfile.is_some(),
                s.wake_scheduling
            ),
            spec: Spec::Host(Box::new(config.clone())),
        });
    }
    for t in &s.scrape {
        out.push(UnitSpec {
            kind: "scrape",
            key: yaml(t),
            spec: Spec::Scrape(t.clone()),
        });
    }
    if let Some(t) = &s.textfile {
        out.push(UnitSpec {
            kind: "textfile",
            key: yaml(t),
            spec: Spec::Textfile(t.clone()),
        });
    }
    if let Some(f) = &s.fast_counters {
        out.push(UnitSpec {
            kind: "fast_counters",
            key: format!("{}wake_scheduling: {:?}", yaml(f), s.wake_scheduling),
            spec: Spec::FastCounters(f.clone(), s.wake_scheduling),
        });
    }
    if let Some(sl) = &s.slurm {
        out.push(UnitSpec {
            kind: "slurm",
            key: yaml(sl),
            spec: Spec::Slurm(sl.clone()),
        });
    }
    if let Some(p) = &s.pod_resources {
        out.push(UnitSpec {
            kind: "pod_resources",
            key: yaml(p),
            spec: Spec::PodResources(p.clone()),
        });
    }
    if s.self_metrics.enabled {
        out.push(UnitSpec {
            kind: "self_metrics",
            key: yaml(&s.self_metrics),
            spec: Spec::SelfMetrics(s.self_metrics.clone()),
        });
    }
    out
}

/// The agent's metric sources.
#[derive(Debug)]
pub struct MetricSources {
    runtime: tokio::runtime::Handle,
    queues: Queues,
    stats: Arc<SelfMetrics>,
    shutdown: Shutdown,
    /// `None`: the round metrics could not be registered, and no metric source runs.
    rounds: Option<RoundMetrics>,
    /// The pod labels `pod_resources` writes and host metrics and fast counters read;
    /// `None` without that source.
    pod_labels: Option<PodLabels>,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    running: Vec<Unit>,
    /// Registered with the first `fast_counters` unit.
    fast: Option<FastCounterMetrics>,
}

impl MetricSources {
    /// Starts the metric sources of `config` on the current tokio runtime, each feeding its
    /// queue of `queues` until `shutdown` or until a reload stops it. A scrape target or
    /// fast counter that cannot be set up is logged and does not run (as at start before).
    ///
    /// # Panics
    /// Called outside a tokio runtime.
    pub fn start(
        config: &AgentConfig,
        queues: &Queues,
        stats: &Arc<SelfMetrics>,
        shutdown: &Shutdown,
    ) -> Arc<MetricSources> {
        let rounds = RoundMetrics::register(stats.registry())
            .inspect_err(|e| {
                tracing::error!(error = %e, "cannot register the sources' round metrics; no metric source runs");
            })
            .ok();
        let me = Arc::new(MetricSources {
            runtime: tokio::runtime::Handle::current(),
            queues: queues.clone(),
            stats: stats.clone(),
            shutdown: shutdown.clone(),
            rounds,
            pod_labels: config
                .sources
                .pod_resources
                .as_ref()
                .map(|_| PodLabels::default()),
            inner: Mutex::new(Inner::default()),
        });
        let mut inner = me.lock();
        for u in units(config) {
            if let Some(unit) = me.spawn(&mut inner, u) {
                inner.running.push(unit);
            }
        }
        drop(inner);
        me
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Starts `u`; `None` when it cannot run (logged).
    fn spawn(&self, inner: &mut Inner, u: UnitSpec) -> Option<Unit> {
        let rounds = self.rounds.clone()?;
        let (trigger, stop) = shutdown::channel();
        let (q, st) = (self.queues.metrics.clone(), self.stats.clone());
        let grid = |interval: f64, offset: f64| Grid::new(seconds(interval), seconds(offset));
        let body: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> = match u.spec {
            Spec::Host(config) => {
                let h = &config.sources.host_metrics;
                Box::pin(host_metrics_loop(
                    host_config(&config),
                    config.sources.textfile.is_none(),
                    (
                        grid(h.interval_seconds, h.offset_seconds),
                        config.sources.wake_scheduling,
                    ),
                    self.pod_labels.clone(),
                    q,
                    (st, rounds),
                    stop,
                ))
            }
            Spec::SelfMetrics(m) => Box::pin(self_metrics_loop(
                grid(m.interval_seconds, m.offset_seconds),
                q,
                (st, rounds),
                stop,
            )),
            Spec::Scrape(t) => {
                let url = t.url.clone();
                match crate::sources::scrape::Target::new(t) {
                    Ok(target) => Box::pin(scrape_loop(target, q, (st, rounds), stop)),
                    Err(e) => {
                        tracing::error!(%url, error = %e, "cannot set up a scrape target; it is not scraped");
                        return None;
                    }
                }
            }
            Spec::Textfile(t) => Box::pin(textfile_loop(
                t.directory,
                grid(t.interval_seconds, t.offset_seconds),
                q,
                (st, rounds),
                stop,
            )),
            Spec::FastCounters(f, scheduling) => {
                let specs = f
                    .resolve()
                    .inspect_err(|e| {
                        tracing::error!(error = %e, "fast_counters: invalid counter; the source does not run");
                    })
                    .ok()?;
                let metrics = match &inner.fast {
                    Some(m) => m.clone(),
                    None => {
                        let m = FastCounterMetrics::register(st.registry())
                            .inspect_err(|e| {
                                tracing::error!(error = %e, "fast_counters: cannot register its metrics; the source does not run");
                            })
                            .ok()?;
                        inner.fast = Some(m.clone());
                        m
                    }
                };
                let q = self.queues.fast_counters.clone();
                let labels = self.pod_labels.clone();
                Box::pin(fast_counters_loop(
                    (f, scheduling),
                    specs,
                    metrics,
                    (q, labels),
                    st,
                    stop,
                ))
            }
            Spec::Slurm(s) => Box::pin(slurm_loop(s, q, (st, rounds), stop)),
            Spec::PodResources(p) => {
                let labels = self.pod_labels.clone()?;
                Box::pin(pod_resources_loop(p, labels, q, (st, rounds), stop))
            }
        };
        // The unit stops at its own trigger (a reload) or at the agent's shutdown.
        let (mut global, mut own, relay) =
            (self.shutdown.clone(), trigger.subscribe(), trigger.clone());
        self.runtime.spawn(async move {
            tokio::select! {
                () = global.wait() => relay.trigger(),
                () = own.wait() => {}
            }
        });
        let (done_tx, done) = std::sync::mpsc::channel();
        let task = self.runtime.spawn(async move {
            body.await;
            let _ = done_tx.send(());
        });
        Some(Unit {
            kind: u.kind,
            key: u.key,
            stop: trigger,
            done,
            task,
        })
    }

    /// Puts the metric sources of `new` in force in the place of those running (module
    /// docs): units unchanged keep running, units gone are stopped (this waits for their
    /// tasks to end, `STOP_WAIT` (30 s) at most each), new ones start. Blocking: call it off the
    /// async workers (a reload runs on the blocking pool).
    ///
    /// # Errors
    /// `sources.fast_counters` was added or removed (the reload's checks refuse that before:
    /// [`restart_keys`]); nothing changed.
    pub fn apply(&self, old: &AgentConfig, new: &AgentConfig) -> Result<(), String> {
        if let Some(k) = restart_keys(old, new).first() {
            return Err(format!("{k} needs a restart"));
        }
        if self.shutdown.is_triggered() {
            return Err("the agent is stopping".into());
        }
        let mut inner = self.lock();
        let mut wanted = units(new);
        let mut keep = Vec::new();
        let mut gone = Vec::new();
        for unit in std::mem::take(&mut inner.running) {
            match wanted
                .iter()
                .position(|w| w.kind == unit.kind && w.key == unit.key)
            {
                Some(i) => {
                    wanted.remove(i);
                    keep.push(unit);
                }
                None => gone.push(unit),
            }
        }
        inner.running = keep;
        for u in &gone {
            tracing::info!(
                source = u.kind,
                "metric source removed or changed: stopping it"
            );
            u.stop.trigger();
        }
        for u in gone {
            if u.done.recv_timeout(STOP_WAIT).is_err() && !u.task.is_finished() {
                tracing::warn!(
                    source = u.kind,
                    "a stopped metric source has not ended yet; it ends by itself"
                );
            }
            if u.kind == "scrape" {
                self.forget_scrape(&u.key, new);
            }
        }
        for w in wanted {
            let kind = w.kind;
            if let Some(unit) = self.spawn(&mut inner, w) {
                tracing::info!(source = kind, "metric source started by a reload");
                inner.running.push(unit);
            }
        }
        Ok(())
    }

    /// Takes a removed scrape target (its serialised entry `key`) off the status board,
    /// unless a target of `new` has the same URL.
    fn forget_scrape(&self, key: &str, new: &AgentConfig) {
        let Ok(t) = serde_yaml::from_str::<crate::sources::scrape::ScrapeTarget>(key) else {
            return;
        };
        if !new.sources.scrape.iter().any(|n| n.url == t.url) {
            self.stats.status().forget_scrape(t.url.as_str());
        }
    }

    /// The kinds of the units running now, in start order (`scrape` once per target).
    pub fn running(&self) -> Vec<&'static str> {
        self.lock().running.iter().map(|u| u.kind).collect()
    }

    /// Waits for every unit's task to end (after shutdown).
    pub async fn join(&self) {
        let tasks: Vec<_> = std::mem::take(&mut self.lock().running);
        for u in tasks {
            let _ = u.task.await;
        }
    }
}

/// The changed `sources` keys of the metric sources that a reload cannot apply live:
/// `sources.fast_counters` or `sources.pod_resources` added or removed.
pub fn restart_keys(old: &AgentConfig, new: &AgentConfig) -> Vec<String> {
    let (o, n) = (&old.sources, &new.sources);
    let mut keys = Vec::new();
    if o.fast_counters.is_some() != n.fast_counters.is_some() {
        keys.push("sources.fast_counters (added or removed)".to_owned());
    }
    if o.pod_resources.is_some() != n.pod_resources.is_some() {
        keys.push("sources.pod_resources (added or removed)".to_owned());
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(yaml: &str) -> AgentConfig {
        serde_yaml::from_str(yaml).unwrap()
    }

    #[test]
    fn units_are_compared_whole() {
        let base = "agent_id: a\ncollector: {control: '127.0.0.1:1'}\n";
        let a = config(&format!(
            "{base}sources:\n  scrape:\n    - {{url: 'http://127.0.0.1:1/metrics'}}\n"
        ));
        let b = config(&format!(
            "{base}sources:\n  textfile: {{directory: /tmp}}\n  scrape:\n    - {{url: 'http://127.0.0.1:1/metrics'}}\n    - {{url: 'http://127.0.0.1:2/metrics'}}\n"
        ));
        let (ua, ub) = (units(&a), units(&b));
        let kinds: Vec<_> = ub.iter().map(|u| u.kind).collect();
        assert_eq!(
            kinds,
            [
                "host_metrics",
                "scrape",
                "scrape",
                "textfile",
                "self_metrics"
            ]
        );
        // The first target is the same unit; host_metrics changes with the textfile source.
        assert_eq!(ua[1].key, ub[1].key);
        assert_ne!(ua[0].key, ub[0].key);
        assert_eq!(ua.last().unwrap().key, ub.last().unwrap().key);
        assert!(restart_keys(&a, &b).is_empty());
    }

    /// `sources.wake_scheduling` is part of the units whose threads it schedules, so a
    /// reload that changes it starts them again under it, and only them.
    #[test]
    fn wake_scheduling_changes_the_host_and_fast_units_only() {
        let base = "agent_id: a\ncollector: {control: '127.0.0.1:1'}\nsources:\n  \
                    scrape: [{url: 'http://127.0.0.1:1/metrics'}]\n  \
                    fast_counters: {counters: [{path: /sys/class/net/lo/statistics/rx_packets}]}\n";
        let (a, b) = (
            config(base),
            config(&format!("{base}  wake_scheduling: normal\n")),
        );
        assert_eq!(
            a.sources.wake_scheduling,
            crate::config::WakeScheduling::Realtime
        );
        let changed: Vec<_> = units(&a)
            .iter()
            .zip(units(&b).iter())
            .filter(|(x, y)| x.key != y.key)
            .map(|(x, _)| x.kind)
            .collect();
        assert_eq!(changed, ["host_metrics", "fast_counters"]);
        assert!(restart_keys(&a, &b).is_empty());
    }
}
