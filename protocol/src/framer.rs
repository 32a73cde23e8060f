//! Sans-IO framer: packs the records of one stream into frames of at most `max_frame_bytes`.
//!
//! One [`Framer`] serves one stream (`stream_id`, and a kind fixed by the record type:
//! [`Metric`] → metrics frames, [`LogRecord`] → logs frames, [`SampleSeries`] → samples
//! frames). Records go in with
//! [`Framer::push`]; a frame comes out when the next record no longer fits (returned by that
//! push) or when the caller calls [`Framer::flush`]. No IO, no clock: the caller passes `now`.
//!
//! # Design
//!
//! - **Encode once, in place.** A payload is a `MetricBatch` / `LogBatch`, whose only field is
//!   `repeated … = 1`; its encoding is the concatenation of each record encoded as field 1.
//!   So each record is sized with prost's `encoded_len` and, if it fits, encoded straight
//!   after the frame's header bytes. Nothing is encoded twice and no batch is rebuilt:
//!   packing `n` records costs O(total bytes).
//! - **Limits honoured.** A frame never exceeds `max_frame_bytes` (header included) nor
//!   `max_records_per_frame`, and every record passes the same validation the decoder runs
//!   ([`crate::payload::validate_metric`], [`crate::payload::validate_log_record`]), so a
//!   collector with the same [`Limits`] accepts every frame. One bad record would otherwise
//!   cost the whole frame at the collector.
//! - **Nothing is dropped silently.** A record that cannot fit even alone, or that fails
//!   validation, is returned as a [`Rejection`] with a reason; the caller counts it (reasons
//!   `oversize`, `invalid`). [`FramerStats`] keeps running totals with the invariant
//!   `records_in == records_framed + records_open + oversize + invalid`. Every count is in
//!   [`Record::weight`]s (one per sample for a [`SampleSeries`]), as is the header's
//!   cumulative `record_count`.
//! - **Stream fields here, connection fields at send time.** The framer fills `kind`,
//!   `stream_id`, `stream_seq` (+1 per frame from a starting value), `timestamp_ns` (the `now`
//!   of the push that opened the frame), cumulative `record_count` and `payload_len`. It
//!   leaves `epoch`, `conn_seq` and the CRC32C zero: the sender assigns the connection
//!   sequence only when it holds a credit, then calls [`BuiltFrame::stamp`] (or
//!   [`crate::frame::stamp_connection`] on the bytes), which writes them and computes the
//!   CRC once. A [`BuiltFrame`] is therefore *unsealed* until stamped.

use std::fmt;
use std::marker::PhantomData;

use crate::frame::{self, FrameFlags, FrameHeader, FrameKind, HEADER_LEN};
use crate::limits::Limits;
use crate::payload::{validate_log_record, validate_metric, LogRecord, Metric, RecordError};
use crate::samples::{validate_sample_series, SampleSeries};

/// Payload field number of the records in both `MetricBatch` and `LogBatch`.
const RECORDS_FIELD: u32 = 1;

mod sealed {
    pub trait Sealed {}
    impl Sealed for crate::payload::Metric {}
    impl Sealed for crate::payload::LogRecord {}
    impl Sealed for crate::samples::SampleSeries {}
}

/// A record a [`Framer`] can pack: [`Metric`], [`LogRecord`] or [`SampleSeries`].
pub trait Record: prost::Message + sealed::Sealed {
    /// The frame kind whose payload holds this record type.
    const KIND: FrameKind;

    /// How many records this one counts as in the stream's accounting: 1, except a
    /// [`SampleSeries`], which counts one per sample ([`crate::samples`]).
    fn weight(&self) -> u32 {
        1
    }

    /// The decoder's validation for this record type.
    ///
    /// # Errors
    /// The first [`RecordError`] found.
    fn validate(&self, limits: &Limits) -> Result<(), RecordError>;
}

impl Record for Metric {
    const KIND: FrameKind = FrameKind::Metrics;
    fn validate(&self, limits: &Limits) -> Result<(), RecordError> {
        validate_metric(self, limits)
    }
}

impl Record for LogRecord {
    const KIND: FrameKind = FrameKind::Logs;
    fn validate(&self, limits: &Limits) -> Result<(), RecordError> {
        validate_log_record(self, limits)
    }
}

