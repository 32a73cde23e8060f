//! What an operator sees: labels, resets, warnings and summaries of an in-process collector
//! driven by the test agent over the real soft RoCEv2 UC transport on loopback.

use crate::support;

use std::io::Write;
use std::sync::{Mutex, OnceLock};

use support::{
    collector_config, eventually, sample, AgentOptions, LogStream, MetricStream, TestAgent,
};
use uctel_common::control::HandshakeError;
use uctel_protocol::control::RefuseReason;

fn value(text: &str, series: &str) -> f64 {
    sample(text, series).unwrap_or(0.0)
}

/// Everything the collector logged in this test binary (INFO and up, no colours). Tests tell
/// their lines apart by agent id.
static LOGS: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct CaptureWriter;

impl Write for CaptureWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOGS.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs the capturing subscriber once per test binary.
fn capture_logs() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let _ = tracing_subscriber::fmt()
            .with_writer(|| CaptureWriter)
            .with_ansi(false)
            .with_max_level(tracing_subscriber::filter::LevelFilter::INFO)
            .try_init();
    });
}

/// The captured log lines containing every one of `needles`.
fn log_lines(needles: &[&str]) -> Vec<String> {
    let logs = LOGS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    String::from_utf8_lossy(&logs)
        .lines()
        .filter(|l| needles.iter().all(|n| l.contains(n)))
        .map(str::to_owned)
        .collect()
}

/// An agent that comes back with a new epoch (a restart or a reconnect) counts one
/// `epoch_change` reset on each of its streams and on its connection, and no loss
/// (DESIGN.md §5); its first connection counts none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_epoch_is_counted_as_a_reset_per_stream() {
    let dir = tempfile::tempdir().unwrap();
    let running = uctel_collector::start(collector_config(dir.path()))
        .await
        .unwrap();
    let series = |stream: &str| {
        format!(
            "uctel_collector_stream_resets_total{{agent=\"restarts\",reason=\"epoch_change\",stream=\"{stream}\"}}"
        )
    };
    let conn =
        "uctel_collector_connection_resets_total{agent=\"restarts\",reason=\"epoch_change\"}";
    let received = "uctel_collector_frames_received_total{agent=\"restarts\",stream=\"logs\"}";
    let mut epochs = Vec::new();
    for round in 1..=3u32 {
        let mut agent = TestAgent::connect(running.control_addr(), AgentOptions::new("restarts"))
            .await
            .unwrap();
        epochs.push(agent.epoch);
        let mut metrics = MetricStream::new(uctel_protocol::stream::METRICS);
        let mut logs = LogStream::new(uctel_protocol::stream::LOGS);
        for step in 0..5 {
            agent.send(metrics.frame(step, 2)).await;
            agent.send(logs.frame(step, 1)).await;
        }
        agent.flush().await;
        let want = f64::from(5 * round);
        eventually("frames of this round", || {
            let text = running.render_metrics().ok()?;
            (value(&text, received) == want).then_some(())
        })
        .await;
        let text = running.render_metrics().unwrap();
        let resets = f64::from(round - 1);
        assert_eq!(
            value(&text, &series("metrics")),
            resets,
            "round {round}\n{text}"
        );
        assert_eq!(
            value(&text, &series("logs")),
            resets,
            "round {round}\n{text}"
        );
        assert_eq!(value(&text, conn), resets, "round {round}\n{text}");
        assert_eq!(
            value(
                &text,
                "uctel_collector_frames_lost_total{agent=\"restarts\",stream=\"metrics\"}"
            ),
            0.0,
            "a new epoch counted as loss\n{text}"
        );
        agent
            .goodbye(vec![metrics.final_state(), logs.final_state()])
            .await;
    }
    assert!(
        epochs[0] != epochs[1] && epochs[1] != epochs[2],
        "{epochs:?}"
    );
    running.stop().await.unwrap();
}

