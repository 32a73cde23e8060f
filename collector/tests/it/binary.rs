//! The `uctel-collector` binary: `--check-config` exit codes and output, and a start /
//! scrape / SIGTERM cycle.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_uctel-collector");

#[test]
fn check_config_accepts_the_example() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../config/collector.yaml");
    let out = Command::new(BIN)
        .args(["--config", example, "--check-config"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("configuration is valid"));
}

/// `--print-clickhouse-schema` prints `config/clickhouse/logs.sql` as shipped, and
/// `--check-config` refuses what the ClickHouse output cannot use, naming each key.
#[test]
fn clickhouse_schema_is_printed_and_its_output_checked() {
    let out = Command::new(BIN)
        .arg("--print-clickhouse-schema")
        .output()
        .unwrap();
    assert!(out.status.success());
    let shipped = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../config/clickhouse/logs.sql"
    ))
    .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), shipped);
    assert!(shipped.contains("ENGINE = MergeTree") && shipped.contains("ORDER BY (agent, ts)"));

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.yaml");
    std::fs::write(
        &config,
        "outputs:\n  clickhouse:\n    url: ftp://x\n    table: \"logs; DROP\"\n    \
         password_file: /nonexistent/pw\n    max_rows_per_insert: 0\n    \
         max_backoff_seconds: 0\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .arg("--config")
        .arg(&config)
        .arg("--check-config")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for key in [
        "outputs.clickhouse.url",
        "outputs.clickhouse.table",
        "outputs.clickhouse.password_file",
        "outputs.clickhouse.max_rows_per_insert",
        "outputs.clickhouse.max_backoff_seconds",
    ] {
        assert!(err.contains(key), "{key} not reported: {err}");
    }
}

/// The configuration file can be given as `-c` or in `UCTEL_COLLECTOR_CONFIG`, as for the
/// agent (`-c`, `UCTEL_AGENT_CONFIG`); `--config` wins over the variable.
#[test]
fn config_short_flag_and_environment_variable() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../config/collector.yaml");
    let out = Command::new(BIN)
        .args(["-c", example, "--check-config"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(BIN)
        .arg("--check-config")
        .env("UCTEL_COLLECTOR_CONFIG", example)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("collector.yaml: configuration is valid"));
    let out = Command::new(BIN)
        .args(["--config", "/nonexistent/uctel.yaml", "--check-config"])
        .env("UCTEL_COLLECTOR_CONFIG", example)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let help = Command::new(BIN).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("-c, --config") && help.contains("UCTEL_COLLECTOR_CONFIG"),
        "{help}"
    );
}

#[test]
fn check_config_reports_every_problem_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(
        &path,
        "listen:\n  control: nowhere\n  bogus: 1\nring:\n  slots: lots\nauth:\n  shared:\n    token: t\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["--config", path.to_str().unwrap(), "--check-config"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    let shown = path.display().to_string();
    assert!(
        err.contains(&format!("{shown}:2:12: listen.control:")),
        "{err}"
    );
    assert!(
        err.contains(&format!("{shown}:3:3: listen.bogus: unknown key")),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "{shown}:5:10: ring.slots: expected a whole number"
        )),
        "{err}"
    );
    assert!(err.contains("invalid configuration (3 problems)"), "{err}");
}

