//! Sans-IO sequence tracker: gap, late, duplicate and stale detection for one sequence space.
//!
//! One [`SequenceTracker`] follows one sequence space: the connection sequence of an agent
//! connection, or the stream sequence of one stream (DESIGN.md §5). It is adapted from
//! RFC 3550 Appendix A.1 (`update_seq`) and A.3 (loss statistics) with three changes:
//!
//! * **Explicit epoch instead of probation.** Every frame carries the agent epoch. A frame of a
//!   new epoch resets the tracker at once (no `MIN_SEQUENTIAL` probation, no `bad_seq`
//!   two-packet restart heuristic); the reset is counted with [`ResetReason::EpochChange`],
//!   never as loss.
//! * **64-bit sequences.** Sequences are `u64` and compared as serial numbers with
//!   [`Seq`] (RFC 1982, practical form: `a` is after `b` when `a − b` (mod 2^64) is in
//!   `1..2^63`), so no input, including values next to `u64::MAX`, can make the tracker
//!   panic. The 32-bit immediate of an RDMA Write-with-immediate carries the low 32 bits of
//!   the connection sequence; [`Seq::extend`] ([`extend_u32`]) widens it back to 64 bits (the
//!   role of RFC 3550's `cycles`).
//! * **Loss is counted once, when it is certain, and never taken back.** RFC 3550 computes
//!   `lost = expected − received` and lets late frames and duplicates move it both ways. Here
//!   a sequence skipped by a forward jump is first *missing*: it may still arrive inside the
//!   reorder window (a *late* frame, counted as received and in `late`). It becomes *lost*
//!   only when it falls out of the window unseen (the window's lower edge passes it), when a
//!   later frame arrived at least the reorder *time* ago (below), or when the segment is
//!   closed ([`SequenceTracker::close`], the sender's `Goodbye`, or
//!   [`SequenceTracker::settle`] when the sender vanished). `lost` therefore only grows, and
//!   at every instant `received + lost ≤ sent`; a frame seen twice is a *duplicate* that
//!   moves nothing. A frame that arrives after its sequence was settled is *stale*: it was
//!   already counted (received or lost) and is not delivered.
//!
//! # Segments
//!
//! A *segment* is the run of observations between two resets. It starts at `base` (the first
//! sequence seen after the reset) and ends, so far, at `highest`. Its *expected* count is
//! `highest − base + 1` (RFC 3550 A.3 `expected`).
//!
//! # How each observation moves the counters
//!
//! Let `d = seq − highest` (wrapping) be the forward distance and `b = highest − seq` the
//! backward distance. "Segment" counters restart at zero on each reset; the cumulative
//! counters of [`TrackerCounts`] add every segment together.
//!
//! | observation | condition | received | lost | late | duplicate | stale | resets | highest / base |
//! |---|---|---|---|---|---|---|---|---|
//! | [`First`](Observation::First) | first frame ever | +1 | | | | | | both = `seq` |
//! | [`EpochReset`](Observation::EpochReset) | `epoch` differs from the current and from the retired one | +1 | | | | | `epoch_change` +1 | both = `seq` |
//! | [`InOrder`](Observation::InOrder) | `d == 1` | +1 | | | | | | highest = `seq` |
//! | [`Gap`](Observation::Gap) | `1 < d ≤ max_dropout` | +1 | | | | | | highest = `seq` |
//! | [`Resync`](Observation::Resync) | `d > max_dropout`, or the segment would span `2^63` or more | +1 | | | | | `dropout` +1 | both = `seq` |
//! | [`Late`](Observation::Late) | `1 ≤ b < reorder_window`, `seq ≥ base`, not yet seen, not yet lost by time | +1 | | +1 | | | | |
//! | [`Duplicate`](Observation::Duplicate) | `0 ≤ b < reorder_window`, `seq ≥ base`, already seen | | | | +1 | | | |
//! | [`Stale`](Observation::Stale) | `b ≥ reorder_window`, or `seq < base`, or counted lost by the reorder time, or the segment was closed, or the epoch was retired by the last epoch change | | | | | +1 | | |
//!
//! Whenever `highest` moves forward, every sequence that leaves the window (`b` becomes
//! `≥ reorder_window`) without having been seen moves from *missing* to `lost`.
//!
//! # The reorder window in time
//!
//! A window counted in frames alone is minutes long on a slow stream (100 frames at one frame
//! a second). So the window is also bounded in time, after RFC 8985 (RACK-TLP) §6.2, whose
//! reordering window `RACK.reo_wnd` is a time: with [`TrackerConfig::reorder_time`] set, a
//! missing sequence is lost once a later sequence arrived at least `reorder_time` ago,
//! whichever of the two windows ends first. The tracker reads no clock: the instant of each
//! arrival is passed in ([`SequenceTracker::observe_at`], [`SequenceTracker::observe_from_at`]),
//! and the caller drives [`SequenceTracker::handle_timeout`] at
//! [`SequenceTracker::poll_timeout`] (or on any periodic tick), so a gap is counted even when
//! no further frame arrives. Frames observed without an instant ([`SequenceTracker::observe`])
//! follow the frame window only.
//!
//! The instant at which a later sequence first arrived never decreases along the missing
//! sequences (every frame after `m'` is after `m < m'` too), so the sequences lost by time
//! are always a prefix of the missing ones: the settled prefix (`is_settled`) just moves
//! further. A missing frame that still arrives after it was counted lost this way is
//! [`Stale`](Observation::Stale) ([`StaleReason::ReorderTime`]), exactly as one behind the
//! frame window: counted once, never taken back, never received on top of lost.
//! [`SequenceTracker::close`] (the sender's last sequence, from its `Goodbye`) moves `highest`
//! to `final_seq` and counts every missing sequence and the tail `final_seq − highest` as
//! lost; the segment is then closed and later frames of it are stale.
//!
//! # Invariants
//!
//! * Segment: `segment.received + segment.lost + segment.missing == highest − base + 1`,
//!   after every call; `segment.missing < reorder_window`, and 0 once closed.
//! * `lost` never decreases (it is exported as a Prometheus counter as is).
//! * Cumulative: `received + lost + missing == expected`, where `expected` is the sum of every segment's
//!   `highest − base + 1` (cumulative counters saturate at `u64::MAX`, which no real stream
//!   reaches).
//! * After `close(epoch, final_seq)`: the sender sent `sent = final_seq − base + 1` frames in
//!   the current segment, and `sent == segment.received + segment.lost`.
//! * Across segments: a segment's contribution to `expected` is `highest − base + 1` as of
//!   its end. For a segment that was closed that is exactly what the sender sent from `base`
//!   on; for a segment that ended without a `Goodbye` (the agent vanished, or a dropout
//!   resync) the frames sent after its `highest` are unknown and counted nowhere. Hence the
//!   cumulative `sent == received + lost` holds exactly when every segment was closed, and
//!   `received + lost + missing == expected` holds always.
//!
//! `received` counts distinct frames, so it never includes duplicates or stale frames.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::seq::{Seq, HALF};

/// RFC 3550 A.1 `MAX_DROPOUT`: the default largest forward jump still counted as loss.
pub const DEFAULT_MAX_DROPOUT: u64 = 3000;
/// Default reorder window: how many of the most recent sequences (the highest included) are
/// remembered to tell late frames from duplicates.
pub const DEFAULT_REORDER_WINDOW: u64 = 64;
/// Largest accepted [`TrackerConfig::reorder_window`] (the bitmap costs `window / 8` bytes).
pub const MAX_REORDER_WINDOW: u64 = 1 << 16;
/// Default [`TrackerConfig::reorder_time`]: 1 s, RFC 6298's floor for TCP's retransmission
/// timeout, far beyond the reordering a UDP path or a NIC causes (microseconds to
/// milliseconds) and short enough for a loss alert at one frame a second.
pub const DEFAULT_REORDER_TIME: Duration = Duration::from_secs(1);

/// Tracker tuning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrackerConfig {
    /// Largest forward jump `d = seq − highest` (in frames) still counted as `d − 1` lost
    /// frames; a larger jump is a resync with reason [`ResetReason::Dropout`]. RFC 3550 A.1
    /// `MAX_DROPOUT`; scale it to "seconds of stall × peak frame rate". Must be ≥ 1.
    pub max_dropout: u64,
    /// Number of most recent sequences, the highest included, within which a backward step
    /// is a late frame or a duplicate rather than a stale frame (RFC 3550 A.1
    /// `MAX_MISORDER`, but the window also remembers which sequences arrived).
    /// Must be in `1..=MAX_REORDER_WINDOW`.
    pub reorder_window: u64,
    /// The reorder window in time (RFC 8985 §6.2 `RACK.reo_wnd`): a missing sequence is lost
    /// once a later sequence arrived at least this long ago, even while it is still inside
    /// `reorder_window` frames (module docs, "The reorder window in time"). Applies to frames
    /// observed with their arrival instant ([`SequenceTracker::observe_at`]); `None`: the
    /// window is counted in frames only. Default [`DEFAULT_REORDER_TIME`].
    pub reorder_time: Option<Duration>,
}

impl Default for TrackerConfig {
    fn default() -> Self {
        Self {
            max_dropout: DEFAULT_MAX_DROPOUT,
            reorder_window: DEFAULT_REORDER_WINDOW,
            reorder_time: Some(DEFAULT_REORDER_TIME),
        }
    }
}

