//! node_exporter's `selinux` collector (`collector/selinux_linux.go`): whether SELinux is
//! enabled and its configured and current modes.

use std::path::Path;
use uctel_protocol::payload::Metric;

use crate::sources::metric::gauge;

/// SELinux enforcement modes as node_exporter exports them: 1 enforcing, 0 permissive, -1
/// disabled (go-selinux's `Enforcing`, `Permissive`, `Disabled`).
fn selinux_mode(word: &str) -> f64 {
    match word.trim() {
        "enforcing" | "1" => 1.0,
        "permissive" | "0" => 0.0,
        _ => -1.0,
    }
}

/// `selinux`: `node_selinux_enabled` (1 when selinuxfs is mounted at `<sys>/fs/selinux` and
/// this process has an SELinux label other than `kernel` in `/proc/self/attr/current`, the
/// test go-selinux makes for node_exporter's `selinux_linux.go`), and when enabled
/// `node_selinux_config_mode` (`SELINUX=` of `<rootfs>/etc/selinux/config`) and
/// `node_selinux_current_mode` (`<sys>/fs/selinux/enforce`), as 1 enforcing, 0 permissive,
/// -1 disabled. Never fails: a host without SELinux has `node_selinux_enabled 0`.
pub fn selinux(sys: &Path, rootfs: &Path, out: &mut Vec<Metric>) {
    let enforce = std::fs::read_to_string(sys.join("fs/selinux/enforce")).ok();
    let label = std::fs::read_to_string("/proc/self/attr/current").ok();
    let labelled = label
        .as_deref()
        .map(|l| l.trim_end_matches(['\0', '\n']))
        .is_some_and(|l| !l.is_empty() && l != "kernel");
    let Some(enforce) = enforce.filter(|_| labelled) else {
        out.push(gauge(
            "node_selinux_enabled",
            "SELinux is enabled, 1 is true, 0 is false",
            &[],
            0.0,
        ));
        return;
    };
    out.push(gauge(
        "node_selinux_enabled",
        "SELinux is enabled, 1 is true, 0 is false",
        &[],
        1.0,
    ));
    let config = std::fs::read_to_string(rootfs.join("etc/selinux/config")).unwrap_or_default();
    let configured = config
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#') && !l.starts_with(';'))
        .find_map(|l| l.strip_prefix("SELINUX="))
        .map_or(-1.0, |v| selinux_mode(v.trim_matches('"')));
    out.push(gauge(
        "node_selinux_config_mode",
        "Configured SELinux enforcement mode",
        &[],
        configured,
    ));
    out.push(gauge(
        "node_selinux_current_mode",
        "Current SELinux enforcement mode",
        &[],
        selinux_mode(&enforce),
    ));
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{lines, tree};
    use super::*;

    #[test]
    fn selinux_is_disabled_without_selinuxfs_and_reads_modes_with_it() {
        let d = tree(&[]);
        let mut out = Vec::new();
        selinux(d.path(), d.path(), &mut out);
        assert_eq!(lines(&out), ["node_selinux_enabled{} gauge 0"]);
        assert_eq!(selinux_mode("enforcing"), 1.0);
        assert_eq!(selinux_mode("0\n"), 0.0);
        assert_eq!(selinux_mode("disabled"), -1.0);
        assert_eq!(selinux_mode("garbage"), -1.0);
    }
}
