//! The `sources` section of the agent's configuration (DESIGN.md §7, §9): which sources run
//! and how. Re-exported by [`crate::config`], whose reference documentation includes the
//! docs below.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::sources::host::HostCollector;

/// `sources`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SourcesSection {
    /// Host metrics named like node_exporter, plus RDMA counters.
    #[serde(default)]
    pub host_metrics: HostMetricsSection,
    /// Log files to tail.
    #[serde(default)]
    pub logs: Vec<LogSection>,
    /// The agent's own `uctel_agent_*` counters, shipped on the metrics stream.
    #[serde(default)]
    pub self_metrics: SelfMetricsSection,
    /// Metrics from the `*.prom` files of a directory, read as node_exporter's textfile
    /// collector reads them (`sources::textfile`). Off when absent.
    #[serde(default)]
    pub textfile: Option<crate::sources::textfile::TextfileSection>,
    /// Local Prometheus endpoints to scrape, one entry per target (`sources::scrape`), e.g.
    /// node_exporter, dcgm-exporter, an application's `/metrics`.
    #[serde(default)]
    pub scrape: Vec<crate::sources::scrape::ScrapeTarget>,
    /// A few counters sampled every few milliseconds (`sources::fast_counters`), shipped
    /// on the `fast_counters` stream. Off when absent.
    #[serde(default)]
    pub fast_counters: Option<crate::sources::fast_counters::FastCountersSection>,
    /// Slurm jobs running on this host (`sources::slurm`): `uctel_job_info` and per-job
    /// CPU, memory and I/O from the job cgroups. Off when absent.
    #[serde(default)]
    pub slurm: Option<crate::sources::slurm::SlurmSection>,
    /// Kubernetes pods' RDMA devices from the kubelet's pod-resources API
    /// (`sources::pod_resources`): `pod`, `namespace` and `container` labels on the
    /// devices' series and `uctel_pod_device_info`. Off when absent.
    #[serde(default)]
    pub pod_resources: Option<crate::sources::pod_resources::PodResourcesSection>,
    /// The systemd journal (`sources::journald`), read through `journalctl`; its cursor is
    /// saved as `journald.json` in `state_directory`. Off when absent.
    #[serde(default)]
    pub journald: Option<crate::sources::journald::JournaldSection>,
    /// The kernel log, `/dev/kmsg` (`sources::kmsg`); its position is saved as `kmsg.json`
    /// in `state_directory`. Off when absent.
    #[serde(default)]
    pub kmsg: Option<crate::sources::kmsg::KmsgSection>,
    /// Directory for the log sources' offset checkpoints (one JSON file per `logs` entry,
    /// named after a hash of its `path`), created at start when there are `logs`. A relative
    /// path is relative to the working directory. Default `/var/lib/uctel-agent` (the systemd
    /// unit's `StateDirectory=`; another user needs a directory of its own, such as
    /// `./uctel-agent-state`). `--check-config` checks that it can be created and written.
    /// `null` disables checkpoints: a restart then starts over at `start_at`.
    #[serde(default = "default_state_directory")]
    pub state_directory: Option<PathBuf>,
    /// How the threads that wake at the aligned sampling instants are scheduled: the host
    /// metrics' `host-wake` thread (it stamps each round and hands it to the collection
    /// thread) and the fast counters' sampling thread. `realtime` (default): Linux
    /// `SCHED_FIFO` at priority 1, the lowest real-time priority, so that a timer's expiry
    /// runs the thread at once rather than after the normal threads of a busy host; it
    /// needs `CAP_SYS_NICE` or `LimitRTPRIO=1` (the packaged systemd unit grants the
    /// latter), and where the kernel refuses, the agent logs a warning once per thread and
    /// runs it as a normal thread. `normal`: never ask. The threads sleep between
    /// instants; the kernel's real-time throttling bounds them in any case.
    #[serde(default)]
    pub wake_scheduling: WakeScheduling,
}

/// `sources.wake_scheduling`: the scheduling of the threads that wake at the aligned
/// sampling instants.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WakeScheduling {
    /// `SCHED_FIFO` priority 1 where the kernel allows it, else as `normal` (warned).
    #[default]
    Realtime,
    /// The agent's own policy and nice value.
    Normal,
}

#[allow(clippy::unnecessary_wraps)]
fn default_state_directory() -> Option<PathBuf> {
    Some(PathBuf::from("/var/lib/uctel-agent"))
}

/// `sources.host_metrics`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HostMetricsSection {
    /// Collect host metrics at all. Default true.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Seconds between two collections. Default 10 (node_exporter is typically scraped
    /// every 10–15 s).
    #[serde(default = "default_host_interval")]
    pub interval_seconds: f64,
    /// Offset of the sampling instants within the interval, seconds: collections happen at
    /// whole multiples of `interval_seconds` since the Unix epoch plus this (OVIS LDMS's
    /// `interval` + `offset`), so agents with the same settings sample the same instants.
    /// 0 to below the interval. Default 0.
    #[serde(default)]
    pub offset_seconds: f64,
    /// procfs root (`/proc`); point at a bind mount of the host's `/proc` in a container.
    #[serde(default = "default_proc")]
    pub procfs_path: PathBuf,
    /// sysfs root (`/sys`).
    #[serde(default = "default_sys")]
    pub sysfs_path: PathBuf,
    /// Prefix joined to mount points before statvfs(2) (`/`); os-release is read under it too.
    #[serde(default = "default_rootfs")]
    pub rootfs_path: PathBuf,
    /// node_exporter collectors not to run, by name (e.g. `[conntrack, vmstat]`): they emit no
    /// series, not even `node_scrape_collector_success`. Default none.
    #[serde(default)]
    pub disabled_collectors: Vec<HostCollector>,
    /// node_exporter's `ethtool` collector (`sources::node::ethtool`), off when absent like
    /// node_exporter's (`--collector.ethtool`); `{}` reads every interface and statistic.
    #[serde(default)]
    pub ethtool: Option<crate::sources::node::ethtool::EthtoolSection>,
}

