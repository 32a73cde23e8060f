//! The series dictionary: metrics frames that carry values only (`kind = metrics_dict`).
//!
//! Per agent epoch and stream, each series (name, labels, type, help and, for a histogram,
//! its bucket bounds) gets a small integer id the first time it is framed. A frame carries
//! `(id, timestamp, value)` records; a series' **definition** travels in-band, in a record
//! of the same frame as its first value, until the collector acknowledges it. The
//! acknowledgment (`DictAck` on the control channel, [`crate::control::DictAck`]) says
//! "every id below `known_up_to` is known" (a contiguous prefix); only then does the agent
//! send the series' values without its definition. So a frame references only ids the
//! collector holds already or defines them itself, and every frame decodes on its own: a
//! lost, duplicated or reordered frame costs only its own samples, never the meaning of a
//! later one (the rule of QPACK, RFC 9204 §2.1.2: an encoder references a dynamic-table
//! entry only once the decoder acknowledged it; OVIS LDMS sends a metric set's metadata
//! once and then only its data chunk).
//!
//! The dictionary lives as long as the epoch: a new epoch (reconnect, collector restart)
//! starts an empty one on both sides, and a collector never forgets an entry within its
//! epoch. Entries are never redefined: the same id with another definition in one epoch is
//! a malformed payload ([`DictError::Conflict`]).
//!
//! # Body (version 1)
//!
//! ```text
//! body    = version:u8 (= 1) record*
//! record  = key:varint [timestamp:zigzag-varint] operand
//! key     = zigzag(id − (previous id in this frame + 1)) << 4 | flags     (first: previous = −1)
//! flags   = op (bits 0..=2) | HAS_TIMESTAMP (bit 3)
//! op 0    f64, 8 bytes little-endian
//! op 1    a non-negative integer value: varint
//! op 2    a negative integer value: varint of its magnitude
//! op 3    histogram: count:varint sum:f64 buckets:varint then, per bucket (as many as
//!         the definition has bounds), the increase of the cumulative count over the
//!         previous bucket: varint
//! op 4..6 a decimal: zigzag-varint m, value = m / 10^(op − 3) (only where that division
//!         gives the value bit for bit)
//! op 7    definition: type:varint name:str help:str labels:varint (name:str value:str)*
//!         and, for a histogram, bounds:varint f64* (no timestamp flag)
//! str     = length:varint UTF-8 bytes
//! ```
//!
//! A timestamp is the sample's own time in ms as the difference to the frame header's
//! `timestamp_ns` in ms (absent: the frame's time, `Metric::timestamp_ms` 0). Varints are
//! protobuf's base-128 varints (at most 10 bytes), zigzag as protobuf's `sint64`. Every
//! value record counts one record (one sample) in the stream's accounting; a definition
//! counts none.
//!
//! Ids below [`MAX_DICT_ENTRIES`] are entries of the epoch's dictionary; ids at or above it
//! are **frame-local**: defined in the frame that uses them, never stored, never
//! acknowledged (an agent whose dictionary is full still sends every series, each with its
//! definition, so no collector holds more than [`MAX_DICT_ENTRIES`] entries per stream).
//!
//! Layout: this module holds the format (parsing, [`Definition`]); `encode` the agent's
//! [`DictFramer`]; `decode` the collector's [`SeriesDict`].

mod decode;
mod encode;
#[cfg(test)]
mod tests;

pub use decode::{resolve_owned, KnownValue, SeriesDict};
pub use encode::DictFramer;

use crate::limits::Limits;
use crate::payload::{check_metric, Bucket, Label, MetricParts, MetricType, RecordError};

/// The body version this crate reads and writes.
pub const DICT_BODY_VERSION: u8 = 1;
/// Most dictionary entries per epoch and stream; ids from here on are frame-local.
pub const MAX_DICT_ENTRIES: u32 = 1 << 16;

pub(crate) const OP_F64: u8 = 0;
pub(crate) const OP_UINT: u8 = 1;
pub(crate) const OP_NEG: u8 = 2;
pub(crate) const OP_HIST: u8 = 3;
pub(crate) const OP_DEC1: u8 = 4;
pub(crate) const OP_DEF: u8 = 7;
pub(crate) const HAS_TIMESTAMP: u8 = 8;

pub use crate::payload::DictError;

