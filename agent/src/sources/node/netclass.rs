//! node_exporter's `netclass` collector (`collector/netclass_linux.go` and the `procfs`
//! library's `sysfs/net_class.go`): the attributes of every `<sys>/class/net/<iface>`.

use std::io::ErrorKind;
use std::path::Path;
use uctel_protocol::payload::Metric;

use super::files::{list_dir, read_text};
use super::NodeError;
use crate::sources::metric::{counter, gauge};

/// One `/sys/class/net/<iface>` attribute: `None` when it does not exist or the driver refuses
/// to read it (`EINVAL`, `EOPNOTSUPP`, as for `speed` and `carrier` of a virtual or down
/// interface) or it may not be read, as the `procfs` library skips those; and when it is not a
/// file (the library reads only the directory's regular files).
fn net_attr(dir: &Path, name: &str) -> Result<Option<String>, NodeError> {
    const EISDIR: i32 = 21;
    const EINVAL: i32 = 22;
    const EOPNOTSUPP: i32 = 95;
    let path = dir.join(name);
    match read_text(&path) {
        Ok(text) => Ok(Some(text.trim().to_owned())),
        Err(e)
            if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::PermissionDenied)
                || matches!(e.raw_os_error(), Some(EISDIR | EINVAL | EOPNOTSUPP)) =>
        {
            Ok(None)
        }
        Err(source) => Err(NodeError::Read { path, source }),
    }
}

/// An integer as Go's `strconv.ParseInt(text, 0, 64)` reads it: an optional sign, then a
/// `0x`, `0o`, `0b` or `0` (octal) prefix or decimal, `_` allowed between digits.
fn go_int(text: &str) -> Option<i64> {
    let (negative, body) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let lower = body.to_ascii_lowercase();
    let (radix, digits, prefixed) = if let Some(d) = lower.strip_prefix("0x") {
        (16, d, true)
    } else if let Some(d) = lower.strip_prefix("0b") {
        (2, d, true)
    } else if let Some(d) = lower.strip_prefix("0o") {
        (8, d, true)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, &lower[1..], true)
    } else {
        (10, lower.as_str(), false)
    };
    let bad_underscore =
        digits.ends_with('_') || digits.contains("__") || (!prefixed && digits.starts_with('_'));
    let clean: String = digits.chars().filter(|c| *c != '_').collect();
    if bad_underscore || clean.is_empty() || clean.starts_with(['+', '-']) {
        return None;
    }
    let magnitude = u64::from_str_radix(&clean, radix).ok()?;
    if negative {
        0i64.checked_sub_unsigned(magnitude)
    } else {
        i64::try_from(magnitude).ok()
    }
}

/// A numeric attribute, read as the `procfs` library 1.5 uses does: [`go_int`], and 0 when
/// the text is not such a number (or is out of range).
fn net_int(dir: &Path, name: &str) -> Result<Option<i64>, NodeError> {
    Ok(net_attr(dir, name)?.map(|text| go_int(&text).unwrap_or(0)))
}

/// `netclass` series after `node_network_up` and `_info`: (series name, attribute file,
/// counter), in node_exporter's order.
const NETCLASS_FIELDS: [(&str, &str, bool); 17] = [
    ("address_assign_type", "addr_assign_type", false),
    ("carrier", "carrier", false),
    ("carrier_changes_total", "carrier_changes", true),
    ("carrier_up_changes_total", "carrier_up_count", true),
    ("carrier_down_changes_total", "carrier_down_count", true),
    ("device_id", "dev_id", false),
    ("dormant", "dormant", false),
    ("flags", "flags", false),
    ("iface_id", "ifindex", false),
    ("iface_link", "iflink", false),
    ("iface_link_mode", "link_mode", false),
    ("mtu_bytes", "mtu", false),
    ("name_assign_type", "name_assign_type", false),
    ("net_dev_group", "netdev_group", false),
    ("speed_bytes", "speed", false),
    ("transmit_queue_length", "tx_queue_len", false),
    ("protocol_type", "type", false),
];

