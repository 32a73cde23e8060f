//! node_exporter's `schedstat` collector (`collector/schedstat_linux.go`): per-CPU scheduler
//! times from `<proc>/schedstat`.

use std::path::Path;
use std::sync::OnceLock;

use regex::Regex;
use uctel_protocol::payload::Metric;

use super::files::{format_error, read};
use super::NodeError;
use crate::sources::metric::counter;

/// `schedstat`: the `cpuN …` lines of `<proc>/schedstat` (the procfs library's unanchored
/// `cpu(\d+)` followed by nine numbers; other lines skipped) →
/// `node_schedstat_{running_seconds,waiting_seconds,timeslices}_total{cpu}` (nanoseconds / 10⁹).
pub fn schedstat(proc: &Path, out: &mut Vec<Metric>) -> Result<(), NodeError> {
    static RE: OnceLock<Option<Regex>> = OnceLock::new();
    let path = proc.join("schedstat");
    let text = read(&path)?;
    let re = RE
        .get_or_init(|| {
            Regex::new(r"cpu(\d+) (\d+) (\d+) (\d+) (\d+) (\d+) (\d+) (\d+) (\d+) (\d+)").ok()
        })
        .as_ref()
        .ok_or_else(|| format_error(&path, "pattern"))?;
    for line in text.lines() {
        let Some(m) = re.captures(line) else {
            continue;
        };
        let num = |i: usize| m.get(i).and_then(|g| g.as_str().parse::<u64>().ok());
        let (Some(running), Some(waiting), Some(slices)) = (num(8), num(9), num(10)) else {
            continue; // out of range: skipped, as the procfs library does
        };
        let cpu = [("cpu", m.get(1).map_or("", |g| g.as_str()))];
        out.push(counter(
            "node_schedstat_running_seconds_total",
            "Number of seconds CPU spent running a process.",
            &cpu,
            running as f64 / 1e9,
        ));
        out.push(counter(
            "node_schedstat_waiting_seconds_total",
            "Number of seconds spent by processing waiting for this CPU.",
            &cpu,
            waiting as f64 / 1e9,
        ));
        out.push(counter(
            "node_schedstat_timeslices_total",
            "Number of timeslices executed by CPU.",
            &cpu,
            slices as f64,
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{lines, tree};
    use super::*;

    #[test]
    fn schedstat_reads_the_cpu_lines() {
        let d = tree(&[(
            "schedstat",
            "version 15\ntimestamp 4297299139\n\
             cpu0 0 0 0 0 0 0 2000000000 1500000000 42\n\
             domain0 00000000,00000003 212 212 0 0 0 0 0 212 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n\
             cpu1 0 0 0 0 0 0 7 8 9\n",
        )]);
        let mut out = Vec::new();
        schedstat(d.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            lines(&out),
            [
                "node_schedstat_running_seconds_total{cpu=\"0\"} counter 2",
                "node_schedstat_waiting_seconds_total{cpu=\"0\"} counter 1.5",
                "node_schedstat_timeslices_total{cpu=\"0\"} counter 42",
                "node_schedstat_running_seconds_total{cpu=\"1\"} counter 0.000000007",
                "node_schedstat_waiting_seconds_total{cpu=\"1\"} counter 0.000000008",
                "node_schedstat_timeslices_total{cpu=\"1\"} counter 9",
            ]
        );
        assert!(schedstat(tree(&[]).path(), &mut Vec::new()).is_err());
    }
}
