//! The source loops: they run the sources of [`crate::sources`] on their schedules and offer
//! the records to the bounded queues in front of the sender.
//!
//! - host metrics: every `sources.host_metrics.interval_seconds`, one
//!   [`HostMetrics::collect`] on the blocking pool (procfs and statvfs(2) are blocking calls);
//! - self-metrics: every `sources.self_metrics.interval_seconds`, a snapshot of the registry
//!   ([`SelfMetrics::to_records`]);
//! - logs: one thread per `sources.logs` entry running a [`LogTailer`]. It reads at most as
//!   many lines as the queue has room for (the file is the buffer, so a slow sender costs no
//!   memory and loses no line), and its checkpoints cover only the lines the sender has
//!   settled — sent, or dropped and counted for a reason other than `shutdown` ([`Handoff`],
//!   per-line offsets from [`LogTailer::settle`]) — so a restart neither loses nor repeats
//!   lines before the UC hop, even when it stops in the middle of a backlog.
//!
//! No loop ever blocks on the sender: a full queue is a counted `source_overflow`.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts};
use uctel_common::shutdown::Shutdown;
use uctel_protocol::payload::{LogRecord, Metric};
use uctel_protocol::samples::SampleSeries;

use crate::buffer::DisconnectedBuffer;
use crate::config::{seconds, AgentConfig, LogSection, LogSeverity, Reliability, StartAt};
use crate::pacing::grid::Grid;
use crate::queue::RecordQueue;
use crate::selfmetrics::{DropReason, SelfMetrics};
use crate::sources::host::{HostMetrics, HostMetricsConfig, HostPaths};
use crate::sources::logs::{self, LogEvent, LogSourceConfig, LogSourceCounts, LogTailer};
use crate::stream::Stream;

mod fast;
pub mod pod_resources;
pub mod rounds;
pub mod slurm;
pub use fast::{fast_counters_loop, fast_counters_thread, FastCounterMetrics};
use rounds::next_round;
pub use rounds::RoundMetrics;
mod journald;
mod kmsg;
mod settled;
pub use settled::{log_tailer_loop, settled_source_loop, SettledSource};

/// Hand-off accounting of the logs queue, in queue (FIFO) positions: records offered to the
/// queue by the tailers, taken from it by the sender, and *settled* by the sender.
///
/// A record is settled once its fate cannot change: posted in a frame, or dropped and counted
/// for any reason but `shutdown` (DESIGN.md §7: lines handed to the framer are never read
/// again; lines still waiting when the agent stops are). The sender handles records in queue
/// order, so it reports settlement as a watermark: every record up to position
/// [`Handoff::settled`] is settled. Once [`Handoff::close`] is called the sender has stopped
/// and the watermark is final.
///
/// On an RC lane a record settles only when its frame was acknowledged (DESIGN.md §8b);
/// when the lane fails, the records past the watermark are abandoned by
/// [`Handoff::rewind`] and the tailers read them again ([`Handoff::settled_in`],
/// [`LogTailer::rewind`]).
#[derive(Debug, Default)]
pub struct Handoff {
    offered: AtomicU64,
    taken: AtomicU64,
    settled: AtomicU64,
    closed: AtomicBool,
    /// Makes "append to the queue" and "count as offered" one step, so that with several
    /// tailers the offered count follows queue order; holds the rewinds.
    order: std::sync::Mutex<Rewinds>,
}

/// The rewinds of a [`Handoff`]: generation `g` (0 at start) ended at a rewind whose
/// watermark was `points[g − first]`.
#[derive(Debug, Default)]
struct Rewinds {
    generation: u64,
    /// Generation of `points[0]`.
    first: u64,
    /// The settled watermark at each rewind, oldest first (the last [`MAX_REWINDS`]).
    points: VecDeque<u64>,
}

/// Rewinds remembered for tailers that have not seen them yet.
const MAX_REWINDS: usize = 64;

/// What [`Handoff::settled_in`] says about a tailer's generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// Still the current generation: the watermark.
    Current(u64),
    /// A rewind ended the generation: every record up to `at` was settled before it, the
    /// rest is to be read again; `now` is the current generation.
    Rewound {
        /// The watermark when the generation ended (0 when that is no longer known).
        at: u64,
        /// The current generation.
        now: u64,
    },
}

impl Handoff {
    /// Records `n` more offered records; returns the new offered total (the caller's mark:
    /// the queue position of the last of them).
    pub fn offered(&self, n: u64) -> u64 {
        self.offered.fetch_add(n, Ordering::AcqRel) + n
    }

