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

/// The committed ConnectX-6 Dx tree (`tests/data/connectx-6-dx/`, see its README).
fn connectx_sys() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/connectx-6-dx/sys")
}

fn connectx_port() -> std::path::PathBuf {
    connectx_sys().join("class/infiniband/mlx5_0/ports/1")
}

fn read_u64(path: &Path) -> u64 {
    fs::read_to_string(path)
        .expect("fixture file")
        .trim()
        .parse()
        .expect("decimal")
}

fn collect_connectx() -> Vec<Metric> {
    let mut out = Vec::new();
    let scan = RdmaCounters::new(&connectx_sys())
        .collect_into(&mut out)
        .expect("scan");
    assert!(scan.skipped.is_empty(), "{:?}", scan.skipped);
    assert!(scan.events.is_empty(), "first collection is the baseline");
    assert_eq!((scan.devices, scan.ports), (1, 1));
    out
}

/// The mlx5 hw_counters of `drivers/infiniband/hw/mlx5/counters.c` (tables `basic_q_cnts`,
/// `out_of_seq_q_cnts`, `retrans_q_cnts`, `cong_cnts`, `extended_err_cnts`,
/// `roce_accl_cnts`, `ext_ppcnt_cnts`) plus the core's `lifespan`.
const MLX5_HW_COUNTERS: [&str; 32] = [
    "rx_write_requests",
    "rx_read_requests",
    "rx_atomic_requests",
    "rx_dct_connect",
    "out_of_buffer",
    "out_of_sequence",
    "duplicate_request",
    "rnr_nak_retry_err",
    "packet_seq_err",
    "implied_nak_seq_err",
    "local_ack_timeout_err",
    "rp_cnp_ignored",
    "rp_cnp_handled",
    "np_ecn_marked_roce_packets",
    "np_cnp_sent",
    "resp_local_length_error",
    "resp_cqe_error",
    "req_cqe_error",
    "req_remote_invalid_request",
    "req_remote_access_errors",
    "resp_remote_access_errors",
    "resp_cqe_flush_error",
    "req_cqe_flush_error",
    "req_transport_retries_exceeded",
    "req_rnr_retries_exceeded",
    "roce_adp_retrans",
    "roce_adp_retrans_to",
    "roce_slow_restart",
    "roce_slow_restart_cnps",
    "roce_slow_restart_trans",
    "rx_icrc_encapsulated",
    "lifespan",
];

