//! One signal's sender task: waits for a full request or the batch deadline, sends it, and
//! retries what may succeed later, by the OTLP/HTTP rules (OpenTelemetry protocol
//! specification, "OTLP/HTTP Response", "Failures", "Throttling"):
//!
//! * 2xx: accepted. Its body, an `Export{Metrics,Logs}ServiceResponse`, may carry a
//!   **partial success**: `rejected_data_points` / `rejected_log_records` items of the
//!   request were refused (the answer does not say which): that many are counted dropped
//!   (`partial_success`), the rest sent, and the receiver's `error_message` is logged the
//!   first time it is seen (later ones with the same message only counted). A message with
//!   0 rejected is a warning: logged the same way, every item sent.
//! * 429, 502, 503, 504: the same request again after a delay (exponential backoff with
//!   full jitter; `Retry-After`, seconds or an HTTP date, honoured and cut to the largest
//!   backoff). Nothing else of the signal is sent meanwhile; new items wait in its bounded
//!   queue. Transport errors (connect, reset, timeout) are retried the same way.
//! * Any other status (400, 401, 403, 404, 413, 500, …): the spec says not to retry; the
//!   request's items are dropped (`rejected`) and the answer logged (at most once per
//!   10 s).
//!
//! A request that timed out or whose connection broke after it was sent may have been
//! applied: OTLP has no way to ask, so it is sent again and may arrive twice (at least
//! once, as every OTLP exporter does). At shutdown the sender has a grace period to send
//! what is queued; a request still failing then, and items not sent, are dropped
//! (`shutdown`).

use std::collections::HashSet;
use std::io::Read as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use prost::Message as _;
use reqwest::header::{HeaderValue, CONTENT_ENCODING, CONTENT_TYPE};
use uctel_common::shutdown::Shutdown;

use super::encode::{Point, Record, Shape};
use super::metrics::Dropped;
use super::proto;
use super::queue::Queue;
use crate::outputs::http;
use crate::outputs::sender::{self, Answer, Event, Refused, Settle, Sink, Timing};

/// Distinct partial-success messages remembered (logged once each); past it, a new message
/// is logged at most every 10 s.
const MESSAGES_KEPT: usize = 64;

/// An item of one signal: how a request of them is built and its answer read.
pub(crate) trait SignalItem: Send + Sync + Sized + 'static {
    /// `metrics` or `logs` (the `signal` label, the URL's last segment).
    const SIGNAL: &'static str;
    /// What the items are, in log lines.
    const ITEMS: &'static str;

    /// The (compressed) body of an export request of `part`.
    fn encode(shape: &Shape, part: &[Self]) -> Result<Vec<u8>, String>;

    /// The partial success of an answer body: items rejected and the message.
    fn partial(body: &[u8]) -> Option<(i64, String)>;
}

impl SignalItem for Point {
    const SIGNAL: &'static str = "metrics";
    const ITEMS: &'static str = "data points";

    fn encode(shape: &Shape, part: &[Point]) -> Result<Vec<u8>, String> {
        shape.metrics(part)
    }

    fn partial(body: &[u8]) -> Option<(i64, String)> {
        let r = proto::ExportMetricsServiceResponse::decode(body).ok()?;
        r.partial_success
            .map(|p| (p.rejected_data_points, p.error_message))
    }
}

impl SignalItem for Record {
    const SIGNAL: &'static str = "logs";
    const ITEMS: &'static str = "log records";

    fn encode(shape: &Shape, part: &[Record]) -> Result<Vec<u8>, String> {
        shape.logs(part)
    }

    fn partial(body: &[u8]) -> Option<(i64, String)> {
        let r = proto::ExportLogsServiceResponse::decode(body).ok()?;
        r.partial_success
            .map(|p| (p.rejected_log_records, p.error_message))
    }
}

/// Where and how one signal's requests go.
#[derive(Debug)]
pub(crate) struct Target {
    pub(crate) client: reqwest::Client,
    /// `<endpoint>/v1/<signal>`.
    pub(crate) url: reqwest::Url,
    /// The URL without credentials, for logs.
    pub(crate) label: String,
    pub(crate) shape: Shape,
    pub(crate) deadline: Duration,
    pub(crate) backoff: (Duration, Duration),
    pub(crate) grace: Duration,
    /// Set when a reload removed or changed the endpoint (`crate::outputs::handover`): what
    /// the grace period leaves is settled `reload` instead of `shutdown`.
    pub(crate) retired: std::sync::atomic::AtomicBool,
}

