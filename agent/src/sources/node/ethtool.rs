//! node_exporter's `ethtool` collector (node_exporter 1.5.0, `collector/ethtool_linux.go`):
//! every interface of `<sys>/class/net` that the device filter lets through, read over the
//! `SIOCETHTOOL` ioctl ([`crate::sources::sys::ethtool`]). Off unless
//! `sources.host_metrics.ethtool` is set ([`EthtoolSection`]), as node_exporter's is
//! (`--collector.ethtool`).
//!
//! Per interface, in node_exporter's order:
//!
//! - link settings (`ETHTOOL_GSET`, the first 32 link-mode bits of
//!   `include/uapi/linux/ethtool.h` `ethtool_link_mode_bit_indices`):
//!   `node_network_{supported,advertised}_speed_bytes{device,duplex,mode}` (Mb/s × 125000)
//!   per speed bit set, `node_network_supported_port_info{device,type}` = 1 per port bit set,
//!   `node_network_{autonegotiate,pause,asymmetricpause}_{supported,advertised}{device}` 0/1,
//!   `node_network_autonegotiate{device}`;
//! - `node_ethtool_info{bus_info,device,driver,expansion_rom_version,firmware_version,version}`
//!   = 1 (`ETHTOOL_GDRVINFO`);
//! - one untyped `node_ethtool_<name>{device}` per driver statistic (`ethtool -S`) whose raw
//!   name `metrics_include` matches, help `Network interface <raw name>`. The name is lower
//!   case, every run of characters outside `[0-9A-Za-z_]` (with the `_`s around it) becomes
//!   one `_`, leading `_`s go, and a whole-word `rx`/`tx` becomes `received`/`transmitted`
//!   (`rx_queue_0_bytes` → `node_ethtool_received_queue_0_bytes`). Per-queue and
//!   per-priority counters stay one series per raw name, as in 1.5.0. Seven raw names have
//!   fixed series instead: `rx_bytes` → `node_ethtool_received_bytes_total` and likewise
//!   `rx_dropped`, `rx_errors`, `rx_packets`, `tx_bytes`, `tx_errors`, `tx_packets`. Raw names
//!   that map to one series name are all dropped (and counted, [`EthtoolSkip`]); empty names
//!   are skipped; a name that appears twice keeps its last value.
//!
//! An interface whose driver refuses an operation with `EOPNOTSUPP` (`lo`, `ifb` for link
//! settings) simply lacks those series, as node_exporter logs that at debug level only; any
//! other failure is also skipped but reported in [`EthtoolSkip`]s, which the agent counts in
//! `uctel_agent_source_errors_total{source="ethtool",reason}`. Like node_exporter, skipped
//! interfaces do not fail the collector; a missing `<sys>/class/net` or one without
//! interfaces does.
//!
//! Known differences: node_exporter visits interfaces in random order (Go map) and fails the
//! whole collector when an interface's sysfs attributes cannot be read; raw names
//! `supported_port`, `supported_speed` and `advertised_speed`, which would crash 1.5.0 (its
//! fixed descriptors for them have more labels), are ordinary statistics here.

use std::collections::BTreeMap;
use std::path::Path;

use crate::sources::sys::ethtool::{self, LinkSettings, StatsReader};
use regex::Regex;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use uctel_protocol::payload::{Metric, MetricType};

use super::NodeError;
use crate::sources::metric::{gauge, sample};

/// A regular expression in the configuration (Rust `regex` syntax, which for these filters
/// reads like node_exporter's Go RE2 syntax), matched anywhere in the text unless anchored
/// with `^…$`. An invalid expression is a configuration error at its key.
#[derive(Debug, Clone)]
pub struct Pattern {
    text: String,
    regex: Regex,
}

impl Pattern {
    /// Compiles `text`.
    ///
    /// # Errors
    /// The `regex` crate's message for an invalid expression.
    pub fn new(text: &str) -> Result<Pattern, regex::Error> {
        Ok(Pattern {
            text: text.to_owned(),
            regex: Regex::new(text)?,
        })
    }

