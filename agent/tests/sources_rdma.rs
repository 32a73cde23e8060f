//! RDMA counters from fixture `class/infiniband` trees built in a tempdir.

use std::fs;
use std::path::Path;

use uctel_agent::sources::rdma::{RdmaCounters, RdmaScan};
use uctel_protocol::payload::{Metric, MetricType};

fn write(path: &Path, contents: &str) {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).expect("mkdir");
    }
    fs::write(path, contents).expect("write fixture");
}

fn find<'a>(metrics: &'a [Metric], name: &str, device: &str, port: &str) -> Option<&'a Metric> {
    let hits: Vec<&Metric> = metrics
        .iter()
        .filter(|m| {
            m.name == name
                && m.labels
                    .iter()
                    .any(|l| l.name == "device" && l.value == device)
                && m.labels.iter().any(|l| l.name == "port" && l.value == port)
        })
        .collect();
    assert!(
        hits.len() <= 1,
        "duplicate series {name}{{{device},{port}}}"
    );
    hits.first().copied()
}

fn value(metrics: &[Metric], name: &str, device: &str, port: &str) -> f64 {
    find(metrics, name, device, port)
        .unwrap_or_else(|| panic!("missing {name}{{device={device},port={port}}}"))
        .value
}

#[test]
fn absent_class_directory_gives_no_series_and_no_error() {
    let sys = tempfile::tempdir().expect("tempdir");
    let mut out = Vec::new();
    let scan = RdmaCounters::new(sys.path())
        .collect_into(&mut out)
        .expect("no error");
    assert_eq!(scan, RdmaScan::default());
    assert!(out.is_empty());
}

