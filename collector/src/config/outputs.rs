//! The `outputs:` section: outputs to other machines, beside `/metrics` and `logs:`. Any
//! combination can be on; none is by default.
//!
//! ```yaml
//! outputs:
//!   remote_write:
//!     - url: http://127.0.0.1:9090/api/v1/write     # Prometheus --web.enable-remote-write-receiver
//!     - url: https://mimir.example.net/api/v1/push
//!       tenant: team-a                              # X-Scope-OrgID
//!       bearer_token_file: /etc/uctel/mimir.token
//!   clickhouse:
//!     url: http://127.0.0.1:8123                    # the HTTP interface
//!     table: logs                                   # config/clickhouse/logs.sql
//!   otlp:
//!     endpoint: http://127.0.0.1:4318               # OTLP/HTTP: /v1/metrics and /v1/logs
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use uctel_common::config::Problems;

/// `outputs:` section.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct OutputsConfig {
    /// Prometheus remote-write 1.0 endpoints (Prometheus, Mimir, Thanos Receive, Cortex,
    /// VictoriaMetrics, Grafana Cloud), each sent every sample with the agent's timestamp.
    /// Default none. A reload adds, removes and changes endpoints live (README "Reload").
    pub remote_write: Vec<RemoteWriteConfig>,
    /// Every log record also into a ClickHouse table (one row per record, the JSON Lines
    /// sink's fields; create the table with `uctel-collector --print-clickhouse-schema`).
    /// Default none. A reload adds, removes and changes it live (README "Reload").
    pub clickhouse: Option<ClickHouseConfig>,
    /// Samples and log records over OTLP/HTTP (protobuf, gzip) to an OpenTelemetry
    /// receiver (an OpenTelemetry Collector, Prometheus 3, Mimir, Loki 3,
    /// VictoriaMetrics). Default none. A reload adds, removes and changes it live (README
    /// "Reload").
    pub otlp: Option<OtlpConfig>,
}

/// `outputs.clickhouse`: log records into a ClickHouse table over its HTTP interface
/// (`INSERT INTO <database>.<table> FORMAT JSONEachRow`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClickHouseConfig {
    /// `http://` or `https://` URL of the server's HTTP interface (required), e.g.
    /// `http://127.0.0.1:8123`.
    pub url: String,
    /// Database of the table. Default none: the user's default database.
    pub database: Option<String>,
    /// The table (created beforehand: `--print-clickhouse-schema`). Default `logs`.
    pub table: String,
    /// User (HTTP basic authentication). Default none: ClickHouse's `default` user.
    pub user: Option<String>,
    /// File holding the user's password (trailing newline ignored), read at start; needs
    /// `user`. Default none (an empty password).
    pub password_file: Option<PathBuf>,
    /// Most rows in one `INSERT`. Default 10000.
    pub max_rows_per_insert: u32,
    /// An `INSERT` is sent once its oldest row has waited this long, seconds. Default 1.
    pub batch_send_deadline_seconds: f64,
    /// Rows kept waiting in memory; when full, the oldest are dropped and counted
    /// (`uctel_collector_clickhouse_rows_dropped_total{reason="queue_full"}`). Default 100000.
    pub queue_capacity_rows: u32,
    /// Timeout of one request, seconds. An `INSERT` that times out (or fails after it was
    /// sent: a reset, a 5xx without a "not applied" code) may have been applied: its rows
    /// are sent again only after ClickHouse answered that they are not in the table
    /// (exactly once; checks counted in `uctel_collector_clickhouse_insert_checks_total`).
    /// Default 30.
    pub timeout_seconds: f64,
    /// First retry delay, seconds; it doubles at each retry of the same `INSERT` up to
    /// `max_backoff_seconds`, every delay drawn uniformly below that bound. Default 0.1.
    pub min_backoff_seconds: f64,
    /// Largest retry delay, seconds. Default 10.
    pub max_backoff_seconds: f64,
    /// TLS settings of an `https://` URL.
    pub tls: TlsConfig,
}

impl Default for ClickHouseConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            database: None,
            table: "logs".into(),
            user: None,
            password_file: None,
            max_rows_per_insert: 10_000,
            batch_send_deadline_seconds: 1.0,
            queue_capacity_rows: 100_000,
            timeout_seconds: 30.0,
            min_backoff_seconds: 0.1,
            max_backoff_seconds: 10.0,
            tls: TlsConfig::default(),
        }
    }
}

