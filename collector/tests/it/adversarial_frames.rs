//! Adversarial frames from an authenticated agent: every bad frame or sample is dropped and
//! counted under its reason, good frames around it are accepted, and the scrape stays a
//! valid exposition.

use crate::support;

use support::{
    collector_config, eventually, http_get, sample, AgentOptions, MetricStream, TestAgent,
};
use uctel_protocol::control::{DataPath, StreamFinal};
use uctel_protocol::frame::{build_frame, FrameHeader, FrameKind, HEADER_LEN};
use uctel_protocol::payload::{
    encode_log_batch, encode_metric_batch, Bucket, Label, LogBatch, LogRecord, Metric, MetricBatch,
    MetricType,
};

fn gauge(name: &str, value: f64, labels: &[(&str, &str)]) -> Metric {
    Metric {
        name: name.into(),
        help: "A test gauge.".into(),
        r#type: MetricType::Gauge as i32,
        labels: labels
            .iter()
            .map(|(n, v)| Label {
                name: (*n).into(),
                value: (*v).into(),
            })
            .collect(),
        value,
        ..Default::default()
    }
}

/// Frames for one stream of a test agent, stamped by hand so they can carry anything.
struct Forger {
    stream: u32,
    next_stream_seq: u64,
    records: u64,
}

impl Forger {
    fn new(stream: u32) -> Self {
        Self {
            stream,
            next_stream_seq: 0,
            records: 0,
        }
    }

    fn header(&mut self, agent: &TestAgent, kind: FrameKind, records: u64) -> FrameHeader {
        self.records += records;
        let h = FrameHeader {
            epoch: agent.epoch,
            conn_seq: agent.conn_frames_sent(),
            stream_seq: self.next_stream_seq,
            record_count: self.records,
            timestamp_ns: support::now_ns(),
            ..FrameHeader::new(kind, self.stream)
        };
        self.next_stream_seq += 1;
        h
    }

    /// Posts a frame with this payload (CRC valid) as the agent's next frame.
    fn post(&mut self, agent: &mut TestAgent, kind: FrameKind, records: u64, payload: &[u8]) {
        let h = self.header(agent, kind, records);
        let bytes = build_frame(&h, payload).unwrap();
        self.post_bytes(agent, &bytes);
    }

    fn post_metrics(&mut self, agent: &mut TestAgent, metrics: Vec<Metric>) {
        let n = metrics.len() as u64;
        self.post(
            agent,
            FrameKind::Metrics,
            n,
            &encode_metric_batch(&MetricBatch { metrics }),
        );
    }

    fn post_bytes(&mut self, agent: &mut TestAgent, bytes: &[u8]) {
        let c = agent.conn_frames_sent();
        agent.post_raw(c, bytes);
        agent.advance_conn_seq(1);
    }

    fn final_state(&self) -> StreamFinal {
        StreamFinal {
            stream_id: self.stream,
            final_stream_seq: self.next_stream_seq.checked_sub(1),
            final_record_count: self.records,
        }
    }
}

fn dropped(text: &str, agent: &str, family: &str, reason: &str) -> f64 {
    sample(
        text,
        &format!("uctel_collector_{family}_dropped_total{{agent=\"{agent}\",reason=\"{reason}\"}}"),
    )
    .unwrap_or(0.0)
}

