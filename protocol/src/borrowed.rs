//! Zero-copy decoding of metric batches: the protobuf wire format of `MetricBatch`
//! (`proto/uctel.proto`, the [`crate::payload`] types) parsed directly over the payload
//! bytes, yielding `&str` views instead of allocating a `String` per name, help text,
//! label name and label value.
//!
//! [`MetricBatchView::decode_into`] accepts exactly the payloads that
//! [`crate::payload::decode_metric_batch`] accepts and returns the same value (as views) or
//! the same [`PayloadError`]: the same bounds ([`Limits`]), the same per-record rules (one
//! shared implementation, [`crate::payload::validate_metric`] and [`validate_metric_view`]),
//! the same protobuf reading as prost's generated decoder (last value wins for a repeated
//! scalar or string field, repeated messages append, unknown fields and groups skipped with
//! prost's recursion limit of 100, strings checked as UTF-8; protobuf language guide,
//! "Encoding"), and the same order of errors (malformed protobuf anywhere in the payload,
//! then the record count, then the first invalid record). A property test compares both
//! decoders on arbitrary and corrupted batches.
//!
//! Layout: [`MetricBatchView`] owns three vectors (metrics, labels of all metrics, buckets
//! of all metrics) of borrowed entries. A receiver keeps one per connection and moves it
//! from one payload to the next with [`MetricBatchView::recycle`], so the steady state
//! allocates nothing per frame. It also remembers the records it decoded, by position: a
//! record that repeats one of the previous payload's byte for byte except for its `value`
//! (an agent sends the same series in the same order every frame) is taken from there
//! without being parsed and validated again. A payload that repeats the previous one
//! whole (only the values changed) is not even turned into views until a consumer asks for
//! them: [`MetricBatchView::repeated`] gives each record's id, type and value, which is all
//! a consumer that keeps what it derived from each record by id needs (the collector's
//! series store).
//!
//! Malformed protobuf is the cold path: the parser only notes *that* the input is malformed
//! and asks prost's decoder for the error, so the error value (with prost's field path) is
//! exactly the owned decoder's.

use std::cell::OnceCell;
use std::sync::atomic::{AtomicU64, Ordering};

use prost::encoding::WireType;

use crate::limits::{Limit, Limits};
use crate::payload::{
    check_metric, decode_metric_batch, Bucket, Label, LabelParts, Metric, MetricBatch, MetricParts,
    PayloadError, RecordError,
};

/// prost's decode recursion limit (`prost::RECURSION_LIMIT`, not exported): nested
/// messages and groups deeper than this are rejected.
const RECURSION_LIMIT: u32 = 100;

/// A `name="value"` label borrowed from a payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LabelView<'a> {
    /// The label name.
    pub name: &'a str,
    /// The label value.
    pub value: &'a str,
}

impl LabelParts for LabelView<'_> {
    fn name(&self) -> &str {
        self.name
    }
    fn value(&self) -> &str {
        self.value
    }
}

/// One metric record borrowed from a payload: the fields of [`Metric`], strings as views.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MetricView<'a> {
    /// Metric name.
    pub name: &'a str,
    /// HELP text.
    pub help: &'a str,
    /// [`crate::payload::MetricType`] value (validated: counter, gauge, histogram or untyped).
    pub r#type: i32,
    /// Labels in payload order (validated: unique names).
    pub labels: &'a [LabelView<'a>],
    /// Counter or gauge value.
    pub value: f64,
    /// Milliseconds since the Unix epoch; 0 means the frame's timestamp.
    pub timestamp_ms: i64,
    /// Histogram buckets (validated: increasing bounds, cumulative counts).
    pub buckets: &'a [Bucket],
    /// Histogram count.
    pub count: u64,
    /// Histogram sum.
    pub sum: f64,
}

impl MetricView<'_> {
    /// The same record as an owned [`Metric`] (allocates).
    pub fn to_metric(&self) -> Metric {
        Metric {
            name: self.name.to_owned(),
            help: self.help.to_owned(),
            r#type: self.r#type,
            labels: self
                .labels
                .iter()
                .map(|l| Label {
                    name: l.name.to_owned(),
                    value: l.value.to_owned(),
                })
                .collect(),
            value: self.value,
            timestamp_ms: self.timestamp_ms,
            buckets: self.buckets.to_vec(),
            count: self.count,
            sum: self.sum,
        }
    }
}

impl<'v> MetricParts for MetricView<'v> {
    type Label = LabelView<'v>;
    fn name(&self) -> &str {
        self.name
    }
    fn help(&self) -> &str {
        self.help
    }
    fn kind(&self) -> i32 {
        self.r#type
    }
    fn labels(&self) -> &[LabelView<'v>] {
        self.labels
    }
    fn buckets(&self) -> &[Bucket] {
        self.buckets
    }
    fn value(&self) -> f64 {
        self.value
    }
    fn count(&self) -> u64 {
        self.count
    }
    fn sum(&self) -> f64 {
        self.sum
    }
    fn timestamp_ms(&self) -> i64 {
        self.timestamp_ms
    }
}

/// Check one borrowed metric: the rules of [`crate::payload::validate_metric`] (one
/// implementation for both).
///
/// # Errors
/// The first [`RecordError`] found.
pub fn validate_metric_view(metric: &MetricView<'_>, limits: &Limits) -> Result<(), RecordError> {
    check_metric(metric, limits)
}

/// Names one record's fields other than its value: two records with the same id have the
/// same name, help, type and labels, and no histogram fields
/// ([`MetricBatchView::iter_with_ids`]); two remembered by the memo also the same timestamp
/// ([`MetricBatchView::repeated`]). Ids are unique in the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RecordId(u64);

/// The next [`RecordId`] (0 is none).
static NEXT_RECORD_ID: AtomicU64 = AtomicU64::new(1);

impl RecordId {
    /// A new id, unique in the process (for a record source other than the memo: a
    /// series-dictionary entry, `dict::SeriesDict`).
    pub fn fresh() -> RecordId {
        RecordId(NEXT_RECORD_ID.fetch_add(1, Ordering::Relaxed))
    }
}

/// The fields of one record other than its labels and buckets, for
/// [`MetricBatchView::push_record`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PushRecord<'a> {
    /// Its [`RecordId`], when its name, help, type and labels are those of every other
    /// record with that id.
    pub id: Option<RecordId>,
    /// Metric name.
    pub name: &'a str,
    /// HELP text.
    pub help: &'a str,
    /// [`crate::payload::MetricType`] value.
    pub r#type: i32,
    /// Counter or gauge value.
    pub value: f64,
    /// Milliseconds since the Unix epoch; 0 means the frame's timestamp.
    pub timestamp_ms: i64,
    /// Histogram count.
    pub count: u64,
    /// Histogram sum.
    pub sum: f64,
}

/// A metric as stored in the batch: labels and buckets as ranges of the shared vectors.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Entry<'a> {
    /// [`RecordId`] of a remembered record, 0 for none.
    id: u64,
    name: &'a str,
    help: &'a str,
    r#type: i32,
    labels: (u32, u32),
    value: f64,
    timestamp_ms: i64,
    buckets: (u32, u32),
    count: u64,
    sum: f64,
}

/// A decoded `MetricBatch` whose strings borrow from the payload (`'a`). It only ever holds
/// validated records (empty after a failed decode).
///
/// Reuse one per connection: [`MetricBatchView::decode_into`] clears it and decodes the
/// next payload; [`MetricBatchView::recycle`] moves the (empty) allocations to a view of
/// another payload's lifetime, so a receiver can keep a `MetricBatchView<'static>` between
/// frames.
#[derive(Clone, Debug, Default)]
pub struct MetricBatchView<'a> {
    metrics: Vec<Entry<'a>>,
    labels: Vec<LabelView<'a>>,
    buckets: Vec<Bucket>,
    /// The records of earlier payloads, by position ([`Memo`]).
    memo: Memo,
    /// The payload, when it was the memo's last payload again with new values
    /// ([`MetricBatchView::repeated`]): its records are the memo's, and `metrics` and
    /// `labels` stay empty; views of them are built into `built` when first asked for.
    repeat: Option<&'a [u8]>,
    built: OnceCell<Built<'a>>,
}

