//! node_exporter's `time` collector (`collector/time.go`, `time_linux.go` and the `procfs`
//! library's `sysfs/clocksource.go`): the system clock, its time zone and clock sources.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use uctel_protocol::payload::Metric;

use super::files::{glob_numbered, read_trimmed};
use super::NodeError;
use crate::sources::metric::gauge;
use crate::sources::sys::clock;

/// `time`: `node_time_seconds` (the system clock, seconds since the epoch with nanoseconds),
/// `node_time_zone_offset_seconds{time_zone}` (the local zone's abbreviation and its offset
/// east of UTC, as localtime(3) finds them from `TZ` or `/etc/localtime`), and per clock
/// source device `<sys>/devices/system/clocksource/clocksource[0-9]*`
/// `node_time_clocksource_available_info{clocksource,device}` (each name of
/// `available_clocksource`) and `node_time_clocksource_current_info{clocksource,device}`
/// (`current_clocksource`), all 1. `device` is the device's position in the sorted listing
/// (`0`, `1`, …), as node_exporter numbers it.
///
/// # Errors
/// A clock source device whose files cannot be read (no devices is not an error).
pub fn time(sys: &Path, out: &mut Vec<Metric>) -> Result<(), NodeError> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    out.push(gauge(
        "node_time_seconds",
        "System time in seconds since epoch (1970).",
        &[],
        now.as_secs_f64(),
    ));
    let seconds = i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
    if let Some((zone, offset)) = clock::local_zone(seconds) {
        out.push(gauge(
            "node_time_zone_offset_seconds",
            "System time zone offset in seconds.",
            &[("time_zone", &zone)],
            offset as f64,
        ));
    }
    let dir = sys.join("devices/system/clocksource");
    for (index, (_, path)) in glob_numbered(&dir, "clocksource").into_iter().enumerate() {
        let available = read_trimmed(&path.join("available_clocksource"))?;
        let current = read_trimmed(&path.join("current_clocksource"))?;
        let device = index.to_string();
        for name in available.split_whitespace() {
            out.push(gauge(
                "node_time_clocksource_available_info",
                "Available clocksources read from '/sys/devices/system/clocksource'.",
                &[("clocksource", name), ("device", &device)],
                1.0,
            ));
        }
        out.push(gauge(
            "node_time_clocksource_current_info",
            "Current clocksource read from '/sys/devices/system/clocksource'.",
            &[("clocksource", &current), ("device", &device)],
            1.0,
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{help_of, lines, tree};
    use super::*;

    #[test]
    fn clock_sources_are_numbered_by_position_and_list_every_available_name() {
        let d = tree(&[
            (
                "devices/system/clocksource/clocksource0/available_clocksource",
                "tsc hpet acpi_pm \n",
            ),
            (
                "devices/system/clocksource/clocksource0/current_clocksource",
                "tsc\n",
            ),
        ]);
        let mut out = Vec::new();
        time(d.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        let got = lines(&out);
        assert!(got[0].starts_with("node_time_seconds{} gauge "), "{got:?}");
        assert!(
            got[1].starts_with("node_time_zone_offset_seconds{time_zone="),
            "{got:?}"
        );
        assert_eq!(
            &got[2..],
            [
                "node_time_clocksource_available_info{clocksource=\"tsc\",device=\"0\"} gauge 1",
                "node_time_clocksource_available_info{clocksource=\"hpet\",device=\"0\"} gauge 1",
                "node_time_clocksource_available_info{clocksource=\"acpi_pm\",device=\"0\"} gauge 1",
                "node_time_clocksource_current_info{clocksource=\"tsc\",device=\"0\"} gauge 1",
            ]
        );
        assert_eq!(
            help_of(&out, "node_time_clocksource_current_info"),
            Some("Current clocksource read from '/sys/devices/system/clocksource'.")
        );
    }

    #[test]
    fn a_machine_without_clock_sources_has_the_time_and_an_unreadable_one_fails() {
        let d = tree(&[]);
        let mut out = Vec::new();
        time(d.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(out.len(), 2);
        let d = tree(&[(
            "devices/system/clocksource/clocksource0/available_clocksource",
            "tsc\n",
        )]);
        assert!(time(d.path(), &mut Vec::new()).is_err());
    }
}
