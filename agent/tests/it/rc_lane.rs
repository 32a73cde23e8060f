//! The RC lane (DESIGN.md §8b) against the in-process collector (`support`): streams set to
//! `reliability: rc` travel on a second QP, of type RC, with a connection sequence, ring and
//! credit window of their own; a collector that offers no RC lane fails the session with a
//! clear error; a dead RC QP ends the session and the agent reconnects. Every wait is
//! bounded.

use crate::support;

use std::path::Path;
use std::time::Duration;

use support::capture::Capture;
use uctel_agent::config::AgentConfig;
use uctel_agent::stream::Stream;
use uctel_protocol::control::{GoodbyeReason, QpEndpoint};
use uctel_protocol::frame::{DecodedFrame, FrameFlags};
use uctel_testkit::wait::until;
use uctel_testkit::RunningAgent;
use uctel_transport::api::{RcCounters, WcOpcode};

fn config(control: std::net::SocketAddr, dir: &Path, extra: &str) -> AgentConfig {
    support::agent_config(
        control,
        dir,
        concat!(
            "  metrics:\n",
            "    flush_milliseconds: 20\n",
            "  logs:\n",
            "    flush_milliseconds: 20\n",
            "    reliability: rc\n",
        ),
        extra,
    )
}

fn valid_endpoint(qp: Option<&QpEndpoint>) -> &QpEndpoint {
    let qp = qp.unwrap_or_else(|| panic!("no QP endpoint"));
    assert!(qp.gid_array().is_some(), "{qp:?}");
    assert!(qp.qpn > 0, "{qp:?}");
    assert!(qp.udp_socket_addr().is_some(), "{qp:?}");
    qp
}