impl ClickHouseConfig {
    /// The request timeout.
    pub fn timeout(&self) -> Duration {
        secs(self.timeout_seconds)
    }

    /// The batch deadline.
    pub fn batch_deadline(&self) -> Duration {
        secs(self.batch_send_deadline_seconds)
    }

    /// The backoff bounds `(min, max)`.
    pub fn backoff(&self) -> (Duration, Duration) {
        (
            secs(self.min_backoff_seconds),
            secs(self.max_backoff_seconds),
        )
    }

    /// Pushes every problem of the section (keys under `outputs.clickhouse`).
    pub fn validate(&self, p: &mut Problems) {
        let key = "outputs.clickhouse";
        check_url(p, &format!("{key}.url"), &self.url);
        if let Some(db) = &self.database {
            check_identifier(p, &format!("{key}.database"), db);
        }
        check_identifier(p, &format!("{key}.table"), &self.table);
        if let Some(u) = &self.user {
            if u.is_empty() || reqwest::header::HeaderValue::from_str(u).is_err() || u.contains(':')
            {
                p.push(
                    format!("{key}.user"),
                    "must be a non-empty name of visible ASCII without ':'",
                );
            }
        }
        if let Some(f) = &self.password_file {
            if self.user.is_none() {
                p.push(format!("{key}.password_file"), "needs `user`");
            }
            check_file(p, &format!("{key}.password_file"), f);
        }
        if !(1..=1_000_000).contains(&self.max_rows_per_insert) {
            p.push(
                format!("{key}.max_rows_per_insert"),
                "must be from 1 to 1000000",
            );
        }
        if self.queue_capacity_rows < self.max_rows_per_insert {
            p.push(
                format!("{key}.queue_capacity_rows"),
                format!(
                    "must hold at least one full INSERT (max_rows_per_insert = {})",
                    self.max_rows_per_insert
                ),
            );
        }
        for (name, v) in [
            ("timeout_seconds", self.timeout_seconds),
            (
                "batch_send_deadline_seconds",
                self.batch_send_deadline_seconds,
            ),
            ("min_backoff_seconds", self.min_backoff_seconds),
        ] {
            check_seconds(p, &format!("{key}.{name}"), v, 0.001, 3600.0);
        }
        check_seconds(
            p,
            &format!("{key}.max_backoff_seconds"),
            self.max_backoff_seconds,
            self.min_backoff_seconds.max(0.001),
            3600.0,
        );
        check_http(p, key, &self.tls, None, None);
    }
}

/// Checks a ClickHouse database or table name for `key`: a plain identifier
/// (`[A-Za-z_][A-Za-z0-9_]*`, at most 255 bytes), so it needs no quoting in the `INSERT`.
pub fn check_identifier(p: &mut Problems, key: &str, name: &str) {
    let mut chars = name.chars();
    let ok = name.len() <= 255
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !ok {
        p.push(
            key,
            format!("must be a plain identifier (letters, digits, '_'; not a digit first), got {name:?}"),
        );
    }
}

