//! `uctel-bench`: the uctel performance harness. One run measures, on this machine and in
//! this order:
//!
//! 1. **limit** ([`limit`]) — a `recvmmsg` sink (the transport's `UdpSink`) fed by a
//!    `sendmmsg` sender flat out on loopback: datagrams per second at the soft path's packet
//!    size; and the same with a `UDP_SEGMENT` sender and a `UDP_GRO` sink;
//! 2. **soft path** ([`softpath`], [`loadgen`]) — `K` emulated agents (real soft RoCEv2 UC
//!    QPs, real frames, RDMA WRITE_WITH_IMM into the rings, the real control handshake and
//!    credits) into one real `uctel-collector` process: frames and samples accepted per second
//!    and per collector CPU second, loss and drops, ratio to the limit;
//! 3. **processing only** ([`processing`]) — the collector library's per-connection ingest
//!    (validate, track, decode, store) in this process, no IO: frames per CPU second;
//! 4. **scaling** — the soft path at several `K`: throughput, memory per agent, fairness;
//! 5. **agent cost** ([`agentcost`]) — CPU and RSS of the real `uctel-agent` at a given
//!    sample and log-line rate;
//! 6. **idle** ([`idle`]) — CPU of both daemons with nothing to do (no agent, collector down,
//!    connected and quiet), side by side with a real node_exporter;
//! 7. **node cost** ([`nodecost`]) — CPU per host collection of the real agent on this host
//!    against CPU per scrape of a real node_exporter scraped as Prometheus does, same window;
//! 8. **fast cost** ([`fastcost`]) — CPU and sampling lateness of the agent's
//!    `fast_counters` source (10 counters every 10 ms), against the same agent without it.
//! 9. **trade-off** ([`tradeoff`]) — the same paced frame stream over UC and over RC soft QPs
//!    at 0 %, 0.1 %, 1 % and 5 % injected loss: delivered rate and fraction, latency p50/p99,
//!    CPU per frame on each side, bytes on the wire per delivered frame.
//!
//! The targets are checked as ratios between figures of the same run ([`report`]); the
//! report is printed as a table and written as JSON. `BENCHMARKS.md` at the repository root
//! has the latest table and the command that made it.
//!
//! Layout: [`workload`] (frames), [`cpu`] (procfs and getrusage), [`promtext`] (reading
//! `/metrics`), [`daemon`] (child processes), [`stats`] (rates, fairness, verdicts).

#![forbid(unsafe_code)]

pub mod agentcost;
pub mod align;
pub mod cpu;
pub mod daemon;
pub mod dictcost;
pub mod fastcost;
pub mod fleet;
pub mod forms;
pub mod idle;
pub mod journalcost;
pub mod limit;
pub mod loadgen;
pub mod logdict;
pub mod nodecost;
pub mod otlpcost;
pub mod processing;
pub mod promtext;
pub mod remotewrite;
pub mod report;
pub mod softpath;
pub mod stats;
pub mod tradeoff;
pub mod workload;
