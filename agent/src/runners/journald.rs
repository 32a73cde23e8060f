//! The journald source in the agent: its counters in the self-metrics registry and the
//! thread that runs it (`runners::settled_source_loop`, the file tailer's loop).

use std::sync::Arc;

use prometheus::{IntCounter, IntCounterVec, Opts};
use uctel_common::shutdown::Shutdown;

use super::settled::{settled_source_loop, SettledSource};
use super::Queues;
use crate::config::{seconds, AgentConfig};
use crate::selfmetrics::{DropReason, SelfMetrics};
use crate::sources::journald::{JournalConfig, JournalCounts, JournalSource};
use crate::stream::Stream;

use super::{Resume, ResumeSlot};

/// The `reason`s of `uctel_agent_journal_events_total`.
const EVENTS: [&str; 5] = [
    "excluded",
    "message_cut",
    "journalctl_exited",
    "checkpoint_error",
    "vacuumed_unfiltered",
];

/// The journald source's series: `uctel_agent_journal_entries_read_total` and
/// `uctel_agent_journal_events_total{reason}` (`excluded`, `message_cut`,
/// `journalctl_exited`, `checkpoint_error`, `vacuumed_unfiltered`: entries of any unit
/// vacuumed unread when journalctl-side matches are set, an upper bound on the records
/// lost). Entries lost (`oversize`, `invalid`, `journal_vacuumed`) are in
/// `uctel_agent_records_dropped_total{stream="logs"}`.
#[derive(Debug, Clone)]
pub(super) struct JournalMetrics {
    entries: IntCounter,
    events: IntCounterVec,
}

impl JournalMetrics {
    /// Registers the series in `stats`' registry.
    ///
    /// # Errors
    /// A registration clash.
    pub(super) fn register(stats: &SelfMetrics) -> Result<Self, prometheus::Error> {
        let r = stats.registry();
        let entries = IntCounter::with_opts(Opts::new(
            "uctel_agent_journal_entries_read_total",
            "Journal entries read by the journald source (sent on or excluded).",
        ))?;
        r.register(Box::new(entries.clone()))?;
        let events = IntCounterVec::new(
            Opts::new(
                "uctel_agent_journal_events_total",
                "journald source events: entries excluded by a filter, messages cut at \
                 max_message_bytes, journalctl exits, failed state file writes, entries of \
                 any unit vacuumed unread with include_units/include_matches set (an upper \
                 bound on the records lost).",
            ),
            &["reason"],
        )?;
        r.register(Box::new(events.clone()))?;
        for e in EVENTS {
            let _ = events.with_label_values(&[e]);
        }
        Ok(Self { entries, events })
    }
}

/// [`JournalSource`] with its counters, as a [`SettledSource`].
struct JournalRunner {
    source: JournalSource,
    stats: Arc<SelfMetrics>,
    metrics: JournalMetrics,
    before: JournalCounts,
    /// Where the source that replaces this one goes on (written when the loop ends).
    resume: ResumeSlot,
}

impl JournalRunner {
    fn publish(&mut self) {
        let now = self.source.counts().clone();
        let b = &self.before;
        self.metrics.entries.inc_by(now.entries - b.entries);
        for (reason, d) in [
            ("excluded", now.excluded - b.excluded),
            ("message_cut", now.message_cut - b.message_cut),
            (
                "journalctl_exited",
                now.journalctl_exited - b.journalctl_exited,
            ),
            (
                "checkpoint_error",
                now.checkpoint_errors - b.checkpoint_errors,
            ),
            (
                "vacuumed_unfiltered",
                now.vacuumed_unfiltered - b.vacuumed_unfiltered,
            ),
        ] {
            if d > 0 {
                self.metrics.events.with_label_values(&[reason]).inc_by(d);
            }
        }
        let oversize = now.too_large - b.too_large;
        if oversize > 0 {
            self.stats
                .dropped(Stream::Logs, DropReason::Oversize, 0, oversize);
        }
        let vacuumed = now.vacuumed - b.vacuumed;
        if vacuumed > 0 {
            self.stats
                .dropped(Stream::Logs, DropReason::JournalVacuumed, 0, vacuumed);
        }
        let invalid = now.unparsable - b.unparsable;
        if invalid > 0 {
            self.stats
                .dropped(Stream::Logs, DropReason::Invalid, 0, invalid);
        }
        self.before = now;
    }
}

