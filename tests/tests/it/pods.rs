//! Kubernetes pods that end, through the real binaries: an agent on the RDMA fabric fixture
//! ([`uctel_tests::fabric`]: `mlx5_0` with host metrics, ethtool pause statistics and fast
//! counters) with `sources.pod_resources` reading a test kubelet ([`uctel_tests::kubelet`]),
//! its collector remote-writing into a real VictoriaMetrics.
//!
//! No cluster runs here: the kubelet is a `podresources/v1` gRPC server built from the
//! vendored upstream proto (`k8s.io/kubelet/pkg/apis/podresources/v1/api.proto`) on a unix
//! socket, listing the pods the test gives it.
//!
//! * A pod that ends takes every series that carried its labels off the collector's
//!   `/metrics` within seconds (the collector's `staleness_seconds` is 300, so only the
//!   agent's stale markers explain it): `uctel_pod_device_info`, the device's
//!   `node_infiniband_*` host series and its fast counters with their `_per_second` rates;
//!   and every such series VictoriaMetrics received ends with a stale marker after its last
//!   sample, so a query no longer finds it.
//! * 1,000 short pods, coming and going 25 at a time, keep `/metrics` and the remote-write
//!   series bounded (at most `max_devices` info series, ended pods leave, the cap counted
//!   as `reason="device_cap"`), and leave nothing behind once they have all ended.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_yaml::{Mapping, Value};
use uctel_tests::exposition::Scrape;
use uctel_tests::fabric::{Fabric, DEVICE, POD, POD_RESOURCE};
use uctel_tests::kubelet::pod;
use uctel_tests::pipeline::Pipeline;
use uctel_tests::victoria::Victoria;
use uctel_tests::wait_for;

const UP: Duration = Duration::from_secs(60);
const RW: &str = "uctel_collector_remote_write_";
/// A shared device plugin resource standing for an RDMA device this host does not have.
const OTHER_RESOURCE: &str = "rdma/hca_shared_devices_b";

fn tick() -> Duration {
    Duration::from_millis(200)
}

/// A collector remote-writing into `vm`, with one fabric agent `id` whose pod-resources
/// source calls every 0.2 s and exports at most `max_devices` pairs.
fn start(vm: &Victoria, id: &str, max_devices: u64) -> (Pipeline, Fabric) {
    let url = vm.write_url();
    let mut p = Pipeline::start_with(|y, _| {
        let mut rw = Mapping::new();
        rw.insert("url".into(), url.into());
        rw.insert("batch_send_deadline_seconds".into(), 0.2.into());
        y.set(
            "outputs.remote_write",
            Value::Sequence(vec![Value::Mapping(rw)]),
        )
        .set("staleness_seconds", 300);
    });
    let fabric = Fabric::new(p.path());
    p.add_agent_with(id, 0.0, 0.5, |y| {
        fabric.configure(y);
        // A second shared resource whose pods own no device of this host: an info series
        // each, no device labels.
        y.set("sources.pod_resources.interval_seconds", 0.2)
            .set("sources.pod_resources.max_devices", max_devices)
            .set(
                &format!("sources.pod_resources.shared_resources.{OTHER_RESOURCE}"),
                Value::Sequence(vec!["mlx5_9".into()]),
            );
    });
    p.wait_flowing(1, &[id], &["metrics", "fast_counters"], UP);
    (p, fabric)
}

/// The collector's series of agent `id` that carry label `pod` (any value when `None`),
/// as `name{labels}`.
fn pod_series(s: &Scrape, id: &str, pod: Option<&str>) -> BTreeSet<String> {
    s.samples
        .iter()
        .filter(|x| x.label("agent") == Some(id))
        .filter(|x| {
            x.label("pod")
                .is_some_and(|p| pod.is_none_or(|want| p == want))
        })
        .map(|x| format!("{}{:?}", x.name, x.labels))
        .collect()
}

