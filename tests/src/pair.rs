//! The whole data pipeline in one process, without sockets and without a clock: the agent's
//! sans-IO [`SenderCore`] → an in-memory [`Link`] with seeded drop, duplicate and reorder →
//! the collector's [`ConnectionIngest`] delivering into a [`Recording`], on a virtual clock
//! (quinn-proto's test `Pair` is the model).
//!
//! A scenario is a list of [`Op`]s; [`Pair::run`] plays it, then closes the epoch the agent's
//! way (`finish`, send what credit allows within a virtual shutdown grace, drop the rest as
//! `shutdown`, `Goodbye` with the final sequences) and drains the link. Every drive loop is
//! bounded: a pipeline that never quiesces fails with [`PairError::Hang`].
//!
//! The accounting terms are the product's own (DESIGN.md §5, the fault matrix's law in
//! [`crate::faults`]): per stream, agent `frames_sent` = collector `accepted + lost +
//! dropped_after_tracking` and agent `records_sent` = collector `records_received +
//! records_lost + records_replayed` at quiescence; records pushed = `records_sent +
//! records_dropped` (agent, every reason); on the connection, frames posted =
//! `conn_received + conn_lost + dropped_before_tracking`. Before quiescence
//! `accepted + lost + missing + dropped_after_tracking ≤ frames sent` and
//! `records_received + records_lost ≤ records sent`, and no record is delivered twice.
//!
//! With [`PairConfig::dictionary`] the metrics stream speaks the series dictionary, and the
//! scenario may churn series ([`Op::Appear`], [`Op::Vanish`]) and restart the agent
//! ([`Op::Restart`], a new epoch): then also at every step no frame posted references an
//! entry the collector has not acknowledged, no frame is dropped as malformed and no sample
//! is delivered under a series not its own ([`churn`]).

use std::collections::{BTreeSet, HashSet};
use std::io;
use std::time::{Duration, Instant};

use uctel_agent::config::DataPath;
use uctel_agent::selfmetrics::DropReason as AgentDropReason;
use uctel_agent::sender::core::{Poll, SenderConfig, SenderCore, Transmit, STREAMS};
use uctel_agent::stream::Stream;
use uctel_collector::ingest::{ConnectionIngest, Delivery, StreamLedger};
use uctel_collector::ingest::{DictAckOutbox, FrameOutcome};
use uctel_collector::logsink::LogContext;
use uctel_collector::store::IngestOutcome;
use uctel_collector::telemetry::DropReason;
use uctel_collector::telemetry::Telemetry;
use uctel_protocol::borrowed::MetricBatchView;
use uctel_protocol::control::{DictAck, Goodbye, GoodbyeReason, StreamFinal};
use uctel_protocol::frame::conn_seq_immediate;
use uctel_protocol::limits::Limits;
use uctel_protocol::payload::{Label, LogRecord, Metric, MetricType};
use uctel_protocol::samples::{SampleBatch, SampleSeries};
use uctel_protocol::tracker::TrackerConfig;

use crate::faults::Rng;

pub mod churn;
mod words;
pub use words::{WordLink, Words};

/// The epoch of every pair's first connection ([`Op::Restart`] counts up from it).
pub const EPOCH: u64 = 0x5eed_0000_0001;

/// Most steps of any drive loop (a step delivers, polls and advances the clock once).
pub const MAX_STEPS: usize = 100_000;

/// One step of a scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Push `n` metric samples.
    Metrics(u8),
    /// Push `n` log records.
    Logs(u8),
    /// Push one sample series of `n` samples (fast_counters stream; `n` records).
    Samples(u8),
    /// Close the open frame of the stream now.
    Flush(Stream),
    /// Advance the virtual clock by this many microseconds (deliveries and timers fire).
    Advance(u32),
    /// The collector sends a `Report`; the agent takes its credits.
    Report,
    /// The collector writes the agent's credit word into its memory (with
    /// [`PairConfig::credit_words`]; nothing otherwise).
    CreditWrite,
    /// `n` new series join the churn set ([`churn`]): from now on [`Op::Metrics`] pushes
    /// samples of the set's series in turn.
    Appear(u8),
    /// The `n` oldest series of the churn set vanish (never pushed again in this epoch).
    Vanish(u8),
    /// The agent restarts: the epoch closes as at the end of [`Pair::run`] (laws checked
    /// at its quiescence), then a new agent epoch connects to a new collector connection
    /// (`set_previous_epoch`: an epoch change), with empty dictionaries on both sides and
    /// the churn set as it was; every `DictAck` of the earlier epochs is then handed to
    /// the new agent, and again at each [`Op::Report`] (it must ignore them).
    Restart,
}

