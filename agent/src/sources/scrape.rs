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
//! - `up{job,instance}` 1 when the scrape succeeded, else 0;
//! - `scrape_duration_seconds`, `scrape_samples_scraped` (every sample of the answer) and
//!   `scrape_samples_post_metric_relabeling` (those left after `metric_relabel`: the samples
//!   shipped plus those refused below), with the same labels;
//! - a failed scrape ships no samples (as Prometheus, whose series then go stale) and is
//!   counted once in `uctel_agent_source_errors_total{source="scrape",reason}`
//!   ([`ScrapeError`]: `down`, `timeout`, `http_status`, `parse_error`, `body_too_large`,
//!   `sample_limit`), logged once per target and reason;
//! - a sample of a successful scrape that Prometheus would not append is refused and
//!   counted, one per sample, in the same counter ([`SampleRefusal`]: `duplicate`,
//!   `timestamp_too_new`, `timestamp_too_old`), logged once per target and reason.
//!
//! The answer is read in chunks into one buffer that grows to at most `body_size_limit`
//! (Prometheus's key and size units; default [`DEFAULT_BODY_SIZE_LIMIT`]): an answer whose
//! `Content-Length` is over the limit fails before its body is read, one without it fails
//! at the first chunk that passes the limit, and the rest is never read (the connection is
//! dropped). What was read is held until it is parsed, because the parser takes the whole
//! text; so a scrape holds at most the limit, plus the parsed records, plus for OpenMetrics
//! its rewrite as the text format.
//!
//! Timestamps (Prometheus's `honor_timestamps`, default on): a sample keeps the timestamp
//! the target gives it, unless it is more than `timestamp_max_future_seconds` (default
//! 600) after the scrape's start or more than `timestamp_max_age_seconds` (default 3600)
//! before it; such a sample is refused (`timestamp_too_new`, `timestamp_too_old`), as
//! Prometheus refuses samples too far in the future or out of its head's bounds
//! (`storage.ErrOutOfBounds`). A target that writes seconds where the format wants
//! milliseconds (1970 to the agent) or the reverse (far in the future) is refused, not
//! shipped with a timestamp no query finds. With `honor_timestamps: false` every sample
//! carries the scrape's start and none is refused for its timestamp. A series given twice
//! in one answer keeps its first sample, the others are refused as `duplicate`, as
//! Prometheus does (`sources::exposition::parse_first`).
//!
//! Samples: OpenMetrics 1.0 or the text format 0.0.4, asked for with Prometheus's own
//! `Accept` header (OpenMetrics preferred); an OpenMetrics answer (by its `Content-Type`) is
//! rewritten as the text format by `sources::openmetrics`, then either is turned into records
//! by `sources::exposition`. Parsing runs off the async workers (`block_in_place`), so a huge
//! answer delays no other source;
//! a sample keeps its own timestamp where the target gives one (within the bounds above), the
//! others get the scrape's start (milliseconds). Every series gets `job`, `instance` (by
//! default the URL's `host:port`, as Prometheus labels a static target, so two targets of
//! one job stay two series; a configuration where two targets share `job` and `instance`
//! is refused at load) and the target's `labels`; a scraped label
//! with one of those names is renamed `exported_<name>` unless `honor_labels` (then the
//! target's value wins), as Prometheus does. `metric_relabel.keep` / `.drop` (regular
//! expressions matched against the whole metric name) filter series by name; `sample_limit`
//! (0: none) fails a scrape with more samples shipped, as Prometheus does. The
//! collector adds `agent` and `instance` (the agent's host), and renames the target's
//! `instance` to `exported_instance`, as a Prometheus federating another does with
//! `honor_labels: false`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use uctel_protocol::payload::{Label, Metric};

use super::exposition::{self, Timestamps};
use super::metric::gauge;
use super::openmetrics;

/// `body_size_limit` of a target that sets none: 16 MiB. Prometheus's default is 0 (no
/// limit); the agent holds the answer in memory to parse it, so it needs a bound. 16 MiB
/// is several times a large node_exporter or dcgm-exporter answer (1 to 3 MB).
pub const DEFAULT_BODY_SIZE_LIMIT: &str = "16MiB";

/// Largest `body_size_limit` accepted: 1 GiB.
pub const MAX_BODY_SIZE_LIMIT: u64 = 1 << 30;

