//! The frames the harness sends: real metrics frames built once with the protocol's
//! [`Framer`], then re-headed per frame (stream sequence, cumulative record count, timestamp)
//! and stamped (epoch, connection sequence, CRC32C) exactly as an agent stamps at send time.
//!
//! The records are node_exporter-style CPU counters (`node_cpu_seconds_total{cpu,mode}` with
//! its help text), the series an agent ships most of, and a few small gauges that fill the
//! rest of the frame; every frame carries the same series so the collector's store updates in
//! place, as it does in steady state.

use uctel_protocol::frame::{self, FrameError, FrameHeader, HEADER_LEN};
use uctel_protocol::framer::Framer;
use uctel_protocol::limits::Limits;
use uctel_protocol::payload::{Label, Metric, MetricType};

/// Modes of `node_cpu_seconds_total`, as node_exporter names them.
const CPU_MODES: [&str; 8] = [
    "idle", "iowait", "irq", "nice", "softirq", "steal", "system", "user",
];

/// Payload field number of the records in `MetricBatch` (`proto/uctel.proto`).
const RECORDS_FIELD: u32 = 1;

/// Bytes one RDMA WRITE_WITH_IMM ONLY packet adds around a frame in the UDP payload:
/// BTH (12) + RETH (16) + ImmDt (4) + ICRC (4) (IBTA vol. 1 §9.2, RoCEv2 annex A17).
pub const ROCE_WRITE_IMM_OVERHEAD: usize = 12 + 16 + 4 + 4;

/// Why a template could not be built.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// The frame size leaves no room for a record.
    #[error("frame size {frame_bytes} B cannot hold one metric record (header {HEADER_LEN} B)")]
    TooSmall {
        /// Requested frame size.
        frame_bytes: usize,
    },
    /// The framer refused the limits.
    #[error("framer: {0}")]
    Framer(String),
    /// Writing a frame failed.
    #[error("frame: {0}")]
    Frame(#[from] FrameError),
}

/// One sample of `node_cpu_seconds_total`: record `i` is CPU `i / 8`, mode `i % 8`.
pub fn cpu_metric(i: usize) -> Metric {
    Metric {
        name: "node_cpu_seconds_total".into(),
        help: "Seconds the CPUs spent in each mode.".into(),
        r#type: MetricType::Counter as i32,
        labels: vec![
            Label {
                name: "cpu".into(),
                value: (i / CPU_MODES.len()).to_string(),
            },
            Label {
                name: "mode".into(),
                value: CPU_MODES[i % CPU_MODES.len()].into(),
            },
        ],
        value: 1_000_000.0 + i as f64 * 0.25,
        ..Default::default()
    }
}

/// A full metrics frame of at most `frame_bytes` bytes, re-headed and stamped per send.
#[derive(Clone, Debug)]
pub struct FrameTemplate {
    bytes: Vec<u8>,
    header: FrameHeader,
    records: u32,
}

impl FrameTemplate {
    /// Packs [`cpu_metric`] records, then small gauges, with the protocol [`Framer`]
    /// (stream 1, limits with `max_frame_bytes = frame_bytes`) into one full frame: the
    /// template.
    ///
    /// # Errors
    /// [`WorkloadError`] when `frame_bytes` cannot hold a record.
    pub fn metrics(frame_bytes: usize) -> Result<FrameTemplate, WorkloadError> {
        let limits = Limits {
            max_frame_bytes: frame_bytes,
            ..Limits::default()
        };
        // Choose the records so that they fill the payload: CPU counters while they fit, then
        // small gauges to close the gap (each record is sized as the framer sizes it).
        let max_payload = limits.max_payload_bytes();
        let entry = |m: &Metric| prost::encoding::message::encoded_len(RECORDS_FIELD, m);
        let mut records = Vec::new();
        let mut used = 0usize;
        for i in 0.. {
            let m = cpu_metric(i);
            if used + entry(&m) > max_payload || records.len() >= limits.max_records_per_frame {
                break;
            }
            used += entry(&m);
            records.push(m);
        }
        for j in 0.. {
            let m = filler_metric(j);
            if used + entry(&m) > max_payload || records.len() >= limits.max_records_per_frame {
                break;
            }
            used += entry(&m);
            records.push(m);
        }
        let mut framer = Framer::<Metric>::new(1, 0, limits)
            .map_err(|e| WorkloadError::Framer(e.to_string()))?;
        let packed = framer.pack(&records, 1);
        let built = match (packed.frames.len(), packed.rejected.is_empty()) {
            (1, true) => packed.frames.into_iter().next(),
            _ => None,
        }
        .filter(|f| f.records() > 0)
        .ok_or(WorkloadError::TooSmall { frame_bytes })?;
        let header = FrameHeader::parse(built.bytes())?;
        Ok(FrameTemplate {
            records: built.records(),
            header,
            bytes: built.into_bytes(),
        })
    }

