//! The node_exporter collectors that [`crate::sources::host::HostMetrics`] runs, one file per
//! collector, each named after the node_exporter collector whose series it reproduces:
//!
//! | collector | source | series |
//! |---|---|---|
//! | `cpu` | `<proc>/stat` | `node_cpu_seconds_total{cpu,mode}` (counter, seconds: kernel ticks / `ticks_per_second`), `node_cpu_guest_seconds_total{cpu,mode}` |
//! | `stat` | `<proc>/stat` | `node_boot_time_seconds`, `node_context_switches_total`, `node_forks_total`, `node_intr_total`, `node_procs_running`, `node_procs_blocked` |
//! | `loadavg` | `<proc>/loadavg` | `node_load1`, `node_load5`, `node_load15` |
//! | `meminfo` | `<proc>/meminfo` | `node_memory_<Field>_bytes` for fields in kB (×1024), `node_memory_<Field>` for unitless fields (`HugePages_Total`, …); `Active(anon)` becomes `Active_anon` |
//! | `netdev` | `<proc>/net/dev`, `<sys>/class/net/<device>/statistics/rx_nohandler` | `node_network_{receive,transmit}_<field>_total{device}` for all 16 fields, `node_network_receive_nohandler_total{device}` |
//! | `diskstats` | `<proc>/diskstats` | `node_disk_*_total{device}`, `node_disk_io_now{device}`; sectors ×512 bytes, milliseconds /1000; partitions, `ram`, `loop`, `fd` excluded like node_exporter's default; `node_disk_info`, `node_disk_filesystem_info`, `node_disk_device_mapper_info`, `node_disk_ata_*` from udev's `<rootfs>/run/udev/data/b<major>:<minor>` (see [`udev`]) |
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
//! | `hwmon` | `<sys>/class/hwmon/*/{,device/}<type><n>_<property>` | `node_hwmon_temp_celsius{chip,sensor}` (millidegrees × 0.001), `node_hwmon_fan_rpm`, `node_hwmon_in_volts` (millivolts × 0.001), `node_hwmon_power_*_watt` (microwatts / 10⁶), `node_hwmon_energy_joule_total`, `node_hwmon_chip_names{chip,chip_name}`, `node_hwmon_sensor_label{chip,label,sensor}`, …; see [`hwmon`] |
//! | `timex` | adjtimex(2), read only | `node_timex_*`: sync status, offset, frequency, errors, tick, PPS state (see [`timex::timex_series`]) |
//! | `udp_queues` | `<proc>/net/udp`, `<proc>/net/udp6` | `node_udp_queues{ip,queue}` (bytes queued, summed over sockets) |
//! | `selinux` | `<sys>/fs/selinux/enforce`, `<rootfs>/etc/selinux/config` | `node_selinux_enabled`, and when enabled `node_selinux_{config,current}_mode` |
//! | `ethtool` (off unless [`crate::sources::host::HostMetricsConfig::ethtool`]) | `<sys>/class/net`, the `SIOCETHTOOL` ioctl | `node_ethtool_<stat>{device}` (untyped, `ethtool -S`), `node_ethtool_info{bus_info,device,driver,…}` = 1, `node_network_{supported,advertised}_speed_bytes`, `node_network_supported_port_info`, `node_network_autonegotiate*`, `node_network_{,asymmetric}pause_*`; see [`ethtool`] |
//!
//! [`HostCollector`] lists them: its [`HostCollector::name`] is the `collector` label and the
//! configuration name, [`HostCollector::ALL`] the order they run in, and
//! `HostCollector::collect` runs one (an exhaustive `match`, so a collector cannot be listed
//! without the file that collects it). [`files`] reads kernel files as node_exporter's `procfs`
//! library does; [`udev`] gives `diskstats` the udev properties of block devices.
//!
//! A missing file of `pressure` (no PSI), `conntrack` (module not loaded), `schedstat` (kernel
//! without `CONFIG_SCHEDSTATS`), `entropy`, `filefd`, `vmstat`, `netstat`, `os`, `softnet`,
//! `arp` or `mdadm` (no md driver), or a missing `<sys>/class/net` (`netclass`),
//! `<sys>/class/nvme` (`nvme`), `<sys>/class/net/bonding_masters` (`bonding`, no bonding
//! driver) or `<sys>/class/hwmon` (`hwmon`, no hardware monitoring chip), fails that collector
//! only (`node_scrape_collector_success` 0), like node_exporter; `thermal_zone` and `edac`
//! without devices succeed with no series, as node_exporter's do; where node_exporter skips a
//! file that is absent (`sockstat6` and `snmp6` without IPv6), so does the collector.
//!
//! Names, help strings, types and value decoding follow node_exporter 1.5's
//! `collector/*_linux.go` (each file names its own) and the parsers of its `procfs` library.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use uctel_protocol::payload::Metric;

