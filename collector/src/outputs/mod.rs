//! Where accepted records go: the [`Delivery`] seam between ingest and the outputs, and
//! the collector's [`Outputs`] behind it.
//!
//! Every accepted frame's records reach the series store (behind `/metrics`) and the log
//! sink (JSON Lines) synchronously, on the worker thread. The outputs that talk to another
//! machine are asynchronous: the worker only appends to their bounded queues (never blocks,
//! never waits on the network) and their sender tasks on the collector's runtime batch,
//! encode and send. Each such output delivers a record whole or counts it as dropped, by a
//! reason from its closed set, so that per output
//! `in = sent + dropped + failed + pending` at every scrape.
//!
//! **Drops.** One rule for every asynchronous output: a record it gives up is counted in
//! that output's own counters only (`clickhouse_rows_dropped_total{reason}`,
//! `remote_write_samples_{dropped,failed}_total{reason}`,
//! `otlp_items_dropped_total{signal,reason}`), never in the agent's
//! `records_dropped_total{agent,reason}`. The record was delivered (the series store, the
//! log sink) and is in `records_received_total`; counting a copy's drop for the agent too
//! would count one record twice and break the per-stream sum
//! `agent records sent = records_received + records_lost + records_dropped +
//! records_replayed` (`crate::telemetry` module docs). Each output's own sum is the place
//! its drops add up.
//!
//! [`Outputs`] is the one place that lists the outputs: [`Outputs::start`] builds them
//! from the configuration, every connection delivers into [`Outputs::for_connection`],
//! [`Outputs::reconfigure`] puts a reloaded `outputs:` in force (each asynchronous output's
//! changed endpoints drained and replaced: `handover`), and [`Outputs::close`] settles what
//! they still hold when the collector stops.
//!
//! - [`remote_write`]: the Prometheus remote-write 1.0 client (`outputs.remote_write`).
//! - [`clickhouse`]: log records into a ClickHouse table (`outputs.clickhouse`).
//! - [`otlp`]: samples and log records to an OpenTelemetry receiver over OTLP/HTTP
//!   (`outputs.otlp`).
//! - [`fast`]: the agents' high-frequency sample series: latest value and rate over the
//!   last second for the store, every sample for remote-write.
//! - [`last_error`]: each endpoint's last error, for the status API.
//! - [`http`]: what the HTTP outputs share: the client, authentication, backoff with full
//!   jitter, `Retry-After`.
//! - `handover`: how a reload replaces an output's endpoint without losing a record (each
//!   record sent by the endpoint in force when it was accepted, or counted `reload`).
//! - `sender`: the sender loop they share (wait for a batch, send, retry, split what was
//!   refused, settle), each output a `Sink` of it.
//! - [`config`]: the `outputs:` configuration section (`crate::config::outputs`).

pub mod clickhouse;
pub mod fast;
mod handover;
pub mod http;
pub mod last_error;
pub mod otlp;
pub mod remote_write;
pub mod report;
mod sender;

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use uctel_protocol::borrowed::MetricBatchView;
use uctel_protocol::dict::KnownValue;
use uctel_protocol::limits::Limits;
use uctel_protocol::payload::{encode_metric_batch, LogRecord, MetricBatch};
use uctel_protocol::samples::SampleBatch;

use crate::logsink::{LogContext, LogSink};
use crate::store::{IngestOutcome, SeriesStore};

pub use crate::config::outputs as config;
pub use clickhouse::ClickHouse;
pub use remote_write::RemoteWrite;

/// Where a connection's accepted records go (`crate::ingest` module docs, "Delivery").
pub trait Delivery {
    /// Store the samples of one decoded metrics frame of `agent` (hostname `instance`)
    /// received at `now`; `frame_timestamp_ns` is the frame header's `timestamp_ns` (when
    /// the agent opened the frame, ns since the Unix epoch: the time of samples whose own
    /// `timestamp_ms` is 0). Returns what the series store kept and what it rejected, by
    /// reason (the asynchronous outputs count their own drops).
    fn metrics(
        &mut self,
        agent: &str,
        instance: &str,
        frame_timestamp_ns: u64,
        batch: &MetricBatchView<'_>,
        now: Instant,
    ) -> IngestOutcome;