/// A [`TrackerConfig`] that [`SequenceTracker::new`] refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum TrackerConfigError {
    /// `max_dropout` is 0: even an in-order frame would be a resync.
    #[error("tracker max_dropout must be at least 1 frame, got 0")]
    ZeroMaxDropout,
    /// `reorder_window` is 0 or larger than [`MAX_REORDER_WINDOW`].
    #[error("tracker reorder_window must be in 1..={max} frames, got {got}")]
    ReorderWindow {
        /// The configured value.
        got: u64,
        /// [`MAX_REORDER_WINDOW`].
        max: u64,
    },
}

/// Why a tracker started a new segment. A closed set: it labels
/// `stream_resets_total{reason}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResetReason {
    /// A frame of a new agent epoch arrived (the agent restarted or reconnected).
    EpochChange,
    /// A forward jump larger than `max_dropout` (a stall, not a flood of loss).
    Dropout,
}

impl ResetReason {
    /// Every reason, in label order.
    pub const ALL: [ResetReason; 2] = [ResetReason::EpochChange, ResetReason::Dropout];

    /// The Prometheus label value: `epoch_change` or `dropout`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ResetReason::EpochChange => "epoch_change",
            ResetReason::Dropout => "dropout",
        }
    }
}

impl std::fmt::Display for ResetReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a frame was classified [`Observation::Stale`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StaleReason {
    /// More than `reorder_window − 1` frames behind the highest sequence.
    BehindWindow,
    /// Before the first sequence of the current segment.
    BeforeBase,
    /// Of the epoch that the last epoch change retired.
    RetiredEpoch,
    /// Of a segment already closed by [`SequenceTracker::close`] or
    /// [`SequenceTracker::settle`]: its every sequence is already counted.
    Closed,
    /// Inside the frame window, but counted lost already: a later frame had arrived at least
    /// [`TrackerConfig::reorder_time`] before it.
    ReorderTime,
}

/// What one observed frame was. Everything but [`Duplicate`](Observation::Duplicate) and
/// [`Stale`](Observation::Stale) is a frame to deliver ([`Observation::is_accepted`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Observation {
    /// The first frame this tracker ever saw; it becomes `base` and `highest`.
    First,
    /// The next sequence after `highest`.
    InOrder,
    /// A forward jump: the `missing` frames between the old `highest` and this one are
    /// missing; each is counted lost when it leaves the reorder window unseen.
    Gap {
        /// Frames skipped, `seq − highest − 1`, in `1..max_dropout`.
        missing: u64,
    },
    /// A missing frame arrived after a later one, inside the reorder window (out of order,
    /// not lost).
    Late,
    /// A frame already received, inside the reorder window.
    Duplicate,
    /// A frame too old to judge, or of a retired epoch; dropped.
    Stale {
        /// Which rule made it stale.
        reason: StaleReason,
    },
    /// A forward jump larger than `max_dropout`: the tracker restarted at this frame
    /// (reset reason [`ResetReason::Dropout`]); the skipped frames are not counted lost.
    Resync {
        /// Frames skipped and not counted, `seq − highest − 1`.
        skipped: u64,
    },
    /// A frame of a new epoch: the tracker restarted at this frame (reset reason
    /// [`ResetReason::EpochChange`]).
    EpochReset {
        /// The epoch that was current until now (now retired).
        previous_epoch: u64,
    },
}

impl Observation {
    /// `true` when the frame is new and should be delivered: everything but duplicates and
    /// stale frames.
    pub const fn is_accepted(self) -> bool {
        !matches!(self, Observation::Duplicate | Observation::Stale { .. })
    }

    /// The reset this observation caused, if any.
    pub const fn reset_reason(self) -> Option<ResetReason> {
        match self {
            Observation::Resync { .. } => Some(ResetReason::Dropout),
            Observation::EpochReset { .. } => Some(ResetReason::EpochChange),
            _ => None,
        }
    }
}

/// Number of resets per [`ResetReason`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResetCounts {
    /// Resets caused by a new epoch.
    pub epoch_change: u64,
    /// Resets caused by a forward jump larger than `max_dropout`.
    pub dropout: u64,
}

impl ResetCounts {
    /// The count for one reason.
    pub const fn get(&self, reason: ResetReason) -> u64 {
        match reason {
            ResetReason::EpochChange => self.epoch_change,
            ResetReason::Dropout => self.dropout,
        }
    }

    /// All resets.
    pub const fn total(&self) -> u64 {
        self.epoch_change.saturating_add(self.dropout)
    }

    fn bump(&mut self, reason: ResetReason) {
        let c = match reason {
            ResetReason::EpochChange => &mut self.epoch_change,
            ResetReason::Dropout => &mut self.dropout,
        };
        *c = c.saturating_add(1);
    }
}

/// Frame counters of the current segment (since the last reset).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SegmentCounts {
    /// Distinct frames received, late ones included.
    pub received: u64,
    /// Frames that left the reorder window (in frames or in time) unseen, or were missing at
    /// close: final.
    pub lost: u64,
    /// Frames skipped by a gap that may still arrive (inside the reorder window).
    pub missing: u64,
    /// Frames that arrived after a later one (out of order), inside the window.
    pub late: u64,
    /// Repeated frames inside the reorder window.
    pub duplicate: u64,
    /// Frames classified stale.
    pub stale: u64,
}

/// A snapshot of a tracker's counters. Frame counters are cumulative over every segment;
/// `epoch`, `base`, `highest` and `segment` describe the current segment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrackerCounts {
    /// Current epoch; `None` until the first frame.
    pub epoch: Option<u64>,
    /// First sequence of the current segment (0 before the first frame).
    pub base: u64,
    /// Highest sequence of the current segment (0 before the first frame).
    pub highest: u64,
    /// Distinct frames received (RFC 3550 `received`, without duplicates).
    pub received: u64,
    /// Frames counted lost (final: they left the reorder window unseen, or were missing or
    /// in the tail at close). Never decreases.
    pub lost: u64,
    /// Frames of the current segment skipped by a gap and still inside the reorder window.
    pub missing: u64,
    /// Frames that arrived out of order (after a later one), inside the window.
    pub late: u64,
    /// Duplicates inside the reorder window.
    pub duplicate: u64,
    /// Stale frames (dropped).
    pub stale: u64,
    /// Sum over every segment of `highest − base + 1` (RFC 3550 A.3 `expected`);
    /// `received + lost + missing == expected`.
    pub expected: u64,
    /// Resets by reason.
    pub resets: ResetCounts,
    /// Counters of the current segment.
    pub segment: SegmentCounts,
}

impl TrackerCounts {
    /// `highest − base + 1` for the current segment, 0 before the first frame.
    pub const fn segment_expected(&self) -> u64 {
        match self.epoch {
            None => 0,
            Some(_) => Seq::new(self.highest)
                .since(Seq::new(self.base))
                .wrapping_add(1),
        }
    }
}

/// One RFC 3550 A.3 reporting interval, from [`SequenceTracker::interval_report`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IntervalReport {
    /// Growth of `expected` since the previous report.
    pub expected_interval: u64,
    /// Growth of `received` since the previous report (late frames included, so it can exceed
    /// `expected_interval`).
    pub received_interval: u64,
    /// `expected_interval − received_interval`; negative when late frames of earlier
    /// intervals arrived (RFC 3550 A.3 `lost_interval`). Saturates at the `i64` range.
    pub lost_interval: i64,
    /// `lost_interval / expected_interval` in `0.0..=1.0`; 0 when `expected_interval == 0`
    /// or `lost_interval ≤ 0`.
    pub fraction_lost: f64,
    /// RFC 3550 A.3 8-bit fixed point: `(lost_interval << 8) / expected_interval`, clamped
    /// to 255 (the RFC's formula gives 256 when every frame was lost, which does not fit).
    pub fraction_lost_u8: u8,
}

/// Why [`SequenceTracker::close`] could not account the sender's final sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum CloseError {
    /// No frame of `epoch` was ever observed, so the first sequence sent is unknown.
    #[error("no frame of epoch {epoch:#x} was observed; cannot account its final sequence")]
    EpochNotObserved {
        /// The epoch named by the sender.
        epoch: u64,
    },
    /// The segment of `epoch` was already closed (a second `Goodbye`, or one after
    /// [`SequenceTracker::settle`]); nothing changes.
    #[error("the segment of epoch {epoch:#x} is already closed")]
    AlreadyClosed {
        /// The epoch named by the sender.
        epoch: u64,
    },
    /// The sender's final sequence is behind a sequence already received.
    #[error("final sequence {final_seq} is behind the highest received {highest}")]
    BehindHighest {
        /// The final sequence named by the sender.
        final_seq: u64,
        /// The tracker's highest sequence.
        highest: u64,
    },
    /// The final sequence is so far ahead that the segment would span `2^63` or more.
    #[error("final sequence {final_seq} is too far ahead of base {base}")]
    TooFarAhead {
        /// The final sequence named by the sender.
        final_seq: u64,
        /// The tracker's base sequence.
        base: u64,
    },
}