    /// Whether the expression matches somewhere in `s`.
    pub fn is_match(&self, s: &str) -> bool {
        self.regex.is_match(s)
    }

    /// The expression as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl Eq for Pattern {}

impl<'de> Deserialize<'de> for Pattern {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Pattern::new(&text).map_err(|e| serde::de::Error::custom(format!("invalid regex: {e}")))
    }
}

impl Serialize for Pattern {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

/// `sources.host_metrics.ethtool`: node_exporter's `ethtool` collector (driver statistics,
/// driver information and link settings of network interfaces). Off when absent; `{}` turns
/// it on for every interface and statistic.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EthtoolSection {
    /// Regex of interface names to read (`--collector.ethtool.device-include`), e.g.
    /// `^(eth|ens|enp)`. Default: every interface of `<sys>/class/net`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_include: Option<Pattern>,
    /// Regex of interface names to skip (`--collector.ethtool.device-exclude`), e.g. `^lo$`.
    /// node_exporter calls the two flags mutually exclusive but applies both: an interface is
    /// read when it matches `device_include` (if set) and not `device_exclude` (if set). An
    /// empty regex means unset, as for node_exporter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_exclude: Option<Pattern>,
    /// Regex of raw statistic names (as `ethtool -S` prints them) to export
    /// (`--collector.ethtool.metrics-include`), e.g. `^(rx|tx)_.*(pause|pfc|ecn|cnp|discard)`.
    /// Default `.*` (a ConnectX port has hundreds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_include: Option<Pattern>,
}

impl EthtoolSection {
    /// Whether interface `device` is skipped (node_exporter 1.5.0 `collector/device_filter.go`
    /// `ignored`).
    pub fn ignored(&self, device: &str) -> bool {
        fn set(p: &Option<Pattern>) -> Option<&Pattern> {
            p.as_ref().filter(|p| !p.as_str().is_empty())
        }
        set(&self.device_exclude).is_some_and(|p| p.is_match(device))
            || set(&self.device_include).is_some_and(|p| !p.is_match(device))
    }

    /// Whether the statistic with raw name `stat` is exported.
    pub fn includes(&self, stat: &str) -> bool {
        self.metrics_include
            .as_ref()
            .is_none_or(|p| p.is_match(stat))
    }
}

/// Why something was skipped
/// (`uctel_agent_source_errors_total{source="ethtool",reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SkipReason {
    /// `ETHTOOL_GSET` failed other than with `EOPNOTSUPP`: no link series for the interface.
    LinkInfo,
    /// `ETHTOOL_GDRVINFO` failed other than with `EOPNOTSUPP`: no `node_ethtool_info`.
    DriverInfo,
    /// Reading the statistics failed other than with `EOPNOTSUPP` (or their count changed
    /// while reading): no `node_ethtool_<stat>` for the interface.
    Stats,
    /// A statistic dropped because another raw name maps to the same series name.
    DuplicateName,
}

impl SkipReason {
    /// The `reason` label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            SkipReason::LinkInfo => "link_info_error",
            SkipReason::DriverInfo => "driver_info_error",
            SkipReason::Stats => "stats_error",
            SkipReason::DuplicateName => "duplicate_name",
        }
    }
}

/// One thing the collector skipped at one collection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EthtoolSkip {
    /// The interface.
    pub device: String,
    /// Why.
    pub reason: SkipReason,
    /// The error, or the raw statistic names that clashed.
    pub detail: String,
}

