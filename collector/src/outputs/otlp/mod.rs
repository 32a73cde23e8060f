//! OTLP/HTTP output (`outputs.otlp`): the agents' samples and log records to an
//! OpenTelemetry receiver (OpenTelemetry protocol specification 1.x, "OTLP/HTTP"): binary
//! protobuf (`Content-Type: application/x-protobuf`), gzip (`Content-Encoding: gzip`,
//! `outputs.otlp.compression`), `POST <endpoint>/v1/metrics` and `<endpoint>/v1/logs`,
//! each signal optional (`outputs.otlp.metrics`, `outputs.otlp.logs`).
//!
//! What is sent, field by field, is the `encode` module's documentation: one resource per
//! agent (`host.name`, `service.instance.id` = agent id, the configured
//! `resource_attributes`), counters as cumulative monotonic sums, gauges as gauges,
//! histograms as cumulative explicit-bucket histograms, log records with their own time,
//! severity number and text, body and fields as attributes.
//!
//! Each signal has its own bounded queue (`queue`; the worker thread only appends) and
//! sender task (`sender`: the loop every asynchronous output shares, with the OTLP/HTTP
//! retry rules and partial success). Every item (a data point, a log record) is sent or
//! counted dropped by reason ([`metrics::Dropped`]), so that per signal
//! `items_in = items_sent + Σ items_dropped + items_pending` at every scrape
//! ([`metrics`]). Headers, basic auth or a bearer token from files, and TLS are the same
//! as remote-write's (`outputs::http`).

pub mod encode;
pub mod metrics;
pub mod proto;
mod queue;
mod sender;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus::core::{Collector, Desc};
use uctel_common::shutdown::Shutdown;
use uctel_protocol::borrowed::MetricBatchView;
use uctel_protocol::payload::LogRecord;

use self::encode::{Agent, Point, Record, Shape};
use self::metrics::{Dropped, Families, Snapshot};
use self::queue::Queue;
use self::sender::{SignalItem, Target};
use super::config::OtlpConfig;
use super::handover::{self, lock, Lifetime, Replacement, Slot, SlotEndpoint, Task};
use super::http::{self, SetupError};
use crate::config::outputs::OtlpCompression;
use crate::logsink::LogContext;

/// Longest a stopping collector waits for the senders to send what is queued.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The output as the worker sees it (cheap to clone); disabled unless configured (at start,
/// or by a reload: `Otlp::prepare`).
#[derive(Debug, Clone, Default)]
pub struct Otlp {
    slot: Arc<Slot<Endpoint>>,
    /// What a reload needs to build endpoints (`None`: built without a runtime, tests).
    context: Option<Arc<Context>>,
}

