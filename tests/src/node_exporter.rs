//! The real node_exporter (Debian's `prometheus-node-exporter`, 1.5) for the tests that
//! compare the agent's sources with it, and the comparison helpers they share.
//!
//! A missing binary is a test failure, not a skip: `.ci/run` installs the package.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::daemon::Daemon;
use crate::exposition::{scrape, Sample, Scrape};

/// The binary.
pub const BINARY: &str = "/usr/bin/prometheus-node-exporter";

/// Starts node_exporter with `args` on a free loopback port, logging to `dir/<name>.log`,
/// and waits until it answers; its address and the process (killed on drop).
///
/// # Panics
/// If the binary is missing, does not start, or does not answer within 20 s.
pub fn start(dir: &Path, name: &str, args: &[String]) -> (SocketAddr, Daemon) {
    let addr = crate::net::free_addr();
    let log = dir.join(format!("{name}.log"));
    let out = std::fs::File::create(&log).unwrap_or_else(|e| panic!("{e}"));
    let err = out.try_clone().unwrap_or_else(|e| panic!("{e}"));
    let binary = Path::new(BINARY);
    assert!(
        binary.is_file(),
        "{} not found: install node_exporter (Debian: apt-get install prometheus-node-exporter)",
        binary.display()
    );
    let child = Command::new(binary)
        .arg(format!("--web.listen-address={addr}"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .spawn()
        .unwrap_or_else(|e| panic!("starting node_exporter: {e}"));
    let daemon = Daemon::adopt(name, binary, binary, &log, child);
    crate::wait_for(
        "node_exporter up",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || scrape(addr).map(|_| ()),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    (addr, daemon)
}

/// `name{labels}` → value of the samples of `s` that `keep` selects, without the labels in
/// `strip` (the ones the collector adds, to compare with node_exporter's own).
pub fn series(s: &Scrape, strip: &[&str], keep: impl Fn(&Sample) -> bool) -> BTreeMap<String, f64> {
    s.samples
        .iter()
        .filter(|smp| keep(smp))
        .map(|smp| {
            let labels: Vec<String> = smp
                .labels
                .iter()
                .filter(|(k, _)| !strip.contains(&k.as_str()))
                .map(|(k, v)| format!("{k}={v:?}"))
                .collect();
            (format!("{}{{{}}}", smp.name, labels.join(",")), smp.value)
        })
        .collect()
}

/// The same value, bit for bit (NaN equals NaN).
pub fn same(a: f64, b: f64) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}
