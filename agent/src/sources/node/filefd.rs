//! node_exporter's `filefd` collector (`collector/filefd_linux.go`): the kernel's file handle
//! counts from `<proc>/sys/fs/file-nr`.

use std::path::Path;
use uctel_protocol::payload::Metric;

use super::files::{format_error, read};
use super::NodeError;
use crate::sources::metric::gauge;

/// `filefd`: `<proc>/sys/fs/file-nr` → `node_filefd_allocated`, `node_filefd_maximum`.
pub fn filefd(proc: &Path, out: &mut Vec<Metric>) -> Result<(), NodeError> {
    let path = proc.join("sys/fs/file-nr");
    let text = read(&path)?;
    // At least three numbers (node_exporter splits on tabs and needs three); the second is
    // always 0 since Linux 2.6.
    let fields: Vec<&str> = text.split_whitespace().collect();
    let (Some(&allocated), Some(&maximum)) = (fields.first(), fields.get(2)) else {
        return Err(format_error(&path, "expected 3 numbers"));
    };
    for (name, value) in [("allocated", allocated), ("maximum", maximum)] {
        let v: f64 = value
            .parse()
            .map_err(|_| format_error(&path, format!("not a number: {value:?}")))?;
        out.push(gauge(
            format!("node_filefd_{name}"),
            &format!("File descriptor statistics: {name}."),
            &[],
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
    fn filefd_exports_allocated_and_maximum() {
        let d = tree(&[("sys/fs/file-nr", "352\t0\t2466165\n")]);
        let mut out = Vec::new();
        filefd(d.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            lines(&out),
            [
                "node_filefd_allocated{} gauge 352",
                "node_filefd_maximum{} gauge 2466165"
            ]
        );
        assert_eq!(
            help_of(&out, "node_filefd_maximum"),
            Some("File descriptor statistics: maximum.")
        );
        let bad = tree(&[("sys/fs/file-nr", "352 0\n")]);
        assert!(matches!(
            filefd(bad.path(), &mut Vec::new()),
            Err(NodeError::Format { .. })
        ));
        let empty = tree(&[]);
        assert!(matches!(
            filefd(empty.path(), &mut Vec::new()),
            Err(NodeError::Read { .. })
        ));
    }
}
