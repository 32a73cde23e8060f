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

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus::core::{Collector, Desc};
use prometheus::proto;
use uctel_common::shutdown::Shutdown;
use uctel_protocol::payload::LogRecord;

use self::metrics::{Counters, Dropped, Snapshot};
use self::queue::{Queue, Row};
use self::sender::Target;
use super::config::ClickHouseConfig;
use super::handover::{self, lock, Lifetime, Replacement, Slot, SlotEndpoint, Task};
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

/// The output as the worker sees it (cheap to clone); disabled unless configured (at start,
/// or by a reload: `ClickHouse::prepare`).
#[derive(Debug, Clone, Default)]
pub struct ClickHouse {
    slot: Arc<Slot<Endpoint>>,
    /// What a reload needs to build endpoints (`None`: built without a runtime, tests).
    context: Option<Arc<Context>>,
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
        self.slot.read().is_some()
    }

    /// Queues one row per record of a frame from `ctx` for the endpoint in force (never
    /// waits on the network; `crate::outputs::handover` for what "in force" means across a
    /// reload).
    pub fn push(&self, ctx: &LogContext<'_>, records: &[LogRecord]) {
        if records.is_empty() {
            return;
        }
        // Held while pushing: a reload's swap waits for it.
        let current = self.slot.read();
        let Some(e) = current.as_ref() else {
            return;
        };
        let agent: Arc<str> = Arc::from(ctx.agent);
        let rows = records.iter().map(|r| Row {
            agent: agent.clone(),
            json: row::encode(&LogLine::new(ctx, r)).into_boxed_slice(),
        });
        let rows: Vec<Row> = rows.collect();
        e.queue.push(rows, Instant::now());
    }

    /// Counts every row still queued as dropped at shutdown (call after the sender and the
    /// data plane stopped, and after [`ClickHouse::join`]). Returns how many.
    pub fn close(&self) -> usize {
        self.slot.get().map_or(0, |e| {
            e.queue
                .drop_queued(Dropped::Shutdown, "still queued when the collector stopped")
        })
    }

    /// The counters now (`None` when not configured).
    pub fn snapshot(&self) -> Option<Snapshot> {
        self.slot.get().map(|e| {
            let _st = e.queue.lock();
            e.queue.counters.snapshot()
        })
    }

    /// Builds what puts `config` in force (a reload, `crate::reload`); nothing changes
    /// until the replacement is committed. `None` when `config` is the one in force. Once
    /// committed, the endpoint in force (if any) is retired (it sends what it holds within
    /// its grace period, the rest is counted `reason="reload"`) and the new one (if any)
    /// takes every row from the swap on, sending once the old one has finished
    /// (`crate::outputs::handover`). The line says what changes.
    ///
    /// # Errors
    /// [`SetupError`] as [`start`].
    pub(crate) fn prepare(
        &self,
        config: Option<&ClickHouseConfig>,
    ) -> Result<Option<(Replacement<Endpoint>, String)>, SetupError> {
        self.slot.prepare(self.context.as_ref(), config)
    }

    /// Waits for the tasks reloads started (endpoints added or changed, the retiring of
    /// those removed or changed), once the collector's shutdown fired.
    pub async fn join(&self) {
        self.slot.join().await;
        let report = self.context.as_ref().and_then(|c| lock(&c.report).take());
        if let Some(t) = report {
            let _ = t.await;
        }
    }
}

/// One configured ClickHouse endpoint: its queue, where it inserts, its tasks.
#[derive(Debug)]
pub(crate) struct Endpoint {
    queue: Arc<Queue>,
    target: Arc<Target>,
    config: ClickHouseConfig,
    life: Lifetime,
}

/// What building and starting an endpoint needs, kept for reloads.
pub(crate) struct Context {
    registry: prometheus::Registry,
    /// The output's counters, shared by every endpoint it has had; registered (with the
    /// output's report task) on first use.
    counters: Mutex<Option<Arc<Counters>>>,
    /// The queues that count in the counters now (the scrape holds their locks).
    queues: Arc<Mutex<Vec<Arc<Queue>>>>,
    /// The endpoint in force, for the report's lines.
    slot: std::sync::Weak<Slot<Endpoint>>,
    shutdown: Shutdown,
    runtime: Option<tokio::runtime::Handle>,
    /// The output's report task, started with the counters.
    report: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").finish_non_exhaustive()
    }
}

impl Context {
    /// The counters, registered on first use.
    fn counters(&self) -> Result<Arc<Counters>, SetupError> {
        handover::registered(
            &self.counters,
            &self.registry,
            Endpoint::KEY,
            || Counters::new().map(Arc::new),
            |c| Box::new(LockedCollector::new(c, self.queues.clone())),
        )
    }