/// `promtool check metrics` must pass with no lint at all (exit 0): these scrapes carry no
/// node_exporter names, so not even the accepted `camelCase` exception applies.
fn promtool_check(body: &str) {
    let lint = support::promtool(body);
    assert_eq!(
        lint.code,
        Some(0),
        "promtool check metrics failed:\n{}\n--- scrape ---\n{body}",
        lint.report
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_frames_on_the_send_path_are_dropped_by_reason() {
    let dir = tempfile::tempdir().unwrap();
    let running = uctel_collector::start(collector_config(dir.path()))
        .await
        .unwrap();
    let mut opts = AgentOptions::new("forger");
    opts.capabilities = vec![DataPath::Send];
    let mut agent = TestAgent::connect(running.control_addr(), opts)
        .await
        .unwrap();
    let mut s = Forger::new(1);
    s.post_metrics(&mut agent, vec![gauge("ok_gauge", 1.0, &[])]);
    // Wrong magic (CRC recomputed over the damaged header would not help: the magic is
    // checked first).
    let h = s.header(&agent, FrameKind::Metrics, 0);
    let mut f = build_frame(&h, &[]).unwrap();
    f[0] = b'X';
    s.post_bytes(&mut agent, &f);
    // CRC mismatch: one payload bit flipped after sealing.
    let h = s.header(&agent, FrameKind::Metrics, 1);
    let mut f = build_frame(
        &h,
        &encode_metric_batch(&MetricBatch {
            metrics: vec![gauge("ok_gauge", 2.0, &[])],
        }),
    )
    .unwrap();
    let last = f.len() - 1;
    f[last] ^= 0x10;
    s.post_bytes(&mut agent, &f);
    // Payload length lying: announces 500 bytes, carries 10.
    let h = FrameHeader {
        payload_len: 500,
        ..s.header(&agent, FrameKind::Metrics, 0)
    };
    let mut f = build_frame(&h, &[0u8; 10]).unwrap();
    f[12..16].copy_from_slice(&500u32.to_be_bytes());
    s.post_bytes(&mut agent, &f);
    // Shorter than a header.
    let h = s.header(&agent, FrameKind::Metrics, 0);
    let f = build_frame(&h, &[]).unwrap();
    s.post_bytes(&mut agent, &f[..HEADER_LEN - 1]);
    // Another epoch.
    let h = FrameHeader {
        epoch: agent.epoch ^ 1,
        ..s.header(&agent, FrameKind::Heartbeat, 0)
    };
    s.post_bytes(&mut agent, &build_frame(&h, &[]).unwrap());
    // A heartbeat frame with a payload.
    s.post(&mut agent, FrameKind::Heartbeat, 0, b"not empty");
    // Limits: 65 labels, a 300-byte name, a 2000-byte label value.
    let many: Vec<(String, String)> = (0..65).map(|i| (format!("l{i}"), "v".into())).collect();
    let many_refs: Vec<(&str, &str)> = many.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    s.post_metrics(&mut agent, vec![gauge("many_labels", 1.0, &many_refs)]);
    s.post_metrics(&mut agent, vec![gauge(&"n".repeat(300), 1.0, &[])]);
    let long_value = "v".repeat(2000);
    s.post_metrics(
        &mut agent,
        vec![gauge("long_value", 1.0, &[("k", &long_value)])],
    );
    // Grammar: metric name, label name, reserved label prefix, duplicate label, type.
    s.post_metrics(&mut agent, vec![gauge("1starts_with_digit", 1.0, &[])]);
    s.post_metrics(&mut agent, vec![gauge("has-dash", 1.0, &[])]);
    s.post_metrics(
        &mut agent,
        vec![gauge("ok_name", 1.0, &[("bad-label", "x")])],
    );
    s.post_metrics(
        &mut agent,
        vec![gauge("ok_name", 1.0, &[("__reserved", "x")])],
    );
    s.post_metrics(
        &mut agent,
        vec![gauge("ok_name", 1.0, &[("job", "a"), ("job", "b")])],
    );
    s.post_metrics(
        &mut agent,
        vec![Metric {
            r#type: 42,
            ..gauge("ok_name", 1.0, &[])
        }],
    );
    // Histograms: decreasing bounds, decreasing counts, count below the last bucket, NaN
    // bound.
    let hist = |buckets: &[(f64, u64)], count: u64| Metric {
        name: "bad_hist".into(),
        r#type: MetricType::Histogram as i32,
        buckets: buckets
            .iter()
            .map(|(ub, c)| Bucket {
                upper_bound: *ub,
                cumulative_count: *c,
            })
            .collect(),
        count,
        ..Default::default()
    };
    s.post_metrics(&mut agent, vec![hist(&[(1.0, 1), (0.5, 2)], 2)]);
    s.post_metrics(&mut agent, vec![hist(&[(0.5, 3), (1.0, 2)], 3)]);
    s.post_metrics(&mut agent, vec![hist(&[(0.5, 1), (1.0, 5)], 4)]);
    s.post_metrics(&mut agent, vec![hist(&[(f64::NAN, 1)], 1)]);
    // Not protobuf, and a string that is not UTF-8 (field 1 = metrics, field 1 = name).
    s.post(&mut agent, FrameKind::Metrics, 1, &[0xff, 0xff, 0xff]);
    s.post(
        &mut agent,
        FrameKind::Metrics,
        1,
        &[0x0a, 0x04, 0x0a, 0x02, 0xc3, 0x28],
    );
    // Logs: a bad severity.
    let mut logs = Forger::new(2);
    logs.post(
        &mut agent,
        FrameKind::Logs,
        1,
        &encode_log_batch(&LogBatch {
            records: vec![LogRecord {
                severity: 99,
                message: "x".into(),
                ..Default::default()
            }],
        }),
    );
    // A good frame at the end.
    s.post_metrics(&mut agent, vec![gauge("ok_gauge", 3.0, &[])]);
    agent.flush().await;
    // Stored while the agent is connected (its series leave the store at its Goodbye).
    let body = eventually("the good frame's sample in the store", || {
        let text = running.render_metrics().ok()?;
        text.contains("ok_gauge{agent=\"forger\",instance=\"forger.test\"} 3")
            .then_some(text)
    })
    .await;
    assert!(!body.contains("bad_hist"), "{body}");
    agent
        .goodbye(vec![s.final_state(), logs.final_state()])
        .await;
    let text = eventually("accounting settled", || {
        let text = running.render_metrics().ok()?;
        (running.ledger("forger").len() == 2).then_some(text)
    })
    .await;
    let d = |reason| dropped(&text, "forger", "frames", reason);
    assert_eq!(d("malformed_frame"), 3.0, "{text}"); // magic, lying length, short
    assert_eq!(d("crc_mismatch"), 1.0, "{text}");
    assert_eq!(d("epoch_mismatch"), 1.0, "{text}");
    assert_eq!(d("limit_exceeded"), 3.0, "{text}");
    // heartbeat payload, 6 grammar, 4 histogram, 2 protobuf, 1 severity
    assert_eq!(d("malformed_payload"), 14.0, "{text}");
    let ledger: std::collections::HashMap<u32, _> = running.ledger("forger").into_iter().collect();
    let l1 = ledger[&1];
    // Stream 1 sent 23 frames: 2 accepted; 5 dropped before tracking are lost; 16 dropped
    // after tracking.
    assert_eq!(l1.accepted, 2, "{l1:?}");
    assert_eq!(
        l1.accepted + l1.lost + l1.dropped_after_tracking,
        23,
        "{l1:?}"
    );
    assert_eq!(l1.lost, 5, "{l1:?}");
    let l2 = ledger[&2];
    assert_eq!((l2.accepted, l2.dropped_after_tracking), (0, 1), "{l2:?}");
    let (status, body) = http_get(running.metrics_addr(), "/metrics").await;
    assert_eq!(status, 200);
    assert!(!body.contains("bad_hist"), "{body}");
    running.stop().await.unwrap();
}

/// Frames larger than a ring slot cannot be read back whole: counted, never accepted, and the
/// agent's next frames are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_frames_in_the_ring_are_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let running = uctel_collector::start(collector_config(dir.path()))
        .await
        .unwrap();
    let mut opts = AgentOptions::new("big");
    opts.capabilities = vec![DataPath::WriteWithImm];
    let mut agent = TestAgent::connect(running.control_addr(), opts)
        .await
        .unwrap();
    let mut s = Forger::new(1);
    s.post_metrics(&mut agent, vec![gauge("ok_gauge", 1.0, &[])]);
    // 1000 labels: about 9 KB, more than the 4096-byte slot it is written to.
    let labels: Vec<(String, String)> = (0..1000).map(|i| (format!("l{i}"), "v".into())).collect();
    let refs: Vec<(&str, &str)> = labels
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    s.post_metrics(&mut agent, vec![gauge("huge", 1.0, &refs)]);
    // Skip the slot the oversized write spilled into, as an agent lapping itself would.
    s.post_metrics(&mut agent, vec![gauge("ok_gauge", 2.0, &[])]);
    s.post_metrics(&mut agent, vec![gauge("ok_gauge", 3.0, &[])]);
    agent.flush().await;
    agent.goodbye(vec![s.final_state()]).await;
    let text = eventually("settled", || {
        let text = running.render_metrics().ok()?;
        (!running.ledger("big").is_empty()).then_some(text)
    })
    .await;
    let l = running.ledger("big")[0].1;
    assert_eq!(l.accepted, 3, "{l:?}");
    assert_eq!(l.accepted + l.lost + l.dropped_after_tracking, 4, "{l:?}");
    let bad = dropped(&text, "big", "frames", "malformed_frame")
        + dropped(&text, "big", "frames", "torn_slot")
        + dropped(&text, "big", "frames", "limit_exceeded")
        + dropped(&text, "big", "frames", "message_too_long");
    assert_eq!(bad, 1.0, "{text}");
    assert!(!text.contains("huge{"), "{text}");
    running.stop().await.unwrap();
}

/// Samples that are valid alone but clash in the store: type conflicts across agents,
/// reserved names, histogram-derived names, duplicate series in one frame, NaN and
/// infinities. The scrape stays valid for promtool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_conflicts_and_special_values_keep_the_scrape_valid() {
    let dir = tempfile::tempdir().unwrap();
    let running = uctel_collector::start(collector_config(dir.path()))
        .await
        .unwrap();
    let addr = running.control_addr();
    let mut a = TestAgent::connect(addr, AgentOptions::new("alpha"))
        .await
        .unwrap();
    let mut b = TestAgent::connect(addr, AgentOptions::new("beta"))
        .await
        .unwrap();
    let mut sa = Forger::new(1);
    let mut sb = Forger::new(1);
    sa.post_metrics(
        &mut a,
        vec![
            gauge("shared_name", 1.0, &[]),
            gauge("special_nan", f64::NAN, &[]),
            gauge("special_inf", f64::INFINITY, &[("sign", "plus")]),
            gauge("special_inf", f64::NEG_INFINITY, &[("sign", "minus")]),
            // The same series twice in one frame: the later sample wins.
            gauge("dup_series", 1.0, &[("k", "v")]),
            gauge("dup_series", 2.0, &[("k", "v")]),
            // Labels the collector sets itself.
            gauge(
                "clashing_labels",
                1.0,
                &[
                    ("agent", "evil"),
                    ("instance", "evil"),
                    ("exported_agent", "x"),
                ],
            ),
            Metric {
                name: "lat_seconds".into(),
                r#type: MetricType::Histogram as i32,
                buckets: vec![
                    Bucket {
                        upper_bound: f64::NEG_INFINITY,
                        cumulative_count: 0,
                    },
                    Bucket {
                        upper_bound: 0.1,
                        cumulative_count: 1,
                    },
                    Bucket {
                        upper_bound: f64::INFINITY,
                        cumulative_count: 2,
                    },
                ],
                count: 2,
                sum: f64::NAN,
                labels: vec![Label {
                    name: "le".into(),
                    value: "user".into(),
                }],
                ..Default::default()
            },
        ],
    );
    a.flush().await;
    eventually("alpha stored", || {
        let text = running.render_metrics().ok()?;
        text.contains("shared_name{").then_some(())
    })
    .await;
    sb.post_metrics(
        &mut b,
        vec![
            Metric {
                r#type: MetricType::Counter as i32,
                ..gauge("shared_name", 5.0, &[])
            },
            gauge("uctel_collector_agents_connected", 99.0, &[]),
            gauge("lat_seconds_count", 1.0, &[]),
            gauge("lat_seconds_bucket", 1.0, &[]),
            gauge("beta_ok", 1.0, &[]),
        ],
    );
    b.flush().await;
    // The store shows a series before the worker counts that frame's drops: wait for both.
    let text = eventually("beta processed and its drops counted", || {
        let text = running.render_metrics().ok()?;
        (text.contains("beta_ok{")
            && dropped(&text, "beta", "records", "type_conflict") >= 1.0
            && dropped(&text, "beta", "records", "reserved_name") >= 3.0)
            .then_some(text)
    })
    .await;
    assert_eq!(
        dropped(&text, "beta", "records", "type_conflict"),
        1.0,
        "{text}"
    );
    assert_eq!(
        dropped(&text, "beta", "records", "reserved_name"),
        3.0,
        "{text}"
    );
    assert_eq!(sample(&text, "uctel_collector_agents_connected"), Some(2.0));
    assert!(
        text.contains("dup_series{agent=\"alpha\",instance=\"alpha.test\",k=\"v\"} 2"),
        "{text}"
    );
    assert_eq!(text.matches("dup_series{").count(), 1, "{text}");
    assert!(
        text.contains("special_nan{agent=\"alpha\",instance=\"alpha.test\"} NaN"),
        "{text}"
    );
    // The `prometheus` crate's encoder writes infinities as `inf`/`-inf` (Rust's spelling),
    // which Prometheus and promtool parse; the values survive either way.
    let inf = |sign: &str| {
        sample(
            &text,
            &format!("special_inf{{agent=\"alpha\",instance=\"alpha.test\",sign=\"{sign}\"}}"),
        )
    };
    assert_eq!(inf("plus"), Some(f64::INFINITY), "{text}");
    assert_eq!(inf("minus"), Some(f64::NEG_INFINITY), "{text}");
    let (status, body) = http_get(running.metrics_addr(), "/metrics").await;
    assert_eq!(status, 200);
    promtool_check(&body);
    a.goodbye(vec![sa.final_state()]).await;
    b.goodbye(vec![sb.final_state()]).await;
    running.stop().await.unwrap();
}

