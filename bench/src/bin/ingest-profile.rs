//! A fixed amount of collector ingest, for instruction-count profiles
//! (`valgrind --tool=callgrind`): one host collection of this machine (the agent's own host
//! collectors, node_exporter 1.5's defaults) framed as `metrics_dict` frames (steady state:
//! every series acknowledged) or as protobuf `metrics` frames, then `collections` rounds
//! of those frames through [`ConnectionIngest::on_send`], two real collections alternated.
//!
//! ```text
//! ingest-profile [--remote-write] [dict|metrics] [collections] [collections-file]
//! ```
//!
//! `--remote-write`: the ingest also queues every sample for one remote-write endpoint
//! (the collector's `outputs.remote_write`, 4 shards) whose senders never run, with room
//! for every sample, so the worker's whole share of remote-write is in the profile and
//! nothing is dropped.
//!
//! With `collections-file`, the two host collections are read from it when it exists and
//! written to it otherwise, so two builds can be profiled on the same input. Profile only
//! the ingest with `--toggle-collect='*ingest_frames*'`; the line printed gives
//! the frames and samples that went through it (every round, the first collection's
//! definitions included), to divide the instruction count by.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use prost::Message;
use uctel_agent::sources::host::{HostMetrics, HostMetricsConfig};
use uctel_agent::sources::node::HostPaths;
use uctel_collector::config::{LogSinkKind, LogsConfig};
use uctel_collector::ingest::{ConnectionIngest, DictAckOutbox, FrameOutcome, Outputs};
use uctel_collector::logsink::LogSink;
use uctel_collector::outputs::config::RemoteWriteConfig;
use uctel_collector::outputs::remote_write;
use uctel_collector::store::SeriesStore;
use uctel_collector::telemetry::Telemetry;
use uctel_protocol::dict::DictFramer;
use uctel_protocol::framer::{BuiltFrame, Framer, PushOutcome};
use uctel_protocol::limits::Limits;
use uctel_protocol::payload::{Metric, MetricBatch};
use uctel_protocol::tracker::TrackerConfig;

/// Two host collections: from `path` when it exists, else collected (and saved there).
fn collections(path: Option<&str>) -> anyhow::Result<[Vec<Metric>; 2]> {
    if let Some(bytes) = path.and_then(|p| std::fs::read(p).ok()) {
        let mut r = &bytes[..];
        let mut take = || -> anyhow::Result<Vec<Metric>> {
            let mut len = [0u8; 4];
            r.read_exact(&mut len)?;
            let n = u32::from_le_bytes(len) as usize;
            let body = r.get(..n).ok_or_else(|| anyhow::anyhow!("short file"))?;
            let batch = MetricBatch::decode(body)?;
            r = &r[n..];
            Ok(batch.metrics)
        };
        return Ok([take()?, take()?]);
    }
    let mut host = HostMetrics::new(HostMetricsConfig {
        paths: HostPaths::default(),
        ticks_per_second: None,
        disabled: Vec::new(),
        ethtool: None,
    });
    let first = host.collect().metrics;
    std::thread::sleep(Duration::from_millis(100));
    let out = [first, host.collect().metrics];
    if let Some(p) = path {
        let mut f = std::fs::File::create(p)?;
        for c in &out {
            let body = MetricBatch { metrics: c.clone() }.encode_to_vec();
            f.write_all(&u32::try_from(body.len())?.to_le_bytes())?;
            f.write_all(&body)?;
        }
    }
    Ok(out)
}

/// Frames of one collection, with either framer.
enum Form {
    Dict(Box<DictFramer>),
    Plain(Box<Framer<Metric>>),
}

impl Form {
    fn pack(&mut self, ms: &[Metric], now: u64) -> Vec<BuiltFrame> {
        let mut out = Vec::new();
        for m in ms {
            let pushed = match self {
                Form::Dict(f) => f.push(m, now),
                Form::Plain(f) => f.push(m, now),
            };
            if let PushOutcome::Closed(b) = pushed {
                out.push(b);
            }
        }
        out.extend(match self {
            Form::Dict(f) => f.flush(),
            Form::Plain(f) => f.flush(),
        });
        out
    }
}