    /// Offers `records` to `queue` for a tailer in `generation` and counts those accepted
    /// as offered, as one step. Returns `(accepted, mark)`; the accepted records are the
    /// first `accepted` of `records`, at queue positions `mark − accepted + 1 ..= mark`.
    /// `None` (nothing offered) when a [`Handoff::rewind`] ended `generation`: the records
    /// are read again after the tailer's rewind.
    pub fn offer_in<T>(
        &self,
        generation: u64,
        queue: &RecordQueue<T>,
        records: Vec<T>,
    ) -> Option<(u64, u64)> {
        let order = self.lock();
        if order.generation != generation {
            return None;
        }
        let n = records.len() as u64;
        let accepted = n - queue.offer(records) as u64;
        Some((accepted, self.offered(accepted)))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Rewinds> {
        self.order
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The current generation (0 until the first [`Handoff::rewind`]).
    pub fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// The watermark as a tailer of `generation` may use it: [`Settled::Current`], or, when
    /// rewinds ended that generation, the watermark of the first of them
    /// ([`Settled::Rewound`]).
    pub fn settled_in(&self, generation: u64) -> Settled {
        let r = self.lock();
        if r.generation == generation {
            return Settled::Current(self.settled());
        }
        let at = generation
            .checked_sub(r.first)
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| r.points.get(i).copied())
            .unwrap_or(0);
        Settled::Rewound {
            at,
            now: r.generation,
        }
    }

    /// The sender's pipeline of an RC lane failed: the records past the settled watermark
    /// were not acknowledged and are to be read again from the files. Discards what the
    /// queue still holds (they come again too, in order), moves the watermark past every
    /// record offered so far (none of them is for the sender any more) and starts a new
    /// generation; each tailer, seeing it ([`Handoff::settled_in`]), settles what was
    /// settled before the rewind and reads the rest again ([`LogTailer::rewind`]). Returns
    /// the records taken out of the queue.
    pub fn rewind<T>(&self, queue: &RecordQueue<T>) -> u64 {
        let mut r = self.lock();
        let point = self.settled();
        let discarded = queue.take_all().len() as u64;
        self.taken.fetch_add(discarded, Ordering::AcqRel);
        self.settled
            .fetch_max(self.offered.load(Ordering::Acquire), Ordering::AcqRel);
        r.points.push_back(point);
        if r.points.len() > MAX_REWINDS {
            r.points.pop_front();
            r.first += 1;
        }
        r.generation += 1;
        discarded
    }

    /// Records `n` more records taken from the queue by the sender.
    pub fn taken(&self, n: u64) {
        self.taken.fetch_add(n, Ordering::AcqRel);
    }

    /// Records taken from the queue so far.
    pub fn taken_total(&self) -> u64 {
        self.taken.load(Ordering::Acquire)
    }

    /// Every record taken so far is settled except the last `unsettled` ones (the sender's
    /// pending records, [`crate::sender::core::SenderCore::unsettled_records`]). The
    /// watermark never moves back.
    pub fn settle(&self, unsettled: u64) {
        let to = self.taken_total().saturating_sub(unsettled);
        self.settled.fetch_max(to, Ordering::AcqRel);
    }

    /// Queue position up to which every record is settled.
    pub fn settled(&self) -> u64 {
        self.settled.load(Ordering::Acquire)
    }

    /// Whether every record offered up to `mark` was settled.
    pub fn reached(&self, mark: u64) -> bool {
        self.settled() >= mark
    }

    /// The sender stopped for good: [`Handoff::settled`] is final.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// Whether [`Handoff::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

/// One offer of a tailer's poll output to the logs queue, for turning the queue's settled
/// watermark back into the tailer's records ([`LogTailer::settle`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Offered {
    /// Queue position of the last accepted record.
    mark: u64,
    /// Records accepted by the queue (the first ones of the poll output).
    accepted: u64,
    /// Records of the poll output (the rest were refused: `source_overflow`).
    total: u64,
    /// Accepted records already reported settled to the tailer.
    settled: u64,
}

/// Settles, oldest first, the tailer records of `offers` that the queue watermark `settled`
/// covers; returns how many tailer records became settled. Refused records of an offer are
/// settled with its last accepted one, so the tailer's records settle in the order it
/// returned them.
fn settle_offers(offers: &mut VecDeque<Offered>, settled: u64) -> u64 {
    let mut n = 0;
    while let Some(o) = offers.front_mut() {
        let first = o.mark - o.accepted; // position before the first accepted record
        let done = settled.saturating_sub(first).min(o.accepted);
        n += done - o.settled;
        o.settled = done;
        if done < o.accepted {
            break;
        }
        n += o.total - o.accepted;
        offers.pop_front();
    }
    n
}

/// The queues between the sources and the sender.
#[derive(Debug, Clone)]
pub struct Queues {
    /// Metric samples (host metrics, self-metrics).
    pub metrics: RecordQueue<Metric>,
    /// Log records.
    pub logs: RecordQueue<LogRecord>,
    /// Sample series of the `fast_counters` source (capacity in series, not samples).
    pub fast_counters: RecordQueue<SampleSeries>,
    /// Hand-off accounting of the logs queue.
    pub logs_handoff: Arc<Handoff>,
    /// Metric samples held while disconnected (`streams.metrics.
    /// buffer_while_disconnected_records`), sent before the metrics queue.
    pub metrics_buffer: DisconnectedBuffer,
}

impl Queues {
    /// Queues sized from `streams.*.queue_records`, the metrics buffer from
    /// `streams.metrics.buffer_while_disconnected_records`.
    pub fn new(config: &AgentConfig) -> Self {
        Self {
            metrics_buffer: DisconnectedBuffer::new(
                config.streams.buffer_while_disconnected_records(),
            ),
            metrics: RecordQueue::new(config.streams.queue_records(Stream::Metrics)),
            logs: RecordQueue::new(config.streams.queue_records(Stream::Logs)),
            fast_counters: RecordQueue::new(config.streams.queue_records(Stream::FastCounters)),
            logs_handoff: Arc::new(Handoff::default()),
        }
    }
}

/// Offers `records` to `queue`, stamped with their collection time where they carry none,
/// counting what does not fit as `source_overflow` (and, on the metrics stream, every
/// record offered in `records_collected_total`).
fn offer(
    queue: &RecordQueue<Metric>,
    mut records: Vec<Metric>,
    stream: Stream,
    stats: &SelfMetrics,
    unix_ms: i64,
) -> u64 {
    stamp_collected(&mut records, unix_ms);
    let n = records.len() as u64;
    if stream == Stream::Metrics {
        stats.metrics_collected(n);
    }
    let rejected = queue.offer(records) as u64;
    if rejected > 0 {
        stats.dropped(stream, DropReason::SourceOverflow, 0, rejected);
    }
    stats.set_queue_records(stream, queue.len());
    n - rejected
}

/// Runs the host-metrics source until shutdown: one collection at each instant of `grid`
/// (whole multiples of the interval since the Unix epoch plus the offset), the first at the
/// first instant after start; a collection that ends after the next instants skips them
/// (counted in `uctel_agent_missed_rounds_total{source="host_metrics"}`), never bunches.
/// Records are stamped with the time the round began: the wall clock read when the
/// `host-wake` thread, which only sleeps to the grid (a `SCHED_FIFO` thread unless
/// `sources.wake_scheduling` is `normal`: [`rounds::schedule_wake`]), woke for it
/// ([`rounds::Handover`]). Collections run on a thread of their own, `host-metrics`, at a
/// nice value raised by [`rounds::COLLECTION_NICE_INCREMENT`] (where that fails: a warning,
/// and collections at the agent's nice value), so that a collection, of this agent or of
/// another on the same cores, does not delay the stamp; no async worker and no blocking-pool hand-off is woken per
/// collection. Collection errors are logged (first failure of each sub-collector at `warn`)
/// and visible as `node_scrape_collector_success{collector} 0`; RDMA files skipped are
/// counted and logged by [`SelfMetrics::infiniband_file_skipped`]. Without a textfile source
/// (`no_textfile`), each collection also carries `node_textfile_scrape_error 0`, as
/// node_exporter's textfile collector reports it with no directory set (`textfile.go`).
pub async fn host_metrics_loop(
    config: HostMetricsConfig,
    no_textfile: bool,
    (grid, scheduling): (Grid, crate::config::WakeScheduling),
    pod_labels: Option<crate::sources::pod_resources::PodLabels>,
    queue: RecordQueue<Metric>,
    (stats, rounds): (Arc<SelfMetrics>, RoundMetrics),
    mut shutdown: Shutdown,
) {
    run_thread("host-wake", &mut shutdown, move |stopped| {
        host_metrics_thread(
            config,
            no_textfile,
            (
                grid,
                scheduling,
                pod_labels.map(crate::sources::pod_resources::DeviceLabeller::new),
            ),
            &queue,
            (&stats, &rounds),
            stopped,
        );
    })
    .await;
}

/// Runs `body` on a thread named `name` until `shutdown`: the thread gets a receiver whose
/// sender is dropped at shutdown (its sleeps are `recv_timeout`s on it), and is joined off
/// the async workers. A thread that cannot start or ends in a panic is logged.
async fn run_thread(
    name: &'static str,
    shutdown: &mut Shutdown,
    body: impl FnOnce(&std::sync::mpsc::Receiver<()>) + Send + 'static,
) {
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let spawned = std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || body(&stopped));
    let thread = match spawned {
        Ok(t) => t,
        Err(e) => {
            tracing::error!(error = %e, thread = name, "cannot start the thread; its source stops");
            return;
        }
    };
    shutdown.wait().await;
    drop(stop);
    if tokio::task::spawn_blocking(move || thread.join())
        .await
        .map_or(true, |joined| joined.is_err())
    {
        tracing::error!(thread = name, "the thread ended abnormally");
    }
}

