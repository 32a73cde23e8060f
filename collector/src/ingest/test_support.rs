//! Helpers of the ingest unit tests: a connection on a real series store and log sink, and
//! frames built with the protocol's own encoders.

pub(super) use std::sync::Arc;
pub(super) use std::time::{Duration, Instant};

pub(super) use uctel_protocol::control::{Goodbye, Heartbeat, StreamFinal};
pub(super) use uctel_protocol::frame::{build_frame, FrameFlags, FrameHeader, FrameKind};
pub(super) use uctel_protocol::limits::Limits;
pub(super) use uctel_protocol::payload::{
    self, encode_metric_batch, Metric, MetricBatch, MetricType,
};
pub(super) use uctel_protocol::tracker::TrackerConfig;

pub(super) use super::{ConnectionIngest, DeliveredLogs, StreamLedger};
pub(super) use crate::config::{LogSinkKind, LogsConfig};
pub(super) use crate::logsink::LogSink;
pub(super) use crate::store::SeriesStore;
pub(super) use crate::telemetry::Telemetry;

pub(super) const EPOCH: u64 = 0xfeed;

pub(super) struct Rig {
    pub(super) ingest: ConnectionIngest,
    pub(super) store: SeriesStore,
    pub(super) telemetry: Telemetry,
}

/// A log sink on stdout.
pub(super) fn stdout_logs() -> Arc<LogSink> {
    Arc::new(
        LogSink::open(&LogsConfig {
            sink: LogSinkKind::Stdout,
            ..Default::default()
        })
        .unwrap(),
    )
}

pub(super) fn rig() -> Rig {
    let telemetry = Telemetry::new().unwrap();
    let store = SeriesStore::new(Duration::from_secs(60), 1000);
    let logs = stdout_logs();
    let ingest = ConnectionIngest::new(
        "a1",
        "host-a1",
        EPOCH,
        Limits::default(),
        TrackerConfig::default(),
        store.clone(),
        logs,
        telemetry.agent("a1"),
    )
    .unwrap();
    Rig {
        ingest,
        store,
        telemetry,
    }
}

pub(super) fn frame(conn_seq: u64, stream: u32, stream_seq: u64, record_count: u64) -> Vec<u8> {
    let batch = MetricBatch {
        metrics: vec![Metric {
            name: "node_load1".into(),
            r#type: MetricType::Gauge as i32,
            value: stream_seq as f64,
            ..Default::default()
        }],
    };
    let header = FrameHeader {
        flags: FrameFlags::EMPTY,
        epoch: EPOCH,
        conn_seq,
        stream_seq,
        record_count,
        timestamp_ns: 1,
        ..FrameHeader::new(FrameKind::Metrics, stream)
    };
    build_frame(&header, &encode_metric_batch(&batch)).unwrap()
}

pub(super) fn slot(bytes: &[u8]) -> Vec<u8> {
    let mut s = vec![0u8; 4096];
    s[..bytes.len()].copy_from_slice(bytes);
    s
}

pub(super) fn now() -> Instant {
    Instant::now()
}

/// A connection of agent "a1" in `epoch`, sharing `delivered`, on `telemetry`.
pub(super) fn log_ingest(
    epoch: u64,
    delivered: &DeliveredLogs,
    telemetry: &Telemetry,
) -> ConnectionIngest {
    let logs = Arc::new(
        LogSink::open(&LogsConfig {
            sink: LogSinkKind::Stdout,
            ..Default::default()
        })
        .unwrap(),
    );
    let mut ingest = ConnectionIngest::new(
        "a1",
        "host-a1",
        epoch,
        Limits::default(),
        TrackerConfig::default(),
        SeriesStore::new(Duration::from_secs(60), 1000),
        logs,
        telemetry.agent("a1"),
    )
    .unwrap();
    ingest.share_delivered(delivered.clone());
    ingest
}

/// A logs frame of `epoch` whose records are `(file_id, end_offset)`; `record_count` is
/// the stream's cumulative count after it.
pub(super) fn log_frame(
    epoch: u64,
    conn_seq: u64,
    stream_seq: u64,
    record_count: u64,
    records: &[(u64, u64)],
) -> Vec<u8> {
    let batch = payload::LogBatch {
        records: records
            .iter()
            .map(|&(file_id, end_offset)| payload::LogRecord {
                message: format!("line ending at {end_offset}"),
                file_id,
                end_offset,
                ..Default::default()
            })
            .collect(),
    };
    let header = FrameHeader {
        flags: FrameFlags::EMPTY,
        epoch,
        conn_seq,
        stream_seq,
        record_count,
        timestamp_ns: 1,
        ..FrameHeader::new(FrameKind::Logs, uctel_protocol::stream::LOGS)
    };
    build_frame(&header, &payload::encode_log_batch(&batch)).unwrap()
}

pub(super) fn logs_ledger(i: &ConnectionIngest) -> StreamLedger {
    i.ledger()
        .into_iter()
        .find(|(id, _)| *id == uctel_protocol::stream::LOGS)
        .map(|(_, l)| l)
        .unwrap_or_default()
}

/// Closes `i` with a `Goodbye` whose logs stream ended at `final_seq` after `records`
/// records (the connection's last frame is the same sequence), and returns the logs stream's
/// ledger from the close summary.
pub(super) fn close_logs(i: &mut ConnectionIngest, final_seq: u64, records: u64) -> StreamLedger {
    let s = i.close(&Goodbye {
        final_conn_seq: Some(final_seq),
        streams: vec![StreamFinal {
            stream_id: uctel_protocol::stream::LOGS,
            final_stream_seq: Some(final_seq),
            final_record_count: records,
        }],
        ..Default::default()
    });
    s.streams
        .iter()
        .find(|(id, _)| *id == uctel_protocol::stream::LOGS)
        .map(|(_, l)| *l)
        .unwrap_or_default()
}

pub(super) fn replayed_total(telemetry: &Telemetry) -> u64 {
    telemetry
        .agent("a1")
        .stream(uctel_protocol::stream::LOGS)
        .records_replayed
        .get()
}

/// Sum of one family's samples for this rig's agent and `stream` in the exposition.
pub(super) fn exported(r: &Rig, family: &str, stream: &str) -> u64 {
    let text = String::from_utf8(r.telemetry.render().unwrap()).unwrap();
    let want = format!("{family}{{agent=\"a1\",stream=\"{stream}\"}} ");
    text.lines()
        .filter_map(|l| l.strip_prefix(&want))
        .map(|v| v.parse::<u64>().unwrap())
        .sum()
}
