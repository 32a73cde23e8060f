//! The series dictionary's cost and gain (`uctel-bench --only dict`): one host collection
//! of this machine, made by the agent's own host collectors (node_exporter 1.5's defaults),
//! framed at one frame size both ways, protobuf metrics frames (`kind = metrics`, every
//! series named in every frame) and series-dictionary frames (`kind = metrics_dict`, in the
//! steady state: every series acknowledged, values only), then:
//!
//! - **bytes per sample** on the wire (frame headers included) and frames per collection,
//!   both forms, and the dictionary's first collection (definitions in band);
//! - **processing CPU per sample** through the collector's own ingest
//!   ([`ConnectionIngest::on_send`]: CRC, trackers, decode, series store), the two forms
//!   alternated back to back in rounds on this thread (`getrusage(RUSAGE_THREAD)`);
//! - **fabric bytes** for 10,000 hosts × 450 series every 10 s from the bytes per sample.
//!
//! Frames are framed and stamped outside the timed sections; consecutive collections carry
//! different values (two real collections, alternated).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use uctel_agent::sources::host::{HostMetrics, HostMetricsConfig};
use uctel_agent::sources::node::HostPaths;
use uctel_collector::config::{LogSinkKind, LogsConfig};
use uctel_collector::ingest::{ConnectionIngest, DictAckOutbox, FrameOutcome};
use uctel_collector::logsink::LogSink;
use uctel_collector::store::SeriesStore;
use uctel_collector::telemetry::Telemetry;
use uctel_protocol::dict::DictFramer;
use uctel_protocol::framer::{BuiltFrame, Framer, PushOutcome};
use uctel_protocol::limits::Limits;
use uctel_protocol::payload::Metric;
use uctel_protocol::tracker::TrackerConfig;

use crate::cpu::thread_cpu;

/// Settings.
#[derive(Clone, Debug)]
pub struct DictCostConfig {
    /// Largest frame, header included (the path MTU of one-packet frames).
    pub frame_bytes: usize,
    /// CPU spent in each form's timed ingest before the run ends.
    pub cpu_budget: Duration,
}

/// One form's figures.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Form {
    /// Frames per host collection.
    pub frames_per_collection: usize,
    /// Bytes on the wire per host collection (frame headers included).
    pub bytes_per_collection: usize,
    /// Bytes per sample.
    pub bytes_per_sample: f64,
    /// Collector CPU per sample through the ingest, ns.
    pub ns_per_sample: f64,
    /// Samples per collector CPU second through the ingest.
    pub samples_per_core_sec: f64,
}

/// What the run measured.
#[derive(Clone, Debug, Serialize)]
pub struct DictCostResult {
    /// Largest frame.
    pub frame_bytes: usize,
    /// Samples in one host collection of this machine.
    pub samples_per_collection: usize,
    /// Protobuf metrics frames.
    pub plain: Form,
    /// Series-dictionary frames, steady state.
    pub dict: Form,
    /// Series-dictionary frames, the first collection of an epoch (bytes only).
    pub dict_first: Form,
    /// Frames of either form the ingest did not accept (must be 0).
    pub not_accepted: u64,
}

/// Fabric bytes per second for `hosts` hosts of `series` series each every `interval_s`,
/// at `bytes_per_sample`.
pub fn fabric_bytes_per_second(
    hosts: f64,
    series: f64,
    interval_s: f64,
    bytes_per_sample: f64,
) -> f64 {
    hosts * series * bytes_per_sample / interval_s
}

