//! The OTLP/HTTP output against a small local HTTP server that answers what each test says:
//! the protocol's headers, a gzipped protobuf body holding exactly the samples and log
//! records pushed (field by field), retries after 503 and 429 (`Retry-After` honoured), no
//! retry after 400 or 500, partial success counted as drops, and the sum rule after each.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prost::Message as _;
use uctel_collector::logsink::LogContext;
use uctel_collector::outputs::config::OtlpConfig;
use uctel_collector::outputs::otlp::metrics::{Dropped, Snapshot};
use uctel_collector::outputs::otlp::{self, proto};
use uctel_protocol::borrowed::MetricBatchView;
use uctel_protocol::limits::Limits;
use uctel_protocol::payload::{
    encode_metric_batch, Bucket, Field, Label, LogRecord, Metric, MetricBatch, MetricType, Severity,
};

/// One request as the server saw it.
#[derive(Debug, Clone)]
struct Seen {
    at: Instant,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body, gunzipped.
    fn protobuf(&self) -> Vec<u8> {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&self.body[..])
            .read_to_end(&mut out)
            .unwrap();
        out
    }
}

/// A server answering the `script`'s responses in order, per path (the last one repeats):
/// `"503 Service Unavailable|retry-after: 1"` (status, then extra header lines), or
/// `"partial N message"`: 200 with an export response whose partial success rejects N.
struct Scripted {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Scripted {
    fn start(script: Vec<&'static str>) -> Scripted {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let script = Arc::new(script);
        let log = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let (log, script) = (log.clone(), script.clone());
                std::thread::spawn(move || serve(stream, &log, &script));
            }
        });
        Scripted { addr, seen }
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

fn serve(stream: TcpStream, log: &Mutex<Vec<Seen>>, script: &[&str]) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut out = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let path = line.split(' ').nth(1).unwrap_or("").to_owned();
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((n, v)) = h.split_once(':') {
                headers.push((n.trim().to_owned(), v.trim().to_owned()));
            }
        }
        let len: usize = headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0; len];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        // The script runs per path: each signal gets its answers in order.
        let n = {
            let mut log = log.lock().unwrap();
            log.push(Seen {
                at: Instant::now(),
                path: path.clone(),
                headers,
                body,
            });
            log.iter().filter(|s| s.path == path).count()
        };
        let answer = script[(n - 1).min(script.len() - 1)];
        let (status, extra, text) = if let Some(rest) = answer.strip_prefix("partial ") {
            let (k, message) = rest.split_once(' ').unwrap();
            // ExportLogsServiceResponse and ExportMetricsServiceResponse share one layout.
            let body = proto::ExportLogsServiceResponse {
                partial_success: Some(proto::ExportLogsPartialSuccess {
                    rejected_log_records: k.parse().unwrap(),
                    error_message: message.into(),
                }),
            }
            .encode_to_vec();
            ("200 OK", "content-type: application/x-protobuf\r\n", body)
        } else {
            let (status, extra) = answer.split_once('|').unwrap_or((answer, ""));
            let extra = if extra.is_empty() {
                String::new()
            } else {
                format!("{extra}\r\n")
            };
            (
                status,
                &*extra.leak(),
                b"answer of the scripted server\n".to_vec(),
            )
        };
        let head = format!(
            "HTTP/1.1 {status}\r\ncontent-length: {}\r\n{extra}\r\n",
            text.len()
        );
        if out.write_all(head.as_bytes()).is_err() || out.write_all(&text).is_err() {
            return;
        }
    }
}

fn config(endpoint: String, token: &std::path::Path) -> OtlpConfig {
    OtlpConfig {
        endpoint,
        max_items_per_request: 100,
        batch_send_deadline_seconds: 0.05,
        queue_capacity_items: 1000,
        min_backoff_seconds: 0.02,
        max_backoff_seconds: 2.0,
        timeout_seconds: 5.0,
        headers: [("X-Api-Key".to_owned(), "k-1".to_owned())].into(),
        resource_attributes: [("deployment.environment".to_owned(), "lab".to_owned())].into(),
        bearer_token_file: Some(token.to_owned()),
        ..OtlpConfig::default()
    }
}