/// The views of a repeated payload's records ([`MetricBatchView::repeat`]), built on first
/// use.
#[derive(Clone, Debug, Default)]
struct Built<'a> {
    metrics: Vec<Entry<'a>>,
    labels: Vec<LabelView<'a>>,
}

/// Byte range `(start, end)` inside a record's body.
type Span = (u32, u32);

/// A record decoded and validated before, kept to decode the same record again cheaply.
#[derive(Clone, Debug, Default)]
struct Remembered {
    /// [`RecordId`] (0 while nothing is remembered here).
    id: u64,
    /// The record's body (the bytes of the `Metric` message).
    body: Vec<u8>,
    /// Where in `body` the 8 bytes of the last `value` field start, if it has one.
    value_at: Option<u32>,
    name: Span,
    help: Span,
    r#type: i32,
    timestamp_ms: i64,
    /// Name and value of each label, in order.
    labels: Vec<(Span, Span)>,
}

/// The records of earlier payloads, by position in the payload, so that a record whose body
/// is byte for byte the one remembered at its position, except for the 8 bytes of its
/// `value`, is decoded without parsing and validating it again: an agent sends the same
/// series in the same order frame after frame, and only their values change.
///
/// Parsing a body only depends on its bytes (a `value` is a fixed-width field: other bytes
/// do not change what is read around it), and validation only on the fields other than
/// `value` and on the limits, so such a record decodes to the remembered fields with the
/// new value, and is valid (only records that passed validation under `limits` are kept,
/// and none with histogram buckets). Memory held is bounded by the largest payload decoded
/// plus a fixed size per record position.
#[derive(Clone, Debug, Default)]
struct Memo {
    /// The limits the records were validated under.
    limits: Option<Limits>,
    records: Vec<Remembered>,
    /// The last payload, while each of its records is the one remembered at its position
    /// in `records` (empty otherwise): a payload equal to it except for the 8 bytes of each
    /// record's `value` is these records again, with new values (the argument of [`Memo`]
    /// applied to the payload: its outer keys and lengths are bytes like any other).
    payload: Vec<u8>,
    /// Where each record's body starts in `payload`, one per record.
    bodies: Vec<u32>,
}

/// Where `part` (a sub-slice of `body`, or an empty string from anywhere) lies in `body`.
fn span_in(part: &str, body: &[u8]) -> Option<Span> {
    if part.is_empty() {
        return Some((0, 0));
    }
    let start = (part.as_ptr() as usize).checked_sub(body.as_ptr() as usize)?;
    let end = start.checked_add(part.len())?;
    if end > body.len() {
        return None;
    }
    Some((u32::try_from(start).ok()?, u32::try_from(end).ok()?))
}

impl Memo {
    /// Forgets everything unless the records were validated under `limits`.
    fn prepare(&mut self, limits: &Limits) {
        if self.limits.as_ref() != Some(limits) {
            self.records.clear();
            self.payload.clear();
            self.bodies.clear();
            self.limits = Some(limits.clone());
        }
    }

    /// Record `index` of the payload, with body `body`, if it is the one remembered there
    /// (see [`Memo`]); its labels are appended to `labels`.
    #[inline]
    fn recall<'a>(
        &mut self,
        index: usize,
        body: &'a [u8],
        labels: &mut Vec<LabelView<'a>>,
    ) -> Option<Entry<'a>> {
        let r = self.records.get_mut(index)?;
        if r.id == 0 || r.body.len() != body.len() {
            return None;
        }
        // The value's bytes are copied first (whatever they are, they parse as the value
        // and nothing else), so one comparison covers the rest: name, help, type and
        // labels (before the value, in the order prost encodes) and any field after it.
        if let Some(at) = r.value_at {
            let at = at as usize;
            let value = body.get(at..)?.first_chunk::<8>()?;
            r.body.get_mut(at..at + 8)?.copy_from_slice(value);
        }
        if r.body != body {
            return None;
        }
        r.entry(body, labels)
    }

    /// True if `payload` is the last payload again (see [`Memo::payload`]) with new values;
    /// the remembered payload then holds its values ([`Memo::repeated_values`]).
    #[inline]
    fn recall_payload(&mut self, payload: &[u8]) -> bool {
        if self.bodies.is_empty() || self.payload.len() != payload.len() {
            return false;
        }
        for (&start, r) in self.bodies.iter().zip(&self.records) {
            if let Some(at) = r.value_at {
                let at = start as usize + at as usize;
                let copied = payload
                    .get(at..)
                    .and_then(|rest| rest.first_chunk::<8>())
                    .zip(self.payload.get_mut(at..at + 8))
                    .map(|(new, old)| old.copy_from_slice(new));
                if copied.is_none() {
                    return false;
                }
            }
        }
        self.payload == payload
    }

    /// The records of `payload`, which [`Memo::recall_payload`] found to be the last
    /// payload again, appended to `metrics` and their labels to `labels`.
    ///
    /// Each record's strings are the bytes of the remembered record, which were valid
    /// UTF-8 when it was remembered; a record whose view could not be built all the same
    /// (unreachable) is kept with empty strings and no labels rather than dropped, so the
    /// record count stays the one the payload was accepted with.
    fn build_repeated<'a>(
        &self,
        payload: &'a [u8],
        metrics: &mut Vec<Entry<'a>>,
        labels: &mut Vec<LabelView<'a>>,
    ) {
        for (&start, r) in self.bodies.iter().zip(&self.records) {
            let start = start as usize;
            let entry = payload
                .get(start..start + r.body.len())
                .and_then(|body| r.entry(body, labels));
            metrics.push(entry.unwrap_or(Entry {
                id: r.id,
                r#type: r.r#type,
                value: r.value_in(&self.payload, start),
                timestamp_ms: r.timestamp_ms,
                ..Entry::default()
            }));
        }
    }

    /// Id, type and value of each record of a payload that [`Memo::recall_payload`] found
    /// to be the last payload again (the remembered payload holds its values).
    fn repeated_values(&self) -> impl ExactSizeIterator<Item = (RecordId, i32, f64)> + '_ {
        self.bodies.iter().zip(&self.records).map(|(&start, r)| {
            (
                RecordId(r.id),
                r.r#type,
                r.value_in(&self.payload, start as usize),
            )
        })
    }

    /// Notes `payload` as the last payload, its records' bodies starting at `bodies`, if
    /// `whole` (each record is the one now remembered at its position); forgets the last
    /// payload otherwise.
    fn note_payload(&mut self, payload: &[u8], whole: bool) {
        if whole && !self.bodies.is_empty() && self.bodies.len() <= self.records.len() {
            self.payload.clear();
            self.payload.extend_from_slice(payload);
        } else {
            self.payload.clear();
            self.bodies.clear();
        }
    }

    /// Remembers record `index` (body `body`, decoded as `entry` with `labels`, the value's
    /// bytes at `value_at`), which passed validation; returns its [`RecordId`] (0 when it
    /// is not remembered).
    fn remember(
        &mut self,
        index: usize,
        body: &[u8],
        entry: &Entry<'_>,
        labels: &[LabelView<'_>],
        value_at: Option<u32>,
    ) -> u64 {
        if entry.buckets.0 != entry.buckets.1 || entry.count != 0 || entry.sum.to_bits() != 0 {
            return 0;
        }
        let spans = (|| {
            let name = span_in(entry.name, body)?;
            let help = span_in(entry.help, body)?;
            Some((name, help))
        })();
        let Some((name, help)) = spans else {
            return 0;
        };
        if self.records.len() <= index {
            self.records.resize_with(index + 1, Remembered::default);
        }
        let Some(r) = self.records.get_mut(index) else {
            return 0;
        };
        r.labels.clear();
        for l in labels {
            match (span_in(l.name, body), span_in(l.value, body)) {
                (Some(n), Some(v)) => r.labels.push((n, v)),
                _ => {
                    // Not from this body (never seen): remember nothing here.
                    r.id = 0;
                    r.body.clear();
                    r.labels.clear();
                    r.value_at = None;
                    return 0;
                }
            }
        }
        r.body.clear();
        r.body.extend_from_slice(body);
        r.value_at = value_at;
        r.name = name;
        r.help = help;
        r.r#type = entry.r#type;
        r.timestamp_ms = entry.timestamp_ms;
        r.id = NEXT_RECORD_ID.fetch_add(1, Ordering::Relaxed);
        r.id
    }
}

