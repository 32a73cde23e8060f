//! The sender task: waits for a full `INSERT` or the batch deadline, sends it, and retries
//! what may succeed later.
//!
//! Outcomes, decided by the `Code: N` of ClickHouse's answer first (an old server answers
//! 500 for bad data, a newer one 400; the code says what happened either way), then by the
//! HTTP status:
//!
//! * 2xx: inserted.
//! * A code of [`REJECT_CODES`] (the data does not parse or fit the table, the table or
//!   database does not exist, authentication or access failed): the rows are dropped
//!   (`rejected`), never retried: the same rows would fail again and block every row behind
//!   them.
//! * A code of [`RETRY_CODES`] (overload, timeouts, too many parts), 5xx, 408, 429 and
//!   transport errors (connect, reset, timeout): the same `INSERT` again after a delay
//!   (exponential backoff with full jitter; `Retry-After` is honoured, cut to the largest
//!   backoff). Nothing else is sent meanwhile; new rows wait in the bounded queue.
//! * Any other status (4xx): rejected.
//!
//! **One refused row costs only itself.** ClickHouse applies an `INSERT` whole or not at
//! all, so one row that does not fit the table (a value too long for a `FixedString`, a
//! number out of range: the codes of [`ROW_CODES`], or a 4xx without a code) refuses the
//! rows beside it too. Such an `INSERT` is split and its parts sent again: around the row
//! the answer names (`(at row N)`, which ClickHouse writes for parse errors), else in
//! halves, as often as it takes (about 2·log2(n) requests for one bad row among n), so
//! the good rows are inserted and each refused row is dropped (`rejected`) alone and
//! logged with its agent, source and `stream_seq`. A refusal that concerns the whole
//! request (no such table, authentication, syntax) drops the whole `INSERT` at once.
//!
//! **Exactly once.** A failure is *ambiguous* when the server may have applied the
//! `INSERT` although its answer did not say so: a timeout or a connection reset after the
//! request was sent (a frozen or overloaded server applies a request it already read once
//! it runs again), a 5xx without a code that says "not applied", or a code of
//! [`UNKNOWN_CODES`]. After an ambiguous failure the same rows are never sent blindly:
//!
//! 1. Every `INSERT` carries a `query_id` (HTTP parameter, ClickHouse 1.1 and later), the
//!    same for every attempt of the same rows, so a second attempt while the first still
//!    runs is refused by the server (code 216, `QUERY_WITH_SAME_ID_IS_ALREADY_RUNNING`).
//! 2. The sender keeps asking, with backoff, until the server answers:
//!    `SELECT count() FROM system.processes WHERE query_id = ?` (0: the earlier attempt
//!    finished or never started), then
//!    `SELECT count() FROM <table> WHERE (agent, stream, stream_seq, ts_ns, message) IN (…)`
//!    over the rows of the request. A MergeTree `INSERT` of fewer rows than
//!    `max_insert_block_size` (1,048,576) is one block, written whole or not at all, so
//!    the rows landed when the count reaches the request's row count.
//! 3. Landed: the rows are settled as inserted, not sent again. Not there: the check is
//!    repeated once more after a backoff delay (an earlier attempt whose connection the
//!    server had accepted but not yet read when it answered the first check has then
//!    started and shows in `system.processes`), and only then are the rows sent again.
//!
//! Each check is counted in `uctel_collector_clickhouse_insert_checks_total{result}`
//! (`landed`, `absent`, `running`, `failed`). This works with the shipped schema
//! (`config/clickhouse/logs.sql`) on every ClickHouse from 18.16 on (tuple `IN` and
//! `system.processes` are older), with no setting on the server. On a current ClickHouse
//! (22.3 on), the table of `--print-clickhouse-schema --server-version 26`
//! (`config/clickhouse/logs-modern.sql`) also has the server drop an identical block
//! inserted again (`non_replicated_deduplication_window`), a second guard; a table created
//! from `logs.sql` keeps both copies of a block inserted twice.
//!
//! What remains: rows identical in all five columns that came from two different requests
//! (the same record sent by two collectors, or identical lines of one frame split over two
//! requests) are counted together by the check, so a request whose every row has such a
//! twin already stored reads as landed; an earlier attempt that the server had not even
//! accepted from the socket by the time two checks were answered (several backoff delays
//! later) could still land after the resend; and rows whose check has not been answered
//! when the collector stops are counted dropped (`shutdown`) although they may be stored.
//!
//! At shutdown the sender has a grace period to send what is queued; a request still
//! failing then, and rows not sent, are dropped (`shutdown`).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use reqwest::header::{HeaderValue, CONTENT_TYPE};
use uctel_common::shutdown::Shutdown;

