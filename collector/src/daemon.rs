//! Starting and stopping the collector: binds the listeners, wires telemetry, the series
//! store, the log sink and the `/metrics` server, and shuts everything down on a
//! [`Shutdown`].

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use uctel_common::shutdown::{self, Shutdown, ShutdownTrigger};

use uctel_transport::api::Device;
use uctel_transport::device::{DeviceConfig, VerbsConfig};

use crate::config::{Config, TransportKindConfig};
use crate::control::Auth;
use crate::dataplane::DataPlane;
use crate::ingest::{DeliveredLogs, StreamLedger};
use crate::logsink::LogSink;
use crate::outputs::Outputs;
use crate::reload::ReloadSource;
use crate::shared::Ledger;
pub use crate::shared::Shared;
use crate::store::SeriesStore;
use crate::telemetry::Telemetry;

/// Why the collector could not start or stopped with an error.
///
/// Each message is complete on its own (it names the configuration key and value it is
/// about, and ends with the cause's text), so a binary prints it once with `{}`; the cause
/// is also kept as [`std::error::Error::source`] for programs.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A listener could not be bound.
    #[error("{key} {addr}: cannot listen: {source}")]
    Bind {
        /// The configuration key: `listen.control` or `listen.metrics`.
        key: &'static str,
        /// The configured address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The log sink's file could not be opened (`logs.file.path`).
    #[error("logs.file.path {path:?}: cannot open: {source}")]
    LogSink {
        /// The configured path.
        path: std::path::PathBuf,
        /// The OS error, or [`crate::logsink::check_path`]'s.
        source: std::io::Error,
    },
    /// Registering metrics failed (a programming error, reported instead of panicking).
    #[error("metrics registry: {0}")]
    Metrics(#[from] prometheus::Error),
    /// The transport device could not be opened.
    #[error(
        "{key} {value}: cannot open the {kind} transport: {}",
        open_reason(source)
    )]
    Transport {
        /// `soft` or `verbs`.
        kind: &'static str,
        /// The configuration key the failure is about: `transport.soft.bind`,
        /// `transport.verbs.device`, or `transport.kind` when the transport is not built in.
        key: &'static str,
        /// Its value (an address, a device name).
        value: String,
        /// The transport's error.
        source: uctel_transport::api::OpenError,
    },
    /// A token could not be resolved.
    #[error("auth: {0}")]
    Auth(String),
    /// An output (`outputs.*`) could not be set up.
    #[error("{0}")]
    Output(#[from] crate::outputs::http::SetupError),
    /// The data-plane threads could not be started.
    #[error("cannot start the data-plane threads: {0}")]
    Threads(#[source] std::io::Error),
    /// A background task panicked.
    #[error("collector task failed: {0}")]
    Task(String),
}

/// The cause of an [`OpenError`](uctel_transport::api::OpenError) without the device name
/// the [`RunError::Transport`] message already carries as the configured value.
fn open_reason(e: &uctel_transport::api::OpenError) -> String {
    match e {
        uctel_transport::api::OpenError::Io { source, .. } => source.to_string(),
        other => other.to_string(),
    }
}

/// A started collector. Dropping it without [`Running::run_until`] stops it too (its
/// internal trigger is dropped).
#[derive(Debug)]
pub struct Running {
    shared: Shared,
    metrics_addr: SocketAddr,
    control_addr: SocketAddr,
    trigger: ShutdownTrigger,
    drain: crate::control::Drain,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    reload: Option<uctel_common::reload::ReloadFn>,
    log_level: uctel_common::logging::LogLevel,
}

impl Running {
    /// The bound `/metrics` address (the real port when configured with port 0).
    pub fn metrics_addr(&self) -> SocketAddr {
        self.metrics_addr
    }

    /// The bound control-plane address.
    pub fn control_addr(&self) -> SocketAddr {
        self.control_addr
    }

    /// Shared state (telemetry, store), for tests and embedding.
    pub fn shared(&self) -> &Shared {
        &self.shared
    }

    /// The UDP address of the soft transport device (for agents on this host); `None` for
    /// verbs.
    pub fn transport_addr(&self) -> Option<SocketAddr> {
        self.shared.plane.device().port_attr().udp_addr
    }

    /// Accounting of every stream of `agent` over its finished connections (settled at
    /// `Goodbye`): `(stream id, ledger)`, sorted by stream id.
    pub fn ledger(&self, agent: &str) -> Vec<(u32, StreamLedger)> {
        let ledger = self
            .shared
            .ledger
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut v: Vec<_> = ledger
            .iter()
            .filter(|((a, _), _)| a == agent)
            .map(|((_, s), l)| (*s, *l))
            .collect();
        v.sort_by_key(|(s, _)| *s);
        v
    }

    /// The `/metrics` text as a scrape would return it.
    ///
    /// # Errors
    /// The encoder rejected a family.
    pub fn render_metrics(&self) -> Result<String, String> {
        self.shared
            .telemetry
            .render()
            .map(|b| String::from_utf8_lossy(&b).into_owned())
    }

    /// Test hook: pause (true) or resume (false) the data-plane worker while the completion
    /// worker keeps polling, so an agent that ignores credits laps the ring. Returns once
    /// the worker has applied it. Not for production use.
    pub fn pause_worker(&self, paused: bool) {
        self.shared.plane.pause_worker(paused);
    }

    /// The drain (`crate::control` module docs): [`Drain::start`](crate::control::Drain::start)
    /// begins it (what `SIGUSR1` and `POST /-/drain` do); [`Running::run_until`] returns once
    /// it is over.
    pub fn drain(&self) -> crate::control::Drain {
        self.drain.clone()
    }

    /// The configuration reload (`crate::reload`), when started with a
    /// [`ReloadSource`]: what `SIGHUP` and `POST /-/reload` run.
    pub fn reload(&self) -> Option<uctel_common::reload::ReloadFn> {
        self.reload.clone()
    }

    /// The log filter (`/api/v1/log_level`).
    pub fn log_level(&self) -> &uctel_common::logging::LogLevel {
        &self.log_level
    }

    /// Runs until `shutdown` fires or a drain is over, then stops every task and waits for
    /// them.
    ///
    /// # Errors
    /// [`RunError::Task`] if a task panicked.
    pub async fn run_until(self, mut shutdown: Shutdown) -> Result<(), RunError> {
        let drain = self.drain.clone();
        tokio::select! {
            () = shutdown.wait() => {}
            () = drain.done() => tracing::info!("drain complete; stopping"),
        }
        self.stop().await
    }

    /// Stops every task and waits for them.
    ///
    /// # Errors
    /// [`RunError::Task`] if a task panicked.
    pub async fn stop(self) -> Result<(), RunError> {
        self.trigger.trigger();
        let mut result = Ok(());
        for t in self.tasks {
            if let Err(e) = t.await {
                result = Err(RunError::Task(e.to_string()));
            }
        }
        // Endpoints a reload started or is retiring end with the shutdown too.
        self.shared.outputs.join().await;
        let plane = self.shared.plane.clone();
        let _ = tokio::task::spawn_blocking(move || plane.stop()).await;
        // Records the worker queued after the senders stopped are counted, not lost.
        self.shared.outputs.close();
        result
    }
}

/// Binds every listener and starts the tasks. Port 0 in `listen.*` picks free ports (read
/// them from [`Running`]). No reload: [`start_with`] a [`ReloadSource`] for one.
///
/// # Errors
/// [`RunError`]: a bind, log sink or registry failure.
pub async fn start(config: Config) -> Result<Running, RunError> {
    start_with(config, None).await
}

/// [`start`], and reloads of the configuration from `reload` (`SIGHUP` through
/// [`Running::reload`], `POST /-/reload`).
///
/// # Errors
/// As [`start`].
pub async fn start_with(config: Config, reload: Option<ReloadSource>) -> Result<Running, RunError> {
    let telemetry = Telemetry::new()?;
    let store = SeriesStore::new(
        config.staleness_seconds.duration(),
        config.series_cap_per_agent.0,
    )
    .with_timestamps(config.metrics.expose_timestamps);
    telemetry.registry().register(Box::new(store.collector()))?;
    let logs = Arc::new(
        LogSink::open(&config.logs).map_err(|source| RunError::LogSink {
            path: config.logs.file.path.clone(),
            source,
        })?,
    );
    let auth = Arc::new(Auth::from_config(&config).map_err(RunError::Auth)?);
    let device = open_device(&config)?;
    let plane = Arc::new(
        DataPlane::start(
            device,
            config.ring.descriptor_queue as usize,
            telemetry.clone(),
        )
        .map_err(RunError::Threads)?,
    );
    let metrics_listener = uctel_common::http::bind(config.listen.metrics)
        .await
        .map_err(|source| RunError::Bind {
            key: "listen.metrics",
            addr: config.listen.metrics,
            source,
        })?;
    let control_listener = tokio::net::TcpListener::bind(config.listen.control)
        .await
        .map_err(|source| RunError::Bind {
            key: "listen.control",
            addr: config.listen.control,
            source,
        })?;
    let local = |l: &tokio::net::TcpListener, key, addr| {
        l.local_addr()
            .map_err(|source| RunError::Bind { key, addr, source })
    };
    let metrics_addr = local(&metrics_listener, "listen.metrics", config.listen.metrics)?;
    let control_addr = local(&control_listener, "listen.control", config.listen.control)?;
    let (trigger, sd) = shutdown::channel();
    // The control plane's dead-peer time: a stall of this process longer than it means
    // its agents moved (remote-write `stall` module).
    let dead_peer = Duration::try_from_secs_f64(
        config.control.heartbeat_interval_seconds
            * f64::from(config.control.dead_after_missed_heartbeats),
    )
    .unwrap_or(Duration::MAX);
    let outputs = Outputs::start(&config, store, logs, &telemetry, dead_peer, &sd)
        .map_err(RunError::Output)?;
    let credits = Arc::new(crate::credits::CreditBudget::new(credit_budget(
        &config,
        plane.device(),
    )));
    telemetry
        .registry()
        .register(Box::new(crate::credits::BudgetCollector::new(
            credits.clone(),
        )))?;
    let shared = Shared {
        limits: Arc::new(crate::shared::LiveLimits::new(&config)),
        credits,
        config: Arc::new(config),
        telemetry,
        outputs: outputs.outputs,
        plane,
        ledger: Ledger::default(),
        delivered: DeliveredLogs::default(),
        drain: shutdown::channel().0,
        sessions: crate::status::Board::default(),
    };
    let (drained, drain) = crate::control::drain_channel(shared.drain.clone());
    let render_telemetry = shared.telemetry.clone();
    let render: uctel_common::http::RenderFn = Arc::new(move || render_telemetry.render());
    // The transport device is open and the control listener bound before anything is
    // served; ready until the control plane stops serving (shutdown).
    let control_up = Arc::new(AtomicBool::new(true));
    let up = control_up.clone();
    let draining = shared.drain.subscribe();
    let mut endpoints =
        uctel_common::http::Endpoints::new("uctel-collector", env!("CARGO_PKG_VERSION"), render)
            .ready(Arc::new(move || {
                if draining.is_triggered() {
                    Err("draining: agents are moving to other collectors".into())
                } else if up.load(Ordering::Acquire) {
                    Ok(())
                } else {
                    Err("the control plane is not serving".into())
                }
            }));
    let (admin, reload, log_level) = admin(&shared, reload)?;
    endpoints = endpoints.admin(admin);
    let status = crate::status::Status::new(
        shared.sessions.clone(),
        shared.telemetry.clone(),
        shared.credits.clone(),
        shared.drain.subscribe(),
    );
    let serve_status = status.clone();
    endpoints = endpoints.status(Arc::new(move || serve_status.json()));
    if shared.config.listen.enable_lifecycle {
        let d = drain.clone();
        endpoints = endpoints.lifecycle(Arc::new(move || {
            tracing::info!("drain requested on POST /-/drain");
            d.start();
            "draining: new agents are refused and connected agents move to their next \
             collector; the collector stops when none is left\n"
                .to_owned()
        }));
    }
    let mut tasks = vec![tokio::spawn(uctel_common::http::serve(
        metrics_listener,
        endpoints,
        sd.clone(),
    ))];
    tasks.push(tokio::spawn(crate::status::sample_loop(status, sd.clone())));
    tasks.push(tokio::spawn(expire_loop(
        shared.outputs.store.clone(),
        shared.telemetry.clone(),
        shared.config.metrics.agent_up_retention_seconds.duration(),
        sd.clone(),
    )));
    tasks.push(tokio::spawn(crate::telemetry::live_loss::live_loss_loop(
        shared.telemetry.clone(),
        sd.clone(),
    )));
    tasks.extend(outputs.tasks);
    let control = crate::control::serve(control_listener, shared.clone(), auth, sd, drained);
    tasks.push(tokio::spawn(async move {
        control.await;
        control_up.store(false, Ordering::Release);
    }));
    Ok(Running {
        shared,
        metrics_addr,
        control_addr,
        trigger,
        drain,
        tasks,
        reload,
        log_level,
    })
}

/// The reload and log-filter endpoints (`uctel_common::admin`), the reload, and the log
/// filter: the installed subscriber's, or a detached one for a collector inside another
/// program, whose base then follows the configuration.
fn admin(
    shared: &Shared,
    source: Option<ReloadSource>,
) -> Result<
    (
        uctel_common::admin::Admin,
        Option<uctel_common::reload::ReloadFn>,
        uctel_common::logging::LogLevel,
    ),
    RunError,
> {
    let level = uctel_common::logging::LogLevel::installed_or_detached();
    let mut admin = uctel_common::admin::Admin::new(shared.config.listen.enable_lifecycle)
        .log_level(level.clone());
    let Some(source) = source else {
        return Ok((admin, None, level));
    };
    let reload = crate::reload::reloader(
        &shared.config,
        source,
        level.clone(),
        &shared.telemetry,
        shared.outputs.clone(),
        shared.limits.clone(),
    )?;
    admin = admin.reload(reload.clone());
    Ok((admin, Some(reload), level))
}

/// Opens the configured transport device.
/// The collector-wide credit budget in frames (`ring.credit_budget_frames`, DESIGN.md §4):
/// as configured; else on the soft transport what the UDP socket's granted receive buffer
/// holds of full-size packets (measured on a loopback socket of the same size); else no
/// shared limit.
fn credit_budget(config: &Config, device: &Device) -> u64 {
    if let Some(frames) = config.ring.credit_budget_frames {
        tracing::info!(frames, "credit budget as configured");
        return frames;
    }
    let port = device.port_attr();
    let Some(buffer) = port.recv_buffer_bytes else {
        return u64::MAX / 4;
    };
    // A frame of max_frame_bytes in packets of the path MTU, each with the RoCEv2 headers
    // of a WRITE_WITH_IMM (BTH 12 + RETH 16 + ImmDt 4) and the ICRC (4).
    let mtu = port.active_mtu.max(256) as usize;
    let frame = config.max_frame_bytes.0 as usize;
    let packets_per_frame = frame.div_ceil(mtu).max(1) as u64;
    let datagram = frame.min(mtu) + 36;
    match uctel_transport::soft::capacity::receive_capacity(buffer, datagram) {
        Ok(c) => {
            let frames = (c.datagrams / packets_per_frame).max(1);
            tracing::info!(
                frames,
                receive_buffer_bytes = buffer,
                datagram_bytes = datagram,
                datagrams = c.datagrams,
                "credit budget: what the soft transport's receive buffer holds"
            );
            frames
        }
        Err(e) => {
            // Without a measurement, the payload alone (an upper bound) halved.
            let frames = ((buffer / datagram) as u64 / packets_per_frame / 2).max(1);
            tracing::warn!(error = %e, frames, "could not measure the receive buffer; credit budget estimated");
            frames
        }
    }
}

fn open_device(config: &Config) -> Result<Device, RunError> {
    let (kind, device_config) = match config.transport.kind {
        TransportKindConfig::Soft => ("soft", DeviceConfig::Soft(config.transport.soft.clone())),
        TransportKindConfig::Verbs => {
            let v = &config.transport.verbs;
            (
                "verbs",
                DeviceConfig::Verbs(VerbsConfig {
                    device: v.device.clone(),
                    port_num: v.port,
                    gid_index: v.gid_index,
                    local_ip: v.local_ip,
                }),
            )
        }
    };
    Device::open(&device_config).map_err(|source| {
        let (key, value) = match (&source, config.transport.kind) {
            (uctel_transport::api::OpenError::Unsupported { .. }, _) => {
                ("transport.kind", kind.to_owned())
            }
            (_, TransportKindConfig::Soft) => (
                "transport.soft.bind",
                config.transport.soft.udp.bind.to_string(),
            ),
            (_, TransportKindConfig::Verbs) => (
                "transport.verbs.device",
                config
                    .transport
                    .verbs
                    .device
                    .clone()
                    .unwrap_or_else(|| "(the first device)".to_owned()),
            ),
        };
        RunError::Transport {
            kind,
            key,
            value,
            source,
        }
    })
}

/// Starts the collector and runs it until `shutdown` fires (the mini-redis shape:
/// `run(config, shutdown)`).
///
/// # Errors
/// See [`start`] and [`Running::run_until`].
pub async fn run(config: Config, shutdown: Shutdown) -> Result<(), RunError> {
    start(config).await?.run_until(shutdown).await
}

/// Expires stale series every few seconds even when nobody scrapes, so memory is bounded by
/// what was fresh recently, and forgets `agent_up` of agents gone for `agent_up_retention`.
async fn expire_loop(
    store: SeriesStore,
    telemetry: Telemetry,
    agent_up_retention: Duration,
    mut shutdown: Shutdown,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let now = std::time::Instant::now();
                store.expire(now);
                telemetry.agent_up().expire(now, agent_up_retention);
            }
            _ = shutdown.wait() => return,
        }
    }
}