/// One `outputs.remote_write` endpoint.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RemoteWriteConfig {
    /// `http://` or `https://` URL of the receiver's write endpoint (required), e.g.
    /// `http://127.0.0.1:9090/api/v1/write`. Its `url` label on the self-metrics has any
    /// user and password removed.
    pub url: String,
    /// Timeout of one request, seconds. Default 30 (Prometheus `remote_timeout`).
    pub timeout_seconds: f64,
    /// Parallel senders; a series always goes to the same one, so its samples stay in order.
    /// Default 4.
    pub shards: u32,
    /// Most samples in one request. Default 2000 (Prometheus `max_samples_per_send`).
    pub max_samples_per_send: u32,
    /// A shard sends what it has once its oldest sample has waited this long, seconds.
    /// Default 1.
    pub batch_send_deadline_seconds: f64,
    /// Samples kept waiting in memory for this endpoint, over all shards; when full, the
    /// oldest are dropped and counted (`queue_full`). Default 100000.
    pub queue_capacity_samples: u32,
    /// First retry delay, seconds; it doubles at each retry of the same request up to
    /// `max_backoff_seconds` and every delay is drawn uniformly below that bound (full
    /// jitter). Default 0.03.
    pub min_backoff_seconds: f64,
    /// Largest retry delay, seconds (a longer `Retry-After` is cut to it). Default 5.
    pub max_backoff_seconds: f64,
    /// Tenant sent as `X-Scope-OrgID` (Mimir, Cortex). Default none.
    pub tenant: Option<String>,
    /// Extra request headers. The protocol's own (`Content-Encoding`, `Content-Type`,
    /// `X-Prometheus-Remote-Write-Version`, `User-Agent`, `Authorization`, `Host`,
    /// `Content-Length`) cannot be set here. Default none.
    pub headers: BTreeMap<String, String>,
    /// HTTP basic authentication. Default none.
    pub basic_auth: Option<BasicAuthConfig>,
    /// File holding a bearer token (`Authorization: Bearer …`; trailing newline ignored),
    /// read at start. Default none.
    pub bearer_token_file: Option<PathBuf>,
    /// TLS settings of `https://` URLs.
    pub tls: TlsConfig,
}

impl Default for RemoteWriteConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            timeout_seconds: 30.0,
            shards: 4,
            max_samples_per_send: 2000,
            batch_send_deadline_seconds: 1.0,
            queue_capacity_samples: 100_000,
            min_backoff_seconds: 0.03,
            max_backoff_seconds: 5.0,
            tenant: None,
            headers: BTreeMap::new(),
            basic_auth: None,
            bearer_token_file: None,
            tls: TlsConfig::default(),
        }
    }
}

/// `basic_auth:` of an HTTP output.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BasicAuthConfig {
    /// User name (required).
    pub username: String,
    /// File holding the password (trailing newline ignored), read at start (required).
    pub password_file: PathBuf,
}

/// `tls:` of an HTTP output (rustls; the system's trust store by default).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// PEM file of extra CA certificates to trust (a private CA). Default none.
    pub ca_file: Option<PathBuf>,
    /// Accept any server certificate (testing only: anyone on the path can read and change
    /// the data). Default false.
    pub insecure_skip_verify: bool,
}

/// Headers the remote-write protocol sets itself (lower case).
pub const RESERVED_HEADERS: &[&str] = &[
    "authorization",
    "content-encoding",
    "content-length",
    "content-type",
    "host",
    "user-agent",
    "x-prometheus-remote-write-version",
];

impl RemoteWriteConfig {
    /// The request timeout.
    pub fn timeout(&self) -> Duration {
        secs(self.timeout_seconds)
    }

    /// The batch deadline.
    pub fn batch_deadline(&self) -> Duration {
        secs(self.batch_send_deadline_seconds)
    }

    /// The backoff bounds `(min, max)`.
    pub fn backoff(&self) -> (Duration, Duration) {
        (
            secs(self.min_backoff_seconds),
            secs(self.max_backoff_seconds),
        )
    }
}

/// `s` seconds (0 for values that are not a valid duration; validation refuses them).
fn secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or(Duration::ZERO)
}

/// Checks an `http://`/`https://` URL for an output's `key`.
pub fn check_url(p: &mut Problems, key: &str, url: &str) {
    if url.is_empty() {
        p.push(key, "is required (the receiver's http:// or https:// URL)");
        return;
    }
    match reqwest::Url::parse(url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {}
        Ok(u) => p.push(
            key,
            format!(
                "must be an http:// or https:// URL with a host, got scheme {:?}",
                u.scheme()
            ),
        ),
        Err(e) => p.push(key, format!("is not a URL: {e}")),
    }
}

/// Checks that `path` names a readable file for `key`.
pub fn check_file(p: &mut Problems, key: &str, path: &std::path::Path) {
    if let Err(e) = std::fs::File::open(path) {
        p.push(key, format!("cannot read {}: {e}", path.display()));
    }
}

/// Checks a seconds value in `lo..=hi` for `key`.
pub fn check_seconds(p: &mut Problems, key: &str, v: f64, lo: f64, hi: f64) {
    if !(v.is_finite() && (lo..=hi).contains(&v)) {
        p.push(key, format!("must be from {lo} to {hi} seconds, got {v}"));
    }
}

