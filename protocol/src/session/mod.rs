//! The control connection's session rules (DESIGN.md §6) as sans-IO state machines, shared
//! by the agent and the collector:
//!
//! - [`handshake`]: `Hello` → `Challenge` → `Proof` → `Welcome`/`Refuse`, the client
//!   ([`ClientHandshake`]) and the server ([`ServerHandshake`]) side, with the handshake
//!   deadline;
//! - [`liveness`]: heartbeats and the one dead-peer rule of an established connection
//!   ([`Liveness`]).
//!
//! No socket, no clock, no async runtime: each machine takes inputs with a `now` and is
//! polled for what to send, what happened and its next deadline (`poll_timeout`, then
//! `handle_timeout(now)`), as quinn-proto's `Connection`. The daemons' tokio loops drive
//! them: they sleep until `poll_timeout()` and call `handle_timeout(Instant::now())`. Tests
//! drive them on a virtual clock.
//!
//! They live in `uctel-protocol` (not in `uctel-common`, which holds the tokio drivers)
//! because the protocol crate is the sans-IO one: no tokio, every function bytes or events
//! in, values out; the rules of the conversation belong beside its messages.

pub mod handshake;
pub mod liveness;

pub use handshake::{ClientError, ClientHandshake, Refusal, ServerEvent, ServerHandshake};
pub use liveness::{Liveness, LivenessConfig, LivenessEvent};