/// `n` samples: a counter per `cpu`, a gauge and a histogram.
fn metrics(n: usize) -> Vec<u8> {
    let mut metrics: Vec<Metric> = (0..n)
        .map(|i| Metric {
            name: "node_cpu_seconds_total".into(),
            help: "Seconds the CPUs spent in each mode.".into(),
            r#type: MetricType::Counter as i32,
            labels: vec![Label {
                name: "cpu".into(),
                value: i.to_string(),
            }],
            value: 100.0 + i as f64,
            timestamp_ms: 1_700_000_000_000 + i as i64,
            ..Default::default()
        })
        .collect();
    metrics.push(Metric {
        name: "node_load1".into(),
        r#type: MetricType::Gauge as i32,
        value: 0.5,
        ..Default::default()
    });
    metrics.push(Metric {
        name: "rpc_seconds".into(),
        r#type: MetricType::Histogram as i32,
        buckets: vec![
            Bucket {
                upper_bound: 0.1,
                cumulative_count: 3,
            },
            Bucket {
                upper_bound: f64::INFINITY,
                cumulative_count: 7,
            },
        ],
        count: 7,
        sum: 1.5,
        timestamp_ms: 1_700_000_000_500,
        ..Default::default()
    });
    encode_metric_batch(&MetricBatch { metrics })
}

fn records(n: usize) -> Vec<LogRecord> {
    (0..n)
        .map(|i| LogRecord {
            timestamp_ns: 1_700_000_000_000_000_000 + i as u64,
            severity: Severity::Error as i32,
            source: "/var/log/app.log".into(),
            message: format!("line {i}"),
            fields: vec![Field {
                key: "unit".into(),
                value: "app.service".into(),
            }],
            ..Default::default()
        })
        .collect()
}

const FRAME_NS: u64 = 1_700_000_001_000_000_000;

/// Starts the output on `cfg`, pushes a metrics frame of `n` counters (plus a gauge and a
/// histogram) and a logs frame of `n` records, waits until nothing is pending (or
/// `within`), stops it; checks the sum rule and returns the counters of both signals.
fn run(cfg: OtlpConfig, n: usize, within: Duration) -> (Snapshot, Snapshot) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let registry = prometheus::Registry::new();
        let (trigger, sd) = uctel_common::shutdown::channel();
        let started = otlp::start(Some(&cfg), &registry, &sd).unwrap();
        let handle = started.handle;
        let payload = metrics(n);
        let view = MetricBatchView::decode(&payload, &Limits::default()).unwrap();
        handle.push_metrics("a-1", "host-1", FRAME_NS, &view);
        let ctx = LogContext {
            agent: "a-1",
            instance: "host-1",
            stream: uctel_protocol::stream::LOGS,
            stream_seq: 41,
            frame_timestamp_ns: FRAME_NS,
        };
        handle.push_logs(&ctx, &records(n));
        let deadline = Instant::now() + within;
        loop {
            let (m, l) = handle.snapshots();
            if m.unwrap().pending + l.unwrap().pending == 0 || Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        trigger.trigger();
        for t in started.tasks {
            t.await.unwrap();
        }
        handle.close();
        let (m, l) = handle.snapshots();
        let (m, l) = (m.unwrap(), l.unwrap());
        for s in [m, l] {
            assert_eq!(
                s.items_in as i64,
                s.sent as i64 + s.dropped() as i64 + s.pending,
                "sum rule: {s:?}"
            );
            assert_eq!(s.pending, 0);
        }
        // The same figures on /metrics.
        let text = prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .unwrap();
        assert!(
            text.contains(&format!(
                "uctel_collector_otlp_items_in_total{{signal=\"logs\"}} {}",
                l.items_in
            )),
            "{text}"
        );
        (m, l)
    })
}

fn token() -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    writeln!(f, "s3cret").unwrap();
    f
}

fn by_path<'a>(seen: &'a [Seen], path: &str) -> Vec<&'a Seen> {
    seen.iter().filter(|s| s.path == path).collect()
}

