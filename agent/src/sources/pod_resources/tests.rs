use super::*;

fn section(sysfs: &std::path::Path, max_devices: usize) -> PodResourcesSection {
    PodResourcesSection {
        sysfs_path: sysfs.to_path_buf(),
        max_devices,
        ..Default::default()
    }
}

fn vf_pod(name: &str, addr: &str) -> v1::PodResources {
    v1::PodResources {
        name: name.into(),
        namespace: "ns".into(),
        containers: vec![v1::ContainerResources {
            name: "c".into(),
            devices: vec![v1::ContainerDevices {
                resource_name: "intel.com/sriov".into(),
                device_ids: vec![addr.into()],
                topology: None,
            }],
            ..Default::default()
        }],
    }
}

fn live_info(c: &PodCollection) -> Vec<String> {
    c.metrics
        .iter()
        .filter(|m| m.name == "uctel_pod_device_info" && m.value == 1.0)
        .filter_map(|m| m.labels.iter().find(|l| l.name == "pod"))
        .map(|l| l.value.clone())
        .collect()
}

#[test]
fn the_cap_keeps_the_first_owners_and_counts_the_rest_and_ended_owners_leave() {
    let d = tempfile::tempdir().unwrap();
    for (i, dev) in ["mlx5_2", "mlx5_3", "mlx5_4"].iter().enumerate() {
        let p = d
            .path()
            .join(format!("bus/pci/devices/0000:3b:02.{i}/infiniband/{dev}"));
        std::fs::create_dir_all(p).unwrap();
    }
    let s = section(d.path(), 2);
    let mut a = PodAttribution::default();
    let pods = vec![vf_pod("b", "0000:3b:02.1"), vf_pod("c", "0000:3b:02.2")];
    let c = a.update(&s, Some(&pods));
    assert_eq!(live_info(&c), ["b", "c"]);
    assert_eq!(c.capped, 0);
    // A third pod is over the cap: counted, the first two keep their place.
    let mut three = vec![vf_pod("a", "0000:3b:02.0")];
    three.extend(pods.iter().cloned());
    let c = a.update(&s, Some(&three));
    assert_eq!(live_info(&c), ["b", "c"]);
    assert_eq!(c.capped, 1);
    assert!(c.device_labels.contains_key("mlx5_3"));
    assert!(!c.device_labels.contains_key("mlx5_2"));
    // b ends: its info series is a stale marker for STALE_ROUNDS calls; a takes its place.
    let c = a.update(&s, Some(&[three[0].clone(), three[2].clone()]));
    assert_eq!(live_info(&c), ["a", "c"]);
    let stale = |c: &PodCollection| {
        c.metrics
            .iter()
            .filter(|m| m.value.to_bits() == STALE_NAN_BITS)
            .count()
    };
    assert_eq!(stale(&c), 1);
    // A failed call: no pods, every owner ends.
    for _ in 1..STALE_ROUNDS {
        let c = a.update(&s, None);
        assert!(live_info(&c).is_empty());
        assert!(c.device_labels.is_empty());
    }
    let c = a.update(&s, None);
    assert_eq!(stale(&c), 2, "a and c end; b's markers are over");
}

#[test]
fn the_labeller_adds_labels_and_ends_the_series_whose_labels_changed() {
    let labels = PodLabels::default();
    let mut l = DeviceLabeller::new(labels.clone());
    let series = |dev: &str| {
        vec![
            Metric {
                name: "node_infiniband_port_data_received_bytes_total".into(),
                labels: vec![label("device", dev), label("port", "1")],
                value: 1.0,
                ..Default::default()
            },
            Metric {
                name: "node_load1".into(),
                labels: vec![label("device", dev)],
                value: 1.0,
                ..Default::default()
            },
        ]
    };
    let mut m = series("mlx5_0");
    l.apply(&mut m);
    assert_eq!(m, series("mlx5_0"), "no pods: nothing changes");
    labels.set(DeviceLabels::from([(
        "mlx5_0".to_owned(),
        vec![label("pod", "p")],
    )]));
    let mut m = series("mlx5_0");
    l.apply(&mut m);
    assert_eq!(m.len(), 2);
    assert!(m[0].labels.iter().any(|x| x.name == "pod"));
    assert!(
        m[1].labels.iter().all(|x| x.name != "pod"),
        "not an RDMA family"
    );
    labels.set(DeviceLabels::new());
    let mut m = series("mlx5_0");
    l.apply(&mut m);
    assert_eq!(m.len(), 3, "the labelled series ends with a marker");
    assert_eq!(m[2].value.to_bits(), STALE_NAN_BITS);
    assert!(m[2].labels.iter().any(|x| x.name == "pod"));
    let mut m = series("mlx5_0");
    l.apply(&mut m);
    assert_eq!(m.len(), 2, "once");
}

