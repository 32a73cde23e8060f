//! RDMA port counters from `<sysfs>/class/infiniband/<device>/ports/<port>/`, named like
//! node_exporter's `infiniband` collector (`collector/infiniband_linux.go`, parsing from
//! prometheus/procfs `sysfs/class_infiniband.go`). All series carry the labels
//! `device` (e.g. `mlx5_0`, `rxe0`) and `port` (e.g. `1`).
//!
//! | sysfs file | series | type |
//! |---|---|---|
//! | `<device>/{fw_ver,board_id,hca_type}` | `node_infiniband_info{device,board_id,firmware_version,hca_type}` = 1 | gauge |
//! | `ports/<p>/state` (`4: ACTIVE`) | `node_infiniband_state_id` | gauge |
//! | `ports/<p>/phys_state` (`5: LinkUp`) | `node_infiniband_physical_state_id` | gauge |
//! | `ports/<p>/rate` (`100 Gb/sec (4X EDR)`) | `node_infiniband_rate_bytes_per_second` (Gb/s × 125 000 000) | gauge |
//! | `ports/<p>/counters/<file>` | `node_infiniband_<name>_total`, see [`PORT_COUNTERS`] | counter |
//! | `ports/<p>/counters_ext/<file>` (kernels < 4.5) | `node_infiniband_legacy_*_total`, see [`PORT_COUNTERS_EXT`] | counter |
//! | `ports/<p>/hw_counters/<file>` | `node_infiniband_<file>` (file name verbatim, no `_total`) | counter |
//!
//! `port_rcv_data`, `port_xmit_data` and their `_64` variants count 4-byte words (IBTA
//! PortCounters: PortXmitData/PortRcvData "in units of 32-bit words"), so they are multiplied by
//! 4 to give bytes, as node_exporter does.
//!
//! `hw_counters` are driver specific (mlx5: `out_of_buffer`, `packet_seq_err`, …, from the
//! kernel's `drivers/infiniband/hw/mlx5/counters.c`; rxe: `rcvd_seq_err`, `duplicate_request`,
//! …). node_exporter 1.5.0, the version uctel compares with, reads no `hw_counters` at all;
//! this module exports every file of every device as `node_infiniband_<file>`, a counter
//! (gauge-like entries such as `active_qps` or `lifespan` included). node_exporter added
//! `hw_counters` in v1.11.0 under names of its own (`out_of_buffer` →
//! `node_infiniband_out_of_buffer_drops_total`, `lifespan` → `node_infiniband_lifespan_seconds`,
//! …), which these are not. `agent/tests/data/connectx-6-dx/` is a ConnectX-6 Dx tree with
//! the mlx5 names.
//!
//! A missing `class/infiniband` directory (no RDMA devices) yields no series and no error. A
//! port file (`state`, `phys_state`, `rate`, `counters*/`, `hw_counters/`) that cannot be read or
//! parsed (`N/A (no PMA)`, EINVAL from the driver) is skipped and listed in
//! [`RdmaScan::skipped`] with a [`SkipReason`]; it never hides the other series. Each
//! [`SkippedFile`] says whether it is the first time this [`RdmaCounters`] met that path with
//! that reason, so the caller can report every distinct problem once rather than at every
//! collection (the agent: one `warn` line, `uctel_agent_source_errors_total{source="infiniband",
//! reason}` at every collection, `node_scrape_collector_success{collector="infiniband"} 0`).
//!
//! # Port events
//!
//! Between collections an [`RdmaCounters`] remembers each port's `state` and its GID table
//! (`ports/<p>/gids/<i>` with `gid_attrs/types/<i>` and `gid_attrs/ndevs/<i>`, kernel
//! `drivers/infiniband/core/sysfs.c`: `state_show`, `show_port_gid`, `_show_port_gid_attr`) and
//! lists what changed in [`RdmaScan::events`] ([`PortEvent`]): a state change (`4: ACTIVE` →
//! `1: DOWN`), a GID entry added, removed or replaced (its GID, type or net device changed, as
//! when an address is added to the netdev under a RoCE port). The first collection that sees a
//! port is its baseline: no event. A port that is gone from a collection is forgotten (seen
//! again, it is a new baseline). An empty GID entry reads as the zero GID (`::`); reading it may
//! also fail with EINVAL or EAGAIN (kernels before 4.19, reserved entries): both mean "no entry",
//! neither is a skipped file. A `gids/<i>` that is not an IPv6-style address is skipped as
//! `parse_error`. A state that cannot be read leaves the remembered state as it was. Cost: one
//! read per entry of the GID table at every collection (`gids/` has one file per entry of the
//! port's table, 1024 on rxe, `RXE_PORT_GID_TBL_LEN` in `drivers/infiniband/sw/rxe/rxe_param.h`),
//! two more per non-empty entry.
//!
//! These changes are counted by the agent as `uctel_agent_rdma_port_state_changes_total` and
//! `uctel_agent_rdma_gid_changes_total` (see [`crate::rdma_events`] for why they are agent
//! series and not `node_*` ones).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use uctel_protocol::payload::Metric;

