//! The RoCEv2 Invariant CRC (ICRC): seal outgoing packets, verify incoming ones.
//!
//! # What is covered (IBTA Vol 1 §7.8.1; Annex A17 "RoCEv2" §A17.4.5)
//!
//! The ICRC is the standard reflected CRC-32 (polynomial `0x04C11DB7`, as zlib and
//! `crc32fast` compute it) over, in order:
//!
//! 1. 8 bytes of `0xFF` standing for the masked InfiniBand LRH;
//! 2. the IP header with the variant fields set to all ones — IPv4: TOS, TTL and header
//!    checksum; IPv6: traffic class, flow label and hop limit;
//! 3. the UDP header with its checksum set to all ones;
//! 4. the BTH with byte 4 (FECN, BECN, 6 reserved bits) set to all ones;
//! 5. everything after the BTH up to the ICRC (extension headers, payload, pad).
//!
//! The 32-bit result is appended least-significant byte first. This is what rxe computes in
//! `rxe_icrc.c` (`rxe_icrc_hdr`, seed `0xdebb20e3` = state after the 8 `0xFF` bytes) and is
//! proven against the nine packets of the rxe capture in `tests/data/rxe-uc-golden.pcap`.
//!
//! # The pseudo IP/UDP header
//!
//! A UDP socket never sees the IP header, so it is rebuilt from what the socket does tell:
//! source and destination address and port and the payload length. IPv4 headers are assumed
//! to be 20 bytes (no options; rxe makes the same assumption), with DF set and fragment
//! offset 0: rxe sets DF on every RoCEv2 packet (`rxe_net.c: prepare4`, `df = htons(IP_DF)`),
//! and `UdpLink` sends with `IP_MTU_DISCOVER = IP_PMTUDISC_DO`, which sets DF too.
//! IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`, as a dual-stack socket reports an IPv4
//! peer) are treated as IPv4, since that is what went on the wire.
//!
//! # The IPv4 Identification field
//!
//! The IPv4 Identification field is *not* masked: it is covered by the ICRC, and a UDP socket
//! can neither choose it on send nor see it on receive.
//!
//! - **Send.** For a datagram with DF set from an *unconnected* socket, Linux writes
//!   `id = 0` (`include/net/ip.h: ip_select_ident_segs()`: a connected socket uses its
//!   private counter `inet_id`; otherwise "DF set and not `ignore_df`" gives `iph->id = 0`,
//!   and only non-DF datagrams get a hashed ID from `__ip_select_ident`). `ignore_df` is false
//!   under `IP_PMTUDISC_DO`. So [`seal`] uses `id = 0`, and `UdpLink` must send with
//!   `sendto`/`sendmmsg` on an unconnected socket with `IP_PMTUDISC_DO`.
//! - **Send with UDP GSO.** The segments of one `UDP_SEGMENT` send get IDs 0, 1, 2, …
//!   (`net/ipv4/af_inet.c: inet_gso_segment()` increments the ID per segment; the fixed-ID
//!   flag is TCP's). `UdpLink` reseals segment `i` for ID `i` with [`reseal_ipv4_id`];
//!   `tests/slow/udp_gso_capture.rs` captures the segments on a veth and checks each ICRC against
//!   the ID it carries.
//! - **Receive.** rxe sends with a hashed, non-zero ID (`__ip_select_ident`; `0x3a38..` in the
//!   capture). CRC-32 is affine over GF(2): `crc(m ⊕ e) = crc(m) ⊕ L(e)` for messages of one
//!   length, with `L` linear. Flipping bit `j` of the ID changes the CRC register right after
//!   the ID by a fixed vector `c_j`, and the remaining `n` bytes multiply that difference by
//!   `x^(8n) mod P`. [`check`] therefore computes the ICRC with `id = 0`, takes the
//!   difference `d` to the received ICRC, and solves `Σ e_j·c_j = d·x^(−8n) mod P` for the 16
//!   bits `e` by elimination over GF(2) (the 16 columns are independent, so the solution is
//!   unique when it exists). A solution means the packet is consistent with *some* ID; it is
//!   reported in [`IcrcMatch::ipv4_id`].
//!
//! Consequence: on IPv4 the receive check is 16 bits weaker than a full CRC-32 (a random
//! corruption escapes with probability about 2⁻¹⁶ instead of 2⁻³²). It still rejects every
//! single-bit error in packets up to 9000 bytes (checked by the unit tests, and over every
//! bit of the captured rxe packets). IPv6 has no such field and is fully checked. Every uctel
//! frame also carries its own CRC32C over header and payload (DESIGN §3.4), so the end-to-end
//! integrity of telemetry does not rest on the ICRC.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use thiserror::Error;

