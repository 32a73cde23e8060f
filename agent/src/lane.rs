//! The lanes of a connection ([`Lane`], [`Lanes`]): the UC lane, and the RC lane (DESIGN.md
//! §8b) when streams are set to `reliability: rc`; those travel on a second QP, of type RC,
//! with a pipeline ([`SenderCore`]) of their own.
//!
//! ```text
//!            ┌─ UC SenderCore (UC streams) ─► DataPlane (UC QP) ─► ring     (credits: budget)
//!  queues ───┤
//!            └─ RC SenderCore (RC streams) ─► DataPlane (RC QP) ─► RC ring  (credits: window)
//! ```
//!
//! Each lane has its own connection sequence (both start at `SenderConfig::first_conn_seq`),
//! ring, credit window and consumed point; a stream travels on exactly one lane, so its
//! stream sequence, its record count and its log settlement come from one pipeline only. The
//! RC lane takes no share of the collector-wide credit budget (no `CreditGrant` applies): its
//! credit is `Welcome.rc_lane.credit_window` frames beyond the consumed sequence that
//! `Report.rc_lane` returns. With no stream on `rc` there is no RC lane: no second QP, and
//! `Hello.rc_lane` is `None`.
//!
//! The session (`crate::run`) opens the RC lane's [`DataPlane`] before `Hello`
//! ([`open_plane`], [`request`]), starts it after `Welcome` ([`Lane::start_rc`]) and drives
//! the lanes of its [`Lanes`] list in the same loop, one step of each in turn. A failed RC QP (an error completion such as
//! `retry_exceeded_error` when `transport.rc.retry_cnt` runs out, the QP in ERROR, a fatal
//! async event) ends the session as lost, like a failed UC QP: the agent reconnects with a
//! new epoch. Heartbeats and `Goodbye` carry both lanes' sequences ([`heartbeat`],
//! [`goodbye`]).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use uctel_protocol::control::{
    self, GoodbyeReason, Heartbeat, RcLaneRequest, Report, StreamFinal, Welcome,
};
use uctel_transport::api::{QpType, RcCounters};
use uctel_transport::soft::fault::FaultCounts;

use crate::config::{AgentConfig, Reliability, TransportKind};
use crate::datapath::{DataPlane, DataPlaneError};
use crate::runners::Queues;
use crate::selfmetrics::{DropReason, FaultTally, SelfMetrics};
use crate::sender::core::{FinalSequences, SenderConfig, SenderCore, STREAMS};
use crate::sender::pump::{self, Stop};
use crate::stream::Stream;

/// Retry interval while the QP's send queue or send buffers are full, and how soon the UC
/// lane's completions are polled while its sends are in flight.
pub const BUSY_RETRY: Duration = Duration::from_millis(1);
/// How often completions are reaped while RC sends are in flight: they complete with their
/// ACK (a round trip, or a retransmit timeout, later) and the device's progress thread runs
/// the protocol, so the session only frees buffers and looks for a failed QP.
pub const RC_REAP_EVERY: Duration = Duration::from_millis(10);
/// Longest wait at the end of a session for posted sends to complete.
pub const DRAIN_GRACE: Duration = Duration::from_millis(500);

/// Per stream, indexed by [`Stream::index`]: whether it travels on the lane of `reliability`
/// ([`SenderConfig::carries`] of that lane's pipeline). The `fast_counters` stream travels on
/// no lane unless `sources.fast_counters` is configured: no idle heartbeats, no last frame
/// of the epoch, so a collector shows no frames (nor their loss) of a stream that carries
/// nothing.
pub fn carries(config: &AgentConfig, reliability: Reliability) -> [bool; STREAMS] {
    Stream::ALL.map(|s| {
        config.streams.reliability(s) == reliability
            && (s != Stream::FastCounters || config.sources.fast_counters.is_some())
    })
}

/// Opens the RC lane's data plane (an RC QP with `transport.rc`'s attributes) when a stream
/// is set to `reliability: rc`; `None` otherwise. On the soft transport the RC QP lives on
/// the UC plane's device `uc` ([`DataPlane::open_beside`]: a verbs peer answers on UDP port
/// 4791 only); on verbs it gets a device context of its own, whose async events it takes.
///
/// # Errors
/// [`DataPlaneError`] naming the RC QP's object that could not be created.
pub fn open_plane(
    config: &AgentConfig,
    local_ip: IpAddr,
    uc: &DataPlane,
) -> Result<Option<DataPlane>, DataPlaneError> {
    if config.streams.rc_streams().is_empty() {
        return Ok(None);
    }
    let qp_type = QpType::Rc(config.transport.rc.attr());
    match config.transport.kind {
        TransportKind::Soft => uc.open_beside(config.max_frame_bytes, qp_type).map(Some),
        TransportKind::Verbs => {
            DataPlane::open(config, local_ip, config.max_frame_bytes, qp_type).map(Some)
        }
    }
}

