//! The OTLP wire messages the output sends and reads, as prost messages: the subset of
//! opentelemetry-proto 1.x (Apache-2.0) that metrics and logs export over OTLP/HTTP needs,
//! field numbers as in its `.proto` files:
//!
//! * `opentelemetry/proto/collector/metrics/v1/metrics_service.proto`:
//!   `ExportMetricsServiceRequest`, `ExportMetricsServiceResponse`,
//!   `ExportMetricsPartialSuccess`;
//! * `opentelemetry/proto/collector/logs/v1/logs_service.proto`: the same three for logs;
//! * `opentelemetry/proto/metrics/v1/metrics.proto`: `ResourceMetrics`, `ScopeMetrics`,
//!   `Metric` (`gauge` 5, `sum` 7, `histogram` 9), `NumberDataPoint`,
//!   `HistogramDataPoint`;
//! * `opentelemetry/proto/logs/v1/logs.proto`: `ResourceLogs`, `ScopeLogs`, `LogRecord`;
//! * `opentelemetry/proto/common/v1/common.proto`, `resource/v1/resource.proto`:
//!   `AnyValue`, `KeyValue`, `InstrumentationScope`, `Resource`.
//!
//! Written out with prost's derive (as the remote-write `prompb` module is) rather than
//! generated: the `opentelemetry-proto` crate's message types come with its `tonic` and
//! `opentelemetry` SDK dependencies, and `prost-build` needs `protoc` at build time.
//! Fields the output never sets (exemplars, trace ids, exponential histograms, summaries,
//! `schema_url`) are left out; a receiver reads their absence as the default.

use prost::{Message, Oneof};

/// `ExportMetricsServiceRequest` (1: resource_metrics).
#[derive(Clone, PartialEq, Message)]
pub struct ExportMetricsServiceRequest {
    /// The metrics, per resource (one per agent).
    #[prost(message, repeated, tag = "1")]
    pub resource_metrics: Vec<ResourceMetrics>,
}

/// `ExportMetricsServiceResponse` (1: partial_success).
#[derive(Clone, PartialEq, Message)]
pub struct ExportMetricsServiceResponse {
    /// Set when the receiver refused some data points.
    #[prost(message, optional, tag = "1")]
    pub partial_success: Option<ExportMetricsPartialSuccess>,
}

/// `ExportMetricsPartialSuccess` (1: rejected_data_points, 2: error_message).
#[derive(Clone, PartialEq, Message)]
pub struct ExportMetricsPartialSuccess {
    /// Data points the receiver refused.
    #[prost(int64, tag = "1")]
    pub rejected_data_points: i64,
    /// Why (may be set with 0 rejected: a warning).
    #[prost(string, tag = "2")]
    pub error_message: String,
}

/// `ExportLogsServiceRequest` (1: resource_logs).
#[derive(Clone, PartialEq, Message)]
pub struct ExportLogsServiceRequest {
    /// The log records, per resource (one per agent).
    #[prost(message, repeated, tag = "1")]
    pub resource_logs: Vec<ResourceLogs>,
}

/// `ExportLogsServiceResponse` (1: partial_success).
#[derive(Clone, PartialEq, Message)]
pub struct ExportLogsServiceResponse {
    /// Set when the receiver refused some records.
    #[prost(message, optional, tag = "1")]
    pub partial_success: Option<ExportLogsPartialSuccess>,
}

/// `ExportLogsPartialSuccess` (1: rejected_log_records, 2: error_message).
#[derive(Clone, PartialEq, Message)]
pub struct ExportLogsPartialSuccess {
    /// Log records the receiver refused.
    #[prost(int64, tag = "1")]
    pub rejected_log_records: i64,
    /// Why (may be set with 0 rejected: a warning).
    #[prost(string, tag = "2")]
    pub error_message: String,
}

/// `Resource` (1: attributes, 2: dropped_attributes_count).
#[derive(Clone, PartialEq, Message)]
pub struct Resource {
    /// `host.name`, `service.instance.id`, the configured attributes.
    #[prost(message, repeated, tag = "1")]
    pub attributes: Vec<KeyValue>,
    /// Always 0.
    #[prost(uint32, tag = "2")]
    pub dropped_attributes_count: u32,
}

