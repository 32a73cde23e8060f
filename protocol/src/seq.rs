//! Wrap-aware frame sequence numbers.
//!
//! [`Seq`] is a connection or stream sequence (DESIGN.md §3: `conn_seq` and `stream_seq` are
//! 64-bit header fields) with serial-number arithmetic instead of integer order, so every
//! comparison stays right across `u64::MAX → 0`. It is a plain `u64` underneath
//! (`#[repr(transparent)]`, every method `const` and inlined): using it costs nothing over
//! the hand-written `wrapping_sub` it replaces. The wire formats do not change: headers carry
//! the `u64`, the RDMA immediate (ImmDt) its low 32 bits.
//!
//! # Rules and their sources
//!
//! * **Comparison: RFC 1982 §3.2** with `SERIAL_BITS = 64`, in the practical two's-complement
//!   form: `a` is after `b` when `a − b` (mod 2^64) is in `1 .. 2^63`. RFC 1982 leaves the
//!   pair at exactly `2^63` apart undefined; here neither is after the other
//!   ([`Seq::serial_cmp`] returns `None`), and callers that must decide treat the midpoint as
//!   *behind* (the tracker's "stale", the credit window's "old report").
//! * **Addition: RFC 1982 §3.1**, `s + n (mod 2^64)`; the RFC allows `n` up to
//!   `2^63 − 1`, this wraps for any `n` (the callers add 1 or a bounded count).
//! * **Distance:** [`Seq::since`] is `self − earlier (mod 2^64)`, the forward count of the
//!   `u64` space; [`Seq::forward_from`] is that count only when `self` is not behind
//!   (`0 .. 2^63`); [`Seq::distance`] the signed two's-complement difference.
//! * **32 → 64-bit extension: RFC 3550 Appendix A.1**, where a receiver widens the 16-bit RTP
//!   sequence with a `cycles` count of wraps (`extended = cycles + seq`). Here the 32-bit
//!   immediate of a Write-with-immediate is widened to the 64-bit sequence: the upper 32 bits
//!   are the cycle count ([`Seq::cycles`]), the lower 32 bits the immediate
//!   ([`Seq::low32`]). Instead of A.1's `max_seq` / `cycles` bookkeeping, [`Seq::extend`]
//!   picks the candidate nearest a reference (the highest sequence seen), which is the same
//!   rule for a receiver that never falls `2^31` frames behind and needs no state of its own.
use std::cmp::Ordering;

/// Half of the 64-bit sequence space (RFC 1982 `2^(SERIAL_BITS − 1)`).
pub const HALF: u64 = 1 << 63;

/// A 64-bit frame sequence number with serial-number arithmetic (module docs: RFC 1982
/// comparison and addition, RFC 3550 A.1-style 32 → 64-bit extension).
///
/// `Ord` is deliberately not implemented: serial order is not a total order. Use
/// [`is_after`](Seq::is_after), [`is_before`](Seq::is_before) or
/// [`serial_cmp`](Seq::serial_cmp).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(transparent)]
pub struct Seq(u64);

impl Seq {
    /// Sequence 0 (where the agent starts each connection and stream in every epoch).
    pub const ZERO: Seq = Seq(0);

    /// The sequence with value `v`.
    #[inline]
    pub const fn new(v: u64) -> Seq {
        Seq(v)
    }

    /// The value as carried in the frame header.
    #[inline]
    pub const fn get(self) -> u64 {
        self.0
    }

    /// `self + n (mod 2^64)` (RFC 1982 §3.1 addition).
    #[inline]
    #[must_use]
    pub const fn add(self, n: u64) -> Seq {
        Seq(self.0.wrapping_add(n))
    }

    /// `self − n (mod 2^64)`.
    #[inline]
    #[must_use]
    pub const fn sub(self, n: u64) -> Seq {
        Seq(self.0.wrapping_sub(n))
    }

    /// The next sequence, `self + 1 (mod 2^64)`.
    #[inline]
    #[must_use]
    pub const fn next(self) -> Seq {
        self.add(1)
    }

    /// The previous sequence, `self − 1 (mod 2^64)`.
    #[inline]
    #[must_use]
    pub const fn prev(self) -> Seq {
        self.sub(1)
    }

    /// The forward count from `earlier` to `self`: `self − earlier (mod 2^64)`, in
    /// `0 ..= u64::MAX`. With `earlier` the first sequence of a run, `since + 1` is the
    /// run's length.
    #[inline]
    pub const fn since(self, earlier: Seq) -> u64 {
        self.0.wrapping_sub(earlier.0)
    }

    /// The signed distance `self − other` in two's complement: positive when `self` is
    /// after `other`, negative when before, `i64::MIN` at the undefined midpoint `2^63`.
    #[inline]
    #[allow(clippy::cast_possible_wrap)]
    pub const fn distance(self, other: Seq) -> i64 {
        self.since(other) as i64
    }

    /// [`since`](Seq::since) when `self` is not behind `other` (`0 .. 2^63`: equal or
    /// after), `None` when it is behind or at the midpoint.
    #[inline]
    pub const fn forward_from(self, other: Seq) -> Option<u64> {
        let d = self.since(other);
        if d < HALF {
            Some(d)
        } else {
            None
        }
    }

    /// `self` is after `other` (RFC 1982 §3.2: `self − other` in `1 .. 2^63`).
    #[inline]
    pub const fn is_after(self, other: Seq) -> bool {
        let d = self.since(other);
        d != 0 && d < HALF
    }

    /// `self` is before `other` (`other` is after `self`).
    #[inline]
    pub const fn is_before(self, other: Seq) -> bool {
        other.is_after(self)
    }