/// `Hello.rc_lane`: the RC QP's endpoint and the header stream ids of the RC streams.
pub fn request(plane: &DataPlane, config: &AgentConfig) -> RcLaneRequest {
    RcLaneRequest {
        qp: Some(plane.endpoint()),
        stream_ids: config.streams.rc_streams().iter().map(|s| s.id()).collect(),
    }
}

/// Follows one RC QP's delivery counters ([`DataPlane::rc_counters`]) and adds their growth
/// since the last [`RcTally::sync`] to the agent's `rc_qp_events_total`, so the exported
/// counters stay cumulative when the next session's QP counts from zero.
#[derive(Debug, Default)]
pub struct RcTally {
    seen: RcCounters,
}

impl RcTally {
    /// Adds the growth from the last sync to `now` (the QP's counters) to `metrics`; returns
    /// the growth.
    pub fn sync(&mut self, now: RcCounters, metrics: &SelfMetrics) -> RcCounters {
        let delta = now.since(&self.seen);
        metrics.add_rc_counts(&delta);
        self.seen = now;
        delta
    }
}

/// One lane of a session: a QP (UC, or RC for the streams set to `reliability: rc`) and the
/// pipeline of the streams it carries. The session keeps its lanes in a [`Lanes`] list and
/// does the same work on each; what differs between a UC and an RC lane (acknowledgements,
/// the RC QP's counters, how a failure is named and counted) lives in these methods.
#[derive(Debug)]
pub struct Lane {
    /// The lane's QP type: `Uc` for the UC lane, `Rc` for the RC lane.
    pub reliability: Reliability,
    /// The lane's QP, its CQs and send buffers.
    pub plane: DataPlane,
    /// The pipeline of the streams the lane carries.
    pub core: SenderCore,
    /// The lane's credit window, frames (the UC lane's from `Welcome`, the RC lane's from
    /// [`sender_config`]).
    pub credit_window: u64,
    tally: RcTally,
    faults: Option<FaultTally>,
}

/// The lane's settings from `Welcome.rc_lane`, on top of the UC pipeline's `uc`: the
/// lane's window (`credit_window`, and no more than `slots − collector.credit_margin_slots`),
/// the RC streams, and frames no larger than the RC QP's path MTU unless
/// `multi_packet_frames` (the UC rule, DESIGN.md §3).
///
/// # Errors
/// A message for a window of 0.
pub fn sender_config(
    config: &AgentConfig,
    uc: &SenderConfig,
    lane: &control::RcLane,
    local_mtu: u32,
) -> Result<SenderConfig, String> {
    let margin = config.collector.credit_margin_slots;
    let window = lane.credit_window.min(lane.slots.saturating_sub(margin));
    if window == 0 {
        return Err(format!(
            "RC lane credit window 0 (credit_window {}, slots {}, credit_margin_slots {margin})",
            lane.credit_window, lane.slots
        ));
    }
    let mut rc = uc.clone();
    rc.credit_window = u64::from(window);
    rc.carries = carries(config, Reliability::Rc);
    if !config.multi_packet_frames {
        let remote_mtu = lane.qp.as_ref().map_or(local_mtu, |q| q.mtu);
        let path_mtu = local_mtu.min(remote_mtu).max(256) as usize;
        if path_mtu < rc.limits.max_frame_bytes {
            rc.limits.max_frame_bytes = path_mtu;
            rc.pacing = Some(config.pacing_limits(path_mtu));
        }
    }
    Ok(rc)
}

impl Lane {
    /// A lane of `reliability` over `plane` (connected to the collector's QP of that type),
    /// `core` the pipeline of its streams with a window of `credit_window` frames. The
    /// plane's fault injector (with `transport.soft.fault`) is followed from here on. An RC
    /// lane is started with [`Lane::start_rc`], which also connects its QP.
    pub fn new(
        reliability: Reliability,
        plane: DataPlane,
        core: SenderCore,
        credit_window: u64,
    ) -> Lane {
        Lane {
            reliability,
            faults: plane.fault_stats().map(FaultTally::new),
            plane,
            core,
            credit_window,
            tally: RcTally::default(),
        }
    }

