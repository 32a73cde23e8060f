//! Per-connection ingest: everything the worker does with one frame, independent of the
//! transport (so it is tested with plain byte buffers).
//!
//! For a Write-with-immediate completion the worker widens the 32-bit immediate to the
//! connection sequence `c` ([`ConnectionIngest::conn_seq_for_imm`]), copies slot `c mod slots`
//! and calls [`ConnectionIngest::on_slot`]; for a Send completion it copies the receive buffer
//! and calls [`ConnectionIngest::on_send`]. Then, in order (DESIGN.md §4, §5):
//!
//! 1. *Slot check* (Write-with-immediate only): the slot's header sequence must be `c`. A
//!    later sequence means the agent lapped the ring (`ring_overrun`); anything else is
//!    `imm_mismatch`. Never accepted as data.
//! 2. *Frame check*: header view (`malformed_frame`), CRC32C (`torn_slot` on the ring,
//!    `crc_mismatch` on Send), size (`limit_exceeded`), epoch (`epoch_mismatch`).
//! 3. *Connection tracker* (connection sequence) and *stream tracker* (stream sequence):
//!    frames skipped by a gap are missing until they arrive late (accepted) or leave the
//!    reorder window, in frames or in time (`reorder_window_seconds`, settled at every frame
//!    and at the worker's sweep, [`ConnectionIngest::handle_timeout`]; then lost, counted
//!    once, never taken back); duplicates and stale frames (already settled) are discarded
//!    and counted apart. A stream's first frame with stream sequence `s > 0` means frames
//!    `0..s` were lost (agents start every stream at stream sequence 0 in each epoch).
//! 4. *Payload*: decoded with the configured limits (`malformed_payload`, `limit_exceeded`,
//!    after tracking: such frames count as received by the tracker and dropped), then stored
//!    (series store, log sink; record-level drops counted).
//!
//! Accounting per stream, once its last frame is in ([`ConnectionIngest::close`] with the
//! agent's `Goodbye`): `sent = accepted + lost + dropped_after_tracking` where `lost` is the
//! tracker's settled loss plus the leading loss. Before that, at any instant,
//! `accepted + lost + missing + dropped_after_tracking ≤ sent`, and every counter only grows.
//! A session that ends without a `Goodbye` ([`ConnectionIngest::end_without_goodbye`]) is
//! settled from the agent's last heartbeat (the sequences it had sent by then); only what
//! was sent after that heartbeat is unknown.
//!
//! Records are settled with their frame: a frame's records count as received or lost only
//! once its sequence leaves the reorder window (or the session is settled), from the
//! cumulative record counts of the settled frames, so `records_lost_total` never counts the
//! records of a frame that is merely late.
//!
//! **Replayed log records.** An agent killed without a final checkpoint reads again, after
//! its restart, the lines it had sent since its last checkpoint. Each log record names its
//! file (`file_id`, stable across the agent's restarts) and the offset just after its line
//! (`end_offset`). [`DeliveredLogs`] keeps, per agent id and file, the highest `end_offset`
//! delivered in the agent's *earlier* epochs (each connection's highest is folded in when it
//! ends); a record of a later epoch at or below it is a replay: not delivered, counted only
//! in `records_replayed_total` (its frame is received). Records with `file_id` 0 (older
//! agents) are never discarded, and nothing is discarded within one epoch (reordering there
//! is the trackers' business). Per stream: records sent `= received + lost + dropped +
//! replayed`.
//!
//! **Delivery.** Accepted records leave through a [`Delivery`]: in the collector
//! [`Outputs`] (the [`SeriesStore`], the [`LogSink`] and the configured outputs, such as
//! remote-write), in tests any recording or null one. `ConnectionIngest` is generic over it
//! (static dispatch: the collector's worker and the benches call the same monomorphic code
//! as before the trait existed).
//!
//! **Layout.** A frame goes through four steps, one module each: `check` (the slot and frame
//! checks, 1 and 2 above), `track` (the trackers, 3), `deliver` (decode and delivery, 4) and
//! `account` (the stream's ledger); `stream` holds the per-stream state and its settling,
//! `replay` the [`DeliveredLogs`]. This module holds the connection's state and what happens
//! outside a frame: the sweep, the reports and the end of the session.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use uctel_protocol::borrowed::MetricBatchView;
use uctel_protocol::control::{DictAck, Goodbye, Heartbeat, Report, StreamFinal, StreamReport};
use uctel_protocol::dict::{KnownValue, SeriesDict};
use uctel_protocol::limits::Limits;
use uctel_protocol::seq::Seq;
use uctel_protocol::stream::StreamName;
use uctel_protocol::tracker::{CloseError, SequenceTracker, TrackerConfig};

use crate::logsink::LogSink;
pub use crate::outputs::{Delivery, Outputs};
use crate::store::SeriesStore;
use crate::telemetry::{AgentTelemetry, DropReason};

/// Most streams tracked per connection; frames of further streams are dropped
/// (`limit_exceeded`) so an agent cannot grow collector memory without bound. At most 1024 so
/// that a `Report` carrying every stream fits the 64 KiB control message limit even with
/// every counter at its largest varint (61 bytes per stream; checked by a test): a larger
/// report could not be sent and the connection would end at every report interval.
pub const MAX_STREAMS_PER_CONNECTION: usize = 1024;

mod account;
mod check;
mod deliver;
#[cfg(test)]
mod dict_tests;
#[cfg(test)]
mod known_tests;
mod replay;
mod stream;
mod track;

use stream::StreamState;