#[test]
fn every_sample_and_record_arrives_field_by_field_with_the_protocol_headers() {
    let server = Scripted::start(vec!["200 OK"]);
    let t = token();
    let (m, l) = run(
        config(server.endpoint(), t.path()),
        3,
        Duration::from_secs(10),
    );
    assert_eq!((m.items_in, m.sent), (5, 5));
    assert_eq!((l.items_in, l.sent), (3, 3));
    let seen = server.seen();
    for r in &seen {
        assert_eq!(r.header("content-type"), Some("application/x-protobuf"));
        assert_eq!(r.header("content-encoding"), Some("gzip"));
        assert_eq!(r.header("authorization"), Some("Bearer s3cret"));
        assert_eq!(r.header("x-api-key"), Some("k-1"));
        assert_eq!(
            r.header("user-agent"),
            Some(concat!("uctel-collector/", env!("CARGO_PKG_VERSION")))
        );
    }
    let resource = proto::Resource {
        attributes: vec![
            proto::KeyValue::string("host.name", "host-1"),
            proto::KeyValue::string("service.instance.id", "a-1"),
            proto::KeyValue::string("deployment.environment", "lab"),
        ],
        dropped_attributes_count: 0,
    };

    let m = by_path(&seen, "/v1/metrics");
    assert_eq!(m.len(), 1);
    let req = proto::ExportMetricsServiceRequest::decode(&m[0].protobuf()[..]).unwrap();
    assert_eq!(req.resource_metrics.len(), 1);
    let rm = &req.resource_metrics[0];
    assert_eq!(rm.resource.as_ref(), Some(&resource));
    let scope = rm.scope_metrics[0].scope.as_ref().unwrap();
    assert_eq!(scope.name, "uctel-collector");
    let metrics = &rm.scope_metrics[0].metrics;
    assert_eq!(metrics.len(), 3, "{metrics:?}");
    assert_eq!(metrics[0].name, "node_cpu_seconds_total");
    assert_eq!(
        metrics[0].description,
        "Seconds the CPUs spent in each mode."
    );
    let Some(proto::Data::Sum(sum)) = &metrics[0].data else {
        panic!("{:?}", metrics[0])
    };
    assert!(sum.is_monotonic);
    assert_eq!(sum.aggregation_temporality, proto::CUMULATIVE);
    for (i, p) in sum.data_points.iter().enumerate() {
        assert_eq!(p.as_double, Some(100.0 + i as f64));
        assert_eq!(p.time_unix_nano, (1_700_000_000_000 + i as u64) * 1_000_000);
        assert_eq!(
            p.attributes,
            [proto::KeyValue::string("cpu", &i.to_string())]
        );
    }
    let Some(proto::Data::Gauge(g)) = &metrics[1].data else {
        panic!("{:?}", metrics[1])
    };
    assert_eq!(g.data_points[0].as_double, Some(0.5));
    assert_eq!(
        g.data_points[0].time_unix_nano, FRAME_NS,
        "no own time: the frame's"
    );
    let Some(proto::Data::Histogram(h)) = &metrics[2].data else {
        panic!("{:?}", metrics[2])
    };
    let p = &h.data_points[0];
    assert_eq!(h.aggregation_temporality, proto::CUMULATIVE);
    assert_eq!((p.count, p.sum), (7, Some(1.5)));
    assert_eq!(p.explicit_bounds, [0.1]);
    assert_eq!(p.bucket_counts, [3, 4]);

    let l = by_path(&seen, "/v1/logs");
    assert_eq!(l.len(), 1);
    let req = proto::ExportLogsServiceRequest::decode(&l[0].protobuf()[..]).unwrap();
    let rl = &req.resource_logs[0];
    assert_eq!(rl.resource.as_ref(), Some(&resource));
    let got = &rl.scope_logs[0].log_records;
    assert_eq!(got.len(), 3);
    for (i, r) in got.iter().enumerate() {
        assert_eq!(r.time_unix_nano, 1_700_000_000_000_000_000 + i as u64);
        assert_eq!(r.observed_time_unix_nano, FRAME_NS);
        assert_eq!((r.severity_number, r.severity_text.as_str()), (17, "error"));
        assert_eq!(
            r.body,
            Some(proto::AnyValue {
                value: Some(proto::Value::String(format!("line {i}")))
            })
        );
        assert_eq!(
            r.attributes,
            [
                proto::KeyValue::string("unit", "app.service"),
                proto::KeyValue::string("uctel.source", "/var/log/app.log"),
                proto::KeyValue::string("uctel.stream", "logs"),
                proto::KeyValue::int("uctel.stream_seq", 41),
            ]
        );
    }
}