#[test]
fn fast_counter_series_whose_pod_ended_end_with_markers_sent_again_until_live() {
    let labels = PodLabels::default();
    let mut l = SeriesLabeller::new(labels.clone());
    let record = |start_us: i64| {
        vec![SampleSeries {
            name: "node_infiniband_port_data_received_bytes_total".into(),
            r#type: MetricType::Counter as i32,
            labels: vec![label("device", "mlx5_0"), label("port", "1")],
            start_us,
            offsets_us: vec![0, 10_000],
            values: vec![1.0, 2.0],
            ..Default::default()
        }]
    };
    let pod = |p: &str| DeviceLabels::from([("mlx5_0".to_owned(), vec![label("pod", p)])]);
    let pod_of = |s: &SampleSeries| {
        s.labels
            .iter()
            .find(|x| x.name == "pod")
            .map(|x| x.value.clone())
    };
    labels.set(pod("p1"));
    let mut r = record(1_000);
    assert_eq!(l.apply(&mut r), 0, "a first series ends nothing");
    assert_eq!(pod_of(&r[0]).as_deref(), Some("p1"));
    // p1 ends, p2 takes the device: p1's series ends at p2's first sample.
    labels.set(pod("p2"));
    let mut r = record(2_000);
    assert_eq!(l.apply(&mut r), 1);
    assert_eq!(r.len(), 2);
    assert_eq!(pod_of(&r[0]).as_deref(), Some("p2"));
    let marker = &r[1];
    assert_eq!(pod_of(marker).as_deref(), Some("p1"));
    assert_eq!(
        (marker.values.len(), marker.start_us, marker.offsets_us[0]),
        (1, 2_000, 0)
    );
    assert_eq!(marker.values[0].to_bits(), STALE_NAN_BITS);
    // Sent again with the next records, STALE_ROUNDS times in all.
    for i in 1..STALE_ROUNDS {
        let mut r = record(3_000 + i64::from(i));
        assert_eq!(l.apply(&mut r), 1, "round {i}");
    }
    let mut r = record(4_000);
    assert_eq!(l.apply(&mut r), 0);
    // p2 ends (no pods) and is back before its markers are all sent: they stop.
    labels.set(DeviceLabels::new());
    let mut r = record(5_000);
    assert_eq!(l.apply(&mut r), 1);
    assert_eq!(pod_of(&r[0]), None);
    labels.set(pod("p2"));
    let mut r = record(6_000);
    // The unlabelled series ends now; p2's marker is not sent again.
    assert_eq!(l.apply(&mut r), 1);
    assert_eq!(pod_of(&r[1]), None);
    assert_eq!(pod_of(&r[0]).as_deref(), Some("p2"));
}

#[test]
fn section_problems_name_the_bad_keys() {
    let mut s = PodResourcesSection::default();
    assert!(s.problems().is_empty());
    s.labels.pod = "device".into();
    s.labels.container = "namespace".into();
    s.timeout_seconds = 0.0;
    s.max_devices = 0;
    let keys: Vec<&str> = s.problems().iter().map(|(k, _)| *k).collect();
    assert_eq!(
        keys,
        ["timeout_seconds", "max_devices", "labels.pod", "labels"]
    );
}
