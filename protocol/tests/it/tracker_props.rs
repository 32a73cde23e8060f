//! Property tests of the sequence tracker against a reference model that keeps the set of
//! received sequences of the current segment in a `BTreeSet` and derives `lost` from it.
//!
//! The sender is simulated: sends with drops, duplicates, stalls (forward jumps, some larger
//! than `max_dropout`) and epoch changes, then the arrival order is shuffled with a bounded
//! displacement. After every arrival the tracker must agree with the model, keep
//! `received + lost + missing == highest − base + 1` and never lower `lost`; after the
//! sender's goodbye, `sent == received + lost`. [`Seq`]'s serial comparison and 32 → 64-bit
//! extension are checked near the 2^32 and 2^64 wraps.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use uctel_protocol::seq::Seq;
use uctel_protocol::tracker::{
    extend_u32, Observation, SequenceTracker, StaleReason, TrackerConfig,
};

/// One step of the simulated sender.
#[derive(Debug, Clone)]
enum SendOp {
    /// Send the next sequence `1 + copies` times (copies are duplicates on the wire).
    Send { copies: u8 },
    /// The next sequence is lost on the wire.
    Drop,
    /// The sender skips `n` sequences without sending (as after a long stall).
    Stall(u64),
    /// The agent reconnects: new epoch, sequence restarts at the epoch's start.
    NewEpoch,
    /// The collector takes an RFC 3550 A.3 interval report.
    Report,
}

fn send_op() -> impl Strategy<Value = SendOp> {
    prop_oneof![
        66 => Just(SendOp::Send { copies: 0 }),
        6 => Just(SendOp::Send { copies: 1 }),
        12 => Just(SendOp::Drop),
        3 => (1u64..400).prop_map(SendOp::Stall),
        1 => Just(SendOp::NewEpoch),
        2 => Just(SendOp::Report),
    ]
}

/// Start sequences that exercise the edges: 0, just below 2^32, just below u64::MAX, any.
fn start_seq() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        (0u64..100).prop_map(|k| (1u64 << 32) - k),
        (0u64..100).prop_map(|k| u64::MAX - k),
        any::<u64>(),
    ]
}

#[derive(Debug, Clone, Copy)]
enum Event {
    Frame { epoch: u64, seq: u64 },
    Report,
}

struct Simulated {
    events: Vec<Event>,
    /// Epoch in force at the end and the last sequence the sender used in it (if any).
    last_epoch: u64,
    last_sent: Option<u64>,
}

fn simulate(ops: &[SendOp], starts: &[u64], first_epoch: u64, displacement: &[u8]) -> Simulated {
    let mut epoch = first_epoch;
    let mut start_idx = 0usize;
    let mut next = starts.first().copied().unwrap_or(0);
    let mut last_sent = None;
    let mut wire: Vec<Event> = Vec::new();
    for op in ops {
        match op {
            SendOp::Send { copies } => {
                for _ in 0..=*copies {
                    wire.push(Event::Frame { epoch, seq: next });
                }
                last_sent = Some(next);
                next = next.wrapping_add(1);
            }
            SendOp::Drop => {
                last_sent = Some(next);
                next = next.wrapping_add(1);
            }
            SendOp::Stall(n) => next = next.wrapping_add(*n),
            SendOp::NewEpoch => {
                epoch = epoch.wrapping_add(0x9E37_79B9_7F4A_7C15);
                start_idx += 1;
                next = starts
                    .get(start_idx % starts.len().max(1))
                    .copied()
                    .unwrap_or(0);
                last_sent = None;
            }
            SendOp::Report => wire.push(Event::Report),
        }
    }
    // Bounded-displacement reorder: each event moves later by at most `displacement[i]`.
    let mut keyed: Vec<(usize, usize, Event)> = wire
        .into_iter()
        .enumerate()
        .map(|(i, e)| {
            let shift = displacement
                .get(i % displacement.len().max(1))
                .copied()
                .unwrap_or(0);
            (i + usize::from(shift), i, e)
        })
        .collect();
    keyed.sort_by_key(|&(key, i, _)| (key, i));
    Simulated {
        events: keyed.into_iter().map(|(_, _, e)| e).collect(),
        last_epoch: epoch,
        last_sent,
    }
}

