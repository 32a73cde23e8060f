//! node_exporter's `vmstat` collector (`collector/vmstat_linux.go`): the default fields of
//! `<proc>/vmstat`, untyped.

use std::path::Path;
use uctel_protocol::payload::Metric;

use super::files::{format_error, read};
use super::NodeError;
use crate::sources::metric::untyped;

/// node_exporter's default `--collector.vmstat.fields`, `^(oom_kill|pgpg|pswp|pg.*fault).*`.
pub fn vmstat_field_selected(name: &str) -> bool {
    name.starts_with("oom_kill")
        || name.starts_with("pgpg")
        || name.starts_with("pswp")
        || name
            .strip_prefix("pg")
            .is_some_and(|rest| rest.contains("fault"))
}

/// `vmstat`: `<proc>/vmstat` → `node_vmstat_<field>` (untyped) for the default fields.
pub fn vmstat(proc: &Path, out: &mut Vec<Metric>) -> Result<(), NodeError> {
    let path = proc.join("vmstat");
    let text = read(&path)?;
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        let (Some(name), Some(value)) = (parts.next(), parts.next()) else {
            return Err(format_error(&path, format!("bad line {line:?}")));
        };
        let v: f64 = value
            .parse()
            .map_err(|_| format_error(&path, format!("bad value in {line:?}")))?;
        if !vmstat_field_selected(name) {
            continue;
        }
        out.push(untyped(
            format!("node_vmstat_{name}"),
            &format!("/proc/vmstat information field {name}."),
            v,
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{help_of, lines, tree};
    use super::*;

    #[test]
    fn vmstat_keeps_the_default_fields_untyped() {
        let d = tree(&[(
            "vmstat",
            "nr_free_pages 500023\npgpgin 115142789\npgpgout 568390820\npswpin 0\npswpout 7\n\
             pgfault 1355172436\npgmajfault 249084\npgfree 12\nthp_fault_alloc 3\n\
             pgdemote_kswapd 1\npgscan_fault_x 5\noom_kill 2\noom_kill_extra 4\n",
        )]);
        let mut out = Vec::new();
        vmstat(d.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            lines(&out),
            [
                "node_vmstat_pgpgin{} untyped 115142789",
                "node_vmstat_pgpgout{} untyped 568390820",
                "node_vmstat_pswpin{} untyped 0",
                "node_vmstat_pswpout{} untyped 7",
                "node_vmstat_pgfault{} untyped 1355172436",
                "node_vmstat_pgmajfault{} untyped 249084",
                "node_vmstat_pgscan_fault_x{} untyped 5",
                "node_vmstat_oom_kill{} untyped 2",
                "node_vmstat_oom_kill_extra{} untyped 4",
            ]
        );
        assert_eq!(
            help_of(&out, "node_vmstat_pgfault"),
            Some("/proc/vmstat information field pgfault.")
        );
        let bad = tree(&[("vmstat", "pgfault x\n")]);
        assert!(vmstat(bad.path(), &mut Vec::new()).is_err());
    }

    #[test]
    fn the_default_vmstat_fields() {
        for (name, selected) in [
            ("oom_kill", true),
            ("pgpgin", true),
            ("pswpout", true),
            ("pgmajfault", true),
            ("pgfault", true),
            ("thp_fault_alloc", false),
            ("pgfree", false),
            ("nr_free_pages", false),
        ] {
            assert_eq!(vmstat_field_selected(name), selected, "{name}");
        }
    }
}
