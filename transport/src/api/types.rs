//! Small value types of the verbs shapes: constants of the wire format, [`TransportKind`],
//! [`AccessFlags`], [`Mtu`], [`QpState`], RoCEv2 GIDs, [`QpEndpoint`] and [`PortAttr`].

use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// UDP destination port of RoCEv2, assigned by IANA ("roce", 4791; IBTA Annex A17 §A17.4.2).
pub const ROCE_V2_UDP_PORT: u16 = 4791;

/// Mask of a 24-bit PSN, the BTH packet sequence number (IBTA Vol 1 9.2, 9.7.1); PSNs wrap at
/// 2^24.
pub const PSN_MASK: u32 = 0x00ff_ffff;

/// Mask of a 24-bit QP number, the BTH destination QP (IBTA Vol 1 9.2).
pub const QPN_MASK: u32 = 0x00ff_ffff;

/// Largest message the protocol allows on a UC QP, in bytes: 2^31 (IBTA 9.4.4; rxe rejects RETH
/// DMA lengths above 2^31, "IBA C9-94"). A device advertises its own, usually smaller, limit
/// in [`PortAttr::max_msg_size`] (the soft device: [`SOFT_MAX_MSG_SIZE`]).
///
/// [`SOFT_MAX_MSG_SIZE`]: crate::soft::device::SOFT_MAX_MSG_SIZE
pub const IBTA_MAX_MSG_SIZE: u32 = 1 << 31;

/// Which transport implementation is behind a [`Device`](super::Device).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TransportKind {
    /// RoCEv2 UC in user space over UDP ([`crate::soft`]).
    Soft,
    /// Real RDMA through libibverbs.
    Verbs,
}

impl TransportKind {
    /// Lower-case name, as used in configuration files and metric labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Soft => "soft",
            Self::Verbs => "verbs",
        }
    }
}

impl fmt::Display for TransportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Memory and QP access rights (`enum ibv_access_flags`, same bit values).
///
/// REMOTE_READ and the atomics are deliberately not representable: UC carries neither, and
/// uctel rings must never be readable by the remote side.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AccessFlags(u32);

impl AccessFlags {
    /// No access beyond local read (always implied).
    pub const NONE: Self = Self(0);
    /// `IBV_ACCESS_LOCAL_WRITE`: the transport may write into the region (needed by receive
    /// buffers and by any region that is the target of RDMA WRITE).
    pub const LOCAL_WRITE: Self = Self(1);
    /// `IBV_ACCESS_REMOTE_WRITE`: the remote side may RDMA WRITE into the region (on an MR) or
    /// through the QP (on a QP). IBTA 10.6.3.1: REMOTE_WRITE requires LOCAL_WRITE.
    pub const REMOTE_WRITE: Self = Self(2);

    /// Raw `ibv_access_flags` bits.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Whether every bit of `other` is set in `self`.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for AccessFlags {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

impl std::ops::BitOrAssign for AccessFlags {
    fn bitor_assign(&mut self, rhs: Self) {
        self.0 |= rhs.0;
    }
}

impl fmt::Debug for AccessFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if self.contains(Self::LOCAL_WRITE) {
            parts.push("LOCAL_WRITE");
        }
        if self.contains(Self::REMOTE_WRITE) {
            parts.push("REMOTE_WRITE");
        }
        if parts.is_empty() {
            f.write_str("NONE")
        } else {
            f.write_str(&parts.join("|"))
        }
    }
}

/// IB path MTU (IBTA 9.7.5.1 / `enum ibv_mtu`): the payload bytes per packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mtu {
    /// 256 bytes (`IBV_MTU_256`).
    Mtu256,
    /// 512 bytes (`IBV_MTU_512`).
    Mtu512,
    /// 1024 bytes (`IBV_MTU_1024`); rxe's active MTU on a 1500-byte netdev.
    Mtu1024,
    /// 2048 bytes (`IBV_MTU_2048`).
    Mtu2048,
    /// 4096 bytes (`IBV_MTU_4096`).
    Mtu4096,
}

impl Mtu {
    /// Payload bytes per packet.
    pub const fn bytes(self) -> u32 {
        match self {
            Self::Mtu256 => 256,
            Self::Mtu512 => 512,
            Self::Mtu1024 => 1024,
            Self::Mtu2048 => 2048,
            Self::Mtu4096 => 4096,
        }
    }

    /// The MTU of exactly `bytes` bytes, or `None` if `bytes` is not an IB MTU.
    pub const fn from_bytes(bytes: u32) -> Option<Self> {
        match bytes {
            256 => Some(Self::Mtu256),
            512 => Some(Self::Mtu512),
            1024 => Some(Self::Mtu1024),
            2048 => Some(Self::Mtu2048),
            4096 => Some(Self::Mtu4096),
            _ => None,
        }
    }

    /// The largest IB MTU not above `bytes`, or `None` if `bytes < 256`.
    pub const fn at_most(bytes: u32) -> Option<Self> {
        if bytes >= 4096 {
            Some(Self::Mtu4096)
        } else if bytes >= 2048 {
            Some(Self::Mtu2048)
        } else if bytes >= 1024 {
            Some(Self::Mtu1024)
        } else if bytes >= 512 {
            Some(Self::Mtu512)
        } else if bytes >= 256 {
            Some(Self::Mtu256)
        } else {
            None
        }
    }
}