/// The body of [`host_metrics_loop`]'s thread, `host-wake`: starts the `host-metrics`
/// thread, which raises its own nice value and collects, then schedules itself as
/// `sources.wake_scheduling` says ([`rounds::schedule_wake`]) and hands the collection
/// thread the rounds of `grid` until `stop` is dropped.
fn host_metrics_thread(
    config: HostMetricsConfig,
    no_textfile: bool,
    (mut grid, scheduling, labeller): (
        Grid,
        crate::config::WakeScheduling,
        Option<crate::sources::pod_resources::DeviceLabeller>,
    ),
    queue: &RecordQueue<Metric>,
    stats: (&SelfMetrics, &RoundMetrics),
    stop: &std::sync::mpsc::Receiver<()>,
) {
    let handover = rounds::Handover::default();
    std::thread::scope(|s| {
        let collector = std::thread::Builder::new()
            .name("host-metrics".to_owned())
            .spawn_scoped(s, || {
                match rounds::raise_own_nice(rounds::COLLECTION_NICE_INCREMENT) {
                    Ok(nice) => tracing::debug!(nice, "host metrics collect at a raised nice value"),
                    Err(e) => tracing::warn!(error = %e,
                        "cannot raise the host metrics thread's nice value; collections may delay other agents' stamps"),
                }
                host_metrics_collect(config, no_textfile, labeller, queue, stats, &handover);
            });
        if let Err(e) = collector {
            tracing::error!(error = %e, thread = "host-metrics", "cannot start the thread; host metrics stop");
            return;
        }
        rounds::schedule_wake("host-wake", scheduling);
        rounds::wake_rounds(&mut grid, stop, &handover);
    });
}

