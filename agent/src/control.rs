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
//! Framing and validation are `uctel_protocol::control`'s (length-prefixed protobuf); this
//! module only moves the bytes and enforces the order of the handshake.

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use uctel_protocol::control::{
    self, Body, ControlDecoder, ControlMessage, Hello, Proof, RefuseReason, Welcome,
};

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
    #[error("refused by the collector: {reason} ({detail})")]
    Refused {
        /// Its reason label.
        reason: &'static str,
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

/// One control connection, split into a buffered reader and a writer.
#[derive(Debug)]
pub struct ControlConn {
    stream: TcpStream,
    decoder: ControlDecoder,
    buf: BytesMut,
    out: Vec<u8>,
}

impl ControlConn {
    /// Wraps a connected stream (sets `TCP_NODELAY`: control messages are small and
    /// latency-sensitive).
    pub fn new(stream: TcpStream) -> Self {
        let _ = stream.set_nodelay(true);
        Self {
            stream,
            decoder: ControlDecoder::new(),
            buf: BytesMut::with_capacity(4096),
            out: Vec::with_capacity(512),
        }
    }

    /// The local address of the connection (the agent's address towards the collector).
    ///
    /// # Errors
    /// The OS error.
    pub fn local_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.stream.local_addr()
    }

    /// Sends one message.
    ///
    /// # Errors
    /// [`ControlError::Encode`] or [`ControlError::Io`].
    pub async fn send(&mut self, msg: impl Into<ControlMessage>) -> Result<(), ControlError> {
        self.out.clear();
        control::encode_message(&msg.into(), &mut self.out)?;
        self.stream.write_all(&self.out).await?;
        Ok(())
    }

    /// Receives the next message. Cancel-safe: bytes read before a cancellation stay
    /// buffered for the next call.
    ///
    /// # Errors
    /// [`ControlError::Closed`], [`ControlError::Io`], [`ControlError::Decode`].
    pub async fn recv(&mut self) -> Result<ControlMessage, ControlError> {
        loop {
            if let Some(msg) = self.decoder.decode(&mut self.buf)? {
                return Ok(msg);
            }
            let n = self.stream.read_buf(&mut self.buf).await?;
            if n == 0 {
                return Err(ControlError::Closed);
            }
        }
    }

    /// Flushes and half-closes the connection (after a Goodbye).
    ///
    /// # Errors
    /// The OS error.
    pub async fn shutdown(&mut self) -> std::io::Result<()> {
        self.stream.shutdown().await
    }
}

/// Runs the handshake: sends `hello`, answers the challenge with the HMAC proof of `token`,
/// and returns the collector's `Welcome`.
///
/// # Errors
/// [`ControlError::Refused`] with the collector's reason, [`ControlError::Unexpected`] on an
/// out-of-order message, or an I/O / decode error.
pub async fn handshake(
    conn: &mut ControlConn,
    hello: Hello,
    token: &[u8],
) -> Result<Welcome, ControlError> {
    let agent_id = hello.agent_id.clone();
    let epoch = hello.epoch;
    conn.send(hello).await?;
    let nonce = match conn.recv().await?.body {
        Some(Body::Challenge(c)) => c.nonce_array().ok_or(ControlError::Unexpected {
            expected: "Challenge with a 32-byte nonce",
            got: "Challenge",
        })?,
        other => return Err(unexpected("Challenge", other)),
    };
    let hmac = control::proof(token, &nonce, &agent_id, epoch);
    conn.send(Proof {
        hmac: hmac.to_vec(),
    })
    .await?;
    match conn.recv().await?.body {
        Some(Body::Welcome(w)) => Ok(w),
        other => Err(unexpected("Welcome", other)),
    }
}

fn unexpected(expected: &'static str, got: Option<Body>) -> ControlError {
    match got {
        Some(Body::Refuse(r)) => ControlError::Refused {
            reason: RefuseReason::try_from(r.reason)
                .unwrap_or(RefuseReason::Unspecified)
                .label(),
            detail: r.detail,
        },
        Some(b) => ControlError::Unexpected {
            expected,
            got: b.name(),
        },
        None => ControlError::Unexpected {
            expected,
            got: "(empty)",
        },
    }
}
