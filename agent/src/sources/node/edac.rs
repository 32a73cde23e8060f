//! node_exporter's `edac` collector (`collector/edac_linux.go`): the memory controllers'
//! error counts from `<sys>/devices/system/edac/mc`.

use std::path::Path;
use uctel_protocol::payload::Metric;

use super::files::{glob_numbered, parse_int, read_trimmed};
use super::NodeError;
use crate::sources::metric::counter;

fn read_count(path: &Path) -> Result<f64, NodeError> {
    let n: u64 = parse_int(path, &read_trimmed(path)?)?;
    Ok(n as f64)
}

/// The digits right after `prefix` in `name` (`mc12` → `12`).
fn number_after<'a>(name: &'a str, prefix: &str) -> &'a str {
    let rest = name.strip_prefix(prefix).unwrap_or_default();
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    &rest[..end]
}

/// `edac`: `<sys>/devices/system/edac/mc/mc[0-9]*` → `node_edac_{correctable,uncorrectable}_errors_total{controller}`
/// and `node_edac_csrow_{correctable,uncorrectable}_errors_total{controller,csrow}`, the
/// controller's `*_noinfo_count` as `csrow="unknown"`.
pub fn edac(sys: &Path, out: &mut Vec<Metric>) -> Result<(), NodeError> {
    const CE: &str = "node_edac_correctable_errors_total";
    const UE: &str = "node_edac_uncorrectable_errors_total";
    const ROW_CE: &str = "node_edac_csrow_correctable_errors_total";
    const ROW_UE: &str = "node_edac_csrow_uncorrectable_errors_total";
    const ROW_CE_HELP: &str = "Total correctable memory errors for this csrow.";
    const ROW_UE_HELP: &str = "Total uncorrectable memory errors for this csrow.";
    for (name, mc) in glob_numbered(&sys.join("devices/system/edac/mc"), "mc") {
        let controller = number_after(&name, "mc");
        let ctl = [("controller", controller)];
        let unknown = [("controller", controller), ("csrow", "unknown")];
        let ce = read_count(&mc.join("ce_count"))?;
        out.push(counter(CE, "Total correctable memory errors.", &ctl, ce));
        let ce_noinfo = read_count(&mc.join("ce_noinfo_count"))?;
        out.push(counter(ROW_CE, ROW_CE_HELP, &unknown, ce_noinfo));
        let ue = read_count(&mc.join("ue_count"))?;
        out.push(counter(UE, "Total uncorrectable memory errors.", &ctl, ue));
        let ue_noinfo = read_count(&mc.join("ue_noinfo_count"))?;
        out.push(counter(ROW_UE, ROW_UE_HELP, &unknown, ue_noinfo));
        for (row_name, row) in glob_numbered(&mc, "csrow") {
            let labels = [
                ("controller", controller),
                ("csrow", number_after(&row_name, "csrow")),
            ];
            let ce = read_count(&row.join("ce_count"))?;
            out.push(counter(ROW_CE, ROW_CE_HELP, &labels, ce));
            let ue = read_count(&row.join("ue_count"))?;
            out.push(counter(ROW_UE, ROW_UE_HELP, &labels, ue));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{help_of, lines, tree};
    use super::*;

    #[test]
    fn edac_reads_controllers_and_csrows() {
        let d = tree(&[
            ("devices/system/edac/mc/mc0/ce_count", "1\n"),
            ("devices/system/edac/mc/mc0/ce_noinfo_count", "2\n"),
            ("devices/system/edac/mc/mc0/ue_count", "5\n"),
            ("devices/system/edac/mc/mc0/ue_noinfo_count", "6\n"),
            ("devices/system/edac/mc/mc0/csrow0/ce_count", "3\n"),
            ("devices/system/edac/mc/mc0/csrow0/ue_count", "4\n"),
            ("devices/system/edac/mc/mc0/csrow1/ce_count", "0\n"),
            ("devices/system/edac/mc/mc0/csrow1/ue_count", "0\n"),
            ("devices/system/edac/mc/power/x", "\n"),
        ]);
        let mut out = Vec::new();
        edac(d.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            lines(&out),
            [
                "node_edac_correctable_errors_total{controller=\"0\"} counter 1",
                "node_edac_csrow_correctable_errors_total{controller=\"0\",csrow=\"unknown\"} \
                 counter 2",
                "node_edac_uncorrectable_errors_total{controller=\"0\"} counter 5",
                "node_edac_csrow_uncorrectable_errors_total{controller=\"0\",csrow=\"unknown\"} \
                 counter 6",
                "node_edac_csrow_correctable_errors_total{controller=\"0\",csrow=\"0\"} counter 3",
                "node_edac_csrow_uncorrectable_errors_total{controller=\"0\",csrow=\"0\"} counter 4",
                "node_edac_csrow_correctable_errors_total{controller=\"0\",csrow=\"1\"} counter 0",
                "node_edac_csrow_uncorrectable_errors_total{controller=\"0\",csrow=\"1\"} counter 0",
            ]
        );
        assert_eq!(
            help_of(&out, "node_edac_correctable_errors_total"),
            Some("Total correctable memory errors.")
        );
        assert_eq!(
            help_of(&out, "node_edac_csrow_uncorrectable_errors_total"),
            Some("Total uncorrectable memory errors for this csrow.")
        );
        let mut out = Vec::new();
        edac(tree(&[]).path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert!(out.is_empty());
        let bad = tree(&[("devices/system/edac/mc/mc0/ce_count", "1\n")]);
        assert!(edac(bad.path(), &mut Vec::new()).is_err());
    }
}
