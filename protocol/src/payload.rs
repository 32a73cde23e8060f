//! Frame payloads: metric batches and log batches, encoded as protobuf.
//!
//! The schema is published as `protocol/proto/uctel.proto` so that producers in any language
//! can emit frames; the types below are its `prost` mirror, kept field-for-field identical
//! (tag numbers included). One record is one [`Metric`] (a histogram counts as one record)
//! or one [`LogRecord`].

/// A `name="value"` label pair.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Label {
    /// Label name (Prometheus rules: `[a-zA-Z_][a-zA-Z0-9_]*`).
    #[prost(string, tag = "1")]
    pub name: String,
    /// Label value, any UTF-8.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// The Prometheus type of a [`Metric`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum MetricType {
    /// Not set: the collector rejects the sample as invalid (counted).
    Unspecified = 0,
    /// A monotonically increasing cumulative count.
    Counter = 1,
    /// A value that goes up and down.
    Gauge = 2,
    /// Cumulative buckets with `count` and `sum`.
    Histogram = 3,
    /// A value of unknown kind, as the Prometheus text format's `untyped` (a sample with no
    /// `# TYPE` line, from a scraped target or a textfile): stored, sent and exposed like a
    /// gauge (which is how Prometheus stores and queries untyped samples).
    Untyped = 4,
}

/// One cumulative histogram bucket: the number of observations `<= upper_bound`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Bucket {
    /// The bucket's inclusive upper bound (`le`); `+Inf` for the last.
    #[prost(double, tag = "1")]
    pub upper_bound: f64,
    /// Observations `<= upper_bound`, cumulative.
    #[prost(uint64, tag = "2")]
    pub cumulative_count: u64,
}

/// One sample of one series. Counters are cumulative, gauges absolute, histograms cumulative
/// buckets plus `count` and `sum` (DESIGN.md §3 rule 2: state, never deltas).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Metric {
    /// Metric name (Prometheus rules, e.g. `node_cpu_seconds_total`).
    #[prost(string, tag = "1")]
    pub name: String,
    /// The `# HELP` text; may be empty.
    #[prost(string, tag = "2")]
    pub help: String,
    /// A [`MetricType`] as its `i32` (protobuf enums are open: unknown values decode).
    #[prost(enumeration = "MetricType", tag = "3")]
    pub r#type: i32,
    /// The series' labels, without the `agent`/`instance` labels the collector adds.
    #[prost(message, repeated, tag = "4")]
    pub labels: Vec<Label>,
    /// Counter or gauge value; unused for histograms.
    #[prost(double, tag = "5")]
    pub value: f64,
    /// Milliseconds since the Unix epoch; 0 means "the frame's timestamp".
    #[prost(int64, tag = "6")]
    pub timestamp_ms: i64,
    /// Histogram only, increasing `upper_bound`.
    #[prost(message, repeated, tag = "7")]
    pub buckets: Vec<Bucket>,
    /// Histogram only: the number of observations.
    #[prost(uint64, tag = "8")]
    pub count: u64,
    /// Histogram only: the sum of the observations.
    #[prost(double, tag = "9")]
    pub sum: f64,
}

/// The payload of a `kind = metrics` frame.
#[derive(Clone, PartialEq, prost::Message)]
pub struct MetricBatch {
    /// The samples, one record each.
    #[prost(message, repeated, tag = "1")]
    pub metrics: Vec<Metric>,
}

/// Log severity, ordered from least to most severe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Severity {
    /// Not known (the line carried no recognisable level).
    Unspecified = 0,
    /// Finer than debug.
    Trace = 1,
    /// Debugging detail.
    Debug = 2,
    /// Normal operation.
    Info = 3,
    /// Something unexpected that did not fail.
    Warn = 4,
    /// An operation failed.
    Error = 5,
    /// The program cannot go on.
    Fatal = 6,
}

/// A structured `key=value` field of a log record.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Field {
    /// Field name.
    #[prost(string, tag = "1")]
    pub key: String,
    /// Field value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// One log line.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LogRecord {
    /// Nanoseconds since the Unix epoch.
    #[prost(uint64, tag = "1")]
    pub timestamp_ns: u64,
    /// A [`Severity`] as its `i32`.
    #[prost(enumeration = "Severity", tag = "2")]
    pub severity: i32,
    /// Where the line came from, e.g. the file path.
    #[prost(string, tag = "3")]
    pub source: String,
    /// The line, without its line terminator.
    #[prost(string, tag = "4")]
    pub message: String,
    /// Structured fields, if the source has any.
    #[prost(message, repeated, tag = "5")]
    pub fields: Vec<Field>,
    /// A stable identity of the file the line was read from: a random non-zero number the
    /// agent assigned when it first saw the file, kept in its checkpoint across restarts and
    /// by a copy recognised after copytruncate, new for a file truncated and rewritten.
    /// 0 = unknown (older agents, records not read from a file).
    #[prost(uint64, tag = "6")]
    pub file_id: u64,
    /// The byte offset in that file just after the line: where reading resumes after this
    /// record. With `file_id` it lets the collector discard lines an agent sends again after
    /// a restart (its checkpoint lags what it sent). 0 = unknown.
    #[prost(uint64, tag = "7")]
    pub end_offset: u64,
}

