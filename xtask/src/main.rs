//! `xtask`: project tasks that need the daemons' clap command lines.
//!
//! ```text
//! cargo run -p xtask -- assets DIR    man pages and shell completions of both daemons:
//!     DIR/man/uctel-agent.1  DIR/man/uctel-collector.1                        (clap_mangen)
//!     DIR/completions/{bash/uctel-agent, zsh/_uctel-agent, fish/uctel-agent.fish}
//!     and the same for uctel-collector                                        (clap_complete)
//! ```
//!
//! `packaging/build-debs` runs it into `target/packaging/` before `cargo deb`; the packages
//! install the files under `/usr/share/`.
//!
//! Why a separate binary: the daemons keep their `Cli` in `main.rs`, so only code compiled
//! with that file sees it. `build.rs` copies each `main.rs` here (the whole file, so the
//! command line is the binary's own, never a copy that drifts) and this crate asks clap for
//! the command. Generating in the daemons' own build scripts cannot see `Cli` either, and a
//! hidden `--generate-man` flag would sit in every user's binary.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Command;

mod agent_main {
    // `fn main` is not called here; the daemons' `verbs` feature is not one of this crate's.
    #![allow(dead_code, unexpected_cfgs)]
    include!(concat!(env!("OUT_DIR"), "/agent_main.rs"));

    pub(crate) fn command() -> clap::Command {
        <Cli as clap::CommandFactory>::command()
    }
}

mod collector_main {
    // `fn main` is not called here; the daemons' `verbs` feature is not one of this crate's.
    #![allow(dead_code, unexpected_cfgs)]
    include!(concat!(env!("OUT_DIR"), "/collector_main.rs"));

    pub(crate) fn command() -> clap::Command {
        <Args as clap::CommandFactory>::command()
    }
}

/// One daemon: its command line and what its man page says beyond the options.
#[derive(Debug)]
pub struct Daemon {
    /// The clap command, with the package version (`0.1.0`: a man page names the release,
    /// not the build's commit and features) and the binary's `about`.
    pub command: Command,
    /// Extra man page sections, roff.
    pub sections: &'static str,
}

/// Sections after OPTIONS of `uctel-agent(1)`.
const AGENT_SECTIONS: &str = r#".SH "EXIT STATUS"
.TP
0
Success; with \fB\-\-check\-config\fR: the configuration is valid.
.TP
1
Any other failure.
.TP
2
Invalid configuration or command line (the systemd unit does not restart the service).
.SH FILES
.TP
\fI/etc/uctel/agent.yaml\fR
The configuration (YAML, strict: unknown keys are errors).
.TP
\fI/etc/uctel/agent.token\fR
The pre\-shared token (\fBauth.token_file\fR), root:uctel, mode 0640; the collector's
\fBauth\fR must know the same token.
.TP
\fI/var/lib/uctel\-agent/\fR
Log offset checkpoints (\fBsources.state_directory\fR).
.SH "SEE ALSO"
\fBuctel\-collector\fR(1), \fBsystemctl\fR(1): \fBsystemctl enable \-\-now uctel\-agent\fR
"#;

/// Sections after OPTIONS of `uctel-collector(1)`.
const COLLECTOR_SECTIONS: &str = r#".SH "EXIT STATUS"
.TP
0
Success; with \fB\-\-check\-config\fR: the configuration is valid.
.TP
1
Any other failure.
.TP
2
Invalid configuration or command line (the systemd unit does not restart the service).
.SH FILES
.TP
\fI/etc/uctel/collector.yaml\fR
The configuration (YAML, strict: unknown keys are errors).
.TP
\fI/etc/uctel/collector.token\fR
The pre\-shared token agents prove (\fBauth.shared.token_file\fR), root:uctel, mode 0640.
.TP
\fI/var/log/uctel/\fR
The agents' log records as JSON Lines (\fBlogs.file.path\fR).
.SH "SEE ALSO"
\fBuctel\-agent\fR(1), \fBsystemctl\fR(1): \fBsystemctl enable \-\-now uctel\-collector\fR
"#;

fn packaged(command: Command, description: &'static str) -> Command {
    // The included `main.rs` is compiled in this crate, so clap's implicit `about` and
    // `version` read this crate's metadata: set the daemon package's instead.
    let command = command.version(env!("CARGO_PKG_VERSION"));
    if description.is_empty() {
        command
    } else {
        command.about(description)
    }
}

/// Both daemons.
pub fn daemons() -> Vec<Daemon> {
    vec![
        Daemon {
            command: packaged(agent_main::command(), env!("UCTEL_AGENT_DESCRIPTION")),
            sections: AGENT_SECTIONS,
        },
        Daemon {
            command: packaged(
                collector_main::command(),
                env!("UCTEL_COLLECTOR_DESCRIPTION"),
            ),
            sections: COLLECTOR_SECTIONS,
        },
    ]
}

/// `name.1`: the clap_mangen page with `sections` before its VERSION section.
pub fn man_page(daemon: &Daemon) -> anyhow::Result<Vec<u8>> {
    let man = clap_mangen::Man::new(daemon.command.clone());
    let mut out = Vec::new();
    man.render_title(&mut out)?;
    man.render_name_section(&mut out)?;
    man.render_synopsis_section(&mut out)?;
    man.render_description_section(&mut out)?;
    man.render_options_section(&mut out)?;
    out.extend_from_slice(daemon.sections.as_bytes());
    man.render_version_section(&mut out)?;
    Ok(out)
}

