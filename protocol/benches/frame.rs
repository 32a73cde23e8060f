//! Frame encode and decode cost per frame, on a realistic ~1 KiB frame of 16
//! `node_cpu_seconds_total{cpu,mode}` samples.
//!
//! `cargo bench -p uctel-protocol --bench frame -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use uctel_protocol::frame::{decode_frame, stamp_connection};
use uctel_protocol::framer::Framer;
use uctel_protocol::limits::Limits;
use uctel_protocol::payload::{Label, Metric, MetricType};

const MODES: [&str; 8] = [
    "idle", "iowait", "irq", "nice", "softirq", "steal", "system", "user",
];

fn samples() -> Vec<Metric> {
    (0..16)
        .map(|i| Metric {
            name: "node_cpu_seconds_total".into(),
            help: String::new(),
            r#type: MetricType::Counter as i32,
            labels: vec![
                Label {
                    name: "cpu".into(),
                    value: (i / 8).to_string(),
                },
                Label {
                    name: "mode".into(),
                    value: MODES[i % 8].into(),
                },
            ],
            value: 123_456.78 + i as f64,
            ..Default::default()
        })
        .collect()
}

fn bench_frame(c: &mut Criterion) {
    let limits = Limits::default();
    let records = samples();
    let mut framer = Framer::<Metric>::new(1, 0, limits.clone()).expect("default limits");
    let mut packed = framer.pack(&records, 1_700_000_000_000_000_000);
    assert_eq!(packed.frames.len(), 1, "the sample set fits one frame");
    let frame = packed.frames.remove(0).into_stamped(7, 1);
    eprintln!(
        "bench frame: {} bytes, {} records",
        frame.len(),
        records.len()
    );

    let mut group = c.benchmark_group("frame");
    group.throughput(Throughput::Elements(1));
    group.bench_function("encode_16_metrics_pack_and_stamp", |b| {
        let mut conn_seq = 0u64;
        b.iter(|| {
            let mut packed = framer.pack(black_box(&records), 1);
            conn_seq += 1;
            for f in &mut packed.frames {
                f.stamp(7, conn_seq);
            }
            packed
        })
    });
    group.bench_function("stamp_connection_only", |b| {
        let mut bytes = frame.clone();
        let mut conn_seq = 0u64;
        b.iter(|| {
            conn_seq += 1;
            stamp_connection(black_box(&mut bytes), 7, conn_seq)
        })
    });
    group.bench_function("decode_16_metrics_with_crc", |b| {
        b.iter(|| decode_frame(black_box(&frame), &limits))
    });
    group.finish();
}

criterion_group!(benches, bench_frame);
criterion_main!(benches);