/// Checks the shared HTTP settings (`tls`, auth files) of an output at `prefix`.
pub fn check_http(
    p: &mut Problems,
    prefix: &str,
    tls: &TlsConfig,
    basic_auth: Option<&BasicAuthConfig>,
    bearer_token_file: Option<&std::path::Path>,
) {
    if let Some(ca) = &tls.ca_file {
        check_file(p, &format!("{prefix}.tls.ca_file"), ca);
    }
    if let Some(b) = basic_auth {
        if b.username.is_empty() {
            p.push(format!("{prefix}.basic_auth.username"), "is required");
        }
        if b.password_file.as_os_str().is_empty() {
            p.push(format!("{prefix}.basic_auth.password_file"), "is required");
        } else {
            check_file(
                p,
                &format!("{prefix}.basic_auth.password_file"),
                &b.password_file,
            );
        }
    }
    if let Some(f) = bearer_token_file {
        check_file(p, &format!("{prefix}.bearer_token_file"), f);
        if basic_auth.is_some() {
            p.push(
                format!("{prefix}.bearer_token_file"),
                "set basic_auth or bearer_token_file, not both",
            );
        }
    }
}

impl OutputsConfig {
    /// Pushes every problem of the section (keys under `outputs.`).
    pub fn validate(&self, p: &mut Problems) {
        for (i, rw) in self.remote_write.iter().enumerate() {
            let key = format!("outputs.remote_write[{i}]");
            check_url(p, &format!("{key}.url"), &rw.url);
            check_seconds(
                p,
                &format!("{key}.timeout_seconds"),
                rw.timeout_seconds,
                0.001,
                3600.0,
            );
            check_seconds(
                p,
                &format!("{key}.batch_send_deadline_seconds"),
                rw.batch_send_deadline_seconds,
                0.001,
                3600.0,
            );
            check_seconds(
                p,
                &format!("{key}.min_backoff_seconds"),
                rw.min_backoff_seconds,
                0.001,
                3600.0,
            );
            check_seconds(
                p,
                &format!("{key}.max_backoff_seconds"),
                rw.max_backoff_seconds,
                rw.min_backoff_seconds.max(0.001),
                3600.0,
            );
            if !(1..=256).contains(&rw.shards) {
                p.push(format!("{key}.shards"), "must be from 1 to 256");
            }
            if !(1..=1_000_000).contains(&rw.max_samples_per_send) {
                p.push(
                    format!("{key}.max_samples_per_send"),
                    "must be from 1 to 1000000",
                );
            }
            let floor = u64::from(rw.shards) * u64::from(rw.max_samples_per_send);
            if u64::from(rw.queue_capacity_samples) < floor {
                p.push(
                    format!("{key}.queue_capacity_samples"),
                    format!(
                        "must hold at least one full request per shard (shards × \
                         max_samples_per_send = {floor})"
                    ),
                );
            }
            for name in rw.headers.keys() {
                let lower = name.to_ascii_lowercase();
                if RESERVED_HEADERS.contains(&lower.as_str()) {
                    p.push(
                        format!("{key}.headers.{name}"),
                        "is set by the remote-write protocol and cannot be changed",
                    );
                } else if lower == "x-scope-orgid" && rw.tenant.is_some() {
                    p.push(
                        format!("{key}.headers.{name}"),
                        "set `tenant` or this header, not both",
                    );
                } else if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
                    p.push(
                        format!("{key}.headers.{name}"),
                        "is not a valid header name",
                    );
                }
            }
            for (name, value) in &rw.headers {
                if reqwest::header::HeaderValue::from_str(value).is_err() {
                    p.push(
                        format!("{key}.headers.{name}"),
                        "is not a valid header value (visible ASCII only)",
                    );
                }
            }
            if let Some(t) = &rw.tenant {
                if t.is_empty() || reqwest::header::HeaderValue::from_str(t).is_err() {
                    p.push(format!("{key}.tenant"), "must be a non-empty header value");
                }
            }
            check_http(
                p,
                &key,
                &rw.tls,
                rw.basic_auth.as_ref(),
                rw.bearer_token_file.as_deref(),
            );
        }
        if let Some(c) = &self.clickhouse {
            c.validate(p);
        }
        if let Some(c) = &self.otlp {
            c.validate(p);
        }
        let mut urls: Vec<&str> = self.remote_write.iter().map(|r| r.url.as_str()).collect();
        urls.sort_unstable();
        if let Some(w) = urls.windows(2).find(|w| w[0] == w[1] && !w[0].is_empty()) {
            p.push("outputs.remote_write", format!("{} is listed twice", w[0]));
        }
    }
}