impl Remembered {
    /// The value of this record in `payload`, whose body starts at `start` (0 without a
    /// value field, as the parser reads it).
    fn value_in(&self, payload: &[u8], start: usize) -> f64 {
        self.value_at
            .and_then(|at| {
                payload
                    .get(start + at as usize..)?
                    .first_chunk::<8>()
                    .copied()
            })
            .map_or(0.0, f64::from_le_bytes)
    }

    /// The remembered record as an entry over `body` (equal to the remembered body except
    /// for the value's 8 bytes), its labels appended to `labels`; `None` (nothing
    /// appended) if a string is not valid UTF-8 in `body`, which the comparison with the
    /// remembered body rules out.
    #[inline]
    fn entry<'a>(&self, body: &'a [u8], labels: &mut Vec<LabelView<'a>>) -> Option<Entry<'a>> {
        // Strings of a record only lie in its head or its tail; the head is usually all
        // ASCII (keys, short lengths, names), so one UTF-8 check covers all its strings.
        let head = match self.value_at {
            Some(at) => body.get(..at as usize)?,
            None => body,
        };
        let head_str = std::str::from_utf8(head).ok();
        let text = |span: Span| -> Option<&'a str> {
            let (start, end) = (span.0 as usize, span.1 as usize);
            match head_str {
                Some(h) if end <= h.len() => h.get(start..end),
                _ => std::str::from_utf8(body.get(start..end)?).ok(),
            }
        };
        let value = match self.value_at {
            Some(at) => f64::from_le_bytes(*body.get(at as usize..)?.first_chunk::<8>()?),
            None => 0.0,
        };
        let labels_start = labels.len();
        let first_label = index_u32(labels_start)?;
        for (name, value) in &self.labels {
            match (text(*name), text(*value)) {
                (Some(name), Some(value)) => labels.push(LabelView { name, value }),
                _ => {
                    labels.truncate(labels_start);
                    return None;
                }
            }
        }
        let (Some(name), Some(help), Some(end_label)) =
            (text(self.name), text(self.help), index_u32(labels.len()))
        else {
            labels.truncate(labels_start);
            return None;
        };
        Some(Entry {
            id: self.id,
            name,
            help,
            r#type: self.r#type,
            labels: (first_label, end_label),
            value,
            timestamp_ms: self.timestamp_ms,
            buckets: (0, 0),
            count: 0,
            sum: 0.0,
        })
    }
}

fn index_u32(n: usize) -> Option<u32> {
    u32::try_from(n).ok()
}

/// The payload is not valid protobuf for `MetricBatch` (the error itself comes from prost).
struct Malformed;

type Parsed<T> = Result<T, Malformed>;

/// Empties `v` and reuses its allocation for elements of another lifetime (same layout:
/// the standard library collects a `vec::IntoIter` in place).
fn recycle_vec<T, U>(mut v: Vec<T>) -> Vec<U> {
    v.clear();
    v.into_iter().filter_map(|_| None).collect()
}

fn expect(actual: WireType, expected: WireType) -> Parsed<()> {
    if actual == expected {
        Ok(())
    } else {
        Err(Malformed)
    }
}

/// A base-128 varint as prost's `decode_varint` reads it: at most 10 bytes, and a 10th byte
/// above 1 overflows 64 bits (both malformed).
#[inline]
fn varint(buf: &mut &[u8]) -> Parsed<u64> {
    if let Some((&b, rest)) = buf.split_first() {
        if b < 0x80 {
            *buf = rest;
            return Ok(u64::from(b));
        }
    }
    let mut value = 0u64;
    for (i, &b) in buf.iter().take(10).enumerate() {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            if i == 9 && b > 1 {
                return Err(Malformed);
            }
            *buf = buf.get(i + 1..).ok_or(Malformed)?;
            return Ok(value);
        }
    }
    Err(Malformed)
}

/// A field key as prost's `decode_key` reads it: a varint of at most 32 bits, wire type
/// 0..=5, tag at least 1.
#[inline]
fn decode_key(buf: &mut &[u8]) -> Parsed<(u32, WireType)> {
    let key = u32::try_from(varint(buf)?).map_err(|_| Malformed)?;
    let wire_type = match key & 7 {
        0 => WireType::Varint,
        1 => WireType::SixtyFourBit,
        2 => WireType::LengthDelimited,
        3 => WireType::StartGroup,
        4 => WireType::EndGroup,
        5 => WireType::ThirtyTwoBit,
        _ => return Err(Malformed),
    };
    match key >> 3 {
        0 => Err(Malformed),
        tag => Ok((tag, wire_type)),
    }
}

fn advance(buf: &mut &[u8], len: u64) -> Parsed<()> {
    let len = usize::try_from(len).map_err(|_| Malformed)?;
    let (_, rest) = buf.split_at_checked(len).ok_or(Malformed)?;
    *buf = rest;
    Ok(())
}

/// The bytes of a length-delimited field (after its key).
fn delimited<'a>(buf: &mut &'a [u8]) -> Parsed<&'a [u8]> {
    let len = usize::try_from(varint(buf)?).map_err(|_| Malformed)?;
    let (head, rest) = buf.split_at_checked(len).ok_or(Malformed)?;
    *buf = rest;
    Ok(head)
}

fn string<'a>(wire_type: WireType, buf: &mut &'a [u8]) -> Parsed<&'a str> {
    expect(wire_type, WireType::LengthDelimited)?;
    std::str::from_utf8(delimited(buf)?).map_err(|_| Malformed)
}

fn double(wire_type: WireType, buf: &mut &[u8]) -> Parsed<f64> {
    expect(wire_type, WireType::SixtyFourBit)?;
    let (bytes, rest) = buf.split_first_chunk::<8>().ok_or(Malformed)?;
    *buf = rest;
    Ok(f64::from_le_bytes(*bytes))
}

fn varint_field(wire_type: WireType, buf: &mut &[u8]) -> Parsed<u64> {
    expect(wire_type, WireType::Varint)?;
    varint(buf)
}

/// A nested message's bytes, `depth` being the recursion budget of the enclosing message
/// (prost's `message::merge`: wire type, then the recursion limit, then the length).
fn message<'a>(wire_type: WireType, buf: &mut &'a [u8], depth: u32) -> Parsed<&'a [u8]> {
    expect(wire_type, WireType::LengthDelimited)?;
    if depth == 0 {
        return Err(Malformed);
    }
    delimited(buf)
}

