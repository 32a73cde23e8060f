//! The soft device: the "NIC" that runs [`UcQp`] and [`RcQp`] engines over a datagram
//! [`Link`].
//!
//! One device owns one link (a UDP socket in production, [`crate::soft::link::MemoryLink`] in
//! tests, either optionally wrapped in the fault injector) and any number of UC and RC QPs,
//! CQs and MRs. All QPs share the link, as all rxe QPs share UDP port 4791; inbound packets are
//! demultiplexed by BTH destination QPN.
//!
//! # Receive path (per datagram)
//!
//! A round receives a batch with [`Link::recv_each`] and runs these steps on each datagram
//! as a view into the link's receive buffers, while it holds the link (a post that finds the
//! link busy leaves its packets to the pump at the end of the round):
//!
//! 1. Parse BTH/RETH/ImmDt (AETH for RC ACKs) by the transport bits of the opcode
//!    ([`PacketRepr::parse`] for UC, [`RcPacketRepr::parse`] for RC) — failure: `malformed`
//!    (device counter).
//!    A datagram the link discarded because it did not fit its receive buffer
//!    ([`Link::recv_discarded`]) is counted here too.
//! 2. Verify the ICRC over the pseudo IP/UDP header rebuilt from the datagram's addresses
//!    ([`icrc::verify`]) — failure: `bad_icrc`. (rxe checks the header before the ICRC; we
//!    check the ICRC first so that a corrupted QPN is not misreported as `unknown_qpn`.)
//! 3. Look up the destination QPN — unknown: `unknown_qpn`.
//! 4. Check the source IP against the connected peer (rxe `check_addr`) — `address_mismatch`.
//! 5. Hand the packet to the QP's engine, which places RDMA WRITE data into the target MR,
//!    scatters SEND data into receive buffers and pushes WCs into the receive CQ; an RC engine
//!    also queues its ACK or NAK, and an inbound ACK completes send WRs into the send CQ. A
//!    packet of the other service (an RC opcode to a UC QP or the reverse) is a QP-level
//!    `malformed` drop (rxe `check_type_state`).
//!
//! # Send path
//!
//! `post_send` queues WRs in the engine; packets are pulled from every QP with pending WRs,
//! sealed (ICRC) and handed to the link in batches (`sendmmsg` on UDP). If the link takes
//! fewer datagrams than offered (socket buffer full) the rest wait in the device's transmit
//! queue and no more are pulled until it drains, so a WR's SQ slot is held until its packets
//! are with the device (UC), or until they are acknowledged (RC).
//!
//! # RC timers
//!
//! Each round runs the RC QPs' due timers first (retransmit, end of an RNR wait; a QP whose
//! retries ran out is flushed there, its `RetryExceededError` completion first), and an idle
//! progress thread sleeps no longer than the earliest timer. A post that sends by itself and
//! arms a timer earlier than the sleeping thread's deadline wakes the thread. In busy-poll
//! and driven mode timers, ACKs and retransmissions run only while the application polls
//! (busy-poll) or drives (driven), or waits on a completion channel, whose wait is bounded
//! by its own timeout, not by the timers.
//!
//! # Progress modes ([`ProgressMode`])
//!
//! * **`thread`** — a background thread acts as the NIC: it sends queued packets, receives
//!   what arrived and processes it, round after round while there is work. When a round finds
//!   nothing it sleeps in `poll(2)` on the link's socket ([`Link::wait_fd`]) and an eventfd,
//!   without holding the link, so an idle device costs no CPU: the next datagram, or a post
//!   that could not send by itself, wakes it at once. `post_send` sends directly when the
//!   link is free; when the thread is in a round, the post wakes it and the thread sends. A
//!   link that cannot be waited on from outside ([`Readiness::Opaque`], e.g. the in-memory
//!   link of tests) is waited on in its `recv` for up to
//!   [`SoftConfig::progress_wait_micros`] per round instead, as is a socket that refused
//!   packets (retried after that long, or sooner when a datagram arrives). `poll_cq` only
//!   reads the CQ. The thread holds only a weak reference: the last handle dropped wakes it
//!   and it stops.
//! * **`busy_poll`** — no thread. `post_send` sends at once, and every [`CompletionQueue::poll`]
//!   (`poll_cq`) first drives the device once without blocking (send queued packets, receive
//!   one batch, process it, flush QPs in ERROR). Lowest latency and fully deterministic with a
//!   [`crate::soft::link::MemoryLink`]; the caller's poll loop is the NIC, so poll often, or
//!   sleep in [`CompletionChannel::wait`], which drives the device while it waits.
//! * **`driven`** — no thread, and `poll_cq` only reads the CQ: the owner's loop drives the
//!   device once per round with [`crate::api::Device::drive`] and then polls all its CQs, so
//!   a round costs one receive however many CQs it polls (with `busy_poll` every poll of
//!   every CQ receives). Sleeping in [`CompletionChannel::wait`] drives it as in `busy_poll`.
//!   A packet goes from the socket to the CQ and the ring on the thread that processes it:
//!   no hand-off between threads, no cache line moved between cores.
//!
//! # Sleeping on completions
//!
//! A [`SoftCompChannel`] is an eventfd. [`CompletionChannel::req_notify`] arms a CQ on it;
//! the device signals the eventfd when it pushes the next completion into an armed CQ (once
//! per arming, so a busy CQ costs one atomic load per completion and no system call).
//!
//! All modes are `Send + Sync`: any thread may post, poll, drive or connect.
//!
//! # Layout
//!
//! ```text
//! mod.rs       SoftDevice: open, with_link, progress; its DeviceOps
//! config.rs    SoftConfig, ProgressMode, the device's limits
//! shared.rs    Shared: link, QP slots, CQ storage, counters, async events
//! progress.rs  rounds (transmit, receive path), the idle rule, the progress thread
//! qp.rs        SoftQp: create, connect, post_send, post_recv
//! service.rs   QpEngine: the UC or RC engine of a QP; parse by opcode transport bits
//! cq.rs        SoftCq, SoftCompChannel
//! mr.rs        SoftMrHandle
//! pd.rs        SoftPd
//! ```
//!
//! The files depend on each other in one direction (`config` ← `shared` ← `progress`, `mr`
//! ← `cq` ← `qp` ← `pd` ← `mod.rs`).
//!
//! [`CompletionQueue::poll`]: crate::api::CompletionQueue::poll
//! [`CompletionChannel::wait`]: crate::api::CompletionChannel::wait
//! [`CompletionChannel::req_notify`]: crate::api::CompletionChannel::req_notify
//! [`UcQp`]: crate::soft::engine::UcQp
//! [`RcQp`]: crate::soft::rc::RcQp
//! [`RcPacketRepr::parse`]: crate::soft::packet::RcPacketRepr::parse
//! [`PacketRepr::parse`]: crate::soft::packet::PacketRepr::parse
//! [`icrc::verify`]: crate::soft::icrc::verify
//! [`Readiness::Opaque`]: crate::soft::link::Readiness::Opaque

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use crate::api::backend::{CompChannelOps, CqOps, DeviceOps, PdOps};
use crate::api::{
    gid_from_ip, AllocPdError, AsyncEvent, CompChannelError, CreateCqError, Device, DeviceStats,
    OpenError, PortAttr, TransportKind,
};
use crate::soft::fault::{FaultInjector, FaultStats};
use crate::soft::link::Link;
use crate::soft::memory::MrTable;
use crate::soft::udp::{UdpConfig, UdpLink};
use crate::sync::lock;
use crate::wake::WakeFd;

