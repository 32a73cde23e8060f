//! The running log tailers, one thread per `sources.logs` entry
//! ([`crate::runners::log_tailer_loop`]), and how a reload changes them without a restart;
//! also the threads of `sources.journald` and `sources.kmsg`, which a reload leaves alone
//! (their keys need a restart).
//!
//! At a reload ([`LogSources::apply`]) the entries are compared whole: an entry in both the
//! old and the new list keeps its tailer untouched; an entry gone from the list (or
//! changed: gone, and a new one added) has its tailer stopped, which waits until the sender
//! has settled every line it read (DESIGN.md §7, [`crate::runners::Handoff`]) and writes its
//! final checkpoint; then the new entries' tailers start, a changed entry's from that
//! checkpoint (the state file is named after the path). So no line is lost or sent twice,
//! and the session goes on. A removed entry's checkpoint stays in `state_directory`: put
//! back, the entry goes on where it stopped. If a new tailer cannot start, the ones this
//! reload started are stopped and the stopped ones started again from their checkpoints:
//! the reload fails and the old list stays in force.

use std::sync::{Arc, Mutex};

use uctel_common::shutdown::{self, Shutdown, ShutdownTrigger};

use crate::config::{seconds, AgentConfig, LogSection, Reliability};
use crate::runners::{log_source_config, log_tailer_loop, LogMetrics, Queues};
use crate::selfmetrics::SelfMetrics;
use crate::sources::logs::LogTailer;
use crate::stream::Stream;

/// One running tailer.
#[derive(Debug)]
struct Tailer {
    entry: LogSection,
    stop: ShutdownTrigger,
    thread: std::thread::JoinHandle<()>,
}

/// The agent's log tailers.
#[derive(Debug)]
pub struct LogSources {
    queues: Queues,
    stats: Arc<SelfMetrics>,
    shutdown: Shutdown,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Registered with the first tailer.
    metrics: Option<LogMetrics>,
    running: Vec<Tailer>,
    /// The journald and kmsg sources' threads (`runners::spawn_system_log_sources`).
    system: Vec<std::thread::JoinHandle<()>>,
}

fn same(a: &LogSection, b: &LogSection) -> bool {
    serde_yaml::to_value(a).ok() == serde_yaml::to_value(b).ok()
}

