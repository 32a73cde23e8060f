//! Prometheus remote-write 1.0 output (`outputs.remote_write`): every accepted sample, with
//! the agent's timestamp, to one or more receivers (Prometheus with
//! `--web.enable-remote-write-receiver`, Mimir, Thanos Receive, Cortex, VictoriaMetrics).
//!
//! The protocol as <https://prometheus.io/docs/specs/remote_write_spec/> defines it: a
//! protobuf `WriteRequest` ([`prompb`]) compressed with snappy's block format, `POST`ed with
//! `Content-Encoding: snappy`, `Content-Type: application/x-protobuf`,
//! `X-Prometheus-Remote-Write-Version: 0.1.0` and `User-Agent: uctel-collector/<version>`.
//!
//! Per endpoint: `queue` (series table, sharded bounded queues, the label and timestamp
//! rules), `sender` (one task per shard: batching, retries, backoff) and [`metrics`]
//! (`uctel_collector_remote_write_*`). The worker thread only appends to the queues; it
//! never waits on the network.
//!
//! **Two collectors, one series.** Agents of a pool move between collectors, and series
//! carry no collector label, so two collectors may write the same series. They never write
//! it at the same time while both run: an agent has one session at a time, and a session
//! that ends by `Goodbye` (drain, return home, shutdown) ends before the next begins. The
//! one overlap is a collector that stopped running (`SIGSTOP`, a paused VM) long enough for
//! its agents to declare it dead and move: when it runs again it still holds their older
//! samples, which the receiver would refuse as out of order. The rule (`stall` module):
//! after its own stall longer than the dead-peer time, the collector drops what it holds of
//! its agents from before it noticed, counted as
//! `samples_dropped_total{reason="agent_moved"}` and logged once per endpoint. A session
//! that merely ends without `Goodbye` while the collector runs (the agent was killed, the
//! network cut) drops nothing: what is queued from before is older than anything another
//! collector can have written since. A request the receiver refuses anyway (clocks,
//! receivers shared with other writers) is split so that only the refused samples fail
//! (`sender`).

mod live;
pub mod metrics;
pub mod prompb;
mod queue;
mod sender;
mod stall;

use std::sync::{Arc, Mutex};

use prometheus::core::{Collector, Desc};
use prometheus::proto;
use std::time::{Duration, Instant, SystemTime};

use uctel_common::shutdown::Shutdown;
use uctel_protocol::borrowed::MetricBatchView;

use self::live::{Endpoint, Live};
use self::metrics::{Counters, Dropped, Failed, Families};
use self::queue::{Scratch, Shards};
use super::config::RemoteWriteConfig;
use super::http::SetupError;

/// Longest a stopping collector waits for its remote-write senders.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The remote-write endpoints, as the worker sees them (cheap to clone: each clone has its
/// own scratch and its own copy of the endpoint list, refreshed when a reload changed it:
/// `live` module docs). Empty unless configured.
#[derive(Debug, Default)]
pub struct RemoteWrite {
    live: Arc<Live>,
    cached: Arc<[Arc<Endpoint>]>,
    generation: u64,
    scratch: Scratch,
}

impl Clone for RemoteWrite {
    fn clone(&self) -> Self {
        RemoteWrite {
            live: self.live.clone(),
            cached: self.cached.clone(),
            generation: self.generation,
            scratch: Scratch::default(),
        }
    }
}

