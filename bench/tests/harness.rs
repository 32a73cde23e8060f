//! The harness end to end against the real daemons (built by `uctel_tests::bins`): short
//! runs that must move data, account for every frame, and measure the agent.

use std::sync::Arc;
use std::time::Duration;

use uctel_bench::agentcost::{self, AgentCostConfig};
use uctel_bench::softpath::{self, SoftRunConfig};
use uctel_bench::workload::FrameTemplate;
use uctel_tests::bins::{self, AGENT, COLLECTOR};

/// Every agent sends its whole credit at the same instant into a collector whose UDP
/// receive buffer holds far fewer frames than the agents' windows add up to (40 agents ×
/// 56 frames against a 256 KiB buffer): the collector-wide credit budget keeps what may be in
/// flight within what the buffer holds, so the kernel drops nothing.
#[test]
fn synchronized_bursts_into_a_small_receive_buffer_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let agents = 40;
    let r = softpath::run(&SoftRunConfig {
        collector_bin: bins::path(COLLECTOR),
        workdir: dir.path().join("burst"),
        agents,
        frame: Arc::new(FrameTemplate::metrics(1024).unwrap()),
        slots: 64,
        credit_margin_slots: 8,
        descriptor_queue: 8192,
        report_interval_seconds: 0.05,
        warmup: Duration::from_millis(100),
        duration: Duration::from_secs(3),
        qps_per_device: 32,
        sq_depth: 64,
        post_batch: 8,
        expected_fps: None,
        bursts: Some(4),
        recv_buffer_bytes: Some(128 << 10),
        min_slots: None,
        progress: None,
        credit_writes: false,
        credit_write_batching: true,
        pace: None,
    })
    .unwrap();
    assert!(r.control_errors.is_empty(), "{:?}", r.control_errors);
    eprintln!(
        "budget {} frames, {} bursts, sent {}, received {}, lost {}, kernel socket drops {:?}, \
         connect {:.1} s",
        r.credit_budget_frames,
        r.bursts,
        r.accounting.sent,
        r.accounting.received,
        r.accounting.lost,
        r.socket_drops,
        r.connect_seconds
    );
    let windows = agents as f64 * 56.0;
    assert!(
        r.credit_budget_frames > 0.0 && r.credit_budget_frames < windows / 4.0,
        "the budget binds: {} frames against windows of {windows}",
        r.credit_budget_frames
    );
    assert!(r.bursts >= 2, "bursts sent: {}", r.bursts);
    assert!(r.accounting.sent > 0, "{:?}", r.accounting);
    assert_eq!(r.socket_drops, Some(0), "{r:?}");
    assert_eq!(r.accounting.lost, 0.0, "{:?}", r.accounting);
    assert_eq!(r.accounting.unaccounted, 0.0, "{:?}", r.accounting);
    assert!(r.accounting.drained, "{:?}", r.accounting);
}

#[test]
fn soft_path_moves_frames_and_accounts_for_every_one() {
    let dir = tempfile::tempdir().unwrap();
    let agents = 40; // two generator devices: QPNs repeat across them
    let r = softpath::run(&SoftRunConfig {
        collector_bin: bins::path(COLLECTOR),
        workdir: dir.path().join("soft"),
        agents,
        frame: Arc::new(FrameTemplate::metrics(1024).unwrap()),
        slots: 64,
        credit_margin_slots: 8,
        descriptor_queue: 8192,
        report_interval_seconds: 0.01,
        warmup: Duration::from_millis(200),
        duration: Duration::from_millis(500),
        qps_per_device: 32,
        sq_depth: 16,
        post_batch: 8,
        expected_fps: None,
        bursts: None,
        recv_buffer_bytes: None,
        min_slots: None,
        progress: None,
        credit_writes: false,
        credit_write_batching: true,
        pace: None,
    })
    .unwrap();
    assert_eq!(r.agents, agents);
    assert!(r.frames > 0.0, "{r:?}");
    assert!(r.samples > 0.0, "{r:?}");
    assert!(r.collector_cpu.cpu_seconds > 0.0);
    assert!(r.rss_loaded_bytes > r.rss_baseline_bytes);
    assert!(r.control_errors.is_empty(), "{:?}", r.control_errors);
    // Every agent got frames through, and every frame sent is received, lost or dropped.
    let f = r.fairness.expect("per-agent rates");
    assert_eq!(f.n, agents);
    assert!(f.min > 0.0, "an agent starved: {f:?}");
    assert_eq!(r.accounting.unaccounted, 0.0, "{:?}", r.accounting);
    assert!(r.accounting.sent > 0);
}

