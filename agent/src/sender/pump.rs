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
/// Samples moved from the metrics buffer into the pipeline between two checks of the
/// credits (a frame holds some tens of samples).
const BUFFER_BATCH: usize = 16;

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
///
/// Metric samples held while disconnected ([`crate::buffer`]) go first, and only as
/// credits allow ([`SenderCore::credit_room`]): they are a backlog to deliver, never dropped
/// as `no_credit`. Until the catch-up is over ([`SenderCore::metrics_catching_up`]: the
/// buffer empty and every credit back) the samples the sources queue meanwhile join the
/// buffer's tail, stamped with the current time as they arrive, rather than being framed
/// into a window the backlog used up (and dropped as `no_credit`) or queued behind it
/// unstamped (several collections would then leave with one frame's timestamp). So per
/// series the samples leave in collection order, each with its collection time.
///
/// Records left in a queue (or the metrics buffer) for a stream that waits for credit ask
/// the collector for it at once ([`SenderCore::set_records_waiting`]), rather than at the
/// next report.
pub fn pull(core: &mut SenderCore, queues: &Queues, stats: &SelfMetrics) {
    let now = Instant::now();
    let ns = unix_ns();
    let logs_first = core.logs_pull_first();
    if logs_first {
        pull_logs(core, queues, now, ns);
    }
    let buffer = &queues.metrics_buffer;
    if core.carries(Stream::Metrics) {
        if !buffer.is_empty() {
            core.set_metrics_catching_up(true);
        }
        if core.metrics_catching_up() {
            let queued = queues.metrics.take_all();
            if !queued.is_empty() {
                let dropped = buffer.hold(queued, i64::try_from(ns / 1_000_000).unwrap_or(0));
                if dropped > 0 {
                    stats.dropped(Stream::Metrics, DropReason::NotConnected, 0, dropped);
                }
            }
            while !buffer.is_empty() && core.wants_records(Stream::Metrics) && core.credit_room() {
                // Small batches: the credit rule is checked between them.
                for m in &buffer.take(BUFFER_BATCH) {
                    core.push_metric(m, now, ns);
                }
            }
            if buffer.is_empty() && core.credits_recovered() {
                core.set_metrics_catching_up(false);
            }
        }
    }
    while !core.metrics_catching_up() && core.wants_records(Stream::Metrics) {
        let batch = queues.metrics.take(PULL_BATCH);
        if batch.is_empty() {
            break;
        }
        for m in &batch {
            core.push_metric(m, now, ns);
        }
    }
    stats.set_buffer_records(buffer.len());
    while core.wants_records(Stream::FastCounters) {
        let batch = queues.fast_counters.take(PULL_BATCH);
        if batch.is_empty() {
            break;
        }
        for s in &batch {
            core.push_samples(s, now, ns);
        }
    }
    if !logs_first {
        pull_logs(core, queues, now, ns);
    }
    // Records left queued for lack of credit ask for it now, not at the next report.
    let left = [
        (Stream::Logs, queues.logs.len()),
        (Stream::Metrics, queues.metrics.len() + buffer.len()),
    ];
    core.set_records_waiting(
        left.iter()
            .any(|&(stream, n)| n > 0 && core.waits_for_credit(stream)),
    );
    stats.set_queue_records(Stream::Metrics, queues.metrics.len());
    stats.set_queue_records(Stream::Logs, queues.logs.len());
    stats.set_queue_records(Stream::FastCounters, queues.fast_counters.len());
    stats.log_due_drops();
}

