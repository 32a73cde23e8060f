//! uctel records as OTLP, and the export requests built from them.
//!
//! **Resource.** Each agent is one OTLP resource: `host.name` (the hostname of its
//! `Hello`), `service.instance.id` (its agent id; OTel resource semantic conventions,
//! "Service"), then `outputs.otlp.resource_attributes`. Every record is in one scope,
//! `uctel-collector` with the collector's version.
//!
//! **Metrics** (OTel metrics data model, "Sums", "Gauge", "Histogram"), one data point per
//! sample, its labels as string attributes, its time the sample's own (`timestamp_ms`) or,
//! without one, its frame's; `start_time_unix_nano` 0 (not known: the agents send
//! cumulative state, DESIGN.md §3 rule 2, not the series' start):
//!
//! | uctel type | OTLP |
//! |---|---|
//! | counter | `Sum`, cumulative, monotonic |
//! | gauge, untyped | `Gauge` |
//! | histogram | `Histogram`, cumulative: the finite `le` bounds as `explicit_bounds`, per-bucket counts (the differences of the cumulative ones, the `+Inf` bucket last), `count`, `sum` |
//!
//! **Logs** (OTel logs data model): `time_unix_nano` the record's own time (the frame's
//! when it has none), `observed_time_unix_nano` the frame's time (when the agent read it),
//! `severity_number` by the data model's ranges (trace 1, debug 5, info 9, warn 13,
//! error 17, fatal 21, unspecified 0) and `severity_text` its lower-case name as the JSON
//! Lines sink writes it, `body` the line as a string, attributes the record's fields as
//! strings plus `uctel.source` (where the agent read it), `uctel.stream` and
//! `uctel.stream_seq` (the frame that carried it).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::sync::Arc;

use prost::Message as _;
use uctel_protocol::borrowed::MetricView;
use uctel_protocol::payload::{LogRecord, MetricType, Severity};

use super::proto;
use crate::logsink::{severity_name, LogContext};

/// The resource of one agent (shared by its queued items).
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Agent {
    /// Agent id (`service.instance.id`).
    pub id: String,
    /// Hostname (`host.name`).
    pub instance: String,
}

/// One queued data point: its agent and a [`proto::Metric`] holding that point only.
#[derive(Clone, Debug)]
pub struct Point {
    /// The agent.
    pub agent: Arc<Agent>,
    /// The metric with one data point.
    pub metric: proto::Metric,
}

/// One queued log record: its agent and the OTLP record.
#[derive(Clone, Debug)]
pub struct Record {
    /// The agent.
    pub agent: Arc<Agent>,
    /// The record.
    pub record: proto::LogRecord,
}

/// ns since the Unix epoch of a sample: its own `timestamp_ms`, else the frame's.
fn point_time(timestamp_ms: i64, frame_timestamp_ns: u64) -> u64 {
    match u64::try_from(timestamp_ms) {
        Ok(ms) if ms > 0 => ms.saturating_mul(1_000_000),
        _ => frame_timestamp_ns,
    }
}

/// The OTLP metric of one sample (module docs, "Metrics").
pub fn metric(view: &MetricView<'_>, frame_timestamp_ns: u64) -> proto::Metric {
    let attributes: Vec<proto::KeyValue> = view
        .labels
        .iter()
        .map(|l| proto::KeyValue::string(l.name, l.value))
        .collect();
    let time_unix_nano = point_time(view.timestamp_ms, frame_timestamp_ns);
    let number = || proto::NumberDataPoint {
        attributes: attributes.clone(),
        start_time_unix_nano: 0,
        time_unix_nano,
        as_double: Some(view.value),
    };
    let data = match MetricType::try_from(view.r#type) {
        Ok(MetricType::Counter) => proto::Data::Sum(proto::Sum {
            data_points: vec![number()],
            aggregation_temporality: proto::CUMULATIVE,
            is_monotonic: true,
        }),
        Ok(MetricType::Histogram) => {
            let (explicit_bounds, bucket_counts) = histogram_buckets(view);
            proto::Data::Histogram(proto::Histogram {
                data_points: vec![proto::HistogramDataPoint {
                    attributes: attributes.clone(),
                    start_time_unix_nano: 0,
                    time_unix_nano,
                    count: view.count,
                    sum: Some(view.sum),
                    bucket_counts,
                    explicit_bounds,
                }],
                aggregation_temporality: proto::CUMULATIVE,
            })
        }
        // Gauges, untyped samples (stored and queried as gauges) and, defensively, any
        // other value (the decoder lets only these four through).
        _ => proto::Data::Gauge(proto::Gauge {
            data_points: vec![number()],
        }),
    };
    proto::Metric {
        name: view.name.to_owned(),
        description: view.help.to_owned(),
        unit: String::new(),
        data: Some(data),
    }
}