/// Link faults, per mille of the frames posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LinkFaults {
    /// Frames lost on the wire.
    pub drop: u32,
    /// Frames delivered twice.
    pub duplicate: u32,
    /// Frames held back by up to `max_delay_us`, so later ones overtake them.
    pub reorder: u32,
    /// Longest extra delay of a reordered frame, microseconds.
    pub max_delay_us: u32,
}

/// A scenario's settings.
#[derive(Debug, Clone)]
pub struct PairConfig {
    /// Seed of the link's faults and of the `Goodbye`'s timing.
    pub seed: u64,
    /// Link faults.
    pub faults: LinkFaults,
    /// The agent's credit window (frames).
    pub credit_window: u64,
    /// Whether the logs stream waits for credit (`on_no_credit: wait`) instead of dropping.
    pub logs_wait_for_credit: bool,
    /// Largest frame, bytes.
    pub max_frame_bytes: usize,
    /// The tracker's reorder window (frames).
    pub reorder_window: u64,
    /// Credits also written into the agent's memory ([`Op::CreditWrite`]) over a reverse
    /// link with these faults; `None`: `Report`s only.
    pub credit_words: Option<LinkFaults>,
    /// Metrics as series-dictionary frames (`kind = metrics_dict`, negotiated as at
    /// `Hello`/`Welcome`): the collector's `DictAck`s reach the agent with each
    /// [`Op::Report`]; every frame posted is checked against them
    /// ([`churn::check_posted`]) and every frame must decode (none dropped as malformed).
    pub dictionary: bool,
}

/// Why a scenario failed.
#[derive(Debug, thiserror::Error)]
pub enum PairError {
    /// A drive loop did not quiesce within [`MAX_STEPS`].
    #[error("the pipeline did not quiesce within {MAX_STEPS} steps ({0})")]
    Hang(&'static str),
    /// An accounting law did not hold.
    #[error("{0}")]
    Law(String),
    /// The pipeline could not be built.
    #[error("setup: {0}")]
    Setup(String),
}

/// What the collector delivered: one id per record (`stream:index`), and how many copies.
#[derive(Debug, Default)]
pub struct Recording {
    /// Every record delivered, in order.
    pub delivered: Vec<String>,
    /// Ids delivered more than once.
    pub duplicates: Vec<String>,
    /// Churn samples delivered under a name, label, help or type not their own
    /// ([`churn::check_sample`]).
    pub misnamed: Vec<String>,
    seen: HashSet<String>,
}

impl Recording {
    fn take(&mut self, id: String) {
        if !self.seen.insert(id.clone()) {
            self.duplicates.push(id.clone());
        }
        self.delivered.push(id);
    }
}

impl Delivery for Recording {
    fn metrics(
        &mut self,
        _agent: &str,
        _instance: &str,
        _frame_timestamp_ns: u64,
        batch: &MetricBatchView<'_>,
        _now: Instant,
    ) -> IngestOutcome {
        for m in batch.iter() {
            match m.labels.iter().find(|l| l.name == "id") {
                Some(l) => self.take(l.value.to_owned()),
                None => match churn::check_sample(&m) {
                    Ok(id) => self.take(id),
                    Err(e) => self.misnamed.push(e),
                },
            }
        }
        IngestOutcome {
            stored: batch.len() as u64,
            rejected: Vec::new(),
        }
    }

    fn samples(
        &mut self,
        _agent: &str,
        _instance: &str,
        batch: &SampleBatch,
        _now: Instant,
    ) -> IngestOutcome {
        let mut stored = 0;
        for s in &batch.series {
            for (_, v) in s.samples() {
                self.take(format!("fast_counters:{v}"));
                stored += 1;
            }
        }
        IngestOutcome {
            stored,
            rejected: Vec::new(),
        }
    }

    fn logs(&mut self, _ctx: &LogContext<'_>, records: &[LogRecord]) -> (u64, Option<io::Error>) {
        for r in records {
            self.take(r.message.clone());
        }
        (0, None)
    }