use super::packet::{BTH_LEN, ICRC_LEN};

mod cache;

/// IPv4 header length assumed in the pseudo header (no options).
const IPV4_HEADER_LEN: usize = 20;
/// IPv6 fixed header length.
const IPV6_HEADER_LEN: usize = 40;
/// UDP header length.
const UDP_HEADER_LEN: usize = 8;
/// Bytes of `0xFF` standing for the masked LRH.
const MASKED_LRH_LEN: usize = 8;
/// Offset of the IPv4 Identification field in the CRC input (after the masked LRH).
const IPV4_ID_OFFSET: usize = MASKED_LRH_LEN + 4;
/// IP protocol number of UDP.
const IPPROTO_UDP: u8 = 17;

/// Why a packet could not be sealed or did not verify.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum IcrcError {
    /// The buffer is shorter than BTH + ICRC.
    #[error("packet of {len} bytes is shorter than BTH + ICRC ({min} bytes)")]
    Truncated {
        /// Buffer length.
        len: usize,
        /// Minimum length.
        min: usize,
    },
    /// One address is IPv4 and the other IPv6.
    #[error("source {src} and destination {dst} are not of the same IP version")]
    AddressFamily {
        /// Source socket address.
        src: SocketAddr,
        /// Destination socket address.
        dst: SocketAddr,
    },
    /// The packet does not fit in one IP datagram.
    #[error("packet of {len} bytes does not fit in one IP datagram")]
    TooLong {
        /// Buffer length.
        len: usize,
    },
    /// The ICRC does not match. On IPv4 `computed` is the value for IPv4 ID 0, and no
    /// other ID would match either.
    #[error("ICRC mismatch: packet carries {received:#010x}, computed {computed:#010x} ({src} -> {dst})")]
    Mismatch {
        /// ICRC carried by the packet.
        received: u32,
        /// ICRC computed (IPv4: with ID 0).
        computed: u32,
        /// Source socket address.
        src: SocketAddr,
        /// Destination socket address.
        dst: SocketAddr,
    },
}

/// The IPv4 header fields the ICRC covers but a UDP socket cannot see.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ipv4Ident {
    /// Identification field.
    pub id: u16,
    /// Don't Fragment flag (fragment offset and MF are always 0 here).
    pub dont_fragment: bool,
}

impl Ipv4Ident {
    /// What Linux puts in a DF datagram sent from an unconnected UDP socket: ID 0, DF set.
    pub const UNCONNECTED_DF: Ipv4Ident = Ipv4Ident {
        id: 0,
        dont_fragment: true,
    };
}

impl Default for Ipv4Ident {
    fn default() -> Self {
        Ipv4Ident::UNCONNECTED_DF
    }
}

/// Result of a successful [`check`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IcrcMatch {
    /// IPv4: the Identification value the packet's ICRC was computed with (0 for packets from
    /// an unconnected DF socket, rxe's hashed ID otherwise). `None` on IPv6.
    pub ipv4_id: Option<u16>,
}

enum Addrs {
    V4(Ipv4Addr, Ipv4Addr),
    V6(Ipv6Addr, Ipv6Addr),
}

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

fn addrs(src: SocketAddr, dst: SocketAddr) -> Result<Addrs, IcrcError> {
    match (canonical(src.ip()), canonical(dst.ip())) {
        (IpAddr::V4(s), IpAddr::V4(d)) => Ok(Addrs::V4(s, d)),
        (IpAddr::V6(s), IpAddr::V6(d)) => Ok(Addrs::V6(s, d)),
        _ => Err(IcrcError::AddressFamily { src, dst }),
    }
}

/// The ICRC input before the BTH: masked LRH, pseudo IP header, UDP header.
struct Prefix {
    bytes: [u8; MASKED_LRH_LEN + IPV6_HEADER_LEN + UDP_HEADER_LEN],
    len: usize,
}