pub use replay::{DeliveredLogs, MAX_REPLAY_AGENTS, MAX_REPLAY_FILES, MAX_REPLAY_FILES_PER_AGENT};

/// `a` is after `b` in serial-number order (RFC 1982 practical form on 64 bits).
fn is_after(a: u64, b: u64) -> bool {
    Seq::new(a).is_after(Seq::new(b))
}

/// Frames a `Goodbye` claims as lost beyond what `tracker` saw in `epoch`: the tail
/// `final_seq − highest` when the epoch was observed (`None` when `final_seq` is behind, which
/// [`SequenceTracker::close`] reports), all of `0..=final_seq` otherwise.
fn claimed_tail(tracker: &SequenceTracker, epoch: u64, final_seq: u64) -> Option<u64> {
    let counts = tracker.counts();
    if counts.epoch == Some(epoch) {
        Seq::new(final_seq).forward_from(Seq::new(counts.highest))
    } else {
        Some(final_seq.saturating_add(1))
    }
}

/// What happened to one frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameOutcome {
    /// Accepted and delivered (`records` records).
    Accepted {
        /// Records in the frame.
        records: u32,
    },
    /// A duplicate, counted in `frames_duplicate_total`, not delivered.
    Duplicate,
    /// Its sequence was settled already (received, or counted lost): counted in
    /// `frames_stale_total`, not delivered.
    Stale,
    /// Dropped, counted under the reason.
    Dropped(DropReason),
}

/// Cumulative accounting of one stream over every connection of an agent (for tests and the
/// final log line of a connection).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamLedger {
    /// Frames accepted and delivered.
    pub accepted: u64,
    /// Frames lost (settled: left the reorder window unseen, or missing at the end of the
    /// session; leading and tail loss included).
    pub lost: u64,
    /// Frames skipped by a gap that may still arrive (inside the reorder window).
    pub missing: u64,
    /// Frames that arrived out of order (after a later one).
    pub late: u64,
    /// Duplicate frames.
    pub duplicate: u64,
    /// Frames tracked, then dropped (bad payload).
    pub dropped_after_tracking: u64,
    /// Records in accepted frames.
    pub records_received: u64,
    /// Records of settled frames that never arrived (from the cumulative record counts).
    pub records_lost: u64,
    /// Log records of accepted frames discarded as replays of an earlier epoch.
    pub records_replayed: u64,
}

/// Connection-level summary returned by [`ConnectionIngest::close`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CloseSummary {
    /// Per stream (this connection only).
    pub streams: Vec<(u32, StreamLedger)>,
    /// Connection-sequence frames received (distinct).
    pub conn_received: u64,
    /// Connection-sequence frames lost (tracker, tail included).
    pub conn_lost: u64,
    /// Frames dropped before the connection tracker (their sequence untrusted).
    pub dropped_before_tracking: u64,
}

/// Who named the agent's last sequences.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    /// Its `Goodbye`: the final sequences.
    Goodbye,
    /// Its last heartbeat before the session ended without a `Goodbye`: what it had sent by
    /// then.
    Heartbeat,
}

impl Source {
    fn as_str(self) -> &'static str {
        match self {
            Source::Goodbye => "goodbye",
            Source::Heartbeat => "last heartbeat",
        }
    }
}

/// Where the frame came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PathKind {
    Ring,
    Send,
}

/// The per-connection ingest state: trackers, counters, delivery (through `D`, the
/// collector's [`Outputs`] unless said otherwise).
#[derive(Debug)]
pub struct ConnectionIngest<D = Outputs> {
    agent: String,
    instance: String,
    epoch: u64,
    limits: Limits,
    tracker_config: TrackerConfig,
    delivery: D,
    tel: AgentTelemetry,
    conn: SequenceTracker,
    /// Looked up three or four times per frame: foldhash (seeded per map) rather than
    /// SipHash; at most [`MAX_STREAMS_PER_CONNECTION`] entries.
    streams: HashMap<u32, StreamState, foldhash::fast::RandomState>,
    consumed: Option<u64>,
    dropped_before_tracking: u64,
    conn_lost_emitted: u64,
    unseen_conn_lost: u64,
    /// The agent's epoch before this connection, when it had connected before
    /// ([`ConnectionIngest::set_previous_epoch`]).
    previous_epoch: Option<u64>,
    /// The sequences the agent's last heartbeat said it had sent (connection, streams).
    last_heartbeat: Option<(Option<u64>, Vec<StreamFinal>)>,
    /// Decode storage reused for every metrics frame ([`MetricBatchView::recycle`]): records
    /// are views into the frame, so the steady state allocates nothing per frame.
    metrics: MetricBatchView<'static>,
    /// The agent's log offsets delivered in earlier epochs ([`ConnectionIngest::share_delivered`]).
    delivered: DeliveredLogs,
    /// This connection's highest delivered `end_offset` per `file_id`, folded into
    /// `delivered` when the connection ends.
    file_highs: HashMap<u64, u64>,
    /// On an RC lane: `rc_gap_frames_total`, which every connection-sequence loss also
    /// counts ([`ConnectionIngest::set_rc_lane`]).
    rc_gaps: Option<prometheus::IntCounter>,
    /// With an RC lane on the connection: its stream ids, and whether this ingest takes only
    /// those (the RC lane's) or all others (the UC lane's); `None`: every stream.
    lane_streams: Option<(Vec<u32>, bool)>,
    /// The series dictionary of each stream that sent `metrics_dict` frames, for this
    /// connection's epoch (at most [`MAX_STREAMS_PER_CONNECTION`], as the trackers).
    dicts: HashMap<u32, SeriesDict>,
    /// The values of a `metrics_dict` frame read by id alone, reused
    /// (`SeriesDict::decode_known`).
    known: Vec<KnownValue>,
    /// Where the dictionaries' acknowledgments go, when the agent and the collector agreed
    /// on the series dictionary ([`ConnectionIngest::set_dict_acks`]).
    dict_acks: Option<DictAckOutbox>,
}

