//! What a `UDP_SEGMENT` send puts on the wire, captured: a veth pair into a network
//! namespace, a `UdpLink` with GSO sending sealed RoCEv2 packets across it, and an
//! `AF_PACKET` socket reading the frames the veth transmits.
//!
//! The veth's `gso_max_segs` is set to 1, so the kernel segments in software before the
//! device (`net/core/dev.c: gso_features_check()` drops the GSO features when a packet has
//! more segments; the segments are what a NIC without UDP segmentation offload sends), and
//! the capture tap, which sits after that (`dev_hard_start_xmit` → `dev_queue_xmit_nit`),
//! sees each segment.
//!
//! The test proves: every datagram leaves as its own UDP datagram with its own length; the
//! kernel numbers the IPv4 IDs of a GSO send's segments 0, 1, 2, … (`inet_gso_segment()` in
//! `net/ipv4/af_inet.c`: `iph->id = htons(id++)` unless `SKB_GSO_TCP_FIXEDID`, a TCP-only
//! flag); and the ICRC of every captured datagram is valid for the ID it really carries,
//! which holds only because `UdpLink` reseals segment `i` for ID `i`. A loopback test
//! cannot show this: the receiver's ICRC check solves for the ID.
//!
//! Needs root and `ip` (iproute2) with network namespaces; otherwise it prints why and
//! skips.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::socket::{
    recvfrom, socket, AddressFamily, LinkAddr, SockFlag, SockProtocol, SockType,
};
use uctel_transport::soft::icrc::{self, Ipv4Ident};
use uctel_transport::soft::link::{Datagram, Link};
use uctel_transport::soft::packet::{BthRepr, Opcode, PacketRepr, DEFAULT_PKEY};
use uctel_transport::soft::psn::Psn;
use uctel_transport::soft::udp::{UdpConfig, UdpDropReason, UdpLink};

/// `PACKET_OUTGOING` in `sockaddr_ll.sll_pkttype` (`include/uapi/linux/if_packet.h`).
const PACKET_OUTGOING: u8 = 4;

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A namespace with one end of a veth pair; the other end in this namespace. Removed on drop.
struct Veth {
    ns: String,
    host_if: String,
    host_ip: Ipv4Addr,
    peer_ip: Ipv4Addr,
}

impl Veth {
    fn create() -> Result<Veth, String> {
        let pid = std::process::id();
        let ns = format!("uctelgso{pid}");
        let host_if = format!("ugso{}a", pid % 100_000);
        let peer_if = format!("ugso{}b", pid % 100_000);
        let net = (pid % 250) as u8 + 1;
        let host_ip = Ipv4Addr::new(10, 211, net, 1);
        let peer_ip = Ipv4Addr::new(10, 211, net, 2);
        ip(&["netns", "add", &ns])?;
        let veth = Veth {
            ns: ns.clone(),
            host_if: host_if.clone(),
            host_ip,
            peer_ip,
        };
        let peer_mac = "02:00:00:d3:00:02";
        ip(&[
            "link", "add", &host_if, "type", "veth", "peer", "name", &peer_if, "netns", &ns,
        ])?;
        ip(&["addr", "add", &format!("{host_ip}/24"), "dev", &host_if])?;
        // More segments than this and the kernel segments before the device.
        ip(&["link", "set", &host_if, "gso_max_segs", "1"])?;
        ip(&["link", "set", &host_if, "up"])?;
        ip(&["-n", &ns, "link", "set", &peer_if, "address", peer_mac])?;
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{peer_ip}/24"),
            "dev",
            &peer_if,
        ])?;
        ip(&["-n", &ns, "link", "set", &peer_if, "up"])?;
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        // No ARP round trip: nothing waits in the neighbour queue.
        ip(&[
            "neigh",
            "replace",
            &peer_ip.to_string(),
            "lladdr",
            peer_mac,
            "dev",
            &host_if,
            "nud",
            "permanent",
        ])?;
        Ok(veth)
    }

    fn ifindex(&self) -> usize {
        std::fs::read_to_string(format!("/sys/class/net/{}/ifindex", self.host_if))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(|| panic!("ifindex of {}", self.host_if))
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        // Deleting the namespace deletes its veth end and with it the pair.
        let _ = ip(&["netns", "del", &self.ns]);
        let _ = ip(&["link", "del", &self.host_if]);
    }
}