use super::rdma::{PortEvent, RdmaCounters, RdmaError, SkippedFile};

pub mod arp;
pub mod bonding;
pub mod conntrack;
pub mod cpu;
pub mod diskstats;
pub mod edac;
pub mod entropy;
pub mod ethtool;
pub mod filefd;
pub mod files;
pub mod filesystem;
pub mod hwmon;
pub mod infiniband;
pub mod loadavg;
pub mod mdadm;
pub mod meminfo;
pub mod netclass;
pub mod netdev;
pub mod netstat;
pub mod nvme;
pub mod os;
pub mod pressure;
pub mod schedstat;
pub mod selinux;
pub mod sockstat;
pub mod softnet;
pub mod stat;
pub mod thermal_zone;
pub mod time;
pub mod timex;
pub mod udev;
pub mod udp_queues;
pub mod uname;
pub mod vmstat;

#[cfg(test)]
mod testutil;

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

/// One sub-collector of [`crate::sources::host::HostMetrics`], named like the node_exporter collector it mirrors.
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
    /// Every sub-collector, in the order they run (and in declaration order, checked below).
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

    /// The node_exporter collector name: the `collector` label value, and the name in
    /// `sources.host_metrics.disabled_collectors` (serde's `snake_case` of the variant, which
    /// the unit tests hold equal).
    pub const fn name(self) -> &'static str {
        match self {
            HostCollector::Cpu => "cpu",
            HostCollector::Stat => "stat",
            HostCollector::Loadavg => "loadavg",
            HostCollector::Meminfo => "meminfo",
            HostCollector::Netdev => "netdev",
            HostCollector::Diskstats => "diskstats",
            HostCollector::Filesystem => "filesystem",
            HostCollector::Time => "time",
            HostCollector::Infiniband => "infiniband",
            HostCollector::Filefd => "filefd",
            HostCollector::Uname => "uname",
            HostCollector::Entropy => "entropy",
            HostCollector::Vmstat => "vmstat",
            HostCollector::Sockstat => "sockstat",
            HostCollector::Netstat => "netstat",
            HostCollector::Pressure => "pressure",
            HostCollector::Os => "os",
            HostCollector::Conntrack => "conntrack",
            HostCollector::Softnet => "softnet",
            HostCollector::Schedstat => "schedstat",
            HostCollector::Arp => "arp",
            HostCollector::Netclass => "netclass",
            HostCollector::ThermalZone => "thermal_zone",
            HostCollector::Edac => "edac",
            HostCollector::Nvme => "nvme",
            HostCollector::Mdadm => "mdadm",
            HostCollector::Bonding => "bonding",
            HostCollector::Hwmon => "hwmon",
            HostCollector::Timex => "timex",
            HostCollector::UdpQueues => "udp_queues",
            HostCollector::Selinux => "selinux",
            HostCollector::Ethtool => "ethtool",
        }
    }

    /// The collector called `name`, `None` when no collector has that name.
    pub fn from_name(name: &str) -> Option<HostCollector> {
        HostCollector::ALL.into_iter().find(|c| c.name() == name)
    }

    /// Its position in [`HostCollector::ALL`] (`0..ALL.len()`).
    pub(crate) const fn index(self) -> usize {
        self as usize
    }

    /// Runs this collector once, appending its series to `run.metrics`.
    ///
    /// # Errors
    /// The collector's [`HostError`]; what it appended is then partial (the caller drops it).
    pub(crate) fn collect(self, run: &mut Run<'_>) -> Result<Outcome, HostError> {
        let paths = run.paths;
        let (proc, sys, rootfs) = (&paths.proc, &paths.sys, &paths.rootfs);
        let out = &mut *run.metrics;
        match self {
            HostCollector::Cpu => {
                let (path, text) = run.proc_stat.text()?;
                cpu::cpu(path, text, run.ticks_per_second, out)?;
            }
            HostCollector::Stat => {
                let (path, text) = run.proc_stat.text()?;
                stat::stat(path, text, out)?;
            }
            HostCollector::Loadavg => loadavg::loadavg(proc, out)?,
            HostCollector::Meminfo => meminfo::meminfo(proc, out)?,
            HostCollector::Netdev => netdev::netdev(proc, sys, out)?,
            HostCollector::Diskstats => diskstats::diskstats(paths, out)?,
            HostCollector::Filesystem => filesystem::filesystem(paths, out)?,
            HostCollector::Time => time::time(sys, out)?,
            HostCollector::Infiniband => {
                let skipped = &mut *run.infiniband_skipped;
                return infiniband::infiniband(run.rdma, out, skipped, run.infiniband_events);
            }
            HostCollector::Filefd => filefd::filefd(proc, out)?,
            HostCollector::Uname => uname::uname(out),
            HostCollector::Entropy => entropy::entropy(proc, out)?,
            HostCollector::Vmstat => vmstat::vmstat(proc, out)?,
            HostCollector::Sockstat => sockstat::sockstat(proc, procfs::page_size(), out)?,
            HostCollector::Netstat => netstat::netstat(proc, out)?,
            HostCollector::Pressure => pressure::pressure(proc, out)?,
            HostCollector::Os => os::os(rootfs, out)?,
            HostCollector::Conntrack => conntrack::conntrack(proc, out)?,
            HostCollector::Softnet => softnet::softnet(proc, out)?,
            HostCollector::Schedstat => schedstat::schedstat(proc, out)?,
            HostCollector::Arp => arp::arp(proc, out)?,
            HostCollector::Netclass => netclass::netclass(sys, out)?,
            HostCollector::ThermalZone => thermal_zone::thermal_zone(sys, out)?,
            HostCollector::Edac => edac::edac(sys, out)?,
            HostCollector::Nvme => nvme::nvme(sys, out)?,
            HostCollector::Mdadm => mdadm::mdadm(proc, out)?,
            HostCollector::Bonding => bonding::bonding(sys, out)?,
            HostCollector::Hwmon => hwmon::hwmon(sys, out)?,
            HostCollector::Timex => timex::timex(out)?,
            HostCollector::UdpQueues => udp_queues::udp_queues(proc, out)?,
            HostCollector::Selinux => selinux::selinux(sys, rootfs, out),
            HostCollector::Ethtool => {
                if let Some(section) = run.ethtool {
                    ethtool::collect(section, sys, out, run.ethtool_skipped)?;
                }
            }
        }
        Ok(Outcome::Complete)
    }
}

