//! OTLP receivers for the OTLP output's tests:
//!
//! * [`Receiver`]: an OTLP/HTTP server in the test process that decodes every export
//!   request (gzip or not) into flat [`Point`]s and [`Record`]s and answers as its
//!   [`Mode`] says: accept, an HTTP status (503 with `Retry-After`, 400), a partial success
//!   rejecting the last N items of each request (which it then does not keep), or down (no
//!   listener, open connections closed unanswered) for an outage.
//! * [`Rotel`]: a real OpenTelemetry receiver, PyPI's `rotel` (a Rust OpenTelemetry
//!   collector) from the virtual environment `scripts/install-deps` makes, receiving
//!   OTLP/HTTP and exporting onward over OTLP/HTTP to a [`Receiver`], with its debug log of
//!   what it received in its log file.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::Message as _;
use uctel_collector::outputs::otlp::proto;

/// How the [`Receiver`] answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// 200 with an empty export response: everything kept.
    Accept,
    /// This status, with `Retry-After: <secs>` when set; nothing kept.
    Status(u16, Option<u64>),
    /// 200 with a partial success rejecting the last N items of each request (kept: the rest).
    Partial(i64),
    /// No listener; open connections closed without an answer.
    Down,
}

/// A data point as received, flattened.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    /// Resource attributes.
    pub resource: BTreeMap<String, String>,
    /// Metric name.
    pub name: String,
    /// `sum` (with `monotonic`/`cumulative` noted), `gauge` or `histogram`.
    pub kind: String,
    /// Point attributes.
    pub attributes: BTreeMap<String, String>,
    /// `time_unix_nano`.
    pub time_unix_nano: u64,
    /// The value (sums, gauges), or the sum (histograms).
    pub value: f64,
    /// Histograms: count, bounds and per-bucket counts.
    pub histogram: Option<(u64, Vec<f64>, Vec<u64>)>,
}

/// A log record as received, flattened.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    /// Resource attributes.
    pub resource: BTreeMap<String, String>,
    /// `time_unix_nano`.
    pub time_unix_nano: u64,
    /// `observed_time_unix_nano`.
    pub observed_time_unix_nano: u64,
    /// `severity_number`.
    pub severity_number: i32,
    /// `severity_text`.
    pub severity_text: String,
    /// The body's string.
    pub body: String,
    /// Attributes (integers as decimal strings).
    pub attributes: BTreeMap<String, String>,
}

/// What a [`Receiver`] holds.
#[derive(Debug, Default)]
pub struct Held {
    /// Points kept.
    pub points: Vec<Point>,
    /// Records kept.
    pub records: Vec<Record>,
    /// Requests per path.
    pub requests: BTreeMap<String, u64>,
    /// Items refused by partial successes, per path.
    pub rejected: BTreeMap<String, u64>,
    /// Content-Encoding values seen.
    pub encodings: Vec<String>,
}

struct Shared {
    mode: Mutex<Mode>,
    held: Mutex<Held>,
    down: AtomicBool,
}

/// An OTLP/HTTP receiver in the test process (module docs).
pub struct Receiver {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Receiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Receiver({})", self.addr)
    }
}

impl Receiver {
    /// Listens on a free loopback port in `mode`.
    ///
    /// # Panics
    /// If no port can be bound.
    pub fn start(mode: Mode) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let shared = Arc::new(Shared {
            down: AtomicBool::new(mode == Mode::Down),
            mode: Mutex::new(mode),
            held: Mutex::default(),
        });
        let s = shared.clone();
        std::thread::spawn(move || accept_loop(Some(listener), addr, &s));
        Receiver { addr, shared }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The port.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Answers as `mode` from now on.
    pub fn set_mode(&self, mode: Mode) {
        self.shared.down.store(mode == Mode::Down, Ordering::SeqCst);
        *self.shared.mode.lock().unwrap_or_else(|p| p.into_inner()) = mode;
    }