/// The remote-write endpoint's series gauge and its accounting: `samples_in` and
/// `sent + dropped + failed + pending`.
fn remote_write(s: &Scrape) -> (u64, u64, u64) {
    let n = |name: &str| s.count(&format!("{RW}{name}"), &[]);
    (
        n("series"),
        n("samples_in_total"),
        n("samples_total")
            + n("samples_dropped_total")
            + n("samples_failed_total")
            + n("samples_pending"),
    )
}

/// VictoriaMetrics' series for `selector` whose last point is not a stale marker.
fn not_ended(vm: &Victoria, selector: &str) -> Result<Vec<String>, String> {
    let values = vm.export(selector)?;
    let stale = vm.stale_markers(selector)?;
    Ok(values
        .iter()
        .filter(|(labels, samples)| {
            let last = samples.last().map_or(i64::MIN, |s| s.0);
            !stale
                .get(*labels)
                .is_some_and(|m| m.iter().any(|(t, _)| *t > last))
        })
        .map(|(labels, _)| format!("{labels:?}"))
        .collect())
}

/// How many series VictoriaMetrics holds for `selector`, once they include the pod's info
/// series, a host series of its device and a fast counter of it (remote-written sample by
/// sample).
fn received(vm: &Victoria, selector: &str) -> Result<usize, String> {
    let all = vm.export(selector)?;
    let names: BTreeSet<String> = all
        .keys()
        .filter_map(|l| l.iter().find(|(k, _)| k == "__name__"))
        .map(|(_, v)| v.clone())
        .collect();
    for name in [
        "uctel_pod_device_info",
        "node_infiniband_port_data_received_bytes_total",
        "node_infiniband_out_of_buffer",
    ] {
        if !names.contains(name) {
            return Err(format!("no {name} received: {names:?}"));
        }
    }
    Ok(all.len())
}

/// A fresh directory named `prefix…` and a VictoriaMetrics keeping its data there (bind
/// them in this order, so that the server stops before its directory goes).
fn victoria(prefix: &str) -> (tempfile::TempDir, Victoria) {
    let receiver = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .unwrap_or_else(|e| panic!("{e}"));
    let vm = Victoria::start(receiver.path());
    (receiver, vm)
}

/// Ends every pod the test kubelet lists.
fn end_all_pods(fabric: &Fabric) {
    fabric
        .pods
        .0
        .lock()
        .unwrap_or_else(|e| panic!("{e}"))
        .clear();
}