fn sealed(psn: u32, body_len: usize, src: SocketAddr, dst: SocketAddr) -> Vec<u8> {
    let body: Vec<u8> = (0..body_len)
        .map(|i| (i * 7 + psn as usize) as u8)
        .collect();
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
            psn: Psn::new(psn),
        },
        reth: None,
        imm: Some(psn),
        payload: &body,
    };
    let mut buf = Vec::new();
    repr.emit(&mut buf).expect("emit");
    icrc::seal(&mut buf, src, dst).expect("seal");
    buf
}

/// One captured IPv4/UDP frame.
#[derive(Debug)]
struct Captured {
    id: u16,
    dont_fragment: bool,
    src: SocketAddr,
    dst: SocketAddr,
    payload: Vec<u8>,
}

/// Parses an Ethernet frame carrying IPv4/UDP (no options); `None` for anything else.
fn parse(frame: &[u8]) -> Option<Captured> {
    if frame.get(12..14)? != [0x08, 0x00] {
        return None;
    }
    let iph = frame.get(14..34)?;
    if iph[0] != 0x45 || iph[9] != 17 {
        return None;
    }
    let total = usize::from(u16::from_be_bytes([iph[2], iph[3]]));
    let id = u16::from_be_bytes([iph[4], iph[5]]);
    let flags = u16::from_be_bytes([iph[6], iph[7]]);
    let src_ip = Ipv4Addr::new(iph[12], iph[13], iph[14], iph[15]);
    let dst_ip = Ipv4Addr::new(iph[16], iph[17], iph[18], iph[19]);
    let udp = frame.get(34..42)?;
    let udp_len = usize::from(u16::from_be_bytes([udp[4], udp[5]]));
    assert_eq!(udp_len + 20, total, "UDP length agrees with the IP length");
    let payload = frame.get(42..14 + total)?.to_vec();
    Some(Captured {
        id,
        dont_fragment: flags & 0x4000 != 0,
        src: SocketAddr::new(IpAddr::V4(src_ip), u16::from_be_bytes([udp[0], udp[1]])),
        dst: SocketAddr::new(IpAddr::V4(dst_ip), u16::from_be_bytes([udp[2], udp[3]])),
        payload,
    })
}

/// Reads frames sent on `ifindex` to `dst` until `n` arrived or two seconds passed.
fn capture(sock: &OwnedFd, ifindex: usize, dst: SocketAddr, n: usize) -> Vec<Captured> {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    let deadline = Instant::now() + Duration::from_secs(2);
    while got.len() < n && Instant::now() < deadline {
        match recvfrom::<LinkAddr>(sock.as_raw_fd(), &mut buf) {
            Ok((len, Some(addr)))
                if addr.ifindex() == ifindex && addr.pkttype() == PACKET_OUTGOING =>
            {
                if let Some(c) = buf.get(..len).and_then(parse) {
                    if c.dst == dst {
                        got.push(c);
                    }
                }
            }
            Ok(_) => {}
            Err(nix::errno::Errno::EAGAIN) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => panic!("AF_PACKET recvfrom: {e}"),
        }
    }
    got
}

fn send_all(link: &mut UdpLink, batch: &[Datagram]) {
    let mut sent = 0;
    while sent < batch.len() {
        sent += link.send(&batch[sent..]).expect("send");
    }
}

/// Sends `batch` and checks every datagram was captured alone, in order, with its bytes
/// (ICRC aside), DF set, the IPv4 ID `want_ids[i]` and an ICRC valid for that ID.
fn send_and_check(
    link: &mut UdpLink,
    sock: &OwnedFd,
    ifindex: usize,
    batch: &[Datagram],
    want_ids: &[u16],
) {
    let dst = batch[0].peer;
    let src = link.local_addr();
    send_all(link, batch);
    let got = capture(sock, ifindex, dst, batch.len());
    let ids: Vec<u16> = got.iter().map(|c| c.id).collect();
    println!("captured IPv4 IDs: {ids:?}");
    assert_eq!(
        got.len(),
        batch.len(),
        "one captured datagram per datagram sent"
    );
    for (i, (c, d)) in got.iter().zip(batch).enumerate() {
        assert_eq!(c.src, src, "datagram {i}");
        assert_eq!(
            c.payload.len(),
            d.payload.len(),
            "datagram {i} keeps its length"
        );
        let body = d.payload.len() - 4;
        assert_eq!(c.payload[..body], d.payload[..body], "datagram {i}");
        assert!(c.dont_fragment, "datagram {i}: DF");
        let m = icrc::check(&c.payload, c.src, c.dst)
            .unwrap_or_else(|e| panic!("datagram {i}: ICRC: {e}"));
        assert_eq!(
            m.ipv4_id,
            Some(c.id),
            "datagram {i}: ICRC sealed for the wire ID"
        );
        let ident = Ipv4Ident {
            id: c.id,
            dont_fragment: true,
        };
        assert_eq!(
            icrc::compute_with(&c.payload, c.src, c.dst, ident).ok(),
            icrc::carried(&c.payload),
            "datagram {i}: full ICRC with the captured header"
        );
    }
    assert_eq!(ids, want_ids, "IPv4 IDs on the wire");
}

