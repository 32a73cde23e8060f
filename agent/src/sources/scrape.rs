//! The scrape source: the agent scrapes local Prometheus endpoints (node_exporter,
//! dcgm-exporter, an application's `/metrics`) like a Prometheus `scrape_configs` job and
//! ships their samples over UC like its own, so the host needs no second pipeline.
//!
//! Each target (`sources.scrape[]`) is scraped every `interval_seconds` by its own task, the
//! first scrape at a random offset within the interval (so targets do not align), with a
//! `timeout_seconds` bound on the whole request; a target that is down, slow or answers
//! garbage costs only its own scrape. Per scrape, as Prometheus (its *scrape target
//! health* series):
//!
//! - `up{job}` 1 when the scrape succeeded, else 0;
//! - `scrape_duration_seconds{job}`, `scrape_samples_scraped{job}` and
//!   `scrape_samples_post_metric_relabeling{job}`;
//! - a failed scrape ships no samples (as Prometheus, whose series then go stale) and is
//!   counted in `uctel_agent_source_errors_total{source="scrape",reason}` ([`ScrapeError`]:
//!   `down`, `timeout`, `http_status`, `parse_error`, `body_too_large`, `sample_limit`),
//!   logged once per target and reason.
//!
//! Samples: OpenMetrics 1.0 or the text format 0.0.4, asked for with Prometheus's own
//! `Accept` header (OpenMetrics preferred); an OpenMetrics answer (by its `Content-Type`) is
//! rewritten as the text format by `sources::openmetrics`, then either is turned into records
//! by `sources::exposition`. Parsing runs off the async workers (`block_in_place`), so a huge
//! answer delays no other source;
//! a sample keeps its own timestamp where the target gives one, the others get the scrape's
//! start (milliseconds). Every series gets `job` and the target's `labels`; a scraped label
//! with one of those names is renamed `exported_<name>` unless `honor_labels` (then the
//! target's value wins), as Prometheus does. `metric_relabel.keep` / `.drop` (regular
//! expressions matched against the whole metric name) filter series by name; `sample_limit`
//! (0: none) fails a scrape with more samples after filtering, as Prometheus does. The
//! collector adds `agent` and `instance` (the agent's host), and renames a scraped `instance`
//! to `exported_instance`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use uctel_protocol::payload::{Label, Metric};

use super::exposition::{self, Timestamps};
use super::metric::gauge;
use super::openmetrics;

/// Longest answer read (larger ones fail the scrape as `body_too_large`).
pub const MAX_BODY_BYTES: usize = 64 << 20;

/// The `Accept` header, Prometheus 2's default (`scrape/scrape.go`, `scrapeAcceptHeader`):
/// OpenMetrics 1.0.0, then 0.0.1, then the text format 0.0.4, then anything.
pub const ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
                          version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// `sources.scrape[]`: one target, as one Prometheus `static_configs` target of a job.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ScrapeTarget {
    /// `http://` or `https://` URL of the target's metrics, path included
    /// (`http://127.0.0.1:9100/metrics`).
    pub url: String,
    /// The `job` label of the target's series (Prometheus's `job_name`). Default `scrape`.
    #[serde(default = "default_job")]
    pub job: String,
    /// Seconds between two scrapes. Default 15.
    #[serde(default = "default_interval")]
    pub interval_seconds: f64,
    /// Seconds a scrape may take, the whole answer read; at most the interval. Default 10,
    /// or the interval when that is shorter (Prometheus's rule for a job without
    /// `scrape_timeout`: the global 10 s, lowered to `scrape_interval`).
    #[serde(default)]
    pub timeout_seconds: Option<f64>,
    /// Keep the target's own values of labels that clash with `job` and `labels` (else they
    /// are renamed `exported_<name>`). Default false.
    #[serde(default)]
    pub honor_labels: bool,
    /// Series to keep or drop by metric name.
    #[serde(default)]
    pub metric_relabel: MetricRelabel,
    /// Most samples a scrape may bring, after `metric_relabel`; more fails the scrape
    /// (`up` 0, nothing shipped). 0: no limit. Default 0.
    #[serde(default)]
    pub sample_limit: u64,
    /// Labels added to every series of the target.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// `sources.scrape[].metric_relabel`: `keep` and `drop` actions on the metric name