impl Record for SampleSeries {
    const KIND: FrameKind = FrameKind::Samples;
    fn weight(&self) -> u32 {
        SampleSeries::weight(self)
    }
    fn validate(&self, limits: &Limits) -> Result<(), RecordError> {
        validate_sample_series(self, limits)
    }
}

/// A frame produced by a [`Framer`]: stream fields filled, `epoch`, `conn_seq` and CRC32C
/// still zero until [`BuiltFrame::stamp`].
#[derive(Clone, PartialEq, Eq)]
pub struct BuiltFrame {
    bytes: Vec<u8>,
    stream_seq: u64,
    records: u32,
    record_count: u64,
}

impl fmt::Debug for BuiltFrame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BuiltFrame")
            .field("len", &self.bytes.len())
            .field("stream_seq", &self.stream_seq)
            .field("records", &self.records)
            .field("record_count", &self.record_count)
            .finish()
    }
}

impl BuiltFrame {
    /// A frame of `records` records whose header (in `bytes`) says `stream_seq` and
    /// `record_count` (for the other framers of this crate).
    pub(crate) fn from_parts(
        bytes: Vec<u8>,
        stream_seq: u64,
        records: u32,
        record_count: u64,
    ) -> Self {
        BuiltFrame {
            bytes,
            stream_seq,
            records,
            record_count,
        }
    }

    /// The frame bytes (header + payload), exactly the frame's length.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The frame bytes, consuming the frame.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    /// Frame length in bytes, header included.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Always false: a frame has at least its header.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The stream sequence given to this frame.
    pub fn stream_seq(&self) -> u64 {
        self.stream_seq
    }

    /// Records in this frame, each counted by its [`Record::weight`].
    pub fn records(&self) -> u32 {
        self.records
    }

    /// Cumulative records on the stream, this frame's included (the header's `record_count`).
    pub fn record_count(&self) -> u64 {
        self.record_count
    }

    /// Write `epoch` and `conn_seq` and fill the CRC32C: the frame is then ready to post.
    /// May be called again (e.g. a frame re-stamped after a reconnect).
    pub fn stamp(&mut self, epoch: u64, conn_seq: u64) {
        // The bytes were built by the framer with a valid header, so this cannot fail;
        // a failure would leave the frame unsealed, which the receiver's CRC check rejects.
        let _ = frame::stamp_connection(&mut self.bytes, epoch, conn_seq);
    }

    /// [`BuiltFrame::stamp`] and return the bytes.
    pub fn into_stamped(mut self, epoch: u64, conn_seq: u64) -> Vec<u8> {
        self.stamp(epoch, conn_seq);
        self.bytes
    }
}

/// Why the framer refused a record. The caller counts it under [`Rejection::reason`].
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Rejection {
    /// The record alone encodes to more than a frame's payload can hold.
    #[error(
        "record encodes to {encoded_len} bytes, a frame payload holds at most {max_payload_bytes}"
    )]
    Oversize {
        /// Encoded size of the record inside a batch (tag and length prefix included).
        encoded_len: usize,
        /// `max_frame_bytes − HEADER_LEN`.
        max_payload_bytes: usize,
    },
    /// The record fails the decoder's validation.
    #[error("invalid record: {0}")]
    Invalid(#[source] RecordError),
}

impl Rejection {
    /// A stable reason label: `oversize` or `invalid`.
    pub fn reason(&self) -> &'static str {
        match self {
            Rejection::Oversize { .. } => "oversize",
            Rejection::Invalid(_) => "invalid",
        }
    }
}

/// What [`Framer::push`] did with a record.
#[derive(Debug)]
pub enum PushOutcome {
    /// The record was appended to the open frame.
    Appended,
    /// The open frame was full: it was closed and is returned, and the record opened the
    /// next frame.
    Closed(BuiltFrame),
    /// The record was refused; nothing else changed.
    Rejected(Rejection),
}

/// Frames and refusals from [`Framer::pack`].
#[derive(Debug, Default)]
pub struct Packed {
    /// Frames in stream order.
    pub frames: Vec<BuiltFrame>,
    /// Refused records: index in the input and why.
    pub rejected: Vec<(usize, Rejection)>,
}

