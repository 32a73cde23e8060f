//! [`SettledSource`]: a log source whose checkpoints cover only what the sender settled (the
//! file tailer, the journald and kmsg sources), and [`settled_source_loop`], the loop that
//! runs one against the logs queue and its `Handoff`.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use uctel_common::shutdown::Shutdown;
use uctel_protocol::payload::LogRecord;

use super::{
    catch_up, LogMetrics, Offered, Queues, Settled, CHECKPOINT_INTERVAL, LOG_HANDOFF_GRACE,
};
use crate::selfmetrics::{DropReason, SelfMetrics};
use crate::sources::logs::{LogSourceCounts, LogTailer};
use crate::stream::Stream;

/// A log source whose records settle through the `Handoff` and whose position is
/// checkpointed only for settled records: the file tailer ([`LogTailer`]) and the journald
/// source ([`crate::sources::journald::JournalSource`]). [`settled_source_loop`] runs one.
pub trait SettledSource {
    /// Appends at most `max` new records to `out`; returns whether more are ready now (poll
    /// again soon).
    fn poll_records(&mut self, out: &mut Vec<LogRecord>, max: usize) -> bool;
    /// The oldest `n` records returned and not settled yet are settled.
    fn settle(&mut self, n: usize);
    /// Writes the checkpoint of what is settled; a failure is counted and logged by the
    /// source, and the previous checkpoint stays in force.
    fn checkpoint_settled(&mut self);
    /// Records returned and not settled yet.
    fn unsettled(&self) -> usize;
    /// Reads again every record returned and not settled (an RC lane failed); returns those
    /// that cannot be read again.
    fn rewind(&mut self) -> u64;
    /// The loop stops: the source releases what it holds (gauges, child processes).
    fn finish(&mut self) {}
    /// Publishes what the source follows on the status board (`crate::status`); called at
    /// most every `STATUS_EVERY`.
    fn publish_status(&mut self, _stats: &SelfMetrics) {}
}

/// Least time between two updates of a source's view on the status board.
const STATUS_EVERY: Duration = Duration::from_millis(250);

impl SettledSource for LogTailer {
    fn poll_records(&mut self, out: &mut Vec<LogRecord>, max: usize) -> bool {
        let ps = self.poll(Instant::now(), std::time::SystemTime::now, out, max);
        for e in ps.errors.iter().take(1) {
            tracing::debug!(error = %e, "log source read error");
        }
        ps.more_pending
    }
    fn settle(&mut self, n: usize) {
        LogTailer::settle(self, n);
    }
    fn checkpoint_settled(&mut self) {
        if let Err(e) = LogTailer::checkpoint_settled(self) {
            tracing::warn!(error = %e, "log checkpoint failed; the previous one stays in force");
        }
    }
    fn unsettled(&self) -> usize {
        LogTailer::unsettled(self)
    }
    fn rewind(&mut self) -> u64 {
        LogTailer::rewind(self)
    }
}

/// [`LogTailer`] with its counters, as a [`SettledSource`].
struct TailerSource {
    tailer: LogTailer,
    metrics: LogMetrics,
    before: LogSourceCounts,
    last_files: i64,
}

impl SettledSource for TailerSource {
    fn poll_records(&mut self, out: &mut Vec<LogRecord>, max: usize) -> bool {
        let ps = self
            .tailer
            .poll(Instant::now(), std::time::SystemTime::now, out, max);
        for e in ps.errors.iter().take(1) {
            tracing::debug!(error = %e, "log source read error");
        }
        let now = self.tailer.counts().clone();
        self.metrics.add(&self.before, &now);
        self.before = now;
        let files = i64::try_from(ps.files).unwrap_or(i64::MAX);
        self.metrics.files.add(files - self.last_files);
        self.last_files = files;
        ps.more_pending
    }
    fn settle(&mut self, n: usize) {
        self.tailer.settle(n);
    }
    fn checkpoint_settled(&mut self) {
        if let Err(e) = self.tailer.checkpoint_settled() {
            self.metrics.checkpoint_errors.inc();
            tracing::warn!(error = %e, "log checkpoint failed; the previous one stays in force");
        }
    }
    fn unsettled(&self) -> usize {
        self.tailer.unsettled()
    }
    fn rewind(&mut self) -> u64 {
        self.tailer.rewind()
    }
    fn finish(&mut self) {
        self.metrics.files.sub(self.last_files);
        self.last_files = 0;
    }
    fn publish_status(&mut self, stats: &SelfMetrics) {
        stats
            .status()
            .set_files(self.tailer.source_name(), self.tailer.file_views());
    }
}