#[test]
fn connectx_fixture_every_hw_counter_is_a_node_infiniband_series() {
    let names = MLX5_HW_COUNTERS;
    let hw_dir = connectx_port().join("hw_counters");
    let mut files: Vec<String> = fs::read_dir(&hw_dir)
        .expect("hw_counters")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    let mut want: Vec<String> = names.iter().map(|s| (*s).to_owned()).collect();
    want.sort();
    assert_eq!(files, want, "the fixture holds exactly the mlx5 list");

    let out = collect_connectx();
    let mut values = std::collections::HashSet::new();
    for file in &files {
        let name = format!("node_infiniband_{file}");
        let m = find(&out, &name, "mlx5_0", "1").unwrap_or_else(|| panic!("missing {name}"));
        let want = read_u64(&hw_dir.join(file));
        assert_eq!(m.value, want as f64, "{name}");
        assert_eq!(
            MetricType::try_from(m.r#type),
            Ok(MetricType::Counter),
            "{name}"
        );
        let mut labels: Vec<(&str, &str)> = m
            .labels
            .iter()
            .map(|l| (l.name.as_str(), l.value.as_str()))
            .collect();
        labels.sort_unstable();
        assert_eq!(labels, [("device", "mlx5_0"), ("port", "1")], "{name}");
        values.insert(want);
    }
    assert_eq!(
        values.len(),
        files.len(),
        "every fixture file has its own value"
    );
    // The congestion and retransmission counters operators look for first.
    for (name, v) in [
        ("node_infiniband_out_of_buffer", 5468.0),
        ("node_infiniband_np_cnp_sent", 6778.0),
        ("node_infiniband_roce_adp_retrans", 8450.0),
    ] {
        assert_eq!(value(&out, name, "mlx5_0", "1"), v, "{name}");
    }
}

/// Every series node_exporter 1.5.0's infiniband collector (`collector/infiniband_linux.go`
/// at tag v1.5.0, with prometheus/procfs `sysfs/class_infiniband.go`) gives for this tree:
/// (series, source file under `ports/1/`, multiplier). node_exporter 1.5.0 reads no
/// `hw_counters`; `VL15_dropped` it does not export.
const NODE_EXPORTER_1_5_0: [(&str, &str, f64); 22] = [
    ("node_infiniband_state_id", "state", 0.0),
    ("node_infiniband_physical_state_id", "phys_state", 0.0),
    ("node_infiniband_rate_bytes_per_second", "rate", 0.0),
    (
        "node_infiniband_symbol_error_total",
        "counters/symbol_error",
        1.0,
    ),
    (
        "node_infiniband_link_error_recovery_total",
        "counters/link_error_recovery",
        1.0,
    ),
    (
        "node_infiniband_link_downed_total",
        "counters/link_downed",
        1.0,
    ),
    (
        "node_infiniband_port_errors_received_total",
        "counters/port_rcv_errors",
        1.0,
    ),
    (
        "node_infiniband_port_receive_remote_physical_errors_total",
        "counters/port_rcv_remote_physical_errors",
        1.0,
    ),
    (
        "node_infiniband_port_receive_switch_relay_errors_total",
        "counters/port_rcv_switch_relay_errors",
        1.0,
    ),
    (
        "node_infiniband_port_discards_transmitted_total",
        "counters/port_xmit_discards",
        1.0,
    ),
    (
        "node_infiniband_port_constraint_errors_transmitted_total",
        "counters/port_xmit_constraint_errors",
        1.0,
    ),
    (
        "node_infiniband_port_constraint_errors_received_total",
        "counters/port_rcv_constraint_errors",
        1.0,
    ),
    (
        "node_infiniband_local_link_integrity_errors_total",
        "counters/local_link_integrity_errors",
        1.0,
    ),
    (
        "node_infiniband_excessive_buffer_overrun_errors_total",
        "counters/excessive_buffer_overrun_errors",
        1.0,
    ),
    (
        "node_infiniband_port_data_transmitted_bytes_total",
        "counters/port_xmit_data",
        4.0,
    ),
    (
        "node_infiniband_port_data_received_bytes_total",
        "counters/port_rcv_data",
        4.0,
    ),
    (
        "node_infiniband_port_packets_transmitted_total",
        "counters/port_xmit_packets",
        1.0,
    ),
    (
        "node_infiniband_port_packets_received_total",
        "counters/port_rcv_packets",
        1.0,
    ),
    (
        "node_infiniband_unicast_packets_received_total",
        "counters/unicast_rcv_packets",
        1.0,
    ),
    (
        "node_infiniband_unicast_packets_transmitted_total",
        "counters/unicast_xmit_packets",
        1.0,
    ),
    (
        "node_infiniband_multicast_packets_received_total",
        "counters/multicast_rcv_packets",
        1.0,
    ),
    (
        "node_infiniband_multicast_packets_transmitted_total",
        "counters/multicast_xmit_packets",
        1.0,
    ),
];

#[test]
fn connectx_fixture_node_exporter_1_5_names_are_identical() {
    let out = collect_connectx();
    let port = connectx_port();
    for (name, file, mult) in NODE_EXPORTER_1_5_0 {
        let got = value(&out, name, "mlx5_0", "1");
        let want = match file {
            "state" => 4.0,             // "4: ACTIVE"
            "phys_state" => 5.0,        // "5: LinkUp"
            "rate" => 12_500_000_000.0, // "100 Gb/sec (2X HDR)" × 125 000 000
            _ => read_u64(&port.join(file)) as f64 * mult,
        };
        assert_eq!(got, want, "{name} from {file}");
        let kind = if name.ends_with("_total") {
            MetricType::Counter
        } else {
            MetricType::Gauge
        };
        let m = find(&out, name, "mlx5_0", "1").expect("found above");
        assert_eq!(MetricType::try_from(m.r#type), Ok(kind), "{name}");
        assert_eq!(m.labels.len(), 2, "{name}: device and port only");
    }
    // Every file of counters/ feeds one node_exporter series (VL15_dropped: uctel only).
    let counters: Vec<String> = fs::read_dir(port.join("counters"))
        .expect("counters")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|f| f != "VL15_dropped")
        .collect();
    for f in &counters {
        let path = format!("counters/{f}");
        assert!(
            NODE_EXPORTER_1_5_0.iter().any(|(_, file, _)| *file == path),
            "{path} has no node_exporter 1.5.0 series in the table"
        );
    }
    assert!(find(&out, "node_infiniband_vl15_dropped_total", "mlx5_0", "1").is_some());
    // node_infiniband_info as node_exporter 1.5.0 gives it (device, board_id,
    // firmware_version, hca_type).
    let info = out
        .iter()
        .find(|m| m.name == "node_infiniband_info")
        .expect("info");
    let mut labels: Vec<(&str, &str)> = info
        .labels
        .iter()
        .map(|l| (l.name.as_str(), l.value.as_str()))
        .collect();
    labels.sort_unstable();
    assert_eq!(
        labels,
        [
            ("board_id", "MT_0000000359"),
            ("device", "mlx5_0"),
            ("firmware_version", "22.36.1010"),
            ("hca_type", "MT4125"),
        ]
    );
}
