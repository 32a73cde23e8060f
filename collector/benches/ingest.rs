//! Worker cost per frame: `ConnectionIngest::on_slot` (slot check, CRC32C, epoch, connection
//! and stream trackers, protobuf decode, series store update) on one core, no transport.
//!
//! `cargo bench -p uctel-collector --bench ingest -- --warm-up-time 1 --measurement-time 3`

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use uctel_collector::config::{LogSinkKind, LogsConfig};
use uctel_collector::ingest::ConnectionIngest;
use uctel_collector::logsink::LogSink;
use uctel_collector::store::SeriesStore;
use uctel_collector::telemetry::Telemetry;
use uctel_protocol::frame::{build_frame, FrameHeader, FrameKind};
use uctel_protocol::limits::Limits;
use uctel_protocol::payload::{encode_metric_batch, Label, Metric, MetricBatch, MetricType};
use uctel_protocol::tracker::TrackerConfig;

const EPOCH: u64 = 7;
const FRAMES: u64 = 1024;
const SAMPLES_PER_FRAME: usize = 20;

fn frames() -> Vec<Vec<u8>> {
    (0..FRAMES)
        .map(|c| {
            let batch = MetricBatch {
                metrics: (0..SAMPLES_PER_FRAME)
                    .map(|i| Metric {
                        name: "node_network_receive_bytes_total".into(),
                        help: "Network device statistic receive_bytes.".into(),
                        r#type: MetricType::Counter as i32,
                        labels: vec![Label {
                            name: "device".into(),
                            value: format!("eth{i}"),
                        }],
                        value: (c * 1000 + i as u64) as f64,
                        ..Default::default()
                    })
                    .collect(),
            };
            let header = FrameHeader {
                epoch: EPOCH,
                conn_seq: c,
                stream_seq: c,
                record_count: (c + 1) * SAMPLES_PER_FRAME as u64,
                timestamp_ns: 1,
                ..FrameHeader::new(FrameKind::Metrics, 1)
            };
            let mut slot = build_frame(&header, &encode_metric_batch(&batch)).expect("frame");
            slot.resize(4096, 0);
            slot
        })
        .collect()
}

fn ingest(telemetry: &Telemetry, store: &SeriesStore, logs: &Arc<LogSink>) -> ConnectionIngest {
    ConnectionIngest::new(
        "bench",
        "bench.host",
        EPOCH,
        Limits::default(),
        TrackerConfig::default(),
        store.clone(),
        logs.clone(),
        telemetry.agent("bench"),
    )
    .expect("ingest")
}

fn bench(c: &mut Criterion) {
    let telemetry = Telemetry::new().expect("telemetry");
    let store = SeriesStore::new(Duration::from_secs(300), 100_000);
    let logs = Arc::new(
        LogSink::open(&LogsConfig {
            sink: LogSinkKind::Stdout,
            ..LogsConfig::default()
        })
        .expect("sink"),
    );
    let frames = frames();
    let frame_bytes = frames.first().map_or(0, |f| {
        uctel_protocol::frame::Frame::new_checked(f.as_slice()).map_or(0, |v| v.frame_len())
    });
    let mut g = c.benchmark_group("collector_ingest");
    g.throughput(Throughput::Elements(FRAMES));
    g.bench_function(
        format!("on_slot_{SAMPLES_PER_FRAME}_samples_{frame_bytes}_bytes"),
        |b| {
            b.iter_batched(
                || ingest(&telemetry, &store, &logs),
                |mut i| {
                    let now = Instant::now();
                    for (c, f) in frames.iter().enumerate() {
                        let _ = i.on_slot(c as u64, f, now);
                    }
                    i
                },
                BatchSize::LargeInput,
            )
        },
    );
    g.finish();

    // Scrape cost (the store lock is held while the families are built): 100 000 series.
    let big = SeriesStore::new(Duration::from_secs(300), 100_000);
    let now = Instant::now();
    for a in 0..10 {
        let metrics: Vec<Metric> = (0..10_000)
            .map(|i| Metric {
                name: format!("uctel_bench_metric_{}", i % 100),
                help: "A bench gauge.".into(),
                r#type: MetricType::Gauge as i32,
                labels: vec![Label {
                    name: "id".into(),
                    value: i.to_string(),
                }],
                value: i as f64,
                ..Default::default()
            })
            .collect();
        big.ingest(&format!("agent-{a}"), "host", &metrics, now);
    }
    let mut g = c.benchmark_group("collector_scrape");
    g.sample_size(10);
    g.bench_function("families_100k_series", |b| {
        b.iter(|| big.families(Instant::now()).len())
    });
    g.bench_function("families_and_text_encode_100k_series", |b| {
        b.iter(|| {
            use prometheus::Encoder;
            let mut out = Vec::with_capacity(8 << 20);
            let _ = prometheus::TextEncoder::new().encode(&big.families(Instant::now()), &mut out);
            out.len()
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
