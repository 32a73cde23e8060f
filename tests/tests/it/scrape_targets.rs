//! The scrape source against targets beyond node_exporter:
//! - **OpenMetrics**: the official Python client (Debian's `python3-prometheus-client`)
//!   serving one registry with every metric type answers the agent in OpenMetrics (the agent
//!   asks for it first, as Prometheus does) and a plain scrape in the text format 0.0.4: the
//!   collector must hold exactly the series, values, help texts and types of the 0.0.4 answer.
//! - **Bad targets**: one that never answers, one that answers 500, and one that answers 50 MB
//!   of garbage, scraped every second beside the host metrics: each failure is counted with
//!   its reason, `up` is 0 for each, the host metrics keep arriving every interval, and the
//!   agent's peak RSS stays under a stated bound.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use uctel_tests::daemon::Daemon;
use uctel_tests::exposition::{scrape, Scrape};
use uctel_tests::node_exporter::{same, series};
use uctel_tests::pipeline::Pipeline;

/// The agent's peak RSS (`VmHWM`) allowed while a target answers 50 MB of garbage: the
/// answer is read into memory up to that target's 64 MiB `body_size_limit`, so about 64 MiB for
/// the body and the agent's own working set (tens of MiB) fit well within it.
const RSS_BOUND_KIB: u64 = 192 * 1024;

/// `# HELP` text and `# TYPE` of each family of an exposition.
fn families(s: &Scrape) -> BTreeMap<String, (String, String)> {
    let mut out: BTreeMap<String, (String, String)> = BTreeMap::new();
    for line in s.text.lines() {
        let mut parts = line.splitn(4, ' ');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some("#"), Some("HELP"), Some(name), help) => {
                out.entry(name.to_owned()).or_default().0 = help.unwrap_or("").to_owned();
            }
            (Some("#"), Some("TYPE"), Some(name), Some(ty)) => {
                out.entry(name.to_owned()).or_default().1 = ty.to_owned();
            }
            _ => {}
        }
    }
    out
}

/// A series key of the target's 0.0.4 answer as the collector serves it: a bucket bound is
/// a number to the protocol, so `le="1.0"` is served as `le="1"`; the gauge histogram's
/// `_gcount` and `_gsum` travel as the protocol histogram's `_count` and `_sum`.
fn expected_key(key: &str) -> String {
    let key = key
        .replace("queue_depth_gcount", "queue_depth_count")
        .replace("queue_depth_gsum", "queue_depth_sum");
    let Some((head, rest)) = key.split_once("le=\"") else {
        return key;
    };
    let Some((bound, tail)) = rest.split_once('"') else {
        return key;
    };
    match bound.parse::<f64>() {
        Ok(b) if b.is_finite() => format!("{head}le=\"{b}\"{tail}"),
        _ => key,
    }
}

