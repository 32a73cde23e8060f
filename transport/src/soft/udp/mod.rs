//! `UdpLink`: the soft transport's [`Link`] over a real UDP socket, batched.
//!
//! - Receive: `recvmmsg(2)` into preallocated buffers, up to [`UdpConfig::batch`] datagrams
//!   per system call; `IP_PKTINFO` / `IPV6_RECVPKTINFO` so [`Datagram::local`] tells the
//!   destination address even when bound to a wildcard address (the ICRC covers it).
//! - Send: `sendmmsg(2)` on an *unconnected* socket, consecutive datagrams with the same
//!   source in one call (or `UDP_SEGMENT`, below); an explicit [`Datagram::local`] source
//!   IP is passed as an `IP_PKTINFO` / `IPV6_PKTINFO` control message.
//! - `IP_MTU_DISCOVER = IP_PMTUDISC_DO` (and `IPV6_MTU_DISCOVER`): DF is set and nothing is
//!   fragmented locally. With DF set on an unconnected socket Linux sends IPv4 ID 0
//!   (`ip_select_ident_segs()`), which is what [`crate::soft::icrc::seal`] assumes. A datagram
//!   larger than the path MTU fails with `EMSGSIZE` and is dropped and counted.
//! - GSO ([`UdpConfig::gso`], `UDP_SEGMENT`, `include/uapi/linux/udp.h`): a run of
//!   consecutive datagrams with the same source, the same destination and the same length
//!   (the last may be shorter) is copied into one buffer and sent with one `sendmsg` whose
//!   `UDP_SEGMENT` control message gives that length as the segment size, at most 64
//!   segments and 65,000 bytes per call. The kernel (`net/ipv4/udp_offload.c:
//!   __udp_gso_segment()`) or the NIC cuts it back into datagrams. Other datagrams go through
//!   `sendmmsg` as before. The socket option is probed at bind; a send the kernel refuses
//!   as unsupported (`EIO`, `EINVAL`, `ENOPROTOOPT`, `EOPNOTSUPP`) switches GSO off for the
//!   link (logged once), and any refused GSO send is sent again through `sendmmsg`, which
//!   sends or counts each datagram.
//! - GSO and the IPv4 ID: the kernel gives the segments of one GSO send consecutive IPv4
//!   IDs starting from the ID of the whole buffer, which is 0 here (`ip_select_ident_segs()`
//!   as above): `inet_gso_segment()` in `net/ipv4/af_inet.c` writes `iph->id = htons(id++)`
//!   for each segment unless `SKB_GSO_TCP_FIXEDID`, which only TCP sets. A NIC that
//!   segments UDP itself (`NETIF_F_GSO_UDP_L4`) is expected to number them the same way as
//!   the software path; that is not checked here on hardware. The ICRC covers the ID, so
//!   segment `i` must be sealed for ID `i`: the link rewrites the ICRC of segment `i ≥ 1` with
//!   [`crate::soft::icrc::reseal_ipv4_id`] in its copy, when the datagram verifies as sealed
//!   for ID 0 on this path (payloads that are not sealed RoCEv2 packets are sent untouched).
//!   Proven on the wire by `tests/slow/udp_gso_capture.rs` (veth pair, software segmentation,
//!   `AF_PACKET` capture: IDs 0, 1, 2, … and every ICRC valid for its captured ID). The
//!   resealing needs the source address, so a wildcard-bound link sends IPv4 datagrams
//!   without an explicit [`Datagram::local`] through `sendmmsg`; IPv6 has no ID.
//! - GRO ([`UdpConfig::gro`], `UDP_GRO`): the kernel may coalesce datagrams of one flow
//!   (`udp_gro_receive()` in `net/ipv4/udp_offload.c`; on loopback a GSO buffer reaches a
//!   GRO socket whole) into one buffer and tells the segment size in a `UDP_GRO` control
//!   message. Receive slots are 64 KiB then, and the link splits each such buffer into
//!   datagrams, each handed out as `recvmmsg` would have handed it alone (same peer and
//!   local address); datagrams beyond the caller's `max` wait in the buffers for the next
//!   `recv`. [`Link::recv_each`] hands them out as views into the buffers, uncopied; `recv`
//!   copies each into a payload buffer. If `setsockopt(UDP_GRO)` fails the link receives as
//!   before.
//! - Waiting: [`PollMode::Blocking`] sleeps in `poll(2)`; [`PollMode::BusyPoll`] spins on
//!   non-blocking `recvmmsg` (lowest latency, burns a core).
//! - Socket buffers (`SO_RCVBUF`/`SO_SNDBUF`) are enlarged; above `net.core.rmem_max` /
//!   `wmem_max` the `*FORCE` variants are tried (they need `CAP_NET_ADMIN`), and the sizes the
//!   kernel granted are readable afterwards.
//!
//! Every datagram that is taken and not sent, or received and not delivered, is counted in
//! [`UdpCounts`] with a [`UdpDropReason`].
//!
//! [`UdpSink`] is a bare `recvmmsg` loop that discards what it reads: the baseline for
//! benchmarks (how many messages per second the kernel hands to user space at a given size).

use std::io::{self, IoSlice, IoSliceMut};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{
    cmsg_space, recvmmsg, sendmmsg, sendmsg, setsockopt, sockopt, ControlMessage,
    ControlMessageOwned, MsgFlags, MultiHeaders, SockaddrLike, SockaddrStorage,
};
use serde::Deserialize;
use socket2::{Domain, Protocol, Socket, Type};

use super::icrc;
use super::link::{Datagram, DatagramView, Link, Readiness};
use crate::api::ROCE_V2_UDP_PORT;

mod sink;
pub use sink::{SinkStats, UdpSink};

