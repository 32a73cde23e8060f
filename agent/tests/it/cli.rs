//! The `uctel-agent` binary: `--check-config` exit codes and messages, `--dry-run --once`
//! output, and SIGTERM ending a session with a `Goodbye` (as systemd stops the service).

use crate::support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn agent() -> Command {
    Command::new(env!("CARGO_BIN_EXE_uctel-agent"))
}

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap_or_else(|e| panic!("{e}"));
    p
}

#[test]
fn check_config_exits_0_for_the_example_and_2_with_every_problem() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/agent.yaml");
    let out = agent()
        .arg("--config")
        .arg(&example)
        .arg("--check-config")
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let bad = write(
        dir.path(),
        "bad.yaml",
        "agent_id: 'not valid'\ncollector:\n  control: nohostport\nauth:\n  token: t\npacing:\n  frames_per_second: 0\nmax_frame_bytes: 10\n",
    );
    let out = agent()
        .arg("--config")
        .arg(&bad)
        .arg("--check-config")
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for want in [
        "bad.yaml:1:11: agent_id:",
        "bad.yaml:3:12: collector.control:",
        "bad.yaml:7:22: pacing.frames_per_second:",
        "bad.yaml:8:18: max_frame_bytes:",
    ] {
        assert!(err.contains(want), "missing {want:?} in:\n{err}");
    }

    let out = agent()
        .arg("--config")
        .arg(dir.path().join("missing.yaml"))
        .arg("--check-config")
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn check_config_names_the_key_of_an_invalid_ethtool_regex() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let head = "agent_id: a\ncollector:\n  control: 127.0.0.1:7400\nauth:\n  token: t\n";
    let check = |name: &str, ethtool: &str| {
        let cfg = write(
            dir.path(),
            name,
            &format!("{head}sources:\n  host_metrics:\n    ethtool:\n{ethtool}"),
        );
        let out = agent()
            .arg("--config")
            .arg(&cfg)
            .arg("--check-config")
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = check(
        "bad.yaml",
        "      device_include: '('\n      metrics_include: '*'\n",
    );
    assert_eq!(code, Some(2), "{err}");
    for want in [
        "bad.yaml:9:23: sources.host_metrics.ethtool.device_include: invalid regex",
        "bad.yaml:10:24: sources.host_metrics.ethtool.metrics_include: invalid regex",
    ] {
        assert!(err.contains(want), "missing {want:?} in:\n{err}");
    }
    let (code, err) = check("good.yaml", "      device_exclude: '^lo$'\n");
    assert_eq!(code, Some(0), "{err}");
}

/// Two scrape targets on one `host:port` without `job` would ship one `up{job="scrape"}`
/// series between them: `--check-config` names the later one (and the agent refuses to
/// start on the same check); another port, or an `instance` of its own, is fine.
#[test]
fn check_config_refuses_two_scrape_targets_with_the_same_job_and_instance() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let head = "agent_id: a\ncollector:\n  control: 127.0.0.1:7400\nauth:\n  token: t\n";
    let check = |name: &str, targets: &str| {
        let cfg = write(
            dir.path(),
            name,
            &format!("{head}sources:\n  scrape:\n{targets}"),
        );
        let out = agent()
            .arg("--config")
            .arg(&cfg)
            .arg("--check-config")
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = check(
        "same.yaml",
        "    - url: http://127.0.0.1:9100/metrics\n    - url: http://127.0.0.1:9100/federate\n",
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("same.yaml:9:7: sources.scrape[1]: job \"scrape\" and instance \"127.0.0.1:9100\" are those of sources.scrape[0] too"),
        "{err}"
    );
    let (code, err) = check(
        "ports.yaml",
        "    - url: http://127.0.0.1:9100/metrics\n    - url: http://127.0.0.1:9400/metrics\n",
    );
    assert_eq!(code, Some(0), "{err}");
    let (code, err) = check(
        "named.yaml",
        "    - url: http://127.0.0.1:9100/metrics\n    - url: http://127.0.0.1:9100/federate\n      instance: federate\n",
    );
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn agent_id_from_the_environment_is_checked_like_the_configuration_key() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cfg = write(
        dir.path(),
        "agent.yaml",
        "agent_id: placeholder\ncollector:\n  control: 127.0.0.1:1\nauth:\n  token: t\nsources:\n  state_directory: null\n",
    );
    let out = agent()
        .arg("--config")
        .arg(&cfg)
        .env("UCTEL_AGENT_ID", "bad id")
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("UCTEL_AGENT_ID") && stderr.contains("\"bad id\""),
        "{stderr}"
    );
}