/// The series-dictionary acknowledgments (`DictAck`) a connection's ingest produced, for
/// its control session to send: at most one per stream per report, and only when the
/// stream's acknowledged prefix advanced. Clone to share.
#[derive(Clone, Debug, Default)]
pub struct DictAckOutbox(Arc<std::sync::Mutex<Vec<DictAck>>>);

impl DictAckOutbox {
    /// Takes what waits, oldest first.
    pub fn take(&self) -> Vec<DictAck> {
        std::mem::take(
            &mut *self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    fn put(&self, acks: impl IntoIterator<Item = DictAck>) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend(acks);
    }
}

impl ConnectionIngest<Outputs> {
    /// State for a new connection of `agent` (hostname `instance`) in `epoch`, delivering
    /// into `store` and `logs`.
    ///
    /// # Errors
    /// An invalid tracker configuration.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        agent: &str,
        instance: &str,
        epoch: u64,
        limits: Limits,
        tracker_config: TrackerConfig,
        store: SeriesStore,
        logs: Arc<LogSink>,
        tel: AgentTelemetry,
    ) -> Result<ConnectionIngest, uctel_protocol::tracker::TrackerConfigError> {
        ConnectionIngest::with_delivery(
            agent,
            instance,
            epoch,
            limits,
            tracker_config,
            Outputs::new(store, logs),
            tel,
        )
    }
}

impl<D> ConnectionIngest<D> {
    /// Folds this connection's highest delivered log offsets into [`DeliveredLogs`], once
    /// (at the end of the connection; also on drop).
    fn fold_delivered(&mut self) {
        let highs = std::mem::take(&mut self.file_highs);
        self.delivered.fold(&self.agent, self.epoch, &highs);
    }
}

impl<D: Delivery> ConnectionIngest<D> {
    /// State for a new connection of `agent` (hostname `instance`) in `epoch`, delivering
    /// through `delivery`.
    ///
    /// # Errors
    /// An invalid tracker configuration.
    pub fn with_delivery(
        agent: &str,
        instance: &str,
        epoch: u64,
        limits: Limits,
        tracker_config: TrackerConfig,
        delivery: D,
        tel: AgentTelemetry,
    ) -> Result<ConnectionIngest<D>, uctel_protocol::tracker::TrackerConfigError> {
        Ok(ConnectionIngest {
            agent: agent.to_string(),
            instance: instance.to_string(),
            epoch,
            limits,
            tracker_config,
            delivery,
            tel,
            conn: SequenceTracker::new(tracker_config)?,
            streams: HashMap::default(),
            consumed: None,
            dropped_before_tracking: 0,
            conn_lost_emitted: 0,
            unseen_conn_lost: 0,
            previous_epoch: None,
            last_heartbeat: None,
            metrics: MetricBatchView::new(),
            delivered: DeliveredLogs::default(),
            file_highs: HashMap::new(),
            rc_gaps: None,
            lane_streams: None,
            dicts: HashMap::new(),
            known: Vec::new(),
            dict_acks: None,
        })
    }

    /// The collector's [`DeliveredLogs`], shared by every connection, so log records this
    /// agent already delivered in an earlier epoch are discarded as replays (module
    /// documentation). Without it a connection compares only with itself (never discards).
    pub fn share_delivered(&mut self, delivered: DeliveredLogs) {
        self.delivered = delivered;
    }

    /// Sends the series dictionaries' acknowledgments to `outbox` (the agent announced the
    /// series dictionary and the collector took it): at each [`ConnectionIngest::report`],
    /// one `DictAck` per stream whose known prefix advanced. Without it none is produced
    /// (an agent that did not ask never gets a message it does not know).
    pub fn set_dict_acks(&mut self, outbox: DictAckOutbox) {
        self.dict_acks = Some(outbox);
    }

    /// The acknowledgments due now: per stream whose dictionary's known prefix advanced
    /// since the last call. Called by [`ConnectionIngest::report`] (once per report
    /// interval: the rate limit).
    pub fn take_dict_acks(&mut self) -> Vec<DictAck> {
        let epoch = self.epoch;
        self.dicts
            .iter_mut()
            .filter_map(|(stream_id, d)| {
                d.take_ack().map(|known_up_to| DictAck {
                    epoch,
                    stream_id: *stream_id,
                    known_up_to,
                })
            })
            .collect()
    }

    /// Where this connection delivers.
    pub fn delivery(&self) -> &D {
        &self.delivery
    }

    /// The epoch of the agent's previous connection, `None` for an agent not seen before.
    /// When it differs from this connection's epoch, the agent restarted or reconnected: the
    /// connection's and each stream's first frame count one `epoch_change` reset
    /// (`connection_resets_total`, `stream_resets_total`), never loss (DESIGN.md §5).
    pub fn set_previous_epoch(&mut self, previous: Option<u64>) {
        self.previous_epoch = previous;
    }

    /// This ingest serves an RC lane (DESIGN.md §8b): every frame missing from its
    /// connection sequence is also counted in `gaps` (`rc_gap_frames_total`).
    pub fn set_rc_lane(&mut self, gaps: prometheus::IntCounter) {
        self.rc_gaps = Some(gaps);
    }

