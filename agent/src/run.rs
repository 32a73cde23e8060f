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
//! pipeline of its own, driven in the same loop ([`crate::lane`]). The session's logic is a
//! state struct fed by a thin async driver (`run/session/`). The connection loop then
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
use crate::lane::{self, LaneError};
use crate::log_sources::LogSources;
use crate::metric_sources::MetricSources;
use crate::pool::{self, Pool, PoolMetrics, SwitchReason};
use crate::runners::{self, Queues};
use crate::selfmetrics::{DropReason, SelfMetrics};
use crate::sender::core::{FinalSequences, SenderConfig, SenderCore};
use crate::sender::pump::{self, Stop};
use crate::stream::Stream;

mod establish;
mod negotiate;
mod session;
use establish::{can_hand_over, establish, Established};
use negotiate::negotiated;
use session::session;

/// Frames per stream waiting for pacing before the pipeline stops taking records.
const READY_FRAMES: usize = 64;
/// Longest time spent sending the last frames at shutdown before `Goodbye`.
const FINISH_GRACE: Duration = Duration::from_secs(2);
/// Longest wait for a control message to be written (a collector that stops reading must
/// not stall the sender).
const CONTROL_SEND_TIMEOUT: Duration = Duration::from_secs(2);
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
    /// Reload the configuration from here (`SIGHUP`, `POST /-/reload`); no reload without.
    pub reload: Option<crate::reload::ReloadSource>,
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
    let log_sources =
        LogSources::start(&config, &queues, &stats, &shutdown).map_err(RunError::Source)?;
    let metric_sources = MetricSources::start(&config, &queues, &stats, &shutdown);
    let admin = admin(
        &config,
        options.reload,
        &stats,
        (&queues, &log_sources, &metric_sources),
    )?;
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
                }))
                .admin(admin);
        let status = crate::status::Status::new(
            config.agent_id.clone(),
            stats.registry().clone(),
            stats.status().clone(),
        );
        let serve_status = status.clone();
        let endpoints = endpoints.status(Arc::new(move || serve_status.json()));
        tasks.spawn(crate::status::sample_loop(status, shutdown.clone()));
        tasks.spawn(uctel_common::http::serve(l, endpoints, shutdown.clone()));
    }

    let summary = connection_loop(&config, &token, &queues, &stats, shutdown.clone()).await;
    // The sender has stopped: the log tailers checkpoint exactly what it settled.
    queues.logs_handoff.close();

    // Sources stop on the same shutdown; account for what they queued last (log lines among
    // it are read again after a restart) and let the log tailers write their final
    // checkpoints.
    while tasks.join_next().await.is_some() {}
    metric_sources.join().await;
    let grace = Instant::now() + runners::LOG_HANDOFF_GRACE;
    while !log_sources.all_finished() && Instant::now() < grace {
        pump::discard_queued(&queues, &stats, DropReason::Shutdown);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    log_sources.join();
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

/// The reload and log-filter endpoints (`uctel_common::admin`) over the installed log
/// filter (a detached one for an agent inside another program) and the log tailers;
/// `SIGHUP` runs the reload.
fn admin(
    config: &AgentConfig,
    source: Option<crate::reload::ReloadSource>,
    stats: &SelfMetrics,
    (queues, log_sources, metric_sources): (&Queues, &Arc<LogSources>, &Arc<MetricSources>),
) -> Result<uctel_common::admin::Admin, RunError> {
    let level = uctel_common::logging::LogLevel::installed_or_detached();
    let admin =
        uctel_common::admin::Admin::new(config.listen.enable_lifecycle).log_level(level.clone());
    let Some(source) = source else {
        return Ok(admin);
    };
    let sources = crate::reload::Sources {
        queues: queues.clone(),
        logs: log_sources.clone(),
        metrics: metric_sources.clone(),
    };
    let reload = crate::reload::reloader(config, source, level, stats.registry(), sources)
        .map_err(|e| RunError::Metrics(e.to_string()))?;
    uctel_common::reload::on_sighup(reload.clone());
    Ok(admin.reload(reload))
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

/// The connection loop's state across walks of the pool: the sessions so far, the failed
/// attempts in a row (the backoff's exponent), and a session a planned move established.
struct Reconnect<'a> {
    config: &'a AgentConfig,
    token: &'a [u8],
    queues: &'a Queues,
    stats: &'a Arc<SelfMetrics>,
    connector: Connector,
    summary: RunSummary,
    /// Failed attempts in a row: the reconnect backoff's exponent.
    attempt: u32,
    /// A duplicate `agent_id` was logged at warning level once.
    duplicate_warned: bool,
    /// The session a planned move established before it ended the previous epoch.
    handed: Option<Box<Established>>,
    /// `collector.reconnect_max_seconds`: the longest backoff.
    max: Duration,
}

/// One collector to try on a walk: its address, the epoch of the session, and the session
/// a planned move already established with it.
type Candidate = (SocketAddr, u64, Option<Box<Established>>);

async fn connection_loop(
    config: &AgentConfig,
    token: &[u8],
    queues: &Queues,
    stats: &Arc<SelfMetrics>,
    mut shutdown: Shutdown,
) -> RunSummary {
    let initial = seconds(config.collector.reconnect_initial_seconds);
    let metrics = match PoolMetrics::register(stats.registry()) {
        Ok(m) => m,
        Err(e) => {
            tracing::error!(error = %e, "cannot register the collector pool's self-metrics");
            return RunSummary::default();
        }
    };
    let mut r = Reconnect {
        config,
        token,
        queues,
        stats,
        connector: Connector::new(config, metrics),
        summary: RunSummary::default(),
        attempt: 0,
        duplicate_warned: false,
        handed: None,
        max: seconds(config.collector.reconnect_max_seconds),
    };
    while !shutdown.is_triggered() {
        let order = r.order().await;
        let (after, stable_once) = r.walk(order, &shutdown).await;
        if stable_once {
            r.attempt = 0;
        }
        let wait = match after {
            AfterWalk::Shutdown => break,
            AfterWalk::Now => continue,
            // A duplicate agent_id waits the whole maximum: the other agent will not leave
            // soon.
            AfterWalk::Backoff { longest: true } => {
                r.attempt = r.attempt.max(31);
                r.max
            }
            AfterWalk::Backoff { longest: false } => {
                backoff(initial, r.max, r.attempt, rand::random::<f64>())
            }
        };
        r.attempt = r.attempt.saturating_add(1);
        hold_metrics_until(
            tokio::time::Instant::now() + wait,
            queues,
            stats,
            &mut shutdown,
        )
        .await;
    }
    r.summary
}

/// Waits until `until` (or shutdown), moving the metric samples queued meanwhile into the
/// metrics buffer as they come (stamped with their collection time); log lines stay in
/// their bounded queue and files.
async fn hold_metrics_until(
    until: tokio::time::Instant,
    queues: &Queues,
    stats: &SelfMetrics,
    shutdown: &mut Shutdown,
) {
    loop {
        pump::buffer_queued_metrics(queues, stats);
        tokio::select! {
            () = tokio::time::sleep_until(until) => break,
            () = queues.metrics.notified() => {}
            () = shutdown.wait() => break,
        }
    }
}

impl Reconnect<'_> {
    /// The collectors to try on this walk: the one a planned move established, else the
    /// pool's walk order, each with a new random epoch (none when no member is known).
    async fn order(&mut self) -> Vec<Candidate> {
        if let Some(ready) = self.handed.take() {
            return vec![(ready.collector, ready.epoch, Some(ready))];
        }
        match self.connector.walk_order().await {
            Ok(o) => o
                .into_iter()
                .map(|a| (a, rand::random::<u64>(), None))
                .collect(),
            Err(e) => {
                let attempt = self.attempt;
                tracing::warn!(error = %e, attempt, "connection to the collector failed");
                Vec::new()
            }
        }
    }

    /// One walk of `order`: a session with each collector until one was welcomed (or
    /// shutdown). Returns what to do next and whether a session of this walk starts the
    /// backoff over ([`resets_backoff`]).
    async fn walk(&mut self, order: Vec<Candidate>, shutdown: &Shutdown) -> (AfterWalk, bool) {
        let mut stable_once = false;
        for (addr, epoch, ready) in order {
            if shutdown.is_triggered() {
                return (AfterWalk::Shutdown, stable_once);
            }
            let mut welcomed = false;
            let began = tokio::time::Instant::now();
            let attempt = Attempt {
                addr,
                epoch,
                previous_sessions: self.summary.sessions,
            };
            let result = session(
                self.config,
                self.token,
                self.queues,
                self.stats,
                attempt,
                ready,
                &mut welcomed,
                &mut self.connector,
                shutdown,
            )
            .await;
            if let Err(SessionError::Control(ControlError::Refused { reason, .. })) = &result {
                self.connector.metrics.refused(*reason);
            }
            self.stats.set_connected(false);
            self.connector.metrics.set_current(None);
            if welcomed {
                self.summary.sessions += 1;
            }
            let lasted = began.elapsed();
            if let Some(after) = self.on_result(attempt, result, welcomed, lasted, &mut stable_once)
            {
                return (after, stable_once);
            }
        }
        (AfterWalk::Backoff { longest: false }, stable_once)
    }

    /// What a session's `result` means for the walk: `Some` ends the walk with what to do
    /// next, `None` tries the next collector. Marks the pool, the reason the agent leaves a
    /// collector, and `stable_once` for a session that starts the backoff over.
    fn on_result(
        &mut self,
        attempt: Attempt,
        result: Result<(SessionEnd, FinalSequences), SessionError>,
        welcomed: bool,
        lasted: Duration,
        stable_once: &mut bool,
    ) -> Option<AfterWalk> {
        let Attempt { addr, epoch, .. } = attempt;
        let mut pool = lock_pool(&self.connector.pool);
        match result {
            Ok((end, fin)) => {
                self.summary.last_session = Some(fin);
                if !matches!(end, SessionEnd::Lost(..)) {
                    *stable_once = true;
                }
                match end {
                    SessionEnd::Shutdown => Some(AfterWalk::Shutdown),
                    SessionEnd::Lost(why, on) => {
                        *stable_once |= resets_backoff(on, lasted, self.max);
                        // The failed attempts in a row the next wait is drawn for.
                        let backoff_attempt = if *stable_once { 0 } else { self.attempt };
                        pool.failed(addr);
                        self.connector.leaving = SwitchReason::Lost;
                        tracing::warn!(epoch = format_args!("{epoch:#x}"), collector = %addr, reason = %why, backoff_attempt, "connection to the collector lost; reconnecting with a new epoch");
                        Some(AfterWalk::Backoff { longest: false })
                    }
                    SessionEnd::Drain(why) => {
                        pool.failed(addr);
                        self.connector.leaving = SwitchReason::Drain;
                        tracing::info!(epoch = format_args!("{epoch:#x}"), collector = %addr, detail = %why, "the collector is draining; moving to the next collector of the pool");
                        Some(AfterWalk::Now)
                    }
                    SessionEnd::Rebalance { to, ready } => {
                        self.connector.leaving = SwitchReason::Rebalance;
                        tracing::info!(epoch = format_args!("{epoch:#x}"), from = %addr, to = %to, welcomed = ready.is_some(), "a collector ranked higher is healthy (or this one left the pool); moved to it");
                        self.handed = ready;
                        Some(AfterWalk::Now)
                    }
                }
            }
            Err(SessionError::Control(ControlError::Refused {
                reason: RefuseReason::DuplicateAgentId,
                detail,
            })) => {
                // Another agent with our id is connected: retry at the longest backoff,
                // and say so once (then at debug level) rather than every attempt.
                if !self.duplicate_warned {
                    tracing::warn!(
                        agent_id = %self.config.agent_id,
                        collector = %addr,
                        detail = %detail,
                        retry_every = ?self.max,
                        "the collector refused this agent: another agent with the same agent_id \
                         is connected; give each agent its own agent_id. Retrying at the longest \
                         backoff; this is logged once"
                    );
                    self.duplicate_warned = true;
                } else {
                    tracing::debug!(detail = %detail, "refused again: duplicate agent_id");
                }
                Some(AfterWalk::Backoff { longest: true })
            }
            Err(SessionError::Control(ControlError::Refused {
                reason: reason @ (RefuseReason::Busy | RefuseReason::Draining),
                detail,
            })) => {
                // Full or draining: the next collector of the pool, at once.
                pool.failed(addr);
                self.connector.refused_on_walk = true;
                tracing::warn!(collector = %addr, reason = reason.label(), detail = %detail, "the collector refused this agent; trying the next collector of the pool");
                None
            }
            Err(e) => {
                pool.failed(addr);
                if welcomed {
                    self.connector.leaving = SwitchReason::Lost;
                    return Some(AfterWalk::Backoff { longest: false });
                }
                let attempt = self.attempt;
                tracing::warn!(epoch = format_args!("{epoch:#x}"), collector = %addr, error = %e, attempt, "connection to the collector failed");
                None
            }
        }
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
        .chars()
        .take(control::MAX_HOSTNAME_BYTES)
        .collect()
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
