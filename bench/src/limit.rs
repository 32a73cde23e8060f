//! The limit: how many datagrams per second the kernel hands one user-space thread on
//! loopback, measured with the transport's own [`UdpSink`] (`recvmmsg`, the same batch size
//! and receive buffer as the soft device's `UdpLink`) fed by a `sendmmsg` sender
//! ([`UdpLink`]) running flat out. Datagrams carry as many bytes as one soft-path packet
//! (frame + RoCEv2 WRITE_WITH_IMM headers and ICRC), so both paths move the same bytes.

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
/// `warmup + duration` long).
///
/// # Errors
/// [`LimitError`] for socket or thread failures.
pub fn measure(cfg: &LimitConfig) -> Result<LimitResult, LimitError> {
    let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut sink = UdpSink::bind(
        loopback,
        cfg.batch,
        cfg.datagram_bytes + 64,
        cfg.recv_buffer_bytes,
    )
    .map_err(io("binding the UdpSink"))?;
    let dest = sink.local_addr().map_err(io("UdpSink address"))?;
    let mut link = UdpLink::bind(UdpConfig {
        batch: cfg.batch,
        ..UdpConfig::bound_to(loopback)
    })
    .map_err(io("binding the sender UdpLink"))?;

    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let sender = {
        let stop = stop.clone();
        let sent = sent.clone();
        let batch: Vec<Datagram> = (0..cfg.batch)
            .map(|i| Datagram::to(dest, vec![i as u8; cfg.datagram_bytes]))
            .collect();
        thread::Builder::new()
            .name("limit-send".into())
            .spawn(move || -> Duration {
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
                thread_cpu().saturating_sub(cpu0)
            })
            .map_err(|e| LimitError::Thread(e.to_string()))?
    };

    // The receiver runs on this thread.
    let drain_until = |sink: &mut UdpSink, until: Instant| -> Result<u64, LimitError> {
        let mut n = 0;
        while Instant::now() < until {
            let step = (Instant::now() + Duration::from_millis(20)).min(until);
            n += sink.drain(u64::MAX, step).map_err(io("recvmmsg"))?.messages;
        }
        Ok(n)
    };
    let result = (|| {
        drain_until(&mut sink, Instant::now() + cfg.warmup)?;
        let t0 = Instant::now();
        let cpu0 = thread_cpu();
        let s0 = sent.load(Ordering::Relaxed);
        let received = drain_until(&mut sink, t0 + cfg.duration)?;
        let cpu1 = thread_cpu();
        let s1 = sent.load(Ordering::Relaxed);
        let seconds = t0.elapsed().as_secs_f64();
        Ok((received, s1 - s0, seconds, (cpu1 - cpu0).as_secs_f64()))
    })();
    stop.store(true, Ordering::Relaxed);
    let sender_cpu = sender
        .join()
        .map_err(|_| LimitError::Thread("sender thread panicked".into()))?;
    let (received, sent, seconds, receiver_cpu_seconds) = result?;
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
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_run_receives_datagrams() {
        let r = measure(&LimitConfig {
            datagram_bytes: 256,
            batch: 16,
            recv_buffer_bytes: 1 << 20,
            warmup: Duration::from_millis(20),
            duration: Duration::from_millis(100),
        })
        .unwrap();
        assert!(r.received > 0);
        assert!(r.sent >= r.received / 2, "{r:?}");
        assert!(r.msgs_per_sec > 0.0);
    }
}