/// The rules of `tracker.rs`, restated over a set of received sequences.
#[derive(Debug, Default)]
struct Model {
    max_dropout: u64,
    window: u64,
    epoch: Option<u64>,
    retired: Option<u64>,
    base: u64,
    highest: u64,
    seen: BTreeSet<u64>,
    received_before: u64,
    lost_before: u64,
    expected_before: u64,
    late: u64,
    duplicate: u64,
    stale: u64,
    epoch_resets: u64,
    dropout_resets: u64,
    closed: bool,
}

impl Model {
    fn span(&self) -> u64 {
        if self.epoch.is_none() {
            0
        } else {
            self.highest.wrapping_sub(self.base) + 1
        }
    }

    fn seg_received(&self) -> u64 {
        self.seen.len() as u64
    }

    /// Offsets from `base` below this are settled: out of the reorder window, or all of the
    /// segment once it was closed.
    fn floor(&self) -> u64 {
        if self.closed {
            self.span()
        } else {
            self.span().saturating_sub(self.window)
        }
    }

    /// Settled and never seen.
    fn seg_lost(&self) -> u64 {
        let floor = self.floor();
        let seen_below = self
            .seen
            .iter()
            .filter(|s| s.wrapping_sub(self.base) < floor)
            .count() as u64;
        floor - seen_below
    }

    /// Not settled and not seen.
    fn seg_missing(&self) -> u64 {
        self.span() - self.seg_received() - self.seg_lost()
    }

    fn start(&mut self, epoch: u64, seq: u64) {
        // A reset settles the old segment: its missing frames are lost.
        self.received_before += self.seg_received();
        self.lost_before += self.span() - self.seg_received();
        self.closed = false;
        self.expected_before += self.span();
        self.epoch = Some(epoch);
        self.base = seq;
        self.highest = seq;
        self.seen.clear();
        self.seen.insert(seq);
    }

    fn observe(&mut self, epoch: u64, seq: u64) -> Observation {
        let Some(current) = self.epoch else {
            self.start(epoch, seq);
            return Observation::First;
        };
        if epoch != current {
            if self.retired == Some(epoch) {
                self.stale += 1;
                return Observation::Stale {
                    reason: StaleReason::RetiredEpoch,
                };
            }
            self.start(epoch, seq);
            self.retired = Some(current);
            self.epoch_resets += 1;
            return Observation::EpochReset {
                previous_epoch: current,
            };
        }
        if self.closed {
            self.stale += 1;
            return Observation::Stale {
                reason: StaleReason::Closed,
            };
        }
        let delta = seq.wrapping_sub(self.highest) as i64;
        if delta > 0 {
            let d = delta as u64;
            if d > self.max_dropout || (seq.wrapping_sub(self.base) as i64) < 0 {
                self.start(epoch, seq);
                self.dropout_resets += 1;
                return Observation::Resync { skipped: d - 1 };
            }
            self.highest = seq;
            self.seen.insert(seq);
            return if d == 1 {
                Observation::InOrder
            } else {
                Observation::Gap { missing: d - 1 }
            };
        }
        let offset_from_base = seq.wrapping_sub(self.base);
        if offset_from_base >= self.span() {
            self.stale += 1;
            return Observation::Stale {
                reason: StaleReason::BeforeBase,
            };
        }
        if self.highest.wrapping_sub(seq) >= self.window {
            self.stale += 1;
            return Observation::Stale {
                reason: StaleReason::BehindWindow,
            };
        }
        if self.seen.insert(seq) {
            self.late += 1;
            Observation::Late
        } else {
            self.duplicate += 1;
            Observation::Duplicate
        }
    }
}

