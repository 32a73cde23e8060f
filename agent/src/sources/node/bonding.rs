//! node_exporter's `bonding` collector (`collector/bonding_linux.go`): configured and active
//! slaves of each bonding master in `<sys>/class/net`.

use std::io::ErrorKind;
use std::path::Path;
use uctel_protocol::payload::Metric;

use super::files::read;
use super::NodeError;
use crate::sources::metric::gauge;

/// `bonding`: `<sys>/class/net/bonding_masters` and each master's `bonding/slaves` →
/// `node_bonding_slaves{master}` and `node_bonding_active{master}` (slaves whose
/// `lower_<slave>/bonding_slave/mii_status`, or on older kernels `slave_<slave>/…`, is `up`).
pub fn bonding(sys: &Path, out: &mut Vec<Metric>) -> Result<(), NodeError> {
    let class = sys.join("class/net");
    let masters = read(&class.join("bonding_masters"))?;
    let mut seen: Vec<&str> = Vec::new();
    for master in masters.split_whitespace() {
        if seen.contains(&master) {
            continue;
        }
        seen.push(master);
        let dir = class.join(master);
        let slaves = read(&dir.join("bonding/slaves"))?;
        let (mut configured, mut active) = (0u32, 0u32);
        for slave in slaves.split_whitespace() {
            let status = |prefix: &str| {
                let path = dir.join(format!("{prefix}{slave}/bonding_slave/mii_status"));
                read(&path)
            };
            let state = match status("lower_") {
                Err(NodeError::Read { source, .. }) if source.kind() == ErrorKind::NotFound => {
                    status("slave_")?
                }
                other => other?,
            };
            configured += 1;
            if state.trim() == "up" {
                active += 1;
            }
        }
        let labels = [("master", master)];
        out.push(gauge(
            "node_bonding_slaves",
            "Number of configured slaves per bonding interface.",
            &labels,
            f64::from(configured),
        ));
        out.push(gauge(
            "node_bonding_active",
            "Number of active slaves per bonding interface.",
            &labels,
            f64::from(active),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{help_of, lines, tree};
    use super::*;

    #[test]
    fn bonding_counts_configured_and_up_slaves() {
        let d = tree(&[
            ("class/net/bonding_masters", "bond0 dmz int\n"),
            ("class/net/bond0/bonding/slaves", "eth0 eth4\n"),
            (
                "class/net/bond0/lower_eth0/bonding_slave/mii_status",
                "up\n",
            ),
            (
                "class/net/bond0/lower_eth4/bonding_slave/mii_status",
                "down\n",
            ),
            ("class/net/dmz/bonding/slaves", "eth1 eth2\n"),
            ("class/net/dmz/slave_eth1/bonding_slave/mii_status", "up\n"),
            ("class/net/dmz/slave_eth2/bonding_slave/mii_status", "up\n"),
            ("class/net/int/bonding/slaves", "\n"),
        ]);
        let mut out = Vec::new();
        bonding(d.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            lines(&out),
            [
                "node_bonding_slaves{master=\"bond0\"} gauge 2",
                "node_bonding_active{master=\"bond0\"} gauge 1",
                "node_bonding_slaves{master=\"dmz\"} gauge 2",
                "node_bonding_active{master=\"dmz\"} gauge 2",
                "node_bonding_slaves{master=\"int\"} gauge 0",
                "node_bonding_active{master=\"int\"} gauge 0",
            ]
        );
        assert_eq!(
            help_of(&out, "node_bonding_slaves"),
            Some("Number of configured slaves per bonding interface.")
        );
        // No bonding module: a failure, as node_exporter's "no data"; a slave without status too.
        assert!(bonding(tree(&[]).path(), &mut Vec::new()).is_err());
        let bad = tree(&[
            ("class/net/bonding_masters", "bond0\n"),
            ("class/net/bond0/bonding/slaves", "eth0\n"),
        ]);
        assert!(bonding(bad.path(), &mut Vec::new()).is_err());
    }
}
