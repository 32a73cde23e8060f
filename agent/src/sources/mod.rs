//! Agent sources: where records come from (DESIGN.md §7).
//!
//! Layout:
//!
//! - [`host`]: host metrics from `/proc` and `/sys` through the `procfs` crate, named, typed and
//!   labelled like Prometheus node_exporter so its dashboards work on uctel data.
//! - [`rdma`]: RDMA port counters (`counters/`, `counters_ext/`) and driver counters
//!   (`hw_counters/`) from `<sysfs>/class/infiniband`, named like node_exporter's `infiniband`
//!   collector. [`host::HostMetrics`] runs it as one of its sub-collectors.
//! - [`node`]: the smaller node_exporter collectors (`filefd`, `uname`, `entropy`, `vmstat`,
//!   `sockstat`, `netstat`, `pressure`, `os`, `conntrack`, `softnet`, `schedstat`, `selinux`)
//!   that [`host::HostMetrics`] runs as sub-collectors.
//! - [`node_netdev`]: `netdev` (interface counters) and `udp_queues`; [`node_time`]: `time`
//!   and `timex` (the kernel clock); [`node_udev`]: the udev properties of block devices that
//!   `diskstats` exports (`node_disk_info`, …).
//! - [`node_sys`]: the node_exporter collectors over `/sys` device trees (`netclass`,
//!   `thermal_zone`, `edac`, `nvme`, `bonding`), `/proc/net/arp` (`arp`) and `/proc/mdstat` (`mdadm`), also run by
//!   [`host::HostMetrics`].
//! - [`node_ethtool`]: node_exporter's `ethtool` collector (driver statistics, driver
//!   information, link settings over `SIOCETHTOOL`), run by [`host::HostMetrics`] when
//!   `sources.host_metrics.ethtool` is set.
//! - [`node_hwmon`]: node_exporter's `hwmon` collector over `/sys/class/hwmon` (temperatures,
//!   fans, voltages, power), also run by [`host::HostMetrics`].
//! - [`fast_counters`]: a short list of counters (sysfs files, ethtool statistics) sampled
//!   every few milliseconds, many samples of one counter per record, on a stream of their own.
//! - [`logs`]: a log file tailer: glob paths, create- and copytruncate-rotation, truncation,
//!   partial last lines, long lines, invalid UTF-8 and an offset checkpoint file.
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

pub mod exposition;
pub mod fast_counters;
pub mod host;
pub mod logs;
pub mod node;
pub mod node_ethtool;
pub mod node_hwmon;
pub mod node_netdev;
pub mod node_sys;
pub mod node_time;
pub mod node_udev;
pub mod openmetrics;
pub mod rdma;
pub mod scrape;
pub mod sections;
pub mod severity;
pub mod textfile;

mod metric;
