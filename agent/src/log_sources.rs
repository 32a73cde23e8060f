//! The running log tailers, one thread per `sources.logs` entry
//! ([`crate::runners::log_tailer_loop`]), and the threads of `sources.journald` and
//! `sources.kmsg`, and how a reload changes them without a restart.
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
//!
//! The journald and kmsg sources hand over the same way ([`LogSources::apply`]): a changed
//! section stops its source, which waits until the sender has settled every record it read
//! and checkpoints; then the new one starts where the old one stopped — after the old one's
//! settled cursor (journald) or at its first unsettled sequence number (kmsg), handed over
//! in memory, so no entry is lost or sent twice even without a `state_directory`. A changed
//! `directory` (journald) or `path` (kmsg) is another input: the new source starts from
//! its state file or `start_at`, as at a restart. A removed source's state file stays.
//!
//! All or nothing: if a system source cannot start, the file tailers this reload changed go
//! back to the old list as well (handed over again, from their checkpoints), so a reload
//! that changes both never leaves one applied and the other not.

use std::sync::{Arc, Mutex};

use uctel_common::shutdown::{self, Shutdown, ShutdownTrigger};

use crate::config::{seconds, AgentConfig, LogSection, Reliability};
use crate::runners::{
    log_source_config, log_tailer_loop, spawn_system_source, LogMetrics, Queues, Resume,
    ResumeSlot, SystemKind, SystemMetrics,
};
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

/// A running journald or kmsg source.
#[derive(Debug)]
struct System {
    kind: SystemKind,
    /// Its section, serialised (compared whole at a reload).
    section: String,
    /// Where it reads: journald's `directory`, kmsg's `path` (a hand-over needs the same).
    input: String,
    stop: ShutdownTrigger,
    thread: std::thread::JoinHandle<()>,
    resume: ResumeSlot,
}

#[derive(Debug, Default)]
struct Inner {
    /// Registered with the first tailer.
    metrics: Option<LogMetrics>,
    running: Vec<Tailer>,
    /// The journald and kmsg sources (at most one of each).
    system: Vec<System>,
    /// Their series, registered at their first start.
    system_metrics: SystemMetrics,
}

/// `kind`'s section in `config`, serialised, and where it reads; `None` when off.
fn system_section(kind: SystemKind, config: &AgentConfig) -> Option<(String, String)> {
    let s = &config.sources;
    match kind {
        SystemKind::Journald => s.journald.as_ref().map(|j| {
            (
                serde_yaml::to_string(j).unwrap_or_default(),
                format!("{:?}", j.directory),
            )
        }),
        SystemKind::Kmsg => s.kmsg.as_ref().map(|k| {
            (
                serde_yaml::to_string(k).unwrap_or_default(),
                k.path.display().to_string(),
            )
        }),
    }
}

