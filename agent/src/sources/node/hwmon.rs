//! node_exporter's `hwmon` collector: the hardware monitoring chips of
//! `<sys>/class/hwmon/*` (temperatures, fans, voltages, currents, power, energy, humidity),
//! run by [`crate::sources::host::HostMetrics`].
//!
//! The rules are those of node_exporter 1.5's `collector/hwmon_linux.go`; the sysfs attributes
//! and their units are the kernel's `Documentation/hwmon/sysfs-interface.rst`.
//!
//! - **Chips.** Every directory (or link to one) in `<sys>/class/hwmon` is a chip. Its sensor
//!   files are read from the chip directory and, when `device` exists, from `device/` too (the
//!   layout of older kernels, where the sensor files sat in the device's directory); a file in
//!   `device/` replaces the same file of the chip directory.
//! - **Chip label** (`chip`, [`chip_label`]): the resolved `device` link as
//!   `<parent dir>_<device dir>` (`platform_coretemp_0`, `0000:00:03_1_0000:09:00_0`,
//!   `nvme_nvme0`), else the `name` file (`acpitz`), else the chip directory's own name
//!   (`hwmon3`), each through [`clean_name`]. `node_hwmon_chip_names{chip,chip_name}` = 1 gives
//!   the `name` file, when there is one, for each chip.
//! - **Sensors.** A file name `<type><n>[_<property>]` (`temp1_input`, `fan2_min`, `pwm1`,
//!   `beep_enable`) whose type is one of [`SENSOR_TYPES`] is property `<property>` (empty when
//!   absent) of sensor `<type><n>` (`n` 0 when absent): label `sensor`. A sensor's `label` file
//!   becomes `node_hwmon_sensor_label{chip,label,sensor}` = 1; the label does not rename the
//!   sensor.
//! - **Series** (all gauges but `energy`, labels `chip`, `sensor`): the name is
//!   `node_hwmon_<type>`, then `_<property>` unless the property is `input` (or empty), then a
//!   unit suffix with the value converted from the kernel's unit: `in`, `cpu` → `_volts`
//!   (millivolts × 0.001); `temp` → `_celsius` (millidegrees × 0.001); `curr` → `_amps`
//!   (milliamperes × 0.001); `energy` → `_joule_total`, a counter (microjoules / 10⁶); `power`
//!   → `_watt` (microwatts / 10⁶), but `power*_accuracy` has no suffix (ratio, / 10⁶) and
//!   `power*_average_interval{,_min,_max}` is `_seconds` (milliseconds × 0.001); `humidity` has
//!   no suffix (/ 10⁶, as node_exporter does); `fan` `input`, `min`, `max`, `target` → `_rpm`.
//!   `*_alarm` and `*_fault` are kept as read without a unit (only a property that is exactly
//!   `alarm` or `fault`: `temp1_crit_alarm` is `node_hwmon_temp_crit_alarm_celsius`, × 0.001,
//!   as node_exporter names it), `*_beep` becomes
//!   `node_hwmon_<type>_beep_enabled`, `temp*_type` and every other property (`pwm1`,
//!   `fan1_pulses`, `intrusion0_alarm`, …) are kept as read. The chip-wide files are
//!   `node_hwmon_beep_enabled` (1 when `beep_enable` reads `1`, else 0),
//!   `node_hwmon_voltage_regulator_version` (`vrm`) and `node_hwmon_update_interval_seconds`
//!   (`update_interval`, milliseconds × 0.001).
//! - **Skipped**: a file whose read fails (a sensor answering `EIO`, `EINVAL`, `ENODATA` or
//!   `EAGAIN`, a directory such as `power/`, a dangling link) and a value that is not a number
//!   (Go's `strconv.ParseFloat`) leave out that one series. Each file is read with one
//!   `read(2)` of at most 128 bytes, as node_exporter does against drivers that would block.
//! - **Fails** (`node_scrape_collector_success` 0): no `<sys>/class/hwmon` (node_exporter's
//!   "no data"), or a chip whose directory or `device/` cannot be listed.
//!
//! Known differences from node_exporter: when one chip fails, node_exporter still serves the
//! other chips' series, this collector none (a failed collector's partial output is
//! discarded); file names that are not UTF-8 are skipped; hexadecimal float values (`0x1p3`),
//! which Go's parser accepts, are skipped. Two chips with the same chip label (two `acpitz`
//! zones without a `device` link) give duplicate series, which node_exporter's registry drops.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::sync::OnceLock;

use regex::Regex;

use uctel_protocol::payload::Metric;

use super::NodeError;
use crate::sources::metric::{counter, gauge};