use super::metric::{counter, gauge, sanitize_name_part};

/// `counters/<file>` → (series name without `node_infiniband_`, help, multiplier).
pub const PORT_COUNTERS: &[(&str, &str, &str, u64)] = &[
    ("excessive_buffer_overrun_errors", "excessive_buffer_overrun_errors_total", "Number of times that OverrunErrors consecutive flow control update periods occurred, each having at least one overrun error.", 1),
    ("link_downed", "link_downed_total", "Number of times the link failed to recover from an error state and went down", 1),
    ("link_error_recovery", "link_error_recovery_total", "Number of times the link successfully recovered from an error state", 1),
    ("local_link_integrity_errors", "local_link_integrity_errors_total", "Number of times that the count of local physical errors exceeded the threshold specified by LocalPhyErrors.", 1),
    ("multicast_rcv_packets", "multicast_packets_received_total", "Number of multicast packets received (including errors)", 1),
    ("multicast_xmit_packets", "multicast_packets_transmitted_total", "Number of multicast packets transmitted (including errors)", 1),
    ("port_rcv_constraint_errors", "port_constraint_errors_received_total", "Number of packets received on the switch physical port that are discarded", 1),
    ("port_rcv_data", "port_data_received_bytes_total", "Number of data octets received on all links", 4),
    ("port_rcv_discards", "port_discards_received_total", "Number of inbound packets discarded by the port because the port is down or congested", 1),
    ("port_rcv_errors", "port_errors_received_total", "Number of packets containing an error that were received on this port", 1),
    ("port_rcv_packets", "port_packets_received_total", "Number of packets received on all VLs by this port (including errors)", 1),
    ("port_rcv_remote_physical_errors", "port_receive_remote_physical_errors_total", "Number of packets marked with the EBP (End of Bad Packet) delimiter received on the port.", 1),
    ("port_rcv_switch_relay_errors", "port_receive_switch_relay_errors_total", "Number of packets that could not be forwarded by the switch.", 1),
    ("port_xmit_constraint_errors", "port_constraint_errors_transmitted_total", "Number of packets not transmitted from the switch physical port", 1),
    ("port_xmit_data", "port_data_transmitted_bytes_total", "Number of data octets transmitted on all links", 4),
    ("port_xmit_discards", "port_discards_transmitted_total", "Number of outbound packets discarded by the port because the port is down or congested", 1),
    ("port_xmit_packets", "port_packets_transmitted_total", "Number of packets transmitted on all VLs from this port (including errors)", 1),
    ("port_xmit_wait", "port_transmit_wait_total", "Number of ticks during which the port had data to transmit but no data was sent during the entire tick", 1),
    ("symbol_error", "symbol_error_total", "Number of minor link errors detected on one or more physical lanes.", 1),
    ("unicast_rcv_packets", "unicast_packets_received_total", "Number of unicast packets received (including errors)", 1),
    ("unicast_xmit_packets", "unicast_packets_transmitted_total", "Number of unicast packets transmitted (including errors)", 1),
    ("VL15_dropped", "vl15_dropped_total", "Number of incoming VL15 packets dropped due to resource limitations.", 1),
];

/// `counters_ext/<file>` (64-bit counters of kernels before 4.5) → (series name without
/// `node_infiniband_`, help, multiplier).
pub const PORT_COUNTERS_EXT: &[(&str, &str, &str, u64)] = &[
    (
        "port_multicast_rcv_packets",
        "legacy_multicast_packets_received_total",
        "Number of multicast packets received",
        1,
    ),
    (
        "port_multicast_xmit_packets",
        "legacy_multicast_packets_transmitted_total",
        "Number of multicast packets transmitted",
        1,
    ),
    (
        "port_rcv_data_64",
        "legacy_data_received_bytes_total",
        "Number of data octets received on all links",
        4,
    ),
    (
        "port_rcv_packets_64",
        "legacy_packets_received_total",
        "Number of data packets received on all links",
        1,
    ),
    (
        "port_unicast_rcv_packets",
        "legacy_unicast_packets_received_total",
        "Number of unicast packets received",
        1,
    ),
    (
        "port_unicast_xmit_packets",
        "legacy_unicast_packets_transmitted_total",
        "Number of unicast packets transmitted",
        1,
    ),
    (
        "port_xmit_data_64",
        "legacy_data_transmitted_bytes_total",
        "Number of data octets transmitted on all links",
        4,
    ),
    (
        "port_xmit_packets_64",
        "legacy_packets_transmitted_total",
        "Number of data packets received on all links",
        1,
    ),
];