    fn series_count(&self, _agent: &str) -> usize {
        self.seen.len()
    }
}

/// A frame on the wire.
#[derive(Debug)]
struct InFlight {
    /// Virtual time of arrival.
    at: Duration,
    /// Tie-break: the order it was put on the wire.
    order: u64,
    data_path: DataPath,
    conn_seq: u64,
    bytes: Vec<u8>,
}

/// The in-memory wire: seeded drop, duplicate and reorder; delivers in arrival-time order.
#[derive(Debug)]
pub struct Link {
    rng: Rng,
    faults: LinkFaults,
    in_flight: Vec<InFlight>,
    order: u64,
    /// Frames dropped on the wire.
    pub dropped: u64,
    /// Extra copies put on the wire.
    pub duplicated: u64,
}

/// Fixed one-way latency of the link.
const LATENCY: Duration = Duration::from_micros(100);

impl Link {
    fn new(seed: u64, faults: LinkFaults) -> Link {
        Link {
            rng: Rng::new(seed),
            faults,
            in_flight: Vec::new(),
            order: 0,
            dropped: 0,
            duplicated: 0,
        }
    }

    fn chance(&mut self, per_mille: u32) -> bool {
        self.rng.range(0, 999) < u64::from(per_mille)
    }

    fn send(&mut self, t: &Transmit, now: Duration) {
        if self.chance(self.faults.drop) {
            self.dropped += 1;
            return;
        }
        let copies = if self.chance(self.faults.duplicate) {
            self.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut at = now + LATENCY;
            if self.chance(self.faults.reorder) {
                at += Duration::from_micros(
                    self.rng
                        .range(1, u64::from(self.faults.max_delay_us.max(1))),
                );
            }
            self.order += 1;
            self.in_flight.push(InFlight {
                at,
                order: self.order,
                data_path: t.data_path,
                conn_seq: t.conn_seq,
                bytes: t.bytes.clone(),
            });
        }
    }

    /// The next frame due at or before `now`, earliest first.
    fn pop_due(&mut self, now: Duration) -> Option<InFlight> {
        let i = self
            .in_flight
            .iter()
            .enumerate()
            .filter(|(_, f)| f.at <= now)
            .min_by_key(|(_, f)| (f.at, f.order))
            .map(|(i, _)| i)?;
        Some(self.in_flight.swap_remove(i))
    }

