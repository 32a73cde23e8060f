//! The limit: how many datagrams per second the kernel hands one user-space thread on
//! loopback, measured with the transport's own [`UdpSink`] (`recvmmsg`, the same batch size
//! and receive buffer as the soft device's `UdpLink`) fed by a `sendmmsg` sender
//! ([`UdpLink`]) running flat out. Datagrams carry as many bytes as one soft-path packet
//! (frame + RoCEv2 WRITE_WITH_IMM headers and ICRC), so both paths move the same bytes.
//!
//! [`measure_gso`] is the same limit with the kernel's UDP offloads: the sender hands
//! [`LimitConfig::gso_segments`] datagrams per `sendmsg` as one `UDP_SEGMENT` buffer, and the
//! sink has `UDP_GRO` on and counts each coalesced buffer's datagrams
//! ([`UdpSink::bind_gro`]). On loopback the GSO buffer reaches the GRO socket whole, so this
//! row shows what the system-call and per-packet costs are without segmentation.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use serde::Serialize;
use uctel_transport::soft::link::{Datagram, Link};
use uctel_transport::soft::udp::{UdpConfig, UdpLink, UdpSink};

use crate::cpu::thread_cpu;
use crate::stats::rate;

/// How to measure the limit.
#[derive(Clone, Debug)]
pub struct LimitConfig {
    /// UDP payload bytes per datagram.
    pub datagram_bytes: usize,
    /// Datagrams per `recvmmsg` / `sendmmsg` call (the soft device's batch).
    pub batch: usize,
    /// Datagrams per `UDP_SEGMENT` send in [`measure_gso`] (1..=64).
    pub gso_segments: usize,
    /// `SO_RCVBUF` request of the receiver (the soft device's default, 8 MiB).
    pub recv_buffer_bytes: usize,
    /// Unmeasured time before the window.
    pub warmup: Duration,
    /// The measured window.
    pub duration: Duration,
}

/// What the limit run measured.
#[derive(Clone, Debug, Serialize)]
pub struct LimitResult {
    /// UDP payload bytes per datagram.
    pub datagram_bytes: usize,
    /// Datagrams received in the window.
    pub received: u64,
    /// Datagrams the sender handed to the kernel in the window.
    pub sent: u64,
    /// Window length.
    pub seconds: f64,
    /// Receiver thread CPU seconds in the window.
    pub receiver_cpu_seconds: f64,
    /// Sender thread CPU seconds in the window.
    pub sender_cpu_seconds: f64,
    /// Received datagrams per wall second.
    pub msgs_per_sec: f64,
    /// Received datagrams per receiver CPU second.
    pub msgs_per_core_sec: f64,
    /// `UDP_SEGMENT` sends over the whole run, warmup included (0 for the plain limit).
    pub gso_sends: u64,
    /// Coalesced `UDP_GRO` buffers read in the window (0 for the plain limit).
    pub gro_buffers: u64,
}

/// Why the limit could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    /// Socket setup failed.
    #[error("{what}: {source}")]
    Io {
        /// Which step.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// A thread panicked or could not be spawned.
    #[error("{0}")]
    Thread(String),
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> LimitError {
    move |source| LimitError::Io { what, source }
}

/// Runs the limit measurement (two threads: sender and receiver, about
/// `warmup + duration` long): `sendmmsg` of `batch` datagrams into a `recvmmsg` sink,
/// neither with UDP offloads.
///
/// # Errors
/// [`LimitError`] for socket or thread failures.
pub fn measure(cfg: &LimitConfig) -> Result<LimitResult, LimitError> {
    let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
    let sink = UdpSink::bind(
        loopback,
        cfg.batch,
        cfg.datagram_bytes + 64,
        cfg.recv_buffer_bytes,
    )
    .map_err(io("binding the UdpSink"))?;
    let link = UdpLink::bind(UdpConfig {
        batch: cfg.batch,
        gso: false,
        gro: false,
        ..UdpConfig::bound_to(loopback)
    })
    .map_err(io("binding the sender UdpLink"))?;
    run(cfg, sink, link, cfg.batch)
}

/// [`measure`] with `UDP_SEGMENT` sends of `gso_segments` datagrams each into a `UDP_GRO`
/// sink that counts datagrams (segments), not buffers.
///
/// # Errors
/// [`LimitError`] for socket or thread failures, and when the kernel has no UDP GSO or GRO
/// (the row would measure something else).
pub fn measure_gso(cfg: &LimitConfig) -> Result<LimitResult, LimitError> {
    let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
    let sink = UdpSink::bind_gro(loopback, cfg.batch, cfg.recv_buffer_bytes)
        .map_err(io("binding the UDP_GRO UdpSink"))?;
    let link = UdpLink::bind(UdpConfig {
        batch: cfg.batch,
        gso: true,
        gro: false,
        ..UdpConfig::bound_to(loopback)
    })
    .map_err(io("binding the sender UdpLink"))?;
    if !link.gso_active() {
        return Err(LimitError::Io {
            what: "UDP_SEGMENT",
            source: std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "the kernel refused UDP_SEGMENT",
            ),
        });
    }
    run(cfg, sink, link, cfg.gso_segments.clamp(1, 64))
}

