//! Bytes per sample for node_exporter-like CPU counters (DESIGN.md §3 rule 5: measure bytes
//! per sample). Run with `--nocapture` to see the figures.

use uctel_protocol::framer::Framer;
use uctel_protocol::limits::Limits;
use uctel_protocol::payload::{Label, Metric, MetricType};

const MODES: [&str; 8] = [
    "idle", "iowait", "irq", "nice", "softirq", "steal", "system", "user",
];

fn cpu_samples(cpus: usize, help: &str) -> Vec<Metric> {
    let mut out = Vec::new();
    for cpu in 0..cpus {
        for (i, mode) in MODES.iter().enumerate() {
            out.push(Metric {
                name: "node_cpu_seconds_total".into(),
                help: help.into(),
                r#type: MetricType::Counter as i32,
                labels: vec![
                    Label {
                        name: "cpu".into(),
                        value: cpu.to_string(),
                    },
                    Label {
                        name: "mode".into(),
                        value: (*mode).into(),
                    },
                ],
                // A realistic cumulative value with a fractional part (8 bytes as a double).
                value: 123_456.78 + (cpu * 8 + i) as f64 * 0.01,
                ..Default::default()
            });
        }
    }
    out
}

/// (frames, total frame bytes, samples) for `samples` packed into `max_frame_bytes` frames.
fn pack(samples: &[Metric], max_frame_bytes: usize) -> (usize, usize, usize) {
    let limits = Limits {
        max_frame_bytes,
        ..Limits::default()
    };
    let mut framer = Framer::<Metric>::new(1, 0, limits).unwrap();
    let packed = framer.pack(samples, 1);
    assert!(packed.rejected.is_empty());
    let bytes = packed.frames.iter().map(|f| f.len()).sum();
    (packed.frames.len(), bytes, samples.len())
}

#[test]
fn bytes_per_node_cpu_sample() {
    let help = "Seconds the CPUs spent in each mode.";
    for (label, samples) in [
        ("without help", cpu_samples(16, "")),
        ("with help", cpu_samples(16, help)),
    ] {
        let payload_per_sample = samples
            .iter()
            .map(|m| prost::encoding::message::encoded_len(1, m))
            .sum::<usize>() as f64
            / samples.len() as f64;
        for mtu in [1024, 4096] {
            let (frames, bytes, n) = pack(&samples, mtu);
            let per_sample = bytes as f64 / n as f64;
            println!(
                "node_cpu_seconds_total {label}: payload {payload_per_sample:.1} B/sample; \
                 {n} samples in {frames} frames of <= {mtu} B: {per_sample:.1} B/sample incl. header"
            );
            // The frame header amortises: it adds less than one sample's worth per frame.
            assert!(per_sample < payload_per_sample + 64.0 / (n as f64 / frames as f64) + 1.0);
        }
        // Name, two labels, a double and framing: well under 100 bytes without help text.
        if samples[0].help.is_empty() {
            assert!(payload_per_sample < 70.0, "{payload_per_sample}");
        }
    }
}
