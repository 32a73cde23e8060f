//! Sans-IO pacing: token buckets that cap the agent's send rate in frames per second and
//! bytes per second.
//!
//! The sender asks [`Pacer::poll_admit`] before posting each frame, passing in `now`; nothing in
//! here reads a clock, so tests drive it on a virtual timeline. A frame that is not admitted yet
//! is not dropped by the pacer: the pacer answers *when* it will be admitted. Meanwhile the
//! sender's bounded frame queue stops taking records, so an excess waits in the bounded source
//! queues and what overflows them is counted there (`source_overflow`).
//!
//! The bucket is the classic token bucket (RFC 2697 §1 "token bucket" with committed rate and
//! burst size; the same shape as Linux `tc-tbf`): tokens accrue at `rate` per second up to
//! `burst`, a frame takes one frame token and `len` byte tokens, both buckets must cover it.
//! Tokens are kept as integers in units of "token × nanosecond" so a long run neither drifts nor
//! loses fractions of a token.

pub mod grid;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

const NANOS_PER_SECOND: u128 = 1_000_000_000;

/// One token bucket: `rate` tokens per second, holding at most `burst` tokens.
///
/// Internally the fill level is `tokens × 10⁹` (token-nanoseconds) so refills of any duration
/// are exact integer arithmetic.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    /// Tokens per second; > 0.
    rate: u64,
    /// Capacity in tokens × 10⁹.
    capacity: u128,
    /// Current fill in tokens × 10⁹.
    level: u128,
    /// The instant `level` was last brought up to date.
    last: Instant,
}

impl TokenBucket {
    /// A bucket that refills at `rate` tokens per second and holds up to `burst` tokens; it
    /// starts full at `now`. `rate` and `burst` are raised to 1 if given as 0 (a bucket that
    /// never admits anything is expressed by not sending, not by a zero rate).
    pub fn new(rate: u64, burst: u64, now: Instant) -> Self {
        let rate = rate.max(1);
        let capacity = u128::from(burst.max(1)) * NANOS_PER_SECOND;
        Self {
            rate,
            capacity,
            level: capacity,
            last: now,
        }
    }

    /// Tokens per second.
    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// Capacity in whole tokens.
    pub fn burst(&self) -> u64 {
        u64::try_from(self.capacity / NANOS_PER_SECOND).unwrap_or(u64::MAX)
    }

    /// Whole tokens available at `now`.
    pub fn available(&mut self, now: Instant) -> u64 {
        self.refill(now);
        u64::try_from(self.level / NANOS_PER_SECOND).unwrap_or(u64::MAX)
    }

    fn refill(&mut self, now: Instant) {
        // A `now` earlier than `last` (a caller mixing clocks) adds nothing and keeps `last`.
        if let Some(elapsed) = now.checked_duration_since(self.last) {
            let added = elapsed.as_nanos().saturating_mul(u128::from(self.rate));
            self.level = self.level.saturating_add(added).min(self.capacity);
            self.last = now;
        }
    }

    /// How long from `now` until `n` tokens are available, or `None` if `n` exceeds the burst
    /// (it never will be). `Some(ZERO)` means now.
    pub fn wait_for(&mut self, n: u64, now: Instant) -> Option<Duration> {
        self.refill(now);
        let need = u128::from(n) * NANOS_PER_SECOND;
        if need > self.capacity {
            return None;
        }
        if need <= self.level {
            return Some(Duration::ZERO);
        }
        let missing = need - self.level;
        // ceil(missing / rate) nanoseconds.
        let rate = u128::from(self.rate);
        let nanos = missing.div_ceil(rate);
        Some(Duration::from_nanos(
            u64::try_from(nanos).unwrap_or(u64::MAX),
        ))
    }

    /// Takes `n` tokens if available at `now`; returns whether it did.
    pub fn try_take(&mut self, n: u64, now: Instant) -> bool {
        self.refill(now);
        let need = u128::from(n) * NANOS_PER_SECOND;
        if need <= self.level {
            self.level -= need;
            true
        } else {
            false
        }
    }
}

/// Pacing limits (from `pacing.*` in the agent config). `None` means unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacingLimits {
    /// Frames per second.
    pub frames_per_second: Option<u64>,
    /// Payload-plus-header bytes per second.
    pub bytes_per_second: Option<u64>,
    /// How many seconds of rate a burst may use (the bucket depth), in milliseconds.
    pub burst_millis: u64,
    /// The largest frame the sender will ever ask about; the byte bucket is at least this deep
    /// so every legal frame can pass.
    pub max_frame_bytes: u64,
}