/// Runs one log tailer on the calling thread until `stop` or `shutdown`
/// ([`settled_source_loop`]).
pub fn log_tailer_loop(
    tailer: LogTailer,
    poll_interval: Duration,
    queues: Queues,
    stats: Arc<SelfMetrics>,
    metrics: LogMetrics,
    stops: (Shutdown, Shutdown),
) {
    let before = tailer.counts().clone();
    let source = TailerSource {
        tailer,
        metrics,
        before,
        last_files: 0,
    };
    settled_source_loop(source, poll_interval, queues, stats, stops);
}

/// Runs one [`SettledSource`] on the calling thread until `stop` or `shutdown`, then writes
/// a final checkpoint once the sender has settled every offered record or stopped.
///
/// Checkpoints cover only settled records (`Handoff`): a record still queued, or framed
/// but not sent, when the agent stops is read again after a restart, and a record sent is
/// not.
///
/// `stop` ends this source alone (a reload removed or changed its entry): it then waits for
/// the sender to settle every record it offered, however long that takes, and checkpoints,
/// so a source started after it on the same input neither repeats nor skips a record. At
/// `shutdown` the wait is [`LOG_HANDOFF_GRACE`] at most.
#[allow(clippy::needless_pass_by_value)]
pub fn settled_source_loop<S: SettledSource>(
    mut source: S,
    poll_interval: Duration,
    queues: Queues,
    stats: Arc<SelfMetrics>,
    (stop, shutdown): (Shutdown, Shutdown),
) {
    let stopped = || stop.is_triggered() || shutdown.is_triggered();
    let mut last_status = Instant::now()
        .checked_sub(STATUS_EVERY)
        .unwrap_or_else(Instant::now);
    let handoff = &queues.logs_handoff;
    let mut mark: u64 = 0;
    let mut generation = handoff.generation();
    let mut offers: VecDeque<Offered> = VecDeque::new();
    // Records settled since the last checkpoint, and when that was.
    let mut fresh: u64 = 0;
    let mut last_checkpoint: Option<Instant> = None;
    let mut out = Vec::new();
    while !stopped() {
        // Commit what the sender has settled; after a rewind, read the rest again.
        fresh += catch_up(&mut source, handoff, &mut generation, &mut offers, &stats);
        let due =
            offers.is_empty() || last_checkpoint.is_none_or(|t| t.elapsed() >= CHECKPOINT_INTERVAL);
        if fresh > 0 && due {
            source.checkpoint_settled();
            fresh = 0;
            last_checkpoint = Some(Instant::now());
        }
        let room = queues.logs.vacancy();
        let mut more = false;
        if room > 0 {
            out.clear();
            more = source.poll_records(&mut out, room);
            if !out.is_empty() {
                let n = out.len() as u64;
                // Refused after a rewind: read again with the rest at the next catch-up.
                let Some((accepted, m)) =
                    handoff.offer_in(generation, &queues.logs, std::mem::take(&mut out))
                else {
                    continue;
                };
                mark = m;
                offers.push_back(Offered {
                    mark: m,
                    accepted,
                    total: n,
                    settled: 0,
                });
                if accepted < n {
                    stats.dropped(Stream::Logs, DropReason::SourceOverflow, 0, n - accepted);
                }
                stats.set_queue_records(Stream::Logs, queues.logs.len());
            }
            if last_status.elapsed() >= STATUS_EVERY {
                source.publish_status(&stats);
                last_status = Instant::now();
            }
        }
        let pause = if more && room > 0 {
            Duration::from_millis(1)
        } else {
            poll_interval
        };
        // Sleep in small steps so shutdown is seen quickly.
        let until = Instant::now() + pause;
        while Instant::now() < until && !stopped() {
            std::thread::sleep((until - Instant::now()).min(Duration::from_millis(50)));
        }
    }
    // Let the sender settle what it can (it sends the queued lines within its own grace),
    // then commit exactly what it settled. Stopped alone (a reload), wait for all of it.
    let mut deadline = None;
    while matches!(handoff.settled_in(generation), Settled::Current(_))
        && !handoff.reached(mark)
        && !handoff.is_closed()
    {
        if shutdown.is_triggered()
            && Instant::now() >= *deadline.get_or_insert_with(|| Instant::now() + LOG_HANDOFF_GRACE)
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    catch_up(&mut source, handoff, &mut generation, &mut offers, &stats);
    source.checkpoint_settled();
    if source.unsettled() > 0 {
        tracing::info!(
            records = source.unsettled(),
            "log records read but not sent before shutdown are not checkpointed; they are read again after a restart"
        );
    }
    source.finish();
}
