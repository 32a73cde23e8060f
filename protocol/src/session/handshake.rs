//! The control handshake (DESIGN.md §6), both sides, as state machines:
//!
//! ```text
//! client (agent)                              server (collector)
//!   Hello ─────────────────────────────────►  version? then the driver's checks
//!                                             (transport, data path, known agent id)
//!                       ◄─────────────────── Challenge (32-byte nonce) | Refuse
//!   Proof = HMAC(token, nonce, id, epoch) ──►  verified in constant time
//!                       ◄─────────────────── Welcome | Refuse   (Welcome: the driver's,
//!                                             after the QP exists)
//! ```
//!
//! Sans-IO in the quinn-proto style: inputs are a decoded [`ControlMessage`], the end of
//! the stream or a channel failure, each with `now`; outputs are pulled: messages to send
//! ([`ClientHandshake::poll_transmit`], [`ServerHandshake::poll_transmit`]), the outcome
//! ([`ClientHandshake::poll_outcome`], [`ServerHandshake::poll_event`]) and the deadline
//! (`poll_timeout`, then `handle_timeout(now)`). The deadline holds from the machine's
//! creation: a handshake not finished by then fails at the deadline, not a moment before.
//! An input that arrives at or after the deadline is the timeout, not the input.
//!
//! Any message other than the one expected next (a second `Hello`, a `Heartbeat`, a
//! `Proof` before the `Challenge`) fails the handshake; each side receives exactly two
//! kinds of message in order, so a duplicate is always one of these.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::control::{
    self, Body, Challenge, ControlMessage, Hello, Proof, Refuse, RefuseReason, Welcome,
    MAX_DETAIL_BYTES, NONCE_BYTES, PROTOCOL_VERSION,
};

// ---------------------------------------------------------------------------------------------
// Client
// ---------------------------------------------------------------------------------------------