    /// The connection has an RC lane carrying the streams `rc_streams`: this ingest (`only`
    /// true: the RC lane's; false: the UC lane's) drops a frame of a stream that travels on
    /// the other lane as `wrong_lane`, before tracking it.
    pub fn set_lane_streams(&mut self, rc_streams: Vec<u32>, only: bool) {
        self.lane_streams = Some((rc_streams, only));
    }

    /// True when this connection started a new epoch of an agent seen before.
    fn epoch_changed(&self) -> bool {
        self.previous_epoch.is_some_and(|p| p != self.epoch)
    }

    /// The agent's metric handles.
    pub fn telemetry(&self) -> &AgentTelemetry {
        &self.tel
    }

    /// The connection sequence a Write-with-immediate ImmDt stands for: the 64-bit sequence
    /// nearest the highest seen whose low 32 bits are `imm` (DESIGN.md §4, §5).
    pub fn conn_seq_for_imm(&self, imm: u32) -> u64 {
        self.conn.extend(imm)
    }

    /// Highest connection sequence processed (the credit point reported to the agent), `None`
    /// before the first frame.
    pub fn consumed(&self) -> Option<u64> {
        self.consumed
    }

    /// Counts `n` frames dropped before they could be tracked (queue full, transport drops,
    /// error completions): they show up as gaps, so the connection-level loss subtracts them.
    pub fn drop_before_tracking(
        &mut self,
        reason: DropReason,
        n: u64,
        detail: &dyn std::fmt::Display,
    ) {
        self.dropped_before_tracking = self.dropped_before_tracking.saturating_add(n);
        self.tel.drop_frames(reason, n, detail);
    }

    /// Only counts `n` earlier drops in the connection accounting (they were already counted
    /// in `frames_dropped_total`).
    pub fn note_dropped_before_tracking(&mut self, n: u64) {
        self.dropped_before_tracking = self.dropped_before_tracking.saturating_add(n);
    }

    fn drop(&mut self, reason: DropReason, detail: &dyn std::fmt::Display) -> FrameOutcome {
        self.drop_before_tracking(reason, 1, detail);
        FrameOutcome::Dropped(reason)
    }

    /// A Send completion delivered `message` (the receive buffer, `byte_len` bytes).
    pub fn on_send(&mut self, message: &[u8], now: Instant) -> FrameOutcome {
        self.on_frame(message, PathKind::Send, now)
    }

    /// One frame, through the four steps in order: [`check`](Self::check) (the frame
    /// checks), [`track`](Self::track) (connection and stream trackers),
    /// [`deliver`](Self::deliver) (decode and hand over the records) and
    /// [`account`](Self::account) (the stream's ledger). The first two may end the frame
    /// early with its outcome, counted.
    fn on_frame(&mut self, bytes: &[u8], path: PathKind, now: Instant) -> FrameOutcome {
        let (frame, header) = match self.check(bytes, path) {
            Ok(checked) => checked,
            Err(outcome) => return outcome,
        };
        if let Err(outcome) = self.track(&header, now) {
            return outcome;
        }
        let delivered = self.deliver(&header, frame.payload(), now);
        self.account(&header, delivered)
    }

    /// The reorder window in time (`reorder_window_seconds`, RFC 8985 §6.2): counts as lost
    /// every missing frame, of the connection and of each stream, after which a later frame
    /// arrived at least the reorder time before `now`, brings `frames_lost_total`,
    /// `records_lost_total` and `frames_missing` up to date, and then the connection's
    /// loss. Called by the worker at its stats fold (every 0.1 s while frames are missing),
    /// after it folded the transport's drops ([`ConnectionIngest::drop_before_tracking`]),
    /// so a gap is counted even when no further frame arrives.
    pub fn handle_timeout(&mut self, now: Instant) {
        let _ = self.conn.handle_timeout(now);
        for stream in self.streams.values_mut() {
            if stream.tracker.handle_timeout(now) > 0 {
                stream.sync();
            }
        }
        self.update_conn_lost();
    }