/// The collections of [`host_metrics_thread`]: one per round taken from `handover`, until it
/// is closed.
fn host_metrics_collect(
    config: HostMetricsConfig,
    no_textfile: bool,
    mut labeller: Option<crate::sources::pod_resources::DeviceLabeller>,
    queue: &RecordQueue<Metric>,
    (stats, rounds): (&SelfMetrics, &RoundMetrics),
    handover: &rounds::Handover,
) {
    let mut host = HostMetrics::new(config);
    let mut warned = std::collections::HashSet::new();
    let mut warned_ethtool = std::collections::HashSet::new();
    while let Some(began) = handover.take() {
        rounds.observe("host_metrics", &began);
        let collected = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| host.collect()));
        let Ok(collection) = collected else {
            tracing::error!("host metrics collection panicked; host metrics stop");
            return;
        };
        for e in &collection.errors {
            if warned.insert(e.collector) {
                tracing::warn!(error = %e, "host metrics sub-collector failed (logged once per collector)");
            } else {
                tracing::debug!(error = %e, "host metrics sub-collector failed");
            }
        }
        for f in &collection.infiniband_skipped {
            stats.infiniband_file_skipped(f);
        }
        for s in &collection.ethtool_skipped {
            stats.source_error("ethtool", s.reason.as_str());
            if warned_ethtool.insert((s.device.clone(), s.reason)) {
                tracing::warn!(device = %s.device, reason = s.reason.as_str(), detail = %s.detail,
                    "ethtool collector skipped (logged once per interface and reason)");
            } else {
                tracing::debug!(device = %s.device, detail = %s.detail, "ethtool collector skipped");
            }
        }
        for e in &collection.infiniband_events {
            stats.rdma().port_event(e);
        }
        let mut metrics = collection.metrics;
        if let Some(l) = &mut labeller {
            l.apply(&mut metrics);
        }
        if no_textfile {
            metrics.push(crate::sources::textfile::scrape_error(false));
        }
        offer(queue, metrics, Stream::Metrics, stats, began.unix_ms());
    }
}

/// Stamps every record without its own timestamp (`timestamp_ms == 0`, "the frame's
/// timestamp") with `unix_ms`, the time of its collection. A record may wait in its queue
/// (no credit, a reconnect, a move to another collector of the pool) and is framed only
/// then; the frame's timestamp is the framing time, so without this stamp a collection held
/// across a move would reach Prometheus seconds after it was taken, or behind a newer one.
/// Records that carry a timestamp (a scraped target's own) keep it.
pub fn stamp_collected(records: &mut [Metric], unix_ms: i64) {
    for m in records.iter_mut().filter(|m| m.timestamp_ms == 0) {
        m.timestamp_ms = unix_ms;
    }
}

/// Runs the textfile source (`sources::textfile`) until shutdown: the directory read at
/// each instant of `grid` (aligned to the Unix epoch, [`crate::pacing::grid`]), off the
/// async threads. Each file skipped is counted in
/// `uctel_agent_source_errors_total{source="textfile",reason}` at every read that skips it,
/// and logged at `warn` once per file and reason (then at debug), so a broken cron job does
/// not fill the log.
pub async fn textfile_loop(
    directory: std::path::PathBuf,
    mut grid: Grid,
    queue: RecordQueue<Metric>,
    (stats, rounds): (Arc<SelfMetrics>, RoundMetrics),
    mut shutdown: Shutdown,
) {
    let mut warned = std::collections::HashSet::new();
    while let Some(began) = next_round(&mut grid, &mut shutdown).await {
        rounds.observe("textfile", &began);
        let dir = directory.clone();
        let Ok(collection) =
            tokio::task::spawn_blocking(move || crate::sources::textfile::collect(&dir)).await
        else {
            tracing::error!("textfile collection panicked; the textfile source stops");
            return;
        };
        for s in &collection.skipped {
            stats.source_error("textfile", s.error.as_str());
            if warned.insert((s.path.clone(), s.error)) {
                tracing::warn!(path = %s.path.display(), reason = s.error.as_str(), detail = %s.detail, "textfile skipped (logged once per file and reason)");
            } else {
                tracing::debug!(path = %s.path.display(), reason = s.error.as_str(), "textfile skipped");
            }
        }
        offer(
            &queue,
            collection.metrics,
            Stream::Metrics,
            &stats,
            began.unix_ms(),
        );
    }
}

/// Scrapes one target (`sources::scrape`) until shutdown: at each whole multiple of its
/// `interval_seconds` since the Unix epoch plus its `offset_seconds` ([`crate::pacing::grid`];
/// instants a slow scrape overran are skipped and counted in
/// `uctel_agent_missed_rounds_total{source="scrape"}`). A failed scrape is counted in
/// `uctel_agent_source_errors_total{source="scrape",reason}`, and so is each sample a
/// successful one refused (`duplicate`, `timestamp_too_new`, `timestamp_too_old`); each
/// reason is logged once per target at `warn`, then at `debug`.
pub async fn scrape_loop(
    target: crate::sources::scrape::Target,
    queue: RecordQueue<Metric>,
    (stats, rounds): (Arc<SelfMetrics>, RoundMetrics),
    mut shutdown: Shutdown,
) {
    let c = target.config();
    let mut grid = Grid::new(seconds(c.interval_seconds), seconds(c.offset_seconds));
    let mut warned = std::collections::HashSet::new();
    while let Some(began) = next_round(&mut grid, &mut shutdown).await {
        rounds.observe("scrape", &began);
        let started = Instant::now();
        let scraped = tokio::select! {
            s = target.scrape() => s,
            () = shutdown.wait() => return,
        };
        let url = &target.config().url;
        let error = scraped
            .error
            .as_ref()
            .map(|(r, d)| format!("{}: {d}", r.as_str()));
        let took = started.elapsed().as_secs_f64();
        stats
            .status()
            .scraped(url.as_str(), took, std::time::SystemTime::now(), error);
        if let Some((reason, detail)) = &scraped.error {
            stats.source_error("scrape", reason.as_str());
            if warned.insert(reason.as_str()) {
                tracing::warn!(%url, reason = reason.as_str(), %detail, "scrape failed (logged once per target and reason)");
            } else {
                tracing::debug!(%url, reason = reason.as_str(), %detail, "scrape failed");
            }
        }
        for (reason, n) in scraped.refusals() {
            stats.source_errors_add("scrape", reason.as_str(), n);
            if warned.insert(reason.as_str()) {
                tracing::warn!(%url, reason = reason.as_str(), samples = n, "samples of a scrape refused (logged once per target and reason)");
            } else {
                tracing::debug!(%url, reason = reason.as_str(), samples = n, "samples of a scrape refused");
            }
        }
        offer(
            &queue,
            scraped.metrics,
            Stream::Metrics,
            &stats,
            began.unix_ms(),
        );
    }
}