/// The series name of raw statistic `stat` (node_exporter 1.5.0 `buildEthtoolFQName`, with
/// `SanitizeMetricName` of `collector/helper.go`).
pub fn series_name(stat: &str) -> String {
    let mut sanitized = String::with_capacity(stat.len());
    let mut run = false;
    for c in stat.chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            if run {
                // `_*[^0-9A-Za-z_]+_*`: the underscores after a run belong to it.
                if c == '_' {
                    continue;
                }
                run = false;
            }
            sanitized.push(c);
        } else if !run {
            while sanitized.ends_with('_') {
                sanitized.pop();
            }
            sanitized.push('_');
            run = true;
        }
    }
    let lower = sanitized.to_lowercase();
    let words = lower.trim_start_matches('_');
    // `(^|_)rx(_|$)` → `${1}received${2}`, then the same for `tx`: leftmost, without
    // overlap, so of two `rx` words in a row only the first is replaced (its match took the
    // `_` the second one needs).
    let mut parts: Vec<&str> = words.split('_').collect();
    for (from, to) in [("rx", "received"), ("tx", "transmitted")] {
        let mut taken = false;
        for p in &mut parts {
            taken = *p == from && !taken;
            if taken {
                *p = to;
            }
        }
    }
    let name = parts.join("_");
    if name.is_empty() {
        "node_ethtool".to_owned()
    } else {
        format!("node_ethtool_{name}")
    }
}

/// Raw names with fixed series in node_exporter 1.5.0 (its pre-populated `entries`): raw
/// name, series name, help.
const FIXED: [(&str, &str, &str); 14] = [
    (
        "rx_bytes",
        "node_ethtool_received_bytes_total",
        "Network interface bytes received",
    ),
    (
        "rx_dropped",
        "node_ethtool_received_dropped_total",
        "Number of received frames dropped",
    ),
    (
        "rx_errors",
        "node_ethtool_received_errors_total",
        "Number of received frames with errors",
    ),
    (
        "rx_packets",
        "node_ethtool_received_packets_total",
        "Network interface packets received",
    ),
    (
        "tx_bytes",
        "node_ethtool_transmitted_bytes_total",
        "Network interface bytes sent",
    ),
    (
        "tx_errors",
        "node_ethtool_transmitted_errors_total",
        "Number of sent frames with errors",
    ),
    (
        "tx_packets",
        "node_ethtool_transmitted_packets_total",
        "Network interface packets sent",
    ),
    (
        "supported_autonegotiate",
        "node_network_autonegotiate_supported",
        "If this port device supports autonegotiate",
    ),
    (
        "supported_pause",
        "node_network_pause_supported",
        "If this port device supports pause frames",
    ),
    (
        "supported_asymmetricpause",
        "node_network_asymmetricpause_supported",
        "If this port device supports asymmetric pause frames",
    ),
    (
        "advertised_autonegotiate",
        "node_network_autonegotiate_advertised",
        "If this port device offers autonegotiate",
    ),
    (
        "advertised_pause",
        "node_network_pause_advertised",
        "If this port device offers pause capability",
    ),
    (
        "advertised_asymmetricpause",
        "node_network_asymmetricpause_advertised",
        "If this port device offers asymmetric pause capability",
    ),
    (
        "autonegotiate",
        "node_network_autonegotiate",
        "If this port is using autonegotiate",
    ),
];

/// The series name and help of raw statistic `stat`, as [`stat_series`] gives them (the
/// fixed names of the seven `rx_`/`tx_` totals, else [`series_name`]).
pub fn series_identity(stat: &str) -> (String, String) {
    match fixed(stat) {
        Some((name, help)) => (name.to_owned(), help.to_owned()),
        None => (series_name(stat), format!("Network interface {stat}")),
    }
}

fn fixed(key: &str) -> Option<(&'static str, &'static str)> {
    FIXED
        .iter()
        .find(|(k, _, _)| *k == key)
        .map(|(_, name, help)| (*name, *help))
}

/// Speed bits node_exporter 1.5.0 reads (`updateSpeeds`): bit, Mb/s, duplex, PHY. Its
/// `2500baseT_Full` (bit 47) is never set in the 32-bit legacy mask, so it is left out.
#[rustfmt::skip]
const SPEEDS: [(u32, u32, &str, &str); 22] = [
    (0, 10, "half", "T"), (1, 10, "full", "T"), (2, 100, "half", "T"), (3, 100, "full", "T"),
    (4, 1000, "half", "T"), (5, 1000, "full", "T"), (12, 10000, "full", "T"),
    (17, 1000, "full", "KX"), (18, 10000, "full", "KX4"), (19, 10000, "full", "KR"),
    (20, 10000, "full", "R_FEC"), (21, 20000, "full", "MLD2"), (22, 20000, "full", "KR2"),
    (23, 40000, "full", "KR4"), (24, 40000, "full", "CR4"), (25, 40000, "full", "SR4"),
    (26, 40000, "full", "LR4"), (27, 56000, "full", "KR4"), (28, 56000, "full", "CR4"),
    (29, 56000, "full", "SR4"), (30, 56000, "full", "LR4"), (31, 25000, "full", "CR"),
];

