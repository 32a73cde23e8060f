//! node_exporter collectors that read device trees in `/sys` (and `/proc/net/arp`), run by
//! [`crate::sources::host::HostMetrics`]: `arp`, `netclass`, `thermal_zone`, `edac`, `nvme`,
//! `mdadm` (`/proc/mdstat`) and `bonding`.
//!
//! Names, help strings, types and value decoding follow node_exporter 1.5's
//! `collector/{arp,netclass,thermal_zone,edac,nvme,mdadm,bonding}_linux.go` and the parsers of its
//! `procfs` library. What is missing follows node_exporter too: no `/proc/net/arp`, no
//! `/proc/mdstat`, no `/sys/class/net`, no `/sys/class/net/bonding_masters` or no
//! `/sys/class/nvme` fails that collector (`node_scrape_collector_success`
//! 0), while `thermal_zone` and `edac` find their devices by glob, so a machine without any is a
//! success with no series.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use regex::Regex;

use uctel_protocol::payload::Metric;

use super::metric::{counter, gauge};
use super::node::{format_error, read, read_text, NodeError};

/// A sysfs attribute as the `procfs` library's `SysReadFile` returns it: trimmed.
pub(super) fn read_trimmed(path: &Path) -> Result<String, NodeError> {
    Ok(read(path)?.trim().to_owned())
}

fn parse_int<T: std::str::FromStr>(path: &Path, text: &str) -> Result<T, NodeError> {
    text.parse()
        .map_err(|_| format_error(path, format!("not an integer: {text:?}")))
}

/// The entries of `dir` whose name starts with `prefix` followed by a digit (the glob
/// `<prefix>[0-9]*`), sorted like Go's `filepath.Glob`; none when `dir` cannot be listed.
pub(super) fn glob_numbered(dir: &Path, prefix: &str) -> Vec<(String, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<(String, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let rest = name.strip_prefix(prefix)?;
            rest.starts_with(|c: char| c.is_ascii_digit())
                .then(|| (name.clone(), e.path()))
        })
        .collect();
    found.sort();
    found
}

/// The entry names of `dir`, sorted, skipping regular files when `skip_files` (as the
/// `procfs` library lists `/sys/class/net`, where `bonding_masters` is a file).
fn list_dir(dir: &Path, skip_files: bool) -> Result<Vec<String>, NodeError> {
    let entries = std::fs::read_dir(dir).map_err(|source| NodeError::Read {
        path: dir.to_owned(),
        source,
    })?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| NodeError::Read {
            path: dir.to_owned(),
            source,
        })?;
        if skip_files && entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        if let Ok(name) = entry.file_name().into_string() {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

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

/// Whether a read failed with `ENODATA`, which a thermal zone whose sensor is not ready
/// returns; the `procfs` library skips such zones.
fn no_data(e: &NodeError) -> bool {
    const ENODATA: i32 = 61;
    matches!(e, NodeError::Read { source, .. } if source.raw_os_error() == Some(ENODATA))
}

/// `thermal_zone`: `<sys>/class/thermal/thermal_zone[0-9]*` → `node_thermal_zone_temp{type,zone}`
/// (millidegrees / 1000) and `cooling_device[0-9]*` → `node_cooling_device_{cur,max}_state`.
/// A zone needs `type`, `policy` and `temp`; a zone whose sensor answers `ENODATA` is skipped.
pub fn thermal_zone(sys: &Path, out: &mut Vec<Metric>) -> Result<(), NodeError> {
    let dir = sys.join("class/thermal");
    for (name, zone) in glob_numbered(&dir, "thermal_zone") {
        let read_zone = || -> Result<(String, i64), NodeError> {
            let kind = read_trimmed(&zone.join("type"))?;
            read_trimmed(&zone.join("policy"))?;
            let temp_path = zone.join("temp");
            let temp = parse_int(&temp_path, &read_trimmed(&temp_path)?)?;
            // `passive` is optional, but when readable it must be an unsigned number.
            let passive = zone.join("passive");
            match read_trimmed(&passive) {
                Ok(text) => parse_int::<u64>(&passive, &text).map(drop)?,
                Err(NodeError::Read { source, .. })
                    if matches!(
                        source.kind(),
                        ErrorKind::NotFound | ErrorKind::PermissionDenied
                    ) => {}
                Err(e) => return Err(e),
            }
            Ok((kind, temp))
        };
        let (kind, temp) = match read_zone() {
            Ok(zone) => zone,
            Err(e) if no_data(&e) => continue,
            Err(e) => return Err(e),
        };
        let id = name.trim_start_matches("thermal_zone");
        out.push(gauge(
            "node_thermal_zone_temp",
            "Zone temperature in Celsius",
            &[("type", &kind), ("zone", id)],
            temp as f64 / 1000.0,
        ));
    }
    for (name, device) in glob_numbered(&dir, "cooling_device") {
        let kind = read_trimmed(&device.join("type"))?;
        let max_path = device.join("max_state");
        let max: i64 = parse_int(&max_path, &read_trimmed(&max_path)?)?;
        let cur_path = device.join("cur_state");
        let cur: i64 = parse_int(&cur_path, &read_trimmed(&cur_path)?)?;
        let id = name.trim_start_matches("cooling_device");
        let labels = [("name", id), ("type", kind.as_str())];
        out.push(gauge(
            "node_cooling_device_cur_state",
            "Current throttle state of the cooling device",
            &labels,
            cur as f64,
        ));
        out.push(gauge(
            "node_cooling_device_max_state",
            "Maximum throttle state of the cooling device",
            &labels,
            max as f64,
        ));
    }
    Ok(())
}

fn read_count(path: &Path) -> Result<f64, NodeError> {
    let n: u64 = parse_int(path, &read_trimmed(path)?)?;
    Ok(n as f64)
}

/// The digits right after `prefix` in `name` (`mc12` → `12`).
fn number_after<'a>(name: &'a str, prefix: &str) -> &'a str {
    let rest = name.strip_prefix(prefix).unwrap_or_default();
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    &rest[..end]
}