/// Runs the self-metrics source until shutdown: a snapshot at each instant of `grid`.
pub async fn self_metrics_loop(
    mut grid: Grid,
    queue: RecordQueue<Metric>,
    (stats, rounds): (Arc<SelfMetrics>, RoundMetrics),
    mut shutdown: Shutdown,
) {
    while let Some(began) = next_round(&mut grid, &mut shutdown).await {
        rounds.observe("self_metrics", &began);
        let records = stats.to_records(0);
        offer(&queue, records, Stream::Metrics, &stats, began.unix_ms());
    }
}

/// The host-metrics source configuration from the agent configuration.
pub fn host_config(config: &AgentConfig) -> HostMetricsConfig {
    let h = &config.sources.host_metrics;
    HostMetricsConfig {
        paths: HostPaths {
            proc: h.procfs_path.clone(),
            sys: h.sysfs_path.clone(),
            rootfs: h.rootfs_path.clone(),
        },
        ticks_per_second: None,
        disabled: h.disabled_collectors.clone(),
        ethtool: h.ethtool.clone(),
    }
}

/// FNV-1a 64 of `s`: names a log entry's checkpoint file after its glob, stable across
/// restarts and reordering of entries.
fn fnv1a64(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The checkpoint file of a `sources.logs` entry under `state_directory`.
pub fn log_state_file(state_directory: &Path, entry: &LogSection) -> PathBuf {
    state_directory.join(format!("logs-{:016x}.json", fnv1a64(&entry.path)))
}

/// The tailer configuration of a `sources.logs` entry.
pub fn log_source_config(
    entry: &LogSection,
    max_line_bytes: usize,
    state_directory: Option<&Path>,
) -> LogSourceConfig {
    let mut c = LogSourceConfig::new([entry.path.clone()]);
    c.exclude.clone_from(&entry.exclude);
    c.start_at = match entry.start_at {
        StartAt::Beginning => logs::StartAt::Beginning,
        StartAt::End => logs::StartAt::End,
    };
    c.max_line_bytes = max_line_bytes;
    c.partial_line_timeout = seconds(entry.partial_line_timeout_seconds);
    c.rotate_wait = seconds(entry.rotate_wait_seconds);
    c.glob_interval = seconds(entry.glob_interval_seconds);
    c.state_file = state_directory.map(|d| log_state_file(d, entry));
    c.detect_severity = entry.severity == LogSeverity::Auto;
    c.parse.clone_from(&entry.parse);
    c
}

/// Log-source counters in the self-metrics registry, shared by every tailer.
#[derive(Debug, Clone)]
pub struct LogMetrics {
    records: IntCounter,
    bytes: IntCounter,
    discarded_bytes: IntCounter,
    truncated_unread_bytes: IntCounter,
    files: IntGauge,
    events: IntCounterVec,
    checkpoint_errors: IntCounter,
}

impl LogMetrics {
    /// Registers the `uctel_agent_log_*` series in `stats`' registry.
    ///
    /// # Errors
    /// A registration clash (registering twice in one registry).
    pub fn register(stats: &SelfMetrics) -> Result<LogMetrics, prometheus::Error> {
        let r = stats.registry();
        let counter = |name: &str, help: &str| -> Result<IntCounter, prometheus::Error> {
            let c = IntCounter::with_opts(Opts::new(format!("uctel_agent_{name}"), help))?;
            r.register(Box::new(c.clone()))?;
            Ok(c)
        };
        let records = counter(
            "log_records_read_total",
            "Log records read by the log sources (a multi-line record counts once).",
        )?;
        let bytes = counter("log_bytes_read_total", "Bytes consumed from log files.")?;
        let discarded_bytes = counter(
            "log_discarded_bytes_total",
            "Bytes of over-long log lines discarded after the cut at max_line_bytes.",
        )?;
        let truncated_unread_bytes = counter(
            "log_truncated_unread_bytes_total",
            "Bytes not yet read when a followed file was found truncated (lower bound of the loss).",
        )?;
        let checkpoint_errors = counter(
            "log_checkpoint_errors_total",
            "Failed writes of a log source's offset checkpoint file.",
        )?;
        let files = IntGauge::with_opts(Opts::new(
            "uctel_agent_log_files",
            "Log files followed now, rotated files still being read included.",
        ))?;
        r.register(Box::new(files.clone()))?;
        let events = IntCounterVec::new(
            Opts::new(
                "uctel_agent_log_events_total",
                "Log source events that altered or lost data, or recovered from rotation, by reason.",
            ),
            &["reason"],
        )?;
        r.register(Box::new(events.clone()))?;
        for e in LogEvent::ALL {
            let _ = events.with_label_values(&[e.as_str()]);
        }
        Ok(LogMetrics {
            records,
            bytes,
            discarded_bytes,
            truncated_unread_bytes,
            files,
            events,
            checkpoint_errors,
        })
    }

    /// Adds the growth from `before` to `now`.
    fn add(&self, before: &LogSourceCounts, now: &LogSourceCounts) {
        self.records
            .inc_by(now.records.saturating_sub(before.records));
        self.bytes
            .inc_by(now.bytes_read.saturating_sub(before.bytes_read));
        self.discarded_bytes
            .inc_by(now.discarded_bytes.saturating_sub(before.discarded_bytes));
        self.truncated_unread_bytes.inc_by(
            now.truncated_unread_bytes
                .saturating_sub(before.truncated_unread_bytes),
        );
        for e in LogEvent::ALL {
            let d = now.get(e).saturating_sub(before.get(e));
            if d > 0 {
                self.events.with_label_values(&[e.as_str()]).inc_by(d);
            }
        }
    }
}

/// Longest wait at shutdown for the sender to settle the last offered lines (or to stop)
/// before the final checkpoint.
pub const LOG_HANDOFF_GRACE: Duration = Duration::from_secs(10);

/// Least time between two checkpoints while lines are still unsettled (each one is a write,
/// fsync and rename).
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(100);

/// Settles the tailer's records that the sender settled in the tailer's `generation`;
/// returns how many. When a rewind ended that generation ([`Handoff::rewind`]: an RC lane
/// failed), settles what was settled before it, rewinds the tailer to its first unsettled
/// line ([`LogTailer::rewind`]: read again, in order) and joins the current generation; the
/// lines that cannot be read again (their file closed after a rotation, or truncated) are
/// counted as dropped (`transport_error`).
pub(super) fn catch_up<S: SettledSource>(
    tailer: &mut S,
    handoff: &Handoff,
    generation: &mut u64,
    offers: &mut VecDeque<Offered>,
    stats: &SelfMetrics,
) -> u64 {
    let (settled, rewound) = match handoff.settled_in(*generation) {
        Settled::Current(s) => (s, None),
        Settled::Rewound { at, now } => (at, Some(now)),
    };
    let n = settle_offers(offers, settled);
    tailer.settle(usize::try_from(n).unwrap_or(usize::MAX));
    if let Some(now) = rewound {
        let gone = tailer.rewind();
        if gone > 0 {
            stats.dropped(Stream::Logs, DropReason::TransportError, 0, gone);
        }
        offers.clear();
        *generation = now;
    }
    n
}

/// A journald or kmsg source's position, handed by the source a reload stopped to the one
/// that replaces it (after the stopped one settled and checkpointed what it read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resume {
    /// The journald source goes on after this cursor (`None`: at the journal's first entry).
    Cursor(Option<String>),
    /// The kmsg source goes on at this sequence number.
    Seq(u64),
}

