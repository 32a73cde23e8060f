//! Host metrics from `/proc` and `/sys`, named, typed and labelled like Prometheus
//! node_exporter (DESIGN.md §7), so existing Node Exporter dashboards work on uctel data.
//!
//! [`HostMetrics::collect`] runs these sub-collectors ([`HostCollector`]), each named after the
//! node_exporter collector whose series it reproduces:
//!
//! | collector | source | series |
//! |---|---|---|
//! | `cpu` | `<proc>/stat` | `node_cpu_seconds_total{cpu,mode}` (counter, seconds: kernel ticks / `ticks_per_second`), `node_cpu_guest_seconds_total{cpu,mode}` |
//! | `stat` | `<proc>/stat` | `node_boot_time_seconds`, `node_context_switches_total`, `node_forks_total`, `node_intr_total`, `node_procs_running`, `node_procs_blocked` |
//! | `loadavg` | `<proc>/loadavg` | `node_load1`, `node_load5`, `node_load15` |
//! | `meminfo` | `<proc>/meminfo` | `node_memory_<Field>_bytes` for fields in kB (×1024), `node_memory_<Field>` for unitless fields (`HugePages_Total`, …); `Active(anon)` becomes `Active_anon` |
//! | `netdev` | `<proc>/net/dev`, `<sys>/class/net/<device>/statistics/rx_nohandler` | `node_network_{receive,transmit}_<field>_total{device}` for all 16 fields, `node_network_receive_nohandler_total{device}` |
//! | `diskstats` | `<proc>/diskstats` | `node_disk_*_total{device}`, `node_disk_io_now{device}`; sectors ×512 bytes, milliseconds /1000; partitions, `ram`, `loop`, `fd` excluded like node_exporter's default; `node_disk_info`, `node_disk_filesystem_info`, `node_disk_device_mapper_info`, `node_disk_ata_*` from udev's `<rootfs>/run/udev/data/b<major>:<minor>` (see [`crate::sources::node_udev`]) |
//! | `filesystem` | `<proc>/1/mountinfo` (fallback `<proc>/self/mountinfo`) + statvfs(2) | `node_filesystem_{size,free,avail}_bytes`, `node_filesystem_files{,_free}`, `node_filesystem_readonly`, `node_filesystem_device_error`, all `{device,mountpoint,fstype}`; pseudo filesystems excluded with node_exporter's default mount-point and fs-type lists |
//! | `time` | system clock, localtime(3), `<sys>/devices/system/clocksource/clocksource[0-9]*` | `node_time_seconds`, `node_time_zone_offset_seconds{time_zone}`, `node_time_clocksource_{available,current}_info{clocksource,device}` |
//! | `infiniband` | `<sys>/class/infiniband` | see [`crate::sources::rdma`] |
//! | `filefd` | `<proc>/sys/fs/file-nr` | `node_filefd_allocated`, `node_filefd_maximum` |
//! | `uname` | uname(2) | `node_uname_info{sysname,release,version,machine,nodename,domainname}` = 1 |
//! | `entropy` | `<proc>/sys/kernel/random/{entropy_avail,poolsize}` | `node_entropy_available_bits`, `node_entropy_pool_size_bits` |
//! | `vmstat` | `<proc>/vmstat` | `node_vmstat_<field>` (untyped) for fields matching node_exporter's default `^(oom_kill\|pgpg\|pswp\|pg.*fault).*` |
//! | `sockstat` | `<proc>/net/sockstat`, `<proc>/net/sockstat6` (each skipped when absent) | `node_sockstat_sockets_used`, `node_sockstat_<PROTO>_<field>` (`inuse`, `orphan`, `tw`, `alloc`, `mem`, `memory`), `node_sockstat_<PROTO>_mem_bytes` (`mem` × page size) |
//! | `netstat` | `<proc>/net/{netstat,snmp,snmp6}` (`snmp6` skipped when absent) | `node_netstat_<Proto>_<Field>` (untyped) for node_exporter 1.5's default field set |
//! | `pressure` | `<proc>/pressure/{cpu,io,memory}` | `node_pressure_cpu_waiting_seconds_total`, `node_pressure_{io,memory}_{waiting,stalled}_seconds_total` (microseconds / 10⁶) |
//! | `os` | `<rootfs>/etc/os-release` (fallback `<rootfs>/usr/lib/os-release`) | `node_os_info{build_id,id,id_like,…,version_id}` = 1, `node_os_version{id,id_like,name}` (major.minor of `VERSION_ID`) |
//! | `conntrack` | `<proc>/sys/net/netfilter/nf_conntrack_{count,max}`, `<proc>/net/stat/nf_conntrack` | `node_nf_conntrack_entries`, `node_nf_conntrack_entries_limit`, `node_nf_conntrack_stat_*` (summed over CPUs) |
//! | `softnet` | `<proc>/net/softnet_stat` | `node_softnet_{processed,dropped,times_squeezed}_total{cpu}` |
//! | `schedstat` | `<proc>/schedstat` | `node_schedstat_{running_seconds,waiting_seconds,timeslices}_total{cpu}` (nanoseconds / 10⁹) |
//! | `arp` | `<proc>/net/arp` | `node_arp_entries{device}` |
//! | `netclass` | `<sys>/class/net/<iface>/*` (every interface) | `node_network_up{device}`, `node_network_info{address,broadcast,device,duplex,ifalias,operstate}` = 1, `node_network_<property>{device}` (`address_assign_type`, `carrier`, `carrier{,_up,_down}_changes_total`, `device_id`, `dormant`, `flags`, `iface_id`, `iface_link`, `iface_link_mode`, `mtu_bytes`, `name_assign_type`, `net_dev_group`, `speed_bytes` (Mb/s × 125000), `transmit_queue_length`, `protocol_type`); an attribute the driver refuses to read (`EINVAL`, `EOPNOTSUPP`) is left out |
//! | `thermal_zone` | `<sys>/class/thermal/{thermal_zone,cooling_device}[0-9]*` | `node_thermal_zone_temp{type,zone}` (millidegrees / 1000), `node_cooling_device_{cur,max}_state{name,type}` |
//! | `edac` | `<sys>/devices/system/edac/mc/mc[0-9]*` | `node_edac_{correctable,uncorrectable}_errors_total{controller}`, `node_edac_csrow_{correctable,uncorrectable}_errors_total{controller,csrow}` (`csrow="unknown"`: the `*_noinfo_count`) |
//! | `nvme` | `<sys>/class/nvme/<device>/{firmware_rev,model,serial,state}` | `node_nvme_info{device,firmware_revision,model,serial,state}` = 1 |
//! | `mdadm` | `<proc>/mdstat` | `node_md_disks_required{device}`, `node_md_disks{device,state}` (`active`, `failed`, `spare`), `node_md_state{device,state}` (`active`, `inactive`, `recovering`, `resync`, `check`), `node_md_blocks{device}`, `node_md_blocks_synced{device}` |
//! | `bonding` | `<sys>/class/net/bonding_masters`, `<sys>/class/net/<master>/bonding/slaves`, `…/{lower,slave}_<slave>/bonding_slave/mii_status` | `node_bonding_slaves{master}`, `node_bonding_active{master}` (slaves whose MII status is `up`) |
//! | `hwmon` | `<sys>/class/hwmon/*/{,device/}<type><n>_<property>` | `node_hwmon_temp_celsius{chip,sensor}` (millidegrees × 0.001), `node_hwmon_fan_rpm`, `node_hwmon_in_volts` (millivolts × 0.001), `node_hwmon_power_*_watt` (microwatts / 10⁶), `node_hwmon_energy_joule_total`, `node_hwmon_chip_names{chip,chip_name}`, `node_hwmon_sensor_label{chip,label,sensor}`, …; see [`crate::sources::node_hwmon`] |
//! | `timex` | adjtimex(2), read only | `node_timex_*`: sync status, offset, frequency, errors, tick, PPS state (see [`crate::sources::node_time::timex_series`]) |
//! | `udp_queues` | `<proc>/net/udp`, `<proc>/net/udp6` | `node_udp_queues{ip,queue}` (bytes queued, summed over sockets) |
//! | `selinux` | `<sys>/fs/selinux/enforce`, `<rootfs>/etc/selinux/config` | `node_selinux_enabled`, and when enabled `node_selinux_{config,current}_mode` |
//! | `ethtool` (off unless [`HostMetricsConfig::ethtool`]) | `<sys>/class/net`, the `SIOCETHTOOL` ioctl | `node_ethtool_<stat>{device}` (untyped, `ethtool -S`), `node_ethtool_info{bus_info,device,driver,…}` = 1, `node_network_{supported,advertised}_speed_bytes`, `node_network_supported_port_info`, `node_network_autonegotiate*`, `node_network_{,asymmetric}pause_*`; see [`crate::sources::node_ethtool`] |
//!
//! The collectors from `filefd` to `schedstat` and `selinux` are in [`crate::sources::node`],
//! those from `arp` to `bonding` in [`crate::sources::node_sys`], `hwmon` in
//! [`crate::sources::node_hwmon`], `netdev` and `udp_queues` in [`crate::sources::node_netdev`],
//! `time` and `timex` in [`crate::sources::node_time`], `ethtool` in
//! [`crate::sources::node_ethtool`]. A missing file of `pressure` (no PSI),
//! `conntrack` (module not loaded), `schedstat` (kernel without `CONFIG_SCHEDSTATS`), `entropy`,
//! `filefd`, `vmstat`, `netstat`, `os`, `softnet`, `arp` or `mdadm` (no md driver), or a
//! missing `<sys>/class/net` (`netclass`), `<sys>/class/nvme` (`nvme`),
//! `<sys>/class/net/bonding_masters` (`bonding`, no bonding driver) or `<sys>/class/hwmon`
//! (`hwmon`, no hardware monitoring chip), fails that collector only
//! (`node_scrape_collector_success` 0), like node_exporter; `thermal_zone` and `edac` without
//! devices succeed with no series, as node_exporter's do. Collectors listed in
//! [`HostMetricsConfig::disabled`] do not run and emit no series at all,
//! `node_scrape_collector_*` included.
//!
//! Each run also emits node_exporter's own `node_scrape_collector_success{collector}` and
//! `node_scrape_collector_duration_seconds{collector}` gauges.
//!
//! A sub-collector that fails is reported in [`HostCollection::errors`], counted in
//! [`HostMetrics::failures`], its partial output is discarded, and the others still run.
//! `infiniband` can also succeed in part: files it had to skip are listed in
//! [`HostCollection::infiniband_skipped`], its other series are kept, and its
//! `node_scrape_collector_success` is 0 for that collection.
//!
//! Names, help strings and unit conversions follow node_exporter's `collector/*_linux.go`
//! (`cpu_linux.go`, `stat_linux.go`, `loadavg_linux.go`, `meminfo.go`, `netdev_linux.go`,
//! `diskstats_linux.go`, `filesystem_linux.go`, `time.go`, `infiniband_linux.go`).
//!
//! Known differences from node_exporter: no CPU "jump back" smoothing on hotplug; statvfs(2) is
//! called inline, so a hung network filesystem blocks the collection (node_exporter marks such
//! mounts stale after a timeout) — exclude such mounts by fs type if that matters.