/// How [`UdpLink::recv`] waits for datagrams.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PollMode {
    /// Sleep in `poll(2)` until a datagram arrives or the timeout passes.
    #[default]
    Blocking,
    /// Spin on non-blocking `recvmmsg(2)` until a datagram arrives or the timeout passes.
    BusyPoll,
}

/// Configuration of a [`UdpLink`].
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UdpConfig {
    /// Address and port to bind; default `0.0.0.0:4791` (4791 = IANA RoCEv2 port). Port 0
    /// picks an ephemeral port.
    pub bind: SocketAddr,
    /// `SO_RCVBUF` request in bytes; `None` keeps the system default.
    pub recv_buffer_bytes: Option<usize>,
    /// `SO_SNDBUF` request in bytes; `None` keeps the system default.
    pub send_buffer_bytes: Option<usize>,
    /// Most datagrams per `recvmmsg`/`sendmmsg` call (1..=1024).
    pub batch: usize,
    /// Receive buffer per datagram in bytes; larger datagrams are dropped and counted
    /// ([`UdpDropReason::RecvTruncated`]). Default 9216 (jumbo frames; RoCE's largest packet
    /// at 4096 MTU is 4132 bytes of UDP payload).
    pub max_datagram_bytes: usize,
    /// How `recv` waits.
    pub poll_mode: PollMode,
    /// For an IPv6 wildcard bind: accept only IPv6 (`IPV6_V6ONLY`). Default false
    /// (dual-stack: IPv4 peers appear as `::ffff:a.b.c.d`).
    pub only_v6: bool,
    /// UDP generic segmentation offload on send (`UDP_SEGMENT`, `include/uapi/linux/udp.h`;
    /// the kernel splits in `net/ipv4/udp_offload.c: __udp_gso_segment()`, or the NIC does):
    /// a run of consecutive datagrams to one peer from one source and of one length (the last
    /// may be shorter) goes to the kernel in one `sendmsg` of at most 64 segments and 65,000
    /// bytes. Default true. Probed at bind and switched off for the link when the kernel
    /// refuses it; then every datagram goes through `sendmmsg` as with false.
    pub gso: bool,
    /// UDP generic receive offload (`UDP_GRO`, `include/uapi/linux/udp.h`; coalescing in
    /// `net/ipv4/udp_offload.c: udp_gro_receive()`): the kernel may hand several datagrams of
    /// one flow as one buffer, with the segment size in a `UDP_GRO` control message; the link
    /// splits it back into the datagrams. Each receive slot is then 64 KiB (instead of
    /// `max_datagram_bytes`). Default true; false when `setsockopt(UDP_GRO)` fails.
    pub gro: bool,
}

impl Default for UdpConfig {
    fn default() -> Self {
        UdpConfig {
            bind: SocketAddr::from((Ipv4Addr::UNSPECIFIED, ROCE_V2_UDP_PORT)),
            recv_buffer_bytes: Some(8 << 20),
            send_buffer_bytes: Some(4 << 20),
            batch: 64,
            max_datagram_bytes: 9216,
            poll_mode: PollMode::Blocking,
            only_v6: false,
            gso: true,
            gro: true,
        }
    }
}

impl UdpConfig {
    /// The default configuration bound to `bind`.
    pub fn bound_to(bind: SocketAddr) -> UdpConfig {
        UdpConfig {
            bind,
            ..UdpConfig::default()
        }
    }
}

/// Why a datagram was dropped inside a [`UdpLink`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UdpDropReason {
    /// Received datagram larger than `max_datagram_bytes` (`MSG_TRUNC`).
    RecvTruncated,
    /// Send refused with `EMSGSIZE`: larger than the path MTU (DF is set).
    SendTooBig,
    /// Send refused: no route (`ENETUNREACH`, `EHOSTUNREACH`, `EADDRNOTAVAIL`).
    SendUnreachable,
    /// Send refused for another per-datagram reason (`EINVAL`, `EAFNOSUPPORT`, `EPERM`,
    /// `EACCES`, `ECONNREFUSED`).
    SendRejected,
}

impl UdpDropReason {
    /// All reasons, for exporting counters.
    pub const ALL: [UdpDropReason; 4] = [
        UdpDropReason::RecvTruncated,
        UdpDropReason::SendTooBig,
        UdpDropReason::SendUnreachable,
        UdpDropReason::SendRejected,
    ];

    /// Label value, snake_case.
    pub const fn as_str(self) -> &'static str {
        match self {
            UdpDropReason::RecvTruncated => "recv_truncated",
            UdpDropReason::SendTooBig => "send_too_big",
            UdpDropReason::SendUnreachable => "send_unreachable",
            UdpDropReason::SendRejected => "send_rejected",
        }
    }
}

/// Datagram counters of one [`UdpLink`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UdpCounts {
    /// Datagrams the kernel accepted for sending.
    pub sent: u64,
    /// Datagrams delivered to the caller of `recv`.
    pub received: u64,
    /// `recvmmsg` / `sendmmsg` system calls that moved at least one datagram.
    pub recv_calls: u64,
    /// See `recv_calls`.
    pub send_calls: u64,
    /// Drops by [`UdpDropReason::RecvTruncated`].
    pub recv_truncated: u64,
    /// Drops by [`UdpDropReason::SendTooBig`].
    pub send_too_big: u64,
    /// Drops by [`UdpDropReason::SendUnreachable`].
    pub send_unreachable: u64,
    /// Drops by [`UdpDropReason::SendRejected`].
    pub send_rejected: u64,
    /// `UDP_SEGMENT` sends the kernel accepted (one buffer of several datagrams each; they
    /// count in `send_calls` and their datagrams in `sent` too).
    pub gso_sends: u64,
    /// Coalesced `UDP_GRO` buffers received and split into datagrams (their datagrams count
    /// in `received`).
    pub gro_buffers: u64,
}