/// The payload of a `kind = logs` frame.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LogBatch {
    /// The lines, one record each.
    #[prost(message, repeated, tag = "1")]
    pub records: Vec<LogRecord>,
}

// ---------------------------------------------------------------------------------------
// Codec: encode, decode and validate payloads.
// ---------------------------------------------------------------------------------------

use crate::limits::{Limit, LimitError, Limits, HEADER_LEN};
use prost::Message as _;

/// What is wrong with one record (a [`Metric`] or a [`LogRecord`]).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum RecordError {
    /// A length or count above its bound.
    #[error(transparent)]
    Limit(#[from] LimitError),
    /// A metric name outside the Prometheus grammar `[a-zA-Z_:][a-zA-Z0-9_:]*`
    /// (Prometheus data model, "Metric names and labels").
    #[error("metric name {name:?} does not match [a-zA-Z_:][a-zA-Z0-9_:]*")]
    BadMetricName {
        /// The name found.
        name: String,
    },
    /// A label name outside the Prometheus grammar `[a-zA-Z_][a-zA-Z0-9_]*`, or starting
    /// with `__` (reserved for Prometheus-internal use by the same document).
    #[error("label name {name:?} does not match [a-zA-Z_][a-zA-Z0-9_]* or starts with __")]
    BadLabelName {
        /// The name found.
        name: String,
    },
    /// The same label name twice on one metric (a series is a label *set*).
    #[error("label {name:?} appears more than once")]
    DuplicateLabel {
        /// The repeated name.
        name: String,
    },
    /// A metric type other than counter, gauge or histogram (including unspecified).
    #[error("metric type {value} is not counter (1), gauge (2) or histogram (3)")]
    BadMetricType {
        /// The enum value found.
        value: i32,
    },
    /// Buckets on a metric that is not a histogram.
    #[error("{buckets} buckets on a metric of type {value}, only histograms have buckets")]
    BucketsOnNonHistogram {
        /// Number of buckets found.
        buckets: usize,
        /// The metric type value.
        value: i32,
    },
    /// Bucket upper bounds not strictly increasing (or NaN): Prometheus `le` values are
    /// distinct and ordered.
    #[error("bucket {bucket}: upper bound {upper_bound} not above the previous bucket's")]
    BucketOrder {
        /// Index of the offending bucket.
        bucket: usize,
        /// Its upper bound.
        upper_bound: f64,
    },
    /// Cumulative bucket counts that decrease (buckets are cumulative, DESIGN.md §3 rule 2).
    #[error("bucket {bucket}: cumulative count {count} below the previous bucket's {previous}")]
    BucketCountDecreasing {
        /// Index of the offending bucket.
        bucket: usize,
        /// Its cumulative count.
        count: u64,
        /// The previous bucket's cumulative count.
        previous: u64,
    },
    /// Histogram `count` (the `+Inf` bucket) below the last bucket's cumulative count.
    #[error("histogram count {count} below the last bucket's cumulative count {last}")]
    HistogramCountBelowBuckets {
        /// The `count` field.
        count: u64,
        /// The last bucket's cumulative count.
        last: u64,
    },
    /// A log severity outside the schema's enum.
    #[error("log severity {value} is not a known Severity (0..=6)")]
    BadSeverity {
        /// The enum value found.
        value: i32,
    },
    /// The samples of a `crate::samples::SampleSeries` are malformed.
    #[error(transparent)]
    Samples(#[from] SamplesError),
}

/// What is wrong with the samples of a `crate::samples::SampleSeries` (its name, labels and
/// type are checked by the metric rules, [`validate_metric`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SamplesError {
    /// A type other than counter, gauge or untyped.
    #[error(
        "sample series of type {value}: only counter (1), gauge (2) and untyped (4) carry samples"
    )]
    BadType {
        /// The enum value found.
        value: i32,
    },
    /// No samples, or more than `crate::limits::MAX_SAMPLES_PER_SERIES`.
    #[error(
        "{found} samples, a series carries 1 to {}",
        crate::limits::MAX_SAMPLES_PER_SERIES
    )]
    Count {
        /// Samples found.
        found: usize,
    },
    /// `offsets_us` and `values` differ in length.
    #[error("{offsets} offsets for {values} values")]
    LengthMismatch {
        /// Offsets found.
        offsets: usize,
        /// Values found.
        values: usize,
    },
    /// `start_us` is not after the Unix epoch.
    #[error("start_us {start_us} is not after the Unix epoch")]
    BadStart {
        /// The value found.
        start_us: i64,
    },
    /// An offset smaller than the one before it.
    #[error("offset {index} goes back in time")]
    OffsetDecreasing {
        /// Index of the offending sample.
        index: usize,
    },
}

