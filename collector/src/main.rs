//! `uctel-collector`: parse flags, load the configuration, install logging and signal
//! handlers, run the collector library.
//!
//! Signals: SIGTERM and SIGINT stop the collector (every session ends with a `Goodbye`);
//! SIGUSR1 drains it (agents are told to move to their next collector of the pool, then the
//! collector stops, exit status 0); SIGHUP reloads the configuration (`uctel_collector::reload`).
//!
//! Exit status: 0 success (and a valid configuration with `--check-config`); 2 an invalid
//! configuration or command line, or a start-up failure no restart can fix (the systemd
//! unit's `RestartPreventExitStatus=2`); 1 any other failure (restarting may help: an
//! address in use, a device not there yet). Problems are printed once, on stderr.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use uctel_collector::daemon::RunError;

/// Receives uctel telemetry over RDMA UC and serves it on /metrics.
#[derive(Debug, Parser)]
#[command(name = "uctel-collector", about)]
#[command(version = uctel_common::version::long(env!("CARGO_PKG_VERSION"), &[("verbs", cfg!(feature = "verbs"))]))]
struct Args {
    /// Configuration file (YAML).
    #[arg(
        long,
        short = 'c',
        value_name = "PATH",
        env = "UCTEL_COLLECTOR_CONFIG",
        default_value = "/etc/uctel/collector.yaml"
    )]
    config: PathBuf,
    /// Validate the configuration and the command line, print every problem, and exit:
    /// 0 valid, 2 invalid.
    #[arg(long)]
    check_config: bool,
    /// Log filter (`info`, `debug`, `warn,uctel_collector=debug`); overrides RUST_LOG.
    #[arg(long, value_name = "FILTER")]
    log_level: Option<String>,
    /// Print the complete default configuration (every key at its default, described in
    /// comments) and exit.
    #[arg(long, conflicts_with = "check_config")]
    print_default_config: bool,
    /// Print the `CREATE TABLE` statement of the ClickHouse log output's table
    /// (`outputs.clickhouse`; `clickhouse-client --multiquery` runs it) and exit.
    #[arg(long, conflicts_with_all = ["check_config", "print_default_config"])]
    print_clickhouse_schema: bool,
    /// With `--print-clickhouse-schema`: the ClickHouse server's version (`18.16`, `26.9`).
    /// From 22 on, the schema for a current ClickHouse (`config/clickhouse/logs-modern.sql`:
    /// DateTime64(9), LowCardinality, a TTL, block deduplication); before, the schema that
    /// works from 18.16 on (`config/clickhouse/logs.sql`, also printed without this flag).
    #[arg(long, value_name = "VERSION", requires = "print_clickhouse_schema")]
    server_version: Option<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.print_default_config {
        return print_then(&uctel_collector::config::reference().default_yaml());
    }
    if args.print_clickhouse_schema {
        use uctel_collector::outputs::clickhouse;
        return match args.server_version.as_deref().map(clickhouse::schema_for) {
            None => print_then(clickhouse::SCHEMA),
            Some(Ok(schema)) => print_then(schema),
            Some(Err(e)) => {
                eprintln!("uctel-collector: {e}");
                ExitCode::from(2)
            }
        };
    }
    // Everything that can be checked without starting, reported together.
    let Some((config, directives)) = uctel_common::config::check_startup(
        "uctel-collector",
        uctel_collector::config::load(&args.config),
        args.log_level.as_deref(),
    ) else {
        return ExitCode::from(2);
    };
    if args.check_config {
        return print_then(&format!(
            "{}: configuration is valid\n",
            args.config.display()
        ));
    }
    // The file's `log_level` takes the place of `RUST_LOG` (`--log-level` wins over both).
    let directives = if args
        .log_level
        .as_deref()
        .is_some_and(|l| !l.trim().is_empty())
    {
        directives
    } else {
        config.log_level.clone().unwrap_or(directives)
    };
    if let Err(e) = uctel_common::logging::init(Some(&directives)) {
        eprintln!("uctel-collector: {e}");
        return ExitCode::from(2);
    }
    let source = uctel_collector::reload::ReloadSource {
        path: args.config.clone(),
        log_rule: uctel_common::logging::BaseRule::from_env(args.log_level.as_deref()),
    };
    match serve(config, source) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Once, on stderr, whatever the log filter; the message is complete on its own
            // (`RunError` ends with its cause's text), so the source chain is not repeated.
            eprintln!("uctel-collector: {e}");
            let permanent = e.downcast_ref::<RunError>().is_some_and(permanent);
            ExitCode::from(if permanent { 2 } else { 1 })
        }
    }
}

/// Prints `text` on stdout: exit 0, also when the reader closed the pipe early
/// (`--check-config | head`); 1 on any other write error.
fn print_then(text: &str) -> ExitCode {
    match uctel_common::stdout::print(text) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("uctel-collector: cannot write to stdout: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Whether a start-up failure would happen again after a restart (exit 2, so systemd does
/// not restart it every 2 s for ever).
fn permanent(e: &RunError) -> bool {
    use uctel_transport::api::{OpenError, TransportKind};
    let os = |source: &std::io::Error| source.kind() != std::io::ErrorKind::AddrInUse;
    match e {
        // Another process holds the address: it may go away. Anything else (not a local
        // address, a privileged port) stays.
        RunError::Bind { source, .. } => os(source),
        RunError::LogSink { .. } | RunError::Auth(_) => true,
        RunError::Transport { source, .. } => match source {
            OpenError::Unsupported { .. } | OpenError::InvalidConfig { .. } => true,
            // The soft transport's UDP socket, as a listener; a verbs device that is not
            // there (yet) may come with its driver.
            OpenError::Io { kind, source, .. } => *kind == TransportKind::Soft && os(source),
        },
        _ => false,
    }
}

fn serve(
    config: uctel_collector::config::Config,
    source: uctel_collector::reload::ReloadSource,
) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("uctel-collector")
        .build()?;
    runtime.block_on(async move {
        let (_trigger, shutdown) = uctel_common::shutdown::on_signals()?;
        let running = uctel_collector::start_with(config, Some(source)).await?;
        if let Some(reload) = running.reload() {
            uctel_common::reload::on_sighup(reload);
        }
        tracing::info!(
            control = %running.control_addr(),
            metrics = %running.metrics_addr(),
            "uctel-collector running"
        );
        // SIGUSR1 drains: agents move to their next collector, then the collector stops.
        let drain = running.drain();
        let mut usr1 =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())?;
        tokio::spawn(async move {
            while usr1.recv().await.is_some() {
                tracing::info!("SIGUSR1 received, draining");
                drain.start();
            }
        });
        running.run_until(shutdown).await?;
        // A session the collector's own `Goodbye` ended is accounted up to its last look:
        // frames the agent posted after it are unknowable (README "Loss accounting"); a
        // drain (SIGUSR1) waits for the agents' `Goodbye`s and is exact.
        tracing::info!(
            "uctel-collector stopped: every session closed (exact where the agent's Goodbye \
             arrived; drain with SIGUSR1 first for exact totals)"
        );
        Ok(())
    })
}
