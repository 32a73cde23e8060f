//! `uctel-protocol`: the uctel frame format, payload codec and sequence tracker.
//!
//! Sans-IO and free of `unsafe`: every function takes bytes or events in and returns values.
//!
//! # Frames
//!
//! A frame is a fixed 64-byte big-endian header ([`frame`]: magic `UCTL`, version, kind,
//! flags, stream id, payload length, epoch, connection and stream sequence, timestamp,
//! cumulative record count, CRC32C) followed by a protobuf payload ([`payload`], schema in
//! `proto/uctel.proto`) bounded by [`limits::Limits`]. The agent side builds frames with the
//! sans-IO [`framer::Framer`] and stamps epoch, connection sequence and CRC at send time
//! ([`frame::stamp_connection`]); the collector side checks and decodes them with
//! [`frame::decode_frame`], which never panics on any input; a receiver on the hot path
//! decodes metric payloads with [`borrowed::MetricBatchView`] (zero-copy `&str` views).
//!
//! Metrics may also travel as values of series defined once per epoch ([`dict`]): a
//! dictionary acknowledged by the collector, so frames stay decodable on their own.
//!
//! # Sequences
//!
//! [`seq::Seq`] is the wrap-aware frame sequence (RFC 1982 serial-number comparison and
//! distance, RFC 3550 A.1-style widening of the 32-bit immediate); [`tracker`] classifies
//! each frame's sequence (in order, gap, late, duplicate, stale, reset) and counts loss.
//!
//! # Control
//!
//! [`control`] holds the control-channel messages and their framing; [`session`] the rules
//! of the conversation (the handshake, heartbeats and the dead-peer rule) as state machines
//! that both daemons drive.
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

pub mod borrowed;
pub mod control;
pub mod dict;
pub mod frame;
pub mod framer;
pub mod limits;
pub mod payload;
pub mod samples;
pub mod seq;
pub mod session;
pub mod stream;
pub mod tracker;

pub use seq::Seq;

#[cfg(test)]
mod proto_schema;
