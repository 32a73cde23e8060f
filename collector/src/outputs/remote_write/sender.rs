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
use super::queue::{Queued, Shard, Shards};
use crate::outputs::http;
use crate::outputs::sender::{self, Answer, Event, Refused, Settle, Sink, Timing};

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
    /// Set when a reload removed or changed the endpoint (`super::live`): what the grace
    /// period leaves is settled `reload` instead of `shutdown`.
    pub(crate) retired: std::sync::atomic::AtomicBool,
}

impl Target {
    /// Whether a reload retired the endpoint.
    pub(crate) fn is_retired(&self) -> bool {
        self.retired.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The reason what the grace period leaves is settled with: `reload` or `shutdown`.
    fn end_reason(&self) -> &'static str {
        if self.is_retired() {
            "reload"
        } else {
            "shutdown"
        }
    }

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

/// Runs shard `index` until `shutdown` fires and the grace period ends (the loop every
/// asynchronous output shares, `crate::outputs::sender`).
pub(crate) async fn run(
    target: Arc<Target>,
    shards: Arc<Shards>,
    shard: Arc<Shard>,
    index: usize,
    shutdown: Shutdown,
) {
    let sink = ShardSink {
        target,
        shards,
        shard,
        index,
        scratch: EncodeScratch::default(),
    };
    sender::run(sink, shutdown).await;
}

/// One remote-write shard as a [`Sink`]: samples from its queue, snappy-compressed
/// protobuf requests, answers classified as the module docs say.
struct ShardSink {
    target: Arc<Target>,
    shards: Arc<Shards>,
    shard: Arc<Shard>,
    index: usize,
    scratch: EncodeScratch,
}

impl Sink for ShardSink {
    type Item = Queued;
    /// The encoded body, shared so that a retry does not copy it.
    type Request = bytes::Bytes;

    fn timing(&self) -> Timing {
        Timing {
            backoff: self.target.backoff,
            grace: self.target.grace,
        }
    }

    fn wake(&self) -> &tokio::sync::Notify {
        &self.shard.wake
    }

    fn due(&self, now: Instant, flush: bool) -> Result<Vec<Queued>, Option<Instant>> {
        let mut st = self.shard.lock();
        let full = st.queue.len() >= self.shard.max_per_send;
        let deadline = st.oldest.map(|t| t + self.target.deadline);
        if !st.queue.is_empty() && (full || flush || deadline.is_some_and(|d| d <= now)) {
            Ok(st.take(self.shard.max_per_send, now))
        } else {
            Err(deadline)
        }
    }

    /// Samples held across the collector's own stall are dropped: their agents moved
    /// (`stall` module).
    fn admit(&self, batch: Vec<Queued>) -> Vec<Queued> {
        let Some(before_ms) = self.shards.watch(Instant::now()) else {
            return batch;
        };
        let n = batch.len();
        let kept: Vec<Queued> = batch
            .into_iter()
            .filter(|q| q.sample.timestamp >= before_ms)
            .collect();
        self.shard
            .lock()
            .settle_dropped(n - kept.len(), Dropped::AgentMoved);
        kept
    }

    fn encode(&mut self, part: &[Queued]) -> Result<bytes::Bytes, String> {
        encode(part, &mut self.scratch)
            .map(bytes::Bytes::from)
            .map_err(|e| e.to_string())
    }

    async fn send(&self, body: &bytes::Bytes) -> Answer {
        send(&self.target, body.clone()).await
    }

    fn settle(&self, part: &[Queued], how: Settle<'_>) {
        let n = part.len();
        let mut st = self.shard.lock();
        match how {
            Settle::Sent => {
                let newest = part.iter().map(|q| q.sample.timestamp).max().unwrap_or(0);
                st.settle_sent(n, newest);
            }
            Settle::Rejected(_) => st.settle_failed(n, Failed::Rejected),
            Settle::Shutdown(_) if self.target.is_retired() => st.settle_failed(n, Failed::Reload),
            Settle::Shutdown(_) => st.settle_failed(n, Failed::Shutdown),
        }
    }

    fn retried(&self, items: usize) {
        let st = self.shard.lock();
        st.counters.retried.inc_by(items as u64);
    }

    fn observe(&self, seconds: f64) {
        let counters = self.shard.lock().counters.clone();
        counters.duration.observe(seconds);
    }

    fn may_split(&self, requests: usize) -> bool {
        requests < MAX_SPLIT_REQUESTS
    }

    fn drop_queued(&self) -> usize {
        let reason = if self.target.is_retired() {
            Dropped::Reload
        } else {
            Dropped::Shutdown
        };
        self.shard.lock().drop_queue(reason)
    }

    fn log(&mut self, event: Event<'_>, _part: &[Queued]) {
        log(&self.target, self.index, event);
    }
}

/// Shard `index`'s line for `event`.
fn log(target: &Target, index: usize, event: Event<'_>) {
    let url = &target.label;
    crate::outputs::last_error::note(url, &event);
    match event {
        Event::Retry { items, why, delay } => {
            if target.log_due("retry") {
                tracing::warn!(url = %url, shard = index, samples = items, error = %why, retry_in_ms = delay.as_millis() as u64, "remote-write request failed; retrying");
            }
        }
        Event::GaveUp { items, why } => {
            let reason = target.end_reason();
            tracing::warn!(url = %url, shard = index, samples = items, error = %why, "remote-write request still failing at {reason}; its samples are counted in samples_failed_total{{reason=\"{reason}\"}}");
        }
        Event::ItemRefused { refused, .. } => {
            tracing::warn!(url = %url, shard = index, answer = %refused.why, "remote-write receiver refused a sample; it is failed alone (samples_failed_total{{reason=\"rejected\"}}), the rest of its request is sent without it");
        }
        Event::PartRefused { items, refused } => {
            if items > 1 && target.log_due("reject") {
                tracing::warn!(url = %url, shard = index, samples = items, answer = %refused.why, "remote-write receiver rejected a request; its samples are dropped (not retried) and counted in samples_failed_total{{reason=\"rejected\"}}");
            }
        }
        Event::NotEncoded { why, .. } => {
            tracing::error!(url = %url, error = %why, "remote-write request not encoded; its samples are counted failed");
        }
        Event::Isolated {
            items,
            refused,
            requests,
        } => {
            tracing::warn!(url = %url, shard = index, samples = items, refused, requests, "a remote-write request had samples the receiver refused: those failed, the rest was sent");
        }
        Event::NotSent { items } => {
            let reason = target.end_reason();
            tracing::warn!(url = %url, shard = index, samples = items, "remote-write samples not sent before {reason}; counted in samples_dropped_total{{reason=\"{reason}\"}}");
        }
        // Remote-write answers are never of unknown outcome (no request identity to check).
        Event::Unchecked { .. }
        | Event::Unknown { .. }
        | Event::Landed { .. }
        | Event::CheckFailed { .. } => {}
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

/// Sends the request `body` once; its [`Answer`] (module docs): a 400 may concern some
/// samples only.
async fn send(target: &Target, body: bytes::Bytes) -> Answer {
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
        Err(e) => return Answer::Retry(None, http::describe(&e)),
    };
    let status = response.status();
    if status.is_success() {
        return Answer::Sent;
    }
    let after = http::retry_after(response.headers(), SystemTime::now());
    let text = response.text().await.unwrap_or_default();
    let why = format!("{status}: {}", http::snippet(&text, 200));
    if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
        Answer::Retry(after, why)
    } else {
        Answer::Refused(Refused {
            by_item: status == StatusCode::BAD_REQUEST,
            named: None,
            fatal: false,
            why,
        })
    }
}
