//! `UdpLink` over the loopback interface, IPv4 and IPv6: batched send and receive with the
//! right peer, local address and payload, ICRC sealing end to end, and the drop counters.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use uctel_transport::soft::icrc::{self, IcrcMatch};
use uctel_transport::soft::link::{Datagram, Link};
use uctel_transport::soft::packet::{BthRepr, Opcode, PacketRepr, DEFAULT_PKEY};
use uctel_transport::soft::psn::Psn;
use uctel_transport::soft::udp::{PollMode, UdpConfig, UdpDropReason, UdpLink};

/// Generous bound so a slow CI machine does not fail; never asserted as a timing.
const WAIT: Duration = Duration::from_secs(5);

fn link(bind: &str) -> UdpLink {
    UdpLink::bind(UdpConfig::bound_to(bind.parse().expect("addr"))).expect("bind")
}

/// Receives exactly `n` datagrams (or fails after `WAIT` per call).
fn recv_n(link: &mut UdpLink, n: usize) -> Vec<Datagram> {
    let mut out = Vec::new();
    while out.len() < n {
        let want = n - out.len();
        let got = link.recv(&mut out, want, Some(WAIT)).expect("recv");
        assert!(got > 0, "timed out after {} of {n}", out.len());
    }
    out
}

fn payload(i: usize) -> Vec<u8> {
    (0..(16 + i % 50)).map(|k| (k * 7 + i) as u8).collect()
}

fn batch_roundtrip(sender_bind: &str, receiver_bind: &str, receiver_ip: IpAddr) {
    let mut a = link(sender_bind);
    let mut b = link(receiver_bind);
    let dst = SocketAddr::new(receiver_ip, b.local_addr().port());
    let batch: Vec<Datagram> = (0..200).map(|i| Datagram::to(dst, payload(i))).collect();
    let mut sent = 0;
    while sent < batch.len() {
        sent += a.send(&batch[sent..]).expect("send");
    }
    let got = recv_n(&mut b, batch.len());
    for (i, d) in got.iter().enumerate() {
        assert_eq!(d.payload, payload(i), "datagram {i} (loopback keeps order)");
        assert_eq!(d.peer, a.local_addr());
        assert_eq!(d.local, Some(dst), "destination from PKTINFO");
    }
    assert_eq!(a.counts().sent, 200);
    assert_eq!(b.counts().received, 200);
    assert!(a.counts().send_calls < 200, "sendmmsg batches");
    assert!(b.counts().recv_calls <= 200);
}

#[test]
fn ipv4_batch_to_specific_bind() {
    batch_roundtrip(
        "127.0.0.1:0",
        "127.0.0.1:0",
        IpAddr::V4(Ipv4Addr::LOCALHOST),
    );
}

#[test]
fn ipv4_batch_to_wildcard_bind_reports_destination() {
    // 127.0.0.2 is also on lo: only PKTINFO can tell which address was used.
    batch_roundtrip(
        "127.0.0.1:0",
        "0.0.0.0:0",
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)),
    );
}

#[test]
fn ipv6_batch() {
    batch_roundtrip("[::1]:0", "[::1]:0", IpAddr::V6(Ipv6Addr::LOCALHOST));
    batch_roundtrip("[::1]:0", "[::]:0", IpAddr::V6(Ipv6Addr::LOCALHOST));
}

#[test]
fn dual_stack_receiver_sees_mapped_ipv4() {
    let mut a = link("127.0.0.1:0");
    let mut b = link("[::]:0");
    let dst = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), b.local_addr().port());
    assert_eq!(
        a.send(&[Datagram::to(dst, vec![1, 2, 3, 4])])
            .expect("send"),
        1
    );
    let got = recv_n(&mut b, 1);
    let mapped = IpAddr::V6(Ipv4Addr::LOCALHOST.to_ipv6_mapped());
    assert_eq!(got[0].peer, SocketAddr::new(mapped, a.local_addr().port()));
    assert_eq!(
        got[0].local,
        Some(SocketAddr::new(mapped, b.local_addr().port()))
    );
    // And the reply path: a dual-stack link sends to a plain IPv4 address.
    let back = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), a.local_addr().port());
    assert_eq!(b.send(&[Datagram::to(back, vec![5; 8])]).expect("send"), 1);
    assert_eq!(recv_n(&mut a, 1)[0].payload, vec![5; 8]);
}

