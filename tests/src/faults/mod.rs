//! Support for the fault matrix (`tests/tests/it/fault_matrix.rs`): one row per fault, every row
//! checked against the same conservation law through the real binaries.
//!
//! Layout (everything is re-exported here, so a row names `faults::Row`, `faults::Law`, ...):
//! - [`seed`]: [`Rng`], [`row_seed`]: the row's seed (printed; `UCTEL_FAULT_SEED` overrides
//!   it) drives the fault injector, the line padding and the burst sizes.
//! - [`source`]: [`LineSource`], a log file the test writes numbered, unique lines into
//!   (`row=<row> src=<src> seq=<i> pad=<seeded>`), and the rotations an operator's logrotate
//!   does to it.
//! - [`sink`]: [`Delivered`], the collector's JSON Lines sink read back (rotated files
//!   included): distinct lines per agent and source, duplicates, lines whose text changed,
//!   torn lines.
//! - [`monotonic`]: [`Monotonic`], every `*_total` series of every scrape, per daemon
//!   process, must never go down.
//! - [`os`]: [`memory_kib`] (`VmRSS` / `VmHWM` from `/proc/<pid>/status`), root and tools,
//!   and the OS-level faults: [`Tmpfs`] (a small file system under the log sink, for "disk
//!   full"), [`NetNs`] (the agent in its own network namespace behind a veth pair, so an nft
//!   rule there cannot touch the host's ruleset) and [`Blackhole`] (an nft drop rule on the
//!   UDP path, in that namespace or, where namespaces are not available, on loopback).
//! - [`row`]: [`Row`], a collector and its agents configured from `config/*.yaml`, every
//!   scrape recorded, quiesced the README's way (agent SIGTERM → Goodbye).
//! - [`samples`]: [`SampleFigures`], an agent's whole-run `fast_counters` figures (samples
//!   taken, sent, dropped by reason, read errors) with the collector's for its id.
//! - [`law`]: [`Row::verdict`]: per agent and stream, `written = delivered + lost + dropped`
//!   (records) and `sent = received + lost + dropped` (frames), nothing delivered twice, no
//!   panic, bounded memory, `/metrics` still served. A failing row panics with the seed and a
//!   table of every term.

pub mod law;
pub mod monotonic;
pub mod os;
pub mod row;
pub mod samples;
pub mod seed;
pub mod sink;
pub mod source;
pub mod sums;

pub use monotonic::*;
pub use os::*;
pub use row::*;
pub use samples::*;
pub use seed::*;
pub use sink::*;
pub use source::*;
pub use sums::*;
