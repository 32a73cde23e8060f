//! `uctel-agent`: parse the command line, load the configuration, install logging and call
//! the library's `run` (or `--check-config`, `--dry-run`, `--print-default-config`).
//!
//! Exit status: 0 success (and a valid configuration with `--check-config`); 2 an invalid
//! configuration or command line, or a start-up failure no restart can fix (the systemd
//! unit's `RestartPreventExitStatus=2`); 1 any other failure (restarting may help: an
//! address in use, a failed runtime). Problems are printed once, on stderr.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use uctel_agent::config::AgentConfig;
use uctel_agent::run::RunError;

/// Streaming telemetry agent: host metrics and logs over RDMA Unreliable Connection.
#[derive(Debug, Parser)]
#[command(name = "uctel-agent", about)]
#[command(version = uctel_common::version::long(env!("CARGO_PKG_VERSION"), &[("verbs", cfg!(feature = "verbs"))]))]
struct Cli {
    /// Configuration file (YAML).
    #[arg(
        long,
        short = 'c',
        env = "UCTEL_AGENT_CONFIG",
        default_value = "/etc/uctel/agent.yaml"
    )]
    config: PathBuf,
    /// Use this agent id instead of the configuration's `agent_id` (1 to 128 characters of
    /// letters, digits, '.', '_', '-'): one configuration for a fleet, each host its own id
    /// (a Kubernetes DaemonSet sets it from the node's name).
    #[arg(long, value_name = "ID", env = "UCTEL_AGENT_ID")]
    agent_id: Option<String>,
    /// Validate the configuration and the command line, print every problem with line and
    /// key (or what the agent will read and write), and exit (0 valid, 2 invalid).
    #[arg(long)]
    check_config: bool,
    /// With --check-config as root: the user the service runs as (the systemd unit's
    /// `User=`). The configuration file, token file and state directory are also checked for
    /// that user, from their owners and modes, since root reads every file.
    #[arg(long, value_name = "USER", default_value = uctel_agent::service_user::SERVICE_USER)]
    service_user: String,
    /// Log filter (`info`, `debug`, `warn,uctel_agent=debug`); overrides RUST_LOG.
    #[arg(long)]
    log_level: Option<String>,
    /// Collect and frame as usual, but print the decoded frames to stdout (JSON lines)
    /// instead of connecting to the collector.
    #[arg(long)]
    dry_run: bool,
    /// With --dry-run: one round of every source, then exit.
    #[arg(long, requires = "dry_run")]
    once: bool,
    /// Print the complete default configuration (every key at its default, described in
    /// comments) and exit.
    #[arg(long, conflicts_with_all = ["check_config", "dry_run"])]
    print_default_config: bool,
}

/// A failure after the configuration was accepted, with its exit status.
struct Fatal {
    message: String,
    /// No restart can fix it: exit 2.
    permanent: bool,
}

impl Fatal {
    fn retry(message: impl std::fmt::Display) -> Fatal {
        Fatal {
            message: message.to_string(),
            permanent: false,
        }
    }

    fn permanent(message: impl std::fmt::Display) -> Fatal {
        Fatal {
            message: message.to_string(),
            permanent: true,
        }
    }
}

impl From<RunError> for Fatal {
    fn from(e: RunError) -> Fatal {
        let permanent = match &e {
            // A missing or empty token, a state directory or log source that cannot be set
            // up: the same again after a restart.
            RunError::Token(_) | RunError::Source(_) => true,
            // Another process holds the port: it may go away.
            RunError::Listen { source, .. } => source.kind() != std::io::ErrorKind::AddrInUse,
            _ => false,
        };
        Fatal {
            message: e.to_string(),
            permanent,
        }
    }
}