/// Running totals of a [`Framer`]. Invariant:
/// `records_in == records_framed + records_open + oversize + invalid`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FramerStats {
    /// Records passed to [`Framer::push`].
    pub records_in: u64,
    /// Records in closed frames (equals the last closed frame's `record_count` minus the
    /// framer's starting count, which is 0).
    pub records_framed: u64,
    /// Records in the open frame.
    pub records_open: u64,
    /// Records refused as [`Rejection::Oversize`].
    pub oversize: u64,
    /// Records refused as [`Rejection::Invalid`].
    pub invalid: u64,
    /// Frames closed, heartbeats included.
    pub frames: u64,
}

/// Why a [`Framer`] cannot be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FramerError {
    /// `max_frame_bytes` leaves no room for a payload, or exceeds what the 32-bit
    /// `payload_len` can describe.
    #[error("max_frame_bytes = {max_frame_bytes} must be in {min}..={max}")]
    FrameSize {
        /// The configured value.
        max_frame_bytes: usize,
        /// Smallest accepted value (`HEADER_LEN + 1`).
        min: usize,
        /// Largest accepted value (`HEADER_LEN + u32::MAX`).
        max: u64,
    },
    /// `max_records_per_frame` is 0.
    #[error("max_records_per_frame must be at least 1")]
    NoRecordsPerFrame,
}

struct OpenFrame {
    /// `HEADER_LEN` placeholder bytes, then the payload so far.
    buf: Vec<u8>,
    records: u32,
    /// Sum of the records' [`Record::weight`].
    weight: u32,
    timestamp_ns: u64,
}

/// Packs records of type `R` for one stream into frames. See the module docs.
pub struct Framer<R: Record> {
    stream_id: u32,
    limits: Limits,
    max_payload: usize,
    max_records: u32,
    next_stream_seq: u64,
    record_count: u64,
    open: Option<OpenFrame>,
    stats: FramerStats,
    _record: PhantomData<fn(&R)>,
}

impl<R: Record> fmt::Debug for Framer<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Framer")
            .field("kind", &R::KIND)
            .field("stream_id", &self.stream_id)
            .field("next_stream_seq", &self.next_stream_seq)
            .field("record_count", &self.record_count)
            .field("stats", &self.stats)
            .finish()
    }
}

impl<R: Record> Framer<R> {
    /// A framer for `stream_id` whose first frame gets `first_stream_seq`. The cumulative
    /// record count starts at 0 (a new framer per epoch).
    ///
    /// # Errors
    /// [`FramerError`] if `limits` allow no payload or no record per frame.
    pub fn new(
        stream_id: u32,
        first_stream_seq: u64,
        limits: Limits,
    ) -> Result<Framer<R>, FramerError> {
        let max_frame = limits.max_frame_bytes;
        let max_allowed = HEADER_LEN as u64 + u64::from(u32::MAX);
        if max_frame <= HEADER_LEN || max_frame as u64 > max_allowed {
            return Err(FramerError::FrameSize {
                max_frame_bytes: max_frame,
                min: HEADER_LEN + 1,
                max: max_allowed,
            });
        }
        if limits.max_records_per_frame == 0 {
            return Err(FramerError::NoRecordsPerFrame);
        }
        Ok(Framer {
            stream_id,
            max_payload: limits.max_payload_bytes(),
            max_records: u32::try_from(limits.max_records_per_frame).unwrap_or(u32::MAX),
            limits,
            next_stream_seq: first_stream_seq,
            record_count: 0,
            open: None,
            stats: FramerStats::default(),
            _record: PhantomData,
        })
    }

    /// The stream id.
    pub fn stream_id(&self) -> u32 {
        self.stream_id
    }

    /// The stream sequence the next closed frame will get.
    pub fn next_stream_seq(&self) -> u64 {
        self.next_stream_seq
    }

    /// Cumulative records in closed frames.
    pub fn record_count(&self) -> u64 {
        self.record_count
    }

    /// Running totals.
    pub fn stats(&self) -> FramerStats {
        self.stats
    }

    /// Whether a frame is open (holds at least one record).
    pub fn has_open_frame(&self) -> bool {
        self.open.is_some()
    }