    /// After `Welcome`: connects `plane` (from [`open_plane`]; `None`: no RC lane) to the
    /// collector's RC QP and ring and builds the RC lane's pipeline for `epoch`, with the UC
    /// pipeline's settings `uc` and the lane's own window ([`sender_config`]).
    ///
    /// # Errors
    /// A `Welcome` without `rc_lane` (a collector that does not support it), an unusable
    /// lane, or a refused connection of the RC QP.
    pub fn start_rc(
        plane: Option<DataPlane>,
        welcome: &Welcome,
        uc: &SenderConfig,
        config: &AgentConfig,
        epoch: u64,
        stats: &Arc<SelfMetrics>,
    ) -> Result<Option<Lane>, LaneError> {
        let Some(mut plane) = plane else {
            return Ok(None);
        };
        let Some(lane) = &welcome.rc_lane else {
            let keys: Vec<String> = config
                .streams
                .rc_streams()
                .iter()
                .map(|s| format!("streams.{s}.reliability"))
                .collect();
            return Err(LaneError::NotOffered(keys.join(", ")));
        };
        let rc =
            sender_config(config, uc, lane, plane.endpoint().mtu).map_err(LaneError::Welcome)?;
        plane.connect_rc_lane(welcome)?;
        let mut core = SenderCore::new(&rc, epoch, Instant::now(), stats.clone())
            .map_err(|e| LaneError::Welcome(e.to_string()))?;
        // A record on RC is settled when the RC QP acknowledged its frame (DESIGN.md §8b).
        core.set_settle_on_ack(true);
        Ok(Some(Lane::new(
            Reliability::Rc,
            plane,
            core,
            rc.credit_window,
        )))
    }

    /// Why the lane's QP can no longer deliver, if it cannot: a fatal async event, an error
    /// completion (the QP is then in ERROR), or the QP in ERROR. Reaps the send completions
    /// on the way. An RC lane's failure is counted (`rc_lane_failures_total`) and names the
    /// completion's status (`retry_exceeded_error` when `transport.rc.retry_cnt` ran out).
    pub fn failure(&mut self, stats: &SelfMetrics) -> Option<String> {
        if self.reliability == Reliability::Uc {
            if let Some(kind) = self.plane.poll_async_events(stats.rdma()) {
                return Some(format!("RDMA async event {}", kind.as_str()));
            }
            return (self.plane.reap() > 0 || self.plane.failed())
                .then(|| "the UC QP went to ERROR".to_owned());
        }
        let why = if let Some(kind) = self.plane.poll_async_events(stats.rdma()) {
            format!("RDMA async event {} on the RC QP", kind.as_str())
        } else if self.reap() > 0 || self.plane.failed() {
            match self.plane.first_error() {
                Some(status) => format!(
                    "the RC QP went to ERROR ({status}{})",
                    if status == uctel_transport::api::WcStatus::RetryExceededError {
                        ": transport.rc.retry_cnt used up"
                    } else {
                        ""
                    }
                ),
                None => "the RC QP went to ERROR (retry exceeded?)".to_owned(),
            }
        } else {
            return None;
        };
        self.sync(stats);
        stats.rc_lane_failed();
        Some(why)
    }

    /// Why the session ends after a post to the lane's QP failed for good
    /// ([`Stop::Failed`]); counts an RC lane's failure (`rc_lane_failures_total`).
    pub fn post_failed(&self, stats: &SelfMetrics) -> String {
        if self.reliability == Reliability::Rc {
            stats.rc_lane_failed();
        }
        format!("posting to the {} failed", self.plane.qp_name())
    }

    /// Polls the QP's send completions ([`DataPlane::reap`]); on an RC lane hands the
    /// acknowledged connection sequence to the pipeline ([`SenderCore::on_acked`]). Returns
    /// how many completions carried an error status.
    pub fn reap(&mut self) -> u64 {
        let errors = self.plane.reap();
        self.take_acks();
        errors
    }

    /// On an RC lane, hands the acknowledgements the plane collected (in
    /// [`DataPlane::reap`], called by posting or by a drain) to the pipeline. A UC send
    /// completion only means the message left: nothing is settled by it.
    pub fn take_acks(&mut self) {
        if self.reliability != Reliability::Rc {
            return;
        }
        if let Some(seq) = self.plane.take_acked() {
            let _ = self.core.on_acked(seq);
        }
    }

    /// One step of the lane: records in, frames out to the QP, acknowledgements (RC), log
    /// settlement, counters.
    pub fn step(&mut self, queues: &Queues, stats: &SelfMetrics) -> Stop {
        pump::pull(&mut self.core, queues, stats);
        self.transmit(queues, stats)
    }

