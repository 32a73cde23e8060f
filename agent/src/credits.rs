//! Sans-IO credit window (DESIGN.md §4 "Credits").
//!
//! The collector's ring has `slots` slots; frame with connection sequence `c` lands in slot
//! `c mod slots`. If the agent ran more than `slots` frames ahead of what the collector has
//! consumed, it would overwrite slots the collector has not read (a `ring_overrun` on the
//! collector). So the agent keeps at most `window = slots − margin` frames outstanding beyond
//! the collector's last reported *consumed* connection sequence, and a frame that finds no
//! credit is dropped at the source (reason `no_credit`) — it never blocks and never queues.
//!
//! A dropped frame takes no connection sequence: only frames that are actually posted get one,
//! so the collector's gap tracker never mistakes a source drop for network loss.
//!
//! Sequence arithmetic is wrap-aware ([`Seq`]: serial-number arithmetic, RFC 1982 §3.2 in its
//! practical two's-complement form) so the window stays correct across `u64::MAX → 0`, even
//! though a 64-bit connection sequence that starts near 0 does not wrap in practice.

use uctel_protocol::control::{CreditWord, CREDIT_WORD_BYTES};
use uctel_protocol::seq::Seq;

/// Why [`Credits::try_acquire`] found no credit: the window is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no credit: {outstanding} frames outstanding, window {window}")]
pub struct NoCredit {
    /// Frames posted and not yet reported consumed.
    pub outstanding: u64,
    /// The window size.
    pub window: u64,
}

/// What a collector report did to the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportOutcome {
    /// The consumed sequence moved forward by this many frames (possibly 0).
    Advanced(u64),
    /// The report is older than one already applied (it points behind the last consumed
    /// sequence); ignored.
    Stale,
    /// The report claims frames the agent never posted on this connection; the window was
    /// advanced only up to the last posted frame.
    Ahead,
}

/// What a collector's credit grant did ([`Credits::on_grant`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrantOutcome {
    /// Applied; `lowered` when the limit went down (the collector took a window back: it
    /// counts the old limit as usable until the agent's next heartbeat says otherwise).
    Applied {
        /// The new limit is below the old one.
        lowered: bool,
    },
    /// Not newer than the grant already applied; ignored.
    Stale,
}

/// The credit state of one connection (one epoch).
#[derive(Debug, Clone)]
pub struct Credits {
    /// Maximum frames outstanding.
    window: u64,
    /// The collector-wide budget's limit (DESIGN.md §4): frames with connection sequence
    /// at or beyond it wait for a later grant. `None`: a collector without grants.
    limit: Option<Seq>,
    /// Sequence of the grant applied last.
    grant: Option<u64>,
    /// The connection sequence the next posted frame gets.
    next: Seq,
    /// The first connection sequence the collector has not reported consumed; every frame in
    /// `acked_next .. next` is outstanding.
    acked_next: Seq,
}

impl Credits {
    /// A fresh window for a new connection whose first frame carries connection sequence
    /// `first_seq`, allowing `window` frames outstanding. Nothing is outstanding yet.
    ///
    /// `window` is `slots − margin` from the collector's `Welcome` (DESIGN.md §6); a window of 0
    /// admits nothing, which the caller should have refused at handshake time.
    pub fn new(first_seq: u64, window: u64) -> Self {
        Self {
            window,
            limit: None,
            grant: None,
            next: Seq::new(first_seq),
            acked_next: Seq::new(first_seq),
        }
    }

    /// Applies a grant of the collector's credit budget (`Welcome`, `Report`): from now on
    /// no frame with connection sequence `≥ limit` is posted, whatever the window allows.
    /// Grants apply in their sequence order; an older or repeated one is [`GrantOutcome::Stale`].
    pub fn on_grant(&mut self, sequence: u64, limit: u64) -> GrantOutcome {
        if self.grant.is_some_and(|g| sequence <= g) {
            return GrantOutcome::Stale;
        }
        let lowered = self.limit.is_some_and(|old| Seq::new(limit).is_before(old));
        self.grant = Some(sequence);
        self.limit = Some(Seq::new(limit));
        GrantOutcome::Applied { lowered }
    }

