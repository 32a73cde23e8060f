//! A real Prometheus server for the tests: the Debian package's `/usr/bin/prometheus` (or
//! `$PROMETHEUS`), started with a temporary configuration and TSDB on a free loopback port,
//! queried through its HTTP API (`/api/v1/query`), stopped with SIGTERM on drop. Also
//! `promtool check metrics` for exposition lint (from `uctel-testkit`).
//!
//! Missing binaries are a test failure, not a skip: `.ci/run` installs the `prometheus`
//! package.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::daemon::Daemon;

/// The Prometheus binary: `$PROMETHEUS` or `/usr/bin/prometheus`.
///
/// # Panics
/// If it does not exist, with the install hint.
pub fn prometheus_binary() -> PathBuf {
    let p =
        std::env::var_os("PROMETHEUS").map_or_else(|| "/usr/bin/prometheus".into(), PathBuf::from);
    assert!(
        p.is_file(),
        "{} not found: install Prometheus (Debian: apt-get install prometheus)",
        p.display()
    );
    p
}

/// `promtool check metrics` on an exposition text: `uctel-testkit`'s one promtool check
/// (node_exporter's `camelCase` names are the only accepted lint).
pub use uctel_testkit::promtool::check_metrics as promtool_check_metrics;

/// Sorted labels (`__name__` included) → samples `(timestamp ms, value)` in time order: raw
/// samples read back from a receiver (Prometheus, VictoriaMetrics).
pub type RawSeries = std::collections::BTreeMap<Vec<(String, String)>, Vec<(i64, f64)>>;

/// One scrape job.
#[derive(Debug, Clone)]
pub struct Job {
    /// `job_name`.
    pub name: String,
    /// Targets (`host:port`).
    pub targets: Vec<SocketAddr>,
    /// `honor_labels`: true for the collector, whose series carry the agents' own `instance`.
    pub honor_labels: bool,
}

/// A running Prometheus.
#[derive(Debug)]
pub struct Prometheus {
    daemon: Daemon,
    addr: SocketAddr,
}

impl Prometheus {
    /// Starts Prometheus in `dir` scraping `jobs` every second.
    ///
    /// # Panics
    /// If the binary is missing or it is not ready within 60 s.
    pub fn start(dir: &Path, jobs: &[Job]) -> Prometheus {
        Prometheus::start_with(dir, jobs, &[])
    }

    /// A Prometheus that scrapes nothing and receives remote-write on `/api/v1/write`
    /// (`--web.enable-remote-write-receiver`).
    ///
    /// # Panics
    /// As [`Prometheus::start`].
    pub fn receiver(dir: &Path) -> Prometheus {
        Prometheus::start_with(dir, &[], &["--web.enable-remote-write-receiver"])
    }

    /// Its remote-write URL (when started as a [`Prometheus::receiver`]).
    pub fn write_url(&self) -> String {
        format!("http://{}/api/v1/write", self.addr)
    }

    /// Every raw sample of the series matching `selector` within the last hour (a range
    /// query, so stale markers are left out, as Prometheus does).
    ///
    /// # Errors
    /// As [`Prometheus::query`], or an answer that is not a matrix.
    pub fn raw_samples(&self, selector: &str) -> Result<RawSeries, String> {
        let mut out = RawSeries::new();
        for s in self.query(&format!("{selector}[1h]"))? {
            let mut labels: Vec<(String, String)> = s["metric"]
                .as_object()
                .ok_or_else(|| format!("no metric in {s}"))?
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                .collect();
            labels.sort();
            let values = s["values"]
                .as_array()
                .ok_or_else(|| format!("no values in {s}"))?;
            let samples = values
                .iter()
                .map(|p| {
                    let t = p[0].as_f64().unwrap_or_default();
                    let v = p[1].as_str().and_then(parse_value).unwrap_or(f64::NAN);
                    ((t * 1000.0).round() as i64, v)
                })
                .collect();
            out.insert(labels, samples);
        }
        Ok(out)
    }