/// Skips an unknown field as prost's `skip_field` does (groups nest, each level costs one
/// unit of `depth`).
fn skip(wire_type: WireType, tag: u32, buf: &mut &[u8], depth: u32) -> Parsed<()> {
    if depth == 0 {
        return Err(Malformed);
    }
    match wire_type {
        WireType::Varint => varint(buf).map(drop),
        WireType::ThirtyTwoBit => advance(buf, 4),
        WireType::SixtyFourBit => advance(buf, 8),
        WireType::LengthDelimited => {
            let len = varint(buf)?;
            advance(buf, len)
        }
        WireType::StartGroup => loop {
            let (inner_tag, inner_type) = decode_key(buf)?;
            if inner_type == WireType::EndGroup {
                return if inner_tag == tag {
                    Ok(())
                } else {
                    Err(Malformed)
                };
            }
            skip(inner_type, inner_tag, buf, depth - 1)?;
        },
        WireType::EndGroup => Err(Malformed),
    }
}

fn label<'a>(mut buf: &'a [u8], depth: u32) -> Parsed<LabelView<'a>> {
    let mut label = LabelView {
        name: "",
        value: "",
    };
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf)?;
        match tag {
            1 => label.name = string(wire_type, &mut buf)?,
            2 => label.value = string(wire_type, &mut buf)?,
            _ => skip(wire_type, tag, &mut buf, depth)?,
        }
    }
    Ok(label)
}

fn bucket(mut buf: &[u8], depth: u32) -> Parsed<Bucket> {
    let mut bucket = Bucket::default();
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf)?;
        match tag {
            1 => bucket.upper_bound = double(wire_type, &mut buf)?,
            2 => bucket.cumulative_count = varint_field(wire_type, &mut buf)?,
            _ => skip(wire_type, tag, &mut buf, depth)?,
        }
    }
    Ok(bucket)
}

fn index(n: usize) -> Parsed<u32> {
    u32::try_from(n).map_err(|_| Malformed)
}

impl<'a> MetricBatchView<'a> {
    /// An empty batch.
    pub fn new() -> MetricBatchView<'a> {
        MetricBatchView::default()
    }

    /// Decodes and validates `payload` into a fresh batch.
    ///
    /// # Errors
    /// As [`crate::payload::decode_metric_batch`]: the same error for the same input.
    pub fn decode(payload: &'a [u8], limits: &Limits) -> Result<MetricBatchView<'a>, PayloadError> {
        let mut batch = MetricBatchView::new();
        batch.decode_into(payload, limits)?;
        Ok(batch)
    }

    /// Empties the batch and keeps its allocations for a payload of another lifetime.
    pub fn recycle<'b>(self) -> MetricBatchView<'b> {
        MetricBatchView {
            metrics: recycle_vec(self.metrics),
            labels: recycle_vec(self.labels),
            buckets: recycle_vec(self.buckets),
            memo: self.memo,
            repeat: None,
            built: OnceCell::new(),
        }
    }

    /// Decodes and validates `payload` (the payload of a metrics frame) into this batch,
    /// replacing what it held. The payload is bounded by `limits.max_frame_bytes` first;
    /// at most `limits.max_records_per_frame` records are kept (more are still parsed, so
    /// malformed input is reported as such, and then rejected as
    /// [`PayloadError::Batch`]). Memory held is bounded by the payload's size (and, for the
    /// records remembered from earlier payloads, by the largest payload's size).
    ///
    /// # Errors
    /// As [`crate::payload::decode_metric_batch`], with the same value for the same input:
    /// [`PayloadError::Batch`], [`PayloadError::Protobuf`], [`PayloadError::Record`]. On
    /// error the batch is empty: a `MetricBatchView` only ever holds records that passed
    /// [`validate_metric_view`] (consumers may rely on it).
    pub fn decode_into(&mut self, payload: &'a [u8], limits: &Limits) -> Result<(), PayloadError> {
        self.clear();
        limits
            .check(
                Limit::FrameBytes,
                payload.len().saturating_add(crate::frame::HEADER_LEN),
            )
            .map_err(PayloadError::Batch)?;
        let result = match self.parse(payload, limits) {
            Ok((count, _)) if count > limits.max_records_per_frame => limits
                .check(Limit::RecordsPerFrame, count)
                .map_err(PayloadError::Batch),
            Ok((_, Some(e))) => Err(e),
            Ok((_, None)) => Ok(()),
            Err(Malformed) => Err(prost_error(payload, limits)),
        };
        if result.is_err() {
            self.clear();
        }
        result
    }

    /// Empties the batch for records added with [`MetricBatchView::push_record`].
    pub fn clear_for_push(&mut self) {
        self.clear();
    }

    /// Adds one record that the caller decoded and validated (the metric rules,
    /// [`validate_metric_view`]): a record of a series-dictionary frame
    /// (`dict::SeriesDict::decode_into`). Not remembered by the memo.
    pub fn push_record(
        &mut self,
        r: PushRecord<'a>,
        labels: impl IntoIterator<Item = LabelView<'a>>,
        buckets: impl IntoIterator<Item = Bucket>,
    ) {
        let (l0, b0) = (self.labels.len(), self.buckets.len());
        self.labels.extend(labels);
        self.buckets.extend(buckets);
        let span = |a: usize, b: usize| {
            (
                u32::try_from(a).unwrap_or(u32::MAX),
                u32::try_from(b).unwrap_or(u32::MAX),
            )
        };
        self.metrics.push(Entry {
            id: r.id.map_or(0, |RecordId(id)| id),
            name: r.name,
            help: r.help,
            r#type: r.r#type,
            labels: span(l0, self.labels.len()),
            value: r.value,
            timestamp_ms: r.timestamp_ms,
            buckets: span(b0, self.buckets.len()),
            count: r.count,
            sum: r.sum,
        });
    }

    fn clear(&mut self) {
        self.metrics.clear();
        self.labels.clear();
        self.repeat = None;
        if let Some(built) = self.built.take() {
            // Keep the larger allocations for the next payload's records.
            if built.metrics.capacity() > self.metrics.capacity() {
                self.metrics = recycle_vec(built.metrics);
            }
            if built.labels.capacity() > self.labels.capacity() {
                self.labels = recycle_vec(built.labels);
            }
        }
        self.buckets.clear();
    }

    /// Parses every record; keeps and validates the first `max_records_per_frame`. Returns
    /// the record count and the first record error.
    fn parse(
        &mut self,
        mut buf: &'a [u8],
        limits: &Limits,
    ) -> Parsed<(usize, Option<PayloadError>)> {
        let keep = limits.max_records_per_frame;
        self.memo.prepare(limits);
        let payload = buf;
        if self.memo.recall_payload(payload) {
            self.repeat = Some(payload);
            return Ok((self.memo.bodies.len(), None));
        }
        self.memo.note_payload(payload, false);
        // Every record so far is kept and is the one remembered at its position.
        let mut whole = true;
        let mut count = 0usize;
        let mut first_error = None;
        while !buf.is_empty() {
            let (tag, wire_type) = decode_key(&mut buf)?;
            if tag != 1 {
                skip(wire_type, tag, &mut buf, RECURSION_LIMIT)?;
                continue;
            }
            let body = message(wire_type, &mut buf, RECURSION_LIMIT)?;
            if whole {
                match payload
                    .len()
                    .checked_sub(buf.len() + body.len())
                    .map(index_u32)
                {
                    Some(Some(start)) if count < keep => self.memo.bodies.push(start),
                    _ => whole = false,
                }
            }
            if count < keep {
                if let Some(entry) = self.memo.recall(count, body, &mut self.labels) {
                    self.metrics.push(entry);
                    count += 1;
                    continue;
                }
            }
            let (labels, buckets) = (self.labels.len(), self.buckets.len());
            let (entry, value_at) = self.metric(body, RECURSION_LIMIT - 1)?;
            if count < keep {
                self.metrics.push(entry);
                if first_error.is_none() {
                    match check_metric(&self.view(&entry, &self.labels), limits) {
                        Ok(()) => {
                            let own = self.labels.get(labels..).unwrap_or_default();
                            let id = self.memo.remember(count, body, &entry, own, value_at);
                            if let Some(last) = self.metrics.last_mut() {
                                last.id = id;
                            }
                            whole &= id != 0;
                        }
                        Err(source) => {
                            whole = false;
                            first_error = Some(PayloadError::Record {
                                index: count,
                                source,
                            });
                        }
                    }
                }
            } else {
                // Parsed for its errors only.
                self.labels.truncate(labels);
                self.buckets.truncate(buckets);
            }
            count += 1;
        }
        self.memo.note_payload(payload, whole);
        Ok((count, first_error))
    }

    /// One `Metric` message; `depth` is the recursion budget of its fields. Also returns
    /// where the bytes of its last `value` field start.
    fn metric(&mut self, mut buf: &'a [u8], depth: u32) -> Parsed<(Entry<'a>, Option<u32>)> {
        let labels_start = index(self.labels.len())?;
        let buckets_start = index(self.buckets.len())?;
        let body_len = buf.len();
        let mut value_at = None;
        let mut m = Entry::default();
        while !buf.is_empty() {
            let (tag, wire_type) = decode_key(&mut buf)?;
            match tag {
                1 => m.name = string(wire_type, &mut buf)?,
                2 => m.help = string(wire_type, &mut buf)?,
                // int32 enumeration: the varint truncated, as prost does.
                3 => m.r#type = varint_field(wire_type, &mut buf)? as i32,
                4 => {
                    let body = message(wire_type, &mut buf, depth)?;
                    self.labels.push(label(body, depth - 1)?);
                }
                5 => {
                    let at = index(body_len - buf.len())?;
                    m.value = double(wire_type, &mut buf)?;
                    value_at = Some(at);
                }
                6 => m.timestamp_ms = varint_field(wire_type, &mut buf)? as i64,
                7 => {
                    let body = message(wire_type, &mut buf, depth)?;
                    self.buckets.push(bucket(body, depth - 1)?);
                }
                8 => m.count = varint_field(wire_type, &mut buf)?,
                9 => m.sum = double(wire_type, &mut buf)?,
                _ => skip(wire_type, tag, &mut buf, depth)?,
            }
        }
        m.labels = (labels_start, index(self.labels.len())?);
        m.buckets = (buckets_start, index(self.buckets.len())?);
        Ok((m, value_at))
    }

    /// The records and their labels: the parsed ones, or those of a repeated payload
    /// (built on first use).
    fn entries(&self) -> (&[Entry<'a>], &[LabelView<'a>]) {
        match self.repeat {
            None => (&self.metrics, &self.labels),
            Some(payload) => {
                let built = self.built.get_or_init(|| {
                    let mut b = Built {
                        metrics: Vec::with_capacity(self.memo.bodies.len()),
                        labels: Vec::new(),
                    };
                    self.memo
                        .build_repeated(payload, &mut b.metrics, &mut b.labels);
                    b
                });
                (&built.metrics, &built.labels)
            }
        }
    }

    fn view<'s>(&'s self, e: &'s Entry<'a>, labels: &'s [LabelView<'a>]) -> MetricView<'s> {
        let labels = labels
            .get(e.labels.0 as usize..e.labels.1 as usize)
            .unwrap_or_default();
        let buckets = self
            .buckets
            .get(e.buckets.0 as usize..e.buckets.1 as usize)
            .unwrap_or_default();
        MetricView {
            name: e.name,
            help: e.help,
            r#type: e.r#type,
            labels,
            value: e.value,
            timestamp_ms: e.timestamp_ms,
            buckets,
            count: e.count,
            sum: e.sum,
        }
    }

    /// Records in the batch.
    pub fn len(&self) -> usize {
        match self.repeat {
            None => self.metrics.len(),
            Some(_) => self.memo.bodies.len(),
        }
    }

    /// True when the batch holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Record `i`, if any.
    pub fn get(&self, i: usize) -> Option<MetricView<'_>> {
        let (metrics, labels) = self.entries();
        metrics.get(i).map(|e| self.view(e, labels))
    }

    /// The records, in payload order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = MetricView<'_>> + use<'_, 'a> {
        let (metrics, labels) = self.entries();
        metrics.iter().map(move |e| self.view(e, labels))
    }

    /// When the payload was the previous payload again with only the 8 bytes of each
    /// record's `value` changed (an agent sending the same series in the same order): each
    /// record's [`RecordId`], type and value, in payload order, without building views of
    /// its strings. `None` otherwise. A consumer that keeps what it derived from each
    /// record under its id (as [`MetricBatchView::iter_with_ids`] allows) needs nothing
    /// else; asking for views still works ([`MetricBatchView::iter`]) and builds them then.
    pub fn repeated(&self) -> Option<impl ExactSizeIterator<Item = (RecordId, i32, f64)> + '_> {
        self.repeat.map(|_| self.memo.repeated_values())
    }

    /// The records, in payload order, each with its [`RecordId`] where it has one (a
    /// record without histogram fields that this batch decoded before, at the same position
    /// of an earlier payload, or remembered now for the next payloads). A consumer may keep
    /// what it derived from a record's fields other than the value under its id.
    pub fn iter_with_ids(
        &self,
    ) -> impl ExactSizeIterator<Item = (MetricView<'_>, Option<RecordId>)> + use<'_, 'a> {
        let (metrics, labels) = self.entries();
        metrics
            .iter()
            .map(move |e| (self.view(e, labels), (e.id != 0).then_some(RecordId(e.id))))
    }

    /// The same batch as an owned [`MetricBatch`] (allocates).
    pub fn to_batch(&self) -> MetricBatch {
        MetricBatch {
            metrics: self.iter().map(|m| m.to_metric()).collect(),
        }
    }
}

