//! One shard's sender task: waits for a full request or the batch deadline, encodes,
//! sends, and retries what may succeed later.
//!
//! Outcomes (remote-write spec 1.0, "Retries & Backoff"):
//! * 2xx: sent.
//! * 5xx, 429 and transport errors (connect, timeout, reset): the same request again after
//!   a delay (exponential backoff with full jitter; a 429's or 503's `Retry-After` is
//!   honoured, cut to the largest backoff). The shard sends nothing else meanwhile, so its
//!   series stay in order; new samples wait in its bounded queue (full: oldest dropped).
//! * 400: the receiver refused some samples (Prometheus answers 400 for one sample out of
//!   order or out of bounds and appends none of the request). The request is split in
//!   halves and the halves sent in order, as often as it takes, so each refused sample is
//!   failed alone (`rejected`) and the other series of the request are written: one
//!   agent's late samples never cost another agent's. At most `MAX_SPLIT_REQUESTS` (128)
//!   requests per batch; parts still refused after that fail whole.
//! * Any other status (401, 404, 413, …): failed for good (`rejected`), never retried;
//!   the answer is logged (rate-limited).
//!
//! **A retry may store a sample twice.** A request that timed out may still be applied by
//! the receiver (a receiver that hung and resumed reads the request it was sent), and the
//! protocol has no request identity, so the retry can deliver the same samples again.
//! Prometheus (TSDB head appender) ignores a sample identical to its series' newest one
//! and refuses older ones (400, split as above; such a sample is counted `rejected` though
//! the first copy was stored): nothing is stored twice. VictoriaMetrics
//! stores every copy unless started with `-dedup.minScrapeInterval` (1.79 as packaged by
//! Debian: off by default; `count_over_time` and `sum_over_time` then count the copies,
//! `rate` does not); with `-dedup.minScrapeInterval=1ms` it keeps one sample per series
//! and millisecond, which removes exactly the copies (samples of one series are stamped
//! with the agent's collection time, never two in the same millisecond). Measured by the
//! fault-matrix row `remote_write_receiver_hung`.
//!
//! At shutdown the shard gets a grace period to send what is queued; a request still
//! failing then is given up (`failed{reason="shutdown"}`), samples not sent
//! `dropped{reason="shutdown"}`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use reqwest::header::{HeaderValue, CONTENT_ENCODING, CONTENT_TYPE};
use reqwest::StatusCode;
use uctel_common::shutdown::Shutdown;

use super::metrics::{Dropped, Failed};
use super::prompb::{self, Sample};
use super::queue::{Queued, Shard};
use crate::outputs::http::{self, split, Backoff};

/// What every shard of an endpoint shares.
#[derive(Debug)]
pub(crate) struct Target {
    /// The client (timeouts, TLS, default headers).
    pub(crate) client: reqwest::Client,
    /// The write URL.
    pub(crate) url: reqwest::Url,
    /// The URL without credentials (logs).
    pub(crate) label: String,
    /// Batch deadline.
    pub(crate) deadline: Duration,
    /// Backoff bounds.
    pub(crate) backoff: (Duration, Duration),
    /// Grace period at shutdown.
    pub(crate) grace: Duration,
    /// The endpoint's log limiter, shared by its shards: one line per kind every 10 s for
    /// the endpoint, not one per shard.
    pub(crate) log: std::sync::Mutex<http::LogLimiter>,
}

impl Target {
    /// Whether a line of `kind` may be logged for this endpoint now.
    fn log_due(&self, kind: &'static str) -> bool {
        self.log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .due(kind)
    }
}

/// The protocol's version header value (spec 1.0).
const VERSION: &str = "0.1.0";

/// Most requests one batch may take while its refused samples are isolated (a 400 that
/// concerns many samples, e.g. a whole agent's samples out of order, then fails its parts
/// whole rather than stalling the shard).
pub(crate) const MAX_SPLIT_REQUESTS: usize = 128;

/// A request's fate.
enum Outcome {
    Sent,
    Retry(Option<Duration>, String),
    /// Refused: the HTTP status, the answer.
    Reject(StatusCode, String),
}

