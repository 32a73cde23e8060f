//! Idle means asleep (DESIGN.md §2): an in-process collector with no agent, and with a
//! connected agent that sends nothing, costs next to no CPU (the data-plane worker sleeps on
//! its completion channel, the soft device's thread sleeps on its socket), and a frame arriving after a long idle stretch is still taken at once.
//!
//! CPU is the process's `utime + stime` from `/proc/self/stat` (10 ms ticks): the tests of
//! this binary run one at a time (a lock), so the figure is the collector's plus an idle
//! test harness. The bound, 2 % of one core, is far above the 0.1 % target and far below the
//! 12 % that a worker waking every 50 µs costs.

use crate::support;

use std::time::{Duration, Instant};

use support::{collector_config, eventually, sample, AgentOptions, MetricStream, TestAgent};

/// One test at a time: each measures the whole process.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The measured window.
const WINDOW: Duration = Duration::from_secs(5);
/// Largest share of one core an idle collector may use over [`WINDOW`].
const MAX_IDLE_SHARE: f64 = 0.02;

/// This process's CPU time so far, in seconds (`utime + stime`, USER_HZ = 100).
fn process_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    let rest = stat.rsplit_once(") ").map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let t = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    (t(11) + t(12)) as f64 / 100.0
}

/// CPU ticks per thread name of this process (to say which thread did not sleep).
fn thread_ticks() -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for entry in dir.flatten() {
        let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let rest = stat.rsplit_once(") ").map_or("", |(_, r)| r);
        let f: Vec<&str> = rest.split_whitespace().collect();
        let t = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        out.push((comm.trim_end().to_owned(), t(11) + t(12)));
    }
    out.sort();
    out
}

/// The share of one core this process used over `window`, and the per-thread ticks.
async fn idle_share(window: Duration) -> (f64, Vec<(String, u64)>) {
    let before = thread_ticks();
    let cpu = process_cpu_seconds();
    let start = Instant::now();
    tokio::time::sleep(window).await;
    let used = process_cpu_seconds() - cpu;
    let share = used / start.elapsed().as_secs_f64();
    let after = thread_ticks();
    let busy = after
        .into_iter()
        .filter_map(|(name, t)| {
            let was = before
                .iter()
                .find(|(n, _)| *n == name)
                .map_or(0, |(_, b)| *b);
            (t > was).then(|| (name, t - was))
        })
        .collect();
    (share, busy)
}

fn config(dir: &std::path::Path) -> uctel_collector::config::Config {
    let mut config = collector_config(dir);
    // The production defaults: the test default of a Report every 20 ms is work.
    config.control.report_interval_seconds = 1.0;
    config.control.heartbeat_interval_seconds = 5.0;
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_without_agents_sleeps() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let running = uctel_collector::start(config(dir.path())).await.unwrap();
    // Let start-up finish.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (share, busy) = idle_share(WINDOW).await;
    eprintln!(
        "idle collector, no agent: {:.3} % of a core over {WINDOW:?}; threads with ticks: {busy:?}",
        share * 100.0
    );
    assert!(
        share < MAX_IDLE_SHARE,
        "an idle collector used {:.2} % of a core (bound {:.0} %); threads: {busy:?}",
        share * 100.0,
        MAX_IDLE_SHARE * 100.0
    );
    running.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_with_a_quiet_agent_sleeps_and_wakes_for_its_next_frame() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let running = uctel_collector::start(config(dir.path())).await.unwrap();
    let mut agent = TestAgent::connect(running.control_addr(), AgentOptions::new("quiet"))
        .await
        .unwrap();
    let mut stream = MetricStream::new(1);
    let received = |running: &uctel_collector::Running| {
        let text = running.render_metrics().ok()?;
        sample(
            &text,
            "uctel_collector_frames_received_total{agent=\"quiet\",stream=\"metrics\"}",
        )
    };
    agent.send(stream.frame(0, 2)).await;
    agent.flush().await;
    eventually("the first frame", || {
        (received(&running)? >= 1.0).then_some(())
    })
    .await;

    let (share, busy) = idle_share(WINDOW).await;
    eprintln!(
        "idle collector, one quiet agent: {:.3} % of a core over {WINDOW:?}; threads with ticks: {busy:?}",
        share * 100.0
    );
    assert!(
        share < MAX_IDLE_SHARE,
        "a collector with a quiet agent used {:.2} % of a core (bound {:.0} %); threads: {busy:?}",
        share * 100.0,
        MAX_IDLE_SHARE * 100.0
    );

    // After the idle stretch every thread is asleep: the next frame is still taken at once
    // (sub-millisecond wake-ups; the bound is generous for a loaded test machine and the
    // 1 ms steps of this loop).
    let sent = Instant::now();
    agent.send(stream.frame(1, 2)).await;
    let mut took = None;
    while sent.elapsed() < Duration::from_secs(5) {
        if received(&running).unwrap_or(0.0) >= 2.0 {
            took = Some(sent.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let took = took.expect("the frame after the idle stretch was not processed within 5 s");
    eprintln!("frame after {WINDOW:?} idle processed {took:?} after the post");
    assert!(
        took < Duration::from_millis(250),
        "the frame after an idle stretch took {took:?}"
    );
    agent.flush().await;
    running.stop().await.unwrap();
}