/// The sensor types node_exporter reads; other files (`freq1_input`, `name`, `uevent`) are
/// ignored.
pub const SENSOR_TYPES: [&str; 13] = [
    "vrm",
    "beep_enable",
    "update_interval",
    "in",
    "cpu",
    "fan",
    "pwm",
    "temp",
    "curr",
    "power",
    "energy",
    "humidity",
    "intrusion",
];

/// How much of a sensor file is read, in bytes (node_exporter's `sysReadFile`).
const READ_LIMIT: usize = 128;

/// A sensor's properties: property (`input`, `max`, `` for `pwm1`) → raw value, `\n` trimmed.
type Sensor = BTreeMap<String, Vec<u8>>;

/// `hwmon`: every chip of `<sys>/class/hwmon` → the series of the module documentation.
///
/// # Errors
/// [`NodeError::Read`] when `<sys>/class/hwmon` cannot be listed (missing included), or when a
/// chip's directory or `device/` cannot be listed; the other chips are still read, and the last
/// such error is returned.
pub fn hwmon(sys: &Path, out: &mut Vec<Metric>) -> Result<(), NodeError> {
    let dir = sys.join("class/hwmon");
    let read_err = |path: &Path, source| NodeError::Read {
        path: path.to_owned(),
        source,
    };
    let mut chips = Vec::new();
    for entry in std::fs::read_dir(&dir).map_err(|e| read_err(&dir, e))? {
        chips.push(entry.map_err(|e| read_err(&dir, e))?.path());
    }
    chips.sort();
    let mut last_error = None;
    for chip in chips {
        // `metadata` follows a link; a dangling one or a plain file is no chip.
        if !std::fs::metadata(&chip).is_ok_and(|m| m.is_dir()) {
            continue;
        }
        if let Err(e) = collect_chip(&chip, out) {
            last_error = Some(e);
        }
    }
    last_error.map_or(Ok(()), Err)
}

/// One chip directory's series.
fn collect_chip(dir: &Path, out: &mut Vec<Metric>) -> Result<(), NodeError> {
    let chip = chip_label(dir).map_err(|source| NodeError::Read {
        path: dir.to_owned(),
        source,
    })?;
    let mut sensors: BTreeMap<String, (&'static str, Sensor)> = BTreeMap::new();
    read_sensors(dir, &mut sensors)?;
    let device = dir.join("device");
    if std::fs::metadata(&device).is_ok() {
        read_sensors(&device, &mut sensors)?;
    }
    if let Ok(raw) = std::fs::read(dir.join("name")) {
        let chip_name = clean_name(&raw);
        if !chip_name.is_empty() {
            out.push(gauge(
                "node_hwmon_chip_names",
                "Annotation metric for human-readable chip names",
                &[("chip", &chip), ("chip_name", &chip_name)],
                1.0,
            ));
        }
    }
    for (sensor, (kind, props)) in &sensors {
        sensor_series(&chip, sensor, kind, props, out);
    }
    Ok(())
}

/// The `chip` label of the chip directory `dir` (node_exporter's `hwmonName`): the resolved
/// `device` link's parent and own directory names (`/sys/devices/platform/coretemp.0` →
/// `platform_coretemp_0`), or its own name alone when the parent's is empty after cleaning;
/// else the cleaned `name` file; else the cleaned last component of `dir` resolved.
///
/// # Errors
/// The error of resolving `dir` when neither `device` nor `name` gives a label, or
/// `InvalidData` when the last component cleans to nothing.
pub fn chip_label(dir: &Path) -> std::io::Result<String> {
    use std::os::unix::ffi::OsStrExt;
    let name_of = |p: &Path| clean_name(p.file_name().map(|n| n.as_bytes()).unwrap_or_default());
    if let Ok(device) = std::fs::canonicalize(dir.join("device")) {
        let dev_name = name_of(&device);
        let dev_type = device.parent().map(name_of).unwrap_or_default();
        if !dev_type.is_empty() && !dev_name.is_empty() {
            return Ok(format!("{dev_type}_{dev_name}"));
        }
        if !dev_name.is_empty() {
            return Ok(dev_name);
        }
    }
    if let Ok(raw) = std::fs::read(dir.join("name")) {
        let name = clean_name(&raw);
        if !name.is_empty() {
            return Ok(name);
        }
    }
    let name = name_of(&std::fs::canonicalize(dir)?);
    if name.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "no chip name from device, name or directory",
        ));
    }
    Ok(name)
}

/// node_exporter's `cleanMetricName`: lower case, every character outside `[a-z0-9:_]` (each
/// byte that is not UTF-8 too) replaced by `_`, leading and trailing `_` removed.
pub fn clean_name(raw: &[u8]) -> String {
    let mut s = String::with_capacity(raw.len());
    for chunk in raw.utf8_chunks() {
        for c in chunk.valid().chars() {
            // Go's simple case mapping: the first character of Rust's full lower case.
            let lower = c.to_lowercase().next().unwrap_or(c);
            let keep = lower.is_ascii_lowercase() || lower.is_ascii_digit() || ":_".contains(lower);
            s.push(if keep { lower } else { '_' });
        }
        s.extend(chunk.invalid().iter().map(|_| '_'));
    }
    s.trim_matches('_').to_owned()
}

