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
//! **Pool members.** A collector is usually one of a pool that agents rank by rendezvous
//! hashing (the agent's `pool` module). Three things serve the pool:
//!
//! - `control.max_agents`: with that many agents connected, a new connection is refused
//!   with `busy` as soon as its first message arrives (before the `Hello` is read), and the
//!   agent moves on to its next collector.
//! - **Probes**: an agent connected elsewhere probes the collectors it prefers with a
//!   connection whose only message is `Probe{nonce}`. This listener answers
//!   `ProbeAnswer{nonce, accepting, reason}` at once (`accepting` false while draining or at
//!   `max_agents`, with the refusal a `Hello` would get) and closes; counted in
//!   `uctel_collector_probes_total{result="accepting"|"refusing"}`. The answer comes from
//!   this process, not the kernel: a stopped (`SIGSTOP`) or wedged collector whose kernel
//!   still completes TCP handshakes answers nothing, and the agent reads that as down. A
//!   connection that closes before its first byte (a TCP-only probe) is counted in
//!   `uctel_collector_control_probes_total`, not as a refused handshake.
//! - **Drain** ([`Drain`]; `SIGUSR1`, or `POST /-/drain` with `listen.enable_lifecycle`):
//!   `uctel_collector_draining` goes to 1, new connections are refused at once with
//!   `draining`, and every session sends its agent `Goodbye{reason: drain}` and keeps
//!   running until the agent's own `Goodbye` (its final sequences: the tail is exact). When
//!   the last agent has left, or after `control.drain_timeout_seconds`, the drain is done
//!   and the daemon stops (sessions still open then end as at shutdown).
//!
//! Layout:
//! - `handshake`: the driver of the handshake machine and the collector's checks of a
//!   `Hello`;
//! - `session`: one agent's session after the handshake: its lanes and `Welcome`, then the
//!   driver that waits for events and hands each to the session's state, and the end and
//!   its accounting;
//! - `state`: the session's rules with no socket and no clock (liveness, report timing,
//!   how the session ended), unit-tested on a virtual clock;
//! - `lane`: the connection's lanes as one list (UC, and RC when asked);
//! - `registry`: live sessions by agent id (twins refused, silent sessions replaced) and
//!   the last epoch of each agent id;
//! - this module: the listener, one task per connection, refusals.
//!
//! The rules of the conversation (handshake order and deadline, heartbeats, the dead-peer
//! rule) are `uctel_protocol::session`'s sans-IO machines; the collector only drives them.

mod cadence;
pub(crate) mod credit_batch;
pub(crate) mod credit_write;
mod handshake;
mod lane;
mod registry;
mod session;
mod state;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use uctel_common::control::ControlChannel;
use uctel_common::shutdown::{self, Shutdown};
use uctel_protocol::control::{self as wire, RefuseReason};
use uctel_protocol::session::Refusal;

use crate::config::{Config, Token};
use crate::shared::Shared;
use handshake::Checks;
use registry::{Admission, SessionLink};
use session::Live;

pub use crate::shared::Ledger;

/// A new pair of drain ends for [`serve`] and the daemon: the trigger `serve` fires when the
/// drain is over, and the [`Drain`] handle that starts it (through `start`, which is
/// `Shared::drain`) and waits for it.
pub fn drain_channel(start: shutdown::ShutdownTrigger) -> (shutdown::ShutdownTrigger, Drain) {
    let (done_trigger, done) = shutdown::channel();
    (done_trigger, Drain { start, done })
}
pub use registry::{Registry, MAX_REMEMBERED_EPOCHS, REPLACED_WARN_EVERY};

/// The identity the collector announces in `Challenge`.
pub const COLLECTOR_ID: &str = "uctel-collector";

/// How long the collector waits after an agent's `Goodbye` for its last frames (already on the
/// wire when the goodbye was sent) to complete before settling the tail.
const GOODBYE_DRAIN: Duration = Duration::from_millis(50);

