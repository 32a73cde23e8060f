//! node_exporter's `timex` collector (`collector/timex.go`): the kernel clock's NTP discipline
//! state from adjtimex(2), read only.

use uctel_protocol::payload::Metric;

use super::NodeError;
use crate::sources::metric::{counter, gauge};
use crate::sources::sys::clock::{self, KernelClock, STA_NANO, TIME_ERROR};

/// `timex`: the kernel clock's state from adjtimex(2) (read only), as node_exporter's
/// `timex.go` exports it; see [`timex_series`].
///
/// # Errors
/// The system call's error (node_exporter reports a permission error as "no data"; both fail
/// the collector).
pub fn timex(out: &mut Vec<Metric>) -> Result<(), NodeError> {
    let clock = clock::kernel_clock().map_err(|source| NodeError::Read {
        path: "adjtimex(2)".into(),
        source,
    })?;
    timex_series(&clock, out);
    Ok(())
}

/// node_exporter's `timex` series of one adjtimex(2) reading: `node_timex_sync_status` (1
/// unless the call returned `TIME_ERROR`), `node_timex_offset_seconds` and
/// `node_timex_pps_jitter_seconds` (µs, or ns under `STA_NANO`), `node_timex_{maxerror,
/// estimated_error}_seconds` and `node_timex_tick_seconds` (µs),
/// `node_timex_frequency_adjustment_ratio` (1 + freq / 2¹⁶ ppm),
/// `node_timex_pps_{frequency,stability}_hertz` (2¹⁶ ppm units), `node_timex_status`,
/// `node_timex_loop_time_constant`, `node_timex_pps_shift_seconds`,
/// `node_timex_tai_offset_seconds` as they are, and the four PPS event counters.
pub fn timex_series(clock: &KernelClock, out: &mut Vec<Metric>) {
    const MICRO: f64 = 1e6;
    const PPM16: f64 = 1e6 * 65536.0;
    let divisor = if clock.status & STA_NANO != 0 {
        1e9
    } else {
        MICRO
    };
    let sync = if clock.state == TIME_ERROR { 0.0 } else { 1.0 };
    let gauges: [(&str, &str, f64); 13] = [
        (
            "node_timex_sync_status",
            "Is clock synchronized to a reliable server (1 = yes, 0 = no).",
            sync,
        ),
        (
            "node_timex_offset_seconds",
            "Time offset in between local system and reference clock.",
            clock.offset as f64 / divisor,
        ),
        (
            "node_timex_frequency_adjustment_ratio",
            "Local clock frequency adjustment.",
            1.0 + clock.freq as f64 / PPM16,
        ),
        (
            "node_timex_maxerror_seconds",
            "Maximum error in seconds.",
            clock.maxerror as f64 / MICRO,
        ),
        (
            "node_timex_estimated_error_seconds",
            "Estimated error in seconds.",
            clock.esterror as f64 / MICRO,
        ),
        (
            "node_timex_status",
            "Value of the status array bits.",
            clock.status as f64,
        ),
        (
            "node_timex_loop_time_constant",
            "Phase-locked loop time constant.",
            clock.constant as f64,
        ),
        (
            "node_timex_tick_seconds",
            "Seconds between clock ticks.",
            clock.tick as f64 / MICRO,
        ),
        (
            "node_timex_pps_frequency_hertz",
            "Pulse per second frequency.",
            clock.ppsfreq as f64 / PPM16,
        ),
        (
            "node_timex_pps_jitter_seconds",
            "Pulse per second jitter.",
            clock.jitter as f64 / divisor,
        ),
        (
            "node_timex_pps_shift_seconds",
            "Pulse per second interval duration.",
            clock.shift as f64,
        ),
        (
            "node_timex_pps_stability_hertz",
            "Pulse per second stability, average of recent frequency changes.",
            clock.stabil as f64 / PPM16,
        ),
        (
            "node_timex_tai_offset_seconds",
            "International Atomic Time (TAI) offset.",
            clock.tai as f64,
        ),
    ];
    for (name, help, value) in gauges {
        out.push(gauge(name, help, &[], value));
    }
    let counters = [
        (
            "node_timex_pps_jitter_total",
            "Pulse per second count of jitter limit exceeded events.",
            clock.jitcnt,
        ),
        (
            "node_timex_pps_calibration_total",
            "Pulse per second count of calibration intervals.",
            clock.calcnt,
        ),
        (
            "node_timex_pps_error_total",
            "Pulse per second count of calibration errors.",
            clock.errcnt,
        ),
        (
            "node_timex_pps_stability_exceeded_total",
            "Pulse per second count of stability limit exceeded events.",
            clock.stbcnt,
        ),
    ];
    for (name, help, value) in counters {
        out.push(counter(name, help, &[], value as f64));
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::lines;
    use super::*;

    #[test]
    fn timex_units_follow_node_exporter() {
        let clock = KernelClock {
            state: TIME_ERROR,
            offset: -1500,
            freq: 65536 * 12,
            maxerror: 16_000_000,
            esterror: 250,
            status: 0x40,
            constant: 2,
            tick: 10_000,
            jitter: 20,
            stbcnt: 3,
            ..KernelClock::default()
        };
        let mut out = Vec::new();
        timex_series(&clock, &mut out);
        let got = lines(&out);
        let has = |l: &str| assert!(got.iter().any(|g| g == l), "{l} not in {got:?}");
        has("node_timex_sync_status{} gauge 0");
        has("node_timex_offset_seconds{} gauge -0.0015");
        has("node_timex_frequency_adjustment_ratio{} gauge 1.000012");
        has("node_timex_maxerror_seconds{} gauge 16");
        has("node_timex_estimated_error_seconds{} gauge 0.00025");
        has("node_timex_status{} gauge 64");
        has("node_timex_tick_seconds{} gauge 0.01");
        has("node_timex_pps_jitter_seconds{} gauge 0.00002");
        has("node_timex_pps_stability_exceeded_total{} counter 3");
        assert_eq!(got.len(), 17);
        // STA_NANO: offset and jitter are nanoseconds.
        let nano = KernelClock {
            status: STA_NANO,
            offset: 1500,
            ..KernelClock::default()
        };
        let mut out = Vec::new();
        timex_series(&nano, &mut out);
        assert!(lines(&out).contains(&"node_timex_offset_seconds{} gauge 0.0000015".to_owned()));
        assert!(lines(&out).contains(&"node_timex_sync_status{} gauge 1".to_owned()));
    }

    #[test]
    fn timex_reads_the_kernel_clock() {
        let mut out = Vec::new();
        timex(&mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(out.len(), 17);
    }
}