    /// The arrival time of the next frame.
    fn next_arrival(&self) -> Option<Duration> {
        self.in_flight.iter().map(|f| f.at).min()
    }
}

/// The figures at quiescence, summed over the epochs of the run ([`Op::Restart`]).
#[derive(Debug, Clone)]
pub struct PairOutcome {
    /// Per stream (indexed by [`Stream::index`]): records pushed into the sender.
    pub pushed: [u64; STREAMS],
    /// The collector's ledger per stream.
    pub ledger: [StreamLedger; STREAMS],
    /// Frames posted on the connection.
    pub frames_posted: u64,
    /// Frames the link dropped.
    pub link_dropped: u64,
    /// Records delivered.
    pub delivered: usize,
    /// Agent epochs the run went through (1 + restarts).
    pub epochs: u32,
}

impl PairOutcome {
    fn add(&mut self, o: &PairOutcome) {
        for s in 0..STREAMS {
            self.pushed[s] += o.pushed[s];
            let (a, b) = (&mut self.ledger[s], o.ledger[s]);
            a.accepted += b.accepted;
            a.lost += b.lost;
            a.missing += b.missing;
            a.late += b.late;
            a.duplicate += b.duplicate;
            a.dropped_after_tracking += b.dropped_after_tracking;
            a.records_received += b.records_received;
            a.records_lost += b.records_lost;
            a.records_replayed += b.records_replayed;
        }
        self.frames_posted += o.frames_posted;
        self.link_dropped = o.link_dropped;
        self.delivered += o.delivered;
        self.epochs += o.epochs;
    }
}

/// The churn set and the dictionary's acknowledgments of the current epoch.
#[derive(Debug, Default)]
struct ChurnState {
    /// Series pushed by [`Op::Metrics`], oldest first.
    series: std::collections::VecDeque<u32>,
    /// The next new series number.
    next_series: u32,
    /// Which series the next sample is of.
    cursor: usize,
    /// The collector's acknowledgments, with [`PairConfig::dictionary`].
    outbox: Option<DictAckOutbox>,
    /// The highest `known_up_to` handed to the agent in this epoch.
    acked: u32,
    /// Every acknowledgment of the run (the earlier epochs' are handed to the agent again at
    /// each report).
    old_acks: Vec<DictAck>,
    /// Records pushed in the earlier epochs, per stream (ids stay unique over epochs).
    base: [u64; STREAMS],
    /// The earlier epochs' figures.
    done: Option<PairOutcome>,
}

/// The agent's pipeline, the link and the collector's connection, on one virtual clock.
#[derive(Debug)]
pub struct Pair {
    /// The agent's send pipeline.
    pub core: SenderCore,
    /// The collector's connection.
    pub ingest: ConnectionIngest<Recording>,
    /// The wire.
    pub link: Link,
    /// The credit writes, with [`PairConfig::credit_words`].
    pub words: Option<Words>,
    t0: Instant,
    now: Duration,
    pushed: [u64; STREAMS],
    rng: Rng,
    cfg: PairConfig,
    epoch: u64,
    churn: ChurnState,
}

type Connection = (
    SenderCore,
    ConnectionIngest<Recording>,
    Option<DictAckOutbox>,
);

/// The agent's pipeline and the collector's connection of `epoch`, on the clock of `t0`.
fn connect(cfg: &PairConfig, epoch: u64, t0: Instant) -> Result<Connection, PairError> {
    let setup = |e: &dyn std::fmt::Display| PairError::Setup(e.to_string());
    let limits = Limits {
        max_frame_bytes: cfg.max_frame_bytes,
        ..Limits::default()
    };
    let sender = SenderConfig {
        limits: limits.clone(),
        pacing: None,
        credit_window: cfg.credit_window,
        first_conn_seq: 0,
        first_stream_seq: 0,
        data_paths: [
            DataPath::WriteWithImm,
            DataPath::Send,
            DataPath::WriteWithImm,
        ],
        flush_after: [Duration::from_millis(2); 3],
        ready_frames: 8,
        idle_heartbeat: Some(Duration::from_millis(5)),
        wait_for_credit: [false, cfg.logs_wait_for_credit, false],
        carries: [true; 3],
    };
    let mut core = SenderCore::new_unexported(&sender, epoch, t0).map_err(|e| setup(&e))?;
    let telemetry = Telemetry::new().map_err(|e| setup(&e))?;
    let mut ingest = ConnectionIngest::with_delivery(
        "pair",
        "pair-host",
        epoch,
        limits,
        TrackerConfig {
            reorder_window: cfg.reorder_window,
            ..TrackerConfig::default()
        },
        Recording::default(),
        telemetry.agent("pair"),
    )
    .map_err(|e| setup(&e))?;
    let outbox = if cfg.dictionary {
        if !core.use_series_dictionary() {
            return Err(PairError::Setup(
                "the series dictionary did not switch on".into(),
            ));
        }
        let outbox = DictAckOutbox::default();
        ingest.set_dict_acks(outbox.clone());
        Some(outbox)
    } else {
        None
    };
    Ok((core, ingest, outbox))
}

impl Pair {
    /// A connected pair.
    ///
    /// # Errors
    /// [`PairError::Setup`] when the pipeline or the connection cannot be built.
    pub fn new(cfg: &PairConfig) -> Result<Pair, PairError> {
        let t0 = Instant::now();
        let (core, ingest, outbox) = connect(cfg, EPOCH, t0)?;
        Ok(Pair {
            core,
            ingest,
            link: Link::new(cfg.seed, cfg.faults),
            words: cfg
                .credit_words
                .map(|f| Words::new(cfg.seed, f, EPOCH, cfg.credit_window)),
            t0,
            now: Duration::ZERO,
            pushed: [0; STREAMS],
            rng: Rng::new(cfg.seed ^ 0x600d_b1e5),
            cfg: cfg.clone(),
            epoch: EPOCH,
            churn: ChurnState {
                outbox,
                ..ChurnState::default()
            },
        })
    }

    fn instant(&self) -> Instant {
        self.t0 + self.now
    }

    fn unix_ns(&self) -> u64 {
        1_700_000_000_000_000_000 + u64::try_from(self.now.as_nanos()).unwrap_or(0)
    }

