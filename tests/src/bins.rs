//! The daemon binaries under test.
//!
//! Integration tests of this crate cannot use `CARGO_BIN_EXE_*` for binaries of other
//! packages, so the first call runs `cargo build -p uctel-collector -p uctel-agent -p
//! uctel-cli` (the same `cargo` that runs the tests, the tests' profile, a no-op when they
//! are fresh) and then uses the binaries next to the test executable's `deps/` directory.
//! `UCTEL_BIN_DIR` points at a directory of prebuilt binaries instead (for example
//! `target/release`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The collector binary name.
pub const COLLECTOR: &str = "uctel-collector";
/// The agent binary name.
pub const AGENT: &str = "uctel-agent";
/// The command-line tool's binary name (`uctel top`, `uctel status`).
pub const CLI: &str = "uctel";

fn build() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("UCTEL_BIN_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    // <target>/<profile>/deps/<test>-<hash>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| format!("unexpected test executable path {}", exe.display()))?
        .to_path_buf();
    // Build with the profile the tests were built with: its directory name is the profile
    // (`debug` is the dev profile's directory).
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "dev".to_owned(),
        Some(name) => name.to_owned(),
    };
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(crate::workspace_root())
        .args([
            "build",
            "--quiet",
            "--profile",
            &profile,
            "-p",
            "uctel-collector",
            "-p",
            "uctel-agent",
            "-p",
            "uctel-cli",
            "--bins",
        ])
        .status()
        .map_err(|e| format!("running cargo build: {e}"))?;
    if !status.success() {
        return Err(format!("cargo build of the daemons failed: {status}"));
    }
    Ok(profile_dir)
}

/// Path of the binary `name` ([`COLLECTOR`], [`AGENT`] or [`CLI`]).
///
/// # Panics
/// When the daemons cannot be built or the binary is missing: a test cannot go on without
/// them, and the message says why.
pub fn path(name: &str) -> PathBuf {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let dir = match DIR.get_or_init(build) {
        Ok(d) => d,
        Err(e) => panic!("{e}"),
    };
    let p = dir.join(name);
    assert!(p.is_file(), "{} does not exist", p.display());
    p
}