/// The series-dictionary form through the real collector: every emulated agent negotiates
/// the dictionary at `Hello`, sends its definitions until the collector's `DictAck` covers
/// them, then values-only `kind = metrics_dict` frames of the same frame size; the collector
/// accepts them (many more samples per frame), and every frame and every record is received
/// or lost, exactly.
#[test]
fn soft_path_with_the_series_dictionary_accounts_for_every_frame_and_record() {
    let dir = tempfile::tempdir().unwrap();
    let agents = 4;
    let plain = FrameTemplate::metrics(1024).unwrap();
    let dict = Arc::new(FrameTemplate::metrics_dict(1024).unwrap());
    assert!(dict.prelude_frames() > 1, "definitions take several frames");
    let r = softpath::run(&SoftRunConfig {
        collector_bin: bins::path(COLLECTOR),
        workdir: dir.path().join("soft-dict"),
        agents,
        frame: dict.clone(),
        slots: 64,
        credit_margin_slots: 8,
        descriptor_queue: 8192,
        report_interval_seconds: 0.01,
        warmup: Duration::from_millis(500),
        duration: Duration::from_millis(500),
        qps_per_device: 32,
        sq_depth: 16,
        post_batch: 8,
        expected_fps: None,
        bursts: None,
        recv_buffer_bytes: None,
        min_slots: None,
        progress: None,
        credit_writes: false,
        credit_write_batching: true,
        pace: None,
    })
    .unwrap();
    assert!(r.control_errors.is_empty(), "{:?}", r.control_errors);
    assert_eq!(r.dict_acknowledged, agents, "{r:?}");
    assert_eq!(r.records_per_frame, dict.records());
    assert!(r.records_per_frame > 5 * plain.records(), "{r:?}");
    // No frame carries more than a full frame's records; prelude frames carry fewer. This is
    // checked on the totals after the drain, not on the measuring window: a scrape reads
    // `frames_received_total` and `records_received_total` one family after the other while
    // the worker runs, so at 7,400 frames/s a gather slowed by a loaded machine sees a few
    // dozen frames in one family and not yet in the other (a CI run saw 19).
    assert!(r.frames > 0.0, "{r:?}");
    assert_eq!(r.frames_dropped, 0.0, "{r:?}");
    assert!(
        r.accounting.records_received <= r.accounting.received * f64::from(dict.records()),
        "{r:?}"
    );
    let a = &r.accounting;
    assert!(a.dropped.is_empty(), "{a:?}");
    assert_eq!(a.unaccounted, 0.0, "{a:?}");
    assert_eq!(a.records_unaccounted, 0.0, "{a:?}");
    assert!(a.records_sent > 0 && a.records_received > 0.0, "{a:?}");
}

#[test]
fn agent_cost_measures_the_real_agent() {
    let dir = tempfile::tempdir().unwrap();
    let r = agentcost::run(&AgentCostConfig {
        agent_bin: bins::path(AGENT),
        collector_bin: bins::path(COLLECTOR),
        workdir: dir.path().join("agent"),
        samples_per_sec: 4000.0,
        log_lines_per_sec: 50.0,
        interval_seconds: 0.5,
        warmup: Duration::from_millis(200),
        duration: Duration::from_secs(1),
    })
    .unwrap();
    assert!((1990..2020).contains(&r.samples_per_collection), "{r:?}");
    assert!(r.samples_per_sec > 0.0, "{r:?}");
    assert!(r.log_lines_per_sec > 0.0, "{r:?}");
    assert!(r.rss_bytes > 0);
    assert!(r.cpu.wall_seconds > 0.0, "{r:?}");
}