/// Why the client side of the handshake failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// The server answered `Refuse`.
    #[error("refused ({}): {detail}", reason.label())]
    Refused {
        /// Its reason (`Unspecified` for a reason this build does not know).
        reason: RefuseReason,
        /// Its detail text.
        detail: String,
    },
    /// Another message than the one expected arrived.
    #[error("unexpected {got} (expected {expected})")]
    Unexpected {
        /// What the handshake expected.
        expected: &'static str,
        /// What arrived (a message name, `(empty)` without a body).
        got: &'static str,
    },
    /// The server closed the connection.
    #[error("connection closed (expected {expected})")]
    Closed {
        /// What the handshake expected.
        expected: &'static str,
    },
    /// No `Welcome` by the deadline.
    #[error("no Welcome within {after:?}")]
    TimedOut {
        /// The handshake's time allowance.
        after: Duration,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClientState {
    AwaitChallenge,
    AwaitWelcome,
    Done,
}

/// The agent side: sends `Hello`, answers the `Challenge` with the HMAC [`control::proof`]
/// of the token (the token never crosses the wire), ends with the `Welcome` or an error.
pub struct ClientHandshake {
    state: ClientState,
    agent_id: String,
    epoch: u64,
    token: Vec<u8>,
    deadline: Option<(Instant, Duration)>,
    transmit: VecDeque<ControlMessage>,
    outcome: Option<Result<Welcome, ClientError>>,
}

impl std::fmt::Debug for ClientHandshake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the token.
        f.debug_struct("ClientHandshake")
            .field("state", &self.state)
            .field("agent_id", &self.agent_id)
            .field("epoch", &self.epoch)
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

impl ClientHandshake {
    /// A handshake started at `now` with `hello` (queued for [`Self::poll_transmit`]),
    /// proving `token`; `timeout`: fail unless welcomed within it (`None`: no deadline).
    pub fn new(hello: Hello, token: &[u8], now: Instant, timeout: Option<Duration>) -> Self {
        let agent_id = hello.agent_id.clone();
        let epoch = hello.epoch;
        ClientHandshake {
            state: ClientState::AwaitChallenge,
            agent_id,
            epoch,
            token: token.to_vec(),
            deadline: timeout.map(|t| (now + t, t)),
            transmit: VecDeque::from([ControlMessage::from(hello)]),
            outcome: None,
        }
    }

    /// The next message to send.
    pub fn poll_transmit(&mut self) -> Option<ControlMessage> {
        self.transmit.pop_front()
    }

    /// When the handshake fails unless it finished; `None` when finished or without one.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            ClientState::Done => None,
            _ => self.deadline.map(|(at, _)| at),
        }
    }

    /// The outcome, once: the server's `Welcome`, or why not.
    pub fn poll_outcome(&mut self) -> Option<Result<Welcome, ClientError>> {
        self.outcome.take()
    }

    /// True once the outcome is known (taken or not).
    pub fn is_done(&self) -> bool {
        self.state == ClientState::Done
    }

    /// What the handshake waits for: `Challenge`, `Welcome`, or `nothing` when done.
    pub fn expected(&self) -> &'static str {
        match self.state {
            ClientState::AwaitChallenge => "Challenge",
            ClientState::AwaitWelcome => "Welcome",
            ClientState::Done => "nothing",
        }
    }

    /// A message from the server arrived at `now`.
    pub fn on_message(&mut self, msg: ControlMessage, now: Instant) {
        if self.timed_out(now) {
            return;
        }
        let got = msg.name();
        match (self.state, msg.body) {
            (ClientState::Done, _) => {}
            (_, Some(Body::Refuse(r))) => self.finish(Err(ClientError::Refused {
                reason: RefuseReason::try_from(r.reason).unwrap_or(RefuseReason::Unspecified),
                detail: r.detail,
            })),
            (ClientState::AwaitChallenge, Some(Body::Challenge(c))) => {
                let Some(nonce) = c.nonce_array() else {
                    return self.finish(Err(ClientError::Unexpected {
                        expected: "Challenge with a 32-byte nonce",
                        got: "Challenge",
                    }));
                };
                let hmac = control::proof(&self.token, &nonce, &self.agent_id, self.epoch);
                self.transmit.push_back(
                    Proof {
                        hmac: hmac.to_vec(),
                    }
                    .into(),
                );
                self.state = ClientState::AwaitWelcome;
            }
            (ClientState::AwaitWelcome, Some(Body::Welcome(w))) => self.finish(Ok(w)),
            (_, _) => {
                let expected = self.expected();
                self.finish(Err(ClientError::Unexpected { expected, got }));
            }
        }
    }

    /// The server closed the connection at `now`.
    pub fn on_closed(&mut self, now: Instant) {
        if self.timed_out(now) || self.state == ClientState::Done {
            return;
        }
        let expected = self.expected();
        self.finish(Err(ClientError::Closed { expected }));
    }

    /// Runs the deadline at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        let _ = self.timed_out(now);
    }

    /// Fails the handshake when `now` is at or past its deadline; true when it is over.
    fn timed_out(&mut self, now: Instant) -> bool {
        match (self.state, self.deadline) {
            (ClientState::Done, _) => true,
            (_, Some((at, after))) if now >= at => {
                self.finish(Err(ClientError::TimedOut { after }));
                true
            }
            _ => false,
        }
    }

    fn finish(&mut self, outcome: Result<Welcome, ClientError>) {
        self.state = ClientState::Done;
        self.transmit.clear();
        self.outcome = Some(outcome);
    }
}

// ---------------------------------------------------------------------------------------------
// Server
// ---------------------------------------------------------------------------------------------

/// A handshake that ended in a refusal: what the server sends as `Refuse` and counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The reason (a label of `handshakes_refused_total`).
    pub reason: RefuseReason,
    /// The agent id from `Hello`; empty before a `Hello` arrived, and for a broken channel
    /// or a timeout (whatever arrived may not be the agent's).
    pub agent: String,
    /// Human-readable detail (may quote the peer's bytes).
    pub detail: String,
}

impl Refusal {
    /// A refusal of `agent` for `reason`.
    pub fn new(reason: RefuseReason, agent: impl Into<String>, detail: impl Into<String>) -> Self {
        Refusal {
            reason,
            agent: agent.into(),
            detail: detail.into(),
        }
    }

