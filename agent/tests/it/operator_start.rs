//! The operator's first run of `uctel-agent`: the example configuration works as it is for
//! an ordinary user (everything it writes is under the working directory, and
//! `--check-config` says what it reads and writes), `--check-config` finds everything that
//! would stop the start (a bad `--log-level` together with the file's problems), and a
//! start-up failure that no restart can fix exits 2, which the systemd unit does not restart.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn agent() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_uctel-agent"));
    c.env_remove("RUST_LOG").env("NO_COLOR", "1");
    c
}

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/agent.yaml")
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// Runs the agent until it exits (bounded); `(exit code, stderr)`.
fn run_to_exit(cmd: &mut Command) -> (Option<i32>, String) {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let start = Instant::now();
    while child.try_wait().unwrap_or_else(|e| panic!("{e}")).is_none() {
        if start.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("the agent did not exit");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap_or_else(|e| panic!("{e}"));
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The README's `uctel-agent --config config/agent.yaml`, run from a fresh working directory:
/// it starts (no collector needed: it keeps retrying), keeps its checkpoints in
/// `./uctel-agent-state` there, and stops with 0 on SIGTERM. Before, the example named
/// `/var/lib/uctel-agent`: an ordinary user's agent failed to start after `--check-config`
/// had called it valid, and root's silently created it.
#[test]
fn the_example_configuration_runs_from_the_working_directory() {
    let cwd = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let out = agent()
        .current_dir(cwd.path())
        .arg("--config")
        .arg(example())
        .arg("--check-config")
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let shown = text(&out);
    assert_eq!(out.status.code(), Some(0), "{shown}");
    let state = cwd.path().join("uctel-agent-state");
    for want in [
        "reads host metrics from /proc and /sys".to_string(),
        "sources.logs[0]: tails /var/log/*.log (".to_string(),
        format!("writes log checkpoints to {}", state.display()),
        "serves its self-metrics on http://127.0.0.1:9471/metrics".to_string(),
    ] {
        assert!(shown.contains(&want), "missing {want:?} in:\n{shown}");
    }
    assert!(
        !state.exists(),
        "--check-config created {}",
        state.display()
    );

    let mut child = agent()
        .current_dir(cwd.path())
        .arg("--config")
        .arg(example())
        .args(["--log-level", "warn"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let start = Instant::now();
    while !state.is_dir() {
        if let Some(status) = child.try_wait().unwrap_or_else(|e| panic!("{e}")) {
            let out = child.wait_with_output().unwrap_or_else(|e| panic!("{e}"));
            panic!("the agent exited ({status}): {}", text(&out));
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no state directory in the working directory"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(status.success());
    let out = child.wait_with_output().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

/// `--check-config` reports the file's problems and a `--log-level` that does not parse in
/// one run (before, the filter was only parsed at start, after "configuration is valid").
#[test]
fn check_config_also_checks_the_log_level() {
    let out = agent()
        .arg("--config")
        .arg(example())
        .args(["--check-config", "--log-level", "inof"])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("uctel-agent: --log-level: unknown log level \"inof\""),
        "{err}"
    );

    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "agent_id: a\ncollector:\n  control: h:1\nauth:\n  token: t\ntransport:\n  soft:\n    faults: {}\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let out = agent()
        .arg("--config")
        .arg(&bad)
        .arg("--check-config")
        .env("RUST_LOG", "warn,=[[")
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 3, "{err}");
    assert!(
        lines[0].ends_with(
            "bad.yaml:8:5: transport.soft.faults: unknown key; did you mean transport.soft.fault?"
        ),
        "{err}"
    );
    assert!(
        lines[1].starts_with("uctel-agent: RUST_LOG: invalid log level"),
        "{err}"
    );
    assert!(
        lines[2].ends_with("bad.yaml: invalid configuration (1 problem)"),
        "{err}"
    );
}

/// A `/metrics` address that is not on this host cannot be bound however often systemd
/// restarts the agent: exit 2 (`RestartPreventExitStatus=2`), found by the configuration
/// check (so `--check-config` finds it too). One that another process holds may be free on
/// the next try: exit 1. Either is printed once.
#[test]
fn startup_failures_no_restart_fixes_exit_2() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let taken = taken
        .local_addr()
        .unwrap_or_else(|e| panic!("{e}"))
        .to_string();
    // 192.0.2.1 is TEST-NET-1 (RFC 5737): never a local address.
    for (metrics, code) in [("192.0.2.1:9471", 2), (taken.as_str(), 1)] {
        let cfg = dir.path().join("agent.yaml");
        std::fs::write(
            &cfg,
            format!(
                "agent_id: a\ncollector:\n  control: 127.0.0.1:1\nauth:\n  token: t\nlisten:\n  \
                 metrics: {metrics}\n"
            ),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let (got, stderr) = run_to_exit(agent().arg("--config").arg(&cfg));
        assert_eq!(got, Some(code), "{metrics}: {stderr}");
        let (host, _) = metrics.rsplit_once(':').unwrap_or_default();
        let errors: Vec<&str> = stderr.lines().filter(|l| l.contains(host)).collect();
        assert_eq!(errors.len(), 1, "printed once: {stderr}");
        let want = if code == 2 {
            format!("agent.yaml:7:12: listen.metrics: {host} is not an address of this host")
        } else {
            format!("uctel-agent: listen.metrics {metrics}: cannot listen for /metrics: ")
        };
        assert!(errors[0].contains(&want), "{stderr}");
    }
}

#[test]
fn print_default_config_is_loadable_yaml() {
    let out = agent()
        .arg("--print-default-config")
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    let value: serde_yaml::Value =
        serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert!(value.get("collector").is_some(), "{text}");
}
