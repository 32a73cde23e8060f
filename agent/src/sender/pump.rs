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

/// Moves queued records into `core` while it wants them (never records of a stream it does
/// not carry: they stay queued for the pipeline of the other lane). Log records taken are reported to
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
///
/// Only the pipeline that carries the logs stream settles ([`SenderCore::carries`]): with an
/// RC lane the other lane's pipeline takes no log record, and its "nothing pending" must not
/// settle the lines the carrying pipeline still holds.
pub fn settle(core: &SenderCore, queues: &Queues) {
    if core.carries(Stream::Logs) {
        queues
            .logs_handoff
            .settle(core.unsettled_records(Stream::Logs));
    }
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use uctel_protocol::limits::Limits;
    use uctel_protocol::payload::{LogRecord, Metric, MetricType};

    use super::*;
    use crate::config::{AgentConfig, DataPath};
    use crate::sender::core::SenderConfig;

    struct Posted(Vec<Transmit>);

    impl FrameSink for Posted {
        fn post(&mut self, t: &Transmit) -> PostOutcome {
            self.0.push(t.clone());
            PostOutcome::Posted
        }
    }

    fn queues() -> Queues {
        let config = AgentConfig::from_yaml(
            "t.yaml",
            "agent_id: a\ncollector:\n  control: 127.0.0.1:1\nauth:\n  token: t\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        Queues::new(&config)
    }

    fn lane(carries: [bool; 3], idle: Duration) -> SenderCore {
        let cfg = SenderConfig {
            limits: Limits {
                max_frame_bytes: 1024,
                ..Limits::default()
            },
            pacing: None,
            credit_window: 64,
            first_conn_seq: 0,
            first_stream_seq: 0,
            data_paths: [DataPath::WriteWithImm; 3],
            flush_after: [Duration::from_millis(1); 3],
            ready_frames: 64,
            idle_heartbeat: Some(idle),
            wait_for_credit: [false, true, false],
            carries,
        };
        SenderCore::new_unexported(&cfg, 7, Instant::now()).unwrap_or_else(|e| panic!("{e}"))
    }

    fn fill(q: &Queues, metrics: usize, logs: usize) {
        let m: Vec<_> = (0..metrics)
            .map(|i| Metric {
                name: "node_load1".into(),
                r#type: MetricType::Gauge as i32,
                value: i as f64,
                ..Metric::default()
            })
            .collect();
        assert_eq!(q.metrics.offer(m), 0);
        let l: Vec<_> = (0..logs)
            .map(|i| LogRecord {
                timestamp_ns: 1,
                source: "/var/log/x".into(),
                message: format!("line {i}"),
                ..LogRecord::default()
            })
            .collect();
        assert_eq!(q.logs_handoff.offer(&q.logs, l).0, logs as u64);
    }

    /// The RC lane's pipeline carries the logs only: it takes no metric record (they stay
    /// queued for the UC lane's pipeline), posts only log frames (its idle heartbeats and its
    /// `LAST_OF_EPOCH` frame included), and reports no metrics totals.
    #[test]
    fn a_lane_carrying_logs_leaves_the_metrics_to_the_other_lane() {
        let stats = SelfMetrics::new().unwrap_or_else(|e| panic!("{e}"));
        let q = queues();
        fill(&q, 10, 5);
        let mut rc = lane([false, true, false], Duration::from_millis(1));
        pull(&mut rc, &q, &stats);
        assert_eq!(q.metrics.len(), 10, "metric records left for the UC lane");
        assert!(q.logs.is_empty());
        assert_eq!(rc.pending_records(Stream::Logs), 5);
        assert_eq!(rc.pending_records(Stream::Metrics), 0);
        std::thread::sleep(Duration::from_millis(5));
        let mut sink = Posted(Vec::new());
        let _ = transmit(&mut rc, &mut sink);
        // Idle long enough for heartbeats on every stream: only the logs stream sends one.
        std::thread::sleep(Duration::from_millis(5));
        let _ = transmit(&mut rc, &mut sink);
        rc.finish(unix_ns());
        let _ = transmit(&mut rc, &mut sink);
        assert!(sink.0.len() >= 3, "{} frames", sink.0.len());
        assert!(sink.0.iter().all(|t| t.stream == Stream::Logs));
        for (i, t) in sink.0.iter().enumerate() {
            assert_eq!(t.conn_seq, i as u64, "the lane's own connection sequence");
        }
        let fin = rc.final_sequences();
        assert_eq!(fin.streams[Stream::Logs.index()].records, 5);
        assert_eq!(fin.streams[Stream::Metrics.index()].frames, 0);
        assert_eq!(fin.frames, sink.0.len() as u64);

        let mut uc = lane([true, false, true], Duration::from_secs(60));
        pull(&mut uc, &q, &stats);
        assert!(q.metrics.is_empty());
        assert_eq!(uc.pending_records(Stream::Metrics), 10);
        uc.finish(unix_ns());
        let mut sink = Posted(Vec::new());
        let _ = transmit(&mut uc, &mut sink);
        assert!(sink.0.iter().all(|t| t.stream != Stream::Logs));
        assert_eq!(
            uc.final_sequences().streams[Stream::Metrics.index()].records,
            10
        );
        assert_eq!(
            sink.0[0].conn_seq, 0,
            "each lane numbers from the first sequence"
        );
    }

    /// Two pipelines pulling from the same queues: only the one carrying the logs moves the
    /// log hand-off watermark, so a line the RC lane still holds is never checkpointed
    /// because the UC lane has nothing pending.
    #[test]
    fn only_the_lane_carrying_the_logs_settles_them() {
        let stats = SelfMetrics::new().unwrap_or_else(|e| panic!("{e}"));
        let q = queues();
        fill(&q, 3, 4);
        let mut uc = lane([true, false, true], Duration::from_secs(60));
        let mut rc = lane([false, true, false], Duration::from_secs(60));
        pull(&mut uc, &q, &stats);
        pull(&mut rc, &q, &stats);
        assert_eq!(q.logs_handoff.taken_total(), 4);
        settle(&uc, &q);
        settle(&rc, &q);
        assert_eq!(
            q.logs_handoff.settled(),
            0,
            "the RC lane still holds the 4 lines"
        );
        rc.flush(Stream::Logs);
        let mut sink = Posted(Vec::new());
        let _ = transmit(&mut rc, &mut sink);
        settle(&uc, &q);
        assert_eq!(q.logs_handoff.settled(), 0);
        settle(&rc, &q);
        assert_eq!(q.logs_handoff.settled(), 4);
    }
}