/// Longest wait after an agent's `Goodbye` for the last frame it names
/// (`DataPlane::wait_consumed`); only a frame really lost at the tail makes it wait this long.
const GOODBYE_WAIT: Duration = Duration::from_millis(500);

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

/// What every connection task shares: the daemon's state and the control plane's own.
#[derive(Debug, Clone)]
struct Plane {
    shared: Shared,
    auth: Arc<Auth>,
    registry: Arc<Registry>,
}

/// The drain's two ends: [`Drain::start`] fires it (idempotent), the control plane waits for
/// it, and [`Drain::done`] completes when the drain is over (no agent left, or the timeout).
#[derive(Debug, Clone)]
pub struct Drain {
    start: shutdown::ShutdownTrigger,
    done: Shutdown,
}

impl Drain {
    /// Starts the drain: from now on agents are refused and told to move. Idempotent.
    pub fn start(&self) {
        self.start.trigger();
    }

    /// Completes when the drain is over: every agent left, or `control.drain_timeout_seconds`
    /// passed. Never completes without a drain.
    pub async fn done(&self) {
        self.done.wait_owned().await;
    }
}

/// Accepts agent connections until `shutdown`, then ends every connection (sending
/// `Goodbye`) and waits for them. `auth`: the tokens agents must prove. `drained` fires
/// when a drain (`shared.drain`) is over; serving goes on until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    shared: Shared,
    auth: Arc<Auth>,
    mut shutdown: Shutdown,
    drained: shutdown::ShutdownTrigger,
) {
    let mut drain = shared.drain.subscribe();
    let drain_timeout = seconds_or(
        shared.config.control.drain_timeout_seconds,
        Duration::from_secs(30),
    );
    let plane = Plane {
        shared,
        auth,
        registry: Arc::new(Registry::default()),
    };
    let mut tasks = JoinSet::new();
    let handshakes = Arc::new(tokio::sync::Semaphore::new(MAX_PENDING_HANDSHAKES));
    // While draining: when it started, and a tick to see whether the last agent left.
    let mut draining: Option<Instant> = None;
    let mut drained = Some(drained);
    let mut drain_check = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            () = drain.wait(), if draining.is_none() => {
                draining = Some(Instant::now());
                plane.shared.telemetry.set_draining(true);
                tracing::info!(
                    agents = plane.registry.live(),
                    timeout = ?drain_timeout,
                    "draining: refusing new agents and telling connected agents to move to \
                     their next collector; stopping when none is left"
                );
            }
            _ = drain_check.tick(), if draining.is_some() && drained.is_some() => {
                let left = plane.registry.live();
                let started = draining.unwrap_or_else(Instant::now);
                if left == 0 || started.elapsed() >= drain_timeout {
                    if left == 0 {
                        tracing::info!(took = ?started.elapsed(), "drained: every agent has left");
                    } else {
                        tracing::warn!(agents = left, timeout = ?drain_timeout, "drain timed out with agents still connected; stopping, their sessions end as at shutdown");
                    }
                    if let Some(d) = drained.take() {
                        d.trigger();
                    }
                }
            }
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    let slot = handshakes.clone().try_acquire_owned().ok();
                    let admit = if draining.is_some() { Admit::Draining } else { Admit::Open };
                    tasks.spawn(connection(stream, peer, plane.clone(), shutdown.clone(), slot, admit));
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

/// Seconds from the configuration as a duration, `default` when out of range.
fn seconds_or(s: f64, default: Duration) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or(default)
}

/// Whether the control plane takes new agents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Admit {
    Open,
    Draining,
}

