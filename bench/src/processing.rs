//! Processing only: what the collector's worker does with a frame, without IO — in this
//! process, on one thread, timed with `getrusage(RUSAGE_THREAD)`.
//!
//! The measured call is the collector library's own per-connection ingest
//! ([`ConnectionIngest::on_slot`]): slot/immediate check, header view, CRC32C, epoch,
//! connection and stream sequence trackers, payload decode with limits, series store,
//! self-metrics. Two cheaper stages are timed on the same frames to show where the time
//! goes: header view + CRC32C only, and [`decode_frame`] (header, CRC, payload decode).
//!
//! Frames are stamped in batches of `batch` (increasing connection and stream sequences, as
//! one agent sends them) outside the timed sections.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use uctel_collector::config::{LogSinkKind, LogsConfig};
use uctel_collector::ingest::{ConnectionIngest, FrameOutcome};
use uctel_collector::logsink::LogSink;
use uctel_collector::store::SeriesStore;
use uctel_collector::telemetry::Telemetry;
use uctel_protocol::frame::{decode_frame, Frame};
use uctel_protocol::limits::Limits;
use uctel_protocol::tracker::TrackerConfig;

use crate::cpu::thread_cpu;
use crate::stats::rate;
use crate::workload::FrameTemplate;

const EPOCH: u64 = 0x00be_7c40_0000_0001;

/// Settings.
#[derive(Clone, Debug)]
pub struct ProcessingConfig {
    /// The frames.
    pub frame: Arc<FrameTemplate>,
    /// Stop once the full ingest stage used this much CPU.
    pub cpu_budget: Duration,
    /// Frames stamped per batch.
    pub batch: usize,
}

/// CPU per frame of one stage.
#[derive(Clone, Debug, Serialize)]
pub struct Stage {
    /// What the stage does.
    pub what: &'static str,
    /// Frames run through it.
    pub frames: u64,
    /// CPU seconds.
    pub cpu_seconds: f64,
    /// Nanoseconds of CPU per frame.
    pub ns_per_frame: f64,
    /// Frames per CPU second.
    pub frames_per_core_sec: f64,
}

/// What the processing run measured.
#[derive(Clone, Debug, Serialize)]
pub struct ProcessingResult {
    /// Bytes per frame.
    pub frame_bytes: usize,
    /// Samples per frame.
    pub records_per_frame: u32,
    /// The full worker path (the headline figure).
    pub ingest: Stage,
    /// Header view + CRC32C only.
    pub check: Stage,
    /// `decode_frame`: header, CRC32C, payload decode and validation.
    pub decode: Stage,
    /// Samples per CPU second through the full path.
    pub samples_per_core_sec: f64,
    /// Frames the ingest did not accept (must be 0; anything else means the workload is
    /// wrong).
    pub not_accepted: u64,
}

/// Why the run could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ProcessingError {
    /// Collector library setup.
    #[error("collector library: {0}")]
    Setup(String),
}

fn stage(what: &'static str, frames: u64, cpu: Duration) -> Stage {
    let s = cpu.as_secs_f64();
    Stage {
        what,
        frames,
        cpu_seconds: s,
        ns_per_frame: if frames > 0 {
            s * 1e9 / frames as f64
        } else {
            0.0
        },
        frames_per_core_sec: rate(frames as f64, s),
    }
}

/// Runs the processing-only measurement on the calling thread.
///
/// # Errors
/// [`ProcessingError`] when the collector library objects cannot be created.
pub fn measure(cfg: &ProcessingConfig) -> Result<ProcessingResult, ProcessingError> {
    let setup = |e: &dyn std::fmt::Display| ProcessingError::Setup(e.to_string());
    let frame_len = cfg.frame.len();
    let limits = Limits {
        max_frame_bytes: frame_len.max(4096),
        ..Limits::default()
    };
    let telemetry = Telemetry::new().map_err(|e| setup(&e))?;
    let store = SeriesStore::new(Duration::from_secs(300), 100_000);
    let logs = LogSink::open(&LogsConfig {
        sink: LogSinkKind::Stdout,
        ..LogsConfig::default()
    })
    .map_err(|e| setup(&e))?;
    let mut ingest = ConnectionIngest::new(
        "bench-processing",
        "bench-host",
        EPOCH,
        limits.clone(),
        TrackerConfig::default(),
        store,
        Arc::new(logs),
        telemetry.agent("bench-processing"),
    )
    .map_err(|e| setup(&e))?;

    let batch = cfg.batch.max(1);
    let mut frames: Vec<Vec<u8>> = (0..batch).map(|_| cfg.frame.bytes().to_vec()).collect();
    let (mut n_check, mut n_decode, mut n_ingest) = (0u64, 0u64, 0u64);
    let (mut t_check, mut t_decode, mut t_ingest) =
        (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let mut not_accepted = 0u64;
    let mut seq = 0u64;
    let mut sink = 0usize;
    while t_ingest < cfg.cpu_budget {
        for f in frames.iter_mut() {
            // Stamping cannot fail: every buffer holds the template.
            let _ = cfg.frame.rehead(f, EPOCH, seq, seq, 1);
            seq += 1;
        }
        let c0 = thread_cpu();
        for f in &frames {
            if let Ok(view) = Frame::new_checked(f.as_slice()) {
                if view.check_crc().is_ok() {
                    sink += view.payload().len();
                }
            }
        }
        let c1 = thread_cpu();
        for f in &frames {
            if let Ok(d) = decode_frame(f, &limits) {
                sink += d.payload.record_count();
            }
        }
        let c2 = thread_cpu();
        let first = seq - batch as u64;
        let now = Instant::now();
        for (i, f) in frames.iter().enumerate() {
            match ingest.on_slot(first + i as u64, f, now) {
                FrameOutcome::Accepted { records } => sink += records as usize,
                _ => not_accepted += 1,
            }
        }
        let c3 = thread_cpu();
        t_check += c1.saturating_sub(c0);
        t_decode += c2.saturating_sub(c1);
        t_ingest += c3.saturating_sub(c2);
        n_check += batch as u64;
        n_decode += batch as u64;
        n_ingest += batch as u64;
    }
    std::hint::black_box(sink);
    let ingest_stage = stage(
        "ingest: slot check, CRC, trackers, decode, store, metrics",
        n_ingest,
        t_ingest,
    );
    Ok(ProcessingResult {
        frame_bytes: frame_len,
        records_per_frame: cfg.frame.records(),
        samples_per_core_sec: ingest_stage.frames_per_core_sec * f64::from(cfg.frame.records()),
        ingest: ingest_stage,
        check: stage("header view + CRC32C", n_check, t_check),
        decode: stage("decode_frame (header, CRC, payload)", n_decode, t_decode),
        not_accepted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_frame_is_accepted_and_stages_are_ordered() {
        let r = measure(&ProcessingConfig {
            frame: Arc::new(FrameTemplate::metrics(1024).unwrap()),
            cpu_budget: Duration::from_millis(30),
            batch: 64,
        })
        .unwrap();
        assert_eq!(r.not_accepted, 0);
        assert!(r.ingest.frames >= 64);
        assert!(r.ingest.frames_per_core_sec > 0.0);
        assert_eq!(r.check.frames, r.ingest.frames);
    }
}
