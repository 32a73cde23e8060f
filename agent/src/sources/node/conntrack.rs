//! node_exporter's `conntrack` collector (`collector/conntrack_linux.go`): the netfilter
//! connection table's size and per-CPU statistics, summed.

use std::path::Path;
use uctel_protocol::payload::Metric;

use super::files::{format_error, read, read_uint};
use super::NodeError;
use crate::sources::metric::gauge;

/// `conntrack`: `<proc>/sys/net/netfilter/nf_conntrack_{count,max}` and the per-CPU
/// `<proc>/net/stat/nf_conntrack` table summed over CPUs → `node_nf_conntrack_*`.
pub fn conntrack(proc: &Path, out: &mut Vec<Metric>) -> Result<(), NodeError> {
    let dir = proc.join("sys/net/netfilter");
    let count = read_uint(&dir.join("nf_conntrack_count"))?;
    let max = read_uint(&dir.join("nf_conntrack_max"))?;
    let path = proc.join("net/stat/nf_conntrack");
    let text = read(&path)?;
    // Columns of the table as the procfs library reads them (by position, 17 per row).
    const STATS: [(usize, &str, &str); 8] = [
        (2, "found", "Number of searched entries which were successful."),
        (4, "invalid", "Number of packets seen which can not be tracked."),
        (5, "ignore", "Number of packets seen which are already connected to a conntrack entry."),
        (8, "insert", "Number of entries inserted into the list."),
        (9, "insert_failed", "Number of entries for which list insertion was attempted but failed."),
        (10, "drop", "Number of packets dropped due to conntrack failure."),
        (11, "early_drop", "Number of dropped conntrack entries to make room for new ones, if maximum table size was reached."),
        (16, "search_restart", "Number of conntrack table lookups which had to be restarted due to hashtable resizes."),
    ];
    let mut sums = [0u64; STATS.len()];
    for line in text.lines().skip(1) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() != 17 {
            return Err(format_error(&path, format!("bad row {line:?}")));
        }
        for (sum, (col, _, _)) in sums.iter_mut().zip(STATS) {
            let v = u64::from_str_radix(fields[col], 16)
                .map_err(|_| format_error(&path, format!("bad hex in {line:?}")))?;
            *sum = sum.wrapping_add(v);
        }
    }
    out.push(gauge(
        "node_nf_conntrack_entries",
        "Number of currently allocated flow entries for connection tracking.",
        &[],
        count as f64,
    ));
    out.push(gauge(
        "node_nf_conntrack_entries_limit",
        "Maximum size of connection tracking table.",
        &[],
        max as f64,
    ));
    for (sum, (_, name, help)) in sums.iter().zip(STATS) {
        let name = format!("node_nf_conntrack_stat_{name}");
        out.push(gauge(name, help, &[], *sum as f64));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{lines, tree};
    use super::*;

    #[test]
    fn conntrack_sums_the_per_cpu_table() {
        let header = "entries  clashres found new invalid ignore delete chainlength insert \
                      insert_failed drop early_drop icmp_error  expect_new expect_create \
                      expect_delete search_restart\n";
        let row1 = "00000005  00000000 00000001 00000000 00000002 00000003 00000000 00000000 \
                    00000004 00000005 00000006 00000007 00000000  00000000 00000000 00000000 \
                    00000008\n";
        let row2 = "00000005  00000000 00000010 00000000 00000020 00000030 00000000 00000000 \
                    00000040 00000050 00000060 00000070 00000000  00000000 00000000 00000000 \
                    000000ff\n";
        let d = tree(&[
            ("sys/net/netfilter/nf_conntrack_count", "7\n"),
            ("sys/net/netfilter/nf_conntrack_max", "262144\n"),
            ("net/stat/nf_conntrack", &format!("{header}{row1}{row2}")),
        ]);
        let mut out = Vec::new();
        conntrack(d.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            lines(&out),
            [
                "node_nf_conntrack_entries{} gauge 7",
                "node_nf_conntrack_entries_limit{} gauge 262144",
                "node_nf_conntrack_stat_found{} gauge 17",
                "node_nf_conntrack_stat_invalid{} gauge 34",
                "node_nf_conntrack_stat_ignore{} gauge 51",
                "node_nf_conntrack_stat_insert{} gauge 68",
                "node_nf_conntrack_stat_insert_failed{} gauge 85",
                "node_nf_conntrack_stat_drop{} gauge 102",
                "node_nf_conntrack_stat_early_drop{} gauge 119",
                "node_nf_conntrack_stat_search_restart{} gauge 263",
            ]
        );
        // Module not loaded.
        assert!(matches!(
            conntrack(tree(&[]).path(), &mut Vec::new()),
            Err(NodeError::Read { .. })
        ));
        let short = tree(&[
            ("sys/net/netfilter/nf_conntrack_count", "7\n"),
            ("sys/net/netfilter/nf_conntrack_max", "9\n"),
            (
                "net/stat/nf_conntrack",
                &format!("{header}00000001 00000002\n"),
            ),
        ]);
        assert!(conntrack(short.path(), &mut Vec::new()).is_err());
    }
}
