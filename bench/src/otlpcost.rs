//! The OTLP row: samples the collector delivers over OTLP/HTTP (protobuf, gzip) per
//! collector CPU-second, against remote-write's (protobuf, snappy) in the same run, with the
//! same load (emulated agents over the soft UC path) and the same receiver.
//!
//! The receiver is an HTTP server in the bench process that reads each request whole and
//! answers `200` at once (it is not measured: only the collector's CPU is), so both sides
//! pay for the same thing except the output: queueing, encoding, compression, sending. The
//! yardstick is the collector's own count of items the receiver accepted
//! (`uctel_collector_otlp_items_sent_total{signal="metrics"}`,
//! `uctel_collector_remote_write_samples_total`) over the window, divided by the collector's
//! `utime + stime`; the row reports OTLP's figure as a ratio of remote-write's.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::cpu::{delta, CpuDelta};
use crate::daemon::{CollectorProcess, CollectorSettings, TOKEN};
use crate::loadgen::{LoadConfig, LoadGen};
use crate::workload::FrameTemplate;

/// How the row runs.
#[derive(Clone, Debug)]
pub struct OtlpCostConfig {
    /// The collector binary.
    pub collector_bin: PathBuf,
    /// Work directory (configs, logs).
    pub workdir: PathBuf,
    /// Emulated agents.
    pub agents: usize,
    /// Frames sent.
    pub frame: Arc<FrameTemplate>,
    /// One frame per agent per this interval.
    pub gap: Duration,
    /// Ring slots per agent.
    pub slots: u32,
    /// Unmeasured start of each side.
    pub warmup: Duration,
    /// Measured window of each side.
    pub duration: Duration,
}

/// One side's figures.
#[derive(Clone, Debug, Serialize)]
pub struct Side {
    /// Samples the receiver accepted in the window.
    pub samples: f64,
    /// Per wall second.
    pub samples_per_sec: f64,
    /// Per collector CPU second.
    pub samples_per_core_sec: f64,
    /// The collector's CPU in the window.
    pub cpu: CpuDelta,
    /// `in − sent − dropped − pending` after the run (0 when the sum rule holds).
    pub unaccounted: f64,
    /// Items dropped, every reason.
    pub dropped: f64,
}

/// The row.
#[derive(Clone, Debug, Serialize)]
pub struct OtlpCostResult {
    /// Emulated agents.
    pub agents: usize,
    /// Samples offered per second.
    pub offered_per_sec: f64,
    /// The collector with `outputs.otlp` (metrics only).
    pub otlp: Side,
    /// The collector with `outputs.remote_write`.
    pub remote_write: Side,
}

impl OtlpCostResult {
    /// OTLP's samples per collector CPU-s over remote-write's.
    pub fn ratio(&self) -> f64 {
        crate::stats::ratio(
            self.otlp.samples_per_core_sec,
            self.remote_write.samples_per_core_sec,
        )
    }

    /// The report's rows.
    pub fn rows(&self) -> Vec<[String; 4]> {
        vec![[
            format!("OTLP/HTTP metrics (protobuf, gzip): K = {}", self.agents),
            format!(
                "{} samples/s; {} per collector CPU-s",
                si(self.otlp.samples_per_sec),
                si(self.otlp.samples_per_core_sec)
            ),
            format!(
                "{:.2}× remote-write's {} per collector CPU-s (same run, same load)",
                self.ratio(),
                si(self.remote_write.samples_per_core_sec)
            ),
            format!(
                "offered {} samples/s; dropped {} / {}",
                si(self.offered_per_sec),
                self.otlp.dropped,
                self.remote_write.dropped
            ),
        ]]
    }
}

/// `v` with a thousands unit (k, M), for the row (the report's own formatting lives in
/// `report`, which depends on this module).
fn si(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2} M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1} k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// Why the row failed.
#[derive(Debug, thiserror::Error)]
pub enum OtlpCostError {
    /// A daemon, the receiver or the generator.
    #[error("{0}")]
    Setup(String),
}

fn setup<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> OtlpCostError + '_ {
    move |e| OtlpCostError::Setup(format!("{what}: {e}"))
}

/// Starts the receiver: every request read whole, answered `200` with an empty body.
fn receiver() -> Result<SocketAddr, OtlpCostError> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(setup("receiver"))?;
    let addr = listener.local_addr().map_err(setup("receiver"))?;
    std::thread::Builder::new()
        .name("bench-receiver".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                let _ = std::thread::Builder::new()
                    .name("bench-receiver-conn".into())
                    .spawn(move || serve(stream));
            }
        })
        .map_err(setup("receiver thread"))?;
    Ok(addr)
}

fn serve(stream: TcpStream) {
    let Ok(clone) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(clone);
    let mut out = stream;
    let mut body = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut len = 0usize;
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((n, v)) = h.split_once(':') {
                if n.trim().eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
        }
        body.resize(len, 0);
        if reader.read_exact(&mut body).is_err()
            || out
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                .is_err()
        {
            return;
        }
    }
}