/// Moves queued log records into `core` while it wants them, reporting them to the hand-off
/// accounting. One record at a time: with `on_no_credit: wait` the answer of
/// `wants_records` can change within a batch, and a record taken from the queue cannot be
/// put back.
fn pull_logs(core: &mut SenderCore, queues: &Queues, now: Instant, ns: u64) {
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

/// While there is no connection: moves the queued metric samples into the metrics buffer
/// ([`crate::buffer`]), stamping those without a timestamp with the current time (call it
/// as soon as a source offered them, so that is their collection time), and counts what
/// the buffer cannot hold, the oldest first, as `not_connected`. The `fast_counters`
/// samples are dropped as `not_connected` (fresh or worthless); log lines stay queued: the queue is bounded and the log
/// tailers read no more than it holds, so the files buffer the rest until a connection is
/// back. Also logs the drop summaries that are due.
pub fn buffer_queued_metrics(queues: &Queues, stats: &SelfMetrics) {
    let queued = queues.metrics.take_all();
    if !queued.is_empty() {
        let now_ms = i64::try_from(unix_ns() / 1_000_000).unwrap_or(i64::MAX);
        let dropped = queues.metrics_buffer.hold(queued, now_ms);
        if dropped > 0 {
            stats.dropped(Stream::Metrics, DropReason::NotConnected, 0, dropped);
        }
    }
    discard_queued_samples(queues, stats, DropReason::NotConnected);
    stats.set_queue_records(Stream::Metrics, 0);
    stats.set_buffer_records(queues.metrics_buffer.len());
    stats.log_due_drops();
}

/// When a connection ends (lost, or left for another collector): takes the metric samples
/// still in `core`'s pipeline back into the front of the metrics buffer, with their frames'
/// timestamps ([`SenderCore::take_back_metrics`]), so the next connection sends them;
/// what the buffer cannot hold, the oldest first, is counted as `not_connected`. Call it
/// before [`SenderCore::drop_pending`], which counts what is left of the other streams.
pub fn take_back_metrics(core: &mut SenderCore, queues: &Queues, stats: &SelfMetrics) {
    let back = core.take_back_metrics();
    if back.is_empty() {
        return;
    }
    let dropped = queues.metrics_buffer.hold_front(back);
    if dropped > 0 {
        stats.dropped(Stream::Metrics, DropReason::NotConnected, 0, dropped);
    }
    stats.set_buffer_records(queues.metrics_buffer.len());
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
    let m = (queues.metrics_buffer.take_all().len() + queues.metrics.take_all().len()) as u64;
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
    stats.set_buffer_records(0);
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
        lane_with_window(carries, idle, 64)
    }

    fn lane_with_window(carries: [bool; 3], idle: Duration, credit_window: u64) -> SenderCore {
        let cfg = SenderConfig {
            limits: Limits {
                max_frame_bytes: 1024,
                ..Limits::default()
            },
            pacing: None,
            credit_window,
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
        assert_eq!(
            q.logs_handoff.offer_in(0, &q.logs, l).map(|(a, _)| a),
            Some(logs as u64)
        );
    }

    fn gauge(i: usize) -> Metric {
        Metric {
            name: "node_load1".into(),
            r#type: MetricType::Gauge as i32,
            value: i as f64,
            ..Metric::default()
        }
    }

    /// The values of the metric samples in `frames`, in order, with their timestamps (the
    /// sample's own, else the frame's, in ms).
    fn samples(frames: &[Transmit]) -> Vec<(f64, i64)> {
        let limits = Limits {
            max_frame_bytes: 1024,
            ..Limits::default()
        };
        let mut out = Vec::new();
        for t in frames {
            let f = uctel_protocol::frame::decode_frame(&t.bytes, &limits)
                .unwrap_or_else(|e| panic!("{e}"));
            let frame_ms = i64::try_from(f.header.timestamp_ns / 1_000_000).unwrap_or(0);
            if let uctel_protocol::frame::Payload::Metrics(b) = f.payload {
                for m in b.metrics {
                    let ts = if m.timestamp_ms == 0 {
                        frame_ms
                    } else {
                        m.timestamp_ms
                    };
                    out.push((m.value, ts));
                }
            }
        }
        out
    }

    /// Samples collected while disconnected are held with their collection time, then sent
    /// before the samples queued after the reconnect; the overflow of a small buffer is
    /// counted as `not_connected`, the oldest first.
    #[test]
    fn buffered_samples_go_first_with_their_collection_time() {
        let stats = SelfMetrics::new().unwrap_or_else(|e| panic!("{e}"));
        let q = queues();
        assert_eq!(q.metrics.offer((0..10).map(gauge)), 0);
        buffer_queued_metrics(&q, &stats);
        let held_at = unix_ns() / 1_000_000;
        assert!(q.metrics.is_empty());
        assert_eq!(q.metrics_buffer.len(), 10);
        assert_eq!(stats.records_dropped_all(Stream::Metrics), 0);
        std::thread::sleep(Duration::from_millis(20));
        // Collected after the reconnect.
        assert_eq!(q.metrics.offer((100..105).map(gauge)), 0);
        let mut core = lane([true; 3], Duration::from_secs(60));
        pull(&mut core, &q, &stats);
        core.flush(Stream::Metrics);
        let mut sink = Posted(Vec::new());
        let _ = transmit(&mut core, &mut sink);
        let got = samples(&sink.0);
        let values: Vec<f64> = got.iter().map(|s| s.0).collect();
        let want: Vec<f64> = (0..10).chain(100..105).map(|i| i as f64).collect();
        assert_eq!(values, want, "the buffered samples first, in order");
        for (v, ts) in &got[..10] {
            let ts = u64::try_from(*ts).unwrap_or(0);
            assert!(
                ts <= held_at && held_at - ts < 1_000,
                "sample {v} stamped {ts}, held at {held_at}"
            );
        }
        assert!(got[10..].iter().all(|(_, ts)| *ts > got[9].1), "{got:?}");
        assert!(q.metrics_buffer.is_empty());

        // A buffer of 4 keeps the newest 4 and counts the rest.
        let mut config = AgentConfig::from_yaml(
            "t.yaml",
            "agent_id: a\ncollector:\n  control: 127.0.0.1:1\nauth:\n  token: t\n\
             streams:\n  metrics:\n    buffer_while_disconnected_records: 4\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let small = Queues::new(&config);
        assert_eq!(small.metrics.offer((0..10).map(gauge)), 0);
        buffer_queued_metrics(&small, &stats);
        assert_eq!(
            stats.records_dropped(Stream::Metrics, DropReason::NotConnected),
            6
        );
        let kept: Vec<f64> = small
            .metrics_buffer
            .take_all()
            .iter()
            .map(|m| m.value)
            .collect();
        assert_eq!(kept, vec![6.0, 7.0, 8.0, 9.0]);
        // 0 turns the buffer off.
        config.streams.metrics.buffer_while_disconnected_records = Some(0);
        let off = Queues::new(&config);
        assert_eq!(off.metrics.offer((0..3).map(gauge)), 0);
        buffer_queued_metrics(&off, &stats);
        assert_eq!(
            stats.records_dropped(Stream::Metrics, DropReason::NotConnected),
            9
        );
    }

    /// The buffered samples wait for credit (never dropped as `no_credit`), and nothing is
    /// taken from the queue while some are held: no newer sample overtakes them.
    #[test]
    fn buffered_samples_wait_for_credit_and_hold_back_the_queue() {
        let stats = SelfMetrics::new().unwrap_or_else(|e| panic!("{e}"));
        let q = queues();
        assert_eq!(q.metrics.offer((0..200).map(gauge)), 0);
        buffer_queued_metrics(&q, &stats);
        assert_eq!(q.metrics.offer((1000..1005).map(gauge)), 0);
        let mut core = lane_with_window([true; 3], Duration::from_secs(60), 2);
        pull(&mut core, &q, &stats);
        let held = q.metrics_buffer.len();
        assert!(held > 5 && held < 205, "{held} held");
        assert!(
            q.metrics.is_empty(),
            "the queued samples join the buffer's tail"
        );
        let mut sink = Posted(Vec::new());
        std::thread::sleep(Duration::from_millis(5));
        let _ = transmit(&mut core, &mut sink);
        assert_eq!(
            stats.records_dropped(Stream::Metrics, DropReason::NoCredit),
            0
        );
        assert!(!sink.0.is_empty());
        let got: Vec<f64> = samples(&sink.0).iter().map(|s| s.0).collect();
        assert!(got.iter().all(|v| *v < 200.0), "{got:?}");
        assert!(core.metrics_catching_up());

        // Credits come back report by report: the backlog, then the samples queued behind
        // it, leave in order, and none is dropped for lack of credit on the way.
        for _ in 0..500 {
            if let Some(last) = sink.0.last().map(|t| t.conn_seq) {
                let _ = core.on_consumed(last);
            }
            pull(&mut core, &q, &stats);
            std::thread::sleep(Duration::from_millis(2));
            let _ = transmit(&mut core, &mut sink);
            if q.metrics_buffer.is_empty()
                && q.metrics.is_empty()
                && core.pending_records(Stream::Metrics) == 0
            {
                break;
            }
        }
        let got: Vec<f64> = samples(&sink.0).iter().map(|s| s.0).collect();
        let want: Vec<f64> = (0..200).chain(1000..1005).map(|i| i as f64).collect();
        assert_eq!(got, want);
        assert_eq!(stats.records_dropped_all(Stream::Metrics), 0);
        let _ = core.on_consumed(sink.0.last().map_or(0, |t| t.conn_seq));
        pull(&mut core, &q, &stats);
        assert!(
            !core.metrics_catching_up(),
            "over once the credits are back"
        );
    }

    /// A connection lost during the catch-up: what the pipeline took from the buffer goes
    /// back in front of what the buffer still holds, in order, nothing dropped, for the next
    /// connection.
    #[test]
    fn a_connection_lost_while_catching_up_puts_the_pipeline_back_in_front() {
        let stats = SelfMetrics::new().unwrap_or_else(|e| panic!("{e}"));
        let q = queues();
        assert_eq!(q.metrics.offer((0..100).map(gauge)), 0);
        buffer_queued_metrics(&q, &stats);
        let mut core = lane_with_window([true; 3], Duration::from_secs(60), 2);
        pull(&mut core, &q, &stats);
        let taken = core.pending_records(Stream::Metrics);
        assert!(taken > 0 && q.metrics_buffer.len() < 100, "{taken} taken");
        take_back_metrics(&mut core, &q, &stats);
        assert_eq!(core.pending_records(Stream::Metrics), 0);
        let values: Vec<f64> = q
            .metrics_buffer
            .take_all()
            .iter()
            .map(|m| m.value)
            .collect();
        assert_eq!(values, (0..100).map(f64::from).collect::<Vec<_>>());
        assert_eq!(stats.records_dropped_all(Stream::Metrics), 0);
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
