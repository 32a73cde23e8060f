//! Sequence tracker cost per observed frame: in order, with 1 % random loss, and in order
//! through the 32-bit immediate extension.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use uctel_protocol::tracker::SequenceTracker;

/// Frames per benchmark iteration.
const FRAMES: u64 = 10_000;
const EPOCH: u64 = 0x5EED;

/// Sequence offsets `0..FRAMES` with about `loss_per_mille / 1000` of them removed, chosen by
/// a fixed xorshift generator so every run measures the same input.
fn offsets(loss_per_mille: u64) -> Vec<u64> {
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    (0..FRAMES)
        .filter(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % 1000 >= loss_per_mille
        })
        .collect()
}

fn bench_tracker(c: &mut Criterion) {
    let mut group = c.benchmark_group("tracker");

    for (name, loss_per_mille) in [("observe_in_order", 0), ("observe_loss_1pct", 10)] {
        let frames = offsets(loss_per_mille);
        group.throughput(Throughput::Elements(frames.len() as u64));
        group.bench_function(name, |b| {
            let mut tracker = SequenceTracker::default();
            let mut base = 0u64;
            b.iter(|| {
                for &offset in &frames {
                    let _ = black_box(tracker.observe(EPOCH, base + offset));
                }
                base += FRAMES;
            });
            black_box(tracker.counts());
        });
    }

    let frames = offsets(0);
    group.throughput(Throughput::Elements(frames.len() as u64));
    group.bench_function("observe_u32_in_order", |b| {
        let mut tracker = SequenceTracker::default();
        let mut base = 0u64;
        b.iter(|| {
            for &offset in &frames {
                let _ = black_box(tracker.observe_u32(EPOCH, (base + offset) as u32));
            }
            base += FRAMES;
        });
        black_box(tracker.counts());
    });

    group.finish();
}

criterion_group!(benches, bench_tracker);
criterion_main!(benches);