    fn push_metrics(&mut self, n: u8) {
        let (now, ns) = (self.instant(), self.unix_ns());
        for _ in 0..n {
            let i = self.churn.base[Stream::Metrics.index()] + self.pushed[Stream::Metrics.index()];
            self.pushed[Stream::Metrics.index()] += 1;
            if !self.churn.series.is_empty() {
                let at = self.churn.cursor % self.churn.series.len();
                self.churn.cursor = at + 1;
                let m = churn::churn_metric(self.churn.series[at], i);
                self.core.push_metric(&m, now, ns);
                continue;
            }
            let m = Metric {
                name: "node_pair_sample".into(),
                help: String::new(),
                r#type: MetricType::Gauge as i32,
                labels: vec![Label {
                    name: "id".into(),
                    value: format!("metrics:{i}"),
                }],
                value: i as f64,
                timestamp_ms: 0,
                buckets: vec![],
                count: 0,
                sum: 0.0,
            };
            self.core.push_metric(&m, now, ns);
        }
    }

    fn push_samples(&mut self, n: u8) {
        let (now, ns) = (self.instant(), self.unix_ns());
        let first = self.churn.base[Stream::FastCounters.index()]
            + self.pushed[Stream::FastCounters.index()];
        let n = u64::from(n.max(1));
        self.pushed[Stream::FastCounters.index()] += n;
        // Each sample's value is its index on the stream: the id the recording keeps.
        let s = SampleSeries {
            name: "node_pair_fast".into(),
            help: String::new(),
            r#type: MetricType::Counter as i32,
            labels: Vec::new(),
            start_us: i64::try_from(ns / 1000).unwrap_or(i64::MAX),
            offsets_us: (0..n).map(|k| k * 10).collect(),
            values: (first..first + n).map(|v| v as f64).collect(),
        };
        self.core.push_samples(&s, now, ns);
    }

    fn push_logs(&mut self, n: u8) {
        let (now, ns) = (self.instant(), self.unix_ns());
        for _ in 0..n {
            let i = self.churn.base[Stream::Logs.index()] + self.pushed[Stream::Logs.index()];
            self.pushed[Stream::Logs.index()] += 1;
            let r = LogRecord {
                timestamp_ns: ns,
                severity: 3,
                source: "/var/log/pair".into(),
                message: format!("logs:{i}"),
                ..Default::default()
            };
            self.core.push_log(&r, now, ns);
        }
    }

    /// Posts every frame the pipeline releases now; returns when it has to wait.
    fn transmit(&mut self) -> Result<(), PairError> {
        if let Some(words) = self.words.as_mut() {
            if let Some(w) = words.read() {
                if self.core.on_credit_word(w.grant(), w.consumed_next) {
                    words.applied += 1;
                }
            }
        }
        for _ in 0..MAX_STEPS {
            match self.core.poll_transmit(self.instant(), self.unix_ns()) {
                Poll::Transmit(t) => {
                    if let Some(limit) = self.words.as_ref().and_then(|x| x.seen_limit) {
                        if t.conn_seq >= limit {
                            return Err(PairError::Law(format!(
                                "t={:?}: frame with connection sequence {} beyond the last \
                                 credit limit the agent saw ({limit})",
                                self.now, t.conn_seq
                            )));
                        }
                    }
                    if self.cfg.dictionary {
                        churn::check_posted(&t.bytes, self.churn.acked).map_err(|e| {
                            PairError::Law(format!("t={:?} epoch {:#x}: {e}", self.now, self.epoch))
                        })?;
                    }
                    self.core.sent(&t);
                    self.link.send(&t, self.now);
                }
                Poll::Wait(_) => return Ok(()),
            }
        }
        Err(PairError::Hang("poll_transmit never waited"))
    }

    /// Hands every frame due by now to the collector, checking the in-flight law after each.
    fn deliver(&mut self) -> Result<(), PairError> {
        if let Some(w) = self.words.as_mut() {
            w.land(self.now);
        }
        for _ in 0..MAX_STEPS {
            let Some(f) = self.link.pop_due(self.now) else {
                return Ok(());
            };
            let now = self.instant();
            let outcome = match f.data_path {
                DataPath::WriteWithImm => {
                    let c = self.ingest.conn_seq_for_imm(conn_seq_immediate(f.conn_seq));
                    self.ingest.on_slot(c, &f.bytes, now)
                }
                DataPath::Send => self.ingest.on_send(&f.bytes, now),
            };
            if let FrameOutcome::Dropped(
                reason @ (DropReason::MalformedFrame | DropReason::MalformedPayload),
            ) = outcome
            {
                return Err(PairError::Law(format!(
                    "t={:?} epoch {:#x}: a frame (connection sequence {}) dropped as {reason:?}",
                    self.now, self.epoch, f.conn_seq
                )));
            }
            self.check_in_flight()?;
        }
        Err(PairError::Hang("the link never emptied"))
    }