    /// Sequence of the grant applied last (for the agent's heartbeat).
    pub fn grant_applied(&self) -> Option<u64> {
        self.grant
    }

    /// The window size in frames.
    pub fn window(&self) -> u64 {
        self.window
    }

    /// Frames this connection may have outstanding under its current grant: the window, or
    /// less where the collector-wide budget's limit is closer (`limit − first unconsumed
    /// sequence`, 0 when the limit is already behind it). With many agents sharing one
    /// budget this is what the agent can really use, often far below the ring's window.
    pub fn granted_window(&self) -> u64 {
        match self.limit {
            None => self.window,
            Some(limit) => self
                .window
                .min(limit.forward_from(self.acked_next).unwrap_or(0)),
        }
    }

    /// The connection sequence the next acquired credit will carry.
    pub fn next_seq(&self) -> u64 {
        self.next.get()
    }

    /// Frames posted and not yet reported consumed.
    pub fn outstanding(&self) -> u64 {
        self.next.since(self.acked_next)
    }

    /// Credits left: frames that may be posted now.
    pub fn available(&self) -> u64 {
        let by_window = self.window.saturating_sub(self.outstanding());
        match self.limit {
            None => by_window,
            Some(limit) => by_window.min(limit.forward_from(self.next).unwrap_or(0)),
        }
    }

    /// Takes one credit and returns the connection sequence of the frame to post, or
    /// [`NoCredit`] if the window is full (the caller drops the frame as `no_credit`).
    pub fn try_acquire(&mut self) -> Result<u64, NoCredit> {
        let outstanding = self.outstanding();
        if self.available() == 0 {
            return Err(NoCredit {
                outstanding,
                window: self.window,
            });
        }
        let seq = self.next;
        self.next = seq.next();
        Ok(seq.get())
    }

    /// Gives back the credit of `seq` if it is the most recently acquired one (the frame
    /// could not be posted after all, e.g. the QP's send queue was full); the next
    /// [`Credits::try_acquire`] returns `seq` again. Returns false, changing nothing, for any
    /// other sequence or when that frame was already reported consumed.
    pub fn release_last(&mut self, seq: u64) -> bool {
        if self.outstanding() == 0 || self.next.prev() != Seq::new(seq) {
            return false;
        }
        self.next = Seq::new(seq);
        true
    }

    /// Applies a collector report: every frame with connection sequence up to and including
    /// `consumed` has been consumed (read from its slot, or counted lost) by the collector.
    pub fn on_consumed(&mut self, consumed: u64) -> ReportOutcome {
        let new_acked = Seq::new(consumed).next();
        // Serial compare with the current boundary; the midpoint counts as behind.
        let Some(forward) = new_acked.forward_from(self.acked_next) else {
            return ReportOutcome::Stale;
        };
        let outstanding = self.outstanding();
        if forward > outstanding {
            self.acked_next = self.next;
            return ReportOutcome::Ahead;
        }
        self.acked_next = new_acked;
        ReportOutcome::Advanced(forward)
    }
}

/// What one read of the credit word found ([`CreditReader::read`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WordRead {
    /// A word of this session that differs from the last one read: apply it.
    New(CreditWord),
    /// The same word as last time (nothing written since, or a refresh of the same values).
    Unchanged,
    /// Nothing valid there: never written, or read while the NIC was writing it (the
    /// check failed). The next read sees the whole word.
    Invalid,
    /// A valid word of another session (its generation is not this session's epoch).
    Foreign,
}

/// The agent's side of credits written into its memory (DESIGN.md §4): reads the credit
/// word the collector writes into this session's region with RDMA WRITE
/// ([`uctel_protocol::control::CreditWord`]). A read is a copy of 40 bytes of local memory:
/// no system call, no message. The word holds absolute values, so the pipeline applies
/// whatever it reads forward only ([`Credits::on_grant`], [`Credits::on_consumed`]): a lost
/// write leaves the last word in place until the collector's next (at most
/// `Welcome.credit_writes.refresh_ms` later), and a late or repeated one changes nothing.
#[derive(Debug)]
pub struct CreditReader {
    mr: uctel_transport::api::MemoryRegion,
    filter: WordFilter,
}