/// The answer of [`Pacer::poll_admit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Send now; the tokens have been taken.
    Now,
    /// Not before `now + Duration`; nothing was taken. Ask again then.
    After(Duration),
    /// The frame is larger than the byte bucket can ever hold (larger than the configured
    /// `max_frame_bytes`); the caller drops it as `oversize`.
    Never,
}

/// Frame-rate and byte-rate token buckets, both of which must admit a frame.
#[derive(Debug, Clone)]
pub struct Pacer {
    frames: Option<TokenBucket>,
    bytes: Option<TokenBucket>,
}

impl Pacer {
    /// Builds the buckets, full at `now`.
    ///
    /// Bucket depth: `rate × burst_millis / 1000`, at least 1 frame and at least
    /// `max_frame_bytes` bytes.
    pub fn new(limits: PacingLimits, now: Instant) -> Self {
        let depth = |rate: u64| -> u64 {
            let d = u128::from(rate) * u128::from(limits.burst_millis) / 1000;
            u64::try_from(d).unwrap_or(u64::MAX)
        };
        Self {
            frames: limits
                .frames_per_second
                .map(|r| TokenBucket::new(r, depth(r).max(1), now)),
            bytes: limits
                .bytes_per_second
                .map(|r| TokenBucket::new(r, depth(r).max(limits.max_frame_bytes).max(1), now)),
        }
    }

    /// A pacer that admits everything.
    pub fn unlimited() -> Self {
        Self {
            frames: None,
            bytes: None,
        }
    }

    /// Asks to send one frame of `len` bytes at `now`. Takes the tokens only when both buckets
    /// can cover the frame, so a refusal by one bucket never consumes the other's tokens.
    pub fn poll_admit(&mut self, len: usize, now: Instant) -> Admit {
        let len = u64::try_from(len).unwrap_or(u64::MAX);
        let mut wait = Duration::ZERO;
        if let Some(b) = self.frames.as_mut() {
            match b.wait_for(1, now) {
                Some(w) => wait = wait.max(w),
                None => return Admit::Never,
            }
        }
        if let Some(b) = self.bytes.as_mut() {
            match b.wait_for(len, now) {
                Some(w) => wait = wait.max(w),
                None => return Admit::Never,
            }
        }
        if !wait.is_zero() {
            return Admit::After(wait);
        }
        if let Some(b) = self.frames.as_mut() {
            let _taken = b.try_take(1, now);
        }
        if let Some(b) = self.bytes.as_mut() {
            let _taken = b.try_take(len, now);
        }
        Admit::Now
    }
}

/// The pacer of one pipeline: its own, or one shared by the pipelines of a connection's lanes
/// (DESIGN.md §8b), so that `pacing`'s caps hold for the connection as a whole.
#[derive(Debug)]
pub enum PacerHandle {
    /// This pipeline's alone.
    Own(Pacer),
    /// Shared with the other lane's pipeline (both run on the session's task; the lock is
    /// never contended).
    Shared(Arc<Mutex<Pacer>>),
}

impl PacerHandle {
    /// [`Pacer::poll_admit`] on the pacer, shared or not.
    pub fn poll_admit(&mut self, len: usize, now: Instant) -> Admit {
        match self {
            PacerHandle::Own(p) => p.poll_admit(len, now),
            PacerHandle::Shared(p) => p
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .poll_admit(len, now),
        }
    }

