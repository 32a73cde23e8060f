//! The fault matrix: one row per fault, through the real `uctel-collector` and `uctel-agent`
//! binaries (soft RoCEv2 transport, configs derived from `config/*.yaml`, free ports), every
//! row judged by the same law ([`uctel_tests::faults::Row::verdict`]):
//!
//! - **records**, per agent, log stream: lines written by the source = lines delivered to the
//!   collector's JSON Lines sink (distinct) + `uctel_collector_records_lost_total` +
//!   `uctel_collector_records_dropped_total{reason="log_sink_error"}` +
//!   `uctel_agent_records_dropped_total{stream="logs",reason}`; nothing delivered twice,
//!   nothing delivered that was not written, every delivered line byte for byte the line
//!   written. Where a daemon is SIGKILLed (no Goodbye) the exact count is unknowable and
//!   the law is `delivered + lost + dropped ≤ written`.
//! - **frames and records**, per agent and stream, for the sessions that ended with Goodbye
//!   (the README's sum rule): the agent's `goodbye sent` figures = collector received + lost
//!   (+ dropped after tracking); per connection sent = received + dropped + connection lost.
//! - no daemon log says `panicked`; every `*_total` counter of every scrape of a process is
//!   monotonic; peak RSS of each daemon below a generous bound; the collector still serves
//!   `/metrics` after the fault (and each agent before its SIGTERM).
//! - the outputs' sum rules on every collector scrape (`faults::output_sum_failures`):
//!   per remote-write endpoint `samples_in = sent + dropped + failed + pending`, for
//!   ClickHouse `rows_in = inserted + dropped + pending`; the output rows (receiver outage,
//!   receiver refusing, ClickHouse restart) add what the receiver holds.
//!
//! Quiescence is the README's: each agent settles, gets SIGTERM and sends Goodbye (the
//! collector then settles tail loss), the collector closes the sessions.
//!
//! Every row prints its seed (`UCTEL_FAULT_SEED=<seed>` reruns it with the same faults,
//! padding and bursts) and its table; a failing row panics with the seed, the failed checks
//! and the table of every term. Rows that need root (nft, network namespaces, tmpfs) print
//! `SKIPPED` and return when not root. The rows run one at a time.
//!
//! The rows assert the correct behaviour (DESIGN.md, README "Loss accounting"), not what
//! the code did when they were written: a row that fails names the checks and the counters
//! that disagree.

use std::time::Duration;

use nix::sys::signal::Signal;
use uctel_tests::exclusive;
use uctel_tests::faults::{root_missing, AgentSpec, Blackhole, CollectorSpec, Law, NetNs, Row};

/// Gap between bursts of lines.
const GAP: Duration = Duration::from_millis(100);
/// How long an agent gets to read and send what was written.
const SETTLE: Duration = Duration::from_secs(15);

fn skip(row: &str, why: &str) {
    eprintln!("row={row} SKIPPED: {why}");
}

/// A row with one agent whose soft transport injects `fault` (`transport.soft.fault.*`,
/// seeded with the row's seed): 3000 lines in seeded bursts while host metrics flow.
fn link_row(name: &str, fault: &[(&str, serde_yaml::Value)]) -> Row {
    let mut row = Row::start(name, CollectorSpec::default(), None);
    let mut spec = AgentSpec::new("a");
    for (k, v) in fault {
        spec = spec.fault(k, v.clone());
    }
    let a = row.add_agent(spec);
    row.wait_connected(1, &[a]);
    row.write_bursts(a, 0, 3000, GAP);
    row.wait_settled(a, 3000, SETTLE);
    row.quiesce();
    row
}

/// A row with the default collector and one agent, `a`, connected.
fn one_agent_row(name: &str) -> (Row, usize) {
    let mut row = Row::start(name, CollectorSpec::default(), None);
    let a = row.add_agent(AgentSpec::new("a"));
    row.wait_connected(1, &[a]);
    (row, a)
}

/// Frames the collector counted lost for agent `a`, and the packets its fault injector
/// dropped (Goodbye figures).
fn lost_and_injected(row: &Row) -> (u64, u64) {
    (
        row.collector_figures("a").lost_total(),
        row.goodbye_sum("a", "fault_dropped"),
    )
}

#[test]
fn uc_drop_0_percent() {
    let _g = exclusive();
    let mut row = link_row("drop-0pct", &[]);
    let (lost, _) = lost_and_injected(&row);
    let c = row.collector_figures("a");
    row.expect(
        lost == 0 && c.dropped_total() == 0,
        format!(
            "clean loopback: {lost} frames lost, {} dropped (want 0)",
            c.dropped_total()
        ),
    );
    row.verdict(Law::Exact);
}

#[test]
fn uc_drop_1_percent() {
    let _g = exclusive();
    let mut row = link_row("drop-1pct", &[("drop_ratio", 0.01.into())]);
    let (lost, injected) = lost_and_injected(&row);
    row.expect(
        lost == injected,
        format!(
            "one packet per frame: frames lost {lost} == packets the injector dropped {injected}"
        ),
    );
    row.verdict(Law::Exact);
}

#[test]
fn uc_drop_20_percent() {
    let _g = exclusive();
    let mut row = link_row("drop-20pct", &[("drop_ratio", 0.2.into())]);
    let (lost, injected) = lost_and_injected(&row);
    let c = row.collector_figures("a");
    row.expect(
        injected > 0 && lost == injected && c.records_lost["logs"] > 0,
        format!(
            "frames lost {lost} == injector drops {injected} > 0, log records lost {}",
            c.records_lost["logs"]
        ),
    );
    row.verdict(Law::Exact);
}

/// A row whose collector has `set` (dotted keys) and whose agent drops 5 % of its datagrams.
fn collector_row(name: &str, set: Vec<(String, serde_yaml::Value)>) -> Row {
    let spec = CollectorSpec {
        set,
        ..CollectorSpec::default()
    };
    let mut row = Row::start(name, spec, None);
    let a = row.add_agent(AgentSpec::new("a").fault("drop_ratio", 0.05));
    row.wait_connected(1, &[a]);
    row.write_bursts(a, 0, 3000, GAP);
    row.wait_settled(a, 3000, SETTLE);
    row.quiesce();
    row
}

/// The collector's soft device on a thread of its own (`transport.soft.progress: thread`;
/// the default is the worker running it): the same exact accounting through the hand-off
/// from the device thread to the worker.
#[test]
fn uc_drop_5_percent_collector_device_thread() {
    let _g = exclusive();
    let set = vec![("transport.soft.progress".into(), "thread".into())];
    let mut row = collector_row("drop-5pct-device-thread", set);
    let (lost, injected) = lost_and_injected(&row);
    row.expect(
        injected > 0 && lost == injected,
        format!("frames lost {lost} == injector drops {injected} > 0"),
    );
    row.verdict(Law::Exact);
}

/// Drops at both ends: the agent's injector drops 5 % of what it sends, the collector's
/// (inside the worker's receive round, `progress: worker`) 5 % of what it receives. The
/// exact law holds, and the frames lost exceed the agent's drops (the collector's injector
/// exports no count, so its share is not checked one by one).
#[test]
fn uc_drop_5_percent_at_both_ends() {
    let _g = exclusive();
    let set = vec![
        ("transport.soft.progress".into(), "worker".into()),
        ("transport.soft.fault.drop_ratio".into(), 0.05.into()),
        ("transport.soft.fault.direction".into(), "recv".into()),
        ("transport.soft.fault.seed".into(), 11.into()),
    ];
    let mut row = collector_row("drop-5pct-both-ends", set);
    let (lost, injected) = lost_and_injected(&row);
    row.expect(
        injected > 0 && lost > injected,
        format!(
            "frames lost {lost} > the agent's injector drops {injected} > 0 (the collector's \
             injector dropped the rest)"
        ),
    );
    row.verdict(Law::Exact);
}

#[test]
fn uc_duplicate() {
    let _g = exclusive();
    let mut row = link_row("duplicate", &[("duplicate_ratio", 0.1.into())]);
    let s = row.collector_last();
    let dups = s.count("uctel_collector_frames_duplicate_total", &[("agent", "a")]);
    let injected = row.agent_last(0).count(
        "uctel_agent_fault_packets_total",
        &[("action", "duplicated")],
    );
    row.expect(
        dups > 0,
        format!("collector frames_duplicate_total {dups} (injector duplicated {injected}+)"),
    );
    row.verdict(Law::Exact);
}

#[test]
fn uc_reorder() {
    let _g = exclusive();
    let mut row = link_row(
        "reorder",
        &[("reorder_ratio", 0.1.into()), ("reorder_window", 4.into())],
    );
    let s = row.collector_last();
    let late = s.count("uctel_collector_frames_late_total", &[("agent", "a")]);
    row.expect(late > 0, format!("collector frames_late_total {late}"));
    row.verdict(Law::Exact);
}

#[test]
fn uc_corrupt() {
    let _g = exclusive();
    let mut row = link_row("corrupt", &[("corrupt_ratio", 0.05.into())]);
    let s = row.collector_last();
    let c = row.collector_figures("a");
    let transport = s.count("uctel_collector_transport_packets_dropped_total", &[]);
    let corrupted = row.agent_last(0).count(
        "uctel_agent_fault_packets_total",
        &[("action", "corrupted")],
    );
    let reasons: Vec<String> = c
        .dropped
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(r, n)| format!("{r}={n}"))
        .collect();
    row.expect(
        corrupted > 0 && c.dropped_total() + transport + c.lost_total() > 0,
        format!(
            "injector corrupted {corrupted}+ packets; collector dropped {reasons:?} for the agent, {transport} at the device (no agent), lost {}",
            c.lost_total()
        ),
    );
    row.verdict(Law::Exact);
}

/// The logs stream on RC (`streams.logs.reliability: rc`, DESIGN.md §8b), metrics on UC, 5 %
/// of the agent's datagrams dropped both ways (data, and the RC acknowledgements coming
/// back): no log frame or record lost, no gap on the RC lane, what the UC streams lose
/// counted, the RC QP's retransmissions exported; everything exact.
#[test]
fn rc_logs_drop_5_percent_both_ways() {
    let _g = exclusive();
    let mut row = Row::start("rc-logs-drop-5pct", CollectorSpec::default(), None);
    let spec = AgentSpec::new("a")
        .set("streams.logs.reliability", "rc")
        .fault("drop_ratio", 0.05)
        .fault("direction", "both");
    let a = row.add_agent(spec);
    row.wait_connected(1, &[a]);
    row.write_bursts(a, 0, 3000, GAP);
    row.wait_settled(a, 3000, SETTLE);
    let retransmitted = row.agent_last(a).count(
        "uctel_agent_rc_qp_events_total",
        &[("event", "packets_retransmitted")],
    );
    row.quiesce();
    let c = row.collector_figures("a");
    let gaps = row
        .collector_last()
        .count("uctel_collector_rc_gap_frames_total", &[("agent", "a")]);
    row.expect(
        c.lost["logs"] == 0 && c.records_lost["logs"] == 0 && gaps == 0,
        format!(
            "logs on RC: frames lost {}, records lost {}, rc_gap_frames {gaps} (want 0)",
            c.lost["logs"], c.records_lost["logs"]
        ),
    );
    // What the UC streams lose is counted (the law's identities); a few dozen UC frames at
    // 5 % may lose none, so no count is required.
    row.notes.push(format!(
        "UC streams: metrics lost {}, fast_counters lost {}",
        c.lost["metrics"], c.lost["fast_counters"]
    ));
    row.expect(
        retransmitted > 0,
        format!("agent RC QP packets_retransmitted {retransmitted}"),
    );
    row.verdict(Law::Exact);
}

/// SIGKILL of the agent while lines flow, lines written while it is down, a restart with
/// the same state directory: no line repeated, what is unaccounted is the killed session's
/// unknowable tail.
#[test]
fn agent_sigkill_and_restart() {
    let _g = exclusive();
    let (mut row, a) = one_agent_row("agent-sigkill");
    row.write_bursts(a, 0, 1500, GAP);
    // Kill while a last burst is being read and sent: lines posted whose offsets the
    // agent may not have checkpointed yet.
    row.write(a, 0, 1000);
    let pause = row.rng.range(40, 100);
    std::thread::sleep(Duration::from_millis(pause));
    row.notes.push(format!(
        "SIGKILL {pause} ms after the last burst was written"
    ));
    row.kill_agent(a);
    // The collector ends the session (control connection closed without Goodbye).
    let _ = uctel_tests::wait_for(
        "session of the killed agent closed",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || {
            let s = row.scrape_collector()?;
            match s.count("uctel_collector_agents_connected", &[]) {
                0 => Ok(()),
                n => Err(format!("agents_connected {n}")),
            }
        },
    );
    // The frame rule can only count the sessions after the kill.
    row.frame_baseline();
    row.write(a, 0, 500);
    row.restart_agent(a);
    row.wait_connected(1, &[a]);
    row.write_bursts(a, 0, 500, GAP);
    // The new life reads at least what was written after the kill.
    row.wait_settled(a, 1000, SETTLE);
    row.quiesce();
    let s = row.collector_last();
    if s.has("uctel_collector_sessions_ended_total", &[]) {
        let n = s.count(
            "uctel_collector_sessions_ended_total",
            &[("agent", "a"), ("reason", "no_goodbye")],
        );
        row.expect(
            n >= 1,
            format!("the collector reports {n} session(s) of a ended without Goodbye"),
        );
    }
    // What is unaccounted is the killed session's tail: frames the agent posted after the
    // last one the collector received. It should be bounded by a collector counter of the
    // unknown tail of sessions that ended without Goodbye (for example
    // `uctel_collector_records_unknown_total{agent,stream}`, fed by heartbeats that carry
    // the agent's stream sequences, DESIGN.md §6). No such metric exists yet: the verdict
    // asserts the inequality and uses such a metric as the bound once it appears
    // (`faults::UNKNOWN_TAIL_HINT`).
    row.verdict(Law::AtMost);
}

/// SIGKILL of the collector with lines in flight, lines written while it is down, a restart:
/// the agent reconnects (new epoch), nothing is repeated, the rest is the dead session's
/// unknowable tail.
#[test]
fn collector_sigkill_and_restart() {
    let _g = exclusive();
    let (mut row, a) = one_agent_row("collector-sigkill");
    row.write_bursts(a, 0, 1000, GAP);
    row.wait_delivered(a, 0, 0..1000, SETTLE);
    row.write(a, 0, 500);
    let pause = row.rng.range(40, 160);
    std::thread::sleep(Duration::from_millis(pause));
    row.notes
        .push(format!("collector SIGKILL {pause} ms after the last burst"));
    row.kill_collector();
    row.write_bursts(a, 0, 500, GAP);
    std::thread::sleep(Duration::from_secs(1));
    row.restart_collector();
    row.wait_connected(1, &[a]);
    row.write_bursts(a, 0, 500, GAP);
    row.wait_settled(a, 2500, SETTLE);
    row.quiesce();
    let reconnects = row.agent_last(a).count("uctel_agent_reconnects_total", &[]);
    row.expect(
        reconnects >= 1,
        format!("agent reconnected {reconnects} time(s)"),
    );
    // What is unaccounted went to the dead collector (posted, never reported consumed) or
    // died in its memory. Only the agent can know the first part: it should be bounded by an
    // agent counter of records posted but never confirmed when a session ends without
    // Goodbye (for example `uctel_agent_records_unconfirmed_total{stream}`). No such metric
    // exists yet: the inequality is asserted, and such a metric is the bound once it
    // appears (`faults::UNKNOWN_TAIL_HINT`).
    row.verdict(Law::AtMost);
}

/// The collector frozen for 10 s (SIGSTOP) while the agent keeps writing, then SIGCONT: one
/// session throughout (heartbeat timeouts are 15 s), everything accounted exactly.
#[test]
fn collector_sigstop_10s() {
    let _g = exclusive();
    let (mut row, a) = one_agent_row("collector-sigstop");
    row.write_bursts(a, 0, 1000, GAP);
    row.wait_delivered(a, 0, 0..1000, SETTLE);
    row.collector.signal(Signal::SIGSTOP);
    let stopped = std::time::Instant::now();
    row.write_bursts(a, 0, 1500, Duration::from_millis(300));
    if let Some(rest) = Duration::from_secs(10).checked_sub(stopped.elapsed()) {
        std::thread::sleep(rest);
    }
    row.collector.signal(Signal::SIGCONT);
    row.notes
        .push(format!("collector stopped for {:.1?}", stopped.elapsed()));
    row.write_bursts(a, 0, 500, GAP);
    row.wait_settled(a, 3000, SETTLE);
    row.quiesce();
    row.verdict(Law::Exact);
}

/// A row whose agents can be put in a network namespace of their own, the collector
/// listening on the namespace's host side, so that a [`Blackhole`] rule there cuts their
/// UDP path alone; without namespaces (or with `UCTEL_FAULT_BLACKHOLE=loopback`, which
/// takes this fallback on purpose) the rule goes on loopback, as the row's notes say.
fn blackhole_row(name: &str) -> Row {
    let (netns, ns_note) = if std::env::var("UCTEL_FAULT_BLACKHOLE").as_deref() == Ok("loopback") {
        (
            None,
            Some("UCTEL_FAULT_BLACKHOLE=loopback: rule on loopback".to_owned()),
        )
    } else {
        match NetNs::create() {
            Ok(n) => (Some(n), None),
            Err(e) => (
                None,
                Some(format!("no network namespace ({e}): rule on loopback")),
            ),
        }
    };
    let spec = CollectorSpec {
        listen_ip: netns.as_ref().map(|n| n.host_ip),
        ..CollectorSpec::default()
    };
    let mut row = Row::start(name, spec, netns);
    row.notes.extend(ns_note);
    row
}