/// A series definition borrowed from a body (or from the agent's own dictionary).
#[derive(Clone, Debug, PartialEq)]
pub struct Definition<'a> {
    /// Metric name.
    pub name: &'a str,
    /// HELP text.
    pub help: &'a str,
    /// [`MetricType`] value.
    pub r#type: i32,
    /// Labels, in the order sent.
    pub labels: Vec<crate::borrowed::LabelView<'a>>,
    /// Histogram bucket bounds as buckets with count 0 (empty for other types).
    pub buckets: Vec<Bucket>,
}

impl<'a> MetricParts for Definition<'a> {
    type Label = crate::borrowed::LabelView<'a>;
    fn name(&self) -> &str {
        self.name
    }
    fn help(&self) -> &str {
        self.help
    }
    fn kind(&self) -> i32 {
        self.r#type
    }
    fn labels(&self) -> &[Self::Label] {
        &self.labels
    }
    fn buckets(&self) -> &[Bucket] {
        &self.buckets
    }
    fn value(&self) -> f64 {
        0.0
    }
    fn count(&self) -> u64 {
        0
    }
    fn sum(&self) -> f64 {
        0.0
    }
}

impl Definition<'_> {
    /// True for a histogram definition.
    pub fn is_histogram(&self) -> bool {
        self.r#type == MetricType::Histogram as i32
    }

    /// The owned labels.
    pub fn owned_labels(&self) -> Vec<Label> {
        self.labels
            .iter()
            .map(|l| Label {
                name: l.name.to_owned(),
                value: l.value.to_owned(),
            })
            .collect()
    }
}

/// A value record's operand.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Operand {
    /// Counter, gauge or untyped value.
    Scalar(f64),
    /// Histogram: count, sum and the range of its cumulative counts in the counts vector.
    Histogram {
        count: u64,
        sum: f64,
        counts: (u32, u32),
    },
}

/// One value record of a body.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct ValueRecord {
    pub(crate) id: u32,
    /// Own timestamp, ms since the Unix epoch; 0: the frame's.
    pub(crate) timestamp_ms: i64,
    pub(crate) operand: Operand,
}

/// A body parsed: definitions (in order) and value records, histogram bucket increases in
/// `counts`. Histogram counts are checked against their definitions at resolution.
#[derive(Debug)]
pub(crate) struct Parsed<'a, 'v> {
    pub(crate) defs: &'v mut Vec<(u32, Definition<'a>)>,
    pub(crate) values: &'v mut Vec<ValueRecord>,
    pub(crate) counts: &'v mut Vec<u64>,
}

/// A reader over a body that knows its offset, for errors.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf, at: 0 }
    }

    fn truncated(&self) -> DictError {
        DictError::Truncated { offset: self.at }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.at >= self.buf.len()
    }

    pub(crate) fn byte(&mut self) -> Result<u8, DictError> {
        let b = *self.buf.get(self.at).ok_or_else(|| self.truncated())?;
        self.at += 1;
        Ok(b)
    }

    /// A protobuf varint; one byte (an id delta, a small value) without a loop.
    #[inline]
    pub(crate) fn varint(&mut self) -> Result<u64, DictError> {
        match self.buf.get(self.at) {
            Some(&b) if b < 0x80 => {
                self.at += 1;
                Ok(u64::from(b))
            }
            _ => self.long_varint(),
        }
    }

    fn long_varint(&mut self) -> Result<u64, DictError> {
        let mut value = 0u64;
        for i in 0..10 {
            let b = self.byte()?;
            value |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(self.truncated())
    }

    pub(crate) fn f64(&mut self) -> Result<f64, DictError> {
        let end = self.at.checked_add(8).ok_or_else(|| self.truncated())?;
        let bytes = self.buf.get(self.at..end).ok_or_else(|| self.truncated())?;
        let mut a = [0u8; 8];
        a.copy_from_slice(bytes);
        self.at = end;
        Ok(f64::from_le_bytes(a))
    }

    /// A length-prefixed string; the length is trusted only as far as the body goes (a
    /// string longer than its limit is refused by validation).
    pub(crate) fn str(&mut self) -> Result<&'a str, DictError> {
        let len = self.varint()?;
        let start = self.at;
        let len = usize::try_from(len).map_err(|_| self.truncated())?;
        let end = start.checked_add(len).ok_or_else(|| self.truncated())?;
        let bytes = self.buf.get(start..end).ok_or_else(|| self.truncated())?;
        self.at = end;
        std::str::from_utf8(bytes).map_err(|_| DictError::Utf8 { offset: start })
    }
}

