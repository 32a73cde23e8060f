//! The `fast_counters` source end to end, through the real binaries on the soft transport:
//! ten real counters — eight sysfs statistics of `lo` and two `ethtool -S` statistics of a
//! veth pair made for the test — sampled every 10 ms for 60 s, with 2 % of the agent's
//! packets dropped by the soft transport's fault injector.
//!
//! * **Exact accounting, in samples.** Samples taken (the agent's
//!   `uctel_agent_fast_samples_total`, logged at stop) = samples the agent sent +
//!   samples it dropped with a reason; samples sent = the collector's `records_received` +
//!   `records_lost` on the `fast_counters` stream once the `Goodbye` is in. Both exactly,
//!   with loss > 0 (the injector drops frames).
//! * **What the collector serves**: the latest value under the name the normal collectors
//!   use (`node_network_receive_packets_total{device="lo"}`, the ethtool collector's names)
//!   and the rate over the last second (`…_per_second`).
//!
//! Needs root (the veth pair); CI runs as root.

use std::time::Duration;

use serde_yaml::{Mapping, Value};
use uctel_tests::net::Veth;
use uctel_tests::pipeline::{last_log_fields, Pipeline};
use uctel_tests::{exclusive, wait_for};

const SAMPLING: Duration = Duration::from_secs(60);
const LO_STATS: [&str; 8] = [
    "rx_bytes",
    "rx_packets",
    "tx_bytes",
    "tx_packets",
    "rx_dropped",
    "tx_dropped",
    "multicast",
    "rx_errors",
];

fn number(fields: &std::collections::BTreeMap<String, String>, key: &str) -> u64 {
    fields
        .get(key)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {fields:?}"))
}

#[test]
fn ten_counters_at_10_ms_for_60_s_are_accounted_for_sample_by_sample() {
    let _g = exclusive();
    let veth = Veth::new();
    let names = uctel_agent::sources::sys::ethtool::StatsReader::open(&veth.a)
        .unwrap_or_else(|e| panic!("ethtool statistics of {}: {e}", veth.a))
        .names()
        .to_vec();
    assert!(names.len() >= 2, "{}: {names:?}", veth.a);
    let mut counters: Vec<Value> = LO_STATS
        .iter()
        .map(|s| {
            let mut m = Mapping::new();
            m.insert(
                "path".into(),
                format!("/sys/class/net/lo/statistics/{s}").into(),
            );
            Value::Mapping(m)
        })
        .collect();
    for stat in &names[..2] {
        let mut e = Mapping::new();
        e.insert("device".into(), veth.a.clone().into());
        e.insert("stat".into(), stat.clone().into());
        let mut m = Mapping::new();
        m.insert("ethtool".into(), Value::Mapping(e));
        counters.push(Value::Mapping(m));
    }
    assert_eq!(counters.len(), 10);

    let mut p = Pipeline::start();
    let i = p.add_agent_with("fast", 0.02, 5.0, |y| {
        y.set("sources.fast_counters.interval_milliseconds", 10)
            .set("sources.fast_counters.samples_per_record", 20)
            .set("sources.fast_counters.counters", Value::Sequence(counters))
            // Full 4 KiB frames carry about 240 samples: some 250 frames a minute, too few
            // for 2 % loss to hit this stream every run. 1 KiB frames make it about 1,000.
            .set("max_frame_bytes", 1024);
    });
    p.wait_flowing(1, &["fast"], &["fast_counters"], Duration::from_secs(30));
    std::thread::sleep(SAMPLING);

    // What the collector serves while the agent runs.
    let s = p.scrape().expect("collector scrape");
    let lo = [("agent", "fast"), ("device", "lo")];
    assert!(
        s.select("node_network_receive_packets_total", &lo).count() == 1,
        "no latest value of lo's rx_packets"
    );
    let rate = s
        .select("node_network_receive_packets_per_second", &lo)
        .map(|x| x.value)
        .next()
        .expect("no 1 s rate of lo's rx_packets");
    assert!(rate.is_finite() && rate >= 0.0, "rate {rate}");
    let (ethtool_name, _) = uctel_agent::sources::node::ethtool::series_identity(&names[0]);
    assert_eq!(
        s.select(&ethtool_name, &[("agent", "fast"), ("device", &veth.a)])
            .count(),
        1,
        "no {ethtool_name}{{device={}}}",
        veth.a
    );
    let a = p.agents[i].scrape().expect("agent scrape");
    let late = a.sum("uctel_agent_fast_sample_lateness_seconds_count", &[]);
    let under_2ms = a.sum(
        "uctel_agent_fast_sample_lateness_seconds_bucket",
        &[("le", "0.002")],
    );
    println!(
        "lateness: {under_2ms} of {late} samples within 2 ms, {} missed rounds, lo rx_packets_per_second = {rate:.1}/s",
        a.count("uctel_agent_fast_missed_rounds_total", &[])
    );

    let frames = a.count(
        "uctel_agent_frames_sent_total",
        &[("stream", "fast_counters")],
    );
    p.agents[i].daemon.stop(Duration::from_secs(20));
    let log = p.agents[i].daemon.log();
    let taken = number(
        &last_log_fields(&log, "fast_counters: stopped").expect("no stop line"),
        "samples_taken",
    );
    let totals = last_log_fields(&log, "stopped: records sent and dropped").expect("no totals");
    let (sent, dropped) = (
        number(&totals, "fast_counters_records_sent"),
        number(&totals, "fast_counters_records_dropped"),
    );
    // 60 s at 10 ms: about 6000 rounds of 10 samples.
    assert!(taken > 40_000, "only {taken} samples taken");
    assert_eq!(taken, sent + dropped, "agent: taken = sent + dropped");

    let m = [("agent", "fast"), ("stream", "fast_counters")];
    let (received, lost) = wait_for(
        "the collector settles the fast_counters stream",
        Duration::from_secs(20),
        Duration::from_millis(200),
        || {
            let s = p.scrape()?;
            let r = s.count("uctel_collector_records_received_total", &m);
            let l = s.count("uctel_collector_records_lost_total", &m);
            if r + l == sent {
                Ok((r, l))
            } else {
                Err(format!("received {r} + lost {l} != sent {sent}"))
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", p.collector.log_tail(30)));
    println!(
        "samples: taken {taken} = sent {sent} + dropped at the agent {dropped}; sent = received {received} + lost {lost}; {frames} frames sent before the stop"
    );
    assert!(lost > 0, "2 % packet loss lost no sample");
    assert!(received > lost * 10, "received {received}, lost {lost}");
}
