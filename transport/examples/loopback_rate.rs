//! Loopback message rate of the soft transport next to a bare `recvmmsg` sink, measured in the
//! same run on 127.0.0.1 with 1 KiB frames (one 1060-byte RoCEv2 RDMA WRITE_WITH_IMM packet
//! each).
//!
//! Three receivers, each fed by a sender thread running flat out for the measured interval:
//!
//! 1. `udp sink`: raw `sendmmsg` of 1060-byte datagrams → [`UdpSink`] (`recvmmsg`, discard).
//!    The baseline: what the kernel hands one thread.
//! 2. `soft rx`: raw `sendmmsg` replaying pre-sealed WRITE_WITH_IMM packets → a soft device
//!    (busy-poll): ICRC check, UC responder, placement into the ring, completions, receive WR
//!    reposts. The soft receive path against the same sender.
//! 3. `soft e2e`: soft device sender (post_send, segmentation, ICRC, sendmmsg) → soft device
//!    receiver.
//!
//! Prints messages/s and the ratio to the baseline. Usage:
//! `cargo run --release -p uctel-transport --example loopback_rate [seconds] [rounds]`
//! (default 1 s, 3 rounds; the three runs are interleaved and medians reported).
//! Rates on a shared or virtual machine vary from run to run; compare ratios within one run.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use uctel_transport::api::{
    gid_from_ip, AccessFlags, Device, QpEndpoint, QpInitAttr, QpType, RecvWr, SendWr, Sge,
    WorkCompletion,
};
use uctel_transport::soft::device::{ProgressMode, SoftConfig, SoftDevice};
use uctel_transport::soft::engine::{LocalSge, RtrAttr, SendWqe, UcQp, UcQpConfig, VecCq};
use uctel_transport::soft::icrc;
use uctel_transport::soft::link::{Datagram, Link};
use uctel_transport::soft::memory::MrTable;
use uctel_transport::soft::udp::{UdpConfig, UdpLink, UdpSink};

const FRAME: usize = 1024;
const SLOTS: u64 = 1024;
const BATCH: usize = 64;
const WARMUP: Duration = Duration::from_millis(300);

type Error = Box<dyn std::error::Error + Send + Sync>;

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// Result of one receiver run.
struct Rate {
    messages: u64,
    seconds: f64,
    sender_offered: u64,
}

impl Rate {
    fn per_second(&self) -> f64 {
        self.messages as f64 / self.seconds
    }
}

/// Sends `packets` round-robin from a fresh UDP link to `dest` until `stop`; counts datagrams
/// the kernel took.
fn raw_sender(
    link: UdpLink,
    dest: SocketAddr,
    packets: Vec<Vec<u8>>,
    stop: Arc<AtomicBool>,
    offered: Arc<AtomicU64>,
) -> thread::JoinHandle<Result<(), std::io::Error>> {
    thread::spawn(move || {
        let mut link = link;
        let batch: Vec<Vec<Datagram>> = packets
            .chunks(BATCH)
            .map(|c| c.iter().map(|p| Datagram::to(dest, p.clone())).collect())
            .collect();
        let mut i = 0;
        while !stop.load(Ordering::Relaxed) {
            let chunk = &batch[i % batch.len()];
            i += 1;
            let n = link.send(chunk)?;
            offered.fetch_add(n as u64, Ordering::Relaxed);
            if n < chunk.len() {
                thread::yield_now();
            }
        }
        Ok(())
    })
}

fn baseline(seconds: f64) -> Result<Rate, Error> {
    let mut sink = UdpSink::bind(loopback(), BATCH, 2048, 8 << 20)?;
    let dest = sink.local_addr()?;
    let link = UdpLink::bind(UdpConfig {
        batch: BATCH,
        ..UdpConfig::bound_to(loopback())
    })?;
    let stop = Arc::new(AtomicBool::new(false));
    let offered = Arc::new(AtomicU64::new(0));
    let sender = raw_sender(
        link,
        dest,
        vec![vec![0x5a; 1060]; 256],
        stop.clone(),
        offered.clone(),
    );
    sink.drain(u64::MAX, Instant::now() + WARMUP)?;
    let before = offered.load(Ordering::Relaxed);
    let start = Instant::now();
    let stats = sink.drain(u64::MAX, start + Duration::from_secs_f64(seconds))?;
    let elapsed = start.elapsed().as_secs_f64();
    let sent = offered.load(Ordering::Relaxed) - before;
    stop.store(true, Ordering::Relaxed);
    sender.join().map_err(|_| "sender panicked")??;
    Ok(Rate {
        messages: stats.messages,
        seconds: elapsed,
        sender_offered: sent,
    })
}

/// A busy-poll soft device on 127.0.0.1 with a collector-style QP and ring.
struct Receiver {
    soft: SoftDevice,
    dev: Device,
}

fn soft_device() -> Result<SoftDevice, Error> {
    let config = SoftConfig {
        udp: UdpConfig {
            batch: BATCH,
            ..UdpConfig::bound_to(loopback())
        },
        progress: ProgressMode::BusyPoll,
        batch: BATCH,
        ..SoftConfig::default()
    };
    Ok(SoftDevice::open(&config)?)
}