    /// Frames out and settlement only (no records taken), as at the end of an epoch. The
    /// UC lane's completions are left to [`Lane::failure`], which tells an error completion
    /// from a good one.
    pub fn transmit(&mut self, queues: &Queues, stats: &SelfMetrics) -> Stop {
        let stop = pump::transmit(&mut self.core, &mut self.plane);
        if self.reliability == Reliability::Rc {
            self.reap();
        }
        pump::settle(&self.core, queues);
        self.sync(stats);
        stop
    }

    /// Takes the lane's part of a collector `Report`: the UC lane its consumed sequence,
    /// credit grant and stream figures, the RC lane `Report.rc_lane`'s consumed sequence.
    pub fn on_report(&mut self, report: &Report) {
        match self.reliability {
            Reliability::Uc => {
                let _ = self.core.on_report(report);
            }
            Reliability::Rc => {
                if let Some(lane) = &report.rc_lane {
                    let _ = self.core.on_lane_report(lane.consumed_conn_seq);
                }
            }
        }
    }

    /// How soon the lane's completions are polled again while sends are in flight: soon
    /// on UC ([`BUSY_RETRY`]: with a busy-poll soft device, polling is also what moves
    /// packets the socket could not take at once), at [`RC_REAP_EVERY`] on RC (its sends
    /// complete with their ACK and the device's progress thread runs the protocol). `None`
    /// when nothing is in flight.
    pub fn reap_after(&self) -> Option<Duration> {
        if self.plane.idle() {
            return None;
        }
        Some(match self.reliability {
            Reliability::Uc => BUSY_RETRY,
            Reliability::Rc => RC_REAP_EVERY,
        })
    }

    /// Lets the posted sends reach the wire (their completions polled), for at most
    /// [`DRAIN_GRACE`]: before `Goodbye`, and so the fault injector has seen every frame.
    pub async fn drain_sends(&mut self) {
        let until = Instant::now() + DRAIN_GRACE;
        while !self.plane.idle() && Instant::now() < until {
            self.plane.reap();
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Ends the lane's epoch: what the pipeline still holds is dropped with `reason`
    /// (`shutdown`, or `not_connected` when the agent moves on or lost the connection).
    /// Unless `reason` is `shutdown`, the metric samples not posted go back to the metrics
    /// buffer for the next session ([`pump::take_back_metrics`]). On an RC lane the last
    /// acknowledgements are taken first (after a drain of the sends) and the log lines not
    /// acknowledged are read again ([`Lane::drop_pending`]); the UC lane drains after.
    pub async fn end_epoch(&mut self, reason: DropReason, queues: &Queues, stats: &SelfMetrics) {
        let moving_on = reason != DropReason::Shutdown;
        match self.reliability {
            Reliability::Uc => {
                if moving_on {
                    pump::take_back_metrics(&mut self.core, queues, stats);
                }
                self.core.drop_pending(reason);
                if moving_on {
                    pump::settle(&self.core, queues);
                }
                self.drain_sends().await;
            }
            Reliability::Rc => {
                self.drain_sends().await;
                self.take_acks();
                if moving_on {
                    pump::take_back_metrics(&mut self.core, queues, stats);
                }
                self.drop_pending(reason, queues);
            }
        }
    }

    /// Ends an RC lane's epoch: what the pipeline still holds is dropped with `reason`,
    /// except the log lines, which settle only when acknowledged (DESIGN.md §8b). Unless
    /// `reason` is `shutdown` (the lines not acknowledged are then read again after a
    /// restart), the acknowledged lines settle, the lines in flight or pending are taken back
    /// ([`SenderCore::take_back_logs`]) and the log sources rewind to the first of them
    /// ([`crate::runners::Handoff::rewind`]): they go again on the next connection. Call it
    /// after the last acknowledgements were taken ([`Lane::take_acks`]).
    pub fn drop_pending(&mut self, reason: DropReason, queues: &Queues) {
        if reason == DropReason::Shutdown {
            self.core.drop_pending(reason);
            return;
        }
        pump::settle(&self.core, queues);
        let back = self.core.take_back_logs();
        self.core.drop_pending(reason);
        if back > 0 {
            let requeued = queues.logs_handoff.rewind(&queues.logs);
            tracing::info!(
                lines = back + requeued,
                "log lines on RC not acknowledged; the log sources read them again from the \
                 last acknowledged line"
            );
        }
    }

    /// Adds the QP's counters (an RC QP's delivery counters, and its fault injector's) since
    /// the last sync to the agent's totals; returns this session's fault counts, when fault
    /// injection is on.
    pub fn sync(&mut self, stats: &SelfMetrics) -> Option<FaultCounts> {
        if self.reliability == Reliability::Rc {
            self.tally.sync(self.plane.rc_counters(), stats);
        }
        self.faults.as_mut().map(|t| t.sync(stats))
    }
}

/// A session's lanes, in order: the UC lane, then the RC lane when a stream is set to
/// `reliability: rc` (quinn-proto keeps one `PacketSpace` per space the same way, and
/// iterates them). Per-lane work is a loop over [`Lanes::iter_mut`]; only the protocol's
/// per-lane fields (a heartbeat's and a `Goodbye`'s `rc_*`) name the RC lane.
#[derive(Debug)]
pub struct Lanes {
    /// The UC lane first; at most one RC lane after it.
    lanes: Vec<Lane>,
}

impl Lanes {
    /// The UC lane `uc` and, when there is one, the RC lane `rc`, which draws on the UC
    /// lane's pacer: one set of pacing caps for the connection, whichever lane a frame takes.
    pub fn new(mut uc: Lane, rc: Option<Lane>) -> Lanes {
        let mut lanes = Vec::with_capacity(2);
        if let Some(mut rc) = rc {
            rc.core.share_pacer_with(&mut uc.core);
            lanes.push(uc);
            lanes.push(rc);
        } else {
            lanes.push(uc);
        }
        Lanes { lanes }
    }

    /// How many lanes: 1, or 2 with an RC lane.
    pub fn len(&self) -> usize {
        self.lanes.len()
    }

    /// Never: a session has at least its UC lane.
    pub fn is_empty(&self) -> bool {
        self.lanes.is_empty()
    }

    /// The lanes, UC first.
    pub fn iter(&self) -> std::slice::Iter<'_, Lane> {
        self.lanes.iter()
    }

    /// The lanes, UC first, to change.
    pub fn iter_mut(&mut self) -> std::slice::IterMut<'_, Lane> {
        self.lanes.iter_mut()
    }