    /// Whether [`Delivery::metrics_known`] may take a series-dictionary frame's values by
    /// id alone now: no output that reads a sample's name or labels is in force. A cheap
    /// check, so that a frame is not read twice when the values cannot go this way.
    fn takes_known(&self) -> bool {
        false
    }

    /// Store the values of one series-dictionary frame by their series' ids alone
    /// (`uctel_protocol::dict::SeriesDict::decode_known`; `agent`, `instance`,
    /// `frame_timestamp_ns` and `now` as in [`Delivery::metrics`]), when
    /// [`Delivery::takes_known`] said so just before. Returns what the series store kept and
    /// rejected, as [`Delivery::metrics`] for the same frame; `None` when it stored
    /// nothing and the frame's records are to go through [`Delivery::metrics`] (a value
    /// of a series the store does not hold by id: `SeriesStore::ingest_known`).
    fn metrics_known(
        &mut self,
        agent: &str,
        instance: &str,
        frame_timestamp_ns: u64,
        values: &[KnownValue],
        now: Instant,
    ) -> Option<IngestOutcome> {
        let _ = (agent, instance, frame_timestamp_ns, values, now);
        None
    }

    /// Store the sample series of one decoded samples frame (`fast_counters` stream) of
    /// `agent`. Returns what the store kept and rejected, counted in samples (the stream's
    /// accounting unit).
    fn samples(
        &mut self,
        agent: &str,
        instance: &str,
        batch: &SampleBatch,
        now: Instant,
    ) -> IngestOutcome;