/// A directory of the RDMA class tree could not be listed (other than "does not exist").
#[derive(Debug, thiserror::Error)]
#[error("cannot list {path}: {source}")]
pub struct RdmaError {
    /// The directory.
    pub path: PathBuf,
    /// The listing error.
    #[source]
    pub source: std::io::Error,
}

/// Why an RDMA file was skipped. Closed: [`SkipReason::as_str`] is the `reason` label of
/// `uctel_agent_source_errors_total{source="infiniband"}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SkipReason {
    /// The driver says the value is not available: `N/A (no PMA)` (a port without a
    /// Performance Management Agent, e.g. some RoCE ports and virtual functions), or another
    /// text starting with `N/A`.
    NotAvailable,
    /// read(2) failed: EINVAL or EIO from the driver, EACCES, a directory where a file was
    /// expected. A file that vanished between listing and reading is not a problem.
    ReadError,
    /// The contents are not what the file holds (a decimal counter, `4: ACTIVE`,
    /// `100 Gb/sec (4X EDR)`), or not UTF-8.
    ParseError,
}

impl SkipReason {
    /// Every reason, for pre-registering zero-valued series.
    pub const ALL: [SkipReason; 3] = [
        SkipReason::NotAvailable,
        SkipReason::ReadError,
        SkipReason::ParseError,
    ];

    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::NotAvailable => "not_available",
            SkipReason::ReadError => "read_error",
            SkipReason::ParseError => "parse_error",
        }
    }

    /// Position in [`SkipReason::ALL`], for per-reason arrays.
    pub fn index(self) -> usize {
        match self {
            SkipReason::NotAvailable => 0,
            SkipReason::ReadError => 1,
            SkipReason::ParseError => 2,
        }
    }
}

impl std::fmt::Display for SkipReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One file skipped by one collection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedFile {
    /// The file, under the `sys_root` given to [`RdmaCounters::new`].
    pub path: PathBuf,
    /// Why it was skipped.
    pub reason: SkipReason,
    /// The read error, or the file's contents (trimmed, at most [`DETAIL_CHARS`] characters).
    pub detail: String,
    /// Whether this is the first collection of this [`RdmaCounters`] that skipped `path` for
    /// `reason` (report it then). Only the first [`MAX_REMEMBERED`] distinct problems are
    /// remembered; later new ones are never `first`.
    pub first: bool,
}

/// Longest [`SkippedFile::detail`], in characters.
pub const DETAIL_CHARS: usize = 64;

/// Most distinct `(path, reason)` problems an [`RdmaCounters`] remembers (sysfs has a few
/// hundred counter files per port; devices that come and go must not grow the set forever).
pub const MAX_REMEMBERED: usize = 4096;

/// What one [`RdmaCounters::collect_into`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RdmaScan {
    /// RDMA devices (`class/infiniband/*`).
    pub devices: usize,
    /// Ports across all devices.
    pub ports: usize,
    /// Samples appended.
    pub samples: usize,
    /// Files present but unreadable or unparsable, skipped (their series are left out), in
    /// scan order.
    pub skipped: Vec<SkippedFile>,
    /// Port state and GID table changes since the previous collection, in scan order (none at
    /// the first collection: it is the baseline).
    pub events: Vec<PortEvent>,
}

/// A port `state` (sysfs `ports/<p>/state`, `"<id>: <NAME>"`; `enum ib_port_state` in
/// `include/rdma/ib_verbs.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PortState(pub u32);

impl PortState {
    /// The kernel's name of the state, lower case (`state_show` in
    /// `drivers/infiniband/core/sysfs.c`): `nop`, `down`, `init`, `armed`, `active`,
    /// `active_defer`; `unknown` for any other id. A closed set: the `to` label of
    /// `uctel_agent_rdma_port_state_changes_total`.
    pub fn name(self) -> &'static str {
        match self.0 {
            0 => "nop",
            1 => "down",
            2 => "init",
            3 => "armed",
            4 => "active",
            5 => "active_defer",
            _ => "unknown",
        }
    }
}

/// One entry of a port's GID table.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GidEntry {
    /// `gids/<i>`: the GID, as the kernel prints it (`fe80:0000:…:0001`).
    pub gid: String,
    /// `gid_attrs/types/<i>` (`IB/RoCE v1`, `RoCE v2`); empty where absent or unreadable.
    pub gid_type: String,
    /// `gid_attrs/ndevs/<i>`: the net device (`eth0`); empty where absent or unreadable.
    pub ndev: String,
}