    /// Starts Prometheus in `dir` scraping `jobs` every second, with `extra` flags.
    ///
    /// # Panics
    /// If the binary is missing or it is not ready within 60 s.
    pub fn start_with(dir: &Path, jobs: &[Job], extra: &[&str]) -> Prometheus {
        let binary = prometheus_binary();
        let addr = crate::net::free_addr();
        let mut cfg = String::from(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\nscrape_configs:\n",
        );
        if jobs.is_empty() {
            cfg.push_str("  []\n");
        }
        for j in jobs {
            let targets: Vec<String> = j.targets.iter().map(|t| format!("'{t}'")).collect();
            cfg.push_str(&format!(
                "  - job_name: '{}'\n    honor_labels: {}\n    static_configs:\n      - targets: [{}]\n",
                j.name,
                j.honor_labels,
                targets.join(", ")
            ));
        }
        let config = dir.join("prometheus.yml");
        std::fs::write(&config, cfg).unwrap_or_else(|e| panic!("writing prometheus.yml: {e}"));
        let data = dir.join("prometheus-data");
        let log = dir.join("prometheus.log");
        let out = std::fs::File::create(&log).unwrap_or_else(|e| panic!("prometheus.log: {e}"));
        let err = out
            .try_clone()
            .unwrap_or_else(|e| panic!("prometheus.log: {e}"));
        let child = Command::new(&binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", data.display()))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--storage.tsdb.retention.time=1h")
            .arg("--log.level=warn")
            .args(extra)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()));
        let daemon = Daemon::adopt("prometheus", &binary, &config, &log, child);
        let p = Prometheus { daemon, addr };
        let ready = crate::wait_for(
            "prometheus ready",
            Duration::from_secs(60),
            Duration::from_millis(200),
            || uctel_testkit::http::get(&format!("http://{addr}/-/ready")).map(|_| ()),
        );
        if let Err(e) = ready {
            panic!("{e}\n{}", p.daemon.log_tail(30));
        }
        p
    }

    /// The HTTP address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Evaluates `expr` at the current time (`/api/v1/query`) and returns `data.result`.
    ///
    /// # Errors
    /// HTTP failure or a Prometheus error answer (`status: error`, e.g. a parse error), with
    /// the error type and message.
    pub fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        instant_query(self.addr, expr)
    }

    /// The number of `up == 1` targets of `job`.
    ///
    /// # Errors
    /// As [`Prometheus::query`].
    pub fn targets_up(&self, job: &str) -> Result<usize, String> {
        Ok(self.query(&format!("up{{job=\"{job}\"}} == 1"))?.len())
    }

    /// The end of Prometheus' log, for failure messages.
    pub fn log_tail(&self, n: usize) -> String {
        self.daemon.log_tail(n)
    }
}

/// Evaluates the PromQL `expr` now through the Prometheus HTTP API at `addr`
/// (`/api/v1/query`, which VictoriaMetrics serves too) and returns `data.result`.
///
/// # Errors
/// HTTP failure or an error answer (`status: error`, e.g. a parse error), with the error
/// type and message.
pub fn instant_query(addr: SocketAddr, expr: &str) -> Result<Vec<Value>, String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(20)))
        .http_status_as_error(false)
        .build()
        .into();
    let url = format!("http://{addr}/api/v1/query");
    let mut resp = agent
        .get(&url)
        .query("query", expr)
        .call()
        .map_err(|e| format!("query {expr:?}: {e}"))?;
    let body = resp
        .body_mut()
        .read_to_string()
        .map_err(|e| format!("query {expr:?}: {e}"))?;
    let v: Value =
        serde_json::from_str(&body).map_err(|e| format!("query {expr:?}: {e}: {body}"))?;
    if v.get("status").and_then(Value::as_str) != Some("success") {
        return Err(format!(
            "query {expr:?}: {} {}",
            v.get("errorType").and_then(Value::as_str).unwrap_or("?"),
            v.get("error").and_then(Value::as_str).unwrap_or(&body)
        ));
    }
    match v.pointer("/data/result") {
        Some(Value::Array(a)) => Ok(a.clone()),
        // A scalar or string result is one value.
        Some(other) => Ok(vec![other.clone()]),
        None => Err(format!("query {expr:?}: no data.result in {body}")),
    }
}

/// The scalar value of one instant-vector element (`[ts, "value"]`).
pub fn sample_value(v: &Value) -> Option<f64> {
    parse_value(v.pointer("/value/1")?.as_str()?)
}

/// A sample value as Prometheus' JSON API writes it (`"1.5"`, `"NaN"`, `"+Inf"`).
pub fn parse_value(s: &str) -> Option<f64> {
    match s {
        "NaN" => Some(f64::NAN),
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        _ => s.parse().ok(),
    }
}
