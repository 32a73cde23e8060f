//! node_exporter's `cpu` collector (`collector/cpu_linux.go`): the seconds each CPU spent in
//! each mode, from the tick counts of `<proc>/stat`.

use std::path::Path;

use procfs::FromReadSI;
use uctel_protocol::payload::Metric;

use super::HostError;
use crate::sources::metric::counter;

/// `cpu`: `<proc>/stat` (`text`, read from `path`) → `node_cpu_seconds_total{cpu,mode}` and
/// `node_cpu_guest_seconds_total{cpu,mode}`, kernel ticks / `ticks_per_second`.
///
/// # Errors
/// `procfs` rejects the text, or the `cpuN` lines and the parsed CPUs differ in number.
pub(super) fn cpu(
    path: &Path,
    text: &str,
    ticks_per_second: u64,
    out: &mut Vec<Metric>,
) -> Result<(), HostError> {
    let info = procfs::ExplicitSystemInfo {
        boot_time_secs: 0,
        ticks_per_second,
        page_size: procfs::page_size(),
        is_little_endian: cfg!(target_endian = "little"),
    };
    let stats = procfs::KernelStats::from_read(text.as_bytes(), &info).map_err(|source| {
        HostError::Parse {
            path: path.to_owned(),
            source,
        }
    })?;
    // procfs keeps the per-CPU lines in file order but drops their numbers; offline CPUs
    // leave gaps (cpu0, cpu2), so take the ids from the text.
    let ids: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter_map(|w| w.strip_prefix("cpu"))
        .filter(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()))
        .collect();
    if ids.len() != stats.cpu_time.len() {
        return Err(HostError::Format {
            path: path.to_owned(),
            reason: format!(
                "{} cpuN lines but {} parsed",
                ids.len(),
                stats.cpu_time.len()
            ),
        });
    }
    let tps = ticks_per_second as f64;
    const HELP: &str = "Seconds the CPUs spent in each mode.";
    const GUEST_HELP: &str = "Seconds the CPUs spent in guests (VMs) for each mode.";
    for (id, t) in ids.iter().zip(&stats.cpu_time) {
        let modes = [
            ("user", t.user),
            ("nice", t.nice),
            ("system", t.system),
            ("idle", t.idle),
            ("iowait", t.iowait.unwrap_or(0)),
            ("irq", t.irq.unwrap_or(0)),
            ("softirq", t.softirq.unwrap_or(0)),
            ("steal", t.steal.unwrap_or(0)),
        ];
        for (mode, ticks) in modes {
            out.push(counter(
                "node_cpu_seconds_total",
                HELP,
                &[("cpu", id), ("mode", mode)],
                ticks as f64 / tps,
            ));
        }
        for (mode, ticks) in [
            ("user", t.guest.unwrap_or(0)),
            ("nice", t.guest_nice.unwrap_or(0)),
        ] {
            out.push(counter(
                "node_cpu_guest_seconds_total",
                GUEST_HELP,
                &[("cpu", id), ("mode", mode)],
                ticks as f64 / tps,
            ));
        }
    }
    Ok(())
}