fn run(
    cfg: &LimitConfig,
    mut sink: UdpSink,
    mut link: UdpLink,
    per_send: usize,
) -> Result<LimitResult, LimitError> {
    let dest = sink.local_addr().map_err(io("UdpSink address"))?;

    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let sender = {
        let stop = stop.clone();
        let sent = sent.clone();
        let batch: Vec<Datagram> = (0..per_send)
            .map(|i| Datagram::to(dest, vec![i as u8; cfg.datagram_bytes]))
            .collect();
        thread::Builder::new()
            .name("limit-send".into())
            .spawn(move || -> (Duration, u64) {
                let cpu0 = thread_cpu();
                let mut errors = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    match link.send(&batch) {
                        Ok(n) => {
                            sent.fetch_add(n as u64, Ordering::Relaxed);
                        }
                        Err(_) => {
                            errors += 1;
                            if errors > 1000 {
                                break;
                            }
                        }
                    }
                }
                (thread_cpu().saturating_sub(cpu0), link.counts().gso_sends)
            })
            .map_err(|e| LimitError::Thread(e.to_string()))?
    };

    // The receiver runs on this thread.
    let drain_until = |sink: &mut UdpSink, until: Instant| -> Result<(u64, u64), LimitError> {
        let (mut n, mut gro) = (0, 0);
        while Instant::now() < until {
            let step = (Instant::now() + Duration::from_millis(20)).min(until);
            let stats = sink.drain(u64::MAX, step).map_err(io("recvmmsg"))?;
            n += stats.messages;
            gro += stats.gro_buffers;
        }
        Ok((n, gro))
    };
    let result = (|| {
        drain_until(&mut sink, Instant::now() + cfg.warmup)?;
        let t0 = Instant::now();
        let cpu0 = thread_cpu();
        let s0 = sent.load(Ordering::Relaxed);
        let (received, gro_buffers) = drain_until(&mut sink, t0 + cfg.duration)?;
        let cpu1 = thread_cpu();
        let s1 = sent.load(Ordering::Relaxed);
        let seconds = t0.elapsed().as_secs_f64();
        Ok((
            received,
            s1 - s0,
            seconds,
            (cpu1 - cpu0).as_secs_f64(),
            gro_buffers,
        ))
    })();
    stop.store(true, Ordering::Relaxed);
    let (sender_cpu, gso_sends) = sender
        .join()
        .map_err(|_| LimitError::Thread("sender thread panicked".into()))?;
    let (received, sent, seconds, receiver_cpu_seconds, gro_buffers) = result?;
    // The sender's CPU is over its whole life; scale it to the window.
    let total = cfg.warmup.as_secs_f64() + seconds;
    let sender_cpu_seconds = sender_cpu.as_secs_f64() * seconds / total.max(1e-9);
    Ok(LimitResult {
        datagram_bytes: cfg.datagram_bytes,
        received,
        sent,
        seconds,
        receiver_cpu_seconds,
        sender_cpu_seconds,
        msgs_per_sec: rate(received as f64, seconds),
        msgs_per_core_sec: rate(received as f64, receiver_cpu_seconds),
        gso_sends,
        gro_buffers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn short() -> LimitConfig {
        LimitConfig {
            datagram_bytes: 256,
            batch: 16,
            gso_segments: 32,
            recv_buffer_bytes: 1 << 20,
            warmup: Duration::from_millis(20),
            duration: Duration::from_millis(100),
        }
    }

    #[test]
    fn a_short_run_receives_datagrams() {
        let r = measure(&short()).unwrap();
        assert!(r.received > 0);
        assert!(r.sent >= r.received / 2, "{r:?}");
        assert!(r.msgs_per_sec > 0.0);
        assert_eq!((r.gso_sends, r.gro_buffers), (0, 0), "{r:?}");
    }

    #[test]
    fn a_short_gso_run_receives_coalesced_datagrams() {
        let r = measure_gso(&short()).unwrap();
        assert!(r.received > 0);
        assert!(r.gso_sends > 0, "{r:?}");
        assert!(r.gro_buffers > 0, "{r:?}");
        assert!(r.received >= r.gro_buffers * 2, "{r:?}");
    }
}
