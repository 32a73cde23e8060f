//! Project hygiene an operator or packager relies on: the license files say what
//! `Cargo.toml` declares, the changelog exists in Keep a Changelog form, release binaries
//! carry no debug info (the `profiling` profile has it), the test scripts never build into
//! `target/release/` (what the README's `cargo build --release` made stays), and the README
//! says how to install.

use std::path::PathBuf;

fn root() -> PathBuf {
    uctel_tests::workspace_root()
}

fn read(rel: &str) -> String {
    let p = root().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// `key = value` lines of one `[table]` of a TOML file (this workspace's manifests: one key a
/// line), values as written.
fn toml_table(text: &str, table: &str) -> Option<Vec<(String, String)>> {
    let header = format!("[{table}]");
    let mut lines = text.lines().skip_while(|l| l.trim() != header);
    lines.next()?;
    Some(
        lines
            .take_while(|l| !l.trim_start().starts_with('['))
            .filter(|l| !l.trim_start().starts_with('#'))
            .filter_map(|l| {
                let (k, v) = l.split_once('=')?;
                let v = v.split(" #").next().unwrap_or(v);
                Some((k.trim().to_owned(), v.trim().to_owned()))
            })
            .collect(),
    )
}

fn get<'a>(table: &'a [(String, String)], key: &str) -> Option<&'a str> {
    table
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// The SPDX expression of `[workspace.package] license`, and what each of its licenses'
/// text must contain.
#[test]
fn license_files_match_the_manifest() {
    let manifest = read("Cargo.toml");
    let package = toml_table(&manifest, "workspace.package").expect("[workspace.package]");
    let license = get(&package, "license")
        .expect("license in [workspace.package]")
        .trim_matches('"')
        .to_owned();
    let ids: Vec<&str> = license.split(" OR ").map(str::trim).collect();
    let marker = |id: &str| match id {
        "Apache-2.0" => (
            "APACHE",
            "Apache License\n                           Version 2.0",
        ),
        "MIT" => ("MIT", "Permission is hereby granted, free of charge"),
        other => panic!("no check for license {other:?}: add its text and a marker here"),
    };
    for id in &ids {
        let (suffix, text) = marker(id);
        // One license: LICENSE; several (MIT OR Apache-2.0): LICENSE-MIT, LICENSE-APACHE.
        let file = if ids.len() == 1 {
            "LICENSE".to_owned()
        } else {
            format!("LICENSE-{suffix}")
        };
        let body = read(&file);
        assert!(body.contains(text), "{file} is not the {id} text");
    }
    // Every crate takes the workspace's license (or no other one).
    for krate in [
        "protocol",
        "transport",
        "common",
        "agent",
        "collector",
        "tests",
        "bench",
    ] {
        let m = read(&format!("{krate}/Cargo.toml"));
        let p = toml_table(&m, "package").expect("[package]");
        let l = get(&p, "license.workspace")
            .map(|_| license.clone())
            .or_else(|| get(&p, "license").map(|v| v.trim_matches('"').to_owned()));
        assert_eq!(l.as_deref(), Some(license.as_str()), "{krate}/Cargo.toml");
    }
}

#[test]
fn changelog_keeps_a_changelog() {
    let log = read("CHANGELOG.md");
    assert!(log.starts_with("# Changelog"), "CHANGELOG.md title");
    assert!(log.contains("keepachangelog.com"), "names its format");
    assert!(log.contains("\n## [Unreleased]\n"), "an Unreleased section");
    assert!(log.contains("\n### Added\n"), "Added entries");
}

/// `[profile.release]` has no debug info (42-45 MB binaries with `debug = 1`), and the
/// profiles that keep it or that the scripts build are there.
#[test]
fn release_profile_has_no_debug_info() {
    let manifest = read("Cargo.toml");
    let release = toml_table(&manifest, "profile.release").unwrap_or_default();
    if let Some(debug) = get(&release, "debug") {
        assert!(
            matches!(debug, "false" | "0" | "\"none\""),
            "[profile.release] debug = {debug}: release binaries would carry debug info"
        );
    }
    let profiling = toml_table(&manifest, "profile.profiling").expect("[profile.profiling]");
    assert_eq!(get(&profiling, "inherits"), Some("\"release\""));
    let debug = get(&profiling, "debug").expect("[profile.profiling] debug");
    assert!(!matches!(debug, "false" | "0" | "\"none\""), "{debug}");
    let dist = toml_table(&manifest, "profile.dist").expect("[profile.dist]");
    assert_eq!(get(&dist, "inherits"), Some("\"release\""));
    // Profiling instructions build the profile that has the line tables.
    let bench = read("BENCHMARKS.md");
    for line in bench
        .lines()
        .filter(|l| l.contains("callgrind") || l.contains("perf record"))
    {
        assert!(
            !line.contains("target/release/"),
            "BENCHMARKS.md profiles a release binary (no debug info): {line}"
        );
    }
}

/// The scripts `scripts/test` runs build with the tests' own profiles or `dist`, never into
/// `target/release/`.
#[test]
fn test_scripts_leave_target_release_alone() {
    for script in [
        "scripts/test",
        "tests/rxe/run.sh",
        "packaging/build-debs",
        "packaging/test-debs",
    ] {
        for (n, line) in read(script).lines().enumerate() {
            let code = line.split('#').next().unwrap_or("");
            assert!(
                !code.contains("--release") && !code.contains("target/release"),
                "{script}:{}: builds into or reads target/release: {line}",
                n + 1
            );
        }
    }
    let test = read("scripts/test");
    assert!(
        test.contains("packaging/test-debs"),
        "scripts/test runs the package step"
    );
}

#[test]
fn readme_says_how_to_install() {
    let readme = read("README.md");
    let install = readme
        .split("\n## Install")
        .nth(1)
        .expect("README has an Install section");
    let install = install.split("\n## ").next().unwrap_or(install);
    for want in ["packaging/build-debs", "dpkg -i", "systemctl enable --now"] {
        assert!(install.contains(want), "README Install lacks {want:?}");
    }
}
