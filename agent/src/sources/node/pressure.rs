//! node_exporter's `pressure` collector (`collector/pressure_linux.go`): pressure stall
//! information from `<proc>/pressure/{cpu,io,memory}`.

use std::path::Path;
use uctel_protocol::payload::Metric;

use super::files::{format_error, read};
use super::NodeError;
use crate::sources::metric::counter;

/// The `some` and `full` `total=` microseconds of a PSI file (`full` absent for `cpu` on
/// older kernels).
fn psi_totals(path: &Path, text: &str) -> Result<(Option<u64>, Option<u64>), NodeError> {
    let (mut some, mut full) = (None, None);
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let bad = || format_error(path, format!("bad line {line:?}"));
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [kind, a10, a60, a300, total] = fields[..] else {
            return Err(bad());
        };
        for (field, key) in [(a10, "avg10="), (a60, "avg60="), (a300, "avg300=")] {
            let ok = field.strip_prefix(key).and_then(|v| v.parse::<f64>().ok());
            ok.ok_or_else(bad)?;
        }
        let total = total
            .strip_prefix("total=")
            .and_then(|v| v.parse::<u64>().ok());
        let total = total.ok_or_else(bad)?;
        match kind {
            "some" => some = Some(total),
            "full" => full = Some(total),
            _ => return Err(bad()),
        }
    }
    Ok((some, full))
}

/// `pressure`: `<proc>/pressure/{cpu,io,memory}` → `node_pressure_*_seconds_total`.
pub fn pressure(proc: &Path, out: &mut Vec<Metric>) -> Result<(), NodeError> {
    // node_exporter divides the microseconds by 1000 twice; doing the same keeps the last bit.
    let seconds = |us: Option<u64>| us.unwrap_or(0) as f64 / 1000.0 / 1000.0;
    for resource in ["cpu", "io", "memory"] {
        let path = proc.join("pressure").join(resource);
        let (some, full) = psi_totals(&path, &read(&path)?)?;
        let series: &[(&str, &str, Option<u64>)] = match resource {
            "cpu" => &[(
                "node_pressure_cpu_waiting_seconds_total",
                "Total time in seconds that processes have waited for CPU time",
                some,
            )],
            "io" => &[
                (
                    "node_pressure_io_waiting_seconds_total",
                    "Total time in seconds that processes have waited due to IO congestion",
                    some,
                ),
                (
                    "node_pressure_io_stalled_seconds_total",
                    "Total time in seconds no process could make progress due to IO congestion",
                    full,
                ),
            ],
            _ => &[
                (
                    "node_pressure_memory_waiting_seconds_total",
                    "Total time in seconds that processes have waited for memory",
                    some,
                ),
                (
                    "node_pressure_memory_stalled_seconds_total",
                    "Total time in seconds no process could make progress due to memory congestion",
                    full,
                ),
            ],
        };
        for (name, help, us) in series {
            out.push(counter(*name, help, &[], seconds(*us)));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{lines, tree};
    use super::*;

    #[test]
    fn pressure_divides_microseconds_like_node_exporter() {
        let d = tree(&[
            (
                "pressure/cpu",
                "some avg10=0.00 avg60=1.12 avg300=15.90 total=9473148091\n\
                 full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
            ),
            (
                "pressure/io",
                "some avg10=0.00 avg60=0.00 avg300=0.00 total=466795267\n\
                 full avg10=0.00 avg60=0.00 avg300=0.00 total=228923153\n",
            ),
            (
                "pressure/memory",
                "some avg10=0.00 avg60=0.00 avg300=0.00 total=33638401\n\
                 full avg10=0.00 avg60=0.00 avg300=0.00 total=16524377\n",
            ),
        ]);
        let mut out = Vec::new();
        pressure(d.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            lines(&out),
            [
                "node_pressure_cpu_waiting_seconds_total{} counter 9473.148091",
                "node_pressure_io_waiting_seconds_total{} counter 466.79526699999997",
                "node_pressure_io_stalled_seconds_total{} counter 228.92315299999999",
                "node_pressure_memory_waiting_seconds_total{} counter 33.638400999999995",
                "node_pressure_memory_stalled_seconds_total{} counter 16.524377",
            ]
        );
        // No PSI: a failure.
        assert!(pressure(tree(&[]).path(), &mut Vec::new()).is_err());
        let bad = tree(&[("pressure/cpu", "some total=1\n")]);
        assert!(pressure(bad.path(), &mut Vec::new()).is_err());
    }
}