#[test]
fn dry_run_once_prints_decodable_frames_of_host_metrics_and_logs() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    write(dir.path(), "app.log", "hello\nworld\n");
    let cfg = write(
        dir.path(),
        "agent.yaml",
        &format!(
            "agent_id: dry\ncollector:\n  control: 127.0.0.1:1\nauth:\n  token: t\nsources:\n  logs:\n    - path: {}/*.log\n      start_at: beginning\n  state_directory: {}/state\n",
            dir.path().display(),
            dir.path().display()
        ),
    );
    let out = agent()
        .arg("--config")
        .arg(&cfg)
        .args(["--dry-run", "--once", "--log-level", "warn"])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let frames: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(frames.len() >= 2);
    // Connection sequences 0..n in order, one epoch.
    for (i, f) in frames.iter().enumerate() {
        assert_eq!(f["conn_seq"].as_u64(), Some(i as u64), "{f}");
        assert!(f.get("decode_error").is_none(), "{f}");
        assert_eq!(f["epoch"], frames[0]["epoch"]);
        assert!(f["frame_bytes"].as_u64().unwrap_or(u64::MAX) <= 4096);
    }
    let names: Vec<&str> = frames
        .iter()
        .filter(|f| f["stream"] == "metrics")
        .flat_map(|f| f["records"].as_array().into_iter().flatten())
        .filter_map(|r| r["name"].as_str())
        .collect();
    for want in [
        "node_cpu_seconds_total",
        "node_load1",
        "uctel_agent_frames_sent_total",
    ] {
        assert!(names.contains(&want), "{want} missing");
    }
    let lines: Vec<&str> = frames
        .iter()
        .filter(|f| f["stream"] == "logs")
        .flat_map(|f| f["records"].as_array().into_iter().flatten())
        .filter_map(|r| r["message"].as_str())
        .collect();
    assert_eq!(lines, vec!["hello", "world"]);
    // A dry run touches no checkpoint.
    assert!(!dir.path().join("state").exists());
}

/// Metrics frames of a dry run of `seconds` with host metrics every 0.5 s and
/// `streams.metrics.series_dictionary: dictionary`.
fn dry_run_metrics_frames(dictionary: bool, seconds: u64) -> Vec<serde_json::Value> {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cfg = write(
        dir.path(),
        "agent.yaml",
        &format!(
            "agent_id: dry\ncollector:\n  control: 127.0.0.1:1\nauth:\n  token: t\nsources:\n  host_metrics:\n    interval_seconds: 0.5\n  state_directory: {}/state\nstreams:\n  metrics:\n    series_dictionary: {dictionary}\n",
            dir.path().display()
        ),
    );
    let child = agent()
        .arg("--config")
        .arg(&cfg)
        .args(["--dry-run", "--log-level", "warn"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    std::thread::sleep(Duration::from_secs(seconds));
    let pid = child.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status();
    assert!(killed.is_ok_and(|s| s.success()));
    let out = child.wait_with_output().unwrap_or_else(|e| panic!("{e}"));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|e| panic!("{e}: {l}"))
        })
        .filter(|f| {
            f["stream"] == "metrics" && f["records"].as_array().is_some_and(|r| !r.is_empty())
        })
        .collect()
}

