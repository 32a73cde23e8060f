//! The thin IO step around [`SenderCore`]: pull records from the source queues into the
//! pipeline, then hand every frame the pipeline releases to a [`FrameSink`] (the QP, or
//! stdout in `--dry-run`).

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::runners::Queues;
use crate::selfmetrics::{DropReason, SelfMetrics};
use crate::sender::core::{Poll, SenderCore, Transmit};
use crate::stream::Stream;

/// Records moved from a queue into the pipeline per batch.
const PULL_BATCH: usize = 512;

/// Nanoseconds since the Unix epoch, for frame timestamps.
pub fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// What became of a frame handed to a [`FrameSink`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostOutcome {
    /// Posted.
    Posted,
    /// No room right now (the QP's send queue or send buffers are full): retry later.
    Busy,
    /// Failed for good (QP in error); the connection must be rebuilt.
    Failed,
}

/// Where frames go.
pub trait FrameSink {
    /// Posts one stamped frame.
    fn post(&mut self, t: &Transmit) -> PostOutcome;
}

/// Moves queued records into `core` while it wants them. Log records taken are reported to
/// the hand-off accounting; [`settle`] then tells the log sources which of them they may
/// checkpoint. Also logs the drop summaries that are due ([`SelfMetrics::log_due_drops`]).
pub fn pull(core: &mut SenderCore, queues: &Queues, stats: &SelfMetrics) {
    let now = Instant::now();
    let ns = unix_ns();
    while core.wants_records(Stream::Metrics) {
        let batch = queues.metrics.take(PULL_BATCH);
        if batch.is_empty() {
            break;
        }
        for m in &batch {
            core.push_metric(m, now, ns);
        }
    }
    while core.wants_records(Stream::FastCounters) {
        let batch = queues.fast_counters.take(PULL_BATCH);
        if batch.is_empty() {
            break;
        }
        for s in &batch {
            core.push_samples(s, now, ns);
        }
    }
    // Logs one record at a time: with `on_no_credit: wait` the answer of `wants_records`
    // can change within a batch, and a record taken from the queue cannot be put back.
    let mut handed = 0u64;
    while core.wants_records(Stream::Logs) {
        let Some(r) = queues.logs.pop() else {
            break;
        };
        core.push_log(&r, now, ns);
        handed += 1;
    }
    if handed > 0 {
        queues.logs_handoff.taken(handed);
    }
    stats.set_queue_records(Stream::Metrics, queues.metrics.len());
    stats.set_queue_records(Stream::Logs, queues.logs.len());
    stats.set_queue_records(Stream::FastCounters, queues.fast_counters.len());
    stats.log_due_drops();
}

/// Reports to the log sources how far the log records taken from the queue are settled
/// (posted, or dropped for a reason other than `shutdown`):
/// [`crate::runners::Handoff::settle`] with the pipeline's
/// [`SenderCore::unsettled_records`]. Call it after [`pull`] / [`transmit`] and after
/// dropping pending records; the watermark never moves back, and records dropped as
/// `shutdown` never count as settled.
pub fn settle(core: &SenderCore, queues: &Queues) {
    queues
        .logs_handoff
        .settle(core.unsettled_records(Stream::Logs));
}

/// Drops every queued metric sample with `reason` (while there is no connection: a sample
/// is fresh or worthless). Log lines are left queued: the queue is bounded and the log
/// tailers read no more than it holds, so the files buffer the rest until a connection is
/// back. Also logs the drop summaries that are due.
pub fn discard_queued_metrics(queues: &Queues, stats: &SelfMetrics, reason: DropReason) {
    let m = queues.metrics.take_all().len() as u64;
    if m > 0 {
        stats.dropped(Stream::Metrics, reason, 0, m);
    }
    discard_queued_samples(queues, stats, reason);
    stats.set_queue_records(Stream::Metrics, 0);
    stats.log_due_drops();
}

/// Drops the queued sample series with `reason`, counting their samples.
fn discard_queued_samples(queues: &Queues, stats: &SelfMetrics, reason: DropReason) {
    let samples: u64 = queues
        .fast_counters
        .take_all()
        .iter()
        .map(|s| u64::from(s.weight()))
        .sum();
    if samples > 0 {
        stats.dropped(Stream::FastCounters, reason, 0, samples);
    }
    stats.set_queue_records(Stream::FastCounters, 0);
}

/// Drops every queued record with `reason` (at shutdown). The log lines among them are not
/// settled: the log sources do not checkpoint them, and read them again after a restart.
/// Then logs every drop not logged yet ([`SelfMetrics::log_pending_drops`]), so the log
/// accounts for every drop of the run.
pub fn discard_queued(queues: &Queues, stats: &SelfMetrics, reason: DropReason) {
    let m = queues.metrics.take_all().len() as u64;
    if m > 0 {
        stats.dropped(Stream::Metrics, reason, 0, m);
    }
    let l = queues.logs.take_all().len() as u64;
    if l > 0 {
        stats.dropped(Stream::Logs, reason, 0, l);
    }
    discard_queued_samples(queues, stats, reason);
    stats.set_queue_records(Stream::Metrics, 0);
    stats.set_queue_records(Stream::Logs, 0);
    stats.log_pending_drops();
}

/// Why [`transmit`] stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Nothing to send before this instant (`None`: until new records arrive).
    Wait(Option<Instant>),
    /// The sink is busy; try again shortly.
    Busy,
    /// The sink failed for good.
    Failed,
}

/// Hands frames from `core` to `sink` until the pipeline has to wait, the sink is busy, or
/// it failed. Every posted frame is counted as sent.
pub fn transmit(core: &mut SenderCore, sink: &mut dyn FrameSink) -> Stop {
    loop {
        match core.poll_transmit(Instant::now(), unix_ns()) {
            Poll::Wait(at) => return Stop::Wait(at),
            Poll::Transmit(t) => match sink.post(&t) {
                PostOutcome::Posted => core.sent(&t),
                PostOutcome::Busy => {
                    core.requeue(t);
                    let _ = core.shed_when_sink_busy();
                    return Stop::Busy;
                }
                PostOutcome::Failed => {
                    core.post_failed(&t);
                    return Stop::Failed;
                }
            },
        }
    }
}
