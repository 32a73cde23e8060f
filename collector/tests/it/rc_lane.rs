//! The RC lane (DESIGN.md §8b): an in-process collector and a test agent with its logs
//! stream on an RC QP and its metrics stream on the UC QP, over the real soft RoCEv2
//! transport with the fault injector dropping datagrams both ways.

use crate::support;

use support::{
    collector_config, eventually, sample, AgentOptions, LogStream, MetricStream, TestAgent,
};
use uctel_protocol::control::{DataPath, StreamFinal};
use uctel_transport::soft::fault::FaultConfig;

const FRAMES: u64 = 1_000;

fn counter(text: &str, series: &str) -> f64 {
    sample(text, series).unwrap_or_else(|| panic!("{series} missing:\n{text}"))
}

/// Logs on RC lose nothing under 5 % loss; metrics on UC lose what the wire dropped, counted;
/// each lane keeps its own connection sequence, and the RC lane's counters show the repair.
async fn rc_lane_under_loss(data_path: DataPath, seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let running = uctel_collector::start(collector_config(dir.path()))
        .await
        .unwrap();
    let mut opts = AgentOptions::new("rc-agent");
    opts.capabilities = vec![data_path];
    opts.rc_streams = vec![2];
    opts.faults = Some(FaultConfig {
        drop_ratio: 0.05,
        seed,
        ..FaultConfig::default()
    });
    let mut agent = TestAgent::connect(running.control_addr(), opts)
        .await
        .unwrap();
    assert_eq!(agent.data_path(), data_path);
    let lane = agent.rc.as_ref().expect("RC lane").lane.clone();
    assert!(lane.slots >= 1 && (1..=lane.slots).contains(&lane.credit_window));
    assert_ne!(
        lane.rkey, agent.welcome.rkey,
        "the lane has a ring of its own"
    );
    let mut metrics = MetricStream::new(1);
    let mut logs = LogStream::new(2);
    for step in 0..FRAMES {
        agent.send(metrics.frame(step, 3)).await;
        agent.send_rc(logs.frame(step, 2)).await;
    }
    // Two lanes, two connection sequences: each numbered its own frames from 0.
    assert_eq!(agent.conn_frames_sent(), FRAMES);
    let rc = agent.rc.as_ref().expect("RC lane");
    assert_eq!(rc.conn_frames_sent(), FRAMES);
    let finals: Vec<StreamFinal> = vec![metrics.final_state(), logs.final_state()];
    agent.flush().await;
    let agent_rc = agent.rc.as_ref().expect("RC lane").qp.stats().rc;
    let injected = agent.soft.fault_stats().map_or(0, |s| s.snapshot().dropped);
    agent.goodbye(finals.clone()).await;
    let ledger = eventually("ledger after goodbye", || {
        let l = running.ledger("rc-agent");
        (l.len() == 2).then_some(l)
    })
    .await;
    let (metrics_id, m) = &ledger[0];
    let (logs_id, l) = &ledger[1];
    assert_eq!((*metrics_id, *logs_id), (1, 2));
    // Logs (RC): every frame and record exactly once.
    assert_eq!(
        (l.accepted, l.lost, l.late, l.duplicate),
        (FRAMES, 0, 0, 0),
        "{l:?}"
    );
    assert_eq!(l.records_received, finals[1].final_record_count, "{l:?}");
    assert_eq!(l.records_lost, 0);
    // Metrics (UC): the loss is counted, and adds up.
    assert_eq!(
        m.accepted + m.lost + m.dropped_after_tracking,
        FRAMES,
        "{m:?}"
    );
    assert!(m.lost > 0, "5 % drops of {FRAMES} frames lost none: {m:?}");
    assert!(
        injected > m.lost,
        "injected {injected}, metrics lost {}",
        m.lost
    );
    // The RC QP repaired what was dropped on its path.
    assert!(
        agent_rc.packets_retransmitted > 0,
        "no retransmission: {agent_rc:?}"
    );
    assert_eq!(agent_rc.retry_exceeded, 0);

    eprintln!(
        "{data_path:?}: injected drops {injected}; metrics (UC) lost {} of {FRAMES}; logs (RC) \
         accepted {} lost {}; agent RC QP {agent_rc:?}",
        m.lost, l.accepted, l.lost
    );
    let text = running.render_metrics().unwrap();
    let a = "agent=\"rc-agent\"";
    assert_eq!(
        counter(
            &text,
            &format!("uctel_collector_rc_gap_frames_total{{{a}}}")
        ),
        0.0
    );
    assert_eq!(
        counter(
            &text,
            &format!("uctel_collector_frames_lost_total{{{a},stream=\"logs\"}}")
        ),
        0.0
    );
    assert_eq!(
        counter(
            &text,
            &format!("uctel_collector_frames_lost_total{{{a},stream=\"metrics\"}}")
        ),
        m.lost as f64
    );
    assert_eq!(
        counter(
            &text,
            &format!("uctel_collector_connection_frames_lost_total{{{a}}}")
        ),
        m.lost as f64,
        "connection-level loss is the UC lane's only"
    );
    // The collector's RC QP answered the gaps it saw (sequence NAKs) or repeated ACKs for
    // duplicates; every event label is exported.
    let events: f64 = ["naks_sent", "duplicates"]
        .iter()
        .map(|e| {
            counter(
                &text,
                &format!("uctel_collector_rc_qp_events_total{{{a},event=\"{e}\"}}"),
            )
        })
        .sum();
    assert!(events > 0.0, "{text}");
    for e in uctel_transport::api::RcCounters::NAMES {
        counter(
            &text,
            &format!("uctel_collector_rc_qp_events_total{{{a},event=\"{e}\"}}"),
        );
    }
    running.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_on_rc_lose_nothing_at_five_percent_loss_write_with_imm() {
    rc_lane_under_loss(DataPath::WriteWithImm, 7).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_on_rc_lose_nothing_at_five_percent_loss_send() {
    rc_lane_under_loss(DataPath::Send, 11).await;
}

/// An agent without an RC lane gets no `rc_lane` in `Welcome`, and no RC series appear.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_rc_lane_unless_asked() {
    let dir = tempfile::tempdir().unwrap();
    let running = uctel_collector::start(collector_config(dir.path()))
        .await
        .unwrap();
    let agent = TestAgent::connect(running.control_addr(), AgentOptions::new("uc-only"))
        .await
        .unwrap();
    assert!(agent.welcome.rc_lane.is_none());
    let text = running.render_metrics().unwrap();
    assert!(
        !text.contains("rc_gap_frames_total{agent=\"uc-only\""),
        "{text}"
    );
    agent.goodbye(Vec::new()).await;
    running.stop().await.unwrap();
}

/// A misbehaving agent that sends a stream on the lane it did not name it for: each such
/// frame is dropped as `wrong_lane` before tracking, and the accounting still adds up (the
/// stream counts the frames it never saw as lost on its own lane).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_on_the_wrong_lane_are_dropped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let running = uctel_collector::start(collector_config(dir.path()))
        .await
        .unwrap();
    let mut opts = AgentOptions::new("stray");
    opts.capabilities = vec![DataPath::WriteWithImm];
    opts.rc_streams = vec![2];
    let mut agent = TestAgent::connect(running.control_addr(), opts)
        .await
        .unwrap();
    let mut metrics = MetricStream::new(1);
    let mut logs = LogStream::new(2);
    // Right lanes for steps 0..10, then a logs frame on UC and a metrics frame on RC.
    for step in 0..10 {
        agent.send(metrics.frame(step, 1)).await;
        agent.send_rc(logs.frame(step, 1)).await;
    }
    agent.send(logs.frame(10, 1)).await;
    agent.send_rc(metrics.frame(10, 1)).await;
    for step in 11..20 {
        agent.send(metrics.frame(step, 1)).await;
        agent.send_rc(logs.frame(step, 1)).await;
    }
    let finals = vec![metrics.final_state(), logs.final_state()];
    agent.goodbye(finals).await;
    let ledger = eventually("ledger after goodbye", || {
        let l = running.ledger("stray");
        (l.len() == 2).then_some(l)
    })
    .await;
    let text = running.render_metrics().unwrap();
    let wrong = counter(
        &text,
        "uctel_collector_frames_dropped_total{agent=\"stray\",reason=\"wrong_lane\"}",
    );
    assert_eq!(wrong, 2.0, "{text}");
    for (stream, l) in &ledger {
        // 20 frames per stream; the stray one never reached its stream's tracker.
        assert_eq!((l.accepted, l.lost), (19, 1), "stream {stream}: {l:?}");
    }
    // The RC lane's tracker saw its connection sequence whole (the stray frame is explained
    // by its drop): no RC gap.
    assert_eq!(
        counter(
            &text,
            "uctel_collector_rc_gap_frames_total{agent=\"stray\"}"
        ),
        0.0
    );
    running.stop().await.unwrap();
}
