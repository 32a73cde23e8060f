//! The remote-write sender against a small local HTTP server that answers what each test
//! says: the protocol's headers and body, no retry after 400, backoff retries after 500
//! and 429 (with `Retry-After`), and the sum rule after each.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use uctel_collector::outputs::config::RemoteWriteConfig;
use uctel_collector::outputs::remote_write::metrics::{Dropped, Failed};
use uctel_collector::outputs::remote_write::{self, prompb};
use uctel_protocol::borrowed::MetricBatchView;
use uctel_protocol::limits::Limits;
use uctel_protocol::payload::{encode_metric_batch, Label, Metric, MetricBatch, MetricType};

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    at: Instant,
    headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A server answering the `script`'s responses in order (the last one repeats).
pub(crate) struct Scripted {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Scripted {
    pub(crate) fn start(script: Vec<&'static str>) -> Scripted {
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

    pub(crate) fn url(&self) -> String {
        format!("http://{}/api/v1/write", self.addr)
    }

    pub(crate) fn seen(&self) -> Vec<Seen> {
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
        let n = {
            let mut log = log.lock().unwrap();
            log.push(Seen {
                at: Instant::now(),
                headers,
                body,
            });
            log.len()
        };
        let mut answer = script[(n - 1).min(script.len() - 1)];
        // `refuse cpu=V`: 400 for a request with a series labelled cpu="V", else 204.
        if let Some(v) = answer.strip_prefix("refuse cpu=") {
            let body = &log.lock().unwrap()[n - 1].body;
            let req = prompb::decode_request(body).unwrap();
            let refused = req
                .timeseries
                .iter()
                .any(|t| t.labels.iter().any(|l| l.name == "cpu" && l.value == v));
            answer = if refused {
                "400 Bad Request"
            } else {
                "204 No Content"
            };
        }
        let (status, extra) = answer.split_once('|').unwrap_or((answer, ""));
        let text = "answer of the scripted server\n";
        let response = format!(
            "HTTP/1.1 {status}\r\ncontent-length: {}\r\n{extra}\r\n{text}",
            text.len()
        );
        if out.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}

pub(crate) fn config(url: String) -> RemoteWriteConfig {
    RemoteWriteConfig {
        url,
        shards: 1,
        max_samples_per_send: 100,
        batch_send_deadline_seconds: 0.05,
        queue_capacity_samples: 1000,
        min_backoff_seconds: 0.02,
        max_backoff_seconds: 0.2,
        timeout_seconds: 5.0,
        tenant: Some("team-a".into()),
        ..RemoteWriteConfig::default()
    }
}

pub(crate) fn batch(n: usize, ts: i64) -> Vec<u8> {
    encode_metric_batch(&MetricBatch {
        metrics: (0..n)
            .map(|i| Metric {
                name: "node_load1".into(),
                r#type: MetricType::Gauge as i32,
                labels: vec![Label {
                    name: "cpu".into(),
                    value: i.to_string(),
                }],
                value: i as f64,
                timestamp_ms: ts,
                ..Default::default()
            })
            .collect(),
    })
}

/// Starts the output on `url`, pushes `n` samples, waits until the sum rule settles with
/// nothing pending (or `within`), stops it; returns the counters.
fn run(cfg: RemoteWriteConfig, n: usize, within: Duration) -> Arc<remote_write::metrics::Counters> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let registry = prometheus::Registry::new();
        let (trigger, sd) = uctel_common::shutdown::channel();
        let started =
            remote_write::start(&[cfg], &registry, Duration::from_secs(300), 100_000, &sd).unwrap();
        let mut handle = started.handle;
        let payload = batch(n, 1_700_000_000_000);
        let view = MetricBatchView::decode(&payload, &Limits::default()).unwrap();
        handle.push("a-1", "host-1", 0, &view);
        let counters = handle.counters(0).unwrap().clone();
        let deadline = Instant::now() + within;
        while counters.pending.get() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        trigger.trigger();
        for t in started.tasks {
            t.await.unwrap();
        }
        handle.close();
        let dropped: u64 = Dropped::ALL.iter().map(|r| counters.dropped(*r)).sum();
        let failed: u64 = Failed::ALL.iter().map(|r| counters.failed_count(*r)).sum();
        assert_eq!(
            counters.samples_in.get(),
            counters.samples_sent() + dropped + failed + counters.pending.get() as u64,
            "sum rule"
        );
        assert_eq!(counters.pending.get(), 0);
        counters
    })
}

#[test]
fn a_request_carries_the_protocol_headers_and_a_snappy_block_write_request() {
    let server = Scripted::start(vec!["204 No Content"]);
    let c = run(config(server.url()), 3, Duration::from_secs(10));
    assert_eq!(c.samples_sent(), 3);
    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    let r = &seen[0];
    assert_eq!(r.header("content-encoding"), Some("snappy"));
    assert_eq!(r.header("content-type"), Some("application/x-protobuf"));
    assert_eq!(r.header("x-prometheus-remote-write-version"), Some("0.1.0"));
    assert_eq!(
        r.header("user-agent"),
        Some(concat!("uctel-collector/", env!("CARGO_PKG_VERSION")))
    );
    assert_eq!(r.header("x-scope-orgid"), Some("team-a"));
    let req = prompb::decode_request(&r.body).unwrap();
    assert_eq!(req.timeseries.len(), 3);
    for (i, ts) in req.timeseries.iter().enumerate() {
        let names: Vec<&str> = ts.labels.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["__name__", "agent", "cpu", "instance"]);
        assert!(ts.labels.iter().all(|l| !l.value.is_empty()));
        assert_eq!(ts.samples.len(), 1);
        assert_eq!(ts.samples[0].timestamp, 1_700_000_000_000);
        assert_eq!(ts.samples[0].value, i as f64);
    }
}