/// The owned decoder's error for a payload this parser found malformed.
#[cold]
fn prost_error(payload: &[u8], limits: &Limits) -> PayloadError {
    match decode_metric_batch(payload, limits) {
        Err(e) => e,
        // Never seen: the property tests check that both decoders accept the same inputs.
        #[allow(deprecated)]
        Ok(_) => PayloadError::Protobuf {
            message: "MetricBatch",
            source: prost::DecodeError::new("rejected by the borrowed MetricBatch parser"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::LimitError;
    use crate::payload::{decode_metric_batch, encode_metric_batch, MetricType};
    use proptest::prelude::*;
    use prost::encoding::{encode_key, encode_varint};

    fn cpu(i: usize) -> Metric {
        Metric {
            name: "node_cpu_seconds_total".into(),
            help: "Seconds the CPUs spent in each mode.".into(),
            r#type: MetricType::Counter as i32,
            labels: vec![
                Label {
                    name: "cpu".into(),
                    value: (i / 8).to_string(),
                },
                Label {
                    name: "mode".into(),
                    value: "idle".into(),
                },
            ],
            value: i as f64,
            ..Default::default()
        }
    }

    fn histogram() -> Metric {
        Metric {
            name: "req_seconds".into(),
            r#type: MetricType::Histogram as i32,
            buckets: vec![
                Bucket {
                    upper_bound: 0.5,
                    cumulative_count: 1,
                },
                Bucket {
                    upper_bound: 1.0,
                    cumulative_count: 3,
                },
            ],
            count: 4,
            sum: 2.5,
            timestamp_ms: -7,
            ..Default::default()
        }
    }

    /// Both decoders, compared: same acceptance, same value, same error.
    fn agree(payload: &[u8], limits: &Limits) -> Result<(), TestCaseError> {
        let owned = decode_metric_batch(payload, limits);
        let borrowed = MetricBatchView::decode(payload, limits).map(|b| b.to_batch());
        prop_assert_eq!(&borrowed, &owned, "payload {:02x?}", payload);
        if let Ok(batch) = &owned {
            let view = MetricBatchView::decode(payload, limits)
                .map_err(|e| TestCaseError::fail(format!("accepted by one decoder only: {e}")))?;
            for (m, v) in batch.metrics.iter().zip(view.iter()) {
                prop_assert_eq!(
                    crate::payload::validate_metric(m, limits),
                    validate_metric_view(&v, limits)
                );
            }
        }
        Ok(())
    }

    #[test]
    fn views_match_the_owned_batch() {
        let batch = MetricBatch {
            metrics: vec![cpu(0), histogram(), cpu(9)],
        };
        let bytes = encode_metric_batch(&batch);
        let view = MetricBatchView::decode(&bytes, &Limits::default()).unwrap();
        assert_eq!(view.len(), 3);
        assert_eq!(view.to_batch(), batch);
        let first = view.get(0).unwrap();
        assert_eq!(first.name, "node_cpu_seconds_total");
        assert_eq!(
            first.labels,
            &[
                LabelView {
                    name: "cpu",
                    value: "0"
                },
                LabelView {
                    name: "mode",
                    value: "idle"
                }
            ][..]
        );
        assert_eq!(view.get(1).unwrap().buckets.len(), 2);
        assert!(view.get(3).is_none());
    }

    #[test]
    fn a_recycled_batch_keeps_its_allocations_and_forgets_its_records() {
        let big = encode_metric_batch(&MetricBatch {
            metrics: (0..20).map(cpu).collect(),
        });
        let small = encode_metric_batch(&MetricBatch {
            metrics: vec![histogram()],
        });
        let mut view = MetricBatchView::decode(&big, &Limits::default()).unwrap();
        let (metrics, labels) = (view.metrics.capacity(), view.labels.capacity());
        let mut next: MetricBatchView<'_> = view.recycle();
        assert!(next.is_empty());
        assert!(next.metrics.capacity() >= metrics && next.labels.capacity() >= labels);
        next.decode_into(&small, &Limits::default()).unwrap();
        assert_eq!(next.to_batch().metrics, vec![histogram()]);
        view = next.recycle();
        assert!(view.metrics.capacity() >= metrics);
    }

    #[test]
    fn a_repeated_record_is_recalled_with_its_new_value() {
        let limits = Limits::default();
        let payload = |v: f64| {
            let mut metrics: Vec<Metric> = (0..3).map(cpu).collect();
            metrics[1].value = v;
            metrics.push(histogram());
            encode_metric_batch(&MetricBatch { metrics })
        };
        let first = payload(1.0);
        let view = MetricBatchView::decode(&first, &limits).unwrap();
        // Counters remembered, the histogram not.
        assert_eq!(view.memo.records.len(), 3);
        let ids: Vec<Option<RecordId>> = view.iter_with_ids().map(|(_, id)| id).collect();
        assert!(ids[..3].iter().all(Option::is_some), "{ids:?}");
        assert_eq!(ids[3], None);
        assert_ne!(ids[0], ids[1]);
        let second = payload(-2.5);
        let mut view = view.recycle();
        view.decode_into(&second, &limits).unwrap();
        assert_eq!(
            view.to_batch(),
            decode_metric_batch(&second, &limits).unwrap()
        );
        assert_eq!(view.get(1).unwrap().value, -2.5);
        let again: Vec<Option<RecordId>> = view.iter_with_ids().map(|(_, id)| id).collect();
        assert_eq!(again, ids);
        // The second payload's counters came from the memo: a tampered entry shows.
        view.memo.records[2].r#type = MetricType::Gauge as i32;
        let mut view = view.recycle();
        view.decode_into(&second, &limits).unwrap();
        assert_eq!(view.get(2).unwrap().r#type, MetricType::Gauge as i32);
        // Other limits: nothing is recalled.
        let other = Limits {
            max_labels: 8,
            ..Limits::default()
        };
        let mut view = view.recycle();
        view.decode_into(&second, &other).unwrap();
        assert_eq!(view.get(2).unwrap().r#type, MetricType::Counter as i32);
    }

    /// A position where nothing is remembered (a histogram was there) recalls nothing,
    /// not even an empty record.
    #[test]
    fn an_empty_record_is_not_recalled_from_an_unused_position() {
        let limits = Limits::default();
        let first = encode_metric_batch(&MetricBatch {
            metrics: vec![cpu(0), histogram(), cpu(2)],
        });
        let view = MetricBatchView::decode(&first, &limits).unwrap();
        assert_eq!(view.memo.records[1].id, 0);
        let second = encode_metric_batch(&MetricBatch {
            metrics: vec![cpu(0), Metric::default(), cpu(2)],
        });
        let mut view = view.recycle();
        let borrowed = view.decode_into(&second, &limits);
        assert!(borrowed.is_err());
        assert_eq!(borrowed, decode_metric_batch(&second, &limits).map(drop));
    }

    #[test]
    fn a_repeated_payload_is_recalled_whole() {
        let limits = Limits::default();
        let payload = |v: f64, name: &str| {
            let mut metrics: Vec<Metric> = (0..4).map(cpu).collect();
            metrics[1].value = v;
            metrics[2].name = name.into();
            encode_metric_batch(&MetricBatch { metrics })
        };
        let first = payload(1.0, "node_a");
        let mut view = MetricBatchView::decode(&first, &limits).unwrap();
        assert_eq!(view.memo.payload, first);
        assert_eq!(view.memo.bodies.len(), 4);
        let ids: Vec<Option<RecordId>> = view.iter_with_ids().map(|(_, id)| id).collect();
        // The same records with other values: taken whole from the memo (a tampered
        // record shows), with the same ids and the new values.
        view.memo.records[3].r#type = MetricType::Gauge as i32;
        let second = payload(-2.5, "node_a");
        let mut next = view.recycle();
        next.decode_into(&second, &limits).unwrap();
        assert_eq!(next.get(1).unwrap().value, -2.5);
        assert_eq!(next.get(3).unwrap().r#type, MetricType::Gauge as i32);
        // Ids, types and values without views, the same as the views'.
        let repeated: Vec<(Option<RecordId>, i32, f64)> = next
            .repeated()
            .expect("a repeated payload")
            .map(|(id, t, v)| (Some(id), t, v))
            .collect();
        assert_eq!(repeated.len(), 4);
        assert_eq!(repeated[1].2, -2.5);
        let again: Vec<Option<RecordId>> = next.iter_with_ids().map(|(_, id)| id).collect();
        assert_eq!(again, ids);
        let from_views: Vec<(Option<RecordId>, i32, f64)> = next
            .iter_with_ids()
            .map(|(m, id)| (id, m.r#type, m.value))
            .collect();
        assert_eq!(repeated, from_views);
        // One byte changed outside the values (same length): parsed again, record by
        // record, and remembered whole again.
        next.memo.records[3].r#type = MetricType::Counter as i32;
        let third = payload(7.0, "node_b");
        let mut view = next.recycle();
        view.decode_into(&third, &limits).unwrap();
        assert!(view.repeated().is_none());
        assert_eq!(
            view.to_batch(),
            decode_metric_batch(&third, &limits).unwrap()
        );
        assert_eq!(view.memo.payload, third);
        // A payload with an invalid record is not remembered whole.
        let bad = payload(7.0, "node b");
        let mut next = view.recycle();
        assert!(next.decode_into(&bad, &limits).is_err());
        assert!(next.memo.payload.is_empty() && next.memo.bodies.is_empty());
        assert_eq!(
            next.decode_into(&bad, &limits),
            decode_metric_batch(&bad, &limits).map(drop)
        );
    }

    #[test]
    fn protobuf_field_rules_follow_prost() {
        let limits = Limits::default();
        // A string field twice: the last one wins; labels appended across interleaving.
        let mut m = Vec::new();
        prost::encoding::string::encode(1, &"first".to_string(), &mut m);
        prost::encoding::message::encode(
            4,
            &Label {
                name: "a".into(),
                value: "1".into(),
            },
            &mut m,
        );
        prost::encoding::string::encode(1, &"second".to_string(), &mut m);
        prost::encoding::int32::encode(3, &(MetricType::Gauge as i32), &mut m);
        prost::encoding::message::encode(
            4,
            &Label {
                name: "b".into(),
                value: "2".into(),
            },
            &mut m,
        );
        // Unknown fields of every wire type, including a group.
        prost::encoding::uint64::encode(100, &5, &mut m);
        prost::encoding::fixed32::encode(101, &5, &mut m);
        prost::encoding::bytes::encode(102, &vec![1u8, 2, 3], &mut m);
        encode_key(103, WireType::StartGroup, &mut m);
        prost::encoding::uint64::encode(1, &9, &mut m);
        encode_key(103, WireType::EndGroup, &mut m);
        let mut payload = Vec::new();
        prost::encoding::bytes::encode(1, &m, &mut payload);
        prost::encoding::uint64::encode(7, &1, &mut payload);
        let view = MetricBatchView::decode(&payload, &limits).unwrap();
        let first = view.get(0).unwrap();
        assert_eq!(first.name, "second");
        assert_eq!(first.labels.len(), 2);
        assert_eq!(
            view.to_batch(),
            decode_metric_batch(&payload, &limits).unwrap()
        );
    }

    #[test]
    fn errors_are_the_owned_decoders() {
        let limits = Limits {
            max_records_per_frame: 2,
            ..Limits::default()
        };
        let mut bad = cpu(0);
        bad.name = "bad name".into();
        for batch in [
            vec![cpu(0), bad.clone()],
            vec![cpu(0), cpu(1), cpu(2)],
            vec![bad.clone(), cpu(1), cpu(2)],
        ] {
            let bytes = encode_metric_batch(&MetricBatch { metrics: batch });
            let err = MetricBatchView::decode(&bytes, &limits).unwrap_err();
            assert_eq!(Err(err), decode_metric_batch(&bytes, &limits));
        }
        // Too many records wins over an invalid record; a malformed tail wins over both.
        let bytes = encode_metric_batch(&MetricBatch {
            metrics: vec![bad, cpu(1), cpu(2)],
        });
        assert_eq!(
            MetricBatchView::decode(&bytes, &limits).unwrap_err(),
            PayloadError::Batch(LimitError {
                limit: Limit::RecordsPerFrame,
                value: 3,
                bound: 2
            })
        );
        let mut broken = bytes.clone();
        broken.extend_from_slice(&[0x0a, 0x05, 0x0a]);
        assert!(matches!(
            MetricBatchView::decode(&broken, &limits),
            Err(PayloadError::Protobuf { .. })
        ));
        // A name that ends inside a character whose other bytes are the next field's key:
        // the metric body is valid UTF-8 as a whole, the name is not.
        let body = [0x0a, 0x01, 0xe2, 0x82, 0x82, 0x01, 0x00];
        let mut payload = vec![0x0a, body.len() as u8];
        payload.extend_from_slice(&body);
        assert!(std::str::from_utf8(&body).is_ok());
        let err = MetricBatchView::decode(&payload, &limits).unwrap_err();
        assert!(matches!(err, PayloadError::Protobuf { .. }), "{err}");
        assert_eq!(Err(err), decode_metric_batch(&payload, &limits));
        // Invalid UTF-8 in a label value.
        let payload = [0x0a, 0x05, 0x22, 0x03, 0x12, 0x01, 0xff];
        let err = MetricBatchView::decode(&payload, &limits).unwrap_err();
        assert!(matches!(err, PayloadError::Protobuf { .. }), "{err}");
        assert_eq!(Err(err), decode_metric_batch(&payload, &limits));
    }

    /// Groups nested around the recursion limit, at the top level, in a metric and in a
    /// label: both decoders draw the line at the same depth.
    #[test]
    fn recursion_limit_is_prosts() {
        fn groups(depth: usize) -> Vec<u8> {
            let mut out = Vec::new();
            for _ in 0..depth {
                encode_key(15, WireType::StartGroup, &mut out);
            }
            for _ in 0..depth {
                encode_key(15, WireType::EndGroup, &mut out);
            }
            out
        }
        let limits = Limits {
            max_frame_bytes: 1 << 16,
            ..Limits::default()
        };
        let mut accepted = [0usize; 3];
        for depth in 90..=101 {
            let top = groups(depth);
            let mut metric = vec![0x0a, 0x01, b'm', 0x18, 0x02];
            metric.extend_from_slice(&groups(depth));
            let mut in_metric = Vec::new();
            prost::encoding::bytes::encode(1, &metric, &mut in_metric);
            let mut label = vec![0x0a, 0x01, b'l'];
            label.extend_from_slice(&groups(depth));
            let mut metric = vec![0x0a, 0x01, b'm', 0x18, 0x02];
            prost::encoding::bytes::encode(4, &label, &mut metric);
            let mut in_label = Vec::new();
            prost::encoding::bytes::encode(1, &metric, &mut in_label);
            for (i, payload) in [top, in_metric, in_label].iter().enumerate() {
                agree(payload, &limits).unwrap();
                if decode_metric_batch(payload, &limits).is_ok() {
                    accepted[i] = accepted[i].max(depth);
                }
            }
        }
        // Deeper inside a message, fewer group levels fit.
        assert!(
            accepted[0] > accepted[1] && accepted[1] > accepted[2],
            "{accepted:?}"
        );
    }

    fn arb_string() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => "[a-z_][a-z0-9_:]{0,12}",
            1 => "\\PC{0,6}",
            1 => Just("__name__".to_string()),
            1 => Just("a".repeat(300)),
        ]
    }

    fn arb_metric() -> impl Strategy<Value = Metric> {
        (
            arb_string(),
            prop_oneof![3 => Just(String::new()), 1 => "[ -~]{0,20}"],
            -1i32..5,
            proptest::collection::vec((arb_string(), arb_string()), 0..4),
            any::<f64>(),
            any::<i64>(),
            proptest::collection::vec((any::<f64>(), 0u64..10), 0..4),
            0u64..20,
            any::<f64>(),
        )
            .prop_map(
                |(name, help, t, labels, value, ts, buckets, count, sum)| Metric {
                    name,
                    help,
                    r#type: t,
                    labels: labels
                        .into_iter()
                        .map(|(name, value)| Label { name, value })
                        .collect(),
                    value,
                    timestamp_ms: ts,
                    buckets: buckets
                        .into_iter()
                        .map(|(upper_bound, cumulative_count)| Bucket {
                            upper_bound,
                            cumulative_count,
                        })
                        .collect(),
                    count,
                    sum,
                },
            )
    }

    /// Well-formed metrics with sorted buckets, so that most batches are valid.
    fn arb_valid_metric() -> impl Strategy<Value = Metric> {
        (
            "[a-z_][a-z0-9_]{0,15}",
            1i32..4,
            proptest::collection::btree_map("[a-z][a-z0-9_]{0,8}", "[ -~]{0,10}", 0..5),
            0usize..4,
        )
            .prop_map(|(name, t, labels, buckets)| {
                let histogram = t == MetricType::Histogram as i32;
                Metric {
                    name,
                    r#type: t,
                    labels: labels
                        .into_iter()
                        .map(|(name, value)| Label { name, value })
                        .collect(),
                    buckets: if histogram {
                        (0..buckets)
                            .map(|i| Bucket {
                                upper_bound: i as f64,
                                cumulative_count: i as u64,
                            })
                            .collect()
                    } else {
                        Vec::new()
                    },
                    count: 10,
                    ..Default::default()
                }
            })
    }

    fn arb_limits() -> impl Strategy<Value = Limits> {
        (0usize..6, 0usize..5, 0usize..40, 0usize..3).prop_map(|(records, labels, len, buckets)| {
            let mut l = Limits {
                max_frame_bytes: 1 << 16,
                ..Limits::default()
            };
            if records > 0 {
                l.max_records_per_frame = records;
            }
            if labels > 0 {
                l.max_labels = labels;
            }
            if len > 0 {
                l.max_name_len = len;
                l.max_label_value_len = len;
            }
            if buckets > 0 {
                l.max_buckets = buckets;
            }
            l
        })
    }

    /// Byte-level damage to an encoded batch: flips, truncation, insertion.
    fn damage(mut bytes: Vec<u8>, edits: &[(usize, u8, u8)]) -> Vec<u8> {
        for &(at, kind, byte) in edits {
            if bytes.is_empty() {
                bytes.push(byte);
                continue;
            }
            let at = at % bytes.len();
            match kind % 4 {
                0 => bytes[at] ^= byte | 1,
                1 => bytes.truncate(at),
                2 => bytes.insert(at, byte),
                _ => {
                    bytes.remove(at);
                }
            }
        }
        bytes
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Arbitrary batches (valid and invalid records), arbitrary limits.
        #[test]
        fn borrowed_decoder_agrees_on_arbitrary_batches(
            metrics in proptest::collection::vec(arb_metric(), 0..6),
            limits in arb_limits(),
        ) {
            agree(&encode_metric_batch(&MetricBatch { metrics }), &limits)?;
        }

        /// Mostly valid batches, then corrupted at the byte level.
        #[test]
        fn borrowed_decoder_agrees_on_corrupted_batches(
            metrics in proptest::collection::vec(arb_valid_metric(), 0..6),
            edits in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 0..4),
            limits in arb_limits(),
        ) {
            let bytes = encode_metric_batch(&MetricBatch { metrics });
            agree(&bytes, &Limits::default())?;
            agree(&damage(bytes, &edits), &limits)?;
        }

        /// One batch reused payload after payload, as a receiver does (records remembered
        /// from earlier payloads): the same series with new values, then damaged or other
        /// batches, under changing limits. Every payload decodes as the owned decoder
        /// decodes it.
        #[test]
        fn a_reused_batch_agrees_payload_after_payload(
            metrics in proptest::collection::vec(
                prop_oneof![3 => arb_valid_metric(), 1 => arb_metric()], 0..6),
            frames in proptest::collection::vec(
                (
                    proptest::collection::vec(any::<f64>(), 6),
                    proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 0..3),
                    0u8..8,
                ),
                1..6,
            ),
            limits in arb_limits(),
        ) {
            let mut reused: MetricBatchView<'static> = MetricBatchView::new();
            for (values, edits, what) in &frames {
                let mut batch = MetricBatch { metrics: metrics.clone() };
                for (m, v) in batch.metrics.iter_mut().zip(values) {
                    m.value = *v;
                }
                let mut bytes = encode_metric_batch(&batch);
                let limits = match what {
                    0 => {
                        bytes = damage(bytes, edits);
                        limits.clone()
                    }
                    1 => Limits::default(),
                    2 => {
                        batch.metrics.reverse();
                        bytes = encode_metric_batch(&batch);
                        limits.clone()
                    }
                    _ => limits.clone(),
                };
                let owned = decode_metric_batch(&bytes, &limits);
                let mut view = std::mem::take(&mut reused).recycle();
                let borrowed = view.decode_into(&bytes, &limits).map(|()| view.to_batch());
                prop_assert_eq!(&borrowed, &owned, "payload {:02x?}", bytes);
                if let Ok(b) = &borrowed {
                    for (m, v) in b.metrics.iter().zip(view.iter()) {
                        prop_assert_eq!(m.value.to_bits(), v.value.to_bits());
                        prop_assert_eq!(m.sum.to_bits(), v.sum.to_bits());
                    }
                }
                if let Ok(o) = &owned {
                    for (m, v) in o.metrics.iter().zip(view.iter()) {
                        prop_assert_eq!(m.value.to_bits(), v.value.to_bits());
                    }
                }
                reused = view.recycle();
            }
        }

        /// Varints and keys read as prost reads them: same value, same length, same failures.
        #[test]
        fn varints_and_keys_follow_prost(
            bytes in proptest::collection::vec(prop_oneof![0x80u8..=0xff, any::<u8>()], 0..13),
        ) {
            let (mut ours, mut theirs) = (&bytes[..], &bytes[..]);
            let a = varint(&mut ours).ok();
            let b = prost::encoding::decode_varint(&mut theirs).ok();
            prop_assert_eq!(a, b);
            if a.is_some() {
                prop_assert_eq!(ours.len(), theirs.len());
            }
            let (mut ours, mut theirs) = (&bytes[..], &bytes[..]);
            prop_assert_eq!(
                decode_key(&mut ours).ok(),
                prost::encoding::decode_key(&mut theirs).ok()
            );
        }

        /// Arbitrary bytes, mostly garbage.
        #[test]
        fn borrowed_decoder_agrees_on_arbitrary_bytes(
            bytes in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            agree(&bytes, &Limits::default())?;
        }

        /// Hand-built wire fields: unknown tags, wrong wire types, repeated fields.
        #[test]
        fn borrowed_decoder_agrees_on_arbitrary_fields(
            fields in proptest::collection::vec(
                (1u32..12, 0u8..10, prop_oneof![3 => 0u64..4, 1 => any::<u64>()], "[a-z]{0,4}"),
                0..12,
            ),
            outer in proptest::collection::vec((1u32..4, 0u8..6), 0..3),
        ) {
            let mut metric = Vec::new();
            for (tag, wire, n, s) in &fields {
                // Mostly the field's own wire type, sometimes any.
                let own = match tag {
                    1 | 2 | 4 | 7 => WireType::LengthDelimited,
                    5 | 9 => WireType::SixtyFourBit,
                    _ => WireType::Varint,
                };
                let wire_type = if *wire < 8 {
                    own
                } else {
                    WireType::try_from(u64::from(*wire - 8) * 3).unwrap_or(WireType::Varint)
                };
                encode_key(*tag, wire_type, &mut metric);
                match wire_type {
                    WireType::Varint => encode_varint(*n, &mut metric),
                    WireType::SixtyFourBit => metric.extend_from_slice(&n.to_le_bytes()),
                    WireType::ThirtyTwoBit => metric.extend_from_slice(&n.to_le_bytes()[..4]),
                    // Labels and buckets as messages, other fields as raw strings.
                    WireType::LengthDelimited if *tag == 4 => {
                        let label = Label {
                            name: s.clone(),
                            value: s.repeat(2),
                        };
                        encode_varint(prost::Message::encoded_len(&label) as u64, &mut metric);
                        prost::Message::encode_raw(&label, &mut metric);
                    }
                    WireType::LengthDelimited if *tag == 7 => {
                        let bucket = Bucket {
                            upper_bound: *n as f64,
                            cumulative_count: *n,
                        };
                        encode_varint(prost::Message::encoded_len(&bucket) as u64, &mut metric);
                        prost::Message::encode_raw(&bucket, &mut metric);
                    }
                    WireType::LengthDelimited => {
                        encode_varint(s.len() as u64, &mut metric);
                        metric.extend_from_slice(s.as_bytes());
                    }
                    WireType::StartGroup | WireType::EndGroup => {}
                }
            }
            let mut payload = Vec::new();
            for (tag, wire) in &outer {
                let wire_type = WireType::try_from(u64::from(*wire)).unwrap_or(WireType::Varint);
                encode_key(*tag, wire_type, &mut payload);
                if wire_type == WireType::LengthDelimited {
                    encode_varint(0, &mut payload);
                }
            }
            prost::encoding::bytes::encode(1, &metric, &mut payload);
            agree(&payload, &Limits::default())?;
        }
    }
}