/// QP state (`enum ibv_qp_state`; SQD and SQE are not used by UC here).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Created, nothing allowed.
    Reset,
    /// Receive WRs may be posted; inbound packets are dropped (`qp_not_ready`).
    Init,
    /// Ready to receive: inbound packets are processed; post_send is refused.
    Rtr,
    /// Ready to send and receive.
    Rts,
    /// Failed: outstanding WRs complete with [`WcStatus::WrFlushError`], inbound packets are
    /// dropped (`qp_error`), post_send is refused. Terminal for uctel: build a new QP.
    ///
    /// [`WcStatus::WrFlushError`]: super::WcStatus::WrFlushError
    Error,
}

impl QpState {
    /// Upper-case name as in the IBTA spec.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Reset => "RESET",
            Self::Init => "INIT",
            Self::Rtr => "RTR",
            Self::Rts => "RTS",
            Self::Error => "ERROR",
        }
    }
}

impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The RoCEv2 GID of an IP address: the IPv4-mapped IPv6 address for IPv4 (`::ffff:a.b.c.d`),
/// the address itself for IPv6 (IBTA annex A17, RoCEv2 GIDs).
pub fn gid_from_ip(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// The IP address a RoCEv2 GID stands for (IPv4 for IPv4-mapped GIDs).
pub fn ip_from_gid(gid: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// Everything the peer needs to connect to a local QP; exchanged on the control channel.
///
/// Fields as in the `ibv_modify_qp` RTR/RTS attributes of the other side: the peer uses
/// `qpn` as its `dest_qp_num`, `psn` as its `rq_psn`, `gid` for its address vector and
/// `min(mtu, own mtu)` as `path_mtu`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QpEndpoint {
    /// RoCEv2 GID of the local port (see [`gid_from_ip`]).
    pub gid: [u8; 16],
    /// Local QP number (24 bits).
    pub qpn: u32,
    /// First PSN this QP will send (24 bits); the peer expects it.
    pub psn: u32,
    /// Largest path MTU this side supports, in bytes (256, 512, 1024, 2048 or 4096).
    pub mtu: u32,
    /// UDP address packets for this QP must be sent to. `Some` for the soft transport (it may
    /// listen on a port other than 4791); `None` means "the GID's IP address, port 4791", which
    /// is what kernel and hardware RoCEv2 devices use.
    pub udp_addr: Option<SocketAddr>,
}

impl QpEndpoint {
    /// The UDP address RoCEv2 packets for this endpoint go to: `udp_addr`, or the GID's IP
    /// address with port [`ROCE_V2_UDP_PORT`].
    pub fn destination(&self) -> SocketAddr {
        self.udp_addr
            .unwrap_or_else(|| SocketAddr::new(ip_from_gid(self.gid), ROCE_V2_UDP_PORT))
    }
}

/// Port attributes of an opened device (`ibv_query_port` + `ibv_query_gid`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortAttr {
    /// RoCEv2 GID used for UC QPs.
    pub gid: [u8; 16],
    /// Active path MTU in bytes.
    pub active_mtu: u32,
    /// Largest message in bytes (`max_msg_sz`; rxe: 8 MiB).
    pub max_msg_size: u32,
    /// The UDP address the device receives RoCEv2 on (soft transport), `None` for verbs.
    pub udp_addr: Option<SocketAddr>,
    /// The receive buffer of the device's UDP socket as the kernel granted it (`SO_RCVBUF`
    /// from `getsockopt`, bytes): every inbound packet of every QP waits there until the
    /// device reads it. `None` for verbs and for soft devices over other links.
    pub recv_buffer_bytes: Option<usize>,
}
#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    #[test]
    fn gid_round_trips_ipv4_and_ipv6() {
        let v4: IpAddr = "10.99.0.2".parse().unwrap();
        let gid = gid_from_ip(v4);
        assert_eq!(&gid[..12], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]);
        assert_eq!(ip_from_gid(gid), v4);
        let v6: IpAddr = "fe80::1".parse().unwrap();
        assert_eq!(ip_from_gid(gid_from_ip(v6)), v6);
    }

    #[test]
    fn endpoint_destination_defaults_to_roce_port() {
        let ep = QpEndpoint {
            gid: gid_from_ip("10.0.0.1".parse().unwrap()),
            qpn: 0x11,
            psn: 0,
            mtu: 1024,
            udp_addr: None,
        };
        assert_eq!(ep.destination(), "10.0.0.1:4791".parse().unwrap());
    }

    #[test]
    fn mtu_conversions() {
        assert_eq!(Mtu::from_bytes(1024), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::from_bytes(1000), None);
        assert_eq!(Mtu::at_most(1500), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::at_most(9000), Some(Mtu::Mtu4096));
        assert_eq!(Mtu::at_most(100), None);
    }

    #[test]
    fn access_flags_compose() {
        let a = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        assert!(a.contains(AccessFlags::REMOTE_WRITE));
        assert!(!AccessFlags::LOCAL_WRITE.contains(AccessFlags::REMOTE_WRITE));
        assert_eq!(a.bits(), 3);
        assert_eq!(format!("{a:?}"), "LOCAL_WRITE|REMOTE_WRITE");
    }
}
