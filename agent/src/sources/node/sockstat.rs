//! node_exporter's `sockstat` collector (`collector/sockstat_linux.go` and the `procfs`
//! library's `net_sockstat.go`): socket counts and memory from `<proc>/net/sockstat{,6}`.

use std::path::Path;
use uctel_protocol::payload::Metric;

use super::files::{format_error, read_optional};
use super::NodeError;
use crate::sources::metric::gauge;

/// `sockstat`: `<proc>/net/sockstat` and `<proc>/net/sockstat6` → `node_sockstat_sockets_used`
/// and `node_sockstat_<PROTO>_<field>` (plus `_mem_bytes`, `mem` × `page_size`). A file that
/// does not exist (IPv4 or IPv6 disabled) is skipped, as node_exporter does.
pub fn sockstat(proc: &Path, page_size: u64, out: &mut Vec<Metric>) -> Result<(), NodeError> {
    for (file, v6) in [("sockstat", false), ("sockstat6", true)] {
        let path = proc.join("net").join(file);
        if let Some(text) = read_optional(&path)? {
            sockstat_file(&path, &text, v6, page_size, out)?;
        }
    }
    Ok(())
}

const SOCKSTAT_FIELDS: [&str; 6] = ["inuse", "orphan", "tw", "alloc", "mem", "memory"];

fn sockstat_file(
    path: &Path,
    text: &str,
    v6: bool,
    page_size: u64,
    out: &mut Vec<Metric>,
) -> Result<(), NodeError> {
    let int = |s: &str| {
        s.parse::<i64>()
            .map_err(|_| format_error(path, format!("not an integer: {s:?}")))
    };
    // As the procfs library: fields split on single spaces, a name and at least one pair.
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let (Some((first, kvs)), true) = (fields.split_first(), fields.len() >= 3) else {
            return Err(format_error(path, format!("malformed line {line:?}")));
        };
        if kvs.len() % 2 != 0 {
            return Err(format_error(path, format!("odd field count in {line:?}")));
        }
        let proto = first.strip_suffix(':').unwrap_or(first);
        let mut values: [Option<i64>; 6] = [None; 6];
        let mut used = 0;
        for pair in kvs.chunks(2) {
            let v = int(pair[1])?;
            if let Some(i) = SOCKSTAT_FIELDS.iter().position(|f| *f == pair[0]) {
                values[i] = Some(v);
            } else if pair[0] == "used" {
                used = v;
            }
        }
        if proto == "sockets" {
            if !v6 {
                out.push(gauge(
                    "node_sockstat_sockets_used",
                    "Number of IPv4 sockets in use.",
                    &[],
                    used as f64,
                ));
            }
            continue;
        }
        // `inuse` is always exported (0 when absent), as the procfs library reads it.
        values[0] = Some(values[0].unwrap_or(0));
        let mem_bytes = values[4].map(|pages| pages * page_size as i64);
        let named = SOCKSTAT_FIELDS
            .iter()
            .zip(values)
            .chain(std::iter::once((&"mem_bytes", mem_bytes)));
        for (field, value) in named {
            if let Some(v) = value {
                out.push(gauge(
                    format!("node_sockstat_{proto}_{field}"),
                    &format!("Number of {proto} sockets in state {field}."),
                    &[],
                    v as f64,
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{help_of, lines, tree};
    use super::*;

    #[test]
    fn sockstat_reads_v4_and_v6_with_mem_bytes() {
        let d = tree(&[
            (
                "net/sockstat",
                "sockets: used 15\nTCP: inuse 2 orphan 1 tw 3 alloc 4 mem 20\nUDP: inuse 0 mem 196\n\
                 FRAG: inuse 0 memory 0\n",
            ),
            ("net/sockstat6", "TCP6: inuse 5\nFRAG6: inuse 0 memory 7\n"),
        ]);
        let mut out = Vec::new();
        sockstat(d.path(), 4096, &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            lines(&out),
            [
                "node_sockstat_sockets_used{} gauge 15",
                "node_sockstat_TCP_inuse{} gauge 2",
                "node_sockstat_TCP_orphan{} gauge 1",
                "node_sockstat_TCP_tw{} gauge 3",
                "node_sockstat_TCP_alloc{} gauge 4",
                "node_sockstat_TCP_mem{} gauge 20",
                "node_sockstat_TCP_mem_bytes{} gauge 81920",
                "node_sockstat_UDP_inuse{} gauge 0",
                "node_sockstat_UDP_mem{} gauge 196",
                "node_sockstat_UDP_mem_bytes{} gauge 802816",
                "node_sockstat_FRAG_inuse{} gauge 0",
                "node_sockstat_FRAG_memory{} gauge 0",
                "node_sockstat_TCP6_inuse{} gauge 5",
                "node_sockstat_FRAG6_inuse{} gauge 0",
                "node_sockstat_FRAG6_memory{} gauge 7",
            ]
        );
        assert_eq!(
            help_of(&out, "node_sockstat_TCP_mem_bytes"),
            Some("Number of TCP sockets in state mem_bytes.")
        );
        assert_eq!(
            help_of(&out, "node_sockstat_sockets_used"),
            Some("Number of IPv4 sockets in use.")
        );
        // IPv6 disabled: no sockstat6, the IPv4 series only.
        let v4 = tree(&[("net/sockstat", "sockets: used 1\nRAW: inuse 1\n")]);
        let mut out = Vec::new();
        sockstat(v4.path(), 4096, &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(out.len(), 2);
        for bad in ["TCP: inuse\n", "TCP: inuse 1 tw\n", "TCP: inuse x\n"] {
            let d = tree(&[("net/sockstat", bad)]);
            assert!(
                sockstat(d.path(), 4096, &mut Vec::new()).is_err(),
                "{bad:?}"
            );
        }
    }
}