    /// Frame length in bytes (header included).
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Always false: a template holds at least one record.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Records (samples) per frame.
    pub fn records(&self) -> u32 {
        self.records
    }

    /// The unstamped template bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Writes frame `stream_seq` of the stream into `out[..self.len()]`: the template payload,
    /// a header with this stream sequence, the cumulative record count `(stream_seq + 1) ×
    /// records` and `timestamp_ns`, stamped with `epoch`, `conn_seq` and the CRC32C.
    ///
    /// # Errors
    /// [`FrameError::Truncated`] when `out` is shorter than the frame.
    pub fn write(
        &self,
        out: &mut [u8],
        epoch: u64,
        conn_seq: u64,
        stream_seq: u64,
        timestamp_ns: u64,
    ) -> Result<(), FrameError> {
        let have = out.len();
        let Some(dst) = out.get_mut(..self.bytes.len()) else {
            return Err(FrameError::Truncated {
                need: self.bytes.len(),
                have,
            });
        };
        dst.copy_from_slice(&self.bytes);
        self.rehead(dst, epoch, conn_seq, stream_seq, timestamp_ns)
    }

    /// As [`FrameTemplate::write`] for a buffer that already holds this template's payload:
    /// rewrites only the header and the CRC.
    ///
    /// # Errors
    /// [`FrameError::Truncated`] when `frame` is shorter than the header.
    pub fn rehead(
        &self,
        frame: &mut [u8],
        epoch: u64,
        conn_seq: u64,
        stream_seq: u64,
        timestamp_ns: u64,
    ) -> Result<(), FrameError> {
        let header = FrameHeader {
            stream_seq,
            timestamp_ns,
            record_count: (stream_seq + 1).saturating_mul(u64::from(self.records)),
            ..self.header
        };
        header.emit(frame)?;
        frame::stamp_connection(frame, epoch, conn_seq)
    }
}

/// A small gauge (`node_filler_<j>`, no labels, no help) to fill the end of a frame.
fn filler_metric(j: usize) -> Metric {
    Metric {
        name: format!("node_filler_{j}"),
        r#type: MetricType::Gauge as i32,
        value: j as f64,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uctel_protocol::frame::{decode_frame, Payload};

    #[test]
    fn template_fills_the_frame_and_decodes() {
        let t = FrameTemplate::metrics(1024).unwrap();
        assert!(t.len() <= 1024);
        // Full: not even the smallest filler gauge (about 20 bytes) would have fitted.
        assert!(t.len() > 1024 - 24, "template only {} bytes", t.len());
        let mut buf = vec![0u8; t.len()];
        t.write(&mut buf, 0xabc, 77, 5, 1_700_000_000_000_000_000)
            .unwrap();
        let limits = Limits {
            max_frame_bytes: 1024,
            ..Limits::default()
        };
        let d = decode_frame(&buf, &limits).unwrap();
        assert_eq!(d.header.epoch, 0xabc);
        assert_eq!(d.header.conn_seq, 77);
        assert_eq!(d.header.stream_seq, 5);
        assert_eq!(d.header.record_count, 6 * u64::from(t.records()));
        match d.payload {
            Payload::Metrics(b) => assert_eq!(b.metrics.len(), t.records() as usize),
            other => panic!("unexpected payload {other:?}"),
        }
    }

    #[test]
    fn rehead_changes_the_crc() {
        let t = FrameTemplate::metrics(512).unwrap();
        let mut a = t.bytes().to_vec();
        let mut b = t.bytes().to_vec();
        t.rehead(&mut a, 1, 1, 1, 1).unwrap();
        t.rehead(&mut b, 1, 2, 1, 1).unwrap();
        assert_ne!(a, b);
        assert!(frame::verify_frame(&a).is_ok());
        assert!(frame::verify_frame(&b).is_ok());
    }

    #[test]
    fn tiny_frames_are_refused() {
        assert!(FrameTemplate::metrics(HEADER_LEN + 4).is_err());
        assert!(FrameTemplate::metrics(8).is_err());
    }

    #[test]
    fn short_output_is_an_error() {
        let t = FrameTemplate::metrics(256).unwrap();
        let mut small = vec![0u8; 10];
        assert!(t.write(&mut small, 0, 0, 0, 0).is_err());
    }
}