impl Target {
    /// Why what the grace period leaves is given up: `reload` (a reload retired the
    /// endpoint) or `shutdown`.
    pub(crate) fn end_reason(&self) -> Dropped {
        if self.retired.load(std::sync::atomic::Ordering::Acquire) {
            Dropped::Reload
        } else {
            Dropped::Shutdown
        }
    }
}

/// What an answer means (module docs).
pub(crate) fn classify(
    status: u16,
    headers: &reqwest::header::HeaderMap,
    body: &[u8],
    partial: fn(&[u8]) -> Option<(i64, String)>,
) -> Answer {
    match status {
        200..=299 => match partial(body) {
            Some((rejected, why)) if rejected > 0 => Answer::Partial {
                rejected: usize::try_from(rejected).unwrap_or(usize::MAX),
                why,
            },
            Some((_, why)) if !why.is_empty() => Answer::Partial { rejected: 0, why },
            _ => Answer::Sent,
        },
        429 | 502 | 503 | 504 => Answer::Retry(
            http::retry_after(headers, SystemTime::now()),
            format!(
                "HTTP {status}: {}",
                http::snippet(&String::from_utf8_lossy(body), 200)
            ),
        ),
        _ => Answer::Refused(Refused {
            by_item: false,
            named: None,
            fatal: matches!(status, 401 | 403 | 404),
            why: format!(
                "HTTP {status}: {}",
                http::snippet(&String::from_utf8_lossy(body), 200)
            ),
        }),
    }
}

/// A response body, gunzipped when the receiver compressed it.
fn decoded(headers: &reqwest::header::HeaderMap, body: &[u8]) -> Vec<u8> {
    let gzip = headers
        .get(CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("gzip"));
    if !gzip {
        return body.to_vec();
    }
    let mut out = Vec::new();
    match flate2::read::GzDecoder::new(body)
        .take(64 << 20)
        .read_to_end(&mut out)
    {
        Ok(_) => out,
        Err(_) => body.to_vec(),
    }
}