/// Every UDP datagram to the collector dropped by an nft rule for ~3 s while lines flow
/// (the agent in its own network namespace, the rule there; on loopback where namespaces
/// are not available), then the path comes back: the gap is counted as loss, exactly.
#[test]
fn udp_path_blackholed() {
    let _g = exclusive();
    const NAME: &str = "udp-blackhole";
    if let Some(why) = root_missing(&["nft", "ip"]) {
        return skip(NAME, &why);
    }
    let mut row = blackhole_row(NAME);
    let in_netns = row.netns.is_some();
    let a = row.add_agent(AgentSpec {
        in_netns,
        ..AgentSpec::new("a")
    });
    row.wait_connected(1, &[a]);
    let hole = Blackhole::new(row.addrs.udp.port(), row.netns.as_ref())
        .unwrap_or_else(|e| panic!("row={NAME}: {e}"));
    row.notes.push(hole.describe());
    row.write_bursts(a, 0, 1000, GAP);
    row.wait_delivered(a, 0, 0..1000, SETTLE);
    hole.engage().unwrap_or_else(|e| panic!("row={NAME}: {e}"));
    let engaged = std::time::Instant::now();
    row.write_bursts(a, 0, 1000, GAP);
    if let Some(rest) = Duration::from_secs(3).checked_sub(engaged.elapsed()) {
        std::thread::sleep(rest);
    }
    let blackholed = hole.release().unwrap_or_else(|e| panic!("row={NAME}: {e}"));
    row.notes
        .push(format!("UDP blackholed for {:.1?}", engaged.elapsed()));
    row.write_bursts(a, 0, 500, GAP);
    row.wait_settled(a, 2500, SETTLE);
    row.quiesce();
    let c = row.collector_figures("a");
    row.expect(
        blackholed > 0 && c.lost_total() > 0,
        format!(
            "nft dropped {blackholed} datagrams; collector frames lost {}",
            c.lost_total()
        ),
    );
    row.verdict(Law::Exact);
    drop(hole);
}

/// The sink's file system fills up (a 256 KiB tmpfs) while 3000 lines arrive, then gets room
/// again (remounted at 16 MiB) and 500 more lines arrive: every record is delivered or
/// counted `log_sink_error`, and the sink writes again once there is room.
#[test]
fn disk_full_under_log_sink() {
    let _g = exclusive();
    const NAME: &str = "disk-full";
    if let Some(why) = root_missing(&["mount", "umount"]) {
        return skip(NAME, &why);
    }
    let spec = CollectorSpec {
        sink_tmpfs_kib: Some(256),
        ..CollectorSpec::default()
    };
    let mut row = Row::start(NAME, spec, None);
    let a = row.add_agent(AgentSpec::new("a"));
    row.wait_connected(1, &[a]);
    row.write_bursts(a, 0, 3000, GAP);
    row.wait_settled(a, 3000, SETTLE);
    std::thread::sleep(Duration::from_millis(500));
    let s = row.scrape_collector().unwrap_or_default();
    let sink_errors = s.count(
        "uctel_collector_records_dropped_total",
        &[("agent", "a"), ("reason", "log_sink_error")],
    );
    if let Some(fs) = &row.tmpfs {
        fs.resize(16 * 1024)
            .unwrap_or_else(|e| panic!("row={NAME}: {e}"));
    }
    row.write_bursts(a, 0, 500, GAP);
    let recovered = row.wait_delivered(a, 0, 3000..3500, SETTLE);
    row.quiesce();
    row.expect(
        sink_errors > 0,
        format!("log_sink_error {sink_errors} while the disk was full"),
    );
    row.expect(
        recovered,
        "every line written after the disk got room again is in the sink",
    );
    row.verdict(Law::Exact);
}

/// How a log file is rotated while the agent is down.
#[derive(Debug, Clone, Copy)]
enum Rotation {
    /// `mv app.log app.log.1; create app.log` (glob `app.log*`: the rotated file is found).
    Create,
    /// More lines, then `cp app.log app.log.1; : > app.log`, then more bytes than before
    /// (the size passes the old offset again). The glob `app.log*` matches the copy: a copy
    /// made while the agent was down must be recognised (resumed at the checkpoint, not read
    /// again), so the lines written before the copy are delivered once.
    CopyTruncate,
    /// `: > app.log`, then fewer bytes than before.
    Truncate,
    /// A new file `other.log` appears (glob `*.log`), and app.log grows.
    NewFile,
}

/// 800 lines read and delivered, agent SIGTERM (Goodbye, checkpoint), the rotation and
/// more lines while it is down, agent restart: every line delivered exactly once. The log
/// source has `start_at: end`, the production default, which applies to the very first run
/// only (DESIGN.md §7): a file the restarted agent finds without a matching checkpoint (new,
/// or emptied while it was down) is read from its beginning.
fn rotation_row(name: &str, mode: Rotation) {
    let glob = match mode {
        Rotation::Create | Rotation::CopyTruncate => "app.log*",
        Rotation::Truncate => "app.log",
        Rotation::NewFile => "*.log",
    };
    let mut row = Row::start(name, CollectorSpec::default(), None);
    let a = row.add_agent(AgentSpec {
        glob: Some(glob.into()),
        ..AgentSpec::new("app")
    });
    row.wait_connected(1, &[a]);
    row.write_bursts(a, 0, 800, GAP);
    row.wait_delivered(a, 0, 0..800, SETTLE);
    row.stop_agent(a);
    // The collector closes the session before the restart (a restart racing the close is
    // the row `agent_restart_right_after_goodbye`).
    row.wait_sessions_closed(Duration::from_secs(10));
    let input = row.input();
    let before = row.agents[a].written();
    match mode {
        Rotation::Create => {
            row.write(a, 0, 300);
            row.agents[a].sources[0].rotate_create(&input.join("app.log.1"));
            row.write(a, 0, 300);
        }
        Rotation::CopyTruncate => {
            row.write(a, 0, 300);
            row.agents[a].sources[0].rotate_copytruncate(&input.join("app.log.1"));
            row.write(a, 0, 1000);
        }
        Rotation::Truncate => {
            row.agents[a].sources[0].truncate();
            row.write(a, 0, 300);
        }
        Rotation::NewFile => {
            let other = row.add_source(a, "other", "other.log");
            row.write(a, other, 400);
            row.write(a, 0, 200);
        }
    }
    let during = row.agents[a].written() - before;
    row.notes.push(format!(
        "{mode:?} rotation and {during} lines while the agent was down"
    ));
    row.restart_agent(a);
    row.wait_connected(1, &[a]);
    row.wait_settled(a, during, Duration::from_secs(5));
    row.quiesce();
    row.verdict(Law::Exact);
}

#[test]
fn rotation_create_during_downtime() {
    let _g = exclusive();
    rotation_row("rotate-create", Rotation::Create);
}

#[test]
fn rotation_copytruncate_during_downtime() {
    let _g = exclusive();
    rotation_row("rotate-copytruncate", Rotation::CopyTruncate);
}

#[test]
fn rotation_truncate_in_place_during_downtime() {
    let _g = exclusive();
    rotation_row("rotate-truncate", Rotation::Truncate);
}

#[test]
fn rotation_new_file_during_downtime() {
    let _g = exclusive();
    rotation_row("rotate-new-file", Rotation::NewFile);
}

/// Three times: agent SIGTERM (Goodbye) and an immediate restart, as `systemctl restart`
/// does, while lines flow. A clean restart is the same agent coming back, not a second live
/// agent with its id: it must be welcomed at once (never refused as `duplicate_agent_id`
/// and kept out for a reconnect backoff), and every line delivered exactly once.
#[test]
fn agent_restart_right_after_goodbye() {
    let _g = exclusive();
    let (mut row, a) = one_agent_row("agent-restart");
    let mut slow = Vec::new();
    for cycle in 0..3 {
        row.write_bursts(a, 0, 400, GAP);
        let want = row.agents[a].written();
        row.wait_delivered(a, 0, 0..want, SETTLE);
        row.stop_agent(a);
        let restarted = std::time::Instant::now();
        row.restart_agent(a);
        row.wait_connected(1, &[a]);
        let took = restarted.elapsed();
        row.notes.push(format!(
            "cycle {cycle}: welcomed again {took:.2?} after the restart"
        ));
        if took > Duration::from_millis(1500) {
            slow.push(format!("cycle {cycle}: {took:.1?}"));
        }
    }
    row.write_bursts(a, 0, 400, GAP);
    let want = row.agents[a].written();
    row.wait_delivered(a, 0, 0..want, SETTLE);
    row.quiesce();
    row.expect(
        slow.is_empty(),
        format!("each restart welcomed within 1.5 s (slow: {slow:?})"),
    );
    row.verdict(Law::Exact);
}

/// The collector drained (SIGUSR1) while lines flow: the agent ends its epoch with a
/// Goodbye (its final sequences), the collector exits 0 on its own once the agent has left,
/// the agent (a pool of one) keeps its lines while nothing is listening and sends them to
/// the collector started again: every line accounted exactly.
#[test]
fn collector_drained_and_restarted() {
    let _g = exclusive();
    let (mut row, a) = one_agent_row("collector-drain");
    row.write_bursts(a, 0, 1000, GAP);
    row.wait_delivered(a, 0, 0..1000, SETTLE);
    row.write(a, 0, 500);
    let _ = row.scrape_collector();
    row.collector.signal(Signal::SIGUSR1);
    let drained = std::time::Instant::now();
    let status = row.collector.wait_exit(Duration::from_secs(30));
    row.notes.push(format!(
        "collector drained and exited {:?} after SIGUSR1 ({status:?})",
        drained.elapsed()
    ));
    row.expect(
        status.is_some_and(|s| s.success()),
        format!("the drained collector exited 0 on its own ({status:?})"),
    );
    row.expect(
        row.agents[a]
            .daemon
            .log()
            .contains("the collector is draining"),
        "the agent logged the drain".to_owned(),
    );
    row.write_bursts(a, 0, 500, GAP);
    row.restart_collector();
    row.wait_connected(1, &[a]);
    row.write_bursts(a, 0, 500, GAP);
    row.wait_settled(a, 2500, SETTLE);
    row.quiesce();
    row.verdict(Law::Exact);
}

/// The agent's other sources failing while lines flow: a scrape target nobody listens on,
/// one that accepts and never answers, one that answers garbage, and a textfile directory
/// with a broken file. Each failure is counted (`up 0`, `source_errors_total`), and the log
/// lines and the frames are accounted exactly, as if nothing failed.
#[test]
fn scrape_targets_and_textfiles_failing_while_lines_flow() {
    let _g = exclusive();
    let mut row = Row::start("sources-failing", CollectorSpec::default(), None);
    let dead = uctel_tests::net::free_addr();
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let garbage = uctel_tests::net::http_answering("200 OK");
    let textfile = row.path().join("textfile");
    std::fs::create_dir_all(&textfile).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(textfile.join("broken.prom"), "broken{ 1\n").unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(textfile.join("ok.prom"), "ok_value 1\n").unwrap_or_else(|e| panic!("{e}"));
    let target = |url: String, job: &str| {
        let mut m = serde_yaml::Mapping::new();
        m.insert("url".into(), url.into());
        m.insert("job".into(), job.into());
        m.insert("interval_seconds".into(), 0.5.into());
        m.insert("timeout_seconds".into(), 0.4.into());
        serde_yaml::Value::Mapping(m)
    };
    let targets = serde_yaml::Value::Sequence(vec![
        target(format!("http://{dead}/metrics"), "dead"),
        target(
            format!(
                "http://{}/metrics",
                silent.local_addr().unwrap_or_else(|e| panic!("{e}"))
            ),
            "silent",
        ),
        target(format!("http://{garbage}/metrics"), "garbage"),
    ]);
    let a = row.add_agent(
        AgentSpec::new("a")
            .set("sources.scrape", targets)
            .set("sources.textfile.directory", textfile.display().to_string())
            .set("sources.textfile.interval_seconds", 0.5),
    );
    row.wait_connected(1, &[a]);
    row.write_bursts(a, 0, 2000, GAP);
    row.wait_settled(a, 2000, SETTLE);
    let s = row.scrape_agent(a).unwrap_or_else(|e| panic!("{e}"));
    for (reason, at_least) in [("down", 1), ("timeout", 1), ("parse_error", 1)] {
        let n = s.count(
            "uctel_agent_source_errors_total",
            &[("source", "scrape"), ("reason", reason)],
        );
        row.expect(
            n >= at_least,
            format!("scrape failures counted as {reason}: {n}"),
        );
    }
    let broken = s.count(
        "uctel_agent_source_errors_total",
        &[("source", "textfile"), ("reason", "parse_error")],
    );
    row.expect(broken >= 1, format!("broken textfile counted: {broken}"));
    let c = row.scrape_collector().unwrap_or_else(|e| panic!("{e}"));
    let ups: Vec<String> = c
        .select("up", &[("agent", "a")])
        .map(|smp| format!("{}={}", smp.label("job").unwrap_or("?"), smp.value))
        .collect();
    row.expect(
        ups.len() == 3 && ups.iter().all(|u| u.ends_with("=0")),
        format!("every failing target up 0 at the collector: {ups:?}"),
    );
    row.quiesce();
    drop(silent);
    row.verdict(Law::Exact);
}

/// Two agents with the same `agent_id`: the collector refuses the second (or replaces the
/// first and keeps it out, DESIGN.md §6), never a loop. Each twin's lines are delivered,
/// counted, or still unread in its file (kept out); none twice.
#[test]
fn twin_agent_ids() {
    let _g = exclusive();
    let mut row = Row::start("twin-ids", CollectorSpec::default(), None);
    row.allow.unread = true;
    row.allow.sessions_without_goodbye = 1;
    // The kept-out twin connects once the first one said goodbye and sends what it held
    // meanwhile: its log backlog and the metric samples it buffered while kept out.
    row.allow.settle = Duration::from_secs(20);
    row.allow.duplicate_refusals = true;
    let one = row.add_agent(AgentSpec {
        id: "twin".into(),
        ..AgentSpec::new("twin-one")
    });
    row.wait_connected(1, &[one]);
    let two = row.add_agent(AgentSpec {
        id: "twin".into(),
        ..AgentSpec::new("twin-two")
    });
    // Watch for 8 s while both write.
    let start = std::time::Instant::now();
    let mut states: Vec<(Duration, u64, u64)> = Vec::new();
    while start.elapsed() < Duration::from_secs(8) {
        row.write(one, 0, 60);
        row.write(two, 0, 60);
        let c1 = row
            .scrape_agent(one)
            .map_or(0, |s| s.count("uctel_agent_connected", &[]));
        let c2 = row
            .scrape_agent(two)
            .map_or(0, |s| s.count("uctel_agent_connected", &[]));
        let _ = row.scrape_collector();
        states.push((start.elapsed(), c1, c2));
        std::thread::sleep(Duration::from_millis(250));
    }
    let s = row.collector_last();
    let replaced = s.count(
        "uctel_collector_connections_replaced_total",
        &[("agent", "twin")],
    );
    let connects = uctel_tests::faults::welcomed_sessions(&row.collector.log(), "twin");
    let tail: Vec<(u64, u64)> = states
        .iter()
        .filter(|(t, ..)| *t >= Duration::from_secs(5))
        .map(|(_, a, b)| (*a, *b))
        .collect();
    let stable_one =
        !tail.is_empty() && tail.iter().all(|st| *st == tail[0]) && tail[0].0 + tail[0].1 == 1;
    row.notes.push(format!(
        "connections welcomed {connects}, replaced {replaced}; connected (one, two) in the last 3 s: {tail:?}"
    ));
    row.expect(
        connects <= 2 && replaced <= 1 && stable_one,
        format!(
            "no flapping: at most 2 connections and 1 replacement in 8 s, then exactly one twin connected and staying so (welcomed {connects}, replaced {replaced})"
        ),
    );
    row.quiesce();
    row.verdict(Law::Exact);
}

/// A remote-write endpoint setting for a row (short deadline and backoff, small queue).
fn remote_write(url: &str, capacity: u64) -> serde_yaml::Value {
    let mut m = serde_yaml::Mapping::new();
    m.insert("url".into(), url.into());
    m.insert("batch_send_deadline_seconds".into(), 0.2.into());
    m.insert("min_backoff_seconds".into(), 0.05.into());
    m.insert("max_backoff_seconds".into(), 0.5.into());
    m.insert("timeout_seconds".into(), 2.into());
    m.insert("queue_capacity_samples".into(), capacity.into());
    serde_yaml::Value::Sequence(vec![serde_yaml::Value::Mapping(m)])
}

/// Waits until the collector's remote-write output has nothing pending; returns the last
/// scrape.
fn remote_write_drained(row: &mut Row) -> uctel_tests::exposition::Scrape {
    let mut last = None;
    let _ = uctel_tests::wait_for(
        "remote-write drained",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || {
            let s = row.scrape_collector()?;
            let pending = s.count("uctel_collector_remote_write_samples_pending", &[]);
            last = Some(s);
            (pending == 0)
                .then_some(())
                .ok_or(format!("{pending} pending"))
        },
    );
    last.unwrap_or_default()
}

/// The remote-write receiver (a real VictoriaMetrics) stops for 8 s while lines and host
/// metrics flow, then comes back: the records law holds, the output's sum rule holds at
/// every scrape, what was not dropped reaches the receiver once the queue drains.
#[test]
fn remote_write_receiver_outage() {
    let _g = exclusive();
    let dir = tempfile::Builder::new()
        .prefix("uctel-fm-vm-")
        .tempdir()
        .unwrap();
    let mut vm = uctel_tests::victoria::Victoria::start(dir.path());
    let url = vm.write_url();
    let spec = CollectorSpec {
        set: vec![("outputs.remote_write".into(), remote_write(&url, 10_000))],
        ..CollectorSpec::default()
    };
    let mut row = Row::start("remote-write-outage", spec, None);
    let a = row.add_agent(AgentSpec::new("a"));
    row.wait_connected(1, &[a]);
    row.write_bursts(a, 0, 1000, GAP);
    vm.stop();
    let down = std::time::Instant::now();
    while down.elapsed() < Duration::from_secs(8) {
        row.write(a, 0, 100);
        std::thread::sleep(Duration::from_millis(500));
        let _ = row.scrape_collector();
    }
    vm.restart();
    row.write_bursts(a, 0, 1000, GAP);
    row.wait_settled(a, 2600, SETTLE);
    row.quiesce();
    let s = remote_write_drained(&mut row);
    let m = [("url", url.as_str())];
    let count = |name: &str| s.count(&format!("uctel_collector_remote_write_{name}"), &m);
    let (sent, stale, retried, failed) = (
        count("samples_total"),
        count("stale_markers_total"),
        count("samples_retried_total"),
        count("samples_failed_total"),
    );
    let held: u64 = vm
        .export_settled(
            &format!("{{agent=\"{}\"}}", row.agents[a].spec.id),
            sent - stale,
            Duration::from_secs(20),
        )
        .map(|r| r.values().map(|v| v.len() as u64).sum())
        .unwrap_or(0);
    row.notes.push(format!(
        "remote-write: sent {sent} (stale markers {stale}), retried {retried}, failed {failed}, \
         dropped {}, held by the receiver {held}",
        count("samples_dropped_total")
    ));
    row.expect(
        retried > 0,
        "requests were retried while the receiver was down",
    );
    row.expect(
        failed == 0,
        "no request failed for good (the receiver came back)",
    );
    row.expect(
        held == sent - stale,
        format!(
            "the receiver holds {held} samples, the collector sent {sent} − {stale} stale markers"
        ),
    );
    row.verdict(Law::Exact);
}