/// The running remote-write output: the worker-side handle and the sender tasks.
#[derive(Debug)]
pub struct Started {
    /// The handle the outputs push through.
    pub handle: RemoteWrite,
    /// The sender and expiry tasks (they end after `shutdown` fires and the grace period).
    pub tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl RemoteWrite {
    /// True when no endpoint is configured (now: a reload may add one).
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// Queues every sample of `batch` for every endpoint configured now (module docs of
    /// `queue`; `live` for what "now" means across a reload).
    pub fn push(
        &mut self,
        agent: &str,
        instance: &str,
        frame_ns: u64,
        batch: &MetricBatchView<'_>,
    ) {
        let now = Instant::now();
        let RemoteWrite {
            live,
            cached,
            generation,
            scratch,
        } = self;
        // Held while pushing: a reload's swap waits for it, so no sample reaches an
        // endpoint after the swap that removed it.
        let current = live.read();
        if current.generation != *generation {
            *cached = current.endpoints.clone();
            *generation = current.generation;
        }
        for e in cached.iter() {
            e.shards
                .push(agent, instance, frame_ns, batch, scratch, now);
        }
        drop(current);
    }

    /// `agent` said `Goodbye`: stale markers for all its series.
    pub fn agent_left(&self, agent: &str) {
        let now = Instant::now();
        let ms = unix_ms(SystemTime::now());
        let current = self.live.read();
        for e in current.endpoints.iter() {
            e.shards.agent_left(agent, now, ms);
        }
    }

    /// Counts everything still queued as dropped at shutdown (call after the senders and
    /// the data plane stopped, and after [`RemoteWrite::join`]). Returns how many samples.
    pub fn close(&self) -> usize {
        self.live
            .read()
            .endpoints
            .iter()
            .map(|e| e.shards.drop_all(Dropped::Shutdown))
            .sum()
    }

    /// Waits for the tasks reloads started (endpoints added or changed, and the retiring
    /// of those removed or changed), once the collector's shutdown fired.
    pub async fn join(&self) {
        self.live.join().await;
    }

    /// Puts `configs` in force (a reload, `live` module docs): endpoints whose settings are
    /// unchanged keep running untouched; the others are retired (they send what they hold
    /// within their grace period, and count the rest `reload`) and new ones take every
    /// sample from the swap on. Returns what changed, one line per endpoint.
    ///
    /// # Errors
    /// [`SetupError`] as [`start`]: nothing changed.
    pub fn reconfigure(&self, configs: &[RemoteWriteConfig]) -> Result<Vec<String>, SetupError> {
        self.live.reconfigure(configs)
    }

    /// Sets `series_cap_per_agent` for every endpoint (a reload, `crate::reload`): a lower
    /// cap refuses new series only.
    pub fn set_series_cap(&self, cap: usize) {
        self.live.set_series_cap(cap);
    }

    /// The counters of endpoint `i` (tests).
    pub fn counters(&self, i: usize) -> Option<Arc<Counters>> {
        self.live
            .read()
            .endpoints
            .get(i)
            .map(|e| e.shards.counters().clone())
    }
}

/// Milliseconds since the Unix epoch.
fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Starts every configured endpoint: registers the self-metrics in `registry`, spawns one
/// sender per shard and an expiry task (stale markers for series not updated for
/// `staleness`) on the current tokio runtime. Each endpoint knows at most
/// `series_cap_per_agent` series per agent.
///
/// # Errors
/// [`SetupError`] for unreadable secret or CA files and invalid headers; a `prometheus`
/// registration error as [`SetupError::Invalid`].
pub fn start(
    configs: &[RemoteWriteConfig],
    registry: &prometheus::Registry,
    staleness: Duration,
    series_cap_per_agent: usize,
    shutdown: &Shutdown,
) -> Result<Started, SetupError> {
    start_with_dead_peer(
        configs,
        registry,
        staleness,
        series_cap_per_agent,
        Duration::MAX,
        shutdown,
    )
}

/// [`start`], with the collector's dead-peer time (`control.heartbeat_interval_seconds ×
/// control.dead_after_missed_heartbeats`): a stall of the collector longer than that drops
/// the samples it holds of its agents (module docs; `Duration::MAX`: never). The handle
/// can be [reconfigured](RemoteWrite::reconfigure) later (must be called inside a tokio
/// runtime: the tasks of endpoints a reload adds run on it).
///
/// # Errors
/// As [`start`].
pub fn start_with_dead_peer(
    configs: &[RemoteWriteConfig],
    registry: &prometheus::Registry,
    staleness: Duration,
    series_cap_per_agent: usize,
    dead_peer: Duration,
    shutdown: &Shutdown,
) -> Result<Started, SetupError> {
    let context = live::Context::new(
        registry.clone(),
        staleness,
        series_cap_per_agent,
        dead_peer,
        shutdown.clone(),
    );
    let mut endpoints = Vec::new();
    let mut tasks = Vec::new();
    for (i, c) in configs.iter().enumerate() {
        let e = context.endpoint(i, c)?;
        tasks.extend(context.spawn(&e));
        endpoints.push(e);
    }
    let endpoints: Arc<[Arc<Endpoint>]> = endpoints.into();
    let live = Arc::new(Live::new(context, endpoints.clone()));
    Ok(Started {
        handle: RemoteWrite {
            live,
            cached: endpoints,
            generation: 0,
            scratch: Scratch::default(),
        },
        tasks,
    })
}

/// Notices the collector's own stalls even when no sample arrives (`stall` module).
async fn stall_loop(shards: Arc<Shards>, mut shutdown: Shutdown) {
    let mut tick = tokio::time::interval(stall::TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                shards.watch(Instant::now());
            }
            _ = shutdown.wait() => return,
        }
    }
}

