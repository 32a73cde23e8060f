//! The sender: from records to frames on the wire.
//!
//! - [`core`]: the sans-IO send pipeline of one connection (framing, pacing, credits,
//!   stamping, accounting).

pub mod core;