impl DictCostResult {
    /// The lines of the report table: (what, figure).
    pub fn lines(&self) -> Vec<(String, String)> {
        let fabric = |f: &Form| fabric_bytes_per_second(10_000.0, 450.0, 10.0, f.bytes_per_sample);
        vec![
            (
                format!("host collection ({} samples), {}-byte frames: bytes per sample", self.samples_per_collection, self.frame_bytes),
                format!(
                    "metrics {:.1} ({} frames); metrics_dict {:.1} ({} frames; first collection {:.1}, {} frames)",
                    self.plain.bytes_per_sample,
                    self.plain.frames_per_collection,
                    self.dict.bytes_per_sample,
                    self.dict.frames_per_collection,
                    self.dict_first.bytes_per_sample,
                    self.dict_first.frames_per_collection
                ),
            ),
            (
                "collector ingest per sample (processing only, same thread, alternated)".into(),
                format!(
                    "metrics {:.1} ns ({:.2} M samples/CPU-s); metrics_dict {:.1} ns ({:.2} M samples/CPU-s): {:.2}×",
                    self.plain.ns_per_sample,
                    self.plain.samples_per_core_sec / 1e6,
                    self.dict.ns_per_sample,
                    self.dict.samples_per_core_sec / 1e6,
                    self.dict.samples_per_core_sec / self.plain.samples_per_core_sec.max(1e-9)
                ),
            ),
            (
                "fabric, 10,000 hosts × 450 series every 10 s".into(),
                format!(
                    "metrics {:.2} MB/s; metrics_dict {:.2} MB/s",
                    fabric(&self.plain) / 1e6,
                    fabric(&self.dict) / 1e6
                ),
            ),
        ]
    }
}

/// Why the run could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("dictionary cost setup: {0}")]
pub struct DictCostError(String);

fn pack_plain(f: &mut Framer<Metric>, ms: &[Metric], now: u64) -> Vec<BuiltFrame> {
    let mut out: Vec<BuiltFrame> = Vec::new();
    for m in ms {
        if let PushOutcome::Closed(b) = f.push(m, now) {
            out.push(b);
        }
    }
    out.extend(f.flush());
    out
}

fn pack_dict(f: &mut DictFramer, ms: &[Metric], now: u64) -> Vec<BuiltFrame> {
    let mut out: Vec<BuiltFrame> = Vec::new();
    for m in ms {
        if let PushOutcome::Closed(b) = f.push(m, now) {
            out.push(b);
        }
    }
    out.extend(f.flush());
    out
}

fn form(frames: &[BuiltFrame], samples: usize) -> Form {
    let bytes: usize = frames.iter().map(BuiltFrame::len).sum();
    Form {
        frames_per_collection: frames.len(),
        bytes_per_collection: bytes,
        bytes_per_sample: bytes as f64 / samples.max(1) as f64,
        ..Form::default()
    }
}

pub(crate) fn ingest(
    agent: &str,
    limits: &Limits,
    t: &Telemetry,
) -> Result<ConnectionIngest, DictCostError> {
    let err = |e: &dyn std::fmt::Display| DictCostError(e.to_string());
    let logs = LogSink::open(&LogsConfig {
        sink: LogSinkKind::Stdout,
        ..LogsConfig::default()
    })
    .map_err(|e| err(&e))?;
    ConnectionIngest::new(
        agent,
        agent,
        1,
        limits.clone(),
        TrackerConfig::default(),
        SeriesStore::new(Duration::from_secs(300), 100_000),
        Arc::new(logs),
        t.agent(agent),
    )
    .map_err(|e| err(&e))
}

/// One timed side: its framer, ingest and sequences.
struct Side {
    ingest: ConnectionIngest,
    conn: u64,
    cpu: Duration,
    samples: u64,
}

impl Side {
    fn feed(&mut self, frames: Vec<BuiltFrame>, not_accepted: &mut u64) {
        let stamped: Vec<Vec<u8>> = frames
            .into_iter()
            .map(|f| {
                let c = self.conn;
                self.conn += 1;
                f.into_stamped(1, c)
            })
            .collect();
        let now = Instant::now();
        let c0 = thread_cpu();
        for f in &stamped {
            match self.ingest.on_send(f, now) {
                FrameOutcome::Accepted { records } => self.samples += u64::from(records),
                _ => *not_accepted += 1,
            }
        }
        self.cpu += thread_cpu().saturating_sub(c0);
    }

    fn figures(&self, into: &mut Form) {
        let s = self.cpu.as_secs_f64();
        into.ns_per_sample = s * 1e9 / self.samples.max(1) as f64;
        into.samples_per_core_sec = if s > 0.0 {
            self.samples as f64 / s
        } else {
            0.0
        };
    }
}