/// Runs the soft receive loop for `seconds` after a warm-up; returns completions counted in
/// the measured interval.
fn receive_loop(
    rx: &Receiver,
    cq: &uctel_transport::api::CompletionQueue,
    qp: &uctel_transport::api::QueuePair,
    seconds: f64,
    sender_offered: &AtomicU64,
) -> Result<Rate, Error> {
    let zero: Vec<RecvWr<'_>> = (0..256).map(RecvWr::zero_length).collect();
    let mut wcs = vec![WorkCompletion::default(); 256];
    let mut run = |until: Instant| -> Result<u64, Error> {
        let mut n_total = 0u64;
        while Instant::now() < until {
            let n = cq.poll(&mut wcs);
            if n > 0 {
                n_total += n as u64;
                qp.post_recv(&zero[..n])?;
            }
        }
        Ok(n_total)
    };
    run(Instant::now() + WARMUP)?;
    let before = sender_offered.load(Ordering::Relaxed);
    let start = Instant::now();
    let messages = run(start + Duration::from_secs_f64(seconds))?;
    let elapsed = start.elapsed().as_secs_f64();
    let _ = &rx.soft;
    Ok(Rate {
        messages,
        seconds: elapsed,
        sender_offered: sender_offered.load(Ordering::Relaxed) - before,
    })
}

