//! One agent's session after its handshake: creates its lanes (QP and ring each), answers
//! `Welcome`, then heartbeats (driving `uctel_protocol::session::Liveness`), reports every
//! report interval, and settles the connection's accounting when it ends.
//!
//! The rules live in the sans-IO [`SessionState`] (`super::state`); this module is its
//! driver, [`Driver`], which waits for the next event and calls one method per event
//! ([`Driver::on_control`], [`Driver::on_liveness`], [`Driver::on_report`],
//! [`Driver::on_drain`]), then [`Driver::close`] (the model: quinn's `ConnectionDriver`).
//! The lanes are one list ([`Lanes`]: UC first, RC when the agent asked for one).
//!
//! Every session's end is counted in `sessions_ended_total{reason}`: `goodbye` (tail loss
//! exact), `no_goodbye` (settled from the agent's last heartbeat, which carries the
//! sequences sent by then: only what was sent after it is unknown), `replaced`, `shutdown`.
//!
//! `uctel_collector_agent_up{agent}` is 1 from the `Welcome` on. When the session has ended
//! and the registry holds no newer connection of the agent (one that replaced this session
//! keeps the agent up), the connection task marks the agent down and removes its series
//! from the store at once (`agent_gone` in `crate::control`, `crate::liveness`).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpStream;
use uctel_common::control::{ChannelError, ControlChannel};
use uctel_common::shutdown::Shutdown;
use uctel_protocol::control::{
    Body, ControlMessage, CreditWrites, DataPath, Goodbye, GoodbyeReason, Heartbeat, Hello,
    RefuseReason, Welcome,
};
use uctel_protocol::limits::Limits;
use uctel_protocol::session::Refusal;
use uctel_protocol::stream::StreamName;
use uctel_protocol::tracker::TrackerConfig;
use uctel_transport::api::QpEndpoint;

use super::credit_batch::CreditBatch;
use super::credit_write::CreditWriter;
use super::handshake::{
    advertised_endpoint, agent_endpoint, agent_qp_endpoint, collector_transport, Accepted,
};
use super::lane::{Lane, Lanes};
use super::registry::{lock, Registry, SessionLink};
use super::state::{Closing, Early, Ending, Flow, Heard, SessionState, Timing, UNEXPECTED};
use super::{refuse, send_within, sleep_until, GOODBYE_DRAIN, GOODBYE_WAIT};
use crate::config::Config;
use crate::credits::ConnLimits;
use crate::dataplane::{Geometry, Session};
use crate::ingest::{CloseSummary, ConnectionIngest, DictAckOutbox, StreamLedger};
use crate::shared::Shared;
use crate::status::SessionView;
use crate::telemetry::AgentTelemetry;
use uctel_protocol::control::FEATURE_SERIES_DICTIONARY;

/// What a session needs from its [`Registry`] entry.
#[derive(Debug)]
pub(super) struct Live {
    /// Fires when a newer connection of the agent replaces this one.
    pub(super) cancel: Shutdown,
    /// Liveness and the replacement's reason, shared with the replacing connection.
    pub(super) link: Arc<SessionLink>,
    /// The registry (the agent's last epoch).
    pub(super) registry: Arc<Registry>,
}

fn millis(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX).max(1)
}

/// Longest time spent reading what an agent sent before a send to it failed.
const GOODBYE_LINGER: Duration = Duration::from_millis(200);

/// The `Goodbye` among the messages still readable on `ch` (heartbeats before it are
/// skipped, but the agent counters they carry are counted in `tel`), read for at most
/// `limit`; `None` at the end of the stream, on an error, or when none came in time. A send
/// that fails because the agent closed its end after its `Goodbye` must not turn a clean
/// goodbye into a vanished agent.
async fn unread_goodbye(
    ch: &mut ControlChannel<TcpStream>,
    limit: Duration,
    tel: &AgentTelemetry,
) -> Option<Goodbye> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, ch.recv()).await {
            Ok(Ok(Some(m))) => match m.body {
                Some(Body::Goodbye(g)) => return Some(g),
                Some(Body::Heartbeat(Heartbeat {
                    agent_counters: Some(c),
                    ..
                })) => tel.agent_counters(&c),
                _ => {}
            },
            _ => return None,
        }
    }
}