use super::metrics::Dropped;
use super::queue::{Queue, Row};
use crate::outputs::http;
#[cfg(test)]
use crate::outputs::http::split;
pub(crate) use crate::outputs::sender::Check;
use crate::outputs::sender::{self, Answer, Event, Refused, Settle, Sink, Timing};

/// ClickHouse error codes after which the same `INSERT` is never sent again (names from
/// ClickHouse's `src/Common/ErrorCodes.cpp`).
pub const REJECT_CODES: &[u32] = &[
    6,   // CANNOT_PARSE_TEXT
    16,  // NO_SUCH_COLUMN_IN_TABLE
    25,  // CANNOT_PARSE_ESCAPE_SEQUENCE
    26,  // CANNOT_PARSE_QUOTED_STRING
    27,  // CANNOT_PARSE_INPUT_ASSERTION_FAILED
    38,  // CANNOT_PARSE_DATE
    41,  // CANNOT_PARSE_DATETIME
    53,  // TYPE_MISMATCH
    60,  // UNKNOWN_TABLE
    62,  // SYNTAX_ERROR
    69,  // ARGUMENT_OUT_OF_BOUND
    70,  // CANNOT_CONVERT_TYPE
    72,  // CANNOT_PARSE_NUMBER
    73,  // UNKNOWN_FORMAT
    81,  // UNKNOWN_DATABASE
    117, // INCORRECT_DATA
    130, // CANNOT_READ_ARRAY_FROM_TEXT
    131, // TOO_LARGE_STRING_SIZE
    190, // SIZES_OF_ARRAYS_DOESNT_MATCH
    192, // UNKNOWN_USER
    193, // WRONG_PASSWORD
    194, // REQUIRED_PASSWORD
    195, // IP_ADDRESS_NOT_ALLOWED
    291, // DATABASE_ACCESS_DENIED
    321, // VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE
    349, // CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN
    366, // SIZES_OF_NESTED_COLUMNS_ARE_INCONSISTENT
    497, // ACCESS_DENIED
    516, // AUTHENTICATION_FAILED
];

/// ClickHouse error codes after which the same `INSERT` is sent again, whatever the status.
pub const RETRY_CODES: &[u32] = &[
    159, // TIMEOUT_EXCEEDED
    202, // TOO_MANY_SIMULTANEOUS_QUERIES
    209, // SOCKET_TIMEOUT
    210, // NETWORK_ERROR
    241, // MEMORY_LIMIT_EXCEEDED
    242, // TABLE_IS_READ_ONLY
    252, // TOO_MANY_PARTS
    319, // UNKNOWN_STATUS_OF_INSERT
];

/// ClickHouse error codes after which the `INSERT` may have been applied: the sender asks
/// whether its rows landed before it sends them again (module documentation).
pub const UNKNOWN_CODES: &[u32] = &[
    159, // TIMEOUT_EXCEEDED (the block may have been written before the limit)
    209, // SOCKET_TIMEOUT
    210, // NETWORK_ERROR
    216, // QUERY_WITH_SAME_ID_IS_ALREADY_RUNNING (an earlier attempt still runs)
    319, // UNKNOWN_STATUS_OF_INSERT
];

/// Codes meaning the table or database is not there.
const MISSING_TABLE_CODES: &[u32] = &[60, 81];