/// One control connection; `handshake_slot` is its place among the
/// [`MAX_PENDING_HANDSHAKES`] (`None`: all taken, refused as `busy`).
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    plane: Plane,
    global: Shutdown,
    handshake_slot: Option<tokio::sync::OwnedSemaphorePermit>,
    admit: Admit,
) {
    let accepted_at = Instant::now();
    let Some(stream) = answer_first(stream, peer, &plane, admit).await else {
        return;
    };
    let shared = &plane.shared;
    let local_ip = stream
        .local_addr()
        .map(|a| a.ip())
        .unwrap_or(IpAddr::from([127, 0, 0, 1]));
    let mut ch = ControlChannel::new(stream);
    let Some(handshake_slot) = handshake_slot else {
        let r = Refusal::new(
            RefuseReason::Busy,
            "",
            format!("more than {MAX_PENDING_HANDSHAKES} handshakes in progress; retry later"),
        );
        return refuse(&mut ch, shared, peer, r).await;
    };
    let control = &shared.config.control;
    let timeout = seconds_or(control.handshake_timeout_seconds, Duration::from_secs(5));
    let checks = Checks {
        config: &shared.config,
        collector_udp: shared.plane.device().port_attr().udp_addr,
        auth: &plane.auth,
    };
    let accepted = match handshake::handshake(&mut ch, checks, accepted_at, timeout).await {
        Ok(a) => a,
        Err(r) => return refuse(&mut ch, shared, peer, r).await,
    };
    drop(handshake_slot);
    admitted(&mut ch, &plane, peer, local_ip, accepted, global).await;
}

/// What a connection hears before its handshake: a full or draining collector refuses it
/// at once (before the `Hello`, so a probe hears it too), a TCP-only probe (closed before
/// its first byte) is counted, a `Probe` is answered. `Some(stream)` when the handshake
/// follows.
async fn answer_first(
    mut stream: TcpStream,
    peer: SocketAddr,
    plane: &Plane,
    admit: Admit,
) -> Option<TcpStream> {
    let shared = &plane.shared;
    let at_once = refusal_at_once(shared, &plane.registry, admit);
    // A TCP-only probe closes before its first byte: counted, not a failed handshake.
    let probe_wait = seconds_or(
        shared.config.control.handshake_timeout_seconds,
        Duration::from_secs(5),
    );
    let first = tokio::time::timeout(probe_wait, stream.peek(&mut [0u8; 1])).await;
    if let Ok(Ok(0)) = first {
        shared.telemetry.control_probe();
        tracing::debug!(%peer, "control probe");
        let _ = tokio::io::AsyncWriteExt::shutdown(&mut stream).await;
        return None;
    }
    // A `Probe` is answered by this process at once, whatever the state (its bytes are
    // there already: the peek above returned them).
    let probe = match first {
        Ok(Ok(_)) => peeked_probe(&stream).await,
        _ => None,
    };
    if let Some((nonce, consumed)) = probe {
        let _ = tokio::io::AsyncReadExt::read_exact(&mut stream, &mut vec![0u8; consumed]).await;
        let reason = at_once
            .as_ref()
            .map_or(RefuseReason::Unspecified, |r| r.reason);
        let answer = wire::ProbeAnswer {
            nonce,
            accepting: at_once.is_none(),
            reason: reason as i32,
        };
        shared.telemetry.probe_answered(answer.accepting);
        tracing::debug!(%peer, accepting = answer.accepting, "control probe answered");
        let mut ch = ControlChannel::new(stream);
        let _ = send_within(&mut ch, answer, REFUSE_WRITE_BOUND, "").await;
        ch.shutdown().await;
        return None;
    }
    if let Some(r) = at_once {
        let mut ch = ControlChannel::new(stream);
        refuse(&mut ch, shared, peer, r).await;
        return None;
    }
    Some(stream)
}

/// The refusal every new connection gets at once while the collector is draining or has
/// `control.max_agents` agents connected; `None` when it takes new agents.
fn refusal_at_once(shared: &Shared, registry: &Registry, admit: Admit) -> Option<Refusal> {
    let full = shared
        .limits
        .max_agents()
        .filter(|max| registry.live() >= *max as usize);
    match (admit, full) {
        (Admit::Draining, _) => Some(Refusal::new(
            RefuseReason::Draining,
            "",
            "this collector is draining; connect to the next collector of the pool",
        )),
        (Admit::Open, Some(max)) => Some(Refusal::new(
            RefuseReason::Busy,
            "",
            format!("control.max_agents ({max}) agents are connected; connect to the next collector of the pool"),
        )),
        (Admit::Open, None) => None,
    }
}