/// Widen a 32-bit value to the 64-bit sequence nearest `highest` whose low 32 bits are `low`.
///
/// The RDMA immediate (ImmDt, 32 bits) carries the low 32 bits of the connection sequence
/// (DESIGN.md §4). [`Seq::extend`] on plain values: the result lies in
/// `highest − 2^31 ..= highest + 2^31 − 1` (RFC 1982 practical form: the midpoint counts as
/// behind), across 2^32 boundaries in both directions, wrapping at `u64::MAX`/0 like the
/// rest of the tracker.
#[inline]
pub const fn extend_u32(highest: u64, low: u32) -> u64 {
    Seq::new(highest).extend(low).get()
}

/// Bitmap of the sequences seen within the reorder window: bit `seq mod capacity`.
/// Holds the truth for sequences in `highest − capacity + 1 ..= highest`.
#[derive(Debug, Clone)]
struct SeenWindow {
    words: Box<[u64]>,
    /// `capacity − 1`; capacity is a power of two and a multiple of 64.
    mask: u64,
}

impl SeenWindow {
    fn new(window: u64) -> Self {
        let words = window.div_ceil(64).next_power_of_two().max(1);
        let words_usize = usize::try_from(words).unwrap_or(1);
        Self {
            words: vec![0; words_usize].into_boxed_slice(),
            mask: words.saturating_mul(64).wrapping_sub(1),
        }
    }

    fn capacity(&self) -> u64 {
        self.mask.wrapping_add(1)
    }

    #[inline]
    fn locate(&self, seq: u64) -> (usize, u64) {
        let bit = seq & self.mask;
        // `bit >> 6` < words.len(), which is a usize.
        ((bit >> 6) as usize, 1u64 << (bit & 63))
    }

    #[inline]
    fn get(&self, seq: u64) -> bool {
        let (w, m) = self.locate(seq);
        self.words.get(w).is_some_and(|word| word & m != 0)
    }

    #[inline]
    fn set(&mut self, seq: u64) {
        let (w, m) = self.locate(seq);
        if let Some(word) = self.words.get_mut(w) {
            *word |= m;
        }
    }

    #[inline]
    fn clear(&mut self, seq: u64) {
        let (w, m) = self.locate(seq);
        if let Some(word) = self.words.get_mut(w) {
            *word &= !m;
        }
    }

    fn clear_all(&mut self) {
        self.words.fill(0);
    }

    /// Forget `from + 1 ..= from + d` (serial), `d` ≥ 1: their bits now stand for new,
    /// not-yet-seen sequences.
    #[inline]
    fn advance(&mut self, from: Seq, d: u64) {
        if d >= self.capacity() {
            self.clear_all();
        } else {
            let mut s = from;
            for _ in 0..d {
                s = s.next();
                self.clear(s.get());
            }
        }
    }
}

/// A gap waiting for the reorder time: offsets below `end` (from `base`) that are missing had
/// a later frame arrive by `at`.
#[derive(Debug, Clone, Copy)]
struct TimedGap {
    end: u64,
    at: Instant,
}

/// Loss, late, duplicate and stale accounting for one sequence space (module docs give every
/// rule). Sans-IO: feed it `(epoch, seq)` pairs with [`observe`](Self::observe), or with
/// their arrival instant with [`observe_at`](Self::observe_at) and drive
/// [`handle_timeout`](Self::handle_timeout) for the reorder window in time.
#[derive(Debug, Clone)]
pub struct SequenceTracker {
    config: TrackerConfig,
    epoch: Option<u64>,
    retired_epoch: Option<u64>,
    base: Seq,
    highest: Seq,
    seen: SeenWindow,
    /// Offsets from `base` below this are settled (received or lost); `≤ highest − base + 1`.
    settled: u64,
    /// The current segment was closed: every sequence of it is settled.
    closed: bool,
    /// Gaps of the current segment still to be settled by time, oldest first: the offset
    /// (from `base`) of the frame that revealed the gap and when it arrived. Every missing
    /// offset below `end` had a later frame arrive by `at`. Offsets strictly increase and
    /// each is above `settled` (entries at or below it are removed), so at most
    /// `reorder_window` entries.
    gaps: VecDeque<TimedGap>,
    segment: SegmentCounts,
    received: u64,
    lost: u64,
    late: u64,
    duplicate: u64,
    stale: u64,
    /// Sum of `highest − base + 1` over the segments before the current one.
    expected_before: u64,
    resets: ResetCounts,
    expected_prior: u64,
    received_prior: u64,
}

impl Default for SequenceTracker {
    fn default() -> Self {
        Self::with_valid_config(TrackerConfig::default())
    }
}

impl SequenceTracker {
    /// A tracker that has seen nothing yet.
    ///
    /// # Errors
    /// [`TrackerConfigError`] when `max_dropout` is 0 or `reorder_window` is outside
    /// `1..=MAX_REORDER_WINDOW`. Any `reorder_time` is accepted (zero: a gap is lost at the
    /// first [`handle_timeout`](Self::handle_timeout) after it is seen).
    pub fn new(config: TrackerConfig) -> Result<Self, TrackerConfigError> {
        if config.max_dropout == 0 {
            return Err(TrackerConfigError::ZeroMaxDropout);
        }
        if config.reorder_window == 0 || config.reorder_window > MAX_REORDER_WINDOW {
            return Err(TrackerConfigError::ReorderWindow {
                got: config.reorder_window,
                max: MAX_REORDER_WINDOW,
            });
        }
        Ok(Self::with_valid_config(config))
    }

