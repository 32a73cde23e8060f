//! The control plane (DESIGN.md §6): a tokio TCP server, one task per agent connection.
//!
//! ```text
//! agent                                   collector
//!   Hello (id, hostname, epoch, QP) ───►  version? transport? data path? id known?
//!                                   ◄───  Challenge (32-byte nonce)
//!   Proof (HMAC-SHA256 of the token) ──►  verify (constant time)
//!                                         create QP + ring, connect QP to the agent's endpoint
//!                                   ◄───  Welcome (QP, ring address, rkey, slots, slot size,
//!                                         max frame, credit window, intervals, data path)
//!   Heartbeat ◄──────────────────────────► Heartbeat        every heartbeat interval
//!                                   ◄───  Report (received, lost, loss fraction, consumed
//!                                         connection sequence = credits)   every report interval
//!   Goodbye (final sequences) ─────────►  settle tail loss, tear down
//! ```
//!
//! Refusals (`Refuse` with a reason, then close) are counted in
//! `uctel_collector_handshakes_refused_total{reason}` and logged once per connection.
//! A connection whose agent is silent for `dead_after_missed_heartbeats` heartbeat periods,
//! that leaves a control message unread for as long (its socket buffers full), whose QP went
//! to ERROR, or that is replaced by a new connection of the same agent id (an
//! agent restart racing its old, silent TCP connection) is torn down; the agent reconnects
//! with a new epoch. While a connection of an agent id is alive (heard from within the last
//! one and a half heartbeat intervals), a second connection with that id is refused with
//! `duplicate_agent_id` (two agents share the id: the first keeps its session, the second is
//! kept out and retries at its longest backoff, never a loop of replacements); counted in
//! `handshakes_refused_total{reason="duplicate_agent_id"}` and warned about once a minute
//! per agent id.
//!
//! Every session's end is counted in `sessions_ended_total{reason}`: `goodbye` (tail loss
//! exact), `no_goodbye` (settled from the agent's last heartbeat, which carries the
//! sequences sent by then: only what was sent after it is unknown), `replaced`, `shutdown`.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use uctel_common::control::{ChannelError, ControlChannel};
use uctel_common::shutdown::{self, Shutdown, ShutdownTrigger};
use uctel_protocol::control::{
    self as wire, Body, Challenge, DataPath, Goodbye, GoodbyeReason, Heartbeat, Hello, Refuse,
    RefuseReason, Transport, Welcome,
};
use uctel_protocol::limits::Limits;
use uctel_protocol::stream::StreamName;
use uctel_protocol::tracker::TrackerConfig;
use uctel_transport::api::{gid_from_ip, QpEndpoint, ROCE_V2_UDP_PORT};

use crate::config::{Config, DataPathConfig, Token, TransportKindConfig};
use crate::daemon::Shared;
use crate::dataplane::{Geometry, Session};
use crate::ingest::{ConnectionIngest, StreamLedger};
use crate::telemetry::SessionEnd;

/// The identity the collector announces in `Challenge`.
pub const COLLECTOR_ID: &str = "uctel-collector";

/// How long the collector waits after an agent's `Goodbye` for its last frames (already on the
/// wire when the goodbye was sent) to complete before settling the tail.
const GOODBYE_DRAIN: Duration = Duration::from_millis(50);

/// Most connections in the handshake at once (accepted, no `Welcome` yet). Each holds a task
/// and a file descriptor for up to `handshake_timeout_seconds`; further connections are
/// refused at once with `busy` (counted), so peers that open connections and say nothing
/// cannot exhaust the collector's file descriptors (its `/metrics` listener, log files and
/// agents' sessions need them too). Sessions of authenticated agents do not count.
pub const MAX_PENDING_HANDSHAKES: usize = 256;

/// Longest wait for a `Refuse` to be written (it is small; only a peer that stopped reading
/// makes it wait).
const REFUSE_WRITE_BOUND: Duration = Duration::from_secs(1);

/// Resolved tokens.
#[derive(Debug, Default)]
pub struct Auth {
    agents: HashMap<String, Token>,
    shared: Option<Token>,
}

impl Auth {
    /// Resolves every token of the configuration.
    ///
    /// # Errors
    /// A token that cannot be read (the configuration check reports these first).
    pub fn from_config(config: &Config) -> Result<Auth, String> {
        let mut agents = HashMap::new();
        for a in &config.auth.agents {
            agents.insert(a.id.clone(), a.source().resolve()?);
        }
        let shared = match &config.auth.shared {
            Some(s) => Some(s.resolve()?),
            None => None,
        };
        Ok(Auth { agents, shared })
    }

    /// The token `agent_id` must prove: its own, else the shared one.
    pub fn token_for(&self, agent_id: &str) -> Option<&Token> {
        self.agents.get(agent_id).or(self.shared.as_ref())
    }
}

/// One live session in the [`Registry`].
#[derive(Debug)]
struct LiveSession {
    /// Registry id (tells a session from its successor).
    id: u64,
    /// Ends the session.
    trigger: ShutdownTrigger,
    /// Set when the session ended.
    done: tokio::sync::watch::Receiver<bool>,
    /// The agent's control-connection address.
    peer: SocketAddr,
    /// The epoch the agent announced.
    epoch: u64,
    /// Shared with the session task.
    link: Arc<SessionLink>,
}