/// A good stream next to the attacks: its accounting is exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn good_stream_is_unaffected_by_a_bad_neighbour() {
    let dir = tempfile::tempdir().unwrap();
    let running = uctel_collector::start(collector_config(dir.path()))
        .await
        .unwrap();
    let mut agent = TestAgent::connect(running.control_addr(), AgentOptions::new("mixed"))
        .await
        .unwrap();
    let mut good = MetricStream::new(1);
    let mut bad = Forger::new(7);
    for step in 0..50 {
        agent.send(good.frame(step, 3)).await;
        bad.post(&mut agent, FrameKind::Metrics, 1, &[0x0a, 0xff]);
    }
    agent.flush().await;
    agent
        .goodbye(vec![good.final_state(), bad.final_state()])
        .await;
    let ledger: std::collections::HashMap<u32, _> = eventually("settled", || {
        let l = running.ledger("mixed");
        (l.len() == 2).then_some(l)
    })
    .await
    .into_iter()
    .collect();
    assert_eq!((ledger[&1].accepted, ledger[&1].lost), (50, 0));
    assert_eq!(ledger[&1].records_received, 150);
    assert_eq!(
        (ledger[&7].accepted, ledger[&7].dropped_after_tracking),
        (0, 50)
    );
    running.stop().await.unwrap();
}