/// Codes of [`REJECT_CODES`] that may concern some rows only (a value that does not parse or
/// fit its column): the rest of the `INSERT` is sent again without them.
pub const ROW_CODES: &[u32] = &[
    6, 25, 26, 27, 38, 41, 53, 69, 70, 72, 117, 130, 131, 190, 321, 349, 366,
];

/// The 1-based row of the `INSERT` a refusal names (`(at row 1001)`, written by ClickHouse
/// for parse errors since long before 18.16), if it names one.
pub fn named_row(body: &str) -> Option<usize> {
    let at = body.find("at row ")?;
    let digits = &body[at + 7..];
    let end = digits
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(digits.len());
    digits[..end].parse().ok().filter(|n| *n > 0)
}

/// What to do with an answer that is not a success.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Send the same `INSERT` again later.
    Retry,
    /// Drop its rows (`rejected`).
    Reject,
}

/// The ClickHouse error code of an answer body (`Code: 27, e.displayText() = …` in old
/// releases, `Code: 27. DB::Exception: …` in newer ones), if it has one.
pub fn error_code(body: &str) -> Option<u32> {
    let at = body.find("Code: ")?;
    let digits: &str = &body[at + 6..];
    let end = digits
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(digits.len());
    digits[..end].parse().ok()
}

/// The verdict on a non-2xx answer with HTTP `status` and `body`.
pub fn classify(status: u16, body: &str) -> Verdict {
    match error_code(body) {
        Some(c) if REJECT_CODES.contains(&c) => return Verdict::Reject,
        Some(c) if RETRY_CODES.contains(&c) => return Verdict::Retry,
        _ => {}
    }
    match status {
        408 | 429 | 500..=599 => Verdict::Retry,
        _ => Verdict::Reject,
    }
}

/// Whether a non-2xx answer leaves open whether the `INSERT` was applied: a code of
/// [`UNKNOWN_CODES`], or a 5xx whose code (if any) is not known to mean "not applied" (a
/// proxy's 502/503/504, a server that failed while answering, an unlisted code). A code of
/// [`REJECT_CODES`] or [`RETRY_CODES`] outside [`UNKNOWN_CODES`] (bad data, overload, too
/// many parts) says the block was not written.
pub fn ambiguous(status: u16, body: &str) -> bool {
    match error_code(body) {
        Some(c) if UNKNOWN_CODES.contains(&c) => true,
        Some(c) if REJECT_CODES.contains(&c) || RETRY_CODES.contains(&c) => false,
        _ => (500..=599).contains(&status),
    }
}

/// What the sender needs.
#[derive(Debug)]
pub(crate) struct Target {
    /// The client (timeouts, TLS, authentication).
    pub(crate) client: reqwest::Client,
    /// The URL with the `INSERT` query.
    pub(crate) url: reqwest::Url,
    /// The URL without a query (the checks of an ambiguous `INSERT` post theirs).
    pub(crate) base: reqwest::Url,
    /// The URL without credentials and query (logs).
    pub(crate) label: String,
    /// `database.table` (logs).
    pub(crate) table: String,
    /// Batch deadline.
    pub(crate) deadline: Duration,
    /// Backoff bounds.
    pub(crate) backoff: (Duration, Duration),
    /// Grace period at shutdown.
    pub(crate) grace: Duration,
    /// Set when a reload removed or changed the endpoint (`crate::outputs::handover`): what
    /// the grace period leaves is settled `reload` instead of `shutdown`.
    pub(crate) retired: std::sync::atomic::AtomicBool,
}

impl Target {
    /// Why what the grace period leaves is given up: `reload` (a reload retired the
    /// endpoint) or `shutdown`.
    fn end_reason(&self) -> Dropped {
        if self.retired.load(std::sync::atomic::Ordering::Acquire) {
            Dropped::Reload
        } else {
            Dropped::Shutdown
        }
    }
}

