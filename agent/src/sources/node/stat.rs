//! node_exporter's `stat` collector (`collector/stat_linux.go`): boot time, context
//! switches, forks, interrupts and process states from `<proc>/stat`.

use std::path::Path;

use procfs::FromReadSI;
use uctel_protocol::payload::Metric;

use super::{parse_error, HostError};
use crate::sources::metric::{counter, gauge};

/// node_exporter's `stat` collector: boot time, context switches, forks, interrupts, process
/// states from `/proc/stat`.
pub(super) fn stat(path: &Path, text: &str, out: &mut Vec<Metric>) -> Result<(), HostError> {
    let info = procfs::ExplicitSystemInfo {
        boot_time_secs: 0,
        ticks_per_second: 100,
        page_size: 4096,
        is_little_endian: cfg!(target_endian = "little"),
    };
    let stats =
        procfs::KernelStats::from_read(text.as_bytes(), &info).map_err(parse_error(path))?;
    // procfs does not parse the `intr` line; its first number is the total.
    let intr = text
        .lines()
        .find_map(|l| l.strip_prefix("intr "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse::<u64>().ok());
    if let Some(intr) = intr {
        out.push(counter(
            "node_intr_total",
            "Total number of interrupts serviced.",
            &[],
            intr as f64,
        ));
    }
    out.push(counter(
        "node_context_switches_total",
        "Total number of context switches.",
        &[],
        stats.ctxt as f64,
    ));
    out.push(gauge(
        "node_boot_time_seconds",
        "Node boot time, in unixtime.",
        &[],
        stats.btime as f64,
    ));
    out.push(counter(
        "node_forks_total",
        "Total number of forks.",
        &[],
        stats.processes as f64,
    ));
    if let Some(n) = stats.procs_running {
        out.push(gauge(
            "node_procs_running",
            "Number of processes in runnable state.",
            &[],
            f64::from(n),
        ));
    }
    if let Some(n) = stats.procs_blocked {
        out.push(gauge(
            "node_procs_blocked",
            "Number of processes blocked waiting for I/O to complete.",
            &[],
            f64::from(n),
        ));
    }
    Ok(())
}
