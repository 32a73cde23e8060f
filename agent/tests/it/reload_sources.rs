//! Reload changes the agent's sources live (`POST /-/reload`, the agent running in-process
//! against the real collector on loopback, soft RoCEv2): a scrape target added appears on
//! the collector's `/metrics` and, removed, leaves it, while the target kept goes on in the
//! same session; the host-metrics interval changes; the journald source's unit filter
//! changes over real journal files (`systemd-journal-remote`) with every entry delivered
//! exactly once across the hand-over, and the status API shows its cursors.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use uctel_agent::config::AgentConfig;
use uctel_agent::run::Options;
use uctel_agent::stream::Stream;
use uctel_testkit::exposition::scrape;
use uctel_testkit::wait::until;
use uctel_testkit::{RunningAgent, RunningCollector};

fn example(name: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../config")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// `config/collector.yaml` on ephemeral loopback ports, logs to `sink`, series gone from
/// `/metrics` one second after their last sample.
fn collector_config(sink: &Path) -> uctel_collector::config::Config {
    let mut v: serde_yaml::Value =
        serde_yaml::from_str(&example("collector.yaml")).unwrap_or_else(|e| panic!("{e}"));
    v["listen"]["control"] = "127.0.0.1:0".into();
    v["listen"]["metrics"] = "127.0.0.1:0".into();
    v["transport"]["soft"]["bind"] = "127.0.0.1:0".into();
    v["logs"]["sink"] = "file".into();
    v["logs"]["file"]["path"] = sink.display().to_string().into();
    v["staleness_seconds"] = 1.0.into();
    let text = serde_yaml::to_string(&v).unwrap_or_else(|e| panic!("{e}"));
    uctel_common::config::from_str("collector.yaml", &text).unwrap_or_else(|e| panic!("{e}"))
}

/// `config/agent.yaml` pointed at `control`, lifecycle on, no log files, state in `dir`,
/// with `sources` merged over it.
fn agent_yaml(control: SocketAddr, dir: &Path, sources: &serde_yaml::Value) -> serde_yaml::Value {
    let mut v: serde_yaml::Value =
        serde_yaml::from_str(&example("agent.yaml")).unwrap_or_else(|e| panic!("{e}"));
    v["agent_id"] = "reload-agent".into();
    v["collector"]["control"] = control.to_string().into();
    v["listen"]["metrics"] = serde_yaml::Value::Null;
    v["listen"]["enable_lifecycle"] = true.into();
    v["streams"]["metrics"]["flush_milliseconds"] = 20.into();
    v["streams"]["logs"]["flush_milliseconds"] = 20.into();
    v["sources"]["logs"] = serde_yaml::Value::Sequence(Vec::new());
    v["sources"]["state_directory"] = dir.join("state").display().to_string().into();
    v["sources"]["self_metrics"]["enabled"] = false.into();
    if let serde_yaml::Value::Mapping(m) = sources {
        for (k, val) in m {
            v["sources"][k] = val.clone();
        }
    }
    v
}

fn write_config(path: &Path, v: &serde_yaml::Value) -> AgentConfig {
    let text = serde_yaml::to_string(v).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(path, &text).unwrap_or_else(|e| panic!("{e}"));
    AgentConfig::from_yaml("agent.yaml", &text).unwrap_or_else(|e| panic!("{e}"))
}

/// The agent serving its HTTP port, reloading from `path`.
async fn start_agent(config: AgentConfig, path: PathBuf) -> (RunningAgent, SocketAddr) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let options = Options {
        stats: None,
        metrics_listener: Some(listener),
        reload: Some(uctel_agent::reload::ReloadSource {
            path,
            agent_id: None,
            log_rule: uctel_common::logging::BaseRule::default(),
        }),
    };
    let agent = RunningAgent::start_with(config, options);
    let stats = agent.stats.clone();
    until("the agent connected", Duration::from_secs(10), || {
        stats.connected()
    })
    .await;
    (agent, addr)
}

