//! `uctel-agent`: parse the command line, load the configuration, install logging and call
//! the library's `run` (or `--check-config`, `--dry-run`).
//!
//! Exit status: 0 success (and a valid configuration with `--check-config`), 2 invalid
//! configuration or command line, 1 any other failure.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use uctel_agent::config::AgentConfig;

/// Streaming telemetry agent: host metrics and logs over RDMA Unreliable Connection.
#[derive(Debug, Parser)]
#[command(name = "uctel-agent", version, about)]
struct Cli {
    /// Configuration file (YAML).
    #[arg(
        long,
        short = 'c',
        env = "UCTEL_AGENT_CONFIG",
        default_value = "/etc/uctel/agent.yaml"
    )]
    config: PathBuf,
    /// Validate the configuration, print every problem with line and key, and exit
    /// (0 valid, 2 invalid).
    #[arg(long)]
    check_config: bool,
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let config = match AgentConfig::load(&cli.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            eprintln!(
                "{}: invalid configuration ({} problem(s))",
                cli.config.display(),
                e.problems.len()
            );
            return ExitCode::from(2);
        }
    };
    if cli.check_config {
        println!("{}: configuration is valid", cli.config.display());
        println!("{}", config.effective_limits());
        return ExitCode::SUCCESS;
    }
    if let Err(e) = uctel_common::logging::init(cli.log_level.as_deref()) {
        eprintln!("{e}");
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
            tracing::error!(error = %e, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    let result: anyhow::Result<()> = runtime.block_on(async {
        let (_trigger, shutdown) = uctel_common::shutdown::on_signals()?;
        if cli.dry_run {
            let mut out = std::io::stdout().lock();
            let summary = uctel_agent::dryrun::run(&config, &mut out, cli.once, shutdown).await?;
            tracing::info!(
                frames = summary.frames,
                records = summary.records,
                "dry run done"
            );
            Ok(())
        } else {
            uctel_agent::run::run(config, shutdown).await?;
            Ok(())
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "uctel-agent failed");
            eprintln!("uctel-agent: {e}");
            ExitCode::FAILURE
        }
    }
}