    /// The lane at `index` (0: UC), to change.
    pub fn get_mut(&mut self, index: usize) -> Option<&mut Lane> {
        self.lanes.get_mut(index)
    }

    /// The UC lane.
    pub fn uc(&self) -> &Lane {
        &self.lanes[0]
    }

    /// The RC lane, when there is one.
    pub fn rc(&self) -> Option<&Lane> {
        self.lanes.get(1)
    }

    /// The UC lane's pipeline and the RC lane's, for the messages that name both.
    pub fn cores_mut(&mut self) -> (&mut SenderCore, Option<&mut SenderCore>) {
        let (uc, rest) = self.lanes.split_at_mut(1);
        (&mut uc[0].core, rest.first_mut().map(|l| &mut l.core))
    }

    /// The merged final sequences of the lanes ([`merged`]).
    pub fn merged(&self) -> FinalSequences {
        merged(&self.uc().core, self.rc().map(|l| &l.core))
    }

    /// The RC lane's own final sequences, when there is one.
    pub fn rc_final(&self) -> Option<FinalSequences> {
        self.rc().map(|l| l.core.final_sequences())
    }

    /// Frames the lanes' pipelines posted in the session, every stream: one announced rate
    /// sizes both lanes' rings.
    pub fn frames_sent(&self) -> u64 {
        self.iter()
            .flat_map(|l| Stream::ALL.map(|s| l.core.stats().stream(s).frames_sent))
            .sum()
    }

    /// Frames ready to post on every lane.
    pub fn ready_frames(&self) -> usize {
        self.iter().map(|l| l.core.ready_frames()).sum()
    }

    /// [`heartbeat_with_counters`] of the lanes.
    pub fn heartbeat(&mut self, sequence: u64, stats: &SelfMetrics) -> Heartbeat {
        let (uc, rc) = self.cores_mut();
        heartbeat_with_counters(sequence, uc, rc, stats)
    }

    /// The packets the session's fault injectors dropped, at its end: the UC plane's
    /// figures plus the other lanes' drops, every lane's counters synced here
    /// ([`Lane::sync`]). `None` without fault injection.
    pub fn sync_session_faults(&mut self, stats: &SelfMetrics) -> Option<FaultCounts> {
        let mut lanes = self.lanes.iter_mut();
        let mut total = lanes.next().and_then(|l| l.sync(stats));
        for lane in lanes {
            let counts = lane.sync(stats);
            if let (Some(t), Some(c)) = (total.as_mut(), counts) {
                t.dropped += c.dropped;
            }
        }
        total
    }
}