/// Runs the session of the agent `accepted` on `ch` (from `peer`, reaching us on
/// `local_ip`) until it ends: the agent's `Goodbye`, a dead or broken connection, a QP in
/// ERROR, a replacement (`live.cancel`) or the collector's shutdown (`global`).
pub(super) async fn run_session(
    ch: &mut ControlChannel<TcpStream>,
    shared: &Shared,
    peer: SocketAddr,
    local_ip: IpAddr,
    accepted: Accepted,
    live: Live,
    global: Shutdown,
) {
    let Live {
        cancel,
        link,
        registry,
    } = live;
    let agent = accepted.hello.agent_id.clone();
    let tel = shared.telemetry.agent(&agent);
    let (lanes, geometry, dict_acks) =
        match open_lanes(shared, peer, &accepted, &registry, &tel).await {
            Ok(opened) => opened,
            Err(r) => return refuse(ch, shared, peer, r).await,
        };
    let timing = timing(&shared.config);
    let id = lanes.uc().id;
    let hello = &accepted.hello;
    let first_grant = shared
        .credits
        .join(id, conn_limits(hello, geometry, timing));
    let welcome = Welcome {
        qp: Some(advertised_endpoint(
            lanes.uc().session.local_endpoint(),
            local_ip,
        )),
        ring_addr: lanes.uc().session.ring.addr(),
        rkey: lanes.uc().session.ring.rkey(),
        slots: geometry.slots,
        slot_bytes: geometry.slot_bytes,
        max_frame_bytes: geometry.max_frame_bytes,
        credit_window: geometry.credit_window,
        heartbeat_interval_ms: millis(timing.heartbeat),
        report_interval_ms: millis(timing.report_every),
        data_path: accepted.data_path as i32,
        credit_grant: Some(first_grant),
        rc_lane: lanes.welcome_rc(local_ip),
        credit_writes: None,
        features: if dict_acks.is_some() {
            FEATURE_SERIES_DICTIONARY
        } else {
            0
        },
    };
    let batch = Arc::clone(&registry.credit_batch);
    let (welcome, credit) = offer_credit_writes(shared, hello, &lanes, first_grant, welcome, batch);
    if let Err(e) = ch.send(welcome).await {
        tracing::warn!(agent = %agent, error = %e, "sending Welcome failed");
        shared.credits.leave(id);
        let _ = lanes.close(&shared.plane, None).await;
        return;
    }
    shared.telemetry.agents_connected().inc();
    shared.telemetry.agent_up().up(&agent);
    shared
        .sessions
        .connected(&agent, session_view(id, peer, &accepted, &lanes));
    tracing::info!(
        agent = %agent,
        hostname = %hello.hostname,
        peer = %peer,
        epoch = format_args!("{:#x}", hello.epoch),
        data_path = ?accepted.data_path,
        qpn = lanes.uc().session.qp.qp_num(),
        rc_qpn = lanes.rc().map(|l| l.session.qp.qp_num()),
        queues = %lanes.uc().session.queue_mode().as_str(),
        "agent connected"
    );
    let now = Instant::now();
    // On the group's phase of the collector-wide grid (`cadence`); a late tick is skipped
    // rather than moving the session off the grid.
    let first_report = registry.reports.first_tick(id, timing.report_every, now);
    let mut report_tick = tokio::time::interval_at(
        tokio::time::Instant::from_std(first_report),
        timing.report_every.max(Duration::from_millis(1)),
    );
    report_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut driver = Driver {
        ch,
        shared,
        agent,
        tel,
        lanes,
        dict_acks,
        state: SessionState::new(timing, link.clone(), now),
        credit,
    };
    let mut events = Events {
        cancel,
        global,
        drain: shared.drain.subscribe(),
        report_tick,
    };
    let ending = driver.run(&mut events).await;
    driver.close(ending, &link, peer, hello).await;
}

