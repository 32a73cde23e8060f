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
//! `hw_counters` are driver specific (mlx5: `out_of_buffer`, `packet_seq_err`, …; rxe:
//! `rcvd_seq_err`, `duplicate_request`, …). node_exporter exports a fixed list of them as
//! `node_infiniband_<name>` counters and only for `mlx5_*`/`irdma*` devices; this module exports
//! every file of every device under the same naming rule (a superset: the names node_exporter
//! knows come out identical). Like node_exporter, gauge-like entries such as `active_qps` or
//! `lifespan` keep the counter type, so series are identical to node_exporter's.
//!
//! A missing `class/infiniband` directory (no RDMA devices) yields no series and no error. A file
//! that cannot be read or parsed (`N/A (no PMA)`, EINVAL from the driver) is skipped and counted in
//! [`RdmaScan::skipped_files`]; it never hides the other series.

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
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// What one [`RdmaCounters::collect_into`] found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RdmaScan {
    /// RDMA devices (`class/infiniband/*`).
    pub devices: usize,
    /// Ports across all devices.
    pub ports: usize,
    /// Samples appended.
    pub samples: usize,
    /// Files present but unreadable or unparsable, skipped.
    pub skipped_files: usize,
}

/// Reads RDMA port and hw counters; see the module documentation.
#[derive(Debug, Clone)]
pub struct RdmaCounters {
    class_dir: PathBuf,
}

impl RdmaCounters {
    /// Reads `<sys_root>/class/infiniband`.
    pub fn new(sys_root: &Path) -> Self {
        Self {
            class_dir: sys_root.join("class").join("infiniband"),
        }
    }

    /// The directory scanned (`<sys_root>/class/infiniband`).
    pub fn class_dir(&self) -> &Path {
        &self.class_dir
    }

    /// Appends one sample per series to `out`. No RDMA devices → `Ok` with nothing appended.
    ///
    /// # Errors
    /// [`RdmaError`] when a directory that exists cannot be listed; nothing is appended then.
    pub fn collect_into(&self, out: &mut Vec<Metric>) -> Result<RdmaScan, RdmaError> {
        let mark = out.len();
        let result = self.scan(out);
        match result {
            Ok(mut scan) => {
                scan.samples = out.len() - mark;
                Ok(scan)
            }
            Err(e) => {
                out.truncate(mark);
                Err(e)
            }
        }
    }

    fn scan(&self, out: &mut Vec<Metric>) -> Result<RdmaScan, RdmaError> {
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
                self.port(&device, port, &ports_dir.join(port), out, &mut scan)?;
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
    ) -> Result<(), RdmaError> {
        let labels = [("device", device), ("port", port)];
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
            match read_trimmed(&dir.join(file))
                .as_deref()
                .and_then(parse_state_id)
            {
                Some(id) => out.push(gauge(name, help, &labels, id as f64)),
                None => scan.skipped_files += usize::from(dir.join(file).exists()),
            }
        }
        match read_trimmed(&dir.join("rate"))
            .as_deref()
            .and_then(parse_rate_bytes_per_second)
        {
            Some(rate) => out.push(gauge(
                "node_infiniband_rate_bytes_per_second",
                "Maximum signal transfer rate",
                &labels,
                rate,
            )),
            None => scan.skipped_files += usize::from(dir.join("rate").exists()),
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
                match read_trimmed(&sub_dir.join(&file))
                    .as_deref()
                    .and_then(parse_u64)
                {
                    Some(v) => out.push(counter(
                        format!("node_infiniband_{name}"),
                        help,
                        &labels,
                        v.saturating_mul(*mult) as f64,
                    )),
                    None => scan.skipped_files += 1,
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
                match read_trimmed(&path).as_deref().and_then(parse_u64) {
                    Some(v) => out.push(counter(
                        format!("node_infiniband_{}", sanitize_name_part(&file)),
                        &format!("Number of {file}."),
                        &labels,
                        v as f64,
                    )),
                    None => scan.skipped_files += 1,
                }
            }
        }
        Ok(())
    }
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