#[test]
fn idle_daemons_are_measured_in_both_phases_and_sleep() {
    let dir = tempfile::tempdir().unwrap();
    let r = uctel_bench::idle::run(&uctel_bench::idle::IdleConfig {
        collector_bin: bins::path(COLLECTOR),
        agent_bin: bins::path(AGENT),
        node_exporter_bin: None,
        workdir: dir.path().join("idle"),
        warmup: Duration::from_millis(500),
        duration: Duration::from_secs(3),
    })
    .unwrap();
    assert_eq!(r.loadavg.len(), 2);
    for (phase, what) in [
        ("disconnected", "collector"),
        ("disconnected", "agent"),
        ("connected", "collector"),
        ("connected", "agent"),
    ] {
        let p = r
            .find(phase, what)
            .unwrap_or_else(|| panic!("no {what} in {phase}: {r:?}"));
        // 3 s of 10 ms ticks: 0.33 % per tick. Idle means asleep; a loop waking every 50 µs
        // (the collector before) costs 12 %.
        assert!(
            p.cpu_percent < 2.0,
            "{what} ({phase}) used {:.2} % of a core: {:?}",
            p.cpu_percent,
            p.cpu.by_thread
        );
    }
}

#[test]
fn remote_write_row_delivers_through_the_collector_and_vmagent_into_victoria_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let r = uctel_bench::remotewrite::run(&uctel_bench::remotewrite::RemoteWriteRunConfig {
        collector_bin: bins::path(COLLECTOR),
        victoria_bin: "/usr/bin/victoria-metrics".into(),
        vmagent_bin: "/usr/bin/vmagent".into(),
        workdir: dir.path().join("rw"),
        agents: 2,
        frame: Arc::new(FrameTemplate::metrics(1024).unwrap()),
        gap: Duration::from_millis(5),
        slots: 64,
        baseline: false,
        warmup: Duration::from_secs(2),
        duration: Duration::from_secs(2),
        dict_frame: Some(Arc::new(FrameTemplate::metrics_dict(1024).unwrap())),
    })
    .unwrap();
    // VictoriaMetrics counts what it inserted; both relays got samples through.
    assert!(r.uctel.samples > 0.0, "{r:?}");
    assert!(r.uctel.cpu.cpu_seconds > 0.0, "{r:?}");
    let v = r
        .vmagent
        .as_ref()
        .unwrap_or_else(|| panic!("vmagent: {:?}", r.vmagent_error));
    assert!(v.samples > 0.0, "{r:?}");
    assert_eq!(r.accounting.unaccounted, 0.0, "{:?}", r.accounting);
    assert_eq!(r.accounting.pending, 0.0, "{:?}", r.accounting);
    assert!(r.accounting.sent > 0.0 && r.accounting.sent == r.accounting.samples_in);
    // Every sample posted reached the output; the rest of `samples_in` are the stale
    // markers of the series that ended at the Goodbyes.
    assert_eq!(
        r.accounting.offered as f64 + r.accounting.stale_markers,
        r.accounting.samples_in,
        "{:?}",
        r.accounting
    );
    // The series-dictionary pair: the same samples per second, every sample delivered.
    let d = r.dict.as_ref().expect("the dictionary pair ran");
    assert!(
        (d.offered_per_sec / r.offered_per_sec - 1.0).abs() < 0.01,
        "{d:?}"
    );
    assert!(d.uctel.samples > 0.0, "{d:?}");
    assert!(d.vmagent.as_ref().is_some_and(|v| v.samples > 0.0), "{d:?}");
    let a = &d.accounting;
    assert_eq!(a.unaccounted, 0.0, "{a:?}");
    assert_eq!(a.pending, 0.0, "{a:?}");
    assert!(a.dropped.values().all(|v| *v == 0.0), "{a:?}");
    assert_eq!(a.offered as f64 + a.stale_markers, a.samples_in, "{a:?}");
    assert_eq!(a.stale_markers, d.series as f64, "{a:?}");
    assert_eq!(a.sent, a.samples_in, "{a:?}");
}