use std::fmt;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use procfs::{FromRead, FromReadSI};
use uctel_protocol::payload::Metric;

use super::metric::{counter, gauge};
use super::node::{self, NodeError};
use super::node_ethtool::{self, EthtoolSection, EthtoolSkip};
use super::rdma::{PortEvent, RdmaCounters, RdmaError, SkippedFile};
use super::{node_netdev, node_sys, node_time, node_udev};
use serde::{Deserialize, Serialize};

/// Where the host's pseudo filesystems are mounted. Tests point these at fixture trees;
/// containers point them at the host's `/proc`, `/sys` and `/` bind mounts (node_exporter's
/// `--path.procfs`, `--path.sysfs`, `--path.rootfs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPaths {
    /// procfs root, default `/proc`.
    pub proc: PathBuf,
    /// sysfs root, default `/sys`.
    pub sys: PathBuf,
    /// Prefix joined to every mount point before statvfs(2), default `/`.
    pub rootfs: PathBuf,
}

impl Default for HostPaths {
    fn default() -> Self {
        Self {
            proc: PathBuf::from("/proc"),
            sys: PathBuf::from("/sys"),
            rootfs: PathBuf::from("/"),
        }
    }
}

/// Configuration of [`HostMetrics`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostMetricsConfig {
    /// Pseudo filesystem roots.
    pub paths: HostPaths,
    /// Kernel clock ticks per second (`USER_HZ`) used to turn `/proc/stat` ticks into seconds;
    /// `None` asks the system (`sysconf(_SC_CLK_TCK)`, 100 on Linux).
    pub ticks_per_second: Option<u64>,
    /// Sub-collectors that do not run.
    pub disabled: Vec<HostCollector>,
    /// The `ethtool` sub-collector's filters; `None` (the default): it does not run.
    pub ethtool: Option<EthtoolSection>,
}

