//! Copies the daemons' `main.rs` into `OUT_DIR` so that `src/main.rs` can `include!` them and
//! get each binary's clap command line from its own `Cli` definition, with nothing moved out
//! of the binaries. `include!` accepts items only, so inner doc comments and inner
//! attributes (`//!`, `#![...]`) become plain comments. Also passes each daemon package's
//! `description` (clap's `about` of the binary) as `UCTEL_<NAME>_DESCRIPTION`.

use std::path::Path;

fn main() {
    let out = std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR");
    for (name, dir) in [("agent", "../agent"), ("collector", "../collector")] {
        let main_rs = format!("{dir}/src/main.rs");
        let manifest = format!("{dir}/Cargo.toml");
        println!("cargo:rerun-if-changed={main_rs}");
        println!("cargo:rerun-if-changed={manifest}");
        let text =
            std::fs::read_to_string(&main_rs).unwrap_or_else(|e| panic!("reading {main_rs}: {e}"));
        let mut items = String::with_capacity(text.len());
        for line in text.lines() {
            let t = line.trim_start();
            if t.starts_with("//!") || t.starts_with("#![") {
                items.push_str("// ");
            }
            items.push_str(line);
            items.push('\n');
        }
        std::fs::write(Path::new(&out).join(format!("{name}_main.rs")), items)
            .unwrap_or_else(|e| panic!("writing {name}_main.rs: {e}"));
        let toml = std::fs::read_to_string(&manifest)
            .unwrap_or_else(|e| panic!("reading {manifest}: {e}"));
        let description = package_description(&toml).unwrap_or_default();
        println!(
            "cargo:rustc-env=UCTEL_{}_DESCRIPTION={description}",
            name.to_uppercase()
        );
    }
}

/// `description = "..."` of the `[package]` table (a one-line basic string, as in this
/// workspace's manifests).
fn package_description(toml: &str) -> Option<String> {
    let mut in_package = false;
    for line in toml.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_package = line == "[package]";
            continue;
        }
        if !in_package {
            continue;
        }
        if let Some(rest) = line.strip_prefix("description") {
            let value = rest.trim_start().strip_prefix('=')?.trim();
            let value = value.strip_prefix('"')?.strip_suffix('"')?;
            return Some(value.replace("\\\"", "\""));
        }
    }
    None
}
