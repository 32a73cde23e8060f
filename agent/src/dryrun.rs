//! `--dry-run`: collect and frame exactly as in normal operation, then decode each frame and
//! print it to stdout as one JSON object per line instead of sending it.
//!
//! The same pipeline runs ([`SenderCore`]: framing, limits, pacing, stamping) with a credit
//! window that the printer replenishes itself, so what is printed is what would go on the
//! wire. With `once`, one round of every source is framed and printed, then the run ends.
//!
//! With `streams.metrics.series_dictionary` (the default) the metrics stream goes out as
//! series-dictionary frames (`"kind":"metrics_dict"`), and the printer plays the
//! collector's part: it decodes them with its own dictionary and acknowledges what it
//! learnt after each frame, so the first collection prints frames that define their series
//! and later ones frames of values only (`"definitions":0`), both decoded to the same
//! records. With `false`, `"kind":"metrics"` frames as a collector without the dictionary
//! gets them.
//!
//! Output line (keys sorted):
//!
//! ```json
//! {"epoch":…,"conn_seq":0,"stream":"metrics","stream_seq":0,"kind":"metrics","flags":0,
//!  "timestamp_ns":…,"record_count":120,"frame_bytes":4012,"data_path":"write_with_imm",
//!  "records":[{"name":"node_load1","type":"gauge","labels":{},"value":0.42,
//!              "timestamp_ms":…}, …]}
//! ```

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};
use uctel_common::shutdown::Shutdown;
use uctel_protocol::borrowed::MetricBatchView;
use uctel_protocol::dict::SeriesDict;
use uctel_protocol::frame::{decode_frame, DecodeError, DecodedFrame, Frame, FrameKind, Payload};
use uctel_protocol::limits::Limits;
use uctel_protocol::payload::{MetricType, Severity};

use crate::config::AgentConfig;
use crate::runners::{self, Queues};
use crate::selfmetrics::{DropReason, SelfMetrics};
use crate::sender::core::{SenderConfig, SenderCore, Transmit};
use crate::sender::pump::{self, FrameSink, PostOutcome, Stop};
use crate::sources::host::HostMetrics;
use crate::sources::logs::LogTailer;
use crate::stream::Stream;

/// Why a dry run failed.
#[derive(Debug, thiserror::Error)]
pub enum DryRunError {
    /// The pipeline could not be built from the configuration.
    #[error("cannot build the send pipeline: {0}")]
    Pipeline(String),
    /// A source could not start.
    #[error("cannot start a source: {0}")]
    Source(String),
    /// Writing to the output failed.
    #[error("writing the dry-run output: {0}")]
    Output(#[from] std::io::Error),
}

/// Totals of a dry run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DryRunSummary {
    /// Frames printed.
    pub frames: u64,
    /// Records in them.
    pub records: u64,
}

/// The frame limits for `config` (its `max_frame_bytes`).
pub fn limits(config: &AgentConfig) -> Limits {
    Limits {
        max_frame_bytes: config.max_frame_bytes,
        ..Limits::default()
    }
}

/// Decodes a stamped frame into its JSON line (a series-dictionary frame only if it
/// defines every series it carries; see [`frame_json_with`]).
pub fn frame_json(t: &Transmit, limits: &Limits) -> Value {
    frame_json_with(t, limits, None)
}

/// Decodes a stamped frame into its JSON line; a series-dictionary frame with `dict`, the
/// dictionary of its stream (which learns the frame's definitions).
pub fn frame_json_with(t: &Transmit, limits: &Limits, dict: Option<&mut SeriesDict>) -> Value {
    let view = Frame::new_checked(&t.bytes[..]).ok();
    let definitions = view
        .as_ref()
        .filter(|f| f.kind() == FrameKind::MetricsDict)
        .and_then(|f| uctel_protocol::dict::body_counts(f.payload(), limits))
        .map(|(definitions, _)| definitions);
    let decoded = match (dict, view) {
        (Some(dict), Some(f)) if f.kind() == FrameKind::MetricsDict => {
            let mut batch = MetricBatchView::new();
            dict.decode_into(f.payload(), f.timestamp_ns(), limits, &mut batch)
                .map(|()| DecodedFrame {
                    header: f.header(),
                    payload: Payload::Metrics(batch.to_batch()),
                })
                .map_err(|source| DecodeError::Payload {
                    kind: f.kind().as_str(),
                    stream_id: f.stream_id(),
                    stream_seq: f.stream_seq(),
                    source,
                })
        }
        (None, Some(f)) if f.kind() == FrameKind::MetricsDict => {
            uctel_protocol::dict::decode_frame_alone(&t.bytes, limits)
        }
        _ => decode_frame(&t.bytes, limits),
    };
    let mut line = frame_line(t, decoded);
    if let Some(n) = definitions {
        line["definitions"] = json!(n);
    }
    line
}