/// `netclass`: `<sys>/class/net/<iface>/*` → `node_network_up`, `node_network_info` and one
/// `node_network_<property>` per readable attribute, for every interface (node_exporter's
/// default `--collector.netclass.ignored-devices` is `^$`, which ignores none).
/// `node_network_speed_bytes` is `speed` × 125000, -125000 where the driver reports -1.
pub fn netclass(sys: &Path, out: &mut Vec<Metric>) -> Result<(), NodeError> {
    let class = sys.join("class/net");
    for device in list_dir(&class, true)? {
        let dir = class.join(&device);
        let text = |name: &str| net_attr(&dir, name).map(Option::unwrap_or_default);
        let operstate = text("operstate")?;
        let (address, broadcast) = (text("address")?, text("broadcast")?);
        let (duplex, ifalias) = (text("duplex")?, text("ifalias")?);
        let labels = [("device", device.as_str())];
        out.push(gauge(
            "node_network_up",
            "Value is 1 if operstate is 'up', 0 otherwise.",
            &labels,
            if operstate == "up" { 1.0 } else { 0.0 },
        ));
        out.push(gauge(
            "node_network_info",
            "Non-numeric data from /sys/class/net/<iface>, value is always 1.",
            &[
                ("address", &address),
                ("broadcast", &broadcast),
                ("device", &device),
                ("duplex", &duplex),
                ("ifalias", &ifalias),
                ("operstate", &operstate),
            ],
            1.0,
        ));
        for (name, file, is_counter) in &NETCLASS_FIELDS {
            let Some(mut value) = net_int(&dir, file)? else {
                continue;
            };
            if *name == "speed_bytes" {
                value = value.wrapping_mul(1000 * 1000) / 8;
            }
            let (series, help) = (
                format!("node_network_{name}"),
                format!("Network device property: {name}"),
            );
            out.push(if *is_counter {
                counter(series, &help, &labels, value as f64)
            } else {
                gauge(series, &help, &labels, value as f64)
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{help_of, lines, tree};
    use super::*;

    #[test]
    fn netclass_reads_every_interface_and_skips_absent_attributes() {
        let eth0 = [
            ("addr_assign_type", "3\n"),
            ("address", "01:01:01:01:01:01\n"),
            ("broadcast", "ff:ff:ff:ff:ff:ff\n"),
            ("carrier", "1\n"),
            ("carrier_changes", "2\n"),
            ("carrier_up_count", "1\n"),
            ("carrier_down_count", "1\n"),
            ("dev_id", "0x20\n"),
            ("dormant", "1\n"),
            ("duplex", "full\n"),
            ("flags", "0x1303\n"),
            ("ifalias", "\n"),
            ("ifindex", "2\n"),
            ("iflink", "2\n"),
            ("link_mode", "1\n"),
            ("mtu", "1500\n"),
            ("name_assign_type", "2\n"),
            ("netdev_group", "0\n"),
            ("operstate", "up\n"),
            ("speed", "1000\n"),
            ("tx_queue_len", "1000\n"),
            ("type", "1\n"),
        ];
        let mut files: Vec<(String, &str)> = eth0
            .iter()
            .map(|(f, v)| (format!("class/net/eth0/{f}"), *v))
            .collect();
        // A virtual interface: no speed, carrier, duplex or name_assign_type; speed -1.
        for (f, v) in [
            ("address", "00:00:00:00:00:00\n"),
            ("operstate", "unknown\n"),
            ("mtu", "65536\n"),
            ("type", "772\n"),
        ] {
            files.push((format!("class/net/lo/{f}"), v));
        }
        files.push(("class/net/virt0/speed".to_owned(), "-1\n"));
        files.push(("class/net/bonding_masters".to_owned(), "bond0\n"));
        let refs: Vec<(&str, &str)> = files.iter().map(|(p, v)| (p.as_str(), *v)).collect();
        let d = tree(&refs);
        let mut out = Vec::new();
        netclass(d.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            lines(&out),
            [
                "node_network_up{device=\"eth0\"} gauge 1",
                "node_network_info{address=\"01:01:01:01:01:01\",broadcast=\"ff:ff:ff:ff:ff:ff\",\
                 device=\"eth0\",duplex=\"full\",ifalias=\"\",operstate=\"up\"} gauge 1",
                "node_network_address_assign_type{device=\"eth0\"} gauge 3",
                "node_network_carrier{device=\"eth0\"} gauge 1",
                "node_network_carrier_changes_total{device=\"eth0\"} counter 2",
                "node_network_carrier_up_changes_total{device=\"eth0\"} counter 1",
                "node_network_carrier_down_changes_total{device=\"eth0\"} counter 1",
                "node_network_device_id{device=\"eth0\"} gauge 32",
                "node_network_dormant{device=\"eth0\"} gauge 1",
                "node_network_flags{device=\"eth0\"} gauge 4867",
                "node_network_iface_id{device=\"eth0\"} gauge 2",
                "node_network_iface_link{device=\"eth0\"} gauge 2",
                "node_network_iface_link_mode{device=\"eth0\"} gauge 1",
                "node_network_mtu_bytes{device=\"eth0\"} gauge 1500",
                "node_network_name_assign_type{device=\"eth0\"} gauge 2",
                "node_network_net_dev_group{device=\"eth0\"} gauge 0",
                "node_network_speed_bytes{device=\"eth0\"} gauge 125000000",
                "node_network_transmit_queue_length{device=\"eth0\"} gauge 1000",
                "node_network_protocol_type{device=\"eth0\"} gauge 1",
                "node_network_up{device=\"lo\"} gauge 0",
                "node_network_info{address=\"00:00:00:00:00:00\",broadcast=\"\",device=\"lo\",\
                 duplex=\"\",ifalias=\"\",operstate=\"unknown\"} gauge 1",
                "node_network_mtu_bytes{device=\"lo\"} gauge 65536",
                "node_network_protocol_type{device=\"lo\"} gauge 772",
                "node_network_up{device=\"virt0\"} gauge 0",
                "node_network_info{address=\"\",broadcast=\"\",device=\"virt0\",duplex=\"\",\
                 ifalias=\"\",operstate=\"\"} gauge 1",
                "node_network_speed_bytes{device=\"virt0\"} gauge -125000",
            ]
        );
        assert_eq!(
            help_of(&out, "node_network_info"),
            Some("Non-numeric data from /sys/class/net/<iface>, value is always 1.")
        );
        assert_eq!(
            help_of(&out, "node_network_up"),
            Some("Value is 1 if operstate is 'up', 0 otherwise.")
        );
        assert_eq!(
            help_of(&out, "node_network_speed_bytes"),
            Some("Network device property: speed_bytes")
        );
        // No class/net: a failure; an attribute that is a directory: skipped.
        assert!(netclass(tree(&[]).path(), &mut Vec::new()).is_err());
        let dir = tree(&[
            ("class/net/eth0/mtu/x", "1\n"),
            ("class/net/eth0/type", "1\n"),
        ]);
        let mut out = Vec::new();
        netclass(dir.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert!(out.iter().all(|s| s.name != "node_network_mtu_bytes"));
        assert!(out.iter().any(|s| s.name == "node_network_protocol_type"));
        // Numbers as Go's ParseInt with base 0 reads them; what it rejects is 0 (checked
        // against node_exporter 1.5).
        for (text, want) in [
            ("010", 8),
            ("0x1003", 4099),
            ("0X1f", 31),
            ("0x_1f", 31),
            ("0b11", 3),
            ("0o17", 15),
            ("0_7", 7),
            ("1_000", 1000),
            ("-0x10", -16),
            ("+5", 5),
            ("-9223372036854775808", i64::MIN),
            ("x", 0),
            ("08", 0),
            ("1__0", 0),
            ("0x", 0),
            ("", 0),
            ("99999999999999999999", 0),
            ("-99999999999999999999", 0),
        ] {
            let d = tree(&[("class/net/eth0/mtu", &format!("{text}\n"))]);
            let mut out = Vec::new();
            netclass(d.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
            let mtu = out.iter().find(|s| s.name == "node_network_mtu_bytes");
            assert_eq!(mtu.map(|s| s.value), Some(want as f64), "{text:?}");
        }
    }

    #[test]
    fn netclass_skips_attributes_the_driver_refuses() {
        // On Linux, /sys/class/net/lo/speed fails with EINVAL: no speed_bytes for lo.
        let sys = Path::new("/sys");
        if !sys.join("class/net/lo").exists() {
            return;
        }
        let mut out = Vec::new();
        netclass(sys, &mut out).unwrap_or_else(|e| panic!("{e}"));
        let lo = |s: &&Metric| {
            s.labels
                .iter()
                .any(|l| l.name == "device" && l.value == "lo")
        };
        assert!(out
            .iter()
            .filter(lo)
            .any(|s| s.name == "node_network_mtu_bytes"));
        if std::fs::read_to_string("/sys/class/net/lo/speed").is_err() {
            assert!(!out
                .iter()
                .filter(lo)
                .any(|s| s.name == "node_network_speed_bytes"));
        }
    }
}