/// The finite bounds and the per-bucket counts of a histogram sample: cumulative counts
/// differenced, the `+Inf` bucket (its own when the sample has one, else `count` less the
/// last cumulative count) last, so `bucket_counts` has one more entry than the bounds.
/// Counts that decrease (refused by the decoder) are clamped at 0, never a panic.
pub fn histogram_buckets(view: &MetricView<'_>) -> (Vec<f64>, Vec<u64>) {
    let mut bounds = Vec::with_capacity(view.buckets.len());
    let mut counts = Vec::with_capacity(view.buckets.len() + 1);
    let mut previous = 0u64;
    let mut inf = None;
    for b in view.buckets {
        if b.upper_bound == f64::INFINITY {
            inf = Some(b.cumulative_count);
            break;
        }
        bounds.push(b.upper_bound);
        counts.push(b.cumulative_count.saturating_sub(previous));
        previous = b.cumulative_count;
    }
    counts.push(inf.unwrap_or(view.count).saturating_sub(previous));
    (bounds, counts)
}

/// `SeverityNumber` of a uctel severity (OTel logs data model, "Field: SeverityNumber":
/// the first number of each range).
pub fn severity_number(severity: i32) -> i32 {
    match Severity::try_from(severity) {
        Ok(Severity::Trace) => 1,
        Ok(Severity::Debug) => 5,
        Ok(Severity::Info) => 9,
        Ok(Severity::Warn) => 13,
        Ok(Severity::Error) => 17,
        Ok(Severity::Fatal) => 21,
        Ok(Severity::Unspecified) | Err(_) => 0,
    }
}

/// The OTLP log record of `record`, carried by the frame `ctx` (module docs, "Logs").
pub fn log_record(ctx: &LogContext<'_>, record: &LogRecord) -> proto::LogRecord {
    let time_unix_nano = if record.timestamp_ns == 0 {
        ctx.frame_timestamp_ns
    } else {
        record.timestamp_ns
    };
    let mut attributes: Vec<proto::KeyValue> = record
        .fields
        .iter()
        .map(|f| proto::KeyValue::string(&f.key, &f.value))
        .collect();
    attributes.push(proto::KeyValue::string("uctel.source", &record.source));
    attributes.push(proto::KeyValue::string(
        "uctel.stream",
        &uctel_protocol::stream::label(ctx.stream),
    ));
    attributes.push(proto::KeyValue::int(
        "uctel.stream_seq",
        i64::try_from(ctx.stream_seq).unwrap_or(i64::MAX),
    ));
    let severity_number = severity_number(record.severity);
    proto::LogRecord {
        time_unix_nano,
        observed_time_unix_nano: ctx.frame_timestamp_ns,
        severity_number,
        severity_text: if severity_number == 0 {
            String::new()
        } else {
            severity_name(record.severity).to_owned()
        },
        body: Some(proto::AnyValue {
            value: Some(proto::Value::String(record.message.clone())),
        }),
        attributes,
    }
}