    fn report(&mut self) {
        let r = self.ingest.report();
        let _ = self.core.on_report(&r);
        // The DictAcks travel on the control channel with the report (ordered, reliable).
        if let Some(outbox) = &self.churn.outbox {
            let fresh = outbox.take();
            for a in &fresh {
                self.core.on_dict_ack(a);
                if a.epoch == self.epoch {
                    self.churn.acked = self.churn.acked.max(a.known_up_to);
                }
            }
            self.churn.old_acks.extend(fresh);
            // Acknowledgments of the earlier epochs keep arriving: the agent ignores them
            // (its ids of this epoch name other series).
            for a in &self.churn.old_acks {
                if a.epoch != self.epoch {
                    self.core.on_dict_ack(a);
                }
            }
        }
    }

    fn appear(&mut self, n: u8) {
        for _ in 0..n {
            self.churn.series.push_back(self.churn.next_series);
            self.churn.next_series += 1;
        }
    }

    fn vanish(&mut self, n: u8) {
        for _ in 0..n {
            self.churn.series.pop_front();
        }
    }

    /// The agent restarts ([`Op::Restart`]).
    fn restart(&mut self) -> Result<(), PairError> {
        let out = self.close_epoch()?;
        match self.churn.done.as_mut() {
            Some(done) => done.add(&out),
            None => self.churn.done = Some(out),
        }
        for s in 0..STREAMS {
            self.churn.base[s] += self.pushed[s];
        }
        self.pushed = [0; STREAMS];
        let previous = self.epoch;
        self.epoch += 1;
        let (core, mut ingest, outbox) = connect(&self.cfg, self.epoch, self.t0)?;
        ingest.set_previous_epoch(Some(previous));
        self.core = core;
        self.ingest = ingest;
        self.churn.outbox = outbox;
        self.churn.acked = 0;
        self.words = self
            .cfg
            .credit_words
            .map(|f| Words::new(self.cfg.seed, f, self.epoch, self.cfg.credit_window));
        // Acknowledgments of the earlier epochs reach the new agent: ignored.
        for a in &self.churn.old_acks {
            self.core.on_dict_ack(a);
        }
        Ok(())
    }

    /// The collector writes the credit word: its consumed point as a `Report` would say it.
    fn credit_write(&mut self) {
        let r = self.ingest.report();
        let consumed_next = if r.conn_received > 0 || r.consumed_conn_seq > 0 {
            r.consumed_conn_seq.saturating_add(1)
        } else {
            0
        };
        let now = self.now;
        if let Some(w) = self.words.as_mut() {
            w.write(consumed_next, now);
        }
    }

    /// Advance the virtual clock by `d`, delivering what arrives on the way in order.
    fn advance(&mut self, d: Duration) -> Result<(), PairError> {
        let until = self.now + d;
        for _ in 0..MAX_STEPS {
            let words = self.words.as_ref().and_then(|w| w.link.next_arrival());
            let next = match (self.link.next_arrival(), words) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            match next.filter(|a| *a <= until) {
                Some(a) => {
                    self.now = self.now.max(a);
                    self.deliver()?;
                }
                None => {
                    self.now = until;
                    self.deliver()?;
                    return self.transmit();
                }
            }
        }
        Err(PairError::Hang("advance"))
    }

    /// One scenario step, then whatever the pipeline releases.
    ///
    /// # Errors
    /// A hang or an in-flight law that did not hold.
    pub fn step(&mut self, op: Op) -> Result<(), PairError> {
        match op {
            Op::Metrics(n) => self.push_metrics(n),
            Op::Logs(n) => self.push_logs(n),
            Op::Samples(n) => self.push_samples(n),
            Op::Flush(s) => self.core.flush(s),
            Op::Advance(us) => self.advance(Duration::from_micros(u64::from(us)))?,
            Op::Report => self.report(),
            Op::CreditWrite => self.credit_write(),
            Op::Appear(n) => self.appear(n),
            Op::Vanish(n) => self.vanish(n),
            Op::Restart => self.restart()?,
        }
        self.transmit()?;
        self.deliver()
    }

