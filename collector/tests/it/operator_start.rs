//! The operator's view of `uctel-collector` start-up: `--check-config` finds everything that
//! would stop the start, all at once (a transport not built in, a `--log-level` that does
//! not parse, semantic problems together with structural ones), start-up failures that no
//! restart can fix exit 2 (the systemd unit's `RestartPreventExitStatus=2`), and
//! `--print-default-config` prints every key.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_uctel-collector");

fn collector() -> Command {
    let mut c = Command::new(BIN);
    c.env_remove("RUST_LOG").env("NO_COLOR", "1");
    c
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

fn check(config: &str, extra: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(&path, config).unwrap();
    collector()
        .arg("--config")
        .arg(&path)
        .arg("--check-config")
        .args(extra)
        .output()
        .unwrap()
}

/// Four mistakes, four problems, one run: two serde finds (an old key, a wrong type), two the
/// semantic checks find. Before, the semantic two appeared only once the first two were fixed.
#[test]
fn check_config_reports_every_problem_in_one_run() {
    let out = check(
        "listen:\n  control: 127.0.0.1:7400\ntransport:\n  soft:\n    udp:\n      bind: 127.0.0.1:4791\nring:\n  slots: lots\n  credit_margin_slots: 5000\nstaleness_seconds: -1\nauth:\n  shared:\n    token: t\n",
        &[],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    for want in [
        "c.yaml:6:7: transport.soft.udp.bind: unknown key; did you mean transport.soft.bind?",
        "c.yaml:8:10: ring.slots: expected a whole number from 0 to 4294967295, found the text \"lots\"",
        "c.yaml:9:24: ring.credit_margin_slots: must be below ring.slots (1024)",
        "c.yaml:10:20: staleness_seconds: must be a positive number of seconds, got -1",
        "c.yaml: invalid configuration (4 problems)",
    ] {
        assert!(err.contains(want), "missing {want:?} in:\n{err}");
    }
}

/// `transport.kind: verbs` in a binary built without it is refused by `--check-config`
/// (before: "valid", then every start failed).
#[test]
fn check_config_refuses_a_transport_that_is_not_built_in() {
    let out = check(
        "transport:\n  kind: verbs\nauth:\n  shared:\n    token: t\n",
        &[],
    );
    if cfg!(feature = "verbs") {
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        return;
    }
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains(
            "c.yaml:2:9: transport.kind: this uctel-collector was built without the verbs transport"
        ),
        "{}",
        text(&out)
    );
}

#[test]
fn check_config_checks_the_log_level_with_the_file() {
    let out = check(
        "auth:\n  shared:\n    token: t\nbogus: 1\n",
        &["--log-level", "warn,uctel_collector=loud"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 3, "{err}");
    assert!(lines[0].contains("c.yaml:4:1: bogus: unknown key"), "{err}");
    assert!(
        lines[1].starts_with("uctel-collector: --log-level: invalid log level"),
        "{err}"
    );
    assert!(
        lines[2].ends_with("c.yaml: invalid configuration (1 problem)"),
        "{err}"
    );
}

/// Runs the collector on `config` until it exits (bounded): (exit code, stderr).
fn run_to_exit(config: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(&path, config).unwrap();
    let mut child = collector()
        .arg("--config")
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
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

/// An address that is not on this host stays so across restarts: exit 2, so systemd stops
/// instead of restarting every 2 s for ever. (An address in use exits 1: see binary.rs.)
#[test]
fn an_address_that_is_not_local_exits_2() {
    // 192.0.2.1 is TEST-NET-1 (RFC 5737): never a local address.
    for (key, config) in [
        (
            "listen.control",
            "listen:\n  control: 192.0.2.1:7400\n  metrics: 127.0.0.1:0\ntransport:\n  soft:\n    bind: 127.0.0.1:0\nauth:\n  shared:\n    token: t\n",
        ),
        (
            "transport.soft.bind",
            "listen:\n  control: 127.0.0.1:0\n  metrics: 127.0.0.1:0\ntransport:\n  soft:\n    bind: 192.0.2.1:4791\nauth:\n  shared:\n    token: t\n",
        ),
    ] {
        let (code, stderr) = run_to_exit(config);
        assert_eq!(code, Some(2), "{key}: {stderr}");
        let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("192.0.2.1")).collect();
        assert_eq!(errors.len(), 1, "{key}: printed once: {stderr}");
        assert!(
            errors[0].starts_with(&format!("uctel-collector: {key} 192.0.2.1:")),
            "{stderr}"
        );
    }
}

#[test]
fn print_default_config_prints_the_reference_defaults() {
    let out = collector().arg("--print-default-config").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        uctel_collector::config::reference().default_yaml()
    );
}