    /// The `Refuse` message: the detail cut to [`MAX_DETAIL_BYTES`] at a character boundary
    /// (`String::truncate` panics inside a character, and the detail may quote the peer's
    /// bytes).
    pub fn message(&self) -> Refuse {
        Refuse {
            reason: self.reason as i32,
            detail: cut_at_char(&self.detail, MAX_DETAIL_BYTES).to_owned(),
        }
    }
}

/// `s` cut to at most `max` bytes at a character boundary.
pub fn cut_at_char(s: &str, max: usize) -> &str {
    let mut cut = s.len().min(max);
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    s.get(..cut).unwrap_or_default()
}

/// What the server side asks of its driver.
#[derive(Debug, Clone, PartialEq)]
pub enum ServerEvent {
    /// A `Hello` of this protocol version arrived: check what only the driver knows
    /// (transport, data path, whether the agent id has a token), then call
    /// [`ServerHandshake::challenge`] or [`ServerHandshake::refuse`].
    CheckHello(Hello),
    /// The proof verified: the agent of this `Hello` holds the token. The driver answers
    /// `Welcome` (or refuses for its own reasons).
    Authenticated(Hello),
    /// The handshake failed: send [`Refusal::message`] and close.
    Refused(Refusal),
}

#[derive(Clone)]
enum ServerState {
    AwaitHello,
    Checking {
        hello: Hello,
    },
    AwaitProof {
        hello: Hello,
        nonce: [u8; NONCE_BYTES],
        token: Vec<u8>,
    },
    Done,
}

impl std::fmt::Debug for ServerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the token.
        f.write_str(match self {
            ServerState::AwaitHello => "AwaitHello",
            ServerState::Checking { .. } => "Checking",
            ServerState::AwaitProof { .. } => "AwaitProof",
            ServerState::Done => "Done",
        })
    }
}

/// The collector side: waits for `Hello`, checks its version, lets the driver check the
/// rest, sends the `Challenge`, verifies the `Proof`.
#[derive(Debug)]
pub struct ServerHandshake {
    state: ServerState,
    deadline: Instant,
    timeout: Duration,
    transmit: VecDeque<ControlMessage>,
    events: VecDeque<ServerEvent>,
}

impl ServerHandshake {
    /// A connection accepted at `now` that must be authenticated within `timeout`.
    pub fn new(now: Instant, timeout: Duration) -> Self {
        ServerHandshake {
            state: ServerState::AwaitHello,
            deadline: now + timeout,
            timeout,
            transmit: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    /// The next message to send (the `Challenge`).
    pub fn poll_transmit(&mut self) -> Option<ControlMessage> {
        self.transmit.pop_front()
    }

    /// The next thing for the driver to do.
    pub fn poll_event(&mut self) -> Option<ServerEvent> {
        self.events.pop_front()
    }

    /// The deadline; `None` once finished.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            ServerState::Done => None,
            _ => Some(self.deadline),
        }
    }

    /// True once authenticated or refused.
    pub fn is_done(&self) -> bool {
        matches!(self.state, ServerState::Done)
    }

    /// A message from the agent arrived at `now`.
    pub fn on_message(&mut self, msg: ControlMessage, now: Instant) {
        if self.timed_out(now) {
            return;
        }
        let got = msg.name();
        match std::mem::replace(&mut self.state, ServerState::Done) {
            ServerState::Done => {}
            ServerState::AwaitHello => match msg.body {
                Some(Body::Hello(hello)) if hello.protocol_version != PROTOCOL_VERSION => {
                    let detail = format!(
                        "control protocol version {} not supported; this collector speaks \
                         {PROTOCOL_VERSION}",
                        hello.protocol_version
                    );
                    self.fail(RefuseReason::VersionMismatch, &hello.agent_id, detail);
                }
                Some(Body::Hello(hello)) => {
                    self.events
                        .push_back(ServerEvent::CheckHello(hello.clone()));
                    self.state = ServerState::Checking { hello };
                }
                _ => self.fail(
                    RefuseReason::ProtocolError,
                    "",
                    format!("expected Hello, got {got}"),
                ),
            },
            ServerState::Checking { hello } => self.fail(
                RefuseReason::ProtocolError,
                &hello.agent_id,
                format!("unexpected {got} before the Challenge"),
            ),
            ServerState::AwaitProof {
                hello,
                nonce,
                token,
            } => match msg.body {
                Some(Body::Proof(p)) => {
                    if control::verify_proof(&token, &nonce, &hello.agent_id, hello.epoch, &p.hmac)
                    {
                        self.events.push_back(ServerEvent::Authenticated(hello));
                    } else {
                        self.fail(
                            RefuseReason::BadProof,
                            &hello.agent_id,
                            "proof does not match the token",
                        );
                    }
                }
                _ => self.fail(
                    RefuseReason::ProtocolError,
                    &hello.agent_id,
                    format!("expected Proof, got {got}"),
                ),
            },
        }
    }