/// `timestamp_max_future_seconds` of a target that sets none: 10 minutes, the clock skew
/// between a target's clock and the agent's that is still shipped. Prometheus refuses
/// samples too far ahead of its own clock; further ahead is a wrong clock or a timestamp
/// in the wrong unit, which would shadow every later sample of the series.
pub const DEFAULT_TIMESTAMP_MAX_FUTURE_SECONDS: f64 = 600.0;

/// `timestamp_max_age_seconds` of a target that sets none: 1 hour. Prometheus appends a
/// sample only inside its head block (at least the last hour of a 2 h block range) and
/// refuses older ones as out of bounds; an older sample would be refused downstream anyway,
/// and a timestamp in seconds read as milliseconds is in January 1970.
pub const DEFAULT_TIMESTAMP_MAX_AGE_SECONDS: f64 = 3600.0;

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
    /// The `instance` label of the target's series. Default the URL's `host:port` (the
    /// scheme's port, 80 or 443, when the URL names none), as Prometheus 2 labels a static
    /// target. Two targets may not share both `job` and `instance`. At the collector it is
    /// `exported_instance` (`instance` is the agent's host there).
    #[serde(default)]
    pub instance: Option<String>,
    /// Seconds between two scrapes. Default 15.
    #[serde(default = "default_interval")]
    pub interval_seconds: f64,
    /// Offset of the scrapes within the interval, seconds: scrapes happen at whole
    /// multiples of `interval_seconds` since the Unix epoch plus this (OVIS LDMS's
    /// `interval` + `offset`), so every agent scrapes at the same instants. 0 to below the
    /// interval. Default 0.
    #[serde(default)]
    pub offset_seconds: f64,
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
    /// Largest answer read (Prometheus's `body_size_limit`, same units: a number and `B`,
    /// `KB`, `MB`, `GB`, with `KiB`, `MiB`, `GiB` the same, 1 KB = 1024 B as in Prometheus):
    /// a larger one fails the scrape (`up` 0) as `body_too_large` without the rest being
    /// read. 1KiB to 1GiB; Prometheus's 0 (no limit) is refused, the agent holds the
    /// answer to parse it. Default `16MiB`.
    #[serde(default = "default_body_size_limit")]
    pub body_size_limit: String,
    /// Keep the timestamps the target gives its samples (Prometheus's `honor_timestamps`).
    /// Off: every sample carries the scrape's start, none is refused for its timestamp.
    /// Default true.
    #[serde(default = "default_true")]
    pub honor_timestamps: bool,
    /// Seconds a sample's own timestamp may be ahead of the scrape's start; a later one is
    /// refused and counted (`timestamp_too_new`): a wrong clock, or milliseconds where
    /// OpenMetrics wants seconds. 1 to 86400. Default 600 (clock skew).
    #[serde(default = "default_max_future")]
    pub timestamp_max_future_seconds: f64,
    /// Seconds a sample's own timestamp may be behind the scrape's start; an older one is
    /// refused and counted (`timestamp_too_old`), as Prometheus refuses samples out of its
    /// head's bounds (at least the last hour); a timestamp in seconds where the text format
    /// wants milliseconds is in 1970. 1 to 604800. Default 3600.
    #[serde(default = "default_max_age")]
    pub timestamp_max_age_seconds: f64,
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
fn default_body_size_limit() -> String {
    DEFAULT_BODY_SIZE_LIMIT.to_owned()
}
fn default_true() -> bool {
    true
}
fn default_max_future() -> f64 {
    DEFAULT_TIMESTAMP_MAX_FUTURE_SECONDS
}
fn default_max_age() -> f64 {
    DEFAULT_TIMESTAMP_MAX_AGE_SECONDS
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

    /// The `instance` label: `instance`, or the URL's `host:port` (the scheme's known port
    /// when the URL has none, as Prometheus 2's `addPort`); `None` when the URL has no host.
    pub fn effective_instance(&self) -> Option<String> {
        if let Some(i) = &self.instance {
            return Some(i.clone());
        }
        let url = reqwest::Url::parse(&self.url).ok()?;
        let host = url.host_str()?; // an IPv6 address in brackets
        Some(match url.port_or_known_default() {
            Some(port) => format!("{host}:{port}"),
            None => host.to_owned(),
        })
    }

    /// `body_size_limit` in bytes.
    ///
    /// # Errors
    /// Not a size in Prometheus's units ([`parse_size`]), 0, or over
    /// [`MAX_BODY_SIZE_LIMIT`].
    pub fn body_size_limit_bytes(&self) -> Result<u64, String> {
        let bytes = parse_size(&self.body_size_limit)?;
        if !(1024..=MAX_BODY_SIZE_LIMIT).contains(&bytes) {
            return Err(format!(
                "must be from 1KiB to 1GiB (0, Prometheus's \"no limit\", is not taken: the \
                 agent holds an answer to parse it), got {:?}",
                self.body_size_limit
            ));
        }
        Ok(bytes)
    }
}

