//! What the HTTP outputs share: the client (reqwest on rustls), authentication from files,
//! retry delays with exponential backoff and full jitter, and `Retry-After`.

use std::path::Path;
use std::time::Duration;

use rand::Rng;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION, USER_AGENT};

use super::config::{BasicAuthConfig, TlsConfig};

/// `User-Agent` of every request: `uctel-collector/<version>`.
pub const USER_AGENT_VALUE: &str = concat!("uctel-collector/", env!("CARGO_PKG_VERSION"));

/// Why an HTTP output could not be set up (at start: the configuration check catches what
/// it can earlier).
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// A secret or CA file could not be read.
    #[error("{key}: cannot read {path}: {source}")]
    File {
        /// The configuration key.
        key: String,
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// A value is not usable in a header, a CA file is not PEM, or the client failed.
    #[error("{key}: {message}")]
    Invalid {
        /// The configuration key.
        key: String,
        /// What is wrong.
        message: String,
    },
}

/// Reads a secret file (a token, a password): its content without the trailing newline.
///
/// # Errors
/// [`SetupError::File`].
pub fn read_secret(key: &str, path: &Path) -> Result<String, SetupError> {
    std::fs::read_to_string(path)
        .map(|s| s.trim_end_matches(['\n', '\r']).to_owned())
        .map_err(|source| SetupError::File {
            key: key.to_owned(),
            path: path.display().to_string(),
            source,
        })
}

/// The `Authorization` header value for basic auth or a bearer token, if either is set.
///
/// # Errors
/// [`SetupError`] when a file cannot be read or holds bytes not allowed in a header.
pub fn authorization(
    prefix: &str,
    basic: Option<&BasicAuthConfig>,
    bearer_file: Option<&Path>,
) -> Result<Option<HeaderValue>, SetupError> {
    use base64::Engine as _;
    let encode = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let value = if let Some(b) = basic {
        let key = format!("{prefix}.basic_auth.password_file");
        let password = read_secret(&key, &b.password_file)?;
        Some(format!(
            "Basic {}",
            encode(format!("{}:{password}", b.username).as_bytes())
        ))
    } else if let Some(f) = bearer_file {
        let key = format!("{prefix}.bearer_token_file");
        Some(format!("Bearer {}", read_secret(&key, f)?))
    } else {
        None
    };
    value
        .map(|v| {
            let mut h = HeaderValue::from_str(&v).map_err(|_| SetupError::Invalid {
                key: prefix.to_owned(),
                message: "the credentials hold bytes not allowed in an HTTP header".into(),
            })?;
            h.set_sensitive(true);
            Ok(h)
        })
        .transpose()
}

/// Builds the client of one output: rustls with the system roots (plus `tls.ca_file`),
/// `timeout` per request, `User-Agent` and `headers` on every request.
///
/// # Errors
/// [`SetupError`] for an unreadable or invalid CA file, or a client that cannot be built.
pub fn client(
    prefix: &str,
    timeout: Duration,
    tls: &TlsConfig,
    mut headers: HeaderMap,
) -> Result<reqwest::Client, SetupError> {
    headers.insert(USER_AGENT, HeaderValue::from_static(USER_AGENT_VALUE));
    let mut builder = reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout.min(Duration::from_secs(10)))
        .pool_max_idle_per_host(64)
        .default_headers(headers);
    if let Some(ca) = &tls.ca_file {
        let key = format!("{prefix}.tls.ca_file");
        let pem = std::fs::read(ca).map_err(|source| SetupError::File {
            key: key.clone(),
            path: ca.display().to_string(),
            source,
        })?;
        let certs =
            reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| SetupError::Invalid {
                key: key.clone(),
                message: format!("{} is not a PEM certificate bundle: {e}", ca.display()),
            })?;
        if certs.is_empty() {
            return Err(SetupError::Invalid {
                key,
                message: format!("{} holds no PEM certificate", ca.display()),
            });
        }
        for c in certs {
            builder = builder.add_root_certificate(c);
        }
    }
    if tls.insecure_skip_verify {
        builder = builder.danger_accept_invalid_certs(true);
    }
    builder.build().map_err(|e| SetupError::Invalid {
        key: prefix.to_owned(),
        message: format!("cannot build the HTTP client: {e}"),
    })
}

/// Headers from the configuration (names and values checked by the configuration check;
/// anything invalid that slipped through is an error here).
///
/// # Errors
/// [`SetupError::Invalid`] naming the header.
pub fn header_map<'a>(
    prefix: &str,
    pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<HeaderMap, SetupError> {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        let invalid = || SetupError::Invalid {
            key: format!("{prefix}.headers.{name}"),
            message: "is not a valid HTTP header".into(),
        };
        let n = HeaderName::from_bytes(name.as_bytes()).map_err(|_| invalid())?;
        let v = HeaderValue::from_str(value).map_err(|_| invalid())?;
        map.insert(n, v);
    }
    Ok(map)
}

/// Adds `authorization` (if any) to `map`.
pub fn with_authorization(mut map: HeaderMap, authorization: Option<HeaderValue>) -> HeaderMap {
    if let Some(a) = authorization {
        map.insert(AUTHORIZATION, a);
    }
    map
}

/// `url` without user and password, for labels and logs.
pub fn redact(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut u) => {
            if !u.username().is_empty() || u.password().is_some() {
                let _ = u.set_username("");
                let _ = u.set_password(None);
            }
            u.to_string()
        }
        Err(_) => url.to_owned(),
    }
}

/// Exponential backoff with full jitter (the AWS Architecture Blog's "Exponential Backoff
/// and Jitter", as Prometheus' remote-write queue and gRPC clients do): the bound starts at
/// `min` and doubles after each failure up to `max`; each delay is drawn uniformly from
/// `0..=bound`, so many senders that failed together do not retry together.
#[derive(Clone, Debug)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    bound: Duration,
}

