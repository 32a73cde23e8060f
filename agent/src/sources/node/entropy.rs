//! node_exporter's `entropy` collector (`collector/entropy_linux.go`): the kernel's entropy
//! pool from `<proc>/sys/kernel/random`.

use std::path::Path;
use uctel_protocol::payload::Metric;

use super::files::read_uint;
use super::NodeError;
use crate::sources::metric::gauge;

/// `entropy`: `<proc>/sys/kernel/random/{entropy_avail,poolsize}`.
pub fn entropy(proc: &Path, out: &mut Vec<Metric>) -> Result<(), NodeError> {
    let dir = proc.join("sys/kernel/random");
    let avail = read_uint(&dir.join("entropy_avail"))?;
    let pool = read_uint(&dir.join("poolsize"))?;
    out.push(gauge(
        "node_entropy_available_bits",
        "Bits of available entropy.",
        &[],
        avail as f64,
    ));
    out.push(gauge(
        "node_entropy_pool_size_bits",
        "Bits of entropy pool.",
        &[],
        pool as f64,
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{lines, tree};
    use super::*;

    #[test]
    fn entropy_needs_both_files() {
        let d = tree(&[
            ("sys/kernel/random/entropy_avail", "256\n"),
            ("sys/kernel/random/poolsize", "4096\n"),
        ]);
        let mut out = Vec::new();
        entropy(d.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            lines(&out),
            [
                "node_entropy_available_bits{} gauge 256",
                "node_entropy_pool_size_bits{} gauge 4096"
            ]
        );
        let half = tree(&[("sys/kernel/random/entropy_avail", "256\n")]);
        assert!(entropy(half.path(), &mut Vec::new()).is_err());
    }
}
