//! The README's first command, `scripts/demo`, run as a user runs it (short `--duration`,
//! `--check`): it must start a collector and two agents, print live per-agent status lines
//! from the collector's `/metrics`, stop on its own, and its summary must show every agent's
//! frames adding up exactly (`sent = received + lost + dropped`).
//!
//! Needs bash, curl and (for the rotation part) logrotate, as the demo does.

use std::process::Command;

#[test]
fn demo_shows_status_and_exact_accounting() {
    let _g = uctel_tests::exclusive();
    let collector = uctel_tests::bins::path(uctel_tests::bins::COLLECTOR);
    let bin_dir = collector
        .parent()
        .unwrap_or_else(|| panic!("{} has no parent", collector.display()));
    let run = tempfile::Builder::new()
        .prefix("uctel-demo-test-")
        .tempdir()
        .unwrap_or_else(|e| panic!("tempdir: {e}"));
    let script = uctel_tests::workspace_root().join("scripts/demo");
    let out = Command::new("bash")
        .arg(&script)
        .arg("--bin-dir")
        .arg(bin_dir)
        // Ports away from the example configs' defaults, so a demo a developer runs at the
        // same time does not collide with this one.
        .arg("--port-base")
        .arg(uctel_tests::net::free_addr().port().to_string())
        .args([
            "--duration",
            "12",
            "--interval",
            "3",
            "--check",
            "--run-dir",
        ])
        .arg(run.path())
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let all = format!("--- stdout\n{stdout}\n--- stderr\n{stderr}");
    assert!(out.status.success(), "demo failed: {}\n{all}", out.status);

    let status_lines: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("frames/s") && l.contains("records lost"))
        .collect();
    for agent in ["demo-a", "demo-b"] {
        let mine: Vec<&&str> = status_lines
            .iter()
            .filter(|l| l.trim_start().starts_with(agent))
            .collect();
        assert!(
            mine.len() >= 3,
            "{agent}: {} status lines\n{all}",
            mine.len()
        );
        // Frames flowed: some status line shows a non-zero rate.
        assert!(
            mine.iter().any(|l| !l.contains(" 0.0 frames/s")),
            "{agent}: no frames/s in any status line\n{all}"
        );
    }
    assert!(stdout.contains("agents connected: 2"), "{all}");
    assert_eq!(
        stdout
            .lines()
            .filter(|l| l.contains("= received + lost + dropped: exact"))
            .count(),
        2,
        "{all}"
    );
    for file in [
        "collector.yaml",
        "demo-a.yaml",
        "demo-b.yaml",
        "collector.log",
    ] {
        assert!(run.path().join(file).is_file(), "{file} missing\n{all}");
    }
    let b = std::fs::read_to_string(run.path().join("demo-b.yaml")).unwrap_or_default();
    assert!(b.contains("drop_ratio: 0.02"), "demo-b.yaml:\n{b}");
}