/// `InstrumentationScope` (1: name, 2: version).
#[derive(Clone, PartialEq, Message)]
pub struct InstrumentationScope {
    /// `uctel-collector`.
    #[prost(string, tag = "1")]
    pub name: String,
    /// The collector's version.
    #[prost(string, tag = "2")]
    pub version: String,
}

/// `KeyValue` (1: key, 2: value).
#[derive(Clone, PartialEq, Message)]
pub struct KeyValue {
    /// The attribute's name.
    #[prost(string, tag = "1")]
    pub key: String,
    /// Its value.
    #[prost(message, optional, tag = "2")]
    pub value: Option<AnyValue>,
}

/// `AnyValue` (a oneof; the output sends strings and integers only).
#[derive(Clone, PartialEq, Message)]
pub struct AnyValue {
    /// The value.
    #[prost(oneof = "Value", tags = "1, 2, 3, 4")]
    pub value: Option<Value>,
}

/// `AnyValue.value`.
#[derive(Clone, PartialEq, Oneof)]
pub enum Value {
    /// 1: string_value.
    #[prost(string, tag = "1")]
    String(String),
    /// 2: bool_value.
    #[prost(bool, tag = "2")]
    Bool(bool),
    /// 3: int_value.
    #[prost(int64, tag = "3")]
    Int(i64),
    /// 4: double_value.
    #[prost(double, tag = "4")]
    Double(f64),
}

impl KeyValue {
    /// A string attribute.
    pub fn string(key: &str, value: &str) -> KeyValue {
        KeyValue {
            key: key.to_owned(),
            value: Some(AnyValue {
                value: Some(Value::String(value.to_owned())),
            }),
        }
    }

    /// An integer attribute.
    pub fn int(key: &str, value: i64) -> KeyValue {
        KeyValue {
            key: key.to_owned(),
            value: Some(AnyValue {
                value: Some(Value::Int(value)),
            }),
        }
    }
}

/// `ResourceMetrics` (1: resource, 2: scope_metrics).
#[derive(Clone, PartialEq, Message)]
pub struct ResourceMetrics {
    /// The agent.
    #[prost(message, optional, tag = "1")]
    pub resource: Option<Resource>,
    /// One scope: the collector.
    #[prost(message, repeated, tag = "2")]
    pub scope_metrics: Vec<ScopeMetrics>,
}

/// `ScopeMetrics` (1: scope, 2: metrics).
#[derive(Clone, PartialEq, Message)]
pub struct ScopeMetrics {
    /// The scope.
    #[prost(message, optional, tag = "1")]
    pub scope: Option<InstrumentationScope>,
    /// The metrics, one per name and type.
    #[prost(message, repeated, tag = "2")]
    pub metrics: Vec<Metric>,
}

/// `Metric` (1: name, 2: description, 3: unit, oneof data).
#[derive(Clone, PartialEq, Message)]
pub struct Metric {
    /// The name (the Prometheus name the agent sent).
    #[prost(string, tag = "1")]
    pub name: String,
    /// The `# HELP` text.
    #[prost(string, tag = "2")]
    pub description: String,
    /// Not known: empty.
    #[prost(string, tag = "3")]
    pub unit: String,
    /// The data points, by type.
    #[prost(oneof = "Data", tags = "5, 7, 9")]
    pub data: Option<Data>,
}

/// `Metric.data`.
#[derive(Clone, PartialEq, Oneof)]
pub enum Data {
    /// 5: gauge.
    #[prost(message, tag = "5")]
    Gauge(Gauge),
    /// 7: sum.
    #[prost(message, tag = "7")]
    Sum(Sum),
    /// 9: histogram.
    #[prost(message, tag = "9")]
    Histogram(Histogram),
}

/// `AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE`.
pub const CUMULATIVE: i32 = 2;

/// `Gauge` (1: data_points).
#[derive(Clone, PartialEq, Message)]
pub struct Gauge {
    /// The points.
    #[prost(message, repeated, tag = "1")]
    pub data_points: Vec<NumberDataPoint>,
}

/// `Sum` (1: data_points, 2: aggregation_temporality, 3: is_monotonic).
#[derive(Clone, PartialEq, Message)]
pub struct Sum {
    /// The points.
    #[prost(message, repeated, tag = "1")]
    pub data_points: Vec<NumberDataPoint>,
    /// [`CUMULATIVE`] for counters.
    #[prost(int32, tag = "2")]
    pub aggregation_temporality: i32,
    /// True for counters.
    #[prost(bool, tag = "3")]
    pub is_monotonic: bool,
}

