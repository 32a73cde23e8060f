//! The sans-IO send pipeline of one connection (one epoch): records in, stamped frames out.
//!
//! ```text
//!  push_metric / push_log ─► Framer (per stream) ─► ready queue (per stream, bounded)
//!                                                          │ poll_transmit(now)
//!                                              credit? ─── no ──► drop `no_credit`
//!                                                 │ yes
//!                                              pacer admits? ── later ──► Poll::Wait(at)
//!                                                 │ now
//!                                   stamp epoch, conn_seq, stream_seq, record_count, CRC32C
//!                                                 ▼
//!                                           Poll::Transmit
//! ```
//!
//! Rules (DESIGN.md §3, §4):
//!
//! - **Sequences only for frames that leave.** The framer packs records; the stream sequence,
//!   the cumulative record count and the connection sequence are written into the header only
//!   when a frame has a credit and the pacer admits it. A frame dropped at the source
//!   (`no_credit`, …) therefore leaves no gap for the collector to count as network loss, and
//!   `agent frames sent == collector received + lost` holds exactly.
//! - **Never blocks, never queues unboundedly.** The ready queue holds at most
//!   `ready_frames` frames per stream; the caller stops pulling records from the source queues
//!   when [`SenderCore::wants_records`] is false, so the overflow is counted where records
//!   wait (`source_overflow`). A frame finding no credit is dropped, except on a stream that
//!   waits for credit, and except an idle heartbeat (no records), which waits for credit on
//!   every stream.
//! - **Every record is accounted.** Per stream, records pushed = records sent + records
//!   dropped (by reason) + records pending ([`SenderCore::pending_records`]) + records taken
//!   back ([`SenderCore::take_back_metrics`]: metric samples that wait for the next
//!   connection in [`crate::buffer`] when this one ends).
//! - **Fair between streams.** Ready frames are taken round-robin across streams.
//! - **Idle streams send heartbeats** (kind heartbeat, empty payload, next stream sequence,
//!   current cumulative count) so the collector sees a lost tail frame before the next burst.
//!
//! Nothing in here reads a clock or does IO: `now` (for pacing and deadlines) and `unix_ns`
//! (for frame timestamps) are passed in.
//!
//! **Accounting.** The pipeline keeps its own plain counters ([`SenderStats`]: frames,
//! records and bytes sent, frames and records dropped by [`DropReason`], records truncated,
//! per stream, this epoch) and mirrors each count, as it happens, into the daemon's
//! [`SelfMetrics`] given to [`SenderCore::new`] (the exported `uctel_agent_*` counters, the
//! drop log). [`SenderCore::new_unexported`] keeps only the plain counters (tests driving the
//! pipeline on a virtual clock).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use uctel_protocol::frame::{self, FrameHeader};
use uctel_protocol::framer::{BuiltFrame, Framer, FramerError, PushOutcome, Rejection};

use super::metrics::MetricsFramer;
use uctel_protocol::limits::Limits;
use uctel_protocol::payload::{LogRecord, Metric};
use uctel_protocol::samples::SampleSeries;
use uctel_protocol::seq::Seq;

use crate::config::DataPath;
use crate::credits::Credits;
use crate::pacing::{Admit, Pacer, PacerHandle, PacingLimits};
use crate::selfmetrics::{DropReason, SelfMetrics};
use crate::stream::Stream;

mod credit;

/// Settings of one connection's send pipeline.
#[derive(Debug, Clone)]
pub struct SenderConfig {
    /// Frame limits (the negotiated `max_frame_bytes` included).
    pub limits: Limits,
    /// Pacing; `None` disables pacing.
    pub pacing: Option<PacingLimits>,
    /// Frames that may be outstanding beyond the collector's consumed sequence.
    pub credit_window: u64,
    /// Connection sequence of the first frame of this epoch.
    pub first_conn_seq: u64,
    /// Stream sequence of the first frame of each stream in this epoch.
    pub first_stream_seq: u64,
    /// Data path of each stream, indexed by [`Stream::index`].
    pub data_paths: [DataPath; STREAMS],
    /// A non-full frame is closed this long after its first record, per stream.
    pub flush_after: [Duration; STREAMS],
    /// Closed frames waiting for pacing, per stream.
    pub ready_frames: usize,
    /// An idle stream sends a heartbeat frame after this long without a frame; `None`: never.
    pub idle_heartbeat: Option<Duration>,
    /// Per stream, indexed by [`Stream::index`]: take no records while the frames already
    /// built would use up every credit (`on_no_credit: wait`) instead of framing and
    /// dropping (`drop`).
    pub wait_for_credit: [bool; STREAMS],
    /// Per stream, indexed by [`Stream::index`]: whether this pipeline carries the stream.
    /// A connection with an RC lane (DESIGN.md §8b) runs one pipeline per lane, each carrying
    /// the streams of its lane; a stream not carried takes no records
    /// ([`SenderCore::wants_records`]), sends no idle heartbeat nor `LAST_OF_EPOCH` frame, and
    /// its totals in [`SenderCore::final_sequences`] stay zero (the caller takes them from the
    /// pipeline that carries it). All true with one lane.
    pub carries: [bool; STREAMS],
}

/// The number of streams ([`Stream::ALL`]).
pub const STREAMS: usize = Stream::ALL.len();

/// A frame ready to post: stamped and sealed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// The stream.
    pub stream: Stream,
    /// How to post it.
    pub data_path: DataPath,
    /// Connection sequence (ring slot `conn_seq mod slots`, immediate = low 32 bits).
    pub conn_seq: u64,
    /// Stream sequence.
    pub stream_seq: u64,
    /// Records in the frame.
    pub records: u32,
    /// Push index (0-based, per stream, in this pipeline) of the frame's first record; see
    /// [`SenderCore::unsettled_records`].
    pub first_record: u64,
    /// The whole frame, header and payload.
    pub bytes: Vec<u8>,
}

/// What [`SenderCore::poll_transmit`] asks the caller to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Poll {
    /// Post this frame now, then report the outcome with [`SenderCore::sent`] or
    /// [`SenderCore::requeue`] / [`SenderCore::post_failed`].
    Transmit(Transmit),
    /// Nothing to post before this instant (a pacing wait, a flush deadline, a heartbeat), or
    /// until new records arrive when `None`.
    Wait(Option<Instant>),
}

/// The last sequences of each stream, for `Goodbye` (DESIGN.md §6) and for tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamTotals {
    /// Frames posted on the stream in this epoch.
    pub frames: u64,
    /// Records in those frames (the last frame's cumulative `record_count`).
    pub records: u64,
    /// Stream sequence of the last posted frame, `None` if none.
    pub last_stream_seq: Option<u64>,
}

/// Final sequences of the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FinalSequences {
    /// Connection sequence of the last posted frame, `None` if none.
    pub last_conn_seq: Option<u64>,
    /// Frames posted on the connection.
    pub frames: u64,
    /// Per stream, indexed by [`Stream::index`].
    pub streams: [StreamTotals; STREAMS],
}

/// Plain counters of one stream of a [`SenderCore`] (this epoch). Same terms as the agent's
/// self-metrics (`frames_sent_total`, `records_sent_total`, `bytes_sent_total`,
/// `frames_dropped_total{reason}`, `records_dropped_total{reason}`,
/// `records_truncated_total`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamStats {
    /// Frames posted ([`SenderCore::sent`]).
    pub frames_sent: u64,
    /// Records in those frames.
    pub records_sent: u64,
    /// Bytes (header + payload) of those frames.
    pub bytes_sent: u64,
    /// Records cut to fit a frame (sent, not dropped).
    pub records_truncated: u64,
    /// Records taken out of the pipeline unsent, to be sent on the next connection
    /// ([`SenderCore::take_back_metrics`]); neither sent nor dropped here.
    pub records_taken_back: u64,
    /// Frames dropped, by [`DropReason`] (in [`DropReason::ALL`] order).
    frames_dropped: [u64; DropReason::ALL.len()],
    /// Records dropped, by [`DropReason`] (in [`DropReason::ALL`] order).
    records_dropped: [u64; DropReason::ALL.len()],
}

impl StreamStats {
    /// Frames dropped for `reason`.
    pub fn frames_dropped(&self, reason: DropReason) -> u64 {
        self.frames_dropped[reason.index()]
    }

    /// Records dropped for `reason`.
    pub fn records_dropped(&self, reason: DropReason) -> u64 {
        self.records_dropped[reason.index()]
    }

    /// Frames dropped, every reason.
    pub fn frames_dropped_all(&self) -> u64 {
        self.frames_dropped.iter().sum()
    }

    /// Records dropped, every reason.
    pub fn records_dropped_all(&self) -> u64 {
        self.records_dropped.iter().sum()
    }
}

/// Plain counters of a [`SenderCore`], per stream (indexed by [`Stream::index`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SenderStats {
    /// Per stream, indexed by [`Stream::index`].
    pub streams: [StreamStats; STREAMS],
}

impl SenderStats {
    /// The counters of `stream`.
    pub fn stream(&self, stream: Stream) -> &StreamStats {
        &self.streams[stream.index()]
    }
}

/// The plain counters and where they are mirrored.
#[derive(Debug)]
struct Accounting {
    stats: SenderStats,
    export: Option<Arc<SelfMetrics>>,
}

impl Accounting {
    fn sent(&mut self, stream: Stream, records: u64, bytes: u64) {
        let st = &mut self.stats.streams[stream.index()];
        st.frames_sent += 1;
        st.records_sent += records;
        st.bytes_sent += bytes;
        if let Some(m) = &self.export {
            m.frame_sent(stream, records, bytes);
        }
    }

    fn dropped(&mut self, stream: Stream, reason: DropReason, frames: u64, records: u64) {
        let st = &mut self.stats.streams[stream.index()];
        st.frames_dropped[reason.index()] += frames;
        st.records_dropped[reason.index()] += records;
        if let Some(m) = &self.export {
            m.dropped(stream, reason, frames, records);
        }
    }

    fn truncated(&mut self, stream: Stream) {
        self.stats.streams[stream.index()].records_truncated += 1;
        if let Some(m) = &self.export {
            m.truncated(stream);
        }
    }
}

#[derive(Debug)]
struct Pending {
    bytes: Vec<u8>,
    records: u32,
    /// Push index of the first record (meaningless when `records` is 0).
    first: u64,
}

/// A frame posted on an RC QP and not acknowledged yet ([`SenderCore::set_settle_on_ack`]).
#[derive(Debug, Clone, Copy)]
struct InFlight {
    conn_seq: u64,
    stream_seq: u64,
    /// The stream's cumulative record count stamped in the frame.
    record_count: u64,
    records: u32,
    /// Push index of the first record.
    first: u64,
}

impl Pending {
    fn new(f: BuiltFrame, first: u64) -> Self {
        let records = f.records();
        Pending {
            bytes: f.into_bytes(),
            records,
            first,
        }
    }
}

#[derive(Debug)]
struct StreamState {
    stream: Stream,
    /// This pipeline carries the stream ([`SenderConfig::carries`]).
    carried: bool,
    data_path: DataPath,
    wait_for_credit: bool,
    flush_after: Duration,
    /// When the open frame got its first record.
    open_since: Option<Instant>,
    ready: VecDeque<Pending>,
    /// Records pushed (every push call, refused records included, each counted by its
    /// weight: one per sample of a sample series): the next push index.
    pushed: u64,
    /// Push index of the open frame's first record.
    open_first: Option<u64>,
    /// Push index of the oldest record dropped as `shutdown`: from there on nothing is
    /// settled.
    abandoned_from: Option<u64>,
    next_stream_seq: Seq,
    totals: StreamTotals,
    /// Frames posted and not acknowledged yet, oldest first (settle on ack only).
    in_flight: VecDeque<InFlight>,
    /// What of `totals` was acknowledged (settle on ack only).
    acked: StreamTotals,
    /// Last time a frame of this stream was posted (or the epoch started).
    last_sent: Instant,
}