#[test]
fn explicit_source_address_from_datagram_local() {
    let mut a = link("0.0.0.0:0");
    let mut b = link("127.0.0.1:0");
    let src = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3)), 0);
    let d = Datagram {
        peer: b.local_addr(),
        local: Some(src),
        payload: vec![9; 12],
    };
    assert_eq!(a.send(&[d.clone(), d]).expect("send"), 2);
    for got in recv_n(&mut b, 2) {
        assert_eq!(got.peer.ip(), src.ip());
        assert_eq!(got.peer.port(), a.local_addr().port());
    }
}

fn sealed_packet(psn: u32, len: usize) -> Vec<u8> {
    let body: Vec<u8> = (0..len).map(|i| (i * 7 + 1) as u8).collect();
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
    buf
}

/// The sender seals with IPv4 ID 0 (what Linux writes for DF datagrams from an unconnected
/// socket); the receiver's check infers the ID from the ICRC and must find 0. If Linux wrote
/// any other ID the check would still pass but report it, so this proves the send-side
/// assumption on this kernel.
#[test]
fn icrc_sealed_over_udp_verifies_and_kernel_sent_ipv4_id_zero() {
    for (a_bind, b_bind, dst_ip) in [
        ("0.0.0.0:0", "0.0.0.0:0", IpAddr::V4(Ipv4Addr::LOCALHOST)),
        ("[::]:0", "[::]:0", IpAddr::V4(Ipv4Addr::LOCALHOST)),
        ("[::]:0", "[::]:0", IpAddr::V6(Ipv6Addr::LOCALHOST)),
    ] {
        let mut a = link(a_bind);
        let mut b = link(b_bind);
        let dst = SocketAddr::new(dst_ip, b.local_addr().port());
        let src = a.source_addr_for(dst).expect("route");
        let batch: Vec<Datagram> = (0..32u32)
            .map(|psn| {
                let mut buf = sealed_packet(psn, 4 * psn as usize + 8);
                icrc::seal(&mut buf, src, dst).expect("seal");
                Datagram::to(dst, buf)
            })
            .collect();
        assert_eq!(a.send(&batch).expect("send"), batch.len());
        let expect_id = if dst_ip.is_ipv4() { Some(0) } else { None };
        for got in recv_n(&mut b, batch.len()) {
            let local = got.local.expect("local");
            assert_eq!(
                icrc::check(&got.payload, got.peer, local),
                Ok(IcrcMatch { ipv4_id: expect_id }),
                "{a_bind} -> {b_bind} via {dst_ip}"
            );
        }
    }
}

#[test]
fn oversized_datagram_is_dropped_and_counted() {
    let mut a = link("127.0.0.1:0");
    let mut b = UdpLink::bind(UdpConfig {
        max_datagram_bytes: 64,
        ..UdpConfig::bound_to("127.0.0.1:0".parse().expect("addr"))
    })
    .expect("bind");
    let dst = b.local_addr();
    let batch = vec![
        Datagram::to(dst, vec![1; 100]),
        Datagram::to(dst, vec![2; 64]),
    ];
    assert_eq!(a.send(&batch).expect("send"), 2);
    let got = recv_n(&mut b, 1);
    assert_eq!(got[0].payload, vec![2; 64]);
    assert_eq!(b.counts().dropped(UdpDropReason::RecvTruncated), 1);
    assert_eq!(b.counts().received, 1);
}

#[test]
fn timeouts_and_busy_poll() {
    let mut quiet = link("127.0.0.1:0");
    let mut out = Vec::new();
    assert_eq!(
        quiet.recv(&mut out, 8, Some(Duration::ZERO)).expect("poll"),
        0
    );
    assert_eq!(
        quiet
            .recv(&mut out, 8, Some(Duration::from_millis(10)))
            .expect("timed"),
        0
    );
    assert!(out.is_empty());

    let mut spin = UdpLink::bind(UdpConfig {
        poll_mode: PollMode::BusyPoll,
        ..UdpConfig::bound_to("127.0.0.1:0".parse().expect("addr"))
    })
    .expect("bind");
    assert_eq!(
        spin.recv(&mut out, 8, Some(Duration::from_millis(2)))
            .expect("spin"),
        0
    );
    let dst = spin.local_addr();
    assert_eq!(
        quiet.send(&[Datagram::to(dst, vec![7; 20])]).expect("send"),
        1
    );
    assert_eq!(recv_n(&mut spin, 1)[0].payload, vec![7; 20]);
}

