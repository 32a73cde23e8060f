//! `uctel-protocol`: the uctel frame format, payload codec and sequence tracker.
//!
//! Sans-IO and free of `unsafe`: every function takes bytes or events in and returns values.
#![forbid(unsafe_code)]

pub mod control;
pub mod frame;
pub mod framer;
pub mod limits;
pub mod payload;
pub mod tracker;