/// An authenticated agent: admitted to the registry (or refused as a twin, or over
/// `max_agents`), its silent predecessor replaced, its session run; then the agent is
/// marked gone unless a newer connection of it took over.
async fn admitted(
    ch: &mut ControlChannel<TcpStream>,
    plane: &Plane,
    peer: SocketAddr,
    local_ip: IpAddr,
    accepted: handshake::Accepted,
    global: Shutdown,
) {
    let Plane {
        shared, registry, ..
    } = plane;
    let agent = accepted.hello.agent_id.clone();
    // Checked again now that the agent is known: handshakes that passed the check at
    // accept side by side must not take the collector past `max_agents`.
    if let Some(max) = shared.limits.max_agents() {
        if registry.live() >= max as usize && !registry.is_live(&agent) {
            let r = Refusal::new(
                RefuseReason::Busy,
                &agent,
                format!("control.max_agents ({max}) agents are connected; connect to the next collector of the pool"),
            );
            return refuse(ch, shared, peer, r).await;
        }
    }
    let (my_trigger, my_cancel) = shutdown::channel();
    let (done_tx, done_rx) = tokio::sync::watch::channel(false);
    let now = Instant::now();
    let link = Arc::new(SessionLink::new(now));
    let heartbeat = seconds_or(
        shared.config.control.heartbeat_interval_seconds,
        Duration::from_secs(5),
    );
    // An agent id with a live session keeps it: a second agent with that id is refused. A
    // silent session is replaced (an agent restart racing its old connection).
    let admission = registry.admit(
        &agent,
        peer,
        accepted.hello.epoch,
        heartbeat.mul_f64(1.5),
        my_trigger,
        done_rx,
        link.clone(),
        now,
    );
    let (token_id, previous) = match admission {
        Admission::Admitted { id, previous } => (id, previous),
        Admission::Alive {
            peer: first_peer,
            epoch: first_epoch,
            silent_for,
        } => {
            let r = twin_refusal(registry, &agent, peer, first_peer, first_epoch, silent_for);
            return refuse(ch, shared, peer, r).await;
        }
    };
    if let Some(previous) = previous {
        let epoch = accepted.hello.epoch;
        registry::replace(
            registry,
            &shared.telemetry,
            heartbeat,
            &agent,
            peer,
            epoch,
            previous,
            now,
        )
        .await;
    }
    let live = Live {
        cancel: my_cancel,
        link,
        registry: registry.clone(),
    };
    session::run_session(ch, shared, peer, local_ip, accepted, live, global).await;
    registry.remove(&agent, token_id);
    if !registry.is_live(&agent) {
        agent_gone(shared, &agent);
    }
    let _ = done_tx.send(true);
    ch.shutdown().await;
}