/// Port bits (`updatePortInfo`): bit, `type` label.
const PORTS: [(u32, &str); 6] = [
    (7, "TP"),
    (8, "AUI"),
    (9, "MII"),
    (10, "FIBRE"),
    (11, "BNC"),
    (16, "Backplane"),
];

const AUTONEG_BIT: u32 = 6;
const PAUSE_BIT: u32 = 13;
const ASYM_PAUSE_BIT: u32 = 14;

const INFO_HELP: &str = "A metric with a constant '1' value labeled by bus_info, device, driver, expansion_rom_version, firmware_version, version.";

fn bit(mask: u32, n: u32) -> f64 {
    f64::from((mask >> n) & 1)
}

/// The link series of one interface (`updateSpeeds`, `updatePortInfo`,
/// `updatePortCapabilities`, `autonegotiate`).
pub fn link_series(device: &str, link: &LinkSettings, out: &mut Vec<Metric>) {
    let speeds = |prefix: &str, help: &str, mask: u32, out: &mut Vec<Metric>| {
        for (b, mbps, duplex, phy) in SPEEDS {
            if mask & (1 << b) != 0 {
                let mode = format!("{mbps}base{phy}");
                out.push(gauge(
                    format!("node_network_{prefix}_speed_bytes"),
                    help,
                    &[("device", device), ("duplex", duplex), ("mode", &mode)],
                    f64::from(mbps) * 125_000.0,
                ));
            }
        }
    };
    let capabilities = |prefix: &str, mask: u32, out: &mut Vec<Metric>| {
        for (what, b) in [
            ("autonegotiate", AUTONEG_BIT),
            ("pause", PAUSE_BIT),
            ("asymmetricpause", ASYM_PAUSE_BIT),
        ] {
            if let Some((name, help)) = fixed(&format!("{prefix}_{what}")) {
                out.push(gauge(name, help, &[("device", device)], bit(mask, b)));
            }
        }
    };
    speeds(
        "supported",
        "Combination of speeds and features supported by network device",
        link.supported,
        out,
    );
    for (b, kind) in PORTS {
        if link.supported & (1 << b) != 0 {
            out.push(gauge(
                "node_network_supported_port_info",
                "Type of ports or PHYs supported by network device",
                &[("device", device), ("type", kind)],
                1.0,
            ));
        }
    }
    capabilities("supported", link.supported, out);
    speeds(
        "advertised",
        "Combination of speeds and features offered by network device",
        link.advertising,
        out,
    );
    capabilities("advertised", link.advertising, out);
    if let Some((name, help)) = fixed("autonegotiate") {
        out.push(gauge(
            name,
            help,
            &[("device", device)],
            f64::from(link.autoneg),
        ));
    }
}

/// The statistic series of one interface from its raw names and values (same length;
/// extra entries of either are ignored), filtered by `section`'s `metrics_include`; names
/// that clash are dropped into `skipped`.
pub fn stat_series(
    section: &EthtoolSection,
    device: &str,
    names: &[String],
    values: &[u64],
    out: &mut Vec<Metric>,
    skipped: &mut Vec<EthtoolSkip>,
) {
    // As node_exporter's library builds a map: empty names skipped, the last value wins.
    let mut stats: BTreeMap<&str, u64> = BTreeMap::new();
    for (name, value) in names.iter().zip(values) {
        if !name.is_empty() {
            stats.insert(name, *value);
        }
    }
    // Series name → raw names mapping to it.
    let mut by_series: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for key in stats.keys().filter(|k| section.includes(k)) {
        by_series.entry(series_name(key)).or_default().push(key);
    }
    for (series, keys) in by_series {
        let [key] = keys.as_slice() else {
            skipped.push(EthtoolSkip {
                device: device.to_owned(),
                reason: SkipReason::DuplicateName,
                detail: format!("{series}: {}", keys.join(", ")),
            });
            continue;
        };
        let value = stats.get(key).copied().unwrap_or_default();
        let help;
        let (name, help) = match fixed(key) {
            Some((name, h)) => (name.to_owned(), h),
            None => {
                help = format!("Network interface {key}");
                (series, help.as_str())
            }
        };
        out.push(sample(
            name,
            help,
            MetricType::Untyped,
            &[("device", device)],
            value as f64,
        ));
    }
}

