//! Acceptance tests: an in-process collector on ephemeral loopback ports and a test agent
//! driving the real soft RoCEv2 UC transport over UDP (fault injection on where stated).

use crate::support;

use std::collections::HashMap;

use support::{
    collector_config, eventually, http_get, promtool, sample, AgentOptions, LogStream,
    MetricStream, TestAgent, TOKEN,
};
use uctel_collector::config::AgentAuth;
use uctel_common::control::HandshakeError;
use uctel_protocol::control::{DataPath, RefuseReason, StreamFinal};
use uctel_protocol::frame::{build_frame, FrameHeader, FrameKind};
use uctel_transport::soft::fault::FaultConfig;

const FRAMES_PER_STREAM: u64 = 1500;

fn faults(drop_ratio: f64, seed: u64) -> Option<FaultConfig> {
    (drop_ratio > 0.0).then(|| FaultConfig {
        drop_ratio,
        seed,
        ..FaultConfig::default()
    })
}

/// Runs one agent with a metrics stream and a logs stream through the collector and checks
/// `sent == accepted + lost + dropped` per stream after `Goodbye`, and the same for records.
async fn accounting(drop_ratio: f64, data_path: DataPath, seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let running = uctel_collector::start(collector_config(dir.path()))
        .await
        .unwrap();
    let mut opts = AgentOptions::new("acct");
    opts.capabilities = vec![data_path];
    opts.faults = faults(drop_ratio, seed);
    let mut agent = TestAgent::connect(running.control_addr(), opts)
        .await
        .unwrap();
    assert_eq!(agent.data_path(), data_path);
    let mut metrics = MetricStream::new(1);
    let mut logs = LogStream::new(2);
    for step in 0..FRAMES_PER_STREAM {
        agent.send(metrics.frame(step, 3)).await;
        agent.send(logs.frame(step, 2)).await;
    }
    let finals: Vec<StreamFinal> = vec![metrics.final_state(), logs.final_state()];
    let injected = agent.soft.fault_stats().map_or(0, |s| s.snapshot().dropped);
    // Records arrived in the series store while the agent is connected.
    let stored =
        "uctel_test_value{agent=\"acct\",instance=\"acct.test\",series=\"0\",stream=\"1\"}";
    eventually("the agent's samples in the store", || {
        running
            .render_metrics()
            .ok()?
            .contains(stored)
            .then_some(())
    })
    .await;
    agent.goodbye(finals.clone()).await;
    let ledger = eventually("ledger after goodbye", || {
        let l = running.ledger("acct");
        (l.len() == 2).then_some(l)
    })
    .await;
    let text = running.render_metrics().unwrap();
    let mut total_lost = 0;
    for (fin, (stream, l)) in finals.iter().zip(&ledger) {
        assert_eq!(fin.stream_id, *stream);
        let sent = fin.final_stream_seq.unwrap() + 1;
        assert_eq!(sent, FRAMES_PER_STREAM);
        assert_eq!(
            sent,
            l.accepted + l.lost + l.dropped_after_tracking,
            "stream {stream} at {drop_ratio}: {l:?}"
        );
        assert_eq!(
            fin.final_record_count,
            l.records_received + l.records_lost,
            "records of stream {stream}: {l:?}"
        );
        let received = sample(
            &text,
            &format!(
                "uctel_collector_frames_received_total{{agent=\"acct\",stream=\"{}\"}}",
                uctel_protocol::stream::label(*stream)
            ),
        );
        assert_eq!(received, Some(l.accepted as f64), "{text}");
        total_lost += l.lost;
    }
    if drop_ratio == 0.0 {
        assert_eq!(total_lost, 0, "{ledger:?}");
    } else {
        assert!(total_lost > 0, "{ledger:?}");
        // Every injected drop is a lost frame (and nothing else was lost on loopback).
        assert_eq!(total_lost, injected, "{ledger:?}");
    }
    // After its Goodbye the agent's series leave the store, and agent_up is 0.
    eventually("the agent's series gone after its Goodbye", || {
        let text = running.render_metrics().ok()?;
        (!text.contains(stored)
            && sample(&text, "uctel_collector_agent_up{agent=\"acct\"}") == Some(0.0))
        .then_some(())
    })
    .await;
    // Records arrived in the log file.
    let log_lines = std::fs::read_to_string(dir.path().join("logs.jsonl")).unwrap();
    let records_logged = ledger[1].1.records_received;
    assert_eq!(log_lines.lines().count() as u64, records_logged);
    running.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accounting_adds_up_without_loss() {
    accounting(0.0, DataPath::WriteWithImm, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accounting_adds_up_at_one_percent_loss() {
    accounting(0.01, DataPath::WriteWithImm, 0x5eed_0001).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accounting_adds_up_at_twenty_percent_loss() {
    accounting(0.20, DataPath::WriteWithImm, 0x5eed_0020).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_data_path_accounting_at_twenty_percent_loss() {
    accounting(0.20, DataPath::Send, 0x5eed_0021).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ring_overrun_while_worker_paused_is_counted_never_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = collector_config(dir.path());
    config.ring.slots = 16;
    config.ring.credit_margin_slots = 4;
    let running = uctel_collector::start(config).await.unwrap();
    let mut opts = AgentOptions::new("lapper");
    opts.capabilities = vec![DataPath::WriteWithImm];
    opts.ignore_credits = true;
    let mut agent = TestAgent::connect(running.control_addr(), opts)
        .await
        .unwrap();
    running.pause_worker(true);
    let mut metrics = MetricStream::new(1);
    for step in 0..40u64 {
        agent.send(metrics.frame(step, 1)).await;
        if step % 8 == 7 {
            agent.flush().await;
            // The RQ holds one WR per slot (16): wait until the worker has polled this chunk
            // (it re-posts the consumed WRs in the same round) before sending the next one.
            let queued = (step + 1) as f64;
            eventually("completions queued for the paused worker", || {
                let text = running.render_metrics().ok()?;
                (sample(&text, "uctel_collector_ring_slots_in_use{agent=\"lapper\"}")
                    == Some(queued))
                .then_some(())
            })
            .await;
        }
    }
    running.pause_worker(false);
    // The stored sample is the last frame's, never a lapped slot's content (checked while
    // the agent is connected: its series leave the store at its Goodbye).
    eventually("the last frame's sample in the store", || {
        running
            .render_metrics()
            .ok()?
            .contains(
                "uctel_test_value{agent=\"lapper\",instance=\"lapper.test\",series=\"0\",stream=\"1\"} 39",
            )
            .then_some(())
    })
    .await;
    let fin = metrics.final_state();
    agent.goodbye(vec![fin.clone()]).await;
    let ledger = eventually("ledger", || {
        let l = running.ledger("lapper");
        (!l.is_empty()).then_some(l)
    })
    .await;
    let l = ledger[0].1;
    // Slot k holds the last frame written to it: frames 24..40 are intact, 0..24 were lapped.
    assert_eq!(l.accepted, 16, "{l:?}");
    assert_eq!(l.lost, 24, "{l:?}");
    let text = running.render_metrics().unwrap();
    assert_eq!(
        sample(
            &text,
            "uctel_collector_frames_dropped_total{agent=\"lapper\",reason=\"ring_overrun\"}"
        ),
        Some(24.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "uctel_collector_frames_dropped_total{agent=\"lapper\",reason=\"torn_slot\"}"
        ),
        Some(0.0)
    );
    running.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_unknown_and_wrong_version_agents_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = collector_config(dir.path());
    config.auth.shared = None;
    config.auth.agents = vec![AgentAuth {
        id: "known".into(),
        token: Some(TOKEN.into()),
        ..AgentAuth::default()
    }];
    let running = uctel_collector::start(config).await.unwrap();
    let refused = |r: Result<TestAgent, HandshakeError>| match r {
        Err(HandshakeError::Refused { reason, .. }) => reason,
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("accepted"),
    };
    let mut bad = AgentOptions::new("known");
    bad.token = "not-the-token".into();
    assert_eq!(
        refused(TestAgent::connect(running.control_addr(), bad).await),
        RefuseReason::BadProof
    );
    let stranger = AgentOptions::new("stranger");
    assert_eq!(
        refused(TestAgent::connect(running.control_addr(), stranger).await),
        RefuseReason::UnknownAgent
    );
    let mut old = AgentOptions::new("known");
    old.protocol_version = 99;
    assert_eq!(
        refused(TestAgent::connect(running.control_addr(), old).await),
        RefuseReason::VersionMismatch
    );
    // The daemon keeps serving: the right agent gets in.
    let good = TestAgent::connect(running.control_addr(), AgentOptions::new("known"))
        .await
        .unwrap();
    let text = running.render_metrics().unwrap();
    for (reason, n) in [
        ("bad_proof", 1.0),
        ("unknown_agent", 1.0),
        ("version_mismatch", 1.0),
    ] {
        assert_eq!(
            sample(
                &text,
                &format!("uctel_collector_handshakes_refused_total{{reason=\"{reason}\"}}")
            ),
            Some(n),
            "{text}"
        );
    }
    assert_eq!(sample(&text, "uctel_collector_agents_connected"), Some(1.0));
    good.goodbye(Vec::new()).await;
    running.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_datagrams_and_malformed_frames_are_counted_and_service_continues() {
    let dir = tempfile::tempdir().unwrap();
    let running = uctel_collector::start(collector_config(dir.path()))
        .await
        .unwrap();
    // Garbage at the RoCEv2 UDP port.
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let target = running.transport_addr().unwrap();
    for i in 0..20u8 {
        udp.send_to(&[i; 37], target).unwrap();
    }
    let mut opts = AgentOptions::new("bad");
    opts.capabilities = vec![DataPath::Send];
    let mut agent = TestAgent::connect(running.control_addr(), opts)
        .await
        .unwrap();
    let mut metrics = MetricStream::new(1);
    agent.send(metrics.frame(0, 1)).await;
    // conn_seq 1: not a frame at all.
    agent.post_raw(1, b"definitely not a uctel frame, just bytes");
    agent.advance_conn_seq(1);
    // conn_seq 2: a frame whose payload was corrupted after the CRC was computed.
    let mut corrupt = metrics.frame(1, 1).into_stamped(agent.epoch, 2);
    let last = corrupt.len() - 1;
    corrupt[last] ^= 0x01;
    agent.post_raw(2, &corrupt);
    agent.advance_conn_seq(1);
    // conn_seq 3: header and CRC fine, payload not protobuf (stream 9).
    let header = FrameHeader {
        epoch: agent.epoch,
        conn_seq: 3,
        stream_seq: 0,
        record_count: 1,
        ..FrameHeader::new(FrameKind::Metrics, 9)
    };
    let bad_payload = build_frame(&header, &[0xff, 0xff, 0xff, 0xff]).unwrap();
    agent.post_raw(3, &bad_payload);
    agent.advance_conn_seq(1);
    for step in 2..10 {
        agent.send(metrics.frame(step, 1)).await;
    }
    // The worker counts frames as it takes them: wait for the first count, not a race.
    let addr = running.metrics_addr();
    let body = uctel_testkit::wait::until_async(
        "frames counted on /metrics",
        support::DEADLINE,
        || async {
            let (status, body) = http_get(addr, "/metrics").await;
            (status == 200 && body.contains("uctel_collector_frames_received_total"))
                .then_some(body)
        },
    )
    .await;
    assert!(body.contains("uctel_collector_frames_received_total"));
    let fin = vec![
        metrics.final_state(),
        StreamFinal {
            stream_id: 9,
            final_stream_seq: Some(0),
            final_record_count: 1,
        },
    ];
    agent.goodbye(fin).await;
    let ledger: HashMap<u32, _> = eventually("ledger", || {
        let l = running.ledger("bad");
        (l.len() == 2).then_some(l)
    })
    .await
    .into_iter()
    .collect();
    let text = eventually("transport drop counters folded", || {
        let text = running.render_metrics().ok()?;
        let n = sample(
            &text,
            "uctel_collector_transport_packets_dropped_total{reason=\"malformed\"}",
        )?;
        (n >= 20.0).then_some(text)
    })
    .await;
    let dropped = |reason: &str| {
        sample(
            &text,
            &format!("uctel_collector_frames_dropped_total{{agent=\"bad\",reason=\"{reason}\"}}"),
        )
    };
    assert_eq!(dropped("malformed_frame"), Some(1.0), "{text}");
    assert_eq!(dropped("crc_mismatch"), Some(1.0), "{text}");
    assert_eq!(dropped("malformed_payload"), Some(1.0), "{text}");
    // Stream 1: frames 0 and 2..=9 accepted, its stream_seq 1 was the corrupted one (lost).
    let s1 = ledger[&1];
    assert_eq!((s1.accepted, s1.lost), (9, 1), "{s1:?}");
    let s9 = ledger[&9];
    assert_eq!((s9.accepted, s9.dropped_after_tracking), (0, 1), "{s9:?}");
    let (status, _) = http_get(running.metrics_addr(), "/").await;
    assert_eq!(status, 200);
    running.stop().await.unwrap();
}

/// A scrape taken while an agent is connected passes `promtool check metrics`, with one
/// accepted exception: node_exporter's own camelCase names (`node_memory_MemAvailable_bytes`,
/// DESIGN.md §7), which promtool flags as lint (exit 3) for node_exporter too. Any other lint
/// line or a parse error fails. promtool (Debian package `prometheus`) is required: the test
/// fails if it is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrape_passes_promtool_check_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let running = uctel_collector::start(collector_config(dir.path()))
        .await
        .unwrap();
    let mut opts = AgentOptions::new("prom");
    opts.faults = faults(0.05, 0x5eed_0005);
    let mut agent = TestAgent::connect(running.control_addr(), opts)
        .await
        .unwrap();
    let mut metrics = MetricStream::new(1);
    let mut logs = LogStream::new(2);
    for step in 0..200 {
        agent.send(metrics.frame(step, 5)).await;
        agent.send(logs.frame(step, 1)).await;
    }
    // node_exporter names, camelCase included, until one got through the 5 % loss.
    let node = uctel_protocol::payload::Metric {
        name: "node_memory_MemAvailable_bytes".into(),
        help: "Memory information field MemAvailable_bytes.".into(),
        r#type: uctel_protocol::payload::MetricType::Gauge as i32,
        value: 1.5e9,
        ..Default::default()
    };
    for _ in 0..50 {
        let _ = metrics.framer.push(&node, support::now_ns());
        let frame = metrics.framer.flush().expect("a frame");
        agent.send(frame).await;
        agent.flush().await;
        let text = running.render_metrics().unwrap();
        if text.contains("node_memory_MemAvailable_bytes{") {
            break;
        }
    }
    agent.wait_report().await;
    agent.wait_report().await;
    let (status, body) = http_get(running.metrics_addr(), "/metrics").await;
    assert_eq!(status, 200);
    assert!(body.contains("uctel_test_value{"), "{body}");
    assert!(body.contains("uctel_collector_loss_ratio{"), "{body}");
    assert!(body.contains("node_memory_MemAvailable_bytes{"), "{body}");
    let lint = promtool(&body);
    // promtool's exit status alone cannot tell: the camelCase lint makes it 3.
    assert_eq!(lint.code, Some(3), "{lint:?}");
    if let Err(e) = lint.check() {
        panic!("{e}\n--- scrape ---\n{body}");
    }
    // A real problem is still one.
    let broken = format!("{body}# TYPE uctel_test_bad counter\nuctel_test_bad 1\n");
    let lint = promtool(&broken);
    assert!(
        lint.check().is_err_and(|e| e.contains("uctel_test_bad")),
        "{lint:?}"
    );
    agent
        .goodbye(vec![metrics.final_state(), logs.final_state()])
        .await;
    running.stop().await.unwrap();
}

/// A Send longer than the posted receive buffer moves the collector's QP to ERROR (rxe class A,
/// `message_too_long`): counted as a QP error and a drop, the connection is torn down with a
/// `Goodbye`, and the agent's reconnect (new epoch) is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qp_error_is_counted_and_the_connection_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let running = uctel_collector::start(collector_config(dir.path()))
        .await
        .unwrap();
    let mut opts = AgentOptions::new("qperr");
    opts.capabilities = vec![DataPath::Send];
    let mut agent = TestAgent::connect(running.control_addr(), opts.clone())
        .await
        .unwrap();
    let mut metrics = MetricStream::new(1);
    agent.send(metrics.frame(0, 1)).await;
    // 5000 bytes into 4096-byte receive buffers.
    agent.post_raw(1, &[0x55; 5000]);
    agent.advance_conn_seq(1);
    agent.flush().await;
    let goodbye = agent.wait_closed().await.expect("collector says goodbye");
    assert!(goodbye.detail.contains("ERROR"), "{goodbye:?}");
    let text = eventually("agent disconnected", || {
        let text = running.render_metrics().ok()?;
        (sample(&text, "uctel_collector_agents_connected") == Some(0.0)).then_some(text)
    })
    .await;
    assert_eq!(
        sample(&text, "uctel_collector_qp_errors_total{agent=\"qperr\"}"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "uctel_collector_frames_dropped_total{agent=\"qperr\",reason=\"message_too_long\"}"
        ),
        Some(1.0),
        "{text}"
    );
    // The agent comes back with a new epoch and is served.
    let mut again = TestAgent::connect(running.control_addr(), opts)
        .await
        .unwrap();
    let mut metrics = MetricStream::new(1);
    for step in 0..5 {
        again.send(metrics.frame(step, 1)).await;
    }
    again.goodbye(vec![metrics.final_state()]).await;
    let l = eventually("second connection settled", || {
        let l = running.ledger("qperr");
        l.first().filter(|(_, l)| l.accepted >= 6).map(|(_, l)| *l)
    })
    .await;
    assert_eq!(l.accepted, 6, "{l:?}");
    running.stop().await.unwrap();
}

/// Stopping the collector with an agent connected sends it `Goodbye` (reason shutdown) and
/// returns once every task ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_says_goodbye_to_connected_agents() {
    let dir = tempfile::tempdir().unwrap();
    let running = uctel_collector::start(collector_config(dir.path()))
        .await
        .unwrap();
    let mut agent = TestAgent::connect(running.control_addr(), AgentOptions::new("stay"))
        .await
        .unwrap();
    let mut metrics = MetricStream::new(1);
    agent.send(metrics.frame(0, 1)).await;
    let stop = tokio::spawn(running.stop());
    let goodbye = agent.wait_closed().await.expect("a Goodbye");
    assert_eq!(
        goodbye.reason,
        uctel_protocol::control::GoodbyeReason::Shutdown as i32
    );
    tokio::time::timeout(std::time::Duration::from_secs(30), stop)
        .await
        .expect("stop returns")
        .unwrap()
        .unwrap();
}