fn prefix(
    buf_len: usize,
    src: SocketAddr,
    dst: SocketAddr,
    ident: Ipv4Ident,
) -> Result<Prefix, IcrcError> {
    let min = BTH_LEN + ICRC_LEN;
    if buf_len < min {
        return Err(IcrcError::Truncated { len: buf_len, min });
    }
    let too_long = IcrcError::TooLong { len: buf_len };
    let udp_len = buf_len.checked_add(UDP_HEADER_LEN).ok_or(too_long)?;
    let mut bytes = [0u8; MASKED_LRH_LEN + IPV6_HEADER_LEN + UDP_HEADER_LEN];
    bytes[..MASKED_LRH_LEN].fill(0xff);
    let ip_len = match addrs(src, dst)? {
        Addrs::V4(s, d) => {
            let total = u16::try_from(udp_len + IPV4_HEADER_LEN).map_err(|_| too_long)?;
            let frag: u16 = if ident.dont_fragment { 0x4000 } else { 0 };
            let ip = &mut bytes[MASKED_LRH_LEN..MASKED_LRH_LEN + IPV4_HEADER_LEN];
            ip[0] = 0x45; // version 4, IHL 5
            ip[1] = 0xff; // TOS, masked
            ip[2..4].copy_from_slice(&total.to_be_bytes());
            ip[4..6].copy_from_slice(&ident.id.to_be_bytes());
            ip[6..8].copy_from_slice(&frag.to_be_bytes());
            ip[8] = 0xff; // TTL, masked
            ip[9] = IPPROTO_UDP;
            ip[10..12].fill(0xff); // header checksum, masked
            ip[12..16].copy_from_slice(&s.octets());
            ip[16..20].copy_from_slice(&d.octets());
            IPV4_HEADER_LEN
        }
        Addrs::V6(s, d) => {
            let payload = u16::try_from(udp_len).map_err(|_| too_long)?;
            let ip = &mut bytes[MASKED_LRH_LEN..MASKED_LRH_LEN + IPV6_HEADER_LEN];
            // Version 6; traffic class and flow label masked.
            ip[0..4].copy_from_slice(&[0x6f, 0xff, 0xff, 0xff]);
            ip[4..6].copy_from_slice(&payload.to_be_bytes());
            ip[6] = IPPROTO_UDP;
            ip[7] = 0xff; // hop limit, masked
            ip[8..24].copy_from_slice(&s.octets());
            ip[24..40].copy_from_slice(&d.octets());
            IPV6_HEADER_LEN
        }
    };
    // udp_len fits in u16 because the IP length check above passed.
    let udp_len = u16::try_from(udp_len).map_err(|_| too_long)?;
    let udp_at = MASKED_LRH_LEN + ip_len;
    let udp = &mut bytes[udp_at..udp_at + UDP_HEADER_LEN];
    udp[0..2].copy_from_slice(&src.port().to_be_bytes());
    udp[2..4].copy_from_slice(&dst.port().to_be_bytes());
    udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
    udp[6..8].fill(0xff); // checksum, masked
    Ok(Prefix {
        bytes,
        len: udp_at + UDP_HEADER_LEN,
    })
}

/// Computes the ICRC of `buf` (one UDP payload, BTH .. ICRC; its last 4 bytes are not read)
/// as sent from `src` to `dst`, with the given IPv4 ID/DF (ignored on IPv6).
///
/// Errors: buffer shorter than BTH + ICRC, mixed address families, or too long for one IP
/// datagram.
pub fn compute_with(
    buf: &[u8],
    src: SocketAddr,
    dst: SocketAddr,
    ident: Ipv4Ident,
) -> Result<u32, IcrcError> {
    compute_flow(buf, src, dst, ident).map(|(icrc, _)| icrc)
}

/// [`compute_with`], and whether the packet went over IPv4.
fn compute_flow(
    buf: &[u8],
    src: SocketAddr,
    dst: SocketAddr,
    ident: Ipv4Ident,
) -> Result<(u32, bool), IcrcError> {
    // Checks the length first: BTH + ICRC at least.
    let (mut hasher, v4) = cache::prefix_state(buf.len(), src, dst, ident)?;
    let body_end = buf.len() - ICRC_LEN;
    let (bth, rest) = match (buf.get(..BTH_LEN), buf.get(BTH_LEN..body_end)) {
        (Some(bth), Some(rest)) => (bth, rest),
        _ => {
            return Err(IcrcError::Truncated {
                len: buf.len(),
                min: BTH_LEN + ICRC_LEN,
            })
        }
    };
    let mut masked_bth = [0u8; BTH_LEN];
    masked_bth.copy_from_slice(bth);
    masked_bth[4] = 0xff; // FECN, BECN, resv6a
    hasher.update(&masked_bth);
    hasher.update(rest);
    Ok((hasher.finalize(), v4))
}