/// What changed on a port between two collections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortChange {
    /// `ports/<p>/state` changed.
    State {
        /// The state at the previous collection.
        from: PortState,
        /// The state now.
        to: PortState,
    },
    /// GID table entry `index` was added (`from: None`), removed (`to: None`) or replaced.
    Gid {
        /// The entry's index (`gids/<index>`).
        index: u32,
        /// The entry at the previous collection.
        from: Option<GidEntry>,
        /// The entry now.
        to: Option<GidEntry>,
    },
}

impl PortChange {
    /// `state` or `gid`: the kind of change, for logging once per kind and port.
    pub fn kind(&self) -> &'static str {
        match self {
            PortChange::State { .. } => "state",
            PortChange::Gid { .. } => "gid",
        }
    }
}

/// A change on one port, found by [`RdmaCounters::collect_into`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortEvent {
    /// Device name (`mlx5_0`, `rxe0`).
    pub device: String,
    /// Port number as in sysfs (`1`).
    pub port: String,
    /// What changed.
    pub change: PortChange,
    /// Whether this is the first change of this [`PortChange::kind`] on this port that this
    /// [`RdmaCounters`] reports (log it then; at most [`MAX_REMEMBERED`] are remembered).
    pub first: bool,
}

/// What a collection read of one port, remembered for the next.
#[derive(Debug, Clone, Default)]
struct PortMemory {
    state: Option<PortState>,
    /// `None` when the port has no `gids/` directory.
    gids: Option<BTreeMap<u32, GidEntry>>,
}

/// Reads RDMA port and hw counters; see the module documentation.
#[derive(Debug, Clone)]
pub struct RdmaCounters {
    class_dir: PathBuf,
    /// `(path, reason)` of every problem met so far (at most [`MAX_REMEMBERED`]).
    seen: HashSet<(PathBuf, SkipReason)>,
    /// `(device, port)` → what the last collection read.
    ports: HashMap<(String, String), PortMemory>,
    /// `(device, port, kind)` of every port event reported so far (at most [`MAX_REMEMBERED`]).
    events_seen: HashSet<(String, String, &'static str)>,
}

impl RdmaCounters {
    /// Reads `<sys_root>/class/infiniband` (`sys_root` is `/sys` on a host; tests point it at
    /// a fixture tree).
    pub fn new(sys_root: &Path) -> Self {
        Self {
            class_dir: sys_root.join("class").join("infiniband"),
            seen: HashSet::new(),
            ports: HashMap::new(),
            events_seen: HashSet::new(),
        }
    }

    /// The directory scanned (`<sys_root>/class/infiniband`).
    pub fn class_dir(&self) -> &Path {
        &self.class_dir
    }

    /// Appends one sample per series to `out`. No RDMA devices → `Ok` with nothing appended.
    /// Files that cannot be read or parsed are skipped and listed in [`RdmaScan::skipped`],
    /// each marked [`SkippedFile::first`] the first time it is met with that reason. Port
    /// state and GID changes since the previous collection are in [`RdmaScan::events`].
    ///
    /// # Errors
    /// [`RdmaError`] when a directory that exists cannot be listed; nothing is appended then
    /// and the remembered port states are kept for the next collection.
    pub fn collect_into(&mut self, out: &mut Vec<Metric>) -> Result<RdmaScan, RdmaError> {
        let mark = out.len();
        let mut seen_ports = Vec::new();
        let result = self.scan(out, &mut seen_ports);
        match result {
            Ok(mut scan) => {
                scan.events = self.compare(seen_ports);
                scan.samples = out.len() - mark;
                for f in &mut scan.skipped {
                    let key = (f.path.clone(), f.reason);
                    f.first = !self.seen.contains(&key) && self.seen.len() < MAX_REMEMBERED;
                    if f.first {
                        self.seen.insert(key);
                    }
                }
                Ok(scan)
            }
            Err(e) => {
                out.truncate(mark);
                Err(e)
            }
        }
    }

    /// Compares what this collection read of each port with the previous one, remembers it,
    /// and forgets the ports that are gone.
    fn compare(&mut self, now: Vec<((String, String), PortMemory)>) -> Vec<PortEvent> {
        let mut events = Vec::new();
        let mut next = HashMap::with_capacity(now.len());
        for (key, mut mem) in now {
            if let Some(before) = self.ports.get(&key) {
                let mut push = |change: PortChange| {
                    events.push(PortEvent {
                        device: key.0.clone(),
                        port: key.1.clone(),
                        change,
                        first: false,
                    });
                };
                match (before.state, mem.state) {
                    (Some(from), Some(to)) if from != to => push(PortChange::State { from, to }),
                    (Some(from), None) => mem.state = Some(from),
                    _ => {}
                }
                if let (Some(old), Some(new)) = (&before.gids, &mem.gids) {
                    for change in gid_changes(old, new) {
                        push(change);
                    }
                }
            }
            next.insert(key, mem);
        }
        self.ports = next;
        for e in &mut events {
            let key = (e.device.clone(), e.port.clone(), e.change.kind());
            e.first = !self.events_seen.contains(&key) && self.events_seen.len() < MAX_REMEMBERED;
            if e.first {
                self.events_seen.insert(key);
            }
        }
        events
    }