/// Connection sequences of `frames`, sorted.
fn conn_seqs<'a>(frames: impl Iterator<Item = &'a (WcOpcode, DecodedFrame)>) -> Vec<u64> {
    let mut seqs: Vec<u64> = frames.map(|(_, f)| f.header.conn_seq).collect();
    seqs.sort_unstable();
    seqs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rc_streams_travel_on_their_own_lane_with_their_own_sequence() {
    let mut fake = support::start(support::FakeConfig {
        heartbeat_interval_ms: 100,
        ..support::FakeConfig::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let log = dir.path().join("app.log");
    std::fs::write(&log, "").unwrap_or_else(|e| panic!("{e}"));
    let agent = RunningAgent::start(config(fake.addr, dir.path(), ""));
    let stats = agent.stats.clone();
    until("connected", Duration::from_secs(10), || stats.connected()).await;
    let lines: Vec<String> = (0..50).map(|i| format!("audit line {i}")).collect();
    std::fs::write(&log, lines.join("\n") + "\n").unwrap_or_else(|e| panic!("{e}"));
    until("records on both lanes", Duration::from_secs(10), || {
        stats.records_sent(Stream::Logs) >= 50 && stats.frames_sent(Stream::Metrics) >= 3
    })
    .await;
    // A few heartbeats after the lines went out.
    tokio::time::sleep(Duration::from_millis(400)).await;
    // Every RC event is exported, at zero on a lossless loopback.
    for event in RcCounters::NAMES {
        assert!(stats.rc_qp_events(event).is_some(), "{event}");
    }
    assert_eq!(stats.rc_qp_events("retry_exceeded"), Some(0));
    assert_eq!(stats.rc_lane_failures(), Some(0));
    let summary = agent.stop().await;
    assert_eq!(summary.sessions, 1);
    let s = tokio::time::timeout(Duration::from_secs(10), fake.sessions.recv())
        .await
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("no session"));
    assert!(s.violations.is_empty(), "{:?}", s.violations);

    // Hello: the RC lane with the logs stream (id 2) and a valid RC QP of its own.
    let hello = s.hello.clone().unwrap_or_else(|| panic!("no hello"));
    let lane = hello
        .rc_lane
        .clone()
        .unwrap_or_else(|| panic!("no rc_lane in Hello"));
    assert_eq!(lane.stream_ids, [Stream::Logs.id()]);
    let rc_qp = valid_endpoint(lane.qp.as_ref());
    let uc_qp = valid_endpoint(hello.qp.as_ref());
    // One soft device, one UDP port (a verbs peer answers RC requests on the requester's
    // port 4791 only), two QPs.
    assert_eq!(
        rc_qp.udp_addr, uc_qp.udp_addr,
        "both QPs on the device's socket"
    );
    assert_ne!(rc_qp.qpn, uc_qp.qpn);
    assert!(s.rc_offered);

    // Logs only on the RC lane, everything else only on the UC lane.
    assert!(!s.rc_frames.is_empty());
    assert!(
        s.rc_frames
            .iter()
            .all(|(op, f)| f.header.stream_id == Stream::Logs.id()
                && *op == WcOpcode::RecvRdmaWithImm)
    );
    assert!(s
        .frames
        .iter()
        .all(|(_, f)| f.header.stream_id != Stream::Logs.id()));
    // Two connection sequences, each 0..n without a hole, and the Goodbye names both ends.
    let g = s.goodbye.clone().unwrap_or_else(|| panic!("no goodbye"));
    assert_eq!(g.reason, GoodbyeReason::Shutdown as i32);
    let uc = conn_seqs(s.frames.iter());
    let rc = conn_seqs(s.rc_frames.iter());
    assert_eq!(uc, (0..uc.len() as u64).collect::<Vec<_>>());
    assert_eq!(rc, (0..rc.len() as u64).collect::<Vec<_>>());
    assert_eq!(g.final_conn_seq, Some(uc.len() as u64 - 1));
    assert_eq!(g.rc_final_conn_seq, Some(rc.len() as u64 - 1));
    let sent = |st: Stream| stats.frames_sent(st);
    assert_eq!(
        uc.len() as u64 + rc.len() as u64,
        Stream::ALL.iter().map(|st| sent(*st)).sum::<u64>()
    );
    // The last heartbeat named both lanes' sequences and the logs stream's progress (from
    // the RC lane's pipeline).
    let hb = s
        .last_heartbeat
        .clone()
        .unwrap_or_else(|| panic!("no heartbeat"));
    assert!(
        hb.rc_sent_conn_seq.is_some_and(|c| c < rc.len() as u64),
        "{hb:?}"
    );
    assert!(
        hb.sent_conn_seq.is_some_and(|c| c < uc.len() as u64),
        "{hb:?}"
    );
    let logs = hb
        .sent_streams
        .iter()
        .find(|f| f.stream_id == Stream::Logs.id())
        .unwrap_or_else(|| panic!("no logs stream in {hb:?}"));
    assert_eq!(logs.final_record_count, 50, "{hb:?}");
    // Each stream's final state comes from the lane that carries it.
    for st in [Stream::Metrics, Stream::Logs] {
        let fin = g
            .streams
            .iter()
            .find(|f| f.stream_id == st.id())
            .unwrap_or_else(|| panic!("no final for {st}"));
        let frames: Vec<&DecodedFrame> = s
            .frames
            .iter()
            .chain(s.rc_frames.iter())
            .map(|(_, f)| f)
            .filter(|f| f.header.stream_id == st.id())
            .collect();
        assert_eq!(
            fin.final_record_count,
            s.records(st.id()) + rc_records(&s, st),
            "{st}"
        );
        assert_eq!(fin.final_record_count, stats.records_sent(st), "{st}");
        assert_eq!(fin.final_stream_seq, Some(frames.len() as u64 - 1), "{st}");
        let last = frames
            .iter()
            .max_by_key(|f| f.header.stream_seq)
            .unwrap_or_else(|| panic!("no frames on {st}"));
        assert!(
            last.header.flags.contains(FrameFlags::LAST_OF_EPOCH),
            "{st}"
        );
    }
    // The log lines, in order, each once.
    let got = support::log_messages(s.rc_frames.iter().map(|(_, f)| f));
    assert_eq!(got, lines);
    assert_eq!(stats.records_dropped_all(Stream::Logs), 0);
    // The log checkpoint names the end of the file: settled by the RC lane's pipeline.
    let state: Vec<_> = std::fs::read_dir(dir.path().join("state"))
        .unwrap_or_else(|e| panic!("{e}"))
        .flatten()
        .collect();
    assert_eq!(state.len(), 1);
    let text = std::fs::read_to_string(state[0].path()).unwrap_or_else(|e| panic!("{e}"));
    let len = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    let v: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(v["files"][0]["offset"].as_u64(), Some(len), "{text}");
}

/// Records of `st` that arrived on the RC lane (`Session::records` counts the UC lane's).
fn rc_records(s: &support::Session, st: Stream) -> u64 {
    s.rc_frames
        .iter()
        .filter(|(_, f)| f.header.stream_id == st.id())
        .map(|(_, f)| f.payload.record_count() as u64)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_rc_streams_there_is_no_rc_lane() {
    let mut fake = support::start(support::FakeConfig::default()).await;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cfg = config(fake.addr, dir.path(), "").streams.clone();
    assert_eq!(cfg.rc_streams(), [Stream::Logs]);
    let text = format!(
        "agent_id: a\ncollector:\n  control: {}\nauth:\n  token: test-token\n",
        fake.addr
    );
    let agent = RunningAgent::start(
        AgentConfig::from_yaml("t.yaml", &text).unwrap_or_else(|e| panic!("{e}")),
    );
    let stats = agent.stats.clone();
    until("connected", Duration::from_secs(10), || stats.connected()).await;
    assert_eq!(
        stats.rc_qp_events("timeouts"),
        None,
        "no RC metrics without an RC lane"
    );
    assert!(!stats.encode_text().contains("uctel_agent_rc_"));
    agent.stop().await;
    let s = fake.session().await;
    let hello = s.hello.unwrap_or_else(|| panic!("no hello"));
    assert_eq!(hello.rc_lane, None);
    assert!(!s.rc_offered);
    assert!(s.rc_frames.is_empty());
    let g = s.goodbye.unwrap_or_else(|| panic!("no goodbye"));
    assert_eq!(g.rc_final_conn_seq, None);
}

#[tokio::test]
async fn a_collector_without_an_rc_lane_fails_the_session_with_a_clear_error() {
    let capture = Capture::default();
    let _guard = tracing::subscriber::set_default(capture.clone());
    let mut fake = support::start(support::FakeConfig {
        offer_rc_lane: false,
        ..support::FakeConfig::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let agent = RunningAgent::start(config(fake.addr, dir.path(), ""));
    let stats = agent.stats.clone();
    // Welcomed by a collector without the lane: refused by the agent, tried again.
    for _ in 0..2 {
        let s = tokio::time::timeout(Duration::from_secs(10), fake.sessions.recv())
            .await
            .ok()
            .flatten()
            .unwrap_or_else(|| panic!("no session"));
        let lane = s
            .hello
            .and_then(|h| h.rc_lane)
            .unwrap_or_else(|| panic!("no rc_lane in Hello"));
        assert_eq!(lane.stream_ids, [Stream::Logs.id()]);
        assert!(!s.rc_offered);
        assert!(s.frames.is_empty() && s.rc_frames.is_empty());
    }
    assert!(!stats.connected());
    let summary = agent.stop().await;
    assert_eq!(summary.sessions, 0);
    let warnings = capture.warnings();
    let want = "the collector offers no RC lane (streams.logs.reliability: rc needs a collector \
                that supports it)";
    assert!(
        warnings.iter().any(|w| w.contains(want)),
        "{want:?} not in {warnings:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_rc_qp_ends_the_session_and_the_agent_reconnects() {
    let mut fake = support::start(support::FakeConfig {
        kill_rc_lane_after_frames: Some(1),
        ..support::FakeConfig::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let log = dir.path().join("app.log");
    std::fs::write(&log, "").unwrap_or_else(|e| panic!("{e}"));
    // A short retransmit timer (4.096 µs × 2^8 ≈ 1 ms) and one retry: the RC QP gives up
    // quickly once the collector's side stops answering.
    let extra = "transport:\n  rc: { timeout: 8, retry_cnt: 1 }\n";
    let agent = RunningAgent::start(config(fake.addr, dir.path(), extra));
    let stats = agent.stats.clone();
    until("connected", Duration::from_secs(10), || stats.connected()).await;
    let lines: Vec<String> = (0..20).map(|i| format!("line {i}")).collect();
    std::fs::write(&log, lines.join("\n") + "\n").unwrap_or_else(|e| panic!("{e}"));
    until("the RC lane failed", Duration::from_secs(20), || {
        stats.rc_lane_failures().is_some_and(|n| n >= 1)
    })
    .await;
    until("reconnected", Duration::from_secs(20), || {
        stats.reconnects() >= 1 && stats.connected()
    })
    .await;
    assert!(
        stats.rc_qp_events("retry_exceeded").is_some_and(|n| n >= 1),
        "retry_exceeded {:?}",
        stats.rc_qp_events("retry_exceeded")
    );
    assert!(stats.rc_qp_events("timeouts").is_some_and(|n| n >= 1));
    let summary = agent.stop().await;
    assert!(summary.sessions >= 2, "{summary:?}");
    let first = fake.session().await;
    // The agent's Goodbye says why, naming the RC QP.
    let g = first.goodbye.unwrap_or_else(|| panic!("no goodbye"));
    assert_eq!(g.reason, GoodbyeReason::Reconnect as i32);
    assert!(g.detail.contains("RC QP"), "{}", g.detail);
    assert!(!first.rc_frames.is_empty());
}

/// An RC QP that fails in every session (the collector's side dies after one frame) while
/// the control connection stays up is a data-path outage: the reconnect backoff keeps
/// growing instead of starting over after each `Welcome`, so the QP is not rebuilt at the
/// shortest backoff for as long as the outage lasts. Each loss is logged with the failed
/// attempts in a row its wait is drawn for (`backoff_attempt`): 0, 1, 2, … here, where
/// starting over would log 0 every time.
#[tokio::test]
async fn a_data_path_outage_rebuilds_the_rc_qp_at_a_growing_interval() {
    let capture = Capture::default();
    let _guard = tracing::subscriber::set_default(capture.clone());
    let fake = support::start(support::FakeConfig {
        kill_rc_lane_after_frames: Some(1),
        ..support::FakeConfig::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let log = dir.path().join("app.log");
    std::fs::write(&log, "").unwrap_or_else(|e| panic!("{e}"));
    let extra = "transport:\n  rc: { timeout: 8, retry_cnt: 1 }\n";
    let mut c = config(fake.addr, dir.path(), extra);
    // Short first waits (the test's time), a ceiling far above them.
    c.collector.reconnect_initial_seconds = 0.02;
    c.collector.reconnect_max_seconds = 60.0;
    let agent = RunningAgent::start(c);
    let stats = agent.stats.clone();
    until("connected", Duration::from_secs(10), || stats.connected()).await;
    let began = std::time::Instant::now();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&log)
        .unwrap_or_else(|e| panic!("{e}"));
    let mut i = 0;
    let losses = || {
        capture
            .warnings()
            .into_iter()
            .filter(|w| w.contains("reconnecting with a new epoch"))
            .collect::<Vec<_>>()
    };
    while losses().len() < 4 && began.elapsed() < Duration::from_secs(30) {
        use std::io::Write as _;
        writeln!(f, "line {i}").unwrap_or_else(|e| panic!("{e}"));
        i += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    agent.stop().await;
    let losses = losses();
    assert!(losses.len() >= 4, "{losses:#?}");
    for w in &losses {
        assert!(w.contains("RC QP"), "not a data-path loss: {w}");
    }
    let attempts: Vec<&str> = losses
        .iter()
        .map(|w| {
            w.split(' ')
                .find_map(|f| f.strip_prefix("backoff_attempt="))
                .unwrap_or_else(|| panic!("no backoff_attempt in {w}"))
        })
        .collect();
    assert_eq!(attempts[..4], ["0", "1", "2", "3"], "{losses:#?}");
}