const SYSTEM_KINDS: [SystemKind; 2] = [SystemKind::Journald, SystemKind::Kmsg];

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
        for kind in SYSTEM_KINDS {
            match me.spawn_system(&mut inner, kind, config, None) {
                Ok(Some(sys)) => inner.system.push(sys),
                Ok(None) => {}
                Err(e) => {
                    let (started, system) = (
                        std::mem::take(&mut inner.running),
                        std::mem::take(&mut inner.system),
                    );
                    drop(inner);
                    stop_all(started);
                    for sys in system {
                        stop_system(sys);
                    }
                    return Err(e);
                }
            }
        }
        drop(inner);
        Ok(me)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Starts the system log source `kind` of `config` (`Ok(None)` when off), from
    /// `resume` when given.
    fn spawn_system(
        &self,
        inner: &mut Inner,
        kind: SystemKind,
        config: &AgentConfig,
        resume: Option<Resume>,
    ) -> Result<Option<System>, String> {
        let Some((section, input)) = system_section(kind, config) else {
            return Ok(None);
        };
        let (trigger, stop) = shutdown::channel();
        let started = spawn_system_source(
            kind,
            config,
            &self.queues,
            &self.stats,
            (&stop, &self.shutdown),
            &mut inner.system_metrics,
            resume,
        )?;
        Ok(started.map(|(thread, resume)| System {
            kind,
            section,
            input,
            stop: trigger,
            thread,
            resume,
        }))
    }

    /// Puts `new`'s journald and kmsg sections in force (module docs): an unchanged one
    /// keeps its source; a changed or removed one is stopped after its hand-over, and the
    /// new one starts from where it stopped.
    ///
    /// # Errors
    /// A new source could not start: the old one is started again from where it stopped,
    /// and the error returned.
    fn apply_system(&self, old: &AgentConfig, new: &AgentConfig) -> Result<(), String> {
        for kind in SYSTEM_KINDS {
            let wanted = system_section(kind, new);
            let mut inner = self.lock();
            let Some(at) = inner.system.iter().position(|s| s.kind == kind) else {
                if wanted.is_some() {
                    tracing::info!(source = ?kind, "system log source started by a reload");
                    if let Some(sys) = self.spawn_system(&mut inner, kind, new, None)? {
                        inner.system.push(sys);
                    }
                }
                continue;
            };
            if wanted.as_ref().map(|w| &w.0) == Some(&inner.system[at].section) {
                continue;
            }
            let sys = inner.system.remove(at);
            // The hand-over may take a while: the lock is not held meanwhile.
            drop(inner);
            tracing::info!(source = ?kind, "system log source removed or changed: handing over, then stopping it");
            let same_input = wanted.as_ref().is_some_and(|w| w.1 == sys.input);
            let resume = stop_system(sys);
            let mut inner = self.lock();
            if wanted.is_none() {
                match kind {
                    SystemKind::Journald => self.stats.status().set_journald(None),
                    SystemKind::Kmsg => self.stats.status().set_kmsg(None),
                }
                continue;
            }
            let resume = resume.filter(|_| same_input);
            match self.spawn_system(&mut inner, kind, new, resume.clone()) {
                Ok(Some(sys)) => inner.system.push(sys),
                Ok(None) => {}
                Err(e) => {
                    match self.spawn_system(&mut inner, kind, old, resume) {
                        Ok(Some(sys)) => inner.system.push(sys),
                        Ok(None) => {}
                        Err(e) => {
                            tracing::error!(error = %e, "cannot start a system log source again");
                        }
                    }
                    return Err(e);
                }
            }
        }
        Ok(())
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

    /// Puts `new.sources.logs`, `new.sources.journald` and `new.sources.kmsg` in force in
    /// the place of `old`'s (module docs), all or nothing. Blocks until the stopped sources
    /// have handed over (their lines settled and checkpointed).
    ///
    /// # Errors
    /// A new source could not start (a tailer, or a journald or kmsg source: an unreadable
    /// state file, a state directory that cannot be created): every source this reload
    /// changed goes back to `old` (the file tailers too when it was a system source that
    /// failed, each from the checkpoint its successor wrote at the hand-over), so the agent
    /// is never left with one part of the file applied and another not.
    pub fn apply(&self, old: &AgentConfig, new: &AgentConfig) -> Result<(), String> {
        if self.shutdown.is_triggered() {
            return Err("the agent is stopping".into());
        }
        self.apply_files(old, new)?;
        if let Err(e) = self.apply_system(old, new) {
            // `apply_system` put the one that failed back; the system sources it changed
            // before it, and the file tailers, go back now.
            let back = self
                .apply_system(new, old)
                .and_then(|()| self.apply_files(new, old));
            if let Err(b) = back {
                tracing::error!(error = %b, "a log source could not be put back after a failed reload");
            }
            return Err(e);
        }
        Ok(())
    }

    /// The file tailers' part of [`LogSources::apply`]: `new.sources.logs` in force in the
    /// place of `old`'s.
    ///
    /// # Errors
    /// A new tailer could not start: the previous list is back in force.
    fn apply_files(&self, old: &AgentConfig, new: &AgentConfig) -> Result<(), String> {
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
            && inner.system.iter().all(|s| s.thread.is_finished())
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
        for s in system {
            let _ = s.thread.join();
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

/// Stops a system log source, waits for its hand-over (its records settled, its checkpoint
/// written) and returns where the next one goes on.
fn stop_system(sys: System) -> Option<Resume> {
    sys.stop.trigger();
    let _ = sys.thread.join();
    sys.resume
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take()
}