/// Ends series not updated for `staleness` (stale markers), every few seconds.
async fn expire_loop(shards: Arc<Shards>, staleness: Duration, mut shutdown: Shutdown) {
    let every = (staleness / 4).clamp(Duration::from_millis(100), Duration::from_secs(5));
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let now = Instant::now();
                if let Some(before) = now.checked_sub(staleness) {
                    shards.expire(before, now, unix_ms(SystemTime::now()));
                }
            }
            _ = shutdown.wait() => return,
        }
    }
}

/// The collector registered for remote-write: it holds every shard lock of every endpoint
/// while the families are read, so a scrape sees the counters of one instant.
#[derive(Debug)]
pub struct LockedCollector {
    families: Families,
    endpoints: Arc<Mutex<Vec<Arc<Shards>>>>,
    descs: Vec<Desc>,
}

impl LockedCollector {
    /// Wraps `families`; the endpoints are added as they start.
    pub(crate) fn new(
        families: Families,
        endpoints: Arc<Mutex<Vec<Arc<Shards>>>>,
    ) -> LockedCollector {
        let descs = families
            .collectors()
            .iter()
            .flat_map(|c| c.desc().into_iter().cloned())
            .collect();
        LockedCollector {
            families,
            endpoints,
            descs,
        }
    }
}

impl Collector for LockedCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<proto::MetricFamily> {
        let endpoints = self
            .endpoints
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for e in &endpoints {
            e.counters().series.set(e.series() as i64);
        }
        let _guards: Vec<_> = endpoints
            .iter()
            .flat_map(|e| e.shards.iter().map(|s| s.lock()))
            .collect();
        self.families
            .collectors()
            .iter()
            .flat_map(|c| c.collect())
            .collect()
    }
}

/// How an endpoint's counters read for the output log (`outputs::report`).
fn tally(c: Arc<Counters>) -> impl Fn() -> crate::outputs::report::Tally + Send {
    move || crate::outputs::report::Tally {
        delivered: c.samples_sent(),
        retried: c.retried.get(),
        pending: u64::try_from(c.pending.get()).unwrap_or(0),
        given_up: Dropped::ALL
            .iter()
            .map(|r| (r.as_str(), c.dropped(*r)))
            .chain(Failed::ALL.iter().map(|r| {
                let label = match r {
                    Failed::Rejected => "rejected",
                    Failed::Shutdown => "failed at shutdown",
                    Failed::Reload => "failed at reload",
                };
                (label, c.failed_count(*r))
            }))
            .collect(),
    }
}