/// Where a system log source leaves its [`Resume`] when its loop ends.
pub type ResumeSlot = Arc<std::sync::Mutex<Option<Resume>>>;

/// Which system log source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SystemKind {
    /// `sources.journald`.
    Journald,
    /// `sources.kmsg`.
    Kmsg,
}

/// The system log sources' own series, registered at their first start and reused when a
/// reload starts them again.
#[derive(Debug, Clone, Default)]
pub struct SystemMetrics {
    journal: Option<journald::JournalMetrics>,
    kmsg: Option<IntCounterVec>,
}

/// Starts the thread of the system log source `kind` where `config` has it (`Ok(None)`
/// otherwise): it runs until `stop` or `shutdown` ([`settled_source_loop`]), from `resume`
/// when given (a reload's hand-over), else from its state file or `start_at`. Returns the
/// thread and the slot where it leaves its own [`Resume`] when it ends.
///
/// # Errors
/// The source cannot start (an unreadable state file, a state directory that cannot be
/// created, its metrics cannot be registered), naming it.
pub fn spawn_system_source(
    kind: SystemKind,
    config: &AgentConfig,
    queues: &Queues,
    stats: &Arc<SelfMetrics>,
    stops: (&Shutdown, &Shutdown),
    metrics: &mut SystemMetrics,
    resume: Option<Resume>,
) -> Result<Option<(std::thread::JoinHandle<()>, ResumeSlot)>, String> {
    match kind {
        SystemKind::Journald => {
            journald::spawn_journald(config, queues, stats, stops, &mut metrics.journal, resume)
        }
        SystemKind::Kmsg => {
            kmsg::spawn_kmsg(config, queues, stats, stops, &mut metrics.kmsg, resume)
        }
    }
}

/// Starts the thread of `sources.journald` and of `sources.kmsg`, where configured (each
/// runs until `shutdown`).
///
/// # Errors
/// A source that cannot start (an unreadable state file, a state directory that cannot be
/// created), naming it.
pub fn spawn_system_log_sources(
    config: &AgentConfig,
    queues: &Queues,
    stats: &Arc<SelfMetrics>,
    shutdown: &Shutdown,
) -> Result<Vec<std::thread::JoinHandle<()>>, String> {
    let mut metrics = SystemMetrics::default();
    let mut handles = Vec::new();
    for kind in [SystemKind::Journald, SystemKind::Kmsg] {
        let stops = (shutdown, shutdown);
        if let Some((t, _)) =
            spawn_system_source(kind, config, queues, stats, stops, &mut metrics, None)?
        {
            handles.push(t);
        }
    }
    Ok(handles)
}

