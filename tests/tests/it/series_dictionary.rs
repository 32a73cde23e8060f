//! The series dictionary (`uctel_protocol::dict`) through the real binaries.
//!
//! * Under 20 % loss, duplication and reordering on the wire, with series that come and go
//!   every collection (a textfile whose series change each round), every sample the
//!   collector serves is under its own name: each probe series' value encodes its own
//!   label, so a sample decoded under another series' name shows at once. The metrics
//!   stream's accounting is exact after the agent's `Goodbye`, and nothing is dropped as
//!   malformed (a frame never references a series the collector does not know).
//! * Negotiation: a new agent with a collector that does not take the dictionary, and an
//!   agent that does not ask for it with a new collector, keep sending `kind = metrics`
//!   frames, and the series flow.

use std::path::Path;
use std::time::Duration;

use uctel_tests::pipeline::{goodbye_figures, CollectorFigures, Pipeline};
use uctel_tests::{exclusive, wait_for};

const UP: Duration = Duration::from_secs(60);
const STOP: Duration = Duration::from_secs(20);
const PROBE: &str = "uctel_dict_probe";

/// Writes the probe series `ids` of `round` into `dir` (atomically, as the textfile
/// convention asks): `uctel_dict_probe{i="N"} N*1000+round`.
fn write_probes(dir: &Path, round: u64, ids: impl Iterator<Item = u64>) {
    let mut text =
        format!("# HELP {PROBE} A probe whose value names its series.\n# TYPE {PROBE} gauge\n");
    for i in ids {
        text.push_str(&format!("{PROBE}{{i=\"{i}\"}} {}\n", i * 1000 + round));
    }
    let tmp = dir.join("probe.prom.tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, dir.join("probe.prom")).unwrap();
}

/// Every probe sample of `agent` in a collector scrape is under its own series: its value
/// divided by 1000 is its `i` label. Returns how many there are.
fn check_names(p: &Pipeline, agent: &str) -> usize {
    let s = p.scrape().expect("scrape");
    let mut n = 0;
    for smp in s.select(PROBE, &[("agent", agent)]) {
        let i: f64 = smp.label("i").unwrap().parse().unwrap();
        assert_eq!(
            (smp.value / 1000.0).floor(),
            i,
            "a sample under a wrong name: {PROBE}{{i=\"{i}\"}} = {}",
            smp.value
        );
        n += 1;
    }
    n
}

fn log_says(log: &str, key_value: &str) -> bool {
    log.lines()
        .any(|l| l.contains("connected to the collector") && l.contains(key_value))
}

#[test]
fn no_sample_under_a_wrong_name_under_loss_duplication_reordering_and_churn() {
    let _g = exclusive();
    let mut p = Pipeline::start();
    let dir = p.path().join("textfile");
    std::fs::create_dir_all(&dir).unwrap();
    write_probes(&dir, 0, 0..40);
    let textfile = dir.display().to_string();
    let i = p.add_agent_with("dict", 0.2, 0.5, |y| {
        y.set("sources.textfile.directory", textfile.as_str())
            .set("sources.textfile.interval_seconds", 0.5)
            .set("transport.soft.fault.duplicate_ratio", 0.1)
            .set("transport.soft.fault.reorder_ratio", 0.1)
            .set("transport.soft.fault.reorder_window", 3)
            .set("transport.soft.fault.seed", 43);
    });
    p.wait_flowing(1, &["dict"], &["metrics"], UP);
    let mut seen = 0;
    for round in 1..=24u64 {
        // Churn: each round one series goes and two come; every sixth round a third of
        // them are replaced at once.
        let start = round + if round % 6 == 0 { 13 } else { 0 };
        write_probes(&dir, round, start..start + 40 + round);
        std::thread::sleep(Duration::from_millis(600));
        seen = seen.max(check_names(&p, "dict"));
    }
    assert!(seen >= 40, "probe series at the collector: {seen}");
    let agent_log = p.agents[i].daemon.log();
    assert!(
        log_says(&agent_log, "series_dictionary=true"),
        "the dictionary was not agreed:\n{}",
        p.agents[i].daemon.log_tail(30)
    );
    p.agents[i].daemon.stop(STOP);
    let sent = goodbye_figures(&p.agents[i].daemon.log());
    let c = wait_for("connection settled", UP, Duration::from_millis(200), || {
        let s = p.scrape()?;
        let ended = s.count(
            "uctel_collector_sessions_ended_total",
            &[("agent", "dict"), ("reason", "goodbye")],
        );
        (ended == 1)
            .then(|| CollectorFigures::read(&s, "dict"))
            .ok_or_else(|| "no goodbye yet".to_owned())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", p.collector.log_tail(30)));
    assert_eq!(
        c.dropped.get("malformed_payload").copied().unwrap_or(0),
        0,
        "{c:?}"
    );
    let frames = sent["metrics_frames"];
    let records = sent["metrics_records"];
    assert_eq!(
        c.received["metrics"] + c.lost["metrics"] + c.dropped_after_tracking(),
        frames,
        "{c:?} {sent:?}"
    );
    assert_eq!(
        c.records_received["metrics"] + c.records_lost["metrics"],
        records,
        "{c:?} {sent:?}"
    );
    assert!(
        c.lost["metrics"] > 0,
        "no loss injected, the test proves nothing: {c:?}"
    );
    println!(
        "series dictionary: {frames} metrics frames, {} lost, {records} samples, {} lost",
        c.lost["metrics"], c.records_lost["metrics"]
    );
}

/// One agent against one collector, `agent_side` / `collector_side` the
/// `series_dictionary` keys: the probes flow, and the agent logs what was agreed.
fn negotiate(agent_side: bool, collector_side: bool) {
    let _g = exclusive();
    let mut p = Pipeline::start_with(|y, _| {
        y.set("metrics.series_dictionary", collector_side);
    });
    let dir = p.path().join("textfile");
    std::fs::create_dir_all(&dir).unwrap();
    write_probes(&dir, 1, 0..10);
    let textfile = dir.display().to_string();
    let i = p.add_agent_with("neg", 0.0, 0.5, |y| {
        y.set("sources.textfile.directory", textfile.as_str())
            .set("sources.textfile.interval_seconds", 0.5)
            .set("streams.metrics.series_dictionary", agent_side);
    });
    p.wait_flowing(1, &["neg"], &["metrics"], UP);
    wait_for(
        "probes at the collector",
        UP,
        Duration::from_millis(200),
        || {
            let n = check_names(&p, "neg");
            (n == 10).then_some(()).ok_or(format!("{n} probes"))
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", p.collector.log_tail(30)));
    let agreed = agent_side && collector_side;
    let log = p.agents[i].daemon.log();
    assert!(
        log_says(&log, &format!("series_dictionary={agreed}")),
        "{}",
        p.agents[i].daemon.log_tail(30)
    );
}

#[test]
fn a_dictionary_agent_with_a_collector_that_does_not_take_it_sends_plain_frames() {
    negotiate(true, false);
}

#[test]
fn an_agent_that_does_not_ask_gets_plain_frames_taken() {
    negotiate(false, true);
}
