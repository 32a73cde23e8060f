//! The frames the harness sends: real metrics frames built once with the protocol's
//! [`Framer`], then re-headed per frame (stream sequence, cumulative record count, timestamp)
//! and stamped (epoch, connection sequence, CRC32C) exactly as an agent stamps at send time.
//!
//! The records are node_exporter-style CPU counters (`node_cpu_seconds_total{cpu,mode}` with
//! its help text), the series an agent ships most of, and a few small gauges that fill the
//! rest of the frame; every frame carries the same series so the collector's store updates in
//! place, as it does in steady state.
//!
//! Two forms ([`FrameForm`]): protobuf metrics frames (`kind = metrics`, every series named in
//! every frame) and series-dictionary frames (`kind = metrics_dict`, `uctel_protocol::dict`),
//! framed by the agent's own encoder ([`DictFramer`]). A dictionary template holds the
//! steady-state frame (values only, every series acknowledged: as many CPU counters as fill
//! the frame) and the **prelude**: the frames of the epoch's first collection of the same
//! series, each value with its definition in band. An emulated agent sends prelude frames
//! until the collector's `DictAck` covers every series, then only the steady-state frame,
//! so no frame references an entry the collector has not acknowledged (the agent's rule).

use uctel_protocol::dict::DictFramer;
use uctel_protocol::frame::{self, FrameError, FrameHeader, HEADER_LEN};
use uctel_protocol::framer::{BuiltFrame, Framer, PushOutcome};
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

/// The payload form of a template's frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FrameForm {
    /// `kind = metrics`: protobuf, every series named in every frame.
    Metrics,
    /// `kind = metrics_dict`: the series dictionary, steady state values only.
    MetricsDict,
}

impl FrameForm {
    /// The frame kind's name, as the protocol spells it.
    pub fn name(self) -> &'static str {
        match self {
            FrameForm::Metrics => "metrics",
            FrameForm::MetricsDict => "metrics_dict",
        }
    }
}

/// One prebuilt frame: bytes, parsed header, samples.
#[derive(Clone, Debug)]
struct Piece {
    bytes: Vec<u8>,
    header: FrameHeader,
    records: u32,
}

impl Piece {
    fn of(built: BuiltFrame) -> Result<Piece, FrameError> {
        let header = FrameHeader::parse(built.bytes())?;
        Ok(Piece {
            records: built.records(),
            header,
            bytes: built.into_bytes(),
        })
    }
}