#[test]
fn rejects_bad_config() {
    for config in [
        UdpConfig {
            batch: 0,
            ..UdpConfig::default()
        },
        UdpConfig {
            max_datagram_bytes: 70_000,
            ..UdpConfig::default()
        },
    ] {
        let err = UdpLink::bind(config).expect_err("invalid");
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    }
}

#[test]
fn config_parses_strictly() {
    let config: UdpConfig = serde_json::from_str(
        r#"{"bind": "[::1]:4791", "batch": 32, "poll_mode": "busy_poll", "recv_buffer_bytes": null}"#,
    )
    .expect("parse");
    assert_eq!(config.batch, 32);
    assert_eq!(config.poll_mode, PollMode::BusyPoll);
    assert_eq!(config.recv_buffer_bytes, None);
    assert_eq!(config.bind.port(), 4791);
    assert!(serde_json::from_str::<UdpConfig>(r#"{"batch_size": 3}"#).is_err());
    assert_eq!(UdpConfig::default().bind.port(), 4791);
}

#[test]
fn sink_counts_what_it_drains() {
    use std::time::Instant;
    use uctel_transport::soft::udp::UdpSink;

    let mut sink =
        UdpSink::bind("127.0.0.1:0".parse().expect("addr"), 32, 2048, 1 << 20).expect("bind sink");
    let dst = sink.local_addr().expect("addr");
    let mut a = link("127.0.0.1:0");
    let batch: Vec<Datagram> = (0..100)
        .map(|_| Datagram::to(dst, vec![0xab; 1000]))
        .collect();
    let mut sent = 0;
    while sent < batch.len() {
        sent += a.send(&batch[sent..]).expect("send");
    }
    let stats = sink.drain(100, Instant::now() + WAIT).expect("drain");
    assert_eq!(stats.messages, 100);
    assert_eq!(stats.bytes, 100_000);
    assert!(stats.calls >= 1 && stats.calls <= 100);
}

#[test]
fn gro_sink_counts_the_datagrams_of_coalesced_buffers() {
    use std::time::Instant;
    use uctel_transport::soft::udp::UdpSink;

    let mut sink =
        UdpSink::bind_gro("127.0.0.1:0".parse().expect("addr"), 8, 1 << 20).expect("bind sink");
    let dst = sink.local_addr().expect("addr");
    let mut a = link("127.0.0.1:0");
    // Sent 32 at a time: 3 GSO sends of 32 × 1045 B and one of 3 × 1045 B + 100 B.
    let mut batch: Vec<Datagram> = (0..99)
        .map(|_| Datagram::to(dst, vec![0xab; 1045]))
        .collect();
    batch.push(Datagram::to(dst, vec![0xcd; 100]));
    for chunk in batch.chunks(32) {
        let mut sent = 0;
        while sent < chunk.len() {
            sent += a.send(&chunk[sent..]).expect("send");
        }
    }
    assert_eq!(a.counts().gso_sends, 4, "{:?}", a.counts());
    let stats = sink.drain(100, Instant::now() + WAIT).expect("drain");
    assert_eq!(stats.messages, 100);
    assert_eq!(stats.bytes, 99 * 1045 + 100);
    assert_eq!(stats.gro_buffers, 4, "{stats:?}");
}

#[test]
fn recycled_buffers_are_refilled_and_a_backlog_is_read_in_growing_batches() {
    let mut a = link("127.0.0.1:0");
    let mut b = link("127.0.0.1:0");
    let dst = b.local_addr();
    let send_all = |a: &mut UdpLink, payloads: &[Vec<u8>]| {
        let batch: Vec<Datagram> = payloads
            .iter()
            .map(|p| Datagram::to(dst, p.clone()))
            .collect();
        let mut sent = 0;
        while sent < batch.len() {
            sent += a.send(&batch[sent..]).expect("send");
        }
    };
    let first_payloads: Vec<Vec<u8>> = (0..200).map(payload).collect();
    send_all(&mut a, &first_payloads);
    let first = recv_n(&mut b, 200);
    for (i, d) in first.iter().enumerate() {
        assert_eq!(d.payload, first_payloads[i], "datagram {i}");
    }
    // The whole backlog was queued before the first read: starting from a short vector,
    // the reads grow towards the configured batch (64) instead of staying short.
    let calls = b.counts().recv_calls;
    assert!(
        calls < 200 / 8,
        "{calls} recvmmsg calls for 200 queued datagrams"
    );

    // Give 64 buffers back; the next receives fill them (the second round's datagrams are
    // no longer than the shortest of the first, so no buffer has to grow).
    let recycled: Vec<*const u8> = first.iter().take(64).map(|d| d.payload.as_ptr()).collect();
    for d in first.into_iter().take(64) {
        b.recycle(d.payload);
    }
    let second_payloads: Vec<Vec<u8>> = (0..200).map(|i| vec![i as u8; 16]).collect();
    send_all(&mut a, &second_payloads);
    let second = recv_n(&mut b, 200);
    for (i, d) in second.iter().enumerate() {
        assert_eq!(
            d.payload, second_payloads[i],
            "datagram {i} of the second round"
        );
    }
    let reused = second
        .iter()
        .filter(|d| recycled.contains(&d.payload.as_ptr()))
        .count();
    assert_eq!(reused, 64, "every recycled buffer was refilled");
    assert_eq!(b.counts().received, 400);
}

fn link_with(bind: &str, gso: bool, gro: bool) -> UdpLink {
    UdpLink::bind(UdpConfig {
        gso,
        gro,
        ..UdpConfig::bound_to(bind.parse().expect("addr"))
    })
    .expect("bind")
}

fn send_all(link: &mut UdpLink, batch: &[Datagram]) {
    let mut sent = 0;
    while sent < batch.len() {
        sent += link.send(&batch[sent..]).expect("send");
    }
}

/// Payload `i` of a batch, `len` bytes, distinct per datagram.
fn bytes(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|k| (k * 13 + i * 7) as u8).collect()
}

/// A batch with runs and loners for two receivers `b` and `c`: runs of equal sizes with a
/// shorter last, a run longer than the 64-segment limit, sizes that start no run, and
/// alternating destinations. Returns the batch and, per destination, the datagrams in order.
fn mixed_batch(b: SocketAddr, c: SocketAddr) -> Vec<Datagram> {
    let mut sizes: Vec<(SocketAddr, usize)> = Vec::new();
    sizes.extend(std::iter::repeat_n((b, 1000), 10));
    sizes.push((b, 300));
    sizes.push((b, 1200));
    sizes.extend(std::iter::repeat_n((b, 100), 70));
    sizes.extend(std::iter::repeat_n((c, 100), 5));
    for k in 0..3 {
        sizes.push((if k % 2 == 0 { b } else { c }, 400));
    }
    sizes.push((b, 700));
    sizes.push((b, 900));
    sizes
        .into_iter()
        .enumerate()
        .map(|(i, (dst, len))| Datagram::to(dst, bytes(i, len)))
        .collect()
}

/// Sends `mixed_batch` from `a` and checks both receivers got their datagrams, identical and
/// in order, with the sender as peer and the destination as local address.
fn mixed_roundtrip(a: &mut UdpLink, b: &mut UdpLink, c: &mut UdpLink) {
    let (b_dst, c_dst) = (b.local_addr(), c.local_addr());
    let batch = mixed_batch(b_dst, c_dst);
    send_all(a, &batch);
    for (rx, dst) in [(b, b_dst), (c, c_dst)] {
        let want: Vec<&Datagram> = batch.iter().filter(|d| d.peer == dst).collect();
        let got = recv_n(rx, want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.payload, w.payload, "datagram {i} to {dst}");
            assert_eq!(g.peer, a.local_addr(), "datagram {i} to {dst}");
            assert_eq!(g.local, Some(dst), "datagram {i} to {dst}");
        }
        assert_eq!(rx.counts().received, want.len() as u64);
        let mut extra = Vec::new();
        assert_eq!(
            rx.recv(&mut extra, 64, Some(Duration::ZERO)).expect("recv"),
            0
        );
    }
    assert_eq!(a.counts().sent, batch.len() as u64);
}

