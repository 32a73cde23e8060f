//! node_exporter's `udp_queues` collector (`collector/udp_queues_linux.go` and the `procfs`
//! library's `net_ip_socket.go`): the bytes queued in UDP sockets.

use std::path::Path;

use procfs::FromReadSI;
use uctel_protocol::payload::Metric;

use super::files::format_error;
use super::NodeError;
use crate::sources::metric::gauge;

/// `udp_queues`: `node_udp_queues{ip,queue}`, the bytes queued for sending (`queue="tx"`) and
/// receiving (`rx`) summed over the sockets of `<proc>/net/udp` (`ip="v4"`) and
/// `<proc>/net/udp6` (`v6`). A missing file is skipped, as node_exporter skips it.
///
/// # Errors
/// A file that cannot be read or parsed, or neither file present (node_exporter's "no data").
pub fn udp_queues(proc: &Path, out: &mut Vec<Metric>) -> Result<(), NodeError> {
    let info = procfs::ExplicitSystemInfo {
        boot_time_secs: 0,
        ticks_per_second: 100,
        page_size: 4096,
        is_little_endian: cfg!(target_endian = "little"),
    };
    let mut found = false;
    for (file, ip) in [("udp", "v4"), ("udp6", "v6")] {
        let path = proc.join("net").join(file);
        let f = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => return Err(NodeError::Read { path, source }),
        };
        let entries = procfs::net::UdpNetEntries::from_read(f, &info)
            .map_err(|e| format_error(&path, e.to_string()))?;
        let (tx, rx) = entries.0.iter().fold((0u64, 0u64), |(tx, rx), e| {
            (tx + u64::from(e.tx_queue), rx + u64::from(e.rx_queue))
        });
        const HELP: &str = "Number of allocated memory in the kernel for UDP datagrams in bytes.";
        out.push(gauge(
            "node_udp_queues",
            HELP,
            &[("ip", ip), ("queue", "tx")],
            tx as f64,
        ));
        out.push(gauge(
            "node_udp_queues",
            HELP,
            &[("ip", ip), ("queue", "rx")],
            rx as f64,
        ));
        found = true;
    }
    if !found {
        return Err(format_error(
            &proc.join("net/udp"),
            "neither udp nor udp6 exists",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{lines, tree};
    use super::*;

    #[test]
    fn udp_queues_sum_the_queues_of_every_socket() {
        let udp = "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n\
  1: 00000000:0044 00000000:0000 07 00000010:00000200 00:00000000 00000000     0        0 1 2 0000000000000000 0\n\
  2: 0100007F:0035 00000000:0000 07 00000001:00000000 00:00000000 00000000   101        0 2 2 0000000000000000 0\n";
        let d = tree(&[("net/udp", udp)]);
        let mut out = Vec::new();
        udp_queues(d.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            lines(&out),
            [
                "node_udp_queues{ip=\"v4\",queue=\"tx\"} gauge 17",
                "node_udp_queues{ip=\"v4\",queue=\"rx\"} gauge 512",
            ]
        );
        assert!(udp_queues(tree(&[]).path(), &mut Vec::new()).is_err());
        let bad = tree(&[("net/udp", "header\n  1: garbage\n")]);
        assert!(udp_queues(bad.path(), &mut Vec::new()).is_err());
    }
}