    /// RFC 1982 §3.2 comparison: `Some(Less | Equal | Greater)`, or `None` for two sequences
    /// exactly `2^63` apart, which the RFC leaves undefined.
    #[inline]
    pub const fn serial_cmp(self, other: Seq) -> Option<Ordering> {
        match self.since(other) {
            0 => Some(Ordering::Equal),
            HALF => None,
            d if d < HALF => Some(Ordering::Greater),
            _ => Some(Ordering::Less),
        }
    }

    /// The low 32 bits: the immediate (ImmDt) that announces this sequence on a
    /// Write-with-immediate (DESIGN.md §4).
    #[inline]
    #[allow(clippy::cast_possible_truncation)]
    pub const fn low32(self) -> u32 {
        self.0 as u32
    }

    /// The upper 32 bits: how many times the 32-bit immediate has wrapped (RFC 3550 A.1
    /// `cycles`, counted in wraps rather than shifted).
    #[inline]
    #[allow(clippy::cast_possible_truncation)]
    pub const fn cycles(self) -> u32 {
        (self.0 >> 32) as u32
    }

    /// The sequence with cycle count `cycles` and immediate `low` (RFC 3550 A.1
    /// `extended = cycles + seq`).
    #[inline]
    pub const fn from_parts(cycles: u32, low: u32) -> Seq {
        Seq(((cycles as u64) << 32) | low as u64)
    }

    /// Widen a 32-bit immediate `low` to the 64-bit sequence nearest `self` whose low 32
    /// bits are `low`: `self + δ (mod 2^64)` where `δ` is `low − low32(self)` read as a signed
    /// 32-bit value, so the result lies in `self − 2^31 ..= self + 2^31 − 1` (RFC 1982 on 32
    /// bits: the midpoint counts as behind). It crosses 2^32 boundaries (the cycle count
    /// moves by one) in both directions and wraps at `u64::MAX`/0 like every other
    /// operation here.
    #[inline]
    #[must_use]
    #[allow(clippy::cast_possible_wrap, clippy::cast_sign_loss)]
    pub const fn extend(self, low: u32) -> Seq {
        let delta = low.wrapping_sub(self.low32()) as i32;
        Seq(self.0.wrapping_add(delta as i64 as u64))
    }
}

impl From<u64> for Seq {
    #[inline]
    fn from(v: u64) -> Seq {
        Seq(v)
    }
}

impl From<Seq> for u64 {
    #[inline]
    fn from(s: Seq) -> u64 {
        s.0
    }
}

impl std::fmt::Display for Seq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO32: u64 = 1 << 32;

    fn s(v: u64) -> Seq {
        Seq::new(v)
    }

    #[test]
    fn comparison_is_serial_across_the_wrap() {
        assert!(s(0).is_after(s(u64::MAX)));
        assert!(s(u64::MAX).is_before(s(0)));
        assert!(s(5).is_after(s(u64::MAX - 5)));
        assert!(!s(7).is_after(s(7)));
        assert!(!s(7).is_before(s(7)));
        // The midpoint: neither after nor before, and no ordering (RFC 1982 §3.2).
        assert!(!s(HALF).is_after(s(0)));
        assert!(!s(0).is_after(s(HALF)));
        assert_eq!(s(HALF).serial_cmp(s(0)), None);
        assert_eq!(s(HALF - 1).serial_cmp(s(0)), Some(Ordering::Greater));
        assert_eq!(s(HALF + 1).serial_cmp(s(0)), Some(Ordering::Less));
        assert_eq!(s(3).serial_cmp(s(3)), Some(Ordering::Equal));
    }

    #[test]
    fn distances() {
        assert_eq!(s(2).since(s(u64::MAX)), 3);
        assert_eq!(s(u64::MAX).since(s(2)), u64::MAX - 2);
        assert_eq!(s(2).distance(s(u64::MAX)), 3);
        assert_eq!(s(u64::MAX).distance(s(2)), -3);
        assert_eq!(s(HALF).distance(s(0)), i64::MIN);
        assert_eq!(s(2).forward_from(s(u64::MAX)), Some(3));
        assert_eq!(s(4).forward_from(s(4)), Some(0));
        assert_eq!(s(u64::MAX).forward_from(s(2)), None);
        assert_eq!(s(HALF).forward_from(s(0)), None);
        assert_eq!(s(u64::MAX).next(), s(0));
        assert_eq!(s(0).prev(), s(u64::MAX));
        assert_eq!(s(u64::MAX - 1).add(3), s(1));
        assert_eq!(s(1).sub(3), s(u64::MAX - 1));
    }

    #[test]
    fn parts_and_extension() {
        let x = s(5 * TWO32 + 9);
        assert_eq!((x.cycles(), x.low32()), (5, 9));
        assert_eq!(Seq::from_parts(5, 9), x);
        assert_eq!(s(0).extend(5), s(5));
        assert_eq!(s(TWO32 - 1).extend(0), s(TWO32));
        assert_eq!(s(TWO32 - 1).extend(u32::MAX - 3), s(TWO32 - 4));
        assert_eq!(s(TWO32 + 2).extend(u32::MAX), s(TWO32 - 1));
        assert_eq!(s(5 * TWO32).extend(1 << 31), s(5 * TWO32 - (1 << 31)));
        assert_eq!(
            s(5 * TWO32).extend((1 << 31) - 1),
            s(5 * TWO32 + (1 << 31) - 1)
        );
        // Wraps at the ends of the 64-bit space.
        assert_eq!(s(u64::MAX).extend(0), s(0));
        assert_eq!(s(0).extend(u32::MAX), s(u64::MAX));
        assert_eq!(u64::from(Seq::from(7u64)), 7);
        assert_eq!(s(42).to_string(), "42");
    }
}
