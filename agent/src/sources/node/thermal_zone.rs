//! node_exporter's `thermal_zone` collector (`collector/thermal_zone_linux.go`): the
//! temperatures of `<sys>/class/thermal/thermal_zone*` and the states of its cooling devices.

use std::io::ErrorKind;
use std::path::Path;
use uctel_protocol::payload::Metric;

use super::files::{glob_numbered, parse_int, read_trimmed};
use super::NodeError;
use crate::sources::metric::gauge;

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

#[cfg(test)]
mod tests {
    use super::super::testutil::{help_of, lines, tree};
    use super::*;

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
}