/// What every request of the output shares: the extra resource attributes and the scope.
#[derive(Debug, Clone)]
pub struct Shape {
    /// `outputs.otlp.resource_attributes`.
    pub resource_attributes: Vec<proto::KeyValue>,
    /// Gzip the body.
    pub gzip: bool,
}

impl Shape {
    fn resource(&self, agent: &Agent) -> proto::Resource {
        let mut attributes = vec![
            proto::KeyValue::string("host.name", &agent.instance),
            proto::KeyValue::string("service.instance.id", &agent.id),
        ];
        attributes.extend(self.resource_attributes.iter().cloned());
        proto::Resource {
            attributes,
            dropped_attributes_count: 0,
        }
    }

    fn scope() -> proto::InstrumentationScope {
        proto::InstrumentationScope {
            name: "uctel-collector".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        }
    }

    /// The body of an export request of `points`: one resource per agent, one metric per
    /// name and type with the points in queue order.
    ///
    /// # Errors
    /// The compressor's error (writing to memory: not expected).
    pub fn metrics(&self, points: &[Point]) -> Result<Vec<u8>, String> {
        let mut by_agent: BTreeMap<&Agent, Vec<proto::Metric>> = BTreeMap::new();
        for p in points {
            let metrics = by_agent.entry(&p.agent).or_default();
            let same = metrics.iter_mut().rev().find(|m| {
                m.name == p.metric.name && same_kind(m.data.as_ref(), p.metric.data.as_ref())
            });
            match same {
                Some(m) => merge(m, &p.metric),
                None => metrics.push(p.metric.clone()),
            }
        }
        let request = proto::ExportMetricsServiceRequest {
            resource_metrics: by_agent
                .into_iter()
                .map(|(agent, metrics)| proto::ResourceMetrics {
                    resource: Some(self.resource(agent)),
                    scope_metrics: vec![proto::ScopeMetrics {
                        scope: Some(Self::scope()),
                        metrics,
                    }],
                })
                .collect(),
        };
        self.body(&request.encode_to_vec())
    }

    /// The body of an export request of `records`: one resource per agent, the records in
    /// queue order.
    ///
    /// # Errors
    /// The compressor's error (writing to memory: not expected).
    pub fn logs(&self, records: &[Record]) -> Result<Vec<u8>, String> {
        let mut by_agent: BTreeMap<&Agent, Vec<proto::LogRecord>> = BTreeMap::new();
        for r in records {
            by_agent.entry(&r.agent).or_default().push(r.record.clone());
        }
        let request = proto::ExportLogsServiceRequest {
            resource_logs: by_agent
                .into_iter()
                .map(|(agent, log_records)| proto::ResourceLogs {
                    resource: Some(self.resource(agent)),
                    scope_logs: vec![proto::ScopeLogs {
                        scope: Some(Self::scope()),
                        log_records,
                    }],
                })
                .collect(),
        };
        self.body(&request.encode_to_vec())
    }

    fn body(&self, protobuf: &[u8]) -> Result<Vec<u8>, String> {
        if !self.gzip {
            return Ok(protobuf.to_vec());
        }
        let mut gz = flate2::write::GzEncoder::new(
            Vec::with_capacity(protobuf.len() / 4),
            flate2::Compression::fast(),
        );
        gz.write_all(protobuf)
            .and_then(|()| gz.finish())
            .map_err(|e| format!("gzip: {e}"))
    }
}

/// Whether two metrics' data are of one kind with the same temporality and monotonicity.
fn same_kind(a: Option<&proto::Data>, b: Option<&proto::Data>) -> bool {
    match (a, b) {
        (Some(proto::Data::Sum(x)), Some(proto::Data::Sum(y))) => {
            x.is_monotonic == y.is_monotonic
                && x.aggregation_temporality == y.aggregation_temporality
        }
        (Some(proto::Data::Gauge(_)), Some(proto::Data::Gauge(_)))
        | (Some(proto::Data::Histogram(_)), Some(proto::Data::Histogram(_))) => true,
        _ => false,
    }
}

