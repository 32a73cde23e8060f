//! The reliability trade-off, measured: the same paced frame stream over a UC and over an RC
//! QP pair at several injected loss rates, in one run.
//!
//! Two soft devices in this process, each on its own UDP loopback socket with the soft
//! transport's fault injector dropping each datagram it sends with probability `loss` (data
//! one way, RC's ACKs and NAKs the other). The sender posts one RDMA Write-with-immediate per
//! frame at a fixed offered rate into a ring at the receiver; each frame carries the time it
//! was due (the agent's timestamp in a real frame) and the receiver takes its latency when it
//! polls the completion (the collector's ingest). Per cell:
//!
//! * frames delivered per second and the fraction of offered frames delivered (each frame
//!   counted once by sequence; duplicates and reordering counted apart, and none are expected);
//! * delivery latency p50 / p99 (due time → receive completion polled), microseconds, over
//!   the frames delivered (a lost UC frame has no latency; at 5 % loss one in twenty is not
//!   in UC's figures);
//! * CPU per offered frame on each side: the posting (or polling) thread plus that device's
//!   progress thread (`/proc/self/task/*/stat`, clock ticks, so a cell of a few seconds
//!   resolves to about 1 %);
//! * bytes on the wire per delivered frame: every datagram both devices handed to their
//!   sockets (lost ones included, ACKs included), UDP payload + 28 B of IPv4 and UDP header;
//! * the RC QP's retransmissions, timeouts and NAKs.
//!
//! This measures the transports, not the daemons: no control plane, no credits, no frame
//! decoding. A sender that finds its send queue full (RC waiting for ACKs) waits, and the
//! frame's latency includes the wait.

use std::io;
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use uctel_transport::api::{
    AccessFlags, Device, PostSendErrorKind, QpInitAttr, QpType, RcAttr, RecvWr, SendWr, Sge,
    WcOpcode, WcStatus, WorkCompletion,
};
use uctel_transport::soft::device::{ProgressMode, SoftConfig, SoftDevice};
use uctel_transport::soft::fault::{FaultConfig, FaultDirection, FaultInjector};
use uctel_transport::soft::link::{Datagram, Link, Readiness};
use uctel_transport::soft::udp::{UdpConfig, UdpLink};

use crate::cpu;

/// IPv4 (20 B) + UDP (8 B) header bytes per datagram.
const IP_UDP_HEADER_BYTES: u64 = 28;
/// Send queue depth (frames in flight: on the wire for UC, unacknowledged for RC).
const SQ_DEPTH: u32 = 256;
/// Receive WRs kept posted.
const RQ_DEPTH: u32 = 1024;
/// Ring slots at the receiver.
const RING_SLOTS: u64 = 4096;
/// How long the receiver keeps polling after the last frame was due (RC retransmissions).
const DRAIN: Duration = Duration::from_secs(2);

/// What to measure.
#[derive(Clone, Debug)]
pub struct TradeoffConfig {
    /// Bytes per frame (one packet: at most the path MTU, 1024).
    pub frame_bytes: usize,
    /// Offered frames per second.
    pub rate_fps: u64,
    /// Sending time per cell.
    pub duration: Duration,
    /// Injected loss probabilities per datagram.
    pub losses: Vec<f64>,
    /// The RC QPs' attributes.
    pub rc: RcAttr,
    /// Seed of the fault injectors.
    pub seed: u64,
}

