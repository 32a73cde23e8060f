//! The collector pool: which collector the agent connects to, and when it moves.
//!
//! `collector.control` names one `host:port` or a list of them; every name is resolved (at
//! start and every `collector.resolve_interval_seconds`), and every address it resolves to
//! is a member of the pool. A single address that resolves to one IP is a pool of one and
//! behaves as a plain address.
//!
//! **Ranking: rendezvous (highest-random-weight) hashing** (Thaler and Ravishankar, *Using
//! name-based mappings to increase hit rates*, IEEE/ACM ToN 6(1), 1998). Each member's
//! weight for this agent is the first 8 bytes, big-endian, of
//! `SHA-256(agent_id ‖ 0x00 ‖ "ip:port")`; the agent prefers members by falling weight. Every
//! agent ranks the pool on its own, with no coordination, and the ranks spread agents evenly
//! over the members; when a member leaves, only its agents move (each to its own next
//! choice), and when it comes back, only they return. SHA-256 keeps the weights the same on
//! every host, build and version.
//!
//! **Walking the ranks.** A connection attempt walks the members in rank order, members
//! known to be down (the last connection or probe failed) after the others, and stops at
//! the first `Welcome`. A refusal (`busy`: the collector's `max_agents` is reached;
//! `draining`) or a failed connection moves on to the next member at once; only when every
//! member failed does the agent wait its reconnect backoff before walking again.
//!
//! **Returning.** While connected to a member that is not its first choice, the agent probes
//! the members ranked above it every `collector.probe_interval_seconds`: a TCP connection
//! whose only message is `Probe{nonce}` (a random `u64`). The collector's control listener
//! answers `ProbeAnswer{nonce, accepting, reason}` at once and closes (it counts it in
//! `uctel_collector_probes_total{result}`). The probe passes only with an answer carrying
//! the same nonce and `accepting: true` within [`PROBE_ANSWER_WAIT`]: a full or draining
//! collector answers `accepting: false`, and a collector whose process does not run
//! (`SIGSTOP`, wedged) answers nothing although its kernel still completes the TCP
//! handshake, so it fails. A collector older than `Probe` answers `Refuse{protocol_error}`:
//! its process answered, so that passes (any other `Refuse` fails). A member
//! that has answered every probe for `collector.return_after_seconds` is healthy again. One
//! failed probe restarts the clock, so a flapping collector does not pull agents back and
//! forth.
//!
//! **Leaving a collector that left the pool.** When a resolution no longer names the current
//! collector, every member ranks above it: the agent probes them all and moves to the best
//! one that answered every probe since it first did, without waiting `return_after_seconds`
//! (the operator took its collector out; the members are where it belongs).
//!
//! **Spreading the moves.** Each agent draws, when a member turns healthy, a delay uniform
//! in `[0, collector.return_spread_seconds)` and moves only that much later (after
//! `return_after_seconds` too when returning), so a collector that comes back or joins gets
//! its share of agents over that window rather than all at once (the "thundering herd").
//! The first probe of a session comes at a random phase of `probe_interval_seconds`, so
//! agents that connected together do not probe (and move) in step.
//!
//! **Moving without losing the place.** A planned move (return, or off a collector that left
//! the pool) first connects to the new collector and runs the whole handshake, with a new
//! epoch, while the current session goes on sending; only once the new collector's `Welcome`
//! is in hand does the agent end its epoch on the current one (its last frames, `Goodbye`)
//! and go on with the new session. A refusal there (`busy`: it filled up between the probe
//! and the handshake; `draining`; `duplicate_agent_id`), or a failed connection, leaves the
//! current session and its epoch as they were: the refusal is counted, the member is down
//! again and its health clock restarts.
//!
//! Self-metrics: `uctel_agent_collector_switches_total{reason}` (a `Welcome` from another
//! collector than the previous `Welcome`'s: `lost` the connection died or could not be made
//! again, `refused` a collector ranked higher refused this agent on the way, `rebalance` back
//! to a higher choice or off a collector that left the pool, `drain` the collector drained),
//! `uctel_agent_collector_refusals_total{reason}` (every `Refuse` a collector answered a
//! handshake with, on a connection walk or a planned move, by the protocol's
//! [`RefuseReason`] label), and `uctel_agent_collector_info{address}` (1 for the collector of
//! the current connection; absent while not connected).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};
use sha2::{Digest, Sha256};
use uctel_protocol::control::RefuseReason;