/// Waits (`UP` at most) until a query of `vm` (`count(selector)`) finds no series.
fn wait_no_live_series(vm: &Victoria, selector: &str, what: &str) {
    wait_for(what, UP, tick(), || {
        let live = vm.query(&format!("count({selector})"))?;
        if live.is_empty() {
            Ok(())
        } else {
            Err(format!("{live:?}"))
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", vm.log_tail()));
}

#[test]
fn an_ended_pods_series_leave_metrics_at_once_and_end_in_victoria_metrics() {
    let _guard = uctel_tests::exclusive();
    let (_receiver, vm) = victoria("uctel-pods-vm-");
    let id = "pod-ends";
    let (p, fabric) = start(&vm, id, 1024);
    let (_, pod_name, _) = POD;
    // The pod's series: its info series, the device's host series and fast counters (the
    // rate series is the collector's, from the fast counter's samples).
    let must = [
        "uctel_pod_device_info",
        "node_infiniband_port_data_received_bytes_total",
        "node_infiniband_out_of_buffer_per_second",
    ];
    let held = wait_for("the pod's series at the collector", UP, tick(), || {
        let s = p.scrape()?;
        let series = pod_series(&s, id, Some(pod_name));
        for name in must {
            if !s.has(
                name,
                &[("agent", id), ("pod", pod_name), ("device", DEVICE)],
            ) {
                return Err(format!("no {name} of {pod_name}; {series:#?}"));
            }
        }
        Ok(series)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", p.collector.log_tail(40)));
    println!("{} series with pod=\"{pod_name}\"", held.len());
    // Let a few fast-counter records and host collections reach VictoriaMetrics.
    std::thread::sleep(Duration::from_secs(3));

    let ended_at = Instant::now();
    end_all_pods(&fabric);
    wait_for(
        "the pod's series gone from /metrics",
        Duration::from_secs(15),
        tick(),
        || {
            let left = pod_series(&p.scrape()?, id, Some(pod_name));
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("left: {left:#?}"))
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", p.collector.log_tail(40)));
    let gone = ended_at.elapsed();
    println!("every series of {pod_name} left /metrics {gone:?} after it ended");
    // The device's series go on without the pod's labels.
    wait_for("mlx5_0 unlabelled", UP, tick(), || {
        let s = p.scrape()?;
        let m = [("agent", id), ("device", DEVICE), ("port", "1")];
        let unlabelled = s
            .select("node_infiniband_port_data_received_bytes_total", &m)
            .chain(s.select("node_infiniband_out_of_buffer_per_second", &m))
            .filter(|x| x.label("pod").is_none())
            .count();
        if unlabelled == 2 {
            Ok(())
        } else {
            Err(format!("{unlabelled} of 2 unlabelled series"))
        }
    })
    .unwrap_or_else(|e| panic!("{e}"));

    // VictoriaMetrics: every series with the pod's label ends with a stale marker after its
    // last sample (the collector's staleness alone would take 300 s).
    let selector = format!(r#"{{agent="{id}",pod="{pod_name}"}}"#);
    let received = wait_for(
        "the pod's series ended in VictoriaMetrics",
        UP,
        tick(),
        || {
            let all = received(&vm, &selector)?;
            let open = not_ended(&vm, &selector)?;
            if open.is_empty() {
                Ok(all)
            } else {
                Err(format!(
                    "{} of {all} series without a final stale marker: {open:#?}",
                    open.len(),
                ))
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", vm.log_tail()));
    println!("{received} series of {pod_name} in VictoriaMetrics, each ended by a stale marker");
    wait_no_live_series(&vm, &selector, "a query finds no series of the ended pod");
    let s = p.scrape().unwrap_or_else(|e| panic!("{e}"));
    let (_, samples_in, out) = remote_write(&s);
    assert_eq!(samples_in, out, "remote-write accounting adds up");
    assert!(
        s.count(&format!("{RW}stale_markers_total"), &[]) >= received as u64,
        "the markers are counted"
    );
}

#[test]
fn a_thousand_short_pods_keep_the_series_bounded_and_leave_nothing_behind() {
    let _guard = uctel_tests::exclusive();
    const MAX_DEVICES: u64 = 16;
    const PER_ROUND: usize = 25;
    const PODS: usize = 1_000;
    let (_receiver, vm) = victoria("uctel-pods-churn-");
    let id = "pod-churn";
    let (p, fabric) = start(&vm, id, MAX_DEVICES);
    // Before the pods come: the fixture's pod (ended at once) and the series baseline.
    end_all_pods(&fabric);
    std::thread::sleep(Duration::from_secs(3));
    let s = p.scrape().unwrap_or_else(|e| panic!("{e}"));
    let agent_series = |s: &Scrape| {
        s.samples
            .iter()
            .filter(|x| x.label("agent") == Some(id))
            .count()
    };
    let (base_series, base_rw) = (agent_series(&s), remote_write(&s).0);
    let device_series = s
        .samples
        .iter()
        .filter(|x| x.label("agent") == Some(id) && x.label("device").is_some())
        .count();
    println!("baseline: {base_series} series at /metrics ({device_series} with a device), {base_rw} remote-write series");

    // Rounds of 25 pods lasting about two calls each: the first owns mlx5_0 alone (its
    // series carry its labels; its name sorts first, so the cap keeps it), the others
    // share a second resource (an info series each).
    let ns = |round: usize| format!("churn-{round:03}");
    let (mut max_series, mut max_info, mut max_labelled, mut max_rw) = (0, 0, 0, 0);
    let started = Instant::now();
    for round in 0..PODS / PER_ROUND {
        let pods: Vec<_> = (0..PER_ROUND)
            .map(|i| {
                if i == 0 {
                    pod(
                        &ns(round),
                        &format!("a-solo-{round}"),
                        &[("w", POD_RESOURCE, &["0"])],
                    )
                } else {
                    pod(
                        &ns(round),
                        &format!("short-{round}-{i}"),
                        &[("w", OTHER_RESOURCE, &["0"])],
                    )
                }
            })
            .collect();
        *fabric.pods.0.lock().unwrap_or_else(|e| panic!("{e}")) = pods;
        std::thread::sleep(Duration::from_millis(450));
        let s = p.scrape().unwrap_or_else(|e| panic!("{e}"));
        max_series = max_series.max(agent_series(&s));
        max_info = max_info.max(s.select("uctel_pod_device_info", &[("agent", id)]).count());
        max_labelled = max_labelled.max(pod_series(&s, id, None).len());
        max_rw = max_rw.max(remote_write(&s).0);
    }
    println!(
        "{PODS} pods in {:?}: at most {max_series} series at /metrics, {max_info} info series, \
         {max_labelled} with a pod label, {max_rw} remote-write series",
        started.elapsed()
    );
    end_all_pods(&fabric);

    // Bounded: at most max_devices info series (twice, for a scrape between the frames of
    // one call), and the pod labels on no more series than the device has.
    let bound = 2 * MAX_DEVICES as usize;
    assert!(
        max_info <= bound,
        "{max_info} info series, cap {MAX_DEVICES}"
    );
    assert!(
        max_labelled <= bound + device_series,
        "{max_labelled} labelled series"
    );
    assert!(
        max_series <= base_series + bound + device_series,
        "{max_series} series (baseline {base_series})"
    );
    assert!(
        max_rw <= base_rw + (bound + device_series) as u64 * 2,
        "{max_rw} remote-write series (baseline {base_rw})"
    );
    // The cap was hit (25 pairs, 16 exported) and counted.
    let capped = wait_for("device_cap counted", UP, tick(), || {
        let s = p.scrape()?;
        let n = s.sum(
            "uctel_agent_source_errors_total",
            &[
                ("agent", id),
                ("source", "pod_resources"),
                ("reason", "device_cap"),
            ],
        );
        if n > 0.0 {
            Ok(n)
        } else {
            Err("no device_cap".into())
        }
    })
    .unwrap_or_else(|e| panic!("{e}"));
    println!("device_cap counted {capped} times");

    // Nothing left once every pod ended: no pod series at /metrics or in a query of
    // VictoriaMetrics, and remote-write back to its baseline of series.
    wait_for("every pod gone", UP, tick(), || {
        let s = p.scrape()?;
        let left = pod_series(&s, id, None);
        let rw = remote_write(&s).0;
        if !left.is_empty() {
            return Err(format!("{} series with a pod label: {left:#?}", left.len()));
        }
        if rw > base_rw + device_series as u64 {
            return Err(format!("{rw} remote-write series, baseline {base_rw}"));
        }
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", p.collector.log_tail(40)));
    let selector = format!(r#"{{agent="{id}",pod!=""}}"#);
    let held = wait_for("VictoriaMetrics has the pods", UP, tick(), || {
        let n = vm.export(&selector)?.len();
        if n >= PODS / PER_ROUND {
            Ok(n)
        } else {
            Err(format!("{n} pod series"))
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", vm.log_tail()));
    wait_no_live_series(&vm, &selector, "every pod series ended in VictoriaMetrics");
    println!("{held} pod series received by VictoriaMetrics, none live after the pods ended");
    let s = p.scrape().unwrap_or_else(|e| panic!("{e}"));
    let (_, samples_in, out) = remote_write(&s);
    assert_eq!(samples_in, out, "remote-write accounting adds up");
}
