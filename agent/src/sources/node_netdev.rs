//! node_exporter's `netdev` and `udp_queues` collectors for
//! [`crate::sources::host::HostMetrics`]: per-interface traffic counters and the bytes queued
//! in UDP sockets.
//!
//! Names, help strings, types and units follow node_exporter 1.5's
//! `collector/netdev_{common,linux}.go` and `udp_queues_linux.go`, and the `/proc/net/udp`
//! parser of its `procfs` library (`net_ip_socket.go`).

use std::path::Path;

use procfs::{FromRead, FromReadSI};
use uctel_protocol::payload::Metric;

use super::metric::{counter, gauge};
use super::node::{format_error, read_text, NodeError};

/// `node_network_<field>_total` name and help of each `/proc/net/dev` field, in the order of
/// the values in [`netdev`] (node_exporter's `netdev_linux.go` field names), spelled out so a
/// collection formats no strings.
const NETDEV_FIELDS: [(&str, &str); 16] = [
    (
        "node_network_receive_bytes_total",
        "Network device statistic receive_bytes.",
    ),
    (
        "node_network_receive_packets_total",
        "Network device statistic receive_packets.",
    ),
    (
        "node_network_receive_errs_total",
        "Network device statistic receive_errs.",
    ),
    (
        "node_network_receive_drop_total",
        "Network device statistic receive_drop.",
    ),
    (
        "node_network_receive_fifo_total",
        "Network device statistic receive_fifo.",
    ),
    (
        "node_network_receive_frame_total",
        "Network device statistic receive_frame.",
    ),
    (
        "node_network_receive_compressed_total",
        "Network device statistic receive_compressed.",
    ),
    (
        "node_network_receive_multicast_total",
        "Network device statistic receive_multicast.",
    ),
    (
        "node_network_transmit_bytes_total",
        "Network device statistic transmit_bytes.",
    ),
    (
        "node_network_transmit_packets_total",
        "Network device statistic transmit_packets.",
    ),
    (
        "node_network_transmit_errs_total",
        "Network device statistic transmit_errs.",
    ),
    (
        "node_network_transmit_drop_total",
        "Network device statistic transmit_drop.",
    ),
    (
        "node_network_transmit_fifo_total",
        "Network device statistic transmit_fifo.",
    ),
    (
        "node_network_transmit_colls_total",
        "Network device statistic transmit_colls.",
    ),
    (
        "node_network_transmit_carrier_total",
        "Network device statistic transmit_carrier.",
    ),
    (
        "node_network_transmit_compressed_total",
        "Network device statistic transmit_compressed.",
    ),
];

/// `netdev`: `node_network_<field>_total{device}` for the 16 fields of `<proc>/net/dev` (the
/// values node_exporter's netlink reader turns back into `/proc/net/dev`'s sums in
/// `netdev_common.go`'s `legacy`), and `node_network_receive_nohandler_total{device}` from
/// `<sys>/class/net/<device>/statistics/rx_nohandler` where the kernel has it (the
/// `rx_nohandler` of `rtnl_link_stats64`, which `/proc/net/dev` does not show).
///
/// # Errors
/// `<proc>/net/dev` cannot be read or parsed.
pub fn netdev(proc: &Path, sys: &Path, out: &mut Vec<Metric>) -> Result<(), NodeError> {
    let path = proc.join("net").join("dev");
    let file = std::fs::File::open(&path).map_err(|source| NodeError::Read {
        path: path.clone(),
        source,
    })?;
    let devices = procfs::net::InterfaceDeviceStatus::from_read(file)
        .map_err(|e| format_error(&path, e.to_string()))?;
    let mut devices: Vec<_> = devices.0.into_values().collect();
    devices.sort_by(|a, b| a.name.cmp(&b.name));
    for d in &devices {
        let values: [u64; NETDEV_FIELDS.len()] = [
            d.recv_bytes,
            d.recv_packets,
            d.recv_errs,
            d.recv_drop,
            d.recv_fifo,
            d.recv_frame,
            d.recv_compressed,
            d.recv_multicast,
            d.sent_bytes,
            d.sent_packets,
            d.sent_errs,
            d.sent_drop,
            d.sent_fifo,
            d.sent_colls,
            d.sent_carrier,
            d.sent_compressed,
        ];
        let labels = [("device", d.name.as_str())];
        for ((name, help), value) in NETDEV_FIELDS.iter().zip(values) {
            out.push(counter(*name, help, &labels, value as f64));
        }
        let nohandler = sys
            .join("class/net")
            .join(&d.name)
            .join("statistics/rx_nohandler");
        if let Some(n) = read_text(&nohandler)
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
        {
            out.push(counter(
                "node_network_receive_nohandler_total",
                "Network device statistic receive_nohandler.",
                &labels,
                n as f64,
            ));
        }
    }
    Ok(())
}

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
    use super::*;

    use super::super::node::tests::{lines, tree};

    #[test]
    fn netdev_names_and_help_follow_the_field_names() {
        let fields = [
            "receive_bytes",
            "receive_packets",
            "receive_errs",
            "receive_drop",
            "receive_fifo",
            "receive_frame",
            "receive_compressed",
            "receive_multicast",
            "transmit_bytes",
            "transmit_packets",
            "transmit_errs",
            "transmit_drop",
            "transmit_fifo",
            "transmit_colls",
            "transmit_carrier",
            "transmit_compressed",
        ];
        assert_eq!(NETDEV_FIELDS.len(), fields.len());
        for ((name, help), field) in NETDEV_FIELDS.iter().zip(fields) {
            assert_eq!(*name, format!("node_network_{field}_total"));
            assert_eq!(*help, format!("Network device statistic {field}."));
        }
    }

    #[test]
    fn nohandler_comes_from_sysfs_where_the_kernel_has_it() {
        let dev = "Inter-|   Receive                                                |  Transmit\n \
                   face |bytes    packets errs drop fifo frame compressed multicast|bytes    \
                   packets errs drop fifo colls carrier compressed\n    \
                   lo: 10 1 0 0 0 0 0 0 10 1 0 0 0 0 0 0\n  \
                   eth0: 20 2 0 0 0 0 0 0 30 3 0 0 0 0 0 0\n";
        let d = tree(&[
            ("proc/net/dev", dev),
            ("sys/class/net/eth0/statistics/rx_nohandler", "7\n"),
        ]);
        let mut out = Vec::new();
        netdev(&d.path().join("proc"), &d.path().join("sys"), &mut out)
            .unwrap_or_else(|e| panic!("{e}"));
        let got = lines(&out);
        assert_eq!(got.len(), 33, "{got:?}");
        assert!(got.contains(
            &"node_network_receive_nohandler_total{device=\"eth0\"} counter 7".to_owned()
        ));
        assert!(got
            .contains(&"node_network_transmit_bytes_total{device=\"eth0\"} counter 30".to_owned()));
        assert!(!got
            .iter()
            .any(|l| l.contains("nohandler") && l.contains("\"lo\"")));
    }

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