/// What a session shares with the connection that may replace it.
#[derive(Debug)]
struct SessionLink {
    /// When the agent last sent a control message (heartbeats at least every heartbeat
    /// interval); the session starts it at the `Welcome`.
    last_heard: Mutex<Instant>,
    /// Why a newer connection of the same agent id ended this one: the `Goodbye` detail.
    replaced_by: Mutex<Option<String>>,
    /// The session is ending (the agent said `Goodbye`, its connection closed, or the
    /// collector ended it): a new connection of the id is the agent coming back, not a twin.
    ending: std::sync::atomic::AtomicBool,
}

impl SessionLink {
    fn new() -> SessionLink {
        SessionLink {
            last_heard: Mutex::new(Instant::now()),
            replaced_by: Mutex::new(None),
            ending: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn set_ending(&self) {
        self.ending
            .store(true, std::sync::atomic::Ordering::Release);
    }

    fn is_ending(&self) -> bool {
        self.ending.load(std::sync::atomic::Ordering::Acquire)
    }

    fn heard(&self) {
        *lock(&self.last_heard) = Instant::now();
    }

    fn silent_for(&self) -> Duration {
        lock(&self.last_heard).elapsed()
    }
}

/// At most one warning about connections of one agent id replacing each other per this
/// period (`connections_replaced_total` counts every replacement).
pub const REPLACED_WARN_EVERY: Duration = Duration::from_secs(60);

/// Most agent ids the replacement-warning limiter remembers; when full, entries older than
/// [`REPLACED_WARN_EVERY`] are forgotten, and if it is still full the warning is skipped.
const REPLACED_WARN_ENTRIES: usize = 4096;

/// Most agent ids whose last epoch the collector remembers ([`Registry::swap_epoch`]). Ids
/// are only remembered after a successful handshake, but a shared token admits any id, so
/// the table is bounded: when full, the id remembered longest ago is forgotten (its next
/// connection then counts no `epoch_change` reset).
pub const MAX_REMEMBERED_EPOCHS: usize = 65_536;

/// Live sessions by agent id, so a reconnecting agent replaces its stale session; and the
/// last epoch of each agent id, so a new epoch is counted as a reset.
#[derive(Debug, Default)]
pub struct Registry {
    live: Mutex<HashMap<String, LiveSession>>,
    next: std::sync::atomic::AtomicU64,
    /// Agent id → (last epoch, stamp of the connection that announced it).
    epochs: Mutex<HashMap<String, (u64, u64)>>,
    /// Agent id → when a replacement of a live connection was last logged.
    replaced_warned: Mutex<HashMap<String, Instant>>,
}

impl Registry {
    /// True when a warning about `agent`'s connections replacing each other may be logged now
    /// (at most once per [`REPLACED_WARN_EVERY`] per agent id).
    fn should_warn_replaced(&self, agent: &str) -> bool {
        let now = Instant::now();
        let mut warned = lock(&self.replaced_warned);
        if let Some(last) = warned.get_mut(agent) {
            if now.duration_since(*last) < REPLACED_WARN_EVERY {
                return false;
            }
            *last = now;
            return true;
        }
        if warned.len() >= REPLACED_WARN_ENTRIES {
            warned.retain(|_, last| now.duration_since(*last) < REPLACED_WARN_EVERY);
            if warned.len() >= REPLACED_WARN_ENTRIES {
                return false;
            }
        }
        warned.insert(agent.to_owned(), now);
        true
    }

    /// Records `epoch` as `agent`'s latest and returns the epoch it had before, `None` for
    /// an agent id not remembered (new, or forgotten past [`MAX_REMEMBERED_EPOCHS`]).
    pub fn swap_epoch(&self, agent: &str, epoch: u64) -> Option<u64> {
        let stamp = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut epochs = lock(&self.epochs);
        if let Some(e) = epochs.get_mut(agent) {
            let previous = e.0;
            *e = (epoch, stamp);
            return Some(previous);
        }
        if epochs.len() >= MAX_REMEMBERED_EPOCHS {
            let oldest = epochs
                .iter()
                .min_by_key(|(_, (_, s))| *s)
                .map(|(a, _)| a.clone());
            if let Some(oldest) = oldest {
                epochs.remove(&oldest);
            }
        }
        epochs.insert(agent.to_owned(), (epoch, stamp));
        None
    }
}

/// Cumulative per-stream accounting of closed connections, by `(agent, stream)`.
pub type Ledger = Arc<Mutex<HashMap<(String, u32), StreamLedger>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Accepts agent connections until `shutdown`, then ends every connection (sending
/// `Goodbye`) and waits for them.
pub async fn serve(listener: TcpListener, shared: Shared, mut shutdown: Shutdown) {
    let mut tasks = JoinSet::new();
    let handshakes = Arc::new(tokio::sync::Semaphore::new(MAX_PENDING_HANDSHAKES));
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    let slot = handshakes.clone().try_acquire_owned().ok();
                    tasks.spawn(connection(stream, peer, shared.clone(), shutdown.clone(), slot));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "control listener accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            _ = shutdown.wait() => break,
        }
    }
    drop(listener);
    while tasks.join_next().await.is_some() {}
}

/// A handshake that ended in a refusal.
struct Refusal {
    reason: RefuseReason,
    agent: String,
    detail: String,
}

fn refusal(reason: RefuseReason, agent: &str, detail: impl Into<String>) -> Refusal {
    Refusal {
        reason,
        agent: agent.to_string(),
        detail: detail.into(),
    }
}

struct Accepted {
    hello: Hello,
    data_path: DataPath,
}

fn choose_data_path(config: &Config, hello: &Hello) -> Option<DataPath> {
    let offers = |p: DataPath| hello.capabilities.contains(&(p as i32));
    match config.ring.data_path {
        DataPathConfig::Auto if offers(DataPath::WriteWithImm) => Some(DataPath::WriteWithImm),
        DataPathConfig::Auto if offers(DataPath::Send) => Some(DataPath::Send),
        DataPathConfig::WriteWithImm if offers(DataPath::WriteWithImm) => {
            Some(DataPath::WriteWithImm)
        }
        DataPathConfig::Send if offers(DataPath::Send) => Some(DataPath::Send),
        _ => None,
    }
}

async fn handshake(
    ch: &mut ControlChannel<TcpStream>,
    shared: &Shared,
) -> Result<Accepted, Refusal> {
    let protocol = |e: ChannelError| refusal(RefuseReason::ProtocolError, "", e.to_string());
    let hello = match ch.recv().await.map_err(protocol)?.and_then(|m| m.body) {
        Some(Body::Hello(h)) => h,
        Some(other) => {
            return Err(refusal(
                RefuseReason::ProtocolError,
                "",
                format!("expected Hello, got {}", other.name()),
            ))
        }
        None => {
            return Err(refusal(
                RefuseReason::ProtocolError,
                "",
                "connection closed before Hello",
            ))
        }
    };
    let agent = hello.agent_id.clone();
    if hello.protocol_version != wire::PROTOCOL_VERSION {
        return Err(refusal(
            RefuseReason::VersionMismatch,
            &agent,
            format!(
                "control protocol version {} not supported; this collector speaks {}",
                hello.protocol_version,
                wire::PROTOCOL_VERSION
            ),
        ));
    }
    let agent_transport = Transport::try_from(hello.transport).unwrap_or(Transport::Unspecified);
    if let Some(detail) = transport_refusal(
        collector_transport(&shared.config),
        shared.plane.device().port_attr().udp_addr,
        agent_transport,
    ) {
        return Err(refusal(RefuseReason::TransportMismatch, &agent, detail));
    }
    let Some(data_path) = choose_data_path(&shared.config, &hello) else {
        return Err(refusal(
            RefuseReason::TransportMismatch,
            &agent,
            "no common data path",
        ));
    };
    let Some(token) = shared.auth.token_for(&agent) else {
        return Err(refusal(
            RefuseReason::UnknownAgent,
            &agent,
            "agent id not configured",
        ));
    };
    let nonce =
        wire::random_nonce().map_err(|e| refusal(RefuseReason::Busy, &agent, e.to_string()))?;
    ch.send(Challenge {
        nonce: nonce.to_vec(),
        collector_id: COLLECTOR_ID.to_string(),
    })
    .await
    .map_err(protocol)?;
    let proof = match ch.recv().await.map_err(protocol)?.and_then(|m| m.body) {
        Some(Body::Proof(p)) => p,
        other => {
            return Err(refusal(
                RefuseReason::ProtocolError,
                &agent,
                format!(
                    "expected Proof, got {}",
                    other.as_ref().map_or("end of stream", Body::name)
                ),
            ))
        }
    };
    if !wire::verify_proof(token.as_bytes(), &nonce, &agent, hello.epoch, &proof.hmac) {
        return Err(refusal(
            RefuseReason::BadProof,
            &agent,
            "proof does not match the token",
        ));
    }
    Ok(Accepted { hello, data_path })
}

/// The transport this collector's QPs run on.
fn collector_transport(config: &Config) -> Transport {
    match config.transport.kind {
        TransportKindConfig::Soft => Transport::Soft,
        TransportKindConfig::Verbs => Transport::Verbs,
    }
}

/// Why an agent on `agent` cannot reach a collector on `collector` (whose soft device, if any,
/// receives on `collector_udp`), or `None` when it can. Both transports speak RoCEv2 UC on
/// the wire (DESIGN.md §2: the soft transport is wire-compatible with rxe), so:
///
/// - same transport: always;
/// - soft agent, verbs collector: always. The collector's QP only receives; the device checks
///   an arriving packet's source IP against the QP's remote GID (rxe: `check_addr` in
///   `rxe_recv.c`), never its source UDP port, so the agent may send from any port;
/// - verbs agent, soft collector: only when the soft device receives on UDP port 4791, the
///   only port an RDMA device sends RoCEv2 to (IANA; rxe's `ROCE_V2_UDP_DPORT`).
fn transport_refusal(
    collector: Transport,
    collector_udp: Option<SocketAddr>,
    agent: Transport,
) -> Option<String> {
    match (collector, agent) {
        (c, a) if c == a => None,
        (Transport::Verbs, Transport::Soft) => None,
        (Transport::Soft, Transport::Verbs) => match collector_udp {
            Some(a) if a.port() == ROCE_V2_UDP_PORT => None,
            udp => Some(format!(
                "this collector's soft transport receives on {}; a verbs agent sends RoCEv2 \
                 only to UDP port {ROCE_V2_UDP_PORT}",
                udp.map_or_else(|| "no UDP address".to_owned(), |a| a.to_string())
            )),
        },
        (c, a) => Some(format!(
            "this collector runs the {} transport; the agent offers {}",
            c.as_str(),
            a.as_str()
        )),
    }
}

/// The agent's endpoint for our QP; an unspecified IP (agent bound to a wildcard) is replaced
/// by the address its TCP connection came from. A verbs collector gets the GID only: its QP
/// never sends to the agent, and an RDMA device accepts no UDP address but the GID's port
/// 4791, while a soft agent may send from any port ([`transport_refusal`]).
fn agent_endpoint(hello: &Hello, peer: SocketAddr, collector: Transport) -> Option<QpEndpoint> {
    let qp = hello.qp.as_ref()?;
    let udp_addr = qp.udp_socket_addr().map(|a| {
        if a.ip().is_unspecified() {
            SocketAddr::new(peer.ip(), a.port())
        } else {
            a
        }
    });
    let gid = match (udp_addr, qp.gid_array()) {
        (Some(a), Some(g)) if g == [0; 16] || a.ip() != uctel_transport::api::ip_from_gid(g) => {
            gid_from_ip(a.ip())
        }
        (_, Some(g)) => g,
        (Some(a), None) => gid_from_ip(a.ip()),
        (None, None) => return None,
    };
    Some(QpEndpoint {
        gid,
        qpn: qp.qpn,
        psn: qp.psn,
        mtu: qp.mtu,
        udp_addr: udp_addr.filter(|_| collector != Transport::Verbs),
    })
}

/// Our endpoint as the agent must see it: a wildcard bind is replaced by the local address of
/// the agent's TCP connection (the address it reached us on).
fn advertised_endpoint(ep: QpEndpoint, local_ip: IpAddr) -> wire::QpEndpoint {
    let udp_addr = ep.udp_addr.map(|a| {
        if a.ip().is_unspecified() {
            SocketAddr::new(local_ip, a.port())
        } else {
            a
        }
    });
    let gid = match udp_addr {
        Some(a) if ep.gid == gid_from_ip(IpAddr::from([0, 0, 0, 0])) || ep.gid == [0; 16] => {
            gid_from_ip(a.ip())
        }
        _ => ep.gid,
    };
    wire::QpEndpoint {
        gid: gid.to_vec(),
        qpn: ep.qpn,
        psn: ep.psn,
        mtu: ep.mtu,
        udp_addr: udp_addr.map(|a| a.to_string()).unwrap_or_default(),
    }
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn millis(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX).max(1)
}

/// One control connection; `handshake_slot` is its place among the
/// [`MAX_PENDING_HANDSHAKES`] (`None`: all taken, refused as `busy`).
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    shared: Shared,
    global: Shutdown,
    handshake_slot: Option<tokio::sync::OwnedSemaphorePermit>,
) {
    let local_ip = stream
        .local_addr()
        .map(|a| a.ip())
        .unwrap_or(IpAddr::from([127, 0, 0, 1]));
    let mut ch = ControlChannel::new(stream);
    let Some(handshake_slot) = handshake_slot else {
        let r = refusal(
            RefuseReason::Busy,
            "",
            format!("more than {MAX_PENDING_HANDSHAKES} handshakes in progress; retry later"),
        );
        return refuse(&mut ch, &shared, peer, r).await;
    };
    let timeout = Duration::try_from_secs_f64(shared.config.control.handshake_timeout_seconds)
        .unwrap_or(Duration::from_secs(5));
    let outcome = tokio::time::timeout(timeout, handshake(&mut ch, &shared)).await;
    let accepted = match outcome {
        Ok(Ok(a)) => a,
        Ok(Err(r)) => return refuse(&mut ch, &shared, peer, r).await,
        Err(_) => {
            let r = refusal(
                RefuseReason::HandshakeTimeout,
                "",
                format!("no Welcome within {timeout:?}"),
            );
            return refuse(&mut ch, &shared, peer, r).await;
        }
    };
    drop(handshake_slot);
    let agent = accepted.hello.agent_id.clone();
    let (my_trigger, my_cancel) = shutdown::channel();
    let (done_tx, done_rx) = tokio::sync::watch::channel(false);
    let link = Arc::new(SessionLink::new());
    // An agent id with a live session keeps it: a second agent with that id is refused. A
    // silent session is replaced (an agent restart racing its old connection).
    let alive_within =
        Duration::try_from_secs_f64(shared.config.control.heartbeat_interval_seconds)
            .unwrap_or(Duration::from_secs(5))
            .mul_f64(1.5);
    let admitted = {
        let mut live = lock(&shared.registry.live);
        match live.get(&agent) {
            Some(existing)
                if !existing.link.is_ending() && existing.link.silent_for() <= alive_within =>
            {
                Err((existing.peer, existing.epoch, existing.link.silent_for()))
            }
            _ => {
                let id = shared
                    .registry
                    .next
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let mine = LiveSession {
                    id,
                    trigger: my_trigger,
                    done: done_rx,
                    peer,
                    epoch: accepted.hello.epoch,
                    link: link.clone(),
                };
                Ok((id, live.insert(agent.clone(), mine)))
            }
        }
    };
    let (token_id, previous) = match admitted {
        Ok(v) => v,
        Err((first_peer, first_epoch, silent_for)) => {
            if shared.registry.should_warn_replaced(&agent) {
                tracing::warn!(
                    agent = %agent,
                    peer = %peer,
                    connected_peer = %first_peer,
                    connected_epoch = format_args!("{first_epoch:#x}"),
                    "refused a second connection of agent_id {agent:?} from {peer}: the agent \
                     connected from {first_peer} is alive (heard {silent_for:.1?} ago). Two \
                     agents share this agent_id? Give each its own. (Counted in \
                     uctel_collector_handshakes_refused_total{{reason=\"duplicate_agent_id\"}}; \
                     this warning repeats at most once a minute per agent id.)"
                );
            }
            let r = refusal(
                RefuseReason::DuplicateAgentId,
                &agent,
                format!(
                    "agent_id {agent:?} is already connected from {first_peer} and alive; \
                     give each agent its own agent_id"
                ),
            );
            return refuse(&mut ch, &shared, peer, r).await;
        }
    };
    if let Some(mut previous) = previous {
        if previous.link.is_ending() {
            // The agent came back while its old session finishes: wait for it (its
            // accounting is settled first), replace nothing.
            let _ =
                tokio::time::timeout(Duration::from_secs(5), previous.done.wait_for(|d| *d)).await;
        } else {
            replace(&shared, &agent, peer, accepted.hello.epoch, previous).await;
        }
    }
    let live = Live {
        cancel: my_cancel,
        link,
    };
    run_session(&mut ch, &shared, peer, local_ip, accepted, live, global).await;
    {
        let mut live = lock(&shared.registry.live);
        if live.get(&agent).is_some_and(|s| s.id == token_id) {
            live.remove(&agent);
        }
    }
    let _ = done_tx.send(true);
    ch.shutdown().await;
}