mod config;
mod cq;
mod mr;
mod pd;
mod progress;
mod qp;
mod service;
mod shared;
mod srq;

pub use config::{ProgressMode, SoftConfig, MAX_CQ_DEPTH, MAX_QP_WR, SOFT_MAX_MSG_SIZE};
pub use cq::{SoftCompChannel, SoftCq};
pub use mr::SoftMrHandle;
pub use pd::SoftPd;
pub use progress::ProgressReport;
pub use qp::SoftQp;
pub use srq::{SoftSrq, MAX_SRQ_WR};

use progress::progress_thread;
use shared::{canonical_ip, Counters, CqInner, LinkState, Shared};

/// The soft RoCEv2 device. Cheap to clone; converts into [`Device`].
#[derive(Clone, Debug)]
pub struct SoftDevice {
    shared: Arc<Shared>,
}

impl SoftDevice {
    /// Binds the UDP socket of `config.udp` and starts the device.
    ///
    /// # Errors
    /// [`OpenError::InvalidConfig`] for bad settings, [`OpenError::Io`] when the socket cannot
    /// be bound.
    pub fn open(config: &SoftConfig) -> Result<SoftDevice, OpenError> {
        config.validate()?;
        let udp = UdpConfig {
            batch: config.batch,
            ..config.udp.clone()
        };
        let link = UdpLink::bind(udp).map_err(|source| OpenError::Io {
            kind: TransportKind::Soft,
            name: format!("{} ({})", config.name, config.udp.bind),
            source,
        })?;
        let granted = link.recv_buffer_bytes();
        let dev = match &config.faults {
            None => Self::with_link(config, Box::new(link)),
            Some(faults) => {
                let injector = FaultInjector::new(link, faults.clone()).map_err(|e| {
                    OpenError::InvalidConfig {
                        kind: TransportKind::Soft,
                        detail: format!("faults: {e}"),
                    }
                })?;
                let stats = injector.stats();
                let dev = Self::with_link(config, Box::new(injector))?;
                *lock(&dev.shared.fault_stats) = Some(stats);
                Ok(dev)
            }
        }?;
        *lock(&dev.shared.recv_buffer_bytes) = Some(granted);
        Ok(dev)
    }