    /// When [`ConnectionIngest::handle_timeout`] next has work: the earliest reorder-time
    /// deadline of the connection's and its streams' missing frames; `None` when no frame
    /// is missing.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.streams
            .values()
            .filter_map(|s| s.tracker.poll_timeout())
            .chain(self.conn.poll_timeout())
            .min()
    }

    /// RFC 3550 A.3 interval statistics for the `Report` to the agent; also sets the
    /// `loss_ratio` gauges, the connection-level loss counter and the agent's series gauge.
    /// The caller folds the transport's drops first (as for
    /// [`ConnectionIngest::handle_timeout`]).
    pub fn report(&mut self) -> Report {
        self.update_conn_lost();
        if let Some(outbox) = self.dict_acks.clone() {
            outbox.put(self.take_dict_acks());
        }
        let series = self.delivery.series_count(&self.agent);
        self.tel
            .series
            .set(i64::try_from(series).unwrap_or(i64::MAX));
        let mut streams: Vec<StreamReport> = self
            .streams
            .iter_mut()
            .map(|(id, s)| {
                let interval = s.tracker.interval_report();
                s.tel.loss_ratio.set(interval.fraction_lost);
                let ledger = s.ledger();
                StreamReport {
                    stream_id: *id,
                    received: s.tracker.counts().received,
                    lost: ledger.lost,
                    late: ledger.late,
                    duplicate: ledger.duplicate,
                    loss_fraction: interval.fraction_lost.clamp(0.0, 1.0),
                }
            })
            .collect();
        streams.sort_by_key(|s| s.stream_id);
        let conn = self.conn.interval_report();
        let counts = self.conn.counts();
        Report {
            consumed_conn_seq: self.consumed.unwrap_or(0),
            streams,
            conn_received: counts.received,
            conn_lost: counts.lost.saturating_add(self.unseen_conn_lost),
            conn_loss_fraction: conn.fraction_lost.clamp(0.0, 1.0),
            credit_grant: None,
            rc_lane: None,
        }
    }

    /// The agent said goodbye: settle tail loss from its final sequences
    /// (`SequenceTracker::close`) and record counts, and return the accounting.
    ///
    /// A `Goodbye` is believed only as far as a sequence jump would be: a final sequence that
    /// claims more than `max_dropout` frames lost at once (the tracker's resync rule,
    /// DESIGN.md §5), or a final record count above what the claimed frames can carry
    /// (`max_records_per_frame` each), is logged and not counted, so a lying or confused
    /// agent cannot push the loss counters by up to 2^64.
    ///
    /// Only a `Goodbye` with reason `shutdown` ends the agent's series in the outputs
    /// (remote-write stale markers): with `reconnect` the agent goes on, on this collector
    /// or another of its pool, under the same labels, and a stale marker would cut its series
    /// in two. An agent that never comes back goes stale after `staleness_seconds`.
    pub fn close(&mut self, goodbye: &Goodbye) -> CloseSummary {
        self.settle_from(goodbye.final_conn_seq, &goodbye.streams, Source::Goodbye);
        self.fold_delivered();
        if goodbye.reason == uctel_protocol::control::GoodbyeReason::Shutdown as i32 {
            self.delivery.agent_left(&self.agent);
        }
        self.summary()
    }

    /// The agent's heartbeat: remember the sequences it had sent by then, the lower bound
    /// of its tail if the session ends without a `Goodbye`.
    pub fn on_heartbeat(&mut self, heartbeat: &Heartbeat) {
        if heartbeat.sent_conn_seq.is_some() || !heartbeat.sent_streams.is_empty() {
            self.last_heartbeat = Some((heartbeat.sent_conn_seq, heartbeat.sent_streams.clone()));
        }
    }

    /// The session ended without a `Goodbye` (the control connection closed or went
    /// silent): every frame still missing is lost (a later one arrived, or the agent's last
    /// heartbeat says it was sent), and so is the tail up to the sequences of that
    /// heartbeat. What the agent sent after its last heartbeat is unknown and counted
    /// nowhere; `sessions_ended_total{reason="no_goodbye"}` says that it happened.
    pub fn end_without_goodbye(&mut self) -> CloseSummary {
        let (conn, streams) = self.last_heartbeat.take().unwrap_or_default();
        self.settle_from(conn, &streams, Source::Heartbeat);
        if !self.conn.is_closed() {
            let _ = self.conn.settle(self.epoch);
        }
        let epoch = self.epoch;
        for stream in self.streams.values_mut() {
            if !stream.tracker.is_closed() {
                let _ = stream.tracker.settle(epoch);
            }
            stream.sync();
        }
        self.fold_delivered();
        self.summary()
    }

    /// Settle the connection and the streams named in `streams` from the agent's last
    /// sequences (`final_conn` and each `StreamFinal`), as its `Goodbye` or last heartbeat
    /// tells them. From a heartbeat a sequence behind the highest received is normal
    /// (frames sent since); the segment is then settled at the highest.
    fn settle_from(&mut self, final_conn: Option<u64>, streams: &[StreamFinal], source: Source) {
        let max_dropout = self.tracker_config.max_dropout;
        let per_frame = u64::try_from(self.limits.max_records_per_frame).unwrap_or(u64::MAX);
        let what = source.as_str();
        let implausible = |item: &str, id: &dyn std::fmt::Display, claimed: u64| {
            tracing::warn!(
                agent = %self.agent,
                stream = %id,
                claimed,
                max_dropout,
                "{what}: final {item} not believed (beyond the maximum dropout); not counted as loss"
            );
        };
        let final_conn = final_conn.filter(|f| {
            let claimed = claimed_tail(&self.conn, self.epoch, *f).unwrap_or(0);
            let believed = claimed <= max_dropout;
            if !believed {
                implausible("connection sequence", &"connection", claimed);
            }
            believed
        });
        if let Some(final_conn) = final_conn {
            // Connection sequences start at 0 each epoch: a Goodbye that overtook every
            // frame of the connection closes `0..=final` as lost, and frames that still
            // arrive are stale.
            match self.conn.close_from(self.epoch, 0, final_conn) {
                Ok(_) | Err(CloseError::AlreadyClosed { .. }) => {}
                Err(CloseError::EpochNotObserved { .. }) => {
                    // The epoch was retired by a later one (not within one connection):
                    // the whole sequence 0..=final is lost.
                    self.unseen_conn_lost = self
                        .unseen_conn_lost
                        .saturating_add(final_conn.saturating_add(1));
                }
                Err(CloseError::BehindHighest { .. }) if source == Source::Heartbeat => {
                    let _ = self.conn.settle(self.epoch);
                }
                Err(e) => {
                    tracing::warn!(agent = %self.agent, error = %e, "{what}: connection sequence not settled")
                }
            }
        }
        for fin in streams {
            let claimed = match (fin.final_stream_seq, self.streams.get(&fin.stream_id)) {
                (None, _) => 0,
                (Some(f), Some(s)) => claimed_tail(&s.tracker, self.epoch, f).unwrap_or(0),
                (Some(f), None) => f.saturating_add(1),
            };
            if claimed > max_dropout {
                implausible("stream sequence", &StreamName(fin.stream_id), claimed);
                continue;
            }
            // A stream the agent sent nothing on (not configured there) has nothing to
            // settle and gets no state, so no series of it shows.
            let silent = fin.final_stream_seq.is_none() && fin.final_record_count == 0;
            let full = self.streams.len() >= MAX_STREAMS_PER_CONNECTION;
            if !self.streams.contains_key(&fin.stream_id) && (silent || full) {
                continue;
            }
            let Ok(tracker) = SequenceTracker::new(self.tracker_config) else {
                continue;
            };
            let tel = &self.tel;
            let stream = self
                .streams
                .entry(fin.stream_id)
                .or_insert_with(|| StreamState::new(tracker, tel.stream(fin.stream_id)));
            let max_records = stream
                .max_record_count
                .saturating_add(claimed.saturating_mul(per_frame));
            let record_count = if fin.final_record_count > max_records {
                implausible(
                    "record count",
                    &StreamName(fin.stream_id),
                    fin.final_record_count,
                );
                None
            } else {
                Some(fin.final_record_count)
            };
            if let Some(final_seq) = fin.final_stream_seq {
                // Stream sequences start at 0 each epoch too (DESIGN.md §5).
                match stream.tracker.close_from(self.epoch, 0, final_seq) {
                    Ok(_) | Err(CloseError::AlreadyClosed { .. }) => {}
                    Err(CloseError::EpochNotObserved { .. }) => {
                        let all = final_seq.saturating_add(1);
                        stream.leading_lost = stream.leading_lost.saturating_add(all);
                    }
                    Err(CloseError::BehindHighest { .. }) if source == Source::Heartbeat => {
                        let _ = stream.tracker.settle(self.epoch);
                    }
                    Err(e) => tracing::warn!(
                        agent = %self.agent,
                        stream = %StreamName(fin.stream_id),
                        error = %e,
                        "{what}: stream sequence not settled"
                    ),
                }
            }
            // Everything of the stream is settled now (a stream that sent nothing has no
            // frames to settle): its records too.
            stream.settle_records(true);
            if let Some(count) = record_count {
                stream.max_record_count = stream.max_record_count.max(count);
                stream.settled_record_count = stream.settled_record_count.max(count);
            }
            stream.sync();
        }
        self.update_conn_lost();
    }

    /// The accounting so far, with nothing settled: what [`ConnectionIngest::close`] returns
    /// after a `Goodbye`, and all there is for a connection that ended without one (an agent
    /// that vanished: frames after the last one received are not known to exist, so no tail
    /// loss is counted). Connection totals are those of the connection tracker.
    pub fn summary(&mut self) -> CloseSummary {
        self.update_conn_lost();
        let counts = self.conn.counts();
        CloseSummary {
            streams: self.ledger(),
            conn_received: counts.received,
            conn_lost: counts.lost.saturating_add(self.unseen_conn_lost),
            dropped_before_tracking: self.dropped_before_tracking,
        }
    }

    /// Accounting of every stream so far (this connection).
    pub fn ledger(&self) -> Vec<(u32, StreamLedger)> {
        let mut v: Vec<_> = self
            .streams
            .iter()
            .map(|(id, s)| (*id, s.ledger()))
            .collect();
        v.sort_by_key(|(id, _)| *id);
        v
    }

    /// Brings `connection_frames_lost_total` up to the connection-sequence gaps that no
    /// counted drop explains: `lost + unseen − dropped_before_tracking`, a high-water mark
    /// (the counter only grows). A frame the UC responder dropped (`psn_gap`, `cut_short`,
    /// `no_receive_wr`: IBTA 9.7.5 class D/D1 drops, counted by the QP) is both a drop and a
    /// gap, and the QP's counters reach `dropped_before_tracking` only when the worker folds
    /// them; the responder counts such a drop before it completes any later message, so
    /// every gap the tracker counted lost by then has its drop folded as long as this runs
    /// only right after a fold. Run earlier (at each frame), a gap counted before its drop
    /// was folded raised the mark for good and the per-connection sum overshot.
    fn update_conn_lost(&mut self) {
        let lost = self
            .conn
            .counts()
            .lost
            .saturating_add(self.unseen_conn_lost)
            .saturating_sub(self.dropped_before_tracking);
        if lost > self.conn_lost_emitted {
            self.tel
                .connection_frames_lost
                .inc_by(lost - self.conn_lost_emitted);
            if let Some(gaps) = &self.rc_gaps {
                gaps.inc_by(lost - self.conn_lost_emitted);
            }
            self.conn_lost_emitted = lost;
        }
    }
}

