//! The agent daemon: sources, the local `/metrics`, and the connection life.
//!
//! ```text
//!  run ─┬─ host metrics loop ─┐
//!       ├─ self-metrics loop ─┼─► bounded queues ─► session: SenderCore ─► DataPlane (UC QP)
//!       ├─ log tailer threads ┘                        ▲   │ Hello/Proof/Heartbeat/Goodbye
//!       ├─ /metrics (optional)                         └── control TCP ◄── Welcome/Report/…
//!       └─ connection loop: session → backoff (+ jitter) → session with a NEW epoch …
//! ```
//!
//! A session (one epoch) connects the control TCP channel, builds the UC QP, runs the
//! handshake (DESIGN.md §6), connects the QP to the collector's endpoint from `Welcome` and
//! then drives the send pipeline: records are pulled from the queues, framed, paced, given
//! credits and posted; `Report`s return credits and set `delivery_ratio`; heartbeats go both
//! ways. The session ends on shutdown (final frames, then `Goodbye` with the final
//! sequences), on the collector's `Goodbye`, on a dead or broken control connection, or on a
//! QP error. Streams set to `reliability: rc` travel on a second lane, an RC QP with a
//! pipeline of its own, driven in the same loop ([`crate::lane`]). The connection loop then
//! waits with exponential backoff and full jitter and starts a new session with a new epoch.
//! While there is no session, metric samples are held in the bounded metrics buffer
//! ([`crate::buffer`]) with their collection time, and a session ending (lost, drain,
//! rebalance) puts the samples its pipeline still holds back in front of them; the next
//! session sends them before any newer collection, as credits allow. What the buffer cannot
//! hold is dropped, the oldest first, as `not_connected`. Log lines wait in their bounded
//! queue and, beyond it, in their files, because the tailers only read what the queue can
//! hold.
//!
//! A shutdown logs the epoch's final figures once `Goodbye` is written, one line with
//! `key=value` fields that end-to-end tests read:
//!
//! ```text
//! goodbye sent epoch=… frames=N [rc_frames=M] metrics_frames=… metrics_records=… logs_frames=… logs_records=… [fault_dropped=…]
//! ```
//!
//! `frames` counts the connection's frames, both lanes (= `final_conn_seq + 1`, plus
//! `rc_final_conn_seq + 1` with an RC lane), `rc_frames` the RC lane's (only with one);
//! `*_frames` and `*_records` are per stream (= `final_stream_seq + 1` and
//! `final_record_count` of `Goodbye`); `fault_dropped` (only with `transport.soft.fault`)
//! counts the packets this session's fault injectors dropped (both lanes').

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use uctel_common::shutdown::Shutdown;
use uctel_protocol::control::{
    self, Body, GoodbyeReason, Hello, RefuseReason, Welcome, PROTOCOL_VERSION,
};
use uctel_protocol::limits::Limits;
use uctel_protocol::session::{Liveness, LivenessConfig, LivenessEvent};
use uctel_transport::api::QpType;

use crate::config::{faults_enabled, seconds, AgentConfig, DataPath, TokenError, TransportKind};
use crate::control::{ControlConn, ControlError, HandshakeFailure};
use crate::credits::DemandMeter;
use crate::datapath::{DataPlane, DataPlaneError};
use crate::lane::{self, LaneError, RcLane};
use crate::pool::{self, Pool, PoolMetrics, SwitchReason};
use crate::runners::{self, Queues};
use crate::selfmetrics::{DropReason, FaultTally, SelfMetrics};
use crate::sender::core::{FinalSequences, SenderConfig, SenderCore};
use crate::sender::pump::{self, Stop};
use crate::stream::Stream;

mod establish;
mod negotiate;
use establish::{can_hand_over, establish, Established};
use negotiate::negotiated;

/// Frames per stream waiting for pacing before the pipeline stops taking records.
const READY_FRAMES: usize = 64;
/// Longest time spent sending the last frames at shutdown before `Goodbye`.
const FINISH_GRACE: Duration = Duration::from_secs(2);
/// Longest wait for a control message to be written (a collector that stops reading must
/// not stall the sender).
const CONTROL_SEND_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest wait at the end of a session for posted sends to complete.
const DRAIN_GRACE: Duration = Duration::from_millis(500);
/// Retry interval while the QP's send queue or send buffers are full.
const BUSY_RETRY: Duration = Duration::from_millis(1);
/// How often completions are reaped while RC sends are in flight: they complete with their
/// ACK (a round trip, or a retransmit timeout, later) and the device's progress thread runs
/// the protocol, so the session only frees buffers and looks for a failed QP.
const RC_REAP_EVERY: Duration = Duration::from_millis(10);
/// Heartbeat periods of silence after which the collector is dead, unless
/// `collector.heartbeat_timeout_seconds` is longer (the dead-peer rule,
/// `uctel_protocol::session::liveness`).
const AGENT_MISSED_HEARTBEATS: u32 = 3;

