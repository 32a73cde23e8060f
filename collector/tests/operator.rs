//! What an operator sees: labels, resets, warnings and summaries of an in-process collector
//! driven by the test agent over the real soft RoCEv2 UC transport on loopback.

mod support;

use support::{
    collector_config, eventually, sample, AgentOptions, LogStream, MetricStream, TestAgent,
};

fn value(text: &str, series: &str) -> f64 {
    sample(text, series).unwrap_or(0.0)
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