    /// Write the log records of one frame; returns how many failed and the first error.
    fn logs(&mut self, ctx: &LogContext<'_>, records: &[LogRecord]) -> (u64, Option<io::Error>);

    /// Series currently stored for `agent` (the `series` gauge, set at each report).
    fn series_count(&self, agent: &str) -> usize;

    /// `agent` said `Goodbye`: its series end now (remote-write sends their stale markers).
    fn agent_left(&mut self, agent: &str) {
        let _ = agent;
    }
}

/// The collector's outputs: the series store behind `/metrics`, the log sink, and the
/// configured asynchronous outputs.
#[derive(Debug, Clone)]
pub struct Outputs {
    /// The series store.
    pub store: SeriesStore,
    /// The log sink.
    pub logs: Arc<LogSink>,
    /// The remote-write endpoints (none unless configured).
    pub remote_write: RemoteWrite,
    /// The ClickHouse log output (disabled unless configured).
    pub clickhouse: ClickHouse,
    /// The OTLP output (disabled unless configured).
    pub otlp: otlp::Otlp,
    /// Rate windows of the agents' sample series.
    pub fast: Arc<Mutex<fast::FastSeries>>,
}

/// The configured [`Outputs`] and their tasks ([`Outputs::start`]).
#[derive(Debug)]
pub struct Started {
    /// The outputs, handed to every connection ([`Outputs::for_connection`]).
    pub outputs: Outputs,
    /// The asynchronous outputs' sender and expiry tasks (they end after `shutdown` fires
    /// and their grace period).
    pub tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Outputs {
    /// The store and the log sink only.
    pub fn new(store: SeriesStore, logs: Arc<LogSink>) -> Outputs {
        Outputs {
            store,
            logs,
            remote_write: RemoteWrite::default(),
            clickhouse: ClickHouse::default(),
            otlp: otlp::Otlp::default(),
            fast: Arc::default(),
        }
    }

    /// Every output of `config`: `store` and `logs`, and the asynchronous outputs of
    /// `outputs:` started (`outputs.remote_write`, `outputs.clickhouse`, `outputs.otlp`; their self-metrics
    /// registered in `telemetry`). `dead_peer`: the control plane's dead-peer time (a stall
    /// of this process longer than it means its agents moved; the remote-write `stall`
    /// module). The one place that lists the outputs.
    ///
    /// # Errors
    /// [`http::SetupError`]: an output's HTTP client or configuration could not be set up.
    pub fn start(
        config: &crate::config::Config,
        store: SeriesStore,
        logs: Arc<LogSink>,
        telemetry: &crate::telemetry::Telemetry,
        dead_peer: std::time::Duration,
        shutdown: &uctel_common::shutdown::Shutdown,
    ) -> Result<Started, http::SetupError> {
        let remote_write = remote_write::start_with_dead_peer(
            &config.outputs.remote_write,
            telemetry.registry(),
            config.staleness_seconds.duration(),
            config.series_cap_per_agent.0,
            dead_peer,
            shutdown,
        )?;
        let clickhouse =
            clickhouse::start(config.outputs.clickhouse.as_ref(), telemetry, shutdown)?;
        let otlp = otlp::start(config.outputs.otlp.as_ref(), telemetry.registry(), shutdown)?;
        let mut tasks = remote_write.tasks;
        tasks.extend(clickhouse.tasks);
        tasks.extend(otlp.tasks);
        Ok(Started {
            outputs: Outputs {
                store,
                logs,
                remote_write: remote_write.handle,
                clickhouse: clickhouse.handle,
                otlp: otlp.handle,
                fast: Arc::default(),
            },
            tasks,
        })
    }

    /// The outputs as one connection delivers into them: the same outputs, with rate
    /// windows of its own for the agent's sample series.
    pub fn for_connection(&self) -> Outputs {
        Outputs {
            fast: Arc::default(),
            ..self.clone()
        }
    }

    /// A reload changed `outputs:` (`crate::reload`): puts the new `outputs.remote_write`,
    /// `outputs.clickhouse` and `outputs.otlp` in force (`handover`: unchanged endpoints
    /// untouched, removed and changed ones drained, new ones fed from the swap on). Every
    /// new endpoint is built before any is swapped in, so an error changes nothing. Returns
    /// one line per endpoint that changed.
    ///
    /// # Errors
    /// [`http::SetupError`]: a new endpoint could not be set up; nothing changed.
    pub fn reconfigure(
        &self,
        old: &config::OutputsConfig,
        new: &config::OutputsConfig,
    ) -> Result<Vec<String>, http::SetupError> {
        // Everything that can fail (secret and CA files, headers) first: the ClickHouse and
        // OTLP endpoints are built, then remote-write builds and swaps its own; only then
        // are the built ones swapped in. An error changes nothing.
        let clickhouse = if old.clickhouse == new.clickhouse {
            None
        } else {
            self.clickhouse.prepare(new.clickhouse.as_ref())?
        };
        let otlp = if old.otlp == new.otlp {
            None
        } else {
            self.otlp.prepare(new.otlp.as_ref())?
        };
        let mut lines = Vec::new();
        if old.remote_write != new.remote_write {
            lines.extend(self.remote_write.reconfigure(&new.remote_write)?);
        }
        if let Some((replacement, line)) = clickhouse {
            replacement.commit();
            lines.push(line);
        }
        if let Some((replacement, line)) = otlp {
            replacement.commit();
            lines.push(line);
        }
        Ok(lines)
    }

    /// Waits for the tasks reloads started (call after the collector's shutdown fired,
    /// before [`Outputs::close`]).
    pub async fn join(&self) {
        self.remote_write.join().await;
        self.clickhouse.join().await;
        self.otlp.join().await;
    }

    /// The collector stops: what the asynchronous outputs still hold queued is counted as
    /// dropped with reason `shutdown` (and warned about), not lost.
    pub fn close(&self) {
        let unsent = self.remote_write.close();
        if unsent > 0 {
            tracing::warn!(
                samples = unsent,
                "remote-write samples queued at shutdown were not sent; counted in \
                 uctel_collector_remote_write_samples_dropped_total{{reason=\"shutdown\"}}"
            );
        }
        let unsent = self.clickhouse.close();
        if unsent > 0 {
            tracing::warn!(
                rows = unsent,
                "ClickHouse rows queued at shutdown were not sent; counted in \
                 uctel_collector_clickhouse_rows_dropped_total{{reason=\"shutdown\"}}"
            );
        }
        let unsent = self.otlp.close();
        if unsent > 0 {
            tracing::warn!(
                items = unsent,
                "OTLP items queued at shutdown were not sent; counted in \
                 uctel_collector_otlp_items_dropped_total{{reason=\"shutdown\"}}"
            );
        }
    }
}

impl Delivery for Outputs {
    #[inline]
    fn metrics(
        &mut self,
        agent: &str,
        instance: &str,
        frame_timestamp_ns: u64,
        batch: &MetricBatchView<'_>,
        now: Instant,
    ) -> IngestOutcome {
        if !self.remote_write.is_empty() {
            self.remote_write
                .push(agent, instance, frame_timestamp_ns, batch);
        }
        self.otlp
            .push_metrics(agent, instance, frame_timestamp_ns, batch);
        self.store
            .ingest_views_at(agent, instance, batch, frame_timestamp_ns, now)
    }

