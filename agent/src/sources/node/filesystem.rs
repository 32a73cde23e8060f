//! node_exporter's `filesystem` collector (`collector/filesystem_linux.go`): statvfs(2) of
//! every mount in `<proc>/1/mountinfo` that its default mount-point and fs-type lists keep.

use procfs::FromRead;
use uctel_protocol::payload::Metric;

use super::{parse_error, HostError, HostPaths};
use crate::sources::metric::gauge;

/// node_exporter's default `--collector.filesystem.fs-types-exclude`.
const FS_TYPES_EXCLUDED: &[&str] = &[
    "autofs",
    "binfmt_misc",
    "bpf",
    "cgroup",
    "cgroup2",
    "configfs",
    "debugfs",
    "devpts",
    "devtmpfs",
    "fusectl",
    "hugetlbfs",
    "iso9660",
    "mqueue",
    "nsfs",
    "overlay",
    "proc",
    "procfs",
    "pstore",
    "rpc_pipefs",
    "securityfs",
    "selinuxfs",
    "squashfs",
    "erofs",
    "sysfs",
    "tracefs",
];

/// node_exporter's default `--collector.filesystem.mount-points-exclude`:
/// `^/(dev|proc|run/credentials/.+|sys|var/lib/docker/.+|var/lib/containers/storage/.+)($|/)`.
pub fn mount_point_ignored(mount_point: &str) -> bool {
    let Some(rest) = mount_point.strip_prefix('/') else {
        return false;
    };
    // `dir` followed by end or '/'.
    let exact_or_below = |dir: &str| {
        rest.strip_prefix(dir)
            .is_some_and(|tail| tail.is_empty() || tail.starts_with('/'))
    };
    // `dir/.+` followed by end or '/': something non-empty below dir.
    let strictly_below = |dir: &str| {
        rest.strip_prefix(dir)
            .and_then(|tail| tail.strip_prefix('/'))
            .is_some_and(|tail| !tail.is_empty())
    };
    exact_or_below("dev")
        || exact_or_below("proc")
        || exact_or_below("sys")
        || strictly_below("run/credentials")
        || strictly_below("var/lib/docker")
        || strictly_below("var/lib/containers/storage")
}

/// Whether a mount of this fs type is skipped (node_exporter's default exclude list).
pub fn fs_type_ignored(fs_type: &str) -> bool {
    FS_TYPES_EXCLUDED.contains(&fs_type)
}

/// A `/proc/*/mountinfo` field (mount point, mount source) as the kernel wrote it, decoded:
/// the kernel escapes space, tab, newline and backslash as `\040`, `\011`, `\012` and
/// `\134` (`show_mountinfo` in `fs/proc_namespace.c`, `mangle()` with `" \t\n\\"`), and
/// node_exporter (through prometheus/procfs) reports the decoded path. The `procfs` crate
/// returns the field as written. Any other backslash is kept as it is.
pub fn mountinfo_unescape(field: &str) -> std::borrow::Cow<'_, str> {
    if !field.contains('\\') {
        return std::borrow::Cow::Borrowed(field);
    }
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(at) = rest.find('\\') {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        let decoded = match tail.get(..4) {
            Some("\\040") => Some(' '),
            Some("\\011") => Some('\t'),
            Some("\\012") => Some('\n'),
            Some("\\134") => Some('\\'),
            _ => None,
        };
        match decoded {
            Some(c) => {
                out.push(c);
                rest = &tail[4..];
            }
            None => {
                out.push('\\');
                rest = &tail[1..];
            }
        }
    }
    out.push_str(rest);
    std::borrow::Cow::Owned(out)
}

