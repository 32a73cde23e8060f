//! The reliability class per stream through the real `uctel-collector` and `uctel-agent`
//! binaries on loopback with the soft RoCEv2 transport (DESIGN.md §8b): an agent with
//! `streams.logs.reliability: rc` and metrics on UC, 5 % of the datagrams dropped by the
//! agent's fault injector in both directions (data one way, RC acknowledgements the other).
//!
//! What it proves: every log line arrives exactly once and in order (the collector's log
//! sink holds lines 0..N in order, none lost or repeated), the RC lane's gap counter stays
//! at zero and its QP's retransmissions show the repair; the metrics stream, still on UC,
//! loses frames and counts each one, and both lanes' frames add up to what the agent sent.
//!
//! And through a data-path outage longer than the RC retry budget (every UDP datagram to the
//! collector dropped by an nft rule while the control connection stays up): the RC QP runs
//! out of retries, the agent reconnects, the log lines not acknowledged are read again from
//! the last acknowledged one, and every line arrives exactly once.

use std::time::Duration;

use uctel_tests::exposition::Scrape;
use uctel_tests::faults::{root_missing, AgentSpec, Blackhole, CollectorSpec, Law, NetNs, Row};
use uctel_tests::pipeline::{
    goodbye_figures, goodbye_frames, AgentFigures, CollectorFigures, Pipeline,
};
use uctel_tests::{exclusive, wait_for};

const UP: Duration = Duration::from_secs(90);
const STOP: Duration = Duration::from_secs(30);
const LINES: usize = 10_000;
const AGENT: &str = "rcagent";

fn tick() -> Duration {
    Duration::from_millis(200)
}

/// The numbers of the end-to-end test's lines from `AGENT` in the collector's log sink, in
/// the order it wrote them.
fn sink_line_numbers(p: &Pipeline) -> Vec<usize> {
    let path = p.path().join("collector-logs.jsonl");
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let marker = format!(" of {AGENT} from the uctel end-to-end test");
    text.lines()
        .filter_map(|l| {
            let end = l.find(&marker)?;
            let start = l[..end].rfind("line ")? + "line ".len();
            l[start..end].parse().ok()
        })
        .collect()
}

