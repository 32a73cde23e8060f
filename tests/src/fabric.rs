//! An RDMA fabric for an agent of a test pipeline, so that the fabric dashboard's series
//! exist: the ConnectX-6 Dx sysfs fixture (`agent/tests/data/connectx-6-dx/`, mlx5 names)
//! copied into the run directory as the agent's `sources.host_metrics.sysfs_path` (its
//! `infiniband` collector then serves `node_infiniband_*` for `mlx5_0` port 1), two of its
//! `hw_counters` files and `lo`'s `rx_packets` sampled by `sources.fast_counters` (the
//! collector then serves their `_per_second`), the port's `state` file rewritten to take the
//! port down and up (`uctel_agent_rdma_port_state_changes_total`) and an address added to
//! its GID table (`uctel_agent_rdma_gid_changes_total`).
//!
//! The mlx5 ethtool pause statistics (`rx_pause_ctrl_phy`, `tx_pause_ctrl_phy`,
//! `rx_prio3_pause`, `tx_prio3_pause`) need an mlx5 interface: the `ethtool` collector asks the
//! kernel (`SIOCETHTOOL`), not sysfs, and the interfaces a test machine has (veth, virtio_net,
//! lo) have no pause counters. They come through the agent's textfile source instead, named
//! and described by the `ethtool` collector's own rule
//! ([`uctel_agent::sources::node::ethtool::series_identity`]), untyped as node_exporter 1.5.0
//! serves them, for the port's net device `ens1f0np0`.
//!
//! The host runs one Slurm job, so the job dashboard's joins have a job to join to: a cgroup
//! v2 tree with the directory `slurmd` makes for job [`JOB_ID`]
//! (`system.slice/slurmstepd.scope/job_<id>`, with `cpu.stat`, `memory.current`, `io.stat`)
//! as the agent's `sources.slurm.cgroup_root`, and as its `scontrol_path` a script that prints
//! that job's `scontrol show job -o` line (user [`JOB_USER`]). No Slurm runs here: the real
//! one is `tests/tests/it/slurm.rs`'s.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_yaml::{Mapping, Value};

use crate::configs::Yaml;
use crate::pipeline::Pipeline;

/// The fixture's RDMA device and port.
pub const DEVICE: &str = "mlx5_0";
/// The fixture's port.
pub const PORT: &str = "1";
/// The interface the pause statistics are reported for: the fixture port's net device
/// (`gid_attrs/ndevs/0`).
pub const INTERFACE: &str = "ens1f0np0";
/// mlx5 `ethtool -S` pause statistics (kernel
/// `drivers/net/ethernet/mellanox/mlx5/core/en_stats.c`: `pport_pause_stats_desc`,
/// `pport_per_prio_pfc_stats_desc`) with made-up values.
pub const PAUSE_STATS: [(&str, u64); 4] = [
    ("rx_pause_ctrl_phy", 1200),
    ("tx_pause_ctrl_phy", 340),
    ("rx_prio3_pause", 1100),
    ("tx_prio3_pause", 310),
];
/// The Slurm job running on the fabric host.
pub const JOB_ID: &str = "4242";
/// Its user, as `scontrol` reports it.
pub const JOB_USER: &str = "alice";

/// The `hw_counters` files sampled by `sources.fast_counters`.
pub const FAST_HW_COUNTERS: [&str; 2] = ["out_of_buffer", "np_ecn_marked_roce_packets"];

/// The fixture copy and the textfile directory of one agent.
#[derive(Debug)]
pub struct Fabric {
    /// `<dir>/fabric-sys`: the agent's sysfs root.
    pub sys: PathBuf,
    /// `<dir>/fabric-textfile`.
    pub textfile: PathBuf,
    /// `<dir>/fabric-cgroup`: the agent's cgroup root, with job [`JOB_ID`].
    pub cgroup: PathBuf,
    /// `<dir>/fabric-scontrol`: prints job [`JOB_ID`]'s `scontrol show job -o` line.
    pub scontrol: PathBuf,
    /// `<dir>/fabric-kubelet.sock`: a test kubelet ([`crate::kubelet`]) listing pod
    /// [`POD`] with [`DEVICE`] through the RDMA shared device plugin's resource
    /// [`POD_RESOURCE`].
    pub kubelet: PathBuf,
    /// The pods that kubelet lists: change them to start and end pods.
    pub pods: crate::kubelet::Kubelet,
}

