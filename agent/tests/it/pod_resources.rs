//! `sources.pod_resources` through the real `uctel-agent` (`--dry-run`, which frames every
//! record as on the wire and prints it): pods' RDMA devices become `pod`, `namespace` and
//! `container` labels on the devices' host and fast-counter series, with
//! `uctel_pod_device_info`.
//!
//! No cluster runs here. The kubelet is a gRPC server built in this test from the same
//! vendored upstream proto (`k8s.io/kubelet/pkg/apis/podresources/v1/api.proto`, the
//! server stubs generated beside the agent's client: `support::podresources`), served on a temporary unix socket
//! with hyper; the devices are a fixture sysfs tree (an SR-IOV VF's PCI address whose
//! `infiniband/` names `mlx5_3`, and `mlx5_0` with its interface `ens1f0` behind the RDMA
//! shared device plugin's resource).

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::podresources::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use crate::support::podresources::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices,
    ContainerResources, GetPodResourcesRequest, GetPodResourcesResponse, ListPodResourcesRequest,
    ListPodResourcesResponse, PodResources,
};
use serde_json::Value;
use tonic::{Request, Response, Status};

/// The test kubelet: answers `List` with the pods of the moment.
#[derive(Debug, Clone, Default)]
struct Kubelet(Arc<Mutex<Vec<PodResources>>>);

#[tonic::async_trait]
impl PodResourcesLister for Kubelet {
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        let pods = self.0.lock().unwrap_or_else(|e| panic!("{e}")).clone();
        Ok(Response::new(ListPodResourcesResponse {
            pod_resources: pods,
        }))
    }
    async fn get_allocatable_resources(
        &self,
        _: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
    async fn get(
        &self,
        _: Request<GetPodResourcesRequest>,
    ) -> Result<Response<GetPodResourcesResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
}

/// Serves `kubelet` on a unix socket at `path` (HTTP/2 without TLS, as the kubelet does)
/// on a thread of its own, until the process ends.
fn serve(path: &Path, kubelet: Kubelet) {
    let path = path.to_path_buf();
    let (ready, bound) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        rt.block_on(async move {
            let listener = tokio::net::UnixListener::bind(&path).unwrap_or_else(|e| panic!("{e}"));
            ready.send(()).unwrap_or_else(|e| panic!("{e}"));
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let svc = PodResourcesListerServer::new(kubelet.clone());
                tokio::spawn(async move {
                    let _ = hyper_util::server::conn::auto::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .http2_only()
                    .serve_connection(
                        hyper_util::rt::TokioIo::new(stream),
                        hyper_util::service::TowerToHyperService::new(svc),
                    )
                    .await;
                });
            }
        });
    });
    bound
        .recv_timeout(Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{e}"));
}

fn pod(namespace: &str, name: &str, containers: &[(&str, &str, &[&str])]) -> PodResources {
    PodResources {
        name: name.into(),
        namespace: namespace.into(),
        containers: containers
            .iter()
            .map(|(c, resource, ids)| ContainerResources {
                name: (*c).into(),
                devices: vec![ContainerDevices {
                    resource_name: (*resource).into(),
                    device_ids: ids.iter().map(|i| (*i).to_owned()).collect(),
                    topology: None,
                }],
                ..Default::default()
            })
            .collect(),
    }
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap_or_else(|| panic!("parent")))
        .unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(path, text).unwrap_or_else(|e| panic!("{e}"));
}

/// sysfs: `mlx5_0` (interface `ens1f0`) and `mlx5_3`, the RDMA device of VF 0000:3b:02.1.
fn sysfs(root: &Path) {
    for dev in ["mlx5_0", "mlx5_3"] {
        write(
            &root.join(format!(
                "class/infiniband/{dev}/ports/1/counters/port_rcv_data"
            )),
            "100\n",
        );
        write(
            &root.join(format!(
                "class/infiniband/{dev}/ports/1/hw_counters/out_of_buffer"
            )),
            "7\n",
        );
    }
    std::fs::create_dir_all(root.join("class/infiniband/mlx5_0/device/net/ens1f0"))
        .unwrap_or_else(|e| panic!("{e}"));
    std::fs::create_dir_all(root.join("bus/pci/devices/0000:3b:02.1/infiniband/mlx5_3"))
        .unwrap_or_else(|e| panic!("{e}"));
    write(&root.join("class/net/ens1f0/statistics/rx_bytes"), "5\n");
}

/// The records the agent printed, in order, read on a thread of their own.
#[derive(Clone, Default)]
struct Printed(Arc<Mutex<Vec<(String, Value)>>>);