#[test]
fn runs_serves_metrics_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(
        &path,
        "listen:\n  control: 127.0.0.1:0\n  metrics: 127.0.0.1:0\ntransport:\n  soft:\n    bind: 127.0.0.1:0\nauth:\n  shared:\n    token: t\n",
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .args(["--config", path.to_str().unwrap(), "--log-level", "info"])
        .env("NO_COLOR", "1")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let start = Instant::now();
    let metrics = loop {
        let line = lines.next().expect("collector exited early").unwrap();
        if let Some(rest) = line.split("metrics=").nth(1) {
            let addr = rest
                .split_whitespace()
                .next()
                .unwrap()
                .trim_end_matches(',');
            // Strip ANSI colour codes if any.
            let addr: String = addr
                .chars()
                .filter(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
                .collect();
            break addr;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "no startup line");
    };
    let mut s = std::net::TcpStream::connect(&metrics).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    assert!(
        body.contains("uctel_collector_agents_connected 0"),
        "{body}"
    );
    assert!(
        body.contains("uctel_collector_build_info{version=")
            && body.contains("process_resident_memory_bytes ")
            && body.contains("process_start_time_seconds "),
        "{body}"
    );
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "exit status {status}");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs the collector on `config` (text) until it exits; returns (exit code, stderr).
fn run_to_exit(dir: &std::path::Path, config: &str) -> (Option<i32>, String) {
    let path = dir.join("c.yaml");
    std::fs::write(&path, config).unwrap();
    let mut child = Command::new(BIN)
        .args(["--config", path.to_str().unwrap()])
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if start.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("the collector did not exit");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn config_with(control: &str, metrics: &str, udp: &str) -> String {
    format!(
        "listen:\n  control: {control}\n  metrics: {metrics}\ntransport:\n  soft:\n    bind: {udp}\nauth:\n  shared:\n    token: t\n"
    )
}

/// A startup failure is printed once, names the configuration key and value, and gives the
/// OS's reason once (no repeated error chain, no second copy through the log).
#[test]
fn startup_errors_name_the_key_and_value_once() {
    let dir = tempfile::tempdir().unwrap();
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let taken_tcp = tcp.local_addr().unwrap().to_string();
    let taken_udp = udp.local_addr().unwrap().to_string();
    let free = "127.0.0.1:0";
    for (config, key, value) in [
        (
            config_with(&taken_tcp, free, free),
            "listen.control",
            &taken_tcp,
        ),
        (
            config_with(free, &taken_tcp, free),
            "listen.metrics",
            &taken_tcp,
        ),
        (
            config_with(free, free, &taken_udp),
            "transport.soft.bind",
            &taken_udp,
        ),
    ] {
        let (code, stderr) = run_to_exit(dir.path(), &config);
        assert_eq!(code, Some(1), "{key}: {stderr}");
        let errors: Vec<&str> = stderr
            .lines()
            .filter(|l| l.contains(value.as_str()))
            .collect();
        assert_eq!(errors.len(), 1, "{key}: printed once: {stderr}");
        let line = errors[0];
        assert!(
            line.starts_with(&format!("uctel-collector: {key} {value}: ")),
            "{line}"
        );
        assert_eq!(
            line.matches("Address already in use").count(),
            1,
            "the cause once: {line}"
        );
    }
}

/// `--check-config` refuses a log file path that cannot be created (here under a regular
/// file) instead of calling it valid and failing at startup.
#[test]
fn check_config_refuses_a_log_path_under_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("hostname");
    std::fs::write(&blocker, "h\n").unwrap();
    let path = dir.path().join("c.yaml");
    let log = blocker.join("x.jsonl");
    std::fs::write(
        &path,
        format!(
            "auth:\n  shared:\n    token: t\nlogs:\n  sink: file\n  file:\n    path: {}\n",
            log.display()
        ),
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["--config", path.to_str().unwrap(), "--check-config"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "logs.file.path: cannot create {:?}: {} is not a directory",
            log,
            blocker.display()
        )),
        "{err}"
    );
}

/// `--check-config` reports every bad `outputs.remote_write` key at once, with its index.
#[test]
fn check_config_reports_each_bad_remote_write_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.yaml");
    std::fs::write(
        &config,
        "auth:\n  shared:\n    token: t\noutputs:\n  remote_write:\n    \
         - url: ftp://x\n      shards: 0\n      headers:\n        User-Agent: me\n      \
         bearer_token_file: /nonexistent/token\n    \
         - url: http://127.0.0.1:9090/api/v1/write\n      max_samples_per_send: 5000\n      \
         queue_capacity_samples: 100\n      tenant: \"\"\n      \
         basic_auth:\n        username: u\n        password_file: /nonexistent/pw\n    \
         - {}\n    - url: http://127.0.0.1:9090/api/v1/write\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .arg("--config")
        .arg(&config)
        .arg("--check-config")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for key in [
        "outputs.remote_write[0].url",
        "outputs.remote_write[0].shards",
        "outputs.remote_write[0].headers.User-Agent",
        "outputs.remote_write[0].bearer_token_file",
        "outputs.remote_write[1].queue_capacity_samples",
        "outputs.remote_write[1].tenant",
        "outputs.remote_write[1].basic_auth.password_file",
        "outputs.remote_write[2].url",
        "http://127.0.0.1:9090/api/v1/write is listed twice",
    ] {
        assert!(err.contains(key), "{key} not reported: {err}");
    }
}

/// `uctel-collector --check-config | head` and `--print-default-config | head`: a reader that
/// closed the pipe before the output is written is no panic (exit 101, "failed printing to
/// stdout"): the exit status is that of the check. The pipe's read end is closed before the
/// collector starts, so every write fails with EPIPE.
#[test]
fn output_into_a_closed_pipe_is_no_panic() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../config/collector.yaml");
    for args in [
        &["--config", example, "--check-config"][..],
        &["--print-default-config"][..],
        &["--print-clickhouse-schema"][..],
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = Command::new(BIN)
            .args(args)
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}