// ---- outputs.otlp (OTLP/HTTP: OpenTelemetry protocol specification, "OTLP/HTTP") ----

/// `outputs.otlp.compression`.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OtlpCompression {
    /// `Content-Encoding: gzip` (every OTLP/HTTP receiver must accept it).
    #[default]
    Gzip,
    /// The protobuf as is.
    None,
}

/// `outputs.otlp`: one OTLP/HTTP receiver for metrics and logs.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct OtlpConfig {
    /// Base `http://` or `https://` URL of the receiver (required), e.g.
    /// `http://127.0.0.1:4318`: metrics go to `<endpoint>/v1/metrics`, logs to
    /// `<endpoint>/v1/logs` (the rule of `OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub endpoint: String,
    /// Send the agents' samples (counters as cumulative monotonic sums, gauges and untyped
    /// samples as gauges, histograms as cumulative histograms). Default true.
    pub metrics: bool,
    /// Send the agents' log records. Default true.
    pub logs: bool,
    /// Request body compression: `gzip` or `none`. Default gzip.
    pub compression: OtlpCompression,
    /// Extra resource attributes on every agent's resource, beside `host.name` (the agent's
    /// hostname) and `service.instance.id` (the agent id). Default none.
    pub resource_attributes: BTreeMap<String, String>,
    /// Most data points (metrics) or log records (logs) in one request. Default 2000.
    pub max_items_per_request: u32,
    /// A request is sent once its oldest item has waited this long, seconds. Default 1.
    pub batch_send_deadline_seconds: f64,
    /// Items kept waiting in memory per signal; when full, the oldest are dropped and
    /// counted (`uctel_collector_otlp_items_dropped_total{reason="queue_full"}`).
    /// Default 100000.
    pub queue_capacity_items: u32,
    /// Timeout of one request, seconds. Default 10 (the OTLP exporters' default).
    pub timeout_seconds: f64,
    /// First retry delay, seconds; it doubles at each retry of the same request up to
    /// `max_backoff_seconds`, every delay drawn uniformly below that bound. Default 0.1.
    pub min_backoff_seconds: f64,
    /// Largest retry delay, seconds (a longer `Retry-After` is cut to it). Default 10.
    pub max_backoff_seconds: f64,
    /// Extra request headers (an API key). The protocol's own (`Content-Encoding`,
    /// `Content-Type`, `User-Agent`, `Authorization`, `Host`, `Content-Length`) cannot be
    /// set here. Default none.
    pub headers: BTreeMap<String, String>,
    /// HTTP basic authentication. Default none.
    pub basic_auth: Option<BasicAuthConfig>,
    /// File holding a bearer token (`Authorization: Bearer …`; trailing newline ignored),
    /// read at start. Default none.
    pub bearer_token_file: Option<PathBuf>,
    /// TLS settings of an `https://` endpoint.
    pub tls: TlsConfig,
}

impl Default for OtlpConfig {
    fn default() -> Self {
        Self {
            endpoint: String::new(),
            metrics: true,
            logs: true,
            compression: OtlpCompression::Gzip,
            resource_attributes: BTreeMap::new(),
            max_items_per_request: 2000,
            batch_send_deadline_seconds: 1.0,
            queue_capacity_items: 100_000,
            timeout_seconds: 10.0,
            min_backoff_seconds: 0.1,
            max_backoff_seconds: 10.0,
            headers: BTreeMap::new(),
            basic_auth: None,
            bearer_token_file: None,
            tls: TlsConfig::default(),
        }
    }
}

/// Headers OTLP/HTTP sets itself (lower case).
pub const OTLP_RESERVED_HEADERS: &[&str] = &[
    "authorization",
    "content-encoding",
    "content-length",
    "content-type",
    "host",
    "user-agent",
];