#[test]
fn dry_run_prints_dictionary_frames_with_and_without_definitions() {
    let frames = dry_run_metrics_frames(true, 3);
    assert!(
        frames.iter().all(|f| f["kind"] == "metrics_dict"),
        "{frames:?}"
    );
    assert!(frames.iter().all(|f| f.get("decode_error").is_none()));
    let defining = frames
        .iter()
        .filter(|f| f["definitions"].as_u64() > Some(0))
        .count();
    let values_only: Vec<_> = frames.iter().filter(|f| f["definitions"] == 0).collect();
    assert!(
        defining > 0 && !values_only.is_empty(),
        "{defining} defining, {} values only",
        values_only.len()
    );
    let names: Vec<&str> = values_only
        .iter()
        .flat_map(|f| f["records"].as_array().into_iter().flatten())
        .filter_map(|r| r["name"].as_str())
        .collect();
    assert!(names.contains(&"node_load1"), "{names:?}");
    let plain = dry_run_metrics_frames(false, 2);
    assert!(
        !plain.is_empty()
            && plain
                .iter()
                .all(|f| f["kind"] == "metrics" && f.get("definitions").is_none())
    );
    // Values-only frames are a fraction of the size of the plain ones.
    let bytes = |fs: &[&serde_json::Value]| {
        let b: u64 = fs.iter().map(|f| f["frame_bytes"].as_u64().unwrap()).sum();
        let r: usize = fs
            .iter()
            .map(|f| f["records"].as_array().unwrap().len())
            .sum();
        b as f64 / r as f64
    };
    let dict = bytes(&values_only);
    let old = bytes(&plain.iter().collect::<Vec<_>>());
    assert!(dict * 4.0 < old, "{dict} against {old} bytes per sample");
}

#[test]
fn sigterm_ends_the_session_with_a_goodbye_and_exit_0() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let mut fake = rt.block_on(support::start(support::FakeConfig::default()));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cfg = write(
        dir.path(),
        "agent.yaml",
        &format!(
            "agent_id: sig\ncollector:\n  control: {}\nauth:\n  token: test-token\nsources:\n  host_metrics:\n    interval_seconds: 0.2\n  logs:\n    - path: {dir}/*.log\n      start_at: beginning\n      poll_interval_seconds: 0.02\n  state_directory: {dir}/state\nstreams:\n  metrics:\n    flush_milliseconds: 10\n  logs:\n    flush_milliseconds: 10\n",
            fake.addr,
            dir = dir.path().display()
        ),
    );
    let lines: Vec<String> = (0..20).map(|i| format!("cli line {i}")).collect();
    write(dir.path(), "app.log", &(lines.join("\n") + "\n"));
    let mut child = agent()
        .arg("--config")
        .arg(&cfg)
        .args(["--log-level", "info"])
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    // Wait (bounded) until the agent reports the connection, as an operator would read it.
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    if let Some(stderr) = child.stderr.take() {
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                // Keep draining after the test stopped listening, so the agent's
                // writes to stderr never fail.
                let _ = tx.send(line);
            }
        });
    }
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let left = until.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.contains("connected to the collector") => break,
            Ok(_) => {}
            Err(_) => {
                let _ = child.kill();
                panic!("the agent never reported a connection");
            }
        }
    }
    // A deliberate pause, not a wait for a state: a few collections (0.2 s apart) go out
    // before SIGTERM; this agent serves no /metrics to watch, and the checks below hold for
    // any number of frames from two on.
    std::thread::sleep(Duration::from_millis(300));
    let pid = child.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status();
    assert!(killed.is_ok_and(|s| s.success()));
    let until = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Ok(Some(s)) = child.try_wait() {
            break s;
        }
        if Instant::now() > until {
            let _ = child.kill();
            panic!("agent did not exit after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    let s = rt
        .block_on(async {
            tokio::time::timeout(Duration::from_secs(10), fake.sessions.recv()).await
        })
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("no session"));
    assert!(s.violations.is_empty(), "{:?}", s.violations);
    let g = s.goodbye.clone().unwrap_or_else(|| panic!("no goodbye"));
    let n = s.frames.len() as u64;
    assert!(n >= 2, "frames {n}");
    assert_eq!(g.final_conn_seq, Some(n - 1));

    // The `goodbye sent` line carries the epoch's final figures, per connection and per
    // stream, equal to what the collector received (loopback, no faults).
    let mut logged = Vec::new();
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(5)) {
        logged.push(strip_ansi(&line));
    }
    let bye = logged
        .iter()
        .rev()
        .find(|l| l.contains("goodbye sent"))
        .unwrap_or_else(|| panic!("no `goodbye sent` line in {logged:#?}"));
    let field = |k: &str| -> u64 {
        bye.split_whitespace()
            .find_map(|t| t.strip_prefix(&format!("{k}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {k}= in {bye}"))
    };
    assert_eq!(field("frames"), n, "{bye}");
    for (name, id) in [("metrics", 1u32), ("logs", 2u32), ("fast_counters", 3u32)] {
        let frames = s
            .frames
            .iter()
            .filter(|(_, f)| f.header.stream_id == id)
            .count() as u64;
        assert_eq!(field(&format!("{name}_frames")), frames, "{bye}");
        assert_eq!(field(&format!("{name}_records")), s.records(id), "{bye}");
    }
    assert_eq!(field("logs_records"), lines.len() as u64, "{bye}");
    assert_eq!(
        field("metrics_frames") + field("logs_frames") + field("fast_counters_frames"),
        n,
        "{bye}"
    );
    // No fast_counters source: its stream carries nothing, not even heartbeats or the
    // epoch's last (empty) frame, so the collector shows no frames of it.
    assert_eq!(field("fast_counters_records"), 0, "{bye}");
    assert_eq!(field("fast_counters_frames"), 0, "{bye}");
    assert!(!bye.contains("fault_dropped"), "no fault injection: {bye}");
}