#[test]
fn logs_on_rc_arrive_once_and_in_order_at_five_percent_loss_both_ways() {
    let _g = exclusive();
    let mut p = Pipeline::start();
    let a = p.add_agent_with(AGENT, 0.05, 0.5, |y| {
        y.set("streams.logs.reliability", "rc");
        y.set("transport.soft.fault.direction", "both");
        // Protobuf metrics frames: the series dictionary packs a run's host metrics into
        // about 40 frames, and 5 % loss then misses all of them one run in nine; the UC
        // loss this test counts needs a few hundred.
        y.set("streams.metrics.series_dictionary", false);
    });
    p.wait_flowing(1, &[AGENT], &["metrics"], UP);

    // Numbered lines in bursts while host metrics flow.
    for b in 0..10 {
        p.write_lines(a, b * 1000, 1000);
        std::thread::sleep(Duration::from_millis(200));
    }
    let read = wait_for("the agent read its log lines", UP, tick(), || {
        let f = AgentFigures::read(&p.agents[a].scrape()?);
        let read = f.records_sent["logs"] + f.records_dropped["logs"];
        if read >= LINES as u64 {
            Ok(f)
        } else {
            Err(format!("{read} of {LINES}"))
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", p.agents[a].daemon.log_tail(30)));
    assert_eq!(
        read.records_dropped["logs"], 0,
        "log lines dropped at the source"
    );
    // The collector has every line before the agent stops: RC delivered them.
    wait_for("every line at the collector", UP, tick(), || {
        let n = sink_line_numbers(&p).len();
        if n >= LINES {
            Ok(())
        } else {
            Err(format!("{n} of {LINES} lines in the sink"))
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", p.collector.log_tail(40)));
    let agent_scrape: Scrape = p.agents[a]
        .scrape()
        .unwrap_or_else(|e| panic!("agent /metrics: {e}"));

    p.agents[a].daemon.stop(STOP);
    let s = wait_for("the Goodbye settled", UP, tick(), || {
        let s = p.scrape()?;
        let ended = s.count(
            "uctel_collector_sessions_ended_total",
            &[("agent", AGENT), ("reason", "goodbye")],
        );
        if ended >= 1 {
            Ok(s)
        } else {
            Err("no session ended by Goodbye yet".to_owned())
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", p.collector.log_tail(40)));

    // Logs: exactly once, in order.
    let numbers = sink_line_numbers(&p);
    let expected: Vec<usize> = (0..LINES).collect();
    if numbers != expected {
        let first_bad = numbers
            .iter()
            .zip(&expected)
            .position(|(a, b)| a != b)
            .unwrap_or(numbers.len().min(expected.len()));
        panic!(
            "the sink holds {} lines, not 0..{LINES} in order; first difference at index {first_bad}: {:?}",
            numbers.len(),
            numbers.get(first_bad..first_bad + 5)
        );
    }
    let c = CollectorFigures::read(&s, AGENT);
    assert_eq!(c.lost["logs"], 0, "{c:?}");
    assert_eq!(c.records_lost["logs"], 0, "{c:?}");
    assert_eq!(c.records_received["logs"], LINES as u64, "{c:?}");
    assert_eq!(
        s.sum("uctel_collector_rc_gap_frames_total", &[("agent", AGENT)]),
        0.0
    );
    // Metrics: still UC, the loss counted.
    let uc_lost = c.lost["metrics"] + c.lost["fast_counters"];
    assert!(uc_lost > 0, "5 % injected loss, nothing lost on UC: {c:?}");
    // Every stream: sent = received + lost (the agent's final figures).
    let bye = goodbye_figures(&p.agents[a].daemon.log());
    for name in ["metrics", "logs"] {
        let sent = bye
            .get(&format!("{name}_frames"))
            .copied()
            .unwrap_or_else(|| panic!("no {name}_frames in `goodbye sent`: {bye:?}"));
        assert_eq!(
            sent,
            c.received[name] + c.lost[name],
            "stream {name}: sent {sent}, received {} + lost {}",
            c.received[name],
            c.lost[name]
        );
    }
    // Both lanes' frames together: the agent's `frames` = received + lost at the collector.
    let sent = goodbye_frames(&p.agents[a].daemon.log());
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0], c.received_total() + c.lost_total(), "{c:?}");
    // The RC QP repaired what the injector dropped on its path.
    let retransmitted = agent_scrape.sum(
        "uctel_agent_rc_qp_events_total",
        &[("event", "packets_retransmitted")],
    );
    assert!(retransmitted > 0.0, "no RC retransmission under 5 % loss");
    eprintln!(
        "{AGENT}: {LINES} lines on RC in order; metrics lost {} of {}; fast_counters lost {}; \
         RC packets retransmitted {retransmitted}; fault drops {:?}",
        c.lost["metrics"],
        c.received["metrics"] + c.lost["metrics"],
        c.lost["fast_counters"],
        bye.get("fault_dropped")
    );
    p.collector.stop(STOP);
}

/// Logs on RC, lines written while every UDP datagram to the collector is dropped for 12 s
/// (far beyond the RC retry budget of about 0.5 s: the RC QP fails with
/// `retry_exceeded`, again at each reconnect while the outage lasts), then the path comes
/// back: every line is in the collector's sink exactly once, no log record or frame is
/// counted lost and the RC lane shows no gap (DESIGN.md §8b: a line settles when the RC QP
/// acknowledged it; the lines not acknowledged are read again after the reconnect). The
/// fault-matrix law (`Law::Exact`) judges the whole run.
#[test]
fn logs_on_rc_survive_a_data_path_outage_longer_than_the_retry_budget() {
    let _g = exclusive();
    const NAME: &str = "rc-logs-outage-12s";
    if let Some(why) = root_missing(&["nft", "ip"]) {
        eprintln!("row={NAME} SKIPPED: {why}");
        return;
    }
    let netns = NetNs::create().ok();
    let spec = CollectorSpec {
        listen_ip: netns.as_ref().map(|n| n.host_ip),
        ..CollectorSpec::default()
    };
    let mut row = Row::start(NAME, spec, netns);
    let in_netns = row.netns.is_some();
    let a = row.add_agent(
        AgentSpec {
            in_netns,
            ..AgentSpec::new("a")
        }
        .set("streams.logs.reliability", "rc"),
    );
    row.wait_connected(1, &[a]);
    let hole = Blackhole::new(row.addrs.udp.port(), row.netns.as_ref())
        .unwrap_or_else(|e| panic!("row={NAME}: {e}"));
    row.notes.push(hole.describe());
    row.write_bursts(a, 0, 1000, Duration::from_millis(100));
    row.wait_delivered(a, 0, 0..1000, Duration::from_secs(30));
    hole.engage().unwrap_or_else(|e| panic!("row={NAME}: {e}"));
    let engaged = std::time::Instant::now();
    while engaged.elapsed() < Duration::from_secs(12) {
        row.write(a, 0, 200);
        std::thread::sleep(Duration::from_millis(500));
    }
    let blackholed = hole.release().unwrap_or_else(|e| panic!("row={NAME}: {e}"));
    let outage = engaged.elapsed();
    let during = row.agents[a].written() - 1000;
    row.write_bursts(a, 0, 1000, Duration::from_millis(100));
    let written = row.agents[a].written();
    let all = row.wait_delivered(a, 0, 0..written, Duration::from_secs(120));
    row.wait_settled(a, written, Duration::from_secs(30));
    let failures = row
        .agent_last(a)
        .count("uctel_agent_rc_lane_failures_total", &[]);
    row.quiesce();
    let c = row.collector_figures("a");
    let gaps = row
        .collector_last()
        .count("uctel_collector_rc_gap_frames_total", &[("agent", "a")]);
    row.notes.push(format!(
        "UDP blackholed for {outage:.1?} ({blackholed} datagrams), {during} lines written \
         meanwhile; RC lane failures {failures}; logs: frames lost {}, records lost {}, \
         records replayed (sent again, delivered once) {}",
        c.lost["logs"],
        c.records_lost["logs"],
        row.collector_last().count(
            "uctel_collector_records_replayed_total",
            &[("agent", "a"), ("stream", "logs")]
        )
    ));
    row.expect(
        blackholed > 0 && failures > 0,
        format!("the outage failed the RC QP: {blackholed} datagrams dropped, {failures} RC lane failures"),
    );
    row.expect(all, format!("every one of the {written} lines in the sink"));
    row.expect(
        c.lost["logs"] == 0 && c.records_lost["logs"] == 0 && gaps == 0,
        format!(
            "logs on RC: frames lost {}, records lost {}, rc_gap_frames {gaps} (want 0)",
            c.lost["logs"], c.records_lost["logs"]
        ),
    );
    row.verdict(Law::Exact);
    drop(hole);
}

/// The number `field=…` of each of the agent's "connected to the collector" lines, one per
/// session.
fn sessions_started(log: &str, field: &str) -> Vec<Option<u64>> {
    log.lines()
        .map(uctel_tests::pipeline::strip_ansi)
        .filter(|l| l.contains("connected to the collector"))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|t| t.split_once('='))
                .find(|(k, _)| *k == field)
                .and_then(|(_, v)| v.parse().ok())
        })
        .collect()
}

/// A burst of 20,000 log lines on RC at the default window settings arrives whole, exactly
/// once, with nothing lost on the RC lane, twice: in the first session (the ring sized from
/// `collector.expected_frames_per_second`), and after a reconnect (a 2 s data-path outage
/// fails the RC QP), whose `Hello` announces the rate the RC lane needed, so its ring and
/// window fit the burst: the RC lane is sized by the same rule as the UC lane, from the
/// frames of both lanes (DESIGN.md §4, §8b). The times are printed (no assertion on speed).
#[test]
fn a_burst_of_20000_lines_on_rc_arrives_at_default_settings() {
    let _g = exclusive();
    const NAME: &str = "rc-logs-burst-20000";
    const LINES: u64 = 20_000;
    const OUTAGE_LINES: u64 = 100;
    if let Some(why) = root_missing(&["nft"]) {
        eprintln!("row={NAME} SKIPPED: {why}");
        return;
    }
    let mut row = Row::start(NAME, CollectorSpec::default(), None);
    let a = row.add_agent(AgentSpec::new("a").set("streams.logs.reliability", "rc"));
    row.wait_connected(1, &[a]);
    let began = std::time::Instant::now();
    row.write(a, 0, LINES);
    let first = row.wait_delivered(a, 0, 0..LINES, Duration::from_secs(300));
    let took_first = began.elapsed();
    // A data-path outage fails the RC QP: the agent reconnects with a new Hello.
    let hole =
        Blackhole::new(row.addrs.udp.port(), None).unwrap_or_else(|e| panic!("row={NAME}: {e}"));
    hole.engage().unwrap_or_else(|e| panic!("row={NAME}: {e}"));
    // Lines to send while the path is down (read again after the reconnect).
    row.write(a, 0, OUTAGE_LINES);
    std::thread::sleep(Duration::from_secs(2));
    hole.release().unwrap_or_else(|e| panic!("row={NAME}: {e}"));
    let windows =
        uctel_tests::wait_for("a second session", Duration::from_secs(60), tick(), || {
            let w = sessions_started(&row.agents[a].daemon.log(), "rc_credit_window");
            if w.len() >= 2 {
                Ok(w)
            } else {
                Err(format!("{} sessions", w.len()))
            }
        })
        .unwrap_or_else(|e| panic!("{e}"));
    row.wait_connected(1, &[a]);
    let began = std::time::Instant::now();
    row.write(a, 0, LINES);
    let total = 2 * LINES + OUTAGE_LINES;
    let second = row.wait_delivered(a, 0, 0..total, Duration::from_secs(300));
    let took_second = began.elapsed();
    row.wait_settled(a, total, Duration::from_secs(30));
    let announced = sessions_started(&row.agents[a].daemon.log(), "announced_frames_per_second");
    row.quiesce();
    let c = row.collector_figures("a");
    let gaps = row
        .collector_last()
        .count("uctel_collector_rc_gap_frames_total", &[("agent", "a")]);
    let rate = |took: Duration| LINES as f64 / took.as_secs_f64();
    eprintln!(
        "{LINES} lines on RC at default settings: first session (RC window {:?}) {took_first:.1?} \
         ({:.0} lines/s); after the reconnect (announced {:?} frames/s, RC window {:?}) \
         {took_second:.1?} ({:.0} lines/s)",
        windows[0],
        rate(took_first),
        announced.last().copied().flatten(),
        windows.last().copied().flatten(),
        rate(took_second),
    );
    row.notes.push(format!(
        "bursts of {LINES} lines: {took_first:.1?} (RC windows per session {windows:?}), then \
         {took_second:.1?}"
    ));
    row.expect(
        first && second,
        format!("both bursts of {LINES} lines in the sink"),
    );
    let (w0, w1) = (windows[0].unwrap_or(0), windows[1].unwrap_or(0));
    row.expect(
        w1 > w0,
        format!("the RC window grows to the burst after a reconnect: {w0} then {w1}"),
    );
    row.expect(
        c.records_lost["logs"] == 0 && gaps == 0,
        format!(
            "logs on RC: records lost {}, rc_gap_frames {gaps} (want 0)",
            c.records_lost["logs"]
        ),
    );
    row.verdict(Law::Exact);
    drop(hole);
}