/// The pod that owns the fabric's device: (namespace, pod, container).
pub const POD: (&str, &str, &str) = ("ml", "allreduce-0", "worker");
/// Its resource (the RDMA shared device plugin's, mapped to [`DEVICE`]).
pub const POD_RESOURCE: &str = "rdma/hca_shared_devices_a";

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap_or_else(|e| panic!("{}: {e}", to.display()));
    let entries = std::fs::read_dir(from).unwrap_or_else(|e| panic!("{}: {e}", from.display()));
    for entry in entries {
        let entry = entry.unwrap_or_else(|e| panic!("{}: {e}", from.display()));
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        if src.is_dir() {
            copy_tree(&src, &dst);
        } else {
            std::fs::copy(&src, &dst).unwrap_or_else(|e| panic!("{}: {e}", src.display()));
        }
    }
}

impl Fabric {
    /// Copies the fixture under `dir` and writes the textfile.
    ///
    /// # Panics
    /// If the fixture cannot be read or `dir` written.
    pub fn new(dir: &Path) -> Fabric {
        let sys = dir.join("fabric-sys");
        copy_tree(
            &crate::workspace_root().join("agent/tests/data/connectx-6-dx/sys"),
            &sys,
        );
        let textfile = dir.join("fabric-textfile");
        std::fs::create_dir_all(&textfile)
            .unwrap_or_else(|e| panic!("{}: {e}", textfile.display()));
        let mut text = String::new();
        for (stat, value) in PAUSE_STATS {
            let (name, help) = uctel_agent::sources::node::ethtool::series_identity(stat);
            text.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} untyped\n{name}{{device=\"{INTERFACE}\"}} {value}\n"
            ));
        }
        let file = textfile.join("ethtool_mlx5.prom");
        std::fs::write(&file, text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let (cgroup, scontrol) = (dir.join("fabric-cgroup"), dir.join("fabric-scontrol"));
        let job = cgroup.join(format!("system.slice/slurmstepd.scope/job_{JOB_ID}"));
        let line = format!(
            "JobId={JOB_ID} JobName=allreduce UserId={JOB_USER}(1000) GroupId={JOB_USER}(1000) \
             Account=ml QOS=normal JobState=RUNNING Partition=gpu NodeList=fabric"
        );
        for (file, text) in [
            (
                cgroup.join("cgroup.controllers"),
                "cpu io memory pids\n".to_owned(),
            ),
            (job.join("cpu.stat"), "usage_usec 7500000\n".to_owned()),
            (job.join("memory.current"), "1073741824\n".to_owned()),
            (
                job.join("io.stat"),
                "8:0 rbytes=4096 wbytes=8192\n".to_owned(),
            ),
            (scontrol.clone(), format!("#!/bin/sh\necho '{line}'\n")),
        ] {
            if let Some(parent) = file.parent() {
                std::fs::create_dir_all(parent)
                    .unwrap_or_else(|e| panic!("{}: {e}", parent.display()));
            }
            std::fs::write(&file, text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        }
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&scontrol, std::fs::Permissions::from_mode(0o755))
            .unwrap_or_else(|e| panic!("{}: {e}", scontrol.display()));
        let kubelet = dir.join("fabric-kubelet.sock");
        let k = crate::kubelet::Kubelet::default();
        *k.0.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = vec![crate::kubelet::pod(
            POD.0,
            POD.1,
            &[(POD.2, POD_RESOURCE, &["0"])],
        )];
        k.serve(&kubelet);
        Fabric {
            sys,
            textfile,
            cgroup,
            scontrol,
            kubelet,
            pods: k,
        }
    }