    fn scan(
        &self,
        out: &mut Vec<Metric>,
        seen_ports: &mut Vec<((String, String), PortMemory)>,
    ) -> Result<RdmaScan, RdmaError> {
        let mut scan = RdmaScan::default();
        let Some(devices) = list_dir(&self.class_dir)? else {
            return Ok(scan);
        };
        for device in devices {
            let dev_dir = self.class_dir.join(&device);
            scan.devices += 1;
            let attr = |name: &str| read_trimmed(&dev_dir.join(name)).unwrap_or_default();
            out.push(gauge(
                "node_infiniband_info",
                "Non-numeric data from /sys/class/infiniband/<device>, value is always 1.",
                &[
                    ("device", &device),
                    ("board_id", &attr("board_id")),
                    ("firmware_version", &attr("fw_ver")),
                    ("hca_type", &attr("hca_type")),
                ],
                1.0,
            ));
            let ports_dir = dev_dir.join("ports");
            let Some(ports) = list_dir(&ports_dir)? else {
                continue;
            };
            for port in ports.iter().filter(|p| p.parse::<u32>().is_ok()) {
                scan.ports += 1;
                let mem = self.port(&device, port, &ports_dir.join(port), out, &mut scan)?;
                seen_ports.push(((device.clone(), port.clone()), mem));
            }
        }
        Ok(scan)
    }

    fn port(
        &self,
        device: &str,
        port: &str,
        dir: &Path,
        out: &mut Vec<Metric>,
        scan: &mut RdmaScan,
    ) -> Result<PortMemory, RdmaError> {
        let labels = [("device", device), ("port", port)];
        let mut mem = PortMemory::default();
        let states = [
            (
                "state",
                "node_infiniband_state_id",
                "State of the InfiniBand port (0: no change, 1: down, 2: init, 3: armed, 4: active, 5: act defer)",
            ),
            (
                "phys_state",
                "node_infiniband_physical_state_id",
                "Physical state of the InfiniBand port (0: no change, 1: sleep, 2: polling, 3: disable, 4: shift, 5: link up, 6: link error recover, 7: phytest)",
            ),
        ];
        for (file, name, help) in states {
            if let Some(id) = read_value(&dir.join(file), parse_state_id, scan) {
                out.push(gauge(name, help, &labels, id as f64));
                if file == "state" {
                    mem.state = Some(PortState(id));
                }
            }
        }
        if let Some(rate) = read_value(&dir.join("rate"), parse_rate_bytes_per_second, scan) {
            out.push(gauge(
                "node_infiniband_rate_bytes_per_second",
                "Maximum signal transfer rate",
                &labels,
                rate,
            ));
        }

        for (sub, table) in [
            ("counters", PORT_COUNTERS),
            ("counters_ext", PORT_COUNTERS_EXT),
        ] {
            let sub_dir = dir.join(sub);
            let Some(files) = list_dir(&sub_dir)? else {
                continue;
            };
            for file in files {
                let Some((_, name, help, mult)) = table.iter().find(|(f, ..)| *f == file) else {
                    continue; // node_exporter exports only the counters it knows
                };
                if let Some(v) = read_value(&sub_dir.join(&file), parse_u64, scan) {
                    out.push(counter(
                        format!("node_infiniband_{name}"),
                        help,
                        &labels,
                        v.saturating_mul(*mult) as f64,
                    ));
                }
            }
        }

        let hw_dir = dir.join("hw_counters");
        if let Some(files) = list_dir(&hw_dir)? {
            for file in files {
                let path = hw_dir.join(&file);
                if !path.is_file() {
                    continue;
                }
                if let Some(v) = read_value(&path, parse_u64, scan) {
                    out.push(counter(
                        format!("node_infiniband_{}", sanitize_name_part(&file)),
                        &format!("Number of {file}."),
                        &labels,
                        v as f64,
                    ));
                }
            }
        }
        mem.gids = read_gids(dir, scan)?;
        Ok(mem)
    }
}

/// The non-empty entries of `<port>/gids/`, with their type and net device; `None` when the
/// port has no `gids/` directory.
fn read_gids(
    port_dir: &Path,
    scan: &mut RdmaScan,
) -> Result<Option<BTreeMap<u32, GidEntry>>, RdmaError> {
    let gids_dir = port_dir.join("gids");
    let Some(files) = list_dir(&gids_dir)? else {
        return Ok(None);
    };
    let attrs = port_dir.join("gid_attrs");
    let mut table = BTreeMap::new();
    for file in files {
        let Ok(index) = file.parse::<u32>() else {
            continue;
        };
        // An empty or reserved entry: the zero GID, or EINVAL/EAGAIN on older kernels.
        let Ok(text) = std::fs::read_to_string(gids_dir.join(&file)) else {
            continue;
        };
        let text = text.trim();
        let Ok(addr) = text.parse::<std::net::Ipv6Addr>() else {
            scan.skipped.push(SkippedFile {
                path: gids_dir.join(&file),
                reason: SkipReason::ParseError,
                detail: text.chars().take(DETAIL_CHARS).collect(),
                first: false,
            });
            continue;
        };
        if addr.is_unspecified() {
            continue;
        }
        let attr = |sub: &str| read_trimmed(&attrs.join(sub).join(&file)).unwrap_or_default();
        table.insert(
            index,
            GidEntry {
                gid: text.to_owned(),
                gid_type: attr("types"),
                ndev: attr("ndevs"),
            },
        );
    }
    Ok(Some(table))
}

/// The entries added, removed or replaced from `old` to `new`, by index.
fn gid_changes(old: &BTreeMap<u32, GidEntry>, new: &BTreeMap<u32, GidEntry>) -> Vec<PortChange> {
    let mut indexes: Vec<u32> = old.keys().chain(new.keys()).copied().collect();
    indexes.sort_unstable();
    indexes.dedup();
    indexes
        .into_iter()
        .filter_map(|index| {
            let (from, to) = (old.get(&index), new.get(&index));
            (from != to).then(|| PortChange::Gid {
                index,
                from: from.cloned(),
                to: to.cloned(),
            })
        })
        .collect()
}

/// Sorted entry names of `dir`; `None` when it does not exist.
fn list_dir(dir: &Path) -> Result<Option<Vec<String>>, RdmaError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(RdmaError {
                path: dir.to_owned(),
                source,
            })
        }
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| RdmaError {
            path: dir.to_owned(),
            source,
        })?;
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    Ok(Some(names))
}