/// Starts one thread per `sources.logs` entry, and one each for `sources.journald` and
/// `sources.kmsg`.
///
/// # Errors
/// A tailer that cannot start (bad pattern, unreadable state file, state directory that
/// cannot be created), naming the entry.
pub fn spawn_log_tailers(
    config: &AgentConfig,
    queues: &Queues,
    stats: &Arc<SelfMetrics>,
    shutdown: &Shutdown,
) -> Result<Vec<std::thread::JoinHandle<()>>, String> {
    let mut handles = spawn_system_log_sources(config, queues, stats, shutdown)?;
    if config.sources.logs.is_empty() {
        return Ok(handles);
    }
    let metrics = LogMetrics::register(stats).map_err(|e| format!("log source metrics: {e}"))?;
    let state_dir = config.sources.state_directory.as_deref();
    if let Some(dir) = state_dir {
        std::fs::create_dir_all(dir).map_err(|e| {
            format!(
                "cannot create sources.state_directory {}: {e}",
                dir.display()
            )
        })?;
    }
    for (i, entry) in config.sources.logs.iter().enumerate() {
        if glob_matches_nothing(&entry.path) {
            tracing::warn!(
                "sources.logs[{i}]: {} matches no file now; it is watched, and files that \
                 appear are read from their first byte",
                entry.path
            );
        }
        let mut source = log_source_config(entry, config.max_line_bytes(entry), state_dir);
        // On an RC lane unacknowledged lines are read again (`LogTailer::rewind`).
        source.keep_positions = config.streams.reliability(Stream::Logs) == Reliability::Rc;
        let tailer = LogTailer::new(source)
            .map_err(|e| format!("sources.logs[{i}] ({}): {e}", entry.path))?;
        let (q, s, m, sd) = (
            queues.clone(),
            stats.clone(),
            metrics.clone(),
            shutdown.clone(),
        );
        let poll = seconds(entry.poll_interval_seconds);
        let h = std::thread::Builder::new()
            .name(format!("uctel-logs-{i}"))
            .spawn(move || log_tailer_loop(tailer, poll, q, s, m, (sd.clone(), sd)))
            .map_err(|e| format!("cannot start the log source thread: {e}"))?;
        handles.push(h);
    }
    Ok(handles)
}