/// The remote-write receiver refuses every request (400): nothing is retried, every sample
/// is counted failed, the records law is untouched.
#[test]
fn remote_write_receiver_refuses() {
    let _g = exclusive();
    let addr = uctel_tests::net::http_answering("400 Bad Request");
    let url = format!("http://{addr}/api/v1/write");
    let spec = CollectorSpec {
        set: vec![("outputs.remote_write".into(), remote_write(&url, 100_000))],
        ..CollectorSpec::default()
    };
    let mut row = Row::start("remote-write-refused", spec, None);
    let a = row.add_agent(AgentSpec::new("a"));
    row.wait_connected(1, &[a]);
    row.write_bursts(a, 0, 1000, GAP);
    row.wait_settled(a, 1000, SETTLE);
    row.quiesce();
    let s = remote_write_drained(&mut row);
    let m = [("url", url.as_str())];
    let input = s.count("uctel_collector_remote_write_samples_in_total", &m);
    let rejected = s.count(
        "uctel_collector_remote_write_samples_failed_total",
        &[("url", url.as_str()), ("reason", "rejected")],
    );
    let dropped = s.count("uctel_collector_remote_write_samples_dropped_total", &m);
    let retried = s.count("uctel_collector_remote_write_samples_retried_total", &m);
    row.notes.push(format!(
        "remote-write: in {input}, rejected {rejected}, dropped {dropped}, retried {retried}"
    ));
    row.expect(input > 0, "samples reached the output");
    row.expect(retried == 0, "a 400 is never retried");
    row.expect(
        rejected + dropped == input,
        "every sample is counted rejected (or dropped before sending)",
    );
    row.verdict(Law::Exact);
}

/// A ClickHouse server with the shipped table (`config/clickhouse/logs.sql`).
fn clickhouse_with_shipped_schema() -> uctel_tests::clickhouse::ClickHouse {
    let ch = uctel_tests::clickhouse::ClickHouse::start();
    let schema =
        std::fs::read_to_string(uctel_tests::workspace_root().join("config/clickhouse/logs.sql"))
            .expect("config/clickhouse/logs.sql");
    ch.query(&schema).unwrap_or_else(|e| panic!("{e}"));
    ch
}

/// A collector whose ClickHouse output writes to `ch` in INSERTs of up to `rows` rows, with
/// a 0.2 s batch deadline, 0.05–0.5 s backoff and the `extra` keys of the output.
fn clickhouse_output(
    ch: &uctel_tests::clickhouse::ClickHouse,
    rows: u64,
    extra: &[(&str, serde_yaml::Value)],
) -> CollectorSpec {
    let mut out = serde_yaml::Mapping::new();
    out.insert("url".into(), ch.url().into());
    out.insert("max_rows_per_insert".into(), rows.into());
    out.insert("batch_send_deadline_seconds".into(), 0.2.into());
    out.insert("min_backoff_seconds".into(), 0.05.into());
    out.insert("max_backoff_seconds".into(), 0.5.into());
    for (k, v) in extra {
        out.insert((*k).into(), v.clone());
    }
    CollectorSpec {
        set: vec![("outputs.clickhouse".into(), serde_yaml::Value::Mapping(out))],
        ..CollectorSpec::default()
    }
}

/// The collector's figures once its ClickHouse output has nothing pending (or after 30 s).
fn clickhouse_drained(row: &mut Row) -> uctel_tests::exposition::Scrape {
    let mut last = None;
    let _ = uctel_tests::wait_for(
        "clickhouse output drained",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || {
            let s = row.scrape_collector()?;
            let pending = s.count("uctel_collector_clickhouse_rows_pending", &[]);
            last = Some(s);
            (pending == 0)
                .then_some(())
                .ok_or(format!("{pending} pending"))
        },
    );
    last.unwrap_or_default()
}

/// ClickHouse is stopped and started again while lines flow: every line the agent wrote is
/// in the table (distinct) or counted dropped by the output; the records law holds for the
/// JSON Lines sink beside it; the output's sum rule holds at every scrape.
#[test]
fn clickhouse_restart_while_lines_flow() {
    let _g = exclusive();
    let mut ch = clickhouse_with_shipped_schema();
    let spec = clickhouse_output(&ch, 500, &[]);
    let mut row = Row::start("clickhouse-restart", spec, None);
    let a = row.add_agent(AgentSpec::new("a"));
    row.wait_connected(1, &[a]);
    row.write_bursts(a, 0, 1500, GAP);
    ch.stop();
    row.write_bursts(a, 0, 1000, GAP);
    let _ = row.scrape_collector();
    ch.restart();
    row.write_bursts(a, 0, 1000, GAP);
    row.wait_settled(a, 3500, SETTLE);
    row.quiesce();
    let s = clickhouse_drained(&mut row);
    let written = row.agents[a].written();
    let id = row.agents[a].spec.id.clone();
    let distinct: u64 = ch
        .query(&format!(
            "SELECT uniqExact(message) FROM logs WHERE agent = '{id}'"
        ))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0);
    let dropped = s.count("uctel_collector_clickhouse_rows_dropped_total", &[]);
    let retried = s.count("uctel_collector_clickhouse_rows_retried_total", &[]);
    row.notes.push(format!(
        "clickhouse: written {written}, distinct rows {distinct}, dropped {dropped}, retried {retried}"
    ));
    row.expect(
        distinct + dropped == written,
        format!("{written} lines written = {distinct} distinct rows + {dropped} dropped"),
    );
    row.verdict(Law::Exact);
}

// ---- The fast_counters stream: counters sampled every 10 ms while log lines flow. ----

/// The statistics of `lo` the fast_counters rows sample (`/sys/class/net/lo/statistics/*`,
/// named as node_exporter's netdev collector names the `/proc/net/dev` columns).
const LO_STATS: [&str; 8] = [
    "rx_bytes",
    "rx_packets",
    "tx_bytes",
    "tx_packets",
    "rx_dropped",
    "tx_dropped",
    "multicast",
    "rx_errors",
];
/// How long a fast_counters row samples at least, from the agent's connection on.
const SAMPLING: Duration = Duration::from_secs(8);

/// `sources.fast_counters.counters` entries for `paths`.
fn counter_paths(paths: &[String]) -> serde_yaml::Value {
    serde_yaml::Value::Sequence(
        paths
            .iter()
            .map(|p| {
                let mut m = serde_yaml::Mapping::new();
                m.insert("path".into(), p.clone().into());
                serde_yaml::Value::Mapping(m)
            })
            .collect(),
    )
}

fn lo_paths() -> Vec<String> {
    LO_STATS
        .iter()
        .map(|s| format!("/sys/class/net/lo/statistics/{s}"))
        .collect()
}

/// Agent `a` sampling `paths` every 10 ms, 20 samples per record.
fn fast_counters_agent(paths: &[String]) -> AgentSpec {
    AgentSpec::new("a")
        .set("sources.fast_counters.interval_milliseconds", 10)
        .set("sources.fast_counters.samples_per_record", 20)
        .set("sources.fast_counters.counters", counter_paths(paths))
}

/// Starts a fast_counters row: the collector (`collector`) and agent `a` (`spec`),
/// connected.
fn fast_counters_start(
    name: &str,
    collector: CollectorSpec,
    spec: AgentSpec,
) -> (Row, usize, std::time::Instant) {
    let mut row = Row::start(name, collector, None);
    let a = row.add_agent(spec);
    row.wait_connected(1, &[a]);
    (row, a, std::time::Instant::now())
}

/// The rest of a fast_counters row: 3000 lines in bursts, sampling for at least
/// [`SAMPLING`] since `since`, then settle and quiesce.
fn fast_counters_finish(row: &mut Row, a: usize, since: std::time::Instant) {
    row.write_bursts(a, 0, 3000, Duration::from_millis(250));
    if let Some(rest) = SAMPLING.checked_sub(since.elapsed()) {
        std::thread::sleep(rest);
    }
    row.wait_settled(a, 3000, SETTLE);
    row.quiesce();
}

/// A fast_counters row whose agent's soft transport injects `fault`. Records of 2 samples
/// (one per counter every 20 ms) and frames flushed after 10 ms: some 18 fast_counters
/// frames a second, so that a few % of packets dropped hit the stream for certain (at 20
/// samples per record and the default 200 ms, some 4 frames a second: 5 % of 33 frames
/// misses the stream in one run of five).
fn fast_counters_link_row(name: &str, fault: &[(&str, serde_yaml::Value)]) -> Row {
    let mut spec = fast_counters_agent(&lo_paths())
        .set("sources.fast_counters.samples_per_record", 2)
        .set("streams.fast_counters.flush_milliseconds", 10);
    for (k, v) in fault {
        spec = spec.fault(k, v.clone());
    }
    let (mut row, a, since) = fast_counters_start(name, CollectorSpec::default(), spec);
    fast_counters_finish(&mut row, a, since);
    row
}

/// 5 % of the agent's packets dropped while eight counters are sampled every 10 ms: the
/// lost frames' samples are counted lost by the collector, sample for sample.
#[test]
fn fast_counters_drop_5_percent() {
    let _g = exclusive();
    let mut row = fast_counters_link_row("fast-drop-5pct", &[("drop_ratio", 0.05.into())]);
    let f = row.sample_figures(0);
    let (lost, injected) = lost_and_injected(&row);
    let c = row.collector_figures("a");
    row.expect(
        injected > 0 && lost == injected,
        format!("frames lost {lost} == injector drops {injected} > 0"),
    );
    row.expect(
        f.lost > 0 && c.records_lost["fast_counters"] > 0 && f.received > f.lost * 5,
        format!(
            "samples lost {} > 0 (fast_counters frames lost {}), received {}",
            f.lost, c.lost["fast_counters"], f.received
        ),
    );
    row.expect(
        f.taken > 8 * 500,
        format!(
            "{} samples taken in {SAMPLING:?}+ of 8 counters at 10 ms",
            f.taken
        ),
    );
    row.verdict(Law::Exact);
}

/// Duplicated and reordered packets while counters are sampled: duplicates discarded (no
/// sample counted twice), late frames inside the reorder window accepted, the sample law
/// exact.
#[test]
fn fast_counters_duplicate_and_reorder() {
    let _g = exclusive();
    let mut row = fast_counters_link_row(
        "fast-dup-reorder",
        &[
            ("duplicate_ratio", 0.1.into()),
            ("reorder_ratio", 0.1.into()),
            ("reorder_window", 4.into()),
        ],
    );
    let s = row.collector_last();
    let dups = s.count(
        "uctel_collector_frames_duplicate_total",
        &[("agent", "a"), ("stream", "fast_counters")],
    );
    // Late frames of the stream itself are few (a packet overtaking one of the same stream
    // within 4 packets): the reordering is asserted on the connection, as in `uc_reorder`.
    let late = s.count("uctel_collector_frames_late_total", &[("agent", "a")]);
    let late_fast = s.count(
        "uctel_collector_frames_late_total",
        &[("agent", "a"), ("stream", "fast_counters")],
    );
    let f = row.sample_figures(0);
    row.expect(
        dups > 0 && late > 0,
        format!("collector frames duplicate {dups} (fast_counters), late {late} (all streams; {late_fast} fast_counters)"),
    );
    row.expect(
        f.taken > 8 * 500 && f.received > 0,
        format!("{} samples taken, {} received", f.taken, f.received),
    );
    row.verdict(Law::Exact);
}

/// The collector frozen (SIGSTOP) for 6 s while counters are sampled, with a ring of 128
/// slots (a credit window of 64 frames, used up in about 2 s): no credit comes back, so the
/// stream (`on_no_credit: drop`) drops at the agent, counted `no_credit` in samples; the
/// logs wait; everything accounted exactly, one session throughout.
#[test]
fn fast_counters_credit_starvation() {
    let _g = exclusive();
    let collector = CollectorSpec {
        set: vec![
            ("ring.slots".into(), 128.into()),
            ("ring.credit_margin_slots".into(), 64.into()),
        ],
        ..CollectorSpec::default()
    };
    let (mut row, a, since) = fast_counters_start(
        "fast-no-credit",
        collector,
        fast_counters_agent(&lo_paths()),
    );
    std::thread::sleep(Duration::from_secs(2));
    row.collector.signal(Signal::SIGSTOP);
    let stopped = std::time::Instant::now();
    row.write_bursts(a, 0, 500, Duration::from_millis(300));
    if let Some(rest) = Duration::from_secs(6).checked_sub(stopped.elapsed()) {
        std::thread::sleep(rest);
    }
    row.collector.signal(Signal::SIGCONT);
    row.notes
        .push(format!("collector stopped for {:.1?}", stopped.elapsed()));
    row.write_bursts(a, 0, 500, GAP);
    if let Some(rest) = (SAMPLING + Duration::from_secs(2)).checked_sub(since.elapsed()) {
        std::thread::sleep(rest);
    }
    row.wait_settled(a, 1000, SETTLE);
    row.quiesce();
    let f = row.sample_figures(a);
    let no_credit = f.dropped_by_reason.get("no_credit").copied().unwrap_or(0);
    let reasons: Vec<String> = f
        .dropped_by_reason
        .iter()
        .filter(|(_, v)| **v > 0)
        .map(|(r, v)| format!("{r}={v}"))
        .collect();
    row.expect(
        no_credit > 0 && no_credit <= f.dropped,
        format!(
            "agent dropped {no_credit} samples as no_credit (of {} dropped in all; by the last scrape {reasons:?})",
            f.dropped
        ),
    );
    row.verdict(Law::Exact);
}

/// One counter cannot be read (an interface that does not exist): it gives no sample and
/// every attempt is counted `read_error`; the eight others are sampled at every round as if
/// it were not there; the law exact.
#[test]
fn fast_counters_unreadable_counter() {
    let _g = exclusive();
    const MISSING: &str = "fmnone0";
    // The unreadable counter first: in each round its error is counted before the eight
    // samples, so at any scrape samples ≤ 8 × errors ≤ samples + 8 (+ a round begun
    // between the two series of one scrape).
    let mut paths = vec![format!("/sys/class/net/{MISSING}/statistics/rx_packets")];
    paths.extend(lo_paths());
    let (mut row, a, since) = fast_counters_start(
        "fast-unreadable",
        CollectorSpec::default(),
        fast_counters_agent(&paths),
    );
    // As `fast_counters_finish`, reading the collector's rates of the agent's series before
    // the agent stops (they leave /metrics at its Goodbye).
    row.write_bursts(a, 0, 3000, Duration::from_millis(250));
    if let Some(rest) = SAMPLING.checked_sub(since.elapsed()) {
        std::thread::sleep(rest);
    }
    row.wait_settled(a, 3000, SETTLE);
    let serving = row.scrape_collector().unwrap_or_default();
    row.quiesce();
    let f = row.sample_figures(a);
    let read_errors = f.errors_by_reason.get("read_error").copied().unwrap_or(0);
    let other: u64 = f
        .errors_by_reason
        .iter()
        .filter(|(r, _)| r.as_str() != "read_error")
        .map(|(_, v)| *v)
        .sum();
    row.expect(
        read_errors > 500 && other == 0,
        format!(
            "source_errors_total{{source=fast_counters}} by reason {:?}: read_error > 500, nothing else",
            f.errors_by_reason
        ),
    );
    let eight = 8 * read_errors;
    row.expect(
        f.taken_at_last_scrape <= eight && eight <= f.taken_at_last_scrape + 16,
        format!(
            "the eight readable counters sampled at every round: 8 × read errors {eight} vs samples {} at the same scrape",
            f.taken_at_last_scrape
        ),
    );
    let rates: std::collections::BTreeSet<String> = serving
        .samples
        .iter()
        .filter(|m| {
            m.name.starts_with("node_network_")
                && m.name.ends_with("_per_second")
                && m.label("agent") == Some("a")
        })
        .map(|m| format!("{}{{device={}}}", m.name, m.label("device").unwrap_or("")))
        .collect();
    let missing = rates.iter().filter(|r| r.contains(MISSING)).count();
    let lo = rates.iter().filter(|r| r.ends_with("{device=lo}")).count();
    row.expect(
        missing == 0 && lo == 8,
        format!(
            "collector 1 s rates of the agent's fast counters: {lo} of device lo (want 8), {missing} of {MISSING} (want 0): {rates:?}"
        ),
    );
    row.verdict(Law::Exact);
}

/// A low-rate stream with a lost frame (counted within the time bound): one log line a
/// second and host metrics every second, 10 % of the agent's packets dropped, for 30 s.
/// Each second both daemons are scraped; every frame the injector dropped more than
/// [`LOW_RATE_BOUND`] ago (the next frame of its stream follows within about a second, the
/// reorder window is 1 s, the collector sweeps every 0.1 s) must be in the collector's
/// `frames_lost_total` already, not 100 frames (minutes at this rate) later; the records of
/// the lost frames are in `records_lost_total` by then too. Then the exact law, and no
/// series of the `fast_counters` stream, which the agent does not have configured.
#[test]
fn low_rate_stream_loss_counted_within_the_time_bound() {
    let _g = exclusive();
    let mut row = Row::start("low-rate-loss", CollectorSpec::default(), None);
    let a = row.add_agent(AgentSpec::new("a").fault("drop_ratio", 0.1));
    row.wait_connected(1, &[a]);
    let started = std::time::Instant::now();
    // (seconds since start, packets the injector dropped, frames lost, records lost)
    let mut samples: Vec<(f64, u64, u64, u64)> = Vec::new();
    let mut late: Vec<String> = Vec::new();
    for _ in 0..LOW_RATE_SECONDS {
        row.write(a, 0, 1);
        std::thread::sleep(Duration::from_secs(1));
        let (Ok(ag), Ok(col)) = (row.scrape_agent(a), row.scrape_collector()) else {
            continue;
        };
        let injected = ag.count("uctel_agent_fault_packets_total", &[("action", "dropped")]);
        let lost = col.count("uctel_collector_frames_lost_total", &[("agent", "a")]);
        let records = col.count("uctel_collector_records_lost_total", &[("agent", "a")]);
        let t = started.elapsed().as_secs_f64();
        // Every drop injected by the sample at least LOW_RATE_BOUND old is counted by now.
        let due = samples
            .iter()
            .rev()
            .find(|s| s.0 <= t - LOW_RATE_BOUND.as_secs_f64())
            .map_or(0, |s| s.1);
        if lost < due {
            late.push(format!(
                "at {t:.1} s: frames lost {lost} < {due} packets dropped {LOW_RATE_BOUND:?} earlier"
            ));
        }
        samples.push((t, injected, lost, records));
    }
    let last = samples.last().copied().unwrap_or_default();
    row.notes.push(format!(
        "after {:.1} s: injector dropped {}, collector frames lost {}, records lost {}",
        last.0, last.1, last.2, last.3
    ));
    row.expect(
        last.1 > 0 && late.is_empty(),
        format!(
            "{} drop(s) injected at ~1 frame/s per stream, each counted lost within {LOW_RATE_BOUND:?}: {late:?}",
            last.1
        ),
    );
    row.expect(
        samples.iter().any(|s| s.3 > 0),
        "records of the lost frames counted in records_lost_total before the Goodbye",
    );
    row.wait_settled(a, LOW_RATE_SECONDS, SETTLE);
    row.quiesce();
    let (lost, injected) = lost_and_injected(&row);
    row.expect(
        lost == injected,
        format!("frames lost {lost} == injector drops {injected}"),
    );
    // The agent has no fast counters configured: that stream carries nothing (no idle
    // heartbeats whose loss would show), so the collector has no series of it.
    let fast = [("agent", "a"), ("stream", "fast_counters")];
    let s = row.collector_last();
    row.expect(
        !s.has("uctel_collector_frames_received_total", &fast)
            && !s.has("uctel_collector_frames_lost_total", &fast),
        format!(
            "no fast_counters series without the source (frames received {}, lost {})",
            s.count("uctel_collector_frames_received_total", &fast),
            s.count("uctel_collector_frames_lost_total", &fast)
        ),
    );
    row.verdict(Law::Exact);
}