#[test]
fn mlx5_and_rxe_fixture_trees() {
    let sys = tempfile::tempdir().expect("tempdir");
    let ib = sys.path().join("class/infiniband");

    // An mlx5-like HCA with two ports, standard counters, legacy counters and hw_counters.
    write(&ib.join("mlx5_0/fw_ver"), "16.35.2000\n");
    write(&ib.join("mlx5_0/board_id"), "MT_0000000012\n");
    write(&ib.join("mlx5_0/hca_type"), "MT4119\n");
    for port in ["1", "2"] {
        let p = ib.join("mlx5_0/ports").join(port);
        write(&p.join("state"), "4: ACTIVE\n");
        write(&p.join("phys_state"), "5: LinkUp\n");
        write(&p.join("rate"), "100 Gb/sec (4X EDR)\n");
        write(&p.join("counters/port_rcv_data"), "2500\n");
        write(
            &p.join("counters/port_xmit_data"),
            &format!("{}\n", 1000 * port.parse::<u64>().unwrap_or(0)),
        );
        write(&p.join("counters/port_rcv_packets"), "77\n");
        write(&p.join("counters/VL15_dropped"), "3\n");
        write(&p.join("counters/symbol_error"), "N/A (no PMA)\n");
        write(&p.join("counters/some_future_counter"), "5\n");
        write(&p.join("counters_ext/port_xmit_data_64"), "10\n");
        write(&p.join("hw_counters/out_of_buffer"), "11\n");
        write(&p.join("hw_counters/packet_seq_err"), "12\n");
        write(&p.join("hw_counters/lifespan"), "10\n");
    }
    // A soft-RoCE device: no counters/, rxe hw_counters names, a non-numeric port dir ignored.
    let rxe = ib.join("rxe0/ports/1");
    write(&ib.join("rxe0/fw_ver"), "0.0.0\n");
    write(&rxe.join("state"), "4: ACTIVE\n");
    write(&rxe.join("phys_state"), "5: LinkUp\n");
    write(&rxe.join("rate"), "10 Gb/sec (4X SDR)\n");
    write(&rxe.join("hw_counters/rcvd_seq_err"), "42\n");
    write(&rxe.join("hw_counters/duplicate_request"), "0\n");
    fs::create_dir_all(ib.join("rxe0/ports/notaport")).expect("mkdir");

    let mut out = Vec::new();
    let scan = RdmaCounters::new(sys.path())
        .collect_into(&mut out)
        .expect("scan");
    assert_eq!(scan.devices, 2);
    assert_eq!(scan.ports, 3);
    assert_eq!(scan.skipped.len(), 2, "symbol_error N/A on two ports");
    assert_eq!(scan.samples, out.len());

    // 4-byte word → bytes for port data counters, as node_exporter.
    assert_eq!(
        value(
            &out,
            "node_infiniband_port_data_received_bytes_total",
            "mlx5_0",
            "1"
        ),
        10_000.0
    );
    assert_eq!(
        value(
            &out,
            "node_infiniband_port_data_transmitted_bytes_total",
            "mlx5_0",
            "2"
        ),
        8000.0
    );
    assert_eq!(
        value(
            &out,
            "node_infiniband_legacy_data_transmitted_bytes_total",
            "mlx5_0",
            "1"
        ),
        40.0
    );
    assert_eq!(
        value(
            &out,
            "node_infiniband_port_packets_received_total",
            "mlx5_0",
            "1"
        ),
        77.0
    );
    assert_eq!(
        value(&out, "node_infiniband_vl15_dropped_total", "mlx5_0", "2"),
        3.0
    );
    assert!(find(&out, "node_infiniband_symbol_error_total", "mlx5_0", "1").is_none());
    assert!(!out.iter().any(|m| m.name.contains("some_future_counter")));

    // hw_counters: file name verbatim, counter type (node_exporter's choice).
    let oob = find(&out, "node_infiniband_out_of_buffer", "mlx5_0", "1").expect("out_of_buffer");
    assert_eq!(oob.value, 11.0);
    assert_eq!(MetricType::try_from(oob.r#type), Ok(MetricType::Counter));
    assert_eq!(
        value(&out, "node_infiniband_packet_seq_err", "mlx5_0", "2"),
        12.0
    );
    assert_eq!(
        value(&out, "node_infiniband_rcvd_seq_err", "rxe0", "1"),
        42.0
    );
    assert_eq!(
        value(&out, "node_infiniband_duplicate_request", "rxe0", "1"),
        0.0
    );

    // Port state gauges.
    assert_eq!(value(&out, "node_infiniband_state_id", "mlx5_0", "1"), 4.0);
    assert_eq!(
        value(&out, "node_infiniband_physical_state_id", "rxe0", "1"),
        5.0
    );
    assert_eq!(
        value(&out, "node_infiniband_rate_bytes_per_second", "mlx5_0", "2"),
        12_500_000_000.0
    );
    assert_eq!(
        value(&out, "node_infiniband_rate_bytes_per_second", "rxe0", "1"),
        1_250_000_000.0
    );
    assert!(!out
        .iter()
        .any(|m| m.labels.iter().any(|l| l.value == "notaport")));

    // Device info.
    let info = out
        .iter()
        .find(|m| m.name == "node_infiniband_info" && m.labels.iter().any(|l| l.value == "mlx5_0"))
        .expect("info");
    let label = |n: &str| {
        info.labels
            .iter()
            .find(|l| l.name == n)
            .map(|l| l.value.as_str())
    };
    assert_eq!(label("firmware_version"), Some("16.35.2000"));
    assert_eq!(label("board_id"), Some("MT_0000000012"));
    assert_eq!(label("hca_type"), Some("MT4119"));

    // Every series has device and port labels (info has device only) and the frame timestamp.
    for m in &out {
        assert_eq!(m.timestamp_ms, 0);
        assert!(m.labels.iter().any(|l| l.name == "device"), "{}", m.name);
        if m.name != "node_infiniband_info" {
            assert!(m.labels.iter().any(|l| l.name == "port"), "{}", m.name);
        }
    }
}

#[test]
fn device_without_ports_directory_still_reports_info() {
    let sys = tempfile::tempdir().expect("tempdir");
    write(
        &sys.path().join("class/infiniband/mlx4_0/fw_ver"),
        "2.42.5000\n",
    );
    let mut out = Vec::new();
    let scan = RdmaCounters::new(sys.path())
        .collect_into(&mut out)
        .expect("scan");
    assert_eq!((scan.devices, scan.ports), (1, 0));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].name, "node_infiniband_info");
}