/// Bytes of a size written as Prometheus writes `body_size_limit` (`units.Base2Bytes`): a
/// number (fractions allowed) and a unit, `B`, `KB`/`KiB`, `MB`/`MiB`, `GB`/`GiB`,
/// `TB`/`TiB`, each 1024 times the one before (`16MiB`, `1.5GB`, `512KB`); `0` alone is 0.
///
/// # Errors
/// A text without a number, an unknown unit, or a size over `u64`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    if t == "0" {
        return Ok(0);
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("{text:?} has no unit (B, KB, MB, GB, TB; KiB, MiB, ...)"))?;
    let (number, unit) = t.split_at(split);
    let n: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} does not start with a number"))?;
    let power = match unit {
        "B" => 0,
        "KB" | "KiB" => 1,
        "MB" | "MiB" => 2,
        "GB" | "GiB" => 3,
        "TB" | "TiB" => 4,
        _ => {
            return Err(format!(
                "{text:?}: unknown unit {unit:?} (B, KB, MB, GB, TB; KiB, MiB, ...)"
            ))
        }
    };
    let bytes = n * 1024f64.powi(power);
    if !bytes.is_finite() || bytes >= 2f64.powi(64) {
        return Err(format!("{text:?} is too large"));
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(bytes.round() as u64)
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
    /// An answer longer than `body_size_limit`.
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

/// Why a sample of a successful scrape was refused
/// (`uctel_agent_source_errors_total{source="scrape",reason}`, one per sample; Prometheus
/// counts the same refusals in `prometheus_target_scrapes_sample_*_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SampleRefusal {
    /// A series given again in the same answer (its first sample is kept).
    Duplicate,
    /// A timestamp more than `timestamp_max_future_seconds` after the scrape's start.
    TimestampTooNew,
    /// A timestamp more than `timestamp_max_age_seconds` before the scrape's start.
    TimestampTooOld,
}

impl SampleRefusal {
    /// Every refusal, in counting order.
    pub const ALL: [SampleRefusal; 3] = [
        SampleRefusal::Duplicate,
        SampleRefusal::TimestampTooNew,
        SampleRefusal::TimestampTooOld,
    ];

    /// The `reason` label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            SampleRefusal::Duplicate => "duplicate",
            SampleRefusal::TimestampTooNew => "timestamp_too_new",
            SampleRefusal::TimestampTooOld => "timestamp_too_old",
        }
    }

    const fn index(self) -> usize {
        match self {
            SampleRefusal::Duplicate => 0,
            SampleRefusal::TimestampTooNew => 1,
            SampleRefusal::TimestampTooOld => 2,
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
    if t.instance.as_deref().is_some_and(str::is_empty) {
        out.push(("instance", "must not be empty".to_owned()));
    }
    if let Err(e) = t.body_size_limit_bytes() {
        out.push(("body_size_limit", e));
    }
    if let Some(e) = crate::pacing::grid::offset_problem(t.offset_seconds, t.interval_seconds) {
        out.push(("offset_seconds", e));
    }
    for (key, v, max) in [
        (
            "timestamp_max_future_seconds",
            t.timestamp_max_future_seconds,
            86400.0,
        ),
        (
            "timestamp_max_age_seconds",
            t.timestamp_max_age_seconds,
            604_800.0,
        ),
    ] {
        if !(v.is_finite() && (1.0..=max).contains(&v)) {
            out.push((
                key,
                format!("must be a number of seconds in [1, {max}], got {v}"),
            ));
        }
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
            out.push(("labels", format!("{name:?} is not a label name a target may add (agent is the collector's; set instance with the instance key)")));
        }
    }
    out
}