// `ALL` lists every variant once, in declaration order, so `index` is a position in it.
const _: () = {
    let mut i = 0;
    while i < HostCollector::ALL.len() {
        assert!(HostCollector::ALL[i].index() == i);
        i += 1;
    }
};

impl std::fmt::Display for HostCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What one run of a collector reads and where it writes, built by
/// [`crate::sources::host::HostMetrics::collect`] for each collector it runs.
#[derive(Debug)]
pub(crate) struct Run<'a> {
    /// The pseudo filesystem roots.
    pub(crate) paths: &'a HostPaths,
    /// Kernel clock ticks per second, for `cpu`.
    pub(crate) ticks_per_second: u64,
    /// `<proc>/stat`, read once for `cpu` and `stat`.
    pub(crate) proc_stat: &'a ProcStat,
    /// The `ethtool` filters; `None`: `ethtool` collects nothing.
    pub(crate) ethtool: Option<&'a ethtool::EthtoolSection>,
    /// The RDMA counter reader of `infiniband`, which keeps port state between collections.
    pub(crate) rdma: &'a mut RdmaCounters,
    /// The samples, appended to.
    pub(crate) metrics: &'a mut Vec<Metric>,
    /// RDMA files `infiniband` skipped.
    pub(crate) infiniband_skipped: &'a mut Vec<SkippedFile>,
    /// RDMA port state and GID changes `infiniband` found.
    pub(crate) infiniband_events: &'a mut Vec<PortEvent>,
    /// What `ethtool` skipped.
    pub(crate) ethtool_skipped: &'a mut Vec<ethtool::EthtoolSkip>,
}

/// How a collector that did not fail went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Everything read: `node_scrape_collector_success` 1.
    Complete,
    /// Some inputs skipped, the rest collected: success 0, the output kept.
    Partial,
}

/// `<proc>/stat`, which both `cpu` and `stat` parse, read once per collection.
#[derive(Debug)]
pub(crate) struct ProcStat {
    path: PathBuf,
    text: std::io::Result<String>,
}

impl ProcStat {
    /// Reads `<proc>/stat`; a failure is kept and becomes each reader's error.
    pub(crate) fn read(proc: &Path) -> ProcStat {
        let path = proc.join("stat");
        let text = std::fs::read_to_string(&path);
        ProcStat { path, text }
    }

    /// The file's path and text.
    ///
    /// # Errors
    /// [`HostError::Read`] when it could not be read.
    fn text(&self) -> Result<(&Path, &str), HostError> {
        match &self.text {
            Ok(text) => Ok((&self.path, text)),
            Err(e) => Err(HostError::Read {
                path: self.path.clone(),
                source: std::io::Error::new(e.kind(), e.to_string()),
            }),
        }
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
    /// A collector that reads plain kernel files failed.
    #[error(transparent)]
    Node(#[from] NodeError),
}

/// Why one of the collectors that read plain kernel files failed.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The read error.
        #[source]
        source: std::io::Error,
    },
    /// A file's contents did not have the expected shape.
    #[error("unexpected contents in {path}: {reason}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What was wrong with it.
        reason: String,
    },
}

