//! ClickHouse log output (`outputs.clickhouse`): every log record the log sink gets, also
//! as a row of a ClickHouse table, over ClickHouse's HTTP interface
//! (`POST /?query=INSERT INTO <database>.<table> FORMAT JSONEachRow`).
//!
//! The table is [`SCHEMA`] (`config/clickhouse/logs.sql`, `--print-clickhouse-schema`):
//! one column per field of the JSON Lines sink ([`row`]). The worker thread only appends
//! rows to a bounded `queue`; one `sender` task batches them by count
//! (`max_rows_per_insert`) and deadline (`batch_send_deadline_seconds`), sends, and retries
//! with backoff. Every row is inserted or counted dropped, by reason ([`metrics`]).
//! Delivery is exactly once: after a failure that leaves open whether the server applied an
//! `INSERT`, the sender asks whether its rows landed before it sends them again (`sender`
//! module docs).

pub mod metrics;
mod queue;
pub mod row;
pub mod sender;

use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus::core::{Collector, Desc};
use prometheus::proto;
use uctel_common::shutdown::Shutdown;
use uctel_protocol::payload::LogRecord;

use self::metrics::{Counters, Dropped, Snapshot};
use self::queue::{Queue, Row};
use self::sender::Target;
use super::config::ClickHouseConfig;
use super::http::{self, SetupError};
use crate::logsink::{LogContext, LogLine};
use crate::telemetry::Telemetry;

/// The table's `CREATE TABLE` statement (`config/clickhouse/logs.sql`).
pub const SCHEMA: &str = include_str!("../../../../config/clickhouse/logs.sql");

/// The table's `CREATE TABLE` statement for ClickHouse 22.3 and later
/// (`config/clickhouse/logs-modern.sql`): the same columns plus a nanosecond `DateTime64(9)`
/// computed from `ts_ns`, `LowCardinality` strings, a 30-day TTL and block deduplication
/// (`non_replicated_deduplication_window`).
pub const SCHEMA_MODERN: &str = include_str!("../../../../config/clickhouse/logs-modern.sql");

/// The schema for a server of `version` (`"18.16"`, `"26"`, `"26.9.2.1"`: the major number
/// decides): [`SCHEMA_MODERN`] from 22 on, [`SCHEMA`] before.
///
/// # Errors
/// A message when `version` does not start with a number.
pub fn schema_for(version: &str) -> Result<&'static str, String> {
    let major = version.split('.').next().unwrap_or_default();
    match major.trim().parse::<u32>() {
        Ok(m) if m >= 22 => Ok(SCHEMA_MODERN),
        Ok(_) => Ok(SCHEMA),
        Err(_) => Err(format!(
            "--server-version {version:?}: expected a ClickHouse version such as 18.16 or 26.9"
        )),
    }
}

/// Longest a stopping collector waits for the sender to send what is queued.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The output as the worker sees it (cheap to clone); disabled unless configured.
#[derive(Debug, Clone, Default)]
pub struct ClickHouse {
    queue: Option<Arc<Queue>>,
}