/// A new connection of `agent` from `peer` in `epoch` ends the agent's `previous`, silent
/// session and waits (bounded) for it to finish. (A live one refuses the new connection
/// instead, in `connection`.) A previous connection heard from within the last heartbeat
/// interval counts as `connections_replaced_total{previous="alive"}`, a race that the
/// refusal rule leaves only for a session that turned silent for a moment.
async fn replace(
    shared: &Shared,
    agent: &str,
    peer: SocketAddr,
    epoch: u64,
    mut previous: LiveSession,
) {
    let heartbeat = Duration::try_from_secs_f64(shared.config.control.heartbeat_interval_seconds)
        .unwrap_or(Duration::from_secs(5));
    let silent_for = previous.link.silent_for();
    let alive = silent_for <= heartbeat;
    shared.telemetry.connection_replaced(agent, alive);
    let detail = if alive {
        format!(
            "replaced by a new connection with the same agent_id {agent:?} from {peer} \
             (epoch {epoch:#x}) while this connection was alive: if that is not this agent \
             restarting, two agents share agent_id {agent:?}; give each agent its own agent_id"
        )
    } else {
        format!(
            "replaced by a newer connection of this agent_id from {peer} (epoch {epoch:#x}); \
             this connection was silent for {silent_for:.1?}"
        )
    };
    *lock(&previous.link.replaced_by) = Some(detail);
    if !alive {
        tracing::info!(
            agent,
            peer = %peer,
            previous_peer = %previous.peer,
            silent_for = ?silent_for,
            "agent reconnected; replacing its previous, silent connection"
        );
    } else if shared.registry.should_warn_replaced(agent) {
        tracing::warn!(
            agent,
            peer = %peer,
            epoch = format_args!("{epoch:#x}"),
            previous_peer = %previous.peer,
            previous_epoch = format_args!("{:#x}", previous.epoch),
            previous_silent_for = ?silent_for,
            "connection from {peer} replaced a still-alive connection of agent_id {agent:?} \
             from {}: two agents share agent_id? (each replacement is counted in \
             uctel_collector_connections_replaced_total; this warning repeats at most once a \
             minute per agent)",
            previous.peer
        );
    }
    previous.trigger.trigger();
    let _ = tokio::time::timeout(Duration::from_secs(5), previous.done.wait_for(|d| *d)).await;
}