/// Why the RC lane could not start.
#[derive(Debug, thiserror::Error)]
pub enum LaneError {
    /// The agent asked for an RC lane and the `Welcome` has none.
    #[error("the collector offers no RC lane ({0}: rc needs a collector that supports it)")]
    NotOffered(String),
    /// The lane in `Welcome` is unusable.
    #[error("{0}")]
    Welcome(String),
    /// The RC QP could not be connected.
    #[error(transparent)]
    DataPlane(#[from] DataPlaneError),
}

/// The merged final sequences of both lanes: the UC lane's connection sequence and frames,
/// and each stream's totals from the pipeline that carries it.
pub fn merged(uc: &SenderCore, rc: Option<&SenderCore>) -> FinalSequences {
    let mut fin = uc.final_sequences();
    if let Some(rc) = rc {
        let r = rc.final_sequences();
        for s in Stream::ALL {
            if rc.carries(s) && !uc.carries(s) {
                fin.streams[s.index()] = r.streams[s.index()];
            }
        }
    }
    fin
}

/// Per stream, the last stream sequence and record count posted (for `Goodbye` and
/// heartbeats), both lanes' streams.
fn stream_finals(fin: &FinalSequences) -> Vec<StreamFinal> {
    Stream::ALL
        .iter()
        .map(|s| {
            let t = fin.streams[s.index()];
            StreamFinal {
                stream_id: s.id(),
                final_stream_seq: t.last_stream_seq,
                final_record_count: t.records,
            }
        })
        .collect()
}

/// The agent's `Goodbye`: `fin` from [`merged`], the RC lane's last connection sequence
/// `rc_final` (`None`: no RC lane, or it sent nothing).
pub fn goodbye(
    fin: &FinalSequences,
    rc_final: Option<u64>,
    reason: GoodbyeReason,
    detail: &str,
) -> control::Goodbye {
    control::Goodbye {
        final_conn_seq: fin.last_conn_seq,
        streams: stream_finals(fin),
        reason: reason as i32,
        detail: detail.chars().take(control::MAX_DETAIL_BYTES).collect(),
        rc_final_conn_seq: rc_final,
    }
}

/// Logs the epoch's final figures as `Goodbye` gave them ("goodbye sent"), for operators and
/// end-to-end tests: `frames` on the connection (both lanes), `rc_frames`, frames and
/// records per stream, and the packets this session's fault injector dropped
/// (`fault_dropped`, only with fault injection). `fin` from [`merged`], `rc` the RC lane's
/// own figures.
pub fn log_goodbye(
    epoch: u64,
    collector: std::net::SocketAddr,
    reason: &str,
    fin: &FinalSequences,
    rc: Option<&FinalSequences>,
    fault_dropped: Option<u64>,
) {
    let [m, l, f] =
        [Stream::Metrics, Stream::Logs, Stream::FastCounters].map(|s| fin.streams[s.index()]);
    tracing::info!(
        epoch = format_args!("{epoch:#x}"),
        collector = %collector,
        reason,
        frames = fin.frames + rc.map_or(0, |f| f.frames),
        rc_frames = rc.map(|f| f.frames),
        metrics_frames = m.frames,
        metrics_records = m.records,
        logs_frames = l.frames,
        logs_records = l.records,
        fast_counters_frames = f.frames,
        fast_counters_records = f.records,
        fault_dropped,
        "goodbye sent"
    );
}

/// A heartbeat carrying the sequences posted so far on both lanes, so a session that ends
/// without a `Goodbye` has an unknown tail of at most one heartbeat interval (DESIGN.md §6).
///
/// It also carries the credit grant applied last and the frames that found no credit since
/// the previous heartbeat (DESIGN.md §4, collector-wide credit budget): the UC lane's, the
/// only one the budget covers.
pub fn heartbeat(sequence: u64, core: &mut SenderCore, rc: Option<&mut SenderCore>) -> Heartbeat {
    let fin = merged(core, rc.as_deref());
    let rc_sent_conn_seq = rc.as_ref().and_then(|r| r.final_sequences().last_conn_seq);
    Heartbeat {
        sequence,
        timestamp_ns: pump::unix_ns(),
        sent_conn_seq: fin.last_conn_seq,
        sent_streams: stream_finals(&fin),
        credit_grant_applied: core.grant_applied(),
        frames_without_credit: Some(core.take_frames_without_credit()),
        rc_sent_conn_seq,
        rc_frames_without_credit: rc.map(SenderCore::take_frames_without_credit),
        agent_counters: None,
    }
}

/// [`heartbeat`] with the agent's send and drop counters (`agent_counters`, from
/// [`SelfMetrics::agent_counters`]): they reach the collector on the control connection,
/// which the drops they count cannot starve.
pub fn heartbeat_with_counters(
    sequence: u64,
    core: &mut SenderCore,
    rc: Option<&mut SenderCore>,
    stats: &SelfMetrics,
) -> Heartbeat {
    stats.status().set_credit(Some(core.credit_view()));
    Heartbeat {
        agent_counters: Some(stats.agent_counters()),
        ..heartbeat(sequence, core, rc)
    }
}

/// The stop of both lanes' [`pump::transmit`]: failed if one failed, busy if one is busy,
/// else the earlier wait.
pub fn merge_stops(uc: Stop, rc: Option<Stop>) -> Stop {
    match (uc, rc) {
        (s, None) => s,
        (Stop::Failed, _) | (_, Some(Stop::Failed)) => Stop::Failed,
        (Stop::Busy, _) | (_, Some(Stop::Busy)) => Stop::Busy,
        (Stop::Wait(a), Some(Stop::Wait(b))) => Stop::Wait(match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn config(extra: &str) -> AgentConfig {
        let text =
            format!("agent_id: a\ncollector:\n  control: 127.0.0.1:1\nauth:\n  token: t\n{extra}");
        AgentConfig::from_yaml("t.yaml", &text).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn no_rc_stream_no_rc_lane() {
        let c = config("");
        let ip = "127.0.0.1".parse().unwrap_or_else(|e| panic!("{e}"));
        let uc = DataPlane::open(&c, ip, 1024, QpType::Uc).unwrap_or_else(|e| panic!("{e}"));
        assert!(open_plane(&c, ip, &uc)
            .unwrap_or_else(|e| panic!("{e}"))
            .is_none());
        // No `sources.fast_counters`: its stream travels on no lane.
        assert_eq!(carries(&c, Reliability::Uc), [true, true, false]);
        assert_eq!(carries(&c, Reliability::Rc), [false; 3]);
        let c = config(
            "sources:\n  fast_counters:\n    counters:\n      - path: /sys/class/net/lo/statistics/rx_packets\n",
        );
        assert_eq!(carries(&c, Reliability::Uc), [true; 3]);
    }

    #[test]
    fn the_lane_request_names_the_rc_streams_and_the_rc_qp() {
        let c = config("streams:\n  logs:\n    reliability: rc\n");
        let ip = "127.0.0.1".parse().unwrap_or_else(|e| panic!("{e}"));
        let uc = DataPlane::open(&c, ip, 1024, QpType::Uc).unwrap_or_else(|e| panic!("{e}"));
        let plane = open_plane(&c, ip, &uc)
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("no RC plane"));
        assert_eq!(plane.qp_name(), "RC QP");
        let r = request(&plane, &c);
        assert_eq!(r.stream_ids, [Stream::Logs.id()]);
        assert_eq!(r.qp, Some(plane.endpoint()));
        assert_eq!(carries(&c, Reliability::Rc), [false, true, false]);
        assert_eq!(carries(&c, Reliability::Uc), [true, false, false]);
    }

    #[test]
    fn stops_merge_to_the_most_urgent() {
        let t = Instant::now();
        let later = t + Duration::from_millis(5);
        assert_eq!(merge_stops(Stop::Wait(None), None), Stop::Wait(None));
        assert_eq!(
            merge_stops(Stop::Wait(Some(t)), Some(Stop::Failed)),
            Stop::Failed
        );
        assert_eq!(merge_stops(Stop::Failed, Some(Stop::Busy)), Stop::Failed);
        assert_eq!(
            merge_stops(Stop::Wait(Some(t)), Some(Stop::Busy)),
            Stop::Busy
        );
        assert_eq!(
            merge_stops(Stop::Wait(Some(later)), Some(Stop::Wait(Some(t)))),
            Stop::Wait(Some(t))
        );
        assert_eq!(
            merge_stops(Stop::Wait(None), Some(Stop::Wait(Some(later)))),
            Stop::Wait(Some(later))
        );
        assert_eq!(
            merge_stops(Stop::Wait(None), Some(Stop::Wait(None))),
            Stop::Wait(None)
        );
    }

    #[test]
    fn the_rc_tally_adds_each_sessions_growth_once() {
        let sm = SelfMetrics::new().unwrap_or_else(|e| panic!("{e}"));
        sm.enable_rc_metrics().unwrap_or_else(|e| panic!("{e}"));
        let mut t1 = RcTally::default();
        let c = |retx, timeouts| RcCounters {
            packets_retransmitted: retx,
            timeouts,
            ..RcCounters::default()
        };
        assert_eq!(t1.sync(c(3, 1), &sm), c(3, 1));
        assert_eq!(t1.sync(c(3, 1), &sm), c(0, 0));
        assert_eq!(t1.sync(c(5, 1), &sm), c(2, 0));
        // The next session's QP counts from zero.
        let mut t2 = RcTally::default();
        t2.sync(c(4, 2), &sm);
        assert_eq!(sm.rc_qp_events("packets_retransmitted"), Some(9));
        assert_eq!(sm.rc_qp_events("timeouts"), Some(3));
    }

    /// The UC lane's sender configuration of `c` with `credit_window`.
    fn uc_config(c: &AgentConfig, credit_window: u64) -> SenderConfig {
        SenderConfig {
            limits: uctel_protocol::limits::Limits::default(),
            pacing: None,
            credit_window,
            first_conn_seq: 0,
            first_stream_seq: 0,
            data_paths: [crate::config::DataPath::WriteWithImm; 3],
            flush_after: [Duration::from_millis(1); 3],
            ready_frames: 8,
            idle_heartbeat: None,
            wait_for_credit: [false; 3],
            carries: carries(c, Reliability::Uc),
        }
    }

    #[test]
    fn the_rc_lane_window_and_frames_come_from_its_welcome() {
        let c = AgentConfig::from_yaml(
            "t.yaml",
            "agent_id: a\ncollector:\n  control: 127.0.0.1:1\n  credit_margin_slots: 8\nauth:\n  \
             token: t\nstreams:\n  logs:\n    reliability: rc\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let uc = SenderConfig {
            limits: uctel_protocol::limits::Limits {
                max_frame_bytes: 4096,
                ..uctel_protocol::limits::Limits::default()
            },
            wait_for_credit: [false, true, false],
            ..uc_config(&c, 100)
        };
        let lane = control::RcLane {
            qp: Some(control::QpEndpoint {
                mtu: 1024,
                ..control::QpEndpoint::default()
            }),
            slots: 64,
            credit_window: 64,
            ..control::RcLane::default()
        };
        let rc = sender_config(&c, &uc, &lane, 4096).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(rc.credit_window, 56, "64 slots less the margin of 8");
        assert_eq!(rc.carries, [false, true, false]);
        assert_eq!(rc.limits.max_frame_bytes, 1024, "the RC QP's path MTU");
        assert_eq!(rc.first_conn_seq, uc.first_conn_seq);
        let tiny = control::RcLane {
            slots: 8,
            credit_window: 8,
            ..lane
        };
        let e = sender_config(&c, &uc, &tiny, 4096)
            .err()
            .unwrap_or_else(|| panic!("a window of 0 accepted"));
        assert!(e.contains("credit window 0"), "{e}");
    }

    #[test]
    fn a_heartbeat_tells_the_rc_lane_out_of_credit_apart() {
        let c = config("streams:\n  logs:\n    reliability: rc\n");
        let base = uc_config(&c, 1);
        let rc_config = SenderConfig {
            carries: carries(&c, Reliability::Rc),
            ..base.clone()
        };
        let t0 = Instant::now();
        let mut uc = SenderCore::new_unexported(&base, 1, t0).unwrap_or_else(|e| panic!("{e}"));
        let mut rc =
            SenderCore::new_unexported(&rc_config, 1, t0).unwrap_or_else(|e| panic!("{e}"));
        // Three log frames on the RC lane, a window of one: two find no credit.
        for i in 0..3 {
            let r = uctel_protocol::payload::LogRecord {
                message: format!("line {i}"),
                ..Default::default()
            };
            rc.push_log(&r, t0, 1);
            rc.flush(Stream::Logs);
        }
        while let crate::sender::core::Poll::Transmit(t) = rc.poll_transmit(t0, 1) {
            rc.sent(&t);
        }
        let hb = heartbeat(1, &mut uc, Some(&mut rc));
        assert_eq!(
            hb.frames_without_credit,
            Some(0),
            "the UC lane had its credit"
        );
        assert!(
            hb.rc_frames_without_credit.is_some_and(|n| n > 0),
            "{:?}",
            hb.rc_frames_without_credit
        );
        assert_eq!(hb.rc_sent_conn_seq, Some(0));
        // Taken: the next heartbeat starts from zero.
        let hb = heartbeat(2, &mut uc, Some(&mut rc));
        assert_eq!(hb.rc_frames_without_credit, Some(0));
        assert_eq!(heartbeat(3, &mut uc, None).rc_frames_without_credit, None);
    }
}