/// The running output: the worker-side handle and its tasks.
#[derive(Debug)]
pub struct Started {
    /// The handle the outputs push through.
    pub handle: Otlp,
    /// The sender and report tasks (they end after `shutdown` fires and the grace period).
    pub tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Otlp {
    /// True when metrics are sent.
    pub fn sends_metrics(&self) -> bool {
        self.slot
            .read()
            .as_ref()
            .is_some_and(|e| e.metrics.is_some())
    }

    /// Queues one data point per sample of a metrics frame of `agent` (hostname
    /// `instance`; `frame_timestamp_ns`: the frame's time, for samples without their own)
    /// for the endpoint in force (`crate::outputs::handover` across a reload).
    pub fn push_metrics(
        &self,
        agent: &str,
        instance: &str,
        frame_timestamp_ns: u64,
        batch: &MetricBatchView<'_>,
    ) {
        if batch.is_empty() {
            return;
        }
        // Held while pushing: a reload's swap waits for it.
        let current = self.slot.read();
        let Some(q) = current.as_ref().and_then(|e| e.metrics.as_ref()) else {
            return;
        };
        let agent = Arc::new(Agent {
            id: agent.to_owned(),
            instance: instance.to_owned(),
        });
        let points: Vec<Point> = batch
            .iter()
            .map(|m| Point {
                agent: agent.clone(),
                metric: encode::metric(&m, frame_timestamp_ns),
            })
            .collect();
        q.queue.push(points, Instant::now());
    }

    /// Queues one record per log record of a frame from `ctx`.
    pub fn push_logs(&self, ctx: &LogContext<'_>, records: &[LogRecord]) {
        if records.is_empty() {
            return;
        }
        let current = self.slot.read();
        let Some(q) = current.as_ref().and_then(|e| e.logs.as_ref()) else {
            return;
        };
        let agent = Arc::new(Agent {
            id: ctx.agent.to_owned(),
            instance: ctx.instance.to_owned(),
        });
        let records: Vec<Record> = records
            .iter()
            .map(|r| Record {
                agent: agent.clone(),
                record: encode::log_record(ctx, r),
            })
            .collect();
        q.queue.push(records, Instant::now());
    }

    /// Counts every item still queued as dropped at shutdown (call after the senders and
    /// the data plane stopped, and after [`Otlp::join`]). Returns how many.
    pub fn close(&self) -> usize {
        self.slot
            .get()
            .map_or(0, |e| e.drop_queued(Dropped::Shutdown))
    }

    /// The counters of each configured signal now (`metrics`, then `logs`).
    pub fn snapshots(&self) -> (Option<Snapshot>, Option<Snapshot>) {
        let Some(e) = self.slot.get() else {
            return (None, None);
        };
        (
            e.metrics.as_ref().map(|s| {
                let _st = s.queue.lock();
                s.queue.counters.snapshot()
            }),
            e.logs.as_ref().map(|s| {
                let _st = s.queue.lock();
                s.queue.counters.snapshot()
            }),
        )
    }

    /// Builds what puts `config` in force (a reload, `crate::reload`), as
    /// `ClickHouse::prepare` does: nothing changes until the replacement is committed;
    /// then the endpoint in force (both signals) drains within its grace period and counts
    /// what is left `reason="reload"`, and the new one takes every item from the swap on
    /// (`crate::outputs::handover`). `None` when `config` is the one in force.
    ///
    /// # Errors
    /// [`SetupError`] as [`start`].
    pub(crate) fn prepare(
        &self,
        config: Option<&OtlpConfig>,
    ) -> Result<Option<(Replacement<Endpoint>, String)>, SetupError> {
        self.slot.prepare(self.context.as_ref(), config)
    }

    /// Waits for the tasks reloads started, once the collector's shutdown fired.
    pub async fn join(&self) {
        self.slot.join().await;
        if let Some(c) = self.context.as_ref() {
            let reports = std::mem::take(&mut *lock(&c.reports));
            for t in reports {
                let _ = t.await;
            }
        }
    }
}

/// One signal of an endpoint: its queue and where it is sent.
#[derive(Debug)]
struct Signal<T> {
    queue: Arc<Queue<T>>,
    target: Arc<Target>,
}

impl<T: SignalItem> Signal<T> {
    /// The signal's empty queue (counting in `families`) and `target`.
    fn new(c: &OtlpConfig, families: &Families, target: Arc<Target>) -> Signal<T> {
        Signal {
            queue: Arc::new(Queue::new(
                T::SIGNAL,
                c.queue_capacity_items as usize,
                c.max_items_per_request as usize,
                families.signal(T::SIGNAL),
            )),
            target,
        }
    }
}

/// One configured OTLP endpoint: its signals and its tasks.
#[derive(Debug)]
pub(crate) struct Endpoint {
    metrics: Option<Signal<Point>>,
    logs: Option<Signal<Record>>,
    config: OtlpConfig,
    /// `endpoint` without credentials.
    label: String,
    life: Lifetime,
}

impl Endpoint {
    /// Drops what both signals still hold for `reason`; how many.
    fn drop_queued(&self, reason: Dropped) -> usize {
        let why = match reason {
            Dropped::Reload => "queued for an endpoint a reload retired, not sent in time",
            _ => "still queued when the collector stopped",
        };
        self.metrics
            .as_ref()
            .map_or(0, |s| s.queue.drop_queued(reason, why))
            + self
                .logs
                .as_ref()
                .map_or(0, |s| s.queue.drop_queued(reason, why))
    }
}

/// What building and starting an endpoint needs, kept for reloads.
pub(crate) struct Context {
    registry: prometheus::Registry,
    /// The families, registered on first use (shared by every endpoint: each signal's
    /// counters are the same series whichever endpoint counts in them).
    families: Mutex<Option<Families>>,
    /// The endpoints whose queues count in the families now (the scrape holds their locks).
    active: Arc<Mutex<Vec<Arc<Endpoint>>>>,
    /// The endpoint in force, for the report's lines.
    slot: std::sync::Weak<Slot<Endpoint>>,
    shutdown: Shutdown,
    runtime: Option<tokio::runtime::Handle>,
    /// One report task per signal, started with the first endpoint that sends it.
    reports: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// The signals whose report runs.
    reported: Mutex<Vec<&'static str>>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").finish_non_exhaustive()
    }
}

impl Context {
    /// The families, registered on first use.
    fn families(&self) -> Result<Families, SetupError> {
        handover::registered(
            &self.families,
            &self.registry,
            Endpoint::KEY,
            Families::new,
            |f| Box::new(LockedCollector::new(f, self.active.clone())),
        )
    }

