//! `outputs.otlp`: samples and log records over OTLP/HTTP (OpenTelemetry protocol
//! specification, "OTLP/HTTP": binary protobuf, `POST` to `<endpoint>/v1/metrics` and
//! `<endpoint>/v1/logs`).
//!
//! ```yaml
//! outputs:
//!   otlp:
//!     endpoint: http://127.0.0.1:4318     # an OpenTelemetry Collector's otlphttp receiver
//!     logs: false                         # metrics only
//!     bearer_token_file: /etc/uctel/otlp.token
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use uctel_common::config::Problems;

use super::outputs::{check_http, check_seconds, check_url, BasicAuthConfig, TlsConfig};

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

/// `s` seconds (0 for values that are not a valid duration; validation refuses them).
fn secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
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
