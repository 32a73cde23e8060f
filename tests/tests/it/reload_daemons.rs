//! Reloads through the real `uctel-collector` and `uctel-agent` binaries:
//!
//! - `a_lower_max_agents_refuses_the_next_agent_and_keeps_those_connected`: a reload that
//!   lowers `control.max_agents`: the agents connected stay (one session each, nothing sent
//!   away), and the next agent is refused `busy`, counted in
//!   `uctel_collector_handshakes_refused_total{reason="busy"}` and logged with the new
//!   limit.
//! - `the_agent_answers_409_to_live_keys_whose_change_needs_a_restart`: the agent's live
//!   keys whose new value needs a restart (`sources.fast_counters` or
//!   `sources.pod_resources` added, a smaller
//!   `streams.metrics.buffer_while_disconnected_records`) are refused with 409 on
//!   `POST /-/reload`, the `log_level` change beside them not applied.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use nix::sys::signal::Signal;
use uctel_tests::pipeline::{connected_epochs, Pipeline};

#[test]
fn a_lower_max_agents_refuses_the_next_agent_and_keeps_those_connected() {
    let _g = uctel_tests::exclusive();
    let mut p = Pipeline::start();
    p.add_agent("keep-a", 0.0, 1.0);
    p.add_agent("keep-b", 0.0, 1.0);
    p.wait_flowing(
        2,
        &["keep-a", "keep-b"],
        &["metrics"],
        Duration::from_secs(60),
    );

    let config = p.collector.config_path().to_path_buf();
    let mut y = uctel_tests::configs::Yaml(
        serde_yaml::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap(),
    );
    y.set("control.max_agents", 1);
    y.write(&config);
    p.collector.signal(Signal::SIGHUP);
    uctel_tests::wait_for(
        "the reload applied",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            let log = p.collector.log();
            log.contains("configuration reloaded: applied control.max_agents")
                .then_some(())
                .ok_or_else(|| p.collector.log_tail(20))
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));

    p.add_agent("late-c", 0.0, 1.0);
    uctel_tests::wait_for(
        "the third agent refused busy",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || {
            let s = p.scrape()?;
            let busy = s.count(
                "uctel_collector_handshakes_refused_total",
                &[("reason", "busy")],
            );
            (busy >= 1)
                .then_some(())
                .ok_or(format!("busy refusals {busy}"))
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", p.collector.log_tail(40)));
    // A few more of the third agent's attempts: none gets in, the two stay.
    std::thread::sleep(Duration::from_secs(3));
    let s = p.scrape().unwrap();
    assert_eq!(s.count("uctel_collector_agents_connected", &[]), 2);
    let log = p.collector.log();
    // Refused at accept, before its Hello names it: the line says why, with the new limit.
    assert!(
        log.lines().any(|l| l.contains("handshake refused")
            && l.contains("busy")
            && l.contains("control.max_agents (1)")),
        "the refusal is logged with the new limit: {}",
        p.collector.log_tail(40)
    );
    assert!(
        connected_epochs(&log, "late-c").is_empty(),
        "the third agent never connected"
    );
    for id in ["keep-a", "keep-b"] {
        assert_eq!(
            connected_epochs(&log, id).len(),
            1,
            "{id} keeps its one session through the reload"
        );
        let frames = |s: &uctel_tests::exposition::Scrape| {
            s.count(
                "uctel_collector_frames_received_total",
                &[("agent", id), ("stream", "metrics")],
            )
        };
        let before = frames(&s);
        uctel_tests::wait_for(
            "frames still flowing",
            Duration::from_secs(10),
            Duration::from_millis(200),
            || {
                let now = frames(&p.scrape()?);
                (now > before).then_some(()).ok_or(format!("{now} frames"))
            },
        )
        .unwrap_or_else(|e| panic!("{id}: {e}"));
    }
    let late = p.agents[2].daemon.log();
    assert!(
        late.contains("busy"),
        "the third agent hears why it was refused: {late}"
    );
}

/// A change to a configuration file.
type Edit = dyn Fn(&mut uctel_tests::configs::Yaml);

/// One HTTP/1.1 request to `addr`: the status and the body.
fn request(addr: SocketAddr, method: &str, target: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("{addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        s,
        "{method} {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
    (status, body)
}

#[test]
fn the_agent_answers_409_to_live_keys_whose_change_needs_a_restart() {
    let _g = uctel_tests::exclusive();
    let mut p = Pipeline::start();
    let i = p.add_agent_with("refuse-a", 0.0, 1.0, |y| {
        y.set("listen.enable_lifecycle", true);
    });
    p.wait_flowing(1, &["refuse-a"], &["metrics"], Duration::from_secs(60));
    let addr = p.agents[i].options.metrics;
    let config = p.agents[i].daemon.config_path().to_path_buf();
    let original = std::fs::read_to_string(&config).unwrap();
    let filter = |addr| request(addr, "GET", "/api/v1/log_level").1;
    let before = filter(addr);
    assert!(!before.contains("uctel_agent=debug"), "{before}");
    let ok = |addr| {
        let s = uctel_tests::exposition::scrape(addr).unwrap();
        s.count("uctel_agent_config_last_reload_successful", &[])
    };
    let cases: [(&str, &Edit); 3] = [
        ("sources.fast_counters (added or removed)", &|y| {
            y.set(
                "sources.fast_counters",
                serde_yaml::from_str::<serde_yaml::Value>(
                    "{interval_milliseconds: 10, counters: [{path: /proc/uptime, name: up_probe}]}",
                )
                .unwrap(),
            );
        }),
        ("sources.pod_resources (added or removed)", &|y| {
            y.set(
                "sources.pod_resources",
                serde_yaml::Value::Mapping(serde_yaml::Mapping::new()),
            );
        }),
        (
            "streams.metrics.buffer_while_disconnected_records (smaller)",
            &|y| {
                y.set("streams.metrics.buffer_while_disconnected_records", 10);
            },
        ),
    ];
    for (key, edit) in cases {
        let mut y = uctel_tests::configs::Yaml(serde_yaml::from_str(&original).unwrap());
        y.set("log_level", "info,uctel_agent=debug");
        edit(&mut y);
        y.write(&config);
        let (status, body) = request(addr, "POST", "/-/reload");
        assert_eq!(status, 409, "{key}: {body}");
        assert!(
            body.contains(&format!("{key} needs a restart")) && !body.contains("log_level"),
            "{key}: {body}"
        );
        assert_eq!(ok(addr), 0, "{key}: the failed reload is said");
        assert!(
            !filter(addr).contains("uctel_agent=debug"),
            "{key}: the log_level beside it not applied"
        );
    }
    std::fs::write(&config, &original).unwrap();
    let (status, body) = request(addr, "POST", "/-/reload");
    assert_eq!(status, 200, "{body}");
    assert_eq!(ok(addr), 1);
    assert_eq!(
        connected_epochs(&p.collector.log(), "refuse-a").len(),
        1,
        "one session throughout"
    );
}