/// `s` cut to at most `max` bytes at a character boundary (`String::truncate` panics inside
/// a character; details may quote the peer's bytes).
fn cut_at_char(mut s: String, max: usize) -> String {
    let mut cut = s.len().min(max);
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    s.truncate(cut);
    s
}

/// What a session needs from its [`Registry`] entry.
struct Live {
    /// Fires when a newer connection of the agent replaces this one.
    cancel: Shutdown,
    /// Liveness and the replacement's reason, shared with the replacing connection.
    link: Arc<SessionLink>,
}

/// Sends `msg` unless the write takes longer than `bound`: an agent that stops reading its
/// control connection fills the socket buffers, and an unbounded write would stall the
/// session (no heartbeat check, no shutdown) for good. False when the connection should end
/// (the error is logged).
async fn send_within(
    ch: &mut ControlChannel<TcpStream>,
    msg: impl Into<wire::ControlMessage>,
    bound: Duration,
    agent: &str,
) -> bool {
    match tokio::time::timeout(bound, ch.send(msg)).await {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            tracing::warn!(agent, error = %e, "sending a control message failed; closing");
            false
        }
        Err(_) => {
            tracing::warn!(agent, waited = ?bound, "agent stopped reading its control connection; closing");
            false
        }
    }
}

async fn refuse(ch: &mut ControlChannel<TcpStream>, shared: &Shared, peer: SocketAddr, r: Refusal) {
    shared
        .telemetry
        .handshake_refused(r.reason, &r.agent, &peer.to_string(), &r.detail);
    let mut detail = r.detail;
    // The detail may quote the peer's bytes (e.g. a bad `udp_addr`): cut at a character
    // boundary, `String::truncate` panics inside a character.
    let mut cut = detail.len().min(wire::MAX_DETAIL_BYTES);
    while !detail.is_char_boundary(cut) {
        cut -= 1;
    }
    detail.truncate(cut);
    let refuse = Refuse {
        reason: r.reason as i32,
        detail,
    };
    let _ = send_within(ch, refuse, REFUSE_WRITE_BOUND, &r.agent).await;
    ch.shutdown().await;
}