/// Appends the points of `from` to `into` (of the same kind, [`same_kind`]).
fn merge(into: &mut proto::Metric, from: &proto::Metric) {
    match (&mut into.data, &from.data) {
        (Some(proto::Data::Sum(a)), Some(proto::Data::Sum(b))) => {
            a.data_points.extend(b.data_points.iter().cloned());
        }
        (Some(proto::Data::Gauge(a)), Some(proto::Data::Gauge(b))) => {
            a.data_points.extend(b.data_points.iter().cloned());
        }
        (Some(proto::Data::Histogram(a)), Some(proto::Data::Histogram(b))) => {
            a.data_points.extend(b.data_points.iter().cloned());
        }
        _ => {}
    }
}

/// Points in a request body (for tests: decoded back).
#[cfg(test)]
pub(crate) fn count_points(request: &proto::ExportMetricsServiceRequest) -> usize {
    request
        .resource_metrics
        .iter()
        .flat_map(|r| &r.scope_metrics)
        .flat_map(|s| &s.metrics)
        .map(|m| match &m.data {
            Some(proto::Data::Sum(s)) => s.data_points.len(),
            Some(proto::Data::Gauge(g)) => g.data_points.len(),
            Some(proto::Data::Histogram(h)) => h.data_points.len(),
            None => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read as _;
    use uctel_protocol::borrowed::LabelView;
    use uctel_protocol::payload::Bucket;

    fn view<'a>(
        name: &'a str,
        kind: MetricType,
        labels: &'a [LabelView<'a>],
        buckets: &'a [Bucket],
    ) -> MetricView<'a> {
        MetricView {
            name,
            help: "help text",
            r#type: kind as i32,
            labels,
            value: 42.5,
            timestamp_ms: 1_700_000_000_123,
            buckets,
            count: 10,
            sum: 7.25,
        }
    }

    #[test]
    fn counters_are_cumulative_monotonic_sums_and_histograms_per_bucket_counts() {
        let labels = [LabelView {
            name: "cpu",
            value: "0",
        }];
        let m = metric(&view("c_total", MetricType::Counter, &labels, &[]), 5);
        let Some(proto::Data::Sum(s)) = &m.data else {
            panic!("{m:?}")
        };
        assert!(s.is_monotonic);
        assert_eq!(s.aggregation_temporality, proto::CUMULATIVE);
        assert_eq!(s.data_points[0].time_unix_nano, 1_700_000_000_123_000_000);
        assert_eq!(s.data_points[0].as_double, Some(42.5));
        assert_eq!(
            s.data_points[0].attributes,
            [proto::KeyValue::string("cpu", "0")]
        );
        assert_eq!(m.description, "help text");

        let mut g = view("g", MetricType::Untyped, &labels, &[]);
        g.timestamp_ms = 0;
        let m = metric(&g, 77);
        let Some(proto::Data::Gauge(gauge)) = &m.data else {
            panic!("{m:?}")
        };
        assert_eq!(gauge.data_points[0].time_unix_nano, 77, "the frame's time");

        let b = |upper_bound, cumulative_count| Bucket {
            upper_bound,
            cumulative_count,
        };
        let with_inf = [b(0.1, 2), b(1.0, 5), b(f64::INFINITY, 10)];
        let m = metric(&view("h", MetricType::Histogram, &labels, &with_inf), 0);
        let Some(proto::Data::Histogram(h)) = &m.data else {
            panic!("{m:?}")
        };
        let p = &h.data_points[0];
        assert_eq!(p.explicit_bounds, [0.1, 1.0]);
        assert_eq!(p.bucket_counts, [2, 3, 5]);
        assert_eq!((p.count, p.sum), (10, Some(7.25)));
        // Without a +Inf bucket: count less the last cumulative count.
        let no_inf = [b(0.1, 2), b(1.0, 5)];
        let (bounds, counts) =
            histogram_buckets(&view("h", MetricType::Histogram, &labels, &no_inf));
        assert_eq!((bounds, counts), (vec![0.1, 1.0], vec![2, 3, 5]));
        // Decreasing counts (refused by the decoder) do not panic.
        let bad = [b(0.1, 9), b(1.0, 5)];
        let (_, counts) = histogram_buckets(&view("h", MetricType::Histogram, &labels, &bad));
        assert_eq!(counts, [9, 0, 5]);
    }

    #[test]
    fn a_request_groups_points_by_agent_and_metric_and_gunzips_to_the_same_points() {
        let a = Arc::new(Agent {
            id: "a1".into(),
            instance: "host-a".into(),
        });
        let b = Arc::new(Agent {
            id: "b1".into(),
            instance: "host-b".into(),
        });
        let labels = [LabelView {
            name: "x",
            value: "1",
        }];
        let c = metric(&view("c_total", MetricType::Counter, &labels, &[]), 0);
        let g = metric(&view("g", MetricType::Gauge, &labels, &[]), 0);
        let points: Vec<Point> = [(&a, &c), (&b, &c), (&a, &g), (&a, &c)]
            .into_iter()
            .map(|(agent, m)| Point {
                agent: agent.clone(),
                metric: m.clone(),
            })
            .collect();
        let shape = Shape {
            resource_attributes: vec![proto::KeyValue::string("deployment.environment", "lab")],
            gzip: true,
        };
        let body = shape.metrics(&points).unwrap();
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(&body[..])
            .read_to_end(&mut raw)
            .unwrap();
        let req = proto::ExportMetricsServiceRequest::decode(&raw[..]).unwrap();
        assert_eq!(count_points(&req), 4);
        assert_eq!(req.resource_metrics.len(), 2);
        let ra = &req.resource_metrics[0];
        assert_eq!(
            ra.resource.as_ref().unwrap().attributes,
            [
                proto::KeyValue::string("host.name", "host-a"),
                proto::KeyValue::string("service.instance.id", "a1"),
                proto::KeyValue::string("deployment.environment", "lab"),
            ]
        );
        let names: Vec<&str> = ra.scope_metrics[0]
            .metrics
            .iter()
            .map(|m| m.name.as_str())
            .collect();
        assert_eq!(
            names,
            ["c_total", "g"],
            "one metric per name, points merged"
        );
    }

    #[test]
    fn log_records_keep_their_time_severity_body_and_fields() {
        let ctx = LogContext {
            agent: "a1",
            instance: "host-a",
            stream: uctel_protocol::stream::LOGS,
            stream_seq: 9,
            frame_timestamp_ns: 2_000,
        };
        let rec = LogRecord {
            timestamp_ns: 1_000,
            severity: Severity::Warn as i32,
            source: "/var/log/x.log".into(),
            message: "disk almost full".into(),
            fields: vec![uctel_protocol::payload::Field {
                key: "unit".into(),
                value: "sshd.service".into(),
            }],
            ..LogRecord::default()
        };
        let r = log_record(&ctx, &rec);
        assert_eq!(
            (r.time_unix_nano, r.observed_time_unix_nano),
            (1_000, 2_000)
        );
        assert_eq!((r.severity_number, r.severity_text.as_str()), (13, "warn"));
        assert_eq!(
            r.body,
            Some(proto::AnyValue {
                value: Some(proto::Value::String("disk almost full".into()))
            })
        );
        assert_eq!(
            r.attributes,
            [
                proto::KeyValue::string("unit", "sshd.service"),
                proto::KeyValue::string("uctel.source", "/var/log/x.log"),
                proto::KeyValue::string("uctel.stream", "logs"),
                proto::KeyValue::int("uctel.stream_seq", 9),
            ]
        );
        let none = LogRecord {
            timestamp_ns: 0,
            ..rec
        };
        assert_eq!(log_record(&ctx, &none).time_unix_nano, 2_000);
    }
}
