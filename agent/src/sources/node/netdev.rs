//! node_exporter's `netdev` collector (`collector/netdev_{common,linux}.go`): per-interface
//! traffic counters from `<proc>/net/dev` and `rx_nohandler` from sysfs.

use std::path::Path;

use procfs::FromRead;
use uctel_protocol::payload::Metric;

use super::files::{format_error, read_text};
use super::NodeError;
use crate::sources::metric::counter;

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

#[cfg(test)]
mod tests {
    use super::super::testutil::{lines, tree};
    use super::*;

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
}