    /// Add `record` at time `now_ns` (ns since the Unix epoch). If it does not fit the open
    /// frame, that frame is closed and returned and the record opens a new one.
    pub fn push(&mut self, record: &R, now_ns: u64) -> PushOutcome {
        let weight = record.weight();
        self.stats.records_in += u64::from(weight);
        let entry_len = prost::encoding::message::encoded_len(RECORDS_FIELD, record);
        if entry_len > self.max_payload {
            self.stats.oversize += u64::from(weight);
            return PushOutcome::Rejected(Rejection::Oversize {
                encoded_len: entry_len,
                max_payload_bytes: self.max_payload,
            });
        }
        if let Err(e) = record.validate(&self.limits) {
            self.stats.invalid += u64::from(weight);
            return PushOutcome::Rejected(Rejection::Invalid(e));
        }
        let fits = self.open.as_ref().is_some_and(|open| {
            open.records < self.max_records
                && open.weight.checked_add(weight).is_some()
                && open.buf.len() - HEADER_LEN + entry_len <= self.max_payload
        });
        let closed = if fits {
            None
        } else {
            self.close(FrameFlags::EMPTY)
        };
        let open = self.open.get_or_insert_with(|| {
            let mut buf = Vec::with_capacity(HEADER_LEN + self.max_payload);
            buf.resize(HEADER_LEN, 0);
            OpenFrame {
                buf,
                records: 0,
                weight: 0,
                timestamp_ns: now_ns,
            }
        });
        prost::encoding::message::encode(RECORDS_FIELD, record, &mut open.buf);
        open.records += 1;
        open.weight += weight;
        self.stats.records_open += u64::from(weight);
        match closed {
            Some(frame) => PushOutcome::Closed(frame),
            None => PushOutcome::Appended,
        }
    }

    /// Close the open frame, if any, and return it.
    pub fn flush(&mut self) -> Option<BuiltFrame> {
        self.close(FrameFlags::EMPTY)
    }

    /// Close the stream for this epoch: the open frame, or an empty frame of the stream's
    /// kind if none is open, is closed with [`FrameFlags::LAST_OF_EPOCH`]. An empty frame
    /// opened here is stamped `now_ns`.
    pub fn finish_epoch(&mut self, now_ns: u64) -> BuiltFrame {
        let open = self.open.take().unwrap_or_else(|| OpenFrame {
            buf: vec![0; HEADER_LEN],
            records: 0,
            weight: 0,
            timestamp_ns: now_ns,
        });
        self.close_frame(open, FrameFlags::LAST_OF_EPOCH)
    }

    /// A heartbeat frame on this stream (kind heartbeat, empty payload) at `now_ns`. It
    /// takes the next stream sequence and carries the current cumulative record count, so
    /// the collector sees an idle stream's frames lost. The open frame stays open.
    pub fn heartbeat(&mut self, now_ns: u64) -> BuiltFrame {
        let mut buf = vec![0; HEADER_LEN];
        let header = FrameHeader {
            timestamp_ns: now_ns,
            ..self.header(
                FrameKind::Heartbeat,
                FrameFlags::EMPTY,
                0,
                self.record_count,
            )
        };
        // `buf` is HEADER_LEN bytes: emit cannot fail.
        let _ = header.emit(&mut buf);
        self.stats.frames += 1;
        let stream_seq = self.take_stream_seq();
        BuiltFrame {
            bytes: buf,
            stream_seq,
            records: 0,
            record_count: self.record_count,
        }
    }

    /// Push every record of `records` at `now_ns`, then flush. Refused records are listed
    /// with their index in `records`.
    pub fn pack<'a, I>(&mut self, records: I, now_ns: u64) -> Packed
    where
        I: IntoIterator<Item = &'a R>,
        R: 'a,
    {
        let mut packed = Packed::default();
        for (index, record) in records.into_iter().enumerate() {
            match self.push(record, now_ns) {
                PushOutcome::Appended => {}
                PushOutcome::Closed(frame) => packed.frames.push(frame),
                PushOutcome::Rejected(why) => packed.rejected.push((index, why)),
            }
        }
        packed.frames.extend(self.flush());
        packed
    }

    fn take_stream_seq(&mut self) -> u64 {
        let seq = self.next_stream_seq;
        self.next_stream_seq = seq.wrapping_add(1);
        seq
    }

    fn header(
        &self,
        kind: FrameKind,
        flags: FrameFlags,
        payload_len: u32,
        record_count: u64,
    ) -> FrameHeader {
        FrameHeader {
            kind,
            flags,
            stream_id: self.stream_id,
            payload_len,
            epoch: 0,
            conn_seq: 0,
            stream_seq: self.next_stream_seq,
            timestamp_ns: 0,
            record_count,
        }
    }