async fn run_session(
    ch: &mut ControlChannel<TcpStream>,
    shared: &Shared,
    peer: SocketAddr,
    local_ip: IpAddr,
    accepted: Accepted,
    live: Live,
    mut global: Shutdown,
) {
    let Live { mut cancel, link } = live;
    let cfg = &shared.config;
    let hello = &accepted.hello;
    let agent = hello.agent_id.clone();
    let tel = shared.telemetry.agent(&agent);
    let geometry = Geometry {
        slots: cfg.ring.slots,
        slot_bytes: cfg.ring.slot_bytes,
        max_frame_bytes: cfg.max_frame_bytes.0,
        send_buffers: cfg.ring.send_buffers,
        // Send path: never more frames outstanding than posted receive buffers (an empty
        // receive queue drops silently, DESIGN.md §4). The descriptor queue reserves this
        // window for the connection.
        credit_window: match accepted.data_path {
            DataPath::Send => cfg.ring.credit_window().min(cfg.ring.send_buffers),
            _ => cfg.ring.credit_window(),
        }
        .max(1),
    };
    let fail = |detail: String| Refusal {
        reason: RefuseReason::Busy,
        agent: agent.clone(),
        detail,
    };
    let Some(remote) = agent_endpoint(hello, peer, collector_transport(cfg)) else {
        let r = refusal(
            RefuseReason::ProtocolError,
            &agent,
            "Hello carries no usable QP endpoint",
        );
        return refuse(ch, shared, peer, r).await;
    };
    let id = shared.plane.next_session_id();
    let session = match Session::create(
        id,
        &agent,
        shared.plane.device(),
        accepted.data_path,
        geometry,
        tel.clone(),
    )
    .and_then(|s| s.connect(&remote).map(|()| s))
    {
        Ok(s) => Arc::new(s),
        Err(e) => return refuse(ch, shared, peer, fail(e.to_string())).await,
    };
    let limits = Limits {
        max_frame_bytes: cfg.max_frame_bytes.0 as usize,
        ..Limits::default()
    };
    let tracker = TrackerConfig {
        max_dropout: cfg.max_dropout_frames.0,
        reorder_window: cfg.reorder_window_frames.0,
    };
    let mut ingest = match ConnectionIngest::new(
        &agent,
        &hello.hostname,
        hello.epoch,
        limits,
        tracker,
        shared.store.clone(),
        shared.logs.clone(),
        tel.clone(),
    ) {
        Ok(i) => i,
        Err(e) => return refuse(ch, shared, peer, fail(e.to_string())).await,
    };
    ingest.set_previous_epoch(shared.registry.swap_epoch(&agent, hello.epoch));
    ingest.share_delivered(shared.delivered.clone());
    shared.plane.register(session.clone(), ingest);
    let heartbeat = Duration::try_from_secs_f64(cfg.control.heartbeat_interval_seconds)
        .unwrap_or(Duration::from_secs(5));
    let report_every = Duration::try_from_secs_f64(cfg.control.report_interval_seconds)
        .unwrap_or(Duration::from_secs(1));
    let welcome = Welcome {
        qp: Some(advertised_endpoint(session.local_endpoint(), local_ip)),
        ring_addr: session.ring.addr(),
        rkey: session.ring.rkey(),
        slots: geometry.slots,
        slot_bytes: geometry.slot_bytes,
        max_frame_bytes: geometry.max_frame_bytes,
        credit_window: geometry.credit_window,
        heartbeat_interval_ms: millis(heartbeat),
        report_interval_ms: millis(report_every),
        data_path: accepted.data_path as i32,
    };
    if let Err(e) = ch.send(welcome).await {
        tracing::warn!(agent = %agent, error = %e, "sending Welcome failed");
        let _ = shared.plane.close(id, None).await;
        return;
    }
    shared.telemetry.agents_connected().inc();
    tracing::info!(
        agent = %agent,
        hostname = %hello.hostname,
        peer = %peer,
        epoch = format_args!("{:#x}", hello.epoch),
        data_path = ?accepted.data_path,
        qpn = session.qp.qp_num(),
        "agent connected"
    );
    let dead_after = heartbeat.saturating_mul(cfg.control.dead_after_missed_heartbeats.max(1));
    let mut hb_tick = tokio::time::interval(heartbeat);
    let mut report_tick = tokio::time::interval(report_every);
    hb_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    report_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_heard = Instant::now();
    let mut hb_seq = 0u64;
    let mut goodbye: Option<Goodbye> = None;
    // Why the agent is gone when it left without a `Goodbye` (`None`: it said goodbye, or
    // the collector ended the session, `ending`).
    let mut vanished: Option<String> = None;
    let connected_at = Instant::now();
    let ending: Option<(GoodbyeReason, &'static str)> = loop {
        tokio::select! {
            msg = ch.recv() => match msg {
                Ok(Some(m)) => {
                    last_heard = Instant::now();
                    link.heard();
                    match m.body {
                        Some(Body::Heartbeat(hb)) => shared.plane.heartbeat(id, hb),
                        Some(Body::Goodbye(g)) => {
                            goodbye = Some(g);
                            break None;
                        }
                        Some(other) => {
                            tracing::warn!(agent = %agent, message = other.name(), "unexpected control message; closing");
                            break Some((GoodbyeReason::Error, "unexpected control message"));
                        }
                        None => break Some((GoodbyeReason::Error, "empty control message")),
                    }
                }
                Ok(None) => {
                    vanished = Some("the control connection closed without Goodbye".into());
                    break None;
                }
                Err(e) => {
                    vanished = Some(format!("the control connection failed: {e}"));
                    break None;
                }
            },
            _ = hb_tick.tick() => {
                if last_heard.elapsed() > dead_after {
                    vanished = Some(format!(
                        "no heartbeat for {:.1?} (at most {dead_after:?})",
                        last_heard.elapsed()
                    ));
                    break Some((GoodbyeReason::Error, "heartbeats missed"));
                }
                hb_seq += 1;
                let beat = Heartbeat { sequence: hb_seq, timestamp_ns: now_ns(), ..Heartbeat::default() };
                if !send_within(ch, beat, dead_after, &agent).await {
                    vanished = Some("a heartbeat could not be sent".into());
                    break None;
                }
            }
            _ = report_tick.tick() => {
                if let Some(report) = shared.plane.report(id).await {
                    if !send_within(ch, report, dead_after, &agent).await {
                        vanished = Some("a report could not be sent".into());
                        break None;
                    }
                }
            }
            _ = session.failed_notify.notified() => {
                break Some((GoodbyeReason::Error, "QP went to the ERROR state; reconnect"));
            }
            _ = cancel.wait() => break Some((GoodbyeReason::Reconnect, "replaced by a newer connection of this agent")),
            _ = global.wait() => break Some((GoodbyeReason::Shutdown, "collector shutting down")),
        }
    };
    link.set_ending();
    let ended_by = match (&goodbye, &vanished, ending) {
        (Some(g), ..) => format!("the agent's Goodbye ({})", goodbye_reason(g)),
        (None, Some(why), _) => why.clone(),
        (None, None, Some((_, detail))) => detail.to_owned(),
        (None, None, None) => "the session ended".to_owned(),
    };
    if let Some((reason, detail)) = ending {
        let replaced_by = lock(&link.replaced_by).take();
        let detail = match (reason, replaced_by) {
            (GoodbyeReason::Reconnect, Some(why)) => why,
            _ => detail.to_owned(),
        };
        let bye = Goodbye {
            final_conn_seq: None,
            streams: Vec::new(),
            reason: reason as i32,
            detail: cut_at_char(detail, wire::MAX_DETAIL_BYTES),
        };
        let _ = send_within(ch, bye, dead_after, &agent).await;
    }
    if goodbye.is_some() {
        tokio::time::sleep(GOODBYE_DRAIN).await;
    }
    let summary = shared.plane.close(id, goodbye.clone()).await;
    shared.telemetry.agents_connected().dec();
    tel.session_ended(match (&goodbye, ending) {
        (Some(_), _) => SessionEnd::Goodbye,
        (None, Some((GoodbyeReason::Reconnect, _))) => SessionEnd::Replaced,
        (None, Some((GoodbyeReason::Shutdown, _))) => SessionEnd::Shutdown,
        (None, _) => SessionEnd::NoGoodbye,
    });
    if let Some(summary) = summary {
        let mut ledger = lock(&shared.ledger);
        for (stream, l) in &summary.streams {
            let e = ledger.entry((agent.clone(), *stream)).or_default();
            e.accepted += l.accepted;
            e.lost += l.lost;
            e.late += l.late;
            e.duplicate += l.duplicate;
            e.dropped_after_tracking += l.dropped_after_tracking;
            e.records_received += l.records_received;
            e.records_lost += l.records_lost;
            e.records_replayed += l.records_replayed;
        }
        let streams = stream_summary(&summary.streams);
        let connected_for = connected_at.elapsed();
        if vanished.is_some() {
            tracing::warn!(
                agent = %agent,
                peer = %peer,
                epoch = format_args!("{:#x}", hello.epoch),
                ended_by,
                connected_for = format_args!("{connected_for:.1?}"),
                frames_received = summary.conn_received,
                frames_lost = summary.conn_lost,
                frames_dropped = summary.dropped_before_tracking,
                streams,
                "agent disconnected without Goodbye: frames it sent after the last one received \
                 are not counted as lost"
            );
        } else {
            tracing::info!(
                agent = %agent,
                peer = %peer,
                epoch = format_args!("{:#x}", hello.epoch),
                ended_by,
                connected_for = format_args!("{connected_for:.1?}"),
                frames_received = summary.conn_received,
                frames_lost = summary.conn_lost,
                frames_dropped = summary.dropped_before_tracking,
                streams,
                "agent disconnected"
            );
        }
    }
}