/// [`compute_with`] for what a socket sends: IPv4 ID 0 and DF set.
pub fn compute(buf: &[u8], src: SocketAddr, dst: SocketAddr) -> Result<u32, IcrcError> {
    compute_with(buf, src, dst, Ipv4Ident::UNCONNECTED_DF)
}

/// The ICRC carried in the last 4 bytes of `buf` (least-significant byte first).
pub fn carried(buf: &[u8]) -> Option<u32> {
    let start = buf.len().checked_sub(ICRC_LEN)?;
    let bytes: [u8; ICRC_LEN] = buf.get(start..)?.try_into().ok()?;
    Some(u32::from_le_bytes(bytes))
}

/// Writes the ICRC into the last 4 bytes of `buf` (one UDP payload, BTH .. ICRC) for a
/// datagram from `src` to `dst` with the given IPv4 ID/DF.
pub fn seal_with(
    buf: &mut [u8],
    src: SocketAddr,
    dst: SocketAddr,
    ident: Ipv4Ident,
) -> Result<(), IcrcError> {
    let icrc = compute_with(buf, src, dst, ident)?;
    let start = buf.len() - ICRC_LEN;
    if let Some(tail) = buf.get_mut(start..) {
        tail.copy_from_slice(&icrc.to_le_bytes());
    }
    Ok(())
}

/// Seals `buf` for sending from `src` to `dst` through `UdpLink` (an unconnected socket with
/// `IP_PMTUDISC_DO`, so IPv4 ID 0 and DF set). `src` must be the address the kernel will
/// send from (the bound address, or the `Datagram.local` source).
pub fn seal(buf: &mut [u8], src: SocketAddr, dst: SocketAddr) -> Result<(), IcrcError> {
    seal_with(buf, src, dst, Ipv4Ident::UNCONNECTED_DF)
}

/// Checks the ICRC of a received `buf` that came from `src` to `dst`.
///
/// IPv6: a full CRC-32 comparison. IPv4: accepts if *some* Identification value makes the
/// ICRC match (DF set assumed; see the module docs) and reports it. Errors with
/// [`IcrcError::Mismatch`] otherwise.
pub fn check(buf: &[u8], src: SocketAddr, dst: SocketAddr) -> Result<IcrcMatch, IcrcError> {
    let (computed, v4) = compute_flow(buf, src, dst, Ipv4Ident::UNCONNECTED_DF)?;
    let received = carried(buf).unwrap_or(!computed);
    if received == computed {
        return Ok(IcrcMatch {
            ipv4_id: v4.then_some(0),
        });
    }
    let diff = received ^ computed;
    let id = if v4 {
        cache::ipv4_id(buf.len(), diff, || solve_general(buf.len(), diff))
    } else {
        None
    };
    match id {
        Some(id) => Ok(IcrcMatch { ipv4_id: Some(id) }),
        None => Err(IcrcError::Mismatch {
            received,
            computed,
            src,
            dst,
        }),
    }
}

/// The IPv4 ID that makes the ICRC of a `len`-byte packet differ by `diff` from its value
/// for ID 0, if any: `diff` shifted back to right after the ID bytes, then eliminated over
/// the 16 ID columns (see the module docs).
fn solve_general(len: usize, diff: u32) -> Option<u16> {
    ID_SOLVER.solve(gf2::mul_mod_p(shift_back(bytes_after_ipv4_id(len)), diff))
}

/// Bytes of ICRC input after the 2 IPv4 ID bytes, for a `len`-byte UDP payload over IPv4
/// (`len` ≥ BTH + ICRC).
fn bytes_after_ipv4_id(len: usize) -> u64 {
    let input_len = MASKED_LRH_LEN + IPV4_HEADER_LEN + UDP_HEADER_LEN + len - ICRC_LEN;
    (input_len - (IPV4_ID_OFFSET + 2)) as u64
}

/// [`check`] without the details: `Ok(())` when the ICRC holds.
pub fn verify(buf: &[u8], src: SocketAddr, dst: SocketAddr) -> Result<(), IcrcError> {
    check(buf, src, dst).map(|_| ())
}

