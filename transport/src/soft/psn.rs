//! [`Psn`]: the 24-bit packet sequence number of the BTH, with arithmetic modulo 2^24.
//!
//! The model is smoltcp's `TcpSeqNumber`: a newtype whose addition wraps in the number's own
//! space and whose comparison is wrap-aware. The rules are IBTA Vol 1 9.7.1 ("Packet Sequence
//! Numbers"): a PSN is 24 bits, every packet of a QP takes the next one, and after 2^24 − 1
//! comes 0; the responder compares PSNs modulo 2^24, so of two PSNs the later is the one less
//! than half the space (2^23) ahead. rxe does the same (`psn_compare` in `rxe_loc.h`: the sign
//! of `(a - b) << 8` as a 32-bit integer).
//!
//! UC needs only equality and `+ 1` (a packet either carries the expected PSN or the responder
//! resyncs, `crate::soft::engine`); the distance and the order are there for tests, logs and
//! rules that look at how far apart two PSNs are.

use std::cmp::Ordering;
use std::fmt;
use std::ops;

use crate::api::PSN_MASK;

/// A 24-bit packet sequence number (IBTA Vol 1 9.2 BTH `PSN`, 9.7.1).
///
/// Always below 2^24: [`Psn::new`] keeps the low 24 bits. `psn + n` wraps modulo 2^24;
/// `a - b` is the signed distance from `b` to `a`, in `-2^23..2^23`; `a < b` when `a` is
/// less than half the space behind `b`. The order is partial: two PSNs exactly 2^23 apart are
/// neither before nor after each other (`partial_cmp` is `None`).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Psn(u32);

impl Psn {
    /// PSN 0.
    pub const ZERO: Psn = Psn(0);
    /// The largest PSN, 2^24 − 1; the next one is [`Psn::ZERO`].
    pub const MAX: Psn = Psn(PSN_MASK);

    /// The PSN of the low 24 bits of `value` (as `set_psn` writes it into a BTH).
    pub const fn new(value: u32) -> Psn {
        Psn(value & PSN_MASK)
    }

    /// The PSN as a number in `0..2^24`.
    pub const fn value(self) -> u32 {
        self.0
    }

    /// `self + n` modulo 2^24.
    pub const fn wrapping_add(self, n: u32) -> Psn {
        Psn(self.0.wrapping_add(n) & PSN_MASK)
    }

    /// The PSN after this one (`self + 1`; 2^24 − 1 is followed by 0).
    pub const fn next(self) -> Psn {
        self.wrapping_add(1)
    }

    /// The signed distance from `other` to `self` modulo 2^24, in `-2^23..2^23`: positive
    /// when `self` is ahead. Exactly half the space apart reads as `-2^23` (as in rxe's
    /// `psn_compare`).
    pub const fn distance(self, other: Psn) -> i32 {
        // The 24-bit difference moved to the top of a 32-bit word, then shifted back with
        // sign extension.
        ((self.0.wrapping_sub(other.0) << 8) as i32) >> 8
    }
}

impl ops::Add<u32> for Psn {
    type Output = Psn;

    /// `self + rhs` modulo 2^24.
    fn add(self, rhs: u32) -> Psn {
        self.wrapping_add(rhs)
    }
}

impl ops::AddAssign<u32> for Psn {
    fn add_assign(&mut self, rhs: u32) {
        *self = self.wrapping_add(rhs);
    }
}

impl ops::Sub for Psn {
    type Output = i32;

    /// [`Psn::distance`]: how far `self` is ahead of `rhs` (negative when behind).
    fn sub(self, rhs: Psn) -> i32 {
        self.distance(rhs)
    }
}

impl PartialOrd for Psn {
    /// Wrap-aware: `a < b` when `b` is less than 2^23 ahead of `a`; `None` for PSNs exactly
    /// 2^23 apart, which the 24-bit space cannot order.
    fn partial_cmp(&self, other: &Psn) -> Option<Ordering> {
        match self.distance(*other) {
            0 => Some(Ordering::Equal),
            d if d == -(1 << 23) => None,
            d if d > 0 => Some(Ordering::Greater),
            _ => Some(Ordering::Less),
        }
    }
}

