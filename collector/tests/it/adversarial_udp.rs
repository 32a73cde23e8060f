//! Adversarial tests of the soft RoCEv2 receive path: whatever arrives at the collector's UDP
//! port is counted with a reason from the closed set, never panics, and never stops the
//! daemon from serving agents and `/metrics`.

use crate::support;

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use support::{
    collector_config, eventually, http_get, sample, AgentOptions, MetricStream, TestAgent,
};
use uctel_protocol::control::DataPath;
use uctel_transport::soft::icrc;
use uctel_transport::soft::packet::{BthRepr, Opcode, PacketRepr, RethRepr, DEFAULT_PKEY};
use uctel_transport::soft::psn::Psn;

fn bth(opcode: Opcode, dest_qpn: u32, psn: u32) -> BthRepr {
    BthRepr {
        opcode,
        solicited: false,
        mig_req: false,
        pad_count: 0,
        pkey: DEFAULT_PKEY,
        fecn: false,
        becn: false,
        dest_qpn,
        ack_req: false,
        psn: Psn::new(psn),
    }
}

/// A sealed RoCEv2 UDP payload from `src` to `dst`.
fn packet(repr: &PacketRepr<'_>, src: SocketAddr, dst: SocketAddr) -> Vec<u8> {
    let mut out = Vec::new();
    repr.emit(&mut out).expect("emit");
    icrc::seal(&mut out, src, dst).expect("seal");
    out
}

fn transport_dropped(text: &str, reason: &str) -> f64 {
    sample(
        text,
        &format!("uctel_collector_transport_packets_dropped_total{{reason=\"{reason}\"}}"),
    )
    .unwrap_or(0.0)
}

fn frames_dropped(text: &str, agent: &str, reason: &str) -> f64 {
    sample(
        text,
        &format!("uctel_collector_frames_dropped_total{{agent=\"{agent}\",reason=\"{reason}\"}}"),
    )
    .unwrap_or(0.0)
}