#[test]
fn a_400_is_not_retried_and_its_samples_are_counted_failed() {
    let server = Scripted::start(vec!["400 Bad Request"]);
    let c = run(config(server.url()), 5, Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(300)); // a retry would have come by now
                                                    // Split until each sample was refused alone (2·5 − 1 requests), none sent twice.
    let seen = server.seen();
    assert_eq!(seen.len(), 9);
    let bodies: std::collections::BTreeSet<&Vec<u8>> = seen.iter().map(|s| &s.body).collect();
    assert_eq!(bodies.len(), seen.len(), "a refused request sent again");
    assert_eq!(c.failed_count(Failed::Rejected), 5);
    assert_eq!(c.retried.get(), 0);
    assert_eq!(c.samples_sent(), 0);
}

#[test]
fn a_400_for_one_series_costs_only_its_samples() {
    let server = Scripted::start(vec!["refuse cpu=3"]);
    let c = run(config(server.url()), 8, Duration::from_secs(10));
    assert_eq!(c.failed_count(Failed::Rejected), 1, "the refused series");
    assert_eq!(c.samples_sent(), 7, "the other series of the request");
    assert_eq!(c.retried.get(), 0);
    // 8 samples, one refused: at most 2·log2(8) + 1 requests.
    let seen = server.seen();
    assert!(seen.len() <= 7, "{} requests", seen.len());
    let mut sent = std::collections::BTreeSet::new();
    for r in &seen {
        for t in prompb::decode_request(&r.body).unwrap().timeseries {
            let cpu = t
                .labels
                .iter()
                .find(|l| l.name == "cpu")
                .unwrap()
                .value
                .clone();
            if cpu != "3" {
                sent.insert(cpu);
            }
        }
    }
    assert_eq!(sent.len(), 7);
}

#[test]
fn a_5xx_is_retried_until_it_succeeds() {
    let server = Scripted::start(vec![
        "500 Internal Server Error",
        "503 Service Unavailable",
        "502 Bad Gateway",
        "500 Internal Server Error",
        "200 OK",
    ]);
    let c = run(config(server.url()), 4, Duration::from_secs(20));
    let seen = server.seen();
    assert_eq!(seen.len(), 5);
    assert!(
        seen.windows(2).all(|w| w[0].body == w[1].body),
        "the same request again"
    );
    assert_eq!(c.samples_sent(), 4);
    assert_eq!(c.retried.get(), 4 * 4);
    assert_eq!(c.failed_count(Failed::Rejected), 0);
}

#[test]
fn a_429_is_retried_after_its_retry_after() {
    let server = Scripted::start(vec!["429 Too Many Requests|retry-after: 1\r\n", "200 OK"]);
    let mut cfg = config(server.url());
    cfg.max_backoff_seconds = 5.0;
    let c = run(cfg, 2, Duration::from_secs(20));
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    let gap = seen[1].at.duration_since(seen[0].at);
    assert!(
        gap >= Duration::from_millis(950),
        "retried after {gap:?}, not after Retry-After: 1"
    );
    assert_eq!(c.samples_sent(), 2);
    assert_eq!(c.retried.get(), 2);
}

#[test]
fn a_dead_receiver_at_shutdown_leaves_every_sample_counted() {
    // Nothing listens on this port: connection refused, retried until the grace ends.
    let addr = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let c = run(
        config(format!("http://{addr}/api/v1/write")),
        7,
        Duration::from_millis(300),
    );
    assert_eq!(c.samples_sent(), 0);
    assert_eq!(
        c.failed_count(Failed::Shutdown) + c.dropped(Dropped::Shutdown),
        7
    );
    assert!(c.retried.get() > 0);
}

#[test]
fn credentials_from_files_and_custom_headers_are_sent() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret-token\n").unwrap();
    let password = dir.path().join("password");
    std::fs::write(&password, "pa:ss\n").unwrap();

    let bearer = Scripted::start(vec!["204 No Content"]);
    let mut cfg = config(bearer.url());
    cfg.bearer_token_file = Some(token);
    cfg.headers.insert("X-Team".into(), "storage".into());
    run(cfg, 1, Duration::from_secs(10));
    let seen = bearer.seen();
    assert_eq!(seen[0].header("authorization"), Some("Bearer s3cret-token"));
    assert_eq!(seen[0].header("x-team"), Some("storage"));

    let basic = Scripted::start(vec!["204 No Content"]);
    let mut cfg = config(basic.url());
    cfg.basic_auth = Some(uctel_collector::outputs::config::BasicAuthConfig {
        username: "uctel".into(),
        password_file: password,
    });
    run(cfg, 1, Duration::from_secs(10));
    // base64("uctel:pa:ss")
    assert_eq!(
        basic.seen()[0].header("authorization"),
        Some("Basic dWN0ZWw6cGE6c3M=")
    );
}