/// Whether a refusal with ClickHouse's error `code` (if the answer has one) and HTTP
/// `status` may concern some rows only: a code of [`ROW_CODES`], or a 4xx without a code
/// other than the request-wide 401, 403, 404 and 413.
fn by_row(code: Option<u32>, status: u16) -> bool {
    match code {
        Some(c) => ROW_CODES.contains(&c),
        None => !matches!(status, 401 | 403 | 404 | 413),
    }
}

/// Agent, source and `stream_seq` of a row, for the log line of a refused row.
fn describe_row(row: &Row) -> String {
    let v: serde_json::Value = serde_json::from_slice(&row.json).unwrap_or_default();
    format!(
        "agent {}, source {}, stream_seq {}",
        row.agent,
        v.get("source").and_then(|s| s.as_str()).unwrap_or("?"),
        v.get("stream_seq")
            .map_or_else(|| "?".to_owned(), ToString::to_string)
    )
}

/// Runs until `shutdown` fires and what is queued is sent or the grace period ends (the
/// loop every asynchronous output shares, `crate::outputs::sender`).
pub(crate) async fn run(target: Arc<Target>, queue: Arc<Queue>, shutdown: Shutdown) {
    let sink = ClickHouseSink {
        target,
        queue,
        log: http::LogLimiter::default(),
    };
    sender::run(sink, shutdown).await;
}

/// The ClickHouse output as a [`Sink`]: rows from its [`Queue`], `INSERT`s of
/// `JSONEachRow`, answers classified as the module docs say.
struct ClickHouseSink {
    target: Arc<Target>,
    queue: Arc<Queue>,
    /// Lines of a kind at most every 10 s.
    log: http::LogLimiter,
}

/// One `INSERT`: its body and its `query_id` (the same for every attempt of its rows).
struct Insert {
    body: Vec<u8>,
    query_id: String,
}

impl Sink for ClickHouseSink {
    type Item = Row;
    type Request = Insert;

    fn timing(&self) -> Timing {
        Timing {
            backoff: self.target.backoff,
            grace: self.target.grace,
        }
    }

    fn wake(&self) -> &tokio::sync::Notify {
        &self.queue.wake
    }

    fn due(&self, now: Instant, flush: bool) -> Result<Vec<Row>, Option<Instant>> {
        self.queue.due(now, self.target.deadline, flush)
    }

    fn encode(&mut self, part: &[Row]) -> Result<Insert, String> {
        Ok(Insert {
            body: body(part),
            query_id: next_query_id(),
        })
    }

    async fn send(&self, insert: &Insert) -> Answer {
        send(&self.target, &insert.query_id, insert.body.clone()).await
    }

    async fn check(&self, part: &[Row], insert: &Insert) -> Check {
        check(&self.target, part, &insert.query_id).await
    }

    fn settle(&self, part: &[Row], how: Settle<'_>) {
        match how {
            Settle::Sent => self.queue.settle_inserted(part),
            Settle::Rejected(why) => self.queue.settle_dropped(part, Dropped::Rejected, why),
            Settle::Shutdown(why) => {
                self.queue
                    .settle_dropped(part, self.target.end_reason(), why);
            }
        }
    }

    fn retried(&self, items: usize) {
        let _st = self.queue.lock();
        self.queue.counters.retried(items as u64);
    }

    fn observe(&self, seconds: f64) {
        self.queue.counters.observe(seconds);
    }

    fn checked(&self, check: &Check) {
        let _st = self.queue.lock();
        self.queue.counters.checked(check.as_str());
    }

    fn drop_queued(&self) -> usize {
        self.queue
            .drop_queued(self.target.end_reason(), "not sent within the grace period")
    }

    fn log(&mut self, event: Event<'_>, part: &[Row]) {
        log(&self.target, &mut self.log, event, part);
    }
}