    /// Builds the endpoint of `c` (nothing started, nothing counted yet).
    fn endpoint(&self, c: &OtlpConfig) -> Result<Arc<Endpoint>, SetupError> {
        let prefix = "outputs.otlp";
        let headers = http::header_map(
            prefix,
            c.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        )?;
        let auth = http::authorization(
            prefix,
            c.basic_auth.as_ref(),
            c.bearer_token_file.as_deref(),
        )?;
        let client = http::client(
            prefix,
            c.timeout(),
            &c.tls,
            http::with_authorization(headers, auth),
        )?;
        let shape = Shape {
            resource_attributes: c
                .resource_attributes
                .iter()
                .map(|(k, v)| proto::KeyValue::string(k, v))
                .collect(),
            gzip: c.compression == OtlpCompression::Gzip,
        };
        let target = |signal: &str| -> Result<Arc<Target>, SetupError> {
            let url = c.signal_url(signal);
            Ok(Arc::new(Target {
                client: client.clone(),
                url: reqwest::Url::parse(&url).map_err(|e| SetupError::Invalid {
                    key: format!("{prefix}.endpoint"),
                    message: e.to_string(),
                })?,
                label: http::redact(&url),
                shape: shape.clone(),
                deadline: c.batch_deadline(),
                backoff: c.backoff(),
                grace: SHUTDOWN_GRACE.min(c.timeout()),
                retired: AtomicBool::new(false),
            }))
        };
        let families = self.families()?;
        let metrics = if c.metrics {
            Some(Signal::new(c, &families, target("metrics")?))
        } else {
            None
        };
        let logs = if c.logs {
            Some(Signal::new(c, &families, target("logs")?))
        } else {
            None
        };
        Ok(Arc::new(Endpoint {
            metrics,
            logs,
            config: c.clone(),
            label: http::redact(&c.endpoint),
            life: Lifetime::default(),
        }))
    }

    /// Starts the report of `signal` unless it runs (one per signal for the output's
    /// life: the counters are the output's, not an endpoint's).
    fn report<T: SignalItem>(&self, queue: &Arc<Queue<T>>, grace: Duration) {
        let Some(runtime) = self.runtime.as_ref() else {
            return;
        };
        let mut reported = lock(&self.reported);
        if reported.contains(&T::SIGNAL) {
            return;
        }
        reported.push(T::SIGNAL);
        let counters = queue.counters.clone();
        let read = move || {
            let s = counters.snapshot();
            crate::outputs::report::Tally {
                delivered: s.sent,
                retried: s.retried,
                pending: u64::try_from(s.pending).unwrap_or(0),
                given_up: Dropped::ALL
                    .iter()
                    .map(|r| (r.as_str(), s.dropped_for(*r)))
                    .collect(),
            }
        };
        let slot = self.slot.clone();
        let url = move || {
            slot.upgrade().and_then(|s| s.get()).map_or_else(
                || "(none)".to_owned(),
                |e| http::redact(&e.config.signal_url(T::SIGNAL)),
            )
        };
        let what = if T::SIGNAL == "metrics" {
            "OTLP metrics"
        } else {
            "OTLP logs"
        };
        lock(&self.reports).push(runtime.spawn(crate::outputs::report::run(
            what,
            url,
            T::ITEMS,
            read,
            grace,
            self.shutdown.clone(),
        )));
    }
}

impl SlotEndpoint for Endpoint {
    type Config = OtlpConfig;
    const KEY: &'static str = "outputs.otlp";
    const NAME: &'static str = "OTLP";

    fn runtime(ctx: &Context) -> Option<&tokio::runtime::Handle> {
        ctx.runtime.as_ref()
    }

    fn build(ctx: &Context, config: &OtlpConfig) -> Result<Arc<Endpoint>, SetupError> {
        ctx.endpoint(config)
    }

    fn config(&self) -> &OtlpConfig {
        &self.config
    }

    fn label(&self) -> String {
        self.label.clone()
    }
}

impl handover::Endpoint for Endpoint {
    type Context = Context;

    fn lifetime(&self) -> &Lifetime {
        &self.life
    }