/// How long the low-rate row runs, one line a second.
const LOW_RATE_SECONDS: u64 = 30;
/// The bound on how late a lost frame of the low-rate row may be counted, from the drop:
/// the next frame of its stream (about 1 s) + the reorder window (1 s) + the collector's
/// sweep (0.1 s) + the scrape period (1 s).
const LOW_RATE_BOUND: Duration = Duration::from_millis(3500);

/// Multi-packet frames (`multi_packet_frames`, path MTU 1024, frames up to 4096 bytes) with
/// 5 % of the agent's packets dropped: a lost packet dooms its frame, which the collector's
/// UC responder drops (`psn_gap`, `cut_short`) and its connection tracker sees as a gap. The
/// per-connection sum `sent = received + dropped + connection lost` holds exactly: the
/// connection's loss counts only the gaps no drop explains, and it must not count a gap
/// before the responder's drop of that frame is folded in (a counter cannot take it back).
/// A frame window of 4 (`reorder_window_frames`) settles gaps within milliseconds, well
/// before the worker's next fold of the QP's drop counters (every 0.1 s).
#[test]
fn multi_packet_frames_drop_5_percent() {
    let _g = exclusive();
    let spec = CollectorSpec {
        set: vec![("reorder_window_frames".into(), 4.into())],
        ..CollectorSpec::default()
    };
    let mut row = Row::start("multi-packet-drop-5pct", spec, None);
    let spec = AgentSpec::new("a")
        .set("multi_packet_frames", true)
        .set("transport.soft.mtu_bytes", 1024)
        .set("max_frame_bytes", 4096)
        .fault("drop_ratio", 0.05);
    let a = row.add_agent(spec);
    row.wait_connected(1, &[a]);
    row.write_bursts(a, 0, 3000, GAP);
    row.wait_settled(a, 3000, SETTLE);
    row.quiesce();
    let c = row.collector_figures("a");
    let doomed = c.dropped.get("psn_gap").copied().unwrap_or(0)
        + c.dropped.get("cut_short").copied().unwrap_or(0);
    let conn_lost = row.collector_last().count(
        "uctel_collector_connection_frames_lost_total",
        &[("agent", "a")],
    );
    row.expect(
        doomed > 0,
        format!(
            "frames doomed by a lost packet and dropped by the UC responder (psn_gap + cut_short) {doomed} > 0; connection frames lost {conn_lost}"
        ),
    );
    row.verdict(Law::Exact);
}

/// Heartbeat period of the row below, seconds: the collector's drop series must show a drop
/// within this long of the agent counting it.
const SMALL_WINDOW_HEARTBEAT_SECONDS: u64 = 1;

/// Per `(kind, stream, reason)` the nonzero drops in `s` of `family`
/// (`uctel_agent_{kind}_dropped_total` on an agent's own `/metrics`,
/// `uctel_collector_agent_{kind}_dropped_total` with `agent="a"` on the collector's).
fn drops_by_stream_and_reason(
    s: &uctel_tests::exposition::Scrape,
    family: &str,
    agent: Option<&str>,
) -> std::collections::BTreeMap<(String, String, String), u64> {
    let mut out = std::collections::BTreeMap::new();
    let matchers: Vec<(&str, &str)> = agent.map(|a| ("agent", a)).into_iter().collect();
    for kind in ["frames", "records"] {
        let name = format!("{family}_{kind}_dropped_total");
        for smp in s.select(&name, &matchers) {
            let (Some(stream), Some(reason)) = (smp.label("stream"), smp.label("reason")) else {
                continue;
            };
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let v = smp.value.max(0.0).round() as u64;
            if v > 0 {
                *out.entry((kind.to_owned(), stream.to_owned(), reason.to_owned()))
                    .or_default() += v;
            }
        }
    }
    out
}

/// An agent whose collection is larger than its window: the collector gives it a ring of 8
/// slots (a credit window of 7 frames) while each host-metrics collection needs more frames
/// than that, so every collection drops frames at the agent as `no_credit` — the frames that
/// would carry the agent's own drop counters among them. The drops are visible at the
/// collector within one heartbeat interval anyway, in
/// `uctel_collector_agent_records_dropped_total{agent,stream,reason}` (the agent's
/// heartbeats carry its counters on the control connection), and that series equals the
/// agent's own `uctel_agent_records_dropped_total` (frames too, every stream and reason)
/// once the agent's counters stand still for a heartbeat; the law exact.
#[test]
fn agent_collection_larger_than_its_window() {
    let _g = exclusive();
    let heartbeat = Duration::from_secs(SMALL_WINDOW_HEARTBEAT_SECONDS);
    let collector = CollectorSpec {
        set: vec![
            ("ring.slots".into(), 8.into()),
            ("ring.min_slots".into(), 8.into()),
            ("ring.credit_margin_slots".into(), 1.into()),
            (
                "control.heartbeat_interval_seconds".into(),
                SMALL_WINDOW_HEARTBEAT_SECONDS.into(),
            ),
        ],
        ..CollectorSpec::default()
    };
    let mut row = Row::start("small-window", collector, None);
    // Host metrics every 4 s: bursts of frames larger than the window, with quiet
    // stretches between them in which the counters stand still.
    let a = row.add_agent(AgentSpec::new("a").set("sources.host_metrics.interval_seconds", 4));
    row.wait_connected(1, &[a]);
    row.write_bursts(a, 0, 300, GAP);

    // 1. Visible within one heartbeat: the first no_credit drops the agent counts reach the
    //    collector's series within a heartbeat interval (plus the scrapes' own time).
    let slack = Duration::from_millis(500);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut seen: Option<(u64, Duration)> = None;
    while seen.is_none() && std::time::Instant::now() < deadline {
        let agent_drops = row
            .scrape_agent(a)
            .map(|s| {
                s.count(
                    "uctel_agent_records_dropped_total",
                    &[("stream", "metrics"), ("reason", "no_credit")],
                )
            })
            .unwrap_or(0);
        if agent_drops == 0 {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        let t0 = std::time::Instant::now();
        let mut shown = 0;
        let mut stale_copy = 0;
        while t0.elapsed() <= heartbeat * 3 && shown < agent_drops {
            if let Ok(c) = row.scrape_collector() {
                let m = [
                    ("agent", "a"),
                    ("stream", "metrics"),
                    ("reason", "no_credit"),
                ];
                shown = c.count("uctel_collector_agent_records_dropped_total", &m);
                stale_copy = c.count("uctel_agent_records_dropped_total", &m);
            }
            if shown < agent_drops {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let took = t0.elapsed();
        row.notes.push(format!(
            "agent counted {agent_drops} no_credit metrics records; collector series showed {shown} after {took:.2?} (the agent's own series as shipped on its metrics stream: {stale_copy})"
        ));
        seen = Some((shown, took));
        row.expect(
            shown >= agent_drops && took <= heartbeat + slack,
            format!(
                "uctel_collector_agent_records_dropped_total{{stream=metrics,reason=no_credit}} {shown} >= the agent's {agent_drops} within one heartbeat ({heartbeat:?} + {slack:?} for the scrapes), took {took:.2?}"
            ),
        );
    }
    if seen.is_none() {
        row.expect(false, "the agent dropped no_credit records within 30 s");
    }

    // 2. Equal while the agent's counters stand still for a heartbeat: agent scrape, a
    //    heartbeat and a half, collector scrape, agent scrape again.
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    let mut compared = false;
    while !compared && std::time::Instant::now() < deadline {
        let Ok(before) = row.scrape_agent(a) else {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        };
        std::thread::sleep(heartbeat + slack);
        let (Ok(c), Ok(after)) = (row.scrape_collector(), row.scrape_agent(a)) else {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        };
        let agent_before = drops_by_stream_and_reason(&before, "uctel_agent", None);
        let agent_after = drops_by_stream_and_reason(&after, "uctel_agent", None);
        if agent_before != agent_after {
            continue;
        }
        let at_collector = drops_by_stream_and_reason(&c, "uctel_collector_agent", Some("a"));
        compared = true;
        row.expect(
            at_collector == agent_after
                && agent_after
                    .get(&(
                        "records".to_owned(),
                        "metrics".to_owned(),
                        "no_credit".to_owned(),
                    ))
                    .is_some_and(|v| *v > 0),
            format!(
                "collector's uctel_collector_agent_*_dropped_total {at_collector:?} == the agent's uctel_agent_*_dropped_total {agent_after:?} (no_credit metrics records > 0)"
            ),
        );
    }
    if !compared {
        row.expect(
            false,
            "the agent's drop counters stood still for a heartbeat within 40 s",
        );
    }
    row.wait_settled(a, 300, SETTLE);
    row.quiesce();
    row.verdict(Law::Exact);
}

/// Milliseconds since the Unix epoch.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The numeric fields of agent `i`'s `stopped:` line (its whole-run figures per stream:
/// `metrics_records_collected`, `metrics_records_sent`, `metrics_records_dropped`, …).
fn stopped_figures(row: &Row, i: usize) -> std::collections::BTreeMap<String, u64> {
    let log = row.agents[i].daemon.log();
    log.lines()
        .rev()
        .map(uctel_tests::pipeline::strip_ansi)
        .find(|l| l.contains("stopped: records sent and dropped"))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|t| t.split_once('='))
                .filter_map(|(k, v)| v.trim_matches('"').parse().ok().map(|n| (k.to_owned(), n)))
                .collect()
        })
        .unwrap_or_default()
}

/// Milliseconds since the Unix epoch of a daemon log line's RFC 3339 UTC timestamp
/// (`2026-01-02T03:04:05.678901Z …`, its first field).
fn log_line_ms(line: &str) -> Option<i64> {
    let stamp = line.split_whitespace().next()?.strip_suffix('Z')?;
    let (date, time) = stamp.split_once('T')?;
    let num = |s: &str| s.parse::<i64>().ok();
    let mut d = date.split('-');
    let (y, m, day) = (num(d.next()?)?, num(d.next()?)?, num(d.next()?)?);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':');
    let (h, mi, sec) = (num(t.next()?)?, num(t.next()?)?, num(t.next()?)?);
    let ms = num(&format!("{frac:0<3}")[..3])?;
    // Days from the civil date (H. Hinnant, "chrono-Compatible Low-Level Date Algorithms").
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + day - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    Some((((days * 24 + h) * 60 + mi) * 60 + sec) * 1000 + ms)
}

/// When agent `i` last logged `connected to the collector` (its last `Welcome`), ms since
/// the Unix epoch.
fn last_welcome_ms(row: &Row, i: usize) -> Option<i64> {
    row.agents[i]
        .daemon
        .log()
        .lines()
        .rev()
        .map(uctel_tests::pipeline::strip_ansi)
        .filter(|l| l.contains("connected to the collector epoch="))
        .find_map(|l| log_line_ms(&l))
}

/// What a metrics-buffer row measured.
struct Restart {
    /// The Prometheus the collector remote-writes into.
    prom: uctel_tests::prometheus::Prometheus,
    _dir: tempfile::TempDir,
    /// The remote-write URL.
    url: String,
    /// Between the collector's exit and its start again, ms since the Unix epoch.
    down_ms: i64,
    up_ms: i64,
    /// The largest `uctel_agent_buffer_records{stream="metrics"}` seen while it was down.
    buffered_peak: u64,
}

/// The collector, remote-writing into a real Prometheus, stopped with SIGTERM for 5 s and
/// started again on the same ports while its agent collects host metrics (and its own)
/// every second and lines flow; `buffer` is the agent's
/// `streams.metrics.buffer_while_disconnected_records` (`None`: the default). The row is
/// quiesced (agent SIGTERM) and the remote-write output drained.
fn metrics_restart_row(name: &str, buffer: Option<u64>) -> (Row, Restart) {
    metrics_outage_row(name, buffer, Signal::SIGTERM)
}