impl CreditReader {
    /// A reader of the word in `mr` (offset 0) for the session of `epoch` (the word's
    /// generation).
    pub fn new(mr: uctel_transport::api::MemoryRegion, epoch: u64) -> CreditReader {
        CreditReader {
            mr,
            filter: WordFilter::new(epoch),
        }
    }

    /// Reads the word once.
    pub fn read(&mut self) -> WordRead {
        let mut bytes = [0u8; CREDIT_WORD_BYTES];
        if self.mr.read_at(0, &mut bytes).is_err() {
            return WordRead::Invalid;
        }
        self.filter.take(&bytes)
    }
}

/// The sans-IO part of [`CreditReader`]: which bytes read from the region are a new word of
/// this session.
#[derive(Debug, Clone)]
pub struct WordFilter {
    generation: u64,
    last: Option<CreditWord>,
}

impl WordFilter {
    /// A filter for the session of `epoch` (the words' generation).
    pub fn new(epoch: u64) -> WordFilter {
        WordFilter {
            generation: epoch,
            last: None,
        }
    }

    /// What `bytes` (a copy of the region, [`CREDIT_WORD_BYTES`] at least) hold for this
    /// session.
    pub fn take(&mut self, bytes: &[u8]) -> WordRead {
        match CreditWord::decode(bytes) {
            None => WordRead::Invalid,
            Some(w) if w.generation != self.generation => WordRead::Foreign,
            Some(w) if self.last == Some(w) => WordRead::Unchanged,
            Some(w) => {
                self.last = Some(w);
                WordRead::New(w)
            }
        }
    }
}

/// The frames per second this agent needs, measured between the collector's reports, for
/// the next `Hello.expected_frames_per_second` (DESIGN.md §4: rings are sized per agent from
/// what it asks for at `Hello`).
///
/// The configured rate is a guess made before the agent ever ran; the pipeline knows what
/// its collections cost. Each report closes a measurement: the frames posted since the
/// previous one, over the longer of the time since then and the report interval (an early
/// report half an interval later does not double the rate), doubled when frames found no
/// credit meanwhile (the demand was larger than what was sent). The agent announces the
/// largest of its configured rate, the peak of the previous session and the peak of this
/// one, so after a reconnect (a collector restart, a pool move) its ring fits the bursts it
/// makes; the peak of a session before the previous one no longer counts.
///
/// Sans-IO: the caller passes `now` and the frames posted so far in the session.
#[derive(Debug, Clone, Default)]
pub struct DemandMeter {
    /// When the running measurement started, and the frames posted by then.
    since: Option<(std::time::Instant, u64)>,
    /// Frames found no credit during the running measurement.
    starved: bool,
    /// The peak of this session, frames per second.
    current: u32,
    /// The peak of the previous session, frames per second.
    previous: u32,
}

impl DemandMeter {
    /// A new session starts at `now`; nothing posted yet.
    pub fn start_session(&mut self, now: std::time::Instant) {
        // A session that ended before its first measurement leaves the older peak.
        let last = std::mem::take(&mut self.current);
        if last > 0 {
            self.previous = last;
        }
        self.since = Some((now, 0));
        self.starved = false;
    }

    /// Frames found no credit (the pipeline asked for an early report).
    pub fn starved(&mut self) {
        self.starved = true;
    }

