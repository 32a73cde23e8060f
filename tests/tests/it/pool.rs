//! A collector pool through the real binaries on loopback: rendezvous spread, failover on
//! SIGKILL, return after a restart, drain on SIGUSR1, refusal when full, a pool named by one
//! host name, and a pool where every collector is down; with the loss accounting checked
//! per agent, stream and epoch across every collector an agent visited. A collector frozen
//! with SIGSTOP (its kernel still accepts connections) is not returned to until it runs
//! again, and once it runs again it writes nothing to Prometheus that the collector its
//! agent moved to has overtaken.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use uctel_agent::pool::weight;
use uctel_tests::pipeline::STREAMS;
use uctel_tests::pool::{agent_epochs, collector_epochs, CollectorPool, HostsEntries};

const AGENTS: usize = 30;
const RETURN_AFTER_SECONDS: f64 = 4.0;
/// The agent's log line for a move to a collector ranked higher (`SessionEnd::Rebalance`).
const MOVED_BACK: &str =
    "a collector ranked higher is healthy (or this one left the pool); moved to it";

fn pool_agent_settings(y: &mut uctel_tests::configs::Yaml) {
    y.set("collector.return_after_seconds", RETURN_AFTER_SECONDS)
        .set("collector.probe_interval_seconds", 0.5)
        .set("collector.heartbeat_timeout_seconds", 3.0);
}

/// The member `agent` ranks first.
fn first_choice(agent: &str, members: &[SocketAddr]) -> SocketAddr {
    *members
        .iter()
        .max_by(|a, b| weight(agent, a).cmp(&weight(agent, b)).then(b.cmp(a)))
        .unwrap_or_else(|| panic!("no members"))
}

/// Waits until every agent reports a collector; the placement.
fn wait_placed(pool: &CollectorPool, timeout: Duration) -> Vec<SocketAddr> {
    let r = uctel_tests::wait_for(
        "every agent connected",
        timeout,
        Duration::from_millis(200),
        || {
            let p = pool.placement();
            let missing: Vec<_> = p
                .iter()
                .enumerate()
                .filter(|(_, c)| c.is_none())
                .map(|(i, _)| pool.agents[i].id().to_owned())
                .collect();
            if missing.is_empty() {
                Ok(p.into_iter().flatten().collect::<Vec<_>>())
            } else {
                Err(format!("not connected: {missing:?}"))
            }
        },
    );
    r.unwrap_or_else(|e| panic!("{e}"))
}

fn distribution(placement: &[SocketAddr], members: &[SocketAddr]) -> Vec<usize> {
    members
        .iter()
        .map(|m| placement.iter().filter(|p| *p == m).count())
        .collect()
}

