//! node_exporter's `arp` collector (`collector/arp_linux.go`): the neighbour table entries of
//! each device, from `<proc>/net/arp`.

use std::path::Path;
use uctel_protocol::payload::Metric;

use super::files::{format_error, read};
use super::NodeError;
use crate::sources::metric::gauge;

/// `arp`: `<proc>/net/arp` → `node_arp_entries{device}`, the entries of each device.
pub fn arp(proc: &Path, out: &mut Vec<Metric>) -> Result<(), NodeError> {
    let path = proc.join("net/arp");
    let text = read(&path)?;
    let mut counts: std::collections::BTreeMap<&str, u32> = std::collections::BTreeMap::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // Every line, the header included, has at least six columns, as node_exporter needs.
        if fields.len() < 6 {
            return Err(format_error(&path, format!("unexpected ARP line {line:?}")));
        }
        // The header starts with `IP address`; the device is the last column.
        match (fields.first(), fields.last()) {
            (Some(&"IP"), _) => {}
            (_, Some(device)) => *counts.entry(device).or_default() += 1,
            (_, None) => {}
        }
    }
    for (device, n) in counts {
        out.push(gauge(
            "node_arp_entries",
            "ARP entries by device",
            &[("device", device)],
            f64::from(n),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{help_of, lines, tree};
    use super::*;

    #[test]
    fn arp_counts_entries_per_device() {
        let d = tree(&[(
            "net/arp",
            "IP address       HW type     Flags       HW address            Mask     Device\n\
             192.168.1.1      0x1         0x2         cc:aa:dd:ee:aa:bb     *        eth0\n\
             192.168.1.2      0x1         0x2         bb:cc:dd:ee:ff:aa     *        eth0\n\
             10.0.0.1         0x1         0x2         aa:bb:cc:dd:ee:ff     *        nope0\n",
        )]);
        let mut out = Vec::new();
        arp(d.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            lines(&out),
            [
                "node_arp_entries{device=\"eth0\"} gauge 2",
                "node_arp_entries{device=\"nope0\"} gauge 1",
            ]
        );
        assert_eq!(
            help_of(&out, "node_arp_entries"),
            Some("ARP entries by device")
        );
        // A header only: no series; no file: a failure.
        let empty = tree(&[(
            "net/arp",
            "IP address HW type Flags HW address Mask Device\n",
        )]);
        let mut out = Vec::new();
        arp(empty.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert!(out.is_empty());
        assert!(arp(tree(&[]).path(), &mut Vec::new()).is_err());
        // Fewer than six columns anywhere (an empty line too): a failure, as node_exporter's.
        for bad in [
            "IP address HW type Flags HW address Mask Device\n1.2.3.4 0x1 0x2 aa eth0\n",
            "IP address\n",
            "IP address HW type Flags HW address Mask Device\n\n",
        ] {
            let d = tree(&[("net/arp", bad)]);
            assert!(arp(d.path(), &mut Vec::new()).is_err(), "{bad:?}");
        }
    }
}