/// Runs shard `index` until `shutdown` fires and the grace period ends.
pub(crate) async fn run(
    target: Arc<Target>,
    shards: Arc<super::queue::Shards>,
    shard: Arc<Shard>,
    index: usize,
    mut shutdown: Shutdown,
) {
    let mut scratch = EncodeScratch::default();
    let mut stop_at: Option<tokio::time::Instant> = None;
    loop {
        // Wait until a request is due (full, deadline) or the collector stops.
        let batch = loop {
            let now = Instant::now();
            let (due, wait) = {
                let mut st = shard.lock();
                let full = st.queue.len() >= shard.max_per_send;
                let deadline = st.oldest.map(|t| t + target.deadline);
                if !st.queue.is_empty()
                    && (full || stop_at.is_some() || deadline.is_some_and(|d| d <= now))
                {
                    (Some(st.take(shard.max_per_send, now)), None)
                } else {
                    (None, deadline)
                }
            };
            if let Some(b) = due {
                break b;
            }
            if stop_at.is_some() {
                return; // Stopping and nothing queued.
            }
            let sleep = async {
                match wait {
                    Some(d) => tokio::time::sleep_until(d.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shard.wake.notified() => {}
                _ = sleep => {}
                _ = shutdown.wait() => {
                    stop_at = Some(tokio::time::Instant::now() + target.grace);
                }
            }
        };
        // Held across the collector's own stall: its agents moved (`stall` module).
        let batch = match shards.watch(Instant::now()) {
            Some(before_ms) => {
                let n = batch.len();
                let kept: Vec<Queued> = batch
                    .into_iter()
                    .filter(|q| q.sample.timestamp >= before_ms)
                    .collect();
                shard
                    .lock()
                    .settle_dropped(n - kept.len(), Dropped::AgentMoved);
                if kept.is_empty() {
                    continue;
                }
                kept
            }
            None => batch,
        };
        // The parts of the batch still to send, the next one last (a part refused with 400
        // is split and its halves pushed back: module documentation).
        let mut parts: Vec<std::ops::Range<usize>> = Vec::new();
        parts.push(0..batch.len());
        let (mut requests, mut isolated) = (0usize, 0usize);
        while let Some(range) = parts.pop() {
            let part = &batch[range.clone()];
            requests += 1;
            send_part(&target, &shard, index, part, &mut scratch, &mut shutdown, &mut stop_at, &mut |refused: &str| {
                if part.len() > 1 && requests < MAX_SPLIT_REQUESTS {
                    let mut again = split(range.clone(), None);
                    again.reverse();
                    parts.extend(again);
                    true
                } else {
                    if part.len() == 1 {
                        isolated += 1;
                        tracing::warn!(url = %target.label, shard = index, answer = %refused, "remote-write receiver refused a sample; it is failed alone (samples_failed_total{{reason=\"rejected\"}}), the rest of its request is sent without it");
                    }
                    false
                }
            })
            .await;
        }
        if isolated > 0 {
            tracing::warn!(url = %target.label, shard = index, samples = batch.len(), refused = isolated, requests, "a remote-write request had samples the receiver refused: those failed, the rest was sent");
        }
        if let Some(stop) = stop_at {
            if tokio::time::Instant::now() >= stop {
                let dropped = shard.lock().drop_queue(Dropped::Shutdown);
                if dropped > 0 {
                    tracing::warn!(url = %target.label, shard = index, samples = dropped, "remote-write samples not sent before shutdown; counted in samples_dropped_total{{reason=\"shutdown\"}}");
                }
                return;
            }
        }
    }
}

/// Sends `part` until it is sent, failed or given up at shutdown, and settles it. A 400
/// asks `split_refused` (with the answer) whether the part is split and sent again in
/// parts (then it is not settled here).
#[allow(clippy::too_many_arguments)]
async fn send_part(
    target: &Target,
    shard: &Shard,
    index: usize,
    part: &[Queued],
    scratch: &mut EncodeScratch,
    shutdown: &mut Shutdown,
    stop_at: &mut Option<tokio::time::Instant>,
    split_refused: &mut (dyn FnMut(&str) -> bool + Send),
) {
    let n = part.len();
    let newest = part.iter().map(|q| q.sample.timestamp).max().unwrap_or(0);
    let body = match encode(part, scratch) {
        // Shared, so that a retry does not copy the request.
        Ok(b) => bytes::Bytes::from(b),
        Err(e) => {
            tracing::error!(url = %target.label, error = %e, "remote-write request not encoded; its samples are counted failed");
            shard.lock().settle_failed(n, Failed::Rejected);
            return;
        }
    };
    let mut backoff = Backoff::new(target.backoff.0, target.backoff.1);
    loop {
        let started = Instant::now();
        let outcome = send(target, body.clone()).await;
        let counters = shard.lock().counters.clone();
        counters.duration.observe(started.elapsed().as_secs_f64());
        match outcome {
            Outcome::Sent => {
                shard.lock().settle_sent(n, newest);
                return;
            }
            Outcome::Reject(status, why) => {
                if status == StatusCode::BAD_REQUEST && split_refused(&why) {
                    return;
                }
                shard.lock().settle_failed(n, Failed::Rejected);
                if n > 1 && target.log_due("reject") {
                    tracing::warn!(url = %target.label, shard = index, samples = n, answer = %why, "remote-write receiver rejected a request; its samples are dropped (not retried) and counted in samples_failed_total{{reason=\"rejected\"}}");
                }
                return;
            }
            Outcome::Retry(after, why) => {
                let delay = backoff.next_delay(after);
                if let Some(stop) = *stop_at {
                    if tokio::time::Instant::now() + delay >= stop {
                        shard.lock().settle_failed(n, Failed::Shutdown);
                        tracing::warn!(url = %target.label, shard = index, samples = n, error = %why, "remote-write request still failing at shutdown; its samples are counted in samples_failed_total{{reason=\"shutdown\"}}");
                        return;
                    }
                }
                {
                    let st = shard.lock();
                    st.counters.retried.inc_by(n as u64);
                }
                if target.log_due("retry") {
                    tracing::warn!(url = %target.label, shard = index, samples = n, error = %why, retry_in_ms = delay.as_millis() as u64, "remote-write request failed; retrying");
                }
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = shutdown.wait(), if stop_at.is_none() => {
                        *stop_at = Some(tokio::time::Instant::now() + target.grace);
                    }
                }
            }
        }
    }
}

/// Reused between requests of one shard.
#[derive(Debug, Default)]
struct EncodeScratch {
    /// Series index by the address of its encoded labels.
    index: HashMap<usize, u32, foldhash::fast::RandomState>,
    /// Per series: its labels' position in the batch and its sample count, then its first
    /// slot in `samples`.
    series: Vec<(u32, u32)>,
    /// Samples grouped by series, in queue order within each.
    samples: Vec<Sample>,
    /// The uncompressed body.
    raw: Vec<u8>,
}

/// The request body of `batch`: one `TimeSeries` per series, its samples in queue order
/// (grouped with a counting sort: no allocation per series).
fn encode(batch: &[Queued], s: &mut EncodeScratch) -> Result<Vec<u8>, snap::Error> {
    s.index.clear();
    s.series.clear();
    let mut of = Vec::with_capacity(batch.len());
    for (i, q) in batch.iter().enumerate() {
        let next = s.series.len() as u32;
        let k = *s.index.entry(q.wire.as_ptr() as usize).or_insert(next);
        if k == next {
            s.series.push((i as u32, 0));
        }
        s.series[k as usize].1 += 1;
        of.push(k);
    }
    // Counts → first slots.
    let mut start = Vec::with_capacity(s.series.len());
    let mut at = 0u32;
    for (_, n) in &s.series {
        start.push(at);
        at += n;
    }
    s.samples.clear();
    s.samples.resize(batch.len(), Sample::default());
    let mut fill = start.clone();
    for (q, k) in batch.iter().zip(&of) {
        let slot = &mut fill[*k as usize];
        s.samples[*slot as usize] = q.sample;
        *slot += 1;
    }
    let samples = &s.samples;
    prompb::encode_request(
        s.series.iter().zip(&start).map(|(&(first, n), &st)| {
            (
                &batch[first as usize].wire[..],
                &samples[st as usize..(st + n) as usize],
            )
        }),
        &mut s.raw,
    )
}

async fn send(target: &Target, body: bytes::Bytes) -> Outcome {
    let result = target
        .client
        .post(target.url.clone())
        .header(CONTENT_ENCODING, HeaderValue::from_static("snappy"))
        .header(
            CONTENT_TYPE,
            HeaderValue::from_static("application/x-protobuf"),
        )
        .header(
            "X-Prometheus-Remote-Write-Version",
            HeaderValue::from_static(VERSION),
        )
        .body(body)
        .send()
        .await;
    let response = match result {
        Ok(r) => r,
        Err(e) => return Outcome::Retry(None, http::describe(&e)),
    };
    let status = response.status();
    if status.is_success() {
        return Outcome::Sent;
    }
    let after = http::retry_after(response.headers(), SystemTime::now());
    let text = response.text().await.unwrap_or_default();
    let why = format!("{status}: {}", http::snippet(&text, 200));
    if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
        Outcome::Retry(after, why)
    } else {
        Outcome::Reject(status, why)
    }
}