/// One cell: a class at a loss rate.
#[derive(Clone, Debug, Serialize)]
pub struct TradeoffRow {
    /// `uc` or `rc`.
    pub class: &'static str,
    /// Injected loss probability per datagram, each direction.
    pub loss: f64,
    /// Frames offered.
    pub offered: u64,
    /// Distinct frames delivered.
    pub delivered: u64,
    /// Frames delivered more than once (must be 0).
    pub duplicates: u64,
    /// Frames delivered after a later one (must be 0 on RC).
    pub out_of_order: u64,
    /// Delivered frames per second, over the sending window or until the last delivery when
    /// that came later (a sender that fell behind).
    pub delivered_per_second: f64,
    /// `delivered / offered`.
    pub fraction_delivered: f64,
    /// Delivery latency, median, microseconds.
    pub latency_p50_us: f64,
    /// Delivery latency, 99th percentile, microseconds.
    pub latency_p99_us: f64,
    /// Sender CPU (posting thread + device) per offered frame, microseconds.
    pub sender_cpu_us_per_frame: f64,
    /// Receiver CPU (polling thread + device) per offered frame, microseconds.
    pub receiver_cpu_us_per_frame: f64,
    /// Bytes both sides put on the wire per delivered frame.
    pub wire_bytes_per_delivered: f64,
    /// Datagrams the injectors dropped (both directions).
    pub injected_drops: u64,
    /// RC: request packets sent again.
    pub retransmitted: u64,
    /// RC: retransmit timer expiries.
    pub timeouts: u64,
    /// RC: NAKs the requester received.
    pub naks: u64,
}

/// A link that counts what it hands on (datagrams and UDP payload bytes).
struct Counting<L> {
    inner: L,
    datagrams: Arc<AtomicU64>,
    bytes: Arc<AtomicU64>,
}

impl<L: Link> Link for Counting<L> {
    fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr()
    }
    fn send(&mut self, batch: &[Datagram]) -> io::Result<usize> {
        let n = self.inner.send(batch)?;
        let bytes: usize = batch.iter().take(n).map(|d| d.payload.len()).sum();
        self.datagrams.fetch_add(n as u64, Ordering::Relaxed);
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        Ok(n)
    }
    fn recv(
        &mut self,
        out: &mut Vec<Datagram>,
        max: usize,
        wait: Option<Duration>,
    ) -> io::Result<usize> {
        self.inner.recv(out, max, wait)
    }
    fn recv_discarded(&self) -> u64 {
        self.inner.recv_discarded()
    }
    fn recycle(&mut self, payload: Vec<u8>) {
        self.inner.recycle(payload);
    }
    fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        self.inner.wait_fd()
    }
    fn readiness(&self) -> Readiness {
        self.inner.readiness()
    }
}

struct Side {
    dev: Device,
    name: String,
    datagrams: Arc<AtomicU64>,
    bytes: Arc<AtomicU64>,
    dropped: Arc<uctel_transport::soft::fault::FaultStats>,
}

fn side(name: &str, loss: f64, seed: u64) -> anyhow::Result<Side> {
    let udp = UdpLink::bind(UdpConfig {
        bind: "127.0.0.1:0".parse()?,
        recv_buffer_bytes: Some(8 << 20),
        ..UdpConfig::default()
    })
    .context("binding a loopback UDP socket")?;
    let injector = FaultInjector::new(
        udp,
        FaultConfig {
            drop_ratio: loss,
            seed,
            direction: FaultDirection::Send,
            ..FaultConfig::default()
        },
    )?;
    let dropped = injector.stats();
    let datagrams = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let link = Counting {
        inner: injector,
        datagrams: Arc::clone(&datagrams),
        bytes: Arc::clone(&bytes),
    };
    let cfg = SoftConfig {
        name: name.into(),
        progress: ProgressMode::Thread,
        ..SoftConfig::default()
    };
    let dev = Device::from(SoftDevice::with_link(&cfg, Box::new(link))?);
    Ok(Side {
        dev,
        name: format!("uctel-{name}"),
        datagrams,
        bytes,
        dropped,
    })
}

/// Runs every class at every loss rate.
///
/// # Errors
/// Setting up sockets, devices or QPs failed, or a cell broke its own rules (an error
/// completion, a QP in ERROR).
pub fn run(cfg: &TradeoffConfig) -> anyhow::Result<Vec<TradeoffRow>> {
    let mut rows = Vec::new();
    for &loss in &cfg.losses {
        for qp_type in [QpType::Uc, QpType::Rc(cfg.rc)] {
            eprintln!(
                "[tradeoff] {} at {:.1} % loss",
                qp_type.as_str(),
                loss * 100.0
            );
            rows.push(cell(cfg, qp_type, loss)?);
        }
    }
    Ok(rows)
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)] as f64 / 1000.0
}

