//! The `uctel-agent` Debian package from the source side: the packaged configuration
//! (`packaging/agent.yaml`, installed as `/etc/uctel/agent.yaml`) loads and names the paths
//! that the unit and the maintainer scripts make, the `[package.metadata.deb]` assets exist,
//! and `--version` names the git commit and the enabled features. `scripts/test`
//! (`packaging/test-debs`) builds, installs and checks the real package.

use std::path::{Path, PathBuf};
use std::process::Command;

use uctel_agent::config::AgentConfig;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(rel: &str) -> String {
    let p = root().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn has_line(text: &str, line: &str) -> bool {
    text.lines().any(|l| l.trim() == line)
}

#[test]
fn packaged_config_loads_and_matches_the_unit_and_the_postinst() {
    let text = read("packaging/agent.yaml");
    let token_path = "/etc/uctel/agent.token";
    assert!(
        text.contains(&format!("token_file: {token_path}")),
        "packaging/agent.yaml must read the token the postinst writes"
    );
    // The token file exists only on an installed host: load a copy that points at a
    // temporary one, everything else as shipped.
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let token = dir.path().join("agent.token");
    std::fs::write(&token, "0123456789abcdef\n").unwrap_or_else(|e| panic!("{e}"));
    let copy = dir.path().join("agent.yaml");
    std::fs::write(
        &copy,
        text.replace(token_path, &token.display().to_string()),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    // As shipped, its `agent_id: change-me` is refused, and only that; the id given on the
    // command line (or in UCTEL_AGENT_ID) takes its place.
    let refused = AgentConfig::load(&copy)
        .err()
        .unwrap_or_else(|| panic!("packaging/agent.yaml loads with agent_id: change-me"));
    let keys: Vec<&str> = refused
        .problems
        .iter()
        .map(|p| p.key_path.as_str())
        .collect();
    assert_eq!(keys, ["agent_id"], "{refused}");
    let config = AgentConfig::load_with_agent_id(&copy, Some("host-a"))
        .unwrap_or_else(|e| panic!("packaging/agent.yaml does not load:\n{e}"));
    assert_eq!(config.agent_id, "host-a");
    assert_eq!(
        config.sources.state_directory.as_deref(),
        Some(Path::new("/var/lib/uctel-agent"))
    );

    let unit = read("config/systemd/uctel-agent.service");
    for line in [
        "StateDirectory=uctel-agent",
        "User=uctel",
        "Group=uctel",
        "ExecStart=/usr/bin/uctel-agent --config /etc/uctel/agent.yaml",
    ] {
        assert!(has_line(&unit, line), "uctel-agent.service: no {line}");
    }
    assert!(
        unit.contains(token_path) && unit.contains("group uctel"),
        "the unit's token guidance must name {token_path} and group uctel"
    );

    let postinst = read("packaging/debian/agent/postinst");
    for want in [
        "groupadd --system uctel",
        "useradd --system --gid uctel",
        "/var/lib/uctel-agent",
        "token=/etc/uctel/agent.token",
        "root:uctel",
        "0640",
    ] {
        assert!(postinst.contains(want), "postinst lacks {want:?}");
    }
    // Commands, not the comments and the hint it prints.
    let commands = postinst
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#') && !l.starts_with("echo "));
    for line in commands {
        for never in ["systemctl enable", "systemctl start", "systemctl restart"] {
            assert!(!line.contains(never), "postinst must start nothing: {line}");
        }
    }
    let postrm = read("packaging/debian/agent/postrm");
    assert!(postrm.contains("purge)") && postrm.contains("rm -rf /var/lib/uctel-agent"));
}

#[test]
fn packaged_agent_reaches_the_packaged_collector() {
    let agent: serde_yaml::Value = serde_yaml::from_str(&read("packaging/agent.yaml"))
        .unwrap_or_else(|e| panic!("packaging/agent.yaml: {e}"));
    let collector: serde_yaml::Value = serde_yaml::from_str(&read("packaging/collector.yaml"))
        .unwrap_or_else(|e| panic!("packaging/collector.yaml: {e}"));
    let port = |v: &serde_yaml::Value, path: &[&str]| -> String {
        let s = path
            .iter()
            .try_fold(v, |v, k| v.get(*k))
            .and_then(serde_yaml::Value::as_str)
            .unwrap_or_else(|| panic!("no {}", path.join(".")));
        s.rsplit_once(':')
            .map(|(_, p)| p.to_owned())
            .unwrap_or_default()
    };
    assert_eq!(
        port(&agent, &["collector", "control"]),
        port(&collector, &["listen", "control"])
    );
    assert_ne!(
        port(&agent, &["listen", "metrics"]),
        port(&collector, &["listen", "metrics"]),
        "both daemons on one host: the /metrics ports must differ"
    );
}

/// Every source file named in `[package.metadata.deb]` exists (those under `target/` are
/// generated by `packaging/build-debs`), and the package is built as documented.
#[test]
fn deb_metadata_names_existing_files() {
    let manifest = read("agent/Cargo.toml");
    let start = manifest
        .find("[package.metadata.deb]")
        .unwrap_or_else(|| panic!("agent/Cargo.toml has no [package.metadata.deb]"));
    let meta = &manifest[start..];
    let mut checked = 0;
    for quoted in meta.split('"').skip(1).step_by(2) {
        let Some(rel) = quoted.strip_prefix("../") else {
            continue;
        };
        if rel.starts_with("target/") {
            continue;
        }
        assert!(root().join(rel).exists(), "{quoted} does not exist");
        checked += 1;
    }
    assert!(checked >= 5, "only {checked} files checked");
    for want in [
        "profile = \"dist\"",
        "features = [\"verbs\"]",
        "\"etc/uctel/agent.yaml\"",
        "\"lib/systemd/system/\"",
        "usr/share/man/man1/",
        "bash-completion/completions/",
        "zsh/vendor-completions/",
        "fish/vendor_completions.d/",
    ] {
        assert!(meta.contains(want), "[package.metadata.deb] lacks {want}");
    }
    for script in ["postinst", "prerm", "postrm"] {
        let p = root().join("packaging/debian/agent").join(script);
        let mode = std::fs::metadata(&p)
            .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()))
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(mode & 0o111 != 0, "{} is not executable", p.display());
    }
}