/// The send pipeline of one connection. See the module docs.
#[derive(Debug)]
pub struct SenderCore {
    epoch: u64,
    metrics_framer: MetricsFramer,
    logs_framer: Framer<LogRecord>,
    samples_framer: Framer<SampleSeries>,
    streams: [StreamState; STREAMS],
    pacer: PacerHandle,
    credits: Credits,
    /// Frames that found no credit since the last heartbeat (waiting or dropped).
    without_credit: u64,
    /// An early heartbeat is due (credit ran out, or a grant lowered the limit).
    credit_heartbeat: bool,
    /// An early heartbeat about running out of credit went since the last report.
    asked_for_credit: bool,
    /// Records wait in a source queue for credit ([`SenderCore::set_records_waiting`]).
    records_waiting: bool,
    ready_frames: usize,
    idle_heartbeat: Option<Duration>,
    /// The frame limits the framers check records against (to decode taken-back frames).
    limits: Limits,
    /// The metrics stream is catching up on samples held while disconnected
    /// ([`SenderCore::set_metrics_catching_up`]).
    metrics_catching_up: bool,
    /// The logs stream took records first at the last pull ([`SenderCore::logs_pull_first`]).
    logs_first: bool,
    frames_posted: u64,
    last_conn_seq: Option<u64>,
    /// Records settle when their frame is acknowledged, not when it is posted
    /// ([`SenderCore::set_settle_on_ack`]).
    settle_on_ack: bool,
    /// Frames acknowledged, and the connection sequence of the last one (settle on ack).
    frames_acked: u64,
    last_acked_conn_seq: Option<u64>,
    rr: usize,
    acct: Accounting,
}

impl SenderCore {
    /// A pipeline for epoch `epoch` starting at `now`, mirroring its counts into `stats`.
    ///
    /// # Errors
    /// [`FramerError`] if `config.limits` allow no frame.
    pub fn new(
        config: &SenderConfig,
        epoch: u64,
        now: Instant,
        stats: Arc<SelfMetrics>,
    ) -> Result<SenderCore, FramerError> {
        Self::build(config, epoch, now, Some(stats))
    }

    /// A pipeline that keeps only its plain counters ([`SenderCore::stats`]), exporting
    /// nothing.
    ///
    /// # Errors
    /// [`FramerError`] if `config.limits` allow no frame.
    pub fn new_unexported(
        config: &SenderConfig,
        epoch: u64,
        now: Instant,
    ) -> Result<SenderCore, FramerError> {
        Self::build(config, epoch, now, None)
    }

    fn build(
        config: &SenderConfig,
        epoch: u64,
        now: Instant,
        export: Option<Arc<SelfMetrics>>,
    ) -> Result<SenderCore, FramerError> {
        let state = |s: Stream| StreamState {
            stream: s,
            carried: config.carries[s.index()],
            data_path: config.data_paths[s.index()],
            wait_for_credit: config.wait_for_credit[s.index()],
            flush_after: config.flush_after[s.index()],
            open_since: None,
            ready: VecDeque::new(),
            pushed: 0,
            open_first: None,
            abandoned_from: None,
            next_stream_seq: Seq::new(config.first_stream_seq),
            totals: StreamTotals::default(),
            in_flight: VecDeque::new(),
            acked: StreamTotals::default(),
            last_sent: now,
        };
        Ok(SenderCore {
            epoch,
            metrics_framer: MetricsFramer::new(
                Stream::Metrics.id(),
                config.first_stream_seq,
                config.limits.clone(),
            )?,
            logs_framer: Framer::new(
                Stream::Logs.id(),
                config.first_stream_seq,
                config.limits.clone(),
            )?,
            samples_framer: Framer::new(
                Stream::FastCounters.id(),
                config.first_stream_seq,
                config.limits.clone(),
            )?,
            streams: Stream::ALL.map(state),
            pacer: PacerHandle::Own(
                config
                    .pacing
                    .map_or_else(Pacer::unlimited, |l| Pacer::new(l, now)),
            ),
            credits: Credits::new(config.first_conn_seq, config.credit_window),
            without_credit: 0,
            credit_heartbeat: false,
            asked_for_credit: false,
            records_waiting: false,
            ready_frames: config.ready_frames.max(1),
            idle_heartbeat: config.idle_heartbeat,
            limits: config.limits.clone(),
            metrics_catching_up: false,
            logs_first: false,
            frames_posted: 0,
            last_conn_seq: None,
            settle_on_ack: false,
            frames_acked: 0,
            last_acked_conn_seq: None,
            rr: 0,
            acct: Accounting {
                stats: SenderStats::default(),
                export,
            },
        })
    }

    /// The pipeline's counters so far (this epoch).
    pub fn stats(&self) -> &SenderStats {
        &self.acct.stats
    }

    /// The epoch stamped on every frame.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Whether this pipeline carries `stream` ([`SenderConfig::carries`]).
    pub fn carries(&self, stream: Stream) -> bool {
        self.streams[stream.index()].carried
    }

    /// Whether the caller should hand more records of `stream` to the pipeline now: false
    /// while the stream's ready queue is full (records then wait, bounded, in the source
    /// queue), and always for a stream this pipeline does not carry
    /// ([`SenderConfig::carries`]: its records are for the other lane's pipeline).
    ///
    /// A stream configured to wait for credit also says no while the frames already built
    /// (ready on any stream, plus open ones) would use up the credits, keeping 1/16 of the
    /// window it is granted (at least one frame; none below 4 frames) for the streams that
    /// drop. The share is taken of [`Credits::granted_window`], not of the ring's window: a
    /// budget shared by many agents may grant far less than the ring holds, and a reserve
    /// sized from the ring would then exceed every grant and hold the stream for good.
    pub fn wants_records(&self, stream: Stream) -> bool {
        let st = &self.streams[stream.index()];
        if !st.carried || st.ready.len() >= self.ready_frames {
            return false;
        }
        if !st.wait_for_credit {
            return true;
        }
        self.credit_room()
    }

    /// Whether the metrics stream is catching up on the samples held while disconnected:
    /// from the first buffered sample taken on this connection until the buffer is empty
    /// with the credits back ([`SenderCore::credits_recovered`]). Meanwhile newer samples
    /// join the buffer and wait for credit as the buffered ones do
    /// ([`crate::sender::pump::pull`]), rather than being framed into a window the backlog
    /// used up and dropped as `no_credit`.
    pub fn metrics_catching_up(&self) -> bool {
        self.metrics_catching_up
    }

    /// Whether the logs stream takes records before the metrics stream at this pull
    /// ([`crate::sender::pump::pull`]); the answer alternates at each call. Both wait for
    /// credit by default, and the first to take records fills the room the credits leave:
    /// taking turns keeps a steady flow of host collections from starving a log backlog of
    /// a small window (and the other way round).
    pub fn logs_pull_first(&mut self) -> bool {
        self.logs_first = !self.logs_first;
        self.logs_first
    }

    /// Starts or ends the catch-up of [`SenderCore::metrics_catching_up`].
    pub fn set_metrics_catching_up(&mut self, on: bool) {
        self.metrics_catching_up = on;
    }

    /// Sends metrics as series-dictionary frames (`kind = metrics_dict`) from now on: the
    /// collector offered it in its `Welcome`. Only before the first metric; false (and
    /// nothing changes) after it.
    pub fn use_series_dictionary(&mut self) -> bool {
        self.metrics_framer.use_dictionary(&self.limits)
    }

    /// Whether metrics go out as series-dictionary frames.
    pub fn series_dictionary(&self) -> bool {
        self.metrics_framer.is_dictionary()
    }

    /// The collector's `DictAck`: it knows the metrics stream's series ids below
    /// `known_up_to` in `epoch`. One of another epoch or stream is ignored.
    pub fn on_dict_ack(&mut self, ack: &uctel_protocol::control::DictAck) {
        if ack.epoch == self.epoch && ack.stream_id == Stream::Metrics.id() {
            self.metrics_framer.on_ack(ack.known_up_to);
        }
    }

    /// Adds one metric sample at `now` / `unix_ns` (frame timestamp, ns since the Unix epoch).
    pub fn push_metric(&mut self, m: &Metric, now: Instant, unix_ns: u64) {
        let outcome = self.metrics_framer.push(m, unix_ns);
        self.after_push(Stream::Metrics, outcome, 1, now);
    }

    /// Adds one sample series (fast_counters stream); it counts one record per sample.
    pub fn push_samples(&mut self, s: &SampleSeries, now: Instant, unix_ns: u64) {
        let outcome = self.samples_framer.push(s, unix_ns);
        self.after_push(Stream::FastCounters, outcome, s.weight(), now);
    }

    /// Adds one log record.
    ///
    /// A line too long for one frame (the tailer's `max_line_bytes` is set before the path
    /// MTU of a connection is known) is cut to fit, marked with the field
    /// `truncated="frame"` and counted (`records_truncated_total`), rather than dropped.
    pub fn push_log(&mut self, r: &LogRecord, now: Instant, unix_ns: u64) {
        let outcome = self.logs_framer.push(r, unix_ns);
        if let PushOutcome::Rejected(Rejection::Oversize {
            encoded_len,
            max_payload_bytes,
        }) = &outcome
        {
            if let Some(cut) = cut_to_fit(r, *encoded_len, *max_payload_bytes) {
                let outcome = self.logs_framer.push(&cut, unix_ns);
                if !matches!(outcome, PushOutcome::Rejected(_)) {
                    self.acct.truncated(Stream::Logs);
                }
                self.after_push(Stream::Logs, outcome, 1, now);
                return;
            }
        }
        self.after_push(Stream::Logs, outcome, 1, now);
    }

    /// Books one push of a record that counts as `weight` records.
    fn after_push(&mut self, stream: Stream, outcome: PushOutcome, weight: u32, now: Instant) {
        let st = &mut self.streams[stream.index()];
        let index = st.pushed;
        st.pushed += u64::from(weight);
        match outcome {
            PushOutcome::Appended => {
                st.open_since.get_or_insert(now);
                st.open_first.get_or_insert(index);
            }
            PushOutcome::Closed(frame) => {
                // The pushed record opened the next frame.
                st.open_since = Some(now);
                let first = st.open_first.replace(index).unwrap_or(index);
                st.ready.push_back(Pending::new(frame, first));
            }
            PushOutcome::Rejected(why) => {
                let reason = match why {
                    Rejection::Oversize { .. } => DropReason::Oversize,
                    Rejection::Invalid(_) => DropReason::Invalid,
                };
                self.acct.dropped(stream, reason, 0, u64::from(weight));
            }
        }
    }

    /// Closes `stream`'s open frame now (e.g. at the end of one metrics collection), so it
    /// does not wait for its flush deadline.
    pub fn flush(&mut self, stream: Stream) {
        let frame = match stream {
            Stream::Metrics => self.metrics_framer.flush(),
            Stream::Logs => self.logs_framer.flush(),
            Stream::FastCounters => self.samples_framer.flush(),
        };
        let st = &mut self.streams[stream.index()];
        st.open_since = None;
        let first = st.open_first.take().unwrap_or(st.pushed);
        if let Some(f) = frame {
            st.ready.push_back(Pending::new(f, first));
        }
    }

    /// Paces with `other`'s pacer from now on: the two pipelines of a connection's lanes
    /// (DESIGN.md §8b) share one set of `pacing` caps, so the connection never sends more
    /// than they allow, whichever lane the frames take.
    pub fn share_pacer_with(&mut self, other: &mut SenderCore) {
        self.pacer = PacerHandle::Shared(other.pacer.share());
    }