#[test]
fn a_503_is_retried_after_its_retry_after_and_a_429_with_backoff() {
    let server = Scripted::start(vec![
        "503 Service Unavailable|retry-after: 1",
        "503 Service Unavailable|retry-after: 1",
        "429 Too Many Requests",
        "200 OK",
    ]);
    let t = token();
    let (m, l) = run(
        config(server.endpoint(), t.path()),
        4,
        Duration::from_secs(20),
    );
    assert_eq!((m.sent, m.dropped()), (6, 0));
    assert_eq!((l.sent, l.dropped()), (4, 0));
    assert!(m.retried + l.retried >= 6, "{m:?} {l:?}");
    let seen = server.seen();
    for path in ["/v1/metrics", "/v1/logs"] {
        let seen = by_path(&seen, path);
        assert_eq!(
            seen.len(),
            4,
            "{path}: one request, three failures before it landed"
        );
        // The attempt after a 503 came no sooner than its Retry-After.
        let gap = seen[1].at.duration_since(seen[0].at);
        assert!(gap >= Duration::from_millis(950), "{path}: {gap:?}");
        // The same request again: the same bytes.
        let bodies: std::collections::BTreeSet<Vec<u8>> =
            seen.iter().map(|s| s.protobuf()).collect();
        assert_eq!(bodies.len(), 1, "{path}: a retry sent other bytes");
    }
}

#[test]
fn a_400_or_500_is_not_retried_and_its_items_are_counted_rejected() {
    for status in ["400 Bad Request", "500 Internal Server Error"] {
        let server = Scripted::start(vec![status]);
        let t = token();
        let (m, l) = run(
            config(server.endpoint(), t.path()),
            5,
            Duration::from_secs(10),
        );
        std::thread::sleep(Duration::from_millis(300)); // a retry would have come by now
        assert_eq!(server.seen().len(), 2, "{status}: one request per signal");
        assert_eq!(m.dropped_for(Dropped::Rejected), 7, "{status}");
        assert_eq!(l.dropped_for(Dropped::Rejected), 5, "{status}");
        assert_eq!((m.sent, l.sent, m.retried, l.retried), (0, 0, 0, 0));
    }
}

#[test]
fn a_partial_success_counts_its_rejected_items_as_dropped_and_the_rest_sent() {
    let server = Scripted::start(vec!["partial 2 two points out of order"]);
    let t = token();
    let (m, l) = run(
        config(server.endpoint(), t.path()),
        5,
        Duration::from_secs(10),
    );
    assert_eq!((m.sent, m.dropped_for(Dropped::PartialSuccess)), (5, 2));
    assert_eq!((l.sent, l.dropped_for(Dropped::PartialSuccess)), (3, 2));
    assert_eq!(
        (m.retried, l.retried),
        (0, 0),
        "a partial success is not retried"
    );
    assert_eq!(server.seen().len(), 2);
}

#[test]
fn a_receiver_down_keeps_items_pending_then_counts_them_at_shutdown() {
    // Nothing listens: every attempt fails to connect; at the stop the grace period ends
    // with the requests still failing: every item counted `shutdown`, none lost.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let t = token();
    let mut cfg = config(format!("http://127.0.0.1:{port}"), t.path());
    cfg.timeout_seconds = 0.5;
    let (m, l) = run(cfg, 3, Duration::from_millis(500));
    assert_eq!((m.sent, m.dropped_for(Dropped::Shutdown)), (0, 5));
    assert_eq!((l.sent, l.dropped_for(Dropped::Shutdown)), (0, 3));
}