/// The ClickHouse output's line for `event` about the rows `part`.
fn log(target: &Target, limiter: &mut http::LogLimiter, event: Event<'_>, part: &[Row]) {
    crate::outputs::last_error::note(crate::outputs::last_error::CLICKHOUSE, &event);
    let (url, table) = (&target.label, &target.table);
    let end = target.end_reason().as_str();
    match event {
        Event::Retry { items, why, delay } => {
            if limiter.due("retry") {
                tracing::warn!(url = %url, rows = items, error = %why, retry_in_ms = delay.as_millis() as u64, "ClickHouse INSERT failed; retrying");
            }
        }
        Event::GaveUp { items, why } => {
            tracing::warn!(url = %url, rows = items, error = %why, "ClickHouse INSERT still failing at the end of the grace period ({end}); its rows are counted in uctel_collector_clickhouse_rows_dropped_total{{reason=\"{end}\"}}");
        }
        Event::Unchecked { items, why } => {
            tracing::warn!(url = %url, rows = items, error = %why, "ClickHouse INSERT of unknown outcome not checked by the end of the grace period ({end}); its rows are counted in uctel_collector_clickhouse_rows_dropped_total{{reason=\"{end}\"}} (they may be stored)");
        }
        Event::Unknown { items, why } => {
            if limiter.due("unknown") {
                tracing::warn!(url = %url, rows = items, error = %why, "ClickHouse INSERT failed after it was sent; asking whether it landed before sending it again");
            }
        }
        Event::Landed { items } => {
            tracing::info!(url = %url, rows = items, "ClickHouse INSERT of unknown outcome had landed; not sent again");
        }
        Event::CheckFailed { items, why } => {
            if limiter.due("check") {
                tracing::warn!(url = %url, rows = items, error = %why, "ClickHouse does not answer whether an INSERT landed; asking again before sending its rows");
            }
        }
        Event::ItemRefused { refused, .. } => {
            let row = part.first().map(describe_row).unwrap_or_default();
            tracing::warn!(url = %url, table = %table, row = %row, answer = %refused.why, "ClickHouse refused a row; it is dropped (not retried) and counted in uctel_collector_clickhouse_rows_dropped_total{{reason=\"rejected\"}}, the other rows of its INSERT are sent without it");
        }
        Event::PartRefused { items, refused } => {
            if !limiter.due("reject") {
            } else if refused.fatal {
                tracing::error!(url = %url, table = %table, rows = items, answer = %refused.why, "ClickHouse has no such table; its rows are dropped and counted (uctel_collector_clickhouse_rows_dropped_total{{reason=\"rejected\"}}): create it with config/clickhouse/logs.sql (uctel-collector --print-clickhouse-schema)");
            } else {
                tracing::warn!(url = %url, table = %table, rows = items, answer = %refused.why, "ClickHouse refused an INSERT; its rows are dropped (not retried) and counted in uctel_collector_clickhouse_rows_dropped_total{{reason=\"rejected\"}}");
            }
        }
        Event::NotEncoded { items, why } => {
            tracing::error!(url = %url, rows = items, error = %why, "ClickHouse INSERT not built; its rows are counted in uctel_collector_clickhouse_rows_dropped_total{{reason=\"rejected\"}}");
        }
        Event::Isolated { items, refused, .. } => {
            tracing::warn!(url = %url, table = %table, rows = items, refused, inserted = items - refused, "an INSERT had rows ClickHouse refused: those were dropped, the rest inserted");
        }
        Event::NotSent { items } => {
            tracing::warn!(url = %url, rows = items, "ClickHouse rows not sent by the end of the grace period ({end}); counted in uctel_collector_clickhouse_rows_dropped_total{{reason=\"{end}\"}}");
        }
    }
}

/// The `JSONEachRow` body of `batch`: one row per line.
fn body(batch: &[Row]) -> Vec<u8> {
    let mut out = Vec::with_capacity(batch.iter().map(|r| r.json.len() + 1).sum());
    for r in batch {
        out.extend_from_slice(&r.json);
        out.push(b'\n');
    }
    out
}

/// A `query_id` unique to this process and request: `uctel-<random>-<n>`.
fn next_query_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static PROCESS: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let process = *PROCESS.get_or_init(rand::random::<u64>);
    format!(
        "uctel-{process:016x}-{}",
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// `s` as a ClickHouse string literal (`'…'`, backslash and quote escaped).
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        if c == '\\' || c == '\'' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('\'');
    out
}