/// The id of a record whose key is `key`, after a record of id `previous` (−1 for the
/// first): `None` outside `0..u32::MAX`.
#[inline]
pub(crate) fn next_id(previous: i64, key: u64) -> Option<u32> {
    previous
        .checked_add(1)
        .and_then(|p| p.checked_add(unzigzag(key >> 4)))
        .filter(|id| (0..i64::from(u32::MAX)).contains(id))
        .map(|id| id as u32)
}

/// The operand of a counter, gauge or untyped value record of op `op` (`OP_F64`,
/// `OP_UINT`, `OP_NEG`, or a decimal `OP_DEC1..=6`; not `OP_HIST` or `OP_DEF`).
#[inline]
pub(crate) fn scalar(r: &mut Reader<'_>, op: u8) -> Result<f64, DictError> {
    Ok(match op {
        OP_F64 => r.f64()?,
        OP_UINT => r.varint()? as f64,
        OP_NEG => -(r.varint()? as f64),
        k => unzigzag(r.varint()?) as f64 / pow10(k.saturating_sub(3)),
    })
}

/// Zigzag decoding (protobuf `sint64`).
pub(crate) fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// Zigzag encoding (protobuf `sint64`).
pub(crate) fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

/// `10^k` for the decimal ops (k = 1..=3).
pub(crate) fn pow10(k: u8) -> f64 {
    match k {
        1 => 10.0,
        2 => 100.0,
        _ => 1000.0,
    }
}

/// The frame's time in ms, the base of the records' timestamps.
pub(crate) fn frame_ms(frame_timestamp_ns: u64) -> i64 {
    i64::try_from(frame_timestamp_ns / 1_000_000).unwrap_or(i64::MAX)
}

fn payload_error(e: DictError) -> crate::payload::PayloadError {
    crate::payload::PayloadError::Dictionary(e)
}

/// Parses one definition (after its key) and validates it with the metric rules.
fn definition<'a>(
    r: &mut Reader<'a>,
    limits: &Limits,
    index: usize,
) -> Result<Definition<'a>, crate::payload::PayloadError> {
    let r#type = r.varint().map_err(payload_error)? as i32;
    let name = r.str().map_err(payload_error)?;
    let help = r.str().map_err(payload_error)?;
    let n = r.varint().map_err(payload_error)?;
    let record = |source: RecordError| crate::payload::PayloadError::Record { index, source };
    limits
        .check(
            crate::limits::Limit::Labels,
            usize::try_from(n).unwrap_or(usize::MAX),
        )
        .map_err(|e| record(e.into()))?;
    let mut labels = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let name = r.str().map_err(payload_error)?;
        let value = r.str().map_err(payload_error)?;
        labels.push(crate::borrowed::LabelView { name, value });
    }
    let mut buckets = Vec::new();
    if r#type == MetricType::Histogram as i32 {
        let n = r.varint().map_err(payload_error)?;
        limits
            .check(
                crate::limits::Limit::Buckets,
                usize::try_from(n).unwrap_or(usize::MAX),
            )
            .map_err(|e| record(e.into()))?;
        for _ in 0..n {
            let upper_bound = r.f64().map_err(payload_error)?;
            buckets.push(Bucket {
                upper_bound,
                cumulative_count: 0,
            });
        }
    }
    let def = Definition {
        name,
        help,
        r#type,
        labels,
        buckets,
    };
    check_metric(&def, limits).map_err(record)?;
    Ok(def)
}