fn cell(cfg: &TradeoffConfig, qp_type: QpType, loss: f64) -> anyhow::Result<TradeoffRow> {
    let len = cfg.frame_bytes.clamp(16, 1024);
    let tx = side("tx", loss, cfg.seed)?;
    let rx = side("rx", loss, cfg.seed ^ 0x9e37_79b9)?;
    let (tpd, rpd) = (tx.dev.alloc_pd()?, rx.dev.alloc_pd()?);
    let (tscq, trcq) = (tx.dev.create_cq(SQ_DEPTH * 2)?, tx.dev.create_cq(16)?);
    let (rscq, rrcq) = (rx.dev.create_cq(16)?, rx.dev.create_cq(RQ_DEPTH * 2)?);
    let attr = |scq, rcq, access| QpInitAttr {
        qp_type,
        send_cq: scq,
        recv_cq: rcq,
        max_send_wr: SQ_DEPTH,
        max_recv_wr: RQ_DEPTH,
        access,
        max_mtu: None,
    };
    let tqp = tpd.create_qp(&attr(&tscq, &trcq, AccessFlags::LOCAL_WRITE))?;
    let rqp = rpd.create_qp(&attr(
        &rscq,
        &rrcq,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
    ))?;
    let ring = rpd.reg_mr(
        RING_SLOTS as usize * len,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
    )?;
    let src = tpd.reg_mr(SQ_DEPTH as usize * len, AccessFlags::LOCAL_WRITE)?;
    let wrs: Vec<RecvWr<'_>> = (0..u64::from(RQ_DEPTH)).map(RecvWr::zero_length).collect();
    rqp.post_recv(&wrs)?;
    tqp.connect(&rqp.local_endpoint())?;
    rqp.connect(&tqp.local_endpoint())?;

    let base = Instant::now();
    let pid = i32::try_from(std::process::id())?;
    let before = cpu::sample_process(pid)?;
    let sending_done = Arc::new(AtomicBool::new(false));
    let offered = (cfg.rate_fps as f64 * cfg.duration.as_secs_f64()) as u64;
    let window = cfg.duration;

    let channel = rx.dev.create_comp_channel()?;
    let receiver = {
        let done = Arc::clone(&sending_done);
        let rqp = rqp.clone();
        let ring = ring.clone();
        std::thread::Builder::new()
            .name("tradeoff-poll".into())
            .spawn(
                move || -> anyhow::Result<(Vec<u64>, u64, u64, Duration, Duration)> {
                    let cpu0 = cpu::thread_cpu();
                    let mut seen = vec![false; offered as usize];
                    let (mut duplicates, mut out_of_order) = (0u64, 0u64);
                    let mut highest: Option<u64> = None;
                    let mut latencies = Vec::with_capacity(offered as usize);
                    let mut wcs = [WorkCompletion::default(); 64];
                    let mut stamp = [0u8; 8];
                    let mut idle_since: Option<Instant> = None;
                    let mut armed = false;
                    let mut last_at = Duration::ZERO;
                    loop {
                        let n = rrcq.poll(&mut wcs);
                        for wc in &wcs[..n] {
                            anyhow::ensure!(
                                wc.status == WcStatus::Success
                                    && wc.opcode == WcOpcode::RecvRdmaWithImm,
                                "receive completion {wc:?}"
                            );
                            let seq = u64::from(wc.imm.unwrap_or(0));
                            last_at = base.elapsed();
                            let at = last_at.as_nanos() as u64;
                            ring.read_at((seq % RING_SLOTS) as usize * len, &mut stamp)?;
                            match seen.get_mut(seq as usize) {
                                Some(s) if *s => duplicates += 1,
                                Some(s) => {
                                    *s = true;
                                    latencies.push(at.saturating_sub(u64::from_le_bytes(stamp)));
                                }
                                None => anyhow::bail!("immediate {seq} beyond {offered} frames"),
                            }
                            if highest.is_some_and(|h| seq < h) {
                                out_of_order += 1;
                            }
                            highest = Some(highest.map_or(seq, |h| h.max(seq)));
                        }
                        if n > 0 {
                            let wrs: Vec<RecvWr<'_>> =
                                (0..n as u64).map(RecvWr::zero_length).collect();
                            rqp.post_recv(&wrs)?;
                            idle_since = None;
                            continue;
                        }
                        if latencies.len() as u64 == offered {
                            break;
                        }
                        if done.load(Ordering::Acquire) {
                            let since = *idle_since.get_or_insert_with(Instant::now);
                            if since.elapsed() > DRAIN {
                                break;
                            }
                        }
                        // Idle: sleep on the completion channel, as the collector's worker does
                        // (arm, poll once more, and only then wait).
                        if armed {
                            channel.wait(Duration::from_millis(20))?;
                            armed = false;
                        } else {
                            channel.req_notify(&rrcq)?;
                            armed = true;
                        }
                    }
                    Ok((
                        latencies,
                        duplicates,
                        out_of_order,
                        cpu::thread_cpu().saturating_sub(cpu0),
                        last_at,
                    ))
                },
            )?
    };

    let cpu0 = cpu::thread_cpu();
    let mut wcs = [WorkCompletion::default(); 64];
    let mut completed = 0u64;
    let period = Duration::from_secs_f64(1.0 / cfg.rate_fps.max(1) as f64);
    let mut i = 0u64;
    let send_result = (|| -> anyhow::Result<()> {
        while i < offered {
            let due = period.mul_f64(i as f64);
            let now = base.elapsed();
            if now < due {
                std::thread::sleep((due - now).min(Duration::from_millis(1)));
            } else if i - completed >= u64::from(SQ_DEPTH) {
                // Behind and the send queue is full (RC waiting for ACKs): do not spin.
                std::thread::sleep(Duration::from_micros(50));
            }
            let n = tscq.poll(&mut wcs);
            for wc in &wcs[..n] {
                anyhow::ensure!(wc.status == WcStatus::Success, "send completion {wc:?}");
                completed += 1;
            }
            while i < offered && period.mul_f64(i as f64) <= base.elapsed() {
                if i - completed >= u64::from(SQ_DEPTH) {
                    break;
                }
                let slot = (i % u64::from(SQ_DEPTH)) as usize * len;
                let due_ns = period.mul_f64(i as f64).as_nanos() as u64;
                src.write_at(slot, &due_ns.to_le_bytes())?;
                let wr = SendWr::write_with_imm(
                    i,
                    Some(Sge::new(&src, slot, len as u32)),
                    ring.addr() + (i % RING_SLOTS) * len as u64,
                    ring.rkey(),
                    i as u32,
                );
                match tqp.post_send(&[wr]) {
                    Ok(()) => i += 1,
                    Err(e) if matches!(e.kind, PostSendErrorKind::Full { .. }) => break,
                    Err(e) => return Err(e.into()),
                }
            }
        }
        // RC: wait for the last ACKs (every WR is signaled).
        let until = Instant::now() + DRAIN;
        while completed < offered && Instant::now() < until {
            let n = tscq.poll(&mut wcs);
            for wc in &wcs[..n] {
                anyhow::ensure!(wc.status == WcStatus::Success, "send completion {wc:?}");
                completed += 1;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        Ok(())
    })();
    let sender_cpu = cpu::thread_cpu().saturating_sub(cpu0);
    sending_done.store(true, Ordering::Release);
    let received = receiver
        .join()
        .map_err(|_| anyhow::anyhow!("receiver thread panicked"))?;
    send_result?;
    let (mut latencies, duplicates, out_of_order, receiver_cpu, last_at) = received?;
    let after = cpu::sample_process(pid)?;
    let delta = cpu::delta(&before, &after);
    let device_cpu = |name: &str| delta.by_thread.get(name).copied().unwrap_or(0.0);
    latencies.sort_unstable();
    let delivered = latencies.len() as u64;
    let per_frame = |secs: f64| secs * 1e6 / offered.max(1) as f64;
    let wire = tx.bytes.load(Ordering::Relaxed)
        + rx.bytes.load(Ordering::Relaxed)
        + IP_UDP_HEADER_BYTES
            * (tx.datagrams.load(Ordering::Relaxed) + rx.datagrams.load(Ordering::Relaxed));
    let rc = tqp.stats().rc;
    Ok(TradeoffRow {
        class: qp_type.as_str(),
        loss,
        offered,
        delivered,
        duplicates,
        out_of_order,
        delivered_per_second: delivered as f64 / window.max(last_at).as_secs_f64(),
        fraction_delivered: delivered as f64 / offered.max(1) as f64,
        latency_p50_us: percentile(&latencies, 0.50),
        latency_p99_us: percentile(&latencies, 0.99),
        sender_cpu_us_per_frame: per_frame(sender_cpu.as_secs_f64() + device_cpu(&tx.name)),
        receiver_cpu_us_per_frame: per_frame(receiver_cpu.as_secs_f64() + device_cpu(&rx.name)),
        wire_bytes_per_delivered: wire as f64 / delivered.max(1) as f64,
        injected_drops: tx.dropped.snapshot().dropped + rx.dropped.snapshot().dropped,
        retransmitted: rc.packets_retransmitted,
        timeouts: rc.timeouts,
        naks: rc.naks_received,
    })
}

/// The cells as a table (one row per class and loss rate).
pub fn render(rows: &[TradeoffRow]) -> String {
    let cells: Vec<[String; 9]> = rows
        .iter()
        .map(|r| {
            [
                r.class.to_uppercase(),
                format!("{:.1} %", r.loss * 100.0),
                format!("{:.0}", r.delivered_per_second),
                format!(
                    "{:.4} ({} of {}{})",
                    r.fraction_delivered,
                    r.delivered,
                    r.offered,
                    if r.duplicates + r.out_of_order > 0 {
                        format!("; {} dup, {} reordered", r.duplicates, r.out_of_order)
                    } else {
                        String::new()
                    }
                ),
                format!("{:.0} / {:.0}", r.latency_p50_us, r.latency_p99_us),
                format!(
                    "{:.1} / {:.1}",
                    r.sender_cpu_us_per_frame, r.receiver_cpu_us_per_frame
                ),
                format!("{:.0}", r.wire_bytes_per_delivered),
                format!("{}", r.injected_drops),
                format!("{} / {} / {}", r.retransmitted, r.timeouts, r.naks),
            ]
        })
        .collect();
    let mut out = String::from(
        "Reliability trade-off (soft transport, one packet per frame, Write-with-immediate):\n",
    );
    out.push_str(&crate::stats::table(
        &[
            "class",
            "loss",
            "delivered/s",
            "fraction delivered",
            "latency p50 / p99 µs",
            "CPU µs/frame tx / rx",
            "wire B/delivered",
            "injected drops",
            "retransmitted / timeouts / NAKs",
        ],
        &cells,
    ));
    out
}

/// Draws fraction delivered, latency p99, bytes on the wire per delivered frame and CPU per
/// frame against the loss rate, UC and RC side by side, as one SVG (`plotters`).
///
/// # Errors
/// The file cannot be written.
pub fn plot(rows: &[TradeoffRow], path: &std::path::Path) -> anyhow::Result<()> {
    use plotters::prelude::*;

    let mut losses: Vec<f64> = rows.iter().map(|r| r.loss).collect();
    losses.sort_by(f64::total_cmp);
    losses.dedup();
    let x_of = |loss: f64| losses.iter().position(|l| *l == loss).unwrap_or(0) as f64;
    let label = |x: &f64| {
        losses
            .get(x.round().max(0.0) as usize)
            .map_or(String::new(), |l| format!("{} %", l * 100.0))
    };
    // (title, value, logarithmic axis)
    type Metric = (&'static str, fn(&TradeoffRow) -> f64, bool);
    let panels: [Metric; 4] = [
        (
            "fraction of frames delivered",
            |r| r.fraction_delivered,
            false,
        ),
        (
            "delivery latency p99 (µs, log scale)",
            |r| r.latency_p99_us,
            true,
        ),
        (
            "bytes on the wire per delivered frame",
            |r| r.wire_bytes_per_delivered,
            false,
        ),
        (
            "CPU per frame, sender + receiver (µs)",
            |r| r.sender_cpu_us_per_frame + r.receiver_cpu_us_per_frame,
            false,
        ),
    ];
    let root = SVGBackend::new(path, (1100, 800)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        "UC vs RC under injected loss (uctel-bench tradeoff)",
        ("sans-serif", 22),
    )?;
    let x_max = (losses.len().max(2) - 1) as f64;
    for (area, (title, metric, log)) in root.split_evenly((2, 2)).iter().zip(panels) {
        let y_of = move |r: &TradeoffRow| {
            let v = metric(r);
            if log {
                v.max(1.0).log10()
            } else {
                v
            }
        };
        let values: Vec<f64> = rows.iter().map(y_of).collect();
        let top = values.iter().copied().fold(0.0, f64::max);
        let (y_min, y_max) = if title.starts_with("fraction") {
            (
                values.iter().copied().fold(1.0, f64::min).min(0.9) - 0.01,
                1.01,
            )
        } else if log {
            (0.0, top.ceil().max(1.0))
        } else {
            (0.0, top * 1.15 + 1e-9)
        };
        let y_label = move |y: &f64| {
            if log {
                format!("{}", 10f64.powf(*y).round())
            } else if *y < 10.0 {
                format!("{y:.2}")
            } else {
                format!("{y:.0}")
            }
        };
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(30)
            .y_label_area_size(70)
            .build_cartesian_2d(-0.2..x_max + 0.2, y_min..y_max)?;
        chart
            .configure_mesh()
            .x_labels(losses.len())
            .x_label_formatter(&label)
            .y_label_formatter(&y_label)
            .x_desc("injected loss per datagram")
            .draw()?;
        for (class, color) in [("uc", BLUE), ("rc", RED)] {
            let points: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.class == class)
                .map(|r| (x_of(r.loss), y_of(r)))
                .collect();
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
                .label(class.to_uppercase())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            chart.draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 4, color.filled())),
            )?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uc_loses_exactly_what_was_dropped_and_rc_delivers_everything_in_order() {
        let cfg = TradeoffConfig {
            frame_bytes: 512,
            rate_fps: 5_000,
            duration: Duration::from_millis(300),
            losses: vec![0.05],
            rc: RcAttr {
                timeout: 10,
                ..RcAttr::default()
            },
            seed: 1,
        };
        let rows = run(&cfg).expect("run");
        let uc = rows.iter().find(|r| r.class == "uc").expect("uc row");
        let rc = rows.iter().find(|r| r.class == "rc").expect("rc row");
        assert_eq!(uc.offered, 1_500);
        // UC's receiver sends nothing: every injected drop is a frame, and only those miss.
        assert!(uc.injected_drops > 0);
        assert_eq!(uc.delivered + uc.injected_drops, uc.offered, "{uc:?}");
        assert_eq!(
            (rc.delivered, rc.duplicates, rc.out_of_order),
            (1_500, 0, 0)
        );
        assert!(rc.retransmitted > 0, "{rc:?}");
        assert!(rc.wire_bytes_per_delivered > uc.wire_bytes_per_delivered);
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.svg");
        plot(&rows, &path).expect("plot");
        let svg = std::fs::read_to_string(&path).expect("svg");
        assert!(svg.contains("<svg") && svg.contains("fraction of frames delivered"));
        assert!(render(&rows).contains("| RC    | 5.0 %"));
    }
}