/// Sends `body` once to `target` and classifies the answer.
async fn send<T: SignalItem>(target: &Target, body: Vec<u8>) -> Answer {
    let mut req = target.client.post(target.url.clone()).header(
        CONTENT_TYPE,
        HeaderValue::from_static("application/x-protobuf"),
    );
    if target.shape.gzip {
        req = req.header(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    let resp = match req.body(body).send().await {
        Ok(r) => r,
        Err(e) => return Answer::Retry(None, http::describe(&e)),
    };
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = match resp.bytes().await {
        Ok(b) => decoded(&headers, &b),
        // The status came: a 2xx whose body broke off is accepted all the same.
        Err(e) if (200..300).contains(&status) => {
            tracing::debug!(error = %http::describe(&e), "OTLP answer body not read");
            Vec::new()
        }
        Err(e) => return Answer::Retry(None, http::describe(&e)),
    };
    classify(status, &headers, &body, T::partial)
}

/// Runs the sender of one signal until `shutdown` and its grace period.
pub(crate) async fn run<T: SignalItem>(
    target: Arc<Target>,
    queue: Arc<Queue<T>>,
    shutdown: Shutdown,
) {
    let sink = OtlpSink {
        target,
        queue,
        log: http::LogLimiter::default(),
        messages: Mutex::default(),
    };
    sender::run(sink, shutdown).await;
}

/// One signal of the OTLP output as a [`Sink`].
pub(crate) struct OtlpSink<T> {
    pub(crate) target: Arc<Target>,
    pub(crate) queue: Arc<Queue<T>>,
    log: http::LogLimiter,
    /// Partial-success messages already logged.
    messages: Mutex<HashSet<String>>,
}

impl<T: SignalItem> Sink for OtlpSink<T> {
    type Item = T;
    type Request = Vec<u8>;

    fn timing(&self) -> Timing {
        Timing {
            backoff: self.target.backoff,
            grace: self.target.grace,
        }
    }

    fn wake(&self) -> &tokio::sync::Notify {
        &self.queue.wake
    }

    fn due(&self, now: Instant, flush: bool) -> Result<Vec<T>, Option<Instant>> {
        self.queue.due(now, self.target.deadline, flush)
    }

    fn encode(&mut self, part: &[T]) -> Result<Vec<u8>, String> {
        T::encode(&self.target.shape, part)
    }

    async fn send(&self, body: &Vec<u8>) -> Answer {
        send::<T>(&self.target, body.clone()).await
    }

    fn settle(&self, part: &[T], how: Settle<'_>) {
        match how {
            Settle::Sent => self.queue.settle_sent(part.len()),
            Settle::Rejected(why) => {
                self.queue
                    .settle_dropped(part.len(), Dropped::Rejected, why);
            }
            Settle::Shutdown(why) => {
                self.queue
                    .settle_dropped(part.len(), self.target.end_reason(), why);
            }
        }
    }

    fn settle_partly(&self, part: &[T], rejected: usize, why: &str) {
        let rejected = rejected.min(part.len());
        self.queue
            .settle_split(part.len() - rejected, rejected, Dropped::PartialSuccess);
        let first = {
            let mut seen = self
                .messages
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if seen.contains(why) {
                false
            } else if seen.len() < MESSAGES_KEPT {
                seen.insert(why.to_owned())
            } else {
                self.queue.lock().log.due("partial")
            }
        };
        if first {
            tracing::warn!(
                url = %self.target.label,
                signal = T::SIGNAL,
                items = part.len(),
                rejected,
                message = %why,
                "OTLP receiver accepted a request but refused {rejected} of its {} {}; \
                 they are counted in uctel_collector_otlp_items_dropped_total\
                 {{reason=\"partial_success\"}} (this message is logged once)",
                part.len(),
                T::ITEMS
            );
        }
    }

    fn retried(&self, items: usize) {
        let _st = self.queue.lock();
        self.queue.counters.retried(items as u64);
    }

    fn observe(&self, seconds: f64) {
        self.queue.counters.observe(seconds);
    }

    fn drop_queued(&self) -> usize {
        self.queue
            .drop_queued(self.target.end_reason(), "not sent within the grace period")
    }

    fn log(&mut self, event: Event<'_>, _part: &[T]) {
        let end = self.target.end_reason().as_str();
        log(&self.target.label, T::SIGNAL, end, &mut self.log, event);
    }
}

/// The OTLP output's line for `event`.
fn log(url: &str, signal: &str, end: &str, limiter: &mut http::LogLimiter, event: Event<'_>) {
    match event {
        Event::Retry { items, why, delay } => {
            if limiter.due("retry") {
                tracing::warn!(url, signal, items, error = %why, retry_in_ms = delay.as_millis() as u64, "OTLP export failed; retrying");
            }
        }
        Event::GaveUp { items, why } => {
            tracing::warn!(url, signal, items, error = %why, "OTLP export still failing at the end of the grace period ({end}); its items are counted in uctel_collector_otlp_items_dropped_total{{reason=\"{end}\"}}");
        }
        Event::PartRefused { items, refused } => {
            if !limiter.due("reject") {
            } else if refused.fatal {
                tracing::error!(url, signal, items, answer = %refused.why, "OTLP receiver refused an export (authentication, or no such path); its items are dropped and counted in uctel_collector_otlp_items_dropped_total{{reason=\"rejected\"}}");
            } else {
                tracing::warn!(url, signal, items, answer = %refused.why, "OTLP receiver refused an export; its items are dropped (not retried, OTLP/HTTP \"Failures\") and counted in uctel_collector_otlp_items_dropped_total{{reason=\"rejected\"}}");
            }
        }
        Event::NotEncoded { items, why } => {
            tracing::error!(url, signal, items, error = %why, "OTLP export not built; its items are counted in uctel_collector_otlp_items_dropped_total{{reason=\"rejected\"}}");
        }
        Event::NotSent { items } => {
            tracing::warn!(url, signal, items, "OTLP items not sent by the end of the grace period ({end}); counted in uctel_collector_otlp_items_dropped_total{{reason=\"{end}\"}}");
        }
        // Never refused by item, and never of unknown outcome (module docs).
        Event::ItemRefused { .. }
        | Event::Isolated { .. }
        | Event::Unchecked { .. }
        | Event::Unknown { .. }
        | Event::Landed { .. }
        | Event::CheckFailed { .. } => {}
    }
}