#[test]
fn gso_sender_to_gro_receiver_delivers_every_datagram_in_order() {
    let mut a = link_with("127.0.0.1:0", true, true);
    let mut b = link_with("127.0.0.1:0", true, true);
    let mut c = link_with("127.0.0.1:0", true, true);
    assert!(a.gso_active(), "UDP_SEGMENT available on this kernel");
    assert!(b.gro_active(), "UDP_GRO available on this kernel");
    mixed_roundtrip(&mut a, &mut b, &mut c);
    // Runs: 10 × 1000 + 300; 1200 + 100 (shorter last); 64 × 100; 5 × 100; 5 × 100 to c.
    assert_eq!(a.counts().gso_sends, 5, "{:?}", a.counts());
    // On loopback a GSO buffer reaches a GRO socket whole: every run to b arrives coalesced.
    assert_eq!(b.counts().gro_buffers, 4, "{:?}", b.counts());
    assert_eq!(c.counts().gro_buffers, 1, "{:?}", c.counts());
}

/// Views (`recv_each`) and copies (`recv`) take turns on one link, with maxima smaller than
/// a coalesced buffer: together they hand out every datagram once, identical and in order.
fn views_and_copies_take_turns(gro: bool) {
    let mut a = link_with("127.0.0.1:0", true, true);
    let mut b = link_with("127.0.0.1:0", true, gro);
    let dst = b.local_addr();
    let batch: Vec<Datagram> = mixed_batch(dst, dst)
        .into_iter()
        .map(|mut d| {
            d.peer = dst;
            d
        })
        .collect();
    send_all(&mut a, &batch);
    let mut got: Vec<Datagram> = Vec::new();
    let mut turn = 0;
    while got.len() < batch.len() {
        let n = if turn % 2 == 0 {
            b.recv_each(3, Some(WAIT), &mut |v| {
                got.push(Datagram {
                    peer: v.peer,
                    local: v.local,
                    payload: v.payload.to_vec(),
                });
            })
        } else {
            b.recv(&mut got, 5, Some(WAIT))
        }
        .expect("recv");
        assert!(
            n > 0 && n <= 5,
            "turn {turn}: {n} after {} datagrams",
            got.len()
        );
        turn += 1;
    }
    assert_eq!(got.len(), batch.len());
    for (i, (g, w)) in got.iter().zip(&batch).enumerate() {
        assert_eq!(g.payload, w.payload, "datagram {i}");
        assert_eq!(g.peer, a.local_addr(), "datagram {i}");
        assert_eq!(g.local, Some(dst), "datagram {i}");
    }
    assert_eq!(b.counts().received, batch.len() as u64);
    let nothing = b.recv_each(64, Some(Duration::ZERO), &mut |v| panic!("extra {v:?}"));
    assert_eq!(nothing.expect("recv"), 0);
    if gro {
        assert!(b.counts().gro_buffers > 0, "{:?}", b.counts());
    }
}