fn frame_line(t: &Transmit, decoded: Result<DecodedFrame, DecodeError>) -> Value {
    match decoded {
        Ok(d) => {
            let records: Vec<Value> = match &d.payload {
                Payload::Metrics(b) => b
                    .metrics
                    .iter()
                    .map(|m| {
                        let labels: Map<String, Value> = m
                            .labels
                            .iter()
                            .map(|l| (l.name.clone(), Value::String(l.value.clone())))
                            .collect();
                        let ty = match MetricType::try_from(m.r#type) {
                            Ok(MetricType::Counter) => "counter",
                            Ok(MetricType::Gauge) => "gauge",
                            Ok(MetricType::Histogram) => "histogram",
                            Ok(MetricType::Untyped) => "untyped",
                            _ => "unspecified",
                        };
                        let mut o = json!({"name": m.name, "type": ty, "labels": labels, "value": m.value,
                                           "timestamp_ms": m.timestamp_ms});
                        if !m.buckets.is_empty() {
                            o["count"] = json!(m.count);
                            o["sum"] = json!(m.sum);
                        }
                        o
                    })
                    .collect(),
                Payload::Logs(b) => b
                    .records
                    .iter()
                    .map(|r| {
                        let sev = match Severity::try_from(r.severity) {
                            Ok(Severity::Trace) => "trace",
                            Ok(Severity::Debug) => "debug",
                            Ok(Severity::Info) => "info",
                            Ok(Severity::Warn) => "warn",
                            Ok(Severity::Error) => "error",
                            Ok(Severity::Fatal) => "fatal",
                            _ => "unspecified",
                        };
                        json!({"timestamp_ns": r.timestamp_ns, "severity": sev, "source": r.source, "message": r.message})
                    })
                    .collect(),
                Payload::Heartbeat => Vec::new(),
                Payload::Samples(b) => b
                    .series
                    .iter()
                    .map(|s| {
                        let labels: Map<String, Value> = s
                            .labels
                            .iter()
                            .map(|l| (l.name.clone(), Value::String(l.value.clone())))
                            .collect();
                        let ty = match MetricType::try_from(s.r#type) {
                            Ok(MetricType::Counter) => "counter",
                            Ok(MetricType::Gauge) => "gauge",
                            _ => "untyped",
                        };
                        json!({"name": s.name, "type": ty, "labels": labels,
                               "start_us": s.start_us, "offsets_us": s.offsets_us,
                               "values": s.values})
                    })
                    .collect(),
            };
            let h = d.header;
            json!({
                "epoch": h.epoch,
                "conn_seq": h.conn_seq,
                "stream": t.stream.as_str(),
                "stream_seq": h.stream_seq,
                "kind": h.kind.as_str(),
                "flags": h.flags.bits(),
                "timestamp_ns": h.timestamp_ns,
                "record_count": h.record_count,
                "frame_bytes": t.bytes.len(),
                "data_path": t.data_path.as_str(),
                "records": records,
            })
        }
        Err(e) => {
            json!({"conn_seq": t.conn_seq, "stream": t.stream.as_str(), "decode_error": e.to_string()})
        }
    }
}

/// Prints every frame and consumes its credit at once.
struct PrintSink<'a, W: Write> {
    out: &'a mut W,
    limits: Limits,
    /// The metrics stream's dictionary (the printer plays the collector).
    dict: SeriesDict,
    consumed: Option<u64>,
    error: Option<std::io::Error>,
    summary: DryRunSummary,
}

impl<W: Write> PrintSink<'_, W> {
    /// What the printer's dictionary learnt, acknowledged to `core` as a collector would.
    fn acknowledge(&mut self, core: &mut SenderCore, epoch: u64) {
        if let Some(known_up_to) = self.dict.take_ack() {
            core.on_dict_ack(&uctel_protocol::control::DictAck {
                epoch,
                stream_id: Stream::Metrics.id(),
                known_up_to,
            });
        }
    }
}

impl<W: Write> FrameSink for PrintSink<'_, W> {
    fn post(&mut self, t: &Transmit) -> PostOutcome {
        let line = frame_json_with(t, &self.limits, Some(&mut self.dict));
        if let Err(e) = writeln!(self.out, "{line}") {
            self.error = Some(e);
            return PostOutcome::Failed;
        }
        self.consumed = Some(t.conn_seq);
        self.summary.frames += 1;
        self.summary.records += u64::from(t.records);
        PostOutcome::Posted
    }
}

fn sender_config(config: &AgentConfig) -> SenderConfig {
    SenderConfig {
        limits: limits(config),
        pacing: Some(config.pacing_limits(config.max_frame_bytes)),
        credit_window: 1 << 20,
        first_conn_seq: 0,
        first_stream_seq: 0,
        data_paths: Stream::ALL.map(|s| config.streams.get(s).data_path),
        flush_after: Stream::ALL
            .map(|s| Duration::from_millis(config.streams.get(s).flush_milliseconds)),
        ready_frames: 256,
        idle_heartbeat: None,
        wait_for_credit: [false; Stream::ALL.len()],
        carries: [true; Stream::ALL.len()],
    }
}