    /// Closes frames whose flush deadline passed and queues heartbeats on idle streams.
    fn timers(&mut self, now: Instant, unix_ns: u64) {
        for s in Stream::ALL {
            let due = self.streams[s.index()].open_since.is_some_and(|t| {
                now.saturating_duration_since(t) >= self.streams[s.index()].flush_after
            });
            if due {
                self.flush(s);
            }
            if let Some(idle) = self.idle_heartbeat {
                let st = &self.streams[s.index()];
                let quiet = st.carried
                    && st.ready.is_empty()
                    && st.open_since.is_none()
                    && now.saturating_duration_since(st.last_sent) >= idle;
                if quiet {
                    let hb = match s {
                        Stream::Metrics => self.metrics_framer.heartbeat(unix_ns),
                        Stream::Logs => self.logs_framer.heartbeat(unix_ns),
                        Stream::FastCounters => self.samples_framer.heartbeat(unix_ns),
                    };
                    let st = &mut self.streams[s.index()];
                    let first = st.pushed;
                    st.ready.push_back(Pending::new(hb, first));
                    // Counts as activity so one heartbeat goes out per idle period even if
                    // it is then dropped for lack of credit.
                    st.last_sent = now;
                }
            }
        }
    }

    /// The earliest instant a timer (flush deadline, idle heartbeat) fires.
    fn next_timer(&self) -> Option<Instant> {
        let mut at: Option<Instant> = None;
        let mut consider = |t: Instant| at = Some(at.map_or(t, |a| a.min(t)));
        for st in &self.streams {
            if let Some(t) = st.open_since {
                consider(t + st.flush_after);
            }
            if let Some(idle) = self.idle_heartbeat {
                if st.carried && st.ready.is_empty() && st.open_since.is_none() {
                    consider(st.last_sent + idle);
                }
            }
        }
        at
    }

    /// The next step: a frame to post, or how long to wait. Frames that find no credit are
    /// dropped (`no_credit`) on the way, except on streams that wait for credit, whose
    /// frames stay queued until [`SenderCore::on_consumed`] returns credits.
    pub fn poll_transmit(&mut self, now: Instant, unix_ns: u64) -> Poll {
        self.timers(now, unix_ns);
        loop {
            // Without credit, a stream that waits for credit keeps its frames (bounded by
            // `ready_frames`) until a report; the others drop theirs at the source. A frame
            // without records (an idle stream's heartbeat, at most one per idle period)
            // waits on every stream: dropping it would count a frame and lose nothing.
            let no_credit = self.credits.available() == 0;
            let Some(s) = (0..Stream::ALL.len())
                .map(|i| (self.rr + i) % Stream::ALL.len())
                .find(|&i| {
                    let st = &self.streams[i];
                    let empty = st.ready.front().is_some_and(|p| p.records == 0);
                    let held = no_credit && (st.wait_for_credit || empty);
                    !st.ready.is_empty() && !held
                })
            else {
                if no_credit {
                    let held: usize = self.streams.iter().map(|st| st.ready.len()).sum();
                    if held > 0 && !self.asked_for_credit {
                        self.starved(held as u64);
                    }
                }
                return Poll::Wait(self.next_timer());
            };
            let stream = self.streams[s].stream;
            let (len, records) = match self.streams[s].ready.front() {
                Some(p) => (p.bytes.len(), p.records),
                None => continue,
            };
            if self.credits.available() == 0 {
                self.streams[s].ready.pop_front();
                self.acct
                    .dropped(stream, DropReason::NoCredit, 1, u64::from(records));
                self.starved(1);
                continue;
            }
            match self.pacer.poll_admit(len, now) {
                Admit::Now => {}
                Admit::After(d) => {
                    let at = now + d;
                    return Poll::Wait(Some(self.next_timer().map_or(at, |t| t.min(at))));
                }
                Admit::Never => {
                    self.streams[s].ready.pop_front();
                    self.acct
                        .dropped(stream, DropReason::Oversize, 1, u64::from(records));
                    continue;
                }
            }
            let Some(pending) = self.streams[s].ready.pop_front() else {
                continue;
            };
            let Ok(conn_seq) = self.credits.try_acquire() else {
                // available() was checked above; keep the frame for the next poll.
                self.streams[s].ready.push_front(pending);
                continue;
            };
            let st = &mut self.streams[s];
            let stream_seq = st.next_stream_seq.get();
            let record_count = st.totals.records + u64::from(pending.records);
            match stamp(
                pending.bytes,
                self.epoch,
                conn_seq,
                stream_seq,
                record_count,
            ) {
                Ok(bytes) => {
                    st.next_stream_seq = st.next_stream_seq.next();
                    st.totals.frames += 1;
                    st.totals.records = record_count;
                    st.totals.last_stream_seq = Some(stream_seq);
                    st.last_sent = now;
                    self.frames_posted += 1;
                    self.last_conn_seq = Some(conn_seq);
                    self.rr = (s + 1) % Stream::ALL.len();
                    return Poll::Transmit(Transmit {
                        stream,
                        data_path: st.data_path,
                        conn_seq,
                        stream_seq,
                        records: pending.records,
                        first_record: pending.first,
                        bytes,
                    });
                }
                Err(_) => {
                    // Cannot happen for framer-built bytes; give the sequence back.
                    let _ = self.credits.release_last(conn_seq);
                    self.acct
                        .dropped(stream, DropReason::Invalid, 1, u64::from(pending.records));
                }
            }
        }
    }

    /// The frame returned by the last [`SenderCore::poll_transmit`] was posted: count it
    /// as sent; when records settle on acknowledgement ([`SenderCore::set_settle_on_ack`]),
    /// also keep it in flight until [`SenderCore::on_acked`] covers its connection sequence.
    pub fn sent(&mut self, t: &Transmit) {
        self.acct
            .sent(t.stream, u64::from(t.records), t.bytes.len() as u64);
        if self.settle_on_ack {
            let st = &mut self.streams[t.stream.index()];
            st.in_flight.push_back(InFlight {
                conn_seq: t.conn_seq,
                stream_seq: t.stream_seq,
                record_count: st.totals.records,
                records: t.records,
                first: t.first_record,
            });
        }
    }

    /// Records settle when the RC QP acknowledged their frame, not when it was posted
    /// (DESIGN.md §8b; on RC a send completion with success status means the responder
    /// ACKed the message, IBTA 9.7.5.1 / rxe `rxe_comp.c`). From then on:
    ///
    /// - a posted frame is counted as sent (`frames_sent_total`: posted, as on UC) and is
    ///   *in flight* ([`SenderCore::in_flight_records`]) until [`SenderCore::on_acked`]
    ///   covers it; only then are its records settled ([`SenderCore::unsettled_records`]);
    /// - [`SenderCore::final_sequences`] (heartbeats, `Goodbye`) reports the logs stream as
    ///   far as it was acknowledged, so the collector never counts a log frame that will be
    ///   sent again as lost; the other streams, and the connection sequence of their frames
    ///   in flight, as posted (their unacknowledged frames are not sent again: counted lost
    ///   by the collector if they never arrived);
    /// - when the QP fails, [`SenderCore::take_back_logs`] takes the log records in flight
    ///   and pending back: the log sources read them again, and they are posted again on
    ///   the next connection (so `records_sent_total` counts a line posted twice twice; the
    ///   collector delivers it once, README "Loss accounting").
    ///
    /// Call it before the first frame is posted. UC pipelines keep settle-on-post.
    pub fn set_settle_on_ack(&mut self, on: bool) {
        self.settle_on_ack = on;
    }

    /// Every frame posted with a connection sequence up to `conn_seq` was acknowledged (a
    /// successful send completion: an RC QP completes its sends in order, IBTA 9.7.5.1.2),
    /// so each is counted as sent and its records settle. Returns the records
    /// acknowledged now (already counted as sent when posted). No effect unless
    /// [`SenderCore::set_settle_on_ack`].
    pub fn on_acked(&mut self, conn_seq: u64) -> u64 {
        let mut records = 0;
        for st in &mut self.streams {
            while let Some(f) = st.in_flight.front().copied() {
                if f.conn_seq > conn_seq {
                    break;
                }
                st.in_flight.pop_front();
                st.acked.frames += 1;
                st.acked.records = f.record_count;
                st.acked.last_stream_seq = Some(f.stream_seq);
                self.frames_acked += 1;
                self.last_acked_conn_seq = Some(
                    self.last_acked_conn_seq
                        .map_or(f.conn_seq, |c| c.max(f.conn_seq)),
                );
                records += u64::from(f.records);
            }
        }
        records
    }

    /// Records of `stream` posted and not acknowledged yet (settle on ack only).
    pub fn in_flight_records(&self, stream: Stream) -> u64 {
        self.streams[stream.index()]
            .in_flight
            .iter()
            .map(|f| u64::from(f.records))
            .sum()
    }

    /// Frames posted and not acknowledged yet, every stream (settle on ack only).
    pub fn in_flight_frames(&self) -> usize {
        self.streams.iter().map(|s| s.in_flight.len()).sum()
    }

    /// When the RC QP failed or the session ends (settle on ack only): the log records
    /// in flight (counted as sent when posted) and those still pending (open and ready
    /// frames: counted in [`StreamStats::records_taken_back`], neither sent nor dropped)
    /// are taken back and left unsettled, so the log sources read them again from the
    /// last acknowledged line ([`crate::runners::Handoff::rewind`]). Empty frames
    /// (heartbeats) stay for [`SenderCore::drop_pending`]. Returns the records taken back,
    /// both kinds.
    pub fn take_back_logs(&mut self) -> u64 {
        let stream = Stream::Logs;
        if !self.settle_on_ack || !self.carries(stream) {
            return 0;
        }
        let from = self.oldest_unsettled(stream);
        self.flush(stream);
        let st = &mut self.streams[stream.index()];
        let flying: u64 = st.in_flight.drain(..).map(|f| u64::from(f.records)).sum();
        let mut pending = 0;
        let mut kept = VecDeque::new();
        for p in st.ready.drain(..) {
            if p.records == 0 {
                kept.push_back(p);
            } else {
                pending += u64::from(p.records);
            }
        }
        st.ready = kept;
        if from < st.pushed {
            st.abandoned_from = Some(st.abandoned_from.map_or(from, |a| a.min(from)));
        }
        self.acct.stats.streams[stream.index()].records_taken_back += pending;
        flying + pending
    }

    /// The frame returned by the last [`SenderCore::poll_transmit`] could not be posted for a
    /// transient reason (the QP's send queue was full): undo its sequences and put it back at
    /// the head of its stream, to be tried again. Only valid for the most recent transmit.
    pub fn requeue(&mut self, t: Transmit) {
        if !self.credits.release_last(t.conn_seq) {
            // Not the most recent transmit: its sequences cannot be taken back. Count it.
            self.post_failed(&t);
            return;
        }
        let st = &mut self.streams[t.stream.index()];
        st.next_stream_seq = Seq::new(t.stream_seq);
        st.totals.frames = st.totals.frames.saturating_sub(1);
        st.totals.records = st.totals.records.saturating_sub(u64::from(t.records));
        st.totals.last_stream_seq =
            (st.totals.frames > 0).then(|| Seq::new(t.stream_seq).prev().get());
        st.ready.push_front(Pending {
            bytes: t.bytes,
            records: t.records,
            first: t.first_record,
        });
        self.frames_posted = self.frames_posted.saturating_sub(1);
        self.last_conn_seq = (self.frames_posted > 0).then(|| Seq::new(t.conn_seq).prev().get());
    }

