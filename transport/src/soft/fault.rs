//! `FaultInjector`: a seeded, reproducible fault-injecting decorator around any [`Link`]
//! (after smoltcp's `FaultInjector` device).
//!
//! Each datagram passing in the configured [`FaultDirection`] goes through, in order:
//!
//! 1. **drop** with probability `drop_ratio`;
//! 2. **corrupt** with probability `corrupt_ratio`: one uniformly chosen payload bit flipped;
//! 3. **duplicate** with probability `duplicate_ratio`: the datagram goes out twice;
//! 4. **reorder** with probability `reorder_ratio`: the datagram is held back and released
//!    right after 1..=`reorder_window` (uniform) later datagrams, or once it has been held
//!    for [`MAX_REORDER_HOLD`] when fewer follow (a real path reorders, it does not keep a
//!    packet forever: the last datagram before a pause still arrives, only late);
//! 5. **delay** by `delay_ms` when non-zero: every datagram is held that long.
//!
//! All randomness comes from one `ChaCha8Rng` seeded with `seed`, so the same seed and the
//! same sequence of calls give the same faults. Counters live in an `Arc<FaultStats>` of
//! atomics that the owner can read from another thread while the link is in use. Once
//! everything held has been released ([`FaultInjector::flush`]), the counters add up:
//! `passed == inputs - dropped + duplicated`.
//!
//! Delays use `Instant::now()` through the [`Link`] methods; [`FaultInjector::send_at`],
//! [`FaultInjector::recv_at`] and [`FaultInjector::release_due`] take the time explicitly for
//! deterministic tests.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Deserialize;
use thiserror::Error;

use super::link::{Datagram, Link, Readiness};

/// Which way faults are applied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultDirection {
    /// Datagrams handed to `send` (default).
    #[default]
    Send,
    /// Datagrams returned by `recv`.
    Recv,
    /// Both ways (each datagram is exposed to faults once per direction it takes).
    Both,
}

impl FaultDirection {
    fn send(self) -> bool {
        matches!(self, FaultDirection::Send | FaultDirection::Both)
    }

    fn recv(self) -> bool {
        matches!(self, FaultDirection::Recv | FaultDirection::Both)
    }
}

/// Fault configuration. `Default` disables every fault. Ratios are probabilities in
/// `0.0..=1.0` per datagram.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FaultConfig {
    /// Probability of dropping a datagram.
    pub drop_ratio: f64,
    /// Probability of sending a datagram twice.
    pub duplicate_ratio: f64,
    /// Probability of holding a datagram back for reordering; needs `reorder_window > 0`.
    pub reorder_ratio: f64,
    /// A held datagram is released after 1..=`reorder_window` later datagrams.
    pub reorder_window: usize,
    /// Probability of flipping one random bit of a datagram's payload.
    pub corrupt_ratio: f64,
    /// Delay added to every datagram, in milliseconds (0 = none).
    pub delay_ms: u64,
    /// Seed of the fault RNG.
    pub seed: u64,
    /// Where faults are applied.
    pub direction: FaultDirection,
}

/// The faults that are on, as `key=value` pairs named like the configuration keys
/// (`drop_ratio=0.02 seed=42 direction=both`), for operator-facing log lines.
impl std::fmt::Display for FaultConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts: Vec<String> = Vec::new();
        for (key, value) in [
            ("drop_ratio", self.drop_ratio),
            ("duplicate_ratio", self.duplicate_ratio),
            ("reorder_ratio", self.reorder_ratio),
            ("corrupt_ratio", self.corrupt_ratio),
        ] {
            if value != 0.0 {
                parts.push(format!("{key}={value}"));
            }
        }
        if self.reorder_window > 0 {
            parts.push(format!("reorder_window={}", self.reorder_window));
        }
        if self.delay_ms > 0 {
            parts.push(format!("delay_milliseconds={}", self.delay_ms));
        }
        parts.push(format!("seed={}", self.seed));
        let direction = match self.direction {
            FaultDirection::Send => "send",
            FaultDirection::Recv => "recv",
            FaultDirection::Both => "both",
        };
        parts.push(format!("direction={direction}"));
        f.write_str(&parts.join(" "))
    }
}