/// `POST /-/reload`: `(status, body)`.
async fn reload(addr: SocketAddr) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    s.write_all(
        b"POST /-/reload HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), s.read_to_end(&mut out))
        .await
        .unwrap_or_else(|_| panic!("no answer to the reload"))
        .unwrap_or_else(|e| panic!("{e}"));
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
    (status, body)
}

/// A scrape target on a free loopback port answering `body` (Prometheus text format).
async fn target(body: &'static str) -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let _ = s.read(&mut buf).await;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(answer.as_bytes()).await;
            });
        }
    });
    addr
}

fn scrape_entry(addr: SocketAddr) -> serde_yaml::Value {
    serde_yaml::from_str(&format!(
        "{{url: 'http://{addr}/metrics', interval_seconds: 0.2}}"
    ))
    .unwrap_or_else(|e| panic!("{e}"))
}

/// The agent's `/metrics` value of `uctel_agent_round_lateness_seconds_count` for `source`.
fn rounds(agent: SocketAddr, source: &str) -> u64 {
    scrape(agent)
        .map(|s| {
            s.sum(
                "uctel_agent_round_lateness_seconds_count",
                &[("source", source)],
            ) as u64
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_target_added_then_removed_and_the_host_interval_changed_live() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let collector = RunningCollector::start(collector_config(&dir.path().join("sink.jsonl"))).await;
    let kept = target("reload_probe_kept 1\n").await;
    let added = target("reload_probe_added 2\n").await;
    let path = dir.path().join("agent.yaml");
    let sources = |targets: Vec<SocketAddr>, host_interval: f64| {
        let mut m = serde_yaml::Mapping::new();
        m.insert(
            "scrape".into(),
            serde_yaml::Value::Sequence(targets.into_iter().map(scrape_entry).collect()),
        );
        let host: serde_yaml::Value = serde_yaml::from_str(&format!(
            "{{interval_seconds: {host_interval}, disabled_collectors: []}}"
        ))
        .unwrap_or_else(|e| panic!("{e}"));
        m.insert("host_metrics".into(), host);
        serde_yaml::Value::Mapping(m)
    };
    let control = collector.control_addr();
    // Host metrics once an hour: no round comes during the test until the reload.
    let config = write_config(
        &path,
        &agent_yaml(control, dir.path(), &sources(vec![kept], 3600.0)),
    );
    let (agent, addr) = start_agent(config, path.clone()).await;
    let metrics = collector.metrics_addr();
    let has = |name: &str| scrape(metrics).is_ok_and(|s| s.has(name, &[]));
    until(
        "the kept target's series on the collector",
        Duration::from_secs(10),
        || has("reload_probe_kept"),
    )
    .await;
    assert!(!has("reload_probe_added"));
    let host_before = rounds(addr, "host_metrics");

    // Added, and host metrics every 0.2 s.
    write_config(
        &path,
        &agent_yaml(control, dir.path(), &sources(vec![kept, added], 0.2)),
    );
    let (status, body) = reload(addr).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("sources.scrape") && body.contains("sources.host_metrics"),
        "{body}"
    );
    until(
        "the added target's series on the collector",
        Duration::from_secs(10),
        || has("reload_probe_added"),
    )
    .await;
    until(
        "host metrics rounds every 0.2 s",
        Duration::from_secs(10),
        || {
            let n = rounds(addr, "host_metrics");
            if n >= host_before + 5 {
                Ok(())
            } else {
                Err(format!("{n} rounds, {host_before} before the reload"))
            }
        },
    )
    .await;
    let status_doc = uctel_testkit::http::http_get(addr, "/api/v1/status")
        .await
        .1;
    assert!(
        status_doc.contains(&format!("http://{added}/metrics")),
        "{status_doc}"
    );

    // Removed: its series leave the collector's /metrics (staleness 1 s), the kept one stays.
    write_config(
        &path,
        &agent_yaml(control, dir.path(), &sources(vec![kept], 0.2)),
    );
    let (status, body) = reload(addr).await;
    assert_eq!(status, 200, "{body}");
    until(
        "the removed target's series gone",
        Duration::from_secs(10),
        || !has("reload_probe_added"),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(has("reload_probe_kept"), "the kept target is still scraped");
    assert!(
        !has("reload_probe_added"),
        "the removed target is not scraped"
    );
    let status_doc = uctel_testkit::http::http_get(addr, "/api/v1/status")
        .await
        .1;
    assert!(
        !status_doc.contains(&format!("http://{added}/metrics")),
        "{status_doc}"
    );

    // The queue sizes change live; a smaller buffer while disconnected needs a restart.
    let mut y = agent_yaml(control, dir.path(), &sources(vec![kept], 0.2));
    y["streams"]["metrics"]["queue_records"] = 100_000.into();
    y["streams"]["logs"]["queue_records"] = 16.into();
    write_config(&path, &y);
    let (status, body) = reload(addr).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("streams.metrics.queue_records")
            && body.contains("streams.logs.queue_records"),
        "{body}"
    );
    y["streams"]["metrics"]["buffer_while_disconnected_records"] = 10.into();
    write_config(&path, &y);
    let (status, body) = reload(addr).await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body.contains("buffer_while_disconnected_records (smaller) needs a restart"),
        "{body}"
    );

    // Adding fast_counters needs a restart: refused, nothing changes.
    let mut y = agent_yaml(control, dir.path(), &sources(vec![kept], 3600.0));
    y["streams"]["metrics"]["queue_records"] = 100_000.into();
    y["streams"]["logs"]["queue_records"] = 16.into();
    y["sources"]["fast_counters"] = serde_yaml::from_str(
        "{interval_milliseconds: 10, counters: [{path: /proc/uptime, name: up_probe}]}",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    write_config(&path, &y);
    let (status, body) = reload(addr).await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body.contains("sources.fast_counters (added or removed) needs a restart"),
        "{body}"
    );
    let n = rounds(addr, "host_metrics");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        rounds(addr, "host_metrics") > n,
        "the host interval stays 0.2 s"
    );

    let summary = agent.stop().await;
    assert_eq!(
        summary.sessions, 1,
        "one session across the reloads: {summary:?}"
    );
    collector.stop().await;
}

