//! Credits written into the agent's memory (DESIGN.md §4 "Credits", §6): the agent
//! registers a small memory region at `Hello` ([`CreditMr`]) and the collector grants
//! credit with a UC RDMA WRITE (no immediate: it consumes no receive WR and makes no
//! completion at the agent, IBTA §9.4.3 / rxe `RXE_WRITE_MASK`) of one [`CreditWord`].
//!
//! The word holds absolute values only — the grant (its sequence and limit, as a
//! [`super::CreditGrant`]) and the first connection sequence not yet consumed — so a write is
//! idempotent and the newest wins: a write that is lost is superseded by the next one (the
//! collector writes again at every report interval), a duplicate changes nothing, and an
//! older write that arrives after a newer one is recognised by its smaller grant sequence
//! and consumed point (both only grow) and changes nothing either.
//!
//! Layout, [`CREDIT_WORD_BYTES`] bytes, little-endian `u64`s:
//!
//! ```text
//!   0  generation       the agent's epoch of this session (Hello.epoch): a word written
//!                       for another session never applies
//!   8  grant_sequence   CreditGrant.sequence
//!  16  grant_limit      CreditGrant.limit: send connection sequence c only while c < limit
//!  24  consumed_next    one past the highest connection sequence consumed (0: none yet)
//!  32  check            a 64-bit mix of the four words above and a constant
//! ```
//!
//! The agent's CPU reads the word while the NIC may be writing it: a read that sees part of
//! one write and part of another (a torn read; verbs does not make a 40-byte write atomic
//! towards the CPU) fails the check and is ignored until the next read. Memory never
//! written (all zeros) fails it too.

use super::{invalid, InvalidMessage};

/// `Hello.credit_mr`: a region that holds a word.
pub(super) fn check_mr(mr: Option<&CreditMr>) -> Result<(), InvalidMessage> {
    match mr {
        Some(mr) if (mr.length as usize) < CREDIT_WORD_BYTES => Err(invalid(
            "Hello",
            "credit_mr.length",
            format!(
                "{} is below the {CREDIT_WORD_BYTES}-byte credit word",
                mr.length
            ),
        )),
        _ => Ok(()),
    }
}

/// `Welcome.credit_writes`: both periods at least 1.
pub(super) fn check_writes(w: Option<&CreditWrites>) -> Result<(), InvalidMessage> {
    match w {
        Some(w) if w.refresh_ms == 0 || w.report_every_intervals == 0 => Err(invalid(
            "Welcome",
            "credit_writes",
            format!(
                "refresh_ms {} and report_every_intervals {} must be ≥ 1",
                w.refresh_ms, w.report_every_intervals
            ),
        )),
        _ => Ok(()),
    }
}

/// Bytes of one [`CreditWord`].
pub const CREDIT_WORD_BYTES: usize = 40;

/// Bytes the agent registers for its credit word ([`CreditMr::length`] is at least
/// [`CREDIT_WORD_BYTES`]; the rest is room for later fields).
pub const CREDIT_MR_BYTES: u32 = 64;

/// Agent → collector, in `Hello`: where the collector may write the agent's credit word
/// ([`CreditWord`]). `None` in `Hello`: an agent without the feature; its credits travel in
/// `Report`s only.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct CreditMr {
    /// Virtual address of the word (RETH VA).
    #[prost(uint64, tag = "1")]
    pub addr: u64,
    /// rkey of the region (REMOTE_WRITE only).
    #[prost(uint32, tag = "2")]
    pub rkey: u32,
    /// Bytes of the region, at least [`CREDIT_WORD_BYTES`].
    #[prost(uint32, tag = "3")]
    pub length: u32,
}

/// Collector → agent, in `Welcome`: the collector writes credit words into the agent's
/// [`CreditMr`]. `None` in `Welcome`: a collector without the feature (or one that turned it
/// off); the agent takes its credits from `Report`s only.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct CreditWrites {
    /// The longest time between two writes, milliseconds (≥ 1): the collector writes again
    /// at least this often even when nothing changed, so a lost write is superseded within
    /// it.
    #[prost(uint32, tag = "1")]
    pub refresh_ms: u32,
    /// `Report`s come every this many report intervals (≥ 1) while credits are written; the
    /// early report an agent out of credit asks for is a write only.
    #[prost(uint32, tag = "2")]
    pub report_every_intervals: u32,
}