/// A full metrics frame of at most `frame_bytes` bytes, re-headed and stamped per send; for
/// the dictionary form also the prelude frames that define its series (module docs).
#[derive(Clone, Debug)]
pub struct FrameTemplate {
    bytes: Vec<u8>,
    header: FrameHeader,
    records: u32,
    form: FrameForm,
    /// The steady-state frame's series, in frame order (values as sent).
    metrics: Vec<Metric>,
    /// Dictionary form: the first collection's frames, definitions in band.
    prelude: Vec<Piece>,
    /// Largest frame of the template, prelude included.
    slot_len: usize,
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
            slot_len: built.len(),
            bytes: built.into_bytes(),
            form: FrameForm::Metrics,
            metrics: records,
            prelude: Vec::new(),
        })
    }

    /// Series-dictionary frames of at most `frame_bytes` bytes, framed by the agent's
    /// [`DictFramer`]: the steady-state frame carries the values of as many [`cpu_metric`]
    /// series as fill it once every series is acknowledged (at most
    /// `Limits::max_records_per_frame`); the prelude is the epoch's first collection of those
    /// series (definitions in band), in as many frames as it takes.
    ///
    /// # Errors
    /// [`WorkloadError`] when `frame_bytes` cannot hold a record, or the steady-state
    /// series do not frame into exactly one frame.
    pub fn metrics_dict(frame_bytes: usize) -> Result<FrameTemplate, WorkloadError> {
        let limits = Limits {
            max_frame_bytes: frame_bytes,
            ..Limits::default()
        };
        let framer_err =
            |e: uctel_protocol::framer::FramerError| WorkloadError::Framer(e.to_string());
        let candidates: Vec<Metric> = (0..limits.max_records_per_frame).map(cpu_metric).collect();
        const NOW: u64 = 1_700_000_000_000_000_000;
        // How many acknowledged series one frame holds: define them all, acknowledge, and
        // frame them again; the first frame that closes is full.
        let mut trial = DictFramer::new(1, 0, limits.clone()).map_err(framer_err)?;
        let _ = pack_dict(&mut trial, &candidates, NOW);
        trial.on_ack(u32::MAX);
        let n = pack_dict(&mut trial, &candidates, NOW)
            .first()
            .map_or(0, |f| f.records() as usize);
        if n == 0 {
            return Err(WorkloadError::TooSmall { frame_bytes });
        }
        let series = candidates[..n].to_vec();
        let mut f = DictFramer::new(1, 0, limits).map_err(framer_err)?;
        let prelude = pack_dict(&mut f, &series, NOW)
            .into_iter()
            .map(Piece::of)
            .collect::<Result<Vec<_>, _>>()?;
        f.on_ack(u32::try_from(n).unwrap_or(u32::MAX));
        let mut steady = pack_dict(&mut f, &series, NOW);
        let (Some(steady), true) = (steady.pop(), steady.is_empty()) else {
            return Err(WorkloadError::Framer(format!(
                "{n} acknowledged series did not frame into one {frame_bytes}-byte frame"
            )));
        };
        let steady = Piece::of(steady)?;
        let slot_len = prelude
            .iter()
            .map(|p| p.bytes.len())
            .chain([steady.bytes.len()])
            .max()
            .unwrap_or(0);
        Ok(FrameTemplate {
            bytes: steady.bytes,
            header: steady.header,
            records: steady.records,
            form: FrameForm::MetricsDict,
            metrics: series,
            prelude,
            slot_len,
        })
    }

    /// A template of `form` ([`FrameTemplate::metrics`] or [`FrameTemplate::metrics_dict`]).
    ///
    /// # Errors
    /// As those.
    pub fn of_form(form: FrameForm, frame_bytes: usize) -> Result<FrameTemplate, WorkloadError> {
        match form {
            FrameForm::Metrics => FrameTemplate::metrics(frame_bytes),
            FrameForm::MetricsDict => FrameTemplate::metrics_dict(frame_bytes),
        }
    }

    /// The payload form.
    pub fn form(&self) -> FrameForm {
        self.form
    }

    /// The steady-state frame's series, in frame order.
    pub fn series(&self) -> &[Metric] {
        &self.metrics
    }

    /// Dictionary entries an agent must see acknowledged before it sends the steady-state
    /// frame (0 for the protobuf form).
    pub fn dict_entries(&self) -> u32 {
        match self.form {
            FrameForm::Metrics => 0,
            FrameForm::MetricsDict => u32::try_from(self.metrics.len()).unwrap_or(u32::MAX),
        }
    }

    /// Prelude frames (dictionary form; 0 for the protobuf form).
    pub fn prelude_frames(&self) -> usize {
        self.prelude.len()
    }

    /// Bytes and samples of the prelude (the first collection of the dictionary form).
    pub fn prelude_size(&self) -> (usize, u64) {
        self.prelude.iter().fold((0, 0), |(b, r), p| {
            (b + p.bytes.len(), r + u64::from(p.records))
        })
    }

    /// The largest frame in bytes (header included), prelude frames included: the ring slot
    /// size the collector must offer.
    pub fn len(&self) -> usize {
        self.slot_len
    }

    /// The steady-state frame's length in bytes.
    pub fn steady_len(&self) -> usize {
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

    /// Writes frame `stream_seq` into `out`: prelude frame `prelude` (`Some(i)`, taken modulo
    /// the prelude's length) or the steady-state frame (`None`, or a template without a
    /// prelude), with `records_before` the stream's cumulative records before it. Returns the
    /// frame's length and samples.
    ///
    /// # Errors
    /// [`FrameError::Truncated`] when `out` is shorter than the frame.
    #[allow(clippy::too_many_arguments)] // the header's fields, as `write`
    pub fn write_piece(
        &self,
        out: &mut [u8],
        prelude: Option<usize>,
        epoch: u64,
        conn_seq: u64,
        stream_seq: u64,
        records_before: u64,
        timestamp_ns: u64,
    ) -> Result<(usize, u32), FrameError> {
        let (bytes, header, records) = match prelude {
            Some(i) if !self.prelude.is_empty() => {
                let p = &self.prelude[i % self.prelude.len()];
                (&p.bytes, &p.header, p.records)
            }
            _ => (&self.bytes, &self.header, self.records),
        };
        let have = out.len();
        let Some(dst) = out.get_mut(..bytes.len()) else {
            return Err(FrameError::Truncated {
                need: bytes.len(),
                have,
            });
        };
        dst.copy_from_slice(bytes);
        let header = FrameHeader {
            stream_seq,
            timestamp_ns,
            record_count: records_before.saturating_add(u64::from(records)),
            ..*header
        };
        header.emit(dst)?;
        frame::stamp_connection(dst, epoch, conn_seq)?;
        Ok((bytes.len(), records))
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

/// Pushes `ms` at `now` and flushes: every frame that closed.
fn pack_dict(f: &mut DictFramer, ms: &[Metric], now: u64) -> Vec<BuiltFrame> {
    let mut out = Vec::new();
    for m in ms {
        if let PushOutcome::Closed(b) = f.push(m, now) {
            out.push(b);
        }
    }
    out.extend(f.flush());
    out
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

    /// The dictionary template: the prelude defines every series of the steady-state frame
    /// (each prelude frame decodes on its own), the steady-state frame carries values only
    /// (it does not decode alone) and many more samples than the protobuf frame of the same
    /// size, and the collector's own ingest accepts the steady frame once it acknowledged
    /// the prelude, with the header's cumulative record count as written.
    #[test]
    fn dictionary_template_defines_then_sends_values_only() {
        use uctel_collector::ingest::FrameOutcome;
        use uctel_protocol::dict::decode_frame_alone;
        let plain = FrameTemplate::metrics(1024).unwrap();
        let t = FrameTemplate::metrics_dict(1024).unwrap();
        assert_eq!(t.form(), FrameForm::MetricsDict);
        assert!(t.steady_len() <= 1024 && t.len() <= 1024);
        // Full: one more value (at least two bytes) would not have fitted.
        assert!(
            t.steady_len() > 1024 - 12,
            "steady frame {} bytes",
            t.steady_len()
        );
        assert!(
            t.records() > 10 * plain.records(),
            "{} vs {}",
            t.records(),
            plain.records()
        );
        assert_eq!(t.dict_entries(), t.records());
        let limits = Limits {
            max_frame_bytes: 1024,
            ..Limits::default()
        };
        let mut buf = vec![0u8; t.len()];
        let mut defined = Vec::new();
        let mut before = 0;
        for i in 0..t.prelude_frames() {
            let (len, r) = t
                .write_piece(&mut buf, Some(i), 9, i as u64, i as u64, before, 1 << 60)
                .unwrap();
            before += u64::from(r);
            let d = decode_frame_alone(&buf[..len], &limits).unwrap();
            assert_eq!(d.header.record_count, before);
            match d.payload {
                Payload::Metrics(b) => defined.extend(b.metrics),
                other => panic!("unexpected payload {other:?}"),
            }
        }
        assert_eq!(before, u64::from(t.records()));
        let names: Vec<_> = defined.iter().map(|m| (&m.name, &m.labels)).collect();
        let want: Vec<_> = t.series().iter().map(|m| (&m.name, &m.labels)).collect();
        assert_eq!(names, want);
        let n = t.prelude_frames() as u64;
        let (len, r) = t
            .write_piece(&mut buf, None, 9, n, n, before, 1 << 60)
            .unwrap();
        assert_eq!(len, t.steady_len());
        assert_eq!(r, t.records());
        assert!(decode_frame_alone(&buf[..len], &limits).is_err());
        // Through the collector's ingest: prelude, acknowledgment, steady frame.
        let telemetry = uctel_collector::telemetry::Telemetry::new().unwrap();
        let outbox = uctel_collector::ingest::DictAckOutbox::default();
        let mut ingest = crate::dictcost::ingest("bench-t", &limits, &telemetry).unwrap();
        ingest.set_dict_acks(outbox.clone());
        let now = std::time::Instant::now();
        let mut before = 0;
        for i in 0..t.prelude_frames() {
            let (len, r) = t
                .write_piece(&mut buf, Some(i), 1, i as u64, i as u64, before, 1 << 60)
                .unwrap();
            before += u64::from(r);
            let out = ingest.on_send(&buf[..len], now);
            assert!(matches!(out, FrameOutcome::Accepted { .. }), "{out:?}");
        }
        let _ = ingest.report();
        let acks = outbox.take();
        assert_eq!(acks.last().map(|a| a.known_up_to), Some(t.dict_entries()));
        let (len, _) = t
            .write_piece(&mut buf, None, 1, n, n, before, 1 << 60)
            .unwrap();
        match ingest.on_send(&buf[..len], now) {
            FrameOutcome::Accepted { records } => assert_eq!(records, t.records()),
            other => panic!("steady frame not accepted: {other:?}"),
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