/// The [`HostError::Parse`] of `path`, for `map_err` on a `procfs` parse.
fn parse_error(path: &Path) -> impl FnOnce(procfs::ProcError) -> HostError + '_ {
    move |source| HostError::Parse {
        path: path.to_owned(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use testutil::tree;
    use uctel_common::config::reference::{trace, Shape};

    /// Each collector's name is its serde (configuration) name and reads back as itself.
    #[test]
    fn every_collector_round_trips_its_name() {
        for c in HostCollector::ALL {
            assert_eq!(HostCollector::from_name(c.name()), Some(c));
            assert_eq!(c.to_string(), c.name());
            let yaml = serde_yaml::to_string(&c).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(yaml.trim(), c.name());
            let back: HostCollector =
                serde_yaml::from_str(c.name()).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(back, c);
            let json = serde_json::to_string(&c).unwrap_or_default();
            assert_eq!(json, format!("\"{}\"", c.name()), "{c:?}");
        }
        assert_eq!(HostCollector::ThermalZone.name(), "thermal_zone");
        assert_eq!(HostCollector::UdpQueues.name(), "udp_queues");
    }

    /// The configuration's choices (serde's list of every variant) are exactly `ALL`'s names,
    /// in order: a variant left out of `ALL` would be accepted by the configuration and never
    /// run.
    #[test]
    fn all_lists_every_variant_the_configuration_accepts() {
        let Shape::Choice { variants, .. } = trace::<HostCollector>().shape else {
            panic!("HostCollector is not traced as a choice");
        };
        let names: Vec<&str> = HostCollector::ALL.iter().map(|c| c.name()).collect();
        assert_eq!(variants, names);
    }

    #[test]
    fn a_name_that_names_no_collector_is_refused() {
        for bad in ["nosuch", "", "Cpu", "thermal-zone", "node_cpu"] {
            assert_eq!(HostCollector::from_name(bad), None, "{bad:?}");
            let err = serde_yaml::from_str::<HostCollector>(&format!("{bad:?}"))
                .map(|c| format!("accepted as {c}"))
                .unwrap_or_else(|e| e.to_string());
            assert!(err.contains("unknown variant"), "{bad:?}: {err}");
        }
    }

    fn run(collector: HostCollector, paths: &HostPaths) -> (Result<Outcome, HostError>, usize) {
        let proc_stat = ProcStat::read(&paths.proc);
        let mut rdma = RdmaCounters::new(&paths.sys);
        let (mut metrics, mut skipped, mut events, mut ethtool_skipped) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let result = collector.collect(&mut Run {
            paths,
            ticks_per_second: 100,
            proc_stat: &proc_stat,
            ethtool: None,
            rdma: &mut rdma,
            metrics: &mut metrics,
            infiniband_skipped: &mut skipped,
            infiniband_events: &mut events,
            ethtool_skipped: &mut ethtool_skipped,
        });
        (result, metrics.len())
    }

    /// Each name reaches its own collector: against an empty tree the collectors that need a
    /// file fail, and those that need none (or find their devices by glob) succeed.
    #[test]
    fn dispatch_runs_the_collector_of_each_variant() {
        let d = tree(&[(
            "net/arp",
            "IP address HW type Flags HW address Mask Device\n",
        )]);
        let paths = HostPaths {
            proc: d.path().to_owned(),
            sys: d.path().to_owned(),
            rootfs: d.path().to_owned(),
        };
        let (arp, n) = run(HostCollector::Arp, &paths);
        assert!(matches!(arp, Ok(Outcome::Complete)) && n == 0, "{arp:?}");
        let (uname, n) = run(HostCollector::Uname, &paths);
        assert!(
            matches!(uname, Ok(Outcome::Complete)) && n == 1,
            "{uname:?}"
        );
        // `ethtool` without its section collects nothing.
        let (ethtool, n) = run(HostCollector::Ethtool, &paths);
        assert!(
            matches!(ethtool, Ok(Outcome::Complete)) && n == 0,
            "{ethtool:?}"
        );
        for c in [
            HostCollector::Cpu,
            HostCollector::Stat,
            HostCollector::Nvme,
            HostCollector::Hwmon,
            HostCollector::Mdadm,
            HostCollector::Filefd,
        ] {
            let (result, _) = run(c, &paths);
            assert!(result.is_err(), "{c}: {result:?}");
        }
        for c in [HostCollector::ThermalZone, HostCollector::Edac] {
            let (result, n) = run(c, &paths);
            assert!(
                matches!(result, Ok(Outcome::Complete)) && n == 0,
                "{c}: {result:?}"
            );
        }
    }
}