impl SettledSource for JournalRunner {
    fn poll_records(
        &mut self,
        out: &mut Vec<uctel_protocol::payload::LogRecord>,
        max: usize,
    ) -> bool {
        let more = self.source.poll(out, max);
        self.publish();
        more
    }
    fn settle(&mut self, n: usize) {
        self.source.settle(n);
    }
    fn checkpoint_settled(&mut self) {
        if let Err(e) = self.source.checkpoint_settled() {
            tracing::warn!(error = %e, "journald checkpoint failed; the previous one stays in force");
        }
        self.publish();
    }
    fn unsettled(&self) -> usize {
        self.source.unsettled()
    }
    fn rewind(&mut self) -> u64 {
        self.source.rewind()
    }
    fn finish(&mut self) {
        self.publish_status(&self.stats.clone());
        if let Some(cursor) = self.source.hand_over() {
            *self
                .resume
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Resume::Cursor(cursor));
        }
    }
    fn publish_status(&mut self, stats: &SelfMetrics) {
        let s = &self.source;
        stats
            .status()
            .set_journald(Some(crate::status::JournaldView {
                last_read_cursor: s.last_read_cursor().map(str::to_owned),
                settled_cursor: s.settled_cursor().map(str::to_owned),
                entries_read: s.counts().entries,
                unsettled_records: s.unsettled() as u64,
            }));
    }
}

/// Starts the journald source's thread when `sources.journald` is set; it runs until
/// `stop` or `shutdown` ([`settled_source_loop`]). `metrics` are registered at the first
/// start and reused after. `resume` (a reload's hand-over, [`Resume::Cursor`]) starts it
/// after that cursor instead of the state file's. Returns the thread and the slot where it
/// leaves its own hand-over when it ends.
///
/// # Errors
/// The state directory cannot be created, the state file cannot be read, or the
/// metrics cannot be registered.
pub(super) fn spawn_journald(
    config: &AgentConfig,
    queues: &Queues,
    stats: &Arc<SelfMetrics>,
    (stop, shutdown): (&Shutdown, &Shutdown),
    metrics: &mut Option<JournalMetrics>,
    resume: Option<Resume>,
) -> Result<Option<(std::thread::JoinHandle<()>, ResumeSlot)>, String> {
    let Some(section) = &config.sources.journald else {
        return Ok(None);
    };
    let metrics = match metrics {
        Some(m) => m.clone(),
        None => metrics
            .insert(
                JournalMetrics::register(stats)
                    .map_err(|e| format!("journald source metrics: {e}"))?,
            )
            .clone(),
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
    let line_limit = config.log_line_limit(section.max_message_bytes);
    let mut source = JournalSource::new(JournalConfig::new(section, line_limit, state_dir))
        .map_err(|e| format!("sources.journald: {e}"))?;
    if let Some(Resume::Cursor(c)) = resume {
        source = source.resuming(c);
    }
    let slot = ResumeSlot::default();
    let runner = JournalRunner {
        before: source.counts().clone(),
        source,
        stats: stats.clone(),
        metrics,
        resume: slot.clone(),
    };
    let (q, s, stop, sd) = (
        queues.clone(),
        stats.clone(),
        stop.clone(),
        shutdown.clone(),
    );
    let poll = seconds(section.poll_interval_seconds);
    std::thread::Builder::new()
        .name("uctel-journald".into())
        .spawn(move || settled_source_loop(runner, poll, q, s, (stop, sd)))
        .map(|t| Some((t, slot)))
        .map_err(|e| format!("cannot start the journald source thread: {e}"))
}