    /// Starts the output's report (its counters are the output's, not an endpoint's: one
    /// report for the output's life, naming the endpoint in force) unless it runs.
    fn report(&self, counters: &Arc<Counters>, grace: Duration) {
        let Some(runtime) = self.runtime.as_ref() else {
            return;
        };
        let mut report = lock(&self.report);
        if report.is_some() {
            return;
        }
        let c = counters.clone();
        let read = move || {
            let s = c.snapshot();
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
                            Dropped::Reload => s.reload,
                        };
                        (r.as_str(), n)
                    })
                    .collect(),
            }
        };
        let slot = self.slot.clone();
        let url = move || {
            slot.upgrade()
                .and_then(|s| s.get())
                .map_or_else(|| "(none)".to_owned(), |e| e.target.label.clone())
        };
        *report = Some(runtime.spawn(crate::outputs::report::run(
            "ClickHouse",
            url,
            "rows",
            read,
            grace,
            self.shutdown.clone(),
        )));
    }

    /// Builds the endpoint of `c` (nothing started, nothing counted yet).
    fn endpoint(&self, c: &ClickHouseConfig) -> Result<Arc<Endpoint>, SetupError> {
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
        let base = reqwest::Url::parse(&c.url).map_err(|e| SetupError::Invalid {
            key: "outputs.clickhouse.url".into(),
            message: e.to_string(),
        })?;
        let grace = SHUTDOWN_GRACE.min(c.timeout());
        let counters = self.counters()?;
        let queue = Arc::new(Queue::new(
            c.queue_capacity_rows as usize,
            c.max_rows_per_insert as usize,
            counters,
        ));
        let target = Arc::new(Target {
            client,
            url,
            base,
            label: http::redact(&c.url),
            table: table_name(c),
            deadline: c.batch_deadline(),
            backoff: c.backoff(),
            grace,
            retired: AtomicBool::new(false),
        });
        Ok(Arc::new(Endpoint {
            queue,
            target,
            config: c.clone(),
            life: Lifetime::default(),
        }))
    }
}

impl SlotEndpoint for Endpoint {
    type Config = ClickHouseConfig;
    const KEY: &'static str = "outputs.clickhouse";
    const NAME: &'static str = "ClickHouse";

    fn runtime(ctx: &Context) -> Option<&tokio::runtime::Handle> {
        ctx.runtime.as_ref()
    }

    fn build(ctx: &Context, config: &ClickHouseConfig) -> Result<Arc<Endpoint>, SetupError> {
        ctx.endpoint(config)
    }

    fn config(&self) -> &ClickHouseConfig {
        &self.config
    }

    fn label(&self) -> String {
        format!("{} ({})", self.target.label, self.target.table)
    }
}

impl handover::Endpoint for Endpoint {
    type Context = Context;

    fn lifetime(&self) -> &Lifetime {
        &self.life
    }

    fn start(&self, ctx: &Context) -> Option<tokio::task::JoinHandle<()>> {
        let runtime = ctx.runtime.as_ref()?;
        ctx.report(&self.queue.counters, self.target.grace);
        let (target, queue) = (self.target.clone(), self.queue.clone());
        let started = self.life.spawn(runtime, &ctx.shutdown, |stopped| {
            let sender: Task = Box::pin(sender::run(target, queue, stopped));
            vec![sender]
        })?;
        tracing::info!(url = %self.target.label, table = %self.target.table, "ClickHouse log output started");
        Some(started)
    }

    fn activate(self: &Arc<Self>, ctx: &Context) {
        lock(&ctx.queues).push(self.queue.clone());
    }

    fn retire(&self) {
        self.target.retired.store(true, Ordering::Release);
        self.life.retire();
    }

    fn retired(&self, ctx: &Context, _replaced: bool) {
        // The sender settled what it held; anything pushed since is counted here.
        let left = self.queue.drop_queued(
            Dropped::Reload,
            "queued for an endpoint a reload retired, not sent within its grace period",
        );
        lock(&ctx.queues).retain(|q| !Arc::ptr_eq(q, &self.queue));
        tracing::info!(
            url = %self.target.label,
            table = %self.target.table,
            dropped_at_reload = left,
            "ClickHouse endpoint retired by a reload"
        );
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
/// and spawns the sender on the current tokio runtime. Outside a runtime the output can be
/// neither started nor changed by a reload.
///
/// # Errors
/// [`SetupError`] for an unreadable password or CA file; a `prometheus` registration error
/// as [`SetupError::Invalid`].
pub fn start(
    config: Option<&ClickHouseConfig>,
    telemetry: &Telemetry,
    shutdown: &Shutdown,
) -> Result<Started, SetupError> {
    let slot: Arc<Slot<Endpoint>> = Arc::default();
    let context = Arc::new(Context {
        registry: telemetry.registry().clone(),
        counters: Mutex::default(),
        queues: Arc::default(),
        slot: Arc::downgrade(&slot),
        shutdown: shutdown.clone(),
        runtime: tokio::runtime::Handle::try_current().ok(),
        report: Mutex::default(),
    });
    let handle = ClickHouse {
        slot,
        context: Some(context.clone()),
    };
    let Some(c) = config else {
        return Ok(Started {
            handle,
            tasks: Vec::new(),
        });
    };
    let mut tasks = handle.slot.start(&context, c)?;
    tasks.extend(lock(&context.report).take());
    Ok(Started { handle, tasks })
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

/// The collector registered for the output: holds the lock of every queue that counts in
/// its counters while they are read (and the list of them, so that no queue joins
/// meanwhile), so a scrape sees the figures of one instant.
#[derive(Debug)]
pub(crate) struct LockedCollector {
    counters: Arc<Counters>,
    queues: Arc<Mutex<Vec<Arc<Queue>>>>,
    descs: Vec<Desc>,
}

impl LockedCollector {
    pub(crate) fn new(counters: Arc<Counters>, queues: Arc<Mutex<Vec<Arc<Queue>>>>) -> Self {
        let descs = counters
            .collectors()
            .iter()
            .flat_map(|c| c.desc().into_iter().cloned())
            .collect();
        LockedCollector {
            counters,
            queues,
            descs,
        }
    }
}

impl Collector for LockedCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<proto::MetricFamily> {
        let queues = lock(&self.queues);
        let _guards: Vec<_> = queues.iter().map(|q| q.lock()).collect();
        self.counters
            .collectors()
            .iter()
            .flat_map(|c| c.collect())
            .collect()
    }
}

#[cfg(test)]
mod tests;
