//! Completions waiting for a paused data-plane worker have each connection's credit window:
//! agents within their credits never lose a frame to `queue_full`, however small
//! `ring.descriptor_queue` (the shared room on top) is and however long the worker stalls;
//! an agent ignoring its credits uses the shared room and then loses only its own frames.

use crate::support;

use support::{collector_config, eventually, sample, AgentOptions, MetricStream, TestAgent};
use uctel_protocol::control::DataPath;

const SLOTS: u32 = 64;
const MARGIN: u32 = 8;
/// The credit window: `slots − margin`.
const WINDOW: u64 = (SLOTS - MARGIN) as u64;
/// Shared room in the queue beyond the windows.
const SHARED: u64 = 4;
const AGENTS: usize = 4;

fn metric_of(text: &str, name: &str, agent: &str, extra: &str) -> f64 {
    sample(text, &format!("{name}{{agent=\"{agent}\"{extra}}}")).unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_within_credits_never_find_the_queue_full() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = collector_config(dir.path());
    config.ring.slots = SLOTS;
    config.ring.credit_margin_slots = MARGIN;
    config.ring.descriptor_queue = SHARED as u32;
    let running = uctel_collector::start(config).await.unwrap();
    let mut agents = Vec::new();
    for i in 0..AGENTS {
        let mut opts = AgentOptions::new(&format!("a{i}"));
        opts.capabilities = vec![DataPath::WriteWithImm];
        let agent = TestAgent::connect(running.control_addr(), opts)
            .await
            .unwrap();
        assert_eq!(u64::from(agent.welcome.credit_window), WINDOW);
        agents.push((agent, MetricStream::new(1)));
    }
    let mut greedy_opts = AgentOptions::new("greedy");
    greedy_opts.capabilities = vec![DataPath::WriteWithImm];
    greedy_opts.ignore_credits = true;
    let mut greedy = TestAgent::connect(running.control_addr(), greedy_opts)
        .await
        .unwrap();
    let mut greedy_stream = MetricStream::new(1);

    // With the worker stalled, every agent fills its whole window: AGENTS × WINDOW
    // descriptors wait in a queue whose configured room is only SHARED.
    running.pause_worker(true);
    for (agent, stream) in &mut agents {
        for step in 0..WINDOW {
            agent.send(stream.frame(step, 2)).await;
        }
        agent.flush().await;
    }
    for (i, _) in agents.iter().enumerate() {
        let name = format!("a{i}");
        eventually("the whole window queued", || {
            let text = running.render_metrics().ok()?;
            (metric_of(&text, "uctel_collector_ring_slots_in_use", &name, "") == WINDOW as f64)
                .then_some(())
        })
        .await;
    }
    // An agent ignoring credits: its window, then the shared room, then `queue_full` for it
    // alone. Chunks stay below the receive queue's depth so every frame completes.
    let sent = WINDOW + SHARED + 6;
    for step in 0..sent {
        greedy.send(greedy_stream.frame(step, 1)).await;
        if step % 8 == 7 || step + 1 == sent {
            greedy.flush().await;
            let done = step + 1;
            eventually("the greedy agent's frames completed", || {
                let text = running.render_metrics().ok()?;
                let queued = metric_of(&text, "uctel_collector_ring_slots_in_use", "greedy", "");
                let full = metric_of(
                    &text,
                    "uctel_collector_frames_dropped_total",
                    "greedy",
                    ",reason=\"queue_full\"",
                );
                (queued + full == done as f64).then_some(())
            })
            .await;
        }
    }
    let text = running.render_metrics().unwrap();
    assert_eq!(
        metric_of(
            &text,
            "uctel_collector_frames_dropped_total",
            "greedy",
            ",reason=\"queue_full\""
        ),
        (sent - WINDOW - SHARED) as f64,
        "{text}"
    );
    running.pause_worker(false);

    for (i, (agent, stream)) in agents.into_iter().enumerate() {
        agent.goodbye(vec![stream.final_state()]).await;
        let name = format!("a{i}");
        let ledger = eventually("ledger", || {
            let l = running.ledger(&name);
            (!l.is_empty()).then_some(l)
        })
        .await;
        let l = ledger[0].1;
        assert_eq!((l.accepted, l.lost), (WINDOW, 0), "{name}: {l:?}");
        let text = running.render_metrics().unwrap();
        assert_eq!(
            metric_of(
                &text,
                "uctel_collector_frames_dropped_total",
                &name,
                ",reason=\"queue_full\""
            ),
            0.0,
            "{text}"
        );
    }
    running.stop().await.unwrap();
}