    /// Counters of the fault injector [`SoftDevice::open`] installed for `config.faults`.
    pub fn fault_stats(&self) -> Option<Arc<FaultStats>> {
        lock(&self.shared.fault_stats).clone()
    }

    /// Starts a device over an existing link (a [`crate::soft::link::MemoryLink`] in tests, or
    /// any link wrapped in the fault injector). `config.udp` is ignored.
    ///
    /// # Errors
    /// [`OpenError::InvalidConfig`] for bad settings, [`OpenError::Io`] when the progress
    /// thread cannot be spawned.
    pub fn with_link(config: &SoftConfig, link: Box<dyn Link>) -> Result<SoftDevice, OpenError> {
        let mtu = config.validate()?;
        let local = link.local_addr();
        let advertised = config.advertise_addr.unwrap_or(local);
        let io_error = |source: io::Error| OpenError::Io {
            kind: TransportKind::Soft,
            name: config.name.clone(),
            source,
        };
        let link_fd = link
            .wait_fd()
            .map(|fd| rustix::io::fcntl_dupfd_cloexec(fd, 0))
            .transpose()
            .map_err(|e| io_error(e.into()))?
            .map(Arc::new);
        let thread = config.progress == ProgressMode::Thread;
        let wake = if thread {
            Some(Arc::new(WakeFd::new().map_err(io_error)?))
        } else {
            None
        };
        let shared = Arc::new(Shared {
            name: config.name.clone(),
            mtu,
            batch: config.batch,
            busy_poll: config.progress != ProgressMode::Thread,
            driven: config.progress == ProgressMode::Driven,
            wait: Duration::from_micros(config.progress_wait_micros),
            local,
            advertised,
            mrs: Arc::new(MrTable::new()),
            qps: RwLock::new(HashMap::new()),
            rc_qps: RwLock::new(HashMap::new()),
            next_qpn: Mutex::new(0x11),
            next_cq: AtomicU32::new(1),
            tx_hint: AtomicBool::new(true),
            flush_hint: AtomicBool::new(true),
            link: Mutex::new(LinkState {
                link,
                tx: Vec::with_capacity(config.batch),
                spare: Vec::new(),
                discarded: 0,
            }),
            link_fd: link_fd.clone(),
            wake: wake.clone(),
            counters: Counters::default(),
            events: Mutex::new(VecDeque::new()),
            fault_stats: Mutex::new(None),
            recv_buffer_bytes: Mutex::new(None),
            timer_epoch: std::time::Instant::now(),
            planned_wake: std::sync::atomic::AtomicU64::new(0),
            changed: Mutex::new(shared::ChangedQps::default()),
        });
        if let (true, Some(wake)) = (thread, wake) {
            let weak = Arc::downgrade(&shared);
            std::thread::Builder::new()
                .name(format!("uctel-{}", config.name))
                .spawn({
                    let name = config.name.clone();
                    move || progress_thread(&weak, &wake, link_fd.as_deref(), &name)
                })
                .map_err(io_error)?;
        }
        Ok(SoftDevice { shared })
    }

    /// Drives the device once without blocking: sends queued packets, receives one batch and
    /// processes it, flushes QPs in ERROR. Busy-poll mode calls this from every `poll_cq`;
    /// tests call it directly.
    pub fn progress(&self) -> ProgressReport {
        self.shared.progress(Some(Duration::ZERO), true)
    }

    /// As [`SoftDevice::progress`], but waits up to `wait` for datagrams.
    pub fn progress_wait(&self, wait: Duration) -> ProgressReport {
        self.shared.progress(Some(wait), true)
    }

    /// The link's bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local
    }

    /// Datagrams waiting in the device's transmit queue (taken from QPs, refused by the link).
    pub fn tx_backlog(&self) -> usize {
        lock(&self.shared.link).tx.len()
    }

    /// Transmit submissions so far: [`Link::send`] calls that handed over at least one
    /// datagram (on UDP each is one `sendmmsg(2)`, or a `UDP_SEGMENT` `sendmsg` per run to one
    /// peer, for up to [`SoftConfig::batch`] datagrams). [`crate::api::post_send_batch`] makes
    /// one for the WRs of many QPs.
    pub fn link_sends(&self) -> u64 {
        self.shared.counters.link_sends.load(Ordering::Relaxed)
    }

    /// Link errors (failed `send`/`recv` calls) so far.
    pub fn link_errors(&self) -> u64 {
        self.shared.counters.link_errors.load(Ordering::Relaxed)
    }
}