/// The OTLP row runs both sides with the same load: each delivers samples, measures the
/// collector's CPU, and accounts for every sample (nothing dropped, nothing pending).
#[test]
fn otlp_row_measures_otlp_and_remote_write_in_the_same_run() {
    let dir = tempfile::tempdir().unwrap();
    let r = uctel_bench::otlpcost::run(&uctel_bench::otlpcost::OtlpCostConfig {
        collector_bin: bins::path(COLLECTOR),
        workdir: dir.path().join("otlp"),
        agents: 2,
        frame: Arc::new(FrameTemplate::metrics(1024).unwrap()),
        gap: Duration::from_millis(5),
        slots: 64,
        warmup: Duration::from_secs(2),
        duration: Duration::from_secs(2),
    })
    .unwrap();
    for (name, side) in [("otlp", &r.otlp), ("remote-write", &r.remote_write)] {
        assert!(side.samples > 0.0, "{name}: {r:?}");
        assert!(side.cpu.cpu_seconds > 0.0, "{name}: {r:?}");
        assert_eq!(side.unaccounted, 0.0, "{name}: {r:?}");
        assert_eq!(side.dropped, 0.0, "{name}: {r:?}");
    }
    assert!(r.ratio() > 0.0, "{r:?}");
    assert_eq!(r.rows().len(), 1);
}

#[test]
fn node_cost_measures_the_agent_beside_node_exporter_over_the_same_collections() {
    let dir = tempfile::tempdir().unwrap();
    let r = uctel_bench::nodecost::run(&uctel_bench::nodecost::NodeCostConfig {
        agent_bin: bins::path(AGENT),
        collector_bin: bins::path(COLLECTOR),
        node_exporter_bin: None,
        workdir: dir.path().join("node-cost"),
        interval: Duration::from_millis(500),
        warmup: Duration::from_millis(500),
        duration: Duration::from_secs(2),
        gzip: true,
    })
    .unwrap();
    for s in [&r.agent, &r.node_defaults, &r.node_same_collectors] {
        assert_eq!(s.collections, 4, "{r:?}");
        // Every collection brought series: none missed, none doubled.
        assert!(s.series_min_max.0 > 100.0, "{r:?}");
        assert!(s.series_min_max.1 < 1.5 * s.series_min_max.0, "{r:?}");
        assert!(s.us_per_collection() > 0.0, "{r:?}");
        assert!(!s.slowest_collectors.is_empty(), "{r:?}");
    }
    // The collector holds what one collection brings.
    assert!(
        (r.agent_series_stored as f64 - r.agent.series_per_collection).abs() < 20.0,
        "{r:?}"
    );
    assert!(r.node_defaults.bytes_per_collection > 0.0);
    assert!(
        r.encoding.contains("Content-Encoding: gzip"),
        "{}",
        r.encoding
    );
    assert!(r.ratio_per_collection(true).is_finite(), "{r:?}");
}

/// The aligned-sampling row, short: three real agents (10 ms fast counters, 1 s host
/// metrics), started 137 ms apart, for 5 s. Asserted: the measurement is complete and the
/// agents share the instants of the epoch grid (loose bounds, not speed: an agent ticking
/// from its own start would be 137 ms from the others); the figures of the 10-minute run are
/// in BENCHMARKS.md.
#[test]
fn align_row_measures_three_agents_on_one_grid() {
    let dir = tempfile::tempdir().unwrap();
    let r = uctel_bench::align::run(&uctel_bench::align::AlignConfig {
        agent_bin: bins::path(AGENT),
        workdir: dir.path().join("align"),
        agents: 3,
        fast_interval: Duration::from_millis(10),
        host_interval: Duration::from_secs(1),
        duration: Duration::from_secs(5),
    })
    .unwrap();
    eprintln!("{r:?}");
    assert!(r.fast_samples >= 3 * 200, "{r:?}");
    assert!(r.host_samples >= 3 * 3, "{r:?}");
    // On the grid: the median collection within 50 ms of its instant, the median spread
    // of one fast instant across the agents within 5 ms.
    let q50 = uctel_bench::align::AlignResult::q(&r.host_error_ms, 0.5);
    assert!(q50 < 50.0, "{r:?}");
    let spread = uctel_bench::align::AlignResult::q(&r.spread_us, 0.5);
    assert!(spread < 5_000.0, "{r:?}");
}