    /// Plays `ops`, closes the epoch as the agent does at shutdown, drains the link and
    /// checks the laws at quiescence.
    ///
    /// # Errors
    /// A hang, or the first law that did not hold.
    pub fn run(&mut self, ops: &[Op]) -> Result<PairOutcome, PairError> {
        for op in ops {
            self.step(*op)?;
        }
        let mut out = self.close_epoch()?;
        if let Some(mut done) = self.churn.done.take() {
            done.add(&out);
            out = done;
        }
        Ok(out)
    }

    /// Closes the epoch as the agent does at shutdown, drains the link and checks the laws
    /// at quiescence; the figures of this epoch.
    fn close_epoch(&mut self) -> Result<PairOutcome, PairError> {
        // Shutdown: close every stream, send what credit allows within a virtual grace
        // (reports keep coming), then drop what is left as `shutdown`.
        self.core.finish(self.unix_ns());
        self.transmit()?;
        let grace = self.now + Duration::from_millis(50);
        let mut steps = 0;
        while self.core.ready_frames() > 0 && self.now < grace {
            steps += 1;
            if steps > MAX_STEPS {
                return Err(PairError::Hang("shutdown grace"));
            }
            self.advance(Duration::from_micros(500))?;
            self.report();
            self.credit_write();
            self.transmit()?;
        }
        self.core.drop_pending(AgentDropReason::Shutdown);
        // The Goodbye (control channel) may overtake frames still on the wire, also every
        // frame of a stream (or of the connection) the collector has not seen yet: those are
        // counted lost at the Goodbye and stale when they arrive.
        let overtake = self.rng.range(0, 1) == 1;
        let wait = Duration::from_micros(self.rng.range(0, 400));
        if overtake {
            self.advance(wait)?;
        } else {
            self.drain()?;
        }
        let fin = self.core.final_sequences();
        let goodbye = Goodbye {
            final_conn_seq: fin.last_conn_seq,
            rc_final_conn_seq: None,
            streams: Stream::ALL
                .iter()
                .map(|s| {
                    let t = fin.streams[s.index()];
                    StreamFinal {
                        stream_id: s.id(),
                        final_stream_seq: t.last_stream_seq,
                        final_record_count: t.records,
                    }
                })
                .collect(),
            reason: GoodbyeReason::Shutdown as i32,
            detail: "pair shutdown".into(),
        };
        let summary = self.ingest.close(&goodbye);
        self.check_in_flight()?;
        // Drain the wire: late frames of the closed epoch are stale.
        self.drain()?;
        self.check_in_flight()?;

        let ledger = self.ledgers();
        let stats = *self.core.stats();
        let fin = self.core.final_sequences();
        let mut bad = Vec::new();
        for s in Stream::ALL {
            let (l, st, t) = (ledger[s.index()], stats.stream(s), fin.streams[s.index()]);
            let pushed = self.pushed[s.index()];
            if st.frames_sent != t.frames || st.records_sent != t.records {
                bad.push(format!(
                    "{s}: stats sent {}/{} frames/records, final sequences {}/{}",
                    st.frames_sent, st.records_sent, t.frames, t.records
                ));
            }
            if pushed != st.records_sent + st.records_dropped_all() + self.core.pending_records(s) {
                bad.push(format!(
                    "{s}: records pushed {pushed} != sent {} + dropped {} + pending {}",
                    st.records_sent,
                    st.records_dropped_all(),
                    self.core.pending_records(s)
                ));
            }
            let frames = l.accepted + l.lost + l.dropped_after_tracking;
            if st.frames_sent != frames || l.missing != 0 {
                bad.push(format!(
                    "{s}: frames sent {} != received {} + lost {} + dropped {} (missing {})",
                    st.frames_sent, l.accepted, l.lost, l.dropped_after_tracking, l.missing
                ));
            }
            let records = l.records_received + l.records_lost + l.records_replayed;
            if st.records_sent != records {
                bad.push(format!(
                    "{s}: records sent {} != received {} + lost {} + replayed {}",
                    st.records_sent, l.records_received, l.records_lost, l.records_replayed
                ));
            }
        }
        let conn = summary.conn_received + summary.conn_lost + summary.dropped_before_tracking;
        if fin.frames != conn {
            bad.push(format!(
                "connection: frames posted {} != received {} + lost {} + dropped {}",
                fin.frames,
                summary.conn_received,
                summary.conn_lost,
                summary.dropped_before_tracking
            ));
        }
        let rec = self.ingest.delivery();
        let received: u64 = ledger.iter().map(|l| l.records_received).sum();
        if rec.delivered.len() as u64 != received {
            bad.push(format!(
                "delivered {} records, the ledger says {received} received",
                rec.delivered.len()
            ));
        }
        let unknown: BTreeSet<&String> = rec
            .delivered
            .iter()
            .filter(|id| !self.was_pushed(id))
            .collect();
        if !unknown.is_empty() {
            bad.push(format!("delivered records never pushed: {unknown:?}"));
        }
        if !bad.is_empty() {
            return Err(PairError::Law(format!(
                "at quiescence: {}; ledger {ledger:?}; sender {stats:?}; link dropped {} duplicated {}",
                bad.join("; "),
                self.link.dropped,
                self.link.duplicated
            )));
        }
        Ok(PairOutcome {
            pushed: self.pushed,
            ledger,
            frames_posted: fin.frames,
            link_dropped: self.link.dropped,
            delivered: rec.delivered.len(),
            epochs: 1,
        })
    }

