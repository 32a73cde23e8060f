//! Issue 42 item 1: every connection of the worker completes into one shared CQ and the
//! Write-with-immediate connections take their receive WRs from one shared receive queue.
//! 64 agents (and one on the Send path, which keeps its own receive queue on the shared CQ)
//! each send frames; every frame is accepted, exactly, and the SRQ holds what the
//! connections on it are owed: Σ of their ring slots while connected, nothing owed after
//! their Goodbyes. `uctel_collector_connection_queues{queues}` says which mode each
//! connection runs in.

use crate::support;

use support::{collector_config, eventually, sample, AgentOptions, MetricStream, TestAgent};
use uctel_protocol::control::DataPath;

const AGENTS: usize = 64;
const FRAMES: u64 = 30;
const SLOTS: u32 = 64;

/// `uctel_collector_connection_queues{queues="<mode>"}` of `running`.
fn connections_in(running: &uctel_collector::Running, mode: &str) -> Option<f64> {
    let text = running.render_metrics().ok()?;
    sample(
        &text,
        &format!("uctel_collector_connection_queues{{queues=\"{mode}\"}}"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_agents_on_one_shared_cq_and_srq_add_up_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = collector_config(dir.path());
    config.ring.slots = SLOTS;
    config.ring.min_slots = SLOTS;
    let running = uctel_collector::start(config).await.unwrap();
    let plane = running.shared().plane.clone();
    let queues = plane
        .shared_queues()
        .expect("the soft device has a shared CQ");
    let srq = queues.srq.as_ref().expect("the soft device has an SRQ");
    assert!(srq.max_wr() >= AGENTS as u32 * SLOTS);

    let mut agents = Vec::new();
    for i in 0..=AGENTS {
        let mut opts = AgentOptions::new(&format!("s{i}"));
        // The last one on the Send path: its own receive queue, on the shared CQ.
        opts.capabilities = vec![if i == AGENTS {
            DataPath::Send
        } else {
            DataPath::WriteWithImm
        }];
        let agent = TestAgent::connect(running.control_addr(), opts)
            .await
            .unwrap();
        agents.push((agent, MetricStream::new(1)));
    }
    // Which queues each connection runs on, as the metric says.
    assert_eq!(
        ["shared_cq_srq", "shared_cq", "own"].map(|m| connections_in(&running, m)),
        [Some(AGENTS as f64), Some(1.0), Some(0.0)]
    );
    // The WRs of the 64 Write-with-immediate connections, all in one queue.
    assert_eq!(
        srq.posted(),
        Some(AGENTS as u32 * SLOTS),
        "the SRQ holds every connection's ring depth"
    );
    for step in 0..FRAMES {
        for (agent, stream) in &mut agents {
            agent.send(stream.frame(step, 2)).await;
        }
    }
    for (agent, _) in &mut agents {
        agent.flush().await;
    }
    // Every Write-with-immediate took a WR and the worker put one back.
    eventually("the SRQ topped up again", || {
        (queues.srq_outstanding() == u64::from(AGENTS as u32 * SLOTS)).then_some(())
    })
    .await;
    let mut names = Vec::new();
    for (i, (agent, stream)) in agents.into_iter().enumerate() {
        agent.goodbye(vec![stream.final_state()]).await;
        names.push(format!("s{i}"));
    }
    for name in &names {
        let ledger = eventually("ledger after goodbye", || {
            let l = running.ledger(name);
            (l.len() == 1).then_some(l)
        })
        .await;
        let l = &ledger[0].1;
        assert_eq!(
            (l.accepted, l.lost, l.dropped_after_tracking),
            (FRAMES, 0, 0),
            "{name}: {l:?}"
        );
    }
    // Nothing owed any more: the connections gave their share of the SRQ back.
    eventually("the SRQ's target back to 0", || {
        (queues.srq_deficit() == 0).then_some(())
    })
    .await;
    eventually("no connection counted in any mode", || {
        ["shared_cq_srq", "shared_cq", "own"]
            .iter()
            .all(|m| connections_in(&running, m) == Some(0.0))
            .then_some(())
    })
    .await;
    running.stop().await.unwrap();
}