#[test]
fn gso_segments_on_the_wire_carry_ids_0_1_2_and_valid_icrcs() {
    let veth = match Veth::create() {
        Ok(v) => v,
        Err(e) => {
            println!("skipping the veth capture (needs root and iproute2 netns): {e}");
            return;
        }
    };
    let sock = socket(
        AddressFamily::Packet,
        SockType::Raw,
        SockFlag::SOCK_NONBLOCK,
        SockProtocol::EthAll,
    )
    .expect("AF_PACKET socket (root)");
    let ifindex = veth.ifindex();
    let dst = SocketAddr::new(IpAddr::V4(veth.peer_ip), 4791);
    let bind = SocketAddr::new(IpAddr::V4(veth.host_ip), 0);

    let mut gso = UdpLink::bind(UdpConfig::bound_to(bind)).expect("bind");
    assert!(gso.gso_active(), "UDP_SEGMENT available");
    let src = gso.local_addr();

    // One run of 32 segments of 1,044 bytes (BTH, ImmDt, 1,024 bytes, ICRC).
    let run: Vec<Datagram> = (0..32)
        .map(|psn| Datagram::to(dst, sealed(psn, 1024, src, dst)))
        .collect();
    assert_eq!(run[0].payload.len(), 1044);
    let want: Vec<u16> = (0..32).collect();
    send_and_check(&mut gso, &sock, ifindex, &run, &want);
    assert_eq!(gso.counts().gso_sends, 1);

    // Two runs in one batch, the first with a shorter last segment: each starts at ID 0.
    let mut two: Vec<Datagram> = (0..10)
        .map(|psn| Datagram::to(dst, sealed(psn, 800, src, dst)))
        .collect();
    two.push(Datagram::to(dst, sealed(10, 500, src, dst)));
    two.extend((11..16).map(|psn| Datagram::to(dst, sealed(psn, 600, src, dst))));
    let want: Vec<u16> = (0..11).chain(0..5).collect();
    send_and_check(&mut gso, &sock, ifindex, &two, &want);
    assert_eq!(gso.counts().gso_sends, 3);

    // Without GSO every datagram leaves with ID 0 (`ip_select_ident_segs()`), as sealed.
    let mut plain = UdpLink::bind(UdpConfig {
        gso: false,
        ..UdpConfig::bound_to(bind)
    })
    .expect("bind");
    let src = plain.local_addr();
    let batch: Vec<Datagram> = (0..8)
        .map(|psn| Datagram::to(dst, sealed(psn, 1000, src, dst)))
        .collect();
    send_and_check(&mut plain, &sock, ifindex, &batch, &[0; 8]);
    assert_eq!(plain.counts().gso_sends, 0);

    // A run whose segments exceed the veth's 1,500-byte MTU: the kernel refuses the GSO
    // send, the link resends through sendmmsg, which refuses each with EMSGSIZE: both
    // counted, none sent, nothing lost uncounted.
    let mut big = UdpLink::bind(UdpConfig::bound_to(bind)).expect("bind");
    let src = big.local_addr();
    let batch: Vec<Datagram> = (0..2)
        .map(|psn| Datagram::to(dst, sealed(psn, 1600, src, dst)))
        .collect();
    assert_eq!(big.send(&batch).expect("send"), 2);
    let c = big.counts();
    println!("over-MTU run: {c:?}, GSO still on: {}", big.gso_active());
    assert_eq!(c.sent, 0);
    assert_eq!(c.gso_sends, 0);
    assert_eq!(c.dropped(UdpDropReason::SendTooBig), 2);
}