/// (`__name__`), regular expressions anchored at both ends as Prometheus anchors them.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MetricRelabel {
    /// Keep only the series whose name matches.
    #[serde(default)]
    pub keep: Option<String>,
    /// Drop the series whose name matches (after `keep`).
    #[serde(default)]
    pub drop: Option<String>,
}

fn default_job() -> String {
    "scrape".to_owned()
}
fn default_interval() -> f64 {
    15.0
}
/// The timeout of a target without `timeout_seconds`, unless its interval is shorter
/// (Prometheus's global `scrape_timeout` default).
pub const DEFAULT_TIMEOUT_SECONDS: f64 = 10.0;

impl ScrapeTarget {
    /// Seconds one scrape may take: `timeout_seconds`, or [`DEFAULT_TIMEOUT_SECONDS`]
    /// lowered to `interval_seconds` (Prometheus `config.go`: a job without
    /// `scrape_timeout` whose `scrape_interval` is shorter than the global timeout gets
    /// the interval as its timeout).
    pub fn effective_timeout_seconds(&self) -> f64 {
        self.timeout_seconds
            .unwrap_or_else(|| DEFAULT_TIMEOUT_SECONDS.min(self.interval_seconds))
    }
}

/// Why a scrape failed (`uctel_agent_source_errors_total{source="scrape",reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScrapeError {
    /// No connection, or the transfer broke.
    Down,
    /// Longer than `timeout_seconds`.
    Timeout,
    /// An answer other than 2xx.
    HttpStatus,
    /// Not the text format.
    ParseError,
    /// More than [`MAX_BODY_BYTES`].
    BodyTooLarge,
    /// More samples than `sample_limit`.
    SampleLimit,
}

impl ScrapeError {
    /// The `reason` label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            ScrapeError::Down => "down",
            ScrapeError::Timeout => "timeout",
            ScrapeError::HttpStatus => "http_status",
            ScrapeError::ParseError => "parse_error",
            ScrapeError::BodyTooLarge => "body_too_large",
            ScrapeError::SampleLimit => "sample_limit",
        }
    }
}

/// A regular expression anchored at both ends.
///
/// # Errors
/// The regex crate's message.
pub fn anchored(pattern: &str) -> Result<regex::Regex, regex::Error> {
    regex::Regex::new(&format!("^(?:{pattern})$"))
}

/// What `--check-config` says about target `t` (key suffix, problem).
pub fn problems(t: &ScrapeTarget) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    match reqwest::Url::parse(&t.url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {}
        Ok(u) => out.push((
            "url",
            format!(
                "must be an http:// or https:// URL with a host, got {:?}",
                u.as_str()
            ),
        )),
        Err(e) => out.push(("url", format!("{e}: {:?}", t.url))),
    }
    if t.job.is_empty() {
        out.push(("job", "must not be empty".to_owned()));
    }
    let seconds = |v: f64| v.is_finite() && (0.01..=86400.0).contains(&v);
    if !seconds(t.interval_seconds) {
        out.push((
            "interval_seconds",
            format!(
                "must be a number of seconds in [0.01, 86400], got {}",
                t.interval_seconds
            ),
        ));
    }
    if let Some(timeout) = t.timeout_seconds {
        if !seconds(timeout) || timeout > t.interval_seconds {
            out.push((
                "timeout_seconds",
                format!("must be a number of seconds up to interval_seconds, got {timeout}"),
            ));
        }
    }
    for (key, pattern) in [
        ("metric_relabel.keep", &t.metric_relabel.keep),
        ("metric_relabel.drop", &t.metric_relabel.drop),
    ] {
        if let Some(p) = pattern {
            if let Err(e) = anchored(p) {
                out.push((key, format!("not a regular expression: {e}")));
            }
        }
    }
    for name in t.labels.keys() {
        let valid = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !name.starts_with("__");
        if !valid || name == "agent" || name == "instance" {
            out.push(("labels", format!("{name:?} is not a label name a target may add (agent and instance are the collector's)")));
        }
    }
    out
}

