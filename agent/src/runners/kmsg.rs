//! The kernel log source in the agent: its counters and the thread that runs it
//! (`runners::settled_source_loop`, the file tailer's loop).

use std::sync::Arc;

use prometheus::{IntCounterVec, Opts};
use uctel_common::shutdown::Shutdown;

use super::settled::{settled_source_loop, SettledSource};
use super::Queues;
use crate::config::{seconds, AgentConfig};
use crate::selfmetrics::{DropReason, SelfMetrics};
use crate::sources::kmsg::{boot_wall_ns, KmsgCounts, KmsgSource};
use crate::stream::Stream;

use super::{Resume, ResumeSlot};

/// Where the kernel names the current boot.
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// [`KmsgSource`] with its counters, as a [`SettledSource`]: records overwritten are
/// dropped as `kmsg_overwritten`, reads that are not records as `invalid`; EPIPE answers,
/// read errors and failed state writes in `uctel_agent_kmsg_events_total{reason}`; each
/// failed open or read also in `uctel_agent_source_errors_total{source="kmsg",reason}`
/// (`permission_denied`: no `CAP_SYSLOG` where `kernel.dmesg_restrict=1`; `not_found`;
/// `read_error`: any other).
struct KmsgRunner {
    source: KmsgSource,
    stats: Arc<SelfMetrics>,
    events: IntCounterVec,
    before: KmsgCounts,
    /// Where the source that replaces this one goes on (written when the loop ends).
    resume: ResumeSlot,
}

impl KmsgRunner {
    fn publish(&mut self) {
        let now = self.source.counts().clone();
        let b = &self.before;
        if now.overwritten > b.overwritten {
            self.stats.dropped(
                Stream::Logs,
                DropReason::KmsgOverwritten,
                0,
                now.overwritten - b.overwritten,
            );
        }
        if now.unparsable > b.unparsable {
            self.stats.dropped(
                Stream::Logs,
                DropReason::Invalid,
                0,
                now.unparsable - b.unparsable,
            );
        }
        let denied = now.denied - b.denied;
        let not_found = now.not_found - b.not_found;
        let other = (now.read_errors - b.read_errors).saturating_sub(denied + not_found);
        for (reason, d) in [
            ("permission_denied", denied),
            ("not_found", not_found),
            ("read_error", other),
        ] {
            if d > 0 {
                self.stats.source_errors_add("kmsg", reason, d);
            }
        }
        for (reason, d) in [
            ("epipe", now.epipe - b.epipe),
            ("read_error", now.read_errors - b.read_errors),
            (
                "checkpoint_error",
                now.checkpoint_errors - b.checkpoint_errors,
            ),
        ] {
            if d > 0 {
                self.events.with_label_values(&[reason]).inc_by(d);
            }
        }
        self.before = now;
    }
}

impl SettledSource for KmsgRunner {
    fn poll_records(
        &mut self,
        out: &mut Vec<uctel_protocol::payload::LogRecord>,
        max: usize,
    ) -> bool {
        let more = self.source.poll(out, max, boot_wall_ns());
        self.publish();
        more
    }
    fn settle(&mut self, n: usize) {
        self.source.settle(n);
    }
    fn checkpoint_settled(&mut self) {
        if let Err(e) = self.source.checkpoint_settled() {
            tracing::warn!(error = %e, "kmsg checkpoint failed; the previous one stays in force");
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
        if let Some(seq) = self.source.hand_over() {
            *self
                .resume
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Resume::Seq(seq));
        }
    }
    fn publish_status(&mut self, stats: &SelfMetrics) {
        let s = &self.source;
        stats.status().set_kmsg(Some(crate::status::KmsgView {
            last_seq: s.last_seq(),
            settled_next_seq: s.settled_next_seq(),
            unsettled_records: s.unsettled() as u64,
        }));
    }
}

/// The series of `uctel_agent_kmsg_events_total{reason}`.
///
/// # Errors
/// A registration clash.
fn register_events(stats: &SelfMetrics) -> Result<IntCounterVec, prometheus::Error> {
    let events = IntCounterVec::new(
        Opts::new(
            "uctel_agent_kmsg_events_total",
            "Kernel log source events: EPIPE answers of /dev/kmsg (records overwritten, \
             counted in records_dropped_total{reason=\"kmsg_overwritten\"}), read errors, \
             failed state file writes.",
        ),
        &["reason"],
    )?;
    stats.registry().register(Box::new(events.clone()))?;
    for r in ["epipe", "read_error", "checkpoint_error"] {
        let _ = events.with_label_values(&[r]);
    }
    Ok(events)
}

/// Starts the kernel log source's thread when `sources.kmsg` is set; it runs until `stop`
/// or `shutdown`. `events` are registered at the first start and reused after. `resume` (a
/// reload's hand-over, [`Resume::Seq`]) starts it at that sequence number instead of the
/// state file's. Returns the thread and the slot where it leaves its own hand-over.
///
/// # Errors
/// The state directory cannot be created or the metrics cannot be registered.
pub(super) fn spawn_kmsg(
    config: &AgentConfig,
    queues: &Queues,
    stats: &Arc<SelfMetrics>,
    (stop, shutdown): (&Shutdown, &Shutdown),
    events: &mut Option<IntCounterVec>,
    resume: Option<Resume>,
) -> Result<Option<(std::thread::JoinHandle<()>, ResumeSlot)>, String> {
    let Some(section) = &config.sources.kmsg else {
        return Ok(None);
    };
    let events = match events {
        Some(e) => e.clone(),
        None => events
            .insert(register_events(stats).map_err(|e| format!("kmsg source metrics: {e}"))?)
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
    let boot_id = std::fs::read_to_string(BOOT_ID).unwrap_or_default();
    let mut source = KmsgSource::new(
        section,
        config.log_line_limit(section.max_message_bytes),
        state_dir.map(|d| d.join("kmsg.json")),
        boot_id.trim(),
    );
    if let Some(Resume::Seq(seq)) = resume {
        source = source.resuming(seq);
    }
    let slot = ResumeSlot::default();
    let runner = KmsgRunner {
        before: source.counts().clone(),
        source,
        stats: stats.clone(),
        events,
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
        .name("uctel-kmsg".into())
        .spawn(move || settled_source_loop(runner, poll, q, s, (stop, sd)))
        .map(|t| Some((t, slot)))
        .map_err(|e| format!("cannot start the kmsg source thread: {e}"))
}