/// The session as the status API shows it (`crate::status::Board`).
fn session_view(id: u32, peer: SocketAddr, accepted: &Accepted, lanes: &Lanes) -> SessionView {
    SessionView {
        conn_id: id,
        peer,
        hostname: accepted.hello.hostname.clone(),
        epoch: accepted.hello.epoch,
        data_path: crate::status::board::data_path_name(accepted.data_path),
        lanes: if lanes.rc().is_some() {
            vec!["uc", "rc"]
        } else {
            vec!["uc"]
        },
        since: std::time::SystemTime::now(),
        since_instant: Instant::now(),
    }
}

/// Takes the agent's offer of credit writes (`Hello.credit_mr`, DESIGN.md §4) when
/// `control.credit_writes` allows: `welcome` then says so, and the writer comes back with
/// the number of report intervals per `Report` (1 on a connection with an RC lane, whose
/// credit travels in the `Report`). Its writes go through `batch` when
/// `control.credit_write_batching` is on.
fn offer_credit_writes(
    shared: &Shared,
    hello: &Hello,
    lanes: &Lanes,
    first: uctel_protocol::control::CreditGrant,
    mut welcome: Welcome,
    batch: Arc<CreditBatch>,
) -> (Welcome, Option<Writes>) {
    let cfg = &shared.config.control;
    let writer = hello
        .credit_mr
        .filter(|_| cfg.credit_writes)
        .and_then(|mr| CreditWriter::new(lanes.uc().session.clone(), mr, hello.epoch, first));
    let Some(writer) = writer else {
        return (welcome, None);
    };
    let every = if lanes.rc().is_some() {
        1
    } else {
        cfg.credit_writes_report_every_intervals.max(1)
    };
    welcome.credit_writes = Some(CreditWrites {
        refresh_ms: welcome.report_interval_ms,
        report_every_intervals: every,
    });
    let writes = Writes {
        writer,
        batch: cfg.credit_write_batching.then_some(batch),
        report_every: every,
        ticks: 0,
    };
    (welcome, Some(writes))
}

/// A session's credit writes: the writer and when the next `Report` is due.
#[derive(Debug)]
struct Writes {
    writer: CreditWriter,
    /// The collector's round of writes (`credit_batch`); `None`: each write posted alone.
    batch: Option<Arc<CreditBatch>>,
    /// A `Report` every this many report intervals.
    report_every: u32,
    /// Report intervals since the last `Report`.
    ticks: u32,
}

impl Writes {
    /// Writes the word with `consumed_next`: into the round (counted when it is flushed),
    /// or posted and counted at once.
    fn post(&mut self, consumed_next: u64, credits: &Arc<crate::credits::CreditBudget>) {
        match &self.batch {
            Some(batch) => match self.writer.prepare(consumed_next) {
                Some(w) => batch.submit(w, credits),
                None => credits.count_write(false),
            },
            None => credits.count_write(self.writer.write(consumed_next)),
        }
    }
}

/// Heartbeat and report periods from the configuration (defaults when out of range).
fn timing(cfg: &Config) -> Timing {
    Timing {
        heartbeat: Duration::try_from_secs_f64(cfg.control.heartbeat_interval_seconds)
            .unwrap_or(Duration::from_secs(5)),
        dead_after_missed: cfg.control.dead_after_missed_heartbeats,
        report_every: Duration::try_from_secs_f64(cfg.control.report_interval_seconds)
            .unwrap_or(Duration::from_secs(1)),
    }
}

