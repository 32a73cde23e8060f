//! End-to-end collector ingest throughput over loopback: an in-process collector and a test
//! agent on the soft RoCEv2 UC transport (real UDP on 127.0.0.1), Write-with-immediate into
//! the ring, credits honoured, no injected loss. Prints frames/s and samples/s.
//!
//! `cargo run --release -p uctel-collector --example loopback_throughput -- [frames] [samples_per_frame]`
//! (`UCTEL_BUSY_POLL=1` makes the collector's data-plane worker drive its soft device instead
//! of a device thread).

#[path = "../tests/it/support/mod.rs"]
mod support;

use std::time::Instant;

use support::{collector_config, eventually, AgentOptions, MetricStream, TestAgent};
use uctel_protocol::control::DataPath;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let frames: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let samples: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = collector_config(dir.path());
    // A 4096-slot ring and 5 ms reports: credits return fast enough that the collector, not
    // the credit loop, is the limit (credit rate <= window / report interval).
    config.ring.slots = 4096;
    config.ring.credit_margin_slots = 256;
    config.ring.descriptor_queue = 8192;
    config.control.report_interval_seconds = 0.005;
    if std::env::var_os("UCTEL_BUSY_POLL").is_some() {
        // The data-plane worker drives the soft device (no device thread).
        config.transport.soft.progress = uctel_transport::soft::device::ProgressMode::BusyPoll;
    }
    let running = uctel_collector::start(config).await.expect("collector");
    let mut opts = AgentOptions::new("bench");
    opts.capabilities = vec![DataPath::WriteWithImm];
    let mut agent = TestAgent::connect(running.control_addr(), opts)
        .await
        .expect("agent");
    let mut stream = MetricStream::new(1);
    // Pre-build the frames so the measurement is the transport + collector, not the framer.
    let built: Vec<_> = (0..frames).map(|i| stream.frame(i, samples)).collect();
    let bytes = built.first().map_or(0, |f| f.len());
    let start = Instant::now();
    agent.send_many(built).await;
    let fin = stream.final_state();
    agent.goodbye(vec![fin]).await;
    let ledger = eventually("ledger", || {
        let l = running.ledger("bench");
        (!l.is_empty()).then_some(l)
    })
    .await;
    let secs = start.elapsed().as_secs_f64();
    let l = ledger[0].1;
    println!(
        "frames sent {frames}, accepted {}, lost {}, frame {bytes} B, {samples} samples/frame",
        l.accepted, l.lost
    );
    println!(
        "{:.0} frames/s, {:.0} samples/s, {:.1} MB/s of frames ({secs:.2} s)",
        l.accepted as f64 / secs,
        l.records_received as f64 / secs,
        l.accepted as f64 * bytes as f64 / secs / 1e6
    );
    let text = running.render_metrics().unwrap_or_default();
    for line in text.lines().filter(|l| {
        (l.starts_with("uctel_collector_frames_dropped_total")
            || l.starts_with("uctel_collector_transport_packets_dropped_total"))
            && !l.ends_with(" 0")
    }) {
        println!("{line}");
    }
    running.stop().await.expect("stop");
}