impl UdpCounts {
    /// The drop counter for `reason`.
    pub fn dropped(&self, reason: UdpDropReason) -> u64 {
        match reason {
            UdpDropReason::RecvTruncated => self.recv_truncated,
            UdpDropReason::SendTooBig => self.send_too_big,
            UdpDropReason::SendUnreachable => self.send_unreachable,
            UdpDropReason::SendRejected => self.send_rejected,
        }
    }

    fn count_drop(&mut self, reason: UdpDropReason) {
        match reason {
            UdpDropReason::RecvTruncated => self.recv_truncated += 1,
            UdpDropReason::SendTooBig => self.send_too_big += 1,
            UdpDropReason::SendUnreachable => self.send_unreachable += 1,
            UdpDropReason::SendRejected => self.send_rejected += 1,
        }
    }
}

/// Most datagrams per system call.
const MAX_BATCH: usize = 1024;

/// Most datagrams in one `UDP_SEGMENT` send (the kernel's `UDP_MAX_SEGMENTS` is 64 in
/// `include/linux/udp.h` up to Linux 6.8, 128 after).
const GSO_MAX_SEGMENTS: usize = 64;

/// Most payload bytes in one `UDP_SEGMENT` send: below the 65,535-byte IP length limit less
/// the IPv6 and UDP headers.
const GSO_MAX_BYTES: usize = 65_000;

/// Receive slot with `UDP_GRO` on: the largest coalesced buffer (`gro_max_size`, 64 KiB).
const GRO_SLOT_BYTES: usize = 1 << 16;

/// Segment size the bind-time `UDP_SEGMENT` probe sets (then resets to 0).
const GSO_PROBE_BYTES: libc::c_int = 1200;

/// Fewest datagrams a `recvmmsg` of [`UdpLink`] asks for while the batch adapts (see
/// `UdpLink::recv_slots`).
const MIN_RECV_SLOTS: usize = 8;

/// A [`Link`] over one UDP socket. See the module docs.
#[derive(Debug)]
pub struct UdpLink {
    socket: UdpSocket,
    local: SocketAddr,
    config: UdpConfig,
    bufs: Vec<Vec<u8>>,
    /// Payload buffers given back with [`Link::recycle`], refilled by the next receive (at
    /// most `batch` kept, `batch` × 64 with `UDP_GRO`), so a steady receive loop allocates
    /// no payload.
    pool: Vec<Vec<u8>>,
    /// Per-call metadata of the last `recvmmsg`, kept to reuse its allocation.
    metas: Vec<RecvMeta>,
    /// Datagrams the next `recvmmsg` asks for (`MIN_RECV_SLOTS..=batch`): doubled after a
    /// call that filled every slot, halved after one that filled less than half. The message
    /// headers and control buffers are built per call, and their cost grows with the slots,
    /// so a lightly loaded socket (a few datagrams per wake-up) is read with a short vector
    /// and a backlog with the full batch.
    recv_slots: usize,
    counts: UdpCounts,
    recv_buffer_bytes: usize,
    send_buffer_bytes: usize,
    /// `UDP_SEGMENT` in use: `config.gso`, the bind probe passed, no send refused it since.
    gso: bool,
    /// `UDP_GRO` in use: `config.gro` and the socket option was accepted.
    gro: bool,
    /// The buffer a `UDP_SEGMENT` send is assembled in, kept for its allocation.
    gso_buf: Vec<u8>,
    /// The next datagram of the last `recvmmsg` to hand out: datagrams split out of a
    /// coalesced buffer beyond what the caller asked for wait in the receive buffers and
    /// are handed out first by the next `recv`.
    cursor: RecvCursor,
}

/// Where [`UdpLink`]'s next datagram starts in its receive buffers.
#[derive(Clone, Copy, Debug, Default)]
struct RecvCursor {
    /// Index into `metas`.
    meta: usize,
    /// Byte offset into that buffer.
    offset: usize,
}

impl RecvCursor {
    /// On to the start of the next buffer.
    fn next_buffer(&mut self) {
        *self = RecvCursor {
            meta: self.meta + 1,
            offset: 0,
        };
    }
}