/// Starts the Python client's target on a free port and waits until it answers.
fn python_target(dir: &Path) -> (SocketAddr, Daemon) {
    let script = uctel_tests::workspace_root().join("tests/data/openmetrics-target.py");
    let python = Path::new("/usr/bin/python3");
    let addr = uctel_tests::net::free_addr();
    let log = dir.join("openmetrics-target.log");
    let out = std::fs::File::create(&log).unwrap_or_else(|e| panic!("{e}"));
    let err = out.try_clone().unwrap_or_else(|e| panic!("{e}"));
    let child = Command::new(python)
        .arg(&script)
        .arg(addr.port().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", python.display()));
    let daemon = Daemon::adopt("openmetrics-target", python, &script, &log, child);
    uctel_tests::wait_for(
        "the Python client's target up (install python3-prometheus-client)",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || scrape(addr).map(|_| ()),
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", daemon.log_tail(20)));
    (addr, daemon)
}

#[test]
fn an_openmetrics_target_arrives_as_its_text_format_answer() {
    let _guard = uctel_tests::exclusive();
    let mut p = Pipeline::start();
    let (addr, _target) = python_target(p.path());
    // What the target itself says the OpenMetrics answer is.
    let om = std::process::Command::new("curl")
        .args([
            "-s",
            "-H",
            "Accept: application/openmetrics-text;version=1.0.0",
            &format!("http://{addr}/metrics"),
        ])
        .output()
        .unwrap_or_else(|e| panic!("curl: {e}"));
    let om = String::from_utf8_lossy(&om.stdout).into_owned();
    assert!(
        om.ends_with("# EOF\n") && om.contains("# TYPE jobs counter"),
        "the target does not speak OpenMetrics:\n{om}"
    );
    let targets = serde_yaml::from_str::<serde_yaml::Value>(&format!(
        "- {{url: 'http://{addr}/metrics', job: om, interval_seconds: 1, timeout_seconds: 1}}\n"
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    p.add_agent_with("om-agent", 0.0, 1.0, |y| {
        y.set("sources.host_metrics.enabled", false)
            .set("sources.scrape", targets.clone());
    });
    let mine = |smp: &uctel_testkit::Sample| {
        smp.label("agent") == Some("om-agent") && smp.label("job") == Some("om")
    };
    let health = [
        "up",
        "scrape_duration_seconds",
        "scrape_samples_scraped",
        "scrape_samples_post_metric_relabeling",
    ];
    let direct = scrape(addr).unwrap_or_else(|e| panic!("{e}"));
    let want: BTreeMap<String, f64> = series(&direct, &[], |_| true)
        .into_iter()
        .map(|(k, v)| (expected_key(&k), v))
        .collect();
    let mut at = BTreeMap::new();
    uctel_tests::wait_for(
        "the target's series at the collector",
        Duration::from_secs(30),
        Duration::from_millis(500),
        || {
            let c = p.scrape()?;
            at = series(&c, &["agent", "instance", "exported_instance", "job"], mine);
            at.retain(|k, _| !health.contains(&k.split('{').next().unwrap_or_default()));
            if at.len() >= want.len() {
                Ok(())
            } else {
                Err(format!("{} of {} series", at.len(), want.len()))
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", p.agents[0].daemon.log_tail(20)));
    let c = p.scrape().unwrap_or_else(|e| panic!("{e}"));
    let up = series(&c, &["agent", "instance", "exported_instance", "job"], mine);
    assert_eq!(up.get("up{}"), Some(&1.0), "{up:?}");
    let mut diff = Vec::new();
    for (k, v) in &want {
        match at.get(k) {
            None => diff.push(format!("missing at the collector: {k}")),
            Some(c) if !same(*c, *v) => diff.push(format!("{k}: target {v}, collector {c}")),
            Some(_) => {}
        }
    }
    for k in at.keys().filter(|k| !want.contains_key(*k)) {
        diff.push(format!("only at the collector: {k}"));
    }
    // Help and type per family. A summary's series travel one by one (the protocol has no
    // summary type), so they are compared above, series by series, not as a family.
    let (theirs, ours) = (families(&direct), families(&c));
    for (family, (help, ty)) in &theirs {
        if ty == "summary" || family.starts_with("queue_depth_g") {
            continue;
        }
        match ours.get(family) {
            None => diff.push(format!("no family {family} at the collector")),
            Some((h, t)) => {
                let ty = if ty == "untyped" {
                    "gauge"
                } else {
                    ty.as_str()
                };
                if h != help || t != ty {
                    diff.push(format!(
                        "{family}: collector {h:?} {t}, target {help:?} {ty}"
                    ));
                }
            }
        }
    }
    println!(
        "OpenMetrics target: {} series in its 0.0.4 answer, {} at the collector, {} families",
        want.len(),
        at.len(),
        theirs.len()
    );
    assert!(diff.is_empty(), "{}", diff.join("\n"));
    assert!(want.len() >= 20, "{want:?}");
    let a = p.agents[0].scrape().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        a.count("uctel_agent_source_errors_total", &[("source", "scrape")]),
        0
    );
    p.agents[0].daemon.stop(Duration::from_secs(20));
}

/// A target that accepts connections, reads the request and never answers.
fn hanging_target() -> SocketAddr {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let addr = listener.local_addr().expect("address");
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let _held = &stream;
                std::thread::sleep(Duration::from_secs(3600));
            });
        }
    });
    addr
}

/// A target that answers every request with `body` as `text/plain; version=0.0.4`.
fn target_answering(body: Arc<Vec<u8>>) -> SocketAddr {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let addr = listener.local_addr().expect("address");
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let body = Arc::clone(&body);
            std::thread::spawn(move || {
                let Ok(read) = stream.try_clone() else { return };
                let mut reader = BufReader::new(read);
                let mut line = String::new();
                while reader.read_line(&mut line).unwrap_or(0) > 0 {
                    if line == "\r\n" {
                        let mut out = &stream;
                        let head = format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n\
                             Content-Length: {}\r\n\r\n",
                            body.len()
                        );
                        if out.write_all(head.as_bytes()).is_err() || out.write_all(&body).is_err()
                        {
                            return;
                        }
                    }
                    line.clear();
                }
            });
        }
    });
    addr
}