impl OtlpConfig {
    /// The request timeout.
    pub fn timeout(&self) -> Duration {
        secs(self.timeout_seconds)
    }

    /// The batch deadline.
    pub fn batch_deadline(&self) -> Duration {
        secs(self.batch_send_deadline_seconds)
    }

    /// The backoff bounds `(min, max)`.
    pub fn backoff(&self) -> (Duration, Duration) {
        (
            secs(self.min_backoff_seconds),
            secs(self.max_backoff_seconds),
        )
    }

    /// The URL of a signal's requests: `endpoint` with `/v1/<signal>` appended (one `/`
    /// between them whatever `endpoint` ends with).
    pub fn signal_url(&self, signal: &str) -> String {
        format!("{}/v1/{signal}", self.endpoint.trim_end_matches('/'))
    }

    /// Pushes every problem of the section (keys under `outputs.otlp`).
    pub fn validate(&self, p: &mut Problems) {
        let key = "outputs.otlp";
        check_url(p, &format!("{key}.endpoint"), &self.endpoint);
        if !self.metrics && !self.logs {
            p.push(
                format!("{key}.metrics"),
                "metrics and logs are both off: remove the section or turn one on",
            );
        }
        if !(1..=1_000_000).contains(&self.max_items_per_request) {
            p.push(
                format!("{key}.max_items_per_request"),
                "must be from 1 to 1000000",
            );
        }
        if self.queue_capacity_items < self.max_items_per_request {
            p.push(
                format!("{key}.queue_capacity_items"),
                format!(
                    "must hold at least one full request (max_items_per_request = {})",
                    self.max_items_per_request
                ),
            );
        }
        for (name, v) in [
            ("timeout_seconds", self.timeout_seconds),
            (
                "batch_send_deadline_seconds",
                self.batch_send_deadline_seconds,
            ),
            ("min_backoff_seconds", self.min_backoff_seconds),
        ] {
            check_seconds(p, &format!("{key}.{name}"), v, 0.001, 3600.0);
        }
        check_seconds(
            p,
            &format!("{key}.max_backoff_seconds"),
            self.max_backoff_seconds,
            self.min_backoff_seconds.max(0.001),
            3600.0,
        );
        for (name, value) in &self.headers {
            let lower = name.to_ascii_lowercase();
            if OTLP_RESERVED_HEADERS.contains(&lower.as_str()) {
                p.push(
                    format!("{key}.headers.{name}"),
                    "is set by OTLP/HTTP and cannot be changed",
                );
            } else if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
                p.push(
                    format!("{key}.headers.{name}"),
                    "is not a valid header name",
                );
            }
            if reqwest::header::HeaderValue::from_str(value).is_err() {
                p.push(
                    format!("{key}.headers.{name}"),
                    "is not a valid header value (visible ASCII only)",
                );
            }
        }
        for name in self.resource_attributes.keys() {
            if name.is_empty() {
                p.push(
                    format!("{key}.resource_attributes"),
                    "an attribute name is empty",
                );
            }
        }
        check_http(
            p,
            key,
            &self.tls,
            self.basic_auth.as_ref(),
            self.bearer_token_file.as_deref(),
        );
    }
}

#[cfg(test)]
mod otlp_tests {
    use super::*;

    #[test]
    fn defaults_validate_with_an_endpoint_and_reserved_headers_are_refused() {
        let mut c = OtlpConfig {
            endpoint: "http://127.0.0.1:4318/".into(),
            ..OtlpConfig::default()
        };
        let mut p = Problems::default();
        c.validate(&mut p);
        assert!(p.is_empty(), "{p:?}");
        assert_eq!(c.signal_url("logs"), "http://127.0.0.1:4318/v1/logs");
        c.headers.insert("Content-Type".into(), "text/plain".into());
        c.metrics = false;
        c.logs = false;
        c.queue_capacity_items = 10;
        let mut p = Problems::default();
        c.validate(&mut p);
        let text = format!("{p:?}");
        for key in [
            "outputs.otlp.headers.Content-Type",
            "outputs.otlp.metrics",
            "outputs.otlp.queue_capacity_items",
        ] {
            assert!(text.contains(key), "{key} not in {text}");
        }
    }
}