/// The profiled part: `frames` through the ingest; returns (samples, frames) accepted and
/// frames refused. Never inlined, so that callgrind can collect it alone.
#[inline(never)]
fn ingest_frames(rx: &mut ConnectionIngest, frames: &[Vec<u8>]) -> (u64, u64, u64) {
    let now = Instant::now();
    let (mut samples, mut accepted, mut refused) = (0, 0, 0);
    for f in frames {
        match rx.on_send(f, now) {
            FrameOutcome::Accepted { records } => {
                samples += u64::from(records);
                accepted += 1;
            }
            _ => refused += 1,
        }
    }
    (samples, accepted, refused)
}

fn main() -> anyhow::Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let remote = args.iter().any(|a| a == "--remote-write");
    args.retain(|a| a != "--remote-write");
    let dict = args.first().is_none_or(|f| f == "dict");
    let rounds: u64 = args.get(1).map_or(Ok(200), |n| n.parse())?;
    let cs = collections(args.get(2).map(String::as_str))?;
    let limits = Limits {
        max_frame_bytes: 1024,
        ..Limits::default()
    };
    let telemetry = Telemetry::new()?;
    let logs = LogSink::open(&LogsConfig {
        sink: LogSinkKind::Stdout,
        ..LogsConfig::default()
    })?;
    let mut outputs = Outputs::new(
        SeriesStore::new(Duration::from_secs(300), 100_000),
        std::sync::Arc::new(logs),
    );
    // The senders are spawned on a runtime that never runs: nothing leaves the queues.
    let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    let _entered = runtime.enter();
    let (_stop, shutdown) = uctel_common::shutdown::channel();
    if remote {
        let samples = (rounds + 1) * cs[0].len().max(cs[1].len()) as u64;
        let config = RemoteWriteConfig {
            url: "http://127.0.0.1:9/api/v1/write".into(),
            queue_capacity_samples: u32::try_from(samples.saturating_mul(2))?,
            ..RemoteWriteConfig::default()
        };
        outputs.remote_write = remote_write::start(
            &[config],
            telemetry.registry(),
            Duration::from_secs(300),
            100_000,
            &shutdown,
        )?
        .handle;
    }
    let mut rx = ConnectionIngest::with_delivery(
        "profile",
        "profile",
        1,
        limits.clone(),
        TrackerConfig::default(),
        outputs,
        telemetry.agent("profile"),
    )?;
    let outbox = DictAckOutbox::default();
    rx.set_dict_acks(outbox.clone());
    let mut form = if dict {
        Form::Dict(Box::new(DictFramer::new(1, 0, limits.clone())?))
    } else {
        Form::Plain(Box::new(Framer::new(1, 0, limits.clone())?))
    };
    let (mut conn, mut samples, mut frames, mut refused) = (0u64, 0u64, 0u64, 0u64);
    let mut ns = 1_700_000_000_000_000_000u64;
    for round in 0..=rounds {
        ns += 10_000_000_000;
        let built = form.pack(&cs[(round % 2) as usize], ns);
        let stamped: Vec<Vec<u8>> = built
            .into_iter()
            .map(|f| {
                conn += 1;
                f.into_stamped(1, conn - 1)
            })
            .collect();
        let (s, f, r) = ingest_frames(&mut rx, &stamped);
        (samples, frames, refused) = (samples + s, frames + f, refused + r);
        if round == 0 {
            let _ = rx.report();
            if let Form::Dict(f) = &mut form {
                for a in outbox.take() {
                    f.on_ack(a.known_up_to);
                }
            }
        }
    }
    println!(
        "form {} series {} rounds {rounds} frames {frames} refused {refused} samples {samples}{}",
        if dict { "metrics_dict" } else { "metrics" },
        cs[0].len(),
        if remote { " (remote-write queued)" } else { "" },
    );
    if remote {
        let text = String::from_utf8(telemetry.render().map_err(anyhow::Error::msg)?)?;
        for line in text.lines().filter(|l| {
            l.starts_with("uctel_collector_remote_write_samples_in_total")
                || l.starts_with("uctel_collector_remote_write_samples_dropped_total")
        }) {
            println!("{line}");
        }
    }
    anyhow::ensure!(refused == 0, "{refused} frames not accepted");
    Ok(())
}
