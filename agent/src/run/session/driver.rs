//! The async driver of a [`Session`]: starts it from a welcomed connection, waits for the
//! next event and hands it to one method of the session, sends what the session asks to
//! send, runs the pool's probes and a planned move's handshake beside it ([`Moves`]), and
//! closes the session when it ends.

#[allow(clippy::wildcard_imports)]
use super::*;

/// Runs one session: the handshake (unless a planned move brought it `ready`), the send
/// loop until the session ends, then its close.
///
/// # Errors
/// [`SessionError`] for a failed connection or handshake, or an unusable `Welcome`
/// (`welcomed` is then false unless the collector welcomed the agent first).
#[allow(clippy::too_many_arguments)]
pub(in crate::run) async fn session(
    config: &AgentConfig,
    token: &[u8],
    queues: &Queues,
    stats: &Arc<SelfMetrics>,
    attempt: Attempt,
    ready: Option<Box<Established>>,
    welcomed: &mut bool,
    connector: &mut Connector,
    shutdown: &Shutdown,
) -> Result<(SessionEnd, FinalSequences), SessionError> {
    let announce = connector
        .demand
        .announce(config.collector.expected_frames_per_second);
    let est = match ready {
        Some(ready) => *ready,
        None => establish(config, token, attempt.addr, attempt.epoch, announce).await?,
    };
    let mut conn = est.conn;
    let mut session = start(
        config,
        stats,
        attempt,
        est.plane,
        est.rc_plane,
        &est.welcome,
        &est.sender_config,
        welcomed,
        connector,
    )?;
    let mut moves = Moves::new(config, token, attempt);
    let end = drive(
        &mut session,
        &mut conn,
        &mut moves,
        queues,
        connector,
        shutdown,
    )
    .await;
    drop(moves);
    Ok(session.close(end, &mut conn, queues).await)
}

/// Starts the session of a welcomed connection: the UC lane and, when configured, the RC
/// lane; the pool and the demand meter told; the connection logged.
#[allow(clippy::too_many_arguments)]
fn start(
    config: &AgentConfig,
    stats: &Arc<SelfMetrics>,
    attempt: Attempt,
    plane: DataPlane,
    rc_plane: Option<DataPlane>,
    welcome: &Welcome,
    sender_config: &SenderConfig,
    welcomed: &mut bool,
    connector: &mut Connector,
) -> Result<Session, SessionError> {
    let Attempt {
        addr: collector,
        epoch,
        previous_sessions,
    } = attempt;
    let rc = Lane::start_rc(rc_plane, welcome, sender_config, config, epoch, stats)?;
    *welcomed = true;
    connector.welcomed(collector);
    connector.demand.start_session(Instant::now());
    let mut core = SenderCore::new(sender_config, epoch, Instant::now(), stats.clone())
        .map_err(|e| SessionError::Welcome(e.to_string()))?;
    if let Some(g) = welcome.credit_grant {
        core.on_grant(g);
    }
    let credit = welcome
        .credit_writes
        .map(|_| CreditReader::new(plane.credit_mr().clone(), epoch));
    let uc = Lane::new(Reliability::Uc, plane, core, sender_config.credit_window);
    let mut lanes = Lanes::new(uc, rc);
    // The series dictionary when both sides announced it (`Hello.features`,
    // `Welcome.features`); the lane carrying the metrics stream uses it.
    let dictionary = config.streams.series_dictionary()
        && welcome.features & uctel_protocol::control::FEATURE_SERIES_DICTIONARY != 0;
    if dictionary {
        for lane in lanes.iter_mut() {
            lane.core.use_series_dictionary();
        }
    }
    stats.set_connected(true);
    if previous_sessions > 0 {
        stats.reconnected();
    }
    tracing::info!(
        epoch = format_args!("{epoch:#x}"),
        collector = %collector,
        slots = welcome.slots,
        credit_window = sender_config.credit_window,
        max_frame_bytes = sender_config.limits.max_frame_bytes,
        rc_slots = welcome.rc_lane.as_ref().filter(|_| lanes.rc().is_some()).map(|l| l.slots),
        rc_credit_window = lanes.rc().map(|l| l.credit_window),
        series_dictionary = dictionary,
        announced_frames_per_second = connector.demand.announce(config.collector.expected_frames_per_second),
        "connected to the collector"
    );
    // Heartbeats at the collector's period; the collector is dead after
    // max(3 heartbeats, heartbeat_timeout_seconds) of silence (the dead-peer rule of
    // `uctel_protocol::session::liveness`).
    let timing = Timing {
        heartbeat_every: sender_config
            .idle_heartbeat
            .unwrap_or(Duration::from_secs(5)),
        heartbeat_timeout: seconds(config.collector.heartbeat_timeout_seconds),
        report_interval: Duration::from_millis(u64::from(welcome.report_interval_ms)),
    };
    let mut session = Session::new(
        epoch,
        collector,
        lanes,
        timing,
        stats.clone(),
        Instant::now(),
    );
    session.set_credit_reader(credit);
    Ok(session)
}

/// Sends `msg` on the control connection within [`CONTROL_SEND_TIMEOUT`] (a collector that
/// stops reading must not stall the sender).
///
/// # Errors
/// [`SessionEnd::Lost`] on the control connection when it broke or stopped taking data.
async fn send(conn: &mut ControlConn, msg: Heartbeat) -> Result<(), SessionEnd> {
    match tokio::time::timeout(CONTROL_SEND_TIMEOUT, conn.send(msg)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(SessionEnd::Lost(e.to_string(), LostOn::Control)),
        Err(_) => Err(SessionEnd::Lost(
            "the collector stopped reading the control connection".into(),
            LostOn::Control,
        )),
    }
}