/// An invalid [`FaultConfig`].
#[derive(Clone, Debug, PartialEq, Error)]
pub enum FaultConfigError {
    /// A ratio outside `0.0..=1.0` or not a number.
    #[error("{field} = {value} is not a probability in 0.0..=1.0")]
    Ratio {
        /// Field name.
        field: &'static str,
        /// The value given.
        value: f64,
    },
    /// `reorder_ratio` > 0 with `reorder_window` = 0, or the reverse.
    #[error("reorder needs both reorder_ratio > 0 and reorder_window > 0 (got {ratio}, {window})")]
    Reorder {
        /// `reorder_ratio`.
        ratio: f64,
        /// `reorder_window`.
        window: usize,
    },
}

impl FaultConfig {
    /// Checks ratios and the reorder pair.
    pub fn validate(&self) -> Result<(), FaultConfigError> {
        for (field, value) in [
            ("drop_ratio", self.drop_ratio),
            ("duplicate_ratio", self.duplicate_ratio),
            ("reorder_ratio", self.reorder_ratio),
            ("corrupt_ratio", self.corrupt_ratio),
        ] {
            if !(0.0..=1.0).contains(&value) {
                return Err(FaultConfigError::Ratio { field, value });
            }
        }
        if (self.reorder_ratio > 0.0) != (self.reorder_window > 0) {
            return Err(FaultConfigError::Reorder {
                ratio: self.reorder_ratio,
                window: self.reorder_window,
            });
        }
        Ok(())
    }
}

/// A snapshot of [`FaultStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// Datagrams handed on (to the inner link on send, to the caller on receive), duplicates
    /// included.
    pub passed: u64,
    /// Datagrams dropped.
    pub dropped: u64,
    /// Extra copies made.
    pub duplicated: u64,
    /// Datagrams held back for reordering.
    pub reordered: u64,
    /// Datagrams with one bit flipped.
    pub corrupted: u64,
    /// Datagrams delayed by `delay_ms`.
    pub delayed: u64,
}

/// Live fault counters, shared through an `Arc`; readable from any thread.
#[derive(Debug, Default)]
pub struct FaultStats {
    inputs: AtomicU64,
    passed: AtomicU64,
    dropped: AtomicU64,
    duplicated: AtomicU64,
    reordered: AtomicU64,
    corrupted: AtomicU64,
    delayed: AtomicU64,
}

impl FaultStats {
    /// The current counts.
    pub fn snapshot(&self) -> FaultCounts {
        FaultCounts {
            passed: self.passed.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
            duplicated: self.duplicated.load(Ordering::Relaxed),
            reordered: self.reordered.load(Ordering::Relaxed),
            corrupted: self.corrupted.load(Ordering::Relaxed),
            delayed: self.delayed.load(Ordering::Relaxed),
        }
    }