#[test]
fn pool_spreads_fails_over_returns_and_drains_with_exact_accounting() {
    let _guard = uctel_tests::exclusive();
    let mut pool = CollectorPool::start(3, |_| {});
    let members = pool.control_addrs();
    for k in 0..AGENTS {
        pool.add_agent(&format!("pool-agent-{k:02}"), pool_agent_settings);
    }
    for i in 0..AGENTS {
        pool.write_lines(i, 0, 20);
    }

    // 1. Spread: every agent on its own first choice, 10 ± 5 per collector.
    let placed = wait_placed(&pool, Duration::from_secs(60));
    for (i, at) in placed.iter().enumerate() {
        assert_eq!(
            *at,
            first_choice(pool.agents[i].id(), &members),
            "{} is not on its rendezvous first choice",
            pool.agents[i].id()
        );
    }
    let spread = distribution(&placed, &members);
    println!("rendezvous spread of {AGENTS} agents over {members:?}: {spread:?}");
    for n in &spread {
        assert!((5..=15).contains(n), "spread {spread:?}");
    }

    // 2. SIGKILL the collector with the most agents: its agents are elsewhere within 10 s;
    // nobody else moves.
    let killed = (0..members.len()).max_by_key(|m| spread[*m]).unwrap_or(0);
    let victims: BTreeSet<usize> = (0..AGENTS)
        .filter(|i| placed[*i] == members[killed])
        .collect();
    pool.members[killed].daemon.kill();
    let killed_at = Instant::now();
    let mut moved_at: BTreeMap<usize, Duration> = BTreeMap::new();
    while moved_at.len() < victims.len() && killed_at.elapsed() < Duration::from_secs(30) {
        for &i in &victims {
            if moved_at.contains_key(&i) {
                continue;
            }
            if let Some(at) = pool.current(i) {
                if at != members[killed] {
                    moved_at.insert(i, killed_at.elapsed());
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let slowest = moved_at.values().max().copied().unwrap_or_default();
    println!(
        "after SIGKILL of {}: {} of {} agents reconnected elsewhere, slowest in {slowest:.2?}",
        members[killed],
        moved_at.len(),
        victims.len()
    );
    assert_eq!(moved_at.len(), victims.len(), "not every agent moved");
    assert!(
        slowest <= Duration::from_secs(10),
        "slowest move {slowest:?}"
    );
    let after_kill = wait_placed(&pool, Duration::from_secs(10));
    for i in 0..AGENTS {
        if !victims.contains(&i) {
            assert_eq!(after_kill[i], placed[i], "{} moved", pool.agents[i].id());
        }
    }

    // 3. Restart it: after the return delay the same agents move back, and only they.
    pool.members[killed].daemon.restart();
    pool.wait_up(killed, Duration::from_secs(30));
    let restarted_at = Instant::now();
    let back = uctel_tests::wait_for(
        "the killed collector's agents back",
        Duration::from_secs(40),
        Duration::from_millis(200),
        || {
            let p = pool.placement();
            let on: BTreeSet<usize> = (0..AGENTS)
                .filter(|i| p[*i] == Some(members[killed]))
                .collect();
            if on == victims {
                Ok(p)
            } else {
                Err(format!("{} of {} back", on.len(), victims.len()))
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let returned_after = restarted_at.elapsed();
    println!(
        "the same {} agents returned {returned_after:.2?} after the restart",
        victims.len()
    );
    assert!(
        returned_after >= Duration::from_secs_f64(RETURN_AFTER_SECONDS * 0.9),
        "returned before the return delay: {returned_after:?}"
    );
    for (i, at) in back.iter().enumerate() {
        assert_eq!(
            *at,
            Some(placed[i]),
            "{} is not back home",
            pool.agents[i].id()
        );
    }
    for i in 0..AGENTS {
        let s = pool.switches(i);
        let (lost, rebalance) = (s.get("lost").copied(), s.get("rebalance").copied());
        if victims.contains(&i) {
            assert_eq!(
                (lost, rebalance),
                (Some(1), Some(1)),
                "{}: {s:?}",
                pool.agents[i].id()
            );
        } else {
            assert_eq!(s.values().sum::<u64>(), 0, "{}: {s:?}", pool.agents[i].id());
        }
    }

    // 4. Drain another collector with SIGUSR1: it exits on its own, and every agent it held
    // left with a Goodbye.
    let drained = (killed + 1) % members.len();
    let evacuees: BTreeSet<usize> = (0..AGENTS)
        .filter(|i| placed[*i] == members[drained])
        .collect();
    pool.members[drained].daemon.signal(Signal::SIGUSR1);
    let status = pool.members[drained]
        .daemon
        .wait_exit(Duration::from_secs(30))
        .unwrap_or_else(|| {
            panic!(
                "the drained collector did not exit\n{}",
                pool.members[drained].daemon.log_tail(30)
            )
        });
    assert!(status.success(), "drained collector exit: {status:?}");
    let after_drain = wait_placed(&pool, Duration::from_secs(10));
    for i in 0..AGENTS {
        if evacuees.contains(&i) {
            assert_ne!(after_drain[i], members[drained]);
            assert_eq!(
                pool.switches(i).get("drain"),
                Some(&1),
                "{}",
                pool.agents[i].id()
            );
        } else {
            assert_eq!(after_drain[i], placed[i], "{} moved", pool.agents[i].id());
        }
    }
    let drained_log = pool.members[drained].daemon.log();
    let sessions = collector_epochs(&drained_log);
    for &i in &evacuees {
        let id = pool.agents[i].id();
        let last = sessions
            .iter()
            .rev()
            .find(|s| s.agent == id)
            .unwrap_or_else(|| panic!("{id}: no session end in the drained collector's log"));
        assert!(last.ended_by.contains("Goodbye"), "{id}: {last:?}");
    }

    // More log lines after the moves, then stop every agent (Goodbye) and the collectors.
    for i in 0..AGENTS {
        pool.write_lines(i, 20, 20);
    }
    std::thread::sleep(Duration::from_secs(3));
    for a in &mut pool.agents {
        let status = a.daemon.stop(Duration::from_secs(20));
        assert!(status.success(), "{}: {status:?}", a.id());
    }
    for (m, member) in pool.members.iter_mut().enumerate() {
        if m != drained {
            let status = member.daemon.stop(Duration::from_secs(20));
            assert!(status.success(), "collector {m}: {status:?}");
        }
    }

    // 5. The sum rule per agent, stream and epoch, across the collectors: every epoch that
    // ended with a Goodbye (all but those cut by the SIGKILL) is accounted exactly:
    // frames sent = received + lost + dropped.
    let mut by_epoch = BTreeMap::new();
    for m in &pool.members {
        for s in collector_epochs(&m.daemon.log()) {
            by_epoch.insert((s.agent.clone(), s.epoch.clone()), s);
        }
    }
    let mut epochs_checked = 0;
    for (i, a) in pool.agents.iter().enumerate() {
        let id = a.id().to_owned();
        let epochs = agent_epochs(&a.daemon.log());
        // The last epoch (shutdown), the one a victim left to return (rebalance), the one
        // an evacuee left (drain); a victim's epoch on the killed collector had no Goodbye.
        let want = 1 + usize::from(victims.contains(&i)) + usize::from(evacuees.contains(&i));
        assert_eq!(
            epochs.len(),
            want,
            "{id}: epochs ended with a Goodbye: {epochs:?}"
        );
        let mut sent_total: BTreeMap<&str, u64> = BTreeMap::new();
        let mut seen_total: BTreeMap<&str, u64> = BTreeMap::new();
        for e in &epochs {
            let c = by_epoch
                .get(&(id.clone(), e.epoch.clone()))
                .unwrap_or_else(|| {
                    panic!(
                        "{id}: epoch {} ({}) has no collector record",
                        e.epoch, e.reason
                    )
                });
            assert!(c.ended_by.contains("Goodbye"), "{id} {}: {c:?}", e.epoch);
            assert_eq!(c.dropped_before_tracking, 0, "{id} {}: {c:?}", e.epoch);
            for s in STREAMS {
                let sent = e.frames[s];
                let (received, lost, dropped) = c.streams.get(s).copied().unwrap_or_default();
                assert_eq!(
                    sent,
                    received + lost + dropped,
                    "{id} epoch {} ({}) stream {s}: sent {sent}, received {received}, lost {lost}, dropped {dropped}",
                    e.epoch,
                    e.reason
                );
                *sent_total.entry(s).or_default() += sent;
                *seen_total.entry(s).or_default() += received + lost + dropped;
            }
            epochs_checked += 1;
        }
        assert_eq!(sent_total, seen_total, "{id}");
    }
    println!("sum rule exact on {epochs_checked} epochs ended with a Goodbye, across the pool");
}

#[test]
fn a_full_collector_refuses_and_the_agent_moves_on() {
    let _guard = uctel_tests::exclusive();
    let mut pool = CollectorPool::start(2, |y| {
        y.set("control.max_agents", 1);
    });
    let members = pool.control_addrs();
    // Two agents that rank the same collector first: the second is refused and moves on.
    let mut ids = Vec::new();
    for k in 0.. {
        let id = format!("full-agent-{k}");
        if first_choice(&id, &members) == members[0] {
            ids.push(id);
        }
        if ids.len() == 2 {
            break;
        }
    }
    pool.add_agent(&ids[0], pool_agent_settings);
    let placed = wait_placed(&pool, Duration::from_secs(30));
    assert_eq!(placed, vec![members[0]]);
    pool.add_agent(&ids[1], pool_agent_settings);
    let placed = wait_placed(&pool, Duration::from_secs(30));
    assert_eq!(placed, vec![members[0], members[1]]);
    let log = pool.agents[1].daemon.log();
    assert!(
        log.contains("refused this agent") && log.contains("busy"),
        "{log}"
    );
    // The agent counts the refusal by its reason.
    let refusals = pool.refusals(1);
    assert!(
        refusals.get("busy").is_some_and(|n| *n >= 1),
        "the busy refusal counted on the agent: {refusals:?}"
    );
    // It stays where it was taken in: probes of the full collector hear the refusal.
    std::thread::sleep(Duration::from_secs_f64(RETURN_AFTER_SECONDS + 2.0));
    assert_eq!(pool.current(1), Some(members[1]));
    let s = uctel_tests::exposition::scrape(pool.members[0].addrs.metrics)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        s.count(
            "uctel_collector_handshakes_refused_total",
            &[("reason", "busy")]
        ) >= 1,
        "busy refusals counted"
    );
    assert!(
        s.count("uctel_collector_probes_total", &[("result", "refusing")]) >= 1,
        "probes answered not accepting"
    );
    for a in &mut pool.agents {
        assert!(a.daemon.stop(Duration::from_secs(20)).success());
    }
}

#[test]
fn an_agent_with_every_collector_down_backs_off_holds_its_logs_and_connects_when_one_returns() {
    let _guard = uctel_tests::exclusive();
    let mut pool = CollectorPool::start(3, |_| {});
    for m in &mut pool.members {
        m.daemon.kill();
    }
    let agent = pool.add_agent("lonely-agent", |y| {
        pool_agent_settings(y);
        y.set("collector.reconnect_initial_seconds", 0.2)
            .set("collector.reconnect_max_seconds", 2.0)
            .set("sources.self_metrics.interval_seconds", 0.5);
    });
    pool.write_lines(agent, 0, 50);
    let dropped = uctel_tests::wait_for(
        "metric samples held while disconnected",
        Duration::from_secs(20),
        Duration::from_millis(200),
        || {
            let s = pool.agents[agent].scrape()?;
            let n = s.count("uctel_agent_buffer_records", &[("stream", "metrics")]);
            if n > 0 {
                Ok(s)
            } else {
                Err("none yet".into())
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        dropped.count(
            "uctel_agent_records_dropped_total",
            &[("stream", "metrics")]
        ),
        0,
        "metric samples are held while no collector is up, not dropped"
    );
    assert_eq!(dropped.count("uctel_agent_connected", &[]), 0);
    assert_eq!(
        dropped.count("uctel_agent_records_dropped_total", &[("stream", "logs")]),
        0,
        "log lines wait; they are not dropped"
    );
    // Bring one collector back: connected within one backoff step (at most 2 s) of it
    // listening.
    let back = 2;
    pool.members[back].daemon.restart();
    pool.wait_up(back, Duration::from_secs(30));
    let up_at = Instant::now();
    uctel_tests::wait_for(
        "the agent connected",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || pool.current(agent).ok_or_else(|| "not yet".to_owned()),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let took = up_at.elapsed();
    println!("connected {took:.2?} after the collector came back");
    assert!(took <= Duration::from_secs(3), "took {took:?}");
    // The 50 lines it held arrive.
    uctel_tests::wait_for(
        "the held log lines delivered",
        Duration::from_secs(20),
        Duration::from_millis(200),
        || {
            let s = uctel_tests::exposition::scrape(pool.members[back].addrs.metrics)?;
            let n = s.count(
                "uctel_collector_records_received_total",
                &[("agent", "lonely-agent"), ("stream", "logs")],
            );
            if n >= 50 {
                Ok(())
            } else {
                Err(format!("{n} lines"))
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(pool.agents[agent]
        .daemon
        .stop(Duration::from_secs(20))
        .success());
}

#[test]
fn a_name_with_three_addresses_is_a_pool_like_the_list() {
    let _guard = uctel_tests::exclusive();
    let name = "uctel-pool-members.test";
    let hosts = match HostsEntries::add(name, 3) {
        Ok(h) => h,
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("skipped: cannot add {name} to /etc/hosts ({e}); CI runs it as root");
            return;
        }
        Err(e) => panic!("cannot add {name} to /etc/hosts: {e}"),
    };
    let mut pool = CollectorPool::start(3, |_| {});
    let members = pool.control_addrs();
    let resolved: BTreeSet<SocketAddr> =
        std::net::ToSocketAddrs::to_socket_addrs(&(name, members[0].port()))
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .collect();
    assert_eq!(
        resolved,
        members.iter().copied().collect(),
        "{name} resolves to the three members"
    );
    for k in 0..6 {
        pool.add_agent_named(&format!("dns-agent-{k}"), name, pool_agent_settings);
    }
    let placed = wait_placed(&pool, Duration::from_secs(30));
    for (i, at) in placed.iter().enumerate() {
        assert_eq!(
            *at,
            first_choice(pool.agents[i].id(), &members),
            "{}",
            pool.agents[i].id()
        );
    }
    println!("{name}: placement {:?}", distribution(&placed, &members));
    // Kill the collector of the first agent: its agents move, the others stay.
    let killed = members.iter().position(|m| *m == placed[0]).unwrap_or(0);
    pool.members[killed].daemon.kill();
    let moved = wait_placed_elsewhere(&pool, &placed, members[killed], Duration::from_secs(10));
    for (i, at) in moved.iter().enumerate() {
        if placed[i] == members[killed] {
            assert_ne!(*at, members[killed]);
        } else {
            assert_eq!(*at, placed[i]);
        }
    }
    for a in &mut pool.agents {
        assert!(a.daemon.stop(Duration::from_secs(20)).success());
    }
    drop(hosts);
}

/// Waits until no agent is on `gone`; the placement then.
fn wait_placed_elsewhere(
    pool: &CollectorPool,
    before: &[SocketAddr],
    gone: SocketAddr,
    timeout: Duration,
) -> Vec<SocketAddr> {
    uctel_tests::wait_for(
        "agents moved off the killed collector",
        timeout,
        Duration::from_millis(100),
        || {
            let p = pool.placement();
            let still: Vec<_> = (0..before.len())
                .filter(|i| p[*i].is_none_or(|c| c == gone))
                .collect();
            if still.is_empty() {
                Ok(p.into_iter().flatten().collect::<Vec<_>>())
            } else {
                Err(format!("agents {still:?} not moved yet"))
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

/// Remote-write across a move: an agent drained off one collector goes on through the
/// next, and its series stay one series in the receiver: same labels, no duplicate
/// timestamps, no stale marker at the move, no gap longer than the move.
#[test]
fn remote_written_series_stay_continuous_when_the_agent_moves() {
    let _guard = uctel_tests::exclusive();
    let receivers = tempfile::Builder::new()
        .prefix("uctel-pool-rw-")
        .tempdir()
        .unwrap_or_else(|e| panic!("{e}"));
    let vm = uctel_tests::victoria::Victoria::start(receivers.path());
    let url = vm.write_url();
    let mut pool = CollectorPool::start(2, |y| {
        let mut endpoint = serde_yaml::Mapping::new();
        endpoint.insert("url".into(), url.clone().into());
        endpoint.insert("batch_send_deadline_seconds".into(), 0.2.into());
        y.set(
            "outputs.remote_write",
            serde_yaml::Value::Sequence(vec![serde_yaml::Value::Mapping(endpoint)]),
        );
    });
    let members = pool.control_addrs();
    let a = pool.add_agent("rw-mover", pool_agent_settings);
    let home = wait_placed(&pool, Duration::from_secs(30))[a];
    std::thread::sleep(Duration::from_secs(6));
    let m = members.iter().position(|x| *x == home).unwrap_or(0);
    let moved_at = std::time::SystemTime::now();
    pool.members[m].daemon.signal(Signal::SIGUSR1);
    assert!(pool.members[m]
        .daemon
        .wait_exit(Duration::from_secs(30))
        .is_some_and(|s| s.success()));
    let away = wait_placed(&pool, Duration::from_secs(10))[a];
    assert_ne!(away, home);
    std::thread::sleep(Duration::from_secs(6));
    assert!(pool.agents[a]
        .daemon
        .stop(Duration::from_secs(20))
        .success());
    std::thread::sleep(Duration::from_secs(2));

    let selector = r#"node_load1{agent="rw-mover"}"#;
    let held = uctel_tests::wait_for(
        "node_load1 of rw-mover in VictoriaMetrics",
        Duration::from_secs(20),
        Duration::from_millis(500),
        || {
            let r = vm.export(selector)?;
            if r.values().map(Vec::len).sum::<usize>() >= 5 {
                Ok(r)
            } else {
                Err(format!(
                    "{} samples",
                    r.values().map(Vec::len).sum::<usize>()
                ))
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", vm.log_tail()));
    assert_eq!(
        held.len(),
        1,
        "one series across both collectors: {:?}",
        held.keys()
    );
    let samples = held.values().next().map(Vec::as_slice).unwrap_or_default();
    let moved_ms = moved_at
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    assert!(
        samples.first().is_some_and(|s| s.0 < moved_ms)
            && samples.last().is_some_and(|s| s.0 > moved_ms),
        "samples on both sides of the move"
    );
    let mut longest = 0;
    for w in samples.windows(2) {
        assert!(
            w[1].0 > w[0].0,
            "duplicate or out-of-order timestamps {w:?}"
        );
        longest = longest.max(w[1].0 - w[0].0);
    }
    println!(
        "{} samples of node_load1 across the move, longest gap {longest} ms",
        samples.len()
    );
    // Host metrics every 2 s: the move costs at most a collection or two.
    assert!(longest <= 6_000, "gap of {longest} ms");
    // The only stale marker is the one of the final shutdown, after the last sample.
    let stale = vm.stale_markers(selector).unwrap_or_else(|e| panic!("{e}"));
    let last = samples.last().map_or(0, |s| s.0);
    let markers: usize = stale.values().map(Vec::len).sum();
    assert_eq!(markers, 1, "one stale marker, the shutdown's: {stale:?}");
    for (labels, marks) in &stale {
        for (t, _) in marks {
            assert!(
                *t >= last,
                "stale marker at {t} before the last sample {last}: {labels:?}"
            );
        }
    }
}

/// Lines of `log` that contain `what` (ANSI colours stripped).
fn log_count(log: &str, what: &str) -> usize {
    uctel_tests::pipeline::strip_ansi(log)
        .lines()
        .filter(|l| l.contains(what))
        .count()
}

/// A collector frozen with SIGSTOP still completes TCP handshakes (the kernel does), but
/// its process answers no `Probe`: the agent stays where it moved while its first choice is
/// frozen, and goes back only after SIGCONT and `return_after_seconds` of answered probes.
#[test]
fn a_frozen_collector_is_not_returned_to_until_it_runs_again() {
    let _guard = uctel_tests::exclusive();
    let mut pool = CollectorPool::start(2, |_| {});
    let members = pool.control_addrs();
    let id = "frozen-home";
    let home = first_choice(id, &members);
    let h = members.iter().position(|m| *m == home).unwrap_or(0);
    let a = pool.add_agent(id, pool_agent_settings);
    assert_eq!(wait_placed(&pool, Duration::from_secs(30))[a], home);
    pool.members[h].daemon.signal(Signal::SIGSTOP);
    let frozen_at = Instant::now();
    let away = uctel_tests::wait_for(
        "the agent moved off the frozen collector",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || match pool.current(a) {
            Some(c) if c != home => Ok(c),
            other => Err(format!("at {other:?}")),
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", pool.agents[a].daemon.log_tail(30)));
    println!("moved to {away} {:?} after SIGSTOP", frozen_at.elapsed());
    // Frozen for four times `return_after` more: probes every 0.5 s all fail.
    let hold = Instant::now();
    while hold.elapsed() < Duration::from_secs_f64(4.0 * RETURN_AFTER_SECONDS) {
        let at = pool.current(a);
        assert!(
            at.is_none_or(|c| c == away),
            "went back to the frozen collector: at {at:?}\n{}",
            pool.agents[a].daemon.log_tail(30)
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let log = pool.agents[a].daemon.log();
    // A move back is logged when it happened, a tried one when its handshake failed.
    assert_eq!(
        log_count(&log, MOVED_BACK)
            + log_count(&log, "moving to another collector of the pool failed"),
        0,
        "tried to move back to the frozen collector\n{}",
        pool.agents[a].daemon.log_tail(30)
    );
    pool.members[h].daemon.signal(Signal::SIGCONT);
    let resumed = Instant::now();
    uctel_tests::wait_for(
        "the agent back home after SIGCONT",
        Duration::from_secs_f64(RETURN_AFTER_SECONDS + 15.0),
        Duration::from_millis(200),
        || match pool.current(a) {
            Some(c) if c == home => Ok(()),
            other => Err(format!("at {other:?}")),
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", pool.agents[a].daemon.log_tail(30)));
    let back = resumed.elapsed();
    println!("back home {back:?} after SIGCONT");
    assert!(
        back >= Duration::from_secs_f64(RETURN_AFTER_SECONDS),
        "returned before return_after: {back:?}"
    );
    let log = pool.agents[a].daemon.log();
    assert_eq!(log_count(&log, MOVED_BACK), 1);
    let s = uctel_tests::exposition::scrape(pool.members[h].addrs.metrics)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        s.count("uctel_collector_probes_total", &[("result", "accepting")]) >= 1,
        "probes answered by the resumed collector"
    );
    assert!(pool.agents[a]
        .daemon
        .stop(Duration::from_secs(20))
        .success());
}

/// `uctel_collector_remote_write_<name>` of collector `m`, summed over its labels that
/// match `matchers`.
fn rw_count(pool: &CollectorPool, m: usize, name: &str, matchers: &[(&str, &str)]) -> u64 {
    let s = uctel_tests::exposition::scrape(pool.members[m].addrs.metrics)
        .unwrap_or_else(|e| panic!("{e}"));
    s.count(&format!("uctel_collector_remote_write_{name}"), matchers)
}

/// Two collectors write one series only one after the other: agent `a`'s first choice is
/// frozen 20 s (SIGSTOP) so `a` moves to the second collector, which writes `a`'s newer
/// samples; when the first runs again it holds `a`'s older ones. It drops them
/// (`agent_moved`) instead of sending them into Prometheus' out-of-order refusal, so no
/// request fails, agent `b` (on the second collector throughout) loses nothing, and every
/// sample of `a` is either in Prometheus or counted.
#[test]
fn a_collector_resumed_after_its_agents_moved_sends_nothing_the_receiver_refuses() {
    let _guard = uctel_tests::exclusive();
    let receivers = tempfile::Builder::new()
        .prefix("uctel-pool-freeze-")
        .tempdir()
        .unwrap_or_else(|e| panic!("{e}"));
    let prom = uctel_tests::prometheus::Prometheus::receiver(receivers.path());
    let url = prom.write_url();
    let mut pool = CollectorPool::start(2, |y| {
        let mut endpoint = serde_yaml::Mapping::new();
        endpoint.insert("url".into(), url.clone().into());
        endpoint.insert("batch_send_deadline_seconds".into(), 0.2.into());
        y.set(
            "outputs.remote_write",
            serde_yaml::Value::Sequence(vec![serde_yaml::Value::Mapping(endpoint)]),
        );
    });
    let members = pool.control_addrs();
    let pick = |home: SocketAddr, prefix: &str| {
        (0..)
            .map(|k| format!("{prefix}-{k}"))
            .find(|id| first_choice(id, &members) == home)
            .unwrap_or_default()
    };
    let (id_a, id_b) = (pick(members[0], "moved"), pick(members[1], "stayed"));
    let a = pool.add_agent(&id_a, pool_agent_settings);
    let b = pool.add_agent(&id_b, pool_agent_settings);
    assert_eq!(
        wait_placed(&pool, Duration::from_secs(30)),
        vec![members[0], members[1]]
    );
    std::thread::sleep(Duration::from_secs(6));
    pool.members[0].daemon.signal(Signal::SIGSTOP);
    let frozen_at = Instant::now();
    uctel_tests::wait_for(
        "a moved off the frozen collector",
        Duration::from_secs(20),
        Duration::from_millis(200),
        || match pool.current(a) {
            Some(c) if c == members[1] => Ok(()),
            other => Err(format!("at {other:?}")),
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", pool.agents[a].daemon.log_tail(30)));
    std::thread::sleep(Duration::from_secs(20).saturating_sub(frozen_at.elapsed()));
    pool.members[0].daemon.signal(Signal::SIGCONT);
    // `a` goes home after `return_after`, and writes through the first collector again.
    uctel_tests::wait_for(
        "a back home",
        Duration::from_secs_f64(RETURN_AFTER_SECONDS + 15.0),
        Duration::from_millis(200),
        || match pool.current(a) {
            Some(c) if c == members[0] => Ok(()),
            other => Err(format!("at {other:?}")),
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", pool.agents[a].daemon.log_tail(30)));
    std::thread::sleep(Duration::from_secs(6));
    for i in [a, b] {
        assert!(pool.agents[i]
            .daemon
            .stop(Duration::from_secs(20))
            .success());
    }
    std::thread::sleep(Duration::from_secs(3));

    for m in 0..2 {
        let failed = rw_count(&pool, m, "samples_failed_total", &[]);
        let sent = rw_count(&pool, m, "samples_total", &[]);
        let dropped = rw_count(&pool, m, "samples_dropped_total", &[]);
        let moved = rw_count(
            &pool,
            m,
            "samples_dropped_total",
            &[("reason", "agent_moved")],
        );
        let pending = rw_count(&pool, m, "samples_pending", &[]);
        let samples_in = rw_count(&pool, m, "samples_in_total", &[]);
        println!(
            "collector {m}: in {samples_in}, sent {sent}, dropped {dropped} (agent_moved {moved}), failed {failed}, pending {pending}"
        );
        assert_eq!(
            failed,
            0,
            "collector {m}: remote-write samples refused\n{}",
            pool.members[m].daemon.log_tail(30)
        );
        assert_eq!(samples_in, sent + dropped + pending, "collector {m}");
        if m == 0 {
            assert!(moved > 0, "the resumed collector dropped a's held samples");
            assert_eq!(
                log_count(
                    &pool.members[0].daemon.log(),
                    "did not run for longer than its dead-peer time"
                ),
                1,
                "logged once"
            );
        } else {
            assert_eq!(
                moved, 0,
                "the collector that ran throughout dropped nothing"
            );
        }
    }
    // b: every 2 s, no gap across the freeze.
    let sel = |id: &str| format!(r#"node_load1{{agent="{id}"}}"#);
    let held = prom
        .raw_samples(&sel(&id_b))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(held.len(), 1, "one series of b: {:?}", held.keys());
    let samples = held.values().next().map(Vec::as_slice).unwrap_or_default();
    let longest = samples
        .windows(2)
        .map(|w| w[1].0 - w[0].0)
        .max()
        .unwrap_or(0);
    println!("b: {} samples, longest gap {longest} ms", samples.len());
    assert!(
        samples.len() >= 15 && longest <= 4_000,
        "b lost samples: gap {longest} ms"
    );
    // a: one series in Prometheus, written by both collectors, before and after the freeze.
    let held = prom
        .raw_samples(&sel(&id_a))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(held.len(), 1, "one series of a: {:?}", held.keys());
    let samples = held.values().next().map(Vec::as_slice).unwrap_or_default();
    let longest = samples
        .windows(2)
        .map(|w| w[1].0 - w[0].0)
        .max()
        .unwrap_or(0);
    println!("a: {} samples, longest gap {longest} ms", samples.len());
    assert!(samples.len() >= 10, "a: {} samples", samples.len());
}