/// Rewrites the ICRC carried in the last 4 bytes of `buf` (one UDP payload over IPv4, BTH ..
/// ICRC, sealed for IPv4 Identification `from`) to the value for Identification `to`, without
/// running the CRC over the packet again: the CRC is affine over GF(2), so the change is
/// `L(from ⊕ to)` shifted through the bytes after the ID (see the module docs), which depends
/// only on the length. Used for UDP GSO, where the kernel gives segment `i` the ID `i`
/// (`net/ipv4/af_inet.c: inet_gso_segment()`; see `crate::soft::udp`).
///
/// Errors: [`IcrcError::Truncated`] when `buf` is shorter than BTH + ICRC.
pub fn reseal_ipv4_id(buf: &mut [u8], from: u16, to: u16) -> Result<(), IcrcError> {
    let min = BTH_LEN + ICRC_LEN;
    let truncated = IcrcError::Truncated {
        len: buf.len(),
        min,
    };
    if buf.len() < min {
        return Err(truncated);
    }
    let (Some(old), Some(start)) = (carried(buf), buf.len().checked_sub(ICRC_LEN)) else {
        return Err(truncated);
    };
    let new = old ^ ipv4_id_delta(buf.len(), from ^ to);
    if let Some(tail) = buf.get_mut(start..) {
        tail.copy_from_slice(&new.to_le_bytes());
    }
    Ok(())
}

/// The change of the ICRC of a `len`-byte UDP payload over IPv4 when its Identification is
/// XORed with `id_xor`.
fn ipv4_id_delta(len: usize, id_xor: u16) -> u32 {
    let column = gf2::raw_update(0, &id_xor.to_be_bytes());
    gf2::mul_mod_p(shift_forward(bytes_after_ipv4_id(len)), column)
}

/// Lengths remembered per direction by [`shift_forward`] and [`shift_back`].
const SHIFT_CACHE: usize = 16;

thread_local! {
    /// `(n, x^(8n) mod P)` for [`shift_forward`] (first half) and `(n, x^(−8n) mod P)` for
    /// [`shift_back`] (second half), direct-mapped by `n mod 16`: a stream of packets has
    /// one or a few lengths, and the exponentiation costs a multiplication (a 32-step
    /// loop) per set bit of `n`.
    static SHIFTS: [std::cell::Cell<(u64, u32)>; 2 * SHIFT_CACHE] =
        const { [const { std::cell::Cell::new((u64::MAX, 0)) }; 2 * SHIFT_CACHE] };
}

/// `x^(8n) mod P` ([`gf2::x_pow_8n`]), remembered per thread.
fn shift_forward(n: u64) -> u32 {
    shift_cached(0, n, gf2::x_pow_8n)
}

/// `x^(−8n) mod P` ([`gf2::x_pow_neg_8n`]), remembered per thread.
fn shift_back(n: u64) -> u32 {
    shift_cached(SHIFT_CACHE, n, gf2::x_pow_neg_8n)
}

fn shift_cached(base: usize, n: u64, compute: fn(u64) -> u32) -> u32 {
    SHIFTS.with(|cells| {
        let Some(cell) = cells.get(base + (n % SHIFT_CACHE as u64) as usize) else {
            return compute(n);
        };
        match cell.get() {
            (last, v) if last == n => v,
            _ => {
                let v = compute(n);
                cell.set((n, v));
                v
            }
        }
    })
}

/// Solver for the 16 ID bits: an XOR basis of the columns `c_j` (CRC register difference
/// right after the ID bytes when ID bit `j` flips), indexed by pivot bit.
struct IdSolver {
    vecs: [u32; 32],
    combos: [u16; 32],
    present: [bool; 32],
}

impl IdSolver {
    const fn new() -> IdSolver {
        let mut s = IdSolver {
            vecs: [0; 32],
            combos: [0; 32],
            present: [false; 32],
        };
        let mut j = 0;
        while j < 16 {
            let id: u16 = 1 << j;
            let mut v = gf2::raw_update(0, &id.to_be_bytes());
            let mut combo: u16 = id;
            let mut bit = 32;
            while bit > 0 {
                bit -= 1;
                if v & (1 << bit) != 0 {
                    if s.present[bit] {
                        v ^= s.vecs[bit];
                        combo ^= s.combos[bit];
                    } else {
                        s.vecs[bit] = v;
                        s.combos[bit] = combo;
                        s.present[bit] = true;
                        break;
                    }
                }
            }
            j += 1;
        }
        s
    }