    fn port_dir(&self) -> PathBuf {
        self.sys
            .join("class/infiniband")
            .join(DEVICE)
            .join("ports")
            .join(PORT)
    }

    /// Points an agent's configuration at the fabric.
    pub fn configure(&self, y: &mut Yaml) {
        y.set(
            "sources.host_metrics.sysfs_path",
            self.sys.display().to_string(),
        )
        .set(
            "sources.textfile.directory",
            self.textfile.display().to_string(),
        )
        .set("sources.textfile.interval_seconds", 1.0);
        let mut counters: Vec<Value> = FAST_HW_COUNTERS
            .iter()
            .map(|f| {
                let path = self.port_dir().join("hw_counters").join(f);
                let mut m = Mapping::new();
                m.insert("path".into(), path.display().to_string().into());
                Value::Mapping(m)
            })
            .collect();
        let mut lo = Mapping::new();
        lo.insert(
            "path".into(),
            "/sys/class/net/lo/statistics/rx_packets".into(),
        );
        counters.push(Value::Mapping(lo));
        y.set("sources.fast_counters.interval_milliseconds", 10)
            .set("sources.fast_counters.counters", Value::Sequence(counters));
        y.set(
            "sources.slurm.cgroup_root",
            self.cgroup.display().to_string(),
        )
        .set(
            "sources.slurm.scontrol_path",
            self.scontrol.display().to_string(),
        )
        .set("sources.slurm.interval_seconds", 1.0);
        let mut shared = Mapping::new();
        shared.insert(POD_RESOURCE.into(), Value::Sequence(vec![DEVICE.into()]));
        y.set(
            "sources.pod_resources.socket_path",
            self.kubelet.display().to_string(),
        )
        .set(
            "sources.pod_resources.sysfs_path",
            self.sys.display().to_string(),
        )
        .set("sources.pod_resources.interval_seconds", 1.0)
        .set(
            "sources.pod_resources.shared_resources",
            Value::Mapping(shared),
        );
    }

    /// Takes the port down (`state` `1: DOWN`) once agent `id` has collected it, waits for the
    /// collector to serve the agent's count of that change, brings it back up (`4: ACTIVE`)
    /// the same way, then adds a RoCE v2 GID for `10.0.0.22` at the table's first empty
    /// entry (4) and waits for the GID change.
    ///
    /// # Panics
    /// On timeout, or if a fixture file cannot be written.
    pub fn port_down_and_up(&self, p: &Pipeline, id: &str, timeout: Duration) {
        let port = [("agent", id), ("device", DEVICE), ("port", PORT)];
        let wait = |what: &str, name: &str, m: &[(&str, &str)]| {
            crate::wait_for(what, timeout, Duration::from_millis(200), || {
                let s = p.scrape()?;
                if s.sum(name, m) > 0.0 {
                    Ok(())
                } else {
                    Err(format!("no {name} {m:?} above 0"))
                }
            })
            .unwrap_or_else(|e| panic!("{e}"));
        };
        let write = |file: PathBuf, text: &str| {
            std::fs::write(&file, text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        };
        wait("the port collected", "node_infiniband_state_id", &port);
        for (text, to) in [("1: DOWN\n", "down"), ("4: ACTIVE\n", "active")] {
            write(self.port_dir().join("state"), text);
            let m = [port[0], port[1], port[2], ("to", to)];
            wait(
                "the port state change served",
                "uctel_agent_rdma_port_state_changes_total",
                &m,
            );
        }
        let attrs = self.port_dir().join("gid_attrs");
        write(attrs.join("types/4"), "RoCE v2\n");
        write(attrs.join("ndevs/4"), &format!("{INTERFACE}\n"));
        write(
            self.port_dir().join("gids/4"),
            "0000:0000:0000:0000:0000:ffff:0a00:0016\n",
        );
        wait(
            "the GID change served",
            "uctel_agent_rdma_gid_changes_total",
            &port,
        );
    }
}