const JOURNAL_REMOTE: &str = "/lib/systemd/systemd-journal-remote";

/// Writes entries `range` (message `entry <n>`, unit `u<n % 3>.service`) into
/// `<dir>/remote.journal` with systemd-journal-remote (as `sources_journald` does).
fn write_entries(dir: &Path, range: std::ops::Range<u64>) {
    use std::io::Write;
    assert!(
        Path::new(JOURNAL_REMOTE).exists(),
        "{JOURNAL_REMOTE} missing: install the Debian package systemd-journal-remote (scripts/install-deps)"
    );
    let mut export = String::new();
    for n in range {
        export.push_str(&format!(
            "__REALTIME_TIMESTAMP={}\n__MONOTONIC_TIMESTAMP={}\n_BOOT_ID=0123456789abcdef0123456789abcdef\n\
             MESSAGE=entry {n}\nPRIORITY=6\n_SYSTEMD_UNIT=u{}.service\n_PID={}\n_COMM=app\n\n",
            1_700_000_000_000_000 + n,
            1000 + n,
            n % 3,
            100 + n,
        ));
    }
    let mut child = std::process::Command::new(JOURNAL_REMOTE)
        .arg(format!("--output={}", dir.join("remote.journal").display()))
        .arg("-")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{JOURNAL_REMOTE}: {e}"));
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(export.as_bytes())
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let out = child.wait_with_output().unwrap_or_else(|e| panic!("{e}"));
    assert!(
        out.status.success(),
        "systemd-journal-remote: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The messages in the collector's log sink, in order.
fn sink_messages(sink: &Path) -> Vec<String> {
    std::fs::read_to_string(sink)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["message"].as_str().map(str::to_owned))
        .collect()
}

fn journald(dir: &Path, units: &[&str]) -> serde_yaml::Value {
    let mut m = serde_yaml::Mapping::new();
    let j: serde_yaml::Value = serde_yaml::from_str(&format!(
        "{{directory: '{}', start_at: beginning, poll_interval_seconds: 0.05, include_units: [{}]}}",
        dir.display(),
        units.join(", ")
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    m.insert("journald".into(), j);
    m.insert(
        "host_metrics".into(),
        serde_yaml::from_str("{enabled: false}").unwrap_or_else(|e| panic!("{e}")),
    );
    serde_yaml::Value::Mapping(m)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_journald_unit_filter_changes_live_and_every_entry_arrives_once() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let journal = dir.path().join("journal");
    std::fs::create_dir_all(&journal).unwrap_or_else(|e| panic!("{e}"));
    let sink = dir.path().join("sink.jsonl");
    let collector = RunningCollector::start(collector_config(&sink)).await;
    let control = collector.control_addr();
    let path = dir.path().join("agent.yaml");
    write_entries(&journal, 0..30);
    let config = write_config(
        &path,
        &agent_yaml(control, dir.path(), &journald(&journal, &["u0"])),
    );
    let (agent, addr) = start_agent(config, path.clone()).await;
    let stats = agent.stats.clone();
    let sent = |n: u64| {
        let stats = stats.clone();
        move || {
            let s = stats.records_sent(Stream::Logs);
            if s >= n {
                Ok(())
            } else {
                Err(format!("{s} log records sent, want {n}"))
            }
        }
    };
    // u0: entries 0, 3, …, 27.
    until("the u0 entries sent", Duration::from_secs(20), sent(10)).await;
    // The status board is refreshed every 250 ms.
    let mut doc = serde_json::Value::Null;
    for _ in 0..100 {
        let text = uctel_testkit::http::http_get(addr, "/api/v1/status")
            .await
            .1;
        doc = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        if doc["sources"]["journald"]["entries_read"] == 10 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let j = &doc["sources"]["journald"];
    assert_eq!(j["entries_read"], 10, "{j}");
    assert!(
        j["last_read_cursor"]
            .as_str()
            .is_some_and(|c| c.starts_with("s=")),
        "{j}"
    );
    assert!(j["settled_cursor"].is_string(), "{j}");
    assert!(doc["sources"]["kmsg"].is_null(), "{doc}");

    // u0 and u1 from now on: the new source goes on after the last entry the old one
    // settled (entry 27), so u1's entry 28 comes, and nothing before it again.
    write_config(
        &path,
        &agent_yaml(control, dir.path(), &journald(&journal, &["u0", "u1"])),
    );
    let (status, body) = reload(addr).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("sources.journald"), "{body}");
    write_entries(&journal, 30..60);
    let mut want: Vec<String> = (0..30)
        .filter(|n| n % 3 == 0)
        .map(|n| format!("entry {n}"))
        .collect();
    want.extend(
        (28..60)
            .filter(|n| n % 3 != 2)
            .map(|n| format!("entry {n}")),
    );
    until("every entry in the sink", Duration::from_secs(20), || {
        let got = sink_messages(&sink);
        if got.len() >= want.len() {
            Ok(())
        } else {
            Err(format!("{} of {} in the sink", got.len(), want.len()))
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let summary = agent.stop().await;
    assert_eq!(summary.sessions, 1, "{summary:?}");
    collector.stop().await;
    let mut got = sink_messages(&sink);
    got.sort();
    want.sort();
    assert_eq!(got, want, "every entry exactly once across the hand-over");
}

/// `sources.logs` entries for `files` (read from their beginning, polled every 50 ms) and,
/// with `journal`, a journald source over it.
fn files_and_journal(files: &[&Path], journal: Option<&Path>) -> serde_yaml::Value {
    let mut m = match journal {
        Some(j) => journald(j, &["u0"]),
        None => serde_yaml::from_str("{host_metrics: {enabled: false}}")
            .unwrap_or_else(|e| panic!("{e}")),
    };
    let logs: Vec<serde_yaml::Value> = files
        .iter()
        .map(|f| {
            serde_yaml::from_str(&format!(
                "{{path: '{}', start_at: beginning, poll_interval_seconds: 0.05}}",
                f.display()
            ))
            .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    if let serde_yaml::Value::Mapping(map) = &mut m {
        map.insert("logs".into(), serde_yaml::Value::Sequence(logs));
    }
    m
}

fn append(path: &Path, lines: std::ops::Range<u32>, tag: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("{e}"));
    for n in lines {
        writeln!(f, "{tag} {n}").unwrap_or_else(|e| panic!("{e}"));
    }
}

/// A reload that adds a log file and the journald source, where journald cannot start (its
/// state file is not a checkpoint): refused whole (500, `config_last_reload_successful` 0),
/// the added file's tailer is not left running (nothing written to it arrives) while the
/// file in force goes on in the same session. Once the
/// state file is removed, the same file applies both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_whose_journald_cannot_start_leaves_the_log_files_as_they_were() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let journal = dir.path().join("journal");
    std::fs::create_dir_all(&journal).unwrap_or_else(|e| panic!("{e}"));
    let (a, b) = (dir.path().join("a.log"), dir.path().join("b.log"));
    append(&a, 0..5, "a");
    std::fs::write(&b, "").unwrap_or_else(|e| panic!("{e}"));
    let sink = dir.path().join("sink.jsonl");
    let collector = RunningCollector::start(collector_config(&sink)).await;
    let control = collector.control_addr();
    let path = dir.path().join("agent.yaml");
    let config = write_config(
        &path,
        &agent_yaml(control, dir.path(), &files_and_journal(&[&a], None)),
    );
    let (agent, addr) = start_agent(config, path.clone()).await;
    let count = |tag: &'static str| {
        let sink = sink.clone();
        move || {
            sink_messages(&sink)
                .iter()
                .filter(|m| m.starts_with(tag))
                .count()
        }
    };
    let (in_a, in_b) = (count("a "), count("b "));
    until("a's first lines", Duration::from_secs(20), || {
        (in_a() == 5).then_some(()).ok_or(format!("{}", in_a()))
    })
    .await;

    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(state.join("journald.json"), "not a checkpoint")
        .unwrap_or_else(|e| panic!("{e}"));
    write_config(
        &path,
        &agent_yaml(
            control,
            dir.path(),
            &files_and_journal(&[&a, &b], Some(&journal)),
        ),
    );
    let (status, body) = reload(addr).await;
    assert_eq!(status, 500, "{body}");
    assert!(body.contains("sources.journald"), "{body}");
    append(&a, 5..10, "a");
    append(&b, 0..5, "b");
    until("a's later lines", Duration::from_secs(20), || {
        (in_a() == 10).then_some(()).ok_or(format!("{}", in_a()))
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        in_b(),
        0,
        "the added file is not tailed after the failed reload"
    );
    let ok = scrape(addr)
        .unwrap_or_else(|e| panic!("{e}"))
        .count("uctel_agent_config_last_reload_successful", &[]);
    assert_eq!(ok, 0);

    // The state file removed: the same file applies both parts.
    std::fs::remove_file(state.join("journald.json")).unwrap_or_else(|e| panic!("{e}"));
    let (status, body) = reload(addr).await;
    assert_eq!(status, 200, "{body}");
    append(&b, 5..10, "b");
    until("b's lines", Duration::from_secs(20), || {
        (in_b() == 10).then_some(()).ok_or(format!("{}", in_b()))
    })
    .await;
    let summary = agent.stop().await;
    assert_eq!(summary.sessions, 1, "{summary:?}");
    collector.stop().await;
    let a_lines = sink_messages(&sink)
        .iter()
        .filter(|m| m.starts_with("a "))
        .count();
    assert_eq!(a_lines, 10, "a's lines exactly once");
}