#[test]
fn views_and_copies_share_one_cursor_over_coalesced_buffers() {
    views_and_copies_take_turns(true);
}

#[test]
fn views_and_copies_share_one_cursor_over_single_datagrams() {
    views_and_copies_take_turns(false);
}

#[test]
fn gso_sender_to_receiver_without_gro() {
    let mut a = link_with("127.0.0.1:0", true, false);
    let mut b = link_with("127.0.0.1:0", false, false);
    let mut c = link_with("127.0.0.1:0", true, false);
    assert!(!b.gro_active());
    mixed_roundtrip(&mut a, &mut b, &mut c);
    assert_eq!(a.counts().gso_sends, 5);
    // The kernel segments on delivery to a socket without UDP_GRO.
    assert_eq!(b.counts().gro_buffers, 0);
    assert_eq!(c.counts().gro_buffers, 0);
}

#[test]
fn sender_without_gso_to_gro_receiver() {
    let mut a = link_with("127.0.0.1:0", false, true);
    let mut b = link_with("127.0.0.1:0", true, true);
    let mut c = link_with("127.0.0.1:0", true, true);
    assert!(!a.gso_active());
    assert!(b.gro_active());
    mixed_roundtrip(&mut a, &mut b, &mut c);
    assert_eq!(a.counts().gso_sends, 0);
    // Loopback has no GRO of its own: single datagrams stay single.
    assert_eq!(b.counts().gro_buffers + c.counts().gro_buffers, 0);
}