/// Waits for the session's next event and hands it to the session, until it ends.
async fn drive(
    session: &mut Session,
    conn: &mut ControlConn,
    moves: &mut Moves<'_>,
    queues: &Queues,
    connector: &mut Connector,
    shutdown: &Shutdown,
) -> SessionEnd {
    let mut sd = shutdown.clone();
    loop {
        let heartbeat = match session.on_wake(queues, &mut connector.demand) {
            Ok(hb) => hb,
            Err(end) => return end,
        };
        if let Some(hb) = heartbeat {
            if let Err(end) = send(conn, hb).await {
                return end;
            }
        }
        let deadline = session.next_wake(Instant::now());
        let outcome: Result<(), SessionEnd> = tokio::select! {
            () = sleep_until(deadline) => Ok(()),
            () = queues.metrics.notified() => Ok(()),
            () = queues.logs.notified() => Ok(()),
            msg = conn.recv() => session.on_control(Instant::now(), msg, &mut connector.demand),
            () = sleep_until(session.liveness_due()) => match session.on_liveness(Instant::now()) {
                Ok(Some(hb)) => send(conn, hb).await,
                Ok(None) => Ok(()),
                Err(end) => Err(end),
            },
            res = handed_over(&mut moves.handover), if moves.handover.is_some() => {
                moves.on_handover(res, connector)
            }
            _ = moves.probe_tick.tick() => moves.on_probe_tick(connector),
            () = sd.wait() => Err(SessionEnd::Shutdown),
        };
        if let Err(end) = outcome {
            return end;
        }
    }
}

/// The result of a planned move's handshake, when one runs; never otherwise.
async fn handed_over(
    handover: &mut Option<(SocketAddr, Handover<'_>)>,
) -> Result<Established, SessionError> {
    match handover.as_mut() {
        Some((_, h)) => h.await,
        None => std::future::pending().await,
    }
}

/// The pool's work beside a session: probes of the collectors ranked above this one (none
/// at the first choice), the periodic re-resolution of the pool's names, and a planned
/// move's handshake with the collector moved to, while this session sends.
pub(in crate::run) struct Moves<'a> {
    config: &'a AgentConfig,
    token: &'a [u8],
    collector: SocketAddr,
    epoch: u64,
    return_after: Duration,
    connect_timeout: Duration,
    probe_tick: tokio::time::Interval,
    probes: Option<tokio::task::JoinHandle<()>>,
    handover: Option<(SocketAddr, Handover<'a>)>,
}

impl<'a> Moves<'a> {
    fn new(config: &'a AgentConfig, token: &'a [u8], attempt: Attempt) -> Moves<'a> {
        let Attempt {
            addr: collector,
            epoch,
            ..
        } = attempt;
        let probe_every = seconds(config.collector.probe_interval_seconds);
        // The first probe at a random phase of the interval: agents that connected together
        // do not probe, and so do not move, in step (`pool` module docs).
        let mut probe_tick = tokio::time::interval_at(
            tokio::time::Instant::now() + probe_every.mul_f64(rand::random::<f64>()),
            probe_every,
        );
        probe_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Moves {
            config,
            token,
            collector,
            epoch,
            return_after: seconds(config.collector.return_after_seconds),
            connect_timeout: seconds(config.collector.connect_timeout_seconds),
            probe_tick,
            probes: None,
            handover: None,
        }
    }

    /// A probe tick: a collector ranked higher that has been healthy long enough (or this
    /// one left the pool) starts a planned move, beside the session where the transport
    /// can hold two sessions, else at once ([`SessionEnd::Rebalance`] without a session);
    /// the probes run again unless they still run.
    fn on_probe_tick(&mut self, connector: &mut Connector) -> Result<(), SessionEnd> {
        let to = self
            .handover
            .is_none()
            .then(|| {
                lock_pool(&connector.pool).return_to(
                    self.collector,
                    self.return_after,
                    Instant::now(),
                )
            })
            .flatten();
        if let Some(to) = to {
            if !can_hand_over(self.config) {
                return Err(SessionEnd::Rebalance { to, ready: None });
            }
            let announce = connector
                .demand
                .announce(self.config.collector.expected_frames_per_second);
            let handshake = establish(self.config, self.token, to, rand::random(), announce);
            self.handover = Some((to, Box::pin(handshake)));
        }
        if self
            .probes
            .as_ref()
            .is_none_or(tokio::task::JoinHandle::is_finished)
        {
            self.probes = Some(tokio::spawn(pool::refresh(
                connector.pool.clone(),
                connector.targets.clone(),
                connector.resolve_every,
                self.collector,
                self.connect_timeout,
            )));
        }
        Ok(())
    }

    /// The planned move's handshake returned: the session ends to move to the welcoming
    /// collector ([`SessionEnd::Rebalance`] with its session); refused or unreachable, this
    /// session and its epoch go on.
    fn on_handover(
        &mut self,
        res: Result<Established, SessionError>,
        connector: &mut Connector,
    ) -> Result<(), SessionEnd> {
        let Some((to, _)) = self.handover.take() else {
            return Ok(());
        };
        match res {
            Ok(ready) => Err(SessionEnd::Rebalance {
                to,
                ready: Some(Box::new(ready)),
            }),
            Err(e) => {
                if let SessionError::Control(ControlError::Refused { reason, .. }) = &e {
                    connector.metrics.refused(*reason);
                }
                lock_pool(&connector.pool).failed(to);
                let epoch = self.epoch;
                tracing::warn!(epoch = format_args!("{epoch:#x}"), collector = %self.collector, to = %to, error = %e, "moving to another collector of the pool failed; staying on this one with the same epoch");
                Ok(())
            }
        }
    }
}

impl Drop for Moves<'_> {
    fn drop(&mut self) {
        if let Some(p) = self.probes.take() {
            p.abort();
        }
    }
}
