//! `sources.pod_resources`: the kubelet's pod-resources API as labels on device series.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// `sources.pod_resources`: which pod owns an RDMA device (or VF), read from the kubelet's
/// pod-resources API (`podresources/v1` `List`, gRPC over a unix socket), added as labels
/// to that device's `node_infiniband_*`, `node_ethtool_*` and fast-counter series, with a
/// `uctel_pod_device_info` series per owner and device. Off when absent.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PodResourcesSection {
    /// The kubelet's pod-resources socket (mount `/var/lib/kubelet/pod-resources` read-only
    /// into the agent's container). Connecting needs write permission on the socket, which
    /// the kubelet gives root only: the packaged unit runs as user uctel, and its drop-in
    /// `pod-resources.conf` (`CAP_DAC_OVERRIDE`) grants it; without it every call is counted
    /// as `reason="permission_denied"`. Default `/var/lib/kubelet/pod-resources/kubelet.sock`.
    #[serde(default = "default_socket")]
    pub socket_path: PathBuf,
    /// Seconds between two `List` calls, 0.1 to 86400. Default 10.
    #[serde(default = "default_interval")]
    pub interval_seconds: f64,
    /// Offset of the calls within the interval, seconds (as `host_metrics`). Default 0.
    #[serde(default)]
    pub offset_seconds: f64,
    /// Seconds one `List` call (connect included) may take, 0.01 to 60. Default 2.
    #[serde(default = "default_timeout")]
    pub timeout_seconds: f64,
    /// sysfs root where a device id that is a PCI address (the SR-IOV device plugin's VFs,
    /// `0000:3b:02.1`) is looked up: `<sysfs>/bus/pci/devices/<addr>/infiniband/*` are its
    /// RDMA devices (an RDMA device's interfaces are `<sysfs>/class/infiniband/<dev>/device/net/*`).
    /// Default `/sys`.
    #[serde(default = "default_sysfs")]
    pub sysfs_path: PathBuf,
    /// Resources whose device ids name no device, by resource name, and the RDMA devices
    /// they stand for: the RDMA shared device plugin announces `rdmaHcaMax` ids `0`, `1`, …
    /// for the HCAs of its selectors, e.g. `{rdma/hca_shared_devices_a: [mlx5_0]}`.
    /// Default none.
    #[serde(default)]
    pub shared_resources: BTreeMap<String, Vec<String>>,
    /// Label names added to the device series and the info series. Default `pod`,
    /// `namespace`, `container`.
    #[serde(default)]
    pub labels: PodLabelNames,
    /// Most (container, device) pairs exported at once, 1 to 100000; further pairs are
    /// counted in `uctel_agent_source_errors_total{source="pod_resources",
    /// reason="device_cap"}` at every call. Default 1024.
    #[serde(default = "default_max_devices")]
    pub max_devices: usize,
}

/// `sources.pod_resources.labels`: the names of the three labels.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PodLabelNames {
    /// The pod's name. Default `pod`.
    #[serde(default = "default_pod")]
    pub pod: String,
    /// The pod's namespace. Default `namespace`.
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// The container's name. Default `container`.
    #[serde(default = "default_container")]
    pub container: String,
}

impl Default for PodLabelNames {
    fn default() -> Self {
        Self {
            pod: default_pod(),
            namespace: default_namespace(),
            container: default_container(),
        }
    }
}

fn default_pod() -> String {
    "pod".to_owned()
}
fn default_namespace() -> String {
    "namespace".to_owned()
}
fn default_container() -> String {
    "container".to_owned()
}
fn default_socket() -> PathBuf {
    PathBuf::from("/var/lib/kubelet/pod-resources/kubelet.sock")
}
fn default_interval() -> f64 {
    10.0
}
fn default_timeout() -> f64 {
    2.0
}
fn default_sysfs() -> PathBuf {
    PathBuf::from("/sys")
}
fn default_max_devices() -> usize {
    1024
}

impl Default for PodResourcesSection {
    fn default() -> Self {
        Self {
            socket_path: default_socket(),
            interval_seconds: default_interval(),
            offset_seconds: 0.0,
            timeout_seconds: default_timeout(),
            sysfs_path: default_sysfs(),
            shared_resources: BTreeMap::new(),
            labels: PodLabelNames::default(),
            max_devices: default_max_devices(),
        }
    }
}

/// Whether `name` is a valid Prometheus label name (`[a-zA-Z_][a-zA-Z0-9_]*`, not `__`).
fn label_name_ok(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with("__")
}

impl PodResourcesSection {
    /// What `--check-config` says about the section (key suffix, problem).
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        let v = self.interval_seconds;
        if !(v.is_finite() && (0.1..=86400.0).contains(&v)) {
            out.push((
                "interval_seconds",
                format!("must be a number of seconds in [0.1, 86400], got {v}"),
            ));
        }
        if let Some(p) = crate::pacing::grid::offset_problem(self.offset_seconds, v) {
            out.push(("offset_seconds", p));
        }
        let t = self.timeout_seconds;
        if !(t.is_finite() && (0.01..=60.0).contains(&t)) {
            out.push((
                "timeout_seconds",
                format!("must be a number of seconds in [0.01, 60], got {t}"),
            ));
        }
        if !(1..=100_000).contains(&self.max_devices) {
            out.push((
                "max_devices",
                format!("must be 1 to 100000, got {}", self.max_devices),
            ));
        }
        let l = &self.labels;
        let names = [
            ("labels.pod", &l.pod),
            ("labels.namespace", &l.namespace),
            ("labels.container", &l.container),
        ];
        for (key, name) in names {
            if !label_name_ok(name) || ["device", "port", "resource"].contains(&name.as_str()) {
                out.push((
                    key,
                    format!("must be a Prometheus label name other than device, port and resource, got {name:?}"),
                ));
            }
        }
        if l.pod == l.namespace || l.pod == l.container || l.namespace == l.container {
            out.push(("labels", "the three label names must differ".to_owned()));
        }
        out
    }
}