/// Why a series-dictionary body (`kind = metrics_dict`) was rejected (a malformed payload).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DictError {
    /// The body ends inside a record, or a varint runs past 10 bytes.
    #[error("truncated or malformed at byte {offset}")]
    Truncated {
        /// Byte offset in the body.
        offset: usize,
    },
    /// A body version other than 1 (or an empty body).
    #[error("body version {found:?}, expected 1")]
    Version {
        /// The version byte, `None` for an empty body.
        found: Option<u8>,
    },
    /// An id outside `0..u32::MAX`.
    #[error("series id out of range at byte {offset}")]
    BadId {
        /// Byte offset of the record.
        offset: usize,
    },
    /// A string that is not UTF-8.
    #[error("a string at byte {offset} is not UTF-8")]
    Utf8 {
        /// Byte offset of the string.
        offset: usize,
    },
    /// A definition with the timestamp flag set.
    #[error("definition of series {id} with a timestamp")]
    TimestampOnDefinition {
        /// The id.
        id: u32,
    },
    /// A value for an id neither defined in the frame nor known to the receiver.
    #[error("series {id} is neither defined in the frame nor known")]
    UnknownSeries {
        /// The id.
        id: u32,
    },
    /// An id defined again with another definition in the same epoch.
    #[error("series {id} defined again with another definition")]
    Conflict {
        /// The id.
        id: u32,
    },
    /// A histogram value for a series that is not a histogram, or the reverse.
    #[error("series {id}: value does not match its type")]
    TypeMismatch {
        /// The id.
        id: u32,
    },
    /// A histogram whose count is below its last bucket's cumulative count, or whose
    /// cumulative counts overflow.
    #[error("series {id}: histogram counts inconsistent")]
    HistogramCounts {
        /// The id.
        id: u32,
    },
}

/// Why a payload was rejected.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum PayloadError {
    /// Not a valid protobuf message of the expected type (includes invalid UTF-8 strings).
    #[error("not a valid {message}: {source}")]
    Protobuf {
        /// The message type expected (`MetricBatch` or `LogBatch`).
        message: &'static str,
        /// prost's description.
        #[source]
        source: prost::DecodeError,
    },
    /// A batch-level bound: payload size or records per frame.
    #[error("batch: {0}")]
    Batch(#[source] LimitError),
    /// One record is invalid; the whole payload is rejected.
    #[error("record {index}: {source}")]
    Record {
        /// Index of the record in the batch.
        index: usize,
        /// What is wrong with it.
        #[source]
        source: RecordError,
    },
    /// A series-dictionary body that is malformed or names a series it cannot.
    #[error("series dictionary: {0}")]
    Dictionary(#[from] DictError),
    /// A heartbeat frame with a non-empty payload.
    #[error("heartbeat frame carries a {len}-byte payload, must be empty")]
    HeartbeatPayload {
        /// Payload bytes found.
        len: usize,
    },
}

/// Byte classes of the Prometheus name grammars, one bit each (a table lookup per byte
/// instead of several range tests: names are checked for every sample).
const METRIC_START: u8 = 1;
const METRIC_CONTINUE: u8 = 2;
const LABEL_START: u8 = 4;
const LABEL_CONTINUE: u8 = 8;

const NAME_CLASSES: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        let b = i as u8;
        let alpha = b.is_ascii_alphabetic() || b == b'_';
        let digit = b.is_ascii_digit();
        let mut class = 0;
        if alpha || b == b':' {
            class |= METRIC_START | METRIC_CONTINUE;
        }
        if digit {
            class |= METRIC_CONTINUE | LABEL_CONTINUE;
        }
        if alpha {
            class |= LABEL_START | LABEL_CONTINUE;
        }
        table[i] = class;
        i += 1;
    }
    table
};

/// True when `name` is non-empty, its first byte has class `start` and every other byte
/// class `rest`.
fn name_matches(name: &str, start: u8, rest: u8) -> bool {
    let class = |b: &u8| NAME_CLASSES[usize::from(*b)]; // a u8 always indexes 256 entries
    match name.as_bytes().split_first() {
        Some((first, tail)) => {
            class(first) & start != 0 && tail.iter().fold(rest, |all, b| all & class(b)) != 0
        }
        None => false,
    }
}

/// `[a-zA-Z_:][a-zA-Z0-9_:]*`
pub fn is_valid_metric_name(name: &str) -> bool {
    name_matches(name, METRIC_START, METRIC_CONTINUE)
}

/// `[a-zA-Z_][a-zA-Z0-9_]*` and not starting with `__`.
pub fn is_valid_label_name(name: &str) -> bool {
    name_matches(name, LABEL_START, LABEL_CONTINUE) && !name.starts_with("__")
}

/// Read access to a label, owned ([`Label`]) or borrowed
/// ([`crate::borrowed::LabelView`]), so that one implementation of each rule serves both.
pub trait LabelParts {
    /// The label name.
    fn name(&self) -> &str;
    /// The label value.
    fn value(&self) -> &str;
}