fn check_against_model(t: &SequenceTracker, m: &Model) -> Result<(), TestCaseError> {
    let c = t.counts();
    prop_assert_eq!(c.epoch, m.epoch);
    if m.epoch.is_some() {
        prop_assert_eq!(c.base, m.base);
        prop_assert_eq!(c.highest, m.highest);
    }
    prop_assert_eq!(c.segment.received, m.seg_received());
    prop_assert_eq!(c.segment.lost, m.seg_lost());
    prop_assert_eq!(c.segment.missing, m.seg_missing());
    prop_assert_eq!(c.missing, m.seg_missing());
    prop_assert!(
        c.missing < m.window,
        "missing frames stay inside the window"
    );
    prop_assert_eq!(c.received, m.received_before + m.seg_received());
    prop_assert_eq!(c.lost, m.lost_before + m.seg_lost());
    prop_assert_eq!(c.expected, m.expected_before + m.span());
    prop_assert_eq!(c.late, m.late);
    prop_assert_eq!(c.duplicate, m.duplicate);
    prop_assert_eq!(c.stale, m.stale);
    prop_assert_eq!(c.resets.epoch_change, m.epoch_resets);
    prop_assert_eq!(c.resets.dropout, m.dropout_resets);
    // The invariants, stated on the tracker's own numbers.
    prop_assert_eq!(
        c.segment.received + c.segment.lost + c.segment.missing,
        c.segment_expected()
    );
    prop_assert_eq!(c.received + c.lost + c.missing, c.expected);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn tracker_matches_reference_model(
        ops in prop::collection::vec(send_op(), 0..300),
        starts in prop::collection::vec(start_seq(), 1..4),
        first_epoch in any::<u64>(),
        displacement in prop::collection::vec(0u8..12, 1..64),
        max_dropout in 1u64..200,
        window in 1u64..150,
    ) {
        let sim = simulate(&ops, &starts, first_epoch, &displacement);
        let mut t = SequenceTracker::new(TrackerConfig { max_dropout, reorder_window: window, ..TrackerConfig::default() })
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut m = Model { max_dropout, window, ..Model::default() };
        let mut reported_expected = 0u64;
        let mut reported_received = 0u64;
        let mut lost_seen = 0u64;
        for ev in &sim.events {
            match *ev {
                Event::Frame { epoch, seq } => {
                    let got = t.observe(epoch, seq);
                    let want = m.observe(epoch, seq);
                    prop_assert_eq!(got, want, "epoch {:#x} seq {}", epoch, seq);
                    // Loss is exported as a counter: it never goes back.
                    prop_assert!(t.counts().lost >= lost_seen, "lost went down");
                    lost_seen = t.counts().lost;
                }
                Event::Report => {
                    let r = t.interval_report();
                    prop_assert!((0.0..=1.0).contains(&r.fraction_lost));
                    prop_assert_eq!(
                        i128::from(r.lost_interval),
                        i128::from(r.expected_interval) - i128::from(r.received_interval)
                    );
                    if r.lost_interval <= 0 {
                        prop_assert_eq!(r.fraction_lost_u8, 0);
                    }
                    reported_expected += r.expected_interval;
                    reported_received += r.received_interval;
                }
            }
            check_against_model(&t, &m)?;
        }
        let r = t.interval_report();
        let c = t.counts();
        prop_assert_eq!(reported_expected + r.expected_interval, c.expected);
        prop_assert_eq!(reported_received + r.received_interval, c.received);

        // Goodbye: the sender's final sequence of its last epoch.
        if let Some(final_seq) = sim.last_sent {
            match t.close(sim.last_epoch, final_seq) {
                Ok(newly_lost) => {
                    let c = t.counts();
                    prop_assert_eq!(
                        newly_lost,
                        final_seq.wrapping_sub(m.highest) + m.seg_missing()
                    );
                    let sent = final_seq.wrapping_sub(c.base) + 1;
                    prop_assert_eq!(sent, c.segment.received + c.segment.lost);
                    prop_assert_eq!(c.missing, 0);
                    prop_assert_eq!(c.received + c.lost, c.expected);
                    // Every frame of the segment that arrived is counted exactly once.
                    let arrived: BTreeSet<u64> = sim.events.iter().filter_map(|e| match *e {
                        Event::Frame { epoch, seq } if epoch == sim.last_epoch
                            && seq.wrapping_sub(c.base) < sent => Some(seq),
                        _ => None,
                    }).collect();
                    prop_assert!(c.segment.received <= arrived.len() as u64);
                    // Delayed frames still arriving after the goodbye are stale: each was
                    // counted once already (received, or lost at close) and stays so.
                    m.highest = final_seq;
                    m.closed = true;
                    for k in 0..window.saturating_add(2) {
                        let seq = final_seq.wrapping_sub(k);
                        prop_assert_eq!(t.observe(sim.last_epoch, seq), m.observe(sim.last_epoch, seq));
                        check_against_model(&t, &m)?;
                        let c = t.counts();
                        prop_assert_eq!(sent, c.segment.received + c.segment.lost);
                    }
                }
                Err(_) => {
                    // Only when the last epoch never reached the tracker (everything of it
                    // dropped, or a reordered older epoch took over again).
                    prop_assert_ne!(m.epoch, Some(sim.last_epoch));
                }
            }
        }
    }

    #[test]
    fn observe_u32_matches_observe_across_two_to_the_32(
        below in 0u64..300,
        ops in prop::collection::vec(send_op(), 1..600),
        displacement in prop::collection::vec(0u8..40, 1..64),
        window in 1u64..100,
    ) {
        // One epoch of a connection sequence that starts just below 2^32 and crosses it.
        let ops: Vec<SendOp> = ops.into_iter().filter(|o| !matches!(o, SendOp::NewEpoch)).collect();
        let start = (1u64 << 32) - below;
        let sim = simulate(&ops, &[start], 7, &displacement);
        let cfg = TrackerConfig { max_dropout: 3000, reorder_window: window, ..TrackerConfig::default() };
        let mut by_imm = SequenceTracker::new(cfg).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut by_seq = SequenceTracker::new(cfg).map_err(|e| TestCaseError::fail(e.to_string()))?;
        // The first immediate is taken as is, so the connection starts below 2^32.
        let first = start - 1;
        prop_assert_eq!(by_imm.observe_u32(7, first as u32), (first, Observation::First));
        prop_assert_eq!(by_seq.observe(7, first), Observation::First);
        for ev in &sim.events {
            if let Event::Frame { epoch, seq } = *ev {
                let (extended, got) = by_imm.observe_u32(epoch, seq as u32);
                prop_assert_eq!(extended, seq);
                prop_assert_eq!(got, by_seq.observe(epoch, seq));
                prop_assert_eq!(by_imm.counts(), by_seq.counts());
            }
        }
    }

    #[test]
    fn extend_u32_recovers_any_value_within_half_the_32_bit_space(
        highest in any::<u64>(),
        delta in -(1i64 << 31)..(1i64 << 31),
    ) {
        let value = highest.wrapping_add(delta as u64);
        prop_assert_eq!(extend_u32(highest, value as u32), value);
    }

    /// `Seq` near the two wraps that matter (2^32, where the immediate's cycle count moves,
    /// and 2^64, where the sequence itself wraps): comparison is antisymmetric and agrees with
    /// the signed distance, addition moves forward, and extension recovers every value
    /// within half the 32-bit space of its reference.
    #[test]
    fn seq_compares_and_extends_across_the_wraps(
        base in prop_oneof![
            Just(0u64),
            Just(1u64 << 32),
            Just(u64::MAX),
            Just(1u64 << 63),
            any::<u64>(),
        ],
        jitter in -(1i64 << 20)..(1i64 << 20),
        delta in prop_oneof![-(1i64 << 31)..(1i64 << 31), -4i64..4],
        step in 1u64..(1 << 62),
    ) {
        let r = Seq::new(base.wrapping_add(jitter as u64));
        let v = r.add(delta as u64);
        // Comparison and distance.
        prop_assert_eq!(v.distance(r), delta);
        prop_assert_eq!(v.is_after(r), delta > 0);
        prop_assert_eq!(v.is_before(r), delta < 0);
        prop_assert_eq!(r.is_after(v), v.is_before(r));
        prop_assert_eq!(v.serial_cmp(r), Some(delta.cmp(&0)));
        prop_assert_eq!(v.forward_from(r), u64::try_from(delta).ok());
        prop_assert!(r.add(step).is_after(r));
        prop_assert_eq!(r.add(step).since(r), step);
        prop_assert_eq!(r.add(1 << 63).serial_cmp(r), None);
        // 32 → 64-bit extension.
        prop_assert_eq!(r.extend(v.low32()), v);
        prop_assert_eq!(extend_u32(r.get(), v.low32()), v.get());
        prop_assert_eq!(Seq::from_parts(v.cycles(), v.low32()), v);
        // Exactly half the 32-bit space ahead reads as behind (RFC 1982 midpoint).
        let far = r.add(1 << 31);
        prop_assert_eq!(r.extend(far.low32()), r.sub(1 << 31));
    }

    #[test]
    fn arbitrary_input_never_breaks_the_invariants(
        frames in prop::collection::vec((0u64..3, any::<u64>(), -70i64..70, any::<bool>()), 0..200),
        max_dropout in prop_oneof![1u64..(1 << 40), Just(u64::MAX)],
        window in 1u64..=1024,
        close in any::<u64>(),
    ) {
        // Sequences are random or near the previous one; epochs come from a tiny set so
        // retired epochs and returns to old ones happen.
        let mut t = SequenceTracker::new(TrackerConfig { max_dropout, reorder_window: window, ..TrackerConfig::default() })
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut prev = 0u64;
        for (epoch, random, step, near) in frames {
            let seq = if near { prev.wrapping_add(step as u64) } else { random };
            let _ = t.observe(epoch, seq);
            let _ = t.interval_report();
            prev = seq;
            let c = t.counts();
            prop_assert_eq!(
                c.segment.received + c.segment.lost + c.segment.missing,
                c.segment_expected()
            );
            // Cumulative counters saturate; only huge `max_dropout` can get there.
            if c.expected < u64::MAX / 2 {
                prop_assert_eq!(c.received + c.lost + c.missing, c.expected);
            }
        }
        if let Some(epoch) = t.epoch() {
            if t.close(epoch, close).is_ok() {
                let c = t.counts();
                prop_assert_eq!(close.wrapping_sub(c.base) + 1, c.segment.received + c.segment.lost);
            }
        }
    }
}

