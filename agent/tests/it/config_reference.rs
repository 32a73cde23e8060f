//! `docs/configuration.md` is generated from the config types (keys, types, defaults) and
//! their doc comments (descriptions), so it cannot drift from what the daemons accept: this
//! test regenerates it and fails when the file differs. `UCTEL_BLESS=1` rewrites it.
//! The examples in the config modules' docs are valid configuration, every key is
//! described, and `--print-default-config` prints the defaults.

use std::path::Path;

use uctel_agent::config::AgentConfig;
use uctel_common::config::reference::{self, Reference};

fn references() -> Vec<Reference> {
    vec![
        uctel_agent::config::reference(),
        uctel_collector::config::reference(),
    ]
}

#[test]
fn docs_configuration_md_is_generated_from_the_config_types() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/configuration.md");
    let want = reference::markdown(&references());
    if std::env::var_os("UCTEL_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &want).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    if have != want {
        let first = have
            .lines()
            .zip(want.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| have.lines().count().min(want.lines().count()));
        panic!(
            "docs/configuration.md is out of date (first difference at line {}: {:?} should be \
             {:?}); regenerate it with UCTEL_BLESS=1 cargo test -p uctel-agent --test it -- \
             config_reference",
            first + 1,
            have.lines().nth(first).unwrap_or(""),
            want.lines().nth(first).unwrap_or("")
        );
    }
}

#[test]
fn every_key_is_described_and_every_required_key_has_an_example() {
    for r in references() {
        assert!(
            r.entries.len() > 40,
            "{}: {} keys",
            r.daemon,
            r.entries.len()
        );
        assert!(
            r.undocumented().is_empty(),
            "{}: keys without a doc comment: {:?}",
            r.daemon,
            r.undocumented()
        );
        for e in r.entries.iter().filter(|e| e.required) {
            assert!(
                e.example.is_some(),
                "{}: {} has no example",
                r.daemon,
                e.key
            );
        }
    }
}

#[test]
fn the_module_doc_examples_are_valid_keys() {
    let agent = reference::module_yaml(include_str!("../../src/config.rs"));
    if let Err(e) = serde_yaml::from_str::<AgentConfig>(&agent) {
        panic!("agent/src/config.rs example: {e}\n{agent}");
    }
    let collector = reference::module_yaml(include_str!("../../../collector/src/config/mod.rs"));
    if let Err(e) = serde_yaml::from_str::<uctel_collector::config::Config>(&collector) {
        panic!("collector/src/config/mod.rs example: {e}\n{collector}");
    }
}

/// Loads `text` as `T` through serde alone (the semantic checks look at files and tokens)
/// and serializes it back.
fn parsed<T: serde::de::DeserializeOwned + serde::Serialize>(text: &str) -> serde_yaml::Value {
    let t: T = serde_yaml::from_str(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    serde_yaml::to_value(&t).unwrap_or_else(|e| panic!("{e}"))
}

fn at<'a>(v: &'a serde_yaml::Value, key: &str) -> Option<&'a serde_yaml::Value> {
    key.split('.').try_fold(v, |v, k| v.get(k))
}

#[test]
fn the_default_configuration_is_complete_and_loads_as_the_defaults() {
    let r = references();
    let printed = [
        parsed::<AgentConfig>(&r[0].default_yaml()),
        parsed::<uctel_collector::config::Config>(&r[1].default_yaml()),
    ];
    for (r, v) in r.iter().zip(&printed) {
        let text = r.default_yaml();
        for e in &r.entries {
            if e.key.contains("[]") {
                continue;
            }
            let leaf = e.key.rsplit('.').next().unwrap_or(&e.key);
            assert!(
                text.contains(&format!("{leaf}:")),
                "{}: {} missing from the default configuration",
                r.daemon,
                e.key
            );
            if e.required || e.node.is_section() {
                continue;
            }
            // Keys of a section that is off (null) by default are absent: null.
            let null = serde_yaml::Value::Null;
            assert_eq!(
                at(v, &e.key).unwrap_or(&null),
                e.default.as_ref().unwrap_or(&null),
                "{}: {} in the printed defaults",
                r.daemon,
                e.key
            );
        }
    }
}

#[test]
fn print_default_config_prints_the_reference_defaults() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_uctel-agent"))
        .arg("--print-default-config")
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        uctel_agent::config::reference().default_yaml()
    );
}