/// One target, ready to scrape.
#[derive(Debug, Clone)]
pub struct Target {
    config: ScrapeTarget,
    keep: Option<regex::Regex>,
    drop: Option<regex::Regex>,
    client: reqwest::Client,
}

/// One scrape's records (the target's samples, then the health series) and its failure.
#[derive(Debug, Default)]
pub struct Scraped {
    /// What to ship.
    pub metrics: Vec<Metric>,
    /// Why it failed, with the detail; `None` when `up` is 1.
    pub error: Option<(ScrapeError, String)>,
}

impl Target {
    /// A target from its configuration (validated by [`problems`]).
    ///
    /// # Errors
    /// A regular expression or the HTTP client could not be built.
    pub fn new(config: ScrapeTarget) -> Result<Target, String> {
        let compile = |p: &Option<String>| {
            p.as_deref()
                .map(anchored)
                .transpose()
                .map_err(|e| e.to_string())
        };
        let keep = compile(&config.metric_relabel.keep)?;
        let drop = compile(&config.metric_relabel.drop)?;
        let client = reqwest::Client::builder()
            .user_agent(concat!("uctel-agent/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Target {
            config,
            keep,
            drop,
            client,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ScrapeTarget {
        &self.config
    }

    /// Scrapes once (module docs).
    pub async fn scrape(&self) -> Scraped {
        let started = Instant::now();
        let start_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let timeout = Duration::try_from_secs_f64(self.config.effective_timeout_seconds())
            .unwrap_or(Duration::from_secs(10));
        let body = tokio::time::timeout(timeout, self.fetch()).await;
        let (samples, scraped, error) = match body {
            Err(_) => (
                Vec::new(),
                0,
                Some((
                    ScrapeError::Timeout,
                    format!("no answer within {timeout:?}"),
                )),
            ),
            Ok(Err(e)) => (Vec::new(), 0, Some(e)),
            Ok(Ok(text)) => match off_the_workers(|| self.samples(&text, start_ms)) {
                Ok((kept, scraped)) => (kept, scraped, None),
                Err((e, scraped)) => (Vec::new(), scraped, Some(e)),
            },
        };
        let kept = samples.iter().map(sample_count).sum::<usize>();
        let mut metrics = samples;
        let health = |name: &str, help: &str, v: f64| {
            let mut m = gauge(name, help, &[], v);
            m.timestamp_ms = start_ms;
            m
        };
        #[allow(clippy::cast_precision_loss)]
        for mut m in [
            health(
                "up",
                "1 if the target was scraped successfully, else 0.",
                if error.is_none() { 1.0 } else { 0.0 },
            ),
            health(
                "scrape_duration_seconds",
                "Duration of the scrape.",
                started.elapsed().as_secs_f64(),
            ),
            health(
                "scrape_samples_scraped",
                "The number of samples the target exposed.",
                scraped as f64,
            ),
            health(
                "scrape_samples_post_metric_relabeling",
                "The number of samples remaining after metric relabeling was applied.",
                if error.is_none() { kept as f64 } else { 0.0 },
            ),
        ] {
            m.labels = self.target_labels();
            metrics.push(m);
        }
        Scraped { metrics, error }
    }

    /// `job` and the configured labels, as record labels.
    fn target_labels(&self) -> Vec<Label> {
        std::iter::once(("job", self.config.job.as_str()))
            .chain(
                self.config
                    .labels
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str())),
            )
            .map(|(n, v)| Label {
                name: n.to_owned(),
                value: v.to_owned(),
            })
            .collect()
    }

    async fn fetch(&self) -> Result<String, (ScrapeError, String)> {
        let down = |e: reqwest::Error| (ScrapeError::Down, e.to_string());
        let mut resp = self
            .client
            .get(&self.config.url)
            .header(reqwest::header::ACCEPT, ACCEPT)
            .send()
            .await
            .map_err(down)?;
        if !resp.status().is_success() {
            return Err((ScrapeError::HttpStatus, format!("HTTP {}", resp.status())));
        }
        let open_metrics = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/openmetrics-text"));
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(down)? {
            if body.len() + chunk.len() > MAX_BODY_BYTES {
                return Err((
                    ScrapeError::BodyTooLarge,
                    format!("more than {MAX_BODY_BYTES} bytes"),
                ));
            }
            body.extend_from_slice(&chunk);
        }
        let text = String::from_utf8(body)
            .map_err(|e| (ScrapeError::ParseError, format!("not UTF-8: {e}")))?;
        if open_metrics {
            off_the_workers(|| openmetrics::to_text(&text))
                .map_err(|e| (ScrapeError::ParseError, e.to_string()))
        } else {
            Ok(text)
        }
    }

    /// The target's records after `metric_relabel`, with target labels and timestamps, and
    /// the samples scraped; or the failure and the samples scraped.
    #[allow(clippy::type_complexity)]
    fn samples(
        &self,
        text: &str,
        start_ms: i64,
    ) -> Result<(Vec<Metric>, usize), ((ScrapeError, String), usize)> {
        let parsed = exposition::parse(text, &|_| String::new(), Timestamps::Keep)
            .map_err(|e| ((ScrapeError::ParseError, e.to_string()), 0))?;
        let scraped = parsed.iter().map(sample_count).sum::<usize>();
        let ours = self.target_labels();
        let mut kept = Vec::with_capacity(parsed.len());
        for mut m in parsed {
            if self.keep.as_ref().is_some_and(|r| !r.is_match(&m.name)) {
                continue;
            }
            if self.drop.as_ref().is_some_and(|r| r.is_match(&m.name)) {
                continue;
            }
            for l in &mut m.labels {
                if !self.config.honor_labels && ours.iter().any(|o| o.name == l.name) {
                    l.name = format!("exported_{}", l.name);
                }
            }
            for o in &ours {
                if !m.labels.iter().any(|l| l.name == o.name) {
                    m.labels.push(o.clone());
                }
            }
            if m.timestamp_ms == 0 {
                m.timestamp_ms = start_ms;
            }
            kept.push(m);
        }
        let n = kept.iter().map(sample_count).sum::<usize>();
        let limit = usize::try_from(self.config.sample_limit).unwrap_or(usize::MAX);
        if limit > 0 && n > limit {
            return Err((
                (
                    ScrapeError::SampleLimit,
                    format!("{n} samples, sample_limit {limit}"),
                ),
                scraped,
            ));
        }
        Ok((kept, scraped))
    }
}

/// Runs CPU-bound `f` (parsing an answer of up to [`MAX_BODY_BYTES`]) without holding an
/// async worker: `block_in_place` on a multi-threaded runtime, inline otherwise.
fn off_the_workers<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// Samples a record stands for in Prometheus (a histogram: its buckets, `+Inf`, `_sum` and
/// `_count`).
fn sample_count(m: &Metric) -> usize {
    if m.r#type == uctel_protocol::payload::MetricType::Histogram as i32 {
        m.buckets.len() + 3
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(yaml: &str) -> Target {
        let c: ScrapeTarget = serde_yaml::from_str(yaml).unwrap();
        assert!(problems(&c).is_empty(), "{:?}", problems(&c));
        Target::new(c).unwrap()
    }

    const TEXT: &str = "\
# TYPE a_total counter
a_total{job=\"theirs\",x=\"1\"} 3
b 2 1700000000000
# TYPE h histogram
h_bucket{le=\"1\"} 1
h_bucket{le=\"+Inf\"} 2
h_sum 3
h_count 2
go_goroutines 7
";

    fn labels(m: &Metric) -> Vec<(String, String)> {
        let mut v: Vec<_> = m
            .labels
            .iter()
            .map(|l| (l.name.clone(), l.value.clone()))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn job_and_labels_are_added_and_clashes_renamed_unless_honoured() {
        let t = target("url: http://127.0.0.1:1/metrics\njob: node\nlabels: {team: a}\n");
        let (ms, scraped) = t.samples(TEXT, 42).unwrap();
        assert_eq!(scraped, 1 + 1 + 4 + 1);
        let a = ms.iter().find(|m| m.name == "a_total").unwrap();
        assert_eq!(
            labels(a),
            [
                ("exported_job", "theirs"),
                ("job", "node"),
                ("team", "a"),
                ("x", "1")
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
        assert_eq!(a.timestamp_ms, 42, "the scrape's time");
        let b = ms.iter().find(|m| m.name == "b").unwrap();
        assert_eq!(
            b.timestamp_ms, 1_700_000_000_000,
            "the target's own timestamp"
        );
        let honoured = target("url: http://127.0.0.1:1/metrics\njob: node\nhonor_labels: true\n");
        let (ms, _) = honoured.samples(TEXT, 42).unwrap();
        let a = ms.iter().find(|m| m.name == "a_total").unwrap();
        assert_eq!(
            labels(a),
            [("job", "theirs"), ("x", "1")].map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
    }

    #[test]
    fn keep_drop_and_sample_limit_as_prometheus() {
        let t = target(
            "url: http://127.0.0.1:1/m\nmetric_relabel: {keep: '[ah].*|go_.*', drop: 'go_.*'}\n",
        );
        let (ms, _) = t.samples(TEXT, 1).unwrap();
        let names: Vec<_> = ms.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["a_total", "h"]);
        let limited = target("url: http://127.0.0.1:1/m\nsample_limit: 3\n");
        let err = limited.samples(TEXT, 1).unwrap_err();
        assert_eq!((err.0).0, ScrapeError::SampleLimit);
        let fits = target("url: http://127.0.0.1:1/m\nsample_limit: 8\n");
        assert!(fits.samples(TEXT, 1).is_ok());
        assert_eq!(
            target("url: http://127.0.0.1:1/m\n")
                .samples("a{ 1\n", 1)
                .unwrap_err()
                .0
                 .0,
            ScrapeError::ParseError
        );
    }

    #[test]
    fn configuration_problems_are_named() {
        let c: ScrapeTarget = serde_yaml::from_str(
            "url: ftp://x/m\njob: ''\ninterval_seconds: 5\ntimeout_seconds: 6\nmetric_relabel: {keep: '('}\nlabels: {instance: x, '0a': y}\n",
        )
        .unwrap();
        let keys: Vec<_> = problems(&c).into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            keys,
            [
                "url",
                "job",
                "timeout_seconds",
                "metric_relabel.keep",
                "labels",
                "labels"
            ]
        );
    }

    /// `interval_seconds: 1` without `timeout_seconds` is valid and times out after the
    /// interval, as Prometheus does for a job with `scrape_interval: 1s` and no
    /// `scrape_timeout`; a longer interval keeps the 10 s default.
    #[test]
    fn a_short_interval_without_a_timeout_takes_the_interval_as_timeout() {
        let short: ScrapeTarget =
            serde_yaml::from_str("url: http://127.0.0.1:9100/metrics\ninterval_seconds: 1\n")
                .unwrap();
        assert_eq!(problems(&short), []);
        assert_eq!(short.effective_timeout_seconds(), 1.0);
        let long: ScrapeTarget =
            serde_yaml::from_str("url: http://127.0.0.1:9100/metrics\ninterval_seconds: 30\n")
                .unwrap();
        assert_eq!(long.effective_timeout_seconds(), 10.0);
        let set: ScrapeTarget = serde_yaml::from_str(
            "url: http://127.0.0.1:9100/metrics\ninterval_seconds: 1\ntimeout_seconds: 0.5\n",
        )
        .unwrap();
        assert_eq!(set.effective_timeout_seconds(), 0.5);
    }

    #[tokio::test]
    async fn a_dead_a_slow_and_a_refusing_target_are_each_counted_with_up_zero() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dead = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let slow = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let slow_addr = slow.local_addr().unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = slow.accept().await {
                held.push(s);
            }
        });
        let refusing = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let refusing_addr = refusing.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = refusing.accept().await {
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").await;
            }
        });
        for (addr, want) in [
            (dead, ScrapeError::Down),
            (slow_addr, ScrapeError::Timeout),
            (refusing_addr, ScrapeError::HttpStatus),
        ] {
            let t = target(&format!(
                "url: http://{addr}/metrics\ninterval_seconds: 1\ntimeout_seconds: 0.3\n"
            ));
            let s = t.scrape().await;
            assert_eq!(s.error.as_ref().map(|e| e.0), Some(want), "{addr}");
            let up = s.metrics.iter().find(|m| m.name == "up").unwrap();
            assert_eq!(up.value, 0.0);
            assert_eq!(s.metrics.len(), 4, "only the health series");
        }
    }
}