/// `s` without ANSI escape sequences (`ESC [ ... letter`).
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// `uctel-agent --check-config | head` and `--print-default-config | head`: a reader that
/// closed the pipe before the output is written is no panic (exit 101, "failed printing to
/// stdout"): the exit status is that of the check. The pipe's read end is closed before the
/// agent starts, so every write fails with EPIPE.
#[test]
fn output_into_a_closed_pipe_is_no_panic() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/agent.yaml");
    let example = example.to_str().unwrap_or_else(|| panic!("path"));
    for args in [
        &["--config", example, "--check-config"][..],
        &["--print-default-config"][..],
    ] {
        let (reader, writer) = std::io::pipe().unwrap_or_else(|e| panic!("{e}"));
        drop(reader);
        let out = agent()
            .args(args)
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

/// A minimal valid configuration, without `agent_id`, whose token is inline.
const NO_ID: &str = "collector:\n  control: 127.0.0.1:7400\nauth:\n  token: t\n";

fn check(config: &Path, env_id: Option<&str>, args: &[&str]) -> (Option<i32>, String) {
    let mut c = agent();
    c.arg("--config")
        .arg(config)
        .arg("--check-config")
        .args(args)
        .env_remove("UCTEL_AGENT_ID");
    if let Some(id) = env_id {
        c.env("UCTEL_AGENT_ID", id);
    }
    let out = c.output().unwrap_or_else(|e| panic!("{e}"));
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// `agent_id` may come from `--agent-id` or `UCTEL_AGENT_ID` alone (before, the file had to
/// have one even then: "agent_id: required, but missing"); the packaged placeholder
/// `change-me` is refused (before, it passed), unless the flag or the environment gives the
/// id, which wins over the file.
#[test]
fn check_config_takes_the_id_from_the_flag_or_environment_and_refuses_the_placeholder() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let no_id = write(dir.path(), "no-id.yaml", NO_ID);
    let (code, out) = check(&no_id, Some("host-a"), &[]);
    assert_eq!(code, Some(0), "{out}");
    let (code, out) = check(&no_id, None, &["--agent-id", "host-a"]);
    assert_eq!(code, Some(0), "{out}");
    let (code, out) = check(&no_id, None, &[]);
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.contains("agent_id: required: set agent_id in this file, or pass --agent-id"),
        "{out}"
    );

    let placeholder = write(
        dir.path(),
        "placeholder.yaml",
        &format!("agent_id: change-me\n{NO_ID}"),
    );
    let (code, out) = check(&placeholder, None, &[]);
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.contains("placeholder.yaml:1:11: agent_id: change-me is the packaged placeholder")
            && out.contains("UCTEL_AGENT_ID"),
        "{out}"
    );
    let (code, out) = check(&placeholder, Some("host-a"), &[]);
    assert_eq!(code, Some(0), "{out}");
}