/// `edac`: `<sys>/devices/system/edac/mc/mc[0-9]*` → `node_edac_{correctable,uncorrectable}_errors_total{controller}`
/// and `node_edac_csrow_{correctable,uncorrectable}_errors_total{controller,csrow}`, the
/// controller's `*_noinfo_count` as `csrow="unknown"`.
pub fn edac(sys: &Path, out: &mut Vec<Metric>) -> Result<(), NodeError> {
    const CE: &str = "node_edac_correctable_errors_total";
    const UE: &str = "node_edac_uncorrectable_errors_total";
    const ROW_CE: &str = "node_edac_csrow_correctable_errors_total";
    const ROW_UE: &str = "node_edac_csrow_uncorrectable_errors_total";
    const ROW_CE_HELP: &str = "Total correctable memory errors for this csrow.";
    const ROW_UE_HELP: &str = "Total uncorrectable memory errors for this csrow.";
    for (name, mc) in glob_numbered(&sys.join("devices/system/edac/mc"), "mc") {
        let controller = number_after(&name, "mc");
        let ctl = [("controller", controller)];
        let unknown = [("controller", controller), ("csrow", "unknown")];
        let ce = read_count(&mc.join("ce_count"))?;
        out.push(counter(CE, "Total correctable memory errors.", &ctl, ce));
        let ce_noinfo = read_count(&mc.join("ce_noinfo_count"))?;
        out.push(counter(ROW_CE, ROW_CE_HELP, &unknown, ce_noinfo));
        let ue = read_count(&mc.join("ue_count"))?;
        out.push(counter(UE, "Total uncorrectable memory errors.", &ctl, ue));
        let ue_noinfo = read_count(&mc.join("ue_noinfo_count"))?;
        out.push(counter(ROW_UE, ROW_UE_HELP, &unknown, ue_noinfo));
        for (row_name, row) in glob_numbered(&mc, "csrow") {
            let labels = [
                ("controller", controller),
                ("csrow", number_after(&row_name, "csrow")),
            ];
            let ce = read_count(&row.join("ce_count"))?;
            out.push(counter(ROW_CE, ROW_CE_HELP, &labels, ce));
            let ue = read_count(&row.join("ue_count"))?;
            out.push(counter(ROW_UE, ROW_UE_HELP, &labels, ue));
        }
    }
    Ok(())
}

/// `nvme`: `<sys>/class/nvme/<device>/{firmware_rev,model,serial,state}` →
/// `node_nvme_info{device,firmware_revision,model,serial,state}` = 1.
pub fn nvme(sys: &Path, out: &mut Vec<Metric>) -> Result<(), NodeError> {
    let class = sys.join("class/nvme");
    for device in list_dir(&class, false)? {
        let dir = class.join(&device);
        let firmware = read_trimmed(&dir.join("firmware_rev"))?;
        let model = read_trimmed(&dir.join("model"))?;
        let serial = read_trimmed(&dir.join("serial"))?;
        let state = read_trimmed(&dir.join("state"))?;
        out.push(gauge(
            "node_nvme_info",
            "Non-numeric data from /sys/class/nvme/<device>, value is always 1.",
            &[
                ("device", &device),
                ("firmware_revision", &firmware),
                ("model", &model),
                ("serial", &serial),
                ("state", &state),
            ],
            1.0,
        ));
    }
    Ok(())
}

/// One array of `/proc/mdstat`.
struct MdArray<'a> {
    name: &'a str,
    state: &'a str,
    active: i64,
    total: i64,
    failed: usize,
    spare: usize,
    blocks: i64,
    synced: i64,
}

/// The second line of an array: (active, required disks, blocks), as the `procfs` library
/// reads it: `raid0` and `linear` count the `[n]` members of the first line, inactive arrays
/// have no disk counts, the others need `[required/active] [U_…]`.
fn md_status(path: &Path, device: &str, status: &str) -> Result<(i64, i64, i64), NodeError> {
    static RE: OnceLock<Option<Regex>> = OnceLock::new();
    let bad = || format_error(path, format!("unexpected status line {status:?}"));
    let first = status.split_whitespace().next().ok_or_else(bad)?;
    let blocks: i64 = first.parse().map_err(|_| bad())?;
    if device.contains("raid0") || device.contains("linear") {
        let members = device.matches('[').count() as i64;
        return Ok((members, members, blocks));
    }
    if device.contains("inactive") {
        return Ok((0, 0, blocks));
    }
    let re = RE.get_or_init(|| Regex::new(r"(\d+) blocks .*\[(\d+)/(\d+)\] \[[U_]+\]").ok());
    let caps = re
        .as_ref()
        .and_then(|re| re.captures(status))
        .ok_or_else(bad)?;
    let num = |i: usize| caps.get(i).and_then(|m| m.as_str().parse::<i64>().ok());
    let (Some(total), Some(active)) = (num(2), num(3)) else {
        return Err(bad());
    };
    Ok((active, total, blocks))
}

/// The blocks synced of a `recovery`/`resync`/`check` line, which must also give the
/// percentage, finish time and speed (the `procfs` library fails the file otherwise).
fn md_synced(path: &Path, line: &str) -> Result<i64, NodeError> {
    static RES: OnceLock<Option<[Regex; 4]>> = OnceLock::new();
    let bad = || format_error(path, format!("unexpected sync line {line:?}"));
    let res = RES.get_or_init(|| {
        let all = [
            r"\((\d+)/\d+\)",
            r"= (.+)%",
            r"finish=(.+)min",
            r"speed=(.+)[A-Z]",
        ];
        let [a, b, c, d] = all.map(|p| Regex::new(p).ok());
        Some([a?, b?, c?, d?])
    });
    let res = res.as_ref().ok_or_else(bad)?;
    let field = |re: &Regex| re.captures(line).and_then(|c| c.get(1)).map(|m| m.as_str());
    let synced = field(&res[0]).and_then(|v| v.parse::<i64>().ok());
    let synced = synced.ok_or_else(bad)?;
    for re in &res[1..] {
        let value = field(re).and_then(|v| v.trim().parse::<f64>().ok());
        value.ok_or_else(bad)?;
    }
    Ok(synced)
}