/// Two agents configured with the same agent id: while the first is alive, every connection
/// of the second is refused with `duplicate_agent_id` (counted, warned about once per agent
/// per minute naming both peers, the refusal detail says what to do) and the first keeps its
/// session: no loop of replacements. A connection that went silent (an agent restart racing
/// its old connection) is still replaced, as `previous="silent"`, and not warned about.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_sharing_an_agent_id_are_refused_warned_and_told() {
    capture_logs();
    let dir = tempfile::tempdir().unwrap();
    let running = uctel_collector::start(collector_config(dir.path()))
        .await
        .unwrap();
    let addr = running.control_addr();
    let refused = "uctel_collector_handshakes_refused_total{reason=\"duplicate_agent_id\"}";
    let mut first = TestAgent::connect(addr, AgentOptions::new("twin"))
        .await
        .unwrap();
    for round in 1..=3 {
        // The first agent is alive: it heartbeats.
        assert!(
            first.heartbeat_without_reading().await,
            "round {round}: first connection closed"
        );
        match TestAgent::connect(addr, AgentOptions::new("twin")).await {
            Err(HandshakeError::Refused { reason, detail }) => {
                assert_eq!(reason, RefuseReason::DuplicateAgentId, "{detail}");
                assert!(
                    detail.contains("agent_id \"twin\" is already connected from 127.0.0.1:")
                        && detail.contains("give each agent its own agent_id"),
                    "round {round}: {detail}"
                );
            }
            Err(e) => panic!("round {round}: {e}"),
            Ok(_) => panic!("round {round}: a second live agent with the same id was let in"),
        }
        let text = running.render_metrics().unwrap();
        assert_eq!(value(&text, refused), f64::from(round), "{text}");
        assert_eq!(
            value(&text, "uctel_collector_agents_connected"),
            1.0,
            "{text}"
        );
    }
    let text = running.render_metrics().unwrap();
    assert!(
        !text.contains("uctel_collector_connections_replaced_total{agent=\"twin\""),
        "the first connection was replaced:\n{text}"
    );
    let warned = log_lines(&["WARN", "refused a second connection", "\"twin\""]);
    assert_eq!(warned.len(), 1, "one warning per minute: {warned:#?}");
    assert!(warned[0].contains("Two agents share"), "{}", warned[0]);
    assert!(
        warned[0].contains("connected_peer=127.0.0.1:"),
        "{}",
        warned[0]
    );
    assert!(
        first.heartbeat_without_reading().await,
        "the first agent keeps its session"
    );
    // An agent that says Goodbye and comes straight back (a restart) is let in at once, while
    // its old session still finishes: it is not a twin.
    first.goodbye(Vec::new()).await;
    let back = TestAgent::connect(addr, AgentOptions::new("twin")).await;
    assert!(
        back.is_ok(),
        "a restart after Goodbye was refused: {:?}",
        back.err()
    );
    let text = running.render_metrics().unwrap();
    assert_eq!(value(&text, refused), 3.0, "{text}");
    assert!(
        !text.contains("uctel_collector_connections_replaced_total{agent=\"twin\""),
        "a restart after Goodbye counted as a replacement:\n{text}"
    );

    // A connection silent for longer than one and a half heartbeat intervals is replaced
    // quietly, not refused: `control::state`'s unit tests, on a virtual clock.
    running.stop().await.unwrap();
}

/// A log sink path that cannot be opened at startup (validation bypassed here: the
/// configuration check refuses this one) names the key and the path, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unusable_log_path_names_the_key_and_path() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("hostname");
    std::fs::write(&blocker, "h\n").unwrap();
    let mut config = collector_config(dir.path());
    let path = blocker.join("x.jsonl");
    config.logs.file.path = path.clone();
    let Err(e) = uctel_collector::start(config).await else {
        panic!("started with a log file under a regular file");
    };
    assert_eq!(
        e.to_string(),
        format!(
            "logs.file.path {path:?}: cannot open: {} is not a directory",
            blocker.display()
        )
    );
}

/// The line logged when an agent goes away sums the connection up by stream name with the
/// connection's totals; an agent that vanished without `Goodbye` is a warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_lines_summarise_by_stream_and_warn_when_the_agent_vanished() {
    capture_logs();
    let dir = tempfile::tempdir().unwrap();
    let running = uctel_collector::start(collector_config(dir.path()))
        .await
        .unwrap();
    for (id, goodbye) in [("vanishes", false), ("leaves", true)] {
        let mut agent = TestAgent::connect(running.control_addr(), AgentOptions::new(id))
            .await
            .unwrap();
        let mut metrics = MetricStream::new(uctel_protocol::stream::METRICS);
        let mut logs = LogStream::new(uctel_protocol::stream::LOGS);
        for step in 0..4 {
            agent.send(metrics.frame(step, 3)).await;
        }
        for step in 0..2 {
            agent.send(logs.frame(step, 1)).await;
        }
        agent.flush().await;
        let received =
            format!("uctel_collector_frames_received_total{{agent=\"{id}\",stream=\"logs\"}}");
        eventually("frames in", || {
            let text = running.render_metrics().ok()?;
            (value(&text, &received) == 2.0).then_some(())
        })
        .await;
        if goodbye {
            agent
                .goodbye(vec![metrics.final_state(), logs.final_state()])
                .await;
        } else {
            drop(agent);
        }
    }
    let agent_field = |id: &str| format!("agent={id} ");
    let vanished = eventually("the vanished agent's line", || {
        log_lines(&["agent disconnected", &agent_field("vanishes")]).pop()
    })
    .await;
    assert!(vanished.contains(" WARN "), "{vanished}");
    assert!(vanished.contains("without Goodbye"), "{vanished}");
    assert!(
        // Closed, or reset when the test agent's unread messages were discarded.
        vanished.contains("ended_by=\"the control connection "),
        "{vanished}"
    );
    assert!(vanished.contains("frames_received=6 "), "{vanished}");
    assert!(vanished.contains("frames_lost=0 "), "{vanished}");
    assert!(
        vanished.contains(
            "streams=\"metrics: received 4, lost 0, dropped 0; logs: received 2, lost 0, dropped 0\""
        ),
        "{vanished}"
    );
    let left = eventually("the leaving agent's line", || {
        log_lines(&["agent disconnected", &agent_field("leaves")]).pop()
    })
    .await;
    assert!(left.contains(" INFO "), "{left}");
    assert!(
        left.contains("ended_by=\"the agent's Goodbye (shutdown: test done)\""),
        "{left}"
    );
    assert!(left.contains("frames_received=6 "), "{left}");
    running.stop().await.unwrap();
}