/// Sends `datagrams` paced so that the loopback socket buffer never overflows (kernel drops
/// would make the exact counts below meaningless).
fn send_paced(udp: &UdpSocket, target: SocketAddr, datagrams: &[Vec<u8>]) {
    for (i, d) in datagrams.iter().enumerate() {
        udp.send_to(d, target).unwrap();
        if i % 256 == 255 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_and_forged_datagrams_are_counted_by_reason() {
    let dir = tempfile::tempdir().unwrap();
    let running = uctel_collector::start(collector_config(dir.path()))
        .await
        .unwrap();
    let target = running.transport_addr().unwrap();
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    let src = udp.local_addr().unwrap();
    // Random bytes of random lengths (seeded), none a UC packet: a non-UC opcode byte.
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let random: Vec<Vec<u8>> = (0..1000)
        .map(|_| {
            let len = (next() % 1500) as usize;
            let mut d: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if let Some(op) = d.first_mut() {
                *op = 0x64 | (*op & 0x03); // a UD opcode: never UC
            }
            d
        })
        .collect();
    send_paced(&udp, target, &random);
    // Well-formed and sealed, but for a QPN nobody has.
    let unknown: Vec<Vec<u8>> = (0..300u32)
        .map(|i| {
            let repr = PacketRepr {
                bth: bth(Opcode::SendOnly, 0x00ab_0000 + i, i),
                reth: None,
                imm: None,
                payload: &[1, 2, 3, 4],
            };
            packet(&repr, src, target)
        })
        .collect();
    send_paced(&udp, target, &unknown);
    // Well-formed, but the ICRC was computed for another destination.
    let other = SocketAddr::from(([10, 9, 8, 7], target.port()));
    let bad_icrc: Vec<Vec<u8>> = (0..200u32)
        .map(|i| {
            let repr = PacketRepr {
                bth: bth(Opcode::SendOnly, 0x11, i),
                reth: None,
                imm: None,
                payload: &[9; 64],
            };
            packet(&repr, src, other)
        })
        .collect();
    send_paced(&udp, target, &bad_icrc);
    let text = eventually("device drop counters", || {
        let text = running.render_metrics().ok()?;
        let done = transport_dropped(&text, "malformed") >= 1000.0
            && transport_dropped(&text, "unknown_qpn") >= 300.0
            && transport_dropped(&text, "bad_icrc") >= 200.0;
        done.then_some(text)
    })
    .await;
    assert_eq!(transport_dropped(&text, "malformed"), 1000.0, "{text}");
    assert_eq!(transport_dropped(&text, "unknown_qpn"), 300.0, "{text}");
    assert_eq!(transport_dropped(&text, "bad_icrc"), 200.0, "{text}");
    // Still serving.
    let agent = TestAgent::connect(running.control_addr(), AgentOptions::new("after"))
        .await
        .unwrap();
    agent.goodbye(Vec::new()).await;
    assert_eq!(http_get(running.metrics_addr(), "/metrics").await.0, 200);
    running.stop().await.unwrap();
}

/// RDMA WRITEs aimed at a live agent's ring with a wrong rkey, outside the ring, or crossing
/// its end are dropped by the UC responder rules and counted for that agent; a zero-length
/// Write-with-immediate (no RETH check applies, as in rxe) announcing a slot that holds no
/// such frame is counted by the slot check. The agent's own frames keep flowing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_writes_into_a_ring_are_counted_and_never_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let running = uctel_collector::start(collector_config(dir.path()))
        .await
        .unwrap();
    let target = running.transport_addr().unwrap();
    let mut opts = AgentOptions::new("victim");
    opts.capabilities = vec![DataPath::WriteWithImm];
    let mut agent = TestAgent::connect(running.control_addr(), opts)
        .await
        .unwrap();
    let mut metrics = MetricStream::new(1);
    agent.send(metrics.frame(0, 1)).await;
    let w = agent.welcome.clone();
    let qpn = w.qp.as_ref().unwrap().qpn;
    let ring_len = u64::from(w.slots) * u64::from(w.slot_bytes);
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    let src = udp.local_addr().unwrap();
    let payload = [0x5a; 256];
    let write = |va: u64, rkey: u32, len: u32, imm: u32, psn: u32| {
        let repr = PacketRepr {
            bth: bth(Opcode::RdmaWriteOnlyWithImmediate, qpn, psn),
            reth: Some(RethRepr {
                virtual_addr: va,
                rkey,
                dma_len: len,
            }),
            imm: Some(imm),
            payload: &payload[..len as usize],
        };
        packet(&repr, src, target)
    };
    let forged = vec![
        // Wrong rkey.
        write(w.ring_addr, w.rkey ^ 0x00ff_ff00, 256, 1, 100),
        // Past the ring's end.
        write(w.ring_addr + ring_len, w.rkey, 256, 2, 101),
        // Below the ring.
        write(w.ring_addr.wrapping_sub(4096), w.rkey, 256, 3, 102),
        // Crossing the end.
        write(w.ring_addr + ring_len - 100, w.rkey, 256, 4, 103),
        // Address wrap-around.
        write(u64::MAX - 10, w.rkey, 256, 5, 104),
    ];
    send_paced(&udp, target, &forged);
    // Zero-length Write-with-immediate announcing conn_seq 200: its slot holds nothing.
    send_paced(&udp, target, &[write(0, 0, 0, 200, 105)]);
    let text = eventually("QP drop counters folded", || {
        let text = running.render_metrics().ok()?;
        let done = frames_dropped(&text, "victim", "bad_rkey") >= 1.0
            && frames_dropped(&text, "victim", "out_of_bounds") >= 4.0
            && frames_dropped(&text, "victim", "malformed_frame")
                + frames_dropped(&text, "victim", "imm_mismatch")
                >= 1.0;
        done.then_some(text)
    })
    .await;
    assert_eq!(frames_dropped(&text, "victim", "bad_rkey"), 1.0, "{text}");
    assert_eq!(
        frames_dropped(&text, "victim", "out_of_bounds"),
        4.0,
        "{text}"
    );
    // The agent's frames still arrive and are accepted.
    for step in 1..20 {
        agent.send(metrics.frame(step, 1)).await;
    }
    agent.goodbye(vec![metrics.final_state()]).await;
    let l = eventually("ledger", || {
        running.ledger("victim").first().map(|(_, l)| *l)
    })
    .await;
    assert_eq!(l.accepted, 20, "{l:?}");
    assert_eq!(l.lost, 0, "{l:?}");
    running.stop().await.unwrap();
}

/// A datagram larger than the soft device's receive buffer (`max_datagram_bytes`, 9216 by
/// default) cannot be a RoCEv2 packet; it is dropped and counted like any malformed packet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_datagrams_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let running = uctel_collector::start(collector_config(dir.path()))
        .await
        .unwrap();
    let target = running.transport_addr().unwrap();
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    let big: Vec<Vec<u8>> = (0..50).map(|i| vec![i as u8; 20_000]).collect();
    send_paced(&udp, target, &big);
    let max = vec![0x24u8; 65_507];
    send_paced(&udp, target, &[max]);
    let text = eventually("oversized datagrams counted", || {
        let text = running.render_metrics().ok()?;
        (transport_dropped(&text, "malformed") >= 51.0).then_some(text)
    })
    .await;
    assert_eq!(transport_dropped(&text, "malformed"), 51.0, "{text}");
    running.stop().await.unwrap();
}

/// A flood of garbage at the UDP port while an agent streams and Prometheus scrapes: every
/// scrape is answered, the agent's frames are accounted, and the garbage is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flood_does_not_stop_metrics_or_agents() {
    let dir = tempfile::tempdir().unwrap();
    let running = uctel_collector::start(collector_config(dir.path()))
        .await
        .unwrap();
    let target = running.transport_addr().unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flooder = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
            let mut sent = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && sent < 2_000_000 {
                let _ = udp.send_to(&[0xffu8; 100], target);
                sent += 1;
            }
            sent
        })
    };
    let mut agent = TestAgent::connect(running.control_addr(), AgentOptions::new("steady"))
        .await
        .unwrap();
    let mut metrics = MetricStream::new(1);
    for step in 0..100 {
        agent.send(metrics.frame(step, 2)).await;
        if step % 20 == 0 {
            let (status, body) = http_get(running.metrics_addr(), "/metrics").await;
            assert_eq!(status, 200);
            assert!(
                body.contains("uctel_collector_agents_connected 1"),
                "{body}"
            );
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sent = flooder.join().unwrap();
    agent.goodbye(vec![metrics.final_state()]).await;
    let l = eventually("ledger", || {
        running.ledger("steady").first().map(|(_, l)| *l)
    })
    .await;
    // Under the flood the agent's packets may be lost in the kernel; what arrived is
    // accounted.
    assert_eq!(l.accepted + l.lost + l.dropped_after_tracking, 100, "{l:?}");
    let text = eventually("flood counted", || {
        let text = running.render_metrics().ok()?;
        (transport_dropped(&text, "malformed") > 0.0).then_some(text)
    })
    .await;
    assert!(transport_dropped(&text, "malformed") <= sent as f64);
    running.stop().await.unwrap();
}
