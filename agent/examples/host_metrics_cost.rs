//! Prints the number of host-metric samples one collection produces on this machine and the
//! time it takes (median of several runs).
//!
//! `cargo run --release -p uctel-agent --example host_metrics_cost`

use std::time::Instant;

use uctel_agent::sources::host::HostMetrics;

fn main() {
    let mut host = HostMetrics::default();
    let first = host.collect();
    for e in &first.errors {
        eprintln!("error: {e}");
    }
    let mut times = Vec::new();
    let mut samples = 0;
    for _ in 0..50 {
        let t = Instant::now();
        let c = host.collect();
        times.push(t.elapsed());
        samples = c.metrics.len();
    }
    times.sort();
    let bytes: usize = first.metrics.iter().map(prost::Message::encoded_len).sum();
    let bare: usize = first
        .metrics
        .iter()
        .map(|m| {
            let mut m = m.clone();
            m.help.clear();
            prost::Message::encoded_len(&m)
        })
        .sum();
    println!(
        "samples per collection: {samples}; protobuf bytes: {bytes} with help, {bare} without; time: min {:?}, median {:?}, max {:?}",
        times[0],
        times[times.len() / 2],
        times[times.len() - 1]
    );
    let mut by_prefix = std::collections::BTreeMap::<String, usize>::new();
    for m in &first.metrics {
        let key: String = m.name.split('_').take(2).collect::<Vec<_>>().join("_");
        *by_prefix.entry(key).or_default() += 1;
    }
    println!("{by_prefix:?}");
}