/// `Histogram` (1: data_points, 2: aggregation_temporality).
#[derive(Clone, PartialEq, Message)]
pub struct Histogram {
    /// The points.
    #[prost(message, repeated, tag = "1")]
    pub data_points: Vec<HistogramDataPoint>,
    /// [`CUMULATIVE`].
    #[prost(int32, tag = "2")]
    pub aggregation_temporality: i32,
}

/// `NumberDataPoint` (7: attributes, 2: start_time_unix_nano, 3: time_unix_nano,
/// 4: as_double).
#[derive(Clone, PartialEq, Message)]
pub struct NumberDataPoint {
    /// The series' labels.
    #[prost(message, repeated, tag = "7")]
    pub attributes: Vec<KeyValue>,
    /// Not known: 0.
    #[prost(fixed64, tag = "2")]
    pub start_time_unix_nano: u64,
    /// The sample's time, ns since the Unix epoch.
    #[prost(fixed64, tag = "3")]
    pub time_unix_nano: u64,
    /// The value.
    #[prost(double, optional, tag = "4")]
    pub as_double: Option<f64>,
}

/// `HistogramDataPoint` (9: attributes, 2: start_time_unix_nano, 3: time_unix_nano,
/// 4: count, 5: sum, 6: bucket_counts, 7: explicit_bounds).
#[derive(Clone, PartialEq, Message)]
pub struct HistogramDataPoint {
    /// The series' labels.
    #[prost(message, repeated, tag = "9")]
    pub attributes: Vec<KeyValue>,
    /// Not known: 0.
    #[prost(fixed64, tag = "2")]
    pub start_time_unix_nano: u64,
    /// The sample's time, ns since the Unix epoch.
    #[prost(fixed64, tag = "3")]
    pub time_unix_nano: u64,
    /// Observations.
    #[prost(fixed64, tag = "4")]
    pub count: u64,
    /// Their sum.
    #[prost(double, optional, tag = "5")]
    pub sum: Option<f64>,
    /// Observations per bucket (not cumulative), one more than `explicit_bounds`.
    #[prost(fixed64, repeated, tag = "6")]
    pub bucket_counts: Vec<u64>,
    /// The finite upper bounds, increasing.
    #[prost(double, repeated, tag = "7")]
    pub explicit_bounds: Vec<f64>,
}

/// `ResourceLogs` (1: resource, 2: scope_logs).
#[derive(Clone, PartialEq, Message)]
pub struct ResourceLogs {
    /// The agent.
    #[prost(message, optional, tag = "1")]
    pub resource: Option<Resource>,
    /// One scope: the collector.
    #[prost(message, repeated, tag = "2")]
    pub scope_logs: Vec<ScopeLogs>,
}

/// `ScopeLogs` (1: scope, 2: log_records).
#[derive(Clone, PartialEq, Message)]
pub struct ScopeLogs {
    /// The scope.
    #[prost(message, optional, tag = "1")]
    pub scope: Option<InstrumentationScope>,
    /// The records.
    #[prost(message, repeated, tag = "2")]
    pub log_records: Vec<LogRecord>,
}

/// `LogRecord` (1: time_unix_nano, 11: observed_time_unix_nano, 2: severity_number,
/// 3: severity_text, 5: body, 6: attributes).
#[derive(Clone, PartialEq, Message)]
pub struct LogRecord {
    /// The record's own time, ns since the Unix epoch.
    #[prost(fixed64, tag = "1")]
    pub time_unix_nano: u64,
    /// When the agent read it (its frame's time), ns since the Unix epoch.
    #[prost(fixed64, tag = "11")]
    pub observed_time_unix_nano: u64,
    /// `SeverityNumber` (OTel logs data model, "Field: SeverityNumber").
    #[prost(int32, tag = "2")]
    pub severity_number: i32,
    /// The severity's name.
    #[prost(string, tag = "3")]
    pub severity_text: String,
    /// The line.
    #[prost(message, optional, tag = "5")]
    pub body: Option<AnyValue>,
    /// The record's fields and where it came from.
    #[prost(message, repeated, tag = "6")]
    pub attributes: Vec<KeyValue>,
}