fn soft_rx(seconds: f64) -> Result<Rate, Error> {
    let soft = soft_device()?;
    let rx = Receiver {
        dev: Device::from(soft.clone()),
        soft,
    };
    let pd = rx.dev.alloc_pd()?;
    let cq = rx.dev.create_cq(4096)?;
    let qp = rx.dev.alloc_pd()?.create_qp(&QpInitAttr {
        qp_type: QpType::Uc,
        send_cq: &cq,
        recv_cq: &cq,
        max_send_wr: 16,
        max_recv_wr: 1024,
        access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        max_mtu: None,
    })?;
    let ring = pd.reg_mr(
        SLOTS as usize * FRAME,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
    )?;
    let zero: Vec<RecvWr<'_>> = (0..1024).map(RecvWr::zero_length).collect();
    qp.post_recv(&zero)?;

    let link = UdpLink::bind(UdpConfig {
        batch: BATCH,
        ..UdpConfig::bound_to(loopback())
    })?;
    let sender_addr = link.local_addr();
    qp.connect(&QpEndpoint {
        gid: gid_from_ip(sender_addr.ip()),
        qpn: 0x11,
        psn: 0,
        mtu: 1024,
        udp_addr: Some(sender_addr),
    })?;
    // Pre-sealed WRITE_WITH_IMM packets with consecutive PSNs, built by a UC engine.
    let dest = rx.soft.local_addr();
    let mem = MrTable::new();
    let src = mem.register(FRAME, AccessFlags::LOCAL_WRITE)?;
    src.write_at(0, &[0xa5; FRAME])?;
    let mut engine = UcQp::new(UcQpConfig {
        qpn: 0x11,
        max_send_wr: 1,
        max_recv_wr: 1,
    });
    engine.modify_to_init(AccessFlags::LOCAL_WRITE)?;
    engine.modify_to_rtr(RtrAttr {
        dest_qpn: qp.qp_num(),
        rq_psn: 0,
        path_mtu: uctel_transport::api::Mtu::Mtu1024,
    })?;
    engine.modify_to_rts(0)?;
    let mut scq = VecCq::new(1);
    let mut packets = Vec::new();
    for seq in 0..4096u64 {
        engine
            .post_send(SendWqe {
                wr_id: seq,
                opcode: uctel_transport::api::SendOpcode::RdmaWriteWithImm {
                    remote_addr: ring.addr() + (seq % SLOTS) * FRAME as u64,
                    rkey: ring.rkey(),
                    imm: seq as u32,
                },
                sge: Some(LocalSge {
                    lkey: src.key(),
                    offset: 0,
                    length: FRAME as u32,
                }),
                signaled: false,
            })
            .map_err(|e| format!("{e:?}"))?;
        let mut buf = Vec::new();
        engine
            .poll_transmit(&mem, &mut buf, &mut scq)
            .ok_or("no packet")?;
        icrc::seal(&mut buf, sender_addr, dest)?;
        packets.push(buf);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let offered = Arc::new(AtomicU64::new(0));
    let sender = raw_sender(link, dest, packets, stop.clone(), offered.clone());
    let rate = receive_loop(&rx, &cq, &qp, seconds, &offered);
    stop.store(true, Ordering::Relaxed);
    sender.join().map_err(|_| "sender panicked")??;
    let stats = qp.stats();
    eprintln!(
        "  soft rx: QP drops {:?}, device drops {:?}, PSN resyncs {} (the sender cycles PSNs every 4096, so ≥ 1 per cycle)",
        stats.drops,
        rx.dev.stats().drops,
        stats.psn_resyncs
    );
    rate
}

fn soft_e2e(seconds: f64) -> Result<Rate, Error> {
    let rx_soft = soft_device()?;
    let rx = Receiver {
        dev: Device::from(rx_soft.clone()),
        soft: rx_soft,
    };
    let pd = rx.dev.alloc_pd()?;
    let cq = rx.dev.create_cq(4096)?;
    let qp = pd.create_qp(&QpInitAttr {
        qp_type: QpType::Uc,
        send_cq: &cq,
        recv_cq: &cq,
        max_send_wr: 16,
        max_recv_wr: 1024,
        access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        max_mtu: None,
    })?;
    let ring = pd.reg_mr(
        SLOTS as usize * FRAME,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
    )?;
    let zero: Vec<RecvWr<'_>> = (0..1024).map(RecvWr::zero_length).collect();
    qp.post_recv(&zero)?;

    let tx = Device::from(soft_device()?);
    let tx_pd = tx.alloc_pd()?;
    let tx_cq = tx.create_cq(4096)?;
    let tx_qp = tx_pd.create_qp(&QpInitAttr {
        qp_type: QpType::Uc,
        send_cq: &tx_cq,
        recv_cq: &tx_cq,
        max_send_wr: 1024,
        max_recv_wr: 1,
        access: AccessFlags::LOCAL_WRITE,
        max_mtu: None,
    })?;
    tx_qp.connect(&qp.local_endpoint())?;
    qp.connect(&tx_qp.local_endpoint())?;
    let (ring_addr, rkey) = (ring.addr(), ring.rkey());

    let stop = Arc::new(AtomicBool::new(false));
    let offered = Arc::new(AtomicU64::new(0));
    let sender = {
        let (stop, offered) = (stop.clone(), offered.clone());
        thread::spawn(move || -> Result<(), Error> {
            let src = tx_pd.reg_mr(FRAME, AccessFlags::LOCAL_WRITE)?;
            src.write_at(0, &[0x3c; FRAME])?;
            let mut seq = 0u64;
            let mut wcs = vec![WorkCompletion::default(); 64];
            while !stop.load(Ordering::Relaxed) {
                let wrs: Vec<SendWr<'_>> = (seq..seq + BATCH as u64)
                    .map(|s| {
                        SendWr::write_with_imm(
                            s,
                            Some(Sge::new(&src, 0, FRAME as u32)),
                            ring_addr + (s % SLOTS) * FRAME as u64,
                            rkey,
                            s as u32,
                        )
                        .with_signaled(false)
                    })
                    .collect();
                match tx_qp.post_send(&wrs) {
                    Ok(()) => {
                        seq += BATCH as u64;
                        offered.fetch_add(BATCH as u64, Ordering::Relaxed);
                    }
                    Err(e) if e.is_full() => {
                        seq += e.posted as u64;
                        offered.fetch_add(e.posted as u64, Ordering::Relaxed);
                    }
                    Err(e) => return Err(e.into()),
                }
                // Drives the sender device (sends what the socket refused earlier).
                let _ = tx_cq.poll(&mut wcs);
            }
            Ok(())
        })
    };
    let rate = receive_loop(&rx, &cq, &qp, seconds, &offered);
    stop.store(true, Ordering::Relaxed);
    sender.join().map_err(|_| "sender panicked")??;
    let stats = qp.stats();
    eprintln!(
        "  soft e2e: QP drops {:?}, device drops {:?}, PSN resyncs {} (each = kernel socket loss)",
        stats.drops,
        rx.dev.stats().drops,
        stats.psn_resyncs
    );
    rate
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let seconds: f64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(1.0);
    let rounds: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(3);
    // Interleave the three runs so machine load affects them alike; report medians.
    let mut rates: [Vec<f64>; 3] = Default::default();
    let mut offered: [Vec<f64>; 3] = Default::default();
    for round in 0..rounds {
        let runs = [baseline(seconds)?, soft_rx(seconds)?, soft_e2e(seconds)?];
        for (i, r) in runs.iter().enumerate() {
            rates[i].push(r.per_second());
            offered[i].push(r.sender_offered as f64 / r.seconds);
        }
        eprintln!(
            "  round {round}: sink {:.0}/s, soft rx {:.0}/s, soft e2e {:.0}/s",
            runs[0].per_second(),
            runs[1].per_second(),
            runs[2].per_second()
        );
    }
    let base = median(rates[0].clone());
    println!(
        "loopback 127.0.0.1, 1 KiB frames (1060-byte UDP payloads), {rounds} x {seconds} s, medians"
    );
    println!(
        "{:<10} {:>14} {:>10} {:>16}",
        "receiver", "messages/s", "vs sink", "sender offered/s"
    );
    for (i, name) in ["udp sink", "soft rx", "soft e2e"].iter().enumerate() {
        let r = median(rates[i].clone());
        println!(
            "{:<10} {:>14.0} {:>9.2}x {:>16.0}",
            name,
            r,
            r / base,
            median(offered[i].clone())
        );
    }
    Ok(())
}