/// The `duplicate_agent_id` refusal of a second connection of `agent` (from `peer`) while
/// its first, from `first_peer` in `first_epoch`, is alive (heard `silent_for` ago); warns
/// at most once a minute per agent id.
fn twin_refusal(
    registry: &Registry,
    agent: &str,
    peer: SocketAddr,
    first_peer: SocketAddr,
    first_epoch: u64,
    silent_for: Duration,
) -> Refusal {
    if registry.should_warn_replaced(agent) {
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
    Refusal::new(
        RefuseReason::DuplicateAgentId,
        agent,
        format!(
            "agent_id {agent:?} is already connected from {first_peer} and alive; \
             give each agent its own agent_id"
        ),
    )
}

/// `agent`'s session ended and no newer connection of it took over: `agent_up{agent} 0`
/// and its series leave the store (and `/metrics`) now rather than after
/// `staleness_seconds` (`crate::liveness`).
fn agent_gone(shared: &Shared, agent: &str) {
    if shared.telemetry.agent_up().down(agent, Instant::now()) {
        let removed = shared.outputs.store.remove_agent(agent);
        shared.telemetry.agent(agent).series.set(0);
        tracing::debug!(
            agent,
            series = removed,
            "agent gone: its series left /metrics"
        );
    }
}

/// Runs `fut` until `deadline` (none: to its end); `None` when the deadline came first.
async fn until<F: std::future::Future>(deadline: Option<Instant>, fut: F) -> Option<F::Output> {
    match deadline {
        Some(at) => tokio::time::timeout_at(at.into(), fut).await.ok(),
        None => Some(fut.await),
    }
}

/// Sleeps until `at`; for ever without a deadline.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
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

/// Counts and logs the refusal `r` of the connection from `peer`, sends its `Refuse`
/// (bounded) and closes.
/// Most bytes a `Probe` frame takes on the wire (length prefix + envelope + nonce varint).
const MAX_PROBE_FRAME_BYTES: usize = 32;

/// When the bytes already received on `stream` (not consumed) are exactly one whole
/// `Probe` frame: its nonce and its length on the wire. Anything else (a `Hello`, a partial
/// frame, garbage) is `None` and left for the handshake to read.
async fn peeked_probe(stream: &TcpStream) -> Option<(u64, usize)> {
    let mut buf = [0u8; MAX_PROBE_FRAME_BYTES + 1];
    let n = stream.peek(&mut buf).await.ok()?;
    probe_frame(&buf[..n])
}

/// `bytes` as one whole `Probe` frame ([`peeked_probe`]).
fn probe_frame(bytes: &[u8]) -> Option<(u64, usize)> {
    let prefix: [u8; wire::LENGTH_PREFIX_BYTES] =
        bytes.get(..wire::LENGTH_PREFIX_BYTES)?.try_into().ok()?;
    let len = u32::from_be_bytes(prefix) as usize;
    let end = wire::LENGTH_PREFIX_BYTES.checked_add(len)?;
    if end > MAX_PROBE_FRAME_BYTES || bytes.len() != end {
        return None;
    }
    let m =
        <wire::ControlMessage as prost::Message>::decode(&bytes[wire::LENGTH_PREFIX_BYTES..end])
            .ok()?;
    match m.body? {
        wire::Body::Probe(p) => Some((p.nonce, end)),
        _ => None,
    }
}

async fn refuse(ch: &mut ControlChannel<TcpStream>, shared: &Shared, peer: SocketAddr, r: Refusal) {
    shared
        .telemetry
        .handshake_refused(r.reason, &r.agent, &peer.to_string(), &r.detail);
    let _ = send_within(ch, r.message(), REFUSE_WRITE_BOUND, &r.agent).await;
    ch.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(m: wire::ControlMessage) -> Vec<u8> {
        let mut out = Vec::new();
        wire::encode_message(&m, &mut out).unwrap();
        out
    }

    #[test]
    fn only_one_whole_probe_frame_reads_as_a_probe() {
        let probe = frame(wire::Probe { nonce: u64::MAX }.into());
        assert!(probe.len() <= MAX_PROBE_FRAME_BYTES);
        assert_eq!(probe_frame(&probe), Some((u64::MAX, probe.len())));
        let small = frame(wire::Probe { nonce: 7 }.into());
        assert_eq!(probe_frame(&small), Some((7, small.len())));
        // Cut short, followed by more bytes, another message, garbage: not a probe.
        assert_eq!(probe_frame(&probe[..probe.len() - 1]), None);
        let mut two = probe.clone();
        two.push(0);
        assert_eq!(probe_frame(&two), None);
        let goodbye = frame(wire::Goodbye::default().into());
        assert_eq!(probe_frame(&goodbye), None);
        assert_eq!(probe_frame(&[0xff; 8]), None);
        assert_eq!(probe_frame(&[]), None);
    }
}