impl Default for SourcesSection {
    fn default() -> Self {
        Self {
            host_metrics: HostMetricsSection::default(),
            logs: Vec::new(),
            self_metrics: SelfMetricsSection::default(),
            textfile: None,
            scrape: Vec::new(),
            fast_counters: None,
            slurm: None,
            pod_resources: None,
            journald: None,
            kmsg: None,
            state_directory: default_state_directory(),
            wake_scheduling: WakeScheduling::default(),
        }
    }
}

fn default_true() -> bool {
    true
}
fn default_host_interval() -> f64 {
    10.0
}
fn default_proc() -> PathBuf {
    PathBuf::from("/proc")
}
fn default_sys() -> PathBuf {
    PathBuf::from("/sys")
}
fn default_rootfs() -> PathBuf {
    PathBuf::from("/")
}

impl Default for HostMetricsSection {
    fn default() -> Self {
        Self {
            enabled: true,
            interval_seconds: default_host_interval(),
            offset_seconds: 0.0,
            procfs_path: default_proc(),
            sysfs_path: default_sys(),
            rootfs_path: default_rootfs(),
            disabled_collectors: Vec::new(),
            ethtool: None,
        }
    }
}

/// `sources.self_metrics`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SelfMetricsSection {
    /// Ship `uctel_agent_*` and the agent's `process_*` through the pipeline. Default true.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Seconds between two snapshots. Default 10.
    #[serde(default = "default_host_interval")]
    pub interval_seconds: f64,
    /// Offset of the sampling instants within the interval, seconds: collections happen at
    /// whole multiples of `interval_seconds` since the Unix epoch plus this (OVIS LDMS's
    /// `interval` + `offset`), so agents with the same settings sample the same instants.
    /// 0 to below the interval. Default 0.
    #[serde(default)]
    pub offset_seconds: f64,
}

impl Default for SelfMetricsSection {
    fn default() -> Self {
        Self {
            enabled: true,
            interval_seconds: default_host_interval(),
            offset_seconds: 0.0,
        }
    }
}

pub use super::start_at::StartAt;

/// How each line's severity is found (`sources.logs[].severity`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LogSeverity {
    /// Read from the line where it says so: a JSON object's `level`/`severity` field, a
    /// syslog `<PRI>` prefix, a `level=`/`lvl=` key or an upper-case level word (`ERROR`,
    /// `WARN`, …) near the start; `unspecified` otherwise. Default.
    #[default]
    Auto,
    /// Not looked for: every record is `unspecified`.
    #[serde(rename = "none")]
    Off,
}

/// One entry of `sources.logs`: one tailer following the files its glob matches.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LogSection {
    /// An absolute glob (`/var/log/app/*.log`); re-evaluated every `glob_interval_seconds`
    /// so new files are picked up. With copytruncate rotation it must not match the copies.
    pub path: String,
    /// Globs of paths to skip even if `path` matches them (`/var/log/*.gz`).
    #[serde(default)]
    pub exclude: Vec<String>,
    /// Where the files found at the first scan of the very first run are read from: `end`
    /// (default) or `beginning`. It applies only while there is no checkpoint yet (first run,
    /// or `state_directory: null`); after that every file the checkpoint does not know
    /// (appeared later, or while the agent was down) is read from its beginning, as
    /// opentelemetry-collector-contrib #12769 asks.
    #[serde(default)]
    pub start_at: StartAt,
    /// `auto` (default): each record's severity is detected from its line (see
    /// [`LogSeverity::Auto`]); `none`: every record is `unspecified`.
    #[serde(default)]
    pub severity: LogSeverity,
    /// Lines longer than this many bytes are cut and the rest of the line is discarded
    /// (counted). Must fit a frame with room for the record's encoding:
    /// at most `max_frame_bytes − 576`. Default: 2048, or less when `max_frame_bytes` needs
    /// it (see [`crate::config::AgentConfig::max_line_bytes`]).
    #[serde(default)]
    pub max_line_bytes: Option<usize>,
    /// A last line without a newline is shipped as is after this long. Default 1.
    #[serde(default = "default_partial_line_timeout")]
    pub partial_line_timeout_seconds: f64,
    /// A rotated-away or deleted file stays open this long for late writers. Default 5.
    #[serde(default = "default_rotate_wait")]
    pub rotate_wait_seconds: f64,
    /// Seconds between two glob evaluations. Default 1.
    #[serde(default = "default_glob_interval")]
    pub glob_interval_seconds: f64,
    /// Seconds between two polls of the followed files. Default 0.25.
    #[serde(default = "default_poll_interval")]
    pub poll_interval_seconds: f64,
    /// How the lines are parsed: multi-line records, JSON fields, the line's own time. Every
    /// part is off by default (README "Parsing log lines").
    #[serde(default)]
    pub parse: super::logs::parse::LogParseSection,
}

fn default_partial_line_timeout() -> f64 {
    1.0
}
fn default_rotate_wait() -> f64 {
    5.0
}
fn default_glob_interval() -> f64 {
    1.0
}
fn default_poll_interval() -> f64 {
    0.25
}
