//! `sources.pod_resources` through the real `uctel-agent` (`--dry-run`, which frames every
//! record as on the wire and prints it): pods' RDMA devices become `pod`, `namespace` and
//! `container` labels on the devices' host and fast-counter series, with
//! `uctel_pod_device_info`.
//!
//! No cluster runs here. The kubelet is a gRPC server built from the same vendored
//! upstream proto (`k8s.io/kubelet/pkg/apis/podresources/v1/api.proto`, the server stubs
//! generated beside the agent's client; `support::kubelet`, the end-to-end tests' test
//! kubelet), served on a temporary unix socket with hyper; the devices are a fixture sysfs
//! tree (an SR-IOV VF's PCI address whose
//! `infiniband/` names `mlx5_3`, and `mlx5_0` with its interface `ens1f0` behind the RDMA
//! shared device plugin's resource).

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::kubelet::{pod, Kubelet};
use serde_json::Value;

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
    kubelet.serve(&socket);
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
    // Its fast counter ends too: one sample, the stale marker (printed as null).
    let fast_mlx5_3 = |r: &Value, pod: &[(&str, &str)]| {
        let mut want = vec![("device", "mlx5_3"), ("port", "1")];
        want.extend_from_slice(pod);
        labels_are(r, &want)
    };
    printed.wait(seen, "trainer-0 fast series stale", |s, r| {
        s == "fast_counters"
            && fast_mlx5_3(r, &t0)
            && r["values"]
                .as_array()
                .is_some_and(|v| v.len() == 1 && v[0].is_null())
    });
    let t1 = [
        ("namespace", "ml"),
        ("pod", "trainer-1"),
        ("container", "worker"),
    ];
    let at = printed.wait(at, "mlx5_3 labelled trainer-1", |_, r| {
        host(r, "mlx5_3", &t1, false)
    });
    printed.wait(seen, "fast mlx5_3 labelled trainer-1", |s, r| {
        s == "fast_counters"
            && fast_mlx5_3(r, &t1)
            && r["values"]
                .as_array()
                .is_some_and(|v| v.iter().all(Value::is_f64))
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

/// The last value of `uctel_agent_source_errors_total{source="pod_resources",reason}`
/// in `frames`.
fn pod_errors(frames: &[Value], reason: &str) -> f64 {
    frames
        .iter()
        .flat_map(|f| f["records"].as_array().into_iter().flatten())
        .filter(|r| {
            r["name"] == "uctel_agent_source_errors_total"
                && r["labels"]["source"] == "pod_resources"
                && r["labels"]["reason"] == reason
        })
        .filter_map(|r| r["value"].as_f64())
        .next_back()
        .unwrap_or(0.0)
}

/// As the packaged unit runs it (user `nobody` here, no capabilities) the agent cannot
/// connect to a kubelet socket only root may write, as the kubelet makes it: counted as
/// `permission_denied` and logged once naming the drop-in; with the drop-in's only grant,
/// `CAP_DAC_OVERRIDE` (ambient), it connects and labels the devices.
#[test]
fn a_non_root_agent_reaches_the_root_only_kubelet_socket_with_the_drop_ins_capability() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    // /proc/self belongs to the effective user.
    if !std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0) {
        eprintln!("SKIPPED: needs root (a root-owned socket, setpriv to nobody)");
        return;
    }
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    // Every directory searchable, so what refuses nobody is the socket's own mode.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
        .unwrap_or_else(|e| panic!("{e}"));
    let sys = dir.path().join("sys");
    sysfs(&sys);
    let socket = dir.path().join("kubelet.sock");
    let cfg = config(dir.path(), &sys, &socket);
    // A state directory the user may write (as the unit's StateDirectory=).
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap_or_else(|e| panic!("{e}"));
    std::os::unix::fs::chown(&state, Some(65534), Some(65534)).unwrap_or_else(|e| panic!("{e}"));
    let text = std::fs::read_to_string(&cfg).unwrap_or_else(|e| panic!("{e}"));
    let text = text.replacen(
        "sources:\n",
        &format!("sources:\n  state_directory: {}\n", state.display()),
        1,
    );
    std::fs::write(&cfg, text).unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o644))
        .unwrap_or_else(|e| panic!("{e}"));
    let kubelet = Kubelet::default();
    *kubelet.0.lock().unwrap_or_else(|e| panic!("{e}")) = vec![pod(
        "ml",
        "trainer-0",
        &[("worker", "intel.com/sriov_rdma_vf", &["0000:3b:02.1"])],
    )];
    kubelet.serve(&socket);
    // The kubelet's socket: owned by root, writable by root only.
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o755))
        .unwrap_or_else(|e| panic!("{e}"));
    let labelled = |frames: &[Value]| {
        frames
            .iter()
            .flat_map(|f| f["records"].as_array().into_iter().flatten())
            .any(|r| {
                host(
                    r,
                    "mlx5_3",
                    &[
                        ("namespace", "ml"),
                        ("pod", "trainer-0"),
                        ("container", "worker"),
                    ],
                    false,
                )
            })
    };

    let (frames, stderr) = crate::support::dry_run_as_nobody(&cfg, &[], 3);
    assert!(!labelled(&frames), "no pod labels without access");
    assert!(
        pod_errors(&frames, "permission_denied") >= 2.0,
        "every refused call counted (interval 0.3 s): {}",
        pod_errors(&frames, "permission_denied")
    );
    let named: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("pod-resources.conf"))
        .collect();
    assert_eq!(
        named.len(),
        1,
        "logged once, naming the drop-in, over several refusals: {stderr}"
    );
    assert!(named[0].contains("permission denied"), "{}", named[0]);

    let (frames, stderr) = crate::support::dry_run_as_nobody(
        &cfg,
        &["--inh-caps=+dac_override", "--ambient-caps=+dac_override"],
        3,
    );
    assert!(
        labelled(&frames),
        "labelled with CAP_DAC_OVERRIDE; stderr: {stderr}"
    );
    assert_eq!(pod_errors(&frames, "permission_denied"), 0.0, "{stderr}");
}