    /// Runs `f` on what it holds.
    pub fn with<T>(&self, f: impl FnOnce(&Held) -> T) -> T {
        f(&self.shared.held.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

fn accept_loop(mut listener: Option<TcpListener>, addr: SocketAddr, s: &Arc<Shared>) {
    loop {
        if s.down.load(Ordering::SeqCst) {
            listener = None;
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        let l = match &listener {
            Some(l) => l,
            None => match TcpListener::bind(addr) {
                Ok(l) => {
                    let _ = l.set_nonblocking(true);
                    listener.insert(l)
                }
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
            },
        };
        let _ = l.set_nonblocking(true);
        match l.accept() {
            Ok((stream, _)) => {
                let _ = stream.set_nonblocking(false);
                let s = s.clone();
                std::thread::spawn(move || serve(stream, &s));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

fn serve(stream: TcpStream, s: &Shared) {
    let Ok(clone) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(clone);
    let mut out = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || s.down.load(Ordering::SeqCst) {
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
                headers.push((n.trim().to_ascii_lowercase(), v.trim().to_owned()));
            }
        }
        let header = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
        };
        let len: usize = header("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0; len];
        if reader.read_exact(&mut body).is_err() || s.down.load(Ordering::SeqCst) {
            return;
        }
        let encoding = header("content-encoding").unwrap_or_default();
        let raw = if encoding.eq_ignore_ascii_case("gzip") {
            let mut raw = Vec::new();
            if flate2::read::GzDecoder::new(&body[..])
                .read_to_end(&mut raw)
                .is_err()
            {
                return;
            }
            raw
        } else {
            body
        };
        let mode = s.mode.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let response = answer(s, &path, &encoding, &raw, &mode);
        if out.write_all(&response).is_err() {
            return;
        }
    }
}

/// Keeps what `mode` says of the request `raw` to `path` and returns the HTTP response.
fn answer(s: &Shared, path: &str, encoding: &str, raw: &[u8], mode: &Mode) -> Vec<u8> {
    let mut held = s.held.lock().unwrap_or_else(|p| p.into_inner());
    *held.requests.entry(path.to_owned()).or_default() += 1;
    held.encodings.push(encoding.to_owned());
    let (status, extra, body) = match mode {
        Mode::Status(code, after) => (
            format!("{code} Scripted"),
            after.map_or(String::new(), |a| format!("retry-after: {a}\r\n")),
            b"scripted answer".to_vec(),
        ),
        Mode::Accept | Mode::Partial(_) | Mode::Down => {
            let reject = match mode {
                Mode::Partial(n) => *n,
                _ => 0,
            };
            let kept = if path.ends_with("/v1/metrics") {
                let r = proto::ExportMetricsServiceRequest::decode(raw).unwrap_or_default();
                let mut points = flatten_points(&r);
                let n = usize::try_from(reject).unwrap_or(0).min(points.len());
                points.truncate(points.len() - n);
                held.points.extend(points);
                n
            } else {
                let r = proto::ExportLogsServiceRequest::decode(raw).unwrap_or_default();
                let mut records = flatten_records(&r);
                let n = usize::try_from(reject).unwrap_or(0).min(records.len());
                records.truncate(records.len() - n);
                held.records.extend(records);
                n
            };
            *held.rejected.entry(path.to_owned()).or_default() += kept as u64;
            let body = if reject > 0 {
                proto::ExportLogsServiceResponse {
                    partial_success: Some(proto::ExportLogsPartialSuccess {
                        rejected_log_records: kept as i64,
                        error_message: "scripted partial success".into(),
                    }),
                }
                .encode_to_vec()
            } else {
                Vec::new()
            };
            ("200 OK".to_owned(), String::new(), body)
        }
    };
    let mut out = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/x-protobuf\r\ncontent-length: {}\r\n{extra}\r\n",
        body.len()
    )
    .into_bytes();
    out.extend(body);
    out
}

fn value_string(v: Option<&proto::AnyValue>) -> String {
    match v.and_then(|v| v.value.as_ref()) {
        Some(proto::Value::String(s)) => s.clone(),
        Some(proto::Value::Int(i)) => i.to_string(),
        Some(proto::Value::Bool(b)) => b.to_string(),
        Some(proto::Value::Double(d)) => d.to_string(),
        None => String::new(),
    }
}

fn attributes(kvs: &[proto::KeyValue]) -> BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| (kv.key.clone(), value_string(kv.value.as_ref())))
        .collect()
}

/// Every data point of a request, flattened.
pub fn flatten_points(r: &proto::ExportMetricsServiceRequest) -> Vec<Point> {
    let mut out = Vec::new();
    for rm in &r.resource_metrics {
        let resource = attributes(rm.resource.as_ref().map_or(&[][..], |r| &r.attributes));
        for m in rm.scope_metrics.iter().flat_map(|s| &s.metrics) {
            let point = |kind: &str, a: &[proto::KeyValue], t: u64, value: f64| Point {
                resource: resource.clone(),
                name: m.name.clone(),
                kind: kind.to_owned(),
                attributes: attributes(a),
                time_unix_nano: t,
                value,
                histogram: None,
            };
            match &m.data {
                Some(proto::Data::Sum(s)) => {
                    let kind = format!(
                        "sum monotonic={} temporality={}",
                        s.is_monotonic, s.aggregation_temporality
                    );
                    for p in &s.data_points {
                        let v = p.as_double.unwrap_or(f64::NAN);
                        out.push(point(&kind, &p.attributes, p.time_unix_nano, v));
                    }
                }
                Some(proto::Data::Gauge(g)) => {
                    for p in &g.data_points {
                        let v = p.as_double.unwrap_or(f64::NAN);
                        out.push(point("gauge", &p.attributes, p.time_unix_nano, v));
                    }
                }
                Some(proto::Data::Histogram(h)) => {
                    let kind = format!("histogram temporality={}", h.aggregation_temporality);
                    for p in &h.data_points {
                        let mut x =
                            point(&kind, &p.attributes, p.time_unix_nano, p.sum.unwrap_or(0.0));
                        x.histogram =
                            Some((p.count, p.explicit_bounds.clone(), p.bucket_counts.clone()));
                        out.push(x);
                    }
                }
                None => {}
            }
        }
    }
    out
}

/// Every log record of a request, flattened.
pub fn flatten_records(r: &proto::ExportLogsServiceRequest) -> Vec<Record> {
    let mut out = Vec::new();
    for rl in &r.resource_logs {
        let resource = attributes(rl.resource.as_ref().map_or(&[][..], |r| &r.attributes));
        for l in rl.scope_logs.iter().flat_map(|s| &s.log_records) {
            out.push(Record {
                resource: resource.clone(),
                time_unix_nano: l.time_unix_nano,
                observed_time_unix_nano: l.observed_time_unix_nano,
                severity_number: l.severity_number,
                severity_text: l.severity_text.clone(),
                body: value_string(l.body.as_ref()),
                attributes: attributes(&l.attributes),
            });
        }
    }
    out
}

/// Where `scripts/install-deps` installs rotel's binary.
pub const ROTEL: &str = "/opt/uctel-test-tools/rotel/bin/rotel-agent";

/// A running rotel (killed on drop).
#[derive(Debug)]
pub struct Rotel {
    child: Child,
    http: SocketAddr,
    log: PathBuf,
}

impl Rotel {
    /// Starts rotel receiving OTLP/HTTP on a free port and exporting onward over OTLP/HTTP
    /// to `forward` (an endpoint URL), its debug log of received metrics and logs in
    /// `dir/rotel.log`.
    ///
    /// # Panics
    /// If the binary is missing (with the install hint) or rotel does not listen in 30 s.
    pub fn start(dir: &Path, forward: &str) -> Rotel {
        assert!(
            Path::new(ROTEL).exists(),
            "{ROTEL} not found: scripts/install-deps installs rotel in its own virtual \
             environment (python3 -m venv /opt/uctel-test-tools/rotel, pip install rotel, \
             bin/rotel-agent linked to the package's binary)"
        );
        let http = crate::net::free_addr();
        let grpc = crate::net::free_addr();
        let log = dir.join("rotel.log");
        let out = std::fs::File::create(&log).expect("rotel log");
        let child = Command::new(ROTEL)
            .args(["start", "--otlp-http-endpoint", &http.to_string()])
            .args(["--otlp-grpc-endpoint", &grpc.to_string()])
            .args(["--exporter", "otlp", "--otlp-exporter-endpoint", forward])
            .args(["--otlp-exporter-protocol", "http"])
            .args(["--debug-log", "metrics", "--debug-log", "logs"])
            .args(["--debug-log-verbosity", "detailed"])
            .args(["--batch-timeout", "100ms"])
            .arg("--log-file")
            .arg(dir.join("rotel-agent.log"))
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log"))
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("{ROTEL}: {e}"));
        let r = Rotel { child, http, log };
        crate::wait_for(
            "rotel listening",
            Duration::from_secs(30),
            Duration::from_millis(100),
            || {
                TcpStream::connect(http)
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            },
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", r.log_text()));
        r
    }

    /// Its OTLP/HTTP endpoint.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.http)
    }

    /// Its log (with the debug log of what it received).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Rotel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