/// 50 MB of text that looks like an exposition at a glance and is not one.
fn garbage() -> Vec<u8> {
    let mut out = Vec::with_capacity(50_000_000);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    while out.len() < 50_000_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = b"abc_{}=\" #.0123456789\n"[(x % 22) as usize];
        out.push(b);
    }
    out
}

#[test]
fn hanging_failing_and_garbage_targets_are_counted_and_host_metrics_stay_on_time() {
    let _guard = uctel_tests::exclusive();
    let mut p = Pipeline::start();
    let (hang, failing, junk) = (
        hanging_target(),
        uctel_tests::net::http_answering("500 Internal Server Error"),
        target_answering(Arc::new(garbage())),
    );
    let targets = serde_yaml::from_str::<serde_yaml::Value>(&format!(
        "- {{url: 'http://{hang}/metrics', job: hang, interval_seconds: 1, timeout_seconds: 1}}\n\
         - {{url: 'http://{failing}/metrics', job: failing, interval_seconds: 1, timeout_seconds: 1}}\n\
         - {{url: 'http://{junk}/metrics', job: junk, interval_seconds: 2, timeout_seconds: 2, body_size_limit: 64MiB}}\n"
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    p.add_agent_with("bad-targets", 0.0, 1.0, |y| {
        y.set("sources.scrape", targets.clone());
    });
    let ours = |smp: &uctel_testkit::Sample| smp.label("agent") == Some("bad-targets");
    uctel_tests::wait_for(
        "the agent's host metrics",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || {
            let c = p.scrape()?;
            series(&c, &["agent", "instance"], ours)
                .contains_key("node_time_seconds{}")
                .then_some(())
                .ok_or_else(|| "no node_time_seconds yet".to_owned())
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", p.agents[0].daemon.log_tail(30)));
    // 20 s of host metrics, sampled every 200 ms at the collector: the longest time between
    // two new values of `node_time_seconds` (the agent's clock at each 1 s collection).
    let started = Instant::now();
    let (mut last, mut last_change, mut longest, mut changes) = (0.0, Instant::now(), 0.0, 0);
    while started.elapsed() < Duration::from_secs(20) {
        let c = p.scrape().unwrap_or_else(|e| panic!("{e}"));
        let now = series(&c, &["agent", "instance"], ours)
            .get("node_time_seconds{}")
            .copied()
            .unwrap_or(0.0);
        if now != last {
            let gap = last_change.elapsed().as_secs_f64();
            if changes > 0 {
                longest = f64::max(longest, gap);
            }
            last = now;
            last_change = Instant::now();
            changes += 1;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let c = p.scrape().unwrap_or_else(|e| panic!("{e}"));
    let a = p.agents[0].scrape().unwrap_or_else(|e| panic!("{e}"));
    let errors = |reason: &str| {
        a.count(
            "uctel_agent_source_errors_total",
            &[("source", "scrape"), ("reason", reason)],
        )
    };
    let (timeouts, statuses, parse) = (
        errors("timeout"),
        errors("http_status"),
        errors("parse_error"),
    );
    let up = |job: &str| {
        series(
            &c,
            &["agent", "instance", "exported_instance", "job"],
            |s| ours(s) && s.label("job") == Some(job),
        )
        .get("up{}")
        .copied()
    };
    let pid = p.agents[0]
        .daemon
        .pid()
        .unwrap_or_else(|| panic!("agent pid"));
    let (rss, hwm) = uctel_tests::faults::memory_kib(pid).unwrap_or_else(|| panic!("VmHWM"));
    println!(
        "bad targets: {changes} host collections in 20 s, longest gap {longest:.2} s; \
         timeouts {timeouts}, http_status {statuses}, parse_error {parse}; \
         agent VmRSS {rss} KiB, VmHWM {hwm} KiB (bound {RSS_BOUND_KIB} KiB)"
    );
    assert!(changes >= 17, "{changes} host collections in 20 s");
    assert!(longest < 2.5, "host metrics stalled for {longest:.2} s");
    assert!(
        timeouts >= 10 && statuses >= 10 && parse >= 5,
        "{timeouts} {statuses} {parse}"
    );
    for job in ["hang", "failing", "junk"] {
        assert_eq!(up(job), Some(0.0), "{job}");
    }
    assert!(
        hwm <= RSS_BOUND_KIB,
        "VmHWM {hwm} KiB over {RSS_BOUND_KIB} KiB"
    );
    p.agents[0].daemon.stop(Duration::from_secs(20));
}