impl LabelParts for Label {
    fn name(&self) -> &str {
        &self.name
    }
    fn value(&self) -> &str {
        &self.value
    }
}

/// Read access to the fields of a metric record, owned ([`Metric`]) or borrowed
/// ([`crate::borrowed::MetricView`]), so that validation and the collector's store have one
/// implementation for both.
pub trait MetricParts {
    /// The label type.
    type Label: LabelParts;
    /// Metric name.
    fn name(&self) -> &str;
    /// HELP text.
    fn help(&self) -> &str;
    /// The [`MetricType`] value as sent (may be out of range before validation).
    fn kind(&self) -> i32;
    /// Labels in payload order.
    fn labels(&self) -> &[Self::Label];
    /// Histogram buckets.
    fn buckets(&self) -> &[Bucket];
    /// Counter or gauge value.
    fn value(&self) -> f64;
    /// Histogram count.
    fn count(&self) -> u64;
    /// Histogram sum.
    fn sum(&self) -> f64;
    /// When the value was collected, ms since the Unix epoch; 0 (the default) means "the
    /// frame's timestamp" ([`Metric::timestamp_ms`]).
    fn timestamp_ms(&self) -> i64 {
        0
    }
}

impl<M: MetricParts + ?Sized> MetricParts for &M {
    type Label = M::Label;
    fn name(&self) -> &str {
        (**self).name()
    }
    fn help(&self) -> &str {
        (**self).help()
    }
    fn kind(&self) -> i32 {
        (**self).kind()
    }
    fn labels(&self) -> &[M::Label] {
        (**self).labels()
    }
    fn buckets(&self) -> &[Bucket] {
        (**self).buckets()
    }
    fn value(&self) -> f64 {
        (**self).value()
    }
    fn count(&self) -> u64 {
        (**self).count()
    }
    fn sum(&self) -> f64 {
        (**self).sum()
    }
    fn timestamp_ms(&self) -> i64 {
        (**self).timestamp_ms()
    }
}