/// `collector.control`: one `host:port`, or a list of them (a pool).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(untagged)]
pub enum ControlTargets {
    /// One `host:port` (a name may still resolve to several addresses).
    One(String),
    /// A pool: several `host:port`.
    Pool(Vec<String>),
}

impl ControlTargets {
    /// Every `host:port`, in the configured order.
    pub fn targets(&self) -> Vec<String> {
        match self {
            ControlTargets::One(t) => vec![t.clone()],
            ControlTargets::Pool(v) => v.clone(),
        }
    }
}

impl ControlTargets {
    /// What is wrong with the list, as `(key, problem)`: an empty list, an entry that is not
    /// `host:port` with a port in 1..=65535, an entry listed twice.
    pub fn problems(&self) -> Vec<(String, String)> {
        let targets = self.targets();
        let mut out = Vec::new();
        if targets.is_empty() {
            out.push((
                "collector.control".to_owned(),
                "the list is empty: name at least one host:port".to_owned(),
            ));
        }
        for (i, t) in targets.iter().enumerate() {
            let key = match self {
                ControlTargets::One(_) => "collector.control".to_owned(),
                ControlTargets::Pool(_) => format!("collector.control[{i}]"),
            };
            if split_host_port(t).is_none() {
                out.push((
                    key,
                    format!("must be host:port with a port in 1..=65535, got {t:?}"),
                ));
            } else if targets[..i].contains(t) {
                out.push((key, format!("{t:?} is listed twice")));
            }
        }
        out
    }
}

impl std::fmt::Display for ControlTargets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.targets().join(", "))
    }
}

impl From<&str> for ControlTargets {
    fn from(s: &str) -> Self {
        ControlTargets::One(s.to_owned())
    }
}

impl<'de> serde::Deserialize<'de> for ControlTargets {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = ControlTargets;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("host:port, or a list of host:port")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(ControlTargets::One(v.to_owned()))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                let mut v = Vec::new();
                while let Some(t) = seq.next_element::<String>()? {
                    v.push(t);
                }
                Ok(ControlTargets::Pool(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// Splits `host:port` (`[v6]:port` for IPv6 literals). Returns `(host, port)`.
pub fn split_host_port(s: &str) -> Option<(&str, u16)> {
    let (host, port) = s.rsplit_once(':')?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.is_empty() || host.contains(char::is_whitespace) {
        return None;
    }
    let port: u16 = port.parse().ok()?;
    (port != 0).then_some((host, port))
}

/// `collector.resolve_interval_seconds` by default.
pub(crate) fn default_resolve_interval() -> f64 {
    30.0
}
/// `collector.return_after_seconds` by default.
pub(crate) fn default_return_after() -> f64 {
    60.0
}
/// `collector.return_spread_seconds` by default.
pub(crate) fn default_return_spread() -> f64 {
    5.0
}
/// `collector.probe_interval_seconds` by default.
pub(crate) fn default_probe_interval() -> f64 {
    5.0
}

/// How long a probe waits, once connected, for the collector's `ProbeAnswer`.
pub const PROBE_ANSWER_WAIT: Duration = Duration::from_secs(1);

/// Why the agent moved to another collector (`uctel_agent_collector_switches_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SwitchReason {
    /// The connection died or could not be made again.
    Lost,
    /// A collector ranked higher refused this agent on the way.
    Refused,
    /// Back to a higher choice that is healthy again.
    Rebalance,
    /// The collector drained.
    Drain,
}

impl SwitchReason {
    /// Every reason, in label order.
    pub const ALL: [SwitchReason; 4] = [
        SwitchReason::Lost,
        SwitchReason::Refused,
        SwitchReason::Rebalance,
        SwitchReason::Drain,
    ];

    /// The `reason` label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            SwitchReason::Lost => "lost",
            SwitchReason::Refused => "refused",
            SwitchReason::Rebalance => "rebalance",
            SwitchReason::Drain => "drain",
        }
    }
}