    /// The sink stays busy (the QP's send queue or send buffers are full): on every stream
    /// that does not wait for credit (fresh or worthless) whose ready queue is full, drop the
    /// oldest frame as `send_queue_full`, so the newest data is what goes once the sink
    /// drains and the sources keep flowing. Streams that wait keep their frames (bounded).
    /// Returns the frames dropped.
    pub fn shed_when_sink_busy(&mut self) -> u64 {
        let mut shed = 0;
        for st in &mut self.streams {
            if st.wait_for_credit || st.ready.len() < self.ready_frames {
                continue;
            }
            if let Some(p) = st.ready.pop_front() {
                self.acct.dropped(
                    st.stream,
                    DropReason::SendQueueFull,
                    1,
                    u64::from(p.records),
                );
                shed += 1;
            }
        }
        shed
    }

    /// The frame could not be posted and will not be retried (QP in error): count it as
    /// `transport_error`. Its sequences stay used: the collector will see it as lost.
    ///
    /// With [`SenderCore::set_settle_on_ack`], a log frame's records are not dropped: they
    /// stay unsettled like a frame in flight (it is never acknowledged), are counted as taken
    /// back ([`StreamStats::records_taken_back`], neither sent nor dropped) and are read
    /// again after the lane's rewind ([`SenderCore::take_back_logs`]).
    pub fn post_failed(&mut self, t: &Transmit) {
        if self.settle_on_ack && t.stream == Stream::Logs && self.carries(t.stream) {
            let st = &mut self.streams[t.stream.index()];
            st.in_flight.push_back(InFlight {
                conn_seq: t.conn_seq,
                stream_seq: t.stream_seq,
                record_count: st.totals.records,
                records: t.records,
                first: t.first_record,
            });
            self.acct.stats.streams[t.stream.index()].records_taken_back += u64::from(t.records);
            return;
        }
        self.acct.dropped(
            t.stream,
            DropReason::TransportError,
            1,
            u64::from(t.records),
        );
    }

    /// Closes every stream this pipeline carries for this epoch: the open frame, or an empty
    /// frame, goes out flagged `LAST_OF_EPOCH` (DESIGN.md §3) after whatever is already
    /// queued.
    pub fn finish(&mut self, unix_ns: u64) {
        let [m, l, f] = self.streams.each_ref().map(|st| st.carried);
        let frames = [
            m.then(|| self.metrics_framer.finish_epoch(unix_ns)),
            l.then(|| self.logs_framer.finish_epoch(unix_ns)),
            f.then(|| self.samples_framer.finish_epoch(unix_ns)),
        ];
        for (st, f) in self.streams.iter_mut().zip(frames) {
            let Some(f) = f else { continue };
            let first = st.open_first.take().unwrap_or(st.pushed);
            st.ready.push_back(Pending::new(f, first));
            st.open_since = None;
        }
    }

    /// Records not yet posted nor dropped: in ready frames and in the open frame.
    pub fn pending_records(&self, stream: Stream) -> u64 {
        let ready: u64 = self.streams[stream.index()]
            .ready
            .iter()
            .map(|p| u64::from(p.records))
            .sum();
        let open = match stream {
            Stream::Metrics => self.metrics_framer.stats().records_open,
            Stream::Logs => self.logs_framer.stats().records_open,
            Stream::FastCounters => self.samples_framer.stats().records_open,
        };
        ready + open
    }

    /// Frames waiting in the ready queues.
    pub fn ready_frames(&self) -> usize {
        self.streams.iter().map(|s| s.ready.len()).sum()
    }

    /// Push index of the oldest record of `stream` still pending (in a ready or the open
    /// frame), or the next push index when none is.
    fn oldest_pending(&self, stream: Stream) -> u64 {
        let st = &self.streams[stream.index()];
        st.ready
            .iter()
            .find(|p| p.records > 0)
            .map(|p| p.first)
            .or(st.open_first)
            .unwrap_or(st.pushed)
    }

    /// Push index of the oldest record of `stream` not settled by a post or an ack: pending,
    /// or in flight (settle on ack), or the next push index when none is.
    fn oldest_unsettled(&self, stream: Stream) -> u64 {
        let st = &self.streams[stream.index()];
        let flying = st.in_flight.iter().find(|f| f.records > 0).map(|f| f.first);
        self.oldest_pending(stream).min(flying.unwrap_or(u64::MAX))
    }

    /// How many of the records pushed on `stream` are not *settled*, counted back from the
    /// newest: every record pushed before them was posted in a frame or dropped and counted
    /// for a reason other than `shutdown`; from the oldest record still pending (or dropped
    /// as `shutdown`) on, nothing is known settled. Frames leave a stream in push order, so
    /// only records refused at push time can be settled out of order (they are counted as
    /// unsettled while an older record is pending).
    ///
    /// The log sources checkpoint only settled lines: a line dropped at shutdown is read again
    /// after a restart, a line posted is not (DESIGN.md §7). With
    /// [`SenderCore::set_settle_on_ack`] a record in a frame posted but not acknowledged is
    /// not settled either.
    pub fn unsettled_records(&self, stream: Stream) -> u64 {
        let st = &self.streams[stream.index()];
        let from = self
            .oldest_unsettled(stream)
            .min(st.abandoned_from.unwrap_or(u64::MAX));
        st.pushed - from.min(st.pushed)
    }

    /// Takes the metric samples still pending (in the open frame and in ready frames) out
    /// of the pipeline, in push order, for the next connection ([`crate::buffer`]): when a
    /// connection ends, what was collected but not posted is not lost with it. A sample
    /// without its own timestamp (`timestamp_ms` 0: "the frame's timestamp") gets its
    /// frame's, in ms since the Unix epoch, so a frame built later does not re-stamp it.
    /// Counted in [`StreamStats::records_taken_back`]; empty frames (heartbeats, an empty
    /// `LAST_OF_EPOCH` frame) stay. Empty when the pipeline does not carry the metrics.
    pub fn take_back_metrics(&mut self) -> Vec<Metric> {
        let stream = Stream::Metrics;
        if !self.carries(stream) {
            return Vec::new();
        }
        self.flush(stream);
        let mut back = Vec::new();
        let mut taken = 0u64;
        let mut invalid = (0u64, 0u64);
        let st = &mut self.streams[stream.index()];
        let mut kept = VecDeque::new();
        for p in st.ready.drain(..) {
            if p.records == 0 {
                kept.push_back(p);
                continue;
            }
            match self.metrics_framer.decode_built(&p.bytes, &self.limits) {
                Some(records) => {
                    taken += u64::from(p.records);
                    back.extend(records);
                }
                // Cannot happen for framer-built bytes; counted as the frame's records.
                None => {
                    invalid.0 += 1;
                    invalid.1 += u64::from(p.records);
                }
            }
        }
        st.ready = kept;
        self.acct.stats.streams[stream.index()].records_taken_back += taken;
        if invalid.0 > 0 {
            self.acct
                .dropped(stream, DropReason::Invalid, invalid.0, invalid.1);
        }
        back
    }

    /// Drops everything still pending (open and ready frames) with `reason`, counting it.
    /// Records dropped as [`DropReason::Shutdown`] stay unsettled
    /// ([`SenderCore::unsettled_records`]), and so do, with
    /// [`SenderCore::set_settle_on_ack`], the records in flight then (sent, not
    /// acknowledged: read again after a restart). Log frames still in flight are forgotten
    /// (counted as sent when posted); those of other streams stay in
    /// [`SenderCore::final_sequences`].
    pub fn drop_pending(&mut self, reason: DropReason) {
        for s in Stream::ALL {
            if reason == DropReason::Shutdown {
                let from = self.oldest_unsettled(s);
                let st = &mut self.streams[s.index()];
                if from < st.pushed {
                    st.abandoned_from = Some(st.abandoned_from.map_or(from, |a| a.min(from)));
                }
            }
            self.flush(s);
            let st = &mut self.streams[s.index()];
            if s == Stream::Logs {
                st.in_flight.clear();
            }
            let frames = st.ready.len() as u64;
            let records: u64 = st.ready.drain(..).map(|p| u64::from(p.records)).sum();
            if frames > 0 {
                self.acct.dropped(s, reason, frames, records);
            }
        }
    }

    /// Sequences and totals of what was posted in this epoch; with
    /// [`SenderCore::set_settle_on_ack`], the logs stream's as far as it was acknowledged
    /// (see there), and the connection's up to the last frame acknowledged or in flight on
    /// another stream.
    pub fn final_sequences(&self) -> FinalSequences {
        if self.settle_on_ack {
            let others = self
                .streams
                .iter()
                .filter(|s| s.stream != Stream::Logs)
                .flat_map(|s| s.in_flight.iter());
            let last = others.clone().map(|f| f.conn_seq).max();
            return FinalSequences {
                last_conn_seq: self.last_acked_conn_seq.max(last),
                frames: self.frames_acked + others.count() as u64,
                streams: self.streams.each_ref().map(|s| {
                    if s.stream == Stream::Logs {
                        s.acked
                    } else {
                        s.totals
                    }
                }),
            };
        }
        FinalSequences {
            last_conn_seq: self.last_conn_seq,
            frames: self.frames_posted,
            streams: self.streams.each_ref().map(|s| s.totals),
        }
    }
}

/// Bytes kept free when cutting a log message to fit: the length prefixes may shrink by a
/// few bytes less than the message does, and the `truncated` marker field needs about 20.
const CUT_SLACK_BYTES: usize = 48;

/// `r` with its message cut (at a UTF-8 boundary) so the record encodes within
/// `max_payload_bytes`, plus a `truncated="frame"` field; `None` if even an empty message
/// would not fit.
fn cut_to_fit(r: &LogRecord, encoded_len: usize, max_payload_bytes: usize) -> Option<LogRecord> {
    let excess = encoded_len
        .saturating_sub(max_payload_bytes)
        .saturating_add(CUT_SLACK_BYTES);
    let mut n = r.message.len().checked_sub(excess)?;
    while n > 0 && !r.message.is_char_boundary(n) {
        n -= 1;
    }
    let mut cut = r.clone();
    cut.message.truncate(n);
    cut.fields.push(uctel_protocol::payload::Field {
        key: "truncated".into(),
        value: "frame".into(),
    });
    Some(cut)
}