    /// Makes this pacer shareable (keeping its buckets) and returns a handle to it.
    pub fn share(&mut self) -> Arc<Mutex<Pacer>> {
        match self {
            PacerHandle::Shared(p) => p.clone(),
            PacerHandle::Own(p) => {
                let shared = Arc::new(Mutex::new(p.clone()));
                *self = PacerHandle::Shared(shared.clone());
                shared
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(fps: Option<u64>, bps: Option<u64>) -> PacingLimits {
        PacingLimits {
            frames_per_second: fps,
            bytes_per_second: bps,
            burst_millis: 100,
            max_frame_bytes: 1000,
        }
    }

    /// Drives `pacer` for `secs` virtual seconds, always sending as soon as admitted, and
    /// returns (frames, bytes) sent. Bounded: a livelock fails.
    fn drive(pacer: &mut Pacer, t0: Instant, secs: u64, len: usize) -> (u64, u64) {
        let end = t0 + Duration::from_secs(secs);
        let mut now = t0;
        let (mut frames, mut bytes) = (0u64, 0u64);
        for _ in 0..10_000_000 {
            if now >= end {
                return (frames, bytes);
            }
            match pacer.poll_admit(len, now) {
                Admit::Now => {
                    frames += 1;
                    bytes += len as u64;
                }
                Admit::After(d) => {
                    assert!(!d.is_zero());
                    now += d;
                }
                Admit::Never => panic!("frame of {len} bytes never admitted"),
            }
        }
        panic!("drive loop did not finish");
    }

    #[test]
    fn frame_rate_is_capped_over_a_long_run() {
        let t0 = Instant::now();
        let mut p = Pacer::new(limits(Some(100), None), t0);
        let (frames, _) = drive(&mut p, t0, 60, 10);
        // 60 s at 100/s plus a burst of 10 at the start.
        assert!((6000..=6011).contains(&frames), "frames = {frames}");
    }

    #[test]
    fn byte_rate_is_capped_over_a_long_run() {
        let t0 = Instant::now();
        let mut p = Pacer::new(limits(None, Some(100_000)), t0);
        let (_, bytes) = drive(&mut p, t0, 10, 1000);
        // 10 s at 100 kB/s plus a 10 kB burst.
        assert!((1_000_000..=1_011_000).contains(&bytes), "bytes = {bytes}");
    }

    #[test]
    fn the_tighter_limit_wins() {
        let t0 = Instant::now();
        // 1000 frames/s but only 10 kB/s of 1000-byte frames = 10 frames/s.
        let mut p = Pacer::new(limits(Some(1000), Some(10_000)), t0);
        let (frames, _) = drive(&mut p, t0, 10, 1000);
        assert!((100..=102).contains(&frames), "frames = {frames}");
    }

    #[test]
    fn refusal_by_one_bucket_takes_nothing_from_the_other() {
        let t0 = Instant::now();
        let mut p = Pacer::new(limits(Some(1000), Some(1000)), t0);
        // Byte bucket depth = max(100, 1000) = 1000: one 1000-byte frame drains it.
        assert_eq!(p.poll_admit(1000, t0), Admit::Now);
        assert!(matches!(p.poll_admit(1000, t0), Admit::After(_)));
        // Frame bucket (depth 100) lost exactly one token: 99 tiny frames still pass on frames,
        // but bytes block them, so check the frame bucket directly.
        let fb = p.frames.as_mut().map(|b| b.available(t0));
        assert_eq!(fb, Some(99));
    }

    #[test]
    fn wait_is_exact_and_rounds_up() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(3, 1, t0);
        assert!(b.try_take(1, t0));
        // 1 token at 3/s = 333_333_333.33 ns, rounded up.
        assert_eq!(b.wait_for(1, t0), Some(Duration::from_nanos(333_333_334)));
        let later = t0 + Duration::from_nanos(333_333_333);
        assert!(!b.try_take(1, later));
        assert!(b.try_take(1, later + Duration::from_nanos(1)));
    }

    #[test]
    fn oversize_frame_is_never_admitted() {
        let t0 = Instant::now();
        let mut p = Pacer::new(limits(None, Some(1000)), t0);
        assert_eq!(p.poll_admit(1001, t0), Admit::Never);
        assert_eq!(p.poll_admit(1000, t0), Admit::Now);
    }

    #[test]
    fn bucket_never_exceeds_burst_after_idle() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(1000, 5, t0);
        assert_eq!(b.available(t0 + Duration::from_secs(3600)), 5);
    }

    #[test]
    fn clock_going_backwards_adds_nothing() {
        let t0 = Instant::now() + Duration::from_secs(10);
        let mut b = TokenBucket::new(10, 1, t0);
        assert!(b.try_take(1, t0));
        assert_eq!(b.available(t0 - Duration::from_secs(5)), 0);
        assert_eq!(b.available(t0 + Duration::from_millis(100)), 1);
    }

    #[test]
    fn unlimited_admits_everything() {
        let t0 = Instant::now();
        let mut p = Pacer::unlimited();
        for _ in 0..1000 {
            assert_eq!(p.poll_admit(usize::MAX, t0), Admit::Now);
        }
    }

    #[test]
    fn zero_rate_and_burst_are_raised_to_one() {
        let t0 = Instant::now();
        let b = TokenBucket::new(0, 0, t0);
        assert_eq!((b.rate(), b.burst()), (1, 1));
    }
}