    /// Datagrams that entered the fault pipeline.
    pub fn inputs(&self) -> u64 {
        self.inputs.load(Ordering::Relaxed)
    }

    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Longest a datagram held back for reordering waits for later datagrams; then it is
/// released anyway (at the next call into the injector at or after that time).
pub const MAX_REORDER_HOLD: Duration = Duration::from_millis(20);

/// A datagram held back for reordering.
#[derive(Debug)]
struct Held {
    /// Later datagrams still to pass before it goes.
    after: usize,
    /// When it goes if fewer pass by then ([`MAX_REORDER_HOLD`] after it was held).
    until: Instant,
    datagram: Datagram,
}

/// The per-direction fault pipeline.
#[derive(Debug, Default)]
struct Pipeline {
    /// Held for reordering, in the order they were held.
    held: Vec<Held>,
    /// Delayed: (release time, datagram), in release order.
    delayed: VecDeque<(Instant, Datagram)>,
    /// Ready to hand on.
    ready: VecDeque<Datagram>,
}

impl Pipeline {
    fn pending(&self) -> usize {
        self.held.len() + self.delayed.len() + self.ready.len()
    }
}

/// Most datagrams the send side buffers while the inner link would block; beyond it `send`
/// takes nothing more.
const MAX_SEND_BACKLOG: usize = 65_536;

/// A [`Link`] decorator injecting faults; see the module docs.
#[derive(Debug)]
pub struct FaultInjector<L: Link> {
    inner: L,
    config: FaultConfig,
    rng: ChaCha8Rng,
    stats: Arc<FaultStats>,
    tx: Pipeline,
    rx: Pipeline,
    scratch: Vec<Datagram>,
}

impl<L: Link> FaultInjector<L> {
    /// Wraps `inner`. Errors if the configuration is invalid.
    pub fn new(inner: L, config: FaultConfig) -> Result<FaultInjector<L>, FaultConfigError> {
        config.validate()?;
        Ok(FaultInjector {
            inner,
            rng: ChaCha8Rng::seed_from_u64(config.seed),
            config,
            stats: Arc::new(FaultStats::default()),
            tx: Pipeline::default(),
            rx: Pipeline::default(),
            scratch: Vec::new(),
        })
    }

    /// The shared counters.
    pub fn stats(&self) -> Arc<FaultStats> {
        Arc::clone(&self.stats)
    }

    /// The configuration.
    pub fn config(&self) -> &FaultConfig {
        &self.config
    }

    /// The wrapped link.
    pub fn inner(&self) -> &L {
        &self.inner
    }

    /// The wrapped link, mutably.
    pub fn inner_mut(&mut self) -> &mut L {
        &mut self.inner
    }

    /// Unwraps the inner link; datagrams still held are lost (not counted).
    pub fn into_inner(self) -> L {
        self.inner
    }

    /// Datagrams held inside the injector (reorder, delay, send backlog, receive queue).
    pub fn pending(&self) -> usize {
        self.tx.pending() + self.rx.pending()
    }

    /// Runs one datagram through the fault pipeline into `pipe`.
    fn inject(&mut self, dir_tx: bool, mut d: Datagram, now: Instant) {
        let stats = Arc::clone(&self.stats);
        FaultStats::bump(&stats.inputs);
        let c = &self.config;
        if c.drop_ratio > 0.0 && self.rng.gen::<f64>() < c.drop_ratio {
            FaultStats::bump(&stats.dropped);
            return;
        }
        if c.corrupt_ratio > 0.0 && self.rng.gen::<f64>() < c.corrupt_ratio && !d.payload.is_empty()
        {
            let bit = self.rng.gen_range(0..d.payload.len() * 8);
            if let Some(byte) = d.payload.get_mut(bit / 8) {
                *byte ^= 1 << (bit % 8);
                FaultStats::bump(&stats.corrupted);
            }
        }
        let copies = if c.duplicate_ratio > 0.0 && self.rng.gen::<f64>() < c.duplicate_ratio {
            FaultStats::bump(&stats.duplicated);
            vec![d.clone(), d]
        } else {
            vec![d]
        };
        for d in copies {
            let c = &self.config;
            let hold = c.reorder_window > 0
                && c.reorder_ratio > 0.0
                && self.rng.gen::<f64>() < c.reorder_ratio;
            if hold {
                let after = self.rng.gen_range(1..=c.reorder_window);
                FaultStats::bump(&stats.reordered);
                let until = now.checked_add(MAX_REORDER_HOLD).unwrap_or(now);
                self.pipe(dir_tx).held.push(Held {
                    after,
                    until,
                    datagram: d,
                });
            } else {
                self.emit(dir_tx, d, now);
                self.release_held(dir_tx, now);
            }
        }
    }

    fn pipe(&mut self, dir_tx: bool) -> &mut Pipeline {
        if dir_tx {
            &mut self.tx
        } else {
            &mut self.rx
        }
    }

    /// One datagram went by: count down the held ones and emit those that are due.
    fn release_held(&mut self, dir_tx: bool, now: Instant) {
        for h in &mut self.pipe(dir_tx).held {
            h.after = h.after.saturating_sub(1);
        }
        self.emit_held(dir_tx, now, |h| h.after == 0);
    }