/// The connection's share of the collector-wide credit budget: its window, and a want that
/// never falls below the frames of one report interval at the rate it announced.
fn conn_limits(hello: &Hello, geometry: Geometry, timing: Timing) -> ConnLimits {
    let floor = hello
        .expected_frames_per_second
        .map_or(u64::from(geometry.credit_window), |r| {
            (f64::from(r) * timing.report_every.as_secs_f64()).ceil() as u64
        });
    ConnLimits {
        window_cap: u64::from(geometry.credit_window),
        floor,
    }
}

/// The ring of each lane, from the rate the agent announced (DESIGN.md §4, rings sized for
/// scale).
fn geometry(cfg: &Config, hello: &Hello, data_path: DataPath) -> Geometry {
    let slots = cfg.ring.slots_for(
        hello.expected_frames_per_second,
        cfg.control.report_interval_seconds,
    );
    Geometry {
        slots,
        slot_bytes: cfg.ring.slot_bytes,
        max_frame_bytes: cfg.max_frame_bytes.0,
        send_buffers: cfg.ring.send_buffers,
        // Send path: never more frames outstanding than posted receive buffers (an empty
        // receive queue drops silently, DESIGN.md §4). The descriptor queue reserves this
        // window for the connection.
        credit_window: match data_path {
            DataPath::Send => cfg.ring.window_of(slots).min(cfg.ring.send_buffers),
            _ => cfg.ring.window_of(slots),
        }
        .max(1),
    }
}

/// The agent's RC QP endpoint and the header stream ids it puts on the RC lane.
type RcRemote = (QpEndpoint, Vec<u32>);

/// The agent's UC QP endpoint, and its RC lane's endpoint and streams when it asked for one;
/// a `protocol_error` refusal when one carries no usable endpoint.
fn remotes(
    hello: &Hello,
    peer: SocketAddr,
    cfg: &Config,
) -> Result<(QpEndpoint, Option<RcRemote>), Refusal> {
    let bad = |what: &str| {
        Refusal::new(
            RefuseReason::ProtocolError,
            &hello.agent_id,
            format!("{what} carries no usable QP endpoint"),
        )
    };
    let transport = collector_transport(cfg);
    let uc = agent_endpoint(hello, peer, transport).ok_or_else(|| bad("Hello"))?;
    let rc = match &hello.rc_lane {
        None => None,
        Some(lane) => {
            let ep = lane
                .qp
                .as_ref()
                .and_then(|qp| agent_qp_endpoint(qp, peer, transport))
                .ok_or_else(|| bad("Hello's rc_lane"))?;
            Some((ep, lane.stream_ids.clone()))
        }
    };
    Ok((uc, rc))
}