/// The rendezvous weight of `member` for `agent_id` (module docs): the first 8 bytes,
/// big-endian, of `SHA-256(agent_id ‖ 0x00 ‖ member.to_string())`.
pub fn weight(agent_id: &str, member: &SocketAddr) -> u64 {
    let mut h = Sha256::new();
    h.update(agent_id.as_bytes());
    h.update([0u8]);
    h.update(member.to_string().as_bytes());
    let digest = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

/// One member's state.
#[derive(Debug, Clone)]
struct Member {
    addr: SocketAddr,
    weight: u64,
    /// The last connection attempt or probe failed (and none succeeded since).
    down: bool,
    /// Since when every probe succeeded (`None`: the last one failed, or none ran).
    healthy_since: Option<Instant>,
    /// This agent's share of the return spread, drawn when the member turned healthy.
    spread_delay: Duration,
}

/// The pool's members and their health (sans-IO: the caller resolves, connects and probes,
/// and reports what happened).
#[derive(Debug)]
pub struct Pool {
    agent_id: String,
    /// By falling weight (ties by address, so the order is total).
    members: Vec<Member>,
    /// When the names were last resolved to at least one address.
    resolved_at: Option<Instant>,
    /// `collector.return_spread_seconds`.
    spread: Duration,
}

impl Pool {
    /// An empty pool for `agent_id`; [`Pool::set_members`] fills it.
    pub fn new(agent_id: &str) -> Pool {
        Pool {
            agent_id: agent_id.to_owned(),
            members: Vec::new(),
            resolved_at: None,
            spread: Duration::ZERO,
        }
    }

    /// Sets the return spread window (`collector.return_spread_seconds`; zero by default):
    /// see [`Pool::probed`].
    pub fn set_return_spread(&mut self, spread: Duration) {
        self.spread = spread;
    }

    /// Whether the names are due for resolution at `now` (never resolved, or `every` ago).
    pub fn resolution_due(&self, every: Duration, now: Instant) -> bool {
        self.resolved_at
            .is_none_or(|t| now.saturating_duration_since(t) >= every)
    }

    /// A resolution at `now` found `addrs`: they become the members ([`Pool::set_members`]);
    /// nothing changes when it found none (a resolver outage keeps the last known pool).
    pub fn resolved(&mut self, addrs: &[SocketAddr], now: Instant) {
        if !addrs.is_empty() {
            self.set_members(addrs);
            self.resolved_at = Some(now);
        }
    }

    /// Replaces the members with `addrs` (a resolution's result), keeping the health of the
    /// addresses that stay. Duplicates count once.
    pub fn set_members(&mut self, addrs: &[SocketAddr]) {
        let mut next: Vec<Member> = Vec::with_capacity(addrs.len());
        for a in addrs {
            if next.iter().any(|m| m.addr == *a) {
                continue;
            }
            let kept = self.members.iter().find(|m| m.addr == *a).cloned();
            next.push(kept.unwrap_or(Member {
                addr: *a,
                weight: weight(&self.agent_id, a),
                down: false,
                healthy_since: None,
                spread_delay: Duration::ZERO,
            }));
        }
        next.sort_by(|x, y| y.weight.cmp(&x.weight).then(x.addr.cmp(&y.addr)));
        self.members = next;
    }

    /// The members in rank order (first choice first).
    pub fn ranked(&self) -> Vec<SocketAddr> {
        self.members.iter().map(|m| m.addr).collect()
    }

    /// The rank of `addr` (0: first choice), if it is a member.
    pub fn rank(&self, addr: SocketAddr) -> Option<usize> {
        self.members.iter().position(|m| m.addr == addr)
    }

    /// The order of one connection walk: members not known down in rank order, then the
    /// ones known down in rank order.
    pub fn walk_order(&self) -> Vec<SocketAddr> {
        let up = self.members.iter().filter(|m| !m.down);
        let down = self.members.iter().filter(|m| m.down);
        up.chain(down).map(|m| m.addr).collect()
    }

    /// The members ranked above `current` (all of them when it is not a member): the ones a
    /// connected agent probes.
    pub fn above(&self, current: SocketAddr) -> Vec<SocketAddr> {
        let end = self.rank(current).unwrap_or(self.members.len());
        self.members[..end].iter().map(|m| m.addr).collect()
    }

    fn member(&mut self, addr: SocketAddr) -> Option<&mut Member> {
        self.members.iter_mut().find(|m| m.addr == addr)
    }

    /// A connection to `addr` was welcomed.
    pub fn connected(&mut self, addr: SocketAddr) {
        if let Some(m) = self.member(addr) {
            m.down = false;
        }
    }

    /// A connection to `addr` failed, was refused, or ended (lost, drained): it is down
    /// until a probe or a connection succeeds, and its health clock restarts.
    pub fn failed(&mut self, addr: SocketAddr) {
        if let Some(m) = self.member(addr) {
            m.down = true;
            m.healthy_since = None;
        }
    }

    /// A probe of `addr` at `now` succeeded (`true`) or failed. `draw` is a uniform draw
    /// in `[0, 1)` (out of range is clamped): when the member turns healthy, this agent's
    /// delay before moving to it is `draw × spread` ([`Pool::set_return_spread`]).
    pub fn probed(&mut self, addr: SocketAddr, ok: bool, now: Instant, draw: f64) {
        let spread = self.spread;
        if let Some(m) = self.member(addr) {
            if ok {
                m.down = false;
                if m.healthy_since.is_none() {
                    m.healthy_since = Some(now);
                    let draw = if draw.is_finite() {
                        draw.clamp(0.0, 1.0)
                    } else {
                        0.0
                    };
                    m.spread_delay = spread.mul_f64(draw);
                }
            } else {
                m.down = true;
                m.healthy_since = None;
            }
        }
    }

    /// Where an agent connected to `current` should move at `now` (module docs), if
    /// anywhere: the best member ranked above `current` that has answered every probe for
    /// `return_after` plus its spread delay ([`Pool::probed`]). When `current` is no longer
    /// a member (it left the pool's names), every member ranks above it and the wait is the
    /// spread delay alone; the agent then waits for its best member that is not down (one
    /// just added to the names has not been probed yet), so it moves once, to that member,
    /// rather than to a lower one first and again when the best turns healthy. `None` at
    /// the first choice.
    pub fn return_to(
        &self,
        current: SocketAddr,
        return_after: Duration,
        now: Instant,
    ) -> Option<SocketAddr> {
        let waited = |m: &Member, wait: Duration| {
            m.healthy_since.is_some_and(|t| {
                now.saturating_duration_since(t) >= wait.saturating_add(m.spread_delay)
            })
        };
        match self.rank(current) {
            Some(r) => self.members[..r]
                .iter()
                .find(|m| waited(m, return_after))
                .map(|m| m.addr),
            None => self
                .members
                .iter()
                .find(|m| !m.down)
                .filter(|m| waited(m, Duration::ZERO))
                .map(|m| m.addr),
        }
    }
}

/// The pool's self-metrics (module docs).
#[derive(Debug, Clone)]
pub struct PoolMetrics {
    switches: IntCounterVec,
    refusals: IntCounterVec,
    info: IntGaugeVec,
}

impl PoolMetrics {
    /// Registers `uctel_agent_collector_switches_total{reason}`,
    /// `uctel_agent_collector_refusals_total{reason}` (every reason of each at 0) and
    /// `uctel_agent_collector_info{address}` into `registry`.
    ///
    /// # Errors
    /// The registry refused a name (registered twice).
    pub fn register(registry: &Registry) -> prometheus::Result<PoolMetrics> {
        let switches = IntCounterVec::new(
            Opts::new(
                "uctel_agent_collector_switches_total",
                "Connections welcomed by another collector of the pool than the previous connection, by why the agent moved: lost, refused, rebalance, drain.",
            ),
            &["reason"],
        )?;
        for r in SwitchReason::ALL {
            switches.with_label_values(&[r.as_str()]);
        }
        let refusals = IntCounterVec::new(
            Opts::new(
                "uctel_agent_collector_refusals_total",
                "Handshakes a collector of the pool answered with Refuse (on a connection walk or a planned move), by the Refuse reason: busy, draining, duplicate_agent_id, ...",
            ),
            &["reason"],
        )?;
        for r in RefuseReason::ALL {
            refusals.with_label_values(&[r.label()]);
        }
        let info = IntGaugeVec::new(
            Opts::new(
                "uctel_agent_collector_info",
                "1 for the control address of the collector the agent is connected to; absent while not connected.",
            ),
            &["address"],
        )?;
        registry.register(Box::new(switches.clone()))?;
        registry.register(Box::new(refusals.clone()))?;
        registry.register(Box::new(info.clone()))?;
        Ok(PoolMetrics {
            switches,
            refusals,
            info,
        })
    }

    /// Counts a collector's `Refuse` of this agent.
    pub fn refused(&self, reason: RefuseReason) {
        self.refusals.with_label_values(&[reason.label()]).inc();
    }

    /// The refusals counted for `reason`.
    pub fn refusals(&self, reason: RefuseReason) -> u64 {
        self.refusals.with_label_values(&[reason.label()]).get()
    }

    /// Counts a switch.
    pub fn switched(&self, reason: SwitchReason) {
        self.switches.with_label_values(&[reason.as_str()]).inc();
    }

    /// The switches counted for `reason`.
    pub fn switches(&self, reason: SwitchReason) -> u64 {
        self.switches.with_label_values(&[reason.as_str()]).get()
    }

    /// The current collector (`None`: not connected).
    pub fn set_current(&self, addr: Option<SocketAddr>) {
        self.info.reset();
        if let Some(a) = addr {
            self.info.with_label_values(&[&a.to_string()]).set(1);
        }
    }
}

/// Resolves every `host:port` of `targets` (the system resolver, as `getaddrinfo` answers,
/// `/etc/hosts` included), in order, without duplicates. A target that does not resolve is
/// returned in the error list with the resolver's message; the others still count.
pub async fn resolve(targets: &[String]) -> (Vec<SocketAddr>, Vec<(String, String)>) {
    let mut addrs = Vec::new();
    let mut errors = Vec::new();
    for t in targets {
        match tokio::net::lookup_host(t.as_str()).await {
            Ok(found) => {
                let found: Vec<SocketAddr> = found.collect();
                if found.is_empty() {
                    errors.push((t.clone(), "resolved to no address".to_owned()));
                }
                for a in found {
                    if !addrs.contains(&a) {
                        addrs.push(a);
                    }
                }
            }
            Err(e) => errors.push((t.clone(), e.to_string())),
        }
    }
    (addrs, errors)
}

/// Probes `addr` (module docs): connects within `timeout`, sends `Probe{nonce}`, waits
/// [`PROBE_ANSWER_WAIT`] for the answer, and closes. True only when the collector's process
/// answered with the same nonce and `accepting: true` (or, being older than `Probe`, with
/// `Refuse{protocol_error}`).
pub async fn probe(addr: SocketAddr, timeout: Duration) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use uctel_protocol::control::{self as wire, Body};
    let Ok(Ok(mut stream)) =
        tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await
    else {
        return false;
    };
    let _ = stream.set_nodelay(true);
    let nonce: u64 = rand::random();
    let mut frame = Vec::new();
    if wire::encode_message(&wire::Probe { nonce }.into(), &mut frame).is_err() {
        return false;
    }
    let answer = async {
        stream.write_all(&frame).await.ok()?;
        let mut decoder = wire::ControlDecoder::new();
        let mut buf = [0u8; 512];
        loop {
            if let Some(m) = decoder.next_message().ok()? {
                return Some(m);
            }
            let n = stream.read(&mut buf).await.ok()?;
            if n == 0 {
                return None;
            }
            decoder.push(&buf[..n]);
        }
    };
    match tokio::time::timeout(PROBE_ANSWER_WAIT, answer).await {
        Ok(Some(m)) => match m.body {
            Some(Body::ProbeAnswer(a)) => a.nonce == nonce && a.accepting,
            Some(Body::Refuse(r)) => r.reason == RefuseReason::ProtocolError as i32,
            _ => false,
        },
        _ => false,
    }
}

