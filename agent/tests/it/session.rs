//! The agent's connection life against an in-process collector (`support`): handshake and
//! proof, both data paths, credits, reconnect with a new epoch, goodbye with exact final
//! sequences, log checkpoints, fault injection. Every wait is bounded.

use crate::support;

use std::path::Path;
use std::time::Duration;

use uctel_agent::config::AgentConfig;
use uctel_agent::run::Options;
use uctel_agent::selfmetrics::{DropReason, FaultAction, SelfMetrics};
use uctel_agent::stream::Stream;
use uctel_protocol::control::GoodbyeReason;
use uctel_protocol::frame::{FrameFlags, Payload};
use uctel_testkit::wait::until;
use uctel_testkit::RunningAgent;
use uctel_transport::api::WcOpcode;

fn config(control: std::net::SocketAddr, dir: &Path, extra: &str) -> AgentConfig {
    support::agent_config(
        control,
        dir,
        concat!(
            "  metrics:\n",
            "    data_path: write_with_imm\n",
            "    flush_milliseconds: 20\n",
            "  logs:\n",
            "    data_path: send\n",
            "    flush_milliseconds: 20\n",
        ),
        extra,
    )
}

/// Rounds of the host metrics source begun so far (its lateness histogram's count).
fn host_rounds(stats: &SelfMetrics) -> u64 {
    let text = stats.encode_text();
    text.lines()
        .find(|l| {
            l.starts_with("uctel_agent_round_lateness_seconds_count")
                && l.contains("source=\"host_metrics\"")
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn sent_frames(stats: &SelfMetrics) -> u64 {
    Stream::ALL.iter().map(|s| stats.frames_sent(*s)).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_delivers_both_streams_and_goodbye_accounts_exactly() {
    let mut fake = support::start(support::FakeConfig::default()).await;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let log = dir.path().join("app.log");
    std::fs::write(&log, "").unwrap_or_else(|e| panic!("{e}"));
    let cfg = config(fake.addr, dir.path(), "");
    let agent = RunningAgent::start(cfg);
    let stats = agent.stats.clone();
    until("connected", Duration::from_secs(10), || stats.connected()).await;
    let connected_at = std::time::Instant::now();
    let lines: Vec<String> = (0..50)
        .map(|i| format!("line {i} of the test log"))
        .collect();
    std::fs::write(&log, lines.join("\n") + "\n").unwrap_or_else(|e| panic!("{e}"));
    until("records on both streams", Duration::from_secs(10), || {
        stats.records_sent(Stream::Logs) >= 50 && stats.frames_sent(Stream::Metrics) >= 3
    })
    .await;
    // The host source's first round may end long after the self-metrics' on a loaded
    // machine: once its second round has begun, the first one's records are collected,
    // and the metrics queue is FIFO, so everything collected by then is sent first.
    until("a host metrics round", Duration::from_secs(30), || {
        host_rounds(&stats) >= 2
    })
    .await;
    let collected = stats.metrics_records_collected();
    until(
        "the host round's records sent",
        Duration::from_secs(10),
        || stats.records_sent(Stream::Metrics) >= collected,
    )
    .await;
    let summary = agent.stop().await;
    let session_seconds = connected_at.elapsed().as_secs();
    assert_eq!(summary.sessions, 1);
    let s = tokio::time::timeout(Duration::from_secs(10), fake.sessions.recv())
        .await
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("no session"));

    assert!(s.violations.is_empty(), "{:?}", s.violations);
    let g = s.goodbye.clone().unwrap_or_else(|| panic!("no goodbye"));
    assert_eq!(g.reason, GoodbyeReason::Shutdown as i32);
    // Exact accounting: every frame the agent counted as sent arrived (loopback, no faults),
    // connection sequences are 0..n without a hole, and the goodbye names the last one.
    let mut seqs: Vec<u64> = s.frames.iter().map(|(_, f)| f.header.conn_seq).collect();
    seqs.sort_unstable();
    let n = seqs.len() as u64;
    assert_eq!(seqs, (0..n).collect::<Vec<_>>());
    assert_eq!(n, sent_frames(&stats));
    assert_eq!(g.final_conn_seq, Some(n - 1));
    for st in Stream::ALL {
        let fin = g
            .streams
            .iter()
            .find(|f| f.stream_id == st.id())
            .unwrap_or_else(|| panic!("no final for {st}"));
        assert_eq!(fin.final_record_count, s.records(st.id()), "{st}");
        assert_eq!(fin.final_record_count, stats.records_sent(st), "{st}");
        let frames: Vec<_> = s
            .frames
            .iter()
            .filter(|(_, f)| f.header.stream_id == st.id())
            .collect();
        if st == Stream::FastCounters {
            // No fast counters configured: the stream carries nothing, not even heartbeats.
            assert!(frames.is_empty(), "{st}: {} frames", frames.len());
            assert_eq!(fin.final_stream_seq, None, "{st}");
            continue;
        }
        assert_eq!(fin.final_stream_seq, Some(frames.len() as u64 - 1), "{st}");
        let last = frames
            .iter()
            .max_by_key(|(_, f)| f.header.stream_seq)
            .unwrap_or_else(|| panic!("no frames on {st}"));
        assert!(
            last.1.header.flags.contains(FrameFlags::LAST_OF_EPOCH),
            "{st}"
        );
        // The collector chose write_with_imm: the logs stream, configured `send`, follows it.
        assert!(
            frames
                .iter()
                .all(|(op, _)| *op == WcOpcode::RecvRdmaWithImm),
            "{st} did not follow the collector's data path"
        );
    }
    // Host metrics named like node_exporter and the agent's own counters arrived.
    let names: std::collections::HashSet<String> = s
        .frames
        .iter()
        .filter_map(|(_, f)| match &f.payload {
            Payload::Metrics(b) => {
                Some(b.metrics.iter().map(|m| m.name.clone()).collect::<Vec<_>>())
            }
            _ => None,
        })
        .flatten()
        .collect();
    for want in [
        "node_cpu_seconds_total",
        "node_memory_MemAvailable_bytes",
        "node_load1",
        "uctel_agent_frames_sent_total",
        "uctel_agent_records_dropped_total",
    ] {
        assert!(names.contains(want), "{want} missing");
    }
    // Log lines in order, each once.
    let got = s.log_messages();
    assert_eq!(got, lines);
    assert_eq!(stats.records_dropped_all(Stream::Logs), 0);
    // One heartbeat per second of the collector's period, never a burst.
    assert!(
        s.heartbeats <= session_seconds + 2,
        "{} heartbeats in {session_seconds} s",
        s.heartbeats
    );
    // The log checkpoint names the end of the file.
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_then_welcomed_with_a_new_epoch() {
    let mut fake = support::start(support::FakeConfig {
        refuse_first: 1,
        ..support::FakeConfig::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cfg = config(fake.addr, dir.path(), "");
    let agent = RunningAgent::start(cfg);
    let stats = agent.stats.clone();
    until("connected", Duration::from_secs(10), || stats.connected()).await;
    let summary = agent.stop().await;
    assert_eq!(summary.sessions, 1);
    let first = fake
        .sessions
        .recv()
        .await
        .unwrap_or_else(|| panic!("no first session"));
    let second = fake
        .sessions
        .recv()
        .await
        .unwrap_or_else(|| panic!("no second session"));
    assert!(first.refused);
    assert!(!second.refused);
    let e1 = first.hello.map(|h| h.epoch);
    let e2 = second.hello.map(|h| h.epoch);
    assert!(e1.is_some() && e2.is_some() && e1 != e2, "{e1:?} {e2:?}");
    assert!(second.goodbye.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collector_goodbye_leads_to_a_reconnect_with_a_new_epoch() {
    let mut fake = support::start(support::FakeConfig {
        goodbye_after_frames: Some(3),
        ..support::FakeConfig::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cfg = config(fake.addr, dir.path(), "");
    let agent = RunningAgent::start(cfg);
    let stats = agent.stats.clone();
    until("a reconnect", Duration::from_secs(15), || {
        stats.reconnects() >= 1 && stats.connected()
    })
    .await;
    until(
        "frames on the new connection",
        Duration::from_secs(10),
        || sent_frames(&stats) >= 6,
    )
    .await;
    let summary = agent.stop().await;
    assert_eq!(summary.sessions, 2);
    let first = fake
        .sessions
        .recv()
        .await
        .unwrap_or_else(|| panic!("no first session"));
    let second = fake
        .sessions
        .recv()
        .await
        .unwrap_or_else(|| panic!("no second session"));
    assert!(first.we_said_goodbye);
    let (e1, e2) = (
        first.hello.map(|h| h.epoch).unwrap_or(0),
        second.hello.map(|h| h.epoch).unwrap_or(0),
    );
    assert_ne!(e1, e2);
    assert!(second.violations.is_empty(), "{:?}", second.violations);
    // The new epoch starts its sequences over.
    let min = second.frames.iter().map(|(_, f)| f.header.conn_seq).min();
    assert_eq!(min, Some(0));
    assert!(second.frames.iter().all(|(_, f)| f.header.epoch == e2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_reports_the_window_caps_frames_and_the_rest_is_dropped_no_credit() {
    let mut fake = support::start(support::FakeConfig {
        silent: true,
        credit_window: 4,
        ..support::FakeConfig::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut cfg = config(fake.addr, dir.path(), "");
    // Metrics wait for credit by default; this is the stream that drops instead.
    cfg.streams.metrics.on_no_credit = Some(uctel_agent::config::OnNoCredit::Drop);
    let agent = RunningAgent::start(cfg);
    let stats = agent.stats.clone();
    until("no_credit drops", Duration::from_secs(10), || {
        stats.frames_dropped(Stream::Metrics, DropReason::NoCredit) >= 3
    })
    .await;
    assert_eq!(
        sent_frames(&stats),
        4,
        "never more than the window outstanding"
    );
    let summary = agent.stop().await;
    assert_eq!(summary.sessions, 1);
    let s = fake.session().await;
    assert_eq!(s.frames.len(), 4);
    assert_eq!(s.goodbye.and_then(|g| g.final_conn_seq), Some(3));
}

/// A host collection larger than the credit window, at the defaults: its tail waits for the
/// next grant instead of being dropped (`streams.metrics.on_no_credit` defaults to `wait`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_a_collection_larger_than_the_window_waits_for_credit_and_nothing_drops() {
    let mut fake = support::start(support::FakeConfig {
        credit_window: 4,
        report_interval: Duration::from_millis(200),
        mtu_bytes: 1024,
        ..support::FakeConfig::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cfg = config(fake.addr, dir.path(), "");
    assert_eq!(
        cfg.streams.on_no_credit(Stream::Metrics),
        uctel_agent::config::OnNoCredit::Wait
    );
    let agent = RunningAgent::start(cfg);
    let stats = agent.stats.clone();
    // Three windows' worth: the collection went out over several grants.
    until(
        "a collection larger than the window sent",
        Duration::from_secs(20),
        || stats.frames_sent(Stream::Metrics) >= 12,
    )
    .await;
    // Before the stop (which counts what still waits as `shutdown`): nothing dropped.
    let dropped: Vec<(DropReason, u64)> = DropReason::ALL
        .iter()
        .map(|r| (*r, stats.records_dropped(Stream::Metrics, *r)))
        .filter(|(_, n)| *n > 0)
        .collect();
    assert!(dropped.is_empty(), "metric records dropped: {dropped:?}");
    let summary = agent.stop().await;
    assert_eq!(summary.sessions, 1);
    let s = fake.session().await;
    assert!(s.violations.is_empty(), "{:?}", s.violations);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_loss_shows_as_gaps_and_sent_equals_received_plus_lost() {
    let mut fake = support::start(support::FakeConfig::default()).await;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cfg = config(
        fake.addr,
        dir.path(),
        "transport:\n  soft:\n    fault:\n      drop_ratio: 0.3\n      seed: 42\n",
    );
    let agent = RunningAgent::start(cfg);
    let stats = agent.stats.clone();
    until("frames", Duration::from_secs(15), || {
        sent_frames(&stats) >= 30
    })
    .await;
    let summary = agent.stop().await;
    assert_eq!(summary.sessions, 1);
    let s = fake.session().await;
    assert!(s.violations.is_empty(), "{:?}", s.violations);
    let g = s
        .goodbye
        .unwrap_or_else(|| panic!("no goodbye (the control channel is TCP)"));
    let last = g
        .final_conn_seq
        .unwrap_or_else(|| panic!("no final sequence"));
    let received = s.frames.len() as u64;
    let sent = last + 1;
    assert_eq!(sent, sent_frames(&stats));
    let lost = sent - received;
    assert!(lost > 0, "30 % drop lost nothing");
    assert!(received > 0);
    // The injector's own counters, exported by the agent, explain the loss exactly: one
    // packet per frame, every frame either passed or dropped.
    let fault = |a| {
        stats
            .fault_packets(a)
            .unwrap_or_else(|| panic!("no fault counters with fault injection on"))
    };
    assert_eq!(fault(FaultAction::Dropped), lost);
    assert_eq!(fault(FaultAction::Passed), received);
    assert_eq!(fault(FaultAction::Duplicated), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_counters_add_up_over_reconnects() {
    let mut fake = support::start(support::FakeConfig {
        goodbye_after_frames: Some(10),
        ..support::FakeConfig::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cfg = config(
        fake.addr,
        dir.path(),
        "transport:\n  soft:\n    fault:\n      drop_ratio: 0.3\n      seed: 7\n",
    );
    let agent = RunningAgent::start(cfg);
    let stats = agent.stats.clone();
    until("a reconnect", Duration::from_secs(15), || {
        stats.reconnects() >= 1 && stats.connected()
    })
    .await;
    let first_session = stats.fault_packets(FaultAction::Dropped).unwrap_or(0)
        + stats.fault_packets(FaultAction::Passed).unwrap_or(0);
    until(
        "frames on the new connection",
        Duration::from_secs(15),
        || sent_frames(&stats) >= first_session + 20,
    )
    .await;
    let summary = agent.stop().await;
    assert_eq!(summary.sessions, 2);
    let _first = fake.sessions.recv().await;
    let second = fake
        .sessions
        .recv()
        .await
        .unwrap_or_else(|| panic!("no second session"));
    let second_sent = second
        .goodbye
        .and_then(|g| g.final_conn_seq)
        .map_or(0, |l| l + 1);
    // Every frame of both sessions went through one of the two injectors: the totals cover
    // both (a per-session counter would have restarted at the reconnect).
    let dropped = stats.fault_packets(FaultAction::Dropped).unwrap_or(0);
    let passed = stats.fault_packets(FaultAction::Passed).unwrap_or(0);
    assert!(first_session > 0);
    assert_eq!(passed + dropped, sent_frames(&stats));
    assert!(
        passed + dropped > second_sent,
        "{passed} + {dropped} vs {second_sent}"
    );
    assert!(dropped > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_data_path_when_the_collector_chooses_it() {
    let mut fake = support::start(support::FakeConfig {
        data_path: uctel_protocol::control::DataPath::Send,
        ..support::FakeConfig::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cfg = config(fake.addr, dir.path(), "");
    let agent = RunningAgent::start(cfg);
    let stats = agent.stats.clone();
    until("frames", Duration::from_secs(10), || {
        sent_frames(&stats) >= 5
    })
    .await;
    let summary = agent.stop().await;
    assert_eq!(summary.sessions, 1);
    let s = fake.session().await;
    assert!(s.violations.is_empty(), "{:?}", s.violations);
    assert!(s.frames.iter().all(|(op, _)| *op == WcOpcode::Recv));
    let n = s.frames.len() as u64;
    assert_eq!(n, sent_frames(&stats));
    assert_eq!(s.goodbye.and_then(|g| g.final_conn_seq), Some(n - 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_metrics_endpoint_serves_self_metrics() {
    let fake = support::start(support::FakeConfig::default()).await;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cfg = config(fake.addr, dir.path(), "");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let agent = RunningAgent::start_with(
        cfg,
        Options {
            stats: None,
            metrics_listener: Some(listener),
            ..Options::default()
        },
    );
    let stats = agent.stats.clone();
    until("connected", Duration::from_secs(10), || stats.connected()).await;
    let body = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("{e}"));
        c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap_or_else(|e| panic!("{e}"));
        let mut out = String::new();
        let _ = c.read_to_string(&mut out);
        out
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let summary = agent.stop().await;
    assert_eq!(summary.sessions, 1);
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    assert!(body.contains("uctel_agent_connected 1"), "{body}");
    assert!(
        body.contains("uctel_agent_frames_dropped_total{reason=\"no_credit\",stream=\"logs\"}"),
        "{body}"
    );
    assert!(
        body.contains("uctel_agent_log_events_total{reason=\"rotation_create\"}"),
        "{body}"
    );
    // No fault injection configured: no fault counters.
    assert!(!body.contains("uctel_agent_fault_packets_total"), "{body}");
    assert_eq!(stats.fault_packets(FaultAction::Dropped), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_neither_repeats_nor_loses_log_lines() {
    let mut fake = support::start(support::FakeConfig::default()).await;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let log = dir.path().join("app.log");
    let first: Vec<String> = (0..40).map(|i| format!("before restart {i}")).collect();
    std::fs::write(&log, first.join("\n") + "\n").unwrap_or_else(|e| panic!("{e}"));
    let mut delivered: Vec<String> = Vec::new();
    for round in 0..2 {
        if round == 1 {
            // Written while the agent is down.
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(&log)
                .unwrap_or_else(|e| panic!("{e}"));
            let more: Vec<String> = (0..25).map(|i| format!("while down {i}")).collect();
            std::io::Write::write_all(&mut f, (more.join("\n") + "\n").as_bytes())
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let cfg = config(fake.addr, dir.path(), "");
        let agent = RunningAgent::start(cfg);
        let stats = agent.stats.clone();
        let want = if round == 0 { 40 } else { 25 };
        until("log lines sent", Duration::from_secs(10), || {
            stats.records_sent(Stream::Logs) >= want
        })
        .await;
        let summary = agent.stop().await;
        assert_eq!(summary.sessions, 1);
        let s = fake.session().await;
        delivered.extend(s.log_messages());
    }
    let mut expected = (0..40)
        .map(|i| format!("before restart {i}"))
        .collect::<Vec<_>>();
    expected.extend((0..25).map(|i| format!("while down {i}")));
    assert_eq!(delivered, expected);
}

/// Milliseconds since the Unix epoch.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// With no collector listening, the metric samples are held (none dropped); when one comes,
/// the first session sends them before the newer ones, each with its collection time: per
/// series the timestamps rise, those of the samples collected while no collector was there
/// lie before it came, one per collection (not one burst stamped at the reconnect).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_collector_samples_are_held_and_sent_first_with_their_collection_time() {
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        l.local_addr().unwrap_or_else(|e| panic!("{e}"))
    };
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let agent = RunningAgent::start(config(closed, dir.path(), ""));
    let stats = agent.stats.clone();
    // Host metrics every 200 ms: about ten collections while nothing listens.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!stats.connected());
    assert_eq!(
        stats.records_dropped_all(Stream::Metrics),
        0,
        "held, not dropped"
    );
    let came = now_ms();
    let mut fake = support::start_on(closed, support::FakeConfig::default()).await;
    until("samples sent", Duration::from_secs(10), || {
        stats.records_sent(Stream::Metrics) > 0 && stats.metrics_records_collected() > 0
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let summary = agent.stop_within(Duration::from_secs(10)).await;
    assert_eq!(summary.sessions, 1);
    assert_eq!(
        stats.records_dropped(Stream::Metrics, DropReason::NotConnected),
        0
    );
    let s = fake.session().await;
    let mut frames: Vec<_> = s.frames.iter().map(|(_, f)| f).collect();
    frames.sort_by_key(|f| f.header.conn_seq);
    let load1: Vec<i64> = frames
        .iter()
        .filter_map(|f| match &f.payload {
            Payload::Metrics(b) => Some(b.metrics.iter().filter(|m| m.name == "node_load1").map(
                |m| match m.timestamp_ms {
                    0 => i64::try_from(f.header.timestamp_ns / 1_000_000).unwrap_or(0),
                    t => t,
                },
            )),
            _ => None,
        })
        .flatten()
        .collect();
    assert!(
        load1.windows(2).all(|w| w[0] < w[1]),
        "node_load1 timestamps rise in sending order: {load1:?}"
    );
    let before: Vec<i64> = load1.iter().copied().filter(|t| *t < came).collect();
    assert!(
        before.len() >= 5,
        "collections held while no collector listened: {before:?} (it came at {came})"
    );
    let spread = before.last().zip(before.first()).map_or(0, |(l, f)| l - f);
    assert!(
        spread >= 800,
        "the held samples keep their collection times: they span {spread} ms"
    );
}

/// `streams.metrics.buffer_while_disconnected_records: 0`: the samples collected with no
/// collector are dropped as `not_connected`, as a sample is fresh or worthless.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_collector_and_no_buffer_samples_are_dropped_not_connected_and_log_lines_wait() {
    // A port nothing listens on.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        l.local_addr().unwrap_or_else(|e| panic!("{e}"))
    };
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cfg = support::agent_config(
        closed,
        dir.path(),
        concat!(
            "  metrics:\n",
            "    data_path: write_with_imm\n",
            "    flush_milliseconds: 20\n",
            "    buffer_while_disconnected_records: 0\n",
            "  logs:\n",
            "    data_path: send\n",
            "    flush_milliseconds: 20\n",
        ),
        "",
    );
    let agent = RunningAgent::start(cfg);
    let stats = agent.stats.clone();
    let log = dir.path().join("app.log");
    let lines: Vec<String> = (0..30)
        .map(|i| format!("while the collector is away {i}"))
        .collect();
    std::fs::write(&log, lines.join("\n") + "\n").unwrap_or_else(|e| panic!("{e}"));
    until("not_connected drops", Duration::from_secs(10), || {
        stats.records_dropped(Stream::Metrics, DropReason::NotConnected) > 100
    })
    .await;
    assert!(!stats.connected());
    assert_eq!(sent_frames(&stats), 0);
    // Log lines are not dropped while disconnected: they wait, bounded, for a connection.
    assert_eq!(stats.records_dropped_all(Stream::Logs), 0);
    let mut fake = support::start_on(closed, support::FakeConfig::default()).await;
    until(
        "log lines after the collector came",
        Duration::from_secs(10),
        || stats.records_sent(Stream::Logs) >= 30,
    )
    .await;
    let summary = agent.stop_within(Duration::from_secs(10)).await;
    assert_eq!(summary.sessions, 1);
    let s = fake.session().await;
    let got = s.log_messages();
    assert_eq!(got, lines);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_collector_is_declared_dead_and_the_agent_reconnects() {
    let mut fake = support::start(support::FakeConfig {
        silent: true,
        heartbeat_interval_ms: 10,
        ..support::FakeConfig::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut cfg = config(fake.addr, dir.path(), "");
    cfg.collector.heartbeat_timeout_seconds = 0.2;
    let agent = RunningAgent::start(cfg);
    let stats = agent.stats.clone();
    until("a reconnect", Duration::from_secs(10), || {
        stats.reconnects() >= 1
    })
    .await;
    let summary = agent.stop().await;
    // Every welcomed session counts, the first and each reconnect after it.
    assert!(summary.sessions >= 2, "{summary:?}");
    assert_eq!(summary.sessions, 1 + stats.reconnects(), "{summary:?}");
    let first = fake.session().await;
    // The agent heartbeated at the collector's period before giving up on it, and said why.
    assert!(first.heartbeats >= 2, "heartbeats {}", first.heartbeats);
    let g = first.goodbye.unwrap_or_else(|| panic!("no goodbye"));
    assert_eq!(g.reason, GoodbyeReason::Reconnect as i32);
    assert!(g.detail.contains("nothing heard"), "{}", g.detail);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_burst_beyond_the_credit_window_waits_instead_of_dropping() {
    let mut fake = support::start(support::FakeConfig {
        credit_window: 4,
        report_interval: Duration::from_millis(20),
        ..support::FakeConfig::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let log = dir.path().join("burst.log");
    let lines: Vec<String> = (0..3000)
        .map(|i| format!("burst line {i:05} {}", "x".repeat(40)))
        .collect();
    std::fs::write(&log, lines.join("\n") + "\n").unwrap_or_else(|e| panic!("{e}"));
    let cfg = config(fake.addr, dir.path(), "");
    let agent = RunningAgent::start(cfg);
    let stats = agent.stats.clone();
    until("the whole burst", Duration::from_secs(30), || {
        stats.records_sent(Stream::Logs) >= 3000
    })
    .await;
    let summary = agent.stop().await;
    assert_eq!(summary.sessions, 1);
    assert_eq!(stats.records_dropped_all(Stream::Logs), 0);
    let s = fake.session().await;
    assert!(s.violations.is_empty(), "{:?}", s.violations);
    let got = s.log_messages();
    assert_eq!(got, lines);
}

/// A log backlog of many credit windows drains on the agent's asks for credit, not one
/// window per report interval. The collector here reports only when asked (a heartbeat that
/// names frames without credit; its report interval is an hour, its heartbeat period a
/// minute, so neither comes round during the test): the stream waits for credit and keeps
/// a reserve for the others, so it never builds a frame that finds no credit, and only the
/// records left in its queue can ask. Without that ask the backlog stops after its first
/// window, and the wait below fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_backlog_asks_for_credit_instead_of_waiting_a_report_interval_per_window() {
    const WINDOW: u32 = 4;
    let mut fake = support::start(support::FakeConfig {
        credit_window: WINDOW,
        report_interval: Duration::from_secs(3600),
        heartbeat_interval_ms: 60_000,
        answer_credit_asks: true,
        ..support::FakeConfig::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let log = dir.path().join("backlog.log");
    let lines: Vec<String> = (0..3000)
        .map(|i| format!("backlog line {i:05} {}", "w".repeat(40)))
        .collect();
    std::fs::write(&log, lines.join("\n") + "\n").unwrap_or_else(|e| panic!("{e}"));
    let agent = RunningAgent::start(config(fake.addr, dir.path(), ""));
    let stats = agent.stats.clone();
    until(
        "the backlog sent on asks for credit alone",
        Duration::from_secs(30),
        || match stats.records_sent(Stream::Logs) {
            3000.. => Ok(()),
            n => Err(format!(
                "{n} of 3000 lines sent in {} frames",
                stats.frames_sent(Stream::Logs)
            )),
        },
    )
    .await;
    let summary = agent.stop().await;
    assert_eq!(summary.sessions, 1);
    assert_eq!(stats.records_dropped_all(Stream::Logs), 0);
    let s = fake.session().await;
    assert!(s.violations.is_empty(), "{:?}", s.violations);
    assert_eq!(log_lines(&s), lines);
    let log_frames = s
        .frames
        .iter()
        .filter(|(_, f)| matches!(f.payload, Payload::Logs(_)))
        .count() as u64;
    let windows = log_frames.div_ceil(u64::from(WINDOW));
    eprintln!(
        "{log_frames} log frames ({windows} windows of {WINDOW}); reports: {} at the \
         interval, {} answering asks",
        s.interval_reports, s.asks_answered
    );
    assert!(
        windows >= 10,
        "a backlog of {windows} windows tests nothing"
    );
    // At most the interval's first tick, at the start; every other credit came from an ask.
    assert!(s.interval_reports <= 1, "{} reports", s.interval_reports);
    // A report gives back at most a window: the frames past the first window went on the
    // credit of answered asks.
    let grants = 1 + s.interval_reports + s.asks_answered;
    assert!(
        grants * u64::from(WINDOW) >= s.frames.len() as u64,
        "{} frames on {grants} windows of credit",
        s.frames.len()
    );
}

/// The value of a counter without labels in the agent's registry.
fn counter(stats: &SelfMetrics, name: &str) -> u64 {
    stats
        .to_records(0)
        .iter()
        .find(|m| m.name == name && m.labels.is_empty())
        .map_or(0, |m| m.value as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_during_a_log_backlog_sends_it_or_counts_it() {
    let mut fake = support::start(support::FakeConfig {
        credit_window: 4,
        report_interval: Duration::from_millis(20),
        ..support::FakeConfig::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let log = dir.path().join("burst.log");
    let lines: Vec<String> = (0..20000)
        .map(|i| format!("backlog line {i:05} {}", "y".repeat(60)))
        .collect();
    std::fs::write(&log, lines.join("\n") + "\n").unwrap_or_else(|e| panic!("{e}"));
    let cfg = config(fake.addr, dir.path(), "");
    let agent = RunningAgent::start(cfg);
    let stats = agent.stats.clone();
    until("the backlog started", Duration::from_secs(10), || {
        stats.records_sent(Stream::Logs) >= 100
    })
    .await;
    let summary = agent.stop_within(Duration::from_secs(30)).await;
    assert_eq!(summary.sessions, 1);
    let s = fake.session().await;
    assert!(s.violations.is_empty(), "{:?}", s.violations);
    let got = s.log_messages();
    // In order, without a hole: a prefix of the file.
    assert_eq!(got.as_slice(), &lines[..got.len()]);
    // Every line the tailer read was delivered or counted.
    let read = counter(&stats, "uctel_agent_log_records_read_total");
    let dropped = stats.records_dropped_all(Stream::Logs);
    assert_eq!(
        got.len() as u64 + dropped,
        read,
        "read {read}, got {}, dropped {dropped}",
        got.len()
    );
    assert_eq!(
        dropped,
        stats.records_dropped(Stream::Logs, DropReason::Shutdown)
    );
    assert_eq!(got.len() as u64, stats.records_sent(Stream::Logs));
}

/// The log lines of a session's frames, in stream order.
fn log_lines(s: &support::Session) -> Vec<String> {
    let mut frames: Vec<_> = s
        .frames
        .iter()
        .filter(|(_, f)| matches!(f.payload, Payload::Logs(_)))
        .collect();
    frames.sort_by_key(|(_, f)| f.header.stream_seq);
    support::log_messages(frames.into_iter().map(|(_, f)| f))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_after_a_shutdown_during_a_log_backlog_delivers_every_line_exactly_once() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let log = dir.path().join("burst.log");
    let lines: Vec<String> = (0..20000)
        .map(|i| format!("backlog line {i:05} {}", "z".repeat(60)))
        .collect();
    std::fs::write(&log, lines.join("\n") + "\n").unwrap_or_else(|e| panic!("{e}"));

    // Run 1: a slow collector (4 credits, a report every 100 ms), stopped early; the shutdown
    // grace cannot drain the backlog.
    let mut slow = support::start(support::FakeConfig {
        credit_window: 4,
        report_interval: Duration::from_millis(100),
        ..support::FakeConfig::default()
    })
    .await;
    let agent = RunningAgent::start(config(slow.addr, dir.path(), ""));
    let stats = agent.stats.clone();
    until("the backlog started", Duration::from_secs(10), || {
        stats.records_sent(Stream::Logs) >= 100
    })
    .await;
    agent.stop_within(Duration::from_secs(30)).await;
    let s1 = slow.session().await;
    assert!(s1.violations.is_empty(), "{:?}", s1.violations);
    let first = log_lines(&s1);
    let left_behind = stats.records_dropped(Stream::Logs, DropReason::Shutdown);
    assert!(left_behind > 0, "the backlog was drained: nothing to test");
    assert_eq!(first.len() as u64, stats.records_sent(Stream::Logs));
    assert!((first.len() as u64) < 20000);

    // Run 2: same state directory, a fast collector: the lines never sent come now, once.
    let mut fast = support::start(support::FakeConfig::default()).await;
    let agent = RunningAgent::start(config(fast.addr, dir.path(), ""));
    let stats = agent.stats.clone();
    let rest = 20000 - first.len() as u64;
    until("the rest of the file", Duration::from_secs(30), || {
        stats.records_sent(Stream::Logs) >= rest
    })
    .await;
    // A deliberate pause, not a wait for a state: anything more (a repeat) would arrive with
    // the lines just counted, and the check below is that nothing does.
    tokio::time::sleep(Duration::from_millis(200)).await;
    agent.stop_within(Duration::from_secs(30)).await;
    let s2 = fast.session().await;
    assert!(s2.violations.is_empty(), "{:?}", s2.violations);
    let second = log_lines(&s2);
    assert_eq!(stats.records_dropped_all(Stream::Logs), 0);

    // Together: every written line, in order, none twice.
    let delivered: Vec<String> = first.iter().chain(second.iter()).cloned().collect();
    assert_eq!(
        delivered.len(),
        lines.len(),
        "run 1 sent {}, left {left_behind} behind; run 2 sent {}",
        first.len(),
        second.len()
    );
    assert!(delivered == lines, "lines lost, repeated or out of order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_are_capped_at_the_path_mtu() {
    let mut fake = support::start(support::FakeConfig {
        mtu_bytes: 1024,
        ..support::FakeConfig::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cfg = config(fake.addr, dir.path(), "");
    assert_eq!(cfg.max_frame_bytes, 4096);
    let agent = RunningAgent::start(cfg);
    let stats = agent.stats.clone();
    until("a few collections", Duration::from_secs(10), || {
        stats.frames_sent(Stream::Metrics) >= 10
    })
    .await;
    let summary = agent.stop().await;
    assert_eq!(summary.sessions, 1);
    let s = fake.session().await;
    assert!(s.violations.is_empty(), "{:?}", s.violations);
    let largest = s
        .frames
        .iter()
        .map(|(_, f)| f.header.payload_len as usize + uctel_protocol::frame::HEADER_LEN)
        .max()
        .unwrap_or(0);
    assert!(
        largest <= 1024,
        "a {largest}-byte frame over a 1024-byte path MTU"
    );
    assert!(
        largest > 512,
        "frames should fill the MTU, largest {largest}"
    );
}
