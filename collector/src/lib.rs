//! `uctel-collector`: receives telemetry frames from uctel agents over RDMA UC, makes every
//! loss visible, and serves what arrived on a Prometheus `/metrics` endpoint and as JSON
//! Lines logs (DESIGN.md §1, §4–§8).
//!
//! Layout:
//! - [`config`]: the YAML configuration (strict, all problems at once).
//! - [`telemetry`]: `uctel_collector_*` self-metrics and the closed [`telemetry::DropReason`].
//! - [`agent_counters`]: the agents' own send and drop counters from their heartbeats,
//!   turned into the collector's monotonic `uctel_collector_agent_*` series.
//! - [`liveness`]: `uctel_collector_agent_up{agent}`, whether each agent has a live session.
//! - [`store`]: latest sample per series per agent, staleness, cardinality cap, exposed through
//!   a custom `prometheus` collector.
//! - [`logsink`]: JSON Lines log sink with size-based rotation.
//! - [`ingest`]: per-connection frame checks, sequence tracking and delivery (transport-free).
//! - [`outputs`]: the [`outputs::Delivery`] seam and the outputs to other machines
//!   (Prometheus remote-write).
//! - [`dataplane`]: per-agent UC QP and ring, the worker thread that polls the CQs and the
//!   SPSC descriptor queue between them.
//! - [`rdma_events`]: the RDMA device's asynchronous events, counted, and the connections
//!   they end.
//! - [`shared`]: the state every task shares ([`shared::Shared`]).
//! - [`credits`]: the collector-wide credit budget and the grants cut from it.
//! - [`control`]: the TCP control plane (handshake, heartbeats, reports, goodbye); the
//!   session rules are `uctel_protocol::session`'s.
//! - [`reload`]: configuration reload (`SIGHUP`, `POST /-/reload`): the keys applied live.
//! - [`status`]: the status API (`GET /api/v1/status`, `docs/status-api.md`).
//! - [`daemon`]: [`start`]/[`run`] wiring it all, with ephemeral-port support for tests.
//!
//! The binary (`src/main.rs`) parses flags, loads the configuration, installs logging and the
//! signal handlers, and calls [`run`].

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod agent_counters;
pub mod config;
pub mod control;
pub mod credits;
pub mod daemon;
pub mod dataplane;
pub mod ingest;
pub mod liveness;
pub mod logsink;
pub mod outputs;
pub mod rdma_events;
pub mod reload;
pub mod shared;
pub mod status;
pub mod store;
pub mod telemetry;

pub use daemon::{run, start, start_with, RunError, Running};
