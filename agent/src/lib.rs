//! `uctel-agent`: collects host metrics and logs, cuts them into self-contained,
//! sequence-numbered frames and pushes them over RDMA Unreliable Connection into a uctel
//! collector's ring (DESIGN.md §1, §3, §4, §6, §7). Loss is never hidden: every record the
//! agent gives up on is counted with a reason ([`selfmetrics::DropReason`]), and the frames
//! it sends carry what the collector needs to count the rest.
//!
//! # Layout
//!
//! ```text
//! main.rs        thin binary: flags → config → logging → run / --check-config / --dry-run
//! config.rs      strict YAML configuration, every problem with line and key
//! log_sources.rs the log tailers, one per sources.logs entry, changed live by a reload
//! reload.rs      configuration reload (SIGHUP, POST /-/reload): the keys applied live
//! run.rs         the daemon: sources, local /metrics and the reconnect loop
//! run/session/   one session (one epoch): a state struct, its thin async driver, its close
//! control.rs     control channel client: Hello → Challenge → Proof → Welcome | Refuse
//! pool.rs        the collector pool: rendezvous ranking, health probes, when to move
//! datapath.rs    a lane's QP (UC, or RC), send buffers, WRITE_WITH_IMM into ring slots / SEND
//! lane.rs        a session's lanes (UC, and RC for `reliability: rc`): QP and pipeline each
//! sender/core.rs sans-IO send pipeline: framing, pacing, credits, stamping, accounting
//! sender/pump.rs moves records from the source queues in and frames out to a sink
//! pacing.rs      sans-IO token buckets (frames/s, bytes/s)
//! credits.rs     sans-IO credit window over the collector's consumed sequence
//! queue.rs       bounded record queues between sources and sender (never block a source)
//! buffer.rs      metric samples held while disconnected, sent first after the next Welcome
//! rdma_events.rs uctel_agent_rdma_*: port state/GID changes, the device's async events
//! runners.rs     source loops: host metrics, self-metrics, log tailers with checkpoints
//! selfmetrics.rs uctel_agent_* counters, closed DropReason, export as records and /metrics
//! status/       the status API (/api/v1/status): the board the sources fill, the document
//! service_user.rs --check-config as root: what the unit's user can read and write
//! stream.rs      the two streams (metrics, logs) and their ids
//! dryrun.rs      --dry-run: frames decoded to JSON lines on stdout
//! sources/       host metrics (node_exporter names), RDMA counters, log tailer; sources/sys/
//!                the only unsafe code (the SIOCETHTOOL ioctl, adjtimex(2), localtime_r(3),
//!                prctl(2) PR_SET_PDEATHSIG for the journalctl child, sched_setscheduler(2)
//!                for the threads that wake at the sampling instants)
//! ```
//!
//! The rules live in sans-IO state machines ([`pacing`], [`credits`], [`sender::core`])
//! tested on virtual time; the IO around them ([`run`], [`datapath`], [`runners`]) is thin.
//!
//! The crate denies `unsafe_code` and every module but [`sources`] forbids it; in [`sources`]
//! only [`sources::sys`] allows it (the system calls no safe crate wraps), so an `unsafe` block
//! can only be added there, with its `// SAFETY:` note.
#![warn(missing_docs, unreachable_pub)]
#![deny(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]

#[forbid(unsafe_code)]
pub mod buffer;
#[forbid(unsafe_code)]
pub mod config;
#[forbid(unsafe_code)]
pub mod control;
#[forbid(unsafe_code)]
pub mod credits;
#[forbid(unsafe_code)]
pub mod datapath;
#[forbid(unsafe_code)]
pub mod dryrun;
#[forbid(unsafe_code)]
pub mod lane;
#[forbid(unsafe_code)]
pub mod log_sources;
#[forbid(unsafe_code)]
pub mod metric_sources;
#[forbid(unsafe_code)]
pub mod pacing;
#[forbid(unsafe_code)]
pub mod pool;
#[forbid(unsafe_code)]
pub mod queue;
#[forbid(unsafe_code)]
pub mod rdma_events;
#[forbid(unsafe_code)]
pub mod reload;
#[forbid(unsafe_code)]
pub mod run;
#[forbid(unsafe_code)]
pub mod runners;
#[forbid(unsafe_code)]
pub mod selfmetrics;
#[forbid(unsafe_code)]
pub mod sender;
#[forbid(unsafe_code)]
pub mod service_user;
pub mod sources;
#[forbid(unsafe_code)]
pub mod status;
#[forbid(unsafe_code)]
pub mod stream;