/// `uctel-agent --version`: `uctel-agent 0.1.0 (git 2044e9b, features: none)`, the commit
/// one of this repository's when it was built from a git checkout.
#[test]
fn version_names_the_commit_and_the_features() {
    let out = Command::new(env!("CARGO_BIN_EXE_uctel-agent"))
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(out.status.success());
    let line = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let prefix = format!("uctel-agent {} (git ", env!("CARGO_PKG_VERSION"));
    let rest = line
        .strip_prefix(&prefix)
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or_else(|| panic!("{line:?} does not start with {prefix:?}"));
    let (commit, features) = rest
        .split_once(", features: ")
        .unwrap_or_else(|| panic!("no features in {line:?}"));
    let want = if cfg!(feature = "verbs") {
        "verbs"
    } else {
        "none"
    };
    assert_eq!(features, want, "{line}");
    if std::env::var_os("UCTEL_GIT_COMMIT").is_some() {
        return; // set by hand for this build: any text
    }
    let in_git = Command::new("git")
        .current_dir(root())
        .args(["rev-parse", "--git-dir"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !in_git {
        assert_eq!(commit, "unknown", "{line}");
        return;
    }
    assert!(
        commit.len() >= 7 && commit.bytes().all(|b| b.is_ascii_hexdigit()),
        "{line}"
    );
    let known = Command::new("git")
        .current_dir(root())
        .args(["cat-file", "-e", &format!("{commit}^{{commit}}")])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        known,
        "{commit} is not a commit of this repository ({line})"
    );
}

/// `uctel-agent --check-config` on the packaged file as shipped (what a fresh install's
/// `ExecStartPre=` runs): exit 2, saying to set `agent_id` or pass `--agent-id` /
/// `UCTEL_AGENT_ID`; with `UCTEL_AGENT_ID` (or `--agent-id`) it is valid, and the file's
/// placeholder is not used. Before, `agent_id: change-me` passed, and every fresh host
/// connected as `change-me`.
#[test]
fn the_packaged_placeholder_id_is_refused_until_one_is_given() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let token = dir.path().join("agent.token");
    std::fs::write(&token, "0123456789abcdef\n").unwrap_or_else(|e| panic!("{e}"));
    let copy = dir.path().join("agent.yaml");
    std::fs::write(
        &copy,
        read("packaging/agent.yaml")
            .replace("/etc/uctel/agent.token", &token.display().to_string())
            .replace(
                "/var/lib/uctel-agent",
                &dir.path().join("state").display().to_string(),
            ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let run = |env: Option<&str>, args: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_uctel-agent"));
        // The service user's view is another test's (where a user uctel exists, it would
        // be checked here too).
        c.arg("--config")
            .arg(&copy)
            .args(["--check-config", "--service-user", "root"])
            .args(args);
        c.env_remove("UCTEL_AGENT_ID");
        if let Some(id) = env {
            c.env("UCTEL_AGENT_ID", id);
        }
        let out = c.output().unwrap_or_else(|e| panic!("{e}"));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    };
    let (code, text) = run(None, &[]);
    assert_eq!(code, Some(2), "{text}");
    for want in ["agent_id: change-me", "--agent-id", "UCTEL_AGENT_ID"] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    let (code, text) = run(Some("host-a"), &[]);
    assert_eq!(code, Some(0), "{text}");
    let (code, text) = run(None, &["--agent-id", "host-b"]);
    assert_eq!(code, Some(0), "{text}");
}