/// Creates and connects the lanes of the agent `accepted` (UC, and RC when it asked), each
/// with its own ingest (DESIGN.md §8b: its own connection tracker and the trackers of its
/// streams, delivering into the same outputs), registered with the data plane.
///
/// # Errors
/// The [`Refusal`] to send: `protocol_error` for an unusable endpoint, `busy` when a verb
/// or an ingest could not be created (nothing stays registered then).
async fn open_lanes(
    shared: &Shared,
    peer: SocketAddr,
    accepted: &Accepted,
    registry: &Registry,
    tel: &AgentTelemetry,
) -> Result<(Lanes, Geometry, Option<DictAckOutbox>), Refusal> {
    let cfg = &shared.config;
    let hello = &accepted.hello;
    // The series dictionary when the agent announced it and this collector takes it.
    let dict_acks = (cfg.metrics.series_dictionary
        && hello.features & FEATURE_SERIES_DICTIONARY != 0)
        .then(DictAckOutbox::default);
    let agent = hello.agent_id.as_str();
    let fail = |detail: String| Refusal::new(RefuseReason::Busy, agent, detail);
    let geometry = geometry(cfg, hello, accepted.data_path);
    let (remote, rc_remote) = remotes(hello, peer, cfg)?;
    let id = shared.plane.next_session_id();
    let session = Session::create(
        id,
        agent,
        &shared.plane,
        accepted.data_path,
        geometry,
        tel.clone(),
        None,
    )
    .and_then(|s| s.connect(&remote).map(|()| s))
    .map_err(|e| fail(e.to_string()))?;
    let session = Arc::new(session);
    let previous_epoch = registry.swap_epoch(agent, hello.epoch);
    let lane_ingest = || new_ingest(shared, hello, previous_epoch, tel);
    let mut ingest = lane_ingest().map_err(|e| fail(e.to_string()))?;
    if let Some(outbox) = &dict_acks {
        ingest.set_dict_acks(outbox.clone());
    }
    let rc = match rc_remote {
        None => None,
        Some((remote, streams)) => {
            let mut rc_ingest = lane_ingest().map_err(|e| fail(e.to_string()))?;
            if let Some(outbox) = &dict_acks {
                rc_ingest.set_dict_acks(outbox.clone());
            }
            ingest.set_lane_streams(streams.clone(), false);
            Some((remote, streams, rc_ingest))
        }
    };
    shared.plane.register(session.clone(), ingest);
    let mut lanes = Lanes::new(Lane::uc(id, session));
    if let Some((remote, streams, rc_ingest)) = rc {
        let data_path = accepted.data_path;
        match Lane::open_rc(
            shared,
            agent,
            &remote,
            &streams,
            data_path,
            geometry,
            rc_ingest,
            tel.clone(),
        ) {
            Ok(l) => lanes.push(l),
            Err(e) => {
                let _ = shared.plane.close(id, None).await;
                return Err(fail(format!("the RC lane: {e}")));
            }
        }
    }
    Ok((lanes, geometry, dict_acks))
}

/// One lane's ingest of the agent `hello`, delivering into the collector's outputs (with
/// rate windows of its own for the agent's sample series).
fn new_ingest(
    shared: &Shared,
    hello: &Hello,
    previous_epoch: Option<u64>,
    tel: &AgentTelemetry,
) -> Result<ConnectionIngest, uctel_protocol::tracker::TrackerConfigError> {
    let cfg = &shared.config;
    let limits = Limits {
        max_frame_bytes: cfg.max_frame_bytes.0 as usize,
        ..Limits::default()
    };
    let tracker = TrackerConfig {
        max_dropout: cfg.max_dropout_frames.0,
        reorder_window: cfg.reorder_window_frames.0,
        reorder_time: Some(cfg.reorder_window_seconds.duration()),
    };
    ConnectionIngest::with_delivery(
        &hello.agent_id,
        &hello.hostname,
        hello.epoch,
        limits,
        tracker,
        shared.outputs.for_connection(),
        tel.clone(),
    )
    .map(|mut ingest| {
        ingest.set_previous_epoch(previous_epoch);
        ingest.share_delivered(shared.delivered.clone());
        ingest
    })
}

/// What the driver waits for besides the control connection and the lanes.
#[derive(Debug)]
struct Events {
    /// A newer connection of the agent replaced this one.
    cancel: Shutdown,
    /// The collector shuts down.
    global: Shutdown,
    /// The collector drains.
    drain: Shutdown,
    /// The report interval's ticks.
    report_tick: tokio::time::Interval,
}

/// The IO driver of one session's [`SessionState`] (module docs).
struct Driver<'a> {
    ch: &'a mut ControlChannel<TcpStream>,
    shared: &'a Shared,
    agent: String,
    tel: AgentTelemetry,
    lanes: Lanes,
    /// The series dictionary's acknowledgments to send after each report, when agreed.
    dict_acks: Option<DictAckOutbox>,
    state: SessionState,
    /// Credits written into the agent's memory, when it offered (`credit_write`).
    credit: Option<Writes>,
}

