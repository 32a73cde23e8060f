//! `uctel-collector`: parse flags, load the configuration, install logging and signal
//! handlers, run the collector library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// Receives uctel telemetry over RDMA UC and serves it on /metrics.
#[derive(Debug, Parser)]
#[command(name = "uctel-collector", version, about)]
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
    /// Validate the configuration, print every problem, and exit: 0 valid, 2 invalid.
    #[arg(long)]
    check_config: bool,
    /// Log filter (`info`, `debug`, `warn,uctel_collector=debug`); overrides RUST_LOG.
    #[arg(long, value_name = "FILTER")]
    log_level: Option<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let config = match uctel_collector::config::load(&args.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            eprintln!(
                "{}: {} problem(s) found",
                args.config.display(),
                e.problems.len()
            );
            return ExitCode::from(2);
        }
    };
    if args.check_config {
        println!("{}: configuration is valid", args.config.display());
        return ExitCode::SUCCESS;
    }
    if let Err(e) = uctel_common::logging::init(args.log_level.as_deref()) {
        eprintln!("uctel-collector: {e}");
        return ExitCode::from(2);
    }
    match serve(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Once, on stderr, whatever the log filter; the message is complete on its own
            // (`RunError` ends with its cause's text), so the source chain is not repeated.
            eprintln!("uctel-collector: {e}");
            ExitCode::FAILURE
        }
    }
}

fn serve(config: uctel_collector::config::Config) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("uctel-collector")
        .build()?;
    runtime.block_on(async move {
        let (_trigger, shutdown) = uctel_common::shutdown::on_signals()?;
        let running = uctel_collector::start(config).await?;
        tracing::info!(
            control = %running.control_addr(),
            metrics = %running.metrics_addr(),
            "uctel-collector running"
        );
        running.run_until(shutdown).await?;
        Ok(())
    })
}