/// A received buffer that passed the checks (not truncated, a source reported), with what
/// every datagram in it shares, settled once when the `recvmmsg` results are read.
#[derive(Debug)]
struct RecvMeta {
    /// Index into the receive buffers.
    index: usize,
    len: usize,
    peer: SocketAddr,
    /// The destination, in the socket's family.
    local: SocketAddr,
    /// Length of each datagram in the buffer (the last may be shorter): the `UDP_GRO`
    /// segment size of a coalesced buffer, else the whole length (at least 1, so that a
    /// zero-length datagram is handed out once).
    segment: usize,
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// Creates the socket: options, buffers, bind; non-blocking.
fn open_socket(config: &UdpConfig) -> io::Result<(UdpSocket, usize, usize)> {
    let domain = Domain::for_address(config.bind);
    let socket = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?;
    let v6 = config.bind.is_ipv6();
    if v6 {
        socket.set_only_v6(config.only_v6)?;
    }
    let fd = socket.as_fd();
    let dual_stack = v6 && !config.only_v6;
    if !v6 || dual_stack {
        rustix::net::sockopt::set_ip_mtu_discover(
            fd,
            rustix::net::sockopt::Ipv4PathMtuDiscovery::DO,
        )?;
        setsockopt(&fd, sockopt::Ipv4PacketInfo, &true)?;
    }
    if v6 {
        rustix::net::sockopt::set_ipv6_mtu_discover(
            fd,
            rustix::net::sockopt::Ipv6PathMtuDiscovery::DO,
        )?;
        setsockopt(&fd, sockopt::Ipv6RecvPacketInfo, &true)?;
    }
    if let Some(bytes) = config.recv_buffer_bytes {
        socket.set_recv_buffer_size(bytes)?;
        // The kernel reports twice the granted value; below the request means rmem_max
        // capped it: try the privileged variant, ignore EPERM.
        if socket.recv_buffer_size()? < bytes {
            let _ = setsockopt(&fd, sockopt::RcvBufForce, &bytes);
        }
    }
    if let Some(bytes) = config.send_buffer_bytes {
        socket.set_send_buffer_size(bytes)?;
        if socket.send_buffer_size()? < bytes {
            let _ = setsockopt(&fd, sockopt::SndBufForce, &bytes);
        }
    }
    socket.set_nonblocking(true)?;
    socket.bind(&config.bind.into())?;
    let recv = socket.recv_buffer_size()?;
    let send = socket.send_buffer_size()?;
    Ok((socket.into(), recv, send))
}

fn to_socket_addr(addr: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = addr.as_sockaddr_in() {
        return Some(SocketAddr::V4(SocketAddrV4::from(*v4)));
    }
    addr.as_sockaddr_in6()
        .map(|v6| SocketAddr::V6(SocketAddrV6::from(*v6)))
}

/// Maps an IPv4 destination to `::ffff:a.b.c.d` for a dual-stack IPv6 socket.
fn for_family(addr: SocketAddr, socket_v6: bool) -> SocketAddr {
    match (addr, socket_v6) {
        (SocketAddr::V4(v4), true) => {
            SocketAddr::V6(SocketAddrV6::new(v4.ip().to_ipv6_mapped(), v4.port(), 0, 0))
        }
        _ => addr,
    }
}

fn classify_send_error(errno: Errno) -> Option<UdpDropReason> {
    match errno {
        Errno::EMSGSIZE => Some(UdpDropReason::SendTooBig),
        Errno::ENETUNREACH | Errno::EHOSTUNREACH | Errno::EADDRNOTAVAIL => {
            Some(UdpDropReason::SendUnreachable)
        }
        Errno::EINVAL
        | Errno::EAFNOSUPPORT
        | Errno::EPERM
        | Errno::EACCES
        | Errno::ECONNREFUSED => Some(UdpDropReason::SendRejected),
        _ => None,
    }
}

/// Whether the kernel takes `UDP_SEGMENT` on this socket: sets the socket-wide segment size
/// and resets it to 0 (no segmentation unless a send's control message asks). `Ok(false)`
/// when the option is refused (kernels before 4.18, or no UDP GSO support); an error only
/// when the reset fails after the set worked (the socket would segment every send).
fn probe_gso(fd: BorrowedFd<'_>) -> io::Result<bool> {
    if setsockopt(&fd, sockopt::UdpGsoSegment, &GSO_PROBE_BYTES).is_err() {
        return Ok(false);
    }
    setsockopt(&fd, sockopt::UdpGsoSegment, &0)?;
    Ok(true)
}

/// An `IP_PKTINFO` / `IPV6_PKTINFO` source address for a send, or none.
enum PktInfo {
    None,
    V4(libc::in_pktinfo),
    V6(libc::in6_pktinfo),
}

impl PktInfo {
    /// The control message choosing source `src` on a socket of family `v6` (an IPv4
    /// source on a dual-stack socket as `::ffff:a.b.c.d`).
    fn new(src: Option<IpAddr>, v6: bool) -> PktInfo {
        match src {
            None => PktInfo::None,
            Some(IpAddr::V4(ip)) if !v6 => PktInfo::V4(libc::in_pktinfo {
                ipi_ifindex: 0,
                ipi_spec_dst: libc::in_addr {
                    s_addr: u32::from(ip).to_be(),
                },
                ipi_addr: libc::in_addr { s_addr: 0 },
            }),
            Some(ip) => {
                let ip6 = match ip {
                    IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                    IpAddr::V6(v6) => v6,
                };
                PktInfo::V6(libc::in6_pktinfo {
                    ipi6_addr: libc::in6_addr {
                        s6_addr: ip6.octets(),
                    },
                    ipi6_ifindex: 0,
                })
            }
        }
    }

    fn cmsg(&self) -> Option<ControlMessage<'_>> {
        match self {
            PktInfo::None => None,
            PktInfo::V4(info) => Some(ControlMessage::Ipv4PacketInfo(info)),
            PktInfo::V6(info) => Some(ControlMessage::Ipv6PacketInfo(info)),
        }
    }

    fn space(&self) -> usize {
        match self {
            PktInfo::None => 0,
            PktInfo::V4(_) => cmsg_space::<libc::in_pktinfo>(),
            PktInfo::V6(_) => cmsg_space::<libc::in6_pktinfo>(),
        }
    }
}

/// Whether a datagram to `peer` goes out over IPv4 (an IPv4-mapped IPv6 peer of a
/// dual-stack socket does).
fn is_ipv4(peer: SocketAddr) -> bool {
    match peer {
        SocketAddr::V4(_) => true,
        SocketAddr::V6(v6) => v6.ip().to_ipv4_mapped().is_some(),
    }
}

/// How many datagrams from the start of `rest` make one `UDP_SEGMENT` send: same peer, same
/// length as the first (the last may be shorter, and ends the run), non-empty, at most
/// [`GSO_MAX_SEGMENTS`] and [`GSO_MAX_BYTES`]. 1 means "send it alone"; 0 only for an empty
/// `rest`. IPv4 runs need `ipv4_source`: the sender's address, to keep each segment's ICRC
/// valid for the IPv4 ID the kernel gives it (see the module docs).
fn gso_run(rest: &[Datagram], ipv4_source: bool) -> usize {
    let Some(first) = rest.first() else {
        return 0;
    };
    let segment = first.payload.len();
    if segment == 0 || (!ipv4_source && is_ipv4(first.peer)) {
        return 1;
    }
    let mut total = segment;
    let mut n = 1;
    for d in rest.iter().skip(1) {
        let len = d.payload.len();
        if n >= GSO_MAX_SEGMENTS
            || d.peer != first.peer
            || len == 0
            || len > segment
            || total + len > GSO_MAX_BYTES
        {
            break;
        }
        total += len;
        n += 1;
        if len < segment {
            break;
        }
    }
    n
}