    /// Delivers everything still on the wire.
    fn drain(&mut self) -> Result<(), PairError> {
        let mut steps = 0;
        while let Some(a) = self.link.next_arrival() {
            steps += 1;
            if steps > MAX_STEPS {
                return Err(PairError::Hang("draining the link"));
            }
            self.now = self.now.max(a);
            self.deliver()?;
        }
        Ok(())
    }

    fn was_pushed(&self, id: &str) -> bool {
        let Some((stream, i)) = id.split_once(':') else {
            return false;
        };
        let Ok(i) = i.parse::<u64>() else {
            return false;
        };
        let s = match stream {
            "metrics" => Stream::Metrics,
            "logs" => Stream::Logs,
            "fast_counters" => Stream::FastCounters,
            _ => return false,
        };
        let base = self.churn.base[s.index()];
        (base..base + self.pushed[s.index()]).contains(&i)
    }

    /// The highest series-dictionary acknowledgment (`known_up_to`) the agent got in the
    /// current epoch (0 without [`PairConfig::dictionary`]).
    pub fn dictionary_acked(&self) -> u32 {
        self.churn.acked
    }

    /// The collector's ledger per stream, indexed by [`Stream::index`].
    pub fn ledgers(&self) -> [StreamLedger; STREAMS] {
        let mut out = [StreamLedger::default(); STREAMS];
        for (id, l) in self.ingest.ledger() {
            if let Some(s) = Stream::from_id(id) {
                out[s.index()] = l;
            }
        }
        out
    }

    /// The laws that hold at every instant: per stream, `accepted + lost + missing +
    /// dropped_after_tracking ≤ frames sent` and `records_received + records_lost ≤ records
    /// sent`; no record delivered twice.
    ///
    /// # Errors
    /// [`PairError::Law`] naming the first term that broke.
    pub fn check_in_flight(&self) -> Result<(), PairError> {
        let ledger = self.ledgers();
        let stats = self.core.stats();
        for s in Stream::ALL {
            let (l, st) = (ledger[s.index()], stats.stream(s));
            let seen = l.accepted + l.lost + l.missing + l.dropped_after_tracking;
            if seen > st.frames_sent {
                return Err(PairError::Law(format!(
                    "t={:?} {s}: received {} + lost {} + missing {} + dropped {} > frames sent {}",
                    self.now,
                    l.accepted,
                    l.lost,
                    l.missing,
                    l.dropped_after_tracking,
                    st.frames_sent
                )));
            }
            if l.records_received + l.records_lost > st.records_sent {
                return Err(PairError::Law(format!(
                    "t={:?} {s}: records received {} + lost {} > records sent {}",
                    self.now, l.records_received, l.records_lost, st.records_sent
                )));
            }
        }
        let rec = self.ingest.delivery();
        if !rec.misnamed.is_empty() {
            return Err(PairError::Law(format!(
                "t={:?} epoch {:#x}: samples delivered under a wrong series: {:?}",
                self.now, self.epoch, rec.misnamed
            )));
        }
        if !rec.duplicates.is_empty() {
            return Err(PairError::Law(format!(
                "t={:?}: records delivered twice: {:?}",
                self.now, rec.duplicates
            )));
        }
        Ok(())
    }
}
