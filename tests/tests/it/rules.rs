//! The Prometheus rules shipped in `config/prometheus/` pass promtool: every rule file (a YAML
//! file with a top-level `groups:` key) passes `promtool check rules`, and every unit-test
//! file (`*_test.yml`) passes `promtool test rules`. promtool runs in that directory, since a
//! test file names its `rule_files` relative to it.

use std::path::{Path, PathBuf};
use std::process::Command;

fn dir() -> PathBuf {
    uctel_tests::workspace_root().join("config/prometheus")
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| panic!("{} has no file name", path.display()))
}

/// The YAML files of `config/prometheus/` for which `keep(name, text)` holds, sorted.
fn yaml_files(keep: impl Fn(&str, &str) -> bool) -> Vec<PathBuf> {
    let dir = dir();
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut files: Vec<PathBuf> = entries
        .map(|entry| match entry {
            Ok(entry) => entry.path(),
            Err(e) => panic!("{}: {e}", dir.display()),
        })
        .filter(|p| p.extension().is_some_and(|x| x == "yml" || x == "yaml"))
        .filter(|p| {
            let text =
                std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            keep(&file_name(p), &text)
        })
        .collect();
    files.sort();
    files
}

/// Runs `promtool <args>` in `config/prometheus/`; its output, or a panic showing it unless
/// it succeeded.
fn promtool(args: &[&str]) -> String {
    let out = Command::new(uctel_testkit::promtool::binary())
        .current_dir(dir())
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("promtool {}: {e}", args.join(" ")));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "promtool {}: {}\n{text}",
        args.join(" "),
        out.status
    );
    text
}

#[test]
fn every_rule_file_passes_promtool_check_rules() {
    let files = yaml_files(|_, text| text.lines().any(|l| l.starts_with("groups:")));
    assert!(!files.is_empty(), "no rule file in {}", dir().display());
    for path in &files {
        let name = file_name(path);
        let text = promtool(&["check", "rules", &name]);
        assert!(text.contains("SUCCESS"), "{name}: {text}");
    }
}

#[test]
fn every_rule_test_file_passes_promtool_test_rules() {
    let files = yaml_files(|name, _| name.ends_with("_test.yml"));
    assert!(!files.is_empty(), "no *_test.yml in {}", dir().display());
    for path in &files {
        let name = file_name(path);
        let text = promtool(&["test", "rules", &name]);
        assert!(text.contains("SUCCESS"), "{name}: {text}");
    }
}

/// Every alert of every rule file is shown firing (a non-empty `exp_alerts`) by some
/// `*_test.yml`, so no alert ships untested.
#[test]
fn every_alert_is_shown_firing_by_a_rule_test() {
    let yaml = |path: &Path| -> serde_yaml::Value {
        let text =
            std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let seq = |v: &serde_yaml::Value, key: &str| -> Vec<serde_yaml::Value> {
        v.get(key)
            .and_then(serde_yaml::Value::as_sequence)
            .cloned()
            .unwrap_or_default()
    };
    let mut fired = std::collections::BTreeSet::new();
    for path in yaml_files(|name, _| name.ends_with("_test.yml")) {
        for test in seq(&yaml(&path), "tests") {
            for case in seq(&test, "alert_rule_test") {
                if !seq(&case, "exp_alerts").is_empty() {
                    if let Some(name) = case.get("alertname").and_then(serde_yaml::Value::as_str) {
                        fired.insert(name.to_owned());
                    }
                }
            }
        }
    }
    let mut alerts = Vec::new();
    for path in yaml_files(|_, text| text.lines().any(|l| l.starts_with("groups:"))) {
        for group in seq(&yaml(&path), "groups") {
            for rule in seq(&group, "rules") {
                if let Some(name) = rule.get("alert").and_then(serde_yaml::Value::as_str) {
                    alerts.push(name.to_owned());
                }
            }
        }
    }
    assert!(alerts.iter().any(|a| a == "UctelAgentDown"), "{alerts:?}");
    let untested: Vec<&String> = alerts.iter().filter(|a| !fired.contains(*a)).collect();
    assert!(
        untested.is_empty(),
        "alerts no rule test shows firing: {untested:?}"
    );
}