/// An agent's `Goodbye` reason and detail for a log line: `shutdown`, `shutdown: stopping`.
fn goodbye_reason(g: &Goodbye) -> String {
    let reason = match GoodbyeReason::try_from(g.reason) {
        Ok(GoodbyeReason::Shutdown) => "shutdown",
        Ok(GoodbyeReason::Reconnect) => "reconnect",
        Ok(GoodbyeReason::Error) => "error",
        _ => "unspecified",
    };
    let detail: String = g
        .detail
        .chars()
        .filter(|c| !c.is_control())
        .take(200)
        .collect();
    if detail.is_empty() {
        reason.to_owned()
    } else {
        format!("{reason}: {detail}")
    }
}

/// Per-stream accounting of a connection for a log line, by stream name:
/// `metrics: received 120, lost 0, dropped 0; logs: received 30, lost 2, dropped 0`
/// (`dropped`: frames tracked, then discarded for their payload).
fn stream_summary(streams: &[(u32, StreamLedger)]) -> String {
    if streams.is_empty() {
        return "none".to_owned();
    }
    streams
        .iter()
        .map(|(id, l)| {
            format!(
                "{}: received {}, lost {}, dropped {}",
                StreamName(*id),
                l.accepted,
                l.lost,
                l.dropped_after_tracking
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_are_remembered_per_agent_and_bounded() {
        let r = Registry::default();
        assert_eq!(r.swap_epoch("a", 1), None);
        assert_eq!(r.swap_epoch("a", 2), Some(1));
        assert_eq!(r.swap_epoch("b", 7), None);
        assert_eq!(r.swap_epoch("a", 3), Some(2));
        for i in 0..MAX_REMEMBERED_EPOCHS {
            let _ = r.swap_epoch(&format!("id-{i}"), 9);
        }
        assert_eq!(lock(&r.epochs).len(), MAX_REMEMBERED_EPOCHS);
        // "a" and "b" were remembered longest ago: forgotten first.
        assert_eq!(r.swap_epoch("b", 8), None);
        assert_eq!(r.swap_epoch("id-100", 10), Some(9));
    }

    fn udp(port: u16) -> Option<SocketAddr> {
        Some(SocketAddr::from(([10, 0, 0, 1], port)))
    }

    #[test]
    fn transports_that_share_the_rocev2_wire_are_accepted() {
        for t in [Transport::Soft, Transport::Verbs] {
            assert_eq!(transport_refusal(t, udp(5000), t), None, "{t:?}");
        }
        // A host without RDMA shipping to an RDMA collector.
        assert_eq!(
            transport_refusal(Transport::Verbs, None, Transport::Soft),
            None
        );
        // An RDMA host shipping to a soft collector on the RoCEv2 port.
        assert_eq!(
            transport_refusal(Transport::Soft, udp(4791), Transport::Verbs),
            None
        );
    }

    #[test]
    fn a_verbs_agent_cannot_reach_a_soft_collector_off_port_4791() {
        let why = transport_refusal(Transport::Soft, udp(5000), Transport::Verbs);
        let why = why.unwrap_or_default();
        assert!(
            why.contains("10.0.0.1:5000") && why.contains("4791"),
            "{why}"
        );
        assert!(transport_refusal(Transport::Soft, None, Transport::Verbs).is_some());
        assert!(transport_refusal(Transport::Verbs, None, Transport::Unspecified).is_some());
    }

    fn soft_hello(udp_addr: &str, gid: [u8; 16]) -> Hello {
        Hello {
            protocol_version: wire::PROTOCOL_VERSION,
            agent_id: "a".into(),
            hostname: String::new(),
            epoch: 1,
            transport: Transport::Soft as i32,
            capabilities: vec![DataPath::WriteWithImm as i32],
            qp: Some(wire::QpEndpoint {
                gid: gid.to_vec(),
                qpn: 0x11,
                psn: 7,
                mtu: 4096,
                udp_addr: udp_addr.into(),
            }),
        }
    }

    #[test]
    fn a_verbs_collector_sees_a_soft_agent_by_gid_only() {
        let peer = SocketAddr::from(([10, 77, 0, 2], 40000));
        let agent_ip = IpAddr::from([10, 77, 0, 2]);
        for (udp_addr, gid) in [
            // Bound to an ephemeral port: no RDMA device could send there, and none has to.
            ("10.77.0.2:53211", gid_from_ip(agent_ip)),
            // Bound to a wildcard: the address the control connection came from.
            ("0.0.0.0:4791", [0; 16]),
        ] {
            let h = soft_hello(udp_addr, gid);
            let verbs = agent_endpoint(&h, peer, Transport::Verbs);
            let ep = verbs.unwrap_or_else(|| panic!("{udp_addr}: no endpoint"));
            assert_eq!(ep.udp_addr, None, "{udp_addr}");
            assert_eq!(ep.gid, gid_from_ip(agent_ip), "{udp_addr}");
            assert_eq!((ep.qpn, ep.psn, ep.mtu), (0x11, 7, 4096));
            let soft = agent_endpoint(&h, peer, Transport::Soft);
            let port = udp_addr.rsplit(':').next().and_then(|p| p.parse().ok());
            assert_eq!(
                soft.and_then(|e| e.udp_addr),
                port.map(|p| SocketAddr::new(agent_ip, p)),
                "{udp_addr}"
            );
        }
    }
}