/// Runs the dry run until `shutdown` (or after one round with `once`), writing to `out`.
///
/// # Errors
/// [`DryRunError`].
pub async fn run<W: Write>(
    config: &AgentConfig,
    out: &mut W,
    once: bool,
    shutdown: Shutdown,
) -> Result<DryRunSummary, DryRunError> {
    let stats = Arc::new(SelfMetrics::new().map_err(|e| DryRunError::Pipeline(e.to_string()))?);
    let queues = Queues::new(config);
    let epoch: u64 = rand::random();
    let mut core = SenderCore::new(&sender_config(config), epoch, Instant::now(), stats.clone())
        .map_err(|e| DryRunError::Pipeline(e.to_string()))?;
    if config.streams.series_dictionary() {
        core.use_series_dictionary();
    }
    let mut sink = PrintSink {
        out,
        limits: limits(config),
        dict: SeriesDict::new(),
        consumed: None,
        error: None,
        summary: DryRunSummary::default(),
    };

    if once {
        one_round(config, &queues, &stats)?;
        pump::pull(&mut core, &queues, &stats);
        core.finish(pump::unix_ns());
        loop {
            let stop = pump::transmit(&mut core, &mut sink);
            if let Some(c) = sink.consumed {
                let _ = core.on_consumed(c);
            }
            sink.acknowledge(&mut core, epoch);
            match stop {
                Stop::Wait(None) => break,
                Stop::Wait(Some(at)) => {
                    tokio::time::sleep_until(at.into()).await;
                }
                Stop::Busy | Stop::Failed => break,
            }
        }
        sink.out.flush()?;
        return match sink.error {
            Some(e) => Err(e.into()),
            None => Ok(sink.summary),
        };
    }

    let metric_sources =
        crate::metric_sources::MetricSources::start(config, &queues, &stats, &shutdown);
    let threads = runners::spawn_log_tailers(config, &queues, &stats, &shutdown)
        .map_err(DryRunError::Source)?;

    let mut sd = shutdown.clone();
    loop {
        pump::pull(&mut core, &queues, &stats);
        let stop = pump::transmit(&mut core, &mut sink);
        pump::settle(&core, &queues);
        if let Some(c) = sink.consumed {
            let _ = core.on_consumed(c);
        }
        sink.acknowledge(&mut core, epoch);
        sink.out.flush()?;
        let deadline = match stop {
            Stop::Wait(at) => at,
            Stop::Busy | Stop::Failed => break,
        };
        let sleep = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = sleep => {}
            () = queues.metrics.notified() => {}
            () = queues.logs.notified() => {}
            () = sd.wait() => break,
        }
    }
    // Final round: take what the sources queued, close the epoch, print the rest, then let
    // the log tailers checkpoint what was printed.
    metric_sources.join().await;
    pump::pull(&mut core, &queues, &stats);
    core.finish(pump::unix_ns());
    let _ = pump::transmit(&mut core, &mut sink);
    pump::settle(&core, &queues);
    core.drop_pending(DropReason::Shutdown);
    queues.logs_handoff.close();
    let grace = Instant::now() + runners::LOG_HANDOFF_GRACE;
    while !threads.iter().all(std::thread::JoinHandle::is_finished) && Instant::now() < grace {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for t in threads {
        let _ = t.join();
    }
    pump::discard_queued(&queues, &stats, DropReason::Shutdown);
    sink.out.flush()?;
    match sink.error {
        Some(e) => Err(e.into()),
        None => Ok(sink.summary),
    }
}

/// One collection of every enabled source, queued.
fn one_round(
    config: &AgentConfig,
    queues: &Queues,
    stats: &Arc<SelfMetrics>,
) -> Result<(), DryRunError> {
    if config.sources.host_metrics.enabled {
        let c = HostMetrics::new(runners::host_config(config)).collect();
        for e in &c.errors {
            tracing::warn!(error = %e, "host metrics sub-collector failed");
        }
        let rejected = queues.metrics.offer(c.metrics);
        if rejected > 0 {
            stats.dropped(
                Stream::Metrics,
                DropReason::SourceOverflow,
                0,
                rejected as u64,
            );
        }
    }
    for (i, entry) in config.sources.logs.iter().enumerate() {
        // No checkpoint in a dry run: the state file is not touched.
        let mut tailer = LogTailer::new(runners::log_source_config(
            entry,
            config.max_line_bytes(entry),
            None,
        ))
        .map_err(|e| DryRunError::Source(format!("sources.logs[{i}]: {e}")))?;
        let mut out = Vec::new();
        let _ = tailer.poll(
            Instant::now(),
            std::time::SystemTime::now,
            &mut out,
            queues.logs.vacancy(),
        );
        let rejected = queues.logs.offer(out);
        if rejected > 0 {
            stats.dropped(Stream::Logs, DropReason::SourceOverflow, 0, rejected as u64);
        }
    }
    if config.sources.self_metrics.enabled {
        let rejected = queues.metrics.offer(stats.to_records(0));
        if rejected > 0 {
            stats.dropped(
                Stream::Metrics,
                DropReason::SourceOverflow,
                0,
                rejected as u64,
            );
        }
    }
    Ok(())
}