impl<D> Drop for ConnectionIngest<D> {
    /// A connection ended by any path (replaced, shutdown) still folds what it delivered.
    fn drop(&mut self) {
        self.fold_delivered();
    }
}

#[cfg(test)]
mod test_support;

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;

    #[test]
    fn a_connection_without_goodbye_keeps_its_connection_totals() {
        let mut r = rig();
        for c in [0u64, 1, 3] {
            let _ = r.ingest.on_send(&frame(c, 1, c, c + 1), now());
        }
        // Before the session ends, 2 may still arrive: missing, not lost.
        let s = r.ingest.summary();
        assert_eq!((s.conn_received, s.conn_lost), (3, 0), "{s:?}");
        assert_eq!((s.streams[0].1.lost, s.streams[0].1.missing), (0, 1));
        // The session ended without Goodbye (and no heartbeat): 2 is lost for sure, as a later
        // frame arrived; nothing after 3 is known.
        let s = r.ingest.end_without_goodbye();
        assert_eq!((s.conn_received, s.conn_lost), (3, 1), "{s:?}");
        assert_eq!(s.streams.len(), 1);
        assert_eq!((s.streams[0].1.accepted, s.streams[0].1.lost), (3, 1));
        assert_eq!(s.streams[0].1.missing, 0);
    }

    /// Killed agent: the last heartbeat names what it had sent, so the tail up to it is
    /// counted lost; only what it sent after that heartbeat is unknown.
    #[test]
    fn a_session_without_goodbye_is_settled_from_the_last_heartbeat() {
        let mut r = rig();
        for s in 0..3u64 {
            let _ = r.ingest.on_send(&frame(s, 1, s, s + 1), now());
        }
        r.ingest.on_heartbeat(&Heartbeat {
            sequence: 7,
            timestamp_ns: 1,
            sent_conn_seq: Some(5),
            sent_streams: vec![StreamFinal {
                stream_id: 1,
                final_stream_seq: Some(5),
                final_record_count: 12,
            }],
            ..Default::default()
        });
        // A frame sent after the heartbeat arrived too: the heartbeat is behind, fine.
        let _ = r.ingest.on_send(&frame(7, 1, 7, 14), now());
        let s = r.ingest.end_without_goodbye();
        let l = s.streams[0].1;
        // 3, 4, 5 (named by the heartbeat) and 6 (missing below 7) are lost.
        assert_eq!((l.accepted, l.lost, l.missing), (4, 4, 0), "{l:?}");
        assert_eq!(l.records_lost, 14 - 4);
        assert_eq!((s.conn_received, s.conn_lost), (4, 4));
        assert_eq!(
            exported(&r, "uctel_collector_frames_lost_total", "metrics"),
            4
        );
    }

    /// A black-holed agent: nothing arrived, the heartbeat names what was sent.
    #[test]
    fn a_session_where_nothing_arrived_is_settled_from_the_last_heartbeat() {
        let mut r = rig();
        r.ingest.on_heartbeat(&Heartbeat {
            sequence: 2,
            timestamp_ns: 1,
            sent_conn_seq: Some(9),
            sent_streams: vec![
                StreamFinal {
                    stream_id: 1,
                    final_stream_seq: Some(5),
                    final_record_count: 60,
                },
                StreamFinal {
                    stream_id: 2,
                    final_stream_seq: Some(3),
                    final_record_count: 20,
                },
            ],
            ..Default::default()
        });
        let s = r.ingest.end_without_goodbye();
        assert_eq!((s.conn_received, s.conn_lost), (0, 10), "{s:?}");
        let by_id: HashMap<u32, StreamLedger> = s.streams.into_iter().collect();
        assert_eq!((by_id[&1].lost, by_id[&1].records_lost), (6, 60));
        assert_eq!((by_id[&2].lost, by_id[&2].records_lost), (4, 20));
        assert_eq!(
            exported(&r, "uctel_collector_frames_lost_total", "metrics"),
            6
        );
        assert_eq!(exported(&r, "uctel_collector_frames_lost_total", "logs"), 4);
        assert_eq!(
            exported(&r, "uctel_collector_records_lost_total", "logs"),
            20
        );
    }

    #[test]
    fn report_with_every_stream_at_its_largest_fits_a_control_message() {
        let worst = StreamReport {
            stream_id: u32::MAX,
            received: u64::MAX,
            lost: u64::MAX,
            late: u64::MAX,
            duplicate: u64::MAX,
            loss_fraction: 0.5,
        };
        let report = Report {
            consumed_conn_seq: u64::MAX,
            streams: vec![worst; MAX_STREAMS_PER_CONNECTION],
            conn_received: u64::MAX,
            conn_lost: u64::MAX,
            conn_loss_fraction: 0.5,
            ..Default::default()
        };
        let mut out = Vec::new();
        let encoded = uctel_protocol::control::encode_message(&report.into(), &mut out);
        assert!(encoded.is_ok(), "{encoded:?}");
    }

    #[test]
    fn implausible_goodbye_is_not_counted_as_loss() {
        let mut r = rig();
        for s in 0..3u64 {
            let _ = r.ingest.on_send(&frame(s, 1, s, s + 1), now());
        }
        let max_dropout = TrackerConfig::default().max_dropout;
        let s = r.ingest.close(&Goodbye {
            final_conn_seq: Some(u64::MAX / 2),
            streams: vec![
                // Seen stream: a tail far beyond the maximum dropout.
                StreamFinal {
                    stream_id: 1,
                    final_stream_seq: Some(2 + max_dropout + 1),
                    final_record_count: u64::MAX,
                },
                // Unseen stream: everything up to u64::MAX.
                StreamFinal {
                    stream_id: 2,
                    final_stream_seq: Some(u64::MAX),
                    final_record_count: u64::MAX,
                },
                // Unseen stream, plausible sequence, impossible record count.
                StreamFinal {
                    stream_id: 3,
                    final_stream_seq: Some(0),
                    final_record_count: 5000,
                },
            ],
            ..Default::default()
        });
        assert_eq!(s.conn_lost, 0, "{s:?}");
        let by_id: HashMap<u32, StreamLedger> = s.streams.into_iter().collect();
        assert_eq!((by_id[&1].lost, by_id[&1].records_lost), (0, 0));
        assert!(!by_id.contains_key(&2), "{by_id:?}");
        assert_eq!((by_id[&3].lost, by_id[&3].records_lost), (1, 0));
        let t = r.telemetry.agent("a1").stream(1);
        assert_eq!(t.frames_lost.get(), 0);
        assert_eq!(t.records_lost.get(), 0);
        // A plausible tail still counts, records included (up to 1024 per frame).
        let mut r = rig();
        let _ = r.ingest.on_send(&frame(0, 1, 0, 1), now());
        let s = r.ingest.close(&Goodbye {
            final_conn_seq: Some(10),
            streams: vec![StreamFinal {
                stream_id: 1,
                final_stream_seq: Some(10),
                final_record_count: 2000,
            }],
            ..Default::default()
        });
        assert_eq!(
            (s.streams[0].1.lost, s.streams[0].1.records_lost),
            (10, 1999)
        );
        assert_eq!(s.conn_lost, 10);
    }

    #[test]
    fn report_carries_credits_and_fractions() {
        let mut r = rig();
        for s in [0u64, 1, 3] {
            let _ = r.ingest.on_send(&frame(s, 1, s, s + 1), now());
        }
        let report = r.ingest.report();
        assert_eq!(report.consumed_conn_seq, 3);
        assert_eq!(report.conn_received, 3);
        // 2 is still inside the reorder window: missing, not (yet) lost.
        assert_eq!(report.conn_lost, 0);
        assert_eq!(report.streams.len(), 1);
        assert!((report.streams[0].loss_fraction - 0.25).abs() < 1e-9);
        let text = String::from_utf8(r.telemetry.render().unwrap()).unwrap();
        assert!(
            text.contains("uctel_collector_series{agent=\"a1\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("uctel_collector_loss_ratio{agent=\"a1\",stream=\"metrics\"} 0.25"),
            "{text}"
        );
        assert!(
            text.contains("uctel_collector_connection_frames_lost_total{agent=\"a1\"} 0"),
            "{text}"
        );
    }

    /// A frame the UC responder dropped (`psn_gap`: a packet of a multi-packet frame lost)
    /// is also a gap in the connection sequence. The connection tracker settles the gap
    /// (here through a frame window of 4) before the worker folds the QP's drop counters;
    /// the connection's loss must then not count it: once the drop is folded, the gap is
    /// explained, and `connection_frames_lost_total`, a counter, could not take it back.
    #[test]
    fn a_gap_explained_by_a_transport_drop_folded_later_is_not_connection_loss() {
        let telemetry = Telemetry::new().unwrap();
        let logs = Arc::new(
            LogSink::open(&LogsConfig {
                sink: LogSinkKind::Stdout,
                ..Default::default()
            })
            .unwrap(),
        );
        let tracker = TrackerConfig {
            reorder_window: 4,
            ..TrackerConfig::default()
        };
        let mut ingest = ConnectionIngest::new(
            "a1",
            "host-a1",
            EPOCH,
            Limits::default(),
            tracker,
            SeriesStore::new(Duration::from_secs(60), 1000),
            logs,
            telemetry.agent("a1"),
        )
        .unwrap();
        let t0 = now();
        // Connection sequence 1 (stream 1, stream sequence 1) was doomed by a lost packet.
        let _ = ingest.on_send(&frame(0, 1, 0, 1), t0);
        for c in 2..=6 {
            let _ = ingest.on_send(&frame(c, 1, c, c + 1), t0);
        }
        let conn = telemetry.agent("a1").connection_frames_lost;
        assert_eq!(ingest.ledger()[0].1.lost, 1, "the stream lost it");
        // The worker's fold: the QP's drop first, then the sweep and the report.
        ingest.drop_before_tracking(
            DropReason::Transport(uctel_transport::api::UcDropReason::PsnGap),
            1,
            &"UC responder",
        );
        ingest.handle_timeout(t0);
        let _ = ingest.report();
        assert_eq!(
            conn.get(),
            0,
            "the gap is the psn_gap drop, not connection loss"
        );
        // A gap no drop explains is connection loss.
        let _ = ingest.on_send(&frame(8, 1, 8, 9), t0);
        for c in 9..=12 {
            let _ = ingest.on_send(&frame(c, 1, c, c + 1), t0);
        }
        ingest.handle_timeout(t0);
        assert_eq!(conn.get(), 1);
        let s = ingest.summary();
        // sent 13 = received 11 + dropped 1 + connection lost 1.
        assert_eq!(
            (s.conn_received, s.dropped_before_tracking, conn.get()),
            (11, 1, 1)
        );
    }

    /// The agent names every stream in its heartbeats and `Goodbye`, also one it sent
    /// nothing on (no sequence, no record: `fast_counters` without the source configured).
    /// Such a stream gets no state and no series: only streams that carry something show.
    #[test]
    fn a_stream_the_agent_sent_nothing_on_shows_no_series() {
        let mut r = rig();
        let _ = r.ingest.on_send(&frame(0, 1, 0, 1), now());
        let fast = uctel_protocol::stream::FAST_COUNTERS;
        let silent = StreamFinal {
            stream_id: fast,
            final_stream_seq: None,
            final_record_count: 0,
        };
        r.ingest.on_heartbeat(&Heartbeat {
            sent_conn_seq: Some(0),
            sent_streams: vec![silent.clone()],
            ..Default::default()
        });
        let s = r.ingest.close(&Goodbye {
            final_conn_seq: Some(0),
            streams: vec![
                StreamFinal {
                    stream_id: 1,
                    final_stream_seq: Some(0),
                    final_record_count: 1,
                },
                silent,
            ],
            ..Default::default()
        });
        let ids: Vec<u32> = s.streams.iter().map(|(id, _)| *id).collect();
        assert_eq!(ids, [1]);
        let text = String::from_utf8(r.telemetry.render().unwrap()).unwrap();
        assert!(!text.contains("stream=\"fast_counters\""), "{text}");
    }
}
