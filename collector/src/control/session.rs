//! One agent's session after its handshake: creates its QP and ring, answers `Welcome`,
//! then heartbeats (driving `uctel_protocol::session::Liveness`), reports every report
//! interval, and settles the connection's accounting when it ends.
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
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::net::TcpStream;
use uctel_common::control::ControlChannel;
use uctel_common::shutdown::Shutdown;
use uctel_protocol::control::{
    self as wire, Body, DataPath, Goodbye, GoodbyeReason, Heartbeat, RefuseReason, Welcome,
};
use uctel_protocol::limits::Limits;
use uctel_protocol::session::handshake::cut_at_char;
use uctel_protocol::session::{Liveness, LivenessConfig, LivenessEvent, Refusal};
use uctel_protocol::stream::StreamName;
use uctel_protocol::tracker::TrackerConfig;

use super::handshake::{
    advertised_endpoint, agent_endpoint, agent_qp_endpoint, collector_transport, Accepted,
};
use super::lane::{merge_summary, RcLane};
use super::registry::{lock, Registry, SessionLink};
use super::{refuse, send_within, sleep_until, GOODBYE_DRAIN, GOODBYE_WAIT};
use crate::credits::{ConnLimits, SentTail};
use crate::dataplane::{Geometry, Session};
use crate::ingest::{ConnectionIngest, StreamLedger};
use crate::outputs::Outputs;
use crate::shared::Shared;
use crate::telemetry::{AgentTelemetry, SessionEnd};

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

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
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
    mut global: Shutdown,
) {
    let Live {
        mut cancel,
        link,
        registry,
    } = live;
    let cfg = &shared.config;
    let hello = &accepted.hello;
    let agent = hello.agent_id.clone();
    let tel = shared.telemetry.agent(&agent);
    // The ring from the rate the agent announced (DESIGN.md §4, rings sized for scale).
    let slots = cfg.ring.slots_for(
        hello.expected_frames_per_second,
        cfg.control.report_interval_seconds,
    );
    let geometry = Geometry {
        slots,
        slot_bytes: cfg.ring.slot_bytes,
        max_frame_bytes: cfg.max_frame_bytes.0,
        send_buffers: cfg.ring.send_buffers,
        // Send path: never more frames outstanding than posted receive buffers (an empty
        // receive queue drops silently, DESIGN.md §4). The descriptor queue reserves this
        // window for the connection.
        credit_window: match accepted.data_path {
            DataPath::Send => cfg.ring.window_of(slots).min(cfg.ring.send_buffers),
            _ => cfg.ring.window_of(slots),
        }
        .max(1),
    };
    let fail = |detail: String| Refusal::new(RefuseReason::Busy, agent.clone(), detail);
    let Some(remote) = agent_endpoint(hello, peer, collector_transport(cfg)) else {
        let r = Refusal::new(
            RefuseReason::ProtocolError,
            &agent,
            "Hello carries no usable QP endpoint",
        );
        return refuse(ch, shared, peer, r).await;
    };
    let rc_remote = match &hello.rc_lane {
        None => None,
        Some(lane) => {
            let Some(ep) = lane
                .qp
                .as_ref()
                .and_then(|qp| agent_qp_endpoint(qp, peer, collector_transport(cfg)))
            else {
                let r = Refusal::new(
                    RefuseReason::ProtocolError,
                    &agent,
                    "Hello's rc_lane carries no usable QP endpoint",
                );
                return refuse(ch, shared, peer, r).await;
            };
            Some((ep, lane.stream_ids.clone()))
        }
    };
    let id = shared.plane.next_session_id();
    let session = match Session::create(
        id,
        &agent,
        shared.plane.device(),
        accepted.data_path,
        geometry,
        tel.clone(),
        None,
    )
    .and_then(|s| s.connect(&remote).map(|()| s))
    {
        Ok(s) => Arc::new(s),
        Err(e) => return refuse(ch, shared, peer, fail(e.to_string())).await,
    };
    let limits = Limits {
        max_frame_bytes: cfg.max_frame_bytes.0 as usize,
        ..Limits::default()
    };
    let tracker = TrackerConfig {
        max_dropout: cfg.max_dropout_frames.0,
        reorder_window: cfg.reorder_window_frames.0,
        reorder_time: Some(cfg.reorder_window_seconds.duration()),
    };
    // One ingest per lane (DESIGN.md §8b): its own connection tracker and the trackers of
    // its streams, delivering into the same outputs.
    let previous_epoch = registry.swap_epoch(&agent, hello.epoch);
    let new_ingest = || {
        let outputs = Outputs {
            store: shared.store.clone(),
            logs: shared.logs.clone(),
            remote_write: shared.remote_write.clone(),
            clickhouse: shared.clickhouse.clone(),
            // Per connection: the rate windows of this agent's sample series.
            fast: Default::default(),
        };
        ConnectionIngest::with_delivery(
            &agent,
            &hello.hostname,
            hello.epoch,
            limits.clone(),
            tracker,
            outputs,
            tel.clone(),
        )
        .map(|mut ingest| {
            ingest.set_previous_epoch(previous_epoch);
            ingest.share_delivered(shared.delivered.clone());
            ingest
        })
    };
    let (ingest, rc_ingest) = match (new_ingest(), rc_remote.as_ref().map(|_| new_ingest())) {
        (Ok(i), None) => (i, None),
        (Ok(mut i), Some(Ok(r))) => {
            if let Some((_, streams)) = &rc_remote {
                i.set_lane_streams(streams.clone(), false);
            }
            (i, Some(r))
        }
        (Err(e), _) | (_, Some(Err(e))) => {
            return refuse(ch, shared, peer, fail(e.to_string())).await
        }
    };
    shared.plane.register(session.clone(), ingest);
    let lane = match (rc_remote, rc_ingest) {
        (Some((remote, streams)), Some(rc_ingest)) => {
            match RcLane::open(
                shared,
                &agent,
                &remote,
                &streams,
                accepted.data_path,
                geometry,
                rc_ingest,
                tel.clone(),
            ) {
                Ok(l) => Some(l),
                Err(e) => {
                    let _ = shared.plane.close(id, None).await;
                    return refuse(ch, shared, peer, fail(format!("the RC lane: {e}"))).await;
                }
            }
        }
        _ => None,
    };
    let heartbeat = Duration::try_from_secs_f64(cfg.control.heartbeat_interval_seconds)
        .unwrap_or(Duration::from_secs(5));
    let report_every = Duration::try_from_secs_f64(cfg.control.report_interval_seconds)
        .unwrap_or(Duration::from_secs(1));
    // Its share of the collector-wide credit budget; its want never falls below the
    // frames of one report interval at the rate it announced.
    let floor = hello
        .expected_frames_per_second
        .map_or(u64::from(geometry.credit_window), |r| {
            (f64::from(r) * report_every.as_secs_f64()).ceil() as u64
        });
    let first_grant = shared.credits.join(
        id,
        ConnLimits {
            window_cap: u64::from(geometry.credit_window),
            floor,
        },
    );
    let welcome = Welcome {
        qp: Some(advertised_endpoint(session.local_endpoint(), local_ip)),
        ring_addr: session.ring.addr(),
        rkey: session.ring.rkey(),
        slots: geometry.slots,
        slot_bytes: geometry.slot_bytes,
        max_frame_bytes: geometry.max_frame_bytes,
        credit_window: geometry.credit_window,
        heartbeat_interval_ms: millis(heartbeat),
        report_interval_ms: millis(report_every),
        data_path: accepted.data_path as i32,
        credit_grant: Some(first_grant),
        rc_lane: lane.as_ref().map(|l| l.welcome(local_ip)),
    };
    if let Err(e) = ch.send(welcome).await {
        tracing::warn!(agent = %agent, error = %e, "sending Welcome failed");
        shared.credits.leave(id);
        let _ = shared.plane.close(id, None).await;
        if let Some(l) = &lane {
            let _ = shared.plane.close(l.id, None).await;
        }
        return;
    }
    shared.telemetry.agents_connected().inc();
    shared.telemetry.agent_up().up(&agent);
    tracing::info!(
        agent = %agent,
        hostname = %hello.hostname,
        peer = %peer,
        epoch = format_args!("{:#x}", hello.epoch),
        data_path = ?accepted.data_path,
        qpn = session.qp.qp_num(),
        rc_qpn = lane.as_ref().map(|l| l.session.qp.qp_num()),
        "agent connected"
    );
    // Heartbeats at the period announced in `Welcome`; the agent is dead after
    // `dead_after_missed_heartbeats` periods of silence (the dead-peer rule of
    // `uctel_protocol::session::liveness`).
    let mut liveness = Liveness::new(
        LivenessConfig::new(
            heartbeat,
            cfg.control.dead_after_missed_heartbeats,
            Duration::ZERO,
        ),
        Instant::now(),
    );
    let dead_after = liveness.dead_after();
    // On the group's phase of the collector-wide grid (`cadence`); a late tick is skipped
    // rather than moving the session off the grid.
    let first_report = registry
        .reports
        .first_tick(id, report_every, Instant::now());
    let mut report_tick = tokio::time::interval_at(
        tokio::time::Instant::from_std(first_report),
        report_every.max(Duration::from_millis(1)),
    );
    report_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut goodbye: Option<Goodbye> = None;
    // Why the agent is gone when it left without a `Goodbye` (`None`: it said goodbye, or
    // the collector ended the session, `ending`).
    let mut vanished: Option<String> = None;
    let connected_at = Instant::now();
    // A drain tells the agent once to move, then waits for its `Goodbye` like any other.
    let mut drain = shared.drain.subscribe();
    let mut told_to_move = false;
    // A send failed: the agent may have said goodbye and closed its end while a report or
    // heartbeat was on its way, its `Goodbye` still unread in the socket.
    let mut send_failed = false;
    let mut last_report = Instant::now();
    // The agent said it is out of credit: when its early report is due (half a report
    // interval after the last report; at once if that has passed).
    let mut early_due: Option<tokio::time::Instant> = None;
    let mut sent_tail = SentTail::default();
    let ending: Option<(GoodbyeReason, &'static str)> = loop {
        tokio::select! {
            () = drain.wait(), if !told_to_move => {
                told_to_move = true;
                let bye = Goodbye {
                    final_conn_seq: None,
                    streams: Vec::new(),
                    reason: GoodbyeReason::Drain as i32,
                    detail: "the collector is draining; move to the next collector of the pool".into(),
                    rc_final_conn_seq: None,
                };
                if !send_within(ch, bye, dead_after, &agent).await {
                    vanished = Some("the control connection failed: the drain notice could not be sent".into());
                    send_failed = true;
                    break None;
                }
                tracing::debug!(agent = %agent, "told the agent to move (drain)");
            }
            msg = ch.recv() => match msg {
                Ok(Some(m)) => {
                    liveness.on_receive(Instant::now());
                    link.heard();
                    match m.body {
                        Some(Body::Heartbeat(hb)) => {
                            if let Some(c) = &hb.agent_counters {
                                tel.agent_counters(c);
                            }
                            let starved = hb.frames_without_credit.unwrap_or(0);
                            // The RC lane out of credit wants its report early too; it has no
                            // share of the budget, so this is not budget want.
                            let rc_starved = hb.rc_frames_without_credit.unwrap_or(0);
                            shared.credits.on_heartbeat(id, hb.credit_grant_applied, hb.sent_conn_seq, starved);
                            sent_tail.on_heartbeat(hb.sent_conn_seq, Instant::now());
                            let hb = match &lane {
                                Some(l) => {
                                    let (uc, rc) = l.split_heartbeat(hb);
                                    shared.plane.heartbeat(l.id, rc);
                                    uc
                                }
                                None => hb,
                            };
                            shared.plane.heartbeat(id, hb);
                            // An agent out of credit gets its report (and grant) before the
                            // next tick, at most twice per report interval: at once when half
                            // an interval has passed since its last report, else when it has,
                            // so how often an agent's credit comes back does not depend on
                            // when its heartbeats happen to fall.
                            if starved > 0 || rc_starved > 0 {
                                early_due = Some(tokio::time::Instant::from_std(last_report + report_every / 2));
                            }
                        }
                        Some(Body::Goodbye(g)) => {
                            goodbye = Some(g);
                            break None;
                        }
                        Some(other) => {
                            tracing::warn!(agent = %agent, message = other.name(), "unexpected control message; closing");
                            break Some((GoodbyeReason::Error, "unexpected control message"));
                        }
                        None => break Some((GoodbyeReason::Error, "empty control message")),
                    }
                }
                Ok(None) => {
                    vanished = Some("the control connection closed without Goodbye".into());
                    break None;
                }
                Err(e) => {
                    vanished = Some(format!("the control connection failed: {e}"));
                    break None;
                }
            },
            () = sleep_until(liveness.poll_timeout()) => match liveness.handle_timeout(Instant::now()) {
                Some(LivenessEvent::PeerDead { silent_for }) => {
                    vanished = Some(format!(
                        "no heartbeat for {silent_for:.1?} (at most {dead_after:?})"
                    ));
                    break Some((GoodbyeReason::Error, "heartbeats missed"));
                }
                Some(LivenessEvent::SendHeartbeat { sequence }) => {
                    let beat = Heartbeat { sequence, timestamp_ns: now_ns(), ..Heartbeat::default() };
                    if !send_within(ch, beat, dead_after, &agent).await {
                        vanished = Some("the control connection failed: a heartbeat could not be sent".into());
                        send_failed = true;
                        break None;
                    }
                }
                None => {}
            },
            () = tokio::time::sleep_until(early_due.unwrap_or_else(tokio::time::Instant::now)), if early_due.is_some() => {
                early_due = None;
                last_report = Instant::now();
                if !send_report(ch, shared, id, dead_after, &agent, sent_tail.gone(Instant::now()), lane.as_ref(), Early::Yes).await {
                    vanished = Some("the control connection failed: a report could not be sent".into());
                    send_failed = true;
                    break None;
                }
            }
            _ = report_tick.tick() => {
                // This report serves an agent waiting for an early one as well.
                early_due = None;
                last_report = Instant::now();
                if !send_report(ch, shared, id, dead_after, &agent, sent_tail.gone(Instant::now()), lane.as_ref(), Early::No).await {
                    vanished = Some("the control connection failed: a report could not be sent".into());
                    send_failed = true;
                    break None;
                }
            }
            _ = session.failed_notify.notified() => {
                break Some((GoodbyeReason::Error, "QP went to the ERROR state; reconnect"));
            }
            () = rc_failed(lane.as_ref()) => {
                break Some((GoodbyeReason::Error, "the RC lane's QP went to the ERROR state; reconnect"));
            }
            _ = cancel.wait() => break Some((GoodbyeReason::Reconnect, "replaced by a newer connection of this agent")),
            _ = global.wait() => break Some((GoodbyeReason::Shutdown, "collector shutting down")),
        }
    };
    if send_failed {
        if let Some(g) = unread_goodbye(ch, GOODBYE_LINGER, &tel).await {
            goodbye = Some(g);
            vanished = None;
        }
    }
    link.set_ending();
    let ended_by = match (&goodbye, &vanished, ending) {
        (Some(g), ..) => format!("the agent's Goodbye ({})", goodbye_reason(g)),
        (None, Some(why), _) => why.clone(),
        (None, None, Some((_, detail))) => detail.to_owned(),
        (None, None, None) => "the session ended".to_owned(),
    };
    if let Some((reason, detail)) = ending {
        let replaced_by = link.take_replaced_by();
        let detail = match (reason, replaced_by) {
            (GoodbyeReason::Reconnect, Some(why)) => why,
            _ => detail.to_owned(),
        };
        let bye = Goodbye {
            final_conn_seq: None,
            streams: Vec::new(),
            reason: reason as i32,
            detail: cut_at_char(&detail, wire::MAX_DETAIL_BYTES).to_owned(),
            rc_final_conn_seq: None,
        };
        let _ = send_within(ch, bye, dead_after, &agent).await;
    }
    if let Some(g) = &goodbye {
        // The frames already on the wire when the agent said goodbye: at least
        // GOODBYE_DRAIN for stragglers, and until its last frame is consumed (at most
        // GOODBYE_WAIT), so a busy receive path does not turn it into tail loss.
        tokio::time::sleep(GOODBYE_DRAIN).await;
        let rc_last = lane.as_ref().map(|l| (l.id, g.rc_final_conn_seq));
        for (lane_id, last) in std::iter::once((id, g.final_conn_seq)).chain(rc_last) {
            if !shared
                .plane
                .wait_consumed(lane_id, last, GOODBYE_WAIT)
                .await
            {
                tracing::debug!(agent = %agent, "the agent's last frame did not arrive after its Goodbye; settling");
            }
        }
    }
    let summary = match &lane {
        None => shared.plane.close(id, goodbye.clone()).await,
        Some(l) => {
            let (uc, rc) = match goodbye.clone().map(|g| l.split_goodbye(g)) {
                Some((uc, rc)) => (Some(uc), Some(rc)),
                None => (None, None),
            };
            let summary = shared.plane.close(id, uc).await;
            let rc = shared.plane.close(l.id, rc).await;
            summary.map(|mut s| {
                if let Some(rc) = rc {
                    merge_summary(&mut s, rc);
                }
                s
            })
        }
    };
    shared.credits.leave(id);
    shared.telemetry.agents_connected().dec();
    tel.session_ended(match (&goodbye, ending) {
        (Some(_), _) => SessionEnd::Goodbye,
        (None, Some((GoodbyeReason::Reconnect, _))) => SessionEnd::Replaced,
        (None, Some((GoodbyeReason::Shutdown, _))) => SessionEnd::Shutdown,
        (None, _) => SessionEnd::NoGoodbye,
    });
    if let Some(summary) = summary {
        let mut ledger = lock(&shared.ledger);
        for (stream, l) in &summary.streams {
            let e = ledger.entry((agent.clone(), *stream)).or_default();
            e.accepted += l.accepted;
            e.lost += l.lost;
            e.late += l.late;
            e.duplicate += l.duplicate;
            e.dropped_after_tracking += l.dropped_after_tracking;
            e.records_received += l.records_received;
            e.records_lost += l.records_lost;
            e.records_replayed += l.records_replayed;
        }
        let streams = stream_summary(&summary.streams);
        let connected_for = connected_at.elapsed();
        if vanished.is_some() {
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
}

/// Resolves when the RC lane's QP went to ERROR; never without a lane.
async fn rc_failed(lane: Option<&RcLane>) {
    match lane {
        Some(l) => l.session.failed_notify.notified().await,
        None => std::future::pending().await,
    }
}

/// Whether a report is sent at its report interval or early.
#[derive(Clone, Copy, Debug)]
enum Early {
    No,
    Yes,
}

/// Sends connection `id`'s report with a new credit grant when its limit changes
/// (DESIGN.md §4); false when the send failed. No report (the connection is closing) is a
/// success. `gone`: the highest connection sequence sent long enough ago that it will not
/// arrive any more ([`SentTail`]); the report's consumed sequence is at least that, so frames
/// lost on the wire give their credit back. `early`: sent between report intervals, for an
/// agent out of credit ([`crate::credits::CreditBudget::grant_early`]).
#[allow(clippy::too_many_arguments)]
async fn send_report(
    ch: &mut ControlChannel<TcpStream>,
    shared: &Shared,
    id: u32,
    within: Duration,
    agent: &str,
    gone: Option<u64>,
    lane: Option<&RcLane>,
    early: Early,
) -> bool {
    let Some(mut report) = shared.plane.report(id).await else {
        return true;
    };
    if let Some(l) = lane {
        if let Some(rc) = shared.plane.report(l.id).await {
            RcLane::merge_report(&mut report, rc);
        }
    }
    // `None` (nothing received, nothing gone) sorts below any sequence.
    let consumed = (report.conn_received > 0)
        .then_some(report.consumed_conn_seq)
        .max(gone);
    if let Some(c) = consumed {
        report.consumed_conn_seq = c;
    }
    let consumed_next = consumed.map_or(0, |c| c.saturating_add(1));
    report.credit_grant = match early {
        Early::No => shared.credits.grant(id, consumed_next),
        Early::Yes => shared.credits.grant_early(id, consumed_next),
    };
    send_within(ch, report, within, agent).await
}

/// An agent's `Goodbye` reason and detail for a log line: `shutdown`, `shutdown: stopping`.
fn goodbye_reason(g: &Goodbye) -> String {
    let reason = match GoodbyeReason::try_from(g.reason) {
        Ok(GoodbyeReason::Shutdown) => "shutdown",
        Ok(GoodbyeReason::Reconnect) => "reconnect",
        Ok(GoodbyeReason::Error) => "error",
        _ => "unspecified",
    };
    let detail: String = g
        .detail
        .chars()
        .filter(|c| !c.is_control())
        .take(200)
        .collect();
    if detail.is_empty() {
        reason.to_owned()
    } else {
        format!("{reason}: {detail}")
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