/// Rewrites the ICRC of segment `index` of an IPv4 `UDP_SEGMENT` send for the IPv4 ID the
/// kernel gives it (`index`; see the module docs), when `payload` is a RoCEv2 packet sealed
/// for ID 0 on this path ([`icrc::seal`]). Anything else is left as it is.
fn reseal_segment(payload: &mut [u8], src: SocketAddr, dst: SocketAddr, index: usize) {
    let Ok(id) = u16::try_from(index) else {
        return;
    };
    if id == 0 {
        return;
    }
    let sealed = match (icrc::compute(payload, src, dst), icrc::carried(payload)) {
        (Ok(computed), Some(carried)) => computed == carried,
        _ => false,
    };
    if sealed {
        let _ = icrc::reseal_ipv4_id(payload, 0, id);
    }
}

/// Milliseconds for `poll(2)`, rounded up so a short remaining time still sleeps.
fn poll_timeout(remaining: Option<Duration>) -> PollTimeout {
    match remaining {
        None => PollTimeout::NONE,
        Some(d) => {
            let ms = d.as_micros().div_ceil(1000);
            PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)
        }
    }
}

impl UdpLink {
    /// Binds a socket as configured. Errors: invalid batch or buffer size, or any socket
    /// option / bind failure (e.g. `AddrInUse`).
    pub fn bind(config: UdpConfig) -> io::Result<UdpLink> {
        if config.batch == 0 || config.batch > MAX_BATCH {
            return Err(invalid(format!(
                "batch {} outside 1..={MAX_BATCH}",
                config.batch
            )));
        }
        if config.max_datagram_bytes == 0 || config.max_datagram_bytes > 65_535 {
            return Err(invalid(format!(
                "max_datagram_bytes {} outside 1..=65535",
                config.max_datagram_bytes
            )));
        }
        let (socket, recv_buffer_bytes, send_buffer_bytes) = open_socket(&config)?;
        let local = socket.local_addr()?;
        let gso = config.gso && probe_gso(socket.as_fd())?;
        if config.gso && !gso {
            tracing::info!(%local, "UDP_SEGMENT refused by the kernel: sending without GSO");
        }
        let gro = config.gro && setsockopt(&socket.as_fd(), sockopt::UdpGroSegment, &true).is_ok();
        if config.gro && !gro {
            tracing::info!(%local, "UDP_GRO refused by the kernel: receiving without GRO");
        }
        let slot = if gro {
            GRO_SLOT_BYTES.max(config.max_datagram_bytes)
        } else {
            config.max_datagram_bytes
        };
        // One zeroed allocation per slot (`vec![v; n]` would copy `v`, touching every page).
        let bufs = (0..config.batch).map(|_| vec![0u8; slot]).collect();
        Ok(UdpLink {
            socket,
            local,
            bufs,
            pool: Vec::with_capacity(config.batch),
            metas: Vec::with_capacity(config.batch),
            recv_slots: config.batch.min(MIN_RECV_SLOTS),
            config,
            counts: UdpCounts::default(),
            recv_buffer_bytes,
            send_buffer_bytes,
            gso,
            gro,
            gso_buf: Vec::new(),
            cursor: RecvCursor::default(),
        })
    }

    /// Whether sends use `UDP_SEGMENT` now: configured, accepted by the kernel at bind, and
    /// not refused by a send since (then it stays off for the link's life).
    pub fn gso_active(&self) -> bool {
        self.gso
    }

    /// Whether the socket has `UDP_GRO` on (configured and accepted at bind).
    pub fn gro_active(&self) -> bool {
        self.gro
    }

    /// The configuration this link was bound with.
    pub fn config(&self) -> &UdpConfig {
        &self.config
    }

    /// Datagram and drop counters.
    pub fn counts(&self) -> UdpCounts {
        self.counts
    }

    /// `SO_RCVBUF` as granted by the kernel (bytes, as `getsockopt` reports it).
    pub fn recv_buffer_bytes(&self) -> usize {
        self.recv_buffer_bytes
    }

    /// `SO_SNDBUF` as granted by the kernel.
    pub fn send_buffer_bytes(&self) -> usize {
        self.send_buffer_bytes
    }

    /// The source address the kernel will use to send to `peer`: the bound address, or for a
    /// wildcard bind the address of the route to `peer` (found with a connected throwaway
    /// socket) with the bound port. Use it as the ICRC source when sealing.
    pub fn source_addr_for(&self, peer: SocketAddr) -> io::Result<SocketAddr> {
        if !self.local.ip().is_unspecified() {
            return Ok(self.local);
        }
        let peer = for_family(peer, self.local.is_ipv6());
        let probe = UdpSocket::bind(SocketAddr::new(self.local.ip(), 0))?;
        probe.connect(peer)?;
        Ok(SocketAddr::new(probe.local_addr()?.ip(), self.local.port()))
    }