impl Driver<'_> {
    /// Waits for events and handles each until the session ends; `Some` when the collector
    /// ends it.
    async fn run(&mut self, ev: &mut Events) -> Option<Ending> {
        loop {
            let flow = tokio::select! {
                () = ev.drain.wait(), if !self.state.told_to_move() => self.on_drain().await,
                msg = self.ch.recv() => self.on_control(msg),
                () = sleep_until(self.state.liveness_deadline()) => self.on_liveness().await,
                () = sleep_until(self.state.early_due()) => self.on_report(Early::Yes).await,
                _ = ev.report_tick.tick() => self.on_report(Early::No).await,
                lane = self.lanes.any_failed() => Flow::End(Some(lane.failed_ending())),
                _ = ev.cancel.wait() => Flow::End(Some((
                    GoodbyeReason::Reconnect,
                    "replaced by a newer connection of this agent",
                ))),
                _ = ev.global.wait() => Flow::End(Some((
                    GoodbyeReason::Shutdown,
                    "collector shutting down",
                ))),
            };
            if let Flow::End(ending) = flow {
                return ending;
            }
        }
    }

    /// Sends `msg` within the dead-peer time; on failure the session ends (`what`: the
    /// message, for the reason).
    async fn send(&mut self, msg: impl Into<ControlMessage>, what: &str) -> Flow {
        let within = self.state.dead_after();
        if send_within(self.ch, msg, within, &self.agent).await {
            Flow::Go
        } else {
            self.state.on_send_failed(what)
        }
    }

    /// A drain started: the agent is told once to move, then its `Goodbye` is waited for
    /// like any other.
    async fn on_drain(&mut self) -> Flow {
        let bye = self.state.on_drain();
        let flow = self.send(bye, "the drain notice").await;
        if matches!(flow, Flow::Go) {
            tracing::debug!(agent = %self.agent, "told the agent to move (drain)");
        }
        flow
    }

    /// A control message, the end of the connection, or its failure.
    fn on_control(&mut self, msg: Result<Option<ControlMessage>, ChannelError>) -> Flow {
        let m = match msg {
            Ok(Some(m)) => m,
            Ok(None) => {
                return self
                    .state
                    .on_closed("the control connection closed without Goodbye".into())
            }
            Err(e) => {
                return self
                    .state
                    .on_closed(format!("the control connection failed: {e}"))
            }
        };
        match self.state.on_message(m.body, Instant::now()) {
            Heard::Heartbeat(hb) => {
                self.on_heartbeat(hb);
                Flow::Go
            }
            Heard::End(ending) => Flow::End(ending),
            Heard::Unexpected(message) => {
                tracing::warn!(agent = %self.agent, message, "unexpected control message; closing");
                Flow::End(Some(UNEXPECTED))
            }
        }
    }

    /// The agent's heartbeat: its counters, its credit state (the UC lane's share of the
    /// budget; the RC lane has none), and each lane's part to its ingest.
    fn on_heartbeat(&mut self, hb: Heartbeat) {
        if let Some(c) = &hb.agent_counters {
            self.tel.agent_counters(c);
        }
        let starved = hb.frames_without_credit.unwrap_or(0);
        let id = self.lanes.uc().id;
        self.shared
            .credits
            .on_heartbeat(id, hb.credit_grant_applied, hb.sent_conn_seq, starved);
        for (lane, part) in self.lanes.split_heartbeat(hb) {
            self.shared.plane.heartbeat(lane, part);
        }
    }

    /// The liveness deadline: a heartbeat to send, or the agent dead.
    async fn on_liveness(&mut self) -> Flow {
        match self.state.on_liveness(Instant::now()) {
            Ok(Some(beat)) => self.send(beat, "a heartbeat").await,
            Ok(None) => Flow::Go,
            Err(end) => end,
        }
    }

    /// A report is due (`early`: for an agent out of credit): every lane's delivery, with a
    /// new credit grant when the connection's limit changed (DESIGN.md §4). No report (the
    /// connection is closing) is not a failure. The report's consumed sequence is at least
    /// the highest one sent long enough ago that it will not arrive any more
    /// ([`crate::credits::SentTail`]), so frames lost on the wire give their credit back.
    async fn on_report(&mut self, early: Early) -> Flow {
        if let Some(w) = self.credit.as_mut() {
            // An early report is a write only; at the interval's tick, every
            // `report_every`-th tick also sends the `Report`.
            if early == Early::No {
                w.ticks += 1;
            }
            if early == Early::Yes || w.ticks < w.report_every {
                self.write_credit(early);
                return Flow::Go;
            }
            w.ticks = 0;
        }
        let gone = self.state.on_report(Instant::now());
        let Some(mut report) = self.lanes.report(&self.shared.plane).await else {
            return Flow::Go;
        };
        // `None` (nothing received, nothing gone) sorts below any sequence.
        let consumed = (report.conn_received > 0)
            .then_some(report.consumed_conn_seq)
            .max(gone);
        if let Some(c) = consumed {
            report.consumed_conn_seq = c;
        }
        let consumed_next = consumed.map_or(0, |c| c.saturating_add(1));
        let id = self.lanes.uc().id;
        report.credit_grant = match early {
            Early::No => self.shared.credits.grant(id, consumed_next),
            Early::Yes => self.shared.credits.grant_early(id, consumed_next),
        };
        if let Some(w) = self.credit.as_mut() {
            w.writer.grant(report.credit_grant);
            w.post(consumed_next, &self.shared.credits);
        }
        if let Flow::End(e) = self.send(report, "a report").await {
            return Flow::End(e);
        }
        // The dictionary acknowledgments the report's ingest produced (after the report,
        // which took them): a message of their own, sent only when a prefix advanced.
        for ack in self
            .dict_acks
            .as_ref()
            .map(DictAckOutbox::take)
            .unwrap_or_default()
        {
            if let Flow::End(e) = self.send(ack, "a dictionary acknowledgment").await {
                return Flow::End(e);
            }
        }
        Flow::Go
    }

    /// A report interval (or an early report) without a `Report`: the grant and consumed
    /// point go into the agent's memory only. The consumed point is the worker's (the
    /// session's atomic, no round trip to the worker), at least the highest sequence sent
    /// long enough ago that it will not arrive any more, as in a `Report`.
    fn write_credit(&mut self, early: Early) {
        let gone = self.state.on_report(Instant::now());
        let Some(w) = self.credit.as_mut() else {
            return;
        };
        let session = &self.lanes.uc().session;
        let consumed = session.consumed().max(gone);
        let consumed_next = consumed.map_or(0, |c| c.saturating_add(1));
        let id = self.lanes.uc().id;
        let grant = match early {
            Early::No => self.shared.credits.grant(id, consumed_next),
            Early::Yes => self.shared.credits.grant_early(id, consumed_next),
        };
        w.writer.grant(grant);
        w.post(consumed_next, &self.shared.credits);
    }

    /// Ends the session (`ending`: the collector's reason, if it ended it): sends its
    /// `Goodbye`, waits for the frames the agent's `Goodbye` names, closes every lane,
    /// settles the accounting and logs the line that sums the connection up.
    ///
    /// The registry sees the session as ending (`link`) only after the short wait for an
    /// unread `Goodbye`: until then a new connection of the agent is refused or replaces
    /// this one by the registry's rules.
    async fn close(
        mut self,
        ending: Option<Ending>,
        link: &SessionLink,
        peer: SocketAddr,
        hello: &Hello,
    ) {
        if self.state.send_failed() {
            if let Some(g) = unread_goodbye(self.ch, GOODBYE_LINGER, &self.tel).await {
                self.state.on_unread_goodbye(g);
            }
        }
        link.set_ending();
        let replaced_by = link.take_replaced_by();
        let within = self.state.dead_after();
        let closing = self.state.close(ending, replaced_by, Instant::now());
        if let Some(bye) = closing.send.clone() {
            let _ = send_within(self.ch, bye, within, &self.agent).await;
        }
        let plane = &self.shared.plane;
        if let Some(g) = &closing.goodbye {
            // The frames already on the wire when the agent said goodbye: at least
            // GOODBYE_DRAIN for stragglers, and until each lane's last frame is consumed (at
            // most GOODBYE_WAIT), so a busy receive path does not turn it into tail loss.
            tokio::time::sleep(GOODBYE_DRAIN).await;
            if !self.lanes.wait_consumed(plane, g, GOODBYE_WAIT).await {
                tracing::debug!(agent = %self.agent, "the agent's last frame did not arrive after its Goodbye; settling");
            }
        }
        let summary = self.lanes.close(plane, closing.goodbye.as_ref()).await;
        self.shared.credits.leave(self.lanes.uc().id);
        self.shared.sessions.ended(&self.agent, self.lanes.uc().id);
        self.shared.telemetry.agents_connected().dec();
        self.tel.session_ended(closing.end);
        if let Some(summary) = summary {
            settle(self.shared, &self.agent, &summary);
            log_disconnected(&self.agent, peer, hello, &closing, &summary);
        }
    }
}

