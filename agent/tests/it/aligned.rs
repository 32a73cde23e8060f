//! Aligned sampling (`pacing::grid`) through the real `uctel-agent`: host metrics and fast
//! counters sample at whole multiples of their interval since the Unix epoch plus their
//! offset, wherever in the interval the agent was started. Read from `--dry-run`, which
//! frames every record exactly as on the wire and prints it (host metrics with their
//! `timestamp_ms`, fast counters with each sample's µs time).
//!
//! The agent is started half an interval away from the grid: an agent that ticks from its
//! own start (as before alignment) samples about 350 ms off it and fails. The bound on how
//! late a sample may be is loose (100 ms; the median 25 ms) so a busy machine does not fail
//! the test; the precise figures are the `uctel-bench --parts align` row.

use std::process::{Command, Stdio};
use std::time::Duration;

const HOST_INTERVAL_MS: u64 = 1_000;
const HOST_OFFSET_MS: u64 = 250;
const FAST_INTERVAL_MS: u64 = 500;
const FAST_OFFSET_MS: u64 = 250;

fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Sleeps until the wall clock is `phase_ms` into a whole second.
fn sleep_until_phase(phase_ms: u64) {
    let now = unix_ns();
    let into = now % 1_000_000_000;
    let target = phase_ms * 1_000_000;
    let wait = (target + 1_000_000_000 - into) % 1_000_000_000;
    std::thread::sleep(Duration::from_nanos(wait));
}

/// How far `t` is past the latest instant `k × interval + offset` (same unit).
fn past_grid(t: u64, interval: u64, offset: u64) -> u64 {
    (t + interval - offset % interval) % interval
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(u64::MAX)
}

#[test]
fn host_metrics_and_fast_counters_sample_on_the_epoch_grid_plus_the_offset() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cfg = dir.path().join("agent.yaml");
    std::fs::write(
        &cfg,
        format!(
            "agent_id: aligned\ncollector:\n  control: 127.0.0.1:1\nauth:\n  token: t\n\
             sources:\n  host_metrics:\n    interval_seconds: {}\n    offset_seconds: {}\n\
             \x20 self_metrics:\n    enabled: false\n\
             \x20 fast_counters:\n    interval_milliseconds: {FAST_INTERVAL_MS}\n\
             \x20   offset_milliseconds: {FAST_OFFSET_MS}\n    samples_per_record: 2\n\
             \x20   counters:\n      - path: /sys/class/net/lo/statistics/rx_packets\n",
            HOST_INTERVAL_MS as f64 / 1000.0,
            HOST_OFFSET_MS as f64 / 1000.0,
        ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    // Half an interval off both grids (0.75 s into the second: 500 ms after the host
    // instant at .250, 0 ms into the 500 ms fast interval, 250 ms before its instant).
    sleep_until_phase(750);
    let child = Command::new(env!("CARGO_BIN_EXE_uctel-agent"))
        .arg("--config")
        .arg(&cfg)
        .args(["--dry-run", "--log-level", "warn"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    std::thread::sleep(Duration::from_millis(4_300));
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(killed.success());
    let out = child.wait_with_output().unwrap_or_else(|e| panic!("{e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let frames: Vec<serde_json::Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let records = |stream: &str| -> Vec<serde_json::Value> {
        frames
            .iter()
            .filter(|f| f["stream"] == stream)
            .flat_map(|f| f["records"].as_array().cloned().unwrap_or_default())
            .collect()
    };

    // Host metrics: one timestamp per collection (the round's start), each on the grid.
    let mut host_ms: Vec<u64> = records("metrics")
        .iter()
        .filter(|r| r["name"] == "node_load1")
        .filter_map(|r| r["timestamp_ms"].as_u64())
        .collect();
    host_ms.dedup();
    assert!(
        host_ms.len() >= 3,
        "collections: {host_ms:?}; stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let host_err: Vec<u64> = host_ms
        .iter()
        .map(|t| past_grid(*t, HOST_INTERVAL_MS, HOST_OFFSET_MS))
        .collect();
    assert!(
        host_err.iter().all(|e| *e < 100),
        "ms past the grid: {host_err:?} ({host_ms:?})"
    );
    assert!(median(host_err.clone()) < 25, "{host_err:?}");
    // One collection per instant: never two for the same one (no bunching).
    let instants: Vec<u64> = host_ms.iter().map(|t| t / HOST_INTERVAL_MS).collect();
    assert!(instants.windows(2).all(|w| w[1] > w[0]), "{host_ms:?}");

    // Fast counters: every sample's µs time on the 500 ms grid + 250 ms.
    let fast_us: Vec<u64> = records("fast_counters")
        .iter()
        .flat_map(|s| {
            let start = s["start_us"].as_u64().unwrap_or(0);
            s["offsets_us"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter_map(|o| o.as_u64())
                .map(move |o| start + o)
        })
        .collect();
    assert!(fast_us.len() >= 6, "fast samples: {fast_us:?}");
    let fast_err: Vec<u64> = fast_us
        .iter()
        .map(|t| past_grid(*t, FAST_INTERVAL_MS * 1_000, FAST_OFFSET_MS * 1_000))
        .collect();
    assert!(
        fast_err.iter().all(|e| *e < 100_000),
        "µs past the grid: {fast_err:?}"
    );
    assert!(median(fast_err.clone()) < 25_000, "{fast_err:?}");
}
