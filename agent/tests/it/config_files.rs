//! Every agent file under `config/` loads and validates (DESIGN.md §9), the example agent
//! configuration matches the example collector configuration on loopback, and the systemd
//! units carry the options the daemons rely on.

use std::path::{Path, PathBuf};

use uctel_agent::config::AgentConfig;

fn config_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../config")
}

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            files_under(&p, out);
        } else {
            out.push(p);
        }
    }
}

/// YAML files under `config/` that configure an agent: `agent.yaml`, `agent-*.yaml`, and any
/// YAML in a directory named like an agent example (`…/agent.yaml` in example trees).
fn agent_yaml_files() -> Vec<PathBuf> {
    let mut all = Vec::new();
    files_under(&config_dir(), &mut all);
    let mut agents: Vec<PathBuf> = all
        .into_iter()
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            (name.ends_with(".yaml") || name.ends_with(".yml")) && name.starts_with("agent")
        })
        .collect();
    agents.sort();
    agents
}

#[test]
fn every_agent_config_file_loads() {
    let files = agent_yaml_files();
    assert!(
        files.iter().any(|p| p.ends_with("config/agent.yaml")),
        "config/agent.yaml missing: {files:?}"
    );
    for f in &files {
        if let Err(e) = AgentConfig::load(f) {
            panic!("{} does not load:\n{e}", f.display());
        }
    }
}

fn yaml(path: &Path) -> serde_yaml::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn get<'a>(v: &'a serde_yaml::Value, path: &[&str]) -> Option<&'a serde_yaml::Value> {
    path.iter().try_fold(v, |v, k| v.get(*k))
}

#[test]
fn example_agent_matches_example_collector_on_loopback() {
    let agent = AgentConfig::load(&config_dir().join("agent.yaml"))
        .unwrap_or_else(|e| panic!("config/agent.yaml: {e}"));
    let collector = yaml(&config_dir().join("collector.yaml"));
    let control = get(&collector, &["listen", "control"])
        .and_then(serde_yaml::Value::as_str)
        .unwrap_or_else(|| panic!("collector.yaml has no listen.control"));
    assert_eq!(
        agent.collector.control,
        control.into(),
        "agent collector.control vs collector listen.control"
    );
    let shared = get(&collector, &["auth", "shared", "token"]).and_then(serde_yaml::Value::as_str);
    let agent_token = agent.auth.read_token().ok();
    assert_eq!(
        agent_token.as_deref(),
        shared.map(str::as_bytes),
        "agent auth.token must be the collector's auth.shared.token for the demo to connect"
    );
    let transport = get(&collector, &["transport", "kind"]).and_then(serde_yaml::Value::as_str);
    assert_eq!(transport, Some("soft"));
    if let Some(max) = get(&collector, &["max_frame_bytes"]).and_then(serde_yaml::Value::as_u64) {
        assert!(
            agent.max_frame_bytes as u64 <= max,
            "agent frames larger than the collector accepts"
        );
    }
    // Both daemons on one host: the agent's /metrics must not collide with the collector's.
    let collector_metrics =
        get(&collector, &["listen", "metrics"]).and_then(serde_yaml::Value::as_str);
    assert_ne!(
        agent.listen.metrics.map(|a| a.to_string()).as_deref(),
        collector_metrics
    );
}

fn unit(name: &str) -> String {
    let p = config_dir().join("systemd").join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn has_line(text: &str, line: &str) -> bool {
    text.lines().any(|l| l.trim() == line)
}

#[test]
fn systemd_units_run_the_daemons_hardened() {
    for (name, bin) in [
        ("uctel-agent.service", "uctel-agent"),
        ("uctel-collector.service", "uctel-collector"),
    ] {
        let u = unit(name);
        for section in ["[Unit]", "[Service]", "[Install]"] {
            assert!(has_line(&u, section), "{name}: no {section}");
        }
        let exec = u
            .lines()
            .find(|l| l.starts_with("ExecStart="))
            .unwrap_or_else(|| panic!("{name}: no ExecStart"));
        assert!(
            exec.contains(bin) && exec.contains("--config"),
            "{name}: {exec}"
        );
        assert!(
            u.lines()
                .any(|l| l.starts_with("ExecStartPre=") && l.contains("--check-config")),
            "{name}: configuration not checked before start"
        );
        for must in [
            "NoNewPrivileges=yes",
            "ProtectSystem=strict",
            "PrivateTmp=yes",
            "DynamicUser=yes",
            "CapabilityBoundingSet=",
            "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX AF_NETLINK",
            "SystemCallArchitectures=native",
            "RestartPreventExitStatus=2",
            "KillSignal=SIGTERM",
            // `systemctl reload`: SIGHUP reloads the configuration.
            "ExecReload=/bin/kill -HUP $MAINPID",
        ] {
            assert!(has_line(&u, must), "{name}: missing {must}");
        }
    }
    // The agent keeps log checkpoints in its state directory: by default the unit's.
    let agent_unit = unit("uctel-agent.service");
    assert!(has_line(&agent_unit, "StateDirectory=uctel-agent"));
    let agent = AgentConfig::from_yaml(
        "default.yaml",
        "agent_id: a\ncollector:\n  control: h:1\nauth:\n  token: t\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        agent.sources.state_directory.as_deref(),
        Some(Path::new("/var/lib/uctel-agent"))
    );
}

#[test]
fn systemd_units_pass_systemd_analyze_when_available() {
    let Ok(out) = std::process::Command::new("systemd-analyze")
        .arg("verify")
        .arg(config_dir().join("systemd/uctel-agent.service"))
        .arg(config_dir().join("systemd/uctel-collector.service"))
        .output()
    else {
        eprintln!("systemd-analyze not installed; syntax check skipped");
        return;
    };
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        // The binaries are not installed on a build machine.
        assert!(
            line.contains("is not executable") || line.contains("No such file"),
            "systemd-analyze: {line}"
        );
    }
}