    /// A report arrived at `now`, `sent` frames posted in this session so far, the collector
    /// reporting every `interval`.
    pub fn on_report(&mut self, now: std::time::Instant, sent: u64, interval: std::time::Duration) {
        let Some((at, base)) = self.since else {
            self.since = Some((now, sent));
            return;
        };
        let elapsed = now.saturating_duration_since(at).max(interval);
        let mut frames = sent.saturating_sub(base);
        if self.starved {
            frames = frames.saturating_mul(2);
        }
        if elapsed > std::time::Duration::ZERO {
            #[allow(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                clippy::cast_precision_loss
            )]
            let fps = (frames as f64 / elapsed.as_secs_f64())
                .ceil()
                .min(f64::from(u32::MAX)) as u32;
            self.current = self.current.max(fps);
        }
        self.since = Some((now, sent));
        self.starved = false;
    }

    /// The rate to announce in `Hello`: the largest of `configured` and the measured peaks,
    /// frames per second.
    pub fn announce(&self, configured: u32) -> u32 {
        configured.max(self.current).max(self.previous).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demand_meter_announces_the_measured_burst_after_a_reconnect() {
        use std::time::{Duration, Instant};
        let second = Duration::from_secs(1);
        let t0 = Instant::now();
        let mut m = DemandMeter::default();
        m.start_session(t0);
        assert_eq!(m.announce(32), 32, "nothing measured yet");
        // A collection of 60 frames in the first interval.
        m.on_report(t0 + second, 60, second);
        assert_eq!(m.announce(32), 60);
        // Quiet intervals do not lower the peak.
        m.on_report(t0 + 2 * second, 60, second);
        assert_eq!(m.announce(32), 60);
        // 56 frames, then out of credit, then an early report half an interval later: the
        // demand is counted over a whole interval and doubled.
        m.starved();
        m.on_report(t0 + Duration::from_millis(2500), 116, second);
        assert_eq!(m.announce(32), 112);
        // The next session announces the previous session's peak from its start...
        m.start_session(t0 + 3 * second);
        assert_eq!(m.announce(32), 112);
        // ...and a session that ended before any report keeps it.
        m.start_session(t0 + 4 * second);
        assert_eq!(m.announce(32), 112);
        m.on_report(t0 + 5 * second, 10, second);
        m.start_session(t0 + 6 * second);
        // The 112 was two sessions ago; the last session measured 10.
        assert_eq!(m.announce(32), 32);
        assert_eq!(m.announce(8), 10);
    }

    #[test]
    fn a_grant_limits_below_the_window_and_a_lower_one_takes_credit_back() {
        let mut c = Credits::new(0, 8);
        assert_eq!(c.on_grant(1, 2), GrantOutcome::Applied { lowered: false });
        assert_eq!(c.try_acquire(), Ok(0));
        assert_eq!(c.try_acquire(), Ok(1));
        assert!(c.try_acquire().is_err(), "limit 2 reached");
        assert_eq!(c.on_grant(2, 6), GrantOutcome::Applied { lowered: false });
        assert_eq!(c.available(), 4);
        assert_eq!(c.on_grant(2, 100), GrantOutcome::Stale);
        assert_eq!(c.on_grant(3, 3), GrantOutcome::Applied { lowered: true });
        assert_eq!(c.available(), 1);
        assert_eq!(c.try_acquire(), Ok(2));
        // A limit already passed leaves nothing, never a negative window.
        assert_eq!(c.on_grant(4, 1), GrantOutcome::Applied { lowered: true });
        assert_eq!(c.available(), 0);
        assert_eq!(c.grant_applied(), Some(4));
        // Nothing consumed yet (first unconsumed sequence 0): the grant's limit 1 allows one
        // frame outstanding, whatever the window of 8 would allow.
        assert_eq!(c.granted_window(), 1);
        // The window still caps what a generous limit allows.
        assert_eq!(
            c.on_grant(5, 1_000),
            GrantOutcome::Applied { lowered: false }
        );
        assert_eq!(c.available(), 5);
    }

    #[test]
    fn window_caps_outstanding_and_drops_excess() {
        let mut c = Credits::new(0, 3);
        assert_eq!(c.try_acquire(), Ok(0));
        assert_eq!(c.try_acquire(), Ok(1));
        assert_eq!(c.try_acquire(), Ok(2));
        assert_eq!(
            c.try_acquire(),
            Err(NoCredit {
                outstanding: 3,
                window: 3
            })
        );
        // A refused frame takes no sequence.
        assert_eq!(c.next_seq(), 3);
        assert_eq!(c.on_consumed(0), ReportOutcome::Advanced(1));
        assert_eq!(c.available(), 1);
        assert_eq!(c.try_acquire(), Ok(3));
        assert!(c.try_acquire().is_err());
    }

    #[test]
    fn never_more_than_window_outstanding_under_any_report_pattern() {
        // Deterministic pseudo-random walk: acquire many, report sometimes (including stale
        // and ahead reports), and check the invariant at every step.
        let mut c = Credits::new(u64::MAX - 500, 16);
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut last_posted: Option<u64> = None;
        let mut acquired = 0u64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            match x % 4 {
                0 | 1 => {
                    if let Ok(s) = c.try_acquire() {
                        if let Some(p) = last_posted {
                            assert_eq!(s, p.wrapping_add(1));
                        }
                        last_posted = Some(s);
                        acquired += 1;
                    }
                }
                2 => {
                    if let Some(p) = last_posted {
                        let back = (x >> 8) % 24;
                        let _ = c.on_consumed(p.wrapping_sub(back));
                    }
                }
                _ => {
                    let _ = c.on_consumed(x);
                }
            }
            assert!(c.outstanding() <= c.window());
        }
        assert!(acquired > 1000, "acquired {acquired}");
    }

    #[test]
    fn window_works_across_u64_wrap() {
        let mut c = Credits::new(u64::MAX - 1, 4);
        assert_eq!(c.try_acquire(), Ok(u64::MAX - 1));
        assert_eq!(c.try_acquire(), Ok(u64::MAX));
        assert_eq!(c.try_acquire(), Ok(0));
        assert_eq!(c.try_acquire(), Ok(1));
        assert!(c.try_acquire().is_err());
        assert_eq!(c.outstanding(), 4);
        // Consumed through u64::MAX: two frames freed across the wrap.
        assert_eq!(c.on_consumed(u64::MAX), ReportOutcome::Advanced(2));
        assert_eq!(c.outstanding(), 2);
        assert_eq!(c.on_consumed(1), ReportOutcome::Advanced(2));
        assert_eq!(c.outstanding(), 0);
        assert_eq!(c.available(), 4);
    }

    #[test]
    fn first_report_before_any_frame_on_a_zero_start() {
        // Nothing posted yet, start 0: a report of "consumed through u64::MAX" (= nothing,
        // written as first − 1) is a no-op, not a huge advance.
        let mut c = Credits::new(0, 8);
        assert_eq!(c.on_consumed(u64::MAX), ReportOutcome::Advanced(0));
        assert_eq!(c.available(), 8);
    }

    #[test]
    fn stale_report_is_ignored() {
        let mut c = Credits::new(100, 8);
        for _ in 0..6 {
            c.try_acquire().unwrap_or_default();
        }
        assert_eq!(c.on_consumed(103), ReportOutcome::Advanced(4));
        assert_eq!(c.on_consumed(101), ReportOutcome::Stale);
        assert_eq!(c.outstanding(), 2);
    }

    #[test]
    fn stale_report_across_wrap_is_ignored() {
        let mut c = Credits::new(u64::MAX - 2, 8);
        for _ in 0..6 {
            c.try_acquire().unwrap_or_default();
        }
        assert_eq!(c.on_consumed(1), ReportOutcome::Advanced(5));
        // u64::MAX is before 1 in serial order.
        assert_eq!(c.on_consumed(u64::MAX), ReportOutcome::Stale);
        assert_eq!(c.outstanding(), 1);
    }

    #[test]
    fn report_ahead_of_posted_is_clamped() {
        let mut c = Credits::new(10, 4);
        c.try_acquire().unwrap_or_default();
        c.try_acquire().unwrap_or_default();
        assert_eq!(c.on_consumed(50), ReportOutcome::Ahead);
        assert_eq!(c.outstanding(), 0);
        // The window does not grow beyond its size because of a bogus report.
        for _ in 0..4 {
            assert!(c.try_acquire().is_ok());
        }
        assert!(c.try_acquire().is_err());
    }

    #[test]
    fn release_last_gives_the_same_sequence_again() {
        let mut c = Credits::new(u64::MAX, 2);
        assert_eq!(c.try_acquire(), Ok(u64::MAX));
        assert_eq!(c.try_acquire(), Ok(0));
        assert!(
            !c.release_last(u64::MAX),
            "only the most recent can be released"
        );
        assert!(c.release_last(0));
        assert_eq!(c.outstanding(), 1);
        assert_eq!(c.try_acquire(), Ok(0));
        assert_eq!(c.on_consumed(0), ReportOutcome::Advanced(2));
        assert!(!c.release_last(0), "consumed frames cannot be released");
    }

    #[test]
    fn credit_words_apply_forward_only_whatever_order_they_come_in() {
        use uctel_protocol::control::CreditGrant;
        let word = |seq: u64, limit: u64, consumed_next: u64| CreditWord {
            generation: 9,
            grant_sequence: seq,
            grant_limit: limit,
            consumed_next,
        };
        let mut c = Credits::new(0, 64);
        let apply = |c: &mut Credits, w: CreditWord| {
            let _ = c.on_grant(w.grant().sequence, w.grant().limit);
            if let Some(done) = w.consumed_next.checked_sub(1) {
                let _ = c.on_consumed(done);
            }
        };
        apply(&mut c, word(1, 10, 0));
        for _ in 0..10 {
            assert!(c.try_acquire().is_ok());
        }
        assert!(c.try_acquire().is_err(), "limit 10");
        let newer = word(2, 20, 8);
        apply(&mut c, newer);
        assert_eq!(c.available(), 10);
        // The older word arrives late, then again: nothing moves back.
        apply(&mut c, word(1, 10, 0));
        apply(&mut c, word(1, 10, 0));
        assert_eq!(c.available(), 10);
        assert_eq!(c.grant_applied(), Some(2));
        assert_eq!(
            newer.grant(),
            CreditGrant {
                sequence: 2,
                limit: 20
            }
        );
        // The reader tells new words from repeats, torn reads and other sessions.
        let tx = word(3, 30, 12);
        let mut r = CreditReader::new(test_region(), 9);
        let f = &mut r.filter;
        assert_eq!(f.take(&tx.encode()), WordRead::New(tx));
        assert_eq!(f.take(&tx.encode()), WordRead::Unchanged);
        let mut torn = tx.encode();
        torn[20] ^= 1;
        assert_eq!(f.take(&torn), WordRead::Invalid);
        assert_eq!(f.take(&[0u8; CREDIT_WORD_BYTES]), WordRead::Invalid);
        let other = CreditWord {
            generation: 8,
            ..tx
        };
        assert_eq!(f.take(&other.encode()), WordRead::Foreign);
        // Read through a real (soft) region: what the NIC wrote is what is read.
        let next = word(4, 40, 20);
        assert!(r.mr.write_at(0, &next.encode()).is_ok());
        assert_eq!(r.read(), WordRead::New(next));
        assert_eq!(r.read(), WordRead::Unchanged);
    }

    fn test_region() -> uctel_transport::api::MemoryRegion {
        use uctel_transport::api::{AccessFlags, Device};
        use uctel_transport::soft::device::{SoftConfig, SoftDevice};
        let dev = Device::from(
            SoftDevice::open(&SoftConfig::default()).unwrap_or_else(|e| panic!("{e}")),
        );
        let pd = dev.alloc_pd().unwrap_or_else(|e| panic!("{e}"));
        pd.reg_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn zero_window_admits_nothing() {
        let mut c = Credits::new(0, 0);
        assert_eq!(
            c.try_acquire(),
            Err(NoCredit {
                outstanding: 0,
                window: 0
            })
        );
    }
}
