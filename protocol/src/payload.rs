//! Frame payloads: metric batches and log batches, encoded as protobuf.
//!
//! The schema is published as `protocol/proto/uctel.proto` so that producers in any language
//! can emit frames; the types below are its `prost` mirror, kept field-for-field identical
//! (tag numbers included). One record is one [`Metric`] (a histogram counts as one record)
//! or one [`LogRecord`].

/// A `name="value"` label pair.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Label {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

/// The Prometheus type of a [`Metric`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum MetricType {
    Unspecified = 0,
    Counter = 1,
    Gauge = 2,
    Histogram = 3,
}

/// One cumulative histogram bucket: the number of observations `<= upper_bound`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Bucket {
    #[prost(double, tag = "1")]
    pub upper_bound: f64,
    #[prost(uint64, tag = "2")]
    pub cumulative_count: u64,
}

/// One sample of one series. Counters are cumulative, gauges absolute, histograms cumulative
/// buckets plus `count` and `sum` (DESIGN.md §3 rule 2: state, never deltas).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Metric {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub help: String,
    #[prost(enumeration = "MetricType", tag = "3")]
    pub r#type: i32,
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
    #[prost(uint64, tag = "8")]
    pub count: u64,
    #[prost(double, tag = "9")]
    pub sum: f64,
}

/// The payload of a `kind = metrics` frame.
#[derive(Clone, PartialEq, prost::Message)]
pub struct MetricBatch {
    #[prost(message, repeated, tag = "1")]
    pub metrics: Vec<Metric>,
}

/// Log severity, ordered from least to most severe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Severity {
    Unspecified = 0,
    Trace = 1,
    Debug = 2,
    Info = 3,
    Warn = 4,
    Error = 5,
    Fatal = 6,
}

/// A structured `key=value` field of a log record.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Field {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

/// One log line.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LogRecord {
    /// Nanoseconds since the Unix epoch.
    #[prost(uint64, tag = "1")]
    pub timestamp_ns: u64,
    #[prost(enumeration = "Severity", tag = "2")]
    pub severity: i32,
    /// Where the line came from, e.g. the file path.
    #[prost(string, tag = "3")]
    pub source: String,
    #[prost(string, tag = "4")]
    pub message: String,
    #[prost(message, repeated, tag = "5")]
    pub fields: Vec<Field>,
}

/// The payload of a `kind = logs` frame.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LogBatch {
    #[prost(message, repeated, tag = "1")]
    pub records: Vec<LogRecord>,
}