fn md_arrays<'a>(path: &Path, text: &'a str) -> Result<Vec<MdArray<'a>>, NodeError> {
    let lines: Vec<&str> = text.split('\n').collect();
    let mut arrays = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty()
            || line.starts_with(' ')
            || line.starts_with("Personalities")
            || line.starts_with("unused")
        {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(name), Some(state)) = (fields.first(), fields.get(2)) else {
            return Err(format_error(path, format!("short device line {line:?}")));
        };
        let (Some(status), Some(third)) = (lines.get(i + 1), lines.get(i + 2)) else {
            return Err(format_error(path, format!("too few lines for {name}")));
        };
        if lines.len() <= i + 3 {
            return Err(format_error(path, format!("too few lines for {name}")));
        }
        let (active, total, blocks) = md_status(path, line, status)?;
        let sync = if third.contains("bitmap") {
            lines.get(i + 3).copied().unwrap_or_default()
        } else {
            third
        };
        let (mut state, mut synced) = (*state, blocks);
        let (recovery, resync, check) = (
            sync.contains("recovery"),
            sync.contains("resync"),
            sync.contains("check"),
        );
        if recovery || resync || check {
            state = if recovery {
                "recovering"
            } else if check {
                "checking"
            } else {
                "resyncing"
            };
            synced = if sync.contains("PENDING") || sync.contains("DELAYED") {
                0
            } else {
                md_synced(path, sync)?
            };
        }
        arrays.push(MdArray {
            name,
            state,
            active,
            total,
            failed: line.matches("(F)").count(),
            spare: line.matches("(S)").count(),
            blocks,
            synced,
        });
    }
    Ok(arrays)
}

/// `mdadm`: `<proc>/mdstat` → per array `node_md_disks_required`, `node_md_disks{state}`
/// (`active`, `failed`, `spare`), `node_md_state{state}` (1 for the array's one of `active`,
/// `inactive`, `recovering`, `resync`, `check`), `node_md_blocks`, `node_md_blocks_synced`.
pub fn mdadm(proc: &Path, out: &mut Vec<Metric>) -> Result<(), NodeError> {
    let path = proc.join("mdstat");
    let text = read(&path)?;
    for md in md_arrays(&path, &text)? {
        let dev = [("device", md.name)];
        let g = |name: &str, help: &str, labels: &[(&str, &str)], v: f64| {
            gauge(name.to_owned(), help, labels, v)
        };
        out.push(g(
            "node_md_disks_required",
            "Total number of disks of device.",
            &dev,
            md.total as f64,
        ));
        for (state, n) in [
            ("active", md.active as f64),
            ("failed", md.failed as f64),
            ("spare", md.spare as f64),
        ] {
            let labels = [("device", md.name), ("state", state)];
            let help = "Number of active/failed/spare disks of device.";
            out.push(g("node_md_disks", help, &labels, n));
        }
        for (state, shown) in [
            ("active", "active"),
            ("inactive", "inactive"),
            ("recovering", "recovering"),
            ("resyncing", "resync"),
            ("checking", "check"),
        ] {
            let labels = [("device", md.name), ("state", shown)];
            let v = if md.state == state { 1.0 } else { 0.0 };
            out.push(g(
                "node_md_state",
                "Indicates the state of md-device.",
                &labels,
                v,
            ));
        }
        let help = "Total number of blocks on device.";
        out.push(g("node_md_blocks", help, &dev, md.blocks as f64));
        let help = "Number of blocks synced on device.";
        out.push(g("node_md_blocks_synced", help, &dev, md.synced as f64));
    }
    Ok(())
}

/// `bonding`: `<sys>/class/net/bonding_masters` and each master's `bonding/slaves` →
/// `node_bonding_slaves{master}` and `node_bonding_active{master}` (slaves whose
/// `lower_<slave>/bonding_slave/mii_status`, or on older kernels `slave_<slave>/…`, is `up`).
pub fn bonding(sys: &Path, out: &mut Vec<Metric>) -> Result<(), NodeError> {
    let class = sys.join("class/net");
    let masters = read(&class.join("bonding_masters"))?;
    let mut seen: Vec<&str> = Vec::new();
    for master in masters.split_whitespace() {
        if seen.contains(&master) {
            continue;
        }
        seen.push(master);
        let dir = class.join(master);
        let slaves = read(&dir.join("bonding/slaves"))?;
        let (mut configured, mut active) = (0u32, 0u32);
        for slave in slaves.split_whitespace() {
            let status = |prefix: &str| {
                let path = dir.join(format!("{prefix}{slave}/bonding_slave/mii_status"));
                read(&path)
            };
            let state = match status("lower_") {
                Err(NodeError::Read { source, .. }) if source.kind() == ErrorKind::NotFound => {
                    status("slave_")?
                }
                other => other?,
            };
            configured += 1;
            if state.trim() == "up" {
                active += 1;
            }
        }
        let labels = [("master", master)];
        out.push(gauge(
            "node_bonding_slaves",
            "Number of configured slaves per bonding interface.",
            &labels,
            f64::from(configured),
        ));
        out.push(gauge(
            "node_bonding_active",
            "Number of active slaves per bonding interface.",
            &labels,
            f64::from(active),
        ));
    }
    Ok(())
}