/// Writes the connection and stream fields into a framer-built frame and seals it.
fn stamp(
    mut bytes: Vec<u8>,
    epoch: u64,
    conn_seq: u64,
    stream_seq: u64,
    record_count: u64,
) -> Result<Vec<u8>, frame::FrameError> {
    let header = FrameHeader {
        epoch,
        conn_seq,
        stream_seq,
        record_count,
        ..FrameHeader::parse(&bytes)?
    };
    header.emit(&mut bytes)?;
    frame::seal(&mut bytes)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credits::{GrantOutcome, ReportOutcome};
    use uctel_protocol::frame::{decode_frame, FrameFlags, FrameKind, Payload};
    use uctel_protocol::payload::{Label, MetricType};

    fn stats() -> Arc<SelfMetrics> {
        Arc::new(SelfMetrics::new().unwrap_or_else(|e| panic!("{e}")))
    }

    fn config(window: u64) -> SenderConfig {
        SenderConfig {
            limits: Limits {
                max_frame_bytes: 512,
                ..Limits::default()
            },
            pacing: None,
            credit_window: window,
            first_conn_seq: 0,
            first_stream_seq: 0,
            data_paths: [
                DataPath::WriteWithImm,
                DataPath::Send,
                DataPath::WriteWithImm,
            ],
            flush_after: [Duration::from_millis(200); 3],
            ready_frames: 64,
            idle_heartbeat: None,
            wait_for_credit: [false; 3],
            carries: [true; 3],
        }
    }

    fn metric(i: usize) -> Metric {
        Metric {
            name: "node_load1".into(),
            help: String::new(),
            r#type: MetricType::Gauge as i32,
            labels: vec![Label {
                name: "i".into(),
                value: format!("{i:04}"),
            }],
            value: i as f64,
            timestamp_ms: 0,
            buckets: vec![],
            count: 0,
            sum: 0.0,
        }
    }

    fn log(msg: &str) -> LogRecord {
        LogRecord {
            timestamp_ns: 1,
            severity: 3,
            source: "/var/log/x".into(),
            message: msg.into(),
            ..Default::default()
        }
    }

    /// Polls until Wait, collecting transmits (marked sent). Bounded.
    fn drain(core: &mut SenderCore, now: Instant) -> (Vec<Transmit>, Option<Instant>) {
        let mut out = Vec::new();
        for _ in 0..10_000 {
            match core.poll_transmit(now, 1_000) {
                Poll::Transmit(t) => {
                    core.sent(&t);
                    out.push(t);
                }
                Poll::Wait(at) => return (out, at),
            }
        }
        panic!("poll_transmit never waited");
    }

    fn decode(t: &Transmit) -> uctel_protocol::frame::DecodedFrame {
        let limits = Limits {
            max_frame_bytes: 512,
            ..Limits::default()
        };
        decode_frame(&t.bytes, &limits).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_report_before_any_frame_arrived_returns_no_credit() {
        let t0 = Instant::now();
        let mut core =
            SenderCore::new(&config(1000), 1, t0, stats()).unwrap_or_else(|e| panic!("{e}"));
        for i in 0..40 {
            core.push_metric(&metric(i), t0, 5);
        }
        core.flush(Stream::Metrics);
        let (tx, _) = drain(&mut core, t0);
        assert!(!tx.is_empty());
        let before = core.credits_available();
        let nothing_yet = uctel_protocol::control::Report {
            consumed_conn_seq: 0,
            conn_received: 0,
            ..Default::default()
        };
        assert!(core.on_report(&nothing_yet).is_none());
        assert_eq!(core.credits_available(), before);
        let frame_zero = uctel_protocol::control::Report {
            consumed_conn_seq: 0,
            conn_received: 1,
            ..Default::default()
        };
        assert!(core.on_report(&frame_zero).is_some());
        assert_eq!(core.credits_available(), before + 1);
    }

    #[test]
    fn frames_decode_with_stamped_sequences_and_cumulative_counts() {
        let t0 = Instant::now();
        let sm = stats();
        let mut core =
            SenderCore::new(&config(1000), 77, t0, sm.clone()).unwrap_or_else(|e| panic!("{e}"));
        for i in 0..40 {
            core.push_metric(&metric(i), t0, 5);
        }
        core.flush(Stream::Metrics);
        let (tx, _) = drain(&mut core, t0);
        assert!(
            tx.len() >= 2,
            "40 samples in 512-byte frames need several frames"
        );
        let mut cumulative = 0;
        for (i, t) in tx.iter().enumerate() {
            let d = decode(t);
            assert_eq!(d.header.epoch, 77);
            assert_eq!(d.header.conn_seq, i as u64);
            assert_eq!(d.header.stream_seq, i as u64);
            assert_eq!(d.header.stream_id, Stream::Metrics.id());
            assert_eq!(t.data_path, DataPath::WriteWithImm);
            cumulative += d.payload.record_count() as u64;
            assert_eq!(d.header.record_count, cumulative);
        }
        assert_eq!(cumulative, 40);
        assert_eq!(sm.records_sent(Stream::Metrics), 40);
        assert_eq!(sm.frames_sent(Stream::Metrics), tx.len() as u64);
        let fin = core.final_sequences();
        assert_eq!(fin.last_conn_seq, Some(tx.len() as u64 - 1));
        assert_eq!(fin.streams[0].records, 40);
    }

    /// The plain counters and the exported self-metrics are the same counts.
    #[test]
    fn plain_stats_match_the_exported_self_metrics() {
        let t0 = Instant::now();
        let sm = stats();
        let mut core =
            SenderCore::new(&config(2), 1, t0, sm.clone()).unwrap_or_else(|e| panic!("{e}"));
        let mut plain =
            SenderCore::new_unexported(&config(2), 1, t0).unwrap_or_else(|e| panic!("{e}"));
        for c in [&mut core, &mut plain] {
            for i in 0..5 {
                c.push_log(&log(&format!("line {i}")), t0, 1);
                c.flush(Stream::Logs);
                c.push_metric(&metric(i), t0, 1);
            }
            c.push_log(&log(&"x".repeat(2000)), t0, 1);
            let _ = drain(c, t0);
            c.drop_pending(DropReason::Shutdown);
        }
        assert_eq!(core.stats(), plain.stats());
        for s in Stream::ALL {
            let st = core.stats().stream(s);
            assert_eq!(st.frames_sent, sm.frames_sent(s));
            assert_eq!(st.records_sent, sm.records_sent(s));
            assert_eq!(st.records_truncated, sm.records_truncated(s));
            assert_eq!(st.records_dropped_all(), sm.records_dropped_all(s));
            for r in DropReason::ALL {
                assert_eq!(st.frames_dropped(r), sm.frames_dropped(s, r), "{s} {r}");
                assert_eq!(st.records_dropped(r), sm.records_dropped(s, r), "{s} {r}");
            }
        }
        let logs = core.stats().stream(Stream::Logs);
        assert_eq!(logs.records_truncated, 1);
        assert!(logs.frames_dropped(DropReason::NoCredit) > 0);
        assert!(
            core.stats()
                .stream(Stream::Metrics)
                .records_dropped(DropReason::Shutdown)
                > 0
        );
    }

    #[test]
    fn no_credit_drops_at_source_without_leaving_sequence_gaps() {
        let t0 = Instant::now();
        let sm = stats();
        let mut core =
            SenderCore::new(&config(2), 1, t0, sm.clone()).unwrap_or_else(|e| panic!("{e}"));
        for i in 0..5 {
            core.push_log(&log(&format!("line {i}")), t0, 1);
            core.flush(Stream::Logs);
        }
        let (tx, _) = drain(&mut core, t0);
        assert_eq!(tx.len(), 2);
        assert_eq!(sm.frames_dropped(Stream::Logs, DropReason::NoCredit), 3);
        assert_eq!(sm.records_dropped(Stream::Logs, DropReason::NoCredit), 3);
        assert_eq!(core.on_consumed(1), ReportOutcome::Advanced(2));
        core.push_log(&log("after report"), t0, 1);
        core.flush(Stream::Logs);
        let (tx2, _) = drain(&mut core, t0);
        assert_eq!(tx2.len(), 1);
        let d = decode(&tx2[0]);
        // Contiguous: the dropped frames took no sequence.
        assert_eq!(
            (
                d.header.conn_seq,
                d.header.stream_seq,
                d.header.record_count
            ),
            (2, 2, 3)
        );
        // Accounting: 6 records pushed = 3 sent + 3 dropped + 0 pending.
        assert_eq!(
            sm.records_sent(Stream::Logs) + sm.records_dropped_all(Stream::Logs),
            6
        );
        assert_eq!(core.pending_records(Stream::Logs), 0);
    }

    #[test]
    fn an_idle_heartbeat_without_credit_waits_instead_of_counting_a_dropped_frame() {
        let t0 = Instant::now();
        let sm = stats();
        let mut cfg = config(1);
        cfg.idle_heartbeat = Some(Duration::from_millis(100));
        cfg.carries = [false, true, false];
        let mut core = SenderCore::new(&cfg, 1, t0, sm.clone()).unwrap_or_else(|e| panic!("{e}"));
        core.push_log(&log("takes the one credit"), t0, 1);
        core.flush(Stream::Logs);
        let (tx, _) = drain(&mut core, t0);
        assert_eq!(tx.len(), 1);
        // Idle past the heartbeat period, out of credit: the heartbeat is held, once.
        let later = t0 + Duration::from_millis(150);
        let (tx, _) = drain(&mut core, later);
        assert!(tx.is_empty());
        let (tx, _) = drain(&mut core, later + Duration::from_millis(150));
        assert!(tx.is_empty());
        assert_eq!(sm.frames_dropped(Stream::Logs, DropReason::NoCredit), 0);
        assert_eq!(
            core.ready_frames(),
            1,
            "one heartbeat held, not one per period"
        );
        // Credit back: it goes out, next in sequence.
        assert_eq!(core.on_consumed(0), ReportOutcome::Advanced(1));
        let (tx, _) = drain(&mut core, later + Duration::from_millis(200));
        assert_eq!(tx.len(), 1);
        assert_eq!(tx[0].records, 0);
        assert_eq!(decode(&tx[0]).header.conn_seq, 1);
    }

    #[test]
    fn pacing_defers_and_then_admits() {
        let t0 = Instant::now();
        let mut cfg = config(1000);
        cfg.pacing = Some(PacingLimits {
            frames_per_second: Some(10),
            bytes_per_second: None,
            burst_millis: 100,
            max_frame_bytes: 512,
        });
        let sm = stats();
        let mut core = SenderCore::new(&cfg, 1, t0, sm.clone()).unwrap_or_else(|e| panic!("{e}"));
        for i in 0..3 {
            core.push_log(&log(&format!("{i}")), t0, 1);
            core.flush(Stream::Logs);
        }
        let (tx, wait) = drain(&mut core, t0);
        assert_eq!(tx.len(), 1, "burst of one frame at 10/s × 100 ms");
        let at = wait.unwrap_or_else(|| panic!("expected a pacing wait"));
        assert_eq!(at, t0 + Duration::from_millis(100));
        let (tx, _) = drain(&mut core, at);
        assert_eq!(tx.len(), 1);
        assert_eq!(core.pending_records(Stream::Logs), 1);
        assert_eq!(
            sm.records_dropped_all(Stream::Logs),
            0,
            "pacing never drops"
        );
    }

    #[test]
    fn two_lanes_sharing_a_pacer_stay_within_its_caps_together() {
        let t0 = Instant::now();
        let mut cfg = config(1000);
        cfg.pacing = Some(PacingLimits {
            frames_per_second: Some(10),
            bytes_per_second: None,
            burst_millis: 100,
            max_frame_bytes: 512,
        });
        let mut uc_cfg = cfg.clone();
        uc_cfg.carries = [true, false, true];
        let mut rc_cfg = cfg;
        rc_cfg.carries = [false, true, false];
        let mut uc = SenderCore::new(&uc_cfg, 1, t0, stats()).unwrap_or_else(|e| panic!("{e}"));
        let mut rc = SenderCore::new(&rc_cfg, 1, t0, stats()).unwrap_or_else(|e| panic!("{e}"));
        rc.share_pacer_with(&mut uc);
        for i in 0..3 {
            uc.push_metric(&metric(i), t0, 1);
            uc.flush(Stream::Metrics);
            rc.push_log(&log(&format!("{i}")), t0, 1);
            rc.flush(Stream::Logs);
        }
        // One frame of burst at 10/s × 100 ms, for both lanes together.
        let (a, _) = drain(&mut uc, t0);
        let (b, wait) = drain(&mut rc, t0);
        assert_eq!(
            (a.len(), b.len()),
            (1, 0),
            "the RC lane waits for the shared bucket"
        );
        let at = wait.unwrap_or_else(|| panic!("expected a pacing wait"));
        assert_eq!(at, t0 + Duration::from_millis(100));
        let (b, _) = drain(&mut rc, at);
        let (a, _) = drain(&mut uc, at);
        assert_eq!((a.len(), b.len()), (0, 1));
    }

    #[test]
    fn requeue_gives_back_the_same_sequences() {
        let t0 = Instant::now();
        let mut core =
            SenderCore::new(&config(8), 1, t0, stats()).unwrap_or_else(|e| panic!("{e}"));
        core.push_log(&log("a"), t0, 1);
        core.flush(Stream::Logs);
        let Poll::Transmit(t) = core.poll_transmit(t0, 1) else {
            panic!("expected a transmit")
        };
        let first = t.clone();
        core.requeue(t);
        assert_eq!(core.final_sequences(), FinalSequences::default());
        let Poll::Transmit(again) = core.poll_transmit(t0, 1) else {
            panic!("expected a transmit")
        };
        assert_eq!(again, first);
    }

    #[test]
    fn open_frame_is_flushed_at_its_deadline() {
        let t0 = Instant::now();
        let mut core =
            SenderCore::new(&config(8), 1, t0, stats()).unwrap_or_else(|e| panic!("{e}"));
        core.push_log(&log("a"), t0, 1);
        let (tx, wait) = drain(&mut core, t0 + Duration::from_millis(10));
        assert!(tx.is_empty());
        assert_eq!(wait, Some(t0 + Duration::from_millis(200)));
        let (tx, _) = drain(&mut core, t0 + Duration::from_millis(200));
        assert_eq!(tx.len(), 1);
    }

    #[test]
    fn idle_stream_sends_a_heartbeat() {
        let t0 = Instant::now();
        let mut cfg = config(8);
        cfg.idle_heartbeat = Some(Duration::from_secs(1));
        let mut core = SenderCore::new(&cfg, 1, t0, stats()).unwrap_or_else(|e| panic!("{e}"));
        let (tx, wait) = drain(&mut core, t0);
        assert!(tx.is_empty());
        assert_eq!(wait, Some(t0 + Duration::from_secs(1)));
        let (tx, _) = drain(&mut core, t0 + Duration::from_secs(1));
        assert_eq!(tx.len(), Stream::ALL.len(), "one per stream");
        for t in &tx {
            let d = decode(t);
            assert_eq!(d.header.kind, FrameKind::Heartbeat);
            assert_eq!(d.payload, Payload::Heartbeat);
            assert_eq!(t.records, 0);
        }
    }

    #[test]
    fn finish_marks_the_last_frame_of_each_stream() {
        let t0 = Instant::now();
        let mut core =
            SenderCore::new(&config(8), 1, t0, stats()).unwrap_or_else(|e| panic!("{e}"));
        core.push_metric(&metric(1), t0, 1);
        core.finish(2);
        let (tx, _) = drain(&mut core, t0);
        assert_eq!(tx.len(), Stream::ALL.len());
        for t in &tx {
            assert!(decode(t).header.flags.contains(FrameFlags::LAST_OF_EPOCH));
        }
        let fin = core.final_sequences();
        assert_eq!(fin.frames, Stream::ALL.len() as u64);
        assert_eq!(fin.streams[Stream::Metrics.index()].records, 1);
        assert_eq!(fin.streams[Stream::Logs.index()].records, 0);
    }

    #[test]
    fn streams_take_turns() {
        let t0 = Instant::now();
        let mut core =
            SenderCore::new(&config(100), 1, t0, stats()).unwrap_or_else(|e| panic!("{e}"));
        for i in 0..4 {
            core.push_metric(&metric(i), t0, 1);
            core.flush(Stream::Metrics);
            core.push_log(&log("x"), t0, 1);
            core.flush(Stream::Logs);
        }
        let (tx, _) = drain(&mut core, t0);
        let order: Vec<Stream> = tx.iter().map(|t| t.stream).collect();
        assert_eq!(order.len(), 8);
        assert!(order.windows(2).all(|w| w[0] != w[1]), "{order:?}");
    }

    #[test]
    fn oversize_and_invalid_records_are_counted() {
        let t0 = Instant::now();
        let sm = stats();
        let mut core =
            SenderCore::new(&config(8), 1, t0, sm.clone()).unwrap_or_else(|e| panic!("{e}"));
        // A log line longer than a frame is cut to fit and marked, not dropped.
        core.push_log(&log(&"é".repeat(1000)), t0, 1);
        assert_eq!(sm.records_dropped(Stream::Logs, DropReason::Oversize), 0);
        assert_eq!(sm.records_truncated(Stream::Logs), 1);
        assert_eq!(core.pending_records(Stream::Logs), 1);
        core.flush(Stream::Logs);
        let (tx, _) = drain(&mut core, t0);
        assert_eq!(tx.len(), 1);
        assert!(tx[0].bytes.len() <= 512);
        match decode(&tx[0]).payload {
            Payload::Logs(b) => {
                let r = &b.records[0];
                assert!(r.message.len() > 300 && r.message.chars().all(|c| c == 'é'));
                assert_eq!(
                    r.fields.last().map(|f| (f.key.as_str(), f.value.as_str())),
                    Some(("truncated", "frame"))
                );
            }
            other => panic!("{other:?}"),
        }
        // A record that cannot fit even empty (a huge source path) is dropped as oversize.
        let mut huge = log("m");
        huge.source = "/".repeat(600);
        core.push_log(&huge, t0, 1);
        assert_eq!(sm.records_dropped(Stream::Logs, DropReason::Oversize), 1);
        let mut bad = metric(0);
        bad.name = "0bad name".into();
        core.push_metric(&bad, t0, 1);
        assert_eq!(sm.records_dropped(Stream::Metrics, DropReason::Invalid), 1);
    }

    #[test]
    fn drop_pending_counts_everything_left() {
        let t0 = Instant::now();
        let sm = stats();
        let mut core =
            SenderCore::new(&config(8), 1, t0, sm.clone()).unwrap_or_else(|e| panic!("{e}"));
        for i in 0..30 {
            core.push_metric(&metric(i), t0, 1);
        }
        core.drop_pending(DropReason::NotConnected);
        assert_eq!(
            sm.records_dropped(Stream::Metrics, DropReason::NotConnected),
            30
        );
        assert_eq!(core.pending_records(Stream::Metrics), 0);
        assert_eq!(core.ready_frames(), 0);
    }

    /// A connection ending with samples in the pipeline: they come back in push order with
    /// their frames' timestamps (a sample's own timestamp kept), are neither sent nor
    /// dropped, and pushed = sent + dropped + pending + taken back holds.
    #[test]
    fn take_back_returns_the_unsent_samples_in_order_with_their_frame_time() {
        let t0 = Instant::now();
        let sm = stats();
        let mut core =
            SenderCore::new(&config(8), 1, t0, sm.clone()).unwrap_or_else(|e| panic!("{e}"));
        // Frame 1 (sent): samples 0..; the rest at 2 s and 3 s after the epoch.
        for i in 0..5 {
            core.push_metric(&metric(i), t0, 1_000_000_000);
        }
        core.flush(Stream::Metrics);
        let (sent, _) = drain(&mut core, t0);
        assert_eq!(sent.len(), 1);
        for i in 5..25 {
            core.push_metric(&metric(i), t0, 2_000_000_000);
        }
        core.flush(Stream::Metrics);
        let mut own = metric(25);
        own.timestamp_ms = 42;
        core.push_metric(&own, t0, 3_000_000_000);
        core.push_metric(&metric(26), t0, 3_000_000_000);
        core.push_log(&log("stays"), t0, 1);
        let before = core.pending_records(Stream::Metrics);
        assert_eq!(before, 22);

        let back = core.take_back_metrics();
        let values: Vec<f64> = back.iter().map(|m| m.value).collect();
        assert_eq!(values, (5..27).map(|i| i as f64).collect::<Vec<_>>());
        assert!(back[..20].iter().all(|m| m.timestamp_ms == 2_000));
        assert_eq!((back[20].timestamp_ms, back[21].timestamp_ms), (42, 3_000));
        let st = *core.stats().stream(Stream::Metrics);
        assert_eq!(st.records_taken_back, 22);
        assert_eq!(st.records_dropped_all(), 0);
        assert_eq!(sm.records_dropped_all(Stream::Metrics), 0);
        assert_eq!(core.pending_records(Stream::Metrics), 0);
        assert_eq!(
            27,
            st.records_sent + st.records_dropped_all() + st.records_taken_back,
            "pushed = sent + dropped + pending + taken back"
        );
        // The other streams are untouched.
        assert_eq!(core.pending_records(Stream::Logs), 1);
        // A pipeline that does not carry the metrics gives nothing back.
        let mut cfg = config(8);
        cfg.carries = [false, true, false];
        let mut rc = SenderCore::new_unexported(&cfg, 2, t0).unwrap_or_else(|e| panic!("{e}"));
        assert!(rc.take_back_metrics().is_empty());
    }

    #[test]
    fn settlement_follows_the_oldest_pending_record_and_shutdown_never_settles() {
        let t0 = Instant::now();
        let sm = stats();
        let mut core =
            SenderCore::new(&config(8), 1, t0, sm.clone()).unwrap_or_else(|e| panic!("{e}"));
        // Frame A: records 0..=1, sent.
        core.push_log(&log("a0"), t0, 1);
        core.push_log(&log("a1"), t0, 1);
        core.flush(Stream::Logs);
        assert_eq!(core.unsettled_records(Stream::Logs), 2);
        let (tx, _) = drain(&mut core, t0);
        assert_eq!((tx.len(), tx[0].first_record), (1, 0));
        assert_eq!(core.unsettled_records(Stream::Logs), 0);
        // Record 2 pending in the open frame; record 3 refused (settled, but after a
        // pending one); record 4 pending.
        core.push_log(&log("b2"), t0, 1);
        let mut huge = log("m");
        huge.source = "/".repeat(600);
        core.push_log(&huge, t0, 1);
        core.push_log(&log("b4"), t0, 1);
        assert_eq!(sm.records_dropped(Stream::Logs, DropReason::Oversize), 1);
        assert_eq!(core.unsettled_records(Stream::Logs), 3);
        // A requeued frame stays the oldest pending one.
        core.flush(Stream::Logs);
        let Poll::Transmit(t) = core.poll_transmit(t0, 1) else {
            panic!("expected a transmit")
        };
        assert_eq!(t.first_record, 2);
        core.requeue(t);
        assert_eq!(core.unsettled_records(Stream::Logs), 3);
        // Dropped at shutdown: counted, and still unsettled (read again after a restart).
        core.push_log(&log("c5"), t0, 1);
        core.drop_pending(DropReason::Shutdown);
        assert_eq!(core.pending_records(Stream::Logs), 0);
        assert_eq!(sm.records_dropped(Stream::Logs, DropReason::Shutdown), 3);
        assert_eq!(core.unsettled_records(Stream::Logs), 4);
        // Metrics are tracked the same way; a drop for another reason settles.
        core.push_metric(&metric(0), t0, 1);
        core.drop_pending(DropReason::NotConnected);
        assert_eq!(core.unsettled_records(Stream::Metrics), 0);
        assert_eq!(core.unsettled_records(Stream::Logs), 4);
    }

    /// On an RC lane a log frame whose post failed (QP in error) is neither sent nor
    /// dropped: it stays unsettled behind the frame in flight, is counted as taken back and
    /// is read again after the rewind, so a line is never both dropped and delivered.
    #[test]
    fn on_rc_a_log_frame_whose_post_failed_is_taken_back_not_dropped() {
        let t0 = Instant::now();
        let sm = stats();
        let mut core =
            SenderCore::new(&config(8), 1, t0, sm.clone()).unwrap_or_else(|e| panic!("{e}"));
        core.set_settle_on_ack(true);
        core.push_log(&log("0a"), t0, 1);
        core.push_log(&log("0b"), t0, 1);
        core.flush(Stream::Logs);
        let (tx, _) = drain(&mut core, t0);
        assert_eq!(tx.len(), 1);
        core.push_log(&log("1a"), t0, 1);
        core.flush(Stream::Logs);
        let Poll::Transmit(t) = core.poll_transmit(t0, 1_000) else {
            panic!("a frame to post")
        };
        core.post_failed(&t);
        let st = core.stats().stream(Stream::Logs);
        assert_eq!(st.records_dropped(DropReason::TransportError), 0);
        assert_eq!(st.records_taken_back, 1);
        assert_eq!(st.records_sent, 2);
        assert_eq!(core.unsettled_records(Stream::Logs), 3, "read again");
        assert_eq!(core.take_back_logs(), 3);
    }

    /// On an RC lane a record settles when its frame is acknowledged, not when it is posted:
    /// posted frames are counted sent and stay in flight (unsettled, out of the final
    /// sequences) until `on_acked` covers them; when the QP fails, what is in flight and
    /// pending is taken back, unsettled (read again), and the records still add up.
    #[test]
    fn on_rc_records_settle_when_acknowledged_and_the_rest_is_taken_back() {
        let t0 = Instant::now();
        let sm = stats();
        let mut core =
            SenderCore::new(&config(8), 1, t0, sm.clone()).unwrap_or_else(|e| panic!("{e}"));
        core.set_settle_on_ack(true);
        // Three frames of two records each: records 0..=5.
        for f in 0..3 {
            core.push_log(&log(&format!("{f}a")), t0, 1);
            core.push_log(&log(&format!("{f}b")), t0, 1);
            core.flush(Stream::Logs);
        }
        let (tx, _) = drain(&mut core, t0);
        assert_eq!(tx.len(), 3);
        assert_eq!(core.pending_records(Stream::Logs), 0);
        assert_eq!(core.in_flight_records(Stream::Logs), 6);
        assert_eq!(core.in_flight_frames(), 3);
        assert_eq!(
            core.unsettled_records(Stream::Logs),
            6,
            "posted is not settled"
        );
        assert_eq!(
            core.stats().stream(Stream::Logs).records_sent,
            6,
            "sent = posted"
        );
        assert_eq!(sm.records_sent(Stream::Logs), 6);
        assert_eq!(core.final_sequences().last_conn_seq, None);
        assert_eq!(
            core.final_sequences().streams[Stream::Logs.index()].records,
            0
        );
        // The first frame acknowledged: its records settle.
        assert_eq!(core.on_acked(tx[0].conn_seq), 2);
        assert_eq!(core.unsettled_records(Stream::Logs), 4);
        let fin = core.final_sequences();
        assert_eq!(fin.last_conn_seq, Some(tx[0].conn_seq));
        assert_eq!(fin.frames, 1);
        assert_eq!(fin.streams[Stream::Logs.index()].records, 2);
        assert_eq!(
            fin.streams[Stream::Logs.index()].last_stream_seq,
            Some(tx[0].stream_seq)
        );
        // An acknowledgement covers every earlier frame (RC completes in order); a repeated
        // one changes nothing.
        assert_eq!(core.on_acked(tx[1].conn_seq), 2);
        assert_eq!(core.on_acked(tx[1].conn_seq), 0);
        assert_eq!(core.unsettled_records(Stream::Logs), 2);
        // One more record pending in the open frame, then the QP fails: the frame in flight
        // (sent) and the pending record (taken back) come again, unsettled, none dropped.
        core.push_log(&log("3a"), t0, 1);
        assert_eq!(core.take_back_logs(), 3);
        core.drop_pending(DropReason::NotConnected);
        let st = *core.stats().stream(Stream::Logs);
        assert_eq!(st.records_taken_back, 1);
        assert_eq!(st.records_dropped_all(), 0);
        assert_eq!(
            core.unsettled_records(Stream::Logs),
            3,
            "read again from record 4"
        );
        assert_eq!(core.in_flight_records(Stream::Logs), 0);
        assert_eq!(
            st.records_sent + st.records_dropped_all() + st.records_taken_back,
            7,
            "every record pushed accounted"
        );
        // What was acknowledged is all the collector is told about.
        assert_eq!(
            core.final_sequences().streams[Stream::Logs.index()].records,
            4
        );
        // A late acknowledgement settles nothing more: the lines are read again.
        assert_eq!(core.on_acked(tx[2].conn_seq), 0);
        assert_eq!(core.unsettled_records(Stream::Logs), 3);
    }

    /// Settle-on-ack at shutdown: the log lines in flight stay unsettled (read again after
    /// a restart) and out of the final figures; a metric frame in flight is not sent again,
    /// so the final figures keep it (the collector counts it lost if it never came).
    #[test]
    fn on_rc_frames_in_flight_at_the_end_stay_unsettled_or_reported() {
        let t0 = Instant::now();
        let sm = stats();
        let mut core =
            SenderCore::new(&config(8), 1, t0, sm.clone()).unwrap_or_else(|e| panic!("{e}"));
        core.set_settle_on_ack(true);
        core.push_log(&log("a"), t0, 1);
        core.flush(Stream::Logs);
        core.push_metric(&metric(0), t0, 1);
        core.flush(Stream::Metrics);
        let (tx, _) = drain(&mut core, t0);
        assert_eq!(tx.len(), 2);
        core.drop_pending(DropReason::Shutdown);
        assert_eq!(sm.records_dropped_all(Stream::Logs), 0, "sent, not dropped");
        assert_eq!(core.unsettled_records(Stream::Logs), 1);
        assert_eq!(core.in_flight_records(Stream::Logs), 0);
        let fin = core.final_sequences();
        assert_eq!(fin.streams[Stream::Logs.index()].records, 0);
        assert_eq!(fin.streams[Stream::Metrics.index()].records, 1);
        let metric_seq = tx
            .iter()
            .find(|t| t.stream == Stream::Metrics)
            .map(|t| t.conn_seq);
        assert_eq!(fin.last_conn_seq, metric_seq);
        assert_eq!(fin.frames, 1);
    }

    #[test]
    fn records_dropped_for_lack_of_credit_are_settled() {
        let t0 = Instant::now();
        let mut core =
            SenderCore::new(&config(1), 1, t0, stats()).unwrap_or_else(|e| panic!("{e}"));
        for i in 0..3 {
            core.push_log(&log(&format!("{i}")), t0, 1);
            core.flush(Stream::Logs);
        }
        let (tx, _) = drain(&mut core, t0);
        assert_eq!(tx.len(), 1);
        assert_eq!(core.pending_records(Stream::Logs), 0);
        assert_eq!(core.unsettled_records(Stream::Logs), 0);
    }

    #[test]
    fn waiting_stream_takes_no_records_it_could_not_send() {
        let t0 = Instant::now();
        let sm = stats();
        let mut cfg = config(4);
        cfg.wait_for_credit = [false, true, false];
        let mut core = SenderCore::new(&cfg, 1, t0, sm.clone()).unwrap_or_else(|e| panic!("{e}"));
        let mut taken = 0;
        for i in 0..10 {
            if core.wants_records(Stream::Logs) {
                core.push_log(&log(&format!("{i}")), t0, 1);
                core.flush(Stream::Logs);
                taken += 1;
            }
        }
        assert_eq!(taken, 3, "four credits, one kept for the metrics");
        let (tx, _) = drain(&mut core, t0);
        assert_eq!(tx.len(), 3);
        assert!(!core.wants_records(Stream::Logs));
        // Metrics (drop policy) get the reserved credit, then drop what finds none.
        assert!(core.wants_records(Stream::Metrics));
        for i in 0..2 {
            core.push_metric(&metric(i), t0, 1);
            core.flush(Stream::Metrics);
        }
        let (tx, _) = drain(&mut core, t0);
        assert_eq!(tx.len(), 1);
        assert_eq!(sm.records_dropped(Stream::Metrics, DropReason::NoCredit), 1);
        // A log frame built anyway (a flush of records already taken) waits for credit.
        core.push_log(&log("late"), t0, 1);
        core.flush(Stream::Logs);
        let (tx, _) = drain(&mut core, t0);
        assert!(tx.is_empty());
        assert_eq!(core.pending_records(Stream::Logs), 1);
        assert_eq!(sm.records_dropped_all(Stream::Logs), 0);
        // A report brings credits back: the waiting frame goes, and the stream resumes.
        assert_eq!(core.on_consumed(3), ReportOutcome::Advanced(4));
        let (tx, _) = drain(&mut core, t0);
        assert_eq!(tx.len(), 1);
        assert_eq!(tx[0].stream, Stream::Logs);
        assert_eq!(core.on_consumed(4), ReportOutcome::Advanced(1));
        assert!(core.wants_records(Stream::Logs));
    }

    #[test]
    fn records_left_queued_for_credit_ask_for_it_once_per_report() {
        let t0 = Instant::now();
        let mut cfg = config(4);
        cfg.wait_for_credit = [false, true, false];
        let mut core = SenderCore::new(&cfg, 1, t0, stats()).unwrap_or_else(|e| panic!("{e}"));
        while core.wants_records(Stream::Logs) {
            core.push_log(&log("x"), t0, 1);
            core.flush(Stream::Logs);
        }
        let (tx, _) = drain(&mut core, t0);
        assert_eq!(tx.len(), 3, "four credits, one kept for the metrics");
        // No frame found no credit (none was built), yet records wait: the stream asks.
        assert!(core.credits_available() > 0);
        assert!(core.waits_for_credit(Stream::Logs));
        assert!(!core.take_credit_heartbeat());
        core.set_records_waiting(true);
        assert!(core.records_waiting());
        assert!(core.take_credit_heartbeat());
        assert_eq!(core.take_frames_without_credit(), 1);
        // Once per report: the next pull that finds them still waiting does not ask again.
        core.set_records_waiting(true);
        assert!(!core.take_credit_heartbeat());
        // A report lets it ask again; credits back, nothing waits.
        assert_eq!(core.on_consumed(2), ReportOutcome::Advanced(3));
        let _ = core.on_report(&uctel_protocol::control::Report::default());
        core.set_records_waiting(true);
        assert!(core.take_credit_heartbeat());
        assert!(!core.waits_for_credit(Stream::Logs));
        core.set_records_waiting(false);
        assert!(!core.records_waiting());
    }

    #[test]
    fn a_busy_sink_sheds_the_oldest_frame_of_full_dropping_streams_only() {
        let t0 = Instant::now();
        let sm = stats();
        let mut cfg = config(100);
        cfg.ready_frames = 2;
        cfg.wait_for_credit = [false, true, false];
        let mut core = SenderCore::new(&cfg, 1, t0, sm.clone()).unwrap_or_else(|e| panic!("{e}"));
        for i in 0..2 {
            core.push_metric(&metric(i), t0, 1);
            core.flush(Stream::Metrics);
            core.push_log(&log("x"), t0, 1);
            core.flush(Stream::Logs);
        }
        // The first transmit is refused by a busy sink.
        let Poll::Transmit(t) = core.poll_transmit(t0, 1) else {
            panic!("expected a transmit")
        };
        core.requeue(t);
        assert_eq!(core.shed_when_sink_busy(), 1);
        assert_eq!(
            sm.frames_dropped(Stream::Metrics, DropReason::SendQueueFull),
            1
        );
        assert_eq!(sm.records_dropped_all(Stream::Logs), 0);
        assert!(core.wants_records(Stream::Metrics));
        // Nothing was sent, so the survivor goes out with the first sequences.
        let (tx, _) = drain(&mut core, t0);
        assert_eq!(tx.len(), 3);
        assert_eq!(tx[0].conn_seq, 0);
        assert_eq!(tx[0].stream_seq, 0);
    }

    #[test]
    fn a_one_frame_window_still_lets_a_waiting_stream_through() {
        let t0 = Instant::now();
        let mut cfg = config(1);
        cfg.wait_for_credit = [false, true, false];
        let mut core = SenderCore::new(&cfg, 1, t0, stats()).unwrap_or_else(|e| panic!("{e}"));
        assert!(core.wants_records(Stream::Logs));
        core.push_log(&log("only"), t0, 1);
        core.flush(Stream::Logs);
        assert!(!core.wants_records(Stream::Logs));
        let (tx, _) = drain(&mut core, t0);
        assert_eq!(tx.len(), 1);
    }

    #[test]
    fn a_grant_below_the_window_sizes_the_reserve_of_a_waiting_stream() {
        // A 960-frame ring window, of which the collector-wide budget grants 20 frames: the
        // reserve for the dropping streams is 1/16 of the 20 (one frame), not 1/16 of 960
        // (60 frames, more than any grant: the logs would never be taken).
        let t0 = Instant::now();
        let mut cfg = config(960);
        cfg.ready_frames = 64;
        cfg.wait_for_credit = [false, true, false];
        let mut core = SenderCore::new(&cfg, 1, t0, stats()).unwrap_or_else(|e| panic!("{e}"));
        let applied = core.on_grant(uctel_protocol::control::CreditGrant {
            sequence: 1,
            limit: 20,
        });
        assert_eq!(applied, GrantOutcome::Applied { lowered: false });
        let mut taken = 0;
        for i in 0..40 {
            if core.wants_records(Stream::Logs) {
                core.push_log(&log(&format!("{i}")), t0, 1);
                core.flush(Stream::Logs);
                taken += 1;
            }
        }
        assert_eq!(taken, 19, "twenty credits, one kept for the metrics");
        let (tx, _) = drain(&mut core, t0);
        assert_eq!(tx.len(), 19);
        assert!(tx.iter().all(|t| t.stream == Stream::Logs));
    }

    #[test]
    fn a_lane_report_returns_credit_only_with_a_consumed_sequence() {
        let t0 = Instant::now();
        let mut core =
            SenderCore::new_unexported(&config(2), 1, t0).unwrap_or_else(|e| panic!("{e}"));
        for i in 0..2 {
            core.push_metric(&metric(i), t0, 1);
            core.flush(Stream::Metrics);
        }
        let (sent, _) = drain(&mut core, t0);
        assert_eq!(sent.len(), 2);
        assert_eq!(core.credits_available(), 0);
        // Before the lane's first frame arrived the report says nothing consumed.
        assert_eq!(core.on_lane_report(None), None);
        assert_eq!(core.credits_available(), 0);
        assert_eq!(
            core.on_lane_report(Some(0)),
            Some(ReportOutcome::Advanced(1))
        );
        assert_eq!(core.credits_available(), 1);
        assert_eq!(
            core.on_lane_report(Some(1)),
            Some(ReportOutcome::Advanced(1))
        );
        assert_eq!(core.credits_available(), 2);
    }

    #[test]
    fn ready_queue_bound_stops_intake() {
        let t0 = Instant::now();
        let mut cfg = config(8);
        cfg.ready_frames = 2;
        let mut core = SenderCore::new(&cfg, 1, t0, stats()).unwrap_or_else(|e| panic!("{e}"));
        assert!(core.wants_records(Stream::Logs));
        for _ in 0..2 {
            core.push_log(&log("a"), t0, 1);
            core.flush(Stream::Logs);
        }
        assert!(!core.wants_records(Stream::Logs));
        assert!(core.wants_records(Stream::Metrics));
    }
}

#[cfg(test)]
mod proptests {
    use super::*;
    use proptest::prelude::*;
    use uctel_protocol::frame::decode_frame;
    use uctel_protocol::payload::{MetricType, Severity};

    #[derive(Debug, Clone)]
    enum Op {
        Metrics(usize),
        Log(usize),
        Samples(usize),
        Flush(bool),
        Advance(u64),
        Report(u64),
        Requeue,
        /// The connection ends: the metric samples pending are taken back.
        TakeBack,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (1usize..60).prop_map(Op::Metrics),
            (0usize..3000).prop_map(Op::Log),
            // Up to 200 samples: beyond about 90 a series no longer fits a 1024-byte frame.
            (1usize..200).prop_map(Op::Samples),
            any::<bool>().prop_map(Op::Flush),
            (0u64..300).prop_map(Op::Advance),
            (0u64..8).prop_map(Op::Report),
            Just(Op::Requeue),
            Just(Op::TakeBack),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// Whatever happens — pacing, credit starvation, oversize records, requeues — per
        /// stream: records pushed = sent + dropped + pending; posted frames carry contiguous
        /// connection and stream sequences and cumulative record counts that match; never
        /// more than the window outstanding beyond the last report.
        #[test]
        fn accounting_and_sequences_hold(ops in proptest::collection::vec(op(), 1..120)) {
            run_ops(ops, [true; 3])?;
        }

        /// The same for the pipeline of one lane (DESIGN.md §8b), carrying any subset of the
        /// streams: it takes no record of the others, posts none of their frames (idle
        /// heartbeats and `LAST_OF_EPOCH` included), and reports no totals for them.
        #[test]
        fn a_lane_carries_only_its_streams(
            ops in proptest::collection::vec(op(), 1..120),
            carries in any::<[bool; 3]>(),
        ) {
            run_ops(ops, carries)?;
        }
    }

    fn run_ops(ops: Vec<Op>, carries: [bool; 3]) -> Result<(), TestCaseError> {
        {
            let stats = Arc::new(SelfMetrics::new().unwrap_or_else(|e| panic!("{e}")));
            let t0 = Instant::now();
            let cfg = SenderConfig {
                limits: Limits {
                    max_frame_bytes: 1024,
                    ..Limits::default()
                },
                pacing: Some(PacingLimits {
                    frames_per_second: Some(200),
                    bytes_per_second: Some(100_000),
                    burst_millis: 50,
                    max_frame_bytes: 1024,
                }),
                credit_window: 6,
                first_conn_seq: u64::MAX - 10,
                first_stream_seq: 0,
                data_paths: [
                    DataPath::WriteWithImm,
                    DataPath::Send,
                    DataPath::WriteWithImm,
                ],
                flush_after: [Duration::from_millis(30); 3],
                ready_frames: 8,
                idle_heartbeat: Some(Duration::from_millis(500)),
                wait_for_credit: [false, true, false],
                carries,
            };
            let mut core =
                SenderCore::new(&cfg, 9, t0, stats.clone()).unwrap_or_else(|e| panic!("{e}"));
            let mut now = t0;
            let mut pushed = [0u64; 3];
            let mut posted: Vec<Transmit> = Vec::new();
            let mut last: Option<Transmit> = None;
            let mut taken_back = 0u64;
            for op in ops {
                match op {
                    Op::Metrics(n) => {
                        for i in 0..n {
                            if core.wants_records(Stream::Metrics) {
                                let m = Metric {
                                    name: "node_x".into(),
                                    help: String::new(),
                                    r#type: MetricType::Gauge as i32,
                                    labels: vec![],
                                    value: i as f64,
                                    timestamp_ms: 0,
                                    buckets: vec![],
                                    count: 0,
                                    sum: 0.0,
                                };
                                core.push_metric(&m, now, 1);
                                pushed[0] += 1;
                            }
                        }
                    }
                    Op::Log(len) => {
                        if core.wants_records(Stream::Logs) {
                            let r = LogRecord {
                                timestamp_ns: 1,
                                severity: Severity::Info as i32,
                                source: "s".into(),
                                message: "x".repeat(len),
                                ..Default::default()
                            };
                            core.push_log(&r, now, 1);
                            pushed[1] += 1;
                        }
                    }
                    Op::Samples(n) => {
                        if core.wants_records(Stream::FastCounters) {
                            let s = SampleSeries {
                                name: "node_infiniband_out_of_buffer".into(),
                                r#type: MetricType::Counter as i32,
                                start_us: 1_000_000,
                                offsets_us: (0..n as u64).map(|i| i * 10_000).collect(),
                                values: (0..n).map(|i| i as f64).collect(),
                                ..SampleSeries::default()
                            };
                            core.push_samples(&s, now, 1);
                            pushed[2] += n as u64;
                        }
                    }
                    Op::Flush(metrics) => core.flush(if metrics {
                        Stream::Metrics
                    } else {
                        Stream::Logs
                    }),
                    Op::Advance(ms) => now += Duration::from_millis(ms),
                    Op::Report(back) => {
                        if let Some(t) = posted.last() {
                            let _ = core.on_consumed(t.conn_seq.wrapping_sub(back));
                        }
                    }
                    Op::TakeBack => {
                        let pending = core.pending_records(Stream::Metrics);
                        let back = core.take_back_metrics();
                        prop_assert_eq!(back.len() as u64, pending);
                        prop_assert!(back.iter().all(|m| m.name == "node_x"));
                        prop_assert_eq!(core.pending_records(Stream::Metrics), 0);
                        taken_back += pending;
                        // A requeue refers to a frame taken back no more.
                        last = None;
                    }
                    Op::Requeue => {
                        // A sink refuses the most recent post (full send queue) before any
                        // report could have consumed it.
                        if let Some(t) = last.take() {
                            let undoable = core.credits.outstanding() > 0
                                && core.credits.next_seq().wrapping_sub(1) == t.conn_seq;
                            if undoable {
                                let popped = posted.pop();
                                prop_assert_eq!(popped.as_ref(), Some(&t));
                                core.requeue(t);
                            }
                        }
                    }
                }
                for _ in 0..100 {
                    match core.poll_transmit(now, 1) {
                        Poll::Transmit(t) => {
                            posted.push(t.clone());
                            last = Some(t);
                        }
                        Poll::Wait(_) => break,
                    }
                }
                prop_assert!(core.credits.outstanding() <= 6);
            }
            for s in Stream::ALL {
                // Pending records are never counted as settled.
                prop_assert!(core.unsettled_records(s) >= core.pending_records(s));
            }
            let unsettled = Stream::ALL.map(|s| core.unsettled_records(s));
            core.finish(2);
            core.drop_pending(DropReason::Shutdown);
            for s in Stream::ALL {
                // What shutdown drops stays unsettled.
                prop_assert_eq!(core.unsettled_records(s), unsettled[s.index()]);
            }
            // Contiguous sequences across the u64 wrap, cumulative counts consistent.
            for (i, t) in posted.iter().enumerate() {
                prop_assert_eq!(t.conn_seq, (u64::MAX - 10).wrapping_add(i as u64));
            }
            for s in Stream::ALL {
                let mine: Vec<&Transmit> = posted.iter().filter(|t| t.stream == s).collect();
                let mut cumulative = 0u64;
                for (i, t) in mine.iter().enumerate() {
                    prop_assert_eq!(t.stream_seq, i as u64);
                    let d = decode_frame(&t.bytes, &cfg.limits).unwrap_or_else(|e| panic!("{e}"));
                    cumulative += d.payload.record_count() as u64;
                    prop_assert_eq!(d.header.record_count, cumulative);
                    prop_assert_eq!(d.header.conn_seq, t.conn_seq);
                }
                let sent: u64 = mine.iter().map(|t| u64::from(t.records)).sum();
                let back = if s == Stream::Metrics { taken_back } else { 0 };
                prop_assert_eq!(
                    core.stats().stream(s).records_taken_back,
                    back,
                    "stream {}",
                    s
                );
                prop_assert_eq!(
                    pushed[s.index()],
                    sent + stats.records_dropped_all(s) + core.pending_records(s) + back,
                    "stream {}: pushed = sent + dropped + pending + taken back",
                    s
                );
                prop_assert_eq!(core.final_sequences().streams[s.index()].records, sent);
                if !carries[s.index()] {
                    prop_assert!(mine.is_empty(), "stream {} not carried", s);
                    prop_assert_eq!(pushed[s.index()], 0);
                    prop_assert_eq!(
                        core.final_sequences().streams[s.index()],
                        StreamTotals::default()
                    );
                    prop_assert_eq!(core.unsettled_records(s), 0);
                }
            }
            prop_assert_eq!(core.final_sequences().frames, posted.len() as u64);
        }
        Ok(())
    }
}