impl MetricParts for Metric {
    type Label = Label;
    fn name(&self) -> &str {
        &self.name
    }
    fn help(&self) -> &str {
        &self.help
    }
    fn kind(&self) -> i32 {
        self.r#type
    }
    fn labels(&self) -> &[Label] {
        &self.labels
    }
    fn buckets(&self) -> &[Bucket] {
        &self.buckets
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

/// Check one metric against the grammar rules and `limits` (string lengths, label count and
/// uniqueness, type, histogram bucket order).
///
/// # Errors
/// The first [`RecordError`] found.
pub fn validate_metric(metric: &Metric, limits: &Limits) -> Result<(), RecordError> {
    check_metric(metric, limits)
}

/// The metric rules, for owned and borrowed records alike.
pub(crate) fn check_metric<M: MetricParts>(metric: &M, limits: &Limits) -> Result<(), RecordError> {
    let name = metric.name();
    limits.check(Limit::NameLen, name.len())?;
    if !is_valid_metric_name(name) {
        return Err(RecordError::BadMetricName {
            name: name.to_owned(),
        });
    }
    limits.check(Limit::HelpLen, metric.help().len())?;
    let value = metric.kind();
    let kind = MetricType::try_from(value)
        .ok()
        .filter(|t| *t != MetricType::Unspecified)
        .ok_or(RecordError::BadMetricType { value })?;
    let labels = metric.labels();
    limits.check(Limit::Labels, labels.len())?;
    for (i, label) in labels.iter().enumerate() {
        let label_name = label.name();
        limits.check(Limit::LabelNameLen, label_name.len())?;
        limits.check(Limit::LabelValueLen, label.value().len())?;
        if !is_valid_label_name(label_name) {
            return Err(RecordError::BadLabelName {
                name: label_name.to_owned(),
            });
        }
        // At most `max_labels` (default 64) labels: a quadratic scan beats hashing here.
        if labels
            .iter()
            .take(i)
            .any(|earlier| earlier.name() == label_name)
        {
            return Err(RecordError::DuplicateLabel {
                name: label_name.to_owned(),
            });
        }
    }
    let buckets = metric.buckets();
    limits.check(Limit::Buckets, buckets.len())?;
    if kind != MetricType::Histogram {
        if !buckets.is_empty() {
            return Err(RecordError::BucketsOnNonHistogram {
                buckets: buckets.len(),
                value,
            });
        }
        return Ok(());
    }
    let mut previous: Option<&Bucket> = None;
    for (i, bucket) in buckets.iter().enumerate() {
        if bucket.upper_bound.is_nan()
            || previous.is_some_and(|p| bucket.upper_bound <= p.upper_bound)
        {
            return Err(RecordError::BucketOrder {
                bucket: i,
                upper_bound: bucket.upper_bound,
            });
        }
        if let Some(p) = previous.filter(|p| bucket.cumulative_count < p.cumulative_count) {
            return Err(RecordError::BucketCountDecreasing {
                bucket: i,
                count: bucket.cumulative_count,
                previous: p.cumulative_count,
            });
        }
        previous = Some(bucket);
    }
    let count = metric.count();
    if let Some(last) = previous.filter(|last| count < last.cumulative_count) {
        return Err(RecordError::HistogramCountBelowBuckets {
            count,
            last: last.cumulative_count,
        });
    }
    Ok(())
}

/// Check one log record against `limits` and the severity enum.
///
/// # Errors
/// The first [`RecordError`] found.
pub fn validate_log_record(record: &LogRecord, limits: &Limits) -> Result<(), RecordError> {
    if Severity::try_from(record.severity).is_err() {
        return Err(RecordError::BadSeverity {
            value: record.severity,
        });
    }
    limits.check(Limit::LogSourceLen, record.source.len())?;
    limits.check(Limit::LogMessageLen, record.message.len())?;
    limits.check(Limit::Fields, record.fields.len())?;
    for field in &record.fields {
        limits.check(Limit::FieldKeyLen, field.key.len())?;
        limits.check(Limit::FieldValueLen, field.value.len())?;
    }
    Ok(())
}

fn check_batch_bytes(payload: &[u8], limits: &Limits) -> Result<(), PayloadError> {
    limits
        .check(Limit::FrameBytes, payload.len().saturating_add(HEADER_LEN))
        .map_err(PayloadError::Batch)
}

/// Decode and validate the payload of a metrics frame.
///
/// The payload is bounded by `max_frame_bytes` before protobuf decoding, so allocation is
/// bounded by the input size; then every metric passes [`validate_metric`].
///
/// # Errors
/// [`PayloadError::Batch`] (payload too large, too many records), [`PayloadError::Protobuf`]
/// (malformed, invalid UTF-8), [`PayloadError::Record`].
pub fn decode_metric_batch(payload: &[u8], limits: &Limits) -> Result<MetricBatch, PayloadError> {
    let mut batch = MetricBatch::default();
    decode_metric_batch_into(payload, limits, &mut batch)?;
    Ok(batch)
}

/// As [`decode_metric_batch`], decoding into `batch` and reusing its memory: each metric
/// slot already in `batch.metrics` is cleared and merged in place, so its `name` and `help`
/// strings and its label vector keep their capacity, and a receiver that keeps one batch
/// per connection stops allocating for them after the first frame (the collector's worker
/// does; one allocation per string was the largest cost of ingesting a frame). The result
/// is the same as [`decode_metric_batch`]'s: `batch.metrics` holds exactly the payload's
/// metrics, in order. On error `batch` holds unspecified (valid) metrics.
///
/// Memory stays bounded: at most `limits.max_records_per_frame` slots are kept; entries
/// beyond that are still decoded (so malformed input reports the same protobuf error) into
/// one spare slot and reported as [`PayloadError::Batch`].
///
/// # Errors
/// As [`decode_metric_batch`].
pub fn decode_metric_batch_into(
    payload: &[u8],
    limits: &Limits,
    batch: &mut MetricBatch,
) -> Result<(), PayloadError> {
    use prost::encoding::{decode_key, message, skip_field, DecodeContext};
    check_batch_bytes(payload, limits)?;
    let protobuf = |source| PayloadError::Protobuf {
        message: "MetricBatch",
        source,
    };
    let keep = limits.max_records_per_frame;
    let mut buf = payload;
    let mut count = 0usize;
    let mut spare = Metric::default();
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf).map_err(protobuf)?;
        if tag != 1 {
            // Unknown fields are skipped, as prost's generated decoder does.
            skip_field(wire_type, tag, &mut buf, DecodeContext::default()).map_err(protobuf)?;
            continue;
        }
        let slot = if count < keep {
            if count == batch.metrics.len() {
                batch.metrics.push(Metric::default());
            }
            batch.metrics.get_mut(count).unwrap_or(&mut spare)
        } else {
            &mut spare
        };
        slot.clear();
        message::merge(wire_type, slot, &mut buf, DecodeContext::default()).map_err(protobuf)?;
        count += 1;
    }
    batch.metrics.truncate(count.min(keep));
    limits
        .check(Limit::RecordsPerFrame, count)
        .map_err(PayloadError::Batch)?;
    for (index, metric) in batch.metrics.iter().enumerate() {
        validate_metric(metric, limits).map_err(|source| PayloadError::Record { index, source })?;
    }
    Ok(())
}

/// Decode and validate the payload of a logs frame.
///
/// # Errors
/// As [`decode_metric_batch`], with [`validate_log_record`] per record.
pub fn decode_log_batch(payload: &[u8], limits: &Limits) -> Result<LogBatch, PayloadError> {
    check_batch_bytes(payload, limits)?;
    let batch = LogBatch::decode(payload).map_err(|source| PayloadError::Protobuf {
        message: "LogBatch",
        source,
    })?;
    limits
        .check(Limit::RecordsPerFrame, batch.records.len())
        .map_err(PayloadError::Batch)?;
    for (index, record) in batch.records.iter().enumerate() {
        validate_log_record(record, limits)
            .map_err(|source| PayloadError::Record { index, source })?;
    }
    Ok(batch)
}