/// Runs the measurement on the calling thread.
///
/// # Errors
/// [`DictCostError`] when the framers or the collector objects cannot be built.
pub fn measure(cfg: &DictCostConfig) -> Result<DictCostResult, DictCostError> {
    let err = |e: &dyn std::fmt::Display| DictCostError(e.to_string());
    let mut host = HostMetrics::new(HostMetricsConfig {
        paths: HostPaths::default(),
        ticks_per_second: None,
        disabled: Vec::new(),
        ethtool: None,
    });
    let collections = [host.collect().metrics, {
        std::thread::sleep(Duration::from_millis(100));
        host.collect().metrics
    }];
    let samples = collections[0].len();
    let limits = Limits {
        max_frame_bytes: cfg.frame_bytes,
        ..Limits::default()
    };
    let mut plain = Framer::<Metric>::new(1, 0, limits.clone()).map_err(|e| err(&e))?;
    let mut dict = DictFramer::new(1, 0, limits.clone()).map_err(|e| err(&e))?;
    let telemetry = Telemetry::new().map_err(|e| err(&e))?;
    let outbox = DictAckOutbox::default();
    let mut p = Side {
        ingest: ingest("bench-plain", &limits, &telemetry)?,
        conn: 0,
        cpu: Duration::ZERO,
        samples: 0,
    };
    let mut d = Side {
        ingest: ingest("bench-dict", &limits, &telemetry)?,
        conn: 0,
        cpu: Duration::ZERO,
        samples: 0,
    };
    d.ingest.set_dict_acks(outbox.clone());
    let mut not_accepted = 0;
    let mut ns = 1_700_000_000_000_000_000u64;
    // The dictionary's first collection, then its acknowledgment (untimed).
    let first = pack_dict(&mut dict, &collections[0], ns);
    let dict_first = form(&first, samples);
    d.feed(first, &mut not_accepted);
    let _ = d.ingest.report();
    for a in outbox.take() {
        dict.on_ack(a.known_up_to);
    }
    let first_plain = pack_plain(&mut plain, &collections[0], ns);
    let mut plain_form = form(&first_plain, samples);
    p.feed(first_plain, &mut not_accepted);
    (p.cpu, p.samples, d.cpu, d.samples) = (Duration::ZERO, 0, Duration::ZERO, 0);
    let mut dict_form = Form::default();
    let mut round = 0usize;
    while p.cpu < cfg.cpu_budget || d.cpu < cfg.cpu_budget {
        round += 1;
        ns += 10_000_000_000;
        let c = &collections[round % 2];
        // Alternated back to back: both forms see the same machine state.
        let pf = pack_plain(&mut plain, c, ns);
        let df = pack_dict(&mut dict, c, ns);
        dict_form = form(&df, samples);
        plain_form.frames_per_collection = pf.len();
        if round % 2 == 0 {
            p.feed(pf, &mut not_accepted);
            d.feed(df, &mut not_accepted);
        } else {
            d.feed(df, &mut not_accepted);
            p.feed(pf, &mut not_accepted);
        }
    }
    p.figures(&mut plain_form);
    d.figures(&mut dict_form);
    Ok(DictCostResult {
        frame_bytes: cfg.frame_bytes,
        samples_per_collection: samples,
        plain: plain_form,
        dict: dict_form,
        dict_first,
        not_accepted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_frame_is_accepted_and_the_dictionary_is_smaller() {
        let r = measure(&DictCostConfig {
            frame_bytes: 1024,
            cpu_budget: Duration::from_millis(50),
        })
        .unwrap();
        assert_eq!(r.not_accepted, 0);
        assert!(r.samples_per_collection > 50, "{r:?}");
        assert!(
            r.dict.bytes_per_sample * 3.0 < r.plain.bytes_per_sample,
            "{r:?}"
        );
        assert!(
            r.dict_first.bytes_per_sample > r.dict.bytes_per_sample,
            "{r:?}"
        );
        assert_eq!(r.lines().len(), 3);
        for (what, figure) in r.lines() {
            println!("{what}: {figure}");
        }
    }
}