/// [`metrics_restart_row`] with the collector stopped by `stop`: SIGTERM (shutdown), or
/// SIGUSR1 (a drain: the agent ends its epoch with `Goodbye`, the collector exits once it
/// has left).
fn metrics_outage_row(name: &str, buffer: Option<u64>, stop: Signal) -> (Row, Restart) {
    let dir = tempfile::Builder::new()
        .prefix("uctel-fm-prom-")
        .tempdir()
        .unwrap_or_else(|e| panic!("tempdir: {e}"));
    let prom = uctel_tests::prometheus::Prometheus::receiver(dir.path());
    let url = prom.write_url();
    let spec = CollectorSpec {
        set: vec![("outputs.remote_write".into(), remote_write(&url, 200_000))],
        ..CollectorSpec::default()
    };
    let mut row = Row::start(name, spec, None);
    // Host metrics every second plus the catch-up after the outage: the agent announces
    // that rate, as an operator would (`collector.expected_frames_per_second` sizes its
    // ring and credit window), so a collector slowed by the machine's load does not leave
    // the fresh collections without credit (`no_credit` is another row's subject).
    let mut agent = AgentSpec::new("a").set("collector.expected_frames_per_second", 256);
    if let Some(n) = buffer {
        agent = agent.set("streams.metrics.buffer_while_disconnected_records", n);
    }
    let a = row.add_agent(agent);
    row.wait_connected(1, &[a]);
    row.write_bursts(a, 0, 300, GAP);
    row.wait_delivered(a, 0, 0..300, SETTLE);
    std::thread::sleep(Duration::from_secs(2));
    let _ = row.scrape_collector();
    row.collector.signal(stop);
    let status = row.collector.wait_exit(Duration::from_secs(30));
    let down_ms = now_ms();
    row.expect(
        status.is_some_and(|s| s.success()),
        format!("the collector exited 0 after {stop} ({status:?})"),
    );
    let down = std::time::Instant::now();
    row.write(a, 0, 200);
    let mut buffered_peak = 0;
    while down.elapsed() < Duration::from_secs(5) {
        if let Ok(s) = row.scrape_agent(a) {
            let b = s.count("uctel_agent_buffer_records", &[("stream", "metrics")]);
            buffered_peak = buffered_peak.max(b);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let up_ms = now_ms();
    row.notes.push(format!(
        "collector down for {} ms; agent's metrics buffer peaked at {buffered_peak} samples",
        up_ms - down_ms
    ));
    row.restart_collector();
    row.wait_connected(1, &[a]);
    let drained = uctel_tests::wait_for(
        "the agent's metrics buffer sent",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            let s = row.scrape_agent(a)?;
            let b = s.count("uctel_agent_buffer_records", &[("stream", "metrics")]);
            (b == 0)
                .then_some(())
                .ok_or(format!("{b} samples buffered"))
        },
    );
    row.expect(
        drained.is_ok(),
        format!("the agent sent its metrics buffer after the reconnect ({drained:?})"),
    );
    row.write_bursts(a, 0, 200, GAP);
    std::thread::sleep(Duration::from_secs(2));
    row.wait_settled(a, 700, SETTLE);
    row.quiesce();
    let _ = remote_write_drained(&mut row);
    (
        row,
        Restart {
            prom,
            _dir: dir,
            url,
            down_ms,
            up_ms,
            buffered_peak,
        },
    )
}

/// Checks common to the metrics-buffer rows: the receiver refused nothing and the output
/// dropped nothing (samples reach it in order per series, the buffered ones before every
/// newer collection), and the agent's whole-run figures add up:
/// `records_collected = records_sent + records_dropped` on the metrics stream (the frame
/// law then carries `sent` to the collector's received + lost).
fn metrics_restart_checks(row: &mut Row, r: &Restart) {
    let s = row.collector_last();
    let m = [("url", r.url.as_str())];
    let (dropped, failed) = (
        s.count("uctel_collector_remote_write_samples_dropped_total", &m),
        s.count("uctel_collector_remote_write_samples_failed_total", &m),
    );
    let by_reason: std::collections::BTreeMap<String, f64> = s
        .samples
        .iter()
        .filter(|m| {
            m.name == "uctel_collector_remote_write_samples_dropped_total"
                && m.label("url") == Some(r.url.as_str())
                && m.value > 0.0
        })
        .map(|m| (m.label("reason").unwrap_or("").to_owned(), m.value))
        .collect();
    row.expect(
        dropped == 0 && failed == 0,
        format!(
            "remote-write after the restart: {dropped} samples dropped ({by_reason:?}: \
             out_of_order would be samples sent out of collection order), {failed} refused by \
             Prometheus; want 0 and 0"
        ),
    );
    let f = stopped_figures(row, 0);
    let get = |k: &str| f.get(k).copied();
    let (collected, sent, lost) = (
        get("metrics_records_collected"),
        get("metrics_records_sent"),
        get("metrics_records_dropped"),
    );
    row.expect(
        collected.is_some()
            && collected == sent.zip(lost).map(|(s, d)| s + d)
            && collected > Some(0),
        format!(
            "agent metrics stream over the run: collected {collected:?} = sent {sent:?} + dropped {lost:?}"
        ),
    );
}

/// The collector restarted (SIGTERM, then started again on the same ports) while host
/// metrics flow into a real Prometheus by remote-write: the collections made while it was
/// down reach Prometheus after the reconnect with their collection time (one sample per
/// second in the outage, not a burst stamped at the reconnect), in order (Prometheus
/// refuses a sample older than the newest of its series), and the agent drops no metric
/// sample.
#[test]
fn collector_restart_with_metrics_buffered() {
    let _g = exclusive();
    let (mut row, r) = metrics_restart_row("collector-restart-metrics", None);
    let before = row.agent_last(0);
    let dropped = before.count(
        "uctel_agent_records_dropped_total",
        &[("stream", "metrics")],
    );
    row.expect(
        dropped == 0,
        format!("the agent dropped {dropped} metric samples before its SIGTERM (want 0)"),
    );
    row.expect(
        r.buffered_peak > 0,
        format!(
            "the agent held samples while the collector was down (peak {})",
            r.buffered_peak
        ),
    );
    let held = r
        .prom
        .raw_samples(r#"node_load1{agent="a"}"#)
        .unwrap_or_else(|e| panic!("{e}"));
    let ts: Vec<i64> = held
        .values()
        .next()
        .map_or_else(Vec::new, |v| v.iter().map(|s| s.0).collect());
    let inside: Vec<i64> = ts
        .iter()
        .copied()
        .filter(|t| *t > r.down_ms && *t < r.up_ms)
        .collect();
    let outage_s = (r.up_ms - r.down_ms) / 1000;
    row.expect(
        inside.len() as i64 >= outage_s - 1,
        format!(
            "Prometheus holds {} node_load1 samples collected during the {outage_s} s outage \
             (one per second: want at least {}): {inside:?}",
            inside.len(),
            outage_s - 1
        ),
    );
    let spread = inside.last().zip(inside.first()).map_or(0, |(l, f)| l - f);
    row.expect(
        spread >= (outage_s - 2) * 1000,
        format!(
            "the outage's samples keep their collection times: they span {spread} ms of the \
             {outage_s} s outage"
        ),
    );
    let around: Vec<i64> = ts
        .iter()
        .copied()
        .filter(|t| *t > r.down_ms - 4000 && *t < r.up_ms + 4000)
        .collect();
    let widest = around
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or(i64::MAX);
    row.expect(
        around.len() > 2 && widest <= 2500,
        format!(
            "node_load1 every second from 4 s before the outage to 4 s after it: widest gap \
             {widest} ms (at most 2500: one collection may go down with the collector)"
        ),
    );
    metrics_restart_checks(&mut row, &r);
    row.verdict(Law::Exact);
}

/// The same restart with a metrics buffer of 100 samples, less than one collection: the
/// agent holds the newest 100, drops the older ones counted as
/// `records_dropped_total{stream="metrics",reason="not_connected"}` (and for no other
/// reason), Prometheus holds no more than 100 samples of the outage, and the sums hold.
#[test]
fn collector_restart_with_a_metrics_buffer_too_small() {
    let _g = exclusive();
    const BUFFER: u64 = 100;
    let (mut row, r) = metrics_restart_row("collector-restart-small-buffer", Some(BUFFER));
    let before = row.agent_last(0);
    let by_reason = before.sum_by("uctel_agent_records_dropped_total", "reason");
    let not_connected = before.count(
        "uctel_agent_records_dropped_total",
        &[("stream", "metrics"), ("reason", "not_connected")],
    );
    let all = before.count(
        "uctel_agent_records_dropped_total",
        &[("stream", "metrics")],
    );
    row.expect(
        not_connected > 0 && all == not_connected,
        format!(
            "the overflow counted: metrics records dropped as not_connected {not_connected} \
             (> 0), every reason {all} (the same); all streams by reason {by_reason:?}"
        ),
    );
    row.expect(
        r.buffered_peak == BUFFER,
        format!(
            "the buffer filled to its bound while the collector was down: peak {} of {BUFFER}",
            r.buffered_peak
        ),
    );
    // Every sample collected between the collector's exit and the agent's Welcome went
    // through the buffer; the newest 100 of them were kept and sent.
    let welcome_ms = last_welcome_ms(&row, 0).unwrap_or(0);
    let held = r
        .prom
        .raw_samples(r#"{agent="a"}"#)
        .unwrap_or_else(|e| panic!("{e}"));
    let inside: Vec<i64> = held
        .values()
        .flat_map(|v| v.iter().map(|s| s.0))
        .filter(|t| *t > r.down_ms && *t < welcome_ms)
        .collect();
    let oldest = inside.iter().min().map(|t| welcome_ms - t);
    row.expect(
        inside.len() as u64 == BUFFER && oldest.is_some_and(|o| o < 2000),
        format!(
            "Prometheus holds {} samples collected between the collector's exit and the \
             agent's Welcome {} ms later (want the buffer's {BUFFER}, all of the last \
             collections: the oldest {oldest:?} ms before the Welcome)",
            inside.len(),
            welcome_ms - r.down_ms,
        ),
    );
    metrics_restart_checks(&mut row, &r);
    row.verdict(Law::Exact);
}

/// The collector drained (SIGUSR1: it tells the agent to move; a pool of one, so nothing
/// listens until it is started again 5 s later) while host metrics flow into Prometheus:
/// what the agent's pipeline held when it ended its epoch, and the collections made while
/// no collector listened, arrive after the reconnect with their collection times; nothing
/// is dropped.
#[test]
fn collector_drained_with_metrics_buffered() {
    let _g = exclusive();
    let (mut row, r) = metrics_outage_row("collector-drain-metrics", None, Signal::SIGUSR1);
    let dropped = row.agent_last(0).count(
        "uctel_agent_records_dropped_total",
        &[("stream", "metrics")],
    );
    row.expect(
        dropped == 0,
        format!("the agent dropped {dropped} metric samples before its SIGTERM (want 0)"),
    );
    row.expect(
        row.agents[0]
            .daemon
            .log()
            .contains("the collector is draining"),
        "the agent logged the drain".to_owned(),
    );
    let held = r
        .prom
        .raw_samples(r#"node_load1{agent="a"}"#)
        .unwrap_or_else(|e| panic!("{e}"));
    let ts: Vec<i64> = held
        .values()
        .next()
        .map_or_else(Vec::new, |v| v.iter().map(|s| s.0).collect());
    let inside = ts
        .iter()
        .filter(|t| **t > r.down_ms && **t < r.up_ms)
        .count() as i64;
    let outage_s = (r.up_ms - r.down_ms) / 1000;
    let around: Vec<i64> = ts
        .iter()
        .copied()
        .filter(|t| *t > r.down_ms - 4000 && *t < r.up_ms + 4000)
        .collect();
    let widest = around
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or(i64::MAX);
    row.expect(
        inside >= outage_s - 1 && widest <= 1500,
        format!(
            "node_load1 in Prometheus: {inside} samples of the {outage_s} s without a collector \
             (want at least {}), widest gap {widest} ms from 4 s before to 4 s after (a drain \
             loses no collection: at most 1500)",
            outage_s - 1
        ),
    );
    metrics_restart_checks(&mut row, &r);
    row.verdict(Law::Exact);
}

/// Samples in `r` (raw `/api/v1/export`), and how many of them repeat a series and
/// timestamp already there (stored twice).
fn samples_and_repeats(r: &uctel_tests::victoria::RawSeries) -> (u64, u64) {
    let mut n = 0;
    let mut twice = 0;
    for s in r.values() {
        n += s.len() as u64;
        twice += s.windows(2).filter(|w| w[0].0 == w[1].0).count() as u64;
    }
    (n, twice)
}

/// The remote-write receiver hangs: two real VictoriaMetrics (the Debian package's 1.79),
/// one with its defaults, one started with `-dedup.minScrapeInterval=1ms`, both receiving the
/// collector's samples, are frozen (SIGSTOP) for 8 s — four times the endpoint's
/// `timeout_seconds` — while lines and host metrics flow, then resumed (SIGCONT). The
/// collector's requests time out and are sent again (remote-write 1.0 retries transport
/// errors); a frozen receiver still gets each timed-out request and stores it once resumed,
/// so the default VictoriaMetrics may hold a sample twice (same series, same timestamp, same
/// value), which `count_over_time` and `sum_over_time` count twice (`rate` does not). With
/// `-dedup.minScrapeInterval=1ms` it keeps one sample per series and millisecond: the row
/// asserts that this one holds every sample the collector sent exactly once, that the
/// default one holds every sample at least once (none lost), and the output's sum rule at
/// every scrape.
#[test]
fn remote_write_receiver_hung() {
    let _g = exclusive();
    let plain_dir = tempfile::Builder::new()
        .prefix("uctel-fm-vm-")
        .tempdir()
        .unwrap();
    let dedup_dir = tempfile::Builder::new()
        .prefix("uctel-fm-vm-")
        .tempdir()
        .unwrap();
    let plain = uctel_tests::victoria::Victoria::start(plain_dir.path());
    let dedup = uctel_tests::victoria::Victoria::start_with(
        dedup_dir.path(),
        &["-dedup.minScrapeInterval=1ms"],
    );
    let (plain_url, dedup_url) = (plain.write_url(), dedup.write_url());
    let mut endpoints = Vec::new();
    for url in [&plain_url, &dedup_url] {
        if let serde_yaml::Value::Sequence(s) = remote_write(url, 100_000) {
            endpoints.extend(s);
        }
    }
    let spec = CollectorSpec {
        set: vec![(
            "outputs.remote_write".into(),
            serde_yaml::Value::Sequence(endpoints),
        )],
        ..CollectorSpec::default()
    };
    let mut row = Row::start("remote-write-hung", spec, None);
    let a = row.add_agent(AgentSpec::new("a"));
    row.wait_connected(1, &[a]);
    row.write_bursts(a, 0, 1000, GAP);
    plain.freeze();
    dedup.freeze();
    let frozen = std::time::Instant::now();
    while frozen.elapsed() < Duration::from_secs(8) {
        row.write(a, 0, 100);
        std::thread::sleep(Duration::from_millis(500));
        let _ = row.scrape_collector();
    }
    plain.thaw();
    dedup.thaw();
    row.write_bursts(a, 0, 1000, GAP);
    row.wait_settled(a, 2600, SETTLE);
    row.quiesce();
    let s = remote_write_drained(&mut row);
    let selector = format!("{{agent=\"{}\"}}", row.agents[a].spec.id);
    for (name, vm, url, dedups) in [
        ("default", &plain, &plain_url, false),
        ("dedup", &dedup, &dedup_url, true),
    ] {
        let m = [("url", url.as_str())];
        let count = |n: &str| s.count(&format!("uctel_collector_remote_write_{n}"), &m);
        let (sent, stale, retried, failed) = (
            count("samples_total"),
            count("stale_markers_total"),
            count("samples_retried_total"),
            count("samples_failed_total"),
        );
        let want = sent - stale;
        // Distinct samples reach `want` once the receiver has made all of them searchable.
        let mut seen = (0, 0);
        let _ = uctel_tests::wait_for(
            "the receiver holds every sample sent",
            Duration::from_secs(30),
            Duration::from_millis(250),
            || {
                seen = samples_and_repeats(&vm.export(&selector)?);
                (seen.0 - seen.1 >= want)
                    .then_some(())
                    .ok_or(format!("{seen:?} of {want}"))
            },
        );
        let (held, twice) = seen;
        row.notes.push(format!(
            "remote-write to {name} VictoriaMetrics: sent {sent} (stale markers {stale}), retried \
             {retried}, failed {failed}; it holds {held} samples, {twice} of them stored twice"
        ));
        row.expect(
            retried > 0,
            format!("{name}: requests timed out while the receiver was frozen and were retried"),
        );
        row.expect(
            failed == 0,
            format!("{name}: no request failed for good (the receiver came back)"),
        );
        row.expect(
            held - twice == want,
            format!(
                "{name}: distinct samples held {} = sent {sent} − {stale} stale markers",
                held - twice
            ),
        );
        // What a query sees: count_over_time counts every stored sample.
        let counted = vm
            .query(&format!("sum(count_over_time({selector}[1h]))"))
            .ok()
            .and_then(|r| r.first().map(|v| v["value"][1].clone()))
            .and_then(|v| v.as_str().and_then(|x| x.parse::<f64>().ok()));
        row.notes.push(format!(
            "{name}: sum(count_over_time({selector}[1h])) = {counted:?}"
        ));
        if dedups {
            row.expect(
                twice == 0,
                format!("{name}: no sample stored twice ({twice})"),
            );
            // No sample counted twice. Once the agent said goodbye, each series ends in a
            // stale marker, and the query at that point may leave the series' last sample
            // out (depending on when it runs): at least distinct − stale markers.
            #[allow(clippy::cast_precision_loss)]
            let (high, low) = (want as f64, want.saturating_sub(stale) as f64);
            row.expect(
                counted.is_some_and(|c| c <= high && c >= low),
                format!(
                    "{name}: count_over_time counts no sample twice ({counted:?} within {low}..={high})"
                ),
            );
        }
    }
    row.verdict(Law::Exact);
}

/// A bad row in many INSERTs: ClickHouse's table has `message FixedString(N)`,
/// N chosen from the row's seeded lines so that 10 or a few more of them are longer (ClickHouse
/// refuses such a row, and with it the whole INSERT: "Too large value for FixedString"),
/// and the output sends at most 100 rows per INSERT while 3000 lines flow. Every refused
/// line is counted `dropped{reason="rejected"}` — exactly the lines longer than N — and
/// every other line is in the table exactly once; `rows_in = inserted + dropped + pending`
/// at every scrape; the records law holds for the JSON Lines sink beside it.
#[test]
fn clickhouse_bad_rows_spread_over_the_inserts() {
    let _g = exclusive();
    let name = "clickhouse-bad-rows";
    let total = 3000u64;
    let seed = uctel_tests::faults::row_seed(name);
    let lens: Vec<usize> = (0..total)
        .map(|seq| uctel_tests::faults::line_text(name, "a", seed, seq).len())
        .collect();
    // The widest column that refuses at least 10 lines (the longest lines tie often).
    let longer = |w: usize| lens.iter().filter(|&&l| l > w).count();
    let mut width = lens.iter().copied().max().unwrap_or(1);
    while width > 1 && longer(width) < 10 {
        width -= 1;
    }
    let bad: std::collections::BTreeSet<u64> = (0..total)
        .filter(|&seq| lens[usize::try_from(seq).unwrap_or(0)] > width)
        .collect();
    let mut ch = uctel_tests::clickhouse::ClickHouse::start();
    ch.query(&format!(
        "CREATE TABLE logs (ts DateTime, ts_ns UInt64, agent String, instance String, \
         stream String, stream_seq UInt64, severity String, source String, \
         message FixedString({width}), fields Nested(key String, value String)) \
         ENGINE = MergeTree PARTITION BY toYYYYMM(ts) ORDER BY (agent, ts)"
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    let spec = clickhouse_output(&ch, 100, &[]);
    let mut row = Row::start(name, spec, None);
    assert_eq!(row.seed, seed, "the row's lines are the ones measured");
    let a = row.add_agent(AgentSpec::new("a"));
    row.wait_connected(1, &[a]);
    row.write_bursts(a, 0, total, GAP);
    row.wait_settled(a, total, SETTLE);
    row.quiesce();
    let mut last = None;
    let _ = uctel_tests::wait_for(
        "clickhouse output drained",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || {
            let s = row.scrape_collector()?;
            let pending = s.count("uctel_collector_clickhouse_rows_pending", &[]);
            last = Some(s);
            (pending == 0)
                .then_some(())
                .ok_or(format!("{pending} pending"))
        },
    );
    let s = last.unwrap_or_default();
    let id = row.agents[a].spec.id.clone();
    let seqs: Vec<u64> = ch
        .query(&format!(
            "SELECT extract(toString(message), 'seq=([0-9]+)') FROM logs WHERE agent = '{id}'"
        ))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    let stored: std::collections::BTreeSet<u64> = seqs.iter().copied().collect();
    let twice = seqs.len() - stored.len();
    let good: std::collections::BTreeSet<u64> =
        (0..total).filter(|seq| !bad.contains(seq)).collect();
    let missing = good.difference(&stored).count();
    let bad_stored = stored.intersection(&bad).count();
    let c = |n: &str, m: &[(&str, &str)]| s.count(&format!("uctel_collector_clickhouse_{n}"), m);
    let rows_in = c("rows_in_total", &[]);
    let inserted = c("rows_inserted_total", &[]);
    let dropped = c("rows_dropped_total", &[]);
    let rejected = c("rows_dropped_total", &[("reason", "rejected")]);
    let pending = c("rows_pending", &[]);
    let requests = c("insert_duration_seconds_count", &[]);
    row.notes.push(format!(
        "clickhouse FixedString({width}): {total} lines, {} longer; in {rows_in}, inserted \
         {inserted}, dropped {dropped} (rejected {rejected}), pending {pending}; {requests} \
         INSERT requests (split parts included); table: {} rows, {twice} twice, {missing} good \
         lines missing, {bad_stored} bad lines stored",
        bad.len(),
        seqs.len()
    ));
    row.expect(
        !bad.is_empty() && bad.len() < 100,
        format!("the seeded lines give 1..100 bad rows ({})", bad.len()),
    );
    row.expect(
        rejected == bad.len() as u64 && dropped == rejected,
        format!(
            "every bad row counted rejected, nothing else dropped: rejected {rejected}, \
             dropped {dropped}, bad rows {}",
            bad.len()
        ),
    );
    row.expect(
        twice == 0 && missing == 0 && bad_stored == 0 && inserted == good.len() as u64,
        format!(
            "every other line in the table exactly once: {} good, {inserted} inserted, \
             {twice} twice, {missing} missing",
            good.len()
        ),
    );
    row.expect(
        rows_in == total && rows_in == inserted + dropped + pending,
        format!("rows_in {rows_in} = {total} = inserted + dropped + pending"),
    );
    row.verdict(Law::Exact);
    ch.stop();
}

/// A scrape target answering 200 MB chunked, without `Content-Length` (64 KiB chunks, 1 ms
/// apart), to a target with `body_size_limit: 4MiB`, next to a normal target, while lines
/// flow. Until the row arms it, it answers a small exposition, which gives the agent's
/// baseline peak RSS. Each big scrape fails as `body_too_large` (`up` 0) with the rest of the
/// answer unread, the agent's peak RSS grows by less than twice the limit plus 16 MiB, the
/// normal target's series arrive (`up` 1), and the lines and frames are accounted exactly.
///
/// Before `body_size_limit`, main read up to a fixed 64 MiB of each answer into one buffer
/// (and refused the key): the peak RSS grows by more than 64 MiB.
#[test]
fn scrape_target_answering_200_mb() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use uctel_tests::targets::{self, Answer};
    const LIMIT_MIB: u64 = 4;
    let _g = exclusive();
    let mut row = Row::start("scrape-200mb", CollectorSpec::default(), None);
    let armed = std::sync::Arc::new(AtomicBool::new(false));
    let big = {
        let armed = std::sync::Arc::clone(&armed);
        targets::start(move || {
            if armed.load(Ordering::SeqCst) {
                Answer::Chunked {
                    total: 200_000_000,
                    chunk: 64 << 10,
                    pause: Duration::from_millis(1),
                }
            } else {
                Answer::Text("big_target_ready 1\n".into())
            }
        })
    };
    let normal = targets::start(|| Answer::Text("# TYPE row_normal gauge\nrow_normal 42\n".into()));
    let targets: serde_yaml::Value = serde_yaml::from_str(&format!(
        "- {{url: '{}', job: big, interval_seconds: 1, timeout_seconds: 1, body_size_limit: {LIMIT_MIB}MiB}}\n\
         - {{url: '{}', job: normal, interval_seconds: 1, timeout_seconds: 1}}\n",
        big.url(),
        normal.url()
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    let a = row.add_agent(AgentSpec::new("a").set("sources.scrape", targets));
    row.wait_connected(1, &[a]);
    let pid = row.agents[a]
        .daemon
        .pid()
        .unwrap_or_else(|| panic!("agent pid"));
    uctel_tests::wait_for(
        "two small answers of the big target",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || {
            (big.served() >= 2)
                .then_some(())
                .ok_or_else(|| format!("{} served", big.served()))
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let (_, hwm0) = uctel_tests::faults::memory_kib(pid).unwrap_or_else(|| panic!("VmHWM"));
    armed.store(true, Ordering::SeqCst);
    row.write_bursts(a, 0, 2000, GAP);
    row.wait_settled(a, 2000, SETTLE);
    let too_large = |s: &uctel_tests::exposition::Scrape| {
        s.count(
            "uctel_agent_source_errors_total",
            &[("source", "scrape"), ("reason", "body_too_large")],
        )
    };
    let mut s = uctel_tests::exposition::Scrape::default();
    let _ = uctel_tests::wait_for(
        "three big scrapes failed",
        Duration::from_secs(20),
        Duration::from_millis(200),
        || {
            s = row.scrape_agent(a)?;
            (too_large(&s) >= 3)
                .then_some(())
                .ok_or_else(|| format!("{} body_too_large", too_large(&s)))
        },
    );
    let (_, hwm) = uctel_tests::faults::memory_kib(pid).unwrap_or_else(|| panic!("VmHWM"));
    let bound_kib = (2 * LIMIT_MIB + 16) * 1024;
    row.expect(
        hwm.saturating_sub(hwm0) < bound_kib,
        format!(
            "agent VmHWM grew from {hwm0} to {hwm} KiB, by less than {bound_kib} KiB \
             (2 × body_size_limit + 16 MiB)"
        ),
    );
    let too_large = too_large(&s);
    let all = s.count("uctel_agent_source_errors_total", &[("source", "scrape")]);
    row.expect(
        too_large >= 3 && all == too_large,
        format!("scrape failures: {too_large} body_too_large of {all}"),
    );
    let written = big.written();
    let unread_bound = (LIMIT_MIB + 4 + 32) << 20;
    row.expect(
        !written.is_empty() && written.iter().all(|&w| w < unread_bound),
        format!(
            "each big answer cut short, below the limit + socket buffers ({unread_bound} \
             bytes): {written:?}"
        ),
    );
    let c = row.scrape_collector().unwrap_or_else(|e| panic!("{e}"));
    let value = |name: &str, job: &str| {
        c.select(name, &[("agent", "a"), ("job", job)])
            .map(|smp| smp.value)
            .collect::<Vec<f64>>()
    };
    let (big_up, normal_up, normal) = (
        value("up", "big"),
        value("up", "normal"),
        value("row_normal", "normal"),
    );
    row.expect(
        big_up == [0.0] && normal_up == [1.0] && normal == [42.0],
        format!(
            "at the collector: big up {big_up:?} (want 0), normal up {normal_up:?} (want 1), \
             row_normal {normal:?} (want 42)"
        ),
    );
    row.quiesce();
    row.verdict(Law::Exact);
}

/// ClickHouse frozen (SIGSTOP) for 4 s — four times the output's `timeout_seconds` — while
/// lines flow, then resumed (SIGCONT): the frozen server applies the `INSERT`s it had
/// buffered once it runs again, so a blind retry would store rows twice. The output asks
/// whether a timed-out `INSERT` landed before sending it again (README "Logs into
/// ClickHouse"), so every line the agent wrote is in the table exactly once
/// (`count() = uniqExact(message)` for the agent) or counted dropped (none expected);
/// `uctel_collector_clickhouse_insert_checks_total > 0` proves the freeze caught an
/// `INSERT` in flight (the freeze is repeated, at most 3 times, until one did); the
/// records law holds for the JSON Lines sink beside it.
#[test]
fn clickhouse_frozen_mid_insert() {
    let _g = exclusive();
    let mut ch = clickhouse_with_shipped_schema();
    let spec = clickhouse_output(&ch, 500, &[("timeout_seconds", 1.0.into())]);
    let mut row = Row::start("clickhouse-frozen", spec, None);
    let a = row.add_agent(AgentSpec::new("a"));
    row.wait_connected(1, &[a]);
    row.write_bursts(a, 0, 1000, GAP);
    let inserted_once = uctel_tests::wait_for(
        "the first lines inserted",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || {
            let s = row.scrape_collector()?;
            let n = s.count("uctel_collector_clickhouse_rows_inserted_total", &[]);
            (n > 0).then_some(()).ok_or(format!("{n} inserted"))
        },
    );
    row.expect(
        inserted_once.is_ok(),
        format!("rows inserted before the freeze: {inserted_once:?}"),
    );
    let checks_of = |row: &mut Row| {
        row.scrape_collector()
            .map(|s| s.count("uctel_collector_clickhouse_insert_checks_total", &[]))
            .unwrap_or(0)
    };
    let mut freezes = 0u32;
    while freezes < 3 {
        freezes += 1;
        // 20 × 100 lines, one every 200 ms: 4 s frozen while lines flow.
        ch.freeze();
        for _ in 0..20 {
            row.write(a, 0, 100);
            std::thread::sleep(2 * GAP);
        }
        ch.resume();
        row.write_bursts(a, 0, 500, GAP);
        let checked = uctel_tests::wait_for(
            "an INSERT of unknown outcome checked",
            Duration::from_secs(10),
            Duration::from_millis(200),
            || {
                let n = checks_of(&mut row);
                (n > 0).then_some(()).ok_or(format!("{n} checks"))
            },
        );
        if checked.is_ok() {
            break;
        }
    }
    let written = row.agents[a].written();
    row.wait_settled(a, written, SETTLE);
    row.quiesce();
    let mut last = None;
    let _ = uctel_tests::wait_for(
        "clickhouse output drained",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || {
            let s = row.scrape_collector()?;
            let pending = s.count("uctel_collector_clickhouse_rows_pending", &[]);
            last = Some(s);
            (pending == 0)
                .then_some(())
                .ok_or(format!("{pending} pending"))
        },
    );
    // Let whatever the resumed server still had buffered land before counting.
    std::thread::sleep(Duration::from_secs(2));
    let s = row.scrape_collector().ok().or(last).unwrap_or_default();
    let id = row.agents[a].spec.id.clone();
    let (total, distinct) = ch
        .query(&format!(
            "SELECT count(), uniqExact(message) FROM logs WHERE agent = '{id}' FORMAT TSV"
        ))
        .ok()
        .and_then(|t| {
            let mut f = t.split_whitespace().map(|x| x.parse::<u64>().ok());
            Some((f.next()??, f.next()??))
        })
        .unwrap_or((0, 0));
    let c = |n: &str, m: &[(&str, &str)]| s.count(&format!("uctel_collector_clickhouse_{n}"), m);
    let rows_in = c("rows_in_total", &[]);
    let inserted = c("rows_inserted_total", &[]);
    let dropped = c("rows_dropped_total", &[]);
    let pending = c("rows_pending", &[]);
    let retried = c("rows_retried_total", &[]);
    let checks = c("insert_checks_total", &[]);
    let by_result: Vec<String> = ["landed", "absent", "running", "failed"]
        .iter()
        .map(|r| format!("{r} {}", c("insert_checks_total", &[("result", r)])))
        .collect();
    row.notes.push(format!(
        "clickhouse frozen {freezes}× 4 s (timeout 1 s): written {written}, in {rows_in}, \
         inserted {inserted}, dropped {dropped}, pending {pending}, retried {retried}; \
         {checks} insert checks ({}); table: {total} rows, {distinct} distinct",
        by_result.join(", ")
    ));
    row.expect(
        checks > 0,
        format!(
            "an INSERT of unknown outcome was checked ({checks} checks after {freezes} \
             freezes): the freeze caught an INSERT in flight"
        ),
    );
    row.expect(
        total == distinct,
        format!(
            "no row twice: count() {total} = uniqExact(message) {distinct}, {} duplicates",
            total.saturating_sub(distinct)
        ),
    );
    row.expect(
        distinct + dropped == written && dropped == 0,
        format!("{written} lines written = {distinct} distinct rows + {dropped} dropped (0)"),
    );
    row.expect(
        rows_in == written && inserted == distinct && pending == 0,
        format!(
            "rows_in {rows_in} = {written} written, inserted {inserted} = {distinct} in the \
             table, pending {pending} = 0"
        ),
    );
    row.verdict(Law::Exact);
    ch.stop();
}

/// Logs on RC through a 30 s data-path outage (every UDP datagram to the collector dropped
/// by an nft rule, the control connection up), far beyond the RC retry budget: the RC QP
/// fails with `retry_exceeded` at each session while the outage lasts, and the lines not
/// acknowledged are read again from the last acknowledged one after each reconnect
/// (DESIGN.md §8b). Once the path is back every line is delivered exactly once: no log
/// frame or record lost, no gap on the RC lane; everything exact.
#[test]
fn rc_logs_through_a_30s_data_path_outage() {
    let _g = exclusive();
    const NAME: &str = "rc-logs-outage-30s";
    if let Some(why) = root_missing(&["nft", "ip"]) {
        return skip(NAME, &why);
    }
    let mut row = blackhole_row(NAME);
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
    row.write_bursts(a, 0, 1000, GAP);
    row.wait_delivered(a, 0, 0..1000, SETTLE);
    hole.engage().unwrap_or_else(|e| panic!("row={NAME}: {e}"));
    let engaged = std::time::Instant::now();
    while engaged.elapsed() < Duration::from_secs(30) {
        row.write_bursts(a, 0, 400, GAP);
        std::thread::sleep(Duration::from_secs(1));
    }
    let blackholed = hole.release().unwrap_or_else(|e| panic!("row={NAME}: {e}"));
    row.notes
        .push(format!("UDP blackholed for {:.1?}", engaged.elapsed()));
    row.write_bursts(a, 0, 1000, GAP);
    let written = row.agents[a].written();
    // The agent reconnects after its backoff (grown during the outage), then catches up.
    row.wait_delivered(a, 0, 0..written, Duration::from_secs(120));
    row.wait_settled(a, written, SETTLE);
    let failures = row
        .agent_last(a)
        .count("uctel_agent_rc_lane_failures_total", &[]);
    row.quiesce();
    let c = row.collector_figures("a");
    let gaps = row
        .collector_last()
        .count("uctel_collector_rc_gap_frames_total", &[("agent", "a")]);
    row.expect(
        blackholed > 0 && failures > 0,
        format!("nft dropped {blackholed} datagrams; RC lane failures {failures}"),
    );
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

// ---- Reload without a restart: SIGHUP and POST /-/reload under load. ----

/// One HTTP/1.1 request to `addr` (`POST /-/reload`); the status code and the body.
fn http_request(addr: std::net::SocketAddr, method: &str, target: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return (0, format!("cannot connect to {addr}"));
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(60)));
    let _ = write!(
        s,
        "{method} {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    );
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, out)
}

/// A daemon's configuration file as YAML.
fn read_config(path: &std::path::Path) -> uctel_tests::configs::Yaml {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    uctel_tests::configs::Yaml(serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{e}")))
}

/// Sets `key` (`outputs.<output>…`) to `value` in the collector's configuration file, sends
/// it `SIGHUP`, and expects its log to say within 60 s that the reload applied the output.
fn reload_collector_output(row: &mut Row, key: &str, value: impl Into<serde_yaml::Value>) {
    let output: Vec<&str> = key.split('.').take(2).collect();
    let output = output.join(".");
    let path = row.collector.config_path().to_path_buf();
    let mut y = read_config(&path);
    y.set(key, value);
    y.write(&path);
    row.collector.signal(Signal::SIGHUP);
    let applied = wait_logged(
        || row.collector.log(),
        &format!("configuration reloaded: applied {output}"),
        1,
    );
    row.expect(
        applied,
        format!("the collector applied the changed {output}"),
    );
}

/// Waits until `log()` has `n` lines containing `needle`; false on timeout.
fn wait_logged(log: impl Fn() -> String, needle: &str, n: usize) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        if log().matches(needle).count() >= n {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// Reload under load: 3000 lines written at once, then at once `SIGHUP` to the agent with
/// its log source changed (another poll interval: same file, tailer handed over from its
/// checkpoint) and a second log source added, and `SIGHUP` to the collector with a key that
/// needs a restart changed (`staleness_seconds`, the series store's: refused whole, its
/// `log_level` change beside it not applied; an output change is live, the row
/// `reload_under_load_moves_remote_write_to_another_receiver`). More lines to both files
/// after. Every line delivered exactly once, one session from start to end, the reload
/// metrics say what happened (agent 1, collector 0).
#[test]
fn reload_under_load_changes_a_source_and_refuses_a_restart_key() {
    let _g = exclusive();
    let (mut row, a) = one_agent_row("reload-under-load");
    let other = row.add_source(a, "other", "other.log");
    row.write_bursts(a, 0, 500, GAP);
    row.write(a, 0, 3000);

    let agent_config = row.agents[a].daemon.config_path().to_path_buf();
    let mut y = read_config(&agent_config);
    let mut logs = y
        .get("sources.logs")
        .and_then(|v| v.as_sequence())
        .cloned()
        .unwrap_or_default();
    let mut second = logs[0].clone();
    if let Some(m) = logs[0].as_mapping_mut() {
        m.insert("poll_interval_seconds".into(), 0.02.into());
    }
    if let Some(m) = second.as_mapping_mut() {
        let path = row.input().join("other.log").display().to_string();
        m.insert("path".into(), path.into());
        m.insert("start_at".into(), "beginning".into());
    }
    logs.push(second);
    y.set("sources.logs", serde_yaml::Value::Sequence(logs));
    y.write(&agent_config);
    row.agents[a].daemon.signal(Signal::SIGHUP);

    let collector_config = row.collector.config_path().to_path_buf();
    let original = std::fs::read_to_string(&collector_config).unwrap_or_default();
    let mut y = read_config(&collector_config);
    y.set("staleness_seconds", 301);
    y.set("log_level", "debug");
    y.write(&collector_config);
    row.collector.signal(Signal::SIGHUP);

    let agent_log = || row.agents[a].daemon.log();
    let applied = wait_logged(agent_log, "configuration reloaded: applied sources.logs", 1);
    let refused = wait_logged(
        || row.collector.log(),
        "staleness_seconds needs a restart",
        1,
    );
    row.expect(
        applied,
        "the agent applied the changed and the added log source",
    );
    row.expect(refused, "the collector refused the restart key, naming it");
    std::fs::write(&collector_config, original).unwrap_or_else(|e| panic!("{e}"));

    row.write_bursts(a, 0, 1000, GAP);
    row.write(a, other, 700);
    let written = row.agents[a].written();
    row.wait_settled(a, written, SETTLE);
    let agent_ok = row
        .agent_last(a)
        .count("uctel_agent_config_last_reload_successful", &[]);
    let collector_ok = row
        .scrape_collector()
        .map(|s| s.count("uctel_collector_config_last_reload_successful", &[]))
        .unwrap_or(9);
    row.expect(
        agent_ok == 1 && collector_ok == 0,
        format!(
            "last reload successful: agent {agent_ok} (want 1), collector {collector_ok} (want 0)"
        ),
    );
    let clog = row.collector.log();
    row.expect(
        !clog.contains("DEBUG"),
        "the collector's log_level change was not applied beside the refused key",
    );
    row.quiesce();
    let sessions = uctel_tests::faults::welcomed_sessions(&row.collector.log(), "a");
    row.expect(
        sessions == 1,
        format!("sessions of agent a: {sessions} (want 1)"),
    );
    row.verdict(Law::Exact);
}

/// A broken configuration on reload (`POST /-/reload`, lifecycle on, under load): both
/// daemons answer 500 with every problem, change nothing (the log source keeps its tailer,
/// the session goes on) and set `config_last_reload_successful` to 0; the file fixed, the
/// next reload succeeds again. Every line delivered exactly once.
#[test]
fn reload_of_a_broken_config_changes_nothing() {
    let _g = exclusive();
    let spec = CollectorSpec {
        set: vec![("listen.enable_lifecycle".into(), true.into())],
        ..CollectorSpec::default()
    };
    let mut row = Row::start("reload-broken-config", spec, None);
    let a = row.add_agent(AgentSpec::new("a").set("listen.enable_lifecycle", true));
    row.wait_connected(1, &[a]);
    row.write_bursts(a, 0, 500, GAP);
    row.write(a, 0, 2000);

    let paths = [
        row.agents[a].daemon.config_path().to_path_buf(),
        row.collector.config_path().to_path_buf(),
    ];
    let originals: Vec<String> = paths
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap_or_default())
        .collect();
    for (p, o) in paths.iter().zip(&originals) {
        // An unknown key, a bad value and a bad log filter: three problems.
        std::fs::write(
            p,
            format!("{o}\nnot_a_key: 1\nlog_level: inof\nmax_frame_bytes: lots\n"),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    }
    let addrs = [row.agents[a].metrics, row.addrs.metrics];
    for (who, addr) in ["agent", "collector"].iter().zip(addrs) {
        let (status, body) = http_request(addr, "POST", "/-/reload");
        row.expect(
            status == 500
                && body.contains("not_a_key")
                && body.contains("log_level")
                && body.contains("max_frame_bytes")
                && body.contains("nothing changed"),
            format!("{who}: broken file answered {status} with every problem: {body}"),
        );
    }
    let agent_ok = row
        .scrape_agent(a)
        .map(|s| s.count("uctel_agent_config_last_reload_successful", &[]))
        .unwrap_or(9);
    let collector_ok = row
        .scrape_collector()
        .map(|s| s.count("uctel_collector_config_last_reload_successful", &[]))
        .unwrap_or(9);
    row.expect(
        agent_ok == 0 && collector_ok == 0,
        format!("after the broken file: agent {agent_ok}, collector {collector_ok} (want 0, 0)"),
    );
    row.write_bursts(a, 0, 1000, GAP);
    for (p, o) in paths.iter().zip(&originals) {
        std::fs::write(p, o).unwrap_or_else(|e| panic!("{e}"));
    }
    for (who, addr) in ["agent", "collector"].iter().zip(addrs) {
        let (status, body) = http_request(addr, "POST", "/-/reload");
        row.expect(
            status == 200 && body.contains("nothing changed"),
            format!("{who}: the fixed file answered {status}: {body}"),
        );
    }
    let written = row.agents[a].written();
    row.wait_settled(a, written, SETTLE);
    let agent_ok = row
        .agent_last(a)
        .count("uctel_agent_config_last_reload_successful", &[]);
    row.expect(
        agent_ok == 1,
        format!("agent after the fix: {agent_ok} (want 1)"),
    );
    row.quiesce();
    let sessions = uctel_tests::faults::welcomed_sessions(&row.collector.log(), "a");
    row.expect(
        sessions == 1,
        format!("sessions of agent a: {sessions} (want 1)"),
    );
    row.verdict(Law::Exact);
}

/// Loss in the collector's log while it happens: at 5 % datagram loss for more
/// than one 10 s window, the collector logs `lost N frames / M records in the last 10 s`
/// for the agent's streams before the session ends, and the frames it logs add up to at
/// most what `frames_lost_total` counts at the end (the tail settled at Goodbye comes after).
#[test]
fn uc_drop_logs_loss_while_it_happens() {
    let _g = exclusive();
    let mut row = Row::start("live-loss-log", CollectorSpec::default(), None);
    let a = row.add_agent(AgentSpec::new("a").fault("drop_ratio", 0.05));
    row.wait_connected(1, &[a]);
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_secs(23) {
        row.write_bursts(a, 0, 400, GAP);
        std::thread::sleep(Duration::from_millis(500));
    }
    let during = row.collector.log();
    let written = row.agents[a].written();
    row.wait_settled(a, written, SETTLE);
    row.quiesce();
    let logged: u64 = during
        .lines()
        .filter(|l| l.contains("agent a stream") && l.contains("in the last 10 s"))
        .filter_map(|l| {
            l.split("lost ")
                .nth(1)?
                .split(' ')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    let lost = row.collector_figures("a").lost_total();
    row.expect(
        logged > 0 && logged <= lost,
        format!("frames lost logged while it happened {logged}, counted {lost} (want 0 < logged <= counted)"),
    );
    row.verdict(Law::Exact);
}

/// Sets agent `a`'s `sources.logs` to its first entry plus, when `other` is set, a copy of it
/// reading `input/other.log` from the beginning; writes the file and sends `SIGHUP`.
fn reload_logs(row: &mut Row, a: usize, other: bool) {
    let path = row.agents[a].daemon.config_path().to_path_buf();
    let mut y = read_config(&path);
    let mut logs = y
        .get("sources.logs")
        .and_then(|v| v.as_sequence())
        .cloned()
        .unwrap_or_default();
    logs.truncate(1);
    if other {
        let mut second = logs[0].clone();
        if let Some(m) = second.as_mapping_mut() {
            let file = row.input().join("other.log").display().to_string();
            m.insert("path".into(), file.into());
            m.insert("start_at".into(), "beginning".into());
        }
        logs.push(second);
    }
    y.set("sources.logs", serde_yaml::Value::Sequence(logs));
    y.write(&path);
    row.agents[a].daemon.signal(Signal::SIGHUP);
}

/// A log source removed by a reload keeps its checkpoint: lines written to its file while
/// it is out of the list are read when a later reload puts it back, from where it stopped
/// (not again from the beginning its `start_at` names). Every line exactly once, one
/// session.
#[test]
fn reload_removes_and_restores_a_log_source() {
    let _g = exclusive();
    let (mut row, a) = one_agent_row("reload-remove-restore");
    let other = row.add_source(a, "other", "other.log");
    reload_logs(&mut row, a, true);
    let applied = "configuration reloaded: applied sources.logs";
    let ok = wait_logged(|| row.agents[a].daemon.log(), applied, 1);
    row.expect(ok, "the added source applied");
    row.write_bursts(a, other, 800, GAP);
    row.write(a, 0, 300);
    row.wait_delivered(a, other, 0..800, SETTLE);
    reload_logs(&mut row, a, false);
    let ok = wait_logged(|| row.agents[a].daemon.log(), applied, 2);
    row.expect(ok, "the removed source applied");
    row.write(a, other, 500);
    row.write(a, 0, 300);
    std::thread::sleep(Duration::from_secs(1));
    reload_logs(&mut row, a, true);
    let ok = wait_logged(|| row.agents[a].daemon.log(), applied, 3);
    row.expect(ok, "the source put back applied");
    let written = row.agents[a].written();
    row.wait_settled(a, written, SETTLE);
    row.quiesce();
    let sessions = uctel_tests::faults::welcomed_sessions(&row.collector.log(), "a");
    row.expect(
        sessions == 1,
        format!("sessions of agent a: {sessions} (want 1)"),
    );
    row.verdict(Law::Exact);
}
// ---- OTLP output rows ----------------------------------------------------------------

/// What an OTLP receiver fault does to the OTLP output.
enum OtlpFault {
    /// No listener for 30 s (connections refused, open ones closed unanswered).
    Down,
    /// 503 with `Retry-After: 1` for 10 s.
    Unavailable,
    /// 200 with a partial success rejecting the last 3 items of each request for 10 s.
    Partial,
}

/// A row with one agent whose collector sends its samples and log records over OTLP/HTTP
/// to a receiver in the test ([`uctel_tests::otlp::Receiver`]) while `fault` lasts, lines
/// flowing before, during and after. At the end, per signal, what the output took in is
/// what the receiver holds plus what the output counted dropped — every sample and record
/// delivered or counted — the receiver holds no log record twice and only lines the
/// collector delivered to its JSON Lines sink; the output's sum rule holds at every scrape
/// (`faults::output_sum_failures`) and the records law for the sink beside it.
fn otlp_row(name: &str, fault: &OtlpFault) {
    use uctel_tests::otlp::{Mode, Receiver};
    let receiver = Receiver::start(Mode::Accept);
    let mut otlp = serde_yaml::Mapping::new();
    for (k, v) in [
        ("endpoint", serde_yaml::Value::from(receiver.endpoint())),
        ("batch_send_deadline_seconds", 0.2.into()),
        ("max_items_per_request", 500.into()),
        ("min_backoff_seconds", 0.05.into()),
        ("max_backoff_seconds", 2.0.into()),
        ("timeout_seconds", 2.0.into()),
    ] {
        otlp.insert(k.into(), v);
    }
    let spec = CollectorSpec {
        set: vec![("outputs.otlp".into(), serde_yaml::Value::Mapping(otlp))],
        ..CollectorSpec::default()
    };
    let mut row = Row::start(name, spec, None);
    let a = row.add_agent(AgentSpec::new("a"));
    row.wait_connected(1, &[a]);
    row.write_bursts(a, 0, 1000, GAP);
    let (mode, lasts) = match fault {
        OtlpFault::Down => (Mode::Down, Duration::from_secs(30)),
        OtlpFault::Unavailable => (Mode::Status(503, Some(1)), Duration::from_secs(10)),
        OtlpFault::Partial => (Mode::Partial(3), Duration::from_secs(10)),
    };
    receiver.set_mode(mode);
    let began = std::time::Instant::now();
    while began.elapsed() < lasts {
        row.write(a, 0, 100);
        std::thread::sleep(Duration::from_millis(500));
        let _ = row.scrape_collector();
    }
    receiver.set_mode(Mode::Accept);
    row.notes
        .push(format!("receiver fault for {:.1?}", began.elapsed()));
    row.write_bursts(a, 0, 1000, GAP);
    let written = row.agents[a].written();
    row.wait_settled(a, written, SETTLE);
    row.quiesce();
    let mut last = None;
    let _ = uctel_tests::wait_for(
        "otlp output drained",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || {
            let s = row.scrape_collector()?;
            let pending = s.count("uctel_collector_otlp_items_pending", &[]);
            last = Some(s);
            (pending == 0)
                .then_some(())
                .ok_or(format!("{pending} pending"))
        },
    );
    let s = last.unwrap_or_default();
    let sink: std::collections::BTreeSet<String> =
        std::fs::read_to_string(row.path().join("collector-logs.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| v["message"].as_str().map(str::to_owned))
            .collect();
    let (points, records, twice, foreign, rejected) = receiver.with(|h| {
        let bodies: std::collections::BTreeSet<&str> =
            h.records.iter().map(|r| r.body.as_str()).collect();
        let foreign = bodies.iter().filter(|b| !sink.contains(**b)).count();
        (
            h.points.len() as u64,
            h.records.len() as u64,
            h.records.len() - bodies.len(),
            foreign,
            h.rejected.values().sum::<u64>(),
        )
    });
    let c = |n: &str, m: &[(&str, &str)]| s.count(&format!("uctel_collector_otlp_{n}"), m);
    for (signal, held) in [("metrics", points), ("logs", records)] {
        let m = [("signal", signal)];
        let (input, sent, dropped, retried) = (
            c("items_in_total", &m),
            c("items_sent_total", &m),
            c("items_dropped_total", &m),
            c("items_retried_total", &m),
        );
        row.notes.push(format!(
            "otlp {signal}: in {input}, sent {sent}, dropped {dropped}, retried {retried}; \
             the receiver holds {held}"
        ));
        row.expect(
            input > 0 && input == held + dropped && sent == held,
            format!(
                "otlp {signal}: every item delivered or counted: in {input} = held {held} + \
                 dropped {dropped}, sent {sent} = held"
            ),
        );
        match fault {
            OtlpFault::Down | OtlpFault::Unavailable => {
                row.expect(
                    retried > 0 && dropped == 0,
                    format!("otlp {signal}: retried {retried} > 0 and nothing dropped ({dropped})"),
                );
            }
            OtlpFault::Partial => {}
        }
    }
    let lines = c("items_in_total", &[("signal", "logs")]);
    row.expect(
        lines == sink.len() as u64 && twice == 0 && foreign == 0,
        format!(
            "otlp logs: took in {lines} = {} lines of the sink; the receiver holds {twice} \
             twice, {foreign} not in the sink",
            sink.len()
        ),
    );
    if let OtlpFault::Partial = fault {
        let partial = c("items_dropped_total", &[("reason", "partial_success")]);
        let dropped = c("items_dropped_total", &[]);
        row.expect(
            partial > 0 && partial == rejected && dropped == partial,
            format!(
                "otlp: dropped partial_success {partial} = the receiver's rejected {rejected}, \
                 nothing else dropped ({dropped})"
            ),
        );
    }
    row.verdict(Law::Exact);
}

/// The OTLP receiver down for 30 s while samples and lines flow: the output retries with
/// backoff and, once the receiver is back, delivers everything; nothing dropped.
#[test]
fn otlp_receiver_down_30s() {
    let _g = exclusive();
    otlp_row("otlp-receiver-down-30s", &OtlpFault::Down);
}

/// The OTLP receiver answering 503 with `Retry-After: 1` for 10 s: retried, everything
/// delivered afterwards; nothing dropped.
#[test]
fn otlp_receiver_answering_503() {
    let _g = exclusive();
    otlp_row("otlp-receiver-503", &OtlpFault::Unavailable);
}

/// The OTLP receiver answering partial successes for 10 s: the items it rejected are
/// counted `dropped{reason="partial_success"}`, exactly its count; the rest delivered.
#[test]
fn otlp_receiver_answering_partial_success() {
    let _g = exclusive();
    otlp_row("otlp-receiver-partial-success", &OtlpFault::Partial);
}

// ---------------------------------------------------------------------------------------------
// Credits written into the agent's memory (DESIGN.md §4, §6): the collector grants credit by
// UC RDMA WRITE into a region the agent named at `Hello`. In these rows the collector sends
// its `Report` only every 1000 report intervals (`credit_writes_report_every_intervals`), so
// after the `Welcome` the agent's credit comes from the writes alone; the agent's soft
// transport injects faults on what it receives, which on a UC-only agent is nothing but the
// credit writes (direction `recv`: its frames to the collector are untouched).
// ---------------------------------------------------------------------------------------------

/// A row whose collector writes credits (reports 1000× rarer) with `collector_set`, one agent
/// whose received datagrams (the credit writes) suffer `fault`, 3000 lines in bursts.
fn credit_write_row(
    name: &str,
    collector_set: Vec<(String, serde_yaml::Value)>,
    fault: &[(&str, serde_yaml::Value)],
    during: impl FnOnce(&mut Row, usize),
) -> Row {
    let mut set = vec![
        (
            "control.credit_writes_report_every_intervals".to_owned(),
            serde_yaml::Value::from(1000),
        ),
        (
            "control.report_interval_seconds".to_owned(),
            serde_yaml::Value::from(0.05),
        ),
    ];
    set.extend(collector_set);
    let spec = CollectorSpec {
        set,
        ..CollectorSpec::default()
    };
    let mut row = Row::start(name, spec, None);
    let mut agent = AgentSpec::new("a").fault("direction", "recv");
    for (k, v) in fault {
        agent = agent.fault(k, v.clone());
    }
    let a = row.add_agent(agent);
    row.wait_connected(1, &[a]);
    during(&mut row, a);
    row.write_bursts(a, 0, 3000, GAP);
    row.wait_delivered(a, 0, 0..row.agents[a].written(), SETTLE * 2);
    row.wait_settled(a, row.agents[a].written(), SETTLE);
    row.quiesce();
    row
}

/// The checks every credit-write row makes besides the law: the collector wrote credit words
/// (and the agent's credit came from them: a window of 64 frames carries far less than the
/// row's lines and host metrics), no heartbeat ever said the agent sent at or beyond the
/// largest limit it was granted, and nothing lapped the ring.
fn credit_write_checks(row: &mut Row) {
    let s = row.collector_last();
    let posted = s.count(
        "uctel_collector_credit_writes_total",
        &[("result", "posted")],
    );
    let overruns = s.count("uctel_collector_credit_overruns_total", &[]);
    let lapped = s.count(
        "uctel_collector_frames_dropped_total",
        &[("agent", "a"), ("reason", "ring_overrun")],
    );
    let frames = row.goodbye_sum("a", "frames");
    row.expect(
        posted > 0 && frames > 64,
        format!(
            "credit words posted {posted} > 0 for {frames} frames sent (> the 64-frame window)"
        ),
    );
    row.expect(
        overruns == 0 && lapped == 0,
        format!("credit overruns {overruns}, ring_overrun drops {lapped} (want 0, 0)"),
    );
}

#[test]
fn credit_writes_dropped_20_percent() {
    let _g = exclusive();
    let mut row = credit_write_row(
        "credit-writes-drop-20pct",
        Vec::new(),
        &[("drop_ratio", 0.2.into())],
        |_, _| {},
    );
    let injected = row.goodbye_sum("a", "fault_dropped");
    let c = row.collector_figures("a");
    row.expect(
        injected > 0 && c.lost_total() == 0,
        format!(
            "credit writes dropped by the injector {injected} > 0; frames lost {} (want 0: \
             the frames' direction has no faults)",
            c.lost_total()
        ),
    );
    credit_write_checks(&mut row);
    row.verdict(Law::Exact);
}

#[test]
fn credit_writes_reordered_and_duplicated() {
    let _g = exclusive();
    let mut row = credit_write_row(
        "credit-writes-reorder-dup",
        Vec::new(),
        &[
            ("reorder_ratio", 0.3.into()),
            ("reorder_window", 4.into()),
            ("duplicate_ratio", 0.3.into()),
        ],
        |_, _| {},
    );
    let c = row.collector_figures("a");
    row.expect(
        c.lost_total() == 0,
        format!("frames lost {} (want 0)", c.lost_total()),
    );
    credit_write_checks(&mut row);
    row.verdict(Law::Exact);
}

/// The collector is stopped (SIGSTOP, 3 s: less than the dead-peer time) while the agent
/// holds credit and keeps writing lines: the agent sends what its last credit word allows and
/// no more (the frames wait in the collector's socket buffer, which the budget sized), then
/// takes the new words once the collector runs again.
#[test]
fn credit_writes_collector_stopped_while_agents_hold_credit() {
    let _g = exclusive();
    let mut row = credit_write_row(
        "credit-writes-collector-stopped",
        Vec::new(),
        &[],
        |row, a| {
            row.write_bursts(a, 0, 500, GAP);
            row.collector.signal(Signal::SIGSTOP);
            row.write_bursts(a, 0, 1000, Duration::from_millis(60));
            std::thread::sleep(Duration::from_secs(1));
            row.collector.signal(Signal::SIGCONT);
        },
    );
    let c = row.collector_figures("a");
    row.expect(
        c.lost_total() == 0,
        format!("frames lost {} (want 0)", c.lost_total()),
    );
    credit_write_checks(&mut row);
    row.verdict(Law::Exact);
}

// ---------------------------------------------------------------------------------------
// Series dictionary (`uctel_protocol::dict`): rows whose metrics stream carries probe series
// that change every half second (a textfile), each probe's value naming its own series, so
// a sample decoded under another series' name shows at the first scrape after it.
// ---------------------------------------------------------------------------------------

/// Probe series `uctel_dict_probe{i="N"}` with value `N * 1000 + round`, written atomically.
fn write_dict_probes(dir: &std::path::Path, round: u64) {
    let start = round + if round % 6 == 0 { 13 } else { 0 };
    let mut text = String::from("# TYPE uctel_dict_probe gauge\n");
    for i in start..start + 30 + round % 7 {
        text.push_str(&format!(
            "uctel_dict_probe{{i=\"{i}\"}} {}\n",
            i * 1000 + round
        ));
    }
    let tmp = dir.join("probe.prom.tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, dir.join("probe.prom")).unwrap();
}

/// The probe samples of agent `a` at the collector under a name that is not their own.
fn wrong_dict_names(row: &mut Row) -> Vec<String> {
    let Ok(s) = row.scrape_collector() else {
        return Vec::new();
    };
    s.select("uctel_dict_probe", &[("agent", "a")])
        .filter(|smp| {
            let i: f64 = smp.label("i").and_then(|v| v.parse().ok()).unwrap_or(-1.0);
            (smp.value / 1000.0).floor() != i
        })
        .map(|smp| format!("uctel_dict_probe{{i={:?}}} = {}", smp.label("i"), smp.value))
        .collect()
}

/// `rounds` rounds of probe churn with log bursts, checking names at every round.
fn dict_churn(
    row: &mut Row,
    a: usize,
    dir: &std::path::Path,
    rounds: std::ops::Range<u64>,
) -> Vec<String> {
    let mut wrong = Vec::new();
    for round in rounds {
        write_dict_probes(dir, round);
        row.write_bursts(a, 0, 60, GAP);
        std::thread::sleep(Duration::from_millis(500));
        wrong.extend(wrong_dict_names(row));
    }
    wrong
}

fn dict_agent(dir: &std::path::Path) -> AgentSpec {
    AgentSpec::new("a")
        .fault("drop_ratio", 0.2)
        .fault("duplicate_ratio", 0.1)
        .fault("reorder_ratio", 0.1)
        .fault("reorder_window", 3)
        .set("sources.textfile.directory", dir.display().to_string())
        .set("sources.textfile.interval_seconds", 0.5)
        .set("sources.host_metrics.interval_seconds", 0.5)
}

/// Series dictionary under 20 % loss, duplication and reordering with series churn, and an
/// agent restart (SIGTERM, a new epoch: both dictionaries start empty): no probe sample under
/// a wrong name at any scrape, nothing dropped as malformed, the law exact.
#[test]
fn series_dictionary_loss_churn_and_agent_restart() {
    let _g = exclusive();
    let mut row = Row::start("series-dictionary", CollectorSpec::default(), None);
    let dir = row.path().join("probes");
    std::fs::create_dir_all(&dir).unwrap();
    write_dict_probes(&dir, 0);
    let a = row.add_agent(dict_agent(&dir));
    row.wait_connected(1, &[a]);
    let mut wrong = dict_churn(&mut row, a, &dir, 1..12);
    row.stop_agent(a);
    row.restart_agent(a);
    row.wait_connected(1, &[a]);
    wrong.extend(dict_churn(&mut row, a, &dir, 12..24));
    let written = row.agents[a].written();
    row.wait_settled(a, written, SETTLE);
    row.quiesce();
    let c = row.collector_figures("a");
    row.expect(
        wrong.is_empty(),
        format!("probe samples under a wrong name: {wrong:?}"),
    );
    row.expect(
        c.dropped.get("malformed_payload").copied().unwrap_or(0) == 0,
        format!("frames dropped as malformed: {:?}", c.dropped),
    );
    row.expect(
        c.lost["metrics"] > 0,
        format!(
            "metrics frames lost {} (the fault must bite)",
            c.lost["metrics"]
        ),
    );
    row.verdict(Law::Exact);
}

/// Series dictionary across a collector SIGKILL and restart (a new, empty dictionary; the
/// agent reconnects with a new epoch and defines its series again) under 20 % loss with
/// series churn: no probe sample under a wrong name, nothing dropped as malformed; the dead
/// session's tail is unknowable (the law is `≤`, as for every kill).
#[test]
fn series_dictionary_collector_restart() {
    let _g = exclusive();
    let mut row = Row::start(
        "series-dictionary-collector-restart",
        CollectorSpec::default(),
        None,
    );
    let dir = row.path().join("probes");
    std::fs::create_dir_all(&dir).unwrap();
    write_dict_probes(&dir, 0);
    let a = row.add_agent(dict_agent(&dir));
    row.wait_connected(1, &[a]);
    let mut wrong = dict_churn(&mut row, a, &dir, 1..10);
    row.kill_collector();
    std::thread::sleep(Duration::from_secs(1));
    row.restart_collector();
    row.wait_connected(1, &[a]);
    wrong.extend(dict_churn(&mut row, a, &dir, 10..20));
    let written = row.agents[a].written();
    row.wait_settled(a, written, SETTLE);
    row.quiesce();
    let c = row.collector_figures("a");
    row.expect(
        wrong.is_empty(),
        format!("probe samples under a wrong name: {wrong:?}"),
    );
    row.expect(
        c.dropped.get("malformed_payload").copied().unwrap_or(0) == 0,
        format!("frames dropped as malformed: {:?}", c.dropped),
    );
    row.verdict(Law::AtMost);
}

// Rows of the journald and kernel log sources: `fault_matrix/sources.rs`.
mod sources;

/// Reload under load changes a scrape target: lines flowing, a `SIGHUP` adds a scrape
/// target (a real HTTP target) and changes the host-metrics interval; its series reach the
/// collector. A second `SIGHUP` removes it: it is not scraped any more, and its series leave
/// the collector's `/metrics`. Every line delivered exactly once, one session throughout,
/// `uctel_agent_config_last_reload_successful` 1.
#[test]
fn reload_under_load_changes_a_scrape_target() {
    let _g = exclusive();
    let spec = CollectorSpec {
        set: vec![("staleness_seconds".into(), 2.0.into())],
        ..CollectorSpec::default()
    };
    let mut row = Row::start("reload-scrape-target", spec, None);
    let a = row.add_agent(AgentSpec::new("a"));
    row.wait_connected(1, &[a]);
    let target = uctel_tests::targets::start(|| {
        uctel_tests::targets::Answer::Text("reload_row_probe 42\n".into())
    });
    row.write_bursts(a, 0, 500, GAP);
    row.write(a, 0, 2000);

    let agent_config = row.agents[a].daemon.config_path().to_path_buf();
    let original = read_config(&agent_config);
    let mut y = read_config(&agent_config);
    let mut t = serde_yaml::Mapping::new();
    t.insert("url".into(), target.url().into());
    t.insert("interval_seconds".into(), 0.5.into());
    y.set(
        "sources.scrape",
        serde_yaml::Value::Sequence(vec![serde_yaml::Value::Mapping(t)]),
    );
    y.set("sources.host_metrics.interval_seconds", 0.5);
    y.write(&agent_config);
    row.agents[a].daemon.signal(Signal::SIGHUP);
    let applied = wait_logged(
        || row.agents[a].daemon.log(),
        "configuration reloaded: applied",
        1,
    );
    row.expect(applied, "the agent applied the added target");
    row.write_bursts(a, 0, 500, GAP);
    let has_probe = |row: &mut Row| {
        row.scrape_collector()
            .map(|s| s.has("reload_row_probe", &[]))
            .unwrap_or(false)
    };
    let mut seen = false;
    for _ in 0..100 {
        if has_probe(&mut row) {
            seen = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    row.expect(
        seen && target.served() > 0,
        format!(
            "the added target scraped ({} answers) and its series on the collector",
            target.served()
        ),
    );

    original.write(&agent_config);
    row.agents[a].daemon.signal(Signal::SIGHUP);
    let removed = wait_logged(
        || row.agents[a].daemon.log(),
        "configuration reloaded: applied",
        2,
    );
    row.expect(removed, "the agent applied the removed target");
    row.write_bursts(a, 0, 500, GAP);
    let mut gone = false;
    for _ in 0..100 {
        if !has_probe(&mut row) {
            gone = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let served = target.served();
    std::thread::sleep(Duration::from_millis(1500));
    row.expect(
        gone && target.served() == served,
        format!(
            "the removed target not scraped any more ({served} then {} answers) and its \
             series gone from the collector: {gone}",
            target.served()
        ),
    );
    let written = row.agents[a].written();
    row.wait_settled(a, written, SETTLE);
    let agent_ok = row
        .agent_last(a)
        .count("uctel_agent_config_last_reload_successful", &[]);
    row.expect(
        agent_ok == 1,
        format!("last reload successful: agent {agent_ok} (want 1)"),
    );
    row.quiesce();
    let sessions = uctel_tests::faults::welcomed_sessions(&row.collector.log(), "a");
    row.expect(
        sessions == 1,
        format!("sessions of agent a: {sessions} (want 1)"),
    );
    row.verdict(Law::Exact);
}

/// A series-dictionary collector restart (`stop`: SIGKILL, or SIGTERM for a graceful
/// restart whose `Goodbye` ends the session) while the agent's probe series churn under
/// 20 % loss, duplication and reordering: probes keep churning while the collector is down,
/// the agent reconnects to the new collector (a new epoch: both dictionaries start empty).
/// Checks: at every scrape no probe sample under a wrong name, nothing dropped as
/// malformed, probes served after the restart, and the new collector's one session
/// accounted exactly: the agent's `goodbye sent` figures for the metrics and logs streams
/// (frames and records) equal the new collector's received + lost (+ replayed).
fn dict_collector_restart_row(name: &str, stop: Signal) -> Row {
    let mut row = Row::start(name, CollectorSpec::default(), None);
    let dir = row.path().join("probes");
    std::fs::create_dir_all(&dir).unwrap();
    write_dict_probes(&dir, 0);
    let a = row.add_agent(dict_agent(&dir));
    row.wait_connected(1, &[a]);
    let mut wrong = dict_churn(&mut row, a, &dir, 1..8);
    if stop == Signal::SIGKILL {
        row.kill_collector();
    } else {
        let _ = row.scrape_collector();
        row.collector.signal(stop);
        let status = row.collector.wait_exit(Duration::from_secs(30));
        row.expect(
            status.is_some_and(|s| s.success()),
            format!("the collector exited 0 after {stop} ({status:?})"),
        );
    }
    for round in 8..10 {
        write_dict_probes(&dir, round);
        row.write_bursts(a, 0, 60, GAP);
        std::thread::sleep(Duration::from_millis(500));
    }
    // The new collector's session: its log from here, the agent's last Goodbye.
    let collector_mark = row.collector.log().len();
    row.restart_collector();
    row.wait_connected(1, &[a]);
    wrong.extend(dict_churn(&mut row, a, &dir, 10..22));
    let written = row.agents[a].written();
    row.wait_settled(a, written, SETTLE);
    let served = row
        .scrape_collector()
        .map(|s| s.select("uctel_dict_probe", &[("agent", "a")]).count())
        .unwrap_or(0);
    row.quiesce();
    let c = row.collector_figures("a");
    let last = row.collector_last();
    let clog = row.collector.log();
    let sessions =
        uctel_tests::faults::welcomed_sessions(clog.get(collector_mark..).unwrap_or(""), "a");
    let goodbye = uctel_tests::faults::goodbye_lines(&row.agents[a].daemon.log())
        .pop()
        .unwrap_or_default();
    row.expect(
        wrong.is_empty(),
        format!("probe samples under a wrong name: {wrong:?}"),
    );
    let malformed = c.dropped.get("malformed_payload").copied().unwrap_or(0);
    row.expect(
        malformed == 0,
        format!("{malformed} frames dropped as malformed_payload"),
    );
    row.expect(
        served > 0,
        format!("{served} probe series served after the restart"),
    );
    row.expect(
        sessions == 1,
        format!("the new collector welcomed {sessions} session(s) of a (want 1)"),
    );
    for s in ["metrics", "logs"] {
        let get = |k: &str| goodbye.get(&format!("{s}_{k}")).copied();
        let replayed = last.count(
            "uctel_collector_records_replayed_total",
            &[("agent", "a"), ("stream", s)],
        );
        let frames = c.received[s] + c.lost[s];
        let records = c.records_received[s] + c.records_lost[s] + replayed;
        row.expect(
            get("frames") == Some(frames) && get("records") == Some(records),
            format!(
                "new session, {s}: agent sent {:?} frames / {:?} records = collector received \
                 + lost {frames} / received + lost + replayed {records}",
                get("frames"),
                get("records")
            ),
        );
    }
    row.expect(
        c.lost["metrics"] > 0,
        format!(
            "metrics frames lost in the new session {} (the fault must bite)",
            c.lost["metrics"]
        ),
    );
    row
}

/// [`dict_collector_restart_row`] with a collector SIGKILL: the dead session's tail is
/// unknowable (the whole-run law is `≤`), the new session exact.
#[test]
fn series_dictionary_collector_sigkill_new_session_exact() {
    let _g = exclusive();
    let mut row =
        dict_collector_restart_row("series-dictionary-collector-sigkill", Signal::SIGKILL);
    row.verdict(Law::AtMost);
}

/// [`dict_collector_restart_row`] with a graceful collector restart (SIGTERM: the
/// collector's `Goodbye` ends the session, then it starts again). The first session ends
/// without the agent's `Goodbye` (`sessions_ended_total{reason="shutdown"}`), so frames
/// the agent posted after the collector's last look are unknowable (README "Loss
/// accounting": exact after the agent's `Goodbye`): the whole-run law is `≤`, the new
/// session exact.
#[test]
fn series_dictionary_graceful_collector_restart() {
    let _g = exclusive();
    let mut row =
        dict_collector_restart_row("series-dictionary-collector-sigterm", Signal::SIGTERM);
    row.verdict(Law::AtMost);
}

// ---- Reload under load changes an output (issue 45 item 3, the collector's outputs). ----

/// Reload under load changes an output: an agent sends lines and host metrics steadily into
/// a collector whose `outputs.remote_write` is a real VictoriaMetrics; mid-stream the file
/// is rewritten so that the endpoint moves to a second VictoriaMetrics, and the collector
/// gets `SIGHUP`. The reload is applied (`config_last_reload_successful 1`), the agent's
/// session goes on (one session, no reconnect), both receivers got samples, and across the
/// two every sample the collector took for remote-write is held exactly once (no series and
/// timestamp in both, or twice in one), or counted dropped or failed with its reason; each
/// endpoint's sum rule holds. Plain VictoriaMetrics (no deduplication), so a sample sent
/// twice would show.
#[test]
fn reload_under_load_moves_remote_write_to_another_receiver() {
    let _g = exclusive();
    let dirs: Vec<_> = (0..2)
        .map(|_| {
            tempfile::Builder::new()
                .prefix("uctel-fm-vm-")
                .tempdir()
                .unwrap()
        })
        .collect();
    let first = uctel_tests::victoria::Victoria::start(dirs[0].path());
    let second = uctel_tests::victoria::Victoria::start(dirs[1].path());
    let (first_url, second_url) = (first.write_url(), second.write_url());
    let spec = CollectorSpec {
        set: vec![(
            "outputs.remote_write".into(),
            remote_write(&first_url, 100_000),
        )],
        ..CollectorSpec::default()
    };
    let mut row = Row::start("reload-moves-remote-write", spec, None);
    let a = row.add_agent(AgentSpec::new("a"));
    row.wait_connected(1, &[a]);
    // Host metrics every second: a few rounds before the switch and a few after.
    let steady = |row: &mut Row| {
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_secs(3) {
            row.write(a, 0, 100);
            std::thread::sleep(Duration::from_millis(250));
        }
    };
    steady(&mut row);
    row.write(a, 0, 3000);

    reload_collector_output(
        &mut row,
        "outputs.remote_write",
        remote_write(&second_url, 100_000),
    );
    steady(&mut row);
    row.write_bursts(a, 0, 1000, GAP);
    let written = row.agents[a].written();
    row.wait_settled(a, written, SETTLE);
    let reloaded = row
        .scrape_collector()
        .map(|s| s.count("uctel_collector_config_last_reload_successful", &[]))
        .unwrap_or(9);
    row.expect(
        reloaded == 1,
        format!("collector config_last_reload_successful {reloaded} (want 1)"),
    );
    row.quiesce();
    let s = remote_write_drained(&mut row);
    let selector = format!("{{agent=\"{}\"}}", row.agents[a].spec.id);
    let mut handed = 0;
    let mut stale = 0;
    let mut given_up = 0;
    let mut merged = uctel_tests::victoria::RawSeries::new();
    for (name, vm, url) in [
        ("first", &first, &first_url),
        ("second", &second, &second_url),
    ] {
        let m = [("url", url.as_str())];
        let count = |n: &str| s.count(&format!("uctel_collector_remote_write_{n}"), &m);
        let (input, sent, st, dropped, failed, pending) = (
            count("samples_in_total"),
            count("samples_total"),
            count("stale_markers_total"),
            count("samples_dropped_total"),
            count("samples_failed_total"),
            count("samples_pending"),
        );
        row.expect(
            input == sent + dropped + failed + pending,
            format!(
                "{name}: in {input} = sent {sent} + dropped {dropped} + failed {failed} + \
                 pending {pending}"
            ),
        );
        let want = sent - st;
        let mut held = uctel_tests::victoria::RawSeries::new();
        let _ = uctel_tests::wait_for(
            "the receiver holds every sample sent",
            Duration::from_secs(30),
            Duration::from_millis(250),
            || {
                held = vm.export(&selector)?;
                let n: u64 = held.values().map(|v| v.len() as u64).sum();
                (n >= want).then_some(()).ok_or(format!("{n} of {want}"))
            },
        );
        let n: u64 = held.values().map(|v| v.len() as u64).sum();
        row.notes.push(format!(
            "{name} VictoriaMetrics: in {input}, sent {sent} (stale markers {st}), dropped \
             {dropped}, failed {failed}; it holds {n} samples"
        ));
        row.expect(
            want > 0,
            format!("{name}: received samples ({want}): the switch came mid-stream"),
        );
        for (series, values) in held {
            merged.entry(series).or_default().extend(values);
        }
        handed += input;
        stale += st;
        given_up += dropped + failed;
    }
    for values in merged.values_mut() {
        values.sort_by_key(|v| v.0);
    }
    let (held, twice) = samples_and_repeats(&merged);
    row.notes.push(format!(
        "both receivers: {held} samples held, {twice} repeated; collector took {handed} \
         (stale markers {stale}), gave up {given_up}"
    ));
    row.expect(
        twice == 0,
        format!("no sample held twice across the two receivers ({twice})"),
    );
    row.expect(
        held + given_up == handed - stale,
        format!(
            "held {held} + dropped or failed {given_up} = taken {handed} − stale markers {stale}"
        ),
    );
    let reconnects = row.agent_last(a).count("uctel_agent_reconnects_total", &[]);
    let sessions = uctel_tests::faults::welcomed_sessions(&row.collector.log(), "a");
    row.expect(
        sessions == 1 && reconnects == 0,
        format!("sessions of agent a: {sessions} (want 1), reconnects {reconnects} (want 0)"),
    );
    row.verdict(Law::Exact);
}

// A reload that changes the ClickHouse output under load: `fault_matrix/reload_outputs.rs`.
mod reload_outputs;
