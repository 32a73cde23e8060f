//! A device plugin's device id as the RDMA devices and network interfaces it stands for,
//! read from sysfs.
//!
//! - The SR-IOV network device plugin announces a VF (or PF) by its PCI address
//!   (`0000:3b:02.1`, the kernel's `<domain>:<bus>:<device>.<function>` naming of
//!   `/sys/bus/pci/devices`); its RDMA devices are `<sysfs>/bus/pci/devices/<addr>/infiniband/*`
//!   and its interfaces `.../net/*`.
//! - An id that is an RDMA device's name (`mlx5_0`, a device in `<sysfs>/class/infiniband`)
//!   stands for that device.
//! - The RDMA shared device plugin announces `rdmaHcaMax` ids `0`, `1`, … that name no
//!   device: `sources.pod_resources.shared_resources` says which HCAs such a resource is.
//!
//! Any other id (a GPU's UUID) stands for no RDMA device. An RDMA device's interfaces are
//! `<sysfs>/class/infiniband/<dev>/device/net/*`.

use std::collections::BTreeSet;
use std::path::Path;

/// Whether `id` is a PCI address `DDDD:BB:DD.F` (hex digits; function 0 to 7).
pub fn is_pci_address(id: &str) -> bool {
    let b = id.as_bytes();
    let hex = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_hexdigit);
    b.len() == 12
        && hex(0..4)
        && b[4] == b':'
        && hex(5..7)
        && b[7] == b':'
        && hex(8..10)
        && b[10] == b'.'
        && (b'0'..=b'7').contains(&b[11])
}

/// The names of the entries of `dir` (none when it cannot be read), sorted.
fn entries(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// Whether `name` is a plain file name (no separator, not `.`/`..`): ids come from the
/// kubelet and are never joined to a path otherwise.
fn plain(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('\0')
}

/// The RDMA devices `id` of `resource` stands for (see the module documentation).
pub fn rdma_devices(
    sysfs: &Path,
    shared: &std::collections::BTreeMap<String, Vec<String>>,
    resource: &str,
    id: &str,
) -> BTreeSet<String> {
    if let Some(devices) = shared.get(resource) {
        return devices.iter().cloned().collect();
    }
    if is_pci_address(id) {
        let addr = id.to_ascii_lowercase();
        return entries(&sysfs.join("bus/pci/devices").join(addr).join("infiniband"))
            .into_iter()
            .collect();
    }
    if plain(id) && sysfs.join("class/infiniband").join(id).is_dir() {
        return BTreeSet::from([id.to_owned()]);
    }
    BTreeSet::new()
}

/// The network interfaces of RDMA device `dev` (`<sysfs>/class/infiniband/<dev>/device/net`).
pub fn interfaces(sysfs: &Path, dev: &str) -> Vec<String> {
    if !plain(dev) {
        return Vec::new();
    }
    entries(&sysfs.join("class/infiniband").join(dev).join("device/net"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_addresses_are_told_apart() {
        assert!(is_pci_address("0000:3b:02.1"));
        assert!(is_pci_address("0000:AF:00.7"));
        for id in [
            "0",
            "mlx5_0",
            "0000:3b:02.8",
            "0000:3b:02",
            "GPU-1234",
            "../../..",
            "",
        ] {
            assert!(!is_pci_address(id), "{id}");
        }
    }

    #[test]
    fn ids_resolve_through_sysfs() {
        let d = tempfile::tempdir().unwrap();
        let s = d.path();
        let vf = s.join("bus/pci/devices/0000:3b:02.1");
        std::fs::create_dir_all(vf.join("infiniband/mlx5_3")).unwrap();
        std::fs::create_dir_all(s.join("class/infiniband/mlx5_0/device/net/ens1f0")).unwrap();
        let shared = [(
            "rdma/hca_shared_devices_a".to_owned(),
            vec!["mlx5_0".to_owned()],
        )]
        .into_iter()
        .collect();
        let r = |res: &str, id: &str| {
            rdma_devices(s, &shared, res, id)
                .into_iter()
                .collect::<Vec<_>>()
        };
        assert_eq!(r("intel.com/sriov", "0000:3B:02.1"), ["mlx5_3"]);
        assert_eq!(r("rdma/hca_shared_devices_a", "7"), ["mlx5_0"]);
        assert_eq!(r("x/y", "mlx5_0"), ["mlx5_0"]);
        assert!(r("nvidia.com/gpu", "GPU-8c2b").is_empty());
        assert!(r("x/y", "..").is_empty());
        assert!(r("x/y", "0000:00:00.0").is_empty());
        assert_eq!(interfaces(s, "mlx5_0"), ["ens1f0"]);
        assert!(interfaces(s, "mlx5_3").is_empty());
    }
}
