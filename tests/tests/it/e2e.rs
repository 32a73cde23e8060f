//! End-to-end tests through the real `uctel-collector` and `uctel-agent` binaries on
//! loopback with the soft RoCEv2 transport, configured by YAML files derived from
//! `config/*.yaml`, on free ports, plus a real Prometheus.
//!
//! What each test proves:
//! - `accounting_is_exact_per_agent_and_stream_after_goodbye`: after SIGTERM (Goodbye) the
//!   collector's figures add up to what each agent sent, per connection and per stream, for
//!   a clean link and a link with 2 % injected packet loss; lost frames equal the fault
//!   injector's drops; every log line written is received or counted lost.
//! - `agent_kill_and_restart_is_a_reset_not_a_loss`: SIGKILL of an agent and a restart is a
//!   new epoch (a stream reset), never counted as loss; the collector keeps running.
//! - `collector_restart_agents_reconnect_and_counters_continue`: agents reconnect with
//!   backoff to a restarted collector; the agents' counters relayed by the collector go on
//!   from where they were (monotonic, as Prometheus expects); accounting stays exact.
//! - `fifty_agents_one_collector`: 50 agent processes against one collector, all connected,
//!   accounting exact for each.
//! - `prometheus_evaluates_every_dashboard_query`: a real Prometheus scrapes the collector
//!   (remote-writing into a real VictoriaMetrics) and agents, one of them on the ConnectX
//!   sysfs fixture with fast counters and a port taken down and up
//!   ([`uctel_tests::fabric`], which also gives it a Slurm job); every panel query of every
//!   dashboard parses and returns data, the job dashboard's under that job;
//!   `promtool check metrics` accepts the collector's and an agent's `/metrics`; across a
//!   collector restart Prometheus sees a reset of the collector's own counters and none in
//!   the agents' counters the collector relays.
//! - `frames_held_for_reordering_when_the_agent_stops_are_sent_or_counted`: frames the
//!   agent's fault injector holds back when it stops go out before `Goodbye` (or count as
//!   `fault_dropped`): lost frames = `fault_dropped`.
//!
//! The tests run one at a time ([`uctel_tests::exclusive`]): each runs several daemons.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use uctel_tests::exposition::Scrape;
use uctel_tests::fabric::Fabric;
use uctel_tests::pipeline::{
    connected_epochs, goodbye_figures, goodbye_frames, AgentFigures, CollectorFigures, Pipeline,
    STREAMS,
};
use uctel_tests::prometheus::{promtool_check_metrics, Job, Prometheus};
use uctel_tests::{dashboards, exclusive, wait_for};

const UP: Duration = Duration::from_secs(60);
const STOP: Duration = Duration::from_secs(20);

fn tick() -> Duration {
    Duration::from_millis(200)
}

