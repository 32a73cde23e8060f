//! node_exporter's `softnet` collector (`collector/softnet_linux.go`): per-CPU packet
//! processing counters from `<proc>/net/softnet_stat`.

use std::path::Path;
use uctel_protocol::payload::Metric;

use super::files::{format_error, read};
use super::NodeError;
use crate::sources::metric::counter;

/// `softnet`: `<proc>/net/softnet_stat` (one hex row per CPU, `cpu` = row number) →
/// `node_softnet_{processed,dropped,times_squeezed}_total{cpu}`.
pub fn softnet(proc: &Path, out: &mut Vec<Metric>) -> Result<(), NodeError> {
    let path = proc.join("net/softnet_stat");
    let text = read(&path)?;
    const SERIES: [(&str, &str); 3] = [
        (
            "node_softnet_processed_total",
            "Number of processed packets",
        ),
        ("node_softnet_dropped_total", "Number of dropped packets"),
        (
            "node_softnet_times_squeezed_total",
            "Number of times processing packets ran out of quota",
        ),
    ];
    for (cpu, line) in text.lines().enumerate() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 9 {
            return Err(format_error(
                &path,
                format!("{} columns, want 9", fields.len()),
            ));
        }
        let mut values = [0u32; 9];
        for (v, f) in values.iter_mut().zip(&fields) {
            *v = u32::from_str_radix(f, 16)
                .map_err(|_| format_error(&path, format!("bad hex in {line:?}")))?;
        }
        let cpu = cpu.to_string();
        for ((name, help), v) in SERIES.iter().zip(values) {
            out.push(counter(*name, help, &[("cpu", &cpu)], f64::from(v)));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{lines, tree};
    use super::*;

    #[test]
    fn softnet_rows_are_cpus_in_hex() {
        let d = tree(&[(
            "net/softnet_stat",
            "01b3d04e 00000001 00000032 00000000 00000000 00000000 00000000 00000000 00000000 \
             00000000 00000000 00000000 00000000 00000000 00000000\n\
             01bbbd49 00000000 00000034 00000000 00000000 00000000 00000000 00000000 00000000\n",
        )]);
        let mut out = Vec::new();
        softnet(d.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            lines(&out),
            [
                "node_softnet_processed_total{cpu=\"0\"} counter 28561486",
                "node_softnet_dropped_total{cpu=\"0\"} counter 1",
                "node_softnet_times_squeezed_total{cpu=\"0\"} counter 50",
                "node_softnet_processed_total{cpu=\"1\"} counter 29080905",
                "node_softnet_dropped_total{cpu=\"1\"} counter 0",
                "node_softnet_times_squeezed_total{cpu=\"1\"} counter 52",
            ]
        );
        let short = tree(&[("net/softnet_stat", "00000001 00000002\n")]);
        assert!(softnet(short.path(), &mut Vec::new()).is_err());
    }
}
