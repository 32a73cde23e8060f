//! The in-process daemons as test fixtures: [`RunningAgent`] (the agent's `run_with` on a
//! tokio task, with its self-metrics readable from outside) and [`RunningCollector`] (the
//! collector's `start`). Each `stop()` triggers the daemon's shutdown, awaits the end of its
//! tasks within [`STOP_TIMEOUT`] and asserts the result: an error, a panic of the task or a
//! hang fails the test with the error's text.

use std::fmt::Display;
use std::future::Future;
use std::net::SocketAddr;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use uctel_agent::config::AgentConfig;
use uctel_agent::run::{run_with, Options, RunError, RunSummary};
use uctel_agent::selfmetrics::SelfMetrics;
use uctel_common::shutdown::ShutdownTrigger;

/// How long a daemon may take to stop once asked (its shutdown grace with room to spare).
pub const STOP_TIMEOUT: Duration = Duration::from_secs(20);

/// Awaits `fut` within `timeout`: its output, or a test failure naming `what`.
async fn within<T>(what: &str, timeout: Duration, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(timeout, fut)
        .await
        .unwrap_or_else(|_| panic!("{what} did not stop within {timeout:?}"))
}

/// `Ok` of a daemon's result, or a test failure with the error's text.
fn ok<T, E: Display>(what: &str, r: Result<T, E>) -> T {
    r.unwrap_or_else(|e| panic!("{what} failed: {e}"))
}

/// The agent running on a task of the current tokio runtime.
#[derive(Debug)]
pub struct RunningAgent {
    /// Its self-metrics (connection state, frames, records, drops), shared with the task.
    pub stats: Arc<SelfMetrics>,
    metrics_addr: Option<SocketAddr>,
    trigger: ShutdownTrigger,
    task: JoinHandle<Result<RunSummary, RunError>>,
}

impl RunningAgent {
    /// Starts the agent on `config` with fresh self-metrics and no `/metrics` listener.
    ///
    /// # Panics
    /// If the self-metrics cannot be created.
    pub fn start(config: AgentConfig) -> RunningAgent {
        RunningAgent::start_with(config, Options::default())
    }

    /// Starts the agent serving `/metrics` on a free loopback port ([`Self::metrics_addr`]).
    ///
    /// # Panics
    /// If the port cannot be bound.
    pub async fn start_serving(config: AgentConfig) -> RunningAgent {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("binding the agent's /metrics: {e}"));
        RunningAgent::start_with(
            config,
            Options {
                stats: None,
                metrics_listener: Some(listener),
                ..Options::default()
            },
        )
    }

    /// Starts the agent with `options` (fresh self-metrics when it names none).
    ///
    /// # Panics
    /// If the self-metrics cannot be created.
    pub fn start_with(config: AgentConfig, mut options: Options) -> RunningAgent {
        let stats = match &options.stats {
            Some(s) => s.clone(),
            None => Arc::new(SelfMetrics::new().unwrap_or_else(|e| panic!("self-metrics: {e}"))),
        };
        options.stats = Some(stats.clone());
        let metrics_addr = options
            .metrics_listener
            .as_ref()
            .and_then(|l| l.local_addr().ok());
        let (trigger, shutdown) = uctel_common::shutdown::channel();
        let task = tokio::spawn(run_with(config, options, shutdown));
        RunningAgent {
            stats,
            metrics_addr,
            trigger,
            task,
        }
    }

    /// The agent's `/metrics` address.
    ///
    /// # Panics
    /// If it was started without a listener.
    pub fn metrics_addr(&self) -> SocketAddr {
        self.metrics_addr
            .unwrap_or_else(|| panic!("the agent was started without a /metrics listener"))
    }

    /// Shuts the agent down (as SIGTERM does) and returns its summary.
    ///
    /// # Panics
    /// If it does not stop within [`STOP_TIMEOUT`], its task panicked, or it returned an
    /// error (the message carries the error's text).
    pub async fn stop(self) -> RunSummary {
        self.stop_within(STOP_TIMEOUT).await
    }

    /// [`Self::stop`] with its own bound.
    ///
    /// # Panics
    /// As [`Self::stop`].
    pub async fn stop_within(self, timeout: Duration) -> RunSummary {
        self.trigger.trigger();
        let joined = within("the agent", timeout, self.task).await;
        ok("the agent", ok("the agent's task", joined))
    }
}

/// The collector started in-process (its listeners on the configured, usually port-0,
/// addresses); derefs to [`uctel_collector::Running`] for addresses, ledger and metrics.
#[derive(Debug)]
pub struct RunningCollector {
    running: uctel_collector::Running,
}

impl RunningCollector {
    /// Starts the collector on `config`.
    ///
    /// # Panics
    /// If it cannot start, with the error's text.
    pub async fn start(config: uctel_collector::config::Config) -> RunningCollector {
        let running = ok(
            "the collector's start",
            uctel_collector::start(config).await,
        );
        RunningCollector { running }
    }

    /// Shuts the collector down (Goodbye to every agent, every task ended).
    ///
    /// # Panics
    /// If it does not stop within [`STOP_TIMEOUT`] or a task failed, with the error's text.
    pub async fn stop(self) {
        ok(
            "the collector",
            within("the collector", STOP_TIMEOUT, self.running.stop()).await,
        );
    }

    /// The collector itself, for a test that drives its stop on its own terms.
    pub fn into_inner(self) -> uctel_collector::Running {
        self.running
    }
}

impl Deref for RunningCollector {
    type Target = uctel_collector::Running;
    fn deref(&self) -> &uctel_collector::Running {
        &self.running
    }
}