    /// The agent closed the connection at `now`.
    pub fn on_closed(&mut self, now: Instant) {
        if self.timed_out(now) {
            return;
        }
        match std::mem::replace(&mut self.state, ServerState::Done) {
            ServerState::Done => {}
            ServerState::AwaitHello => self.fail(
                RefuseReason::ProtocolError,
                "",
                "connection closed before Hello",
            ),
            ServerState::Checking { hello } | ServerState::AwaitProof { hello, .. } => self.fail(
                RefuseReason::ProtocolError,
                &hello.agent_id,
                "expected Proof, got end of stream",
            ),
        }
    }

    /// The channel failed at `now` (I/O, bytes that are not a valid message): refused as a
    /// protocol error naming no agent, with `detail` (the channel's error).
    pub fn on_error(&mut self, detail: impl Into<String>, now: Instant) {
        if self.timed_out(now) || self.is_done() {
            return;
        }
        self.fail(RefuseReason::ProtocolError, "", detail);
    }

    /// After [`ServerEvent::CheckHello`]: the `Hello` is acceptable and its agent must prove
    /// `token`; queues the `Challenge` with `nonce` (fresh from [`control::random_nonce`])
    /// and `collector_id`. Ignored in any other state.
    pub fn challenge(&mut self, token: &[u8], nonce: [u8; NONCE_BYTES], collector_id: &str) {
        if let ServerState::Checking { hello } =
            std::mem::replace(&mut self.state, ServerState::Done)
        {
            self.transmit.push_back(
                Challenge {
                    nonce: nonce.to_vec(),
                    collector_id: collector_id.to_owned(),
                }
                .into(),
            );
            self.state = ServerState::AwaitProof {
                hello,
                nonce,
                token: token.to_vec(),
            };
        } else {
            self.state = ServerState::Done;
        }
    }

    /// Refuses for the driver's `reason` (after [`ServerEvent::CheckHello`]: transport, data
    /// path, unknown agent; or no nonce), naming the `Hello`'s agent. Ignored once done.
    pub fn refuse(&mut self, reason: RefuseReason, detail: impl Into<String>) {
        let agent = match &self.state {
            ServerState::Done => return,
            ServerState::AwaitHello => String::new(),
            ServerState::Checking { hello } | ServerState::AwaitProof { hello, .. } => {
                hello.agent_id.clone()
            }
        };
        self.fail(reason, &agent, detail);
    }

