//! The agent's side of the control channel (DESIGN.md §6) over tokio TCP.
//!
//! ```text
//! agent                                   collector
//!   Hello {agent_id, hostname, epoch, transport, capabilities, qp}  ──►
//!                                      ◄──  Challenge {nonce}
//!   Proof {HMAC-SHA256(token, transcript)}                          ──►
//!                                      ◄──  Welcome {qp, ring, rkey, slots, …} | Refuse
//! then Heartbeat both ways, Report from the collector, Goodbye from either side.
//! ```
//!
//! The channel and the handshake are `uctel_common::control`'s (the one control client, which
//! the collector's tests and the bench's load generator use too), the handshake's and the
//! heartbeats' rules `uctel_protocol::session`'s; this module names the agent's connection
//! type and words its errors from the agent's point of view.

use std::time::Duration;

use tokio::net::TcpStream;
use uctel_common::control::{
    client_handshake_within, ChannelError, ControlChannel, HandshakeError,
};
use uctel_protocol::control::{self, ControlMessage, Hello, RefuseReason, Welcome};

/// One control connection: `uctel_common`'s [`ControlChannel`] over TCP, with the agent's
/// errors.
#[derive(Debug)]
pub struct ControlConn {
    channel: ControlChannel<TcpStream>,
}

/// A control-channel failure.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// Reading or writing the socket failed.
    #[error("control connection I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The collector closed the connection.
    #[error("the collector closed the control connection")]
    Closed,
    /// A message did not decode or validate.
    #[error("bad control message from the collector: {0}")]
    Decode(#[from] control::DecodeError),
    /// A message we built did not encode (a bug, or a value out of the schema's range).
    #[error("cannot encode a control message: {0}")]
    Encode(#[from] control::EncodeError),
    /// The collector refused us.
    #[error("refused by the collector: {} ({detail})", reason.label())]
    Refused {
        /// Its reason.
        reason: RefuseReason,
        /// Its human-readable detail.
        detail: String,
    },
    /// A message arrived where the handshake expects another.
    #[error("expected {expected} from the collector, got {got}")]
    Unexpected {
        /// What the handshake expected.
        expected: &'static str,
        /// What arrived.
        got: &'static str,
    },
}

impl From<ChannelError> for ControlError {
    fn from(e: ChannelError) -> Self {
        match e {
            ChannelError::Io(e) => ControlError::Io(e),
            ChannelError::Decode(e) => ControlError::Decode(e),
            ChannelError::Encode(e) => ControlError::Encode(e),
        }
    }
}

/// A failed handshake: a [`ControlError`], or no `Welcome` in time.
#[derive(Debug)]
pub enum HandshakeFailure {
    /// The channel failed or the collector refused.
    Control(ControlError),
    /// No `Welcome` within the time allowed.
    TimedOut(Duration),
}

impl From<HandshakeError> for HandshakeFailure {
    fn from(e: HandshakeError) -> Self {
        HandshakeFailure::Control(match e {
            HandshakeError::Refused { reason, detail } => ControlError::Refused { reason, detail },
            HandshakeError::Channel(e) => e.into(),
            HandshakeError::Unexpected { expected, got } => {
                ControlError::Unexpected { expected, got }
            }
            HandshakeError::Closed { .. } => ControlError::Closed,
            HandshakeError::TimedOut(after) => return HandshakeFailure::TimedOut(after),
        })
    }
}

impl ControlConn {
    /// Wraps a connected stream (sets `TCP_NODELAY`: control messages are small and
    /// latency-sensitive).
    pub fn new(stream: TcpStream) -> Self {
        let _ = stream.set_nodelay(true);
        ControlConn {
            channel: ControlChannel::new(stream),
        }
    }

    /// The local address of the connection (the agent's address towards the collector).
    ///
    /// # Errors
    /// The OS error.
    pub fn local_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.channel.get_ref().local_addr()
    }

    /// Sends one message.
    ///
    /// # Errors
    /// [`ControlError::Encode`] or [`ControlError::Io`].
    pub async fn send(&mut self, msg: impl Into<ControlMessage>) -> Result<(), ControlError> {
        Ok(self.channel.send(msg).await?)
    }

    /// Receives the next message. Cancel-safe: bytes read before a cancellation stay
    /// buffered for the next call.
    ///
    /// # Errors
    /// [`ControlError::Closed`], [`ControlError::Io`], [`ControlError::Decode`].
    pub async fn recv(&mut self) -> Result<ControlMessage, ControlError> {
        self.channel.recv().await?.ok_or(ControlError::Closed)
    }

    /// Flushes and half-closes the connection (after a Goodbye), best effort.
    pub async fn shutdown(&mut self) {
        self.channel.shutdown().await;
    }

    /// The handshake (`uctel_common::control::client_handshake_within`, the one control
    /// client): sends `hello`, answers the challenge with the HMAC proof of `token`, and
    /// returns the collector's `Welcome`, all within `timeout`.
    ///
    /// # Errors
    /// [`HandshakeFailure::Control`] with [`ControlError::Refused`] (the collector's
    /// reason), [`ControlError::Unexpected`] on an out-of-order message, [`ControlError::Closed`]
    /// or an I/O / decode error; [`HandshakeFailure::TimedOut`].
    pub async fn handshake(
        &mut self,
        hello: Hello,
        token: &[u8],
        timeout: Duration,
    ) -> Result<Welcome, HandshakeFailure> {
        Ok(client_handshake_within(&mut self.channel, hello, token, timeout).await?)
    }
}