    /// Emits, in the order they were held, the held datagrams for which `due` is true.
    fn emit_held(&mut self, dir_tx: bool, now: Instant, due: impl Fn(&Held) -> bool) {
        let pipe = self.pipe(dir_tx);
        if !pipe.held.iter().any(&due) {
            return;
        }
        let (go, kept): (Vec<Held>, Vec<Held>) =
            std::mem::take(&mut pipe.held).into_iter().partition(&due);
        pipe.held = kept;
        for h in go {
            self.emit(dir_tx, h.datagram, now);
        }
    }

    /// Applies the delay, or makes the datagram ready.
    fn emit(&mut self, dir_tx: bool, d: Datagram, now: Instant) {
        let delay = self.config.delay_ms;
        let stats = Arc::clone(&self.stats);
        let pipe = self.pipe(dir_tx);
        if delay > 0 {
            FaultStats::bump(&stats.delayed);
            let at = now.checked_add(Duration::from_millis(delay)).unwrap_or(now);
            pipe.delayed.push_back((at, d));
        } else {
            pipe.ready.push_back(d);
        }
    }

    /// Releases held datagrams whose [`MAX_REORDER_HOLD`] is over (through the delay, as
    /// any released datagram), then moves delayed datagrams whose time has come to the ready
    /// queues.
    pub fn release_due(&mut self, now: Instant) {
        for dir_tx in [true, false] {
            self.emit_held(dir_tx, now, |h| h.until <= now);
        }
        for pipe in [&mut self.tx, &mut self.rx] {
            while pipe.delayed.front().is_some_and(|(at, _)| *at <= now) {
                if let Some((_, d)) = pipe.delayed.pop_front() {
                    pipe.ready.push_back(d);
                }
            }
        }
    }

    /// Releases everything held (reorder and delay) at once, in order, and tries to hand the
    /// send side to the inner link. Returns the number of datagrams still pending in the
    /// send backlog (inner link would block).
    pub fn flush(&mut self) -> io::Result<usize> {
        for pipe in [&mut self.tx, &mut self.rx] {
            for h in pipe.held.drain(..) {
                pipe.delayed.push_back((Instant::now(), h.datagram));
            }
            for (_, d) in pipe.delayed.drain(..) {
                pipe.ready.push_back(d);
            }
        }
        self.push_tx()?;
        Ok(self.tx.ready.len())
    }

    /// Hands the ready send queue to the inner link.
    fn push_tx(&mut self) -> io::Result<()> {
        while !self.tx.ready.is_empty() {
            let (front, _) = self.tx.ready.as_slices();
            let offered = front.len();
            let taken = self.inner.send(front)?.min(offered);
            self.tx.ready.drain(..taken);
            self.stats.passed.fetch_add(taken as u64, Ordering::Relaxed);
            if taken < offered {
                break;
            }
        }
        Ok(())
    }

    /// [`Link::send`] at an explicit time `now`.
    pub fn send_at(&mut self, batch: &[Datagram], now: Instant) -> io::Result<usize> {
        self.release_due(now);
        self.push_tx()?;
        if !self.config.direction.send() {
            if !self.tx.ready.is_empty() {
                return Ok(0);
            }
            let taken = self.inner.send(batch)?;
            return Ok(taken);
        }
        let room = MAX_SEND_BACKLOG.saturating_sub(self.tx.pending());
        let take = batch.len().min(room);
        for d in batch.iter().take(take) {
            self.inject(true, d.clone(), now);
        }
        self.push_tx()?;
        Ok(take)
    }

    /// Non-blocking [`Link::recv`] at an explicit time `now`.
    pub fn recv_at(
        &mut self,
        out: &mut Vec<Datagram>,
        max: usize,
        now: Instant,
    ) -> io::Result<usize> {
        self.recv_inner(out, max, now, Some(Duration::ZERO))
    }