    /// Runs the deadline at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        let _ = self.timed_out(now);
    }

    /// Refuses with `handshake_timeout` when `now` is at or past the deadline; true when
    /// the handshake is over.
    fn timed_out(&mut self, now: Instant) -> bool {
        if self.is_done() {
            return true;
        }
        if now < self.deadline {
            return false;
        }
        let detail = format!("no Welcome within {:?}", self.timeout);
        self.fail(RefuseReason::HandshakeTimeout, "", detail);
        true
    }

    fn fail(&mut self, reason: RefuseReason, agent: &str, detail: impl Into<String>) {
        self.state = ServerState::Done;
        self.transmit.clear();
        self.events
            .push_back(ServerEvent::Refused(Refusal::new(reason, agent, detail)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::{DataPath, Heartbeat, QpEndpoint, Transport};

    const TOKEN: &[u8] = b"the token";
    const NONCE: [u8; NONCE_BYTES] = [7; NONCE_BYTES];
    const TIMEOUT: Duration = Duration::from_secs(5);

    fn hello() -> Hello {
        Hello {
            protocol_version: PROTOCOL_VERSION,
            agent_id: "a1".into(),
            hostname: "h".into(),
            epoch: 9,
            transport: Transport::Soft as i32,
            capabilities: vec![DataPath::Send as i32],
            qp: Some(QpEndpoint {
                gid: vec![0; 16],
                qpn: 17,
                psn: 1,
                mtu: 1024,
                udp_addr: "127.0.0.1:5000".into(),
            }),
            ..Default::default()
        }
    }

    fn welcome() -> Welcome {
        Welcome {
            slots: 8,
            ..Welcome::default()
        }
    }

    /// A server driver's policy for tests: accept agent `a1` with `token`, refuse others.
    fn check(server: &mut ServerHandshake, hello: &Hello, token: &[u8]) {
        if hello.agent_id == "a1" {
            server.challenge(token, NONCE, "c");
        } else {
            server.refuse(RefuseReason::UnknownAgent, "agent id not configured");
        }
    }

    /// Wires a client and a server back to back on a virtual clock where each message
    /// takes `hop`; the server driver answers `Welcome` to an authenticated agent. Bounded.
    fn pair(
        client: &mut ClientHandshake,
        server: &mut ServerHandshake,
        server_token: &[u8],
        start: Instant,
        hop: Duration,
    ) -> (Option<Result<Welcome, ClientError>>, Vec<ServerEvent>) {
        let mut now = start;
        let mut server_events = Vec::new();
        for _ in 0..100 {
            let mut moved = false;
            while let Some(m) = client.poll_transmit() {
                now += hop;
                server.on_message(m, now);
                moved = true;
            }
            while let Some(e) = server.poll_event() {
                match &e {
                    ServerEvent::CheckHello(h) => check(server, h, server_token),
                    ServerEvent::Authenticated(_) => {
                        now += hop;
                        client.on_message(welcome().into(), now);
                    }
                    ServerEvent::Refused(r) => {
                        now += hop;
                        client.on_message(r.message().into(), now);
                    }
                }
                server_events.push(e);
                moved = true;
            }
            while let Some(m) = server.poll_transmit() {
                now += hop;
                client.on_message(m, now);
                moved = true;
            }
            if !moved {
                return (client.poll_outcome(), server_events);
            }
        }
        panic!("the handshake did not settle");
    }

    #[test]
    fn happy_path() {
        let t0 = Instant::now();
        let mut c = ClientHandshake::new(hello(), TOKEN, t0, Some(TIMEOUT));
        let mut s = ServerHandshake::new(t0, TIMEOUT);
        let (outcome, events) = pair(&mut c, &mut s, TOKEN, t0, Duration::from_millis(10));
        assert_eq!(outcome, Some(Ok(welcome())));
        assert_eq!(
            events,
            [
                ServerEvent::CheckHello(hello()),
                ServerEvent::Authenticated(hello())
            ]
        );
        assert!(c.is_done() && s.is_done());
        assert_eq!((c.poll_timeout(), s.poll_timeout()), (None, None));
        // Nothing more comes out, whatever arrives after.
        c.on_message(welcome().into(), t0);
        s.on_message(hello().into(), t0);
        assert_eq!(c.poll_outcome(), None);
        assert_eq!(s.poll_event(), None);
        assert!(c.poll_transmit().is_none() && s.poll_transmit().is_none());
    }

    #[test]
    fn refuse_reaches_the_client_with_its_reason() {
        let t0 = Instant::now();
        let mut h = hello();
        h.agent_id = "stranger".into();
        let mut c = ClientHandshake::new(h, TOKEN, t0, Some(TIMEOUT));
        let mut s = ServerHandshake::new(t0, TIMEOUT);
        let (outcome, events) = pair(&mut c, &mut s, TOKEN, t0, Duration::from_millis(10));
        assert_eq!(
            outcome,
            Some(Err(ClientError::Refused {
                reason: RefuseReason::UnknownAgent,
                detail: "agent id not configured".into()
            }))
        );
        assert!(matches!(
            events.last(),
            Some(ServerEvent::Refused(r)) if r.agent == "stranger" && r.reason == RefuseReason::UnknownAgent
        ));
        // A reason from a newer collector reads as Unspecified.
        let mut c = ClientHandshake::new(hello(), TOKEN, t0, None);
        let _ = c.poll_transmit();
        c.on_message(
            Refuse {
                reason: 999,
                detail: "new".into(),
            }
            .into(),
            t0,
        );
        assert!(matches!(
            c.poll_outcome(),
            Some(Err(ClientError::Refused {
                reason: RefuseReason::Unspecified,
                ..
            }))
        ));
    }

    #[test]
    fn bad_proof_is_refused() {
        let t0 = Instant::now();
        let mut c = ClientHandshake::new(hello(), b"wrong token", t0, Some(TIMEOUT));
        let mut s = ServerHandshake::new(t0, TIMEOUT);
        let (outcome, events) = pair(&mut c, &mut s, TOKEN, t0, Duration::from_millis(10));
        assert!(
            matches!(
                &outcome,
                Some(Err(ClientError::Refused {
                    reason: RefuseReason::BadProof,
                    ..
                }))
            ),
            "{outcome:?}"
        );
        assert_eq!(
            events.last(),
            Some(&ServerEvent::Refused(Refusal::new(
                RefuseReason::BadProof,
                "a1",
                "proof does not match the token"
            )))
        );
        // A proof for another nonce (a replay) is as bad.
        let mut s = ServerHandshake::new(t0, TIMEOUT);
        s.on_message(hello().into(), t0);
        s.challenge(TOKEN, NONCE, "c");
        let replay = control::proof(TOKEN, &[8; NONCE_BYTES], "a1", 9);
        s.on_message(
            Proof {
                hmac: replay.to_vec(),
            }
            .into(),
            t0,
        );
        assert!(matches!(s.poll_event(), Some(ServerEvent::CheckHello(_))));
        assert!(matches!(
            s.poll_event(),
            Some(ServerEvent::Refused(Refusal {
                reason: RefuseReason::BadProof,
                ..
            }))
        ));
    }

    #[test]
    fn a_version_mismatch_is_refused_by_the_machine() {
        let t0 = Instant::now();
        let mut s = ServerHandshake::new(t0, TIMEOUT);
        s.on_message(
            Hello {
                protocol_version: PROTOCOL_VERSION + 1,
                ..hello()
            }
            .into(),
            t0,
        );
        let Some(ServerEvent::Refused(r)) = s.poll_event() else {
            panic!("not refused")
        };
        assert_eq!(
            (r.reason, r.agent.as_str()),
            (RefuseReason::VersionMismatch, "a1")
        );
        assert!(r.detail.contains("speaks 1"), "{}", r.detail);
        assert!(s.poll_transmit().is_none());
    }

    #[test]
    fn messages_out_of_order_fail_both_sides() {
        let t0 = Instant::now();
        // Server: anything but Hello first, anything but Proof after the Challenge.
        let mut s = ServerHandshake::new(t0, TIMEOUT);
        s.on_message(Heartbeat::default().into(), t0);
        assert_eq!(
            s.poll_event(),
            Some(ServerEvent::Refused(Refusal::new(
                RefuseReason::ProtocolError,
                "",
                "expected Hello, got Heartbeat"
            )))
        );
        let mut s = ServerHandshake::new(t0, TIMEOUT);
        s.on_message(Proof { hmac: vec![0; 32] }.into(), t0);
        assert!(
            matches!(s.poll_event(), Some(ServerEvent::Refused(r)) if r.detail == "expected Hello, got Proof")
        );
        let mut s = ServerHandshake::new(t0, TIMEOUT);
        s.on_message(hello().into(), t0);
        let _ = s.poll_event();
        s.challenge(TOKEN, NONCE, "c");
        s.on_message(welcome().into(), t0);
        assert_eq!(
            s.poll_event(),
            Some(ServerEvent::Refused(Refusal::new(
                RefuseReason::ProtocolError,
                "a1",
                "expected Proof, got Welcome"
            )))
        );
        // Client: a Welcome before the Challenge, a Heartbeat instead of the Welcome.
        let mut c = ClientHandshake::new(hello(), TOKEN, t0, None);
        assert!(matches!(
            c.poll_transmit().and_then(|m| m.body),
            Some(Body::Hello(_))
        ));
        c.on_message(welcome().into(), t0);
        assert_eq!(
            c.poll_outcome(),
            Some(Err(ClientError::Unexpected {
                expected: "Challenge",
                got: "Welcome"
            }))
        );
        let mut c = ClientHandshake::new(hello(), TOKEN, t0, None);
        let _ = c.poll_transmit();
        c.on_message(
            Challenge {
                nonce: NONCE.to_vec(),
                collector_id: "c".into(),
            }
            .into(),
            t0,
        );
        assert!(matches!(
            c.poll_transmit().and_then(|m| m.body),
            Some(Body::Proof(_))
        ));
        c.on_message(Heartbeat::default().into(), t0);
        assert_eq!(
            c.poll_outcome(),
            Some(Err(ClientError::Unexpected {
                expected: "Welcome",
                got: "Heartbeat"
            }))
        );
        // A short nonce, an empty envelope.
        let mut c = ClientHandshake::new(hello(), TOKEN, t0, None);
        c.on_message(
            Challenge {
                nonce: vec![1; 5],
                collector_id: "c".into(),
            }
            .into(),
            t0,
        );
        assert!(matches!(
            c.poll_outcome(),
            Some(Err(ClientError::Unexpected {
                expected: "Challenge with a 32-byte nonce",
                ..
            }))
        ));
        let mut c = ClientHandshake::new(hello(), TOKEN, t0, None);
        c.on_message(ControlMessage { body: None }, t0);
        assert!(matches!(
            c.poll_outcome(),
            Some(Err(ClientError::Unexpected { got: "(empty)", .. }))
        ));
    }

    #[test]
    fn duplicate_messages_fail_the_handshake() {
        let t0 = Instant::now();
        // A second Hello where the Proof belongs.
        let mut s = ServerHandshake::new(t0, TIMEOUT);
        s.on_message(hello().into(), t0);
        let _ = s.poll_event();
        s.challenge(TOKEN, NONCE, "c");
        assert!(s.poll_transmit().is_some());
        s.on_message(hello().into(), t0);
        assert_eq!(
            s.poll_event(),
            Some(ServerEvent::Refused(Refusal::new(
                RefuseReason::ProtocolError,
                "a1",
                "expected Proof, got Hello"
            )))
        );
        // A second Hello before the driver decided on the first.
        let mut s = ServerHandshake::new(t0, TIMEOUT);
        s.on_message(hello().into(), t0);
        s.on_message(hello().into(), t0);
        assert!(matches!(s.poll_event(), Some(ServerEvent::CheckHello(_))));
        assert!(
            matches!(s.poll_event(), Some(ServerEvent::Refused(r)) if r.detail == "unexpected Hello before the Challenge")
        );
        // The driver's late decision changes nothing.
        s.challenge(TOKEN, NONCE, "c");
        assert!(s.poll_transmit().is_none() && s.poll_event().is_none());
        // A second Challenge where the Welcome belongs.
        let mut c = ClientHandshake::new(hello(), TOKEN, t0, None);
        let challenge = || {
            ControlMessage::from(Challenge {
                nonce: NONCE.to_vec(),
                collector_id: "c".into(),
            })
        };
        c.on_message(challenge(), t0);
        c.on_message(challenge(), t0);
        assert_eq!(
            c.poll_outcome(),
            Some(Err(ClientError::Unexpected {
                expected: "Welcome",
                got: "Challenge"
            }))
        );
        // The Hello and the Proof were queued before the failure; the failure drops what
        // is still queued.
        assert!(c.poll_transmit().is_none());
    }

    #[test]
    fn the_deadline_fires_at_the_deadline_and_not_before() {
        let t0 = Instant::now();
        let just_before = t0 + TIMEOUT - Duration::from_nanos(1);
        // Server: silent peer.
        let mut s = ServerHandshake::new(t0, TIMEOUT);
        assert_eq!(s.poll_timeout(), Some(t0 + TIMEOUT));
        s.handle_timeout(just_before);
        assert_eq!(s.poll_event(), None);
        s.handle_timeout(t0 + TIMEOUT);
        assert_eq!(
            s.poll_event(),
            Some(ServerEvent::Refused(Refusal::new(
                RefuseReason::HandshakeTimeout,
                "",
                "no Welcome within 5s"
            )))
        );
        assert_eq!(s.poll_timeout(), None);
        // Server: the Proof arriving just before the deadline counts, at it does not.
        for (at, authenticated) in [(just_before, true), (t0 + TIMEOUT, false)] {
            let mut s = ServerHandshake::new(t0, TIMEOUT);
            s.on_message(hello().into(), t0);
            let _ = s.poll_event();
            s.challenge(TOKEN, NONCE, "c");
            let hmac = control::proof(TOKEN, &NONCE, "a1", 9).to_vec();
            s.on_message(Proof { hmac }.into(), at);
            assert_eq!(
                matches!(s.poll_event(), Some(ServerEvent::Authenticated(_))),
                authenticated
            );
        }
        // Client: the collector never answers; the Welcome at the deadline is too late.
        let mut c = ClientHandshake::new(hello(), TOKEN, t0, Some(TIMEOUT));
        assert_eq!(c.poll_timeout(), Some(t0 + TIMEOUT));
        c.handle_timeout(just_before);
        assert_eq!(c.poll_outcome(), None);
        c.on_message(
            Challenge {
                nonce: NONCE.to_vec(),
                collector_id: "c".into(),
            }
            .into(),
            just_before,
        );
        c.on_message(welcome().into(), t0 + TIMEOUT);
        assert_eq!(
            c.poll_outcome(),
            Some(Err(ClientError::TimedOut { after: TIMEOUT }))
        );
        // A slow pair: 3 hops of 2 s each miss a 5 s deadline on both sides.
        let mut c = ClientHandshake::new(hello(), TOKEN, t0, Some(TIMEOUT));
        let mut s = ServerHandshake::new(t0, TIMEOUT);
        let (outcome, events) = pair(&mut c, &mut s, TOKEN, t0, Duration::from_secs(2));
        assert_eq!(outcome, Some(Err(ClientError::TimedOut { after: TIMEOUT })));
        assert!(matches!(
            events.last(),
            Some(ServerEvent::Refused(Refusal {
                reason: RefuseReason::HandshakeTimeout,
                ..
            }))
        ));
        // Without a deadline the client waits for ever.
        let c = ClientHandshake::new(hello(), TOKEN, t0, None);
        assert_eq!(c.poll_timeout(), None);
    }

    #[test]
    fn a_closed_connection_fails_the_handshake() {
        let t0 = Instant::now();
        let mut s = ServerHandshake::new(t0, TIMEOUT);
        s.on_closed(t0);
        assert!(
            matches!(s.poll_event(), Some(ServerEvent::Refused(r)) if r.detail == "connection closed before Hello" && r.reason == RefuseReason::ProtocolError)
        );
        let mut s = ServerHandshake::new(t0, TIMEOUT);
        s.on_message(hello().into(), t0);
        let _ = s.poll_event();
        s.challenge(TOKEN, NONCE, "c");
        s.on_closed(t0);
        assert!(
            matches!(s.poll_event(), Some(ServerEvent::Refused(r)) if r.detail == "expected Proof, got end of stream" && r.agent == "a1")
        );
        let mut s = ServerHandshake::new(t0, TIMEOUT);
        s.on_error("control message from peer: too long", t0);
        assert!(
            matches!(s.poll_event(), Some(ServerEvent::Refused(r)) if r.agent.is_empty() && r.reason == RefuseReason::ProtocolError)
        );
        let mut c = ClientHandshake::new(hello(), TOKEN, t0, None);
        c.on_closed(t0);
        assert_eq!(
            c.poll_outcome(),
            Some(Err(ClientError::Closed {
                expected: "Challenge"
            }))
        );
    }

    #[test]
    fn refusal_details_are_cut_at_a_character_boundary() {
        let r = Refusal::new(RefuseReason::ProtocolError, "", "€".repeat(1000));
        let m = r.message();
        assert!(m.detail.len() <= MAX_DETAIL_BYTES && m.detail.len() > MAX_DETAIL_BYTES - 3);
        assert!(m.detail.chars().all(|c| c == '€'));
        assert_eq!(cut_at_char("abc", 10), "abc");
        assert_eq!(cut_at_char("aé", 2), "a");
    }
}