/// The running output: the worker-side handle and the sender task.
#[derive(Debug)]
pub struct Started {
    /// The handle the outputs push through.
    pub handle: ClickHouse,
    /// The sender task (it ends after `shutdown` fires and the grace period).
    pub tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl ClickHouse {
    /// True when configured.
    pub fn is_enabled(&self) -> bool {
        self.queue.is_some()
    }

    /// Queues one row per record of a frame from `ctx` (never waits on the network).
    pub fn push(&self, ctx: &LogContext<'_>, records: &[LogRecord]) {
        let Some(q) = &self.queue else {
            return;
        };
        if records.is_empty() {
            return;
        }
        let agent: Arc<str> = Arc::from(ctx.agent);
        let rows = records.iter().map(|r| Row {
            agent: agent.clone(),
            json: row::encode(&LogLine::new(ctx, r)).into_boxed_slice(),
        });
        let rows: Vec<Row> = rows.collect();
        q.push(rows, Instant::now());
    }

    /// Counts every row still queued as dropped at shutdown (call after the sender and the
    /// data plane stopped). Returns how many.
    pub fn close(&self) -> usize {
        self.queue.as_ref().map_or(0, |q| {
            q.drop_queued(Dropped::Shutdown, "still queued when the collector stopped")
        })
    }

    /// The counters now (`None` when not configured).
    pub fn snapshot(&self) -> Option<Snapshot> {
        self.queue.as_ref().map(|q| {
            let _st = q.lock();
            q.counters.snapshot()
        })
    }
}

/// The `INSERT` URL: `config.url` with the query (and the URL's own parameters kept).
///
/// # Errors
/// [`SetupError::Invalid`] when the URL does not parse.
pub fn insert_url(config: &ClickHouseConfig) -> Result<reqwest::Url, SetupError> {
    let mut url = reqwest::Url::parse(&config.url).map_err(|e| SetupError::Invalid {
        key: "outputs.clickhouse.url".into(),
        message: e.to_string(),
    })?;
    url.query_pairs_mut().append_pair(
        "query",
        &format!("INSERT INTO {} FORMAT JSONEachRow", table_name(config)),
    );
    Ok(url)
}

/// `database.table`, or `table` without a database.
fn table_name(config: &ClickHouseConfig) -> String {
    match &config.database {
        Some(db) => format!("{db}.{}", config.table),
        None => config.table.clone(),
    }
}

/// Starts the output if configured: registers its self-metrics in `telemetry`'s registry
/// and spawns the sender on the current tokio runtime.
///
/// # Errors
/// [`SetupError`] for an unreadable password or CA file; a `prometheus` registration error
/// as [`SetupError::Invalid`].
pub fn start(
    config: Option<&ClickHouseConfig>,
    telemetry: &Telemetry,
    shutdown: &Shutdown,
) -> Result<Started, SetupError> {
    let Some(c) = config else {
        return Ok(Started {
            handle: ClickHouse::default(),
            tasks: Vec::new(),
        });
    };
    let prefix = "outputs.clickhouse";
    let url = insert_url(c)?;
    let auth = match &c.user {
        Some(user) => {
            let password = match &c.password_file {
                Some(f) => http::read_secret(&format!("{prefix}.password_file"), f)?,
                None => String::new(),
            };
            Some(basic(prefix, user, &password)?)
        }
        None => None,
    };
    let client = http::client(
        prefix,
        c.timeout(),
        &c.tls,
        http::with_authorization(reqwest::header::HeaderMap::new(), auth),
    )?;
    let registration = |e: prometheus::Error| SetupError::Invalid {
        key: prefix.into(),
        message: format!("self-metrics: {e}"),
    };
    let counters = Counters::new().map_err(registration)?;
    let queue = Arc::new(Queue::new(
        c.queue_capacity_rows as usize,
        c.max_rows_per_insert as usize,
        counters,
    ));
    telemetry
        .registry()
        .register(Box::new(LockedCollector::new(queue.clone())))
        .map_err(registration)?;
    let label = http::redact(&c.url);
    let base = reqwest::Url::parse(&c.url).map_err(|e| SetupError::Invalid {
        key: "outputs.clickhouse.url".into(),
        message: e.to_string(),
    })?;
    let target = Arc::new(Target {
        client,
        url,
        base,
        label: label.clone(),
        table: table_name(c),
        deadline: c.batch_deadline(),
        backoff: c.backoff(),
        grace: SHUTDOWN_GRACE.min(c.timeout()),
    });
    let report = {
        let q = queue.clone();
        move || {
            let s = q.counters.snapshot();
            crate::outputs::report::Tally {
                delivered: s.inserted,
                retried: s.retried,
                pending: u64::try_from(s.pending).unwrap_or(0),
                given_up: Dropped::ALL
                    .iter()
                    .map(|r| {
                        let n = match r {
                            Dropped::Rejected => s.rejected,
                            Dropped::QueueFull => s.queue_full,
                            Dropped::Shutdown => s.shutdown,
                        };
                        (r.as_str(), n)
                    })
                    .collect(),
            }
        }
    };
    let tasks = vec![
        tokio::spawn(crate::outputs::report::run(
            "ClickHouse",
            label.clone(),
            "rows",
            report,
            target.grace,
            shutdown.clone(),
        )),
        tokio::spawn(sender::run(target, queue.clone(), shutdown.clone())),
    ];
    tracing::info!(url = %label, table = %table_name(c), "ClickHouse log output started");
    Ok(Started {
        handle: ClickHouse { queue: Some(queue) },
        tasks,
    })
}

/// `Authorization: Basic …` of `user` and `password`.
fn basic(
    prefix: &str,
    user: &str,
    password: &str,
) -> Result<reqwest::header::HeaderValue, SetupError> {
    use base64::Engine as _;
    let v = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    );
    let mut h = reqwest::header::HeaderValue::from_str(&v).map_err(|_| SetupError::Invalid {
        key: prefix.to_owned(),
        message: "the credentials hold bytes not allowed in an HTTP header".into(),
    })?;
    h.set_sensitive(true);
    Ok(h)
}

/// The collector registered for the output: holds the queue lock while the counters are
/// read, so a scrape sees the figures of one instant.
#[derive(Debug)]
pub(crate) struct LockedCollector {
    queue: Arc<Queue>,
    descs: Vec<Desc>,
}

impl LockedCollector {
    pub(crate) fn new(queue: Arc<Queue>) -> LockedCollector {
        let descs = queue
            .counters
            .collectors()
            .iter()
            .flat_map(|c| c.desc().into_iter().cloned())
            .collect();
        LockedCollector { queue, descs }
    }
}

impl Collector for LockedCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<proto::MetricFamily> {
        let _guard = self.queue.lock();
        self.queue
            .counters
            .collectors()
            .iter()
            .flat_map(|c| c.collect())
            .collect()
    }
}

#[cfg(test)]
mod tests;