impl From<Psn> for u32 {
    fn from(psn: Psn) -> u32 {
        psn.0
    }
}

impl fmt::Debug for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Psn({:#08x})", self.0)
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_keeps_24_bits() {
        assert_eq!(Psn::new(0x0123_4567).value(), 0x23_4567);
        assert_eq!(Psn::new(1 << 24), Psn::ZERO);
        assert_eq!(Psn::new(u32::MAX), Psn::MAX);
        assert_eq!(u32::from(Psn::new(7)), 7);
    }

    #[test]
    fn addition_wraps_at_2_pow_24() {
        assert_eq!(Psn::MAX.next(), Psn::ZERO);
        assert_eq!(Psn::MAX + 1, Psn::ZERO);
        assert_eq!(Psn::new(0xff_fffe) + 3, Psn::new(1));
        assert_eq!(Psn::ZERO + PSN_MASK, Psn::MAX);
        assert_eq!(
            Psn::new(5) + (1 << 24),
            Psn::new(5),
            "adding 2^24 is a full turn"
        );
        assert_eq!(Psn::new(5) + u32::MAX, Psn::new(4));
        let mut p = Psn::new(0xff_ffff);
        p += 2;
        assert_eq!(p, Psn::new(1));
    }

    #[test]
    fn distance_is_signed_and_wrap_aware() {
        assert_eq!(Psn::ZERO - Psn::MAX, 1);
        assert_eq!(Psn::MAX - Psn::ZERO, -1);
        assert_eq!(Psn::new(5) - Psn::new(3), 2);
        assert_eq!(Psn::new(3) - Psn::new(5), -2);
        assert_eq!(Psn::new(2) - Psn::new(0xff_fffd), 5);
        assert_eq!(Psn::new(7) - Psn::new(7), 0);
        // The two ends of the range: just under half the space ahead, and exactly half.
        assert_eq!(Psn::new((1 << 23) - 1) - Psn::ZERO, (1 << 23) - 1);
        assert_eq!(Psn::new(1 << 23) - Psn::ZERO, -(1 << 23));
        assert_eq!(Psn::ZERO - Psn::new(1 << 23), -(1 << 23));
        for (a, n) in [(0u32, 1u32), (0xff_ff00, 0x200), (0x12_3456, (1 << 23) - 1)] {
            assert_eq!(Psn::new(a) + n - Psn::new(a), n as i32, "{a:#x} + {n:#x}");
        }
    }

    #[test]
    fn order_is_wrap_aware_and_partial() {
        assert!(Psn::MAX < Psn::ZERO, "0 follows 2^24 - 1");
        assert!(Psn::ZERO > Psn::MAX);
        assert!(Psn::new(3) < Psn::new(5));
        assert!(Psn::new(0xff_fff0) < Psn::new(0x10));
        assert!(Psn::new(0x10) > Psn::new(0xff_fff0));
        assert!(Psn::new(4) <= Psn::new(4));
        assert_eq!(Psn::ZERO.partial_cmp(&Psn::new(1 << 23)), None);
        assert_eq!(Psn::new(1 << 23).partial_cmp(&Psn::ZERO), None);
        assert!(Psn::ZERO < Psn::new((1 << 23) - 1));
        assert!(Psn::ZERO > Psn::new((1 << 23) + 1));
    }

    proptest::proptest! {
        /// For any PSN and any step less than half the space, the step comes back as the
        /// distance and the order agrees with its sign, across the wrap too.
        #[test]
        fn distance_inverts_addition(a in 0u32..(1 << 24), n in 0u32..(1 << 23)) {
            let a = Psn::new(a);
            let b = a + n;
            proptest::prop_assert_eq!(b - a, n as i32);
            proptest::prop_assert_eq!(a - b, -(n as i32));
            proptest::prop_assert_eq!(b.partial_cmp(&a), Some(n.cmp(&0)));
            proptest::prop_assert_eq!(b + ((1 << 24) - n), a);
        }
    }

    #[test]
    fn formats_as_six_hex_digits() {
        assert_eq!(Psn::new(0xab).to_string(), "0x0000ab");
        assert_eq!(format!("{:?}", Psn::MAX), "Psn(0xffffff)");
    }
}