/// One credit word; see the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CreditWord {
    /// The agent's epoch of the session (`Hello.epoch`).
    pub generation: u64,
    /// The grant's sequence (`CreditGrant.sequence`).
    pub grant_sequence: u64,
    /// The grant's limit (`CreditGrant.limit`).
    pub grant_limit: u64,
    /// One past the highest connection sequence consumed; 0 before the first.
    pub consumed_next: u64,
}

/// Constant of the check, so that all-zero memory does not pass.
const CHECK_SEED: u64 = 0x7563_7465_6c63_7764; // "uctelcwd"

/// A 64-bit mix (splitmix64's finaliser) folded over the fields.
fn check(fields: [u64; 4]) -> u64 {
    let mut h = CHECK_SEED;
    for f in fields {
        h ^= f;
        h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h ^= h >> 31;
        h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
        h ^= h >> 29;
    }
    h
}

impl CreditWord {
    fn fields(&self) -> [u64; 4] {
        [
            self.generation,
            self.grant_sequence,
            self.grant_limit,
            self.consumed_next,
        ]
    }

    /// The [`CREDIT_WORD_BYTES`] bytes written into the agent's region.
    pub fn encode(&self) -> [u8; CREDIT_WORD_BYTES] {
        let mut out = [0u8; CREDIT_WORD_BYTES];
        let fields = self.fields();
        for (i, f) in fields.iter().chain([check(fields)].iter()).enumerate() {
            out[i * 8..i * 8 + 8].copy_from_slice(&f.to_le_bytes());
        }
        out
    }

    /// The word in `bytes` (at least [`CREDIT_WORD_BYTES`]); `None` when they are too short,
    /// were never written, or were read torn (the check does not match).
    pub fn decode(bytes: &[u8]) -> Option<CreditWord> {
        let bytes = bytes.get(..CREDIT_WORD_BYTES)?;
        let mut f = [0u64; 5];
        for (i, chunk) in bytes.chunks_exact(8).enumerate() {
            f[i] = u64::from_le_bytes(chunk.try_into().ok()?);
        }
        let word = CreditWord {
            generation: f[0],
            grant_sequence: f[1],
            grant_limit: f[2],
            consumed_next: f[3],
        };
        (check(word.fields()) == f[4]).then_some(word)
    }

    /// The grant the word carries.
    pub fn grant(&self) -> super::CreditGrant {
        super::CreditGrant {
            sequence: self.grant_sequence,
            limit: self.grant_limit,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_word_round_trips_and_zero_memory_is_no_word() {
        let w = CreditWord {
            generation: 0xdead_beef,
            grant_sequence: 7,
            grant_limit: 1234,
            consumed_next: 1200,
        };
        assert_eq!(CreditWord::decode(&w.encode()), Some(w));
        assert_eq!(CreditWord::decode(&[0u8; CREDIT_WORD_BYTES]), None);
        assert_eq!(CreditWord::decode(&w.encode()[..39]), None);
        // A zero word (all fields 0) is still a valid word once written.
        let z = CreditWord::default();
        assert_eq!(CreditWord::decode(&z.encode()), Some(z));
    }

    #[test]
    fn a_torn_read_fails_the_check() {
        let wa = CreditWord {
            generation: 5,
            grant_sequence: 1,
            grant_limit: 10,
            consumed_next: 3,
        };
        let wb = CreditWord {
            generation: 5,
            grant_sequence: 2,
            grant_limit: 40,
            consumed_next: 9,
        };
        let (a, b) = (wa.encode(), wb.encode());
        // Every split of the new write over the old one, either way round: the read is the
        // old word, the new word, or nothing; never a mix.
        let mut refused = 0;
        for cut in 1..CREDIT_WORD_BYTES {
            for (first, second) in [(a, b), (b, a)] {
                let mut torn = second;
                torn[..cut].copy_from_slice(&first[..cut]);
                let got = CreditWord::decode(&torn);
                assert!(
                    got.is_none() || got == Some(wa) || got == Some(wb),
                    "cut {cut}: {got:?}"
                );
                refused += usize::from(got.is_none());
            }
        }
        assert!(refused > 40, "{refused}");
        for bit in 0..CREDIT_WORD_BYTES * 8 {
            let mut flipped = b;
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(CreditWord::decode(&flipped).is_none(), "bit {bit}");
        }
    }
}