/// Waits until the agent has read all `lines` lines of its log (sent or dropped at the
/// source) and returns its figures then.
fn wait_lines_read(p: &Pipeline, i: usize, lines: u64) -> AgentFigures {
    let a = &p.agents[i];
    wait_for(
        &format!("{} read its {lines} log lines", a.id()),
        UP,
        tick(),
        || {
            let f = AgentFigures::read(&a.scrape()?);
            let read = f.records_sent["logs"] + f.records_dropped["logs"];
            if read >= lines {
                Ok(f)
            } else {
                Err(format!("{read} of {lines}"))
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", a.daemon.log_tail(30)))
}

fn wait_connected(p: &Pipeline, n: u64) -> Scrape {
    wait_for("agents_connected", UP, tick(), || {
        let s = p.scrape()?;
        let c = s.count("uctel_collector_agents_connected", &[]);
        if c == n {
            Ok(s)
        } else {
            Err(format!("agents_connected = {c}, want {n}"))
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", p.collector.log_tail(40)))
}

/// Waits until the collector has ended `n` sessions of each agent in `ids` by Goodbye and
/// returns that scrape. `sessions_ended_total{reason="goodbye"}` moves only after the
/// session's tail loss is settled and its figures are final, so the scrape holds them.
fn wait_goodbyes_settled(p: &Pipeline, ids: &[&str], n: u64) -> Scrape {
    wait_for("the Goodbyes settled", UP, tick(), || {
        let s = p.scrape()?;
        for id in ids {
            let ended = s.count(
                "uctel_collector_sessions_ended_total",
                &[("agent", id), ("reason", "goodbye")],
            );
            if ended < n {
                return Err(format!("{id}: {ended} of {n} sessions ended by Goodbye"));
            }
        }
        Ok(s)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", p.collector.log_tail(40)))
}

/// The per-connection identities for one agent's single session whose Goodbye reported
/// `sent` frames, with collector figures `c` (minus `base`, what earlier sessions left).
fn assert_connection_exact(agent: &str, sent: u64, c: &CollectorFigures, base: &CollectorFigures) {
    let rx = c.received_total() - base.received_total();
    let lost = c.lost_total() - base.lost_total();
    let after = c.dropped_after_tracking() - base.dropped_after_tracking();
    let dropped = c.dropped_total() - base.dropped_total();
    let conn_lost = c.connection_lost - base.connection_lost;
    assert_eq!(
        sent,
        rx + lost + after,
        "{agent}: sent {sent} != received {rx} + lost {lost} + dropped after tracking {after} ({c:?})"
    );
    assert_eq!(
        sent,
        rx + dropped + conn_lost,
        "{agent}: sent {sent} != received {rx} + dropped {dropped} + connection lost {conn_lost} ({c:?})"
    );
}

fn single_goodbye(p: &Pipeline, i: usize) -> u64 {
    let a = &p.agents[i];
    let g = goodbye_frames(&a.daemon.log());
    assert_eq!(
        g.len(),
        1,
        "{}: want exactly one `goodbye sent` line, got {g:?}\n{}",
        a.id(),
        a.daemon.log_tail(30)
    );
    g[0]
}

#[test]
fn accounting_is_exact_per_agent_and_stream_after_goodbye() {
    let _g = exclusive();
    let mut p = Pipeline::start();
    let clean = p.add_agent("clean", 0.0, 0.5);
    let lossy = p.add_agent("lossy", 0.02, 0.5);
    p.wait_flowing(2, &["clean", "lossy"], &["metrics"], UP);

    // 20 000 numbered lines per agent (about 700 frames), in bursts, while host metrics
    // flow.
    const LINES: u64 = 20_000;
    for b in 0..20 {
        p.write_lines(clean, b * 1000, 1000);
        p.write_lines(lossy, b * 1000, 1000);
        // Pacing, not a wait for a state: the lines come in bursts, as a busy log's do.
        std::thread::sleep(Duration::from_millis(200));
    }
    let read: Vec<AgentFigures> = [clean, lossy]
        .iter()
        .map(|i| wait_lines_read(&p, *i, LINES))
        .collect();
    // The agents' figures before SIGTERM, once the lossy agent exports its injector's drops.
    let before: Vec<AgentFigures> = p
        .agents
        .iter()
        .map(|a| {
            wait_for(&format!("{} figures", a.id()), UP, tick(), || {
                let f = AgentFigures::read(&a.scrape()?);
                if a.options.drop_ratio > 0.0 && f.fault_dropped.is_none() {
                    return Err("no uctel_agent_fault_packets_total yet".to_owned());
                }
                Ok(f)
            })
            .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();

    for a in &mut p.agents {
        a.daemon.stop(STOP);
    }
    wait_connected(&p, 0);
    let s = wait_goodbyes_settled(&p, &["clean", "lossy"], 1);

    let mut lines = Vec::new();
    for (i, a) in p.agents.iter().enumerate() {
        let id = a.id();
        let c = CollectorFigures::read(&s, id);
        let sent = single_goodbye(&p, i);
        assert!(sent > 20, "{id}: only {sent} frames sent");
        assert_connection_exact(id, sent, &c, &CollectorFigures::default());
        // Per stream, against the agent's final figures (its `goodbye sent` line): frames
        // and records sent = received + lost (+ frames dropped after tracking, none here).
        let bye = goodbye_figures(&a.daemon.log());
        let after = c.dropped_after_tracking();
        for name in STREAMS {
            let fin = |k: &str| {
                bye.get(&format!("{name}_{k}"))
                    .copied()
                    .unwrap_or_else(|| panic!("{id}: no {name}_{k} in `goodbye sent`: {bye:?}"))
            };
            let seen = c.received[name] + c.lost[name];
            let records = c.records_received[name] + c.records_lost[name];
            assert!(
                seen <= fin("frames") && fin("frames") <= seen + after,
                "{id} stream {name}: sent {} frames; received {} + lost {} (+ {after} dropped after tracking)",
                fin("frames"),
                c.received[name],
                c.lost[name]
            );
            if after == 0 {
                assert_eq!(
                    records,
                    fin("records"),
                    "{id} stream {name}: records received {} + lost {} != {} sent",
                    c.records_received[name],
                    c.records_lost[name],
                    fin("records")
                );
            }
        }
        // Every log line is a record received or counted lost (records are exact even
        // under loss: frames carry cumulative record counts).
        let logs_dropped_at_source = read[i].records_dropped["logs"];
        assert_eq!(
            c.records_received["logs"] + c.records_lost["logs"],
            LINES - logs_dropped_at_source,
            "{id}: log records received {} + lost {} != {LINES} lines - {logs_dropped_at_source} dropped at the source",
            c.records_received["logs"],
            c.records_lost["logs"]
        );
        lines.push(format!(
            "{id}: sent {sent} frames; received {:?} lost {:?} records lost {:?}; dropped {}; fault drops {:?}",
            c.received,
            c.lost,
            c.records_lost,
            c.dropped_total(),
            before[i].fault_dropped
        ));
    }
    let c_clean = CollectorFigures::read(&s, "clean");
    assert_eq!(c_clean.lost_total(), 0, "loss on the clean loopback link");
    assert_eq!(c_clean.records_received["logs"], LINES, "clean: every line");
    let c_lossy = CollectorFigures::read(&s, "lossy");
    assert!(
        c_lossy.lost_total() > 0,
        "2 % injected loss but nothing lost: {c_lossy:?}"
    );
    assert!(
        c_lossy.records_lost["metrics"] + c_lossy.records_lost["logs"] > 0,
        "frames lost but no records lost: {c_lossy:?}"
    );
    // One packet per frame: the frames lost are exactly the packets the injector dropped,
    // up to the last frame (the final figure of the `goodbye sent` line). The exported
    // counter, scraped before SIGTERM, cannot be ahead of it; the clean agent has none.
    let bye = goodbye_figures(&p.agents[lossy].daemon.log());
    let injected = bye
        .get("fault_dropped")
        .copied()
        .unwrap_or_else(|| panic!("lossy: no fault_dropped in `goodbye sent`: {bye:?}"));
    assert_eq!(
        c_lossy.lost_total(),
        injected,
        "lost frames != packets the fault injector dropped"
    );
    let exported = before[lossy]
        .fault_dropped
        .unwrap_or_else(|| panic!("lossy: no uctel_agent_fault_packets_total"));
    assert!(
        exported <= injected,
        "exported {exported} > final {injected}"
    );
    assert_eq!(before[clean].fault_dropped, None);
    eprintln!("{}", lines.join("\n"));
    p.collector.stop(STOP);
}

#[test]
fn agent_kill_and_restart_is_a_reset_not_a_loss() {
    let _g = exclusive();
    let mut p = Pipeline::start();
    let victim = p.add_agent("victim", 0.0, 0.5);
    let steady = p.add_agent("steady", 0.0, 0.5);
    p.wait_flowing(2, &["victim", "steady"], &["metrics"], UP);
    p.write_lines(victim, 0, 500);
    wait_lines_read(&p, victim, 500);
    // Posted is not yet received: a frame posted just before SIGKILL may still be in the
    // agent's send queue, and what the agent sent after its last heartbeat is counted
    // nowhere (`sessions_ended_total{reason="no_goodbye"}`), while its lines are
    // checkpointed as sent. So the kill waits until the collector holds every line.
    let at_posted = p
        .scrape()
        .map(|s| CollectorFigures::read(&s, "victim").records_received["logs"])
        .unwrap_or(0);
    wait_for(
        "the victim's 500 lines at the collector",
        UP,
        tick(),
        || {
            let s = p.scrape()?;
            match CollectorFigures::read(&s, "victim").records_received["logs"] {
                500.. => Ok(()),
                n => Err(format!("{n} of 500 log records received")),
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", p.collector.log_tail(40)));
    let collector_pid = p.collector.pid();

    p.agents[victim].daemon.kill(); // SIGKILL: no Goodbye, no flush
    wait_connected(&p, 1);
    // The session that ended without Goodbye is settled once it is counted as such.
    let s1 = wait_for("the killed session settled", UP, tick(), || {
        let s = p.scrape()?;
        let ended = s.count(
            "uctel_collector_sessions_ended_total",
            &[("agent", "victim"), ("reason", "no_goodbye")],
        );
        if ended == 1 {
            Ok(s)
        } else {
            Err(format!("{ended} sessions of victim ended without Goodbye"))
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", p.collector.log_tail(40)));
    let c1 = CollectorFigures::read(&s1, "victim");
    assert_eq!(c1.lost_total(), 0, "SIGKILL counted as loss: {c1:?}");
    assert!(c1.received_total() > 0);

    p.agents[victim].daemon.restart();
    let s2 = wait_for("victim back", UP, tick(), || {
        let s = p.scrape()?;
        let c = CollectorFigures::read(&s, "victim");
        let connected = s.count("uctel_collector_agents_connected", &[]);
        if connected == 2 && c.received["metrics"] > c1.received["metrics"] {
            Ok(s)
        } else {
            Err(format!("connected {connected}, received {:?}", c.received))
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", p.collector.log_tail(40)));
    let c2 = CollectorFigures::read(&s2, "victim");
    // A new epoch: a reset, never loss, never a dropout resync.
    let epochs = connected_epochs(&p.collector.log(), "victim");
    assert!(
        epochs.len() >= 2 && epochs[0] != epochs[epochs.len() - 1],
        "the restarted agent did not come back with a new epoch: {epochs:?}"
    );
    assert_eq!(c2.lost_total(), 0, "a new epoch counted as loss: {c2:?}");
    assert_eq!(c2.other_resets(), 0, "a restart read as a dropout: {c2:?}");
    assert!(
        c2.epoch_resets() >= 1,
        "the new epoch was not counted as a reset: {c2:?}"
    );
    assert!(p.collector.is_running(), "the collector died");
    assert_eq!(p.collector.pid(), collector_pid, "the collector restarted");

    // The restarted agent resumes its log from the checkpoint: nothing written before the
    // kill is lost (a line may repeat if the kill came between send and checkpoint).
    p.write_lines(victim, 500, 300);
    wait_lines_read(&p, victim, 300);
    for a in &mut p.agents {
        a.daemon.stop(STOP);
    }
    wait_connected(&p, 0);
    let s3 = wait_goodbyes_settled(&p, &["victim", "steady"], 1);
    let c3 = CollectorFigures::read(&s3, "victim");
    // The second process said goodbye once; its frames are exactly what the collector
    // counted after the kill.
    let sent2 = single_goodbye(&p, victim);
    assert_connection_exact("victim (after restart)", sent2, &c3, &c1);
    assert_eq!(c3.lost_total(), 0, "{c3:?}");
    assert!(
        c3.records_received["logs"] >= 800,
        "log lines lost across the restart: {} of 800 received",
        c3.records_received["logs"]
    );
    let steady_c = CollectorFigures::read(&s3, "steady");
    assert_eq!(steady_c.lost_total(), 0, "{steady_c:?}");
    assert_connection_exact(
        "steady",
        single_goodbye(&p, steady),
        &steady_c,
        &CollectorFigures::default(),
    );
    eprintln!(
        "victim: epochs {epochs:?}; before kill {:?}; after restart {:?}, resets {:?}, log records {} for 800 lines ({at_posted} at the collector when the agent had posted all 500)",
        c1.received, c3.received, c3.resets, c3.records_received["logs"]
    );
    p.collector.stop(STOP);
}

#[test]
fn collector_restart_agents_reconnect_and_counters_continue() {
    let _g = exclusive();
    let mut p = Pipeline::start();
    p.add_agent("a", 0.0, 0.5);
    p.add_agent("b", 0.0, 0.5);
    p.wait_flowing(2, &["a", "b"], &["metrics"], UP);
    // The agents' own counters, relayed by the collector with the agent label.
    let relayed = |s: &Scrape, agent: &str| {
        s.count(
            "uctel_agent_frames_sent_total",
            &[("agent", agent), ("stream", "metrics")],
        )
    };
    let s0 = wait_for("relayed agent counters", UP, tick(), || {
        let s = p.scrape()?;
        if relayed(&s, "a") > 0 && relayed(&s, "b") > 0 {
            Ok(s)
        } else {
            Err("no uctel_agent_frames_sent_total relayed yet".into())
        }
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let agent_pids: Vec<Option<u32>> = p.agents.iter().map(|a| a.daemon.pid()).collect();

    p.collector.stop(STOP);
    let down = Instant::now();
    for a in &p.agents {
        wait_for(
            &format!("{} to see the collector gone", a.id()),
            UP,
            tick(),
            || {
                let s = a.scrape()?;
                match s.count("uctel_agent_connected", &[]) {
                    0 => Ok(()),
                    _ => Err(format!("{} still says connected", a.id())),
                }
            },
        )
        .unwrap_or_else(|e| panic!("{e}"));
    }
    p.collector.restart();
    p.wait_collector_up(UP);
    p.wait_flowing(2, &["a", "b"], &["metrics"], UP);
    let back_after = down.elapsed();

    let s1 = wait_for("relayed counters after the restart", UP, tick(), || {
        let s = p.scrape()?;
        if relayed(&s, "a") > 0 && relayed(&s, "b") > 0 {
            Ok(s)
        } else {
            Err("no relayed counters yet".into())
        }
    })
    .unwrap_or_else(|e| panic!("{e}"));
    for id in ["a", "b"] {
        let (v0, v1) = (relayed(&s0, id), relayed(&s1, id));
        assert!(
            v1 >= v0,
            "{id}: relayed uctel_agent_frames_sent_total went back from {v0} to {v1} (a counter reset Prometheus would see)"
        );
    }
    for (i, a) in p.agents.iter().enumerate() {
        assert_eq!(a.daemon.pid(), agent_pids[i], "{} restarted", a.id());
        let s = a.scrape().unwrap_or_else(|e| panic!("{e}"));
        assert!(
            s.count("uctel_agent_reconnects_total", &[]) >= 1,
            "{}: no reconnect counted",
            a.id()
        );
        assert_eq!(s.count("uctel_agent_connected", &[]), 1);
    }

    // The new collector saw exactly the agents' last sessions: exact accounting for them.
    for a in &mut p.agents {
        a.daemon.stop(STOP);
    }
    wait_connected(&p, 0);
    let s2 = wait_goodbyes_settled(&p, &["a", "b"], 1);
    for a in &p.agents {
        let c = CollectorFigures::read(&s2, a.id());
        let g = goodbye_frames(&a.daemon.log());
        let sent = *g.last().unwrap_or_else(|| panic!("{}: no goodbye", a.id()));
        assert_connection_exact(a.id(), sent, &c, &CollectorFigures::default());
        assert_eq!(c.lost_total(), 0, "{}: {c:?}", a.id());
    }
    eprintln!("agents back {back_after:?} after the collector went down");
    p.collector.stop(STOP);
}

#[test]
fn fifty_agents_one_collector() {
    let _g = exclusive();
    const N: usize = 50;
    const LINES: u64 = 100;
    let mut p = Pipeline::start();
    let started = Instant::now();
    let ids: Vec<String> = (0..N).map(|i| format!("fleet-{i:02}")).collect();
    // Half the fleet announces 512 frames/s (960-frame ring windows): the budget grants
    // each agent far less than its ring holds, and the logs must still go.
    for (i, id) in ids.iter().enumerate() {
        p.add_agent_with(id, 0.0, 5.0, |y| {
            if i % 2 == 1 {
                y.set("collector.expected_frames_per_second", 512);
            }
        });
    }
    let id_refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    p.wait_flowing(N, &id_refs, &["metrics"], Duration::from_secs(90));
    let all_up = started.elapsed();
    for i in 0..N {
        p.write_lines(i, 0, usize::try_from(LINES).unwrap_or(0));
    }
    wait_for("every log line at the collector", UP, tick(), || {
        let s = p.scrape()?;
        let missing: Vec<&str> = id_refs
            .iter()
            .copied()
            .filter(|id| {
                let c = CollectorFigures::read(&s, id);
                c.records_received["logs"] + c.records_lost["logs"] < LINES
            })
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!("{} agents not done: {:?}", missing.len(), missing))
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", p.collector.log_tail(40)));

    for a in &mut p.agents {
        a.daemon.signal(nix::sys::signal::Signal::SIGTERM);
    }
    for a in &mut p.agents {
        let st = a.daemon.wait_exit(STOP);
        assert!(
            st.is_some_and(|s| s.success()),
            "{} did not stop cleanly: {st:?}\n{}",
            a.id(),
            a.daemon.log_tail(20)
        );
    }
    wait_connected(&p, 0);
    let s = wait_goodbyes_settled(&p, &id_refs, 1);
    let mut totals: BTreeMap<&str, u64> = BTreeMap::new();
    for (i, id) in id_refs.iter().enumerate() {
        let c = CollectorFigures::read(&s, id);
        let sent = single_goodbye(&p, i);
        assert_connection_exact(id, sent, &c, &CollectorFigures::default());
        assert_eq!(
            c.records_received["logs"] + c.records_lost["logs"],
            LINES,
            "{id}: {c:?}"
        );
        *totals.entry("sent").or_default() += sent;
        *totals.entry("received").or_default() += c.received_total();
        *totals.entry("lost").or_default() += c.lost_total();
        *totals.entry("dropped").or_default() += c.dropped_total();
    }
    eprintln!(
        "{N} agents connected {all_up:?} after start; totals {totals:?}; run {:?}",
        started.elapsed()
    );
    p.collector.stop(STOP);
}

/// Each `(panel, ref_id)` query of the dashboard `file` (relative to the workspace root),
/// evaluated by `prom`, returns exactly one series, whose `labels` are `want`.
fn assert_panels_name(
    prom: &Prometheus,
    file: &str,
    panels: &[(&str, &str)],
    labels: (&str, &str),
    want: (&str, &str),
) {
    let queries = dashboards::queries(&uctel_tests::workspace_root().join(file));
    for &(panel, ref_id) in panels {
        let q = queries
            .iter()
            .find(|q| q.panel == panel && q.ref_id == ref_id)
            .unwrap_or_else(|| panic!("no {panel} / {ref_id}"));
        let r = prom
            .query(&q.expr)
            .unwrap_or_else(|e| panic!("{panel}: {e}"));
        let got: Vec<(String, String)> = r
            .iter()
            .map(|s| {
                let l = |n: &str| {
                    s.pointer(&format!("/metric/{n}"))
                        .and_then(serde_json::Value::as_str)
                        .unwrap_or("")
                        .to_owned()
                };
                (l(labels.0), l(labels.1))
            })
            .collect();
        assert_eq!(
            got,
            [(want.0.to_owned(), want.1.to_owned())],
            "{file}: {panel} / {ref_id}"
        );
    }
}

#[test]
fn prometheus_evaluates_every_dashboard_query() {
    let _g = exclusive();
    // A real remote-write receiver, so the pipeline dashboard's remote-write row has data.
    let receiver_dir = tempfile::Builder::new()
        .prefix("uctel-e2e-vm-")
        .tempdir()
        .unwrap_or_else(|e| panic!("tempdir: {e}"));
    let vm = uctel_tests::victoria::Victoria::start(receiver_dir.path());
    let url = vm.write_url();
    // And a real ClickHouse and an OTLP receiver, for the ClickHouse and OTLP rows.
    let ch = uctel_tests::clickhouse::ClickHouse::start();
    let schema =
        std::fs::read_to_string(uctel_tests::workspace_root().join("config/clickhouse/logs.sql"))
            .unwrap_or_else(|e| panic!("config/clickhouse/logs.sql: {e}"));
    ch.query(&schema).unwrap_or_else(|e| panic!("{e}"));
    let otlp = uctel_tests::otlp::Receiver::start(uctel_tests::otlp::Mode::Accept);
    let mut p = Pipeline::start_with(|y, _| {
        let mut rw = serde_yaml::Mapping::new();
        rw.insert("url".into(), url.as_str().into());
        y.set(
            "outputs.remote_write",
            serde_yaml::Value::Sequence(vec![serde_yaml::Value::Mapping(rw)]),
        );
        let mut c = serde_yaml::Mapping::new();
        c.insert("url".into(), ch.url().into());
        c.insert("batch_send_deadline_seconds".into(), 0.2.into());
        y.set("outputs.clickhouse", serde_yaml::Value::Mapping(c));
        let mut o = serde_yaml::Mapping::new();
        o.insert("endpoint".into(), otlp.endpoint().into());
        o.insert("batch_send_deadline_seconds".into(), 0.2.into());
        y.set("outputs.otlp", serde_yaml::Value::Mapping(o));
    });
    p.add_agent("prom-clean", 0.0, 1.0);
    // Its logs on RC, so the RC lane panels have data (retransmissions under 5 % loss).
    p.add_agent_with("prom-lossy", 0.05, 1.0, |y| {
        y.set("streams.logs.reliability", "rc");
    });
    let fabric = Fabric::new(p.path());
    p.add_agent_with("prom-fabric", 0.02, 1.0, |y| fabric.configure(y));
    p.wait_flowing(
        3,
        &["prom-clean", "prom-lossy", "prom-fabric"],
        &["metrics"],
        UP,
    );
    p.wait_flowing(3, &["prom-fabric"], &["fast_counters"], UP);
    p.write_lines(0, 0, 300);
    p.write_lines(1, 0, 300);
    p.write_lines(2, 0, 300);
    fabric.port_down_and_up(&p, "prom-fabric", UP);

    let jobs = [
        Job {
            name: "uctel-collector".into(),
            targets: vec![p.metrics_addr()],
            honor_labels: true,
        },
        Job {
            name: "uctel-agent".into(),
            targets: p.agents.iter().map(|a| a.options.metrics).collect(),
            honor_labels: false,
        },
    ];
    let prom = Prometheus::start(p.path(), &jobs);
    wait_for("targets up", UP, tick(), || {
        let (c, a) = (
            prom.targets_up("uctel-collector")?,
            prom.targets_up("uctel-agent")?,
        );
        if c == 1 && a == 3 {
            Ok(())
        } else {
            Err(format!("collector {c}/1, agents {a}/3 up"))
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", prom.log_tail(20)));
    // Enough samples for rate() over 1m and for the host metrics to have arrived twice.
    wait_for("data in Prometheus", UP, tick(), || {
        let n = prom.query("count_over_time(node_load1{agent=\"prom-clean\"}[1m])")?;
        let have = n
            .first()
            .and_then(uctel_tests::prometheus::sample_value)
            .unwrap_or(0.0);
        if have >= 4.0 {
            Ok(())
        } else {
            Err(format!("{have} samples of node_load1"))
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", prom.log_tail(20)));

    // promtool lint of both exposition endpoints, the fabric agent's series included.
    let cs = p.scrape().unwrap_or_else(|e| panic!("{e}"));
    promtool_check_metrics(&cs.text).unwrap_or_else(|e| panic!("collector /metrics: {e}"));
    let as_ = p.agents[0].scrape().unwrap_or_else(|e| panic!("{e}"));
    promtool_check_metrics(&as_.text).unwrap_or_else(|e| panic!("agent /metrics: {e}"));

    let mut failures = Vec::new();
    let mut evaluated = 0;
    for file in dashboards::files() {
        let d = dashboards::load(&file);
        let vars = dashboards::variables(&d);
        // The template variables' own queries.
        for v in d
            .pointer("/templating/list")
            .and_then(serde_json::Value::as_array)
            .into_iter()
            .flatten()
        {
            let Some(def) = v.get("definition").and_then(serde_json::Value::as_str) else {
                continue;
            };
            let Some(sel) = dashboards::variable_selector(def, &vars) else {
                failures.push(format!(
                    "{}: variable query {def:?} is not label_values()",
                    file.display()
                ));
                continue;
            };
            match prom.query(&sel) {
                Ok(r) if !r.is_empty() => evaluated += 1,
                Ok(_) => failures.push(format!("{}: variable {def:?}: no data", file.display())),
                Err(e) => failures.push(format!("{}: variable {def:?}: {e}", file.display())),
            }
        }
        for q in dashboards::queries(&file) {
            // A query can need a little more data (a rate over a counter that just
            // appeared): retry for a while. A parse error (`bad_data`) does not go away.
            let r = match prom.query(&q.expr) {
                Ok(r) if !r.is_empty() => Ok(r.len()),
                Err(e) if e.contains("bad_data") => Err(e),
                _ => wait_for(
                    &q.expr,
                    Duration::from_secs(15),
                    Duration::from_secs(1),
                    || match prom.query(&q.expr) {
                        Ok(r) if !r.is_empty() => Ok(r.len()),
                        Ok(_) => Err("empty result".into()),
                        Err(e) => Err(e),
                    },
                ),
            };
            match r {
                Ok(_) => evaluated += 1,
                Err(e) => {
                    failures.push(format!("{} / {} / {}: {e}", q.dashboard, q.panel, q.ref_id))
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} dashboard queries failed:\n{}",
        failures.len(),
        failures.len() + evaluated,
        failures.join("\n")
    );
    assert!(evaluated >= 100, "only {evaluated} queries evaluated");
    eprintln!("{evaluated} dashboard and variable queries returned data");

    // The fabric panels show the fabric agent's series under the labels their legends use.
    let fabric_file = uctel_tests::workspace_root().join("dashboards/uctel-fabric.json");
    let fabric_queries = dashboards::queries(&fabric_file);
    let labels_of = |panel: &str, ref_id: &str, label: &str| -> Vec<String> {
        let q = fabric_queries
            .iter()
            .find(|q| q.panel == panel && q.ref_id == ref_id)
            .unwrap_or_else(|| panic!("no {panel} / {ref_id}"));
        let mut v: Vec<String> = prom
            .query(&q.expr)
            .unwrap_or_else(|e| panic!("{panel}: {e}"))
            .iter()
            .filter_map(|r| {
                r.pointer(&format!("/metric/{label}"))?
                    .as_str()
                    .map(str::to_owned)
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        labels_of("PFC pause frames by priority", "A", "stat"),
        ["received_prio3_pause", "transmitted_prio3_pause"]
    );
    let lossy_agents = labels_of("RDMA drops and uctel loss per agent", "C", "agent");
    assert!(
        lossy_agents.iter().any(|a| a == "prom-fabric"),
        "uctel frames lost not joined to the fabric agent: {lossy_agents:?}"
    );
    // The job dashboard: the fabric host's counters and uctel loss show under its Slurm job.
    assert_panels_name(
        &prom,
        "dashboards/uctel-jobs.json",
        &[
            ("out_of_buffer", "A"),
            ("out_of_buffer", "B"),
            ("CNPs sent", "A"),
            ("Link pause frames", "A"),
            ("uctel loss on the job's hosts", "A"),
        ],
        ("job_id", "user"),
        (uctel_tests::fabric::JOB_ID, uctel_tests::fabric::JOB_USER),
    );
    // The pod dashboard: the fabric device's counters and uctel loss show under the pod
    // the test kubelet lists with it.
    let (ns, pod, _) = uctel_tests::fabric::POD;
    assert_panels_name(
        &prom,
        "dashboards/uctel-pods.json",
        &[
            ("out_of_buffer", "A"),
            ("out_of_buffer", "B"),
            ("CNPs sent", "A"),
            ("Link pause frames on the pods' hosts", "A"),
            ("uctel loss on the pods' hosts", "A"),
        ],
        ("namespace", "pod"),
        (ns, pod),
    );
    let to = labels_of("Port state and GID changes", "A", "to");
    assert!(
        to.contains(&"down".to_owned()) && to.contains(&"active".to_owned()),
        "{to:?}"
    );

    // The host dashboard on remote-written data only (VictoriaMetrics holds nothing
    // scraped): its variables and every query return data there too.
    let host = dashboards::files()
        .into_iter()
        .find(|f| f.ends_with("uctel-host-overview.json"))
        .expect("the host dashboard");
    let d = dashboards::load(&host);
    let vars = dashboards::variables(&d);
    let mut on_vm = Vec::new();
    for v in d
        .pointer("/templating/list")
        .and_then(serde_json::Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(sel) = v
            .get("definition")
            .and_then(serde_json::Value::as_str)
            .and_then(|def| dashboards::variable_selector(def, &vars))
        {
            on_vm.push(("variable".to_owned(), sel));
        }
    }
    for q in dashboards::queries(&host) {
        on_vm.push((format!("{} / {}", q.panel, q.ref_id), q.expr.clone()));
    }
    let mut vm_failures = Vec::new();
    for (what, expr) in &on_vm {
        let r = wait_for(
            expr,
            Duration::from_secs(15),
            Duration::from_secs(1),
            || match vm.query(expr) {
                Ok(r) if !r.is_empty() => Ok(()),
                Ok(_) => Err("empty result".into()),
                Err(e) => Err(e),
            },
        );
        if let Err(e) = r {
            vm_failures.push(format!("{what}: {e}"));
        }
    }
    assert!(
        vm_failures.is_empty(),
        "host dashboard on remote-written data: {} of {} queries failed:\n{}",
        vm_failures.len(),
        on_vm.len(),
        vm_failures.join("\n")
    );

    // A collector restart as Prometheus sees it: the collector's own counters start over (a
    // counter reset, which rate() and increase() absorb), while the agents' counters it
    // relays go on from where they were, so Prometheus sees no reset in them.
    p.collector.stop(STOP);
    p.collector.restart();
    p.wait_collector_up(UP);
    p.wait_flowing(
        3,
        &["prom-clean", "prom-lossy", "prom-fabric"],
        &["metrics"],
        UP,
    );
    let value = |q: &str| -> Result<f64, String> {
        prom.query(q)?
            .first()
            .and_then(uctel_tests::prometheus::sample_value)
            .ok_or_else(|| format!("{q}: no value"))
    };
    wait_for("Prometheus saw the collector's counter reset", UP, tick(), || {
        let r = value(
            "max(resets(uctel_collector_frames_received_total{agent=\"prom-clean\",stream=\"metrics\"}[5m]))",
        )?;
        if r >= 1.0 {
            Ok(())
        } else {
            Err(format!("resets = {r}"))
        }
    })
    .unwrap_or_else(|e| panic!("{e}"));
    // Two more scrapes of relayed agent counters after the restart: samples of the relayed
    // series within the seconds since the restart (whole seconds, rounded down, so every
    // one counted is from after it).
    let restarted = Instant::now();
    wait_for("two scrapes of relayed counters after the restart", UP, tick(), || {
        let since = restarted.elapsed().as_secs();
        if since == 0 {
            return Err("restart just now".to_owned());
        }
        let n = value(&format!(
            "max(count_over_time(uctel_agent_frames_sent_total{{job=\"uctel-collector\",agent=\"prom-clean\"}}[{since}s]))"
        ))
        .unwrap_or(0.0);
        if n >= 2.0 {
            Ok(())
        } else {
            Err(format!("{n} scrapes in the last {since} s"))
        }
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let relayed_resets = value(
        "max(resets(uctel_agent_frames_sent_total{job=\"uctel-collector\",agent=\"prom-clean\"}[5m]))",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        relayed_resets, 0.0,
        "the agent's counters relayed by the collector reset across the collector restart"
    );
    let rate = value("sum(rate(uctel_collector_frames_received_total{agent=\"prom-clean\"}[1m]))")
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(rate > 0.0, "rate() across the restart: {rate}");
    drop(prom);
    for a in &mut p.agents {
        a.daemon.stop(STOP);
    }
    p.collector.stop(STOP);
}

/// An agent whose fault injector holds every packet back for reordering (ratio 1, window
/// 1000: each goes out once 20 ms have passed, at the next call into the link) stops with
/// SIGTERM right after its final frames: those are sent before `Goodbye` (or counted as the
/// injector's drops), so the collector's lost frames equal the `fault_dropped` of the
/// `goodbye sent` line. They were kept inside the injector and dropped with it, uncounted:
/// the collector counted them lost against `fault_dropped=0`.
#[test]
fn frames_held_for_reordering_when_the_agent_stops_are_sent_or_counted() {
    let _g = exclusive();
    let mut p = Pipeline::start();
    let i = p.add_agent_with("held", 0.0, 0.5, |y| {
        y.set("transport.soft.fault.reorder_ratio", 1.0)
            .set("transport.soft.fault.reorder_window", 1000)
            .set("transport.soft.fault.seed", 7);
    });
    p.wait_flowing(1, &["held"], &["metrics"], UP);
    p.write_lines(i, 0, 200);
    wait_lines_read(&p, i, 200);
    p.agents[i].daemon.stop(STOP);
    wait_connected(&p, 0);
    let s = wait_goodbyes_settled(&p, &["held"], 1);
    let c = CollectorFigures::read(&s, "held");
    let sent = single_goodbye(&p, i);
    assert_connection_exact("held", sent, &c, &CollectorFigures::default());
    let bye = goodbye_figures(&p.agents[i].daemon.log());
    let injected = bye
        .get("fault_dropped")
        .copied()
        .unwrap_or_else(|| panic!("no fault_dropped in `goodbye sent`: {bye:?}"));
    assert_eq!(
        c.lost_total(),
        injected,
        "frames lost ({:?}) != packets the fault injector dropped; goodbye {bye:?}",
        c.lost
    );
    assert_eq!(c.records_received["logs"] + c.records_lost["logs"], 200);
    p.collector.stop(STOP);
}