    fn start(&self, ctx: &Context) -> Option<tokio::task::JoinHandle<()>> {
        let runtime = ctx.runtime.as_ref()?;
        if let Some(s) = &self.metrics {
            ctx.report(&s.queue, s.target.grace);
        }
        if let Some(s) = &self.logs {
            ctx.report(&s.queue, s.target.grace);
        }
        let metrics = self
            .metrics
            .as_ref()
            .map(|s| (s.target.clone(), s.queue.clone()));
        let logs = self
            .logs
            .as_ref()
            .map(|s| (s.target.clone(), s.queue.clone()));
        let started = self.life.spawn(runtime, &ctx.shutdown, |stopped| {
            let mut tasks: Vec<Task> = Vec::new();
            if let Some((t, q)) = metrics {
                tasks.push(Box::pin(sender::run(t, q, stopped.clone())));
            }
            if let Some((t, q)) = logs {
                tasks.push(Box::pin(sender::run(t, q, stopped)));
            }
            tasks
        })?;
        tracing::info!(
            endpoint = %self.label,
            metrics = self.config.metrics,
            logs = self.config.logs,
            "OTLP output started"
        );
        Some(started)
    }

    fn activate(self: &Arc<Self>, ctx: &Context) {
        lock(&ctx.active).push(self.clone());
    }

    fn retire(&self) {
        for t in [
            self.metrics.as_ref().map(|s| &s.target),
            self.logs.as_ref().map(|s| &s.target),
        ]
        .into_iter()
        .flatten()
        {
            t.retired.store(true, Ordering::Release);
        }
        self.life.retire();
    }

    fn retired(&self, ctx: &Context, _replaced: bool) {
        // The senders settled what they held; anything pushed since is counted here.
        let left = self.drop_queued(Dropped::Reload);
        lock(&ctx.active).retain(|e| !std::ptr::eq(&**e, self));
        tracing::info!(
            endpoint = %self.label,
            dropped_at_reload = left,
            "OTLP endpoint retired by a reload"
        );
    }
}

/// Starts the output if configured: registers its self-metrics in `registry` (the
/// collector's telemetry registry) and spawns a sender per signal on the current tokio
/// runtime. Outside a runtime the output can be neither started nor changed by a reload.
///
/// # Errors
/// [`SetupError`] for an unreadable secret or CA file or an invalid header or URL; a
/// `prometheus` registration error as [`SetupError::Invalid`].
pub fn start(
    config: Option<&OtlpConfig>,
    registry: &prometheus::Registry,
    shutdown: &Shutdown,
) -> Result<Started, SetupError> {
    let slot: Arc<Slot<Endpoint>> = Arc::default();
    let context = Arc::new(Context {
        registry: registry.clone(),
        families: Mutex::default(),
        active: Arc::default(),
        slot: Arc::downgrade(&slot),
        shutdown: shutdown.clone(),
        runtime: tokio::runtime::Handle::try_current().ok(),
        reports: Mutex::default(),
        reported: Mutex::default(),
    });
    let handle = Otlp {
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
    tasks.append(&mut lock(&context.reports));
    Ok(Started { handle, tasks })
}

/// The collector registered for the output: holds the queue locks of every endpoint that
/// counts in the families (and the list of them, so that none joins meanwhile) while the
/// counters are read, so a scrape sees the figures of one instant.
#[derive(Debug)]
struct LockedCollector {
    families: Families,
    active: Arc<Mutex<Vec<Arc<Endpoint>>>>,
    descs: Vec<Desc>,
}

impl LockedCollector {
    fn new(families: Families, active: Arc<Mutex<Vec<Arc<Endpoint>>>>) -> LockedCollector {
        let descs = families
            .collectors()
            .iter()
            .flat_map(|c| c.desc().into_iter().cloned())
            .collect();
        LockedCollector {
            families,
            active,
            descs,
        }
    }
}

impl Collector for LockedCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        let now = Instant::now();
        let active = lock(&self.active);
        let m: Vec<_> = active
            .iter()
            .filter_map(|e| e.metrics.as_ref())
            .map(|s| (s, s.queue.lock()))
            .collect();
        let l: Vec<_> = active
            .iter()
            .filter_map(|e| e.logs.as_ref())
            .map(|s| (s, s.queue.lock()))
            .collect();
        // The oldest item of a signal across the endpoints that hold some.
        let oldest = |ages: &mut dyn Iterator<Item = f64>| ages.fold(0.0_f64, f64::max);
        if let Some((s, _)) = m.first() {
            let age = oldest(&mut m.iter().map(|(_, st)| Queue::oldest_age(st, now)));
            s.queue.counters.oldest.set(age);
        }
        if let Some((s, _)) = l.first() {
            let age = oldest(&mut l.iter().map(|(_, st)| Queue::oldest_age(st, now)));
            s.queue.counters.oldest.set(age);
        }
        let out = self
            .families
            .collectors()
            .iter()
            .flat_map(|c| c.collect())
            .collect();
        drop((m, l));
        out
    }
}