/// Runs both sides, OTLP first.
///
/// # Errors
/// [`OtlpCostError`] when the receiver, the collector or the generator cannot run.
pub fn run(cfg: &OtlpCostConfig) -> Result<OtlpCostResult, OtlpCostError> {
    std::fs::create_dir_all(&cfg.workdir).map_err(setup("work directory"))?;
    let addr = receiver()?;
    let otlp = run_side(
        cfg,
        "otlp",
        &format!("outputs:\n  otlp:\n    endpoint: http://{addr}\n    logs: false\n"),
        (
            "uctel_collector_otlp_items_",
            "in_total",
            "sent_total",
            "dropped_total",
            "pending",
        ),
    )?;
    let remote_write = run_side(
        cfg,
        "remote-write",
        &format!("outputs:\n  remote_write:\n    - url: http://{addr}/api/v1/write\n"),
        (
            "uctel_collector_remote_write_samples_",
            "in_total",
            "total",
            "dropped_total",
            "pending",
        ),
    )?;
    Ok(OtlpCostResult {
        agents: cfg.agents,
        offered_per_sec: cfg.agents as f64 * f64::from(cfg.frame.records()) / cfg.gap.as_secs_f64(),
        otlp,
        remote_write,
    })
}

/// One collector run with `extra_yaml`; `names`: the counter prefix and the suffixes of
/// its in, sent, dropped and pending figures.
fn run_side(
    cfg: &OtlpCostConfig,
    name: &str,
    extra_yaml: &str,
    names: (&str, &str, &str, &str, &str),
) -> Result<Side, OtlpCostError> {
    let (prefix, n_in, n_sent, n_dropped, n_pending) = names;
    let dir = cfg.workdir.join(name);
    std::fs::create_dir_all(&dir).map_err(setup("work directory"))?;
    let collector = CollectorProcess::start(
        &cfg.collector_bin,
        &dir,
        &CollectorSettings {
            slots: cfg.slots,
            slot_bytes: u32::try_from(cfg.frame.len()).unwrap_or(u32::MAX),
            credit_margin_slots: (cfg.slots / 16).clamp(1, 64),
            descriptor_queue: 8192,
            report_interval_seconds: 0.5,
            data_path: "write_with_imm",
            log_file: dir.join("logs.jsonl"),
            credit_write_batching: None,
            extra_yaml: extra_yaml.to_owned(),
            recv_buffer_bytes: None,
            progress: None,
            min_slots: None,
        },
    )
    .map_err(setup("collector"))?;
    let mut gen = LoadGen::connect(&LoadConfig {
        agents: cfg.agents,
        control: collector.control,
        token: TOKEN.into(),
        frame: cfg.frame.clone(),
        qps_per_device: 32,
        sq_depth: 256,
        post_batch: 16,
        connect_parallelism: 32,
        pace: Some(cfg.gap),
        expected_fps: None,
        bursts: None,
        credit_writes: false,
    })
    .map_err(setup("load generator"))?;
    gen.start_sending().map_err(setup("load generator"))?;
    std::thread::sleep(cfg.warmup);
    let sent = |c: &CollectorProcess| -> Result<f64, OtlpCostError> {
        let s = c.scrape().map_err(setup("collector /metrics"))?;
        Ok(s.sum(&format!("{prefix}{n_sent}"), &[]))
    };
    let (c0, s0) = (
        collector.sample().map_err(setup("collector CPU"))?,
        sent(&collector)?,
    );
    let t0 = Instant::now();
    std::thread::sleep(cfg.duration);
    let (c1, s1) = (
        collector.sample().map_err(setup("collector CPU"))?,
        sent(&collector)?,
    );
    let window = t0.elapsed().as_secs_f64();
    gen.stop_sending();
    gen.wait_consumed(Duration::from_secs(5));
    let _ = gen.finish();
    let deadline = Instant::now() + Duration::from_secs(30);
    let s = loop {
        let s = collector.scrape().map_err(setup("collector /metrics"))?;
        if s.sum(&format!("{prefix}{n_pending}"), &[]) <= 0.0 || Instant::now() >= deadline {
            break s;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    collector.stop();
    let get = |n: &str| s.sum(&format!("{prefix}{n}"), &[]);
    let dropped = get(n_dropped);
    let cpu = delta(&c0, &c1);
    let samples = s1 - s0;
    let rate = |n: f64, d: f64| if d > 0.0 { n / d } else { 0.0 };
    Ok(Side {
        samples,
        samples_per_sec: rate(samples, window),
        samples_per_core_sec: rate(samples, cpu.cpu_seconds),
        cpu,
        unaccounted: get(n_in) - get(n_sent) - dropped - get(n_pending),
        dropped,
    })
}
