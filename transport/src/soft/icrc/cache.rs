//! Per-thread memory of the ICRC's per-flow and per-length work, so that a packet costs the
//! CRC over its own bytes and a few table lookups.
//!
//! * **Prefix state.** The masked LRH, the pseudo IP header and the UDP header depend only on
//!   the addresses, the length and the IPv4 ID/DF: the CRC state after them is kept for the
//!   last flows seen (direct-mapped by source address, port and length), so a packet runs the CRC
//!   over its BTH and payload only. The 36 to 56 prefix bytes went through crc32fast's
//!   byte-table path on every packet before.
//! * **IPv4 ID tables.** For one packet length the map from IPv4 ID to ICRC difference is
//!   linear (see the parent module), so it and its inverse are tabulated by byte: the ID
//!   of a difference is four lookups and its proof two more, where the general solver
//!   multiplies by `x^(−8n)` and eliminates over 32 pivots bit by bit. Tables are built for
//!   a length the second time in a row it misses on its way, so a stream of one length
//!   (every segment of a GSO send carries a new ID) pays once and lengths that never repeat
//!   never pay the build; a way's tables are replaced at most once per [`REBUILD_AFTER`]
//!   solves on it, so lengths that take turns cost at most a build (a few µs) per 64
//!   packets on top of the general solver.

use std::cell::RefCell;
use std::net::SocketAddr;

use super::{addrs, ipv4_id_delta, prefix, Addrs, IcrcError, Ipv4Ident};

/// Flows remembered per thread (direct-mapped).
const PREFIX_WAYS: usize = 8;
/// Packet lengths with ID tables per thread (direct-mapped); 4 KiB each.
const ID_WAYS: usize = 4;
/// Solves on a way before its tables may be replaced by another length's.
const REBUILD_AFTER: u32 = 64;

#[derive(Clone, Copy, PartialEq, Eq)]
struct FlowKey {
    src: SocketAddr,
    dst: SocketAddr,
    len: usize,
    ident: Ipv4Ident,
}

/// The CRC state after a flow's prefix, and whether the flow is IPv4.
#[derive(Clone)]
struct PrefixState {
    key: FlowKey,
    hasher: crc32fast::Hasher,
    v4: bool,
}

/// The ID ↔ difference maps of one packet length.
struct IdTables {
    len: usize,
    /// `fwd[k][b]`: the ICRC difference when ID byte `k` (0: low) is `b` and the other is 0.
    fwd: [[u32; 256]; 2],
    /// `inv[k][b]`: the ID bits whose pivot lies in byte `k` of the difference, for byte
    /// value `b` (reduced echelon form: a pivot bit is set in its own row only).
    inv: [[u16; 256]; 4],
}

impl IdTables {
    fn build(len: usize) -> Box<IdTables> {
        #[cfg(test)]
        BUILDS.with(|b| b.set(b.get() + 1));
        let mut t = Box::new(IdTables {
            len,
            fwd: [[0; 256]; 2],
            inv: [[0; 256]; 4],
        });
        let cols: [u32; 16] = std::array::from_fn(|j| ipv4_id_delta(len, 1 << j));
        for (k, table) in t.fwd.iter_mut().enumerate() {
            for (b, entry) in table.iter_mut().enumerate() {
                *entry = (0..8)
                    .filter(|bit| b & (1 << bit) != 0)
                    .fold(0, |acc, bit| acc ^ cols[8 * k + bit]);
            }
        }
        // Rows (vector, ID bits) with the highest set bit as pivot, each pivot bit set in
        // its own row only.
        let mut rows: Vec<(u32, u16)> = Vec::with_capacity(16);
        for (j, &col) in cols.iter().enumerate() {
            let (mut v, mut combo) = (col, 1u16 << j);
            for &(rv, rc) in &rows {
                if v & (1 << (31 - rv.leading_zeros())) != 0 {
                    v ^= rv;
                    combo ^= rc;
                }
            }
            if v == 0 {
                // The 16 columns are independent at every length (parent module's tests).
                continue;
            }
            let pivot = 31 - v.leading_zeros();
            for row in rows.iter_mut() {
                if row.0 & (1 << pivot) != 0 {
                    row.0 ^= v;
                    row.1 ^= combo;
                }
            }
            rows.push((v, combo));
        }
        for (v, combo) in rows {
            let pivot = 31 - v.leading_zeros();
            let (k, bit) = ((pivot / 8) as usize, pivot % 8);
            for (b, entry) in t.inv[k].iter_mut().enumerate() {
                if b & (1 << bit) != 0 {
                    *entry ^= combo;
                }
            }
        }
        t
    }