#[test]
fn gso_and_gro_off_is_the_plain_path() {
    let mut a = link_with("127.0.0.1:0", false, false);
    let mut b = link_with("127.0.0.1:0", false, false);
    let mut c = link_with("127.0.0.1:0", false, false);
    assert!(!a.gso_active() && !a.gro_active());
    mixed_roundtrip(&mut a, &mut b, &mut c);
    assert_eq!(a.counts().gso_sends, 0);
    assert_eq!(b.counts().gro_buffers + c.counts().gro_buffers, 0);
    assert!(
        a.counts().send_calls < 20,
        "sendmmsg batches: {:?}",
        a.counts()
    );
}

#[test]
fn gso_over_ipv6_and_wildcard_receiver() {
    let mut a = link_with("[::1]:0", true, true);
    let mut b = link_with("[::]:0", true, true);
    let dst = SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), b.local_addr().port());
    let batch: Vec<Datagram> = (0..100)
        .map(|i| Datagram::to(dst, bytes(i, 1045)))
        .collect();
    send_all(&mut a, &batch);
    let got = recv_n(&mut b, batch.len());
    for (i, (g, w)) in got.iter().zip(&batch).enumerate() {
        assert_eq!(g.payload, w.payload, "datagram {i}");
        assert_eq!(g.peer, a.local_addr());
        assert_eq!(g.local, Some(dst), "destination from PKTINFO");
    }
    assert_eq!(a.counts().gso_sends, 2, "64 + 36");
    assert_eq!(b.counts().gro_buffers, 2);
}

/// A receiver asking for fewer datagrams than a coalesced buffer holds gets the rest on the
/// next calls, and `readiness` says so.
#[test]
fn a_coalesced_buffer_is_handed_out_over_several_receives() {
    use uctel_transport::soft::link::Readiness;
    let mut a = link_with("127.0.0.1:0", true, true);
    let mut b = link_with("127.0.0.1:0", true, true);
    let dst = b.local_addr();
    let batch: Vec<Datagram> = (0..32).map(|i| Datagram::to(dst, bytes(i, 1045))).collect();
    send_all(&mut a, &batch);
    let mut got = Vec::new();
    assert_eq!(b.recv(&mut got, 5, Some(WAIT)).expect("recv"), 5);
    assert_eq!(b.readiness(), Readiness::Now);
    while got.len() < 32 {
        assert!(b.recv(&mut got, 5, Some(WAIT)).expect("recv") > 0);
    }
    for (g, w) in got.iter().zip(&batch) {
        assert_eq!(g.payload, w.payload);
    }
    assert_eq!(b.counts().received, 32);
    assert_eq!(b.counts().gro_buffers, 1);
    assert_ne!(b.readiness(), Readiness::Now);
}

/// IPv4 GSO: segment `i` leaves with IPv4 ID `i` (proven on the wire by the veth capture in
/// `udp_gso_capture.rs`), so the sender reseals it for that ID; the receiver's check finds it.
#[test]
fn gso_segments_are_resealed_for_their_ipv4_id() {
    let mut a = link_with("127.0.0.1:0", true, true);
    let mut b = link_with("127.0.0.1:0", true, true);
    let dst = b.local_addr();
    let src = a.local_addr();
    let batch: Vec<Datagram> = (0..40u32)
        .map(|psn| {
            let mut buf = sealed_packet(psn, 1000);
            icrc::seal(&mut buf, src, dst).expect("seal");
            Datagram::to(dst, buf)
        })
        .collect();
    send_all(&mut a, &batch);
    assert_eq!(a.counts().gso_sends, 1);
    for (i, got) in recv_n(&mut b, batch.len()).iter().enumerate() {
        let m = icrc::check(&got.payload, got.peer, got.local.expect("local")).expect("icrc");
        assert_eq!(m.ipv4_id, Some(i as u16), "segment {i}");
        // Only the ICRC differs from what was handed to `send`.
        let body = got.payload.len() - 4;
        assert_eq!(got.payload[..body], batch[i].payload[..body]);
    }
}
