//! Issue 42 item 2: credit writes batched across agents. Sixteen agents (one report group:
//! they tick at one instant) offer a credit word region at `Hello`; every agent's word
//! arrives in its memory, carrying its epoch and the frames consumed, and a round of their
//! writes goes to the transport together: many writes per
//! `uctel_collector_credit_write_batches_total`, none refused. With
//! `control.credit_write_batching: false` the same words arrive, each posted alone (no batch).

use std::time::Duration;

use crate::support;

use support::{collector_config, eventually, AgentOptions, MetricStream, TestAgent};

const AGENTS: usize = 16;
const FRAMES: u64 = 6;

/// Connects the agents (credit words offered), sends `FRAMES` frames from each and waits
/// until every agent's word carries its epoch and all its frames consumed.
async fn agents_with_credit_words(
    running: &uctel_collector::Running,
) -> Vec<(TestAgent, MetricStream)> {
    let mut agents = Vec::new();
    for i in 0..AGENTS {
        let mut opts = AgentOptions::new(&format!("cw{i}"));
        opts.credit_mr = true;
        let agent = TestAgent::connect(running.control_addr(), opts)
            .await
            .unwrap();
        assert!(
            agent.welcome.credit_writes.is_some(),
            "the collector takes the region"
        );
        agents.push((agent, MetricStream::new(1)));
    }
    for step in 0..FRAMES {
        for (agent, stream) in &mut agents {
            agent.send(stream.frame(step, 1)).await;
        }
    }
    for (agent, _) in &mut agents {
        agent.flush().await;
    }
    for (agent, _) in &agents {
        let word = eventually("the credit word with every frame consumed", || {
            agent.credit_word().filter(|w| w.consumed_next == FRAMES)
        })
        .await;
        assert_eq!(word.generation, agent.epoch, "the word of this session");
        assert!(word.grant_limit >= FRAMES, "{word:?}");
    }
    agents
}

/// Writes (posted, refused) and batches over `window`.
async fn writes_over(running: &uctel_collector::Running, window: Duration) -> (u64, u64, u64) {
    let credits = running.shared().credits.clone();
    let ((p0, r0), b0) = (credits.writes(), credits.write_batches());
    tokio::time::sleep(window).await;
    let ((p1, r1), b1) = (credits.writes(), credits.write_batches());
    (p1 - p0, r1 - r0, b1 - b0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_of_due_agents_goes_out_in_one_batch() {
    let dir = tempfile::tempdir().unwrap();
    let config = collector_config(dir.path());
    assert!(config.control.credit_write_batching, "on by default");
    let running = uctel_collector::start(config).await.unwrap();
    let agents = agents_with_credit_words(&running).await;
    // 0.02 s report interval: about 20 rounds of 16 writes.
    let (posted, refused, batches) = writes_over(&running, Duration::from_millis(400)).await;
    eprintln!("batched: {posted} writes posted, {refused} refused, in {batches} batches");
    assert_eq!(refused, 0);
    assert!(
        posted >= 5 * AGENTS as u64,
        "{posted} writes in 20 report intervals"
    );
    assert!(batches > 0, "{posted} writes in no batch");
    // One round is the group's 16 writes; a tick whose Report waits for the worker may make
    // a round of its own. Posted one by one it would be one call per write.
    assert!(
        posted >= 4 * batches,
        "{posted} writes in {batches} batches (want ≥ 4 per batch)"
    );
    for (agent, stream) in agents {
        agent.goodbye(vec![stream.final_state()]).await;
    }
    running.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_batching_each_write_is_posted_alone() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = collector_config(dir.path());
    config.control.credit_write_batching = false;
    let running = uctel_collector::start(config).await.unwrap();
    let agents = agents_with_credit_words(&running).await;
    let (posted, refused, batches) = writes_over(&running, Duration::from_millis(200)).await;
    assert_eq!((refused, batches), (0, 0));
    assert!(posted >= 2 * AGENTS as u64, "{posted} writes");
    for (agent, stream) in agents {
        agent.goodbye(vec![stream.final_state()]).await;
    }
    running.stop().await.unwrap();
}