    /// Remote-write and OTLP read each sample's name and labels: while one of them is in
    /// force, every frame takes the full path.
    #[inline]
    fn takes_known(&self) -> bool {
        self.remote_write.is_empty() && !self.otlp.sends_metrics()
    }

    #[inline]
    fn metrics_known(
        &mut self,
        agent: &str,
        instance: &str,
        frame_timestamp_ns: u64,
        values: &[KnownValue],
        now: Instant,
    ) -> Option<IngestOutcome> {
        self.store
            .ingest_known(agent, instance, values, frame_timestamp_ns, now)
    }

    fn samples(
        &mut self,
        agent: &str,
        instance: &str,
        batch: &SampleBatch,
        now: Instant,
    ) -> IngestOutcome {
        let mut out = IngestOutcome::default();
        let mut remote =
            (!self.remote_write.is_empty() || self.otlp.sends_metrics()).then(Vec::new);
        let mut derived = Vec::new();
        {
            let mut fast = self
                .fast
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            for s in &batch.series {
                let o = fast.observe(agent, s, remote.as_mut());
                let stored =
                    self.store
                        .ingest(agent, instance, std::slice::from_ref(&o.latest), now);
                let weight = u64::from(s.weight());
                if stored.rejected.is_empty() {
                    out.stored += weight;
                }
                for (reason, _) in stored.rejected {
                    out.reject_n(reason, weight);
                }
                // The rate over the last second up to the latest sample: stamped with its time.
                let at = o.latest.timestamp_ms;
                derived.extend(o.rate.map(|mut r| {
                    r.timestamp_ms = at;
                    r
                }));
            }
        }
        // Derived series are not records: one the store refuses (its series cap) is
        // simply not exposed.
        let kept = self.store.ingest(agent, instance, &derived, now);
        if !kept.rejected.is_empty() {
            tracing::debug!(agent, rejected = ?kept.rejected, "rate series not stored");
        }
        if let Some(metrics) = remote.filter(|m| !m.is_empty()) {
            let limits = Limits {
                max_frame_bytes: usize::MAX / 2,
                max_records_per_frame: metrics.len(),
                ..Limits::default()
            };
            let bytes = encode_metric_batch(&MetricBatch { metrics });
            // Built from validated series: decoding cannot fail.
            if let Ok(view) = MetricBatchView::decode(&bytes, &limits) {
                if !self.remote_write.is_empty() {
                    self.remote_write.push(agent, instance, 0, &view);
                }
                self.otlp.push_metrics(agent, instance, 0, &view);
            }
        }
        out
    }

    #[inline]
    fn logs(&mut self, ctx: &LogContext<'_>, records: &[LogRecord]) -> (u64, Option<io::Error>) {
        self.clickhouse.push(ctx, records);
        self.otlp.push_logs(ctx, records);
        self.logs.write_batch(ctx, records)
    }

    fn series_count(&self, agent: &str) -> usize {
        self.store.series_count(agent)
    }

    fn agent_left(&mut self, agent: &str) {
        self.fast
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .forget(agent);
        self.remote_write.agent_left(agent);
    }
}