    fn solve(&self, diff: u32) -> Option<u16> {
        let [d0, d1, d2, d3] = diff.to_le_bytes();
        let id = self.inv[0][usize::from(d0)]
            ^ self.inv[1][usize::from(d1)]
            ^ self.inv[2][usize::from(d2)]
            ^ self.inv[3][usize::from(d3)];
        let [lo, hi] = id.to_le_bytes();
        (self.fwd[0][usize::from(lo)] ^ self.fwd[1][usize::from(hi)] == diff).then_some(id)
    }
}

struct IdWay {
    tables: Option<Box<IdTables>>,
    /// The length of this way's last miss.
    missed: Option<usize>,
    /// Solves on this way since its tables were built.
    solves: u32,
}

impl IdWay {
    const EMPTY: IdWay = IdWay {
        tables: None,
        missed: None,
        solves: 0,
    };
}

thread_local! {
    static PREFIXES: RefCell<[Option<PrefixState>; PREFIX_WAYS]> =
        const { RefCell::new([const { None }; PREFIX_WAYS]) };
    // Both const-initialized: an access is no lazy-initialization check.
    static ID_TABLES: RefCell<[IdWay; ID_WAYS]> = const { RefCell::new([IdWay::EMPTY; ID_WAYS]) };
}

#[cfg(test)]
thread_local! {
    /// Tables built on this thread.
    static BUILDS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The CRC state after the prefix of a `len`-byte packet from `src` to `dst` with `ident`,
/// and whether it is IPv4. Errors as [`super::compute_with`].
pub(super) fn prefix_state(
    len: usize,
    src: SocketAddr,
    dst: SocketAddr,
    ident: Ipv4Ident,
) -> Result<(crc32fast::Hasher, bool), IcrcError> {
    let key = FlowKey {
        src,
        dst,
        len,
        ident,
    };
    let way = flow_way(src, len);
    let hit = PREFIXES.with(|p| {
        p.borrow()
            .get(way)
            .and_then(Option::as_ref)
            .filter(|s| s.key == key)
            .map(|s| (s.hasher.clone(), s.v4))
    });
    if let Some(hit) = hit {
        return Ok(hit);
    }
    let p = prefix(len, src, dst, ident)?;
    let v4 = matches!(addrs(src, dst)?, Addrs::V4(..));
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(p.bytes.get(..p.len).unwrap_or_default());
    PREFIXES.with(|p| {
        if let Some(slot) = p.borrow_mut().get_mut(way) {
            *slot = Some(PrefixState {
                key,
                hasher: hasher.clone(),
                v4,
            });
        }
    });
    Ok((hasher, v4))
}

/// The prefix cache's way of a flow: its source address, port and length mixed.
fn flow_way(src: SocketAddr, len: usize) -> usize {
    let ip = match src.ip() {
        std::net::IpAddr::V4(v4) => u32::from(v4),
        std::net::IpAddr::V6(v6) => {
            let o = v6.octets();
            u32::from_be_bytes([o[12], o[13], o[14], o[15]])
        }
    };
    let mixed = (ip ^ u32::from(src.port()).rotate_left(8) ^ len as u32).wrapping_mul(0x9e37_79b1);
    (mixed >> 29) as usize % PREFIX_WAYS
}

/// The IPv4 ID that makes a `len`-byte packet's ICRC differ by `diff` from its value for ID
/// 0, if any: from the length's tables when it has them, else from `general`.
pub(super) fn ipv4_id(len: usize, diff: u32, general: impl FnOnce() -> Option<u16>) -> Option<u16> {
    ID_TABLES.with(|ways| {
        let mut ways = ways.borrow_mut();
        let Some(way) = ways.get_mut(len % ID_WAYS) else {
            return general();
        };
        way.solves = way.solves.saturating_add(1);
        if let Some(t) = way.tables.as_ref().filter(|t| t.len == len) {
            return t.solve(diff);
        }
        let may_build = way.tables.is_none() || way.solves >= REBUILD_AFTER;
        if way.missed == Some(len) && may_build {
            let t = IdTables::build(len);
            let id = t.solve(diff);
            way.tables = Some(t);
            way.missed = None;
            way.solves = 0;
            return id;
        }
        way.missed = Some(len);
        general()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic xorshift sequence (no dependency on a random crate here).
    fn xorshift(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    #[test]
    fn tables_agree_with_the_general_solver() {
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        for len in [16usize, 17, 64, 1045, 1049, 4132, 8999] {
            let t = IdTables::build(len);
            // Every ID's difference solves back to it.
            for id in (0..=u16::MAX).step_by(251).chain([1, 2, 31, u16::MAX]) {
                let diff = ipv4_id_delta(len, id);
                assert_eq!(t.solve(diff), Some(id), "len {len} id {id}");
                assert_eq!(super::super::solve_general(len, diff), Some(id));
            }
            // Arbitrary differences: the tables answer exactly as the general solver.
            for _ in 0..20_000 {
                let diff = xorshift(&mut s) as u32;
                assert_eq!(
                    t.solve(diff),
                    super::super::solve_general(len, diff),
                    "len {len} diff {diff:#x}"
                );
            }
        }
    }

    #[test]
    fn tables_are_built_on_the_second_miss_of_a_length() {
        let len = 777;
        let diff = ipv4_id_delta(len, 5);
        let mut general_calls = 0;
        for _ in 0..4 {
            let id = ipv4_id(len, diff, || {
                general_calls += 1;
                super::super::solve_general(len, diff)
            });
            assert_eq!(id, Some(5));
        }
        assert_eq!(
            general_calls, 1,
            "the first miss solves in general, then tables"
        );
        // Two lengths alternating on one way never build: the general solver answers.
        let (a, b) = (1000, 1000 + ID_WAYS);
        let mut calls = 0;
        for i in 0..6 {
            let len = if i % 2 == 0 { a } else { b };
            let d = ipv4_id_delta(len, 9);
            let id = ipv4_id(len, d, || {
                calls += 1;
                super::super::solve_general(len, d)
            });
            assert_eq!(id, Some(9));
        }
        assert_eq!(calls, 6);
        // Two lengths on one way taking turns in pairs: a build at most once per
        // REBUILD_AFTER solves, the general solver in between.
        let (a, b) = (2000, 2000 + ID_WAYS);
        let before = BUILDS.with(std::cell::Cell::get);
        let packets = 64 * REBUILD_AFTER as usize;
        for i in 0..packets {
            let len = if (i / 2) % 2 == 0 { a } else { b };
            let d = ipv4_id_delta(len, 3);
            assert_eq!(
                ipv4_id(len, d, || super::super::solve_general(len, d)),
                Some(3)
            );
        }
        let builds = BUILDS.with(std::cell::Cell::get) - before;
        assert!(
            builds <= (packets / REBUILD_AFTER as usize) as u64 + 1,
            "{builds} builds for {packets} packets"
        );
        assert!(
            builds >= 2,
            "both lengths got tables in turn ({builds} builds)"
        );
    }

    #[test]
    fn a_remembered_prefix_is_the_computed_one() {
        let src: SocketAddr = "10.0.0.1:4791".parse().unwrap();
        let dst: SocketAddr = "10.0.0.2:4791".parse().unwrap();
        let other: SocketAddr = "[2001:db8::1]:4791".parse().unwrap();
        for (s, d) in [(src, dst), (other, "[2001:db8::2]:9".parse().unwrap())] {
            for len in [16usize, 1045] {
                for ident in [
                    Ipv4Ident::UNCONNECTED_DF,
                    Ipv4Ident {
                        id: 7,
                        dont_fragment: false,
                    },
                ] {
                    let p = prefix(len, s, d, ident).unwrap();
                    let mut want = crc32fast::Hasher::new();
                    want.update(&p.bytes[..p.len]);
                    for _ in 0..2 {
                        let (got, v4) = prefix_state(len, s, d, ident).unwrap();
                        assert_eq!(got.finalize(), want.clone().finalize());
                        assert_eq!(v4, s.is_ipv4());
                    }
                }
            }
        }
        // Errors are not remembered as states.
        assert!(prefix_state(4, src, dst, Ipv4Ident::UNCONNECTED_DF).is_err());
        assert!(prefix_state(100, src, other, Ipv4Ident::UNCONNECTED_DF).is_err());
    }
}
