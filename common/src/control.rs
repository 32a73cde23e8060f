//! The control channel over a byte stream (TCP in the daemons): length-prefixed
//! `ControlMessage`s from `uctel_protocol::control`, plus the driver of the agent side of
//! the handshake (DESIGN.md §6; the rules are `uctel_protocol::session`'s), so the agent,
//! the collector's tests and the bench's load generator share one control client.
//!
//! [`ControlChannel::recv`] is cancel-safe (bytes already read stay buffered in the decoder),
//! so it can sit in a `tokio::select!` next to timers.

use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use uctel_protocol::control::{self, ControlDecoder, ControlMessage, Hello, RefuseReason, Welcome};
use uctel_protocol::session::{ClientError, ClientHandshake};

/// Errors on the control channel.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    /// Reading or writing the stream failed.
    #[error("control connection I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The peer sent bytes that are not a valid control message (the framing is lost).
    #[error("control message from peer: {0}")]
    Decode(#[from] control::DecodeError),
    /// A message of ours did not encode (a bug: it failed validation).
    #[error("control message to peer: {0}")]
    Encode(#[from] control::EncodeError),
}

/// A framed control connection.
#[derive(Debug)]
pub struct ControlChannel<S> {
    stream: S,
    decoder: ControlDecoder,
    chunk: Box<[u8]>,
    out: Vec<u8>,
}

impl<S: AsyncRead + AsyncWrite + Unpin> ControlChannel<S> {
    /// Wraps a connected stream.
    pub fn new(stream: S) -> Self {
        Self {
            stream,
            decoder: ControlDecoder::new(),
            chunk: vec![0u8; 16 * 1024].into_boxed_slice(),
            out: Vec::new(),
        }
    }

    /// The next message; `Ok(None)` when the peer closed the connection between messages.
    /// Cancel-safe.
    ///
    /// # Errors
    /// I/O errors, undecodable or invalid messages, a connection closed inside a message.
    pub async fn recv(&mut self) -> Result<Option<ControlMessage>, ChannelError> {
        loop {
            if let Some(m) = self.decoder.next_message()? {
                return Ok(Some(m));
            }
            let n = self.stream.read(&mut self.chunk).await?;
            if n == 0 {
                self.decoder.finish()?;
                return Ok(None);
            }
            self.decoder.push(self.chunk.get(..n).unwrap_or(&[]));
        }
    }

    /// Sends one message and flushes.
    ///
    /// # Errors
    /// Encoding (validation) or I/O errors.
    pub async fn send(&mut self, msg: impl Into<ControlMessage>) -> Result<(), ChannelError> {
        self.out.clear();
        control::encode_message(&msg.into(), &mut self.out)?;
        self.stream.write_all(&self.out).await?;
        self.stream.flush().await?;
        Ok(())
    }

    /// The underlying stream (e.g. for `peer_addr`).
    pub fn get_ref(&self) -> &S {
        &self.stream
    }

    /// Shuts the write side down (best effort).
    pub async fn shutdown(&mut self) {
        let _ = self.stream.shutdown().await;
    }
}

/// Why [`client_handshake`] failed.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The collector refused.
    #[error("refused by the collector ({}): {detail}", reason.label())]
    Refused {
        /// Its reason.
        reason: RefuseReason,
        /// Its detail text.
        detail: String,
    },
    /// The channel failed.
    #[error(transparent)]
    Channel(#[from] ChannelError),
    /// The collector sent an unexpected message.
    #[error("unexpected {got} during the handshake (expected {expected})")]
    Unexpected {
        /// What was expected.
        expected: &'static str,
        /// What arrived.
        got: &'static str,
    },
    /// The collector closed the connection.
    #[error("unexpected end of stream during the handshake (expected {expected})")]
    Closed {
        /// What was expected.
        expected: &'static str,
    },
    /// No `Welcome` within the time allowed ([`client_handshake_within`]).
    #[error("handshake timed out after {0:?}")]
    TimedOut(Duration),
}

impl From<ClientError> for HandshakeError {
    fn from(e: ClientError) -> Self {
        match e {
            ClientError::Refused { reason, detail } => HandshakeError::Refused { reason, detail },
            ClientError::Unexpected { expected, got } => {
                HandshakeError::Unexpected { expected, got }
            }
            ClientError::Closed { expected } => HandshakeError::Closed { expected },
            ClientError::TimedOut { after } => HandshakeError::TimedOut(after),
        }
    }
}

/// The agent side of the handshake: `Hello` → `Challenge` → `Proof` (HMAC of `token`,
/// `uctel_protocol::control::proof`) → `Welcome`. The token never crosses the wire. A thin
/// driver of [`ClientHandshake`]; no deadline (see [`client_handshake_within`]).
///
/// # Errors
/// [`HandshakeError`]: refused (with the collector's reason), channel errors, or an
/// out-of-order message.
pub async fn client_handshake<S: AsyncRead + AsyncWrite + Unpin>(
    channel: &mut ControlChannel<S>,
    hello: Hello,
    token: &[u8],
) -> Result<Welcome, HandshakeError> {
    let machine = ClientHandshake::new(hello, token, Instant::now(), None);
    drive_client(channel, machine).await
}

/// [`client_handshake`] that fails with [`HandshakeError::TimedOut`] unless the `Welcome`
/// arrives within `timeout` (sends included).
///
/// # Errors
/// As [`client_handshake`], and [`HandshakeError::TimedOut`].
pub async fn client_handshake_within<S: AsyncRead + AsyncWrite + Unpin>(
    channel: &mut ControlChannel<S>,
    hello: Hello,
    token: &[u8],
    timeout: Duration,
) -> Result<Welcome, HandshakeError> {
    let machine = ClientHandshake::new(hello, token, Instant::now(), Some(timeout));
    drive_client(channel, machine).await
}

/// Runs `fut` until `deadline` (none: to its end); `None` when the deadline came first.
async fn until<F: std::future::Future>(deadline: Option<Instant>, fut: F) -> Option<F::Output> {
    match deadline {
        Some(at) => tokio::time::timeout_at(at.into(), fut).await.ok(),
        None => Some(fut.await),
    }
}

async fn drive_client<S: AsyncRead + AsyncWrite + Unpin>(
    channel: &mut ControlChannel<S>,
    mut machine: ClientHandshake,
) -> Result<Welcome, HandshakeError> {
    loop {
        while let Some(msg) = machine.poll_transmit() {
            match until(machine.poll_timeout(), channel.send(msg)).await {
                Some(sent) => sent?,
                None => machine.handle_timeout(Instant::now()),
            }
        }
        if let Some(outcome) = machine.poll_outcome() {
            return outcome.map_err(HandshakeError::from);
        }
        let received = until(machine.poll_timeout(), channel.recv()).await;
        let now = Instant::now();
        match received {
            Some(Ok(Some(msg))) => machine.on_message(msg, now),
            Some(Ok(None)) => machine.on_closed(now),
            Some(Err(e)) => return Err(e.into()),
            None => machine.handle_timeout(now),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uctel_protocol::control::{Body, Challenge, Heartbeat, Refuse};

    #[tokio::test]
    async fn messages_cross_a_duplex_stream() {
        let (a, b) = tokio::io::duplex(64);
        let mut a = ControlChannel::new(a);
        let mut b = ControlChannel::new(b);
        let send = tokio::spawn(async move {
            for i in 0..100u64 {
                a.send(Heartbeat {
                    sequence: i,
                    timestamp_ns: i * 10,
                    ..Heartbeat::default()
                })
                .await
                .unwrap();
            }
        });
        for i in 0..100u64 {
            match b.recv().await.unwrap().and_then(|m| m.body) {
                Some(Body::Heartbeat(h)) => assert_eq!(h.sequence, i),
                other => panic!("{other:?}"),
            }
        }
        send.await.unwrap();
        assert!(b.recv().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn garbage_is_a_decode_error() {
        let (mut a, b) = tokio::io::duplex(64);
        let mut b = ControlChannel::new(b);
        a.write_all(&[0xff, 0xff, 0xff, 0xff, 1, 2]).await.unwrap();
        assert!(matches!(b.recv().await, Err(ChannelError::Decode(_))));
    }

    fn hello() -> Hello {
        Hello {
            protocol_version: control::PROTOCOL_VERSION,
            agent_id: "a1".into(),
            hostname: "h".into(),
            epoch: 9,
            transport: control::Transport::Soft as i32,
            capabilities: vec![control::DataPath::Send as i32],
            qp: Some(control::QpEndpoint {
                gid: vec![0; 16],
                qpn: 17,
                psn: 1,
                mtu: 1024,
                udp_addr: "127.0.0.1:5000".into(),
            }),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn handshake_proves_the_token_and_reports_refusals() {
        let (a, b) = tokio::io::duplex(4096);
        let server = tokio::spawn(async move {
            let mut ch = ControlChannel::new(b);
            let Some(Body::Hello(h)) = ch.recv().await.unwrap().and_then(|m| m.body) else {
                panic!("no hello")
            };
            let nonce = [7u8; control::NONCE_BYTES];
            ch.send(Challenge {
                nonce: nonce.to_vec(),
                collector_id: "c".into(),
            })
            .await
            .unwrap();
            let Some(Body::Proof(p)) = ch.recv().await.unwrap().and_then(|m| m.body) else {
                panic!("no proof")
            };
            let ok = control::verify_proof(b"right", &nonce, &h.agent_id, h.epoch, &p.hmac);
            ch.send(Refuse {
                reason: if ok {
                    RefuseReason::Busy
                } else {
                    RefuseReason::BadProof
                } as i32,
                detail: "test".into(),
            })
            .await
            .unwrap();
        });
        let mut ch = ControlChannel::new(a);
        let err = client_handshake(&mut ch, hello(), b"right")
            .await
            .unwrap_err();
        // The server answers Busy only when the proof verified.
        assert!(
            matches!(
                err,
                HandshakeError::Refused {
                    reason: RefuseReason::Busy,
                    ..
                }
            ),
            "{err}"
        );
        server.await.unwrap();
    }

    #[tokio::test]
    async fn a_silent_collector_times_the_handshake_out() {
        let (a, mut b) = tokio::io::duplex(4096);
        let mut ch = ControlChannel::new(a);
        let started = Instant::now();
        let err = client_handshake_within(&mut ch, hello(), b"t", Duration::from_millis(50))
            .await
            .unwrap_err();
        assert!(
            matches!(err, HandshakeError::TimedOut(d) if d == Duration::from_millis(50)),
            "{err}"
        );
        assert!(started.elapsed() >= Duration::from_millis(50));
        // The Hello went out before the wait.
        let mut buf = [0u8; 4];
        b.read_exact(&mut buf).await.unwrap();
        // A collector that closes instead: `Closed`, naming what was expected.
        let (a, b) = tokio::io::duplex(4096);
        drop(b);
        let mut ch = ControlChannel::new(a);
        let err = client_handshake(&mut ch, hello(), b"t").await.unwrap_err();
        assert!(
            matches!(
                err,
                HandshakeError::Channel(_)
                    | HandshakeError::Closed {
                        expected: "Challenge"
                    }
            ),
            "{err}"
        );
    }
}