impl From<SoftDevice> for Device {
    fn from(d: SoftDevice) -> Device {
        Device::from_backend(Arc::new(d))
    }
}

impl DeviceOps for SoftDevice {
    fn name(&self) -> &str {
        &self.shared.name
    }

    fn kind(&self) -> TransportKind {
        TransportKind::Soft
    }

    fn port_attr(&self) -> PortAttr {
        PortAttr {
            gid: gid_from_ip(canonical_ip(self.shared.advertised.ip())),
            active_mtu: self.shared.mtu.bytes(),
            max_msg_size: SOFT_MAX_MSG_SIZE,
            udp_addr: Some(self.shared.advertised),
            recv_buffer_bytes: *lock(&self.shared.recv_buffer_bytes),
        }
    }

    fn alloc_pd(&self) -> Result<Arc<dyn PdOps>, AllocPdError> {
        Ok(Arc::new(SoftPd {
            shared: Arc::clone(&self.shared),
        }))
    }

    fn create_cq(&self, depth: u32) -> Result<Arc<dyn CqOps>, CreateCqError> {
        if depth == 0 || depth > MAX_CQ_DEPTH {
            return Err(CreateCqError::InvalidDepth {
                depth,
                max: MAX_CQ_DEPTH,
            });
        }
        let handle = self.shared.next_cq.fetch_add(1, Ordering::Relaxed);
        Ok(Arc::new(SoftCq {
            inner: Arc::new(CqInner::new(handle, depth as usize)),
            device: Arc::downgrade(&self.shared),
            busy_poll: self.shared.busy_poll && !self.shared.driven,
        }))
    }

    fn create_comp_channel(&self) -> Result<Arc<dyn CompChannelOps>, CompChannelError> {
        let wake = WakeFd::new().map_err(|e| CompChannelError::Device {
            what: "eventfd",
            detail: e.to_string(),
        })?;
        Ok(Arc::new(SoftCompChannel {
            wake: Arc::new(wake),
            device: Arc::downgrade(&self.shared),
        }))
    }

    fn poll_async_event(&self) -> Option<AsyncEvent> {
        lock(&self.shared.events).pop_front()
    }

    fn stats(&self) -> DeviceStats {
        let c = &self.shared.counters;
        DeviceStats {
            packets_received: c.packets_received.load(Ordering::Relaxed),
            packets_sent: c.packets_sent.load(Ordering::Relaxed),
            drops: *lock(&c.drops),
        }
    }

    fn drive(&self) -> usize {
        if !self.shared.driven {
            return 0;
        }
        let r = self.shared.progress(Some(Duration::ZERO), false);
        r.received + r.sent
    }

    fn is_driven(&self) -> bool {
        self.shared.driven
    }

    fn take_changed_qps(&self, out: &mut Vec<u32>) -> bool {
        self.shared.take_changed(out);
        true
    }

    fn flush_link(&self) {
        let mut ls = lock(&self.shared.link);
        self.shared.pump_tx(&mut ls);
        if let Err(e) = ls.link.flush_held() {
            self.shared
                .counters
                .link_errors
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(device = %self.shared.name, error = %e, "link flush failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::UdpSocket;

    use super::*;
    use crate::api::UcDropReason;

    #[test]
    fn datagrams_longer_than_the_receive_buffer_count_as_malformed() {
        let config = SoftConfig {
            udp: UdpConfig::bound_to("127.0.0.1:0".parse().expect("addr")),
            progress: ProgressMode::BusyPoll,
            ..SoftConfig::default()
        };
        let dev = SoftDevice::open(&config).expect("open");
        let target = dev.local_addr();
        let peer = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let max = config.udp.max_datagram_bytes;
        for len in [max + 1, 20_000, 65_000] {
            peer.send_to(&vec![0x24; len], target).expect("send");
        }
        peer.send_to(&[0xff; 8], target).expect("send");
        let device = Device::from(dev.clone());
        let mut malformed = 0;
        for _ in 0..2000 {
            dev.progress_wait(Duration::from_millis(5));
            malformed = device.stats().drops.get(UcDropReason::Malformed);
            if malformed >= 4 {
                break;
            }
        }
        assert_eq!(malformed, 4);
    }

    #[test]
    fn device_handles_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<SoftDevice>();
        check::<crate::api::Device>();
        check::<crate::api::QueuePair>();
        check::<crate::api::CompletionQueue>();
        check::<crate::api::MemoryRegion>();
    }
}