fn read_trimmed(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
}

/// Reads and parses the value file `path`. A missing file is `None` silently; one that
/// cannot be read or parsed is `None` and listed in `scan.skipped` (not yet marked `first`).
fn read_value<T>(
    path: &Path,
    parse: impl FnOnce(&str) -> Option<T>,
    scan: &mut RdmaScan,
) -> Option<T> {
    let (reason, detail) = match std::fs::read_to_string(path) {
        Ok(text) => {
            let text = text.trim();
            if let Some(v) = parse(text) {
                return Some(v);
            }
            let reason = if text.starts_with("N/A") {
                SkipReason::NotAvailable
            } else {
                SkipReason::ParseError
            };
            (reason, text.chars().take(DETAIL_CHARS).collect())
        }
        Err(e) if e.kind() == ErrorKind::NotFound => return None,
        Err(e) if e.kind() == ErrorKind::InvalidData => {
            (SkipReason::ParseError, "not UTF-8".to_owned())
        }
        Err(e) => (SkipReason::ReadError, e.to_string()),
    };
    scan.skipped.push(SkippedFile {
        path: path.to_owned(),
        reason,
        detail,
        first: false,
    });
    None
}

fn parse_u64(s: &str) -> Option<u64> {
    s.trim().parse().ok()
}

/// `"4: ACTIVE"` → 4 (sysfs-class-infiniband `state` and `phys_state`).
pub fn parse_state_id(s: &str) -> Option<u32> {
    let (id, _name) = s.split_once(':')?;
    id.trim().parse().ok()
}