    /// The ID whose columns sum to `diff`, if any.
    fn solve(&self, mut diff: u32) -> Option<u16> {
        let mut combo = 0u16;
        for bit in (0..32).rev() {
            if diff & (1 << bit) != 0 {
                if !self.present[bit] {
                    return None;
                }
                diff ^= self.vecs[bit];
                combo ^= self.combos[bit];
            }
        }
        Some(combo)
    }

    #[cfg(test)]
    fn rank(&self) -> usize {
        self.present.iter().filter(|p| **p).count()
    }
}

static ID_SOLVER: IdSolver = IdSolver::new();

/// Arithmetic in GF(2)[x] / P for the reflected CRC-32: bit 31 of a `u32` is the coefficient
/// of `x^0`, bit 0 that of `x^31` (the representation of the CRC register itself).
mod gf2 {
    /// The reflected CRC-32 polynomial (P without its `x^32` term).
    pub(super) const POLY: u32 = 0xedb8_8320;
    /// The polynomial 1.
    pub(super) const ONE: u32 = 1 << 31;

    /// `v · x mod P`: one zero bit through the CRC register.
    pub(super) const fn mul_x(v: u32) -> u32 {
        if v & 1 != 0 {
            (v >> 1) ^ POLY
        } else {
            v >> 1
        }
    }

    /// `v · x⁻¹ mod P`, the inverse of [`mul_x`] (P has a constant term, so x is invertible).
    pub(super) const fn div_x(v: u32) -> u32 {
        if v & ONE != 0 {
            ((v ^ POLY) << 1) | 1
        } else {
            v << 1
        }
    }

    /// `a · b mod P`.
    pub(super) const fn mul_mod_p(a: u32, mut b: u32) -> u32 {
        let mut product = 0;
        let mut i = 0;
        while i < 32 {
            if a & (ONE >> i) != 0 {
                product ^= b;
            }
            b = mul_x(b);
            i += 1;
        }
        product
    }

    /// Feeds `bytes` through a CRC-32 register without the initial and final inversion:
    /// the linear part of the CRC.
    pub(super) const fn raw_update(mut state: u32, bytes: &[u8]) -> u32 {
        let mut i = 0;
        while i < bytes.len() {
            state ^= bytes[i] as u32;
            let mut k = 0;
            while k < 8 {
                state = mul_x(state);
                k += 1;
            }
            i += 1;
        }
        state
    }

    /// `x^(−8·2^k) mod P` for k = 0..64.
    const NEG_8_POW2: [u32; 64] = {
        let mut table = [0u32; 64];
        // x^-8
        let mut v = ONE;
        let mut i = 0;
        while i < 8 {
            v = div_x(v);
            i += 1;
        }
        table[0] = v;
        let mut k = 1;
        while k < 64 {
            table[k] = mul_mod_p(table[k - 1], table[k - 1]);
            k += 1;
        }
        table
    };

    /// `x^(8·2^k) mod P` for k = 0..64.
    const POS_8_POW2: [u32; 64] = {
        let mut table = [0u32; 64];
        // x^8
        let mut v = ONE;
        let mut i = 0;
        while i < 8 {
            v = mul_x(v);
            i += 1;
        }
        table[0] = v;
        let mut k = 1;
        while k < 64 {
            table[k] = mul_mod_p(table[k - 1], table[k - 1]);
            k += 1;
        }
        table
    };

    /// `x^(8n) mod P`: `n` zero bytes through the CRC register.
    pub(super) fn x_pow_8n(mut n: u64) -> u32 {
        let mut acc = ONE;
        let mut k = 0;
        while n != 0 {
            if n & 1 != 0 {
                acc = mul_mod_p(acc, POS_8_POW2[k & 63]);
            }
            n >>= 1;
            k += 1;
        }
        acc
    }