/// Encode a metric batch (no validation; see [`validate_metric`]).
pub fn encode_metric_batch(batch: &MetricBatch) -> Vec<u8> {
    batch.encode_to_vec()
}

/// Encode a log batch (no validation; see [`validate_log_record`]).
pub fn encode_log_batch(batch: &LogBatch) -> Vec<u8> {
    batch.encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counter() -> Metric {
        Metric {
            name: "node_cpu_seconds_total".into(),
            help: "Seconds the CPUs spent in each mode.".into(),
            r#type: MetricType::Counter as i32,
            labels: vec![
                Label {
                    name: "cpu".into(),
                    value: "0".into(),
                },
                Label {
                    name: "mode".into(),
                    value: "idle".into(),
                },
            ],
            value: 12345.67,
            ..Default::default()
        }
    }

    fn histogram() -> Metric {
        Metric {
            name: "http_request_duration_seconds".into(),
            r#type: MetricType::Histogram as i32,
            buckets: vec![
                Bucket {
                    upper_bound: 0.1,
                    cumulative_count: 1,
                },
                Bucket {
                    upper_bound: 1.0,
                    cumulative_count: 5,
                },
            ],
            count: 6,
            sum: 3.5,
            ..Default::default()
        }
    }

    fn metric_err(m: Metric) -> RecordError {
        validate_metric(&m, &Limits::default()).unwrap_err()
    }

    #[test]
    fn decoding_into_a_reused_batch_gives_the_fresh_result() {
        let limits = Limits::default();
        let mut gauge = counter();
        gauge.name = "node_load1".into();
        gauge.help = String::new();
        gauge.r#type = MetricType::Gauge as i32;
        gauge.labels.truncate(1);
        let big = encode_metric_batch(&MetricBatch {
            metrics: vec![counter(), histogram(), counter(), counter()],
        });
        let small = encode_metric_batch(&MetricBatch {
            metrics: vec![gauge.clone(), counter()],
        });
        let mut batch = MetricBatch::default();
        for payload in [&big, &small, &big, &small] {
            decode_metric_batch_into(payload, &limits, &mut batch).unwrap();
            assert_eq!(batch, decode_metric_batch(payload, &limits).unwrap());
        }
        // The first slot held a counter with help and two labels; the gauge replaced it
        // whole (no help, one label), not merged on top of it.
        assert_eq!(batch.metrics[0], gauge);
    }

    #[test]
    fn a_reused_batch_keeps_at_most_the_record_limit() {
        let few = Limits {
            max_records_per_frame: 2,
            ..Limits::default()
        };
        let five = encode_metric_batch(&MetricBatch {
            metrics: vec![counter(); 5],
        });
        let mut batch = MetricBatch::default();
        assert_eq!(
            decode_metric_batch_into(&five, &few, &mut batch),
            Err(PayloadError::Batch(LimitError {
                limit: Limit::RecordsPerFrame,
                value: 5,
                bound: 2
            }))
        );
        assert_eq!(batch.metrics.len(), 2);
        // Malformed input past the limit is still reported as malformed.
        let mut broken = five.clone();
        broken.push(0x0a);
        broken.push(0x05);
        assert!(matches!(
            decode_metric_batch_into(&broken, &few, &mut batch),
            Err(PayloadError::Protobuf { .. })
        ));
    }

    #[test]
    fn grammar() {
        for ok in ["a", "_", ":", "node_cpu_seconds_total", "a:b_c9"] {
            assert!(is_valid_metric_name(ok), "{ok}");
        }
        for bad in ["", "9a", "a-b", "a b", "é", "a.b"] {
            assert!(!is_valid_metric_name(bad), "{bad}");
        }
        for ok in ["a", "_a", "cpu", "le", "A9_"] {
            assert!(is_valid_label_name(ok), "{ok}");
        }
        for bad in ["", "9", "a:b", "__name__", "__", "a-b", "ü"] {
            assert!(!is_valid_label_name(bad), "{bad}");
        }
    }

    proptest::proptest! {
        /// The byte-class tables say what the grammars say, byte by byte.
        #[test]
        fn grammar_tables_match_the_grammar(name in "[a-zA-Z0-9_:. é-]{0,6}|\\PC{0,4}") {
            let metric_start = |b: u8| b.is_ascii_alphabetic() || b == b'_' || b == b':';
            let metric_rest = |b: u8| metric_start(b) || b.is_ascii_digit();
            let label_start = |b: u8| b.is_ascii_alphabetic() || b == b'_';
            let label_rest = |b: u8| label_start(b) || b.is_ascii_digit();
            let bytes = name.as_bytes();
            let metric = bytes.first().is_some_and(|b| metric_start(*b))
                && bytes.iter().skip(1).all(|b| metric_rest(*b));
            let label = bytes.first().is_some_and(|b| label_start(*b))
                && bytes.iter().skip(1).all(|b| label_rest(*b))
                && !name.starts_with("__");
            proptest::prop_assert_eq!(is_valid_metric_name(&name), metric, "{:?}", name);
            proptest::prop_assert_eq!(is_valid_label_name(&name), label, "{:?}", name);
        }
    }

    #[test]
    fn valid_records_round_trip() {
        let batch = MetricBatch {
            metrics: vec![counter(), histogram()],
        };
        let bytes = encode_metric_batch(&batch);
        assert_eq!(decode_metric_batch(&bytes, &Limits::default()), Ok(batch));
        let logs = LogBatch {
            records: vec![LogRecord {
                timestamp_ns: 5,
                severity: Severity::Warn as i32,
                source: "/var/log/syslog".into(),
                message: "disk almost full".into(),
                fields: vec![Field {
                    key: "unit".into(),
                    value: "sda".into(),
                }],
                file_id: 0x9e37_79b9_7f4a_7c15,
                end_offset: 1 << 40,
            }],
        };
        let bytes = encode_log_batch(&logs);
        assert_eq!(decode_log_batch(&bytes, &Limits::default()), Ok(logs));
    }

    #[test]
    fn log_file_identity_is_tags_6_and_7_and_optional() {
        let record = LogRecord {
            message: "m".into(),
            file_id: 300,
            end_offset: 1,
            ..Default::default()
        };
        // message (tag 4) "m", file_id (tag 6, varint 300 = ac 02), end_offset (tag 7) 1.
        assert_eq!(
            record.encode_to_vec(),
            [0x22, 0x01, b'm', 0x30, 0xac, 0x02, 0x38, 0x01]
        );
        assert_eq!(
            LogRecord::decode(&[0x22, 0x01, b'm', 0x30, 0xac, 0x02, 0x38, 0x01][..]),
            Ok(record)
        );
        // An older agent sends neither: both read 0 (unknown); 0 is not sent.
        let old = LogRecord::decode(&[0x22, 0x01, b'm'][..]).expect("older record");
        assert_eq!((old.file_id, old.end_offset), (0, 0));
        assert_eq!(old.encode_to_vec(), [0x22, 0x01, b'm']);
    }

    #[test]
    fn each_metric_rule_is_enforced() {
        let limit = |limit, value, bound| {
            RecordError::Limit(LimitError {
                limit,
                value,
                bound,
            })
        };
        let mut m = counter();
        m.name = "n".repeat(257);
        assert_eq!(metric_err(m), limit(Limit::NameLen, 257, 256));
        let mut m = counter();
        m.name = "1bad".into();
        assert_eq!(
            metric_err(m),
            RecordError::BadMetricName {
                name: "1bad".into()
            }
        );
        let mut m = counter();
        m.help = "h".repeat(1025);
        assert_eq!(metric_err(m), limit(Limit::HelpLen, 1025, 1024));
        for t in [0, 5, -1] {
            let mut m = counter();
            m.r#type = t;
            assert_eq!(metric_err(m), RecordError::BadMetricType { value: t });
        }
        let mut m = counter();
        m.labels = (0..65)
            .map(|i| Label {
                name: format!("l{i}"),
                value: String::new(),
            })
            .collect();
        assert_eq!(metric_err(m), limit(Limit::Labels, 65, 64));
        let mut m = counter();
        m.labels[0].name = "l".repeat(129);
        assert_eq!(metric_err(m), limit(Limit::LabelNameLen, 129, 128));
        let mut m = counter();
        m.labels[0].value = "v".repeat(1025);
        assert_eq!(metric_err(m), limit(Limit::LabelValueLen, 1025, 1024));
        let mut m = counter();
        m.labels[0].name = "__name__".into();
        assert_eq!(
            metric_err(m),
            RecordError::BadLabelName {
                name: "__name__".into()
            }
        );
        let mut m = counter();
        m.labels[1].name = "cpu".into();
        assert_eq!(
            metric_err(m),
            RecordError::DuplicateLabel { name: "cpu".into() }
        );
        let mut m = counter();
        m.buckets = histogram().buckets;
        assert_eq!(
            metric_err(m),
            RecordError::BucketsOnNonHistogram {
                buckets: 2,
                value: 1
            }
        );
        let mut m = histogram();
        m.buckets = (0..129)
            .map(|i| Bucket {
                upper_bound: f64::from(i),
                cumulative_count: 0,
            })
            .collect();
        assert_eq!(metric_err(m), limit(Limit::Buckets, 129, 128));
    }

    #[test]
    fn histogram_rules_are_enforced() {
        let mut m = histogram();
        m.buckets[1].upper_bound = 0.1;
        assert!(matches!(
            metric_err(m),
            RecordError::BucketOrder { bucket: 1, .. }
        ));
        let mut m = histogram();
        m.buckets[0].upper_bound = f64::NAN;
        assert!(matches!(
            metric_err(m),
            RecordError::BucketOrder { bucket: 0, .. }
        ));
        let mut m = histogram();
        m.buckets[1].cumulative_count = 0;
        assert_eq!(
            metric_err(m),
            RecordError::BucketCountDecreasing {
                bucket: 1,
                count: 0,
                previous: 1
            }
        );
        let mut m = histogram();
        m.count = 4;
        assert_eq!(
            metric_err(m),
            RecordError::HistogramCountBelowBuckets { count: 4, last: 5 }
        );
        let mut m = histogram();
        m.buckets.push(Bucket {
            upper_bound: f64::INFINITY,
            cumulative_count: 6,
        });
        assert_eq!(validate_metric(&m, &Limits::default()), Ok(()));
    }

    #[test]
    fn each_log_rule_is_enforced() {
        let limits = Limits::default();
        let err = |r: LogRecord| validate_log_record(&r, &limits).unwrap_err();
        let limit = |limit, value, bound| {
            RecordError::Limit(LimitError {
                limit,
                value,
                bound,
            })
        };
        assert_eq!(
            err(LogRecord {
                severity: 7,
                ..Default::default()
            }),
            RecordError::BadSeverity { value: 7 }
        );
        assert_eq!(
            err(LogRecord {
                source: "s".repeat(4097),
                ..Default::default()
            }),
            limit(Limit::LogSourceLen, 4097, 4096)
        );
        assert_eq!(
            err(LogRecord {
                message: "m".repeat(16 * 1024 + 1),
                ..Default::default()
            }),
            limit(Limit::LogMessageLen, 16385, 16384)
        );
        let field = |k: usize, v: usize| Field {
            key: "k".repeat(k),
            value: "v".repeat(v),
        };
        assert_eq!(
            err(LogRecord {
                fields: (0..65).map(|_| field(1, 1)).collect(),
                ..Default::default()
            }),
            limit(Limit::Fields, 65, 64)
        );
        assert_eq!(
            err(LogRecord {
                fields: vec![field(129, 1)],
                ..Default::default()
            }),
            limit(Limit::FieldKeyLen, 129, 128)
        );
        assert_eq!(
            err(LogRecord {
                fields: vec![field(1, 1025)],
                ..Default::default()
            }),
            limit(Limit::FieldValueLen, 1025, 1024)
        );
    }

    #[test]
    fn batch_errors() {
        let limits = Limits::default();
        // Payload larger than a frame can carry.
        let big = vec![0u8; 4096];
        assert_eq!(
            decode_metric_batch(&big, &limits),
            Err(PayloadError::Batch(LimitError {
                limit: Limit::FrameBytes,
                value: 4096 + 64,
                bound: 4096
            }))
        );
        // Too many records.
        let few = Limits {
            max_records_per_frame: 1,
            ..Limits::default()
        };
        let two = encode_metric_batch(&MetricBatch {
            metrics: vec![counter(), counter()],
        });
        assert_eq!(
            decode_metric_batch(&two, &few),
            Err(PayloadError::Batch(LimitError {
                limit: Limit::RecordsPerFrame,
                value: 2,
                bound: 1
            }))
        );
        let two_logs = encode_log_batch(&LogBatch {
            records: vec![LogRecord::default(), LogRecord::default()],
        });
        assert!(matches!(
            decode_log_batch(&two_logs, &few),
            Err(PayloadError::Batch(LimitError {
                limit: Limit::RecordsPerFrame,
                ..
            }))
        ));
        // Record index is reported.
        let mut bad = counter();
        bad.name = "bad name".into();
        let bytes = encode_metric_batch(&MetricBatch {
            metrics: vec![counter(), bad],
        });
        assert!(matches!(
            decode_metric_batch(&bytes, &limits),
            Err(PayloadError::Record {
                index: 1,
                source: RecordError::BadMetricName { .. }
            })
        ));
        // Invalid UTF-8 in a string field is a protobuf error (prost checks UTF-8).
        // MetricBatch{metrics: [Metric{name: 0xFF}]}: 0a 03 0a 01 ff
        assert!(matches!(
            decode_metric_batch(&[0x0a, 0x03, 0x0a, 0x01, 0xff], &limits),
            Err(PayloadError::Protobuf {
                message: "MetricBatch",
                ..
            })
        ));
        assert!(matches!(
            decode_log_batch(&[0x0a, 0x03, 0x22, 0x01, 0xff], &limits),
            Err(PayloadError::Protobuf {
                message: "LogBatch",
                ..
            })
        ));
        let bad_log = LogRecord {
            severity: -3,
            ..Default::default()
        };
        assert!(matches!(
            decode_log_batch(
                &encode_log_batch(&LogBatch {
                    records: vec![bad_log]
                }),
                &limits
            ),
            Err(PayloadError::Record {
                index: 0,
                source: RecordError::BadSeverity { value: -3 }
            })
        ));
    }
}