impl Printed {
    fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| panic!("{e}")).len()
    }
    /// Waits (up to 30 s) for a record after position `from` that `want` accepts; its
    /// position.
    fn wait(&self, from: usize, what: &str, want: impl Fn(&str, &Value) -> bool) -> usize {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            {
                let all = self.0.lock().unwrap_or_else(|e| panic!("{e}"));
                if let Some(i) = all.iter().skip(from).position(|(s, r)| want(s, r)) {
                    return from + i;
                }
                if Instant::now() > deadline {
                    let names: Vec<String> = all
                        .iter()
                        .rev()
                        .take(40)
                        .map(|(_, r)| format!("{} {} {}", r["name"], r["labels"], r["value"]))
                        .collect();
                    panic!("no {what} after record {from} in 30 s; last: {names:#?}");
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn labels_are(r: &Value, want: &[(&str, &str)]) -> bool {
    let Some(l) = r["labels"].as_object() else {
        return false;
    };
    l.len() == want.len()
        && want
            .iter()
            .all(|(k, v)| l.get(*k).and_then(Value::as_str) == Some(*v))
}

fn host(r: &Value, dev: &str, extra: &[(&str, &str)], stale: bool) -> bool {
    let mut want = vec![("device", dev), ("port", "1")];
    want.extend_from_slice(extra);
    r["name"] == "node_infiniband_port_data_received_bytes_total"
        && labels_are(r, &want)
        && r["value"].is_null() == stale
}

fn info(r: &Value, pod: (&str, &str, &str), dev: &str, resource: &str, stale: bool) -> bool {
    r["name"] == "uctel_pod_device_info"
        && labels_are(
            r,
            &[
                ("namespace", pod.0),
                ("pod", pod.1),
                ("container", pod.2),
                ("device", dev),
                ("resource", resource),
            ],
        )
        && r["value"].is_null() == stale
}

fn config(dir: &Path, sys: &Path, socket: &Path) -> PathBuf {
    let cfg = dir.join("agent.yaml");
    let s = sys.display();
    std::fs::write(
        &cfg,
        format!(
            "agent_id: pods\ncollector:\n  control: 127.0.0.1:1\nauth:\n  token: t\n\
             sources:\n  host_metrics:\n    interval_seconds: 0.3\n    sysfs_path: {s}\n\
             \x20 self_metrics:\n    interval_seconds: 0.3\n\
             \x20 fast_counters:\n    interval_milliseconds: 50\n    samples_per_record: 2\n\
             \x20   counters:\n\
             \x20     - path: {s}/class/infiniband/mlx5_3/ports/1/counters/port_rcv_data\n\
             \x20     - path: {s}/class/net/ens1f0/statistics/rx_bytes\n\
             \x20 pod_resources:\n    socket_path: {}\n    interval_seconds: 0.3\n\
             \x20   sysfs_path: {s}\n    shared_resources:\n\
             \x20     rdma/hca_shared_devices_a: [mlx5_0]\n",
            socket.display()
        ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    cfg
}

#[test]
fn pods_label_their_devices_series_and_leave_when_they_end() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let sys = dir.path().join("sys");
    sysfs(&sys);
    let socket = dir.path().join("kubelet.sock");
    let cfg = config(dir.path(), &sys, &socket);
    let mut child = Command::new(env!("CARGO_BIN_EXE_uctel-agent"))
        .arg("--config")
        .arg(&cfg)
        .args(["--dry-run", "--log-level", "warn"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let printed = Printed::default();
    let stdout = child.stdout.take().unwrap_or_else(|| panic!("stdout"));
    let sink = printed.clone();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            let Ok(frame) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            let stream = frame["stream"].as_str().unwrap_or_default().to_owned();
            let records = frame["records"].as_array().cloned().unwrap_or_default();
            let mut all = sink.0.lock().unwrap_or_else(|e| panic!("{e}"));
            all.extend(records.into_iter().map(|r| (stream.clone(), r)));
        }
    });

    // No kubelet socket: counted, and the device series carry no pod labels.
    let at = printed.wait(0, "socket_absent count", |_, r| {
        r["name"] == "uctel_agent_source_errors_total"
            && labels_are(
                r,
                &[("source", "pod_resources"), ("reason", "socket_absent")],
            )
            && r["value"].as_f64().is_some_and(|v| v >= 1.0)
    });
    printed.wait(at, "mlx5_3 unlabelled", |_, r| {
        host(r, "mlx5_3", &[], false)
    });

    // A kubelet: a VF for trainer-0 (and a GPU, not an RDMA device), the shared HCA for
    // two containers of one pod.
    let kubelet = Kubelet::default();
    *kubelet.0.lock().unwrap_or_else(|e| panic!("{e}")) = vec![
        pod(
            "ml",
            "trainer-0",
            &[
                ("worker", "intel.com/sriov_rdma_vf", &["0000:3b:02.1"]),
                ("gpu", "nvidia.com/gpu", &["GPU-8c2b"]),
            ],
        ),
        pod(
            "perf",
            "bench",
            &[
                ("a", "rdma/hca_shared_devices_a", &["3"]),
                ("b", "rdma/hca_shared_devices_a", &["4"]),
            ],
        ),
    ];
    serve(&socket, kubelet.clone());
    let t0 = [
        ("namespace", "ml"),
        ("pod", "trainer-0"),
        ("container", "worker"),
    ];
    let at = printed.wait(at, "mlx5_3 labelled trainer-0", |_, r| {
        host(r, "mlx5_3", &t0, false)
    });
    // The shared HCA: the labels both containers agree on (pod and namespace).
    let bench = [("namespace", "perf"), ("pod", "bench")];
    printed.wait(at, "mlx5_0 labelled bench", |_, r| {
        host(r, "mlx5_0", &bench, false)
    });
    for (who, dev, res) in [
        (
            ("ml", "trainer-0", "worker"),
            "mlx5_3",
            "intel.com/sriov_rdma_vf",
        ),
        (
            ("perf", "bench", "a"),
            "mlx5_0",
            "rdma/hca_shared_devices_a",
        ),
        (
            ("perf", "bench", "b"),
            "mlx5_0",
            "rdma/hca_shared_devices_a",
        ),
    ] {
        printed.wait(at, "info series", |_, r| info(r, who, dev, res, false));
    }
    // Fast counters: the RDMA device's and the shared HCA's interface's series.
    let at = printed.wait(at, "fast mlx5_3 labelled", |s, r| {
        s == "fast_counters"
            && labels_are(
                r,
                &[("device", "mlx5_3"), ("port", "1"), t0[0], t0[1], t0[2]],
            )
    });
    printed.wait(at, "fast ens1f0 labelled", |s, r| {
        s == "fast_counters" && labels_are(r, &[("device", "ens1f0"), bench[0], bench[1]])
    });
    let seen = printed.len();
    let absent_before = {
        let all = printed.0.lock().unwrap_or_else(|e| panic!("{e}"));
        assert!(
            all.iter().all(|(_, r)| r["name"] != "uctel_pod_device_info"
                || r["labels"]["resource"] != "nvidia.com/gpu"),
            "a GPU is no RDMA device"
        );
        all.iter()
            .filter(|(_, r)| {
                r["name"] == "uctel_agent_source_errors_total"
                    && labels_are(
                        r,
                        &[("source", "pod_resources"), ("reason", "socket_absent")],
                    )
            })
            .filter_map(|(_, r)| r["value"].as_f64())
            .fold(0.0, f64::max)
    };

    // trainer-0 ends, trainer-1 gets the VF: trainer-0 leaves at once (stale markers on
    // its info and on the VF's labelled series), trainer-1 labels it.
    {
        let mut pods = kubelet.0.lock().unwrap_or_else(|e| panic!("{e}"));
        pods.remove(0);
        pods.push(pod(
            "ml",
            "trainer-1",
            &[("worker", "intel.com/sriov_rdma_vf", &["0000:3b:02.1"])],
        ));
    }
    let at = printed.wait(seen, "trainer-0 info stale", |_, r| {
        info(
            r,
            ("ml", "trainer-0", "worker"),
            "mlx5_3",
            "intel.com/sriov_rdma_vf",
            true,
        )
    });
    printed.wait(seen, "trainer-0 host series stale", |_, r| {
        host(r, "mlx5_3", &t0, true)
    });
    let t1 = [
        ("namespace", "ml"),
        ("pod", "trainer-1"),
        ("container", "worker"),
    ];
    let at = printed.wait(at, "mlx5_3 labelled trainer-1", |_, r| {
        host(r, "mlx5_3", &t1, false)
    });

    // The kubelet goes away: counted again, the labels go.
    std::fs::remove_file(&socket).unwrap_or_else(|e| panic!("{e}"));
    let at = printed.wait(at, "bench info stale", |_, r| {
        info(
            r,
            ("perf", "bench", "a"),
            "mlx5_0",
            "rdma/hca_shared_devices_a",
            true,
        )
    });
    printed.wait(at, "mlx5_0 unlabelled", |_, r| {
        host(r, "mlx5_0", &[], false)
    });
    printed.wait(at, "mlx5_3 unlabelled", |_, r| {
        host(r, "mlx5_3", &[], false)
    });
    printed.wait(at, "socket_absent counted again", |_, r| {
        r["name"] == "uctel_agent_source_errors_total"
            && labels_are(
                r,
                &[("source", "pod_resources"), ("reason", "socket_absent")],
            )
            && r["value"].as_f64().is_some_and(|v| v > absent_before)
    });
    let _ = child.kill();
    let _ = child.wait();
}