/// One sub-collector of [`HostMetrics`], named like the node_exporter collector it mirrors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HostCollector {
    /// `node_cpu_seconds_total` per CPU and mode (`/proc/stat`).
    Cpu,
    /// Boot time, context switches, interrupts, forks, running and blocked processes (`/proc/stat`).
    Stat,
    /// `node_load1`, `node_load5`, `node_load15` (`/proc/loadavg`).
    Loadavg,
    /// `node_memory_*_bytes` (`/proc/meminfo`).
    Meminfo,
    /// `node_network_*` per interface (`/proc/net/dev`).
    Netdev,
    /// `node_disk_*` per block device (`/proc/diskstats`).
    Diskstats,
    /// `node_filesystem_*` per mount (`/proc/1/mountinfo`, statvfs(2)).
    Filesystem,
    /// `node_time_seconds`, `node_time_zone_offset_seconds`, `node_time_clocksource_*`.
    Time,
    /// `node_infiniband_*` per RDMA port (`/sys/class/infiniband`).
    Infiniband,
    /// `node_filefd_*` (`/proc/sys/fs/file-nr`).
    Filefd,
    /// `node_uname_info` (uname(2)).
    Uname,
    /// `node_entropy_*` (`/proc/sys/kernel/random`).
    Entropy,
    /// `node_vmstat_*` (`/proc/vmstat`).
    Vmstat,
    /// `node_sockstat_*` (`/proc/net/sockstat`, `/proc/net/sockstat6`).
    Sockstat,
    /// `node_netstat_*` (`/proc/net/netstat`, `/proc/net/snmp`, `/proc/net/snmp6`).
    Netstat,
    /// `node_pressure_*` (`/proc/pressure`).
    Pressure,
    /// `node_os_info`, `node_os_version` (`/etc/os-release`).
    Os,
    /// `node_nf_conntrack_*` (`/proc/sys/net/netfilter`, `/proc/net/stat/nf_conntrack`).
    Conntrack,
    /// `node_softnet_*` per CPU (`/proc/net/softnet_stat`).
    Softnet,
    /// `node_schedstat_*` per CPU (`/proc/schedstat`).
    Schedstat,
    /// `node_arp_entries` per device (`/proc/net/arp`).
    Arp,
    /// `node_network_info`, `node_network_up` and device properties (`/sys/class/net`).
    Netclass,
    /// `node_thermal_zone_temp`, `node_cooling_device_*` (`/sys/class/thermal`).
    ThermalZone,
    /// `node_edac_*` per memory controller (`/sys/devices/system/edac/mc`).
    Edac,
    /// `node_nvme_info` per controller (`/sys/class/nvme`).
    Nvme,
    /// `node_md_*` per software RAID array (`/proc/mdstat`).
    Mdadm,
    /// `node_bonding_{slaves,active}` per bonding master (`/sys/class/net/bonding_masters`).
    Bonding,
    /// `node_hwmon_*` per hardware monitoring chip and sensor (`/sys/class/hwmon`).
    Hwmon,
    /// `node_timex_*`: the kernel clock's NTP state (adjtimex(2)).
    Timex,
    /// `node_udp_queues` (`/proc/net/udp`, `/proc/net/udp6`).
    UdpQueues,
    /// `node_selinux_*` (`/sys/fs/selinux`).
    Selinux,
    /// `node_ethtool_*` and link settings per interface (the `SIOCETHTOOL` ioctl); runs only
    /// when `sources.host_metrics.ethtool` is set.
    Ethtool,
}

impl HostCollector {
    /// Every sub-collector, in the order they run.
    pub const ALL: [HostCollector; 32] = [
        HostCollector::Cpu,
        HostCollector::Stat,
        HostCollector::Loadavg,
        HostCollector::Meminfo,
        HostCollector::Netdev,
        HostCollector::Diskstats,
        HostCollector::Filesystem,
        HostCollector::Time,
        HostCollector::Infiniband,
        HostCollector::Filefd,
        HostCollector::Uname,
        HostCollector::Entropy,
        HostCollector::Vmstat,
        HostCollector::Sockstat,
        HostCollector::Netstat,
        HostCollector::Pressure,
        HostCollector::Os,
        HostCollector::Conntrack,
        HostCollector::Softnet,
        HostCollector::Schedstat,
        HostCollector::Arp,
        HostCollector::Netclass,
        HostCollector::ThermalZone,
        HostCollector::Edac,
        HostCollector::Nvme,
        HostCollector::Mdadm,
        HostCollector::Bonding,
        HostCollector::Hwmon,
        HostCollector::Timex,
        HostCollector::UdpQueues,
        HostCollector::Selinux,
        HostCollector::Ethtool,
    ];

