//! Build script of `uctel-common`: records the git commit of the build for `--version`
//! ([`version`](src/version.rs)) as `UCTEL_GIT_COMMIT`.
//!
//! The commit is `git rev-parse --short HEAD` of the checkout, or `unknown` outside git (a
//! source tarball) or without `git`. `UCTEL_GIT_COMMIT` in the environment wins (builds from
//! an exported tree that know their commit). The script runs again when `HEAD` moves: a
//! commit, a checkout, a rebase (the branch's ref file, `packed-refs`, `HEAD` itself).

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=UCTEL_GIT_COMMIT");
    let from_env = std::env::var("UCTEL_GIT_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty());
    let commit = from_env
        .or_else(git_commit)
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=UCTEL_GIT_COMMIT={}", commit.trim());
}

/// `git` run in this package's directory; its stdout trimmed, `None` on any failure.
fn git(args: &[&str]) -> Option<String> {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR")?;
    let out = Command::new("git")
        .current_dir(dir)
        .args(args)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

/// The short commit of `HEAD`, and the files to watch for it to change.
fn git_commit() -> Option<String> {
    let commit = git(&["rev-parse", "--short", "HEAD"])?;
    let mut watch: Vec<PathBuf> = Vec::new();
    for name in ["HEAD", "packed-refs"] {
        if let Some(p) = git(&["rev-parse", "--git-path", name]) {
            watch.push(PathBuf::from(p));
        }
    }
    // On a branch: its loose ref file, or the folder it will appear in after a commit when
    // the ref is packed today.
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        if let Some(p) = git(&["rev-parse", "--git-path", &branch]) {
            let p = PathBuf::from(p);
            if p.exists() {
                watch.push(p);
            } else if let Some(parent) = p.parent() {
                watch.push(parent.to_path_buf());
            }
        }
    }
    let dir = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from)?;
    for p in watch {
        // Relative paths are relative to the directory git ran in. A path that does not
        // exist would make cargo run this script on every build: skip it.
        let p = if p.is_absolute() { p } else { dir.join(p) };
        if Path::new(&p).exists() {
            println!("cargo:rerun-if-changed={}", p.display());
        }
    }
    Some(commit)
}