pub(super) fn filesystem(paths: &HostPaths, out: &mut Vec<Metric>) -> Result<(), HostError> {
    let primary = paths.proc.join("1").join("mountinfo");
    let mounts = match procfs::process::MountInfos::from_file(&primary) {
        Ok(m) => m,
        Err(_) => {
            let fallback = paths.proc.join("self").join("mountinfo");
            procfs::process::MountInfos::from_file(&fallback).map_err(parse_error(&fallback))?
        }
    };
    // Later mounts over the same mount point hide earlier ones; statvfs sees the top one.
    let mut seen: Vec<(String, String, String)> = Vec::new();
    for m in mounts.0.iter() {
        let mount_point = mountinfo_unescape(&m.mount_point.to_string_lossy()).into_owned();
        if fs_type_ignored(&m.fs_type) || mount_point_ignored(&mount_point) {
            continue;
        }
        let device = m
            .mount_source
            .as_deref()
            .map_or_else(|| "none".to_owned(), |s| mountinfo_unescape(s).into_owned());
        seen.retain(|(_, mp, _)| *mp != mount_point);
        seen.push((device, mount_point, m.fs_type.clone()));
    }
    for (device, mount_point, fs_type) in &seen {
        let labels = [
            ("device", device.as_str()),
            ("mountpoint", mount_point.as_str()),
            ("fstype", fs_type.as_str()),
        ];
        let target = paths.rootfs.join(mount_point.trim_start_matches('/'));
        match rustix::fs::statvfs(&target) {
            Ok(s) => {
                // f_blocks, f_bfree and f_bavail are in f_frsize units (POSIX statvfs).
                let unit = if s.f_frsize > 0 {
                    s.f_frsize
                } else {
                    s.f_bsize
                } as f64;
                out.push(gauge(
                    "node_filesystem_size_bytes",
                    "Filesystem size in bytes.",
                    &labels,
                    s.f_blocks as f64 * unit,
                ));
                out.push(gauge(
                    "node_filesystem_free_bytes",
                    "Filesystem free space in bytes.",
                    &labels,
                    s.f_bfree as f64 * unit,
                ));
                out.push(gauge(
                    "node_filesystem_avail_bytes",
                    "Filesystem space available to non-root users in bytes.",
                    &labels,
                    s.f_bavail as f64 * unit,
                ));
                out.push(gauge(
                    "node_filesystem_files",
                    "Filesystem total file nodes.",
                    &labels,
                    s.f_files as f64,
                ));
                out.push(gauge(
                    "node_filesystem_files_free",
                    "Filesystem total free file nodes.",
                    &labels,
                    s.f_ffree as f64,
                ));
                let ro = s.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY);
                out.push(gauge(
                    "node_filesystem_readonly",
                    "Filesystem read-only status.",
                    &labels,
                    if ro { 1.0 } else { 0.0 },
                ));
                out.push(gauge(
                    "node_filesystem_device_error",
                    "Whether an error occurred while getting statistics for the given device.",
                    &labels,
                    0.0,
                ));
            }
            Err(_) => {
                // node_exporter reports an unreadable mount with device_error=1 and no sizes.
                out.push(gauge(
                    "node_filesystem_device_error",
                    "Whether an error occurred while getting statistics for the given device.",
                    &labels,
                    1.0,
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The four escapes of the kernel's `mangle()` decode; other backslashes stay.
    #[test]
    fn mountinfo_escapes_decode_as_node_exporter_decodes_them() {
        assert_eq!(mountinfo_unescape("/mnt/plain"), "/mnt/plain");
        assert_eq!(
            mountinfo_unescape("/mnt/a\\040b\\011c\\012d\\134e"),
            "/mnt/a b\tc\nd\\e"
        );
        assert_eq!(mountinfo_unescape("/x\\134040"), "/x\\040");
        assert_eq!(mountinfo_unescape("/x\\041\\"), "/x\\041\\");
        assert_eq!(mountinfo_unescape("\\04"), "\\04");
    }

    #[test]
    fn mount_point_filter_matches_node_exporter_default() {
        for ignored in [
            "/dev",
            "/dev/shm",
            "/proc",
            "/sys/fs/cgroup",
            "/run/credentials/x.service",
            "/var/lib/docker/overlay2/abc",
            "/var/lib/containers/storage/x",
        ] {
            assert!(mount_point_ignored(ignored), "{ignored} should be ignored");
        }
        for kept in [
            "/",
            "/home",
            "/devices",
            "/run",
            "/run/credentials",
            "/var/lib/docker",
            "/system",
        ] {
            assert!(!mount_point_ignored(kept), "{kept} should be kept");
        }
        assert!(!fs_type_ignored("tmpfs"));
        assert!(fs_type_ignored("cgroup2"));
    }
}