/// Bytes of row tuples per check query: ClickHouse parses at most `max_query_size`
/// (256 KiB by default) of a query, so a large request is checked in several queries.
const CHECK_QUERY_BYTES: usize = 128 * 1024;

/// The queries counting the stored rows equal to those of `rows` in agent, stream,
/// `stream_seq`, `ts_ns` and message, each under [`CHECK_QUERY_BYTES`] of tuples unless one
/// row alone is longer (`None` for rows that do not parse: a bug).
pub(crate) fn landed_queries(table: &str, rows: &[Row]) -> Option<Vec<String>> {
    let head = format!(
        "SELECT count() FROM {table} WHERE (agent, stream, stream_seq, ts_ns, message) IN ("
    );
    let mut out = Vec::new();
    let mut sql = String::new();
    for r in rows {
        let v: serde_json::Value = serde_json::from_slice(&r.json).ok()?;
        let tuple = format!(
            "({}, {}, {}, {}, {})",
            quote(&r.agent),
            quote(v.get("stream")?.as_str()?),
            v.get("stream_seq")?.as_u64()?,
            v.get("ts_ns")?.as_u64()?,
            quote(v.get("message")?.as_str()?)
        );
        if !sql.is_empty() && sql.len() + tuple.len() > CHECK_QUERY_BYTES {
            sql.push(')');
            out.push(std::mem::take(&mut sql));
        }
        if sql.is_empty() {
            sql.push_str(&head);
        } else {
            sql.push_str(", ");
        }
        sql.push_str(&tuple);
    }
    if !sql.is_empty() {
        sql.push(')');
        out.push(sql);
    }
    Some(out)
}

/// Runs a `SELECT` answering one number.
async fn count(target: &Target, sql: String) -> Result<u64, String> {
    let mut url = target.base.clone();
    if sql.len() > 200 * 1024 {
        // One row longer than the default limit (256 KiB).
        url.query_pairs_mut()
            .append_pair("max_query_size", &(sql.len() + 1024).to_string());
    }
    let response = target
        .client
        .post(url)
        .body(sql)
        .send()
        .await
        .map_err(|e| http::describe(&e))?;
    let status = response.status();
    let text = response.text().await.map_err(|e| http::describe(&e))?;
    if !status.is_success() {
        return Err(format!("{status}: {}", http::snippet(&text, 300)));
    }
    text.trim()
        .parse()
        .map_err(|_| format!("not a count: {}", http::snippet(&text, 100)))
}

/// Whether the rows of an `INSERT` with `query_id` whose outcome is unknown landed.
async fn check(target: &Target, rows: &[Row], query_id: &str) -> Check {
    let running = format!(
        "SELECT count() FROM system.processes WHERE query_id = {}",
        quote(query_id)
    );
    match count(target, running).await {
        Ok(0) => {}
        Ok(_) => return Check::Running,
        Err(e) => return Check::Failed(e),
    }
    let Some(queries) = landed_queries(&target.table, rows) else {
        return Check::Failed("a row does not parse".into());
    };
    let mut stored = 0u64;
    for sql in queries {
        match count(target, sql).await {
            Ok(n) => stored += n,
            Err(e) => return Check::Failed(e),
        }
    }
    if stored >= rows.len() as u64 {
        Check::Landed
    } else {
        Check::Absent
    }
}

