//! Agent sources: where records come from (DESIGN.md §7).
//!
//! Layout:
//!
//! - [`host`]: host metrics from `/proc` and `/sys` through the `procfs` crate, named, typed and
//!   labelled like Prometheus node_exporter so its dashboards work on uctel data.
//! - [`rdma`]: RDMA port counters (`counters/`, `counters_ext/`) and driver counters
//!   (`hw_counters/`) from `<sysfs>/class/infiniband`, named like node_exporter's `infiniband`
//!   collector. [`host::HostMetrics`] runs it as one of its sub-collectors.
//! - [`node`]: the node_exporter collectors that [`host::HostMetrics`] runs, one file per
//!   collector (`node/cpu.rs`, `node/meminfo.rs`, `node/netdev.rs`, `node/hwmon.rs`,
//!   `node/ethtool.rs`, …), and [`node::HostCollector`], the list of them.
//! - [`sys`]: the system calls no safe crate wraps: the `SIOCETHTOOL` ioctl ([`sys::ethtool`],
//!   for the `ethtool` collector and [`fast_counters`]) and adjtimex(2) and localtime_r(3)
//!   ([`sys::clock`], for `time` and `timex`), prctl(2) `PR_SET_PDEATHSIG` for journalctl
//!   ([`sys::child`]). The crate's only `unsafe` code.
//! - [`fast_counters`]: a short list of counters (sysfs files, ethtool statistics) sampled
//!   every few milliseconds, many samples of one counter per record, on a stream of their own.
//! - [`logs`]: a log file tailer: glob paths, create- and copytruncate-rotation, truncation,
//!   partial last lines, long lines, invalid UTF-8 and an offset checkpoint file.
//! - [`journald`]: the systemd journal through `journalctl --output=json --follow`, resumed
//!   from a saved cursor.
//! - [`kmsg`]: the kernel log from `/dev/kmsg`, loss counted exactly from the kernel's
//!   sequence numbers.
//! - [`exposition`]: the Prometheus text format as records (textfile and scrape sources).
//! - [`openmetrics`]: OpenMetrics 1.0 text rewritten as the text format 0.0.4.
//! - [`scrape`]: local Prometheus endpoints scraped like a Prometheus job.
//! - [`sections`]: the `sources` part of the agent configuration.
//! - [`textfile`]: metrics from `*.prom` files, as node_exporter's textfile collector.
//! - [`severity`]: a log line's severity from where the line states it (syslog `<PRI>`, JSON
//!   `level`, `level=`, level words), a pure function.
//!
//! Every source produces the protocol's payload records
//! ([`uctel_protocol::payload::Metric`], [`uctel_protocol::payload::LogRecord`]); the framer cuts
//! them into frames. Metrics are state, never deltas (DESIGN.md §3 rule 2): counters are
//! cumulative values read from the kernel, gauges absolute. Every metric carries
//! `timestamp_ms = 0` ("the frame's timestamp").

#[forbid(unsafe_code)]
pub mod exposition;
#[forbid(unsafe_code)]
pub mod fast_counters;
#[forbid(unsafe_code)]
pub mod host;
#[forbid(unsafe_code)]
pub mod journald;
#[forbid(unsafe_code)]
pub mod kmsg;
#[forbid(unsafe_code)]
pub mod logs;
#[forbid(unsafe_code)]
pub mod node;
#[forbid(unsafe_code)]
pub mod openmetrics;
#[forbid(unsafe_code)]
pub mod pod_resources;
#[forbid(unsafe_code)]
pub mod rdma;
#[forbid(unsafe_code)]
pub mod scrape;
#[forbid(unsafe_code)]
pub mod sections;
#[forbid(unsafe_code)]
pub mod severity;
/// Slurm job attribution from the job cgroups.
pub mod slurm;
#[forbid(unsafe_code)]
pub mod start_at;
#[allow(unsafe_code)]
pub mod sys;
#[forbid(unsafe_code)]
pub mod textfile;

#[forbid(unsafe_code)]
mod metric;