/// `(job, instance)` pairs given to more than one of `targets`, each once, in the order
/// they first repeat: two such targets would ship the same series (Prometheus refuses a
/// target given twice in one job the same way, by its labels).
pub fn shared_identities(targets: &[ScrapeTarget]) -> Vec<(usize, String)> {
    let mut seen = std::collections::HashMap::new();
    let mut out = Vec::new();
    for (i, t) in targets.iter().enumerate() {
        let Some(instance) = t.effective_instance() else {
            continue;
        };
        if let Some(first) = seen.insert((t.job.clone(), instance.clone()), i) {
            out.push((
                i,
                format!(
                    "job {:?} and instance {instance:?} are those of sources.scrape[{first}] too; \
                     give one of them another job or instance",
                    t.job
                ),
            ));
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
    /// `job`, `instance` and `labels`.
    labels: Vec<Label>,
    body_limit: usize,
}

/// One scrape's records (the target's samples, then the health series), its failure and the
/// samples it refused.
#[derive(Debug, Default)]
pub struct Scraped {
    /// What to ship.
    pub metrics: Vec<Metric>,
    /// Why it failed, with the detail; `None` when `up` is 1.
    pub error: Option<(ScrapeError, String)>,
    /// Samples refused, per [`SampleRefusal`] (in [`SampleRefusal::ALL`] order); all 0 when
    /// the scrape failed.
    pub refused: [u64; 3],
}

impl Scraped {
    /// The refusals with their counts, those above 0.
    pub fn refusals(&self) -> impl Iterator<Item = (SampleRefusal, u64)> + '_ {
        SampleRefusal::ALL
            .into_iter()
            .map(|r| (r, self.refused[r.index()]))
            .filter(|(_, n)| *n > 0)
    }
}

/// The samples of a parsed answer that are shipped, with what was counted on the way.
#[derive(Debug, Default)]
struct Taken {
    kept: Vec<Metric>,
    /// Samples in the answer.
    scraped: usize,
    /// Samples left after `metric_relabel` (shipped + refused).
    post_relabel: usize,
    refused: [u64; 3],
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
        let body_limit = usize::try_from(config.body_size_limit_bytes()?).unwrap_or(usize::MAX);
        let instance = config
            .effective_instance()
            .ok_or_else(|| format!("no host in {:?}", config.url))?;
        let labels = [
            ("job", config.job.as_str()),
            ("instance", instance.as_str()),
        ]
        .into_iter()
        .chain(config.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .map(|(n, v)| Label {
            name: n.to_owned(),
            value: v.to_owned(),
        })
        .collect();
        Ok(Target {
            config,
            keep,
            drop,
            client,
            labels,
            body_limit,
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
        let (taken, error) = match body {
            Err(_) => (
                Taken::default(),
                Some((
                    ScrapeError::Timeout,
                    format!("no answer within {timeout:?}"),
                )),
            ),
            Ok(Err(e)) => (Taken::default(), Some(e)),
            Ok(Ok(text)) => match off_the_workers(|| self.samples(&text, start_ms)) {
                Ok(taken) => (taken, None),
                Err((e, scraped)) => (
                    Taken {
                        scraped,
                        ..Taken::default()
                    },
                    Some(e),
                ),
            },
        };
        let Taken {
            kept: mut metrics,
            scraped,
            post_relabel,
            refused,
        } = taken;
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
                if error.is_none() {
                    post_relabel as f64
                } else {
                    0.0
                },
            ),
        ] {
            m.labels.clone_from(&self.labels);
            metrics.push(m);
        }
        Scraped {
            metrics,
            error,
            refused,
        }
    }

    async fn fetch(&self) -> Result<String, (ScrapeError, String)> {
        let down = |e: reqwest::Error| (ScrapeError::Down, e.to_string());
        let limit = self.body_limit;
        let too_large = |what: String| {
            (
                ScrapeError::BodyTooLarge,
                format!("{what}, over body_size_limit ({limit} bytes)"),
            )
        };
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
        let announced = resp.content_length();
        if let Some(n) = announced.filter(|&n| n > limit as u64) {
            return Err(too_large(format!("Content-Length {n} bytes")));
        }
        // The buffer grows by doubling but never past the limit (nor past a Content-Length).
        let cap = announced.map_or(64 << 10, |n| usize::try_from(n).unwrap_or(limit));
        let mut body: Vec<u8> = Vec::with_capacity(cap.min(limit));
        while let Some(chunk) = resp.chunk().await.map_err(down)? {
            let need = body.len() + chunk.len();
            if need > limit {
                return Err(too_large(format!("more than {} bytes", body.len())));
            }
            if need > body.capacity() {
                let grown = (body.capacity() * 2).max(need).min(limit);
                body.reserve_exact(grown - body.len());
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

    /// Whether `metric_relabel` keeps records named `name`.
    fn relabel_keeps(&self, name: &str) -> bool {
        self.keep.as_ref().is_none_or(|r| r.is_match(name))
            && !self.drop.as_ref().is_some_and(|r| r.is_match(name))
    }

    /// The target's records after `metric_relabel` and the refusals, with target labels and
    /// timestamps, and the counts; or the failure and the samples scraped.
    fn samples(&self, text: &str, start_ms: i64) -> Result<Taken, ((ScrapeError, String), usize)> {
        let parsed = exposition::parse_first(text, &|_| String::new(), Timestamps::Keep)
            .map_err(|e| ((ScrapeError::ParseError, e.to_string()), 0))?;
        let mut refused = [0u64; 3];
        for name in &parsed.duplicates {
            if self.relabel_keeps(name) {
                refused[SampleRefusal::Duplicate.index()] += 1;
            }
        }
        let scraped =
            parsed.metrics.iter().map(sample_count).sum::<usize>() + parsed.duplicates.len();
        let ours = &self.labels;
        let ms = |s: f64| {
            #[allow(clippy::cast_possible_truncation)]
            let v = (s * 1000.0) as i64;
            v
        };
        let newest = start_ms.saturating_add(ms(self.config.timestamp_max_future_seconds));
        let oldest = start_ms.saturating_sub(ms(self.config.timestamp_max_age_seconds));
        let mut kept = Vec::with_capacity(parsed.metrics.len());
        for mut m in parsed.metrics {
            if !self.relabel_keeps(&m.name) {
                continue;
            }
            if m.timestamp_ms == 0 || !self.config.honor_timestamps {
                m.timestamp_ms = start_ms;
            } else if m.timestamp_ms > newest || m.timestamp_ms < oldest {
                let why = if m.timestamp_ms > newest {
                    SampleRefusal::TimestampTooNew
                } else {
                    SampleRefusal::TimestampTooOld
                };
                refused[why.index()] += sample_count(&m) as u64;
                continue;
            }
            for l in &mut m.labels {
                if !self.config.honor_labels && ours.iter().any(|o| o.name == l.name) {
                    l.name = format!("exported_{}", l.name);
                }
            }
            for o in ours {
                if !m.labels.iter().any(|l| l.name == o.name) {
                    m.labels.push(o.clone());
                }
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
        let refused_total = usize::try_from(refused.iter().sum::<u64>()).unwrap_or(usize::MAX);
        Ok(Taken {
            kept,
            scraped,
            post_relabel: n.saturating_add(refused_total),
            refused,
        })
    }
}

/// Runs CPU-bound `f` (parsing an answer of up to `body_size_limit`) without holding an
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
        let taken = t.samples(TEXT, 42).unwrap();
        let (ms, scraped) = (taken.kept, taken.scraped);
        assert_eq!(scraped, 1 + 1 + 4 + 1);
        let a = ms.iter().find(|m| m.name == "a_total").unwrap();
        assert_eq!(
            labels(a),
            [
                ("exported_job", "theirs"),
                ("instance", "127.0.0.1:1"),
                ("job", "node"),
                ("team", "a"),
                ("x", "1")
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
        assert_eq!(a.timestamp_ms, 42, "the scrape's time");
        let b = ms.iter().find(|m| m.name == "b");
        assert!(b.is_none(), "a 2023 timestamp is too old at 42 ms: {b:?}");
        let honoured = target("url: http://127.0.0.1:1/metrics\njob: node\nhonor_labels: true\n");
        let ms = honoured.samples(TEXT, 42).unwrap().kept;
        let a = ms.iter().find(|m| m.name == "a_total").unwrap();
        assert_eq!(
            labels(a),
            [("instance", "127.0.0.1:1"), ("job", "theirs"), ("x", "1")]
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
    }

    #[test]
    fn keep_drop_and_sample_limit_as_prometheus() {
        let t = target(
            "url: http://127.0.0.1:1/m\nmetric_relabel: {keep: '[ah].*|go_.*', drop: 'go_.*'}\n",
        );
        let ms = t.samples(TEXT, 1).unwrap().kept;
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
            "url: ftp://x/m\njob: ''\ninstance: ''\ninterval_seconds: 5\ntimeout_seconds: 6\nmetric_relabel: {keep: '('}\nlabels: {instance: x, '0a': y}\nbody_size_limit: 0\ntimestamp_max_future_seconds: 0\ntimestamp_max_age_seconds: .nan\n",
        )
        .unwrap();
        let keys: Vec<_> = problems(&c).into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            keys,
            [
                "url",
                "job",
                "instance",
                "body_size_limit",
                "timestamp_max_future_seconds",
                "timestamp_max_age_seconds",
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

    #[test]
    fn sizes_are_read_in_prometheus_units() {
        for (text, bytes) in [
            ("0", 0),
            ("512B", 512),
            ("1KB", 1024),
            ("1KiB", 1024),
            ("16MiB", 16 << 20),
            ("10MB", 10 << 20),
            ("1.5GB", 3 << 29),
            ("1TiB", 1 << 40),
        ] {
            assert_eq!(parse_size(text), Ok(bytes), "{text}");
        }
        for bad in [
            "",
            "16",
            "MiB",
            "16 MiB",
            "16mb",
            "1e3B",
            "-1B",
            "1.2.3KB",
            "99999999999TB",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
        let with = |limit: &str| {
            serde_yaml::from_str::<ScrapeTarget>(&format!(
                "url: http://127.0.0.1:1/m\nbody_size_limit: '{limit}'\n"
            ))
            .unwrap()
            .body_size_limit_bytes()
        };
        assert_eq!(with("16MiB"), Ok(16 << 20));
        assert!(with("0").is_err(), "no limit is refused");
        assert!(with("2GiB").is_err());
        let default: ScrapeTarget = serde_yaml::from_str("url: http://127.0.0.1:1/m\n").unwrap();
        assert_eq!(default.body_size_limit_bytes(), Ok(16 << 20));
    }

    #[test]
    fn instance_defaults_to_the_urls_host_and_port() {
        let t = |yaml: &str| serde_yaml::from_str::<ScrapeTarget>(yaml).unwrap();
        for (url, want) in [
            ("http://127.0.0.1:9100/metrics", "127.0.0.1:9100"),
            ("http://node.example/metrics", "node.example:80"),
            ("https://node.example/metrics", "node.example:443"),
            ("http://[::1]:9400/metrics", "[::1]:9400"),
        ] {
            assert_eq!(
                t(&format!("url: {url}\n")).effective_instance().as_deref(),
                Some(want)
            );
        }
        assert_eq!(
            t("url: http://127.0.0.1:9100/m\ninstance: gpu0\n")
                .effective_instance()
                .as_deref(),
            Some("gpu0")
        );
        let targets = [
            t("url: http://127.0.0.1:9100/metrics\n"),
            t("url: http://127.0.0.1:9400/metrics\n"),
            t("url: http://127.0.0.1:9100/other\njob: other\n"),
            t("url: http://127.0.0.1:9100/federate\n"),
            t("url: http://127.0.0.1:9100/x\ninstance: x\n"),
        ];
        let shared: Vec<usize> = shared_identities(&targets)
            .into_iter()
            .map(|(i, _)| i)
            .collect();
        assert_eq!(shared, [3], "same job and host:port as the first");
    }

    fn stamped(t: &Target, text: &str, now: i64) -> (Vec<(String, i64)>, [u64; 3], usize) {
        let taken = t.samples(text, now).unwrap();
        let ms = taken
            .kept
            .iter()
            .map(|m| (m.name.clone(), m.timestamp_ms))
            .collect();
        (ms, taken.refused, taken.post_relabel)
    }

    #[test]
    fn timestamps_out_of_bounds_are_refused_and_counted_unless_not_honoured() {
        let now: i64 = 1_800_000_000_000;
        let text = format!(
            "ok 1 {}\nfresh 1\nfuture 1 {}\npast 1 {}\nseconds 1 {}\n\
             # TYPE h histogram\nh_bucket{{le=\"1\"}} 1 {f}\nh_bucket{{le=\"+Inf\"}} 1 {f}\n\
             h_sum 1 {f}\nh_count 1 {f}\n",
            now - 60_000,
            now + 3_600_000,
            now - 3_600_001,
            now / 1000,
            f = now + 601_000,
        );
        let t = target("url: http://127.0.0.1:1/m\n");
        let (kept, refused, post) = stamped(&t, &text, now);
        assert_eq!(
            kept,
            [("ok".to_owned(), now - 60_000), ("fresh".to_owned(), now)]
        );
        // future + the histogram's four samples; past + seconds.
        assert_eq!(refused, [0, 5, 2]);
        assert_eq!(post, 9, "shipped and refused");
        let wide = target(
            "url: http://127.0.0.1:1/m\ntimestamp_max_future_seconds: 7200\ntimestamp_max_age_seconds: 7200\n",
        );
        let (kept, refused, _) = stamped(&wide, &text, now);
        assert_eq!(kept.len(), 5, "{kept:?}");
        assert_eq!(refused, [0, 0, 1], "only the seconds");
        let off = target("url: http://127.0.0.1:1/m\nhonor_timestamps: false\n");
        let (kept, refused, _) = stamped(&off, &text, now);
        assert_eq!(refused, [0, 0, 0]);
        assert_eq!(kept.len(), 6);
        assert!(kept.iter().all(|(_, ts)| *ts == now), "{kept:?}");
    }

    #[test]
    fn duplicates_keep_the_first_value_and_are_counted_after_relabeling() {
        let t = target("url: http://127.0.0.1:1/m\nmetric_relabel: {drop: 'gone'}\n");
        let taken = t
            .samples("a{x=\"1\"} 1\na{x=\"1\"} 2\ngone 1\ngone 2\nb 3\n", 5)
            .unwrap();
        let values: Vec<(&str, f64)> = taken
            .kept
            .iter()
            .map(|m| (m.name.as_str(), m.value))
            .collect();
        assert_eq!(values, [("a", 1.0), ("b", 3.0)]);
        assert_eq!(
            taken.refused,
            [1, 0, 0],
            "the dropped series' repeat is not counted"
        );
        assert_eq!((taken.scraped, taken.post_relabel), (5, 3));
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

    /// A target answering `body` (with a `Content-Length` when `announce`), once per
    /// connection; the bytes it managed to write come back on the channel.
    async fn answering(
        body: Vec<u8>,
        announce: bool,
    ) -> (String, tokio::sync::mpsc::UnboundedReceiver<usize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let head = if announce {
                    format!("HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", body.len())
                } else {
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nconnection: close\r\n\r\n"
                        .to_owned()
                };
                let _ = s.write_all(head.as_bytes()).await;
                let mut sent = 0;
                for chunk in body.chunks(64 << 10) {
                    if s.write_all(chunk).await.is_err() {
                        break;
                    }
                    sent += chunk.len();
                }
                let _ = tx.send(sent);
            }
        });
        (format!("http://{addr}/metrics"), rx)
    }

    #[tokio::test]
    async fn an_answer_over_body_size_limit_fails_without_the_rest_read() {
        const LINE: &[u8] = b"some_metric_with_a_long_name{label=\"value\"} 1\n";
        let mut body = Vec::new();
        while body.len() < 8 << 20 {
            body.extend_from_slice(LINE);
        }
        // Four times that: more than a loopback connection's socket buffers hold.
        let big = body.repeat(4);
        for announce in [true, false] {
            let (url, mut sent) = answering(big.clone(), announce).await;
            let t = target(&format!(
                "url: {url}\nbody_size_limit: 1MiB\ninterval_seconds: 5\ntimeout_seconds: 4\n"
            ));
            let s = t.scrape().await;
            let (e, detail) = s.error.clone().unwrap();
            assert_eq!(e, ScrapeError::BodyTooLarge, "{detail}");
            assert!(detail.contains("1048576 bytes"), "{detail}");
            let up = s.metrics.iter().find(|m| m.name == "up").unwrap();
            assert_eq!(up.value, 0.0);
            assert_eq!(s.metrics.len(), 4);
            drop(t);
            let written = sent.recv().await.unwrap();
            assert!(
                written < big.len(),
                "the target wrote all {written} bytes ({announce})"
            );
            // Under the limit the same answer is taken.
            let (url, _sent) = answering(body.clone(), announce).await;
            let fits = target(&format!(
                "url: {url}\nbody_size_limit: 9MiB\ninterval_seconds: 5\ntimeout_seconds: 4\n"
            ));
            let s = fits.scrape().await;
            assert_eq!(s.error, None);
            assert_eq!(
                s.refused,
                [(body.len() / LINE.len() - 1) as u64, 0, 0],
                "one series, repeated"
            );
        }
    }
}