/// Parses `body` (a dictionary body) of a frame stamped `frame_timestamp_ns` into `out`:
/// every record read, every definition validated with the metric rules and `limits`, at
/// most `limits.max_records_per_frame` value records. Ids are not resolved here.
///
/// # Errors
/// [`crate::payload::PayloadError::Dictionary`] for a malformed body,
/// [`crate::payload::PayloadError::Record`] for an invalid definition (index: its record's
/// position), [`crate::payload::PayloadError::Batch`] for too many records or bytes.
pub(crate) fn parse<'a>(
    body: &'a [u8],
    frame_timestamp_ns: u64,
    limits: &Limits,
    out: Parsed<'a, '_>,
) -> Result<(), crate::payload::PayloadError> {
    use crate::limits::Limit;
    use crate::payload::PayloadError;
    out.defs.clear();
    out.values.clear();
    out.counts.clear();
    limits
        .check(
            Limit::FrameBytes,
            body.len().saturating_add(crate::frame::HEADER_LEN),
        )
        .map_err(PayloadError::Batch)?;
    let mut r = Reader::new(body);
    match r.byte() {
        Ok(DICT_BODY_VERSION) => {}
        Ok(v) => return Err(payload_error(DictError::Version { found: Some(v) })),
        Err(_) => return Err(payload_error(DictError::Version { found: None })),
    }
    let base = frame_ms(frame_timestamp_ns);
    let mut previous: i64 = -1;
    let mut index = 0usize;
    while !r.is_empty() {
        let offset = r.at;
        let key = r.varint().map_err(payload_error)?;
        let flags = (key & 0xf) as u8;
        let id = next_id(previous, key).ok_or(payload_error(DictError::BadId { offset }))?;
        previous = i64::from(id);
        let op = flags & 7;
        if op == OP_DEF {
            if flags & HAS_TIMESTAMP != 0 {
                return Err(payload_error(DictError::TimestampOnDefinition { id }));
            }
            let def = definition(&mut r, limits, index)?;
            out.defs.push((id, def));
            index += 1;
            continue;
        }
        let timestamp_ms = if flags & HAS_TIMESTAMP != 0 {
            base.saturating_add(unzigzag(r.varint().map_err(payload_error)?))
        } else {
            0
        };
        let operand = match op {
            OP_HIST => {
                let count = r.varint().map_err(payload_error)?;
                let sum = r.f64().map_err(payload_error)?;
                let start = u32::try_from(out.counts.len()).unwrap_or(u32::MAX);
                Operand::Histogram {
                    count,
                    sum,
                    counts: (start, start),
                }
            }
            op => Operand::Scalar(scalar(&mut r, op).map_err(payload_error)?),
        };
        out.values.push(ValueRecord {
            id,
            timestamp_ms,
            operand,
        });
        index += 1;
        if let Operand::Histogram { .. } = operand {
            // The bucket increases follow; their number is the definition's, which may be
            // in this frame (parsed) or known to the receiver: read them at resolution.
            // To keep parsing independent of the receiver, a histogram value carries its
            // bucket count first.
            let n = r.varint().map_err(payload_error)?;
            limits
                .check(Limit::Buckets, usize::try_from(n).unwrap_or(usize::MAX))
                .map_err(|e| PayloadError::Record {
                    index: index - 1,
                    source: e.into(),
                })?;
            for _ in 0..n {
                let inc = r.varint().map_err(payload_error)?;
                out.counts.push(inc);
            }
            let end = u32::try_from(out.counts.len()).unwrap_or(u32::MAX);
            if let Some(ValueRecord {
                operand: Operand::Histogram { counts, .. },
                ..
            }) = out.values.last_mut()
            {
                counts.1 = end;
            }
        }
    }
    if out.values.len() > limits.max_records_per_frame {
        return limits
            .check(Limit::RecordsPerFrame, out.values.len())
            .map_err(PayloadError::Batch);
    }
    Ok(())
}

/// Definitions and value records in a dictionary body, without resolving any id (for
/// printing a frame); `None` when the body does not parse under `limits`.
pub fn body_counts(body: &[u8], limits: &Limits) -> Option<(usize, usize)> {
    let (mut defs, mut values, mut counts) = (Vec::new(), Vec::new(), Vec::new());
    parse(
        body,
        0,
        limits,
        Parsed {
            defs: &mut defs,
            values: &mut values,
            counts: &mut counts,
        },
    )
    .ok()?;
    Some((defs.len(), values.len()))
}

/// [`crate::frame::decode_frame`] for a `metrics_dict` frame read alone: the series it
/// defines itself only (every frame before the collector's first acknowledgment).
///
/// # Errors
/// As [`crate::frame::decode_frame`]; a value of a series the frame does not define is
/// [`DictError::UnknownSeries`].
pub fn decode_frame_alone(
    buf: &[u8],
    limits: &Limits,
) -> Result<crate::frame::DecodedFrame, crate::frame::DecodeError> {
    use crate::frame::{DecodeError, DecodedFrame, Frame, FrameError, Payload};
    let frame = Frame::new_checked(buf)?;
    if frame.frame_len() > limits.max_frame_bytes {
        return Err(FrameError::TooLarge {
            frame_len: frame.frame_len(),
            max_frame_bytes: limits.max_frame_bytes,
        }
        .into());
    }
    frame.check_crc()?;
    let header = frame.header();
    resolve_owned(frame.payload(), header.timestamp_ns, limits, &|_| None)
        .map(|metrics| DecodedFrame {
            header,
            payload: Payload::Metrics(crate::payload::MetricBatch { metrics }),
        })
        .map_err(|source| DecodeError::Payload {
            kind: header.kind.as_str(),
            stream_id: header.stream_id,
            stream_seq: header.stream_seq,
            source,
        })
}