/// A file name split as node_exporter's `explodeSensorFilename`: (type, number, property), the
/// number 0 and the property empty when absent; `None` when the name has no such shape or the
/// number does not fit an `i64`.
pub fn split_sensor_file(name: &str) -> Option<(&str, i64, &str)> {
    static RE: OnceLock<Option<Regex>> = OnceLock::new();
    let re = RE
        .get_or_init(|| Regex::new(r"^(?P<type>[^0-9]+)(?P<id>[0-9]*)?(_(?P<property>.+))?$").ok())
        .as_ref()?;
    let caps = re.captures(name)?;
    let kind = caps.name("type")?.as_str();
    let id = match caps.name("id").map(|m| m.as_str()) {
        None | Some("") => 0,
        Some(digits) => digits.parse().ok()?,
    };
    let property = caps.name("property").map_or("", |m| m.as_str());
    Some((kind, id, property))
}

/// Adds the readable sensor files of `dir` to `sensors` (sensor → (type, properties)).
fn read_sensors(
    dir: &Path,
    sensors: &mut BTreeMap<String, (&'static str, Sensor)>,
) -> Result<(), NodeError> {
    let read_err = |source| NodeError::Read {
        path: dir.to_owned(),
        source,
    };
    for entry in std::fs::read_dir(dir).map_err(read_err)? {
        let entry = entry.map_err(read_err)?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        let Some((kind, id, property)) = split_sensor_file(&name) else {
            continue;
        };
        let Some(kind) = SENSOR_TYPES.iter().copied().find(|t| *t == kind) else {
            continue;
        };
        let Some(value) = read_value(&entry.path()) else {
            continue;
        };
        sensors
            .entry(format!("{kind}{id}"))
            .or_insert_with(|| (kind, Sensor::new()))
            .1
            .insert(property.to_owned(), value);
    }
    Ok(())
}

/// One `read(2)` of at most [`READ_LIMIT`] bytes, `\n` trimmed at both ends; `None` when the
/// open or the read fails.
fn read_value(path: &Path) -> Option<Vec<u8>> {
    let mut file = std::fs::File::open(path).ok()?;
    let mut buf = [0u8; READ_LIMIT];
    let n = file.read(&mut buf).ok()?;
    let value = buf.get(..n)?;
    let start = value
        .iter()
        .position(|b| *b != b'\n')
        .unwrap_or(value.len());
    let end = value
        .iter()
        .rposition(|b| *b != b'\n')
        .map_or(start, |i| i + 1);
    Some(value.get(start..end)?.to_vec())
}

/// Go's `strconv.ParseFloat(s, 64)` for decimal input: `None` for what it rejects (empty,
/// spaces, a sign before `nan`, out of range).
pub fn parse_go_float(raw: &[u8]) -> Option<f64> {
    let s = std::str::from_utf8(raw).ok()?;
    let unsigned = s.strip_prefix(['+', '-']);
    if unsigned.is_some_and(|u| u.starts_with(['n', 'N'])) {
        return None;
    }
    let value: f64 = s.parse().ok()?;
    let literal_inf = unsigned
        .unwrap_or(s)
        .get(..3)
        .is_some_and(|p| p.eq_ignore_ascii_case("inf"));
    (!value.is_infinite() || literal_inf).then_some(value)
}

/// Go's `strings.ToValidUTF8(s, "\u{FFFD}")`: each run of bytes that are not UTF-8 becomes
/// one replacement character.
fn valid_utf8(raw: &[u8]) -> String {
    let mut s = String::with_capacity(raw.len());
    let mut in_invalid = false;
    for chunk in raw.utf8_chunks() {
        if !chunk.valid().is_empty() {
            s.push_str(chunk.valid());
            in_invalid = false;
        }
        if !chunk.invalid().is_empty() && !in_invalid {
            s.push('\u{FFFD}');
            in_invalid = true;
        }
    }
    s
}

/// The series of one sensor (see the module documentation).
fn sensor_series(chip: &str, sensor: &str, kind: &str, props: &Sensor, out: &mut Vec<Metric>) {
    let labels = [("chip", chip), ("sensor", sensor)];
    if let Some(label) = props.get("label") {
        out.push(gauge(
            "node_hwmon_sensor_label",
            "Label for given chip and sensor",
            &[
                ("chip", chip),
                ("label", &valid_utf8(label)),
                ("sensor", sensor),
            ],
            1.0,
        ));
    }
    let whole = props.get("").map(|v| v.as_slice());
    match kind {
        "beep_enable" => {
            let on = if whole == Some(b"1") { 1.0 } else { 0.0 };
            out.push(gauge(
                "node_hwmon_beep_enabled",
                "Hardware beep enabled",
                &labels,
                on,
            ));
            return;
        }
        "vrm" => {
            if let Some(v) = parse_go_float(whole.unwrap_or_default()) {
                out.push(gauge(
                    "node_hwmon_voltage_regulator_version",
                    "Hardware voltage regulator",
                    &labels,
                    v,
                ));
            }
            return;
        }
        "update_interval" => {
            if let Some(v) = parse_go_float(whole.unwrap_or_default()) {
                out.push(gauge(
                    "node_hwmon_update_interval_seconds",
                    "Hardware monitor update interval",
                    &labels,
                    v * 0.001,
                ));
            }
            return;
        }
        _ => {}
    }
    for (element, raw) in props {
        if element == "label" {
            continue;
        }
        let mut name = format!("node_hwmon_{kind}");
        if element == "input" {
            // `input` is the value itself, unless the sensor also has a bare `<type><n>` file.
            if whole.is_some() {
                name.push_str("_input");
            }
        } else if !element.is_empty() {
            name.push('_');
            name.push_str(&clean_name(element.as_bytes()));
        }
        let Some(value) = parse_go_float(raw) else {
            continue;
        };
        let (name, help, value) = named_value(name, kind, element, value);
        if kind == "energy" {
            out.push(counter(name, &help, &labels, value));
        } else {
            out.push(gauge(name, &help, &labels, value));
        }
    }
}

/// The full name (unit suffix added), help and converted value of one property `element` of a
/// sensor of type `kind`, named `name` so far, read as `value` (node_exporter's rules, in its
/// order).
fn named_value(name: String, kind: &str, element: &str, value: f64) -> (String, String, f64) {
    if element == "fault" || element == "alarm" {
        let help = format!("Hardware sensor {element} status ({kind})");
        return (name, help, value);
    }
    if element == "beep" {
        let help = "Hardware monitor sensor has beeping enabled".to_owned();
        return (format!("{name}_enabled"), help, value);
    }
    match kind {
        "in" | "cpu" => (
            format!("{name}_volts"),
            format!("Hardware monitor for voltage ({element})"),
            value * 0.001,
        ),
        "temp" if element != "type" => {
            let element = if element.is_empty() { "input" } else { element };
            (
                format!("{name}_celsius"),
                format!("Hardware monitor for temperature ({element})"),
                value * 0.001,
            )
        }
        "curr" => (
            format!("{name}_amps"),
            format!("Hardware monitor for current ({element})"),
            value * 0.001,
        ),
        "energy" => (
            format!("{name}_joule_total"),
            format!("Hardware monitor for joules used so far ({element})"),
            value / 1000000.0,
        ),
        "power" if element == "accuracy" => (
            name,
            "Hardware monitor power meter accuracy, as a ratio".to_owned(),
            value / 1000000.0,
        ),
        "power"
            if matches!(
                element,
                "average_interval" | "average_interval_min" | "average_interval_max"
            ) =>
        {
            (
                format!("{name}_seconds"),
                format!("Hardware monitor power usage update interval ({element})"),
                value * 0.001,
            )
        }
        "power" => (
            format!("{name}_watt"),
            format!("Hardware monitor for power usage in watts ({element})"),
            value / 1000000.0,
        ),
        "humidity" => (
            name,
            format!(
                "Hardware monitor for humidity, as a ratio (multiply with 100.0 to get the \
                 humidity as a percentage) ({element})"
            ),
            value / 1000000.0,
        ),
        "fan" if matches!(element, "input" | "min" | "max" | "target") => (
            format!("{name}_rpm"),
            format!("Hardware monitor for fan revolutions per minute ({element})"),
            value,
        ),
        _ => (
            name,
            format!("Hardware monitor {kind} element {element}"),
            value,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The fixture tree and the line rendering of the `node` collectors' tests.
    use super::super::testutil::{help_of, lines, tree};

    /// A symbolic link `root/rel` → `target`, as sysfs has them.
    fn link(root: &Path, rel: &str, target: &str) {
        let path = root.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap_or_else(|e| panic!("{e}"));
        }
        std::os::unix::fs::symlink(target, &path).unwrap_or_else(|e| panic!("{e}"));
    }

    fn collect(root: &Path) -> Vec<String> {
        let mut out = Vec::new();
        hwmon(root, &mut out).unwrap_or_else(|e| panic!("{e}"));
        lines(&out)
    }

    #[test]
    fn coretemp_chip_with_device_link() {
        let dev = "devices/platform/coretemp.0";
        let hw = format!("{dev}/hwmon/hwmon1");
        let files: Vec<(String, &str)> = [
            ("name", "coretemp\n"),
            ("temp1_input", "45000\n"),
            ("temp1_crit", "100000\n"),
            ("temp1_crit_alarm", "0\n"),
            ("temp1_max", "80000\n"),
            ("temp1_label", "Package id 0\n"),
            ("temp2_input", "43000\n"),
            ("temp2_label", "Core 0\n"),
            ("uevent", ""),
            ("power/runtime_status", "unsupported\n"),
        ]
        .iter()
        .map(|(f, v)| (format!("{hw}/{f}"), *v))
        .chain([(format!("{dev}/modalias"), "platform:coretemp\n")])
        .collect();
        let refs: Vec<(&str, &str)> = files.iter().map(|(p, v)| (p.as_str(), *v)).collect();
        let d = tree(&refs);
        link(d.path(), &format!("{hw}/device"), "../../../coretemp.0");
        link(
            d.path(),
            "class/hwmon/hwmon1",
            "../../devices/platform/coretemp.0/hwmon/hwmon1",
        );
        let chip = "chip=\"platform_coretemp_0\"";
        assert_eq!(
            collect(d.path()),
            [
                format!("node_hwmon_chip_names{{{chip},chip_name=\"coretemp\"}} gauge 1"),
                format!(
                    "node_hwmon_sensor_label{{{chip},label=\"Package id 0\",sensor=\"temp1\"}} gauge 1"
                ),
                format!("node_hwmon_temp_crit_celsius{{{chip},sensor=\"temp1\"}} gauge 100"),
                format!("node_hwmon_temp_crit_alarm_celsius{{{chip},sensor=\"temp1\"}} gauge 0"),
                format!("node_hwmon_temp_celsius{{{chip},sensor=\"temp1\"}} gauge 45"),
                format!("node_hwmon_temp_max_celsius{{{chip},sensor=\"temp1\"}} gauge 80"),
                format!(
                    "node_hwmon_sensor_label{{{chip},label=\"Core 0\",sensor=\"temp2\"}} gauge 1"
                ),
                format!("node_hwmon_temp_celsius{{{chip},sensor=\"temp2\"}} gauge 43"),
            ]
        );
        let mut out = Vec::new();
        hwmon(d.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        for (name, help) in [
            (
                "node_hwmon_chip_names",
                "Annotation metric for human-readable chip names",
            ),
            ("node_hwmon_sensor_label", "Label for given chip and sensor"),
            (
                "node_hwmon_temp_celsius",
                "Hardware monitor for temperature (input)",
            ),
            (
                "node_hwmon_temp_crit_alarm_celsius",
                "Hardware monitor for temperature (crit_alarm)",
            ),
        ] {
            assert_eq!(help_of(&out, name), Some(help), "{name}");
        }
    }

    #[test]
    fn chip_label_prefers_device_then_name_then_directory() {
        let d = tree(&[
            (
                "devices/pci0000:00/0000:00:03.1/0000:09:00.0/vendor",
                "0x1002\n",
            ),
            (
                "devices/pci0000:00/0000:00:03.1/0000:09:00.0/hwmon/hwmon2/name",
                "amdgpu\n",
            ),
            (
                "devices/pci0000:00/0000:00:01.2/0000:02:00.0/nvme/nvme0/dev",
                "259:0\n",
            ),
            (
                "devices/virtual/thermal/thermal_zone0/hwmon0/name",
                "acpitz\n",
            ),
            ("devices/virtual/misc/hwmon7/temp1_input", "1\n"),
            ("devices/virtual/odd/hwmon8/name", "Foo Sensor-1 \n"),
            ("devices/virtual/odd/hwmon9/name", "---\n"),
            ("devices/a.b/x.Y/hwmon3/name", "n\n"),
        ]);
        let root = d.path();
        link(
            root,
            "devices/pci0000:00/0000:00:03.1/0000:09:00.0/hwmon/hwmon2/device",
            "../../../0000:09:00.0",
        );
        link(
            root,
            "devices/pci0000:00/0000:00:01.2/0000:02:00.0/nvme/nvme0/hwmon5/device",
            "../../nvme0",
        );
        link(root, "devices/virtual/odd/hwmon9/device", "../../nowhere");
        link(root, "devices/a.b/x.Y/hwmon3/device", "..");
        let label = |rel: &str| chip_label(&root.join(rel)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            label("devices/pci0000:00/0000:00:03.1/0000:09:00.0/hwmon/hwmon2"),
            "0000:00:03_1_0000:09:00_0"
        );
        assert_eq!(
            label("devices/pci0000:00/0000:00:01.2/0000:02:00.0/nvme/nvme0/hwmon5"),
            "nvme_nvme0"
        );
        assert_eq!(
            label("devices/virtual/thermal/thermal_zone0/hwmon0"),
            "acpitz"
        );
        assert_eq!(label("devices/virtual/misc/hwmon7"), "hwmon7");
        assert_eq!(label("devices/virtual/odd/hwmon8"), "foo_sensor_1");
        // A dangling `device` link and a name that cleans to nothing: the directory's name.
        assert_eq!(label("devices/virtual/odd/hwmon9"), "hwmon9");
        assert_eq!(label("devices/a.b/x.Y/hwmon3"), "a_b_x_y");
        assert!(chip_label(&root.join("devices/none")).is_err());
    }

    #[test]
    fn clean_name_is_go_clean_metric_name() {
        for (raw, want) in [
            (&b"coretemp.0"[..], "coretemp_0"),
            (b"Platform", "platform"),
            (b"__Foo Bar__\n", "foo_bar"),
            (b"pci0000:00", "pci0000:00"),
            (b"caf\xc3\xa9", "caf"),
            (b"a\xc3\xa9b", "a_b"),
            (b"a\xff\xfeb", "a__b"),
            (b"\xe2\x84\xaaelvin", "kelvin"),
            (b"", ""),
            (b"---", ""),
        ] {
            assert_eq!(clean_name(raw), want, "{raw:?}");
        }
    }

    #[test]
    fn sensor_file_names_split_like_node_exporter() {
        for (name, want) in [
            ("temp1_input", Some(("temp", 1, "input"))),
            ("temp1_crit_alarm", Some(("temp", 1, "crit_alarm"))),
            (
                "power1_average_interval",
                Some(("power", 1, "average_interval")),
            ),
            ("pwm1", Some(("pwm", 1, ""))),
            ("temp01_max", Some(("temp", 1, "max"))),
            ("beep_enable", Some(("beep_enable", 0, ""))),
            ("update_interval", Some(("update_interval", 0, ""))),
            ("fan_input", Some(("fan_input", 0, ""))),
            ("in_foo0bar", Some(("in", 0, "foo0bar"))),
            (
                "temp1_auto_point1_pwm",
                Some(("temp", 1, "auto_point1_pwm")),
            ),
            ("in0abc", None),
            ("in0_", None),
            ("1temp", None),
            ("temp99999999999999999999_input", None),
            ("", None),
        ] {
            assert_eq!(split_sensor_file(name), want, "{name:?}");
        }
    }

    #[test]
    fn go_float_parsing() {
        for (raw, want) in [
            (&b"45000"[..], Some(45000.0)),
            (b"-273150", Some(-273150.0)),
            (b"+1.5e3", Some(1500.0)),
            (b".5", Some(0.5)),
            (b"Inf", Some(f64::INFINITY)),
            (b"-infinity", Some(f64::NEG_INFINITY)),
            (b"1e400", None),
            (b"-1e400", None),
            (b"", None),
            (b" 1", None),
            (b"1 ", None),
            (b"N/A", None),
            (b"1_000", None),
            (b"+nan", None),
            (b"\xff", None),
        ] {
            assert_eq!(parse_go_float(raw), want, "{raw:?}");
        }
        assert!(parse_go_float(b"NaN").is_some_and(f64::is_nan));
    }

    #[test]
    fn units_and_names_of_every_sensor_type() {
        let hw = "class/hwmon/hwmon0";
        let files: Vec<(String, &str)> = [
            ("in0_input", "1016\n"),
            ("in0_min", "0\n"),
            ("in0_alarm", "1\n"),
            ("in0_beep", "0\n"),
            ("cpu0_vid", "1550\n"),
            ("vrm", "90\n"),
            ("fan1_input", "1032\n"),
            ("fan1_min", "300\n"),
            ("fan1_target", "1100\n"),
            ("fan1_pulses", "2\n"),
            ("fan1_fault", "0\n"),
            ("pwm1", "153\n"),
            ("pwm1_enable", "5\n"),
            ("temp1", "41000\n"),
            ("temp1_type", "4\n"),
            ("temp2", "40000\n"),
            ("temp2_input", "42000\n"),
            ("curr1_input", "1500\n"),
            ("power1_input", "5000000\n"),
            ("power1_accuracy", "25000\n"),
            ("power1_average_interval", "1000\n"),
            ("energy1_input", "123456789\n"),
            ("humidity1_input", "45123\n"),
            ("intrusion0_alarm", "1\n"),
            ("beep_enable", "1\n"),
            ("update_interval", "2000\n"),
            ("freq1_input", "500000000\n"),
        ]
        .iter()
        .map(|(f, v)| (format!("{hw}/{f}"), *v))
        .collect();
        let refs: Vec<(&str, &str)> = files.iter().map(|(p, v)| (p.as_str(), *v)).collect();
        let d = tree(&refs);
        let mut out = Vec::new();
        hwmon(d.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        let l = |name: &str, sensor: &str, ty: &str, v: &str| {
            format!("{name}{{chip=\"hwmon0\",sensor=\"{sensor}\"}} {ty} {v}")
        };
        assert_eq!(
            lines(&out),
            [
                l("node_hwmon_beep_enabled", "beep_enable0", "gauge", "1"),
                l("node_hwmon_cpu_vid_volts", "cpu0", "gauge", "1.55"),
                l("node_hwmon_curr_amps", "curr1", "gauge", "1.5"),
                l(
                    "node_hwmon_energy_joule_total",
                    "energy1",
                    "counter",
                    "123.456789"
                ),
                l("node_hwmon_fan_fault", "fan1", "gauge", "0"),
                l("node_hwmon_fan_rpm", "fan1", "gauge", "1032"),
                l("node_hwmon_fan_min_rpm", "fan1", "gauge", "300"),
                l("node_hwmon_fan_pulses", "fan1", "gauge", "2"),
                l("node_hwmon_fan_target_rpm", "fan1", "gauge", "1100"),
                l("node_hwmon_humidity", "humidity1", "gauge", "0.045123"),
                l("node_hwmon_in_alarm", "in0", "gauge", "1"),
                l("node_hwmon_in_beep_enabled", "in0", "gauge", "0"),
                l("node_hwmon_in_volts", "in0", "gauge", "1.016"),
                l("node_hwmon_in_min_volts", "in0", "gauge", "0"),
                l("node_hwmon_intrusion_alarm", "intrusion0", "gauge", "1"),
                l("node_hwmon_power_accuracy", "power1", "gauge", "0.025"),
                l(
                    "node_hwmon_power_average_interval_seconds",
                    "power1",
                    "gauge",
                    "1"
                ),
                l("node_hwmon_power_watt", "power1", "gauge", "5"),
                l("node_hwmon_pwm", "pwm1", "gauge", "153"),
                l("node_hwmon_pwm_enable", "pwm1", "gauge", "5"),
                l("node_hwmon_temp_celsius", "temp1", "gauge", "41"),
                l("node_hwmon_temp_type", "temp1", "gauge", "4"),
                l("node_hwmon_temp_celsius", "temp2", "gauge", "40"),
                l("node_hwmon_temp_input_celsius", "temp2", "gauge", "42"),
                l(
                    "node_hwmon_update_interval_seconds",
                    "update_interval0",
                    "gauge",
                    "2"
                ),
                l(
                    "node_hwmon_voltage_regulator_version",
                    "vrm0",
                    "gauge",
                    "90"
                ),
            ]
        );
        for (name, help) in [
            ("node_hwmon_beep_enabled", "Hardware beep enabled"),
            (
                "node_hwmon_cpu_vid_volts",
                "Hardware monitor for voltage (vid)",
            ),
            (
                "node_hwmon_curr_amps",
                "Hardware monitor for current (input)",
            ),
            (
                "node_hwmon_energy_joule_total",
                "Hardware monitor for joules used so far (input)",
            ),
            ("node_hwmon_fan_fault", "Hardware sensor fault status (fan)"),
            (
                "node_hwmon_fan_rpm",
                "Hardware monitor for fan revolutions per minute (input)",
            ),
            (
                "node_hwmon_fan_pulses",
                "Hardware monitor fan element pulses",
            ),
            (
                "node_hwmon_humidity",
                "Hardware monitor for humidity, as a ratio (multiply with 100.0 to get the \
                 humidity as a percentage) (input)",
            ),
            (
                "node_hwmon_in_beep_enabled",
                "Hardware monitor sensor has beeping enabled",
            ),
            (
                "node_hwmon_intrusion_alarm",
                "Hardware sensor alarm status (intrusion)",
            ),
            (
                "node_hwmon_power_accuracy",
                "Hardware monitor power meter accuracy, as a ratio",
            ),
            (
                "node_hwmon_power_average_interval_seconds",
                "Hardware monitor power usage update interval (average_interval)",
            ),
            (
                "node_hwmon_power_watt",
                "Hardware monitor for power usage in watts (input)",
            ),
            ("node_hwmon_pwm", "Hardware monitor pwm element "),
            ("node_hwmon_temp_type", "Hardware monitor temp element type"),
            (
                "node_hwmon_temp_input_celsius",
                "Hardware monitor for temperature (input)",
            ),
            (
                "node_hwmon_update_interval_seconds",
                "Hardware monitor update interval",
            ),
            (
                "node_hwmon_voltage_regulator_version",
                "Hardware voltage regulator",
            ),
        ] {
            assert_eq!(help_of(&out, name), Some(help), "{name}");
        }
    }

    #[test]
    fn unreadable_and_garbage_files_are_skipped() {
        let hw = "class/hwmon/hwmon0";
        let long_label = "x".repeat(200);
        let files: Vec<(String, &str)> = [
            ("temp1_input", "N/A\n"),
            ("temp2_input", ""),
            ("temp3_input", " 42\n"),
            ("temp4_max", "\n\n1000\n\n"),
            ("temp4_label", long_label.as_str()),
            ("temp6_input", "7000\n"),
            ("in0_input/x", "1\n"),
            ("beep_enable", "yes\n"),
            ("vrm", "abc\n"),
            (
                "fan1_input",
                "12345678901234567890123456789012345678901234567890\n",
            ),
        ]
        .iter()
        .map(|(f, v)| (format!("{hw}/{f}"), *v))
        .collect();
        let refs: Vec<(&str, &str)> = files.iter().map(|(p, v)| (p.as_str(), *v)).collect();
        let d = tree(&refs);
        // A sensor answering EIO (reading /proc/self/mem at offset 0 does), a dangling link,
        // a label that is not UTF-8.
        link(d.path(), &format!("{hw}/temp5_input"), "/proc/self/mem");
        link(d.path(), &format!("{hw}/temp6_max"), "nowhere");
        std::fs::write(d.path().join(hw).join("temp6_label"), b"CPU\xff\xfe 0\n")
            .unwrap_or_else(|e| panic!("{e}"));
        let chip = "chip=\"hwmon0\"";
        assert_eq!(
            collect(d.path()),
            [
                format!("node_hwmon_beep_enabled{{{chip},sensor=\"beep_enable0\"}} gauge 0"),
                format!("node_hwmon_fan_rpm{{{chip},sensor=\"fan1\"}} gauge 12345678901234567000000000000000000000000000000000"),
                format!(
                    "node_hwmon_sensor_label{{{chip},label=\"{}\",sensor=\"temp4\"}} gauge 1",
                    "x".repeat(READ_LIMIT)
                ),
                format!("node_hwmon_temp_max_celsius{{{chip},sensor=\"temp4\"}} gauge 1"),
                format!(
                    "node_hwmon_sensor_label{{{chip},label=\"CPU\u{FFFD} 0\",sensor=\"temp6\"}} gauge 1"
                ),
                format!("node_hwmon_temp_celsius{{{chip},sensor=\"temp6\"}} gauge 7"),
            ]
        );
    }

    #[test]
    fn older_layout_reads_the_device_directory() {
        let dev = "devices/platform/w83627ehf.2576";
        let d = tree(&[
            (&format!("{dev}/name"), "w83627ehf\n"),
            (&format!("{dev}/fan1_input"), "2000\n"),
            (&format!("{dev}/in0_input"), "1000\n"),
            (&format!("{dev}/power/control"), "auto\n"),
            (&format!("{dev}/hwmon/hwmon3/uevent"), ""),
            (&format!("{dev}/hwmon/hwmon3/in0_input"), "900\n"),
        ]);
        link(
            d.path(),
            &format!("{dev}/hwmon/hwmon3/device"),
            "../../../w83627ehf.2576",
        );
        link(
            d.path(),
            "class/hwmon/hwmon3",
            &format!("../../{dev}/hwmon/hwmon3"),
        );
        // Not chips: a plain file and a dangling link.
        std::fs::write(d.path().join("class/hwmon/README"), "x").unwrap_or_else(|e| panic!("{e}"));
        link(d.path(), "class/hwmon/hwmon4", "../../devices/gone");
        let chip = "chip=\"platform_w83627ehf_2576\"";
        // `device/in0_input` replaces the chip directory's; no `name` in the chip directory:
        // no `node_hwmon_chip_names`.
        assert_eq!(
            collect(d.path()),
            [
                format!("node_hwmon_fan_rpm{{{chip},sensor=\"fan1\"}} gauge 2000"),
                format!("node_hwmon_in_volts{{{chip},sensor=\"in0\"}} gauge 1"),
            ]
        );
    }

    #[test]
    fn no_hwmon_class_fails_and_an_empty_one_succeeds() {
        assert!(hwmon(tree(&[]).path(), &mut Vec::new()).is_err());
        let d = tree(&[("class/hwmon/.keep", "")]);
        assert!(collect(d.path()).is_empty());
        // A chip whose `device` is not a directory cannot be listed: a failure.
        let bad = tree(&[
            ("class/hwmon/hwmon0/device", "x"),
            ("class/hwmon/hwmon0/name", "a\n"),
        ]);
        assert!(hwmon(bad.path(), &mut Vec::new()).is_err());
    }
}