    /// The node_exporter collector name, used as the `collector` label value.
    pub fn as_str(self) -> &'static str {
        COLLECTOR_NAMES
            .get(self.index())
            .copied()
            .unwrap_or_default()
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// [`HostCollector::as_str`] of each variant, in declaration order.
#[rustfmt::skip]
const COLLECTOR_NAMES: [&str; HostCollector::ALL.len()] = [
    "cpu", "stat", "loadavg", "meminfo", "netdev", "diskstats", "filesystem", "time",
    "infiniband", "filefd", "uname", "entropy", "vmstat", "sockstat", "netstat", "pressure",
    "os", "conntrack", "softnet", "schedstat", "arp", "netclass", "thermal_zone", "edac", "nvme",
    "mdadm", "bonding", "hwmon", "timex", "udp_queues", "selinux", "ethtool",
];

impl fmt::Display for HostCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a sub-collector failed.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The read error.
        #[source]
        source: std::io::Error,
    },
    /// The `procfs` crate rejected a file's contents.
    #[error("cannot parse {path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What `procfs` said.
        #[source]
        source: procfs::ProcError,
    },
    /// A file's contents did not have the expected shape.
    #[error("unexpected contents in {path}: {reason}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What was wrong with it.
        reason: String,
    },
    /// The RDMA counter tree could not be walked.
    #[error(transparent)]
    Rdma(#[from] RdmaError),
    /// One of the [`crate::sources::node`] collectors failed.
    #[error(transparent)]
    Node(#[from] NodeError),
}

/// A failed sub-collector and why.
#[derive(Debug, thiserror::Error)]
#[error("host collector {collector} failed: {error}")]
pub struct CollectorError {
    /// The sub-collector that failed.
    pub collector: HostCollector,
    /// Why.
    #[source]
    pub error: HostError,
}

/// The result of one [`HostMetrics::collect`]: the samples of every sub-collector that
/// succeeded, and one error per sub-collector that failed.
#[derive(Debug, Default)]
pub struct HostCollection {
    /// Samples of the sub-collectors that succeeded, plus the per-collector
    /// `node_scrape_collector_*` series.
    pub metrics: Vec<Metric>,
    /// One entry per sub-collector that failed.
    pub errors: Vec<CollectorError>,
    /// RDMA files the `infiniband` sub-collector skipped ([`RdmaCounters::collect_into`]);
    /// when there are any, its `node_scrape_collector_success` is 0.
    pub infiniband_skipped: Vec<SkippedFile>,
    /// What the `ethtool` sub-collector skipped (interfaces whose requests failed other than
    /// with `EOPNOTSUPP`, clashing statistic names); its success stays 1, as node_exporter's.
    pub ethtool_skipped: Vec<EthtoolSkip>,
    /// RDMA port state and GID changes since the previous collection
    /// ([`super::rdma::RdmaScan::events`]).
    pub infiniband_events: Vec<PortEvent>,
}

/// Collects host metrics; see the module documentation for the series produced.
#[derive(Debug)]
pub struct HostMetrics {
    paths: HostPaths,
    ticks_per_second: u64,
    disabled: Vec<HostCollector>,
    ethtool: Option<EthtoolSection>,
    rdma: RdmaCounters,
    failures: [u64; HostCollector::ALL.len()],
    /// Samples of the previous collection: the next one reserves that many up front, so a big
    /// host's sample vector is allocated once rather than grown (and copied) by doubling.
    last_len: usize,
}

impl HostMetrics {
    /// A collector reading the given roots. `ticks_per_second` of 0 is treated as the system
    /// value.
    pub fn new(config: HostMetricsConfig) -> Self {
        let ticks_per_second = match config.ticks_per_second {
            Some(t) if t > 0 => t,
            _ => procfs::ticks_per_second().max(1),
        };
        let rdma = RdmaCounters::new(&config.paths.sys);
        Self {
            paths: config.paths,
            ticks_per_second,
            disabled: config.disabled,
            ethtool: config.ethtool,
            rdma,
            failures: [0; HostCollector::ALL.len()],
            last_len: 0,
        }
    }

    /// Runs every sub-collector once. Never stops at a failing sub-collector: its error is in
    /// [`HostCollection::errors`], its `node_scrape_collector_success` sample is 0, and
    /// [`HostMetrics::failures`] counts it. `infiniband` files skipped are in
    /// [`HostCollection::infiniband_skipped`] (success 0, the other RDMA series kept, not
    /// counted in `failures`).
    pub fn collect(&mut self) -> HostCollection {
        let mut out = HostCollection {
            metrics: Vec::with_capacity(self.last_len),
            errors: Vec::new(),
            infiniband_skipped: Vec::new(),
            ethtool_skipped: Vec::new(),
            infiniband_events: Vec::new(),
        };
        let stat_path = self.paths.proc.join("stat");
        let stat_text = std::fs::read_to_string(&stat_path);
        let proc = &self.paths.proc;
        for collector in HostCollector::ALL {
            let off = collector == HostCollector::Ethtool && self.ethtool.is_none();
            if off || self.disabled.contains(&collector) {
                continue;
            }
            let mark = out.metrics.len();
            let started = Instant::now();
            // Some inputs skipped, the rest collected: success 0, output kept.
            let mut partial = false;
            let result = match collector {
                HostCollector::Cpu => match &stat_text {
                    Ok(text) => self.cpu(&stat_path, text, &mut out.metrics),
                    Err(e) => Err(read_error(&stat_path, e)),
                },
                HostCollector::Stat => match &stat_text {
                    Ok(text) => stat(&stat_path, text, &mut out.metrics),
                    Err(e) => Err(read_error(&stat_path, e)),
                },
                HostCollector::Loadavg => loadavg(&self.paths.proc, &mut out.metrics),
                HostCollector::Meminfo => meminfo(&self.paths.proc, &mut out.metrics),
                HostCollector::Netdev => {
                    node_netdev::netdev(proc, &self.paths.sys, &mut out.metrics).map_err(From::from)
                }
                HostCollector::Diskstats => diskstats(&self.paths, &mut out.metrics),
                HostCollector::Filesystem => filesystem(&self.paths, &mut out.metrics),
                HostCollector::Time => {
                    node_time::time(&self.paths.sys, &mut out.metrics).map_err(From::from)
                }
                HostCollector::Timex => node_time::timex(&mut out.metrics).map_err(From::from),
                HostCollector::UdpQueues => {
                    node_netdev::udp_queues(proc, &mut out.metrics).map_err(From::from)
                }
                HostCollector::Ethtool => match &self.ethtool {
                    Some(section) => {
                        let (sys, skipped) = (&self.paths.sys, &mut out.ethtool_skipped);
                        node_ethtool::collect(section, sys, &mut out.metrics, skipped)
                            .map_err(From::from)
                    }
                    None => Ok(()),
                },
                HostCollector::Selinux => {
                    node::selinux(&self.paths.sys, &self.paths.rootfs, &mut out.metrics);
                    Ok(())
                }
                HostCollector::Infiniband => match self.rdma.collect_into(&mut out.metrics) {
                    Ok(scan) => {
                        partial = !scan.skipped.is_empty();
                        out.infiniband_skipped = scan.skipped;
                        out.infiniband_events = scan.events;
                        Ok(())
                    }
                    Err(e) => Err(HostError::from(e)),
                },
                HostCollector::Filefd => node::filefd(proc, &mut out.metrics).map_err(From::from),
                HostCollector::Uname => {
                    node::uname(&mut out.metrics);
                    Ok(())
                }
                HostCollector::Entropy => node::entropy(proc, &mut out.metrics).map_err(From::from),
                HostCollector::Vmstat => node::vmstat(proc, &mut out.metrics).map_err(From::from),
                HostCollector::Sockstat => {
                    node::sockstat(proc, procfs::page_size(), &mut out.metrics).map_err(From::from)
                }
                HostCollector::Netstat => node::netstat(proc, &mut out.metrics).map_err(From::from),
                HostCollector::Pressure => {
                    node::pressure(proc, &mut out.metrics).map_err(From::from)
                }
                HostCollector::Os => {
                    node::os(&self.paths.rootfs, &mut out.metrics).map_err(From::from)
                }
                HostCollector::Conntrack => {
                    node::conntrack(proc, &mut out.metrics).map_err(From::from)
                }
                HostCollector::Softnet => node::softnet(proc, &mut out.metrics).map_err(From::from),
                HostCollector::Schedstat => {
                    node::schedstat(proc, &mut out.metrics).map_err(From::from)
                }
                c => node_sys::collect(c.as_str(), proc, &self.paths.sys, &mut out.metrics)
                    .map_err(From::from),
            };
            let elapsed = started.elapsed();
            let ok = match result {
                Ok(()) => !partial,
                Err(error) => {
                    out.metrics.truncate(mark);
                    if let Some(n) = self.failures.get_mut(collector.index()) {
                        *n += 1;
                    }
                    out.errors.push(CollectorError { collector, error });
                    false
                }
            };
            scrape_samples(collector, ok, elapsed, &mut out.metrics);
        }
        self.last_len = out.metrics.len();
        out
    }

    /// How many times `collector` has failed since this value was created.
    pub fn failures(&self, collector: HostCollector) -> u64 {
        self.failures.get(collector.index()).copied().unwrap_or(0)
    }

    /// The ticks-per-second value used to convert `/proc/stat`.
    pub fn ticks_per_second(&self) -> u64 {
        self.ticks_per_second
    }

    fn cpu(&self, path: &Path, text: &str, out: &mut Vec<Metric>) -> Result<(), HostError> {
        let info = procfs::ExplicitSystemInfo {
            boot_time_secs: 0,
            ticks_per_second: self.ticks_per_second,
            page_size: procfs::page_size(),
            is_little_endian: cfg!(target_endian = "little"),
        };
        let stats = procfs::KernelStats::from_read(text.as_bytes(), &info).map_err(|source| {
            HostError::Parse {
                path: path.to_owned(),
                source,
            }
        })?;
        // procfs keeps the per-CPU lines in file order but drops their numbers; offline CPUs
        // leave gaps (cpu0, cpu2), so take the ids from the text.
        let ids: Vec<&str> = text
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter_map(|w| w.strip_prefix("cpu"))
            .filter(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()))
            .collect();
        if ids.len() != stats.cpu_time.len() {
            return Err(HostError::Format {
                path: path.to_owned(),
                reason: format!(
                    "{} cpuN lines but {} parsed",
                    ids.len(),
                    stats.cpu_time.len()
                ),
            });
        }
        let tps = self.ticks_per_second as f64;
        const HELP: &str = "Seconds the CPUs spent in each mode.";
        const GUEST_HELP: &str = "Seconds the CPUs spent in guests (VMs) for each mode.";
        for (id, t) in ids.iter().zip(&stats.cpu_time) {
            let modes = [
                ("user", t.user),
                ("nice", t.nice),
                ("system", t.system),
                ("idle", t.idle),
                ("iowait", t.iowait.unwrap_or(0)),
                ("irq", t.irq.unwrap_or(0)),
                ("softirq", t.softirq.unwrap_or(0)),
                ("steal", t.steal.unwrap_or(0)),
            ];
            for (mode, ticks) in modes {
                out.push(counter(
                    "node_cpu_seconds_total",
                    HELP,
                    &[("cpu", id), ("mode", mode)],
                    ticks as f64 / tps,
                ));
            }
            for (mode, ticks) in [
                ("user", t.guest.unwrap_or(0)),
                ("nice", t.guest_nice.unwrap_or(0)),
            ] {
                out.push(counter(
                    "node_cpu_guest_seconds_total",
                    GUEST_HELP,
                    &[("cpu", id), ("mode", mode)],
                    ticks as f64 / tps,
                ));
            }
        }
        Ok(())
    }
}