/// Whether the glob `pattern` matches no existing path now (an invalid pattern, which the
/// configuration check refuses, counts as matching nothing).
pub(crate) fn glob_matches_nothing(pattern: &str) -> bool {
    glob::glob(pattern).map_or(true, |mut paths| !paths.any(|p| p.is_ok()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_glob_that_matches_nothing_is_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let pattern = format!("{}/*.log", dir.path().display());
        assert!(super::glob_matches_nothing(&pattern));
        std::fs::write(dir.path().join("a.log"), "x\n").unwrap();
        assert!(!super::glob_matches_nothing(&pattern));
        assert!(super::glob_matches_nothing("[unclosed"));
    }

    use super::*;

    #[test]
    fn handoff_marks() {
        let h = Handoff::default();
        let m1 = h.offered(3);
        let m2 = h.offered(2);
        assert_eq!((m1, m2), (3, 5));
        assert!(!h.reached(m1));
        // Taken but still pending in the sender: not settled.
        h.taken(4);
        h.settle(4);
        assert!(!h.reached(1));
        h.settle(1);
        assert!(h.reached(m1));
        assert!(!h.reached(m2));
        // The watermark never moves back.
        h.settle(4);
        assert_eq!(h.settled(), 3);
        h.taken(1);
        h.settle(0);
        assert!(h.reached(m2));
        assert!(!h.is_closed());
        h.close();
        assert!(h.is_closed());
    }

    /// An RC lane failed after 6 of 10 lines were taken and 4 acknowledged: the rewind
    /// discards the 4 still queued, the tailer settles the 4 acknowledged ones and reads
    /// lines 5..=10 again, in order; an offer of the ended generation is refused, and a
    /// tailer two rewinds behind settles only what was settled before the first.
    #[test]
    fn a_rewind_reads_the_unacknowledged_lines_again_in_order() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let text: String = (1..=10).map(|i| format!("line {i}\n")).collect();
        std::fs::write(dir.path().join("a.log"), text).unwrap_or_else(|e| panic!("{e}"));
        let mut c = logs::LogSourceConfig::new([format!("{}/*.log", dir.path().display())]);
        c.start_at = logs::StartAt::Beginning;
        c.keep_positions = true;
        let mut tailer = LogTailer::new(c).unwrap_or_else(|e| panic!("{e}"));
        let stats = SelfMetrics::new().unwrap_or_else(|e| panic!("{e}"));
        let queue: RecordQueue<LogRecord> = RecordQueue::new(100);
        let h = Handoff::default();
        let mut generation = h.generation();
        let mut offers = VecDeque::new();
        let poll = |t: &mut LogTailer| {
            let mut out = Vec::new();
            let _ = t.poll(Instant::now(), std::time::SystemTime::now, &mut out, 100);
            out
        };
        let out = poll(&mut tailer);
        assert_eq!(out.len(), 10);
        let (accepted, mark) = h
            .offer_in(generation, &queue, out)
            .unwrap_or_else(|| panic!("current generation"));
        offers.push_back(Offered {
            mark,
            accepted,
            total: accepted,
            settled: 0,
        });
        // The sender takes 6, 4 of them acknowledged.
        for _ in 0..6 {
            assert!(queue.pop().is_some());
        }
        h.taken(6);
        h.settle(2);
        assert_eq!(h.settled(), 4);
        assert_eq!(
            h.rewind(&queue),
            4,
            "the queued lines come again from the file"
        );
        assert!(queue.is_empty());
        assert!(h
            .offer_in(generation, &queue, vec![LogRecord::default()])
            .is_none());
        assert_eq!(h.settled_in(generation), Settled::Rewound { at: 4, now: 1 });
        let n = catch_up(&mut tailer, &h, &mut generation, &mut offers, &stats);
        assert_eq!((n, generation, tailer.unsettled()), (4, 1, 0));
        let again: Vec<String> = poll(&mut tailer).into_iter().map(|r| r.message).collect();
        let want: Vec<String> = (5..=10).map(|i| format!("line {i}")).collect();
        assert_eq!(again, want);
        assert_eq!(stats.records_dropped_all(Stream::Logs), 0);
        // Two more rewinds: a tailer still in generation 1 gets the first one's watermark.
        h.settle(0);
        let first = h.settled();
        h.rewind(&queue);
        h.rewind(&queue);
        assert_eq!(h.settled_in(1), Settled::Rewound { at: first, now: 3 });
        assert_eq!(h.settled_in(3), Settled::Current(h.settled()));
    }

    #[test]
    fn offers_settle_in_order_with_refused_records_after_their_offer() {
        let o = |mark, accepted, total| Offered {
            mark,
            accepted,
            total,
            settled: 0,
        };
        // Offer A: 3 records at positions 1..=3; offer B: 4 records, 2 accepted at 4..=5.
        let mut offers: VecDeque<Offered> = [o(3, 3, 3), o(5, 2, 4)].into();
        assert_eq!(settle_offers(&mut offers, 0), 0);
        assert_eq!(settle_offers(&mut offers, 2), 2);
        assert_eq!(settle_offers(&mut offers, 2), 0, "nothing twice");
        assert_eq!(settle_offers(&mut offers, 4), 2);
        assert_eq!(offers.len(), 1);
        // The last accepted record of B settles B's refused ones with it.
        assert_eq!(settle_offers(&mut offers, 5), 3);
        assert!(offers.is_empty());
        // An offer the queue refused whole is settled when it comes first.
        let mut offers: VecDeque<Offered> = [o(5, 0, 7)].into();
        assert_eq!(settle_offers(&mut offers, 5), 7);
        assert!(offers.is_empty());
    }

    #[test]
    fn state_file_names_are_stable_and_distinct() {
        let e = |p: &str| LogSection {
            path: p.into(),
            exclude: vec![],
            start_at: StartAt::End,
            severity: LogSeverity::Auto,
            max_line_bytes: None,
            partial_line_timeout_seconds: 1.0,
            rotate_wait_seconds: 5.0,
            glob_interval_seconds: 1.0,
            poll_interval_seconds: 0.25,
            parse: Default::default(),
        };
        let d = Path::new("/state");
        let a = log_state_file(d, &e("/var/log/a*.log"));
        assert_eq!(a, log_state_file(d, &e("/var/log/a*.log")));
        assert_ne!(a, log_state_file(d, &e("/var/log/b*.log")));
        let c = log_source_config(&e("/var/log/a*.log"), 2048, Some(d));
        assert_eq!(c.state_file, Some(a));
        assert_eq!(c.include, vec!["/var/log/a*.log".to_owned()]);
        assert!(c.detect_severity);
        let off = LogSection {
            severity: LogSeverity::Off,
            ..e("/var/log/a*.log")
        };
        assert!(!log_source_config(&off, 2048, Some(d)).detect_severity);
    }

    #[test]
    fn a_collection_held_across_a_reconnect_keeps_its_collection_time() {
        use uctel_protocol::frame::{decode_frame, Payload};
        use uctel_protocol::framer::Framer;
        use uctel_protocol::limits::Limits;
        use uctel_protocol::payload::MetricType;
        let collected_ms: i64 = 1_700_000_000_000;
        let m = |name: &str, kind: MetricType, timestamp_ms: i64| Metric {
            name: name.into(),
            r#type: kind as i32,
            value: 1.0,
            timestamp_ms,
            ..Default::default()
        };
        // As the host source collects them (no timestamp: "the frame's"), and a scraped
        // target's own.
        let mut held = vec![
            m("node_load1", MetricType::Gauge, 0),
            m("node_boot_total", MetricType::Counter, 0),
            m("scraped", MetricType::Gauge, 1_600_000_000_000),
        ];
        stamp_collected(&mut held, collected_ms);
        // Framed 4 s later by the framer of a new connection (new epoch, sequences from 0).
        let framed_ns = (collected_ms as u64 + 4_000) * 1_000_000;
        let mut framer = Framer::<Metric>::new(0, 0, Limits::default()).unwrap();
        let packed = framer.pack(&held, framed_ns);
        let mut stamps = Vec::new();
        for f in packed.frames {
            let bytes = f.into_stamped(2, 0);
            let d = decode_frame(&bytes, &Limits::default()).unwrap();
            let Payload::Metrics(batch) = d.payload else {
                panic!("kind")
            };
            // The collector's rule: the sample's own timestamp, else the frame's.
            let frame_ms = i64::try_from(d.header.timestamp_ns / 1_000_000).unwrap();
            stamps.extend(batch.metrics.iter().map(|m| {
                if m.timestamp_ms != 0 {
                    m.timestamp_ms
                } else {
                    frame_ms
                }
            }));
        }
        assert_eq!(stamps, vec![collected_ms, collected_ms, 1_600_000_000_000]);
    }
}