/// Prints `text` on stdout: exit 0, also when the reader closed the pipe early
/// (`--check-config | head`); 1 on any other write error.
fn print_then(text: &str) -> ExitCode {
    match uctel_common::stdout::print(text) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("uctel-agent: cannot write to stdout: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `--check-config` as root for a service that runs as `--service-user`: what that user
/// cannot read or write is printed on stderr like the file's problems (`Err`, exit 2);
/// otherwise the notes to print after "valid" (each line ending in a newline).
fn service_user_findings(cli: &Cli, config: &AgentConfig) -> Result<String, ExitCode> {
    use uctel_agent::service_user::{check, Accounts};
    if !uctel_agent::service_user::running_as_root() {
        return Ok(String::new());
    }
    let accounts = Accounts::system();
    let Some(account) = accounts.user(&cli.service_user) else {
        return Ok(format!(
            "note: checked as root, and there is no user {:?} here (the service's User=): pass \
             --service-user USER to check the files as the user the service runs as\n",
            cli.service_user
        ));
    };
    if account.uid == 0 {
        return Ok(String::new());
    }
    let found = check(&accounts, &account, &cli.config, config);
    if !found.problems.is_empty() {
        let file = cli.config.display();
        for (key, text) in &found.problems {
            if key.is_empty() {
                eprintln!("{file}: {text}");
            } else {
                eprintln!("{file}: {key}: {text}");
            }
        }
        let n = found.problems.len();
        eprintln!(
            "{file}: invalid for the service user {} ({n} problem{}; checked as root, which \
             reads every file)",
            account.name,
            if n == 1 { "" } else { "s" }
        );
        return Err(ExitCode::from(2));
    }
    let mut notes = format!(
        "checked as root, and for the service user {}: it can read the configuration{}\n",
        account.name,
        if config.auth.token_file.is_some() {
            " and the token file"
        } else {
            ""
        }
    );
    for n in &found.notes {
        notes.push_str(&format!("note: {n}\n"));
    }
    Ok(notes)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.print_default_config {
        return print_then(&uctel_agent::config::reference().default_yaml());
    }
    if let Some(id) = &cli.agent_id {
        if !uctel_agent::config::valid_agent_id(id) {
            eprintln!(
                "uctel-agent: --agent-id (or UCTEL_AGENT_ID) {id:?}: must be 1 to 128 characters \
                 of letters, digits, '.', '_' or '-'"
            );
            return ExitCode::from(2);
        }
    }
    // Everything that can be checked without starting, reported together; the id from the
    // command line or the environment takes the place of the file's `agent_id`.
    let Some((config, directives)) = uctel_common::config::check_startup(
        "uctel-agent",
        AgentConfig::load_with_agent_id(&cli.config, cli.agent_id.as_deref()),
        cli.log_level.as_deref(),
    ) else {
        return ExitCode::from(2);
    };
    if cli.check_config {
        let notes = match service_user_findings(&cli, &config) {
            Ok(notes) => notes,
            Err(status) => return status,
        };
        return print_then(&format!(
            "{}: configuration is valid\n{}\n{}\n{notes}",
            cli.config.display(),
            config.effective_limits(),
            config.reads_and_writes()
        ));
    }
    // The file's `log_level` takes the place of `RUST_LOG` (`--log-level` wins over both).
    let directives = if cli
        .log_level
        .as_deref()
        .is_some_and(|l| !l.trim().is_empty())
    {
        directives
    } else {
        config.log_level.clone().unwrap_or(directives)
    };
    if let Err(e) = uctel_common::logging::init(Some(&directives)) {
        eprintln!("uctel-agent: {e}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("uctel-agent")
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("uctel-agent: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result: Result<(), Fatal> = runtime.block_on(async {
        let (_trigger, shutdown) = uctel_common::shutdown::on_signals()
            .map_err(|e| Fatal::retry(format!("cannot handle signals: {e}")))?;
        if cli.dry_run {
            let mut out = std::io::stdout().lock();
            let summary = uctel_agent::dryrun::run(&config, &mut out, cli.once, shutdown)
                .await
                .map_err(|e| match e {
                    uctel_agent::dryrun::DryRunError::Source(_) => Fatal::permanent(e),
                    _ => Fatal::retry(e),
                })?;
            tracing::info!(
                frames = summary.frames,
                records = summary.records,
                "dry run done"
            );
            Ok(())
        } else {
            let options = uctel_agent::run::Options {
                reload: Some(uctel_agent::reload::ReloadSource {
                    path: cli.config.clone(),
                    agent_id: cli.agent_id.clone(),
                    log_rule: uctel_common::logging::BaseRule::from_env(cli.log_level.as_deref()),
                }),
                ..Default::default()
            };
            uctel_agent::run::run_with(config, options, shutdown).await?;
            tracing::info!("uctel-agent stopped");
            Ok(())
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            // Once, on stderr, whatever the log filter.
            eprintln!("uctel-agent: {}", f.message);
            ExitCode::from(if f.permanent { 2 } else { 1 })
        }
    }
}