impl LogSources {
    /// Starts a tailer for each entry of `config.sources.logs`, and the journald and kmsg
    /// sources where configured.
    ///
    /// # Errors
    /// A tailer that cannot start (bad pattern, unreadable state file, state directory that
    /// cannot be created), naming the entry; the tailers started are stopped. A journald or
    /// kmsg source that cannot start, naming it.
    pub fn start(
        config: &AgentConfig,
        queues: &Queues,
        stats: &Arc<SelfMetrics>,
        shutdown: &Shutdown,
    ) -> Result<Arc<LogSources>, String> {
        let me = Arc::new(LogSources {
            queues: queues.clone(),
            stats: stats.clone(),
            shutdown: shutdown.clone(),
            inner: Mutex::new(Inner::default()),
        });
        let mut inner = me.lock();
        for (i, entry) in config.sources.logs.iter().enumerate() {
            if crate::runners::glob_matches_nothing(&entry.path) {
                tracing::warn!(
                    "sources.logs[{i}]: {} matches no file now; it is watched, and files that \
                     appear are read from their first byte",
                    entry.path
                );
            }
            match me.spawn(&mut inner, config, i, entry) {
                Ok(t) => inner.running.push(t),
                Err(e) => {
                    let started = std::mem::take(&mut inner.running);
                    drop(inner);
                    stop_all(started);
                    return Err(e);
                }
            }
        }
        inner.system = crate::runners::spawn_system_log_sources(config, queues, stats, shutdown)
            .inspect_err(|_| {
                stop_all(std::mem::take(&mut inner.running));
            })?;
        drop(inner);
        Ok(me)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Starts the tailer of `entry` (`sources.logs[i]` of `config`).
    fn spawn(
        &self,
        inner: &mut Inner,
        config: &AgentConfig,
        i: usize,
        entry: &LogSection,
    ) -> Result<Tailer, String> {
        let metrics = match &inner.metrics {
            Some(m) => m.clone(),
            None => {
                let m = LogMetrics::register(&self.stats)
                    .map_err(|e| format!("log source metrics: {e}"))?;
                inner.metrics = Some(m.clone());
                m
            }
        };
        let state_dir = config.sources.state_directory.as_deref();
        if let Some(dir) = state_dir {
            std::fs::create_dir_all(dir).map_err(|e| {
                format!(
                    "cannot create sources.state_directory {}: {e}",
                    dir.display()
                )
            })?;
        }
        let mut source = log_source_config(entry, config.max_line_bytes(entry), state_dir);
        // On an RC lane unacknowledged lines are read again (`LogTailer::rewind`).
        source.keep_positions = config.streams.reliability(Stream::Logs) == Reliability::Rc;
        let tailer = LogTailer::new(source)
            .map_err(|e| format!("sources.logs[{i}] ({}): {e}", entry.path))?;
        let (trigger, stop) = shutdown::channel();
        let (q, s, sd) = (
            self.queues.clone(),
            self.stats.clone(),
            self.shutdown.clone(),
        );
        let poll = seconds(entry.poll_interval_seconds);
        let thread = std::thread::Builder::new()
            .name(format!("uctel-logs-{i}"))
            .spawn(move || log_tailer_loop(tailer, poll, q, s, metrics, (stop, sd)))
            .map_err(|e| format!("cannot start the log source thread: {e}"))?;
        Ok(Tailer {
            entry: entry.clone(),
            stop: trigger,
            thread,
        })
    }

    /// Puts `new.sources.logs` in force in the place of `old`'s (module docs). Blocks until
    /// the stopped tailers have handed over (their lines settled and checkpointed).
    ///
    /// # Errors
    /// A new tailer could not start: the previous list is back in force.
    pub fn apply(&self, old: &AgentConfig, new: &AgentConfig) -> Result<(), String> {
        if self.shutdown.is_triggered() {
            return Err("the agent is stopping".into());
        }
        let mut inner = self.lock();
        let (keep, gone): (Vec<Tailer>, Vec<Tailer>) = std::mem::take(&mut inner.running)
            .into_iter()
            .partition(|t| new.sources.logs.iter().any(|e| same(e, &t.entry)));
        inner.running = keep;
        // The hand-over may take a while: the lock is not held meanwhile (shutdown reads
        // it); reloads run one at a time (`uctel_common::reload::Reloader`).
        drop(inner);
        let removed: Vec<LogSection> = gone.iter().map(|t| t.entry.clone()).collect();
        for t in &removed {
            tracing::info!(path = %t.path, "log source removed or changed: handing over, then stopping its tailer");
        }
        stop_all(gone);
        let mut inner = self.lock();
        let mut started = Vec::new();
        for (i, entry) in new.sources.logs.iter().enumerate() {
            if inner.running.iter().any(|t| same(&t.entry, entry)) {
                continue;
            }
            match self.spawn(&mut inner, new, i, entry) {
                Ok(t) => {
                    tracing::info!(path = %entry.path, "log source started by a reload");
                    started.push(t);
                }
                Err(e) => {
                    stop_all(started);
                    // Back to the old list: the stopped tailers again, from their checkpoints.
                    for (i, entry) in old.sources.logs.iter().enumerate() {
                        if removed.iter().any(|r| same(r, entry)) {
                            match self.spawn(&mut inner, old, i, entry) {
                                Ok(t) => inner.running.push(t),
                                Err(e) => {
                                    tracing::error!(error = %e, "cannot start a log source again")
                                }
                            }
                        }
                    }
                    return Err(e);
                }
            }
        }
        inner.running.extend(started);
        Ok(())
    }

    /// Whether every tailer has ended (after shutdown).
    pub fn all_finished(&self) -> bool {
        let inner = self.lock();
        inner.running.iter().all(|t| t.thread.is_finished())
            && inner
                .system
                .iter()
                .all(std::thread::JoinHandle::is_finished)
    }

    /// Waits for every tailer to end (after shutdown).
    pub fn join(&self) {
        let (running, system) = {
            let mut inner = self.lock();
            (
                std::mem::take(&mut inner.running),
                std::mem::take(&mut inner.system),
            )
        };
        for t in running {
            let _ = t.thread.join();
        }
        for t in system {
            let _ = t.join();
        }
    }
}

/// Stops `tailers` and waits for their final checkpoints.
fn stop_all(tailers: Vec<Tailer>) {
    for t in &tailers {
        t.stop.trigger();
    }
    for t in tailers {
        let _ = t.thread.join();
    }
}