/// While connected to `current`: re-resolves the pool's names when due (every
/// `resolve_every`), then probes every member ranked above `current` (none at the first
/// choice, [`probe`] within `timeout`) and records the answers.
pub async fn refresh(
    pool: std::sync::Arc<std::sync::Mutex<Pool>>,
    targets: std::sync::Arc<[String]>,
    resolve_every: Duration,
    current: SocketAddr,
    timeout: Duration,
) {
    let lock = || {
        pool.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    };
    if lock().resolution_due(resolve_every, Instant::now()) {
        let (addrs, _) = resolve(&targets).await;
        lock().resolved(&addrs, Instant::now());
    }
    let above = lock().above(current);
    for addr in above {
        let ok = probe(addr, timeout).await;
        lock().probed(addr, ok, Instant::now(), rand::random::<f64>());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(i: u8) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, i], 7400))
    }

    #[test]
    fn weights_are_the_documented_sha256_prefix() {
        // SHA-256("a1\0127.0.0.1:7400"), first 8 bytes, computed independently with
        // `printf 'a1\0127.0.0.1:7400' | sha256sum`.
        let w = weight("a1", &addr(1));
        let mut h = Sha256::new();
        h.update(b"a1\x00127.0.0.1:7400");
        let d = h.finalize();
        assert_eq!(w.to_be_bytes(), d[..8]);
        assert_ne!(weight("a1", &addr(1)), weight("a2", &addr(1)));
        assert_ne!(weight("a1", &addr(1)), weight("a1", &addr(2)));
    }

    #[test]
    fn ranks_spread_agents_evenly_and_only_a_leaving_members_agents_move() {
        let members = [addr(1), addr(2), addr(3)];
        let mut first = [0usize; 3];
        let mut pools = Vec::new();
        for i in 0..3000 {
            let mut p = Pool::new(&format!("host-{i}"));
            p.set_members(&members);
            let top = p.ranked()[0];
            first[members.iter().position(|m| *m == top).unwrap()] += 1;
            pools.push(p);
        }
        for n in first {
            assert!((850..=1150).contains(&n), "uneven spread: {first:?}");
        }
        // Without member 2, agents whose first choice was 1 or 3 keep it.
        for p in &mut pools {
            let before = p.ranked();
            p.set_members(&[addr(1), addr(3)]);
            let after = p.ranked();
            if before[0] != addr(2) {
                assert_eq!(after[0], before[0]);
            } else {
                assert_eq!(after[0], before[1], "moves to its own second choice");
            }
        }
    }

    #[test]
    fn walk_puts_members_known_down_last_and_set_members_keeps_health() {
        let mut p = Pool::new("a1");
        p.set_members(&[addr(1), addr(2), addr(3), addr(2)]);
        let ranked = p.ranked();
        assert_eq!(ranked.len(), 3);
        assert_eq!(p.walk_order(), ranked);
        p.failed(ranked[0]);
        assert_eq!(p.walk_order(), vec![ranked[1], ranked[2], ranked[0]]);
        p.set_members(&[addr(3), addr(1), addr(2)]);
        assert_eq!(p.walk_order(), vec![ranked[1], ranked[2], ranked[0]]);
        p.connected(ranked[0]);
        assert_eq!(p.walk_order(), ranked);
    }

    #[test]
    fn returns_only_after_the_first_choice_was_healthy_for_the_whole_delay() {
        let mut p = Pool::new("a1");
        p.set_members(&[addr(1), addr(2), addr(3)]);
        let r = p.ranked();
        let t0 = Instant::now();
        let delay = Duration::from_secs(60);
        assert_eq!(p.above(r[1]), vec![r[0]]);
        assert!(p.above(r[0]).is_empty());
        p.failed(r[0]);
        assert_eq!(p.return_to(r[1], delay, t0), None);
        p.probed(r[0], true, t0, 0.0);
        assert_eq!(p.return_to(r[1], delay, t0 + Duration::from_secs(59)), None);
        // One failed probe restarts the clock.
        p.probed(r[0], false, t0 + Duration::from_secs(30), 0.0);
        p.probed(r[0], true, t0 + Duration::from_secs(35), 0.0);
        assert_eq!(p.return_to(r[1], delay, t0 + Duration::from_secs(61)), None);
        assert_eq!(
            p.return_to(r[1], delay, t0 + Duration::from_secs(95)),
            Some(r[0])
        );
        // Nothing ranks above the first choice; from a collector that is not a member the
        // agent moves to the best healthy member without waiting the delay.
        assert_eq!(p.return_to(r[0], delay, t0 + Duration::from_secs(95)), None);
        assert_eq!(
            p.return_to(addr(9), delay, t0 + Duration::from_secs(36)),
            Some(r[0])
        );
    }

    /// The reported case (issue 40, item 1): the current collector left the pool's names.
    /// It was the first choice, so nothing was probed and `return_to` had nothing to rank
    /// it against; now every member ranks above it and the agent moves to its best healthy
    /// member after its spread delay, without waiting `return_after`.
    #[test]
    fn an_agent_on_a_collector_that_left_the_pool_moves_to_its_best_healthy_member() {
        let delay = Duration::from_secs(20);
        let spread = Duration::from_secs(4);
        // An agent whose first choice is addr(3) among 1, 2, 3.
        let id = (0..)
            .map(|i| format!("agent-{i}"))
            .find(|id| {
                let mut p = Pool::new(id);
                p.set_members(&[addr(1), addr(2), addr(3)]);
                p.ranked()[0] == addr(3)
            })
            .unwrap_or_default();
        let mut p = Pool::new(&id);
        p.set_return_spread(spread);
        let t0 = Instant::now();
        p.resolved(&[addr(1), addr(2), addr(3)], t0);
        assert!(p.above(addr(3)).is_empty());
        assert_eq!(p.return_to(addr(3), delay, t0), None);
        // The name now resolves to 1, 2, 4.
        p.resolved(&[addr(1), addr(2), addr(4)], t0 + Duration::from_secs(5));
        assert_eq!(p.rank(addr(3)), None);
        let mut above = p.above(addr(3));
        above.sort();
        assert_eq!(
            above,
            vec![addr(1), addr(2), addr(4)],
            "every member is probed"
        );
        let best = p.ranked()[0];
        let t1 = t0 + Duration::from_secs(6);
        // Not probed yet: nowhere to go.
        assert_eq!(p.return_to(addr(3), delay, t1), None);
        // The others answered first: the agent waits for its best member's probe instead
        // of moving twice (to a lower member, then to the best once it turns healthy).
        for m in &p.ranked()[1..] {
            p.probed(*m, true, t1 - Duration::from_secs(1), 0.5);
        }
        assert_eq!(
            p.return_to(addr(3), delay, t1 + Duration::from_secs(2)),
            None
        );
        for m in p.ranked() {
            p.probed(m, true, t1, 0.5);
        }
        // Half the spread later, not `return_after` later.
        assert_eq!(
            p.return_to(addr(3), delay, t1 + Duration::from_millis(1999)),
            None
        );
        assert_eq!(
            p.return_to(addr(3), delay, t1 + Duration::from_secs(2)),
            Some(best)
        );
        // Its best member refused it: the next one that is healthy.
        p.failed(best);
        let next = p.ranked()[1];
        assert_eq!(
            p.return_to(addr(3), delay, t1 + Duration::from_secs(2)),
            Some(next)
        );
    }

    /// Returns are spread over the window by the draws: the agent with draw `d` returns
    /// `return_after + d × spread` after the member turned healthy, and a member that fails
    /// a probe and turns healthy again draws again.
    #[test]
    fn returns_wait_their_share_of_the_spread_window() {
        let delay = Duration::from_secs(10);
        let spread = Duration::from_secs(8);
        let t0 = Instant::now();
        let mut due = Vec::new();
        for k in 0..8u32 {
            let mut p = Pool::new("a1");
            p.set_return_spread(spread);
            p.set_members(&[addr(1), addr(2)]);
            let r = p.ranked();
            p.failed(r[0]);
            p.probed(r[0], true, t0, f64::from(k) / 8.0);
            let when = (0..=200u64)
                .map(|ms100| t0 + Duration::from_millis(ms100 * 100))
                .find(|t| p.return_to(r[1], delay, *t) == Some(r[0]));
            due.push(when.map(|t| t - t0));
        }
        let expect: Vec<Option<Duration>> = (0..8u64)
            .map(|k| Some(Duration::from_secs(10 + k)))
            .collect();
        assert_eq!(due, expect);
        // A failed probe restarts the clock and the draw.
        let mut p = Pool::new("a1");
        p.set_return_spread(spread);
        p.set_members(&[addr(1), addr(2)]);
        let r = p.ranked();
        p.probed(r[0], true, t0, 0.0);
        p.probed(r[0], false, t0 + Duration::from_secs(1), 0.0);
        p.probed(r[0], true, t0 + Duration::from_secs(2), 1.0);
        let at = t0 + Duration::from_secs(2) + delay;
        assert_eq!(p.return_to(r[1], delay, at), None);
        assert_eq!(p.return_to(r[1], delay, at + spread), Some(r[0]));
        // Draws out of range are clamped: no NaN, no negative, no beyond the window.
        let mut p = Pool::new("a1");
        p.set_return_spread(spread);
        p.set_members(&[addr(1), addr(2)]);
        let r = p.ranked();
        p.probed(r[0], true, t0, f64::NAN);
        assert_eq!(p.return_to(r[1], delay, t0 + delay), Some(r[0]));
        p.probed(r[0], false, t0, 0.0);
        p.probed(r[0], true, t0, 7.0);
        assert_eq!(p.return_to(r[1], delay, t0 + delay + spread), Some(r[0]));
    }

    #[test]
    fn refusals_are_counted_by_the_protocols_reason() {
        let registry = Registry::new();
        let m = PoolMetrics::register(&registry).unwrap_or_else(|e| panic!("{e}"));
        for r in RefuseReason::ALL {
            assert_eq!(m.refusals(r), 0);
        }
        m.refused(RefuseReason::Busy);
        m.refused(RefuseReason::Busy);
        m.refused(RefuseReason::DuplicateAgentId);
        assert_eq!(m.refusals(RefuseReason::Busy), 2);
        assert_eq!(m.refusals(RefuseReason::DuplicateAgentId), 1);
        assert_eq!(m.refusals(RefuseReason::Draining), 0);
        let text = prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .unwrap_or_default();
        assert!(text.contains("uctel_agent_collector_refusals_total{reason=\"busy\"} 2"));
        assert!(text.contains("uctel_agent_collector_refusals_total{reason=\"draining\"} 0"));
    }

    /// A listener that answers each connection's first `Probe` with `answer(nonce)`.
    async fn answering(
        answer: impl Fn(u64) -> Option<uctel_protocol::control::ControlMessage> + Send + 'static,
    ) -> SocketAddr {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        use uctel_protocol::control::{self as wire, Body};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let mut d = wire::ControlDecoder::new();
                let mut buf = [0u8; 256];
                let nonce = loop {
                    if let Ok(Some(m)) = d.next_message() {
                        match m.body {
                            Some(Body::Probe(p)) => break p.nonce,
                            _ => panic!("not a probe: {m:?}"),
                        }
                    }
                    let n = s.read(&mut buf).await.unwrap();
                    assert!(n > 0, "closed before its Probe");
                    d.push(&buf[..n]);
                };
                if let Some(m) = answer(nonce) {
                    let mut out = Vec::new();
                    wire::encode_message(&m, &mut out).unwrap();
                    s.write_all(&out).await.unwrap();
                }
                tokio::time::sleep(Duration::from_secs(3)).await;
            }
        });
        at
    }

    #[tokio::test]
    async fn probe_passes_only_on_the_collectors_own_accepting_answer() {
        use uctel_protocol::control::{ProbeAnswer, Refuse, RefuseReason};
        let answer = |nonce, accepting, reason: RefuseReason| ProbeAnswer {
            nonce,
            accepting,
            reason: reason as i32,
        };
        let t = Duration::from_secs(1);
        // Accepting, with the probe's nonce.
        let ok = answering(move |n| Some(answer(n, true, RefuseReason::Unspecified).into())).await;
        assert!(probe(ok, t).await);
        // Draining or full: the process answers, but not accepting.
        let draining =
            answering(move |n| Some(answer(n, false, RefuseReason::Draining).into())).await;
        assert!(!probe(draining, t).await);
        // An answer to another probe.
        let stale =
            answering(move |n| Some(answer(n ^ 1, true, RefuseReason::Unspecified).into())).await;
        assert!(!probe(stale, t).await);
        // Accepted by the kernel, never answered (a stopped process): down.
        let silent = answering(|_| None).await;
        assert!(!probe(silent, t).await);
        // A collector older than `Probe` answers `Refuse{protocol_error}`: alive.
        let older = answering(|_| {
            Some(
                Refuse {
                    reason: RefuseReason::ProtocolError as i32,
                    detail: String::new(),
                }
                .into(),
            )
        })
        .await;
        assert!(probe(older, t).await);
        let busy = answering(|_| {
            Some(
                Refuse {
                    reason: RefuseReason::Busy as i32,
                    detail: String::new(),
                }
                .into(),
            )
        })
        .await;
        assert!(!probe(busy, t).await);
        let gone = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        assert!(!probe(gone, t).await);
    }

    #[tokio::test]
    async fn resolve_keeps_order_drops_duplicates_and_reports_bad_names() {
        let targets = vec![
            "127.0.0.2:7400".to_owned(),
            "127.0.0.1:7400".to_owned(),
            "127.0.0.2:7400".to_owned(),
            "no-such-host.invalid:7400".to_owned(),
        ];
        let (addrs, errors) = resolve(&targets).await;
        assert_eq!(addrs, vec![addr(2), addr(1)]);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].0, "no-such-host.invalid:7400");
    }
}