    fn recv_inner(
        &mut self,
        out: &mut Vec<Datagram>,
        max: usize,
        now: Instant,
        timeout: Option<Duration>,
    ) -> io::Result<usize> {
        self.release_due(now);
        self.push_tx()?;
        if !self.config.direction.recv() {
            return self.inner.recv(out, max, timeout);
        }
        if self.rx.ready.is_empty() {
            let mut scratch = std::mem::take(&mut self.scratch);
            scratch.clear();
            let got = self.inner.recv(&mut scratch, max.max(1), timeout);
            for d in scratch.drain(..) {
                self.inject(false, d, now);
            }
            self.scratch = scratch;
            got?;
        }
        let n = max.min(self.rx.ready.len());
        for d in self.rx.ready.drain(..n) {
            out.push(d);
            FaultStats::bump(&self.stats.passed);
        }
        Ok(n)
    }

    /// Earliest release time of a delayed or held datagram.
    fn next_release(&self) -> Option<Instant> {
        let delayed = [self.tx.delayed.front(), self.rx.delayed.front()]
            .into_iter()
            .flatten()
            .map(|(at, _)| *at);
        let held = self.tx.held.iter().chain(&self.rx.held).map(|h| h.until);
        delayed.chain(held).min()
    }
}

impl<L: Link> Link for FaultInjector<L> {
    fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr()
    }

    /// The inner link's discards (datagrams the injector drops are in its own stats).
    fn recv_discarded(&self) -> u64 {
        self.inner.recv_discarded()
    }

    fn recycle(&mut self, payload: Vec<u8>) {
        self.inner.recycle(payload);
    }

    fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        self.inner.wait_fd()
    }

    /// The inner link's, no later than the next delayed datagram's release; [`Readiness::Now`]
    /// while datagrams wait in the receive queue, [`Readiness::Opaque`] while sends wait for
    /// the inner link (retried by `recv`).
    fn readiness(&self) -> Readiness {
        if !self.rx.ready.is_empty() {
            return Readiness::Now;
        }
        if !self.tx.ready.is_empty() {
            return Readiness::Opaque;
        }
        match self.inner.readiness() {
            Readiness::Idle { until } => Readiness::Idle {
                until: match (until, self.next_release()) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                },
            },
            other => other,
        }
    }

    /// [`FaultInjector::flush`], then the send backlog the inner link would not take is
    /// discarded and counted as `dropped`, so that once a stopping device's figures are
    /// read, `passed == inputs - dropped + duplicated` holds with nothing held. Received
    /// datagrams stay in the receive queue.
    fn flush_held(&mut self) -> io::Result<()> {
        let flushed = FaultInjector::flush(self);
        let left = self.tx.ready.len() as u64;
        if left > 0 {
            self.tx.ready.clear();
            self.stats.dropped.fetch_add(left, Ordering::Relaxed);
        }
        flushed.map(|_| ())
    }

    /// Runs each datagram through the faults and hands what comes out to the inner link.
    /// Takes every datagram unless the internal backlog (inner link blocking) is full.
    fn send(&mut self, batch: &[Datagram]) -> io::Result<usize> {
        self.send_at(batch, Instant::now())
    }

    /// Waits up to `timeout` (never past the next delayed datagram's release) for datagrams
    /// that survive the faults.
    fn recv(
        &mut self,
        out: &mut Vec<Datagram>,
        max: usize,
        timeout: Option<Duration>,
    ) -> io::Result<usize> {
        let start = Instant::now();
        let deadline = timeout.and_then(|t| start.checked_add(t));
        loop {
            let now = Instant::now();
            // Wait no longer than the deadline or the next release, whichever is first.
            let until = match (deadline, self.next_release()) {
                (Some(d), Some(r)) => Some(d.min(r)),
                (d, r) => d.or(r),
            };
            let wait = match (timeout, until) {
                (Some(t), _) if t.is_zero() => Some(Duration::ZERO),
                (_, Some(until)) => Some(until.saturating_duration_since(now)),
                (_, None) => None,
            };
            let n = self.recv_inner(out, max, now, wait)?;
            if n > 0 || max == 0 {
                return Ok(n);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) || timeout.is_some_and(|t| t.is_zero())
            {
                return Ok(0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn display_names_the_faults_that_are_on_like_the_config_keys() {
        let f = FaultConfig {
            drop_ratio: 0.02,
            reorder_ratio: 0.1,
            reorder_window: 3,
            seed: 7,
            ..FaultConfig::default()
        };
        assert_eq!(
            f.to_string(),
            "drop_ratio=0.02 reorder_ratio=0.1 reorder_window=3 seed=7 direction=send"
        );
    }
    use super::*;
    use crate::soft::link::MemoryLink;

    fn pair() -> (MemoryLink, MemoryLink, SocketAddr) {
        let a: SocketAddr = "10.0.0.1:4791".parse().expect("addr");
        let b: SocketAddr = "10.0.0.2:4791".parse().expect("addr");
        let (la, lb) = MemoryLink::pair(a, b);
        (la, lb, b)
    }

    fn numbered(dst: SocketAddr, n: u32) -> Vec<Datagram> {
        (0..n)
            .map(|i| Datagram::to(dst, i.to_be_bytes().to_vec()))
            .collect()
    }

    fn drain(link: &mut MemoryLink) -> Vec<Datagram> {
        let mut out = Vec::new();
        while link
            .recv(&mut out, usize::MAX, Some(Duration::ZERO))
            .expect("recv")
            > 0
        {}
        out
    }

    #[test]
    fn default_is_transparent() {
        let (la, mut lb, b) = pair();
        let mut f = FaultInjector::new(la, FaultConfig::default()).expect("valid");
        assert_eq!(f.send(&numbered(b, 100)).expect("send"), 100);
        let got = drain(&mut lb);
        assert_eq!(got.len(), 100);
        for (i, d) in got.iter().enumerate() {
            assert_eq!(d.payload, (i as u32).to_be_bytes());
        }
        assert_eq!(
            f.stats().snapshot(),
            FaultCounts {
                passed: 100,
                ..FaultCounts::default()
            }
        );
    }

    #[test]
    fn invalid_configs_are_rejected() {
        let bad = [
            FaultConfig {
                drop_ratio: 1.5,
                ..FaultConfig::default()
            },
            FaultConfig {
                corrupt_ratio: f64::NAN,
                ..FaultConfig::default()
            },
            FaultConfig {
                reorder_window: 4,
                ..FaultConfig::default()
            },
            FaultConfig {
                reorder_ratio: 0.1,
                ..FaultConfig::default()
            },
        ];
        for c in bad {
            assert!(c.validate().is_err(), "{c:?}");
        }
    }

    /// A device that stops calls `Link::flush_held`: datagrams held for reordering and
    /// delay go out at once, and what the inner link refuses is counted as dropped, so
    /// `passed == inputs - dropped + duplicated` with nothing left inside.
    #[test]
    fn flush_held_sends_what_is_held_and_counts_what_cannot_go() {
        let (la, mut lb, b) = pair();
        let config = FaultConfig {
            reorder_ratio: 1.0,
            reorder_window: 1000,
            seed: 3,
            ..FaultConfig::default()
        };
        let mut f: Box<dyn Link> = Box::new(FaultInjector::new(la, config).expect("valid"));
        assert_eq!(f.send(&numbered(b, 10)).expect("send"), 10);
        assert!(drain(&mut lb).is_empty(), "every datagram is held");
        f.flush_held().expect("flush");
        assert_eq!(drain(&mut lb).len(), 10);

        // An inner link that takes 4 more: the other 6 are counted as dropped.
        let a: SocketAddr = "10.0.0.1:4791".parse().expect("addr");
        let (la, mut lb) = MemoryLink::pair_bounded(a, b, 4);
        let delayed = FaultConfig {
            delay_ms: 60_000,
            seed: 3,
            ..FaultConfig::default()
        };
        let mut f = FaultInjector::new(la, delayed).expect("valid");
        let stats = f.stats();
        assert_eq!(f.send(&numbered(b, 10)).expect("send"), 10);
        Link::flush_held(&mut f).expect("flush");
        assert_eq!(f.pending(), 0);
        assert_eq!(drain(&mut lb).len(), 4);
        let s = stats.snapshot();
        assert_eq!((s.passed, s.dropped), (4, 6));
        assert_eq!(s.passed, stats.inputs() - s.dropped + s.duplicated);
    }

    #[test]
    fn reorder_releases_within_window() {
        let (la, mut lb, b) = pair();
        let config = FaultConfig {
            reorder_ratio: 0.3,
            reorder_window: 3,
            seed: 7,
            ..FaultConfig::default()
        };
        let mut f = FaultInjector::new(la, config).expect("valid");
        f.send(&numbered(b, 1000)).expect("send");
        f.flush().expect("flush");
        let got: Vec<u32> = drain(&mut lb)
            .iter()
            .map(|d| u32::from_be_bytes(d.payload[..4].try_into().expect("4 bytes")))
            .collect();
        assert_eq!(got.len(), 1000);
        let mut sorted = got.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..1000).collect::<Vec<_>>());
        assert_ne!(got, sorted, "some reordering happened");
        let s = f.stats().snapshot();
        assert!(s.reordered > 200 && s.reordered < 400, "{s:?}");
        assert_eq!(s.passed, 1000);
    }

    #[test]
    fn a_held_datagram_with_no_followers_goes_after_the_hold_time() {
        let (la, mut lb, b) = pair();
        let config = FaultConfig {
            reorder_ratio: 1.0,
            reorder_window: 3,
            seed: 5,
            ..FaultConfig::default()
        };
        let mut f = FaultInjector::new(la, config).expect("valid");
        let t0 = Instant::now();
        f.send_at(&numbered(b, 1), t0).expect("send");
        assert!(drain(&mut lb).is_empty());
        assert_eq!(f.pending(), 1);
        // What `readiness` reports to the owner as `Idle { until }` over a waitable link.
        assert_eq!(f.next_release(), Some(t0 + MAX_REORDER_HOLD));
        f.send_at(&[], t0 + MAX_REORDER_HOLD - Duration::from_millis(1))
            .expect("tick");
        assert!(drain(&mut lb).is_empty(), "released before its hold time");
        f.send_at(&[], t0 + MAX_REORDER_HOLD).expect("tick");
        assert_eq!(drain(&mut lb).len(), 1);
        assert_eq!(f.pending(), 0);
        let s = f.stats().snapshot();
        assert_eq!((s.reordered, s.passed), (1, 1), "{s:?}");
    }

    #[test]
    fn corrupt_flips_exactly_one_bit() {
        let (la, mut lb, b) = pair();
        let config = FaultConfig {
            corrupt_ratio: 1.0,
            seed: 3,
            ..FaultConfig::default()
        };
        let mut f = FaultInjector::new(la, config).expect("valid");
        let input = vec![Datagram::to(b, vec![0u8; 64]); 50];
        f.send(&input).expect("send");
        for d in drain(&mut lb) {
            let ones: u32 = d.payload.iter().map(|b| b.count_ones()).sum();
            assert_eq!(ones, 1);
        }
        assert_eq!(f.stats().snapshot().corrupted, 50);
    }

    #[test]
    fn delay_holds_until_due() {
        let (la, mut lb, b) = pair();
        let config = FaultConfig {
            delay_ms: 50,
            ..FaultConfig::default()
        };
        let mut f = FaultInjector::new(la, config).expect("valid");
        let t0 = Instant::now();
        f.send_at(&numbered(b, 3), t0).expect("send");
        assert!(drain(&mut lb).is_empty());
        assert_eq!(f.pending(), 3);
        f.send_at(&[], t0 + Duration::from_millis(49))
            .expect("tick");
        assert!(drain(&mut lb).is_empty());
        f.send_at(&[], t0 + Duration::from_millis(50))
            .expect("tick");
        assert_eq!(drain(&mut lb).len(), 3);
        assert_eq!(f.stats().snapshot().delayed, 3);
    }

    #[test]
    fn receive_direction_faults_what_arrives() {
        let (mut la, lb, b) = pair();
        let config = FaultConfig {
            drop_ratio: 0.5,
            seed: 11,
            direction: FaultDirection::Recv,
            ..FaultConfig::default()
        };
        let mut f = FaultInjector::new(lb, config).expect("valid");
        la.send(&numbered(b, 400)).expect("send");
        let mut out = Vec::new();
        while f.recv(&mut out, 64, Some(Duration::ZERO)).expect("recv") > 0 {}
        let s = f.stats().snapshot();
        assert_eq!(out.len() as u64, s.passed);
        assert_eq!(s.passed + s.dropped, 400);
        assert!(s.dropped > 120 && s.dropped < 280, "{s:?}");
    }

    fn run_all_faults(seed: u64) -> (Vec<Datagram>, FaultCounts) {
        let (la, mut lb, b) = pair();
        let config = FaultConfig {
            drop_ratio: 0.05,
            duplicate_ratio: 0.05,
            reorder_ratio: 0.1,
            reorder_window: 4,
            corrupt_ratio: 0.05,
            seed,
            ..FaultConfig::default()
        };
        let mut f = FaultInjector::new(la, config).expect("valid");
        // One instant for every batch: the reorder hold ends by count, never by the
        // [`MAX_REORDER_HOLD`] timer, so a stalled test thread cannot change the order.
        let now = Instant::now();
        for chunk in numbered(b, 5000).chunks(64) {
            assert_eq!(f.send_at(chunk, now).expect("send"), chunk.len());
        }
        assert_eq!(f.flush().expect("flush"), 0);
        let stats = f.stats().snapshot();
        (drain(&mut lb), stats)
    }

    #[test]
    fn same_seed_gives_the_same_faults() {
        let (out1, counts1) = run_all_faults(42);
        let (out2, counts2) = run_all_faults(42);
        assert_eq!(out1, out2);
        assert_eq!(counts1, counts2);
        assert!(counts1.dropped > 0 && counts1.duplicated > 0);
        assert!(counts1.reordered > 0 && counts1.corrupted > 0);
        let (out3, _) = run_all_faults(43);
        assert_ne!(out1, out3, "another seed, another fault sequence");
    }

    #[test]
    fn drop_ratio_is_near_and_counts_add_up_over_100k() {
        let (la, mut lb, b) = pair();
        let config = FaultConfig {
            drop_ratio: 0.05,
            duplicate_ratio: 0.01,
            seed: 2024,
            ..FaultConfig::default()
        };
        let mut f = FaultInjector::new(la, config).expect("valid");
        let stats = f.stats();
        let sent = 100_000u32;
        let input = numbered(b, sent);
        let mut received = 0u64;
        for chunk in input.chunks(256) {
            assert_eq!(f.send(chunk).expect("send"), chunk.len());
            received += drain(&mut lb).len() as u64;
        }
        f.flush().expect("flush");
        received += drain(&mut lb).len() as u64;
        // Read through the shared handle, as an owner in another thread would.
        let s = stats.snapshot();
        assert_eq!(received, u64::from(sent) - s.dropped + s.duplicated);
        assert_eq!(received, s.passed);
        assert_eq!(stats.inputs(), u64::from(sent));
        // Binomial(100k, 0.05): mean 5000, sd ~69; 4500..5500 is > 7 sd.
        assert!((4500..=5500).contains(&s.dropped), "{s:?}");
        assert!((700..=1300).contains(&s.duplicated), "{s:?}");
    }

    #[test]
    fn config_parses_strictly() {
        let c: FaultConfig =
            serde_json::from_str(r#"{"drop_ratio": 0.05, "seed": 9, "direction": "both"}"#)
                .expect("parse");
        assert_eq!(c.drop_ratio, 0.05);
        assert_eq!(c.direction, FaultDirection::Both);
        assert_eq!(c.delay_ms, 0);
        assert!(serde_json::from_str::<FaultConfig>(r#"{"loss": 0.1}"#).is_err());
    }
}