/// The `ethtool` collector: every interface of `<sys>/class/net` (entries that are not
/// regular files, as node_exporter's `procfs` library lists them) not [`EthtoolSection::ignored`].
///
/// # Errors
/// `<sys>/class/net` cannot be listed, or lists no interface.
pub fn collect(
    section: &EthtoolSection,
    sys: &Path,
    out: &mut Vec<Metric>,
    skipped: &mut Vec<EthtoolSkip>,
) -> Result<(), NodeError> {
    let dir = sys.join("class/net");
    let read_error = |source| NodeError::Read {
        path: dir.clone(),
        source,
    };
    let mut devices = Vec::new();
    for entry in std::fs::read_dir(&dir).map_err(read_error)? {
        let entry = entry.map_err(read_error)?;
        if entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        if let Ok(name) = entry.file_name().into_string() {
            devices.push(name);
        }
    }
    if devices.is_empty() {
        return Err(NodeError::Format {
            path: dir,
            reason: "no network devices found".to_owned(),
        });
    }
    devices.sort();
    let mut values = Vec::new();
    for device in devices.iter().filter(|d| !section.ignored(d)) {
        let mut skip = |reason, e: std::io::Error| {
            if !ethtool::is_unsupported(&e) {
                skipped.push(EthtoolSkip {
                    device: device.clone(),
                    reason,
                    detail: e.to_string(),
                });
            }
        };
        match ethtool::link_settings(device) {
            Ok(link) => link_series(device, &link, out),
            Err(e) => skip(SkipReason::LinkInfo, e),
        }
        match ethtool::driver_info(device) {
            Ok(i) => out.push(gauge(
                "node_ethtool_info",
                INFO_HELP,
                &[
                    ("bus_info", &i.bus_info),
                    ("device", device),
                    ("driver", &i.driver),
                    ("expansion_rom_version", &i.expansion_rom_version),
                    ("firmware_version", &i.firmware_version),
                    ("version", &i.version),
                ],
                1.0,
            )),
            Err(e) => skip(SkipReason::DriverInfo, e),
        }
        let read = StatsReader::open(device).and_then(|mut r| {
            r.read(&mut values)?;
            Ok(r)
        });
        match read {
            Ok(reader) => stat_series(section, device, reader.names(), &values, out, skipped),
            Err(e) => skip(SkipReason::Stats, e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(yaml: &str) -> EthtoolSection {
        serde_yaml::from_str(yaml).expect(yaml)
    }

    #[test]
    fn names_follow_node_exporter() {
        for (raw, want) in [
            ("rx_queue_0_bytes", "node_ethtool_received_queue_0_bytes"),
            (
                "tx_pause_ctrl_phy",
                "node_ethtool_transmitted_pause_ctrl_phy",
            ),
            ("rx_prio3_pause", "node_ethtool_received_prio3_pause"),
            ("rx0_xdp_tx", "node_ethtool_rx0_xdp_transmitted"),
            ("rx_xdp_tx", "node_ethtool_received_xdp_transmitted"),
            ("Tx Errors", "node_ethtool_transmitted_errors"),
            ("rx-bytes", "node_ethtool_received_bytes"),
            ("port.rx_bytes", "node_ethtool_port_received_bytes"),
            ("rx__.__x", "node_ethtool_received_x"),
            ("__rx", "node_ethtool_received"),
            ("a..b", "node_ethtool_a_b"),
            ("a_.b", "node_ethtool_a_b"),
            ("rxtx", "node_ethtool_rxtx"),
            ("rx_tx", "node_ethtool_received_transmitted"),
            ("rx_rx", "node_ethtool_received_rx"),
            ("tx_tx_tx", "node_ethtool_transmitted_tx_transmitted"),
            ("rx__rx", "node_ethtool_received__received"),
            (
                "ch_3_rx_xsk_arfs_err",
                "node_ethtool_ch_3_received_xsk_arfs_err",
            ),
            ("...", "node_ethtool"),
            ("1st", "node_ethtool_1st"),
        ] {
            assert_eq!(series_name(raw), want, "{raw}");
        }
    }

    #[test]
    fn fixed_names_duplicates_and_the_metrics_filter() {
        let names: Vec<String> = [
            "rx_bytes",
            "rx-crc",
            "rx.crc",
            "tx_pause",
            "",
            "rx_pfc",
            "rx_pfc",
            "tx_errors",
        ]
        .map(String::from)
        .to_vec();
        let values = [1, 2, 3, 4, 5, 6, 7, 8];
        let (mut out, mut skipped) = (Vec::new(), Vec::new());
        stat_series(
            &section("{}"),
            "eth9",
            &names,
            &values,
            &mut out,
            &mut skipped,
        );
        let got: Vec<(String, String, f64)> = out
            .iter()
            .map(|m| (m.name.clone(), m.help.clone(), m.value))
            .collect();
        let want = [
            (
                "node_ethtool_received_bytes_total",
                "Network interface bytes received",
                1.0,
            ),
            ("node_ethtool_received_pfc", "Network interface rx_pfc", 7.0),
            (
                "node_ethtool_transmitted_errors_total",
                "Number of sent frames with errors",
                8.0,
            ),
            (
                "node_ethtool_transmitted_pause",
                "Network interface tx_pause",
                4.0,
            ),
        ]
        .map(|(n, h, v)| (n.to_owned(), h.to_owned(), v));
        assert_eq!(got, want);
        assert!(out.iter().all(|m| m.r#type == MetricType::Untyped as i32
            && m.labels.len() == 1
            && m.labels[0].name == "device"
            && m.labels[0].value == "eth9"));
        // `rx-crc` and `rx.crc` both sanitize to `received_crc`: both dropped, counted.
        assert_eq!(skipped.len(), 1, "{skipped:?}");
        assert_eq!(skipped[0].reason, SkipReason::DuplicateName);
        assert_eq!(
            skipped[0].detail,
            "node_ethtool_received_crc: rx-crc, rx.crc"
        );
        // The clash is found on the sanitized name, also for a raw name with a fixed series.
        let two = ["rx_bytes", "rx-bytes"].map(String::from);
        let (mut out2, mut skipped2) = (Vec::new(), Vec::new());
        stat_series(
            &section("{}"),
            "eth9",
            &two,
            &[1, 2],
            &mut out2,
            &mut skipped2,
        );
        assert!(out2.is_empty(), "{out2:?}");
        assert_eq!(skipped2.len(), 1);

        let (mut out, mut skipped) = (Vec::new(), Vec::new());
        let pause = section("metrics_include: 'pause|pfc'");
        stat_series(&pause, "eth9", &names, &values, &mut out, &mut skipped);
        let got: Vec<&str> = out.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(
            got,
            [
                "node_ethtool_received_pfc",
                "node_ethtool_transmitted_pause"
            ]
        );
        assert!(skipped.is_empty());
    }

    #[test]
    fn device_filters_as_node_exporter_applies_them() {
        let all = section("{}");
        assert!(!all.ignored("lo") && !all.ignored("eth0"));
        let include = section("device_include: '^(eth|veth)'");
        assert!(!include.ignored("eth0") && !include.ignored("veth1") && include.ignored("lo"));
        let exclude = section("device_exclude: '^lo$'");
        assert!(exclude.ignored("lo") && !exclude.ignored("lo0"));
        let both = section("device_include: eth\ndevice_exclude: eth1");
        assert!(!both.ignored("eth0") && both.ignored("eth1") && both.ignored("ib0"));
        let empty = section("device_include: ''\ndevice_exclude: ''");
        assert!(!empty.ignored("lo"));
    }

    #[test]
    fn invalid_regexes_are_errors() {
        for yaml in [
            "device_include: '('",
            "device_exclude: '[z-a]'",
            "metrics_include: '*'",
        ] {
            let e = serde_yaml::from_str::<EthtoolSection>(yaml).expect_err(yaml);
            assert!(e.to_string().contains("invalid regex"), "{yaml}: {e}");
        }
        assert!(serde_yaml::from_str::<EthtoolSection>("devices: x").is_err());
    }

    #[test]
    fn link_series_from_mode_bits() {
        // 1000baseT full and half, 10000baseT full, autoneg, TP, pause supported; 1000baseT
        // full and autoneg advertised; autoneg on.
        let link = LinkSettings {
            supported: (1 << 4) | (1 << 5) | (1 << 12) | (1 << 6) | (1 << 7) | (1 << 13),
            advertising: (1 << 5) | (1 << 6),
            autoneg: 1,
            ..LinkSettings::default()
        };
        let mut out = Vec::new();
        link_series("eth0", &link, &mut out);
        let got: Vec<String> = out
            .iter()
            .map(|m| {
                let labels: Vec<String> = m
                    .labels
                    .iter()
                    .map(|l| format!("{}={}", l.name, l.value))
                    .collect();
                format!("{}{{{}}} {}", m.name, labels.join(","), m.value)
            })
            .collect();
        let want = [
            "node_network_supported_speed_bytes{device=eth0,duplex=half,mode=1000baseT} 125000000",
            "node_network_supported_speed_bytes{device=eth0,duplex=full,mode=1000baseT} 125000000",
            "node_network_supported_speed_bytes{device=eth0,duplex=full,mode=10000baseT} 1250000000",
            "node_network_supported_port_info{device=eth0,type=TP} 1",
            "node_network_autonegotiate_supported{device=eth0} 1",
            "node_network_pause_supported{device=eth0} 1",
            "node_network_asymmetricpause_supported{device=eth0} 0",
            "node_network_advertised_speed_bytes{device=eth0,duplex=full,mode=1000baseT} 125000000",
            "node_network_autonegotiate_advertised{device=eth0} 1",
            "node_network_pause_advertised{device=eth0} 0",
            "node_network_asymmetricpause_advertised{device=eth0} 0",
            "node_network_autonegotiate{device=eth0} 1",
        ];
        assert_eq!(got, want);
        assert!(out.iter().all(|m| m.r#type == MetricType::Gauge as i32));
    }

    #[test]
    fn a_sysfs_without_interfaces_fails_and_lo_is_skipped_silently() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut out, mut skipped) = (Vec::new(), Vec::new());
        let s = section("{}");
        assert!(collect(&s, dir.path(), &mut out, &mut skipped).is_err());
        std::fs::create_dir_all(dir.path().join("class/net/lo")).expect("mkdir");
        std::fs::write(dir.path().join("class/net/bonding_masters"), "").expect("write");
        collect(&s, dir.path(), &mut out, &mut skipped).expect("lo");
        // `lo` refuses every ethtool request with EOPNOTSUPP: no series, nothing counted.
        assert!(out.is_empty(), "{out:?}");
        assert!(skipped.is_empty(), "{skipped:?}");
        // An interface that does not exist (ENODEV) is counted, once per request.
        std::fs::create_dir_all(dir.path().join("class/net/uctelnone0")).expect("mkdir");
        collect(&s, dir.path(), &mut out, &mut skipped).expect("missing interface");
        let reasons: Vec<SkipReason> = skipped.iter().map(|s| s.reason).collect();
        assert_eq!(
            reasons,
            [
                SkipReason::LinkInfo,
                SkipReason::DriverInfo,
                SkipReason::Stats
            ]
        );
        assert!(skipped.iter().all(|s| s.device == "uctelnone0"));
    }
}