/// Sends the `INSERT` `body` with `query_id` once; its [`Answer`] (module docs).
async fn send(target: &Target, query_id: &str, body: Vec<u8>) -> Answer {
    let mut url = target.url.clone();
    url.query_pairs_mut().append_pair("query_id", query_id);
    let result = target
        .client
        .post(url)
        .header(
            CONTENT_TYPE,
            HeaderValue::from_static("application/x-ndjson"),
        )
        .body(body)
        .send()
        .await;
    let response = match result {
        Ok(r) => r,
        // Refused connections never carried the request; anything later may have.
        Err(e) if e.is_connect() => return Answer::Retry(None, http::describe(&e)),
        Err(e) => return Answer::Unknown(http::describe(&e)),
    };
    let status = response.status();
    if status.is_success() {
        return Answer::Sent;
    }
    let after = http::retry_after(response.headers(), SystemTime::now());
    let text = match response.text().await {
        Ok(t) => t,
        // The status came but the body did not: retry only what a status alone allows.
        Err(e) => format!("(answer body unreadable: {})", http::describe(&e)),
    };
    let why = format!("{status}: {}", http::snippet(&text, 300));
    if ambiguous(status.as_u16(), &text) {
        return Answer::Unknown(why);
    }
    match classify(status.as_u16(), &text) {
        Verdict::Retry => Answer::Retry(after, why),
        Verdict::Reject => {
            let code = error_code(&text);
            Answer::Refused(Refused {
                by_item: by_row(code, status.as_u16()),
                named: named_row(&text),
                fatal: code.is_some_and(|c| MISSING_TABLE_CODES.contains(&c)),
                why,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_part_splits_around_the_named_row_or_in_halves_and_always_shrinks() {
        assert_eq!(
            named_row("Code: 131, e.displayText() = DB::Exception: Too large value for FixedString(16): (at row 1001)"),
            Some(1001)
        );
        assert_eq!(
            named_row("Code: 27. DB::Exception: Cannot parse input (at row 0)"),
            None
        );
        assert_eq!(named_row("Code: 27"), None);
        assert_eq!(split(0..1001, Some(1001)), vec![0..1000, 1000..1001]);
        assert_eq!(split(10..20, Some(1)), vec![10..11, 11..20]);
        assert_eq!(split(10..20, Some(5)), vec![10..14, 14..15, 15..20]);
        assert_eq!(split(10..20, Some(11)), vec![10..15, 15..20]);
        assert_eq!(split(10..20, None), vec![10..15, 15..20]);
        assert_eq!(split(10..11, None), vec![10..11]);
        // One bad row among n: every part shrinks, and the requests stay near 2·log2(n).
        for n in [2usize, 3, 1000, 1001, 4096] {
            for bad in [0, n / 3, n - 1] {
                let mut parts: Vec<std::ops::Range<usize>> = std::iter::once(0..n).collect();
                let (mut requests, mut inserted, mut refused) = (0, 0, 0);
                while let Some(r) = parts.pop() {
                    requests += 1;
                    if !r.contains(&bad) {
                        inserted += r.len();
                    } else if r.len() == 1 {
                        refused += 1;
                    } else {
                        let mut again = split(r.clone(), None);
                        assert!(again.iter().all(|p| p.len() < r.len()));
                        again.reverse();
                        parts.extend(again);
                    }
                }
                assert_eq!((inserted, refused), (n - 1, 1), "n {n}, bad {bad}");
                let bound = 2 * (usize::BITS - n.leading_zeros()) as usize + 1;
                assert!(requests <= bound, "n {n}: {requests} requests > {bound}");
            }
        }
    }

    #[test]
    fn only_answers_that_say_not_applied_are_sent_again_without_a_check() {
        // A proxy's 502/504 or a 500 without a code: the server may have applied it.
        assert!(ambiguous(502, "Bad Gateway"));
        assert!(ambiguous(500, ""));
        assert!(ambiguous(500, "Code: 209, e.displayText() = Timeout"));
        assert!(ambiguous(
            500,
            "Code: 216. DB::Exception: Query with id = x is already running"
        ));
        // Overload and too many parts: the block was not written.
        assert!(!ambiguous(500, "Code: 241, Memory limit"));
        assert!(!ambiguous(500, "Code: 252, Too many parts"));
        assert!(!ambiguous(429, ""));
        assert!(!ambiguous(500, "Code: 117, Unknown field"));
        assert!(ambiguous(500, "Code: 1001, std::exception"));
        assert!(!ambiguous(400, "Code: 1001, std::exception"));
        for c in UNKNOWN_CODES {
            assert!(!REJECT_CODES.contains(c), "{c} rejected and unknown");
        }
    }

    #[test]
    fn the_landed_query_quotes_every_string_and_names_each_row() {
        let row = |agent: &str, message: &str| Row {
            agent: Arc::from(agent),
            json: serde_json::to_vec(&serde_json::json!({
                "stream": "logs", "stream_seq": 7, "ts_ns": 12u64, "message": message,
            }))
            .unwrap()
            .into_boxed_slice(),
        };
        let sql = landed_queries("db.logs", &[row("a'b", r"c:\x 'q'"), row("a", "m")]).unwrap();
        assert_eq!(
            sql[..],
            [
                r"SELECT count() FROM db.logs WHERE (agent, stream, stream_seq, ts_ns, message) IN (('a\'b', 'logs', 7, 12, 'c:\\x \'q\''), ('a', 'logs', 7, 12, 'm'))"
            ]
        );
        // A large request is checked in queries the server parses with its default limit.
        let long = "x".repeat(1000);
        let many: Vec<Row> = (0..1000).map(|_| row("a", &long)).collect();
        let queries = landed_queries("t", &many).unwrap();
        assert!(queries.len() > 1, "{} queries", queries.len());
        assert!(queries
            .iter()
            .all(|q| q.len() <= CHECK_QUERY_BYTES + 1100 && q.ends_with(')')));
        let tuples: usize = queries
            .iter()
            .map(|q| q.matches("('a', 'logs'").count())
            .sum();
        assert_eq!(tuples, 1000);
        let bad = Row {
            agent: Arc::from("a"),
            json: Box::from(&b"{}"[..]),
        };
        assert_eq!(landed_queries("t", &[bad]), None);
        let ids = (next_query_id(), next_query_id());
        assert_ne!(ids.0, ids.1);
        assert!(ids.0.starts_with("uctel-"));
    }

    #[test]
    fn error_codes_are_read_from_old_and_new_answers() {
        assert_eq!(
            error_code("Code: 27, e.displayText() = DB::Exception: Cannot parse input"),
            Some(27)
        );
        assert_eq!(
            error_code("Code: 117. DB::Exception: Unknown field"),
            Some(117)
        );
        assert_eq!(error_code("Internal Server Error"), None);
        assert_eq!(error_code("Code: x"), None);
        assert_eq!(error_code("Code: 99999999999999999999"), None);
        assert_eq!(error_code(""), None);
    }

    #[test]
    fn bad_data_is_rejected_whatever_the_status_and_overload_retried() {
        // ClickHouse 18.16 answers 500 for an unknown JSONEachRow field (code 117).
        assert_eq!(
            classify(
                500,
                "Code: 117, e.displayText() = DB::Exception: Unknown field"
            ),
            Verdict::Reject
        );
        assert_eq!(
            classify(500, "Code: 27, e.displayText() = x"),
            Verdict::Reject
        );
        assert_eq!(
            classify(400, "Code: 41, e.displayText() = x"),
            Verdict::Reject
        );
        assert_eq!(
            classify(404, "Code: 60, e.displayText() = x"),
            Verdict::Reject
        );
        assert_eq!(classify(500, "Code: 241, Memory limit"), Verdict::Retry);
        assert_eq!(classify(400, "Code: 252, Too many parts"), Verdict::Retry);
        assert_eq!(classify(500, "Code: 1001, std::exception"), Verdict::Retry);
        assert_eq!(classify(503, ""), Verdict::Retry);
        assert_eq!(classify(502, "Bad Gateway"), Verdict::Retry);
        assert_eq!(classify(429, ""), Verdict::Retry);
        assert_eq!(classify(408, ""), Verdict::Retry);
        assert_eq!(classify(400, ""), Verdict::Reject);
        assert_eq!(classify(401, ""), Verdict::Reject);
        for c in REJECT_CODES {
            assert!(!RETRY_CODES.contains(c), "{c} in both lists");
        }
    }
}