impl Default for HostMetrics {
    fn default() -> Self {
        Self::new(HostMetricsConfig::default())
    }
}

fn read_error(path: &Path, e: &std::io::Error) -> HostError {
    HostError::Read {
        path: path.to_owned(),
        source: std::io::Error::new(e.kind(), e.to_string()),
    }
}

fn parse_error(path: &Path) -> impl FnOnce(procfs::ProcError) -> HostError + '_ {
    move |source| HostError::Parse {
        path: path.to_owned(),
        source,
    }
}

fn scrape_samples(collector: HostCollector, ok: bool, elapsed: Duration, out: &mut Vec<Metric>) {
    let labels = [("collector", collector.as_str())];
    out.push(gauge(
        "node_scrape_collector_duration_seconds",
        "node_exporter: Duration of a collector scrape.",
        &labels,
        elapsed.as_secs_f64(),
    ));
    out.push(gauge(
        "node_scrape_collector_success",
        "node_exporter: Whether a collector succeeded.",
        &labels,
        if ok { 1.0 } else { 0.0 },
    ));
}

/// node_exporter's `stat` collector: boot time, context switches, forks, interrupts, process
/// states from `/proc/stat`.
fn stat(path: &Path, text: &str, out: &mut Vec<Metric>) -> Result<(), HostError> {
    let info = procfs::ExplicitSystemInfo {
        boot_time_secs: 0,
        ticks_per_second: 100,
        page_size: 4096,
        is_little_endian: cfg!(target_endian = "little"),
    };
    let stats =
        procfs::KernelStats::from_read(text.as_bytes(), &info).map_err(parse_error(path))?;
    // procfs does not parse the `intr` line; its first number is the total.
    let intr = text
        .lines()
        .find_map(|l| l.strip_prefix("intr "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse::<u64>().ok());
    if let Some(intr) = intr {
        out.push(counter(
            "node_intr_total",
            "Total number of interrupts serviced.",
            &[],
            intr as f64,
        ));
    }
    out.push(counter(
        "node_context_switches_total",
        "Total number of context switches.",
        &[],
        stats.ctxt as f64,
    ));
    out.push(gauge(
        "node_boot_time_seconds",
        "Node boot time, in unixtime.",
        &[],
        stats.btime as f64,
    ));
    out.push(counter(
        "node_forks_total",
        "Total number of forks.",
        &[],
        stats.processes as f64,
    ));
    if let Some(n) = stats.procs_running {
        out.push(gauge(
            "node_procs_running",
            "Number of processes in runnable state.",
            &[],
            f64::from(n),
        ));
    }
    if let Some(n) = stats.procs_blocked {
        out.push(gauge(
            "node_procs_blocked",
            "Number of processes blocked waiting for I/O to complete.",
            &[],
            f64::from(n),
        ));
    }
    Ok(())
}

/// `f32` load averages printed back in their shortest form, so `0.52` is exported as 0.52
/// rather than 0.5199999809.
fn f32_to_f64_exact(v: f32) -> f64 {
    v.to_string().parse::<f64>().unwrap_or(f64::from(v))
}

fn loadavg(proc: &Path, out: &mut Vec<Metric>) -> Result<(), HostError> {
    let path = proc.join("loadavg");
    let load = procfs::LoadAverage::from_file(&path).map_err(parse_error(&path))?;
    out.push(gauge(
        "node_load1",
        "1m load average.",
        &[],
        f32_to_f64_exact(load.one),
    ));
    out.push(gauge(
        "node_load5",
        "5m load average.",
        &[],
        f32_to_f64_exact(load.five),
    ));
    out.push(gauge(
        "node_load15",
        "15m load average.",
        &[],
        f32_to_f64_exact(load.fifteen),
    ));
    Ok(())
}

/// `/proc/meminfo` read field by field, so every field the kernel exposes is exported.
/// (`procfs::Meminfo` is a fixed struct; this keeps fields it does not know, which is what
/// node_exporter's original parser in `meminfo.go` does.)
fn meminfo(proc: &Path, out: &mut Vec<Metric>) -> Result<(), HostError> {
    let path = proc.join("meminfo");
    let file = std::fs::File::open(&path).map_err(|source| HostError::Read {
        path: path.clone(),
        source,
    })?;
    let mut parsed = 0usize;
    for line in BufReader::new(file).lines() {
        let line = line.map_err(|source| HostError::Read {
            path: path.clone(),
            source,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let Some((name, value)) = parse_meminfo_line(&line) else {
            return Err(HostError::Format {
                path,
                reason: format!("bad line {line:?}"),
            });
        };
        let help = format!("Memory information field {name}.");
        out.push(gauge(format!("node_memory_{name}"), &help, &[], value));
        parsed += 1;
    }
    if parsed == 0 {
        return Err(HostError::Format {
            path,
            reason: "no fields".to_owned(),
        });
    }
    Ok(())
}

/// One `/proc/meminfo` line → (`<Field>_bytes` or `<Field>`, value in bytes or as-is).
/// `Key(sub):` becomes `Key_sub`; a `kB` unit multiplies by 1024 and adds `_bytes`.
fn parse_meminfo_line(line: &str) -> Option<(String, f64)> {
    let mut parts = line.split_whitespace();
    let key = parts.next()?.strip_suffix(':')?;
    let value: f64 = parts.next()?.parse().ok()?;
    let unit = parts.next();
    if parts.next().is_some() {
        return None;
    }
    let mut name = String::with_capacity(key.len() + 6);
    for c in key.chars() {
        match c {
            '(' => name.push('_'),
            ')' => {}
            c if c.is_ascii_alphanumeric() || c == '_' => name.push(c),
            _ => name.push('_'),
        }
    }
    if name.is_empty() {
        return None;
    }
    match unit {
        None => Some((name, value)),
        Some("kB") => {
            name.push_str("_bytes");
            Some((name, value * 1024.0))
        }
        Some(_) => None,
    }
}

/// node_exporter's default `--collector.diskstats.device-exclude`:
/// `^(z?ram|loop|fd|(h|s|v|xv)d[a-z]|nvme\d+n\d+p)\d+$` — partitions and RAM/loop/floppy
/// devices, so whole disks are not counted twice.
pub fn disk_device_ignored(name: &str) -> bool {
    let stem = name.trim_end_matches(|c: char| c.is_ascii_digit());
    if stem.len() == name.len() {
        return false; // the pattern needs at least one trailing digit
    }
    if matches!(stem, "ram" | "zram" | "loop" | "fd") {
        return true;
    }
    for prefix in ["hd", "sd", "vd", "xvd"] {
        if let Some(rest) = stem.strip_prefix(prefix) {
            if rest.len() == 1 && rest.bytes().all(|b| b.is_ascii_lowercase()) {
                return true;
            }
        }
    }
    // nvme\d+n\d+p
    if let Some(rest) = stem.strip_prefix("nvme").and_then(|r| r.strip_suffix('p')) {
        if let Some((ctrl, ns)) = rest.split_once('n') {
            let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
            return digits(ctrl) && digits(ns);
        }
    }
    false
}

fn diskstats(paths: &HostPaths, out: &mut Vec<Metric>) -> Result<(), HostError> {
    let path = paths.proc.join("diskstats");
    let udev_data = paths.rootfs.join("run/udev/data");
    let disks = procfs::DiskStats::from_file(&path).map_err(parse_error(&path))?;
    // Sectors are 512-byte units regardless of the device (Documentation/block/stat.rst);
    // times are milliseconds.
    const SECTOR: f64 = 512.0;
    const MS: f64 = 1.0 / 1000.0;
    for d in disks.0.iter().filter(|d| !disk_device_ignored(&d.name)) {
        let props = node_udev::properties(&udev_data, d.major, d.minor);
        node_udev::disk_series(&d.name, d.major, d.minor, &props, out);
        let dev = [("device", d.name.as_str())];
        let c = |name: &str, help: &str, v: f64| counter(name.to_owned(), help, &dev, v);
        out.push(c(
            "node_disk_reads_completed_total",
            "The total number of reads completed successfully.",
            d.reads as f64,
        ));
        out.push(c(
            "node_disk_reads_merged_total",
            "The total number of reads merged.",
            d.merged as f64,
        ));
        out.push(c(
            "node_disk_read_bytes_total",
            "The total number of bytes read successfully.",
            d.sectors_read as f64 * SECTOR,
        ));
        out.push(c(
            "node_disk_read_time_seconds_total",
            "The total number of seconds spent by all reads.",
            d.time_reading as f64 * MS,
        ));
        out.push(c(
            "node_disk_writes_completed_total",
            "The total number of writes completed successfully.",
            d.writes as f64,
        ));
        out.push(c(
            "node_disk_writes_merged_total",
            "The number of writes merged.",
            d.writes_merged as f64,
        ));
        out.push(c(
            "node_disk_written_bytes_total",
            "The total number of bytes written successfully.",
            d.sectors_written as f64 * SECTOR,
        ));
        out.push(c(
            "node_disk_write_time_seconds_total",
            "This is the total number of seconds spent by all writes.",
            d.time_writing as f64 * MS,
        ));
        out.push(gauge(
            "node_disk_io_now",
            "The number of I/Os currently in progress.",
            &dev,
            d.in_progress as f64,
        ));
        out.push(c(
            "node_disk_io_time_seconds_total",
            "Total seconds spent doing I/Os.",
            d.time_in_progress as f64 * MS,
        ));
        out.push(c(
            "node_disk_io_time_weighted_seconds_total",
            "The weighted # of seconds spent doing I/Os.",
            d.weighted_time_in_progress as f64 * MS,
        ));
        let optional = [
            (
                "node_disk_discards_completed_total",
                "The total number of discards completed successfully.",
                d.discards.map(|v| v as f64),
            ),
            (
                "node_disk_discards_merged_total",
                "The total number of discards merged.",
                d.discards_merged.map(|v| v as f64),
            ),
            (
                "node_disk_discarded_sectors_total",
                "The total number of sectors discarded successfully.",
                d.sectors_discarded.map(|v| v as f64),
            ),
            (
                "node_disk_discard_time_seconds_total",
                "This is the total number of seconds spent by all discards.",
                d.time_discarding.map(|v| v as f64 * MS),
            ),
            (
                "node_disk_flush_requests_total",
                "The total number of flush requests completed successfully",
                d.flushes.map(|v| v as f64),
            ),
            (
                "node_disk_flush_requests_time_seconds_total",
                "This is the total number of seconds spent by all flush requests.",
                d.time_flushing.map(|v| v as f64 * MS),
            ),
        ];
        for (name, help, value) in optional {
            if let Some(v) = value {
                out.push(c(name, help, v));
            }
        }
    }
    Ok(())
}

/// node_exporter's default `--collector.filesystem.fs-types-exclude`.
const FS_TYPES_EXCLUDED: &[&str] = &[
    "autofs",
    "binfmt_misc",
    "bpf",
    "cgroup",
    "cgroup2",
    "configfs",
    "debugfs",
    "devpts",
    "devtmpfs",
    "fusectl",
    "hugetlbfs",
    "iso9660",
    "mqueue",
    "nsfs",
    "overlay",
    "proc",
    "procfs",
    "pstore",
    "rpc_pipefs",
    "securityfs",
    "selinuxfs",
    "squashfs",
    "erofs",
    "sysfs",
    "tracefs",
];

/// node_exporter's default `--collector.filesystem.mount-points-exclude`:
/// `^/(dev|proc|run/credentials/.+|sys|var/lib/docker/.+|var/lib/containers/storage/.+)($|/)`.
pub fn mount_point_ignored(mount_point: &str) -> bool {
    let Some(rest) = mount_point.strip_prefix('/') else {
        return false;
    };
    // `dir` followed by end or '/'.
    let exact_or_below = |dir: &str| {
        rest.strip_prefix(dir)
            .is_some_and(|tail| tail.is_empty() || tail.starts_with('/'))
    };
    // `dir/.+` followed by end or '/': something non-empty below dir.
    let strictly_below = |dir: &str| {
        rest.strip_prefix(dir)
            .and_then(|tail| tail.strip_prefix('/'))
            .is_some_and(|tail| !tail.is_empty())
    };
    exact_or_below("dev")
        || exact_or_below("proc")
        || exact_or_below("sys")
        || strictly_below("run/credentials")
        || strictly_below("var/lib/docker")
        || strictly_below("var/lib/containers/storage")
}

/// Whether a mount of this fs type is skipped (node_exporter's default exclude list).
pub fn fs_type_ignored(fs_type: &str) -> bool {
    FS_TYPES_EXCLUDED.contains(&fs_type)
}

/// A `/proc/*/mountinfo` field (mount point, mount source) as the kernel wrote it, decoded:
/// the kernel escapes space, tab, newline and backslash as `\040`, `\011`, `\012` and
/// `\134` (`show_mountinfo` in `fs/proc_namespace.c`, `mangle()` with `" \t\n\\"`), and
/// node_exporter (through prometheus/procfs) reports the decoded path. The `procfs` crate
/// returns the field as written. Any other backslash is kept as it is.
pub fn mountinfo_unescape(field: &str) -> std::borrow::Cow<'_, str> {
    if !field.contains('\\') {
        return std::borrow::Cow::Borrowed(field);
    }
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(at) = rest.find('\\') {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        let decoded = match tail.get(..4) {
            Some("\\040") => Some(' '),
            Some("\\011") => Some('\t'),
            Some("\\012") => Some('\n'),
            Some("\\134") => Some('\\'),
            _ => None,
        };
        match decoded {
            Some(c) => {
                out.push(c);
                rest = &tail[4..];
            }
            None => {
                out.push('\\');
                rest = &tail[1..];
            }
        }
    }
    out.push_str(rest);
    std::borrow::Cow::Owned(out)
}

fn filesystem(paths: &HostPaths, out: &mut Vec<Metric>) -> Result<(), HostError> {
    let primary = paths.proc.join("1").join("mountinfo");
    let mounts = match procfs::process::MountInfos::from_file(&primary) {
        Ok(m) => m,
        Err(_) => {
            let fallback = paths.proc.join("self").join("mountinfo");
            procfs::process::MountInfos::from_file(&fallback).map_err(parse_error(&fallback))?
        }
    };
    // Later mounts over the same mount point hide earlier ones; statvfs sees the top one.
    let mut seen: Vec<(String, String, String)> = Vec::new();
    for m in mounts.0.iter() {
        let mount_point = mountinfo_unescape(&m.mount_point.to_string_lossy()).into_owned();
        if fs_type_ignored(&m.fs_type) || mount_point_ignored(&mount_point) {
            continue;
        }
        let device = m
            .mount_source
            .as_deref()
            .map_or_else(|| "none".to_owned(), |s| mountinfo_unescape(s).into_owned());
        seen.retain(|(_, mp, _)| *mp != mount_point);
        seen.push((device, mount_point, m.fs_type.clone()));
    }
    for (device, mount_point, fs_type) in &seen {
        let labels = [
            ("device", device.as_str()),
            ("mountpoint", mount_point.as_str()),
            ("fstype", fs_type.as_str()),
        ];
        let target = paths.rootfs.join(mount_point.trim_start_matches('/'));
        match rustix::fs::statvfs(&target) {
            Ok(s) => {
                // f_blocks, f_bfree and f_bavail are in f_frsize units (POSIX statvfs).
                let unit = if s.f_frsize > 0 {
                    s.f_frsize
                } else {
                    s.f_bsize
                } as f64;
                out.push(gauge(
                    "node_filesystem_size_bytes",
                    "Filesystem size in bytes.",
                    &labels,
                    s.f_blocks as f64 * unit,
                ));
                out.push(gauge(
                    "node_filesystem_free_bytes",
                    "Filesystem free space in bytes.",
                    &labels,
                    s.f_bfree as f64 * unit,
                ));
                out.push(gauge(
                    "node_filesystem_avail_bytes",
                    "Filesystem space available to non-root users in bytes.",
                    &labels,
                    s.f_bavail as f64 * unit,
                ));
                out.push(gauge(
                    "node_filesystem_files",
                    "Filesystem total file nodes.",
                    &labels,
                    s.f_files as f64,
                ));
                out.push(gauge(
                    "node_filesystem_files_free",
                    "Filesystem total free file nodes.",
                    &labels,
                    s.f_ffree as f64,
                ));
                let ro = s.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY);
                out.push(gauge(
                    "node_filesystem_readonly",
                    "Filesystem read-only status.",
                    &labels,
                    if ro { 1.0 } else { 0.0 },
                ));
                out.push(gauge(
                    "node_filesystem_device_error",
                    "Whether an error occurred while getting statistics for the given device.",
                    &labels,
                    0.0,
                ));
            }
            Err(_) => {
                // node_exporter reports an unreadable mount with device_error=1 and no sizes.
                out.push(gauge(
                    "node_filesystem_device_error",
                    "Whether an error occurred while getting statistics for the given device.",
                    &labels,
                    1.0,
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::rdma::SkipReason;

    /// The four escapes of the kernel's `mangle()` decode; other backslashes stay.
    #[test]
    fn mountinfo_escapes_decode_as_node_exporter_decodes_them() {
        assert_eq!(mountinfo_unescape("/mnt/plain"), "/mnt/plain");
        assert_eq!(
            mountinfo_unescape("/mnt/a\\040b\\011c\\012d\\134e"),
            "/mnt/a b\tc\nd\\e"
        );
        assert_eq!(mountinfo_unescape("/x\\134040"), "/x\\040");
        assert_eq!(mountinfo_unescape("/x\\041\\"), "/x\\041\\");
        assert_eq!(mountinfo_unescape("\\04"), "\\04");
    }

    #[test]
    fn collector_names_are_the_serde_names() {
        for c in HostCollector::ALL {
            let json = serde_json::to_string(&c).unwrap_or_default();
            assert_eq!(json, format!("\"{}\"", c.as_str()), "{c:?}");
            assert_eq!(HostCollector::ALL[c.index()], c);
        }
        assert_eq!(HostCollector::ThermalZone.as_str(), "thermal_zone");
        assert_eq!(HostCollector::Hwmon.as_str(), "hwmon");
    }

    fn scrape_success(m: &[Metric], collector: &str) -> Option<f64> {
        m.iter()
            .find(|s| {
                s.name == "node_scrape_collector_success"
                    && s.labels
                        .iter()
                        .any(|l| l.name == "collector" && l.value == collector)
            })
            .map(|s| s.value)
    }

    #[test]
    fn a_missing_file_fails_only_its_collector_and_disabled_collectors_do_not_run() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let proc = dir.path().join("proc");
        std::fs::create_dir_all(proc.join("sys/fs")).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(proc.join("sys/fs/file-nr"), "352\t0\t2466165\n")
            .unwrap_or_else(|e| panic!("{e}"));
        let config = |disabled: Vec<HostCollector>| HostMetricsConfig {
            paths: HostPaths {
                proc: proc.clone(),
                sys: dir.path().join("sys"),
                rootfs: dir.path().to_path_buf(),
            },
            ticks_per_second: Some(100),
            disabled,
            ethtool: None,
        };
        let mut host = HostMetrics::new(config(Vec::new()));
        let c = host.collect();
        assert_eq!(scrape_success(&c.metrics, "filefd"), Some(1.0));
        // `ethtool` is off without its section, as node_exporter's is by default.
        assert_eq!(scrape_success(&c.metrics, "ethtool"), None);
        let mut with_ethtool = config(Vec::new());
        with_ethtool.ethtool = Some(Default::default());
        let c2 = HostMetrics::new(with_ethtool).collect();
        // On, but the tree has no `sys/class/net`: that collector fails.
        assert_eq!(scrape_success(&c2.metrics, "ethtool"), Some(0.0));
        assert!(c2
            .errors
            .iter()
            .any(|e| e.collector == HostCollector::Ethtool));
        assert_eq!(scrape_success(&c.metrics, "uname"), Some(1.0));
        for missing in [
            "conntrack",
            "pressure",
            "schedstat",
            "vmstat",
            "os",
            "softnet",
        ] {
            assert_eq!(scrape_success(&c.metrics, missing), Some(0.0), "{missing}");
        }
        assert!(c.metrics.iter().any(|m| m.name == "node_filefd_allocated"));
        assert!(c
            .metrics
            .iter()
            .all(|m| !m.name.starts_with("node_nf_conntrack")));
        assert!(c
            .errors
            .iter()
            .any(|e| e.collector == HostCollector::Conntrack
                && matches!(e.error, HostError::Node(NodeError::Read { .. }))));
        assert!(c
            .errors
            .iter()
            .all(|e| e.collector != HostCollector::Filefd));
        // sockstat without its files is empty, not a failure (node_exporter skips them).
        assert_eq!(scrape_success(&c.metrics, "sockstat"), Some(1.0));
        host.collect();
        assert_eq!(host.failures(HostCollector::Conntrack), 2);
        assert_eq!(host.failures(HostCollector::Filefd), 0);

        let mut host = HostMetrics::new(config(vec![
            HostCollector::Filefd,
            HostCollector::Conntrack,
        ]));
        let c = host.collect();
        assert_eq!(scrape_success(&c.metrics, "filefd"), None);
        assert_eq!(scrape_success(&c.metrics, "conntrack"), None);
        assert!(c.metrics.iter().all(|m| !m.name.starts_with("node_filefd")));
        assert!(c
            .errors
            .iter()
            .all(|e| e.collector != HostCollector::Conntrack));
        assert_eq!(scrape_success(&c.metrics, "uname"), Some(1.0));
    }

    #[test]
    fn collector_names_are_the_config_names() {
        for c in HostCollector::ALL {
            let yaml = serde_yaml::to_string(&c).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(yaml.trim(), c.as_str());
            let back: HostCollector =
                serde_yaml::from_str(c.as_str()).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(back, c);
        }
        assert!(serde_yaml::from_str::<HostCollector>("nosuch").is_err());
    }

    #[test]
    fn infiniband_scrape_fails_when_a_file_is_skipped_and_keeps_the_rest() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let counters = dir.path().join("class/infiniband/rxe0/ports/1/counters");
        std::fs::create_dir_all(&counters).unwrap_or_else(|e| panic!("{e}"));
        let write = |name: &str, text: &str| {
            std::fs::write(counters.join(name), text).unwrap_or_else(|e| panic!("{e}"));
        };
        write("port_rcv_data", "10\n");
        let mut host = HostMetrics::new(HostMetricsConfig {
            paths: HostPaths {
                proc: dir.path().join("no-proc"),
                sys: dir.path().to_path_buf(),
                rootfs: dir.path().to_path_buf(),
            },
            ticks_per_second: Some(100),
            disabled: Vec::new(),
            ethtool: None,
        });
        let c = host.collect();
        assert_eq!(scrape_success(&c.metrics, "infiniband"), Some(1.0));
        assert!(c.infiniband_skipped.is_empty());

        write("symbol_error", "N/A (no PMA)\n");
        let c = host.collect();
        assert_eq!(scrape_success(&c.metrics, "infiniband"), Some(0.0));
        let skipped: Vec<_> = c
            .infiniband_skipped
            .iter()
            .map(|f| (f.path.clone(), f.reason, f.first))
            .collect();
        assert_eq!(
            skipped,
            vec![(
                counters.join("symbol_error"),
                SkipReason::NotAvailable,
                true
            )]
        );
        assert!(
            c.metrics
                .iter()
                .any(|m| m.name == "node_infiniband_port_data_received_bytes_total"),
            "the other RDMA series are kept"
        );
        assert!(c
            .errors
            .iter()
            .all(|e| e.collector != HostCollector::Infiniband));
        assert_eq!(host.failures(HostCollector::Infiniband), 0);
        // Still failing at the next collection, no longer new.
        let c = host.collect();
        assert_eq!(scrape_success(&c.metrics, "infiniband"), Some(0.0));
        assert_eq!(c.infiniband_skipped.first().map(|f| f.first), Some(false));
    }

    #[test]
    fn meminfo_lines_map_to_node_exporter_names() {
        assert_eq!(
            parse_meminfo_line("MemTotal:       16318412 kB"),
            Some(("MemTotal_bytes".to_owned(), 16318412.0 * 1024.0))
        );
        assert_eq!(
            parse_meminfo_line("Active(anon):     123 kB"),
            Some(("Active_anon_bytes".to_owned(), 123.0 * 1024.0))
        );
        assert_eq!(
            parse_meminfo_line("HugePages_Total:       0"),
            Some(("HugePages_Total".to_owned(), 0.0))
        );
        assert_eq!(
            parse_meminfo_line("NFS_Unstable:          0 kB"),
            Some(("NFS_Unstable_bytes".to_owned(), 0.0))
        );
        assert_eq!(parse_meminfo_line("garbage"), None);
        assert_eq!(parse_meminfo_line("X: 1 MB"), None);
        assert_eq!(parse_meminfo_line("X: notanumber kB"), None);
    }

    #[test]
    fn disk_filter_matches_node_exporter_default() {
        for ignored in [
            "sda1",
            "vdb12",
            "xvda1",
            "hdc3",
            "nvme0n1p1",
            "loop0",
            "ram15",
            "zram0",
            "fd0",
        ] {
            assert!(disk_device_ignored(ignored), "{ignored} should be ignored");
        }
        for kept in [
            "sda", "vdb", "nvme0n1", "dm-0", "md0", "sdaa1", "mmcblk0", "nvme0n1p", "loop",
        ] {
            assert!(!disk_device_ignored(kept), "{kept} should be kept");
        }
    }

    #[test]
    fn mount_point_filter_matches_node_exporter_default() {
        for ignored in [
            "/dev",
            "/dev/shm",
            "/proc",
            "/sys/fs/cgroup",
            "/run/credentials/x.service",
            "/var/lib/docker/overlay2/abc",
            "/var/lib/containers/storage/x",
        ] {
            assert!(mount_point_ignored(ignored), "{ignored} should be ignored");
        }
        for kept in [
            "/",
            "/home",
            "/devices",
            "/run",
            "/run/credentials",
            "/var/lib/docker",
            "/system",
        ] {
            assert!(!mount_point_ignored(kept), "{kept} should be kept");
        }
        assert!(!fs_type_ignored("tmpfs"));
        assert!(fs_type_ignored("cgroup2"));
    }

    #[test]
    fn load_average_keeps_printed_precision() {
        assert_eq!(f32_to_f64_exact(0.52), 0.52);
        assert_eq!(f32_to_f64_exact(12.5), 12.5);
    }
}