/// Completion script for `shell`, and the file name it is installed under.
pub fn completion(daemon: &Daemon, shell: clap_complete::Shell) -> (String, Vec<u8>) {
    let mut command = daemon.command.clone();
    let name = command.get_name().to_owned();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut command, &name, &mut out);
    let file = match shell {
        clap_complete::Shell::Zsh => format!("_{name}"),
        clap_complete::Shell::Fish => format!("{name}.fish"),
        _ => name,
    };
    (file, out)
}

/// Writes every man page and completion under `dir`; returns the paths written.
pub fn write_assets(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let mut write = |path: PathBuf, bytes: &[u8]| -> anyhow::Result<()> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
        Ok(())
    };
    for daemon in daemons() {
        let name = daemon.command.get_name().to_owned();
        write(
            dir.join("man").join(format!("{name}.1")),
            &man_page(&daemon)?,
        )?;
        for (shell, sub) in [
            (clap_complete::Shell::Bash, "bash"),
            (clap_complete::Shell::Zsh, "zsh"),
            (clap_complete::Shell::Fish, "fish"),
        ] {
            let (file, bytes) = completion(&daemon, shell);
            write(dir.join("completions").join(sub).join(file), &bytes)?;
        }
    }
    Ok(written)
}

const USAGE: &str = "usage: cargo run -p xtask -- assets DIR   (man pages and shell completions)";

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [task, dir] if task == "assets" => {
            for path in write_assets(Path::new(dir))? {
                println!("{}", path.display());
            }
            Ok(())
        }
        _ => {
            eprintln!("{USAGE}");
            std::process::exit(2);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(bytes: &[u8]) -> String {
        String::from_utf8(bytes.to_vec()).expect("UTF-8")
    }

    #[test]
    fn man_pages_carry_the_daemons_options_and_sections() {
        for daemon in daemons() {
            let name = daemon.command.get_name().to_owned();
            let page = text(&man_page(&daemon).expect("render"));
            assert!(page.contains(&format!(".TH {name} 1 ")), "{page}");
            let version = format!("{name} {}", env!("CARGO_PKG_VERSION"));
            assert!(page.contains(&version), "no {version:?} in\n{page}");
            for want in [
                "\\-\\-check\\-config",
                "\\-\\-config",
                "\\-\\-log\\-level",
                ".SH \"EXIT STATUS\"",
                ".SH FILES",
                "/etc/uctel/",
            ] {
                assert!(page.contains(want), "{name}.1 lacks {want:?}:\n{page}");
            }
        }
    }

    #[test]
    fn about_is_what_the_binary_prints() {
        let daemons = daemons();
        // No package description: the doc comment of `Cli`, as `uctel-agent --help` shows.
        let agent = daemons[0].command.get_about().map(|a| a.to_string());
        assert_eq!(
            agent.as_deref(),
            Some(
                "Streaming telemetry agent: host metrics and logs over RDMA Unreliable Connection"
            )
        );
        let collector = daemons[1].command.get_about().map(|a| a.to_string());
        assert!(
            collector
                .as_deref()
                .is_some_and(|a| a.starts_with("uctel collector daemon")),
            "{collector:?}"
        );
        assert!(daemons[0]
            .command
            .get_arguments()
            .any(|a| a.get_long() == Some("dry-run")));
    }

    #[test]
    fn completions_for_bash_zsh_and_fish() {
        for daemon in daemons() {
            let name = daemon.command.get_name().to_owned();
            let (file, bash) = completion(&daemon, clap_complete::Shell::Bash);
            assert_eq!(file, name);
            let bash = text(&bash);
            assert!(
                bash.contains("--check-config") && bash.contains("complete -F"),
                "{bash}"
            );
            let (file, zsh) = completion(&daemon, clap_complete::Shell::Zsh);
            assert_eq!(file, format!("_{name}"));
            assert!(text(&zsh).starts_with(&format!("#compdef {name}")));
            let (file, fish) = completion(&daemon, clap_complete::Shell::Fish);
            assert_eq!(file, format!("{name}.fish"));
            assert!(text(&fish).contains(&format!("complete -c {name}")));
        }
    }

    #[test]
    fn assets_are_written_and_bash_accepts_its_scripts() {
        let dir = tempfile::tempdir().expect("tempdir");
        let written = write_assets(dir.path()).expect("write");
        assert_eq!(written.len(), 8, "{written:?}");
        for p in ["man/uctel-agent.1", "completions/zsh/_uctel-collector"] {
            assert!(dir.path().join(p).is_file(), "{p}");
        }
        for name in ["uctel-agent", "uctel-collector"] {
            let script = dir.path().join("completions/bash").join(name);
            match std::process::Command::new("bash")
                .arg("-n")
                .arg(&script)
                .output()
            {
                Ok(out) => assert!(
                    out.status.success(),
                    "bash -n {}: {}",
                    script.display(),
                    String::from_utf8_lossy(&out.stderr)
                ),
                Err(e) => eprintln!("bash not run ({e}); syntax check skipped"),
            }
        }
    }
}