/// `sources.logs[].parse`: a bad regex or zone is refused naming its key, as is an unknown key.
#[test]
fn check_config_names_the_bad_parse_key() {
    let yaml = |parse: &str| {
        format!(
            "agent_id: a1\ncollector:\n  control: 127.0.0.1:7470\nauth:\n  token: secret\n\
             sources:\n  state_directory: null\n  logs:\n    - path: /var/log/a.log\n      \
             parse: {parse}\n"
        )
    };
    let load = |parse: &str| {
        uctel_agent::config::AgentConfig::from_yaml("agent.yaml", &yaml(parse))
            .err()
            .map(|e| e.to_string())
    };
    let ok = load(
        "{json: true, timestamp: true, timezone: '+01:00', \
         multiline: {start_pattern: '^\\S', timeout_seconds: 2}}",
    );
    assert_eq!(ok, None);
    let bad = load("{multiline: {start_pattern: '('}}").unwrap_or_default();
    assert!(
        bad.contains("sources.logs[0].parse.multiline.start_pattern"),
        "{bad}"
    );
    let bad = load("{timezone: Mars}").unwrap_or_default();
    assert!(bad.contains("sources.logs[0].parse.timezone"), "{bad}");
    let bad = load("{jsn: true}").unwrap_or_default();
    assert!(bad.contains("jsn"), "unknown keys are refused: {bad}");
}

/// The settings of a unit file or drop-in: its lines, trimmed, without blanks and comments.
fn settings(unit: &str) -> Vec<&str> {
    unit.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect()
}

/// Asserts that `uctel-agent.service` itself (without any drop-in) has each of `lines`.
fn assert_unit_has<const N: usize>(lines: [&str; N]) {
    let u = unit("uctel-agent.service");
    for line in lines {
        assert!(has_line(&u, line), "the unit without the drop-in: {line}");
    }
}

/// The kernel log drop-in grants CAP_SYSLOG and nothing else (the unit's user stays
/// unprivileged), and undoes only the hardening that hides /dev/kmsg;
/// [`systemd_units_pass_systemd_analyze_when_available`] verifies the unit with it (systemd
/// reads `uctel-agent.service.d/` beside the unit).
#[test]
fn the_kmsg_drop_in_grants_exactly_cap_syslog() {
    let d = unit("uctel-agent.service.d/kmsg.conf");
    let settings = settings(&d);
    assert_eq!(
        settings,
        [
            "[Service]",
            "ProtectKernelLogs=no",
            "CapabilityBoundingSet=CAP_SYSLOG",
            "AmbientCapabilities=CAP_SYSLOG",
            "DeviceAllow=/dev/kmsg r"
        ]
    );
    assert_unit_has([
        "User=uctel",
        "DynamicUser=yes",
        "SupplementaryGroups=adm systemd-journal",
        "AmbientCapabilities=",
        "ProtectKernelLogs=yes",
    ]);
}

/// The pod-resources drop-in grants CAP_DAC_OVERRIDE and nothing else (the kubelet's
/// socket is writable by root only; `connect(2)` needs write permission on it); the unit
/// itself grants no capability.
#[test]
fn the_pod_resources_drop_in_grants_exactly_cap_dac_override() {
    let d = unit("uctel-agent.service.d/pod-resources.conf");
    let settings = settings(&d);
    assert_eq!(
        settings,
        [
            "[Service]",
            "CapabilityBoundingSet=CAP_DAC_OVERRIDE",
            "AmbientCapabilities=CAP_DAC_OVERRIDE"
        ]
    );
    assert_unit_has([
        "User=uctel",
        "CapabilityBoundingSet=",
        "AmbientCapabilities=",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
    ]);
    assert!(
        d.contains("permission_denied") && d.contains("pod-resources.conf"),
        "the drop-in says what its absence costs and how to install it"
    );
}