    fn close(&mut self, flags: FrameFlags) -> Option<BuiltFrame> {
        let open = self.open.take()?;
        Some(self.close_frame(open, flags))
    }

    fn close_frame(&mut self, open: OpenFrame, flags: FrameFlags) -> BuiltFrame {
        let OpenFrame {
            mut buf,
            weight: records,
            timestamp_ns,
            ..
        } = open;
        // The payload never exceeds `max_payload`, which `new` bounded by `u32::MAX`.
        let payload_len = u32::try_from(buf.len() - HEADER_LEN).unwrap_or(u32::MAX);
        let record_count = self.record_count + u64::from(records);
        let header = FrameHeader {
            timestamp_ns,
            ..self.header(R::KIND, flags, payload_len, record_count)
        };
        // `buf` starts with HEADER_LEN placeholder bytes: emit cannot fail.
        let _ = header.emit(&mut buf);
        self.record_count = record_count;
        self.stats.records_open -= u64::from(records);
        self.stats.records_framed += u64::from(records);
        self.stats.frames += 1;
        let stream_seq = self.take_stream_seq();
        BuiltFrame {
            bytes: buf,
            stream_seq,
            records,
            record_count,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{decode_frame, Frame, FrameError, Payload};
    use crate::payload::{Label, MetricType};

    fn metric(i: usize) -> Metric {
        Metric {
            name: "node_cpu_seconds_total".into(),
            help: String::new(),
            r#type: MetricType::Counter as i32,
            labels: vec![
                Label {
                    name: "cpu".into(),
                    value: i.to_string(),
                },
                Label {
                    name: "mode".into(),
                    value: "idle".into(),
                },
            ],
            value: 1234.5 + i as f64,
            ..Default::default()
        }
    }

    #[test]
    fn packs_into_frames_that_decode() {
        let limits = Limits {
            max_frame_bytes: 512,
            ..Limits::default()
        };
        let mut framer = Framer::<Metric>::new(7, 100, limits.clone()).unwrap();
        let input: Vec<Metric> = (0..100).map(metric).collect();
        let packed = framer.pack(&input, 42);
        assert!(packed.rejected.is_empty());
        assert!(packed.frames.len() > 1);
        let mut out = Vec::new();
        for (i, f) in packed.frames.into_iter().enumerate() {
            assert!(f.len() <= 512);
            assert_eq!(f.stream_seq(), 100 + i as u64);
            let bytes = f.into_stamped(9, 1000 + i as u64);
            let d = decode_frame(&bytes, &limits).unwrap();
            assert_eq!(d.header.epoch, 9);
            assert_eq!(d.header.conn_seq, 1000 + i as u64);
            assert_eq!(d.header.timestamp_ns, 42);
            let Payload::Metrics(batch) = d.payload else {
                panic!("kind")
            };
            out.extend(batch.metrics);
            assert_eq!(d.header.record_count, out.len() as u64);
        }
        assert_eq!(out, input);
        let s = framer.stats();
        assert_eq!(s.records_in, 100);
        assert_eq!(s.records_framed, 100);
    }

    #[test]
    fn unstamped_frame_fails_crc() {
        let mut framer = Framer::<Metric>::new(1, 0, Limits::default()).unwrap();
        assert!(matches!(framer.push(&metric(0), 1), PushOutcome::Appended));
        let f = framer.flush().unwrap();
        let err = decode_frame(f.bytes(), &Limits::default()).unwrap_err();
        assert!(matches!(
            err,
            crate::frame::DecodeError::Frame(FrameError::BadCrc { .. })
        ));
    }

    #[test]
    fn oversize_and_invalid_records_are_rejected_and_counted() {
        let limits = Limits {
            max_frame_bytes: 128,
            ..Limits::default()
        };
        let mut framer = Framer::<LogRecord>::new(1, 0, limits).unwrap();
        let big = LogRecord {
            message: "x".repeat(200),
            ..Default::default()
        };
        let bad = LogRecord {
            severity: 99,
            ..Default::default()
        };
        let ok = LogRecord {
            message: "hello".into(),
            ..Default::default()
        };
        let packed = framer.pack([&big, &ok, &bad], 5);
        assert_eq!(packed.rejected.len(), 2);
        assert_eq!(packed.rejected[0].0, 0);
        assert_eq!(packed.rejected[0].1.reason(), "oversize");
        assert_eq!(packed.rejected[1].0, 2);
        assert_eq!(packed.rejected[1].1.reason(), "invalid");
        assert_eq!(packed.frames.len(), 1);
        let s = framer.stats();
        assert_eq!(
            (s.records_in, s.records_framed, s.oversize, s.invalid),
            (3, 1, 1, 1)
        );
    }

    #[test]
    fn max_records_per_frame_closes_frames() {
        let limits = Limits {
            max_records_per_frame: 3,
            ..Limits::default()
        };
        let mut framer = Framer::<Metric>::new(1, 0, limits).unwrap();
        let input: Vec<Metric> = (0..7).map(metric).collect();
        let packed = framer.pack(&input, 0);
        let counts: Vec<u32> = packed.frames.iter().map(BuiltFrame::records).collect();
        assert_eq!(counts, vec![3, 3, 1]);
        let cumulative: Vec<u64> = packed.frames.iter().map(BuiltFrame::record_count).collect();
        assert_eq!(cumulative, vec![3, 6, 7]);
    }

    #[test]
    fn finish_epoch_and_heartbeat() {
        let mut framer = Framer::<Metric>::new(3, 0, Limits::default()).unwrap();
        let hb = framer.heartbeat(10);
        assert_eq!(hb.stream_seq(), 0);
        let f = Frame::new_checked(hb.bytes()).unwrap();
        assert_eq!(f.kind(), FrameKind::Heartbeat);
        assert_eq!(f.payload_len(), 0);
        let _ = framer.push(&metric(1), 11);
        let last = framer.finish_epoch(12);
        assert_eq!(last.stream_seq(), 1);
        assert_eq!(last.records(), 1);
        let bytes = last.into_stamped(1, 1);
        let d = decode_frame(&bytes, &Limits::default()).unwrap();
        assert!(d.header.flags.contains(FrameFlags::LAST_OF_EPOCH));
        // Nothing open: an empty frame carries the flag.
        let empty = framer.finish_epoch(13).into_stamped(1, 2);
        let d = decode_frame(&empty, &Limits::default()).unwrap();
        assert_eq!(d.payload, Payload::Metrics(Default::default()));
        assert_eq!(d.header.stream_seq, 2);
        assert_eq!(d.header.record_count, 1);
    }

    #[test]
    fn bad_frame_size_is_refused() {
        let limits = Limits {
            max_frame_bytes: HEADER_LEN,
            ..Limits::default()
        };
        assert!(matches!(
            Framer::<Metric>::new(1, 0, limits),
            Err(FramerError::FrameSize { .. })
        ));
        let limits = Limits {
            max_records_per_frame: 0,
            ..Limits::default()
        };
        assert_eq!(
            Framer::<Metric>::new(1, 0, limits).unwrap_err(),
            FramerError::NoRecordsPerFrame
        );
    }

    #[test]
    fn sample_series_count_one_record_per_sample() {
        let series = |n: u64| crate::samples::SampleSeries {
            name: "x_total".into(),
            r#type: MetricType::Counter as i32,
            start_us: 1_000_000,
            offsets_us: (0..n).map(|i| i * 10_000).collect(),
            values: (0..n).map(|i| i as f64).collect(),
            ..Default::default()
        };
        let mut f = Framer::<crate::samples::SampleSeries>::new(3, 0, Limits::default()).unwrap();
        let packed = f.pack([&series(20), &series(5)], 7);
        assert!(packed.rejected.is_empty());
        assert_eq!(packed.frames.len(), 1);
        assert_eq!(packed.frames[0].records(), 25);
        assert_eq!(packed.frames[0].record_count(), 25);
        let bytes = packed.frames[0].clone().into_stamped(1, 0);
        let d = decode_frame(&bytes, &Limits::default()).unwrap();
        assert_eq!(d.header.kind, FrameKind::Samples);
        assert_eq!(d.header.record_count, 25);
        assert_eq!(d.payload.record_count(), 25);
        // A refused series counts its samples too.
        let mut bad = series(4);
        bad.offsets_us.pop();
        assert!(matches!(
            f.push(&bad, 8),
            PushOutcome::Rejected(Rejection::Invalid(_))
        ));
        let s = f.stats();
        assert_eq!((s.records_in, s.records_framed, s.invalid), (29, 25, 4));
    }
}