impl Backoff {
    /// A backoff between `min` and `max` (`max` below `min` is raised to `min`).
    pub fn new(min: Duration, max: Duration) -> Backoff {
        Backoff {
            min,
            max: max.max(min),
            bound: min,
        }
    }

    /// The delay before the next retry, and the bound doubled for the one after.
    /// `retry_after` (a server's `Retry-After`) replaces the random draw, cut to `max`.
    pub fn next_delay(&mut self, retry_after: Option<Duration>) -> Duration {
        let delay = match retry_after {
            Some(d) => d.min(self.max),
            None => {
                let bound = self.bound.as_nanos().min(u128::from(u64::MAX)) as u64;
                Duration::from_nanos(rand::thread_rng().gen_range(0..=bound))
            }
        };
        self.bound = self.bound.saturating_mul(2).min(self.max);
        delay
    }

    /// Starts again from `min` (after a success).
    pub fn reset(&mut self) {
        self.bound = self.min;
    }

    /// The current bound (for tests and logs).
    pub fn bound(&self) -> Duration {
        self.bound
    }
}

/// `Retry-After` of a response (RFC 9110 §10.2.3): delay-seconds, or an HTTP-date taken
/// relative to `now`. `None` when absent or unreadable.
pub fn retry_after(headers: &HeaderMap, now: std::time::SystemTime) -> Option<Duration> {
    let v = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = chrono::DateTime::parse_from_rfc2822(v).ok()?;
    let at = std::time::SystemTime::UNIX_EPOCH
        + Duration::from_secs(u64::try_from(at.timestamp()).ok()?);
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The first line of a server's answer, at most `max_chars` characters (for logs).
pub fn snippet(text: &str, max_chars: usize) -> &str {
    let line = text.lines().next().unwrap_or("").trim();
    match line.char_indices().nth(max_chars) {
        Some((i, _)) => &line[..i],
        None => line,
    }
}

/// A transport error with its causes, `: `-separated (for logs).
pub fn describe(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(c) = source {
        s.push_str(": ");
        s.push_str(&c.to_string());
        source = c.source();
    }
    s
}

/// At most one log line per kind of failure per [`LogLimiter::EVERY`] (a sender's retries
/// and rejections; the counters count every event).
#[derive(Debug, Default)]
pub struct LogLimiter {
    last: std::collections::HashMap<&'static str, std::time::Instant>,
}

impl LogLimiter {
    /// The period.
    pub const EVERY: Duration = Duration::from_secs(10);

    /// True when a line of `kind` may be logged now (and remembers it).
    pub fn due(&mut self, kind: &'static str) -> bool {
        let now = std::time::Instant::now();
        match self.last.get(kind) {
            Some(t) if now.duration_since(*t) < Self::EVERY => false,
            _ => {
                self.last.insert(kind, now);
                true
            }
        }
    }
}

/// The parts to send again of the items `range` of a batch (rows of an `INSERT`, samples of
/// a remote-write request), refused as a whole for one of them: the items before the named
/// item (1-based within `range`), the named item alone, the items after it; without a
/// usable name, two halves. Empty parts are left out; each part is
/// shorter than `range` (so splitting ends), in the order to send them.
pub fn split(range: std::ops::Range<usize>, named: Option<usize>) -> Vec<std::ops::Range<usize>> {
    let len = range.end.saturating_sub(range.start);
    if len < 2 {
        return std::iter::once(range).collect();
    }
    let parts = match named.filter(|n| (1..=len).contains(n)) {
        Some(n) => {
            let at = range.start + n - 1;
            vec![range.start..at, at..at + 1, at + 1..range.end]
        }
        None => {
            let mid = range.start + len / 2;
            vec![range.start..mid, mid..range.end]
        }
    };
    parts.into_iter().filter(|r| !r.is_empty()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_bound_doubles_to_max_and_delays_stay_below_it() {
        let mut b = Backoff::new(Duration::from_millis(30), Duration::from_millis(200));
        let mut bounds = Vec::new();
        for _ in 0..6 {
            let bound = b.bound();
            let d = b.next_delay(None);
            assert!(d <= bound, "{d:?} > {bound:?}");
            bounds.push(bound.as_millis());
        }
        assert_eq!(bounds, [30, 60, 120, 200, 200, 200]);
        b.reset();
        assert_eq!(b.bound(), Duration::from_millis(30));
        // Retry-After replaces the draw, cut to max.
        assert_eq!(
            b.next_delay(Some(Duration::from_secs(9))),
            Duration::from_millis(200)
        );
        assert_eq!(
            b.next_delay(Some(Duration::from_millis(7))),
            Duration::from_millis(7)
        );
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_445_412_480); // Wed, 21 Oct 2015 07:28:00 GMT
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h, now), None);
        h.insert(
            reqwest::header::RETRY_AFTER,
            HeaderValue::from_static("120"),
        );
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(120)));
        h.insert(
            reqwest::header::RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:30 GMT"),
        );
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(30)));
        h.insert(
            reqwest::header::RETRY_AFTER,
            HeaderValue::from_static("soon"),
        );
        assert_eq!(retry_after(&h, now), None);
    }

    #[test]
    fn redact_removes_credentials_only() {
        assert_eq!(
            redact("https://u:p@mimir.example:443/api/v1/push"),
            "https://mimir.example/api/v1/push"
        );
        assert_eq!(
            redact("http://127.0.0.1:9090/api/v1/write"),
            "http://127.0.0.1:9090/api/v1/write"
        );
    }
}