    /// One non-blocking `recvmmsg` into the receive buffers, replacing the last call's
    /// metadata and resetting the cursor; nothing read when the socket is empty.
    fn read_batch(&mut self, max: usize) -> io::Result<()> {
        let n = max.min(self.bufs.len()).min(self.recv_slots);
        self.metas.clear();
        self.cursor = RecvCursor::default();
        if n == 0 {
            return Ok(());
        }
        let fd = self.socket.as_raw_fd();
        let gro_space = if self.gro {
            cmsg_space::<libc::c_int>()
        } else {
            0
        };
        let mut headers = MultiHeaders::<SockaddrStorage>::preallocate(
            n,
            Some(vec![
                0u8;
                cmsg_space::<libc::in_pktinfo>()
                    + cmsg_space::<libc::in6_pktinfo>()
                    + gro_space
            ]),
        );
        let mut metas = std::mem::take(&mut self.metas);
        // Buffers the call returned, whether they pass the checks or not.
        let mut received = 0;
        {
            let mut iovs: Vec<[IoSliceMut<'_>; 1]> = self
                .bufs
                .iter_mut()
                .take(n)
                .map(|b| [IoSliceMut::new(b.as_mut_slice())])
                .collect();
            let results = match recvmmsg(
                fd,
                &mut headers,
                iovs.iter_mut(),
                MsgFlags::MSG_DONTWAIT,
                None,
            ) {
                Ok(results) => results,
                // Nothing waiting, or interrupted: the caller's wait loop tries again.
                Err(Errno::EAGAIN) | Err(Errno::EINTR) => return Ok(()),
                Err(e) => return Err(e.into()),
            };
            for (index, msg) in results.enumerate() {
                received += 1;
                let mut local_ip = None;
                let mut segment = None;
                if let Ok(cmsgs) = msg.cmsgs() {
                    for cmsg in cmsgs {
                        match cmsg {
                            ControlMessageOwned::Ipv4PacketInfo(info) => {
                                local_ip = Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                                    info.ipi_addr.s_addr,
                                ))));
                            }
                            ControlMessageOwned::Ipv6PacketInfo(info) => {
                                local_ip = Some(IpAddr::V6(Ipv6Addr::from(info.ipi6_addr.s6_addr)));
                            }
                            ControlMessageOwned::UdpGroSegments(size) => {
                                segment = usize::try_from(size).ok().filter(|s| *s > 0);
                            }
                            _ => {}
                        }
                    }
                }
                let peer = msg.address.as_ref().and_then(to_socket_addr);
                let Some(peer) = peer.filter(|_| !msg.flags.contains(MsgFlags::MSG_TRUNC)) else {
                    // A UDP socket always reports the source; a datagram without one is
                    // counted like a truncated one rather than trusted.
                    self.counts.count_drop(UdpDropReason::RecvTruncated);
                    continue;
                };
                let local_ip = match local_ip {
                    // A dual-stack socket reports IPv4 destinations both ways; keep the
                    // socket's family so `peer` and `local` agree.
                    Some(IpAddr::V4(v4)) if self.local.is_ipv6() => IpAddr::V6(v4.to_ipv6_mapped()),
                    Some(ip) => ip,
                    None => self.local.ip(),
                };
                let segment = match segment {
                    Some(segment) if segment < msg.bytes => {
                        self.counts.gro_buffers += 1;
                        segment
                    }
                    _ => msg.bytes.max(1),
                };
                metas.push(RecvMeta {
                    index,
                    len: msg.bytes,
                    peer,
                    local: SocketAddr::new(local_ip, self.local.port()),
                    segment,
                });
            }
        }
        if received > 0 {
            self.counts.recv_calls += 1;
        }
        // Adapt only when the slots, not the caller's `max`, bounded this call.
        if received > 0 && n == self.recv_slots {
            let full = self.bufs.len().max(1);
            self.recv_slots = if received >= n {
                (n * 2).min(full)
            } else if received * 2 < n {
                (n / 2).clamp(MIN_RECV_SLOTS.min(full), full)
            } else {
                n.max(MIN_RECV_SLOTS.min(full))
            };
        }
        self.metas = metas;
        Ok(())
    }

    /// Whether datagrams of the last `recvmmsg` wait to be handed out.
    fn has_unread(&self) -> bool {
        self.cursor.meta < self.metas.len()
    }

    /// Hands up to `max` datagrams to `each` as views into the receive buffers, from the
    /// cursor on; reads the socket once first when nothing waits. A coalesced `UDP_GRO`
    /// buffer holds datagrams of its `segment` size, the last maybe shorter
    /// (`net/ipv4/udp_offload.c: udp_gro_receive()`); datagrams beyond `max` wait in the
    /// buffers for the next call.
    fn recv_once_each(
        &mut self,
        max: usize,
        each: &mut dyn FnMut(DatagramView<'_>),
    ) -> io::Result<usize> {
        if !self.has_unread() {
            self.read_batch(max)?;
        }
        let mut delivered = 0;
        while delivered < max {
            let Some(meta) = self.metas.get(self.cursor.meta) else {
                break;
            };
            let Some(data) = self.bufs.get(meta.index).and_then(|b| b.get(..meta.len)) else {
                // Never: `recvmmsg` filled these buffers with these lengths.
                self.counts.count_drop(UdpDropReason::RecvTruncated);
                self.cursor.next_buffer();
                continue;
            };
            let start = self.cursor.offset.min(data.len());
            let end = start.saturating_add(meta.segment).min(data.len());
            let chunk = data.get(start..end).unwrap_or_default();
            // A zero-length datagram is handed out once, like any other.
            if end >= data.len() {
                self.cursor.next_buffer();
            } else {
                self.cursor.offset = end;
            }
            if chunk.len() > self.config.max_datagram_bytes {
                // What the kernel would have truncated without the larger GRO slots.
                self.counts.count_drop(UdpDropReason::RecvTruncated);
                continue;
            }
            each(DatagramView {
                peer: meta.peer,
                local: Some(meta.local),
                payload: chunk,
            });
            delivered += 1;
        }
        self.counts.received += delivered as u64;
        Ok(delivered)
    }

    /// Receives like [`Link::recv`], handing each datagram to `each`: the wait loop of
    /// `recv` and `recv_each`.
    fn recv_loop(
        &mut self,
        max: usize,
        timeout: Option<Duration>,
        each: &mut dyn FnMut(DatagramView<'_>),
    ) -> io::Result<usize> {
        // Read the clock only once the socket was found empty: a loaded receiver never waits.
        let mut start = None;
        loop {
            let n = self.recv_once_each(max, each)?;
            if n > 0 || max == 0 {
                return Ok(n);
            }
            let remaining = match timeout {
                Some(t) => {
                    let elapsed = start.get_or_insert_with(Instant::now).elapsed();
                    if elapsed >= t {
                        return Ok(0);
                    }
                    Some(t - elapsed)
                }
                None => None,
            };
            match self.config.poll_mode {
                PollMode::BusyPoll => std::hint::spin_loop(),
                PollMode::Blocking => {
                    let mut fds = [PollFd::new(self.socket.as_fd(), PollFlags::POLLIN)];
                    match poll(&mut fds, poll_timeout(remaining)) {
                        Ok(_) | Err(Errno::EINTR) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }
        }
    }

    /// Sends `group` (all with the same source `src`): runs that [`gso_run`] finds as one
    /// `UDP_SEGMENT` send each while GSO is on, the rest with `sendmmsg`; returns
    /// `(datagrams taken, would_block)`.
    fn send_group(&mut self, group: &[Datagram], src: Option<IpAddr>) -> io::Result<(usize, bool)> {
        // IPv4 segments are resealed for their IPv4 ID, which needs the source address: a
        // wildcard-bound link without an explicit source sends IPv4 with `sendmmsg`.
        let ipv4_source = src.is_some() || !self.local.ip().is_unspecified();
        let mut taken = 0;
        while taken < group.len() {
            let rest = group.get(taken..).unwrap_or_default();
            if !self.gso {
                let (n, would_block) = self.send_mmsg(rest, src)?;
                return Ok((taken + n, would_block));
            }
            let run = gso_run(rest, ipv4_source);
            let (n, would_block) = if run >= 2 {
                self.send_gso(rest.get(..run).unwrap_or_default(), src)?
            } else {
                // Datagrams that start no run, up to the next that does: one `sendmmsg`.
                let singles = (1..rest.len())
                    .find(|&i| gso_run(rest.get(i..).unwrap_or_default(), ipv4_source) >= 2)
                    .unwrap_or(rest.len());
                self.send_mmsg(rest.get(..singles).unwrap_or_default(), src)?
            };
            taken += n;
            if would_block {
                return Ok((taken, true));
            }
        }
        Ok((taken, false))
    }

    /// Sends `run` (see [`gso_run`]: one peer, one source `src`, one segment size) as one
    /// `sendmsg` with a `UDP_SEGMENT` control message. IPv4 segments after the first get
    /// their ICRC rewritten for the IPv4 ID the kernel gives them (module docs), in the copy
    /// only: `run` itself is not changed. A refusal that means the kernel cannot segment
    /// (`EIO`, `EINVAL`, `ENOPROTOOPT`, `EOPNOTSUPP`) switches GSO off for the link and logs
    /// once; after any refusal `run` goes again through `sendmmsg`, which sends or counts
    /// every datagram. Returns `(datagrams taken, would_block)`.
    fn send_gso(&mut self, run: &[Datagram], src: Option<IpAddr>) -> io::Result<(usize, bool)> {
        let Some(first) = run.first() else {
            return Ok((0, false));
        };
        let Ok(segment) = u16::try_from(first.payload.len()) else {
            return self.send_mmsg(run, src);
        };
        let peer = first.peer;
        let v6 = self.local.is_ipv6();
        let source = SocketAddr::new(src.unwrap_or(self.local.ip()), self.local.port());
        let ipv4 = is_ipv4(peer);
        let mut buf = std::mem::take(&mut self.gso_buf);
        buf.clear();
        for (i, d) in run.iter().enumerate() {
            let at = buf.len();
            buf.extend_from_slice(&d.payload);
            if ipv4 {
                if let Some(copy) = buf.get_mut(at..) {
                    reseal_segment(copy, source, peer, i);
                }
            }
        }
        let info = PktInfo::new(src, v6);
        let mut cmsgs = vec![ControlMessage::UdpGsoSegments(&segment)];
        cmsgs.extend(info.cmsg());
        let addr = SockaddrStorage::from(for_family(peer, v6));
        let fd = self.socket.as_raw_fd();
        let result = loop {
            match sendmsg(
                fd,
                &[IoSlice::new(&buf)],
                &cmsgs,
                MsgFlags::MSG_DONTWAIT,
                Some(&addr),
            ) {
                Err(Errno::EINTR) => {}
                r => break r,
            }
        };
        drop(cmsgs);
        self.gso_buf = buf;
        match result {
            Ok(_) => {
                self.counts.send_calls += 1;
                self.counts.gso_sends += 1;
                self.counts.sent += run.len() as u64;
                Ok((run.len(), false))
            }
            Err(Errno::EAGAIN) => Ok((0, true)),
            Err(errno @ (Errno::EIO | Errno::EINVAL | Errno::ENOPROTOOPT | Errno::EOPNOTSUPP)) => {
                self.gso = false;
                tracing::warn!(
                    local = %self.local,
                    %peer,
                    segment,
                    segments = run.len(),
                    error = %errno,
                    "UDP_SEGMENT send refused: GSO off for this link, resending with sendmmsg"
                );
                self.send_mmsg(run, src)
            }
            // Per-datagram reasons (EMSGSIZE, no route): `sendmmsg` sorts and counts them.
            Err(_) => self.send_mmsg(run, src),
        }
    }

    /// Sends `group` (all with the same source `src`) with `sendmmsg`; returns
    /// `(datagrams taken, would_block)`.
    fn send_mmsg(&mut self, group: &[Datagram], src: Option<IpAddr>) -> io::Result<(usize, bool)> {
        let v6 = self.local.is_ipv6();
        let fd = self.socket.as_raw_fd();
        let mut taken = 0;
        while taken < group.len() {
            let rest = group.get(taken..).unwrap_or_default();
            let chunk = rest
                .get(..rest.len().min(self.config.batch))
                .unwrap_or_default();
            let iovs: Vec<[IoSlice<'_>; 1]> = chunk
                .iter()
                .map(|d| [IoSlice::new(d.payload.as_slice())])
                .collect();
            let addrs: Vec<Option<SockaddrStorage>> = chunk
                .iter()
                .map(|d| Some(SockaddrStorage::from(for_family(d.peer, v6))))
                .collect();
            let info = PktInfo::new(src, v6);
            let cmsgs: Vec<ControlMessage<'_>> = info.cmsg().into_iter().collect();
            let cmsg_buf = (info.space() > 0).then(|| vec![0u8; info.space()]);
            let mut headers = MultiHeaders::<SockaddrStorage>::preallocate(chunk.len(), cmsg_buf);
            match sendmmsg(
                fd,
                &mut headers,
                &iovs,
                &addrs,
                &cmsgs,
                MsgFlags::MSG_DONTWAIT,
            ) {
                Ok(results) => {
                    let sent = results.count();
                    self.counts.send_calls += 1;
                    self.counts.sent += sent as u64;
                    taken += sent;
                }
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => return Ok((taken, true)),
                Err(errno) => match classify_send_error(errno) {
                    Some(reason) => {
                        // The first datagram of the chunk failed; drop it and go on.
                        self.counts.count_drop(reason);
                        taken += 1;
                    }
                    None => {
                        if taken == 0 {
                            return Err(errno.into());
                        }
                        return Ok((taken, true));
                    }
                },
            }
        }
        Ok((taken, false))
    }

    fn source_ip(&self, d: &Datagram) -> Option<IpAddr> {
        let local = d.local?;
        let ip = local.ip();
        if ip.is_unspecified() || ip == self.local.ip() {
            None
        } else {
            Some(ip)
        }
    }
}

impl Link for UdpLink {
    fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// [`UdpDropReason::RecvTruncated`] drops so far.
    fn recv_discarded(&self) -> u64 {
        self.counts.recv_truncated
    }

    /// Keeps buffers for the next receives: up to `batch`, or with `UDP_GRO` as many as one
    /// receive may split out of its coalesced buffers (`batch` × 64 segments), since those
    /// beyond the datagrams delivered wait in the link and take buffers too.
    fn recycle(&mut self, payload: Vec<u8>) {
        if self.pool.len() < self.config.batch * if self.gro { GSO_MAX_SEGMENTS } else { 1 } {
            self.pool.push(payload);
        }
    }

    /// The socket: readable when a datagram waits.
    fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.socket.as_fd())
    }

    /// [`Readiness::Now`] while datagrams split out of a coalesced `UDP_GRO` buffer wait;
    /// otherwise [`Readiness::Idle`] (sleep on the socket). In [`PollMode::BusyPoll`] the
    /// link spins instead of sleeping: [`Readiness::Opaque`], so waits go through `recv`.
    fn readiness(&self) -> Readiness {
        if self.has_unread() {
            return Readiness::Now;
        }
        match self.config.poll_mode {
            PollMode::Blocking => Readiness::Idle { until: None },
            PollMode::BusyPoll => Readiness::Opaque,
        }
    }

    /// Sends in order; stops at the first `EAGAIN` and returns how many were taken.
    /// Datagrams refused individually (too big, unroutable) are taken, dropped and counted.
    /// `Datagram.local`'s IP, when set and not the bound IP, becomes the source address; its
    /// port is ignored (the socket's port is used).
    fn send(&mut self, batch: &[Datagram]) -> io::Result<usize> {
        let mut taken = 0;
        while taken < batch.len() {
            let rest = batch.get(taken..).unwrap_or_default();
            let src = rest.first().and_then(|d| self.source_ip(d));
            let same = rest
                .iter()
                .take_while(|d| self.source_ip(d) == src)
                .count()
                .max(1);
            let group = rest.get(..same).unwrap_or_default();
            let (n, would_block) = self.send_group(group, src)?;
            taken += n;
            if would_block {
                break;
            }
        }
        Ok(taken)
    }

    fn recv(
        &mut self,
        out: &mut Vec<Datagram>,
        max: usize,
        timeout: Option<Duration>,
    ) -> io::Result<usize> {
        let mut pool = std::mem::take(&mut self.pool);
        let got = self.recv_loop(max, timeout, &mut |v| {
            let mut payload = pool.pop().unwrap_or_default();
            payload.clear();
            payload.extend_from_slice(v.payload);
            out.push(Datagram {
                peer: v.peer,
                local: v.local,
                payload,
            });
        });
        self.pool = pool;
        got
    }

    /// Views into the receive buffers: a datagram is not copied out of its `UDP_GRO`
    /// buffer (that copy was 4 % of a busy collector's CPU, BENCHMARKS.md).
    fn recv_each(
        &mut self,
        max: usize,
        timeout: Option<Duration>,
        each: &mut dyn FnMut(DatagramView<'_>),
    ) -> io::Result<usize> {
        self.recv_loop(max, timeout, each)
    }
}

#[allow(dead_code)]
fn _assert_send() {
    fn is_send<T: Send>() {}
    is_send::<UdpLink>();
    is_send::<UdpSink>();
    let _ = SockaddrStorage::len;
}