/// Adds a closed connection's per-stream accounting to the collector's ledger.
fn settle(shared: &Shared, agent: &str, summary: &CloseSummary) {
    let mut ledger = lock(&shared.ledger);
    for (stream, l) in &summary.streams {
        let e = ledger.entry((agent.to_owned(), *stream)).or_default();
        e.accepted += l.accepted;
        e.lost += l.lost;
        e.late += l.late;
        e.duplicate += l.duplicate;
        e.dropped_after_tracking += l.dropped_after_tracking;
        e.records_received += l.records_received;
        e.records_lost += l.records_lost;
        e.records_replayed += l.records_replayed;
    }
}

/// The line that sums a connection up: a warning when the agent vanished without `Goodbye`.
fn log_disconnected(
    agent: &str,
    peer: SocketAddr,
    hello: &Hello,
    closing: &Closing,
    summary: &CloseSummary,
) {
    let streams = stream_summary(&summary.streams);
    let connected_for = closing.connected_for;
    let ended_by = &closing.ended_by;
    if closing.vanished {
        tracing::warn!(
            agent = %agent,
            peer = %peer,
            epoch = format_args!("{:#x}", hello.epoch),
            ended_by,
            connected_for = format_args!("{connected_for:.1?}"),
            frames_received = summary.conn_received,
            frames_lost = summary.conn_lost,
            frames_dropped = summary.dropped_before_tracking,
            streams,
            "agent disconnected without Goodbye: frames it sent after the last one received \
             are not counted as lost"
        );
    } else {
        tracing::info!(
            agent = %agent,
            peer = %peer,
            epoch = format_args!("{:#x}", hello.epoch),
            ended_by,
            connected_for = format_args!("{connected_for:.1?}"),
            frames_received = summary.conn_received,
            frames_lost = summary.conn_lost,
            frames_dropped = summary.dropped_before_tracking,
            streams,
            "agent disconnected"
        );
    }
}

/// Per-stream accounting of a connection for a log line, by stream name:
/// `metrics: received 120, lost 0, dropped 0; logs: received 30, lost 2, dropped 0`
/// (`dropped`: frames tracked, then discarded for their payload).
fn stream_summary(streams: &[(u32, StreamLedger)]) -> String {
    if streams.is_empty() {
        return "none".to_owned();
    }
    streams
        .iter()
        .map(|(id, l)| {
            format!(
                "{}: received {}, lost {}, dropped {}",
                StreamName(*id),
                l.accepted,
                l.lost,
                l.dropped_after_tracking
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}