/// Reference model of the reorder window in time (one epoch, a frame window wider than the
/// run, so only time settles): a missing sequence is lost once the first frame after it is
/// `reorder_time` old.
#[derive(Debug, Default)]
struct TimedModel {
    highest: Option<u64>,
    received: BTreeSet<u64>,
    lost: BTreeSet<u64>,
    /// Missing sequence → when a later frame first arrived.
    revealed: std::collections::BTreeMap<u64, Duration>,
}

impl TimedModel {
    fn sweep(&mut self, now: Duration, reorder_time: Duration) {
        let due: Vec<u64> = self
            .revealed
            .iter()
            .filter(|(_, at)| now.saturating_sub(**at) >= reorder_time)
            .map(|(s, _)| *s)
            .collect();
        for s in due {
            self.revealed.remove(&s);
            self.lost.insert(s);
        }
    }

    fn observe(&mut self, seq: u64, now: Duration, reorder_time: Duration) -> Observation {
        self.sweep(now, reorder_time);
        match self.highest {
            Some(h) if seq <= h => {
                if self.received.contains(&seq) {
                    Observation::Duplicate
                } else if self.lost.contains(&seq) {
                    Observation::Stale {
                        reason: StaleReason::ReorderTime,
                    }
                } else {
                    self.revealed.remove(&seq);
                    self.received.insert(seq);
                    Observation::Late
                }
            }
            _ => {
                let from = self.highest.map_or(0, |h| h + 1);
                for m in from..seq {
                    self.revealed.insert(m, now);
                }
                self.received.insert(seq);
                let first = self.highest.is_none();
                self.highest = Some(seq);
                match (first, seq - from) {
                    (true, _) => Observation::First,
                    (false, 0) => Observation::InOrder,
                    (false, missing) => Observation::Gap { missing },
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Frames dropped, duplicated and reordered, arriving at random instants with sweeps in
    /// between: each frame is classified as the time model says (late inside the reorder
    /// time, stale once counted lost), the counters agree with it, nothing overdue is left
    /// after a sweep, and after the goodbye `sent == received + lost`.
    #[test]
    fn the_reorder_time_counts_each_missing_frame_once(
        sends in prop::collection::vec((0u8..10, 0u64..700, any::<bool>()), 1..160),
        displacement in 0usize..6,
        order_seed in any::<u64>(),
        reorder_ms in 1u64..2000,
    ) {
        let reorder_time = Duration::from_millis(reorder_ms);
        let mut t = SequenceTracker::new(TrackerConfig {
            max_dropout: 3000,
            reorder_window: 1024,
            reorder_time: Some(reorder_time),
        })
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
        // (seq, gap before it in ms, sweep before it); 0 = dropped, 1 = duplicated.
        let mut wire: Vec<(u64, u64, bool)> = Vec::new();
        for (i, (fate, dt, sweep)) in sends.iter().enumerate() {
            let seq = i as u64;
            match fate {
                0 => {}
                1 => {
                    wire.push((seq, *dt, *sweep));
                    wire.push((seq, 0, false));
                }
                _ => wire.push((seq, *dt, *sweep)),
            }
        }
        // Bounded reordering: swap neighbours a few places apart.
        let mut x = order_seed | 1;
        for i in 0..wire.len() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let j = (i + (x as usize) % (displacement + 1)).min(wire.len() - 1);
            wire.swap(i, j);
        }
        let t0 = Instant::now();
        let mut m = TimedModel::default();
        let mut now = Duration::ZERO;
        let mut lost_before = 0;
        for (seq, dt, sweep) in wire {
            now += Duration::from_millis(dt);
            if sweep {
                let before = t.counts().lost;
                let newly = t.handle_timeout(t0 + now);
                m.sweep(now, reorder_time);
                prop_assert_eq!(t.counts().lost - before, newly);
                prop_assert!(t.poll_timeout().is_none_or(|d| d > t0 + now));
            }
            let want = m.observe(seq, now, reorder_time);
            prop_assert_eq!(t.observe_from_at(7, 0, seq, t0 + now), want, "seq {} at {:?}", seq, now);
            let c = t.counts();
            prop_assert_eq!(c.received, m.received.len() as u64);
            prop_assert_eq!(c.lost, m.lost.len() as u64);
            prop_assert_eq!(c.missing, m.revealed.len() as u64);
            prop_assert_eq!(c.received + c.lost + c.missing, c.expected);
            prop_assert!(c.lost >= lost_before);
            lost_before = c.lost;
            // A timer is pending whenever a frame is missing, and never later than the
            // oldest missing frame's deadline.
            let oldest = m.revealed.values().min().map(|at| t0 + *at + reorder_time);
            match (t.poll_timeout(), oldest) {
                (None, Some(_)) => prop_assert!(false, "missing frames but no timer"),
                (Some(p), Some(o)) => prop_assert!(p <= o),
                _ => {}
            }
        }
        let last = sends.len() as u64 - 1;
        if let Some(h) = m.highest {
            prop_assert!(t.close(7, last).is_ok());
            let c = t.counts();
            prop_assert_eq!(c.segment.received + c.segment.lost, last + 1);
            prop_assert_eq!(c.received, m.received.len() as u64);
            prop_assert!(h <= last);
        }
    }
}

#[test]
fn late_never_exceeds_received_and_lost_never_goes_negative() {
    let mut t = SequenceTracker::default();
    let _ = t.observe(1, 0);
    let _ = t.observe(1, 10);
    for s in (1..10).rev() {
        assert_eq!(t.observe(1, s), Observation::Late);
    }
    for s in 0..=10 {
        assert_eq!(t.observe(1, s), Observation::Duplicate);
    }
    let c = t.counts();
    assert_eq!((c.received, c.lost, c.late, c.duplicate), (11, 0, 9, 11));
}