/// Runs the collector of this module named `name` (a `HostCollector` name), reading `proc` and
/// `sys`; any other name does nothing.
pub(super) fn collect(
    name: &str,
    proc: &Path,
    sys: &Path,
    out: &mut Vec<Metric>,
) -> Result<(), NodeError> {
    match name {
        "arp" => arp(proc, out),
        "netclass" => netclass(sys, out),
        "thermal_zone" => thermal_zone(sys, out),
        "edac" => edac(sys, out),
        "nvme" => nvme(sys, out),
        "mdadm" => mdadm(proc, out),
        "bonding" => bonding(sys, out),
        "hwmon" => super::node_hwmon::hwmon(sys, out),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The fixture tree and the line rendering of the `node` collectors' tests.
    use super::super::node::tests::{help_of, lines, tree};

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

    #[test]
    fn thermal_zone_reads_zones_and_cooling_devices() {
        let d = tree(&[
            ("class/thermal/thermal_zone0/type", "bcm2835_thermal\n"),
            ("class/thermal/thermal_zone0/policy", "step_wise\n"),
            ("class/thermal/thermal_zone0/temp", "49925\n"),
            ("class/thermal/thermal_zone1/type", "acpitz\n"),
            ("class/thermal/thermal_zone1/policy", "step_wise\n"),
            ("class/thermal/thermal_zone1/temp", "-44000\n"),
            ("class/thermal/thermal_zonex/temp", "1\n"),
            ("class/thermal/cooling_device0/type", "Processor\n"),
            ("class/thermal/cooling_device0/max_state", "50\n"),
            ("class/thermal/cooling_device0/cur_state", "0\n"),
            ("class/thermal/cooling_device1/type", "intel_powerclamp\n"),
            ("class/thermal/cooling_device1/max_state", "27\n"),
            ("class/thermal/cooling_device1/cur_state", "-1\n"),
        ]);
        let mut out = Vec::new();
        thermal_zone(d.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            lines(&out),
            [
                "node_thermal_zone_temp{type=\"bcm2835_thermal\",zone=\"0\"} gauge 49.925",
                "node_thermal_zone_temp{type=\"acpitz\",zone=\"1\"} gauge -44",
                "node_cooling_device_cur_state{name=\"0\",type=\"Processor\"} gauge 0",
                "node_cooling_device_max_state{name=\"0\",type=\"Processor\"} gauge 50",
                "node_cooling_device_cur_state{name=\"1\",type=\"intel_powerclamp\"} gauge -1",
                "node_cooling_device_max_state{name=\"1\",type=\"intel_powerclamp\"} gauge 27",
            ]
        );
        assert_eq!(
            help_of(&out, "node_thermal_zone_temp"),
            Some("Zone temperature in Celsius")
        );
        assert_eq!(
            help_of(&out, "node_cooling_device_max_state"),
            Some("Maximum throttle state of the cooling device")
        );
        // No thermal class at all: a success with no series; a zone without policy: a failure.
        let mut out = Vec::new();
        thermal_zone(tree(&[]).path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert!(out.is_empty());
        let bad = tree(&[
            ("class/thermal/thermal_zone0/type", "x\n"),
            ("class/thermal/thermal_zone0/temp", "1\n"),
        ]);
        assert!(thermal_zone(bad.path(), &mut Vec::new()).is_err());
        // `mode` is not read (a disabled zone is still reported); a `passive` that is not an
        // unsigned number fails the collector, as node_exporter 1.5's does.
        let zone = |passive: &str| {
            tree(&[
                ("class/thermal/thermal_zone0/type", "t\n"),
                ("class/thermal/thermal_zone0/policy", "p\n"),
                ("class/thermal/thermal_zone0/temp", "1000\n"),
                ("class/thermal/thermal_zone0/mode", "disabled\n"),
                ("class/thermal/thermal_zone0/passive", passive),
            ])
        };
        let mut out = Vec::new();
        thermal_zone(zone("0\n").path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            lines(&out),
            ["node_thermal_zone_temp{type=\"t\",zone=\"0\"} gauge 1"]
        );
        for bad in ["x\n", "-1\n"] {
            assert!(
                thermal_zone(zone(bad).path(), &mut Vec::new()).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn edac_reads_controllers_and_csrows() {
        let d = tree(&[
            ("devices/system/edac/mc/mc0/ce_count", "1\n"),
            ("devices/system/edac/mc/mc0/ce_noinfo_count", "2\n"),
            ("devices/system/edac/mc/mc0/ue_count", "5\n"),
            ("devices/system/edac/mc/mc0/ue_noinfo_count", "6\n"),
            ("devices/system/edac/mc/mc0/csrow0/ce_count", "3\n"),
            ("devices/system/edac/mc/mc0/csrow0/ue_count", "4\n"),
            ("devices/system/edac/mc/mc0/csrow1/ce_count", "0\n"),
            ("devices/system/edac/mc/mc0/csrow1/ue_count", "0\n"),
            ("devices/system/edac/mc/power/x", "\n"),
        ]);
        let mut out = Vec::new();
        edac(d.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            lines(&out),
            [
                "node_edac_correctable_errors_total{controller=\"0\"} counter 1",
                "node_edac_csrow_correctable_errors_total{controller=\"0\",csrow=\"unknown\"} \
                 counter 2",
                "node_edac_uncorrectable_errors_total{controller=\"0\"} counter 5",
                "node_edac_csrow_uncorrectable_errors_total{controller=\"0\",csrow=\"unknown\"} \
                 counter 6",
                "node_edac_csrow_correctable_errors_total{controller=\"0\",csrow=\"0\"} counter 3",
                "node_edac_csrow_uncorrectable_errors_total{controller=\"0\",csrow=\"0\"} counter 4",
                "node_edac_csrow_correctable_errors_total{controller=\"0\",csrow=\"1\"} counter 0",
                "node_edac_csrow_uncorrectable_errors_total{controller=\"0\",csrow=\"1\"} counter 0",
            ]
        );
        assert_eq!(
            help_of(&out, "node_edac_correctable_errors_total"),
            Some("Total correctable memory errors.")
        );
        assert_eq!(
            help_of(&out, "node_edac_csrow_uncorrectable_errors_total"),
            Some("Total uncorrectable memory errors for this csrow.")
        );
        let mut out = Vec::new();
        edac(tree(&[]).path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert!(out.is_empty());
        let bad = tree(&[("devices/system/edac/mc/mc0/ce_count", "1\n")]);
        assert!(edac(bad.path(), &mut Vec::new()).is_err());
    }

    #[test]
    fn nvme_info_per_controller() {
        let d = tree(&[
            ("class/nvme/nvme0/firmware_rev", "1B2QEXP7\n"),
            (
                "class/nvme/nvme0/model",
                "Samsung SSD 970 PRO 512GB               \n",
            ),
            ("class/nvme/nvme0/serial", "S680HF8N190894I     \n"),
            ("class/nvme/nvme0/state", "live\n"),
        ]);
        let mut out = Vec::new();
        nvme(d.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            lines(&out),
            [
                "node_nvme_info{device=\"nvme0\",firmware_revision=\"1B2QEXP7\",\
              model=\"Samsung SSD 970 PRO 512GB\",serial=\"S680HF8N190894I\",state=\"live\"} \
              gauge 1"
            ]
        );
        assert_eq!(
            help_of(&out, "node_nvme_info"),
            Some("Non-numeric data from /sys/class/nvme/<device>, value is always 1.")
        );
        // No class/nvme: a failure, as node_exporter's "no data".
        assert!(nvme(tree(&[]).path(), &mut Vec::new()).is_err());
        let bad = tree(&[("class/nvme/nvme0/model", "x\n")]);
        assert!(nvme(bad.path(), &mut Vec::new()).is_err());
    }

    /// `/proc/mdstat` of arrays in every state (the `procfs` library's fixture cases), and
    /// node_exporter 1.5's output for it, sorted.
    const MDSTAT: &str = r"Personalities : [linear] [multipath] [raid0] [raid1] [raid6] [raid5] [raid4] [raid10]
md3 : active raid6 sda1[8] sdh1[7] sdg1[6] sdf1[5] sde1[11] sdd1[3] sdc1[10] sdb1[9] sdd1[10](S) sdd2[11](S)
      5853468288 blocks super 1.2 level 6, 64k chunk, algorithm 2 [8/8] [UUUUUUUU]

md127 : active raid1 sdi2[0] sdj2[1]
      312319552 blocks [2/2] [UU]

md0 : active raid1 sdi1[0] sdj1[1]
      248896 blocks [2/2] [UU]

md4 : inactive raid1 sda3[0](F) sdb3[1](S)
      4883648 blocks [2/2] [UU]

md6 : active raid1 sdb2[2](F) sdc[1](S) sda2[0]
      195310144 blocks [2/1] [U_]
      [=>...................]  recovery =  8.5% (16775552/195310144) finish=17.0min speed=259783K/sec

md8 : active raid1 sdb1[1] sda1[0] sdc[2](S) sde[3](S)
      195310144 blocks [2/2] [UU]
      [=>...................]  resync =  8.5% (16775552/195310144) finish=17.0min speed=259783K/sec

md7 : active raid6 sdb1[0] sde1[3] sdd1[2] sdc1[1](F)
      7813735424 blocks super 1.2 level 6, 512k chunk, algorithm 2 [4/3] [U_UU]
      bitmap: 0/30 pages [0KB], 65536KB chunk

md9 : active raid1 sdc2[2] sdd2[3] sdb2[1] sda2[0] sde[4](F) sdf[5](F) sdg[6](S)
      523968 blocks super 1.2 [4/4] [UUUU]
      resync=DELAYED

md10 : active raid0 sda1[0] sdb1[1]
      314159265 blocks 64k chunks

md11 : active (auto-read-only) raid1 sdb2[0] sdc2[1](S)
      4190208 blocks super 1.2 [2/2] [UU]
      resync=PENDING

md12 : active raid0 sdc2[0] sdd2[1]
      3886394368 blocks super 1.2 512k chunks

md126 : active raid0 sdb[1] sdc[0]
      1855870976 blocks super external:/md127/0 128k chunks

md219 : inactive sdb[2](S) sdc[1](S) sda[0](S)
      7932 blocks super external:imsm

md00 : active raid0 xvdb[0]
      4186624 blocks super 1.2 256k chunks

md120 : active linear sda1[1] sdb1[0]
      2095104 blocks super 1.2 0k rounding

md101 : active (read-only) raid0 sdb[2] sdd[1] sdc[0]
      322560 blocks super 1.2 512k chunks

md201 : active raid1 sda3[0] sdb3[1]
      1993728 blocks super 1.2 [2/2] [UU]
      [=>...................]  check =  5.7% (114176/1993728) finish=0.2min speed=114176K/sec

unused devices: <none>
";

    #[test]
    fn mdadm_matches_node_exporter_on_every_array_kind() {
        let d = tree(&[("mdstat", MDSTAT)]);
        let mut out = Vec::new();
        mdadm(d.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        let mut got = lines(&out);
        got.sort();
        let want = [
            "node_md_blocks_synced{device=\"md0\"} gauge 248896",
            "node_md_blocks_synced{device=\"md00\"} gauge 4186624",
            "node_md_blocks_synced{device=\"md10\"} gauge 314159265",
            "node_md_blocks_synced{device=\"md101\"} gauge 322560",
            "node_md_blocks_synced{device=\"md11\"} gauge 0",
            "node_md_blocks_synced{device=\"md12\"} gauge 3886394368",
            "node_md_blocks_synced{device=\"md120\"} gauge 2095104",
            "node_md_blocks_synced{device=\"md126\"} gauge 1855870976",
            "node_md_blocks_synced{device=\"md127\"} gauge 312319552",
            "node_md_blocks_synced{device=\"md201\"} gauge 114176",
            "node_md_blocks_synced{device=\"md219\"} gauge 7932",
            "node_md_blocks_synced{device=\"md3\"} gauge 5853468288",
            "node_md_blocks_synced{device=\"md4\"} gauge 4883648",
            "node_md_blocks_synced{device=\"md6\"} gauge 16775552",
            "node_md_blocks_synced{device=\"md7\"} gauge 7813735424",
            "node_md_blocks_synced{device=\"md8\"} gauge 16775552",
            "node_md_blocks_synced{device=\"md9\"} gauge 0",
            "node_md_blocks{device=\"md0\"} gauge 248896",
            "node_md_blocks{device=\"md00\"} gauge 4186624",
            "node_md_blocks{device=\"md10\"} gauge 314159265",
            "node_md_blocks{device=\"md101\"} gauge 322560",
            "node_md_blocks{device=\"md11\"} gauge 4190208",
            "node_md_blocks{device=\"md12\"} gauge 3886394368",
            "node_md_blocks{device=\"md120\"} gauge 2095104",
            "node_md_blocks{device=\"md126\"} gauge 1855870976",
            "node_md_blocks{device=\"md127\"} gauge 312319552",
            "node_md_blocks{device=\"md201\"} gauge 1993728",
            "node_md_blocks{device=\"md219\"} gauge 7932",
            "node_md_blocks{device=\"md3\"} gauge 5853468288",
            "node_md_blocks{device=\"md4\"} gauge 4883648",
            "node_md_blocks{device=\"md6\"} gauge 195310144",
            "node_md_blocks{device=\"md7\"} gauge 7813735424",
            "node_md_blocks{device=\"md8\"} gauge 195310144",
            "node_md_blocks{device=\"md9\"} gauge 523968",
            "node_md_disks_required{device=\"md0\"} gauge 2",
            "node_md_disks_required{device=\"md00\"} gauge 1",
            "node_md_disks_required{device=\"md10\"} gauge 2",
            "node_md_disks_required{device=\"md101\"} gauge 3",
            "node_md_disks_required{device=\"md11\"} gauge 2",
            "node_md_disks_required{device=\"md12\"} gauge 2",
            "node_md_disks_required{device=\"md120\"} gauge 2",
            "node_md_disks_required{device=\"md126\"} gauge 2",
            "node_md_disks_required{device=\"md127\"} gauge 2",
            "node_md_disks_required{device=\"md201\"} gauge 2",
            "node_md_disks_required{device=\"md219\"} gauge 0",
            "node_md_disks_required{device=\"md3\"} gauge 8",
            "node_md_disks_required{device=\"md4\"} gauge 0",
            "node_md_disks_required{device=\"md6\"} gauge 2",
            "node_md_disks_required{device=\"md7\"} gauge 4",
            "node_md_disks_required{device=\"md8\"} gauge 2",
            "node_md_disks_required{device=\"md9\"} gauge 4",
            "node_md_disks{device=\"md0\",state=\"active\"} gauge 2",
            "node_md_disks{device=\"md0\",state=\"failed\"} gauge 0",
            "node_md_disks{device=\"md0\",state=\"spare\"} gauge 0",
            "node_md_disks{device=\"md00\",state=\"active\"} gauge 1",
            "node_md_disks{device=\"md00\",state=\"failed\"} gauge 0",
            "node_md_disks{device=\"md00\",state=\"spare\"} gauge 0",
            "node_md_disks{device=\"md10\",state=\"active\"} gauge 2",
            "node_md_disks{device=\"md10\",state=\"failed\"} gauge 0",
            "node_md_disks{device=\"md10\",state=\"spare\"} gauge 0",
            "node_md_disks{device=\"md101\",state=\"active\"} gauge 3",
            "node_md_disks{device=\"md101\",state=\"failed\"} gauge 0",
            "node_md_disks{device=\"md101\",state=\"spare\"} gauge 0",
            "node_md_disks{device=\"md11\",state=\"active\"} gauge 2",
            "node_md_disks{device=\"md11\",state=\"failed\"} gauge 0",
            "node_md_disks{device=\"md11\",state=\"spare\"} gauge 1",
            "node_md_disks{device=\"md12\",state=\"active\"} gauge 2",
            "node_md_disks{device=\"md12\",state=\"failed\"} gauge 0",
            "node_md_disks{device=\"md12\",state=\"spare\"} gauge 0",
            "node_md_disks{device=\"md120\",state=\"active\"} gauge 2",
            "node_md_disks{device=\"md120\",state=\"failed\"} gauge 0",
            "node_md_disks{device=\"md120\",state=\"spare\"} gauge 0",
            "node_md_disks{device=\"md126\",state=\"active\"} gauge 2",
            "node_md_disks{device=\"md126\",state=\"failed\"} gauge 0",
            "node_md_disks{device=\"md126\",state=\"spare\"} gauge 0",
            "node_md_disks{device=\"md127\",state=\"active\"} gauge 2",
            "node_md_disks{device=\"md127\",state=\"failed\"} gauge 0",
            "node_md_disks{device=\"md127\",state=\"spare\"} gauge 0",
            "node_md_disks{device=\"md201\",state=\"active\"} gauge 2",
            "node_md_disks{device=\"md201\",state=\"failed\"} gauge 0",
            "node_md_disks{device=\"md201\",state=\"spare\"} gauge 0",
            "node_md_disks{device=\"md219\",state=\"active\"} gauge 0",
            "node_md_disks{device=\"md219\",state=\"failed\"} gauge 0",
            "node_md_disks{device=\"md219\",state=\"spare\"} gauge 3",
            "node_md_disks{device=\"md3\",state=\"active\"} gauge 8",
            "node_md_disks{device=\"md3\",state=\"failed\"} gauge 0",
            "node_md_disks{device=\"md3\",state=\"spare\"} gauge 2",
            "node_md_disks{device=\"md4\",state=\"active\"} gauge 0",
            "node_md_disks{device=\"md4\",state=\"failed\"} gauge 1",
            "node_md_disks{device=\"md4\",state=\"spare\"} gauge 1",
            "node_md_disks{device=\"md6\",state=\"active\"} gauge 1",
            "node_md_disks{device=\"md6\",state=\"failed\"} gauge 1",
            "node_md_disks{device=\"md6\",state=\"spare\"} gauge 1",
            "node_md_disks{device=\"md7\",state=\"active\"} gauge 3",
            "node_md_disks{device=\"md7\",state=\"failed\"} gauge 1",
            "node_md_disks{device=\"md7\",state=\"spare\"} gauge 0",
            "node_md_disks{device=\"md8\",state=\"active\"} gauge 2",
            "node_md_disks{device=\"md8\",state=\"failed\"} gauge 0",
            "node_md_disks{device=\"md8\",state=\"spare\"} gauge 2",
            "node_md_disks{device=\"md9\",state=\"active\"} gauge 4",
            "node_md_disks{device=\"md9\",state=\"failed\"} gauge 2",
            "node_md_disks{device=\"md9\",state=\"spare\"} gauge 1",
            "node_md_state{device=\"md0\",state=\"active\"} gauge 1",
            "node_md_state{device=\"md0\",state=\"check\"} gauge 0",
            "node_md_state{device=\"md0\",state=\"inactive\"} gauge 0",
            "node_md_state{device=\"md0\",state=\"recovering\"} gauge 0",
            "node_md_state{device=\"md0\",state=\"resync\"} gauge 0",
            "node_md_state{device=\"md00\",state=\"active\"} gauge 1",
            "node_md_state{device=\"md00\",state=\"check\"} gauge 0",
            "node_md_state{device=\"md00\",state=\"inactive\"} gauge 0",
            "node_md_state{device=\"md00\",state=\"recovering\"} gauge 0",
            "node_md_state{device=\"md00\",state=\"resync\"} gauge 0",
            "node_md_state{device=\"md10\",state=\"active\"} gauge 1",
            "node_md_state{device=\"md10\",state=\"check\"} gauge 0",
            "node_md_state{device=\"md10\",state=\"inactive\"} gauge 0",
            "node_md_state{device=\"md10\",state=\"recovering\"} gauge 0",
            "node_md_state{device=\"md10\",state=\"resync\"} gauge 0",
            "node_md_state{device=\"md101\",state=\"active\"} gauge 1",
            "node_md_state{device=\"md101\",state=\"check\"} gauge 0",
            "node_md_state{device=\"md101\",state=\"inactive\"} gauge 0",
            "node_md_state{device=\"md101\",state=\"recovering\"} gauge 0",
            "node_md_state{device=\"md101\",state=\"resync\"} gauge 0",
            "node_md_state{device=\"md11\",state=\"active\"} gauge 0",
            "node_md_state{device=\"md11\",state=\"check\"} gauge 0",
            "node_md_state{device=\"md11\",state=\"inactive\"} gauge 0",
            "node_md_state{device=\"md11\",state=\"recovering\"} gauge 0",
            "node_md_state{device=\"md11\",state=\"resync\"} gauge 1",
            "node_md_state{device=\"md12\",state=\"active\"} gauge 1",
            "node_md_state{device=\"md12\",state=\"check\"} gauge 0",
            "node_md_state{device=\"md12\",state=\"inactive\"} gauge 0",
            "node_md_state{device=\"md12\",state=\"recovering\"} gauge 0",
            "node_md_state{device=\"md12\",state=\"resync\"} gauge 0",
            "node_md_state{device=\"md120\",state=\"active\"} gauge 1",
            "node_md_state{device=\"md120\",state=\"check\"} gauge 0",
            "node_md_state{device=\"md120\",state=\"inactive\"} gauge 0",
            "node_md_state{device=\"md120\",state=\"recovering\"} gauge 0",
            "node_md_state{device=\"md120\",state=\"resync\"} gauge 0",
            "node_md_state{device=\"md126\",state=\"active\"} gauge 1",
            "node_md_state{device=\"md126\",state=\"check\"} gauge 0",
            "node_md_state{device=\"md126\",state=\"inactive\"} gauge 0",
            "node_md_state{device=\"md126\",state=\"recovering\"} gauge 0",
            "node_md_state{device=\"md126\",state=\"resync\"} gauge 0",
            "node_md_state{device=\"md127\",state=\"active\"} gauge 1",
            "node_md_state{device=\"md127\",state=\"check\"} gauge 0",
            "node_md_state{device=\"md127\",state=\"inactive\"} gauge 0",
            "node_md_state{device=\"md127\",state=\"recovering\"} gauge 0",
            "node_md_state{device=\"md127\",state=\"resync\"} gauge 0",
            "node_md_state{device=\"md201\",state=\"active\"} gauge 0",
            "node_md_state{device=\"md201\",state=\"check\"} gauge 1",
            "node_md_state{device=\"md201\",state=\"inactive\"} gauge 0",
            "node_md_state{device=\"md201\",state=\"recovering\"} gauge 0",
            "node_md_state{device=\"md201\",state=\"resync\"} gauge 0",
            "node_md_state{device=\"md219\",state=\"active\"} gauge 0",
            "node_md_state{device=\"md219\",state=\"check\"} gauge 0",
            "node_md_state{device=\"md219\",state=\"inactive\"} gauge 1",
            "node_md_state{device=\"md219\",state=\"recovering\"} gauge 0",
            "node_md_state{device=\"md219\",state=\"resync\"} gauge 0",
            "node_md_state{device=\"md3\",state=\"active\"} gauge 1",
            "node_md_state{device=\"md3\",state=\"check\"} gauge 0",
            "node_md_state{device=\"md3\",state=\"inactive\"} gauge 0",
            "node_md_state{device=\"md3\",state=\"recovering\"} gauge 0",
            "node_md_state{device=\"md3\",state=\"resync\"} gauge 0",
            "node_md_state{device=\"md4\",state=\"active\"} gauge 0",
            "node_md_state{device=\"md4\",state=\"check\"} gauge 0",
            "node_md_state{device=\"md4\",state=\"inactive\"} gauge 1",
            "node_md_state{device=\"md4\",state=\"recovering\"} gauge 0",
            "node_md_state{device=\"md4\",state=\"resync\"} gauge 0",
            "node_md_state{device=\"md6\",state=\"active\"} gauge 0",
            "node_md_state{device=\"md6\",state=\"check\"} gauge 0",
            "node_md_state{device=\"md6\",state=\"inactive\"} gauge 0",
            "node_md_state{device=\"md6\",state=\"recovering\"} gauge 1",
            "node_md_state{device=\"md6\",state=\"resync\"} gauge 0",
            "node_md_state{device=\"md7\",state=\"active\"} gauge 1",
            "node_md_state{device=\"md7\",state=\"check\"} gauge 0",
            "node_md_state{device=\"md7\",state=\"inactive\"} gauge 0",
            "node_md_state{device=\"md7\",state=\"recovering\"} gauge 0",
            "node_md_state{device=\"md7\",state=\"resync\"} gauge 0",
            "node_md_state{device=\"md8\",state=\"active\"} gauge 0",
            "node_md_state{device=\"md8\",state=\"check\"} gauge 0",
            "node_md_state{device=\"md8\",state=\"inactive\"} gauge 0",
            "node_md_state{device=\"md8\",state=\"recovering\"} gauge 0",
            "node_md_state{device=\"md8\",state=\"resync\"} gauge 1",
            "node_md_state{device=\"md9\",state=\"active\"} gauge 0",
            "node_md_state{device=\"md9\",state=\"check\"} gauge 0",
            "node_md_state{device=\"md9\",state=\"inactive\"} gauge 0",
            "node_md_state{device=\"md9\",state=\"recovering\"} gauge 0",
            "node_md_state{device=\"md9\",state=\"resync\"} gauge 1",
        ];
        assert_eq!(got, want);
        assert_eq!(
            help_of(&out, "node_md_disks"),
            Some("Number of active/failed/spare disks of device.")
        );
        assert_eq!(
            help_of(&out, "node_md_state"),
            Some("Indicates the state of md-device.")
        );
        // No mdstat (no md driver): a failure, as node_exporter's "no data".
        assert!(mdadm(tree(&[]).path(), &mut Vec::new()).is_err());
        for bad in [
            "md0 : active raid1 sda1[0]\n      12 blocks [2/2]\n\n\n",
            "md0 : active raid1 sda1[0]\n      x blocks [2/2] [UU]\n\n\n",
            "md0 : active raid1 sda1[0]\n      12 blocks [2/2] [UU]\n",
            "md0 :\n\n\n\n",
            "md6 : active raid1 sda2[0]\n      9 blocks [2/1] [U_]\n      recovery = 8.5% (1/9)\n\n",
        ] {
            let d = tree(&[("mdstat", bad)]);
            assert!(mdadm(d.path(), &mut Vec::new()).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn bonding_counts_configured_and_up_slaves() {
        let d = tree(&[
            ("class/net/bonding_masters", "bond0 dmz int\n"),
            ("class/net/bond0/bonding/slaves", "eth0 eth4\n"),
            (
                "class/net/bond0/lower_eth0/bonding_slave/mii_status",
                "up\n",
            ),
            (
                "class/net/bond0/lower_eth4/bonding_slave/mii_status",
                "down\n",
            ),
            ("class/net/dmz/bonding/slaves", "eth1 eth2\n"),
            ("class/net/dmz/slave_eth1/bonding_slave/mii_status", "up\n"),
            ("class/net/dmz/slave_eth2/bonding_slave/mii_status", "up\n"),
            ("class/net/int/bonding/slaves", "\n"),
        ]);
        let mut out = Vec::new();
        bonding(d.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            lines(&out),
            [
                "node_bonding_slaves{master=\"bond0\"} gauge 2",
                "node_bonding_active{master=\"bond0\"} gauge 1",
                "node_bonding_slaves{master=\"dmz\"} gauge 2",
                "node_bonding_active{master=\"dmz\"} gauge 2",
                "node_bonding_slaves{master=\"int\"} gauge 0",
                "node_bonding_active{master=\"int\"} gauge 0",
            ]
        );
        assert_eq!(
            help_of(&out, "node_bonding_slaves"),
            Some("Number of configured slaves per bonding interface.")
        );
        // No bonding module: a failure, as node_exporter's "no data"; a slave without status too.
        assert!(bonding(tree(&[]).path(), &mut Vec::new()).is_err());
        let bad = tree(&[
            ("class/net/bonding_masters", "bond0\n"),
            ("class/net/bond0/bonding/slaves", "eth0\n"),
        ]);
        assert!(bonding(bad.path(), &mut Vec::new()).is_err());
    }

    #[test]
    fn collect_dispatches_by_name() {
        let d = tree(&[(
            "net/arp",
            "IP address HW type Flags HW address Mask Device\n",
        )]);
        assert!(collect("arp", d.path(), d.path(), &mut Vec::new()).is_ok());
        assert!(collect("nvme", d.path(), d.path(), &mut Vec::new()).is_err());
        assert!(collect("cpu", d.path(), d.path(), &mut Vec::new()).is_ok());
    }
}