    fn with_valid_config(config: TrackerConfig) -> Self {
        Self {
            config,
            epoch: None,
            retired_epoch: None,
            base: Seq::ZERO,
            highest: Seq::ZERO,
            seen: SeenWindow::new(config.reorder_window),
            settled: 0,
            closed: false,
            gaps: VecDeque::new(),
            segment: SegmentCounts::default(),
            received: 0,
            lost: 0,
            late: 0,
            duplicate: 0,
            stale: 0,
            expected_before: 0,
            resets: ResetCounts::default(),
            expected_prior: 0,
            received_prior: 0,
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> TrackerConfig {
        self.config
    }

    /// The current epoch, `None` before the first frame.
    pub fn epoch(&self) -> Option<u64> {
        self.epoch
    }

    /// The highest sequence of the current segment, `None` before the first frame.
    pub fn highest(&self) -> Option<u64> {
        self.epoch.map(|_| self.highest.get())
    }

    /// Widen a 32-bit immediate against this tracker's highest sequence ([`extend_u32`]);
    /// before the first frame the value is taken as is (upper 32 bits zero: a connection
    /// sequence starts at 0 each epoch).
    pub fn extend(&self, low: u32) -> u64 {
        match self.epoch {
            Some(_) => self.highest.extend(low).get(),
            None => u64::from(low),
        }
    }

    /// [`observe`](Self::observe) for a sequence space that is known to start at `first` in
    /// every epoch (the agent starts its connection and stream sequences at 0, DESIGN.md §5).
    /// When `seq` is the first frame of its epoch here and lies in `first + 1 ..= first +
    /// max_dropout`, the segment starts at `first` instead of at `seq`: the frames
    /// `first .. seq` are *missing* (they may still arrive out of order) rather than never
    /// expected, and count lost only once they leave the window or the segment is closed.
    /// Otherwise (an epoch already current, or a jump too large to believe) exactly
    /// [`observe`](Self::observe).
    pub fn observe_from(&mut self, epoch: u64, first: u64, seq: u64) -> Observation {
        self.observe_from_inner(epoch, first, seq, None)
    }

    /// [`observe_from`](Self::observe_from) for a frame that arrived at `now`: first
    /// [`handle_timeout(now)`](Self::handle_timeout), then the frame is classified, and a gap
    /// it reveals (the leading one included) is lost once `now` is
    /// [`TrackerConfig::reorder_time`] old, if it has not left the frame window before.
    /// `now` must not go backwards between calls (an earlier instant only delays the loss).
    pub fn observe_from_at(
        &mut self,
        epoch: u64,
        first: u64,
        seq: u64,
        now: Instant,
    ) -> Observation {
        self.handle_timeout(now);
        self.observe_from_inner(epoch, first, seq, Some(now))
    }

    fn observe_from_inner(
        &mut self,
        epoch: u64,
        first: u64,
        seq: u64,
        now: Option<Instant>,
    ) -> Observation {
        let lead = Seq::new(seq).since(Seq::new(first));
        let starts_epoch = self.epoch != Some(epoch) && self.retired_epoch != Some(epoch);
        if !starts_epoch || lead == 0 || lead >= HALF || lead > self.config.max_dropout {
            return self.observe_inner(epoch, seq, now);
        }
        // Open the segment at `first` with nothing received, then take `seq` as a forward
        // jump from `first − 1`: `first ..= seq − 1` are missing.
        let previous = self.open_empty_segment(epoch, first);
        // `highest − base + 1` is 0 now; the jump below adds `lead` missing and one received.
        let d = lead + 1;
        let window_floor = d.saturating_sub(self.config.reorder_window);
        self.segment.missing += d - 1;
        self.settle_below(window_floor);
        self.push_gap(lead, now);
        self.seen.set(seq);
        self.highest = Seq::new(seq);
        self.segment.received += 1;
        self.received = self.received.saturating_add(1);
        match previous {
            None => Observation::First,
            Some(previous_epoch) => Observation::EpochReset { previous_epoch },
        }
    }

    /// Classify one frame of `epoch` with sequence `seq` and update the counters (rules in
    /// the module docs). Never panics. A gap it reveals is settled by the frame window only;
    /// [`observe_at`](Self::observe_at) also bounds it in time.
    pub fn observe(&mut self, epoch: u64, seq: u64) -> Observation {
        self.observe_inner(epoch, seq, None)
    }

    /// [`observe`](Self::observe) for a frame that arrived at `now`: first
    /// [`handle_timeout(now)`](Self::handle_timeout) (missing frames whose reorder time ran
    /// out are lost, so one of them arriving now is stale), then the frame is classified; a
    /// gap it reveals is lost once `now` is [`TrackerConfig::reorder_time`] old, if it has not
    /// left the frame window before. `now` must not go backwards between calls (an earlier
    /// instant only delays the loss). Never panics.
    pub fn observe_at(&mut self, epoch: u64, seq: u64, now: Instant) -> Observation {
        self.handle_timeout(now);
        self.observe_inner(epoch, seq, Some(now))
    }

    fn observe_inner(&mut self, epoch: u64, seq: u64, now: Option<Instant>) -> Observation {
        let Some(current) = self.epoch else {
            self.start_segment(epoch, seq);
            return Observation::First;
        };
        if epoch != current {
            if self.retired_epoch == Some(epoch) {
                self.count_stale();
                return Observation::Stale {
                    reason: StaleReason::RetiredEpoch,
                };
            }
            self.reset(ResetReason::EpochChange, epoch, seq);
            self.retired_epoch = Some(current);
            return Observation::EpochReset {
                previous_epoch: current,
            };
        }

        if self.closed {
            self.count_stale();
            return Observation::Stale {
                reason: StaleReason::Closed,
            };
        }
        let s = Seq::new(seq);
        if s.is_after(self.highest) {
            // Forward.
            let d = s.since(self.highest);
            let Some(off) = s
                .forward_from(self.base)
                .filter(|_| d <= self.config.max_dropout)
            else {
                self.reset(ResetReason::Dropout, epoch, seq);
                return Observation::Resync { skipped: d - 1 };
            };
            // `off < 2^63`: no overflow.
            let window_floor = (off + 1).saturating_sub(self.config.reorder_window);
            self.segment.missing += d - 1;
            self.settle_below(window_floor);
            if d > 1 {
                self.push_gap(off, now);
            }
            self.seen.advance(self.highest, d);
            self.seen.set(seq);
            self.highest = s;
            self.segment.received += 1;
            self.received = self.received.saturating_add(1);
            if d == 1 {
                return Observation::InOrder;
            }
            return Observation::Gap { missing: d - 1 };
        }

        // Backward (or equal): b = highest − seq.
        let b = self.highest.since(s);
        if b > self.highest.since(self.base) {
            self.count_stale();
            return Observation::Stale {
                reason: StaleReason::BeforeBase,
            };
        }
        if b >= self.config.reorder_window {
            self.count_stale();
            return Observation::Stale {
                reason: StaleReason::BehindWindow,
            };
        }
        if self.seen.get(seq) {
            self.segment.duplicate = self.segment.duplicate.saturating_add(1);
            self.duplicate = self.duplicate.saturating_add(1);
            return Observation::Duplicate;
        }
        // `b ≤ highest − base`: the offset from `base` does not underflow.
        if self.highest.since(self.base) - b < self.settled {
            // Inside the frame window, never seen, but counted lost by the reorder time.
            self.count_stale();
            return Observation::Stale {
                reason: StaleReason::ReorderTime,
            };
        }
        // Inside the segment, inside the window, not settled, never seen: a missing frame
        // arrived.
        self.seen.set(seq);
        self.segment.received += 1;
        self.segment.missing = self.segment.missing.saturating_sub(1);
        self.segment.late += 1;
        self.received = self.received.saturating_add(1);
        self.late = self.late.saturating_add(1);
        Observation::Late
    }

    /// [`observe`](Self::observe) a frame known by the low 32 bits of its sequence (the RDMA
    /// immediate), widened with [`extend`](Self::extend) against the current segment. A frame
    /// that starts a tracker or a new epoch takes the immediate as is. Returns the widened
    /// sequence and the observation.
    pub fn observe_u32(&mut self, epoch: u64, imm: u32) -> (u64, Observation) {
        let seq = if self.epoch == Some(epoch) {
            self.highest.extend(imm).get()
        } else {
            u64::from(imm)
        };
        (seq, self.observe(epoch, seq))
    }

    /// The sender said goodbye: its last sequence sent in `epoch` was `final_seq`. Counts every
    /// missing frame and the tail `final_seq − highest` as lost, moves `highest` to
    /// `final_seq`, closes the segment and returns the frames newly counted lost (tail and
    /// missing). Afterwards `final_seq − base + 1 == segment.received + segment.lost`. Frames
    /// of the segment that still arrive are [`Stale`](Observation::Stale)
    /// ([`StaleReason::Closed`]): they were counted lost once and are not taken back.
    ///
    /// # Errors
    /// * [`CloseError::EpochNotObserved`]: the current segment is not of `epoch`, so its first
    ///   sequence is unknown; nothing changes.
    /// * [`CloseError::BehindHighest`]: `final_seq` is before `highest` (the sender contradicts
    ///   what arrived); nothing changes.
    /// * [`CloseError::TooFarAhead`]: the segment would span `2^63` frames or more.
    /// * [`CloseError::AlreadyClosed`]: the segment was closed before; nothing changes.
    pub fn close(&mut self, epoch: u64, final_seq: u64) -> Result<u64, CloseError> {
        if self.epoch != Some(epoch) {
            return Err(CloseError::EpochNotObserved { epoch });
        }
        if self.closed {
            return Err(CloseError::AlreadyClosed { epoch });
        }
        let fin = Seq::new(final_seq);
        let Some(tail) = fin.forward_from(self.highest) else {
            return Err(CloseError::BehindHighest {
                final_seq,
                highest: self.highest.get(),
            });
        };
        if fin.forward_from(self.base).is_none() {
            return Err(CloseError::TooFarAhead {
                final_seq,
                base: self.base.get(),
            });
        }
        let before = self.lost;
        if tail > 0 {
            self.seen.advance(self.highest, tail);
            self.highest = fin;
            self.segment.lost = self.segment.lost.saturating_add(tail);
            self.lost = self.lost.saturating_add(tail);
        }
        self.finish_segment();
        Ok(self.lost.saturating_sub(before))
    }

    /// [`close`](Self::close) for a sequence space that starts at `first` in every epoch (as
    /// [`observe_from`](Self::observe_from)), also when no frame of `epoch` has arrived:
    /// the sender's `Goodbye` overtook all of its frames (it travels on the control
    /// connection). The segment is then opened at `first` with nothing received and closed at
    /// `final_seq`, so `first ..= final_seq` are counted lost, and frames of `epoch` that
    /// still arrive are [`Stale`](Observation::Stale) ([`StaleReason::Closed`]), not counted
    /// received on top of lost. With `epoch` current, exactly [`close`](Self::close).
    ///
    /// # Errors
    /// As [`close`](Self::close); [`CloseError::EpochNotObserved`] only when `epoch` is the
    /// epoch retired by the last epoch change (its frames are stale anyway), and
    /// [`CloseError::TooFarAhead`] when `final_seq` is `2^63` or more past `first`.
    pub fn close_from(
        &mut self,
        epoch: u64,
        first: u64,
        final_seq: u64,
    ) -> Result<u64, CloseError> {
        if self.epoch == Some(epoch) {
            return self.close(epoch, final_seq);
        }
        if self.retired_epoch == Some(epoch) {
            return Err(CloseError::EpochNotObserved { epoch });
        }
        let fin = Seq::new(final_seq);
        if fin.since(Seq::new(first)) >= HALF {
            return Err(CloseError::TooFarAhead {
                final_seq,
                base: first,
            });
        }
        let _ = self.open_empty_segment(epoch, first);
        self.close(epoch, final_seq)
    }

    /// The sender of `epoch` is gone without naming its last sequence (no `Goodbye`): count
    /// the missing frames of the current segment as lost (a later frame arrived, so they were
    /// sent), close the segment, and return how many were counted. Frames sent after
    /// `highest` are unknown and counted nowhere; a caller that knows a lower bound of the
    /// sender's last sequence (from a heartbeat) uses [`close`](Self::close) with it instead.
    /// Nothing changes (and 0 is returned) when the current segment is not of `epoch` or is
    /// already closed.
    pub fn settle(&mut self, epoch: u64) -> u64 {
        if self.epoch != Some(epoch) || self.closed {
            return 0;
        }
        let before = self.lost;
        self.finish_segment();
        self.lost.saturating_sub(before)
    }

    /// The reorder window in time: counts as lost every missing frame of the current segment
    /// after which a later frame arrived at least [`TrackerConfig::reorder_time`] before
    /// `now` (RFC 8985 §6.2, with the arrival instants passed to
    /// [`observe_at`](Self::observe_at) and [`observe_from_at`](Self::observe_from_at)), and
    /// returns how many. Call it at [`poll_timeout`](Self::poll_timeout), or on any periodic
    /// tick; calling it early or often changes nothing. Frames counted lost this way that
    /// still arrive are [`Stale`](Observation::Stale) ([`StaleReason::ReorderTime`]). 0
    /// without a `reorder_time`, before the first frame and once the segment is closed.
    pub fn handle_timeout(&mut self, now: Instant) -> u64 {
        let Some(reorder_time) = self.config.reorder_time else {
            return 0;
        };
        let before = self.lost;
        while let Some(gap) = self.gaps.front().copied() {
            if now.saturating_duration_since(gap.at) < reorder_time {
                break;
            }
            // `gap.end ≤ highest − base`: the bitmap holds every offset below it that is
            // not settled yet (they are inside the frame window).
            self.gaps.pop_front();
            self.settle_below(gap.end);
        }
        self.lost.saturating_sub(before)
    }

    /// When [`handle_timeout`](Self::handle_timeout) next has work: the instant the oldest
    /// gap still missing frames reaches [`TrackerConfig::reorder_time`]; `None` when nothing
    /// waits for it (no gap, no `reorder_time`, or the segment is closed).
    pub fn poll_timeout(&self) -> Option<Instant> {
        let reorder_time = self.config.reorder_time?;
        let gap = self.gaps.front()?;
        Some(gap.at.checked_add(reorder_time).unwrap_or(gap.at))
    }

    /// Whether the current segment was closed ([`close`](Self::close), [`settle`](Self::settle)).
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Whether `seq` of the current segment is settled: counted received or lost for good
    /// (behind the reorder window, before `base`, or the segment is closed). `true` before
    /// the first frame (nothing can be pending).
    pub fn is_settled(&self, seq: u64) -> bool {
        if self.epoch.is_none() || self.closed {
            return true;
        }
        Seq::new(seq)
            .forward_from(self.base)
            .is_none_or(|off| off < self.settled)
    }

    /// Count every missing frame of the current segment as lost and close it.
    fn finish_segment(&mut self) {
        let missing = self.segment.missing;
        self.segment.missing = 0;
        self.segment.lost = self.segment.lost.saturating_add(missing);
        self.lost = self.lost.saturating_add(missing);
        self.settled = self.highest.since(self.base).wrapping_add(1);
        self.closed = true;
        self.gaps.clear();
    }

    /// Remembers, for the reorder time, that the frames missing below offset `end` had a
    /// later frame arrive at `now` (nothing without an instant, or when they are all settled
    /// already).
    fn push_gap(&mut self, end: u64, now: Option<Instant>) {
        if let Some(at) = now {
            if self.config.reorder_time.is_some() && end > self.settled {
                self.gaps.push_back(TimedGap { end, at });
            }
        }
    }

    /// The window's lower edge moves to offset `floor` (from `base`), while `highest` moves
    /// forward (the jump's skipped frames already added to `missing`) or because the reorder
    /// time of a gap ran out (`floor ≤ highest − base`): every offset in `settled..floor` not
    /// seen is lost. Offsets up to the old `highest` are looked up in the bitmap (which still
    /// holds them: they are inside the old window, the bitmap is at least as large); offsets
    /// beyond it were skipped by this jump and are lost unseen.
    fn settle_below(&mut self, floor: u64) {
        if floor <= self.settled {
            return;
        }
        let old_top = self.highest.since(self.base); // offset of the old highest
        let in_window_end = floor.min(old_top.wrapping_add(1));
        let mut newly = 0u64;
        let mut off = self.settled;
        while off < in_window_end {
            if !self.seen.get(self.base.add(off).get()) {
                newly += 1;
            }
            off += 1;
        }
        // Offsets in `old_top + 1 .. floor`: skipped by this jump, already past the window.
        newly = newly.saturating_add(floor.saturating_sub(old_top.wrapping_add(1)));
        self.settled = floor;
        while self.gaps.front().is_some_and(|g| g.end <= floor) {
            self.gaps.pop_front();
        }
        self.segment.missing = self.segment.missing.saturating_sub(newly);
        self.segment.lost = self.segment.lost.saturating_add(newly);
        self.lost = self.lost.saturating_add(newly);
    }

    /// Counters now.
    pub fn counts(&self) -> TrackerCounts {
        TrackerCounts {
            epoch: self.epoch,
            base: self.base.get(),
            highest: self.highest.get(),
            received: self.received,
            lost: self.lost,
            missing: self.segment.missing,
            late: self.late,
            duplicate: self.duplicate,
            stale: self.stale,
            expected: self.expected(),
            resets: self.resets,
            segment: self.segment,
        }
    }

    /// RFC 3550 A.3 interval statistics since the previous call (or since creation), then
    /// start a new interval. Uses the cumulative `expected` and `received`, so resets inside
    /// the interval neither lose nor invent frames.
    pub fn interval_report(&mut self) -> IntervalReport {
        let expected = self.expected();
        let expected_interval = expected.saturating_sub(self.expected_prior);
        let received_interval = self.received.saturating_sub(self.received_prior);
        self.expected_prior = expected;
        self.received_prior = self.received;

        let lost_wide = i128::from(expected_interval) - i128::from(received_interval);
        let lost_interval =
            i64::try_from(lost_wide).unwrap_or(if lost_wide < 0 { i64::MIN } else { i64::MAX });
        let (fraction_lost, fraction_lost_u8) = if expected_interval == 0 || lost_wide <= 0 {
            (0.0, 0)
        } else {
            let fraction = (lost_wide as f64 / expected_interval as f64).clamp(0.0, 1.0);
            let fixed = ((lost_wide << 8) / i128::from(expected_interval)).clamp(0, 255);
            (fraction, u8::try_from(fixed).unwrap_or(u8::MAX))
        };
        IntervalReport {
            expected_interval,
            received_interval,
            lost_interval,
            fraction_lost,
            fraction_lost_u8,
        }
    }

    fn expected(&self) -> u64 {
        match self.epoch {
            None => 0,
            Some(_) => self
                .expected_before
                .saturating_add(self.highest.since(self.base).wrapping_add(1)),
        }
    }

    fn count_stale(&mut self) {
        self.segment.stale = self.segment.stale.saturating_add(1);
        self.stale = self.stale.saturating_add(1);
    }

    fn reset(&mut self, reason: ResetReason, epoch: u64, seq: u64) {
        // The old segment's missing frames were sent (a later frame arrived): lost now.
        if !self.closed {
            self.finish_segment();
        }
        self.expected_before = self.expected();
        self.resets.bump(reason);
        self.start_segment(epoch, seq);
    }

    /// Makes `epoch` current with a segment that starts at `first` and holds nothing yet
    /// (`highest = first − 1`), closing and retiring the previous one as an epoch change
    /// does. Returns the previous epoch.
    fn open_empty_segment(&mut self, epoch: u64, first: u64) -> Option<u64> {
        let previous = self.epoch;
        if previous.is_some() {
            if !self.closed {
                self.finish_segment();
            }
            self.expected_before = self.expected();
            self.resets.bump(ResetReason::EpochChange);
            self.retired_epoch = previous;
        }
        self.epoch = Some(epoch);
        self.base = Seq::new(first);
        self.highest = self.base.prev();
        self.seen.clear_all();
        self.settled = 0;
        self.closed = false;
        self.gaps.clear();
        self.segment = SegmentCounts::default();
        previous
    }

    fn start_segment(&mut self, epoch: u64, seq: u64) {
        self.epoch = Some(epoch);
        self.base = Seq::new(seq);
        self.highest = self.base;
        self.seen.clear_all();
        self.seen.set(seq);
        self.settled = 0;
        self.closed = false;
        self.gaps.clear();
        self.segment = SegmentCounts {
            received: 1,
            ..SegmentCounts::default()
        };
        self.received = self.received.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    const E: u64 = 0xE1;

    fn tracker(max_dropout: u64, reorder_window: u64) -> SequenceTracker {
        match SequenceTracker::new(TrackerConfig {
            max_dropout,
            reorder_window,
            ..TrackerConfig::default()
        }) {
            Ok(t) => t,
            Err(e) => panic!("valid config refused: {e}"),
        }
    }

    fn assert_invariants(t: &SequenceTracker) {
        let c = t.counts();
        assert_eq!(
            c.segment.received + c.segment.lost + c.segment.missing,
            c.segment_expected(),
            "{c:?}"
        );
        assert!(
            c.segment.missing < t.config().reorder_window.max(1),
            "{c:?}"
        );
        // Cumulative counters saturate at u64::MAX; compare without overflow.
        if c.expected < u64::MAX {
            assert_eq!(
                u128::from(c.received) + u128::from(c.lost) + u128::from(c.missing),
                u128::from(c.expected),
                "{c:?}"
            );
        }
    }

    #[test]
    fn config_is_validated() {
        let bad = |max_dropout, reorder_window| {
            SequenceTracker::new(TrackerConfig {
                max_dropout,
                reorder_window,
                reorder_time: None,
            })
            .err()
        };
        assert_eq!(bad(0, 64), Some(TrackerConfigError::ZeroMaxDropout));
        assert_eq!(
            bad(10, 0),
            Some(TrackerConfigError::ReorderWindow {
                got: 0,
                max: MAX_REORDER_WINDOW
            })
        );
        assert!(bad(10, MAX_REORDER_WINDOW + 1).is_some());
        assert!(bad(1, MAX_REORDER_WINDOW).is_none());
        assert_eq!(
            SequenceTracker::default().config(),
            TrackerConfig::default()
        );
        assert_eq!(TrackerConfig::default().max_dropout, 3000);
    }

    #[test]
    fn first_then_in_order() {
        let mut t = SequenceTracker::default();
        assert_eq!(t.counts().segment_expected(), 0);
        assert_eq!(t.observe(E, 10), Observation::First);
        for s in 11..20 {
            assert_eq!(t.observe(E, s), Observation::InOrder);
            assert_invariants(&t);
        }
        let c = t.counts();
        assert_eq!((c.base, c.highest, c.received, c.lost), (10, 19, 10, 0));
        assert_eq!(c.epoch, Some(E));
        assert_eq!(c.resets.total(), 0);
    }

    #[test]
    fn gap_counts_jump_minus_one() {
        let mut t = SequenceTracker::default();
        let _ = t.observe(E, 0);
        assert_eq!(t.observe(E, 5), Observation::Gap { missing: 4 });
        assert_eq!(t.observe(E, 6), Observation::InOrder);
        let c = t.counts();
        // Inside the window of 64 the four are missing, not yet lost.
        assert_eq!((c.received, c.lost, c.missing, c.highest), (3, 0, 4, 6));
        assert_invariants(&t);
        // Once the window's lower edge passes them, they are lost.
        let _ = t.observe(E, 69);
        let c = t.counts();
        assert_eq!((c.received, c.lost, c.missing), (4, 4, 62));
        assert_invariants(&t);
    }

    #[test]
    fn jump_of_exactly_max_dropout_is_loss_and_larger_is_resync() {
        let mut t = tracker(100, 16);
        let _ = t.observe(E, 0);
        assert_eq!(t.observe(E, 100), Observation::Gap { missing: 99 });
        assert_eq!(t.observe(E, 201), Observation::Resync { skipped: 100 });
        let c = t.counts();
        assert_eq!(c.resets.get(ResetReason::Dropout), 1);
        assert_eq!(c.resets.get(ResetReason::EpochChange), 0);
        assert_eq!((c.base, c.highest), (201, 201));
        assert_eq!(
            c.lost, 99,
            "the old segment's missing frames are lost at the reset; a resync's skipped frames are not"
        );
        assert_eq!(c.received, 3);
        assert_eq!(c.segment.received, 1);
        assert_eq!(c.segment.lost, 0);
        assert_eq!(c.expected, 101 + 1);
        assert_invariants(&t);
    }

    #[test]
    fn late_frame_moves_one_from_missing_to_received() {
        let mut t = SequenceTracker::default();
        let _ = t.observe(E, 0);
        assert_eq!(t.observe(E, 4), Observation::Gap { missing: 3 });
        assert_eq!(t.observe(E, 2), Observation::Late);
        assert_invariants(&t);
        let c = t.counts();
        assert_eq!((c.received, c.lost, c.missing, c.late), (3, 0, 2, 1));
        // Second copy of the late frame is a duplicate.
        assert_eq!(t.observe(E, 2), Observation::Duplicate);
        assert_eq!(t.observe(E, 4), Observation::Duplicate);
        assert_eq!(t.observe(E, 0), Observation::Duplicate);
        let c = t.counts();
        assert_eq!(
            (c.received, c.lost, c.missing, c.late, c.duplicate),
            (3, 0, 2, 1, 3)
        );
        assert_invariants(&t);
        assert!(!Observation::Duplicate.is_accepted());
        assert!(Observation::Late.is_accepted());
    }

    #[test]
    fn window_edge_and_stale() {
        let mut t = tracker(3000, 8);
        let _ = t.observe(E, 0);
        let _ = t.observe(E, 20);
        // b = 7 is the oldest inside a window of 8.
        assert_eq!(t.observe(E, 13), Observation::Late);
        assert_eq!(
            t.observe(E, 12),
            Observation::Stale {
                reason: StaleReason::BehindWindow
            }
        );
        assert_eq!(
            t.observe(E, 0),
            Observation::Stale {
                reason: StaleReason::BehindWindow
            }
        );
        let c = t.counts();
        // 1..=12 left the window unseen (lost); 14..=19 are still missing.
        assert_eq!(
            (c.received, c.lost, c.missing, c.late, c.stale),
            (3, 12, 6, 1, 2)
        );
        assert_invariants(&t);
    }

    /// The sequence of the reorder finding: `FFFFFFFD, FFFFFFFF, 00000000, FFFFFFFE,
    /// 00000001` as immediates. Nothing is lost, so `lost` must never move (it used to count
    /// one lost at `FFFFFFFF` and take it back at `FFFFFFFE`, while the exported counter,
    /// which cannot go down, kept the 1).
    #[test]
    fn reorder_across_two_to_the_32_counts_no_loss_at_any_point() {
        let mut t = SequenceTracker::default();
        let mut observations = Vec::new();
        for imm in [0xFFFF_FFFDu32, 0xFFFF_FFFF, 0, 0xFFFF_FFFE, 1] {
            let (_, obs) = t.observe_u32(E, imm);
            observations.push(obs);
            assert_eq!(t.counts().lost, 0, "after {imm:#x}: {:?}", t.counts());
            assert_invariants(&t);
        }
        assert_eq!(
            observations,
            [
                Observation::First,
                Observation::Gap { missing: 1 },
                Observation::InOrder,
                Observation::Late,
                Observation::InOrder
            ]
        );
        assert_eq!(t.close(E, (1 << 32) + 1), Ok(0));
        let c = t.counts();
        assert_eq!((c.received, c.lost, c.missing, c.late), (5, 0, 0, 1));
    }

    /// A stream's first frame arrives after its second: with the known start 0, frame 0 is
    /// missing (then late), never counted lost and never stale.
    #[test]
    fn observe_from_makes_a_leading_gap_missing_not_lost() {
        let mut t = SequenceTracker::default();
        assert_eq!(t.observe_from(E, 0, 1), Observation::First);
        let c = t.counts();
        assert_eq!(
            (c.base, c.highest, c.received, c.lost, c.missing),
            (0, 1, 1, 0, 1)
        );
        assert_invariants(&t);
        assert_eq!(t.observe_from(E, 0, 0), Observation::Late);
        let c = t.counts();
        assert_eq!((c.received, c.lost, c.missing, c.late), (2, 0, 0, 1));
        // A new epoch whose first frame is 3: 0..=2 missing; the old epoch settled.
        assert_eq!(
            t.observe_from(0xE2, 0, 3),
            Observation::EpochReset { previous_epoch: E }
        );
        let c = t.counts();
        assert_eq!((c.base, c.missing, c.resets.epoch_change), (0, 3, 1));
        assert_invariants(&t);
        assert_eq!(t.close(0xE2, 3), Ok(3));
        assert_invariants(&t);
        // Beyond the window at once: the leading frames that cannot arrive in time are lost.
        let mut t = tracker(3000, 4);
        assert_eq!(t.observe_from(E, 0, 10), Observation::First);
        let c = t.counts();
        assert_eq!((c.lost, c.missing), (7, 3));
        assert_invariants(&t);
        // A jump beyond max_dropout is not believed: the segment starts at the frame.
        let mut t = tracker(5, 64);
        assert_eq!(t.observe_from(E, 0, 100), Observation::First);
        assert_eq!((t.counts().base, t.counts().missing), (100, 0));
    }

    const SEC: Duration = Duration::from_secs(1);

    /// One frame a second with a window of 100 frames: the frame-only window would count the
    /// missing frame lost only 100 frames (100 s) later; the reorder time counts it once the
    /// frame after it is one second old, and a sweep does so with no further frame.
    #[test]
    fn a_gap_at_one_frame_a_second_is_lost_after_the_reorder_time() {
        let mut t = tracker(3000, 100);
        let t0 = Instant::now();
        assert_eq!(t.observe_at(E, 0, t0), Observation::First);
        assert_eq!(
            t.observe_at(E, 2, t0 + SEC),
            Observation::Gap { missing: 1 }
        );
        assert_eq!(t.poll_timeout(), Some(t0 + 2 * SEC));
        assert_eq!(t.handle_timeout(t0 + SEC + SEC / 2), 0, "only 0.5 s old");
        assert_eq!((t.counts().lost, t.counts().missing), (0, 1));
        assert!(!t.is_settled(1));
        assert_eq!(t.handle_timeout(t0 + 2 * SEC), 1);
        let c = t.counts();
        assert_eq!((c.received, c.lost, c.missing), (2, 1, 0));
        assert!(t.is_settled(1));
        assert_eq!(t.poll_timeout(), None);
        assert_invariants(&t);
        // Counted lost once: arriving now it is stale, neither received nor taken back.
        assert_eq!(
            t.observe_at(E, 1, t0 + 3 * SEC),
            Observation::Stale {
                reason: StaleReason::ReorderTime
            }
        );
        let c = t.counts();
        assert_eq!((c.received, c.lost, c.stale, c.late), (2, 1, 1, 0));
        assert_invariants(&t);
        // A received frame inside the frame window is still a duplicate.
        assert_eq!(t.observe_at(E, 0, t0 + 3 * SEC), Observation::Duplicate);
        assert_eq!(t.close(E, 2), Ok(0));
        let c = t.counts();
        assert_eq!(c.segment.received + c.segment.lost, 3);
    }

    /// A frame that arrives within the reorder time is late, not lost; the next frame's own
    /// sweep (no explicit `handle_timeout`) settles the other missing frame.
    #[test]
    fn a_late_frame_within_the_reorder_time_is_received() {
        let mut t = tracker(3000, 100);
        let t0 = Instant::now();
        let _ = t.observe_at(E, 0, t0);
        assert_eq!(t.observe_at(E, 3, t0), Observation::Gap { missing: 2 });
        assert_eq!(t.observe_at(E, 1, t0 + SEC / 2), Observation::Late);
        assert_eq!(t.counts().missing, 1);
        // 1.2 s later frame 4 arrives: the sweep first counts 2 lost, then 4 is in order.
        assert_eq!(t.observe_at(E, 4, t0 + SEC + SEC / 5), Observation::InOrder);
        let c = t.counts();
        assert_eq!((c.received, c.lost, c.missing, c.late), (4, 1, 0, 1));
        assert_invariants(&t);
    }

    /// Gaps revealed at different instants are settled each at its own time, in order; the
    /// later gap's frame can still arrive late after the earlier gap was counted.
    #[test]
    fn each_gap_is_settled_at_its_own_time() {
        let mut t = tracker(3000, 100);
        let t0 = Instant::now();
        let _ = t.observe_at(E, 0, t0);
        let _ = t.observe_at(E, 2, t0); // 1 missing since t0
        let _ = t.observe_at(E, 5, t0 + SEC / 2); // 3, 4 missing since t0 + 0.5 s
        assert_eq!(t.handle_timeout(t0 + SEC), 1);
        assert_eq!(t.poll_timeout(), Some(t0 + SEC + SEC / 2));
        assert_eq!(t.observe_at(E, 3, t0 + SEC), Observation::Late);
        assert_eq!(
            t.observe_at(E, 1, t0 + SEC),
            Observation::Stale {
                reason: StaleReason::ReorderTime
            }
        );
        assert_eq!(t.handle_timeout(t0 + 2 * SEC), 1);
        let c = t.counts();
        assert_eq!(
            (c.received, c.lost, c.missing, c.late, c.stale),
            (4, 2, 0, 1, 1)
        );
        assert_invariants(&t);
        // Nothing waits any more; sweeping again changes nothing.
        assert_eq!(t.poll_timeout(), None);
        assert_eq!(t.handle_timeout(t0 + 10 * SEC), 0);
    }

    /// The frame window still applies within the reorder time (whichever ends first), and a
    /// gap it settled leaves nothing for the timer.
    #[test]
    fn the_frame_window_settles_first_at_high_rates() {
        let mut t = tracker(3000, 4);
        let t0 = Instant::now();
        let _ = t.observe_at(E, 0, t0);
        let _ = t.observe_at(E, 2, t0);
        for s in 3..=5 {
            let _ = t.observe_at(E, s, t0);
        }
        assert_eq!((t.counts().lost, t.counts().missing), (1, 0));
        assert_eq!(t.poll_timeout(), None);
        assert_invariants(&t);
    }

    /// Without an instant (`observe`) or without `reorder_time`, only the frame window counts.
    #[test]
    fn no_reorder_time_means_the_frame_window_only() {
        let t0 = Instant::now();
        let mut t = SequenceTracker::new(TrackerConfig {
            reorder_time: None,
            ..TrackerConfig::default()
        })
        .unwrap_or_default();
        let _ = t.observe_at(E, 0, t0);
        let _ = t.observe_at(E, 2, t0);
        assert_eq!(t.poll_timeout(), None);
        assert_eq!(t.handle_timeout(t0 + 1000 * SEC), 0);
        assert_eq!(t.observe_at(E, 1, t0 + 1000 * SEC), Observation::Late);
        let mut u = SequenceTracker::default();
        let _ = u.observe(E, 0);
        let _ = u.observe(E, 2);
        assert_eq!(u.handle_timeout(t0 + 1000 * SEC), 0);
        assert_eq!(u.counts().missing, 1);
    }

    /// A stream whose first frame is not its sequence 0: the leading gap is bounded in time
    /// too; a reset or a close drops what waited for the timer.
    #[test]
    fn the_leading_gap_is_bounded_in_time_and_resets_forget_timers() {
        let mut t = tracker(3000, 100);
        let t0 = Instant::now();
        assert_eq!(t.observe_from_at(E, 0, 3, t0), Observation::First);
        assert_eq!(t.counts().missing, 3);
        assert_eq!(t.handle_timeout(t0 + SEC), 3);
        assert_invariants(&t);
        let _ = t.observe_at(E, 6, t0 + SEC);
        assert!(t.poll_timeout().is_some());
        assert_eq!(
            t.observe_from_at(0xE2, 0, 0, t0 + SEC),
            Observation::EpochReset { previous_epoch: E }
        );
        // The old segment's missing frames were counted at the reset; no timer is left.
        assert_eq!(t.counts().lost, 5);
        assert_eq!(t.poll_timeout(), None);
        let _ = t.observe_at(0xE2, 2, t0 + SEC);
        assert_eq!(t.settle(0xE2), 1);
        assert_eq!(t.poll_timeout(), None);
        assert_eq!(t.handle_timeout(t0 + 9 * SEC), 0);
        assert_invariants(&t);
    }

    #[test]
    fn settle_counts_missing_frames_of_a_vanished_sender() {
        let mut t = SequenceTracker::default();
        let _ = t.observe(E, 0);
        let _ = t.observe(E, 3);
        assert_eq!(t.settle(0xE2), 0, "another epoch: nothing settled");
        assert_eq!(t.settle(E), 2);
        assert!(t.is_closed());
        assert_eq!(t.settle(E), 0);
        assert_eq!(
            t.observe(E, 2),
            Observation::Stale {
                reason: StaleReason::Closed
            }
        );
        let c = t.counts();
        assert_eq!((c.received, c.lost, c.missing, c.stale), (2, 2, 0, 1));
        assert_eq!(t.close(E, 3), Err(CloseError::AlreadyClosed { epoch: E }));
        // A new epoch opens a new segment.
        assert_eq!(
            t.observe(0xE2, 0),
            Observation::EpochReset { previous_epoch: E }
        );
        assert!(!t.is_closed());
        assert_invariants(&t);
    }

    #[test]
    fn before_base_is_stale_even_inside_window() {
        let mut t = SequenceTracker::default();
        let _ = t.observe(E, 100);
        let _ = t.observe(E, 101);
        assert_eq!(
            t.observe(E, 99),
            Observation::Stale {
                reason: StaleReason::BeforeBase
            }
        );
        assert_eq!(t.counts().stale, 1);
        assert_invariants(&t);
    }

    #[test]
    fn bitmap_forgets_sequences_that_left_the_window() {
        // Window 64 → capacity 64: seq 0 and seq 64 share a bit, as do 1 and 65.
        let mut t = tracker(3000, 64);
        let _ = t.observe(E, 0);
        let _ = t.observe(E, 1);
        assert_eq!(t.observe(E, 60), Observation::Gap { missing: 58 });
        assert_eq!(t.observe(E, 65), Observation::Gap { missing: 4 });
        // 64 aliases 0 (seen) but must read as unseen → late.
        assert_eq!(t.observe(E, 64), Observation::Late);
        assert_eq!(t.observe(E, 2), Observation::Late);
        assert_eq!(t.observe(E, 65), Observation::Duplicate);
        assert_eq!(
            t.observe(E, 1),
            Observation::Stale {
                reason: StaleReason::BehindWindow
            }
        );
        assert_invariants(&t);
    }

    #[test]
    fn epoch_change_resets_without_loss() {
        let mut t = SequenceTracker::default();
        let _ = t.observe(E, 0);
        let _ = t.observe(E, 3);
        assert_eq!(
            t.observe(0xE2, 7),
            Observation::EpochReset { previous_epoch: E }
        );
        assert_eq!(t.observe(0xE2, 8), Observation::InOrder);
        let c = t.counts();
        assert_eq!(c.epoch, Some(0xE2));
        assert_eq!(c.resets.get(ResetReason::EpochChange), 1);
        assert_eq!((c.base, c.highest), (7, 8));
        assert_eq!((c.received, c.lost, c.expected), (4, 2, 6));
        assert_eq!((c.segment.received, c.segment.lost), (2, 0));
        assert_invariants(&t);
        // A straggler of the retired epoch is stale, not a second reset.
        assert_eq!(
            t.observe(E, 4),
            Observation::Stale {
                reason: StaleReason::RetiredEpoch
            }
        );
        assert_eq!(t.counts().resets.total(), 1);
        // Going back to the old epoch after a third one is a (new) reset.
        let _ = t.observe(0xE3, 0);
        assert_eq!(
            t.observe(E, 0),
            Observation::EpochReset {
                previous_epoch: 0xE3
            }
        );
        assert_eq!(t.counts().resets.epoch_change, 3);
        assert_eq!(
            Observation::EpochReset { previous_epoch: 1 }.reset_reason(),
            Some(ResetReason::EpochChange)
        );
        assert_eq!(ResetReason::EpochChange.to_string(), "epoch_change");
        assert_eq!(ResetReason::Dropout.as_str(), "dropout");
    }

    #[test]
    fn close_accounts_tail_loss() {
        let mut t = SequenceTracker::default();
        let _ = t.observe(E, 5);
        let _ = t.observe(E, 7);
        // 6 was missing, 8..=10 are the tail.
        assert_eq!(t.close(E, 10), Ok(4));
        let c = t.counts();
        let sent = 10 - c.base + 1;
        assert_eq!(sent, c.segment.received + c.segment.lost);
        assert_eq!((c.highest, c.lost, c.missing), (10, 4, 0));
        assert_invariants(&t);
        // A tail frame that still arrives was counted lost once: it is stale, and stays lost.
        assert_eq!(
            t.observe(E, 9),
            Observation::Stale {
                reason: StaleReason::Closed
            }
        );
        assert_eq!(t.counts().lost, 4);
        assert_invariants(&t);
        assert_eq!(t.close(E, 10), Err(CloseError::AlreadyClosed { epoch: E }));
        let mut t = SequenceTracker::default();
        let _ = t.observe(E, 10);
        assert_eq!(
            t.close(E, 9),
            Err(CloseError::BehindHighest {
                final_seq: 9,
                highest: 10
            })
        );
        assert_eq!(
            t.close(0xE2, 10),
            Err(CloseError::EpochNotObserved { epoch: 0xE2 })
        );
        let mut fresh = SequenceTracker::default();
        assert!(fresh.close(E, 1).is_err());
    }

    #[test]
    fn close_from_counts_a_segment_nothing_of_which_arrived_and_makes_its_frames_stale() {
        let mut t = SequenceTracker::default();
        assert_eq!(t.close_from(E, 0, 4), Ok(5));
        assert!(t.is_closed());
        assert_eq!(
            t.observe_from(E, 0, 2),
            Observation::Stale {
                reason: StaleReason::Closed
            }
        );
        let c = t.counts();
        assert_eq!((c.received, c.lost, c.stale), (0, 5, 1));
        assert_eq!(c.expected, 5);
        assert_invariants(&t);
        assert_eq!(
            t.close_from(E, 0, 4),
            Err(CloseError::AlreadyClosed { epoch: E })
        );
        // A later epoch retires it; a second Goodbye of the retired one changes nothing.
        let _ = t.observe_from(0xE2, 0, 0);
        assert_eq!(
            t.close_from(E, 0, 9),
            Err(CloseError::EpochNotObserved { epoch: E })
        );
        assert_eq!(t.counts().lost, 5);
        // With the epoch current it is `close`.
        let mut u = SequenceTracker::default();
        let _ = u.observe(E, 0);
        assert_eq!(u.close_from(E, 0, 3), Ok(3));
        let mut w = SequenceTracker::default();
        assert!(matches!(
            w.close_from(E, 0, HALF),
            Err(CloseError::TooFarAhead { .. })
        ));
        assert_eq!(w.counts().lost, 0);
    }

    #[test]
    fn close_rejects_a_segment_of_half_the_space() {
        let mut t = SequenceTracker::default();
        let _ = t.observe(E, 0);
        assert_eq!(
            t.close(E, HALF),
            Err(CloseError::BehindHighest {
                final_seq: HALF,
                highest: 0
            })
        );
        assert_eq!(t.close(E, HALF - 1), Ok(HALF - 1));
        assert_invariants(&t);
    }

    #[test]
    fn sequences_wrap_at_u64_max() {
        let mut t = SequenceTracker::default();
        let _ = t.observe(E, u64::MAX - 2);
        assert_eq!(t.observe(E, u64::MAX - 1), Observation::InOrder);
        assert_eq!(t.observe(E, u64::MAX), Observation::InOrder);
        assert_eq!(t.observe(E, 0), Observation::InOrder);
        assert_eq!(t.observe(E, 3), Observation::Gap { missing: 2 });
        assert_eq!(t.observe(E, 1), Observation::Late);
        assert_eq!(t.observe(E, u64::MAX), Observation::Duplicate);
        assert_eq!(
            t.observe(E, u64::MAX - 3),
            Observation::Stale {
                reason: StaleReason::BeforeBase
            }
        );
        let c = t.counts();
        assert_eq!(c.segment_expected(), 7); // u64::MAX − 2 ..= 3
        assert_invariants(&t);
        // 2 was missing; 4 and 5 are the tail.
        assert_eq!(t.close(E, 5), Ok(3));
        assert_invariants(&t);
    }

    #[test]
    fn huge_jumps_never_panic_and_segment_stays_below_half_the_space() {
        let mut t = tracker(u64::MAX, 1);
        let _ = t.observe(E, 0);
        assert_eq!(
            t.observe(E, HALF - 1),
            Observation::Gap { missing: HALF - 2 }
        );
        // Forward from highest but 2^63 past base: resync.
        assert_eq!(t.observe(E, HALF + 5), Observation::Resync { skipped: 5 });
        // Exactly half the space ahead counts as behind → stale.
        assert!(matches!(
            t.observe(E, (HALF + 5).wrapping_add(HALF)),
            Observation::Stale { .. }
        ));
        assert_invariants(&t);
        for s in [u64::MAX, 0, 1, HALF, HALF + 1, u64::MAX / 3] {
            let _ = t.observe(E, s);
            let _ = t.observe(s, s);
            assert_invariants(&t);
        }
    }

    #[test]
    fn window_of_one_only_knows_the_highest() {
        let mut t = tracker(10, 1);
        let _ = t.observe(E, 0);
        let _ = t.observe(E, 2);
        assert_eq!(t.observe(E, 2), Observation::Duplicate);
        assert_eq!(
            t.observe(E, 1),
            Observation::Stale {
                reason: StaleReason::BehindWindow
            }
        );
        assert_invariants(&t);
    }

    #[test]
    fn extend_u32_picks_the_nearest_candidate() {
        const TWO32: u64 = 1 << 32;
        assert_eq!(extend_u32(0, 5), 5);
        assert_eq!(extend_u32(TWO32 - 1, 0), TWO32);
        assert_eq!(extend_u32(TWO32 - 1, u32::MAX - 3), TWO32 - 4);
        assert_eq!(extend_u32(TWO32 + 2, u32::MAX), TWO32 - 1);
        assert_eq!(extend_u32(TWO32 + 2, 7), TWO32 + 7);
        assert_eq!(extend_u32(5 * TWO32, 1 << 31), 5 * TWO32 - (1 << 31));
        assert_eq!(
            extend_u32(5 * TWO32, (1 << 31) - 1),
            5 * TWO32 + (1 << 31) - 1
        );
        // Wraps at the ends of the 64-bit space.
        assert_eq!(extend_u32(u64::MAX, 0), 0);
        assert_eq!(extend_u32(0, u32::MAX), u64::MAX);
    }

    #[test]
    fn observe_u32_crosses_two_to_the_32() {
        let mut t = SequenceTracker::default();
        let start = (1u64 << 32) - 3;
        assert_eq!(t.observe_u32(E, start as u32), (start, Observation::First));
        for s in start + 1..start + 6 {
            assert_eq!(t.observe_u32(E, s as u32), (s, Observation::InOrder));
        }
        assert_eq!(
            t.observe_u32(E, (start + 8) as u32).1,
            Observation::Gap { missing: 2 }
        );
        assert_eq!(
            t.observe_u32(E, (start + 1) as u32),
            (start + 1, Observation::Duplicate)
        );
        assert_eq!(
            t.observe_u32(E, (start + 6) as u32),
            (start + 6, Observation::Late)
        );
        assert_eq!(t.highest(), Some(start + 8));
        assert_eq!(t.extend(0), 1 << 32);
        // A new epoch takes the immediate as is.
        assert_eq!(
            t.observe_u32(0xE2, 4),
            (4, Observation::EpochReset { previous_epoch: E })
        );
        assert_invariants(&t);
    }

    #[test]
    fn interval_report_follows_rfc3550_a3() {
        let mut t = SequenceTracker::default();
        let r = t.interval_report();
        assert_eq!(
            (r.expected_interval, r.received_interval, r.lost_interval),
            (0, 0, 0)
        );
        assert_eq!(r.fraction_lost, 0.0);

        let _ = t.observe(E, 0);
        let _ = t.observe(E, 4); // 3 lost, expected 5, received 2
        let r = t.interval_report();
        assert_eq!(
            (r.expected_interval, r.received_interval, r.lost_interval),
            (5, 2, 3)
        );
        assert_eq!(r.fraction_lost, 0.6);
        assert_eq!(r.fraction_lost_u8, 153); // (3 << 8) / 5

        // Next interval: two late frames and one new frame: expected 1, received 3.
        let _ = t.observe(E, 1);
        let _ = t.observe(E, 2);
        let _ = t.observe(E, 5);
        let r = t.interval_report();
        assert_eq!(
            (r.expected_interval, r.received_interval, r.lost_interval),
            (1, 3, -2)
        );
        assert_eq!((r.fraction_lost, r.fraction_lost_u8), (0.0, 0));

        // Everything lost: the fixed point clamps at 255 rather than wrapping to 0. The
        // missing frame 3 is lost at the close too.
        assert_eq!(t.close(E, 9), Ok(5));
        let r = t.interval_report();
        assert_eq!(
            (r.expected_interval, r.received_interval, r.lost_interval),
            (4, 0, 4)
        );
        assert_eq!((r.fraction_lost, r.fraction_lost_u8), (1.0, 255));

        // Reset inside an interval: the new segment adds to expected, nothing is lost.
        let _ = t.observe(0xE2, 100);
        let _ = t.observe(0xE2, 101);
        let r = t.interval_report();
        assert_eq!(
            (r.expected_interval, r.received_interval, r.lost_interval),
            (2, 2, 0)
        );
    }
}