/// `"100 Gb/sec (4X EDR)"` → 12 500 000 000 bytes/s (Gb/s × 125 000 000, as node_exporter).
pub fn parse_rate_bytes_per_second(s: &str) -> Option<f64> {
    let gbps: f64 = s.split_whitespace().next()?.parse().ok()?;
    (gbps.is_finite() && gbps >= 0.0).then_some(gbps * 125_000_000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_and_rate_parse() {
        assert_eq!(parse_state_id("4: ACTIVE"), Some(4));
        assert_eq!(parse_state_id("5: LinkUp"), Some(5));
        assert_eq!(parse_state_id("ACTIVE"), None);
        assert_eq!(
            parse_rate_bytes_per_second("100 Gb/sec (4X EDR)"),
            Some(12_500_000_000.0)
        );
        assert_eq!(
            parse_rate_bytes_per_second("2.5 Gb/sec (1X SDR)"),
            Some(312_500_000.0)
        );
        assert_eq!(parse_rate_bytes_per_second("fast"), None);
        assert_eq!(parse_rate_bytes_per_second(""), None);
    }

    fn write(path: &Path, contents: &str) {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap_or_else(|e| panic!("{e}"));
        }
        std::fs::write(path, contents).unwrap_or_else(|e| panic!("{e}"));
    }

    fn brief(scan: &RdmaScan, root: &Path) -> Vec<(String, SkipReason, bool)> {
        scan.skipped
            .iter()
            .map(|f| {
                let rel = f.path.strip_prefix(root).unwrap_or(&f.path);
                (rel.display().to_string(), f.reason, f.first)
            })
            .collect()
    }

    #[test]
    fn skipped_files_are_listed_with_reason_and_first_only_once() {
        let sys = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let port = sys.path().join("class/infiniband/mlx5_0/ports/1");
        write(&port.join("state"), "4: ACTIVE\n");
        write(&port.join("rate"), "fast\n");
        write(&port.join("counters/port_rcv_data"), "100\n");
        write(&port.join("counters/symbol_error"), "N/A (no PMA)\n");
        // A read error that does not depend on permissions (tests may run as root).
        std::fs::create_dir_all(port.join("counters/port_xmit_data"))
            .unwrap_or_else(|e| panic!("{e}"));
        write(&port.join("hw_counters/out_of_buffer"), "7\n");
        write(&port.join("hw_counters/rx_icrc_encapsulated"), "N/A\n");

        let mut rdma = RdmaCounters::new(sys.path());
        let mut out = Vec::new();
        let scan = rdma
            .collect_into(&mut out)
            .unwrap_or_else(|e| panic!("{e}"));
        let dev = "class/infiniband/mlx5_0/ports/1";
        let expect = |first: bool| {
            vec![
                (format!("{dev}/rate"), SkipReason::ParseError, first),
                (
                    format!("{dev}/counters/port_xmit_data"),
                    SkipReason::ReadError,
                    first,
                ),
                (
                    format!("{dev}/counters/symbol_error"),
                    SkipReason::NotAvailable,
                    first,
                ),
                (
                    format!("{dev}/hw_counters/rx_icrc_encapsulated"),
                    SkipReason::NotAvailable,
                    first,
                ),
            ]
        };
        assert_eq!(brief(&scan, sys.path()), expect(true), "{scan:#?}");
        assert_eq!(scan.skipped[0].detail, "fast");
        assert_eq!(scan.skipped[2].detail, "N/A (no PMA)");
        // The good files still give their series.
        let names: Vec<&str> = out.iter().map(|m| m.name.as_str()).collect();
        assert!(names.contains(&"node_infiniband_state_id"), "{names:?}");
        assert!(names.contains(&"node_infiniband_port_data_received_bytes_total"));
        assert!(names.contains(&"node_infiniband_out_of_buffer"));
        assert!(!names.contains(&"node_infiniband_symbol_error_total"));

        // The next collection skips the same files, but none of them is new.
        let again = rdma
            .collect_into(&mut Vec::new())
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(brief(&again, sys.path()), expect(false));

        // The same path failing for another reason is a new problem; a fixed file is gone.
        write(&port.join("counters/symbol_error"), "many\n");
        write(&port.join("rate"), "100 Gb/sec (4X EDR)\n");
        let third = rdma
            .collect_into(&mut Vec::new())
            .unwrap_or_else(|e| panic!("{e}"));
        let b = brief(&third, sys.path());
        assert_eq!(b.len(), 3, "{b:?}");
        assert!(b.contains(&(
            format!("{dev}/counters/symbol_error"),
            SkipReason::ParseError,
            true
        )));
        assert!(b.contains(&(
            format!("{dev}/counters/port_xmit_data"),
            SkipReason::ReadError,
            false
        )));
    }

    const ZERO_GID: &str = "0000:0000:0000:0000:0000:0000:0000:0000";
    const LINK_LOCAL: &str = "fe80:0000:0000:0000:0000:0000:0000:0001";
    const V4_MAPPED: &str = "0000:0000:0000:0000:0000:ffff:0a4d:0001";

    fn changes(scan: &RdmaScan) -> Vec<(String, PortChange, bool)> {
        scan.events
            .iter()
            .map(|e| {
                (
                    format!("{}/{}", e.device, e.port),
                    e.change.clone(),
                    e.first,
                )
            })
            .collect()
    }

    fn entry(gid: &str, gid_type: &str, ndev: &str) -> GidEntry {
        GidEntry {
            gid: gid.to_owned(),
            gid_type: gid_type.to_owned(),
            ndev: ndev.to_owned(),
        }
    }

    #[test]
    fn port_state_and_gid_changes_after_the_baseline() {
        let sys = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let port = sys.path().join("class/infiniband/rxe0/ports/1");
        write(&port.join("state"), "4: ACTIVE\n");
        write(&port.join("gids/0"), &format!("{LINK_LOCAL}\n"));
        write(&port.join("gid_attrs/types/0"), "RoCE v2\n");
        write(&port.join("gid_attrs/ndevs/0"), "v0\n");
        write(&port.join("gids/1"), &format!("{ZERO_GID}\n"));
        let mut rdma = RdmaCounters::new(sys.path());
        let mut collect = || {
            rdma.collect_into(&mut Vec::new())
                .unwrap_or_else(|e| panic!("{e}"))
        };

        let baseline = collect();
        assert!(baseline.events.is_empty(), "{baseline:?}");
        assert!(baseline.skipped.is_empty(), "{baseline:?}");
        assert!(collect().events.is_empty(), "nothing changed");

        // The port goes down, an address is added (GID 1), GID 0 changes type.
        write(&port.join("state"), "1: DOWN\n");
        write(&port.join("gids/1"), &format!("{V4_MAPPED}\n"));
        write(&port.join("gid_attrs/types/1"), "RoCE v2\n");
        write(&port.join("gid_attrs/ndevs/1"), "v0\n");
        write(&port.join("gid_attrs/types/0"), "IB/RoCE v1\n");
        let p = "rxe0/1".to_owned();
        assert_eq!(
            changes(&collect()),
            vec![
                (
                    p.clone(),
                    PortChange::State {
                        from: PortState(4),
                        to: PortState(1)
                    },
                    true
                ),
                (
                    p.clone(),
                    PortChange::Gid {
                        index: 0,
                        from: Some(entry(LINK_LOCAL, "RoCE v2", "v0")),
                        to: Some(entry(LINK_LOCAL, "IB/RoCE v1", "v0")),
                    },
                    true
                ),
                (
                    p.clone(),
                    PortChange::Gid {
                        index: 1,
                        from: None,
                        to: Some(entry(V4_MAPPED, "RoCE v2", "v0")),
                    },
                    false
                ),
            ]
        );
        assert!(collect().events.is_empty(), "the new state is remembered");

        // Back up, the address removed (the kernel then reads the zero GID again): changes
        // of kinds already reported on this port are not `first`.
        write(&port.join("state"), "4: ACTIVE\n");
        write(&port.join("gids/1"), &format!("{ZERO_GID}\n"));
        assert_eq!(
            changes(&collect()),
            vec![
                (
                    p.clone(),
                    PortChange::State {
                        from: PortState(1),
                        to: PortState(4)
                    },
                    false
                ),
                (
                    p.clone(),
                    PortChange::Gid {
                        index: 1,
                        from: Some(entry(V4_MAPPED, "RoCE v2", "v0")),
                        to: None,
                    },
                    false
                ),
            ]
        );

        // An unreadable state keeps the remembered one; a GID that is no address is skipped.
        write(&port.join("state"), "N/A\n");
        write(&port.join("gids/1"), "garbage\n");
        let odd = collect();
        assert!(odd.events.is_empty(), "{odd:?}");
        let reasons: Vec<SkipReason> = odd.skipped.iter().map(|f| f.reason).collect();
        assert_eq!(
            reasons,
            [SkipReason::NotAvailable, SkipReason::ParseError],
            "{odd:?}"
        );
        write(&port.join("state"), "4: ACTIVE\n");
        write(&port.join("gids/1"), &format!("{ZERO_GID}\n"));
        assert!(collect().events.is_empty());

        // A port that disappears is forgotten: when it comes back it is a new baseline.
        std::fs::rename(&port, sys.path().join("away")).unwrap_or_else(|e| panic!("{e}"));
        assert!(collect().events.is_empty());
        write(&port.join("state"), "1: DOWN\n");
        assert!(collect().events.is_empty(), "baseline again");
    }

    #[test]
    fn port_state_names_are_the_kernels() {
        let names: Vec<&str> = (0..7).map(|i| PortState(i).name()).collect();
        assert_eq!(
            names,
            [
                "nop",
                "down",
                "init",
                "armed",
                "active",
                "active_defer",
                "unknown"
            ]
        );
    }

    #[test]
    fn skip_reason_names_are_unique_and_indexed() {
        for (i, r) in SkipReason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
        }
        let mut names: Vec<&str> = SkipReason::ALL.iter().map(|r| r.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), SkipReason::ALL.len());
    }

    #[test]
    fn missing_class_dir_is_no_series_and_no_error() {
        let dir = std::env::temp_dir().join("uctel-rdma-test-surely-absent-dir");
        let mut out = Vec::new();
        let scan = RdmaCounters::new(&dir)
            .collect_into(&mut out)
            .expect("absent is fine");
        assert_eq!(scan, RdmaScan::default());
        assert!(out.is_empty());
    }
}