    /// `x^(−8n) mod P`: undoes `n` zero bytes through the CRC register.
    pub(super) fn x_pow_neg_8n(mut n: u64) -> u32 {
        let mut acc = ONE;
        let mut k = 0;
        while n != 0 {
            if n & 1 != 0 {
                acc = mul_mod_p(acc, NEG_8_POW2[k & 63]);
            }
            n >>= 1;
            k += 1;
        }
        acc
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::soft::packet::{BthRepr, Opcode, PacketRepr, DEFAULT_PKEY};

    fn v4(a: [u8; 4], port: u16) -> SocketAddr {
        SocketAddr::from((a, port))
    }

    fn sample(payload_len: usize) -> Vec<u8> {
        let payload: Vec<u8> = (0..payload_len).map(|i| (i * 7 + 1) as u8).collect();
        let repr = PacketRepr {
            bth: BthRepr {
                opcode: Opcode::SendOnlyWithImmediate,
                solicited: false,
                mig_req: false,
                pad_count: 0,
                pkey: DEFAULT_PKEY,
                fecn: false,
                becn: false,
                dest_qpn: 0xabc,
                ack_req: false,
                psn: crate::soft::psn::Psn::new(7),
            },
            reth: None,
            imm: Some(0x0102_0304),
            payload: &payload,
        };
        let mut buf = Vec::new();
        repr.emit(&mut buf).expect("emit");
        buf
    }

    #[test]
    fn remembered_shifts_are_the_shifts_of_their_length() {
        // Lengths alternating, repeating and changing: the remembered value is always the
        // one of the length asked for.
        // 1,108 shares 1,092's entry (n mod 16).
        for n in [
            1_092u64, 1_092, 60, 1_092, 1_108, 1_092, 0, 0, 9_000, 60, 60, 1_092,
        ] {
            assert_eq!(shift_back(n), gf2::x_pow_neg_8n(n), "n={n}");
            assert_eq!(shift_forward(n), gf2::x_pow_8n(n), "n={n}");
        }
    }

    #[test]
    fn reseal_ipv4_id_matches_sealing_with_that_id() {
        let src = v4([10, 0, 0, 1], 4791);
        let dst = v4([10, 0, 0, 2], 4791);
        for len in [0usize, 1, 100, 1033, 4096] {
            let mut a = sample(len);
            seal(&mut a, src, dst).expect("seal");
            for id in [1u16, 2, 63, 0x3a38, u16::MAX] {
                let mut b = a.clone();
                reseal_ipv4_id(&mut b, 0, id).expect("reseal");
                let mut want = a.clone();
                let ident = Ipv4Ident {
                    id,
                    dont_fragment: true,
                };
                seal_with(&mut want, src, dst, ident).expect("seal_with");
                assert_eq!(b, want, "len {len} id {id}");
                assert_eq!(check(&b, src, dst).expect("check").ipv4_id, Some(id));
                reseal_ipv4_id(&mut b, id, 0).expect("back");
                assert_eq!(b, a);
            }
        }
        assert!(matches!(
            reseal_ipv4_id(&mut [0u8; 15], 0, 1),
            Err(IcrcError::Truncated { len: 15, .. })
        ));
    }

    #[test]
    fn gf2_helpers_agree_with_brute_force() {
        assert_eq!(gf2::div_x(gf2::mul_x(0x1234_5678)), 0x1234_5678);
        assert_eq!(gf2::mul_mod_p(gf2::ONE, 0xdead_beef), 0xdead_beef);
        // raw CRC register through n zero bytes, undone by x^-8n.
        for n in [0u64, 1, 2, 3, 17, 1000, 9000] {
            let v = 0x8765_4321;
            let zeros = vec![0u8; n as usize];
            let through = gf2::raw_update(v, &zeros);
            assert_eq!(gf2::mul_mod_p(gf2::x_pow_neg_8n(n), through), v, "n={n}");
        }
        // raw_update matches crc32fast (init/final inversion aside).
        let data = b"123456789";
        assert_eq!(!gf2::raw_update(!0, data), 0xcbf4_3926);
        assert_eq!(crc32fast::hash(data), 0xcbf4_3926);
    }

    #[test]
    fn id_columns_are_independent() {
        assert_eq!(ID_SOLVER.rank(), 16);
    }

    #[test]
    fn seal_then_verify_v4_and_v6() {
        let (a, b) = (v4([127, 0, 0, 1], 50000), v4([127, 0, 0, 2], 4791));
        let mut buf = sample(100);
        seal(&mut buf, a, b).expect("seal");
        assert_eq!(check(&buf, a, b), Ok(IcrcMatch { ipv4_id: Some(0) }));
        // Wrong port or address fails.
        assert!(verify(&buf, v4([127, 0, 0, 1], 50001), b).is_err());
        assert!(verify(&buf, a, v4([127, 0, 0, 3], 4791)).is_err());

        let (a6, b6): (SocketAddr, SocketAddr) = (
            "[fd00::1]:50000".parse().expect("addr"),
            "[fd00::2]:4791".parse().expect("addr"),
        );
        let mut buf6 = sample(100);
        seal(&mut buf6, a6, b6).expect("seal");
        assert_eq!(check(&buf6, a6, b6), Ok(IcrcMatch { ipv4_id: None }));
        buf6[20] ^= 1;
        assert!(matches!(
            verify(&buf6, a6, b6),
            Err(IcrcError::Mismatch { .. })
        ));
        assert!(matches!(
            verify(&buf6, a, b6),
            Err(IcrcError::AddressFamily { .. })
        ));
    }

    #[test]
    fn mapped_addresses_are_ipv4() {
        let (a, b) = (v4([10, 0, 0, 1], 1), v4([10, 0, 0, 2], 4791));
        let am: SocketAddr = "[::ffff:10.0.0.1]:1".parse().expect("addr");
        let bm: SocketAddr = "[::ffff:10.0.0.2]:4791".parse().expect("addr");
        let mut buf = sample(8);
        seal(&mut buf, a, b).expect("seal");
        assert_eq!(check(&buf, am, bm), Ok(IcrcMatch { ipv4_id: Some(0) }));
    }

    #[test]
    fn any_ipv4_id_is_recovered() {
        let (a, b) = (v4([10, 99, 0, 1], 52215), v4([10, 99, 0, 2], 4791));
        for len in [0usize, 4, 32, 1024, 4096] {
            for id in [1u16, 0x3a38, 0x8000, 0xffff, 0x1234] {
                let mut buf = sample(len);
                seal_with(
                    &mut buf,
                    a,
                    b,
                    Ipv4Ident {
                        id,
                        dont_fragment: true,
                    },
                )
                .expect("seal");
                assert_eq!(
                    check(&buf, a, b),
                    Ok(IcrcMatch { ipv4_id: Some(id) }),
                    "len {len} id {id:#x}"
                );
            }
        }
    }

    #[test]
    fn every_single_bit_flip_is_rejected() {
        let (a, b) = (v4([10, 99, 0, 1], 52215), v4([10, 99, 0, 2], 4791));
        let mut buf = sample(60);
        seal_with(
            &mut buf,
            a,
            b,
            Ipv4Ident {
                id: 0x3a38,
                dont_fragment: true,
            },
        )
        .expect("seal");
        for bit in 0..buf.len() * 8 {
            if bit / 8 == 4 {
                continue; // BTH byte 4 (FECN/BECN/resv6a) is masked by design.
            }
            let mut c = buf.clone();
            c[bit / 8] ^= 1 << (bit % 8);
            assert!(verify(&c, a, b).is_err(), "bit {bit} undetected");
        }
    }

    /// Only the distance between an error and the ID matters: an error bit followed by `r`
    /// more input bits changes the final register by `x^r · f` (`f` = the effect of flipping
    /// the last input bit), and pulling that back to just after the ID multiplies by
    /// `x^(−8n)`, leaving `x^(−t) · f` for the distance `t` in bits. A flip of the carried
    /// ICRC bit `b` changes the difference by `1 << b` directly, pulled back by `x^(−8n)`.
    /// None of these may lie in the span of the ID columns for any packet up to 9000 bytes:
    /// that is every single-bit error of every such packet, checked in the algebra.
    #[test]
    fn no_single_bit_error_hides_in_the_id_up_to_9000_bytes() {
        let max_bytes = 9000 + MASKED_LRH_LEN + IPV4_HEADER_LEN + UDP_HEADER_LEN;
        let f = gf2::raw_update(0, &[0x80]);
        let mut v = f;
        for t in 1..=max_bytes * 8 {
            v = gf2::div_x(v);
            assert!(ID_SOLVER.solve(v).is_none(), "error {t} bits after the ID");
        }
        for b in 0..32 {
            let mut v = 1u32 << b;
            for n in 0..=max_bytes {
                assert!(ID_SOLVER.solve(v).is_none(), "ICRC bit {b}, n {n}");
                for _ in 0..8 {
                    v = gf2::div_x(v);
                }
            }
        }
    }
}
