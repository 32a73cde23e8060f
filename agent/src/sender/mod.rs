//! The sender: from records to frames on the wire.
//!
//! - [`core`]: the sans-IO send pipeline of one connection (framing, pacing, credits,
//!   stamping, accounting).
//! - [`pump`]: the IO step moving records from the source queues into the pipeline and
//!   frames from the pipeline to a [`pump::FrameSink`].

pub mod core;
mod metrics;
pub mod pump;
