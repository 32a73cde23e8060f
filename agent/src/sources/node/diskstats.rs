//! node_exporter's `diskstats` collector (`collector/diskstats_linux.go`): the I/O counters
//! of `<proc>/diskstats` and, per disk, its udev properties ([`super::udev`]).

use procfs::FromRead;
use uctel_protocol::payload::Metric;

use super::{parse_error, udev, HostError, HostPaths};
use crate::sources::metric::{counter, gauge};

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

pub(super) fn diskstats(paths: &HostPaths, out: &mut Vec<Metric>) -> Result<(), HostError> {
    let path = paths.proc.join("diskstats");
    let udev_data = paths.rootfs.join("run/udev/data");
    let disks = procfs::DiskStats::from_file(&path).map_err(parse_error(&path))?;
    // Sectors are 512-byte units regardless of the device (Documentation/block/stat.rst);
    // times are milliseconds.
    const SECTOR: f64 = 512.0;
    const MS: f64 = 1.0 / 1000.0;
    for d in disks.0.iter().filter(|d| !disk_device_ignored(&d.name)) {
        let props = udev::properties(&udev_data, d.major, d.minor);
        udev::disk_series(&d.name, d.major, d.minor, &props, out);
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
