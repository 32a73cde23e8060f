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

use std::sync::Arc;
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
use super::http::{self, SetupError};
use crate::config::outputs::OtlpCompression;
use crate::logsink::LogContext;

/// Longest a stopping collector waits for the senders to send what is queued.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The output as the worker sees it (cheap to clone); disabled unless configured.
#[derive(Debug, Clone, Default)]
pub struct Otlp {
    metrics: Option<Arc<Queue<Point>>>,
    logs: Option<Arc<Queue<Record>>>,
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
        self.metrics.is_some()
    }

    /// Queues one data point per sample of a metrics frame of `agent` (hostname
    /// `instance`; `frame_timestamp_ns`: the frame's time, for samples without their own).
    pub fn push_metrics(
        &self,
        agent: &str,
        instance: &str,
        frame_timestamp_ns: u64,
        batch: &MetricBatchView<'_>,
    ) {
        let Some(q) = &self.metrics else {
            return;
        };
        if batch.is_empty() {
            return;
        }
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
        q.push(points, Instant::now());
    }

    /// Queues one record per log record of a frame from `ctx`.
    pub fn push_logs(&self, ctx: &LogContext<'_>, records: &[LogRecord]) {
        let Some(q) = &self.logs else {
            return;
        };
        if records.is_empty() {
            return;
        }
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
        q.push(records, Instant::now());
    }

    /// Counts every item still queued as dropped at shutdown (call after the senders and
    /// the data plane stopped). Returns how many.
    pub fn close(&self) -> usize {
        let why = "still queued when the collector stopped";
        self.metrics
            .as_ref()
            .map_or(0, |q| q.drop_queued(Dropped::Shutdown, why))
            + self
                .logs
                .as_ref()
                .map_or(0, |q| q.drop_queued(Dropped::Shutdown, why))
    }

    /// The counters of each configured signal now (`metrics`, then `logs`).
    pub fn snapshots(&self) -> (Option<Snapshot>, Option<Snapshot>) {
        (
            self.metrics.as_ref().map(|q| {
                let _st = q.lock();
                q.counters.snapshot()
            }),
            self.logs.as_ref().map(|q| {
                let _st = q.lock();
                q.counters.snapshot()
            }),
        )
    }
}

/// Starts the output if configured: registers its self-metrics in `registry` (the
/// collector's telemetry registry) and spawns a sender per signal on the current tokio
/// runtime.
///
/// # Errors
/// [`SetupError`] for an unreadable secret or CA file or an invalid header or URL; a
/// `prometheus` registration error as [`SetupError::Invalid`].
pub fn start(
    config: Option<&OtlpConfig>,
    registry: &prometheus::Registry,
    shutdown: &Shutdown,
) -> Result<Started, SetupError> {
    let Some(c) = config else {
        return Ok(Started {
            handle: Otlp::default(),
            tasks: Vec::new(),
        });
    };
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
    let registration = |e: prometheus::Error| SetupError::Invalid {
        key: prefix.into(),
        message: format!("self-metrics: {e}"),
    };
    let families = Families::new().map_err(registration)?;
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
        }))
    };
    let mut tasks = Vec::new();
    let mut handle = Otlp::default();
    if c.metrics {
        let (q, t) = signal::<Point>(c, &families, target("metrics")?, shutdown);
        handle.metrics = Some(q);
        tasks.extend(t);
    }
    if c.logs {
        let (q, t) = signal::<Record>(c, &families, target("logs")?, shutdown);
        handle.logs = Some(q);
        tasks.extend(t);
    }
    registry
        .register(Box::new(LockedCollector::new(families, handle.clone())))
        .map_err(registration)?;
    tracing::info!(
        endpoint = %http::redact(&c.endpoint),
        metrics = c.metrics,
        logs = c.logs,
        "OTLP output started"
    );
    Ok(Started { handle, tasks })
}

/// The queue of one signal and its sender and report tasks.
fn signal<T: SignalItem>(
    c: &OtlpConfig,
    families: &Families,
    target: Arc<Target>,
    shutdown: &Shutdown,
) -> (Arc<Queue<T>>, Vec<tokio::task::JoinHandle<()>>) {
    let queue = Arc::new(Queue::new(
        T::SIGNAL,
        c.queue_capacity_items as usize,
        c.max_items_per_request as usize,
        families.signal(T::SIGNAL),
    ));
    let report = {
        let q = queue.clone();
        move || {
            let s = {
                let _st = q.lock();
                q.counters.snapshot()
            };
            crate::outputs::report::Tally {
                delivered: s.sent,
                retried: s.retried,
                pending: u64::try_from(s.pending).unwrap_or(0),
                given_up: Dropped::ALL
                    .iter()
                    .map(|r| (r.as_str(), s.dropped_for(*r)))
                    .collect(),
            }
        }
    };
    let what = if T::SIGNAL == "metrics" {
        "OTLP metrics"
    } else {
        "OTLP logs"
    };
    let tasks = vec![
        tokio::spawn(crate::outputs::report::run(
            what,
            target.label.clone(),
            T::ITEMS,
            report,
            target.grace,
            shutdown.clone(),
        )),
        tokio::spawn(sender::run(target, queue.clone(), shutdown.clone())),
    ];
    (queue, tasks)
}

/// The collector registered for the output: holds both signals' queue locks while the
/// counters are read, so a scrape sees the figures of one instant.
#[derive(Debug)]
struct LockedCollector {
    families: Families,
    handle: Otlp,
    descs: Vec<Desc>,
}

impl LockedCollector {
    fn new(families: Families, handle: Otlp) -> LockedCollector {
        let descs = families
            .collectors()
            .iter()
            .flat_map(|c| c.desc().into_iter().cloned())
            .collect();
        LockedCollector {
            families,
            handle,
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
        let m = self.handle.metrics.as_ref().map(|q| (q, q.lock()));
        let l = self.handle.logs.as_ref().map(|q| (q, q.lock()));
        if let Some((q, st)) = &m {
            q.counters.oldest.set(Queue::oldest_age(st, now));
        }
        if let Some((q, st)) = &l {
            q.counters.oldest.set(Queue::oldest_age(st, now));
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