/// A listen address that no local interface has (192.0.2.1, TEST-NET-1) is refused with
/// its key and line; before, it passed and the agent failed at start.
#[test]
fn check_config_refuses_a_listen_address_of_no_local_interface() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let remote = write(
        dir.path(),
        "remote.yaml",
        &format!("agent_id: a\n{NO_ID}listen:\n  metrics: 192.0.2.1:9471\n"),
    );
    let (code, out) = check(&remote, None, &[]);
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.contains("remote.yaml:7:12: listen.metrics: 192.0.2.1 is not an address of this host"),
        "{out}"
    );
    let local = write(
        dir.path(),
        "local.yaml",
        &format!("agent_id: a\n{NO_ID}listen:\n  metrics: 127.0.0.1:9471\n"),
    );
    let (code, out) = check(&local, None, &[]);
    assert_eq!(code, Some(0), "{out}");
}

/// As root, `--check-config` also checks the files for the user the service runs as
/// (`--service-user`, default the unit's `uctel`): a token file only root can read is
/// refused, naming the user, the path, owner, group and mode; readable by that user, it
/// passes. Before, root's check passed and the service failed under its user. Runs as root
/// only (skipped with a note otherwise), as the user `nobody`.
#[test]
fn check_config_as_root_checks_the_files_for_the_service_user() {
    use std::os::unix::fs::PermissionsExt;
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let root = std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m));
    if root.ok() != Some(0) || !passwd.lines().any(|l| l.starts_with("nobody:")) {
        eprintln!("skipped: needs root and a user nobody");
        return;
    }
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mode = |p: &Path, m: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m))
            .unwrap_or_else(|e| panic!("{e}"));
    };
    mode(dir.path(), 0o755);
    let token = write(dir.path(), "agent.token", "secret\n");
    mode(&token, 0o600);
    let config = write(
        dir.path(),
        "agent.yaml",
        &format!(
            "agent_id: a\ncollector:\n  control: 127.0.0.1:7400\nauth:\n  token_file: {}\n",
            token.display()
        ),
    );
    let (code, out) = check(&config, None, &["--service-user", "nobody"]);
    assert_eq!(code, Some(2), "{out}");
    let want = format!(
        "agent.yaml: auth.token_file: the service user nobody (uid 65534, groups nogroup) cannot \
         read {}: owner root, group root, mode 0600",
        token.display()
    );
    assert!(out.contains(&want), "missing {want:?} in:\n{out}");
    assert!(
        out.contains("invalid for the service user nobody (1 problem"),
        "{out}"
    );

    mode(&token, 0o644);
    let (code, out) = check(&config, None, &["--service-user", "nobody"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains(
            "for the service user nobody: it can read the configuration and the token file"
        ),
        "{out}"
    );
    // root itself: nothing more to check.
    mode(&token, 0o600);
    let (code, out) = check(&config, None, &["--service-user", "root"]);
    assert_eq!(code, Some(0), "{out}");
}