/// Sleeps until `at`; for ever without a deadline.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// Why the agent could not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The auth token could not be read.
    #[error(transparent)]
    Token(#[from] TokenError),
    /// The self-metrics could not be set up.
    #[error("self-metrics: {0}")]
    Metrics(String),
    /// The local `/metrics` listener could not be bound.
    #[error("listen.metrics {addr}: cannot listen for /metrics: {source}")]
    Listen {
        /// The configured address.
        addr: std::net::SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A source could not start.
    #[error("cannot start a source: {0}")]
    Source(String),
}

/// Resources a caller (a test, an embedding) can hand in.
#[derive(Debug, Default)]
pub struct Options {
    /// Self-metrics to use (to read the counters from outside); a fresh set otherwise.
    pub stats: Option<Arc<SelfMetrics>>,
    /// An already bound listener for `/metrics` (port 0 in tests); else `listen.metrics`.
    pub metrics_listener: Option<TcpListener>,
}

/// What a run did, for logs and tests.
#[derive(Debug, Clone, Default)]
pub struct RunSummary {
    /// Sessions that reached `Welcome`.
    pub sessions: u64,
    /// The final sequences of the last session.
    pub last_session: Option<FinalSequences>,
}

/// Runs the agent until `shutdown`.
///
/// # Errors
/// [`RunError`] for what prevents starting; connection failures are retried, never returned.
pub async fn run(config: AgentConfig, shutdown: Shutdown) -> Result<RunSummary, RunError> {
    run_with(config, Options::default(), shutdown).await
}

/// [`run`] with caller-provided resources.
///
/// # Errors
/// As [`run`].
pub async fn run_with(
    config: AgentConfig,
    options: Options,
    shutdown: Shutdown,
) -> Result<RunSummary, RunError> {
    let token = config.auth.read_token()?;
    let stats = match options.stats {
        Some(s) => s,
        None => Arc::new(SelfMetrics::new().map_err(|e| RunError::Metrics(e.to_string()))?),
    };
    if config.transport.kind == TransportKind::Soft && faults_enabled(&config.transport.soft.fault)
    {
        stats
            .enable_fault_metrics()
            .map_err(|e| RunError::Metrics(e.to_string()))?;
    }
    if !config.streams.rc_streams().is_empty() {
        stats
            .enable_rc_metrics()
            .map_err(|e| RunError::Metrics(e.to_string()))?;
    }
    let queues = Queues::new(&config);
    let mut tasks = tokio::task::JoinSet::new();

    let listener = match (options.metrics_listener, config.listen.metrics) {
        (Some(l), _) => Some(l),
        (None, Some(addr)) => Some(
            TcpListener::bind(addr)
                .await
                .map_err(|source| RunError::Listen { addr, source })?,
        ),
        (None, None) => None,
    };
    if let Some(l) = listener {
        if let Ok(addr) = l.local_addr() {
            tracing::info!(%addr, "serving self-metrics on /metrics");
        }
        let render = uctel_common::http::registry_render(stats.registry().clone());
        let (connected, collector) = (stats.clone(), config.collector.control.to_string());
        let endpoints =
            uctel_common::http::Endpoints::new("uctel-agent", env!("CARGO_PKG_VERSION"), render)
                .ready(Arc::new(move || {
                    if connected.connected() {
                        Ok(())
                    } else {
                        Err(format!("not connected to the collector at {collector}"))
                    }
                }));
        tasks.spawn(uctel_common::http::serve(l, endpoints, shutdown.clone()));
    }
    runners::spawn_metric_sources(&config, &queues, &stats, &shutdown, &mut tasks);
    let threads = runners::spawn_log_tailers(&config, &queues, &stats, &shutdown)
        .map_err(RunError::Source)?;

    let summary = connection_loop(&config, &token, &queues, &stats, shutdown.clone()).await;
    // The sender has stopped: the log tailers checkpoint exactly what it settled.
    queues.logs_handoff.close();

    // Sources stop on the same shutdown; account for what they queued last (log lines among
    // it are read again after a restart) and let the log tailers write their final
    // checkpoints.
    while tasks.join_next().await.is_some() {}
    let grace = Instant::now() + runners::LOG_HANDOFF_GRACE;
    while !threads.iter().all(std::thread::JoinHandle::is_finished) && Instant::now() < grace {
        pump::discard_queued(&queues, &stats, DropReason::Shutdown);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for t in threads {
        let _ = t.join();
    }
    pump::discard_queued(&queues, &stats, DropReason::Shutdown);
    stats.set_connected(false);
    let totals = |s: Stream| (stats.records_sent(s), stats.records_dropped_all(s));
    let (m, l, f) = (
        totals(Stream::Metrics),
        totals(Stream::Logs),
        totals(Stream::FastCounters),
    );
    tracing::info!(
        metrics_records_collected = stats.metrics_records_collected(),
        metrics_records_sent = m.0,
        metrics_records_dropped = m.1,
        logs_records_sent = l.0,
        logs_records_dropped = l.1,
        fast_counters_records_sent = f.0,
        fast_counters_records_dropped = f.1,
        "stopped: records sent and dropped per stream over the whole run"
    );
    Ok(summary)
}

/// How a session ended.
#[derive(Debug)]
enum SessionEnd {
    /// Shutdown was requested; `Goodbye` was sent.
    Shutdown,
    /// The collector said `Goodbye`, the connection died or a QP failed: reconnect.
    Lost(String, LostOn),
    /// The collector is draining (its `Goodbye` said so): the epoch ended cleanly; move to
    /// the next collector of the pool at once.
    Drain(String),
    /// A collector ranked higher has been healthy for `return_after_seconds` (or the
    /// current one left the pool): the epoch ended cleanly; move to `to`, whose session is
    /// `ready` when it welcomed the agent before the epoch ended (`None`: connect to it).
    Rebalance {
        to: SocketAddr,
        ready: Option<Box<Established>>,
    },
}

/// What a lost session lost: its control connection (or the collector ended it) or its data
/// path (a QP error, a failed post, an RDMA async event) while the control connection was up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LostOn {
    Control,
    DataPath,
}

/// A planned move's connection and handshake ([`establish`]), run beside the session.
type Handover<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Established, SessionError>> + Send + 'a>,
>;

/// One connection attempt: where, with which epoch, after how many sessions.
#[derive(Debug, Clone, Copy)]
struct Attempt {
    addr: SocketAddr,
    epoch: u64,
    previous_sessions: u64,
}

/// Why a session failed before or during the handshake.
#[derive(Debug, thiserror::Error)]
enum SessionError {
    #[error("cannot resolve or connect to the collector at {addr}: {detail}")]
    Connect { addr: String, detail: String },
    #[error("handshake timed out after {0:?}")]
    HandshakeTimeout(Duration),
    #[error(transparent)]
    Control(#[from] ControlError),
    #[error(transparent)]
    DataPlane(#[from] DataPlaneError),
    #[error("unusable Welcome: {0}")]
    Welcome(String),
    #[error(transparent)]
    Lane(#[from] LaneError),
}

/// Reconnect backoff with "full jitter" (AWS Architecture Blog, *Exponential Backoff And
/// Jitter*): the ceiling is `initial × 2^attempt` capped at `max`, and the wait is drawn
/// uniformly between a tenth of the ceiling (a small floor, so no retry is immediate) and
/// the ceiling; `jitter` (0 to 1) is the uniform draw. The wait is never longer than `max`.
pub fn backoff(initial: Duration, max: Duration, attempt: u32, jitter: f64) -> Duration {
    let ceiling = initial.saturating_mul(1u32 << attempt.min(20)).min(max);
    let floor = ceiling / 10;
    let jitter = if jitter.is_finite() {
        jitter.clamp(0.0, 1.0)
    } else {
        1.0
    };
    (floor + (ceiling - floor).mul_f64(jitter)).min(max)
}

/// Whether a welcomed session lost `on` after `lasted` starts the reconnect backoff over.
/// A lost control connection does (the collector restarted: reconnect fast). A lost data
/// path (a QP error, a failed post, an RDMA async event, while the control connection is
/// up: an RC QP that runs out of retries in a fabric outage) does only after a session at
/// least as long as the longest backoff `max`, which proved the path; a shorter one keeps
/// the backoff growing, so an outage rebuilds QPs at a growing, jittered interval instead
/// of once per retry budget (about a second).
fn resets_backoff(on: LostOn, lasted: Duration, max: Duration) -> bool {
    on == LostOn::Control || lasted >= max
}

/// The connection side of the agent across sessions: the collector pool, its metrics, and
/// what the last session left for the next switch (`pool` module docs).
struct Connector {
    targets: Arc<[String]>,
    pool: Arc<std::sync::Mutex<Pool>>,
    metrics: PoolMetrics,
    resolve_every: Duration,
    /// The collector of the last `Welcome`.
    last: Option<SocketAddr>,
    /// Why the agent left `last`.
    leaving: SwitchReason,
    /// A collector ranked above the one that welcomed us refused us on this walk.
    refused_on_walk: bool,
    /// The frames per second the sessions needed: `Hello.expected_frames_per_second`.
    demand: DemandMeter,
}

fn lock_pool(pool: &std::sync::Mutex<Pool>) -> std::sync::MutexGuard<'_, Pool> {
    pool.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Connector {
    fn new(config: &AgentConfig, metrics: PoolMetrics) -> Connector {
        Connector {
            targets: config.collector.control.targets().into(),
            pool: Arc::new(std::sync::Mutex::new({
                let mut pool = Pool::new(&config.agent_id);
                pool.set_return_spread(seconds(config.collector.return_spread_seconds));
                pool
            })),
            metrics,
            resolve_every: seconds(config.collector.resolve_interval_seconds),
            last: None,
            leaving: SwitchReason::Lost,
            refused_on_walk: false,
            demand: DemandMeter::default(),
        }
    }

    /// Resolves the targets when due; the walk order. An error when no member is known.
    async fn walk_order(&mut self) -> Result<Vec<SocketAddr>, SessionError> {
        let due = lock_pool(&self.pool).resolution_due(self.resolve_every, Instant::now());
        if !due {
            return Ok(lock_pool(&self.pool).walk_order());
        }
        let (addrs, errors) = pool::resolve(&self.targets).await;
        for (target, error) in &errors {
            tracing::warn!(collector = %target, %error, "cannot resolve a collector address");
        }
        let mut pool = lock_pool(&self.pool);
        pool.resolved(&addrs, Instant::now());
        let order = pool.walk_order();
        if order.is_empty() {
            return Err(SessionError::Connect {
                addr: self.targets.join(", "),
                detail: errors
                    .into_iter()
                    .map(|(t, e)| format!("{t}: {e}"))
                    .collect::<Vec<_>>()
                    .join("; "),
            });
        }
        Ok(order)
    }

    /// `addr` welcomed the agent: counts a switch when it is not the last collector.
    fn welcomed(&mut self, addr: SocketAddr) {
        lock_pool(&self.pool).connected(addr);
        if let Some(last) = self.last.filter(|l| *l != addr) {
            let reason = match self.leaving {
                SwitchReason::Lost if self.refused_on_walk => SwitchReason::Refused,
                r => r,
            };
            self.metrics.switched(reason);
            tracing::info!(from = %last, to = %addr, reason = reason.as_str(), "moved to another collector of the pool");
        }
        self.metrics.set_current(Some(addr));
        self.last = Some(addr);
        self.leaving = SwitchReason::Lost;
        self.refused_on_walk = false;
    }
}

/// What to do after one walk of the pool.
enum AfterWalk {
    /// Stop: shutdown.
    Shutdown,
    /// Walk again at once (the agent moved on purpose: drain, rebalance).
    Now,
    /// Wait the reconnect backoff (`max`: the longest), then walk again.
    Backoff { longest: bool },
}

async fn connection_loop(
    config: &AgentConfig,
    token: &[u8],
    queues: &Queues,
    stats: &Arc<SelfMetrics>,
    mut shutdown: Shutdown,
) -> RunSummary {
    let mut summary = RunSummary::default();
    let mut attempt: u32 = 0;
    let mut duplicate_warned = false;
    let initial = seconds(config.collector.reconnect_initial_seconds);
    let max = seconds(config.collector.reconnect_max_seconds);
    let metrics = match PoolMetrics::register(stats.registry()) {
        Ok(m) => m,
        Err(e) => {
            tracing::error!(error = %e, "cannot register the collector pool's self-metrics");
            return summary;
        }
    };
    let mut connector = Connector::new(config, metrics);
    // The session a planned move established before it ended the previous epoch.
    let mut handed: Option<Box<Established>> = None;
    while !shutdown.is_triggered() {
        let order = match handed.take() {
            Some(ready) => vec![(ready.collector, ready.epoch, Some(ready))],
            None => match connector.walk_order().await {
                Ok(o) => o
                    .into_iter()
                    .map(|a| (a, rand::random::<u64>(), None))
                    .collect(),
                Err(e) => {
                    tracing::warn!(error = %e, attempt, "connection to the collector failed");
                    Vec::new()
                }
            },
        };
        let mut after = AfterWalk::Backoff { longest: false };
        // Whether a session of this walk starts the backoff over (`resets_backoff`).
        let mut stable_once = false;
        for (addr, epoch, ready) in order {
            if shutdown.is_triggered() {
                after = AfterWalk::Shutdown;
                break;
            }
            let mut welcomed = false;
            let began = tokio::time::Instant::now();
            let result = session(
                config,
                token,
                queues,
                stats,
                Attempt {
                    addr,
                    epoch,
                    previous_sessions: summary.sessions,
                },
                ready,
                &mut welcomed,
                &mut connector,
                &shutdown,
            )
            .await;
            if let Err(SessionError::Control(ControlError::Refused { reason, .. })) = &result {
                connector.metrics.refused(*reason);
            }
            stats.set_connected(false);
            connector.metrics.set_current(None);
            if welcomed {
                summary.sessions += 1;
            }
            let mut pool = lock_pool(&connector.pool);
            match result {
                Ok((end, fin)) => {
                    summary.last_session = Some(fin);
                    if !matches!(end, SessionEnd::Lost(..)) {
                        stable_once = true;
                    }
                    match end {
                        SessionEnd::Shutdown => {
                            after = AfterWalk::Shutdown;
                        }
                        SessionEnd::Lost(why, on) => {
                            stable_once |= resets_backoff(on, began.elapsed(), max);
                            // The failed attempts in a row the next wait is drawn for.
                            let backoff_attempt = if stable_once { 0 } else { attempt };
                            pool.failed(addr);
                            connector.leaving = SwitchReason::Lost;
                            tracing::warn!(epoch = format_args!("{epoch:#x}"), collector = %addr, reason = %why, backoff_attempt, "connection to the collector lost; reconnecting with a new epoch");
                        }
                        SessionEnd::Drain(why) => {
                            pool.failed(addr);
                            connector.leaving = SwitchReason::Drain;
                            tracing::info!(epoch = format_args!("{epoch:#x}"), collector = %addr, detail = %why, "the collector is draining; moving to the next collector of the pool");
                            after = AfterWalk::Now;
                        }
                        SessionEnd::Rebalance { to, ready } => {
                            connector.leaving = SwitchReason::Rebalance;
                            tracing::info!(epoch = format_args!("{epoch:#x}"), from = %addr, to = %to, welcomed = ready.is_some(), "a collector ranked higher is healthy (or this one left the pool); moved to it");
                            handed = ready;
                            after = AfterWalk::Now;
                        }
                    }
                    break;
                }
                Err(SessionError::Control(ControlError::Refused {
                    reason: RefuseReason::DuplicateAgentId,
                    detail,
                })) => {
                    // Another agent with our id is connected: retry at the longest backoff,
                    // and say so once (then at debug level) rather than every attempt.
                    if !duplicate_warned {
                        tracing::warn!(
                            agent_id = %config.agent_id,
                            collector = %addr,
                            detail = %detail,
                            retry_every = ?max,
                            "the collector refused this agent: another agent with the same agent_id \
                             is connected; give each agent its own agent_id. Retrying at the longest \
                             backoff; this is logged once"
                        );
                        duplicate_warned = true;
                    } else {
                        tracing::debug!(detail = %detail, "refused again: duplicate agent_id");
                    }
                    after = AfterWalk::Backoff { longest: true };
                    break;
                }
                Err(SessionError::Control(ControlError::Refused {
                    reason: reason @ (RefuseReason::Busy | RefuseReason::Draining),
                    detail,
                })) => {
                    // Full or draining: the next collector of the pool, at once.
                    pool.failed(addr);
                    connector.refused_on_walk = true;
                    tracing::warn!(collector = %addr, reason = reason.label(), detail = %detail, "the collector refused this agent; trying the next collector of the pool");
                }
                Err(e) => {
                    pool.failed(addr);
                    if welcomed {
                        connector.leaving = SwitchReason::Lost;
                        break;
                    }
                    tracing::warn!(epoch = format_args!("{epoch:#x}"), collector = %addr, error = %e, attempt, "connection to the collector failed");
                }
            }
        }
        if stable_once {
            attempt = 0;
        }
        let wait = match after {
            AfterWalk::Shutdown => break,
            AfterWalk::Now => continue,
            // A duplicate agent_id waits the whole maximum: the other agent will not leave
            // soon.
            AfterWalk::Backoff { longest: true } => {
                attempt = attempt.max(31);
                max
            }
            AfterWalk::Backoff { longest: false } => {
                backoff(initial, max, attempt, rand::random::<f64>())
            }
        };
        attempt = attempt.saturating_add(1);
        let until = tokio::time::Instant::now() + wait;
        // Wait, moving the metric samples queued meanwhile into the metrics buffer as they
        // come (stamped with their collection time); log lines stay in their bounded queue
        // and files.
        loop {
            pump::buffer_queued_metrics(queues, stats);
            tokio::select! {
                () = tokio::time::sleep_until(until) => break,
                () = queues.metrics.notified() => {}
                () = shutdown.wait() => break,
            }
        }
    }
    summary
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
        .chars()
        .take(control::MAX_HOSTNAME_BYTES)
        .collect()
}

/// Frames `core` posted in its session, every stream.
fn frames_sent(core: &SenderCore) -> u64 {
    Stream::ALL
        .iter()
        .map(|s| core.stats().stream(*s).frames_sent)
        .sum()
}

/// Lets the posted sends reach the wire (their completions polled), for at most
/// [`DRAIN_GRACE`]: before `Goodbye`, and so the fault injector has seen every frame.
async fn drain_sends(plane: &mut DataPlane) {
    let until = Instant::now() + DRAIN_GRACE;
    while !plane.idle() && Instant::now() < until {
        plane.reap();
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[allow(clippy::too_many_arguments)]
async fn session(
    config: &AgentConfig,
    token: &[u8],
    queues: &Queues,
    stats: &Arc<SelfMetrics>,
    attempt: Attempt,
    ready: Option<Box<Established>>,
    welcomed: &mut bool,
    connector: &mut Connector,
    shutdown: &Shutdown,
) -> Result<(SessionEnd, FinalSequences), SessionError> {
    let Attempt {
        addr: collector,
        epoch,
        previous_sessions,
    } = attempt;
    let connect_timeout = seconds(config.collector.connect_timeout_seconds);
    let addr = collector.to_string();
    let announce = connector
        .demand
        .announce(config.collector.expected_frames_per_second);
    let Established {
        mut conn,
        mut plane,
        rc_plane,
        welcome,
        sender_config,
        ..
    } = match ready {
        Some(ready) => *ready,
        None => establish(config, token, collector, epoch, announce).await?,
    };
    let mut rc = RcLane::start(rc_plane, &welcome, &sender_config, config, epoch, stats)?;
    *welcomed = true;
    connector.welcomed(collector);
    connector.demand.start_session(Instant::now());
    let report_interval = Duration::from_millis(u64::from(welcome.report_interval_ms));
    let mut core = SenderCore::new(&sender_config, epoch, Instant::now(), stats.clone())
        .map_err(|e| SessionError::Welcome(e.to_string()))?;
    if let Some(g) = welcome.credit_grant {
        core.on_grant(g);
    }
    if let Some(l) = rc.as_mut() {
        // One set of pacing caps for the connection, whichever lane a frame takes.
        l.core.share_pacer_with(&mut core);
    }
    // This session's fault injector counts from zero; the tally keeps the agent's totals.
    let mut faults = plane.fault_stats().map(FaultTally::new);
    let mut sync_faults = |stats: &SelfMetrics| faults.as_mut().map(|t| t.sync(stats));
    stats.set_connected(true);
    if previous_sessions > 0 {
        stats.reconnected();
    }
    tracing::info!(
        epoch = format_args!("{epoch:#x}"),
        collector = %addr,
        slots = welcome.slots,
        credit_window = sender_config.credit_window,
        max_frame_bytes = sender_config.limits.max_frame_bytes,
        rc_slots = welcome.rc_lane.as_ref().filter(|_| rc.is_some()).map(|l| l.slots),
        rc_credit_window = rc.as_ref().map(|l| l.credit_window),
        announced_frames_per_second = connector.demand.announce(config.collector.expected_frames_per_second),
        "connected to the collector"
    );

    // Heartbeats at the collector's period; the collector is dead after
    // max(3 heartbeats, heartbeat_timeout_seconds) of silence (the dead-peer rule of
    // `uctel_protocol::session::liveness`).
    let heartbeat_every = sender_config
        .idle_heartbeat
        .unwrap_or(Duration::from_secs(5));
    let mut liveness = Liveness::new(
        LivenessConfig::new(
            heartbeat_every,
            AGENT_MISSED_HEARTBEATS,
            seconds(config.collector.heartbeat_timeout_seconds),
        ),
        Instant::now(),
    );
    let dead_after = liveness.dead_after();
    let mut sd = shutdown.clone();
    // Probes of the collectors ranked above this one (none at the first choice), and the
    // periodic re-resolution of the pool's names, off the send path.
    let probe_every = seconds(config.collector.probe_interval_seconds);
    let return_after = seconds(config.collector.return_after_seconds);
    // The first probe at a random phase of the interval: agents that connected together
    // do not probe, and so do not move, in step (`pool` module docs).
    let mut probe_tick = tokio::time::interval_at(
        tokio::time::Instant::now() + probe_every.mul_f64(rand::random::<f64>()),
        probe_every,
    );
    probe_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut probes: Option<tokio::task::JoinHandle<()>> = None;
    // A planned move's handshake with the collector moved to, while this session sends.
    let mut handover: Option<(SocketAddr, Handover<'_>)> = None;

    let mut last_heartbeat = 0u64;
    // The lanes take turns going first: they draw on one pacer, and the first to ask takes
    // the tokens.
    let mut rc_first = false;
    let end = loop {
        // The RC lane first: on the soft transport its QP shares the UC plane's device,
        // whose async events the UC plane takes; the lane sees its own failure by its error
        // completion (queued before the device's async event), so it is counted as the RC
        // QP's.
        if let Some(why) = rc.as_mut().and_then(|l| l.failure(stats)) {
            break SessionEnd::Lost(why, LostOn::DataPath);
        }
        if let Some(kind) = plane.poll_async_events(stats.rdma()) {
            break SessionEnd::Lost(
                format!("RDMA async event {}", kind.as_str()),
                LostOn::DataPath,
            );
        }
        if plane.reap() > 0 || plane.failed() {
            break SessionEnd::Lost("the UC QP went to ERROR".into(), LostOn::DataPath);
        }
        rc_first = rc.is_some() && !rc_first;
        let mut rc_stop = None;
        if rc_first {
            rc_stop = rc.as_mut().map(|l| l.step(queues, stats));
        }
        pump::pull(&mut core, queues, stats);
        let stop = pump::transmit(&mut core, &mut plane);
        pump::settle(&core, queues);
        sync_faults(stats);
        if !rc_first {
            rc_stop = rc.as_mut().map(|l| l.step(queues, stats));
        }
        if rc_stop == Some(Stop::Failed) {
            stats.rc_lane_failed();
            break SessionEnd::Lost("posting to the RC QP failed".into(), LostOn::DataPath);
        }
        let rc_credit = rc.as_mut().is_some_and(|l| l.core.take_credit_heartbeat());
        let uc_credit = core.take_credit_heartbeat();
        if uc_credit | rc_credit {
            connector.demand.starved();
            // Out of credit with frames to send, or a window taken back: tell the
            // collector now rather than at the next heartbeat (it answers with a report).
            // The heartbeat counter is repeated: this is not a period of its own.
            let hb = lane::heartbeat_with_counters(
                last_heartbeat,
                &mut core,
                rc.as_mut().map(|l| &mut l.core),
                stats,
            );
            match tokio::time::timeout(CONTROL_SEND_TIMEOUT, conn.send(hb)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => break SessionEnd::Lost(e.to_string(), LostOn::Control),
                Err(_) => {
                    break SessionEnd::Lost(
                        "the collector stopped reading the control connection".into(),
                        LostOn::Control,
                    )
                }
            }
        }
        let mut deadline = match lane::merge_stops(stop, rc_stop) {
            Stop::Wait(at) => at,
            Stop::Busy => Some(Instant::now() + BUSY_RETRY),
            Stop::Failed => {
                break SessionEnd::Lost("posting to the UC QP failed".into(), LostOn::DataPath)
            }
        };
        let in_flight = if !plane.idle() {
            // Sends in flight: poll their completions soon (with a busy-poll soft device,
            // polling is also what moves packets the socket could not take at once).
            Some(BUSY_RETRY)
        } else {
            rc.as_ref()
                .is_some_and(|l| !l.plane.idle())
                .then_some(RC_REAP_EVERY)
        };
        if let Some(after) = in_flight {
            let soon = Instant::now() + after;
            deadline = Some(deadline.map_or(soon, |d| d.min(soon)));
        }
        tokio::select! {
            () = sleep_until(deadline) => {}
            () = queues.metrics.notified() => {}
            () = queues.logs.notified() => {}
            msg = conn.recv() => {
                liveness.on_receive(Instant::now());
                match msg {
                    Ok(m) => match m.body {
                        Some(Body::Report(r)) => {
                            let _ = core.on_report(&r);
                            // Both lanes' frames: one announced rate sizes both lanes' rings.
                            let sent = frames_sent(&core) + rc.as_ref().map_or(0, |l| frames_sent(&l.core));
                            connector.demand.on_report(Instant::now(), sent, report_interval);
                            if let Some(l) = rc.as_mut() {
                                l.on_report(&r);
                            }
                            for s in &r.streams {
                                if let Some(stream) = Stream::from_id(s.stream_id) {
                                    let total = s.received.saturating_add(s.lost);
                                    #[allow(clippy::cast_precision_loss)]
                                    let ratio = if total == 0 { 1.0 } else { s.received as f64 / total as f64 };
                                    stats.set_delivery_ratio(stream, ratio);
                                }
                            }
                        }
                        Some(Body::Heartbeat(_)) => {}
                        Some(Body::Goodbye(g)) if g.reason == GoodbyeReason::Drain as i32 => {
                            break SessionEnd::Drain(g.detail);
                        }
                        Some(Body::Goodbye(g)) => {
                            break SessionEnd::Lost(format!("the collector said goodbye: {}", g.detail), LostOn::Control);
                        }
                        Some(other) => {
                            break SessionEnd::Lost(format!("unexpected {} from the collector", other.name()), LostOn::Control);
                        }
                        None => break SessionEnd::Lost("empty control message".into(), LostOn::Control),
                    },
                    Err(e) => break SessionEnd::Lost(e.to_string(), LostOn::Control),
                }
            }
            () = sleep_until(liveness.poll_timeout()) => match liveness.handle_timeout(Instant::now()) {
                Some(LivenessEvent::PeerDead { .. }) => {
                    break SessionEnd::Lost(format!("nothing heard from the collector for {dead_after:?}"), LostOn::Control);
                }
                Some(LivenessEvent::SendHeartbeat { sequence }) => {
                    last_heartbeat = sequence;
                    let hb = lane::heartbeat_with_counters(sequence, &mut core, rc.as_mut().map(|l| &mut l.core), stats);
                    match tokio::time::timeout(CONTROL_SEND_TIMEOUT, conn.send(hb)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => break SessionEnd::Lost(e.to_string(), LostOn::Control),
                        Err(_) => break SessionEnd::Lost("the collector stopped reading the control connection".into(), LostOn::Control),
                    }
                }
                None => {}
            },
            res = async {
                match handover.as_mut() {
                    Some((_, h)) => h.await,
                    None => std::future::pending().await,
                }
            }, if handover.is_some() => {
                let Some((to, _)) = handover.take() else { continue };
                match res {
                    Ok(ready) => break SessionEnd::Rebalance { to, ready: Some(Box::new(ready)) },
                    Err(e) => {
                        // Refused or unreachable: this session and its epoch go on.
                        if let SessionError::Control(ControlError::Refused { reason, .. }) = &e {
                            connector.metrics.refused(*reason);
                        }
                        lock_pool(&connector.pool).failed(to);
                        tracing::warn!(epoch = format_args!("{epoch:#x}"), collector = %addr, to = %to, error = %e, "moving to another collector of the pool failed; staying on this one with the same epoch");
                    }
                }
            }
            _ = probe_tick.tick() => {
                let to = handover.is_none().then(|| lock_pool(&connector.pool).return_to(collector, return_after, Instant::now())).flatten();
                if let Some(to) = to {
                    if !can_hand_over(config) {
                        break SessionEnd::Rebalance { to, ready: None };
                    }
                    let announce = connector.demand.announce(config.collector.expected_frames_per_second);
                    handover = Some((to, Box::pin(establish(config, token, to, rand::random(), announce))));
                }
                if probes.as_ref().is_none_or(tokio::task::JoinHandle::is_finished) {
                    probes = Some(tokio::spawn(pool::refresh(
                        connector.pool.clone(),
                        connector.targets.clone(),
                        connector.resolve_every,
                        collector,
                        connect_timeout,
                    )));
                }
            }
            () = sd.wait() => break SessionEnd::Shutdown,
        }
    };
    if let Some(p) = probes {
        p.abort();
    }
    drop(handover);

    match end {
        SessionEnd::Shutdown | SessionEnd::Drain(_) | SessionEnd::Rebalance { .. } => {
            // Last frames: first what the sources queued (log lines waiting for credit
            // included, as long as reports keep coming), then every stream's
            // LAST_OF_EPOCH frame, all within FINISH_GRACE.
            let until = Instant::now() + FINISH_GRACE;
            let mut finished = false;
            loop {
                plane.reap();
                if let Some(l) = rc.as_mut() {
                    l.reap();
                }
                if !finished {
                    pump::pull(&mut core, queues, stats);
                    if let Some(l) = rc.as_mut() {
                        pump::pull(&mut l.core, queues, stats);
                    }
                    if queues.metrics_buffer.is_empty()
                        && queues.metrics.is_empty()
                        && queues.logs.is_empty()
                    {
                        core.finish(pump::unix_ns());
                        if let Some(l) = rc.as_mut() {
                            l.core.finish(pump::unix_ns());
                        }
                        finished = true;
                    }
                }
                let stop = pump::transmit(&mut core, &mut plane);
                pump::settle(&core, queues);
                let rc_stop = rc.as_mut().map(|l| l.transmit(queues, stats));
                let stop = lane::merge_stops(stop, rc_stop);
                let rc_ready = rc.as_ref().map_or(0, |l| l.core.ready_frames());
                let done = finished && core.ready_frames() == 0 && rc_ready == 0;
                if done || Instant::now() >= until || stop == Stop::Failed {
                    break;
                }
                // Waiting for credits (a Report) or pacing.
                let wait = match stop {
                    Stop::Wait(Some(at)) => at.min(until),
                    Stop::Wait(None) if !finished => until,
                    _ => Instant::now() + BUSY_RETRY,
                };
                tokio::select! {
                    () = tokio::time::sleep_until(wait.into()) => {}
                    msg = conn.recv() => match msg {
                        Ok(m) => if let Some(Body::Report(r)) = m.body {
                            let _ = core.on_report(&r);
                            if let Some(l) = rc.as_mut() {
                                l.on_report(&r);
                            }
                        },
                        Err(_) => break,
                    }
                }
            }
            if !finished {
                // Out of time: close the epoch with what could be sent; the rest is
                // counted as `shutdown` below.
                core.finish(pump::unix_ns());
                let _ = pump::transmit(&mut core, &mut plane);
                pump::settle(&core, queues);
                if let Some(l) = rc.as_mut() {
                    l.core.finish(pump::unix_ns());
                    let _ = l.transmit(queues, stats);
                }
            }
            let (reason, detail) = match &end {
                SessionEnd::Drain(_) => (
                    GoodbyeReason::Reconnect,
                    "the collector is draining; moving to the next collector".to_owned(),
                ),
                SessionEnd::Rebalance { to, .. } => (
                    GoodbyeReason::Reconnect,
                    format!("moving to the collector at {to}"),
                ),
                _ => (GoodbyeReason::Shutdown, "agent shutting down".to_owned()),
            };
            if matches!(end, SessionEnd::Shutdown) {
                // What is left was not sent: counted as `shutdown`, not settled, so the log
                // sources read those lines again after a restart.
                core.drop_pending(DropReason::Shutdown);
                if let Some(l) = rc.as_mut() {
                    drain_sends(&mut l.plane).await;
                    l.take_acks();
                    l.drop_pending(DropReason::Shutdown, queues);
                }
            } else {
                // Moving on: the metric samples that could not be sent in time wait in the
                // metrics buffer for the next collector; the rest is dropped as when the
                // connection is lost.
                pump::take_back_metrics(&mut core, queues, stats);
                core.drop_pending(DropReason::NotConnected);
                pump::settle(&core, queues);
                if let Some(l) = rc.as_mut() {
                    drain_sends(&mut l.plane).await;
                    l.take_acks();
                    pump::take_back_metrics(&mut l.core, queues, stats);
                    l.drop_pending(DropReason::NotConnected, queues);
                }
            }
            drain_sends(&mut plane).await;
            // What a fault injector still holds back (reorder, delay) goes out now or is
            // counted as its drop, before its figures go into the `goodbye sent` line.
            plane.flush_link();
            let session_faults = lane::sync_session_faults(sync_faults(stats), rc.as_mut(), stats);
            let fin = lane::merged(&core, rc.as_ref().map(|l| &l.core));
            let rc_fin = rc.as_ref().map(|l| l.core.final_sequences());
            let bye = lane::goodbye(&fin, rc_fin.and_then(|f| f.last_conn_seq), reason, &detail);
            // A last heartbeat first: the counters with this epoch's final drops (`shutdown`
            // included) reach the collector before the connection closes.
            let hb = lane::heartbeat_with_counters(
                last_heartbeat,
                &mut core,
                rc.as_mut().map(|l| &mut l.core),
                stats,
            );
            let _ = tokio::time::timeout(CONTROL_SEND_TIMEOUT, async {
                let _ = conn.send(hb).await;
                let _ = conn.send(bye).await;
                conn.shutdown().await;
            })
            .await;
            let reason = match &end {
                SessionEnd::Drain(_) => "drain",
                SessionEnd::Rebalance { .. } => "rebalance",
                _ => "shutdown",
            };
            let dropped = session_faults.map(|c| c.dropped);
            lane::log_goodbye(epoch, collector, reason, &fin, rc_fin.as_ref(), dropped);
            Ok((end, fin))
        }
        SessionEnd::Lost(why, on) => {
            // The metric samples not posted yet wait in the metrics buffer for the next
            // session; the rest is dropped.
            pump::take_back_metrics(&mut core, queues, stats);
            core.drop_pending(DropReason::NotConnected);
            pump::settle(&core, queues);
            drain_sends(&mut plane).await;
            if let Some(l) = rc.as_mut() {
                // The last acknowledgements first: what they cover is settled, what they
                // do not is read again (`RcLane::drop_pending`).
                drain_sends(&mut l.plane).await;
                l.take_acks();
                pump::take_back_metrics(&mut l.core, queues, stats);
                l.drop_pending(DropReason::NotConnected, queues);
            }
            plane.flush_link();
            let session_faults = lane::sync_session_faults(sync_faults(stats), rc.as_mut(), stats);
            let fin = lane::merged(&core, rc.as_ref().map(|l| &l.core));
            let rc_fin = rc.as_ref().map(|l| l.core.final_sequences());
            let rc_final = rc_fin.and_then(|f| f.last_conn_seq);
            let bye = lane::goodbye(&fin, rc_final, GoodbyeReason::Reconnect, &why);
            let sent = tokio::time::timeout(CONTROL_SEND_TIMEOUT, conn.send(bye)).await;
            // With the control connection up (a data-path loss) the collector takes the
            // Goodbye and settles the epoch by it: its figures, as after a planned end.
            if on == LostOn::DataPath && matches!(sent, Ok(Ok(_))) {
                let dropped = session_faults.map(|c| c.dropped);
                lane::log_goodbye(epoch, collector, "lost", &fin, rc_fin.as_ref(), dropped);
            }
            Ok((SessionEnd::Lost(why, on), fin))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_path_loss_resets_the_backoff_only_after_a_session_as_long_as_its_longest() {
        let max = Duration::from_secs(30);
        let d = LostOn::DataPath;
        assert!(!resets_backoff(d, Duration::from_millis(600), max));
        assert!(!resets_backoff(d, Duration::from_secs(29), max));
        assert!(resets_backoff(d, Duration::from_secs(30), max));
        assert!(resets_backoff(d, Duration::from_secs(3600), max));
        // A lost control connection always starts over.
        assert!(resets_backoff(
            LostOn::Control,
            Duration::from_millis(1),
            max
        ));
    }

    #[test]
    fn backoff_grows_with_full_jitter_below_the_ceiling() {
        let i = Duration::from_millis(100);
        let m = Duration::from_secs(10);
        // The draw spans a tenth of the ceiling to the ceiling.
        assert_eq!(backoff(i, m, 0, 0.0), Duration::from_millis(10));
        assert_eq!(backoff(i, m, 0, 1.0), Duration::from_millis(100));
        assert_eq!(backoff(i, m, 3, 0.0), Duration::from_millis(80));
        assert_eq!(backoff(i, m, 3, 1.0), Duration::from_millis(800));
        assert_eq!(backoff(i, m, 3, 0.5), Duration::from_millis(440));
        // Capped: the ceiling is the maximum from attempt 7 on.
        assert_eq!(backoff(i, m, 7, 1.0), m);
        assert_eq!(backoff(i, m, 30, 0.0), m / 10);
        assert_eq!(backoff(i, m, u32::MAX, 1.0), m);
        // Out-of-range draws are clamped.
        assert_eq!(backoff(i, m, 30, 7.0), m);
        assert_eq!(backoff(i, m, 30, -1.0), m / 10);
        assert_eq!(backoff(i, m, 30, f64::NAN), m);
    }

    /// The reported case: `reconnect_max_seconds: 30` waited 35.9 s and 43 s with the old
    /// ±50 % jitter. The maximum is a maximum, whatever the attempt and the draw.
    #[test]
    fn backoff_never_exceeds_the_maximum() {
        let i = Duration::from_millis(500);
        let m = Duration::from_secs(30);
        let mut longest = Duration::ZERO;
        for attempt in 0..40 {
            for k in 0..=1000 {
                let wait = backoff(i, m, attempt, f64::from(k) / 1000.0);
                assert!(wait <= m, "attempt {attempt}, draw {k}: {wait:?}");
                assert!(wait >= i / 10, "attempt {attempt}, draw {k}: {wait:?}");
                longest = longest.max(wait);
            }
        }
        assert_eq!(longest, m);
    }
}
