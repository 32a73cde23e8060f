//! The datagram link a soft device talks through.
//!
//! A [`Link`] moves whole UDP payloads (one RoCEv2 packet each: BTH .. ICRC) between socket
//! addresses, in batches. Implementations: [`MemoryLink`] (in-memory, deterministic, for
//! tests), `UdpLink` (real UDP sockets, `crate::soft::udp`) and `FaultInjector`
//! (`crate::soft::fault`), which wraps any link.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// One UDP datagram carrying one RoCEv2 packet: BTH .. ICRC (the UDP payload).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Datagram {
    /// Remote end: destination when sending, source when received.
    pub peer: SocketAddr,
    /// Local end: the address the datagram was received on (from `IP_PKTINFO` /
    /// `IPV6_PKTINFO`, or the bound address), or the source address to send from
    /// (`None` = the link's bound address).
    pub local: Option<SocketAddr>,
    /// The UDP payload.
    pub payload: Vec<u8>,
}

impl Datagram {
    /// A datagram to `peer` from the link's bound address.
    pub fn to(peer: SocketAddr, payload: Vec<u8>) -> Datagram {
        Datagram {
            peer,
            local: None,
            payload,
        }
    }

    /// This datagram as a [`DatagramView`].
    pub fn view(&self) -> DatagramView<'_> {
        DatagramView {
            peer: self.peer,
            local: self.local,
            payload: &self.payload,
        }
    }
}

/// A received datagram borrowed from a link's receive buffers ([`Link::recv_each`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DatagramView<'a> {
    /// Remote end: the source.
    pub peer: SocketAddr,
    /// Local end: the address the datagram was received on (see [`Datagram::local`]).
    pub local: Option<SocketAddr>,
    /// The UDP payload.
    pub payload: &'a [u8],
}

/// Whether a [`Link`] has something to receive, for a thread that sleeps without holding it
/// ([`Link::readiness`]). The soft device's progress thread sleeps on [`Link::wait_fd`]
/// without holding the link, so other threads can send meanwhile and nothing wakes it while
/// the link is quiet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// Datagrams may be waiting now: call [`Link::recv`] without sleeping.
    Now,
    /// Nothing to receive now: sleep until [`Link::wait_fd`] is readable, then call
    /// [`Link::recv`]; `until`: the link has timed work then (a delayed datagram to release),
    /// call `recv` by that time at the latest. `None` = no timed work.
    Idle {
        /// Call `recv` by this time at the latest.
        until: Option<Instant>,
    },
    /// The link cannot be waited on from outside: call [`Link::recv`] with a timeout.
    Opaque,
}

/// A batched datagram link.
pub trait Link: Send {
    /// Address this link is bound to.
    fn local_addr(&self) -> SocketAddr;

    /// Hands datagrams to the network, in order; returns how many were taken (fewer than
    /// `batch.len()` when the link would block). Errors only on a failure of the link itself.
    fn send(&mut self, batch: &[Datagram]) -> io::Result<usize>;

    /// Appends up to `max` received datagrams to `out`; waits up to `timeout`
    /// (`Some(Duration::ZERO)` = non-blocking poll, `None` = block until at least one
    /// arrives). Returns the number appended (0 on timeout).
    fn recv(
        &mut self,
        out: &mut Vec<Datagram>,
        max: usize,
        timeout: Option<Duration>,
    ) -> io::Result<usize>;

    /// Receives like [`Link::recv`] but hands each datagram to `each` as a view instead of
    /// appending an owned copy; returns how many. A link that keeps its receive buffers
    /// hands out views into them, so a receive path that only reads each datagram once
    /// copies nothing (`UdpLink`). Default: [`Link::recv`] into a scratch vector, each
    /// payload given back with [`Link::recycle`] after `each` saw it.
    fn recv_each(
        &mut self,
        max: usize,
        timeout: Option<Duration>,
        each: &mut dyn FnMut(DatagramView<'_>),
    ) -> io::Result<usize> {
        let mut got = Vec::new();
        let n = self.recv(&mut got, max, timeout)?;
        for d in got {
            each(d.view());
            self.recycle(d.payload);
        }
        Ok(n)
    }

    /// Datagrams this link received and discarded instead of handing them out (a UDP
    /// datagram longer than the receive buffer, `MSG_TRUNC`), cumulative since the link was
    /// opened. The soft device counts them as malformed packets, so no arriving datagram goes
    /// uncounted. Default 0, for links that never discard.
    fn recv_discarded(&self) -> u64 {
        0
    }

    /// Gives back the payload buffer of a datagram that [`Link::recv`] handed out and the
    /// caller has finished with, so a later `recv` can fill it instead of allocating. Default:
    /// dropped, for links that do not keep buffers.
    fn recycle(&mut self, payload: Vec<u8>) {
        drop(payload);
    }

    /// A descriptor that is readable while datagrams wait (the UDP socket), the same for the
    /// link's whole life, to sleep on in `poll(2)` as [`Readiness::Idle`] says. Default
    /// `None`: the link can only be waited on in `recv`.
    fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    /// Whether there is something to receive now, or what to sleep on (see [`Readiness`]).
    /// Default [`Readiness::Opaque`]: only a `recv` with a timeout waits.
    fn readiness(&self) -> Readiness {
        Readiness::Opaque
    }

    /// Hands on at once every datagram the link holds back on purpose (a fault injector's
    /// reorder and delay queues), for a device that stops: what was sent before the stop
    /// reaches the network or is counted by the link as dropped, never left inside it
    /// uncounted. Datagrams the network will not take now (the link would block) are
    /// discarded and counted as the link's drops. Default: nothing is held.
    ///
    /// # Errors
    /// A failure of the link itself (what it held is then counted as dropped).
    fn flush_held(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<L: Link + ?Sized> Link for Box<L> {
    fn local_addr(&self) -> SocketAddr {
        (**self).local_addr()
    }

    fn send(&mut self, batch: &[Datagram]) -> io::Result<usize> {
        (**self).send(batch)
    }

    fn recv(
        &mut self,
        out: &mut Vec<Datagram>,
        max: usize,
        timeout: Option<Duration>,
    ) -> io::Result<usize> {
        (**self).recv(out, max, timeout)
    }

    fn recv_each(
        &mut self,
        max: usize,
        timeout: Option<Duration>,
        each: &mut dyn FnMut(DatagramView<'_>),
    ) -> io::Result<usize> {
        (**self).recv_each(max, timeout, each)
    }

    fn recv_discarded(&self) -> u64 {
        (**self).recv_discarded()
    }

    fn recycle(&mut self, payload: Vec<u8>) {
        (**self).recycle(payload);
    }

    fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        (**self).wait_fd()
    }

    fn readiness(&self) -> Readiness {
        (**self).readiness()
    }

    fn flush_held(&mut self) -> io::Result<()> {
        (**self).flush_held()
    }
}

/// Counters of one [`MemoryLink`] end (sending side).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryLinkCounts {
    /// Datagrams delivered into the peer's queue.
    pub delivered: u64,
    /// Datagrams taken but dropped because their `peer` is not the other end's address.
    pub dropped_unroutable: u64,
    /// Datagrams refused because the peer's queue was full (not taken; `send` returned fewer).
    pub refused_full: u64,
}

#[derive(Debug)]
struct Queue {
    packets: VecDeque<Datagram>,
    /// The sending end still exists.
    open: bool,
}

#[derive(Debug)]
struct Channel {
    queue: Mutex<Queue>,
    ready: Condvar,
    capacity: Option<usize>,
}

impl Channel {
    fn new(capacity: Option<usize>) -> Arc<Channel> {
        Arc::new(Channel {
            queue: Mutex::new(Queue {
                packets: VecDeque::new(),
                open: true,
            }),
            ready: Condvar::new(),
            capacity,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A panic while holding the lock cannot leave the queue half-updated (every
        // critical section is a push or a pop), so a poisoned lock is still usable.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One end of an in-memory point-to-point link: deterministic, FIFO, no loss unless the
/// bounded queue is full (then `send` takes fewer, like a socket returning `WouldBlock`).
///
/// Datagrams whose `peer` is not the other end's address are taken and dropped (counted in
/// [`MemoryLinkCounts::dropped_unroutable`]), as UDP to an address nobody listens on.
/// Received datagrams carry `peer` = the sender's address and `local` = this end's address.
#[derive(Debug)]
pub struct MemoryLink {
    addr: SocketAddr,
    peer_addr: SocketAddr,
    tx: Arc<Channel>,
    rx: Arc<Channel>,
    counts: MemoryLinkCounts,
}

impl MemoryLink {
    /// Two connected ends bound to `a` and `b`, with unbounded queues.
    pub fn pair(a: SocketAddr, b: SocketAddr) -> (MemoryLink, MemoryLink) {
        Self::build(a, b, None)
    }

    /// Two connected ends whose receive queues hold at most `capacity` datagrams each.
    pub fn pair_bounded(a: SocketAddr, b: SocketAddr, capacity: usize) -> (MemoryLink, MemoryLink) {
        Self::build(a, b, Some(capacity))
    }

    fn build(a: SocketAddr, b: SocketAddr, capacity: Option<usize>) -> (MemoryLink, MemoryLink) {
        let a_to_b = Channel::new(capacity);
        let b_to_a = Channel::new(capacity);
        let end_a = MemoryLink {
            addr: a,
            peer_addr: b,
            tx: Arc::clone(&a_to_b),
            rx: Arc::clone(&b_to_a),
            counts: MemoryLinkCounts::default(),
        };
        let end_b = MemoryLink {
            addr: b,
            peer_addr: a,
            tx: b_to_a,
            rx: a_to_b,
            counts: MemoryLinkCounts::default(),
        };
        (end_a, end_b)
    }

    /// Address of the other end.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer_addr
    }

    /// This end's sending counters.
    pub fn counts(&self) -> MemoryLinkCounts {
        self.counts
    }

    /// Datagrams waiting in this end's receive queue.
    pub fn pending(&self) -> usize {
        self.rx.lock().packets.len()
    }
}

impl Drop for MemoryLink {
    fn drop(&mut self) {
        self.tx.lock().open = false;
        self.tx.ready.notify_all();
    }
}

impl Link for MemoryLink {
    fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    fn send(&mut self, batch: &[Datagram]) -> io::Result<usize> {
        let mut queue = self.tx.lock();
        let mut taken = 0;
        for d in batch {
            if d.peer != self.peer_addr {
                self.counts.dropped_unroutable += 1;
                taken += 1;
                continue;
            }
            if self
                .tx
                .capacity
                .is_some_and(|cap| queue.packets.len() >= cap)
            {
                self.counts.refused_full += (batch.len() - taken) as u64;
                break;
            }
            queue.packets.push_back(Datagram {
                peer: self.addr,
                local: Some(self.peer_addr),
                payload: d.payload.clone(),
            });
            self.counts.delivered += 1;
            taken += 1;
        }
        drop(queue);
        self.tx.ready.notify_all();
        Ok(taken)
    }

    fn recv(
        &mut self,
        out: &mut Vec<Datagram>,
        max: usize,
        timeout: Option<Duration>,
    ) -> io::Result<usize> {
        if max == 0 {
            return Ok(0);
        }
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let mut queue = self.rx.lock();
        while queue.packets.is_empty() {
            if !queue.open {
                return Err(io::Error::new(
                    io::ErrorKind::NotConnected,
                    format!("memory link peer {} is gone", self.peer_addr),
                ));
            }
            match (timeout, deadline) {
                (Some(t), _) if t.is_zero() => return Ok(0),
                (Some(_), Some(deadline)) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Ok(0);
                    }
                    queue = self
                        .rx
                        .ready
                        .wait_timeout(queue, deadline - now)
                        .map(|(q, _)| q)
                        .unwrap_or_else(|e| e.into_inner().0);
                }
                _ => {
                    queue = self.rx.ready.wait(queue).unwrap_or_else(|e| e.into_inner());
                }
            }
        }
        let n = max.min(queue.packets.len());
        out.extend(queue.packets.drain(..n));
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    fn addrs() -> (SocketAddr, SocketAddr) {
        (
            "10.0.0.1:4791".parse().expect("addr"),
            "10.0.0.2:4791".parse().expect("addr"),
        )
    }

    #[test]
    fn pair_delivers_in_order_with_addresses() {
        let (a, b) = addrs();
        let (mut la, mut lb) = MemoryLink::pair(a, b);
        let batch: Vec<Datagram> = (0..5u8).map(|i| Datagram::to(b, vec![i; 4])).collect();
        assert_eq!(la.send(&batch).expect("send"), 5);
        let mut out = Vec::new();
        assert_eq!(lb.recv(&mut out, 3, Some(Duration::ZERO)).expect("recv"), 3);
        assert_eq!(lb.recv(&mut out, 10, None).expect("recv"), 2);
        for (i, d) in out.iter().enumerate() {
            assert_eq!(d.payload, vec![i as u8; 4]);
            assert_eq!(d.peer, a);
            assert_eq!(d.local, Some(b));
        }
        assert_eq!(
            lb.recv(&mut out, 10, Some(Duration::ZERO)).expect("recv"),
            0
        );
        assert_eq!(la.counts().delivered, 5);
    }

    #[test]
    fn unroutable_and_full_are_counted() {
        let (a, b) = addrs();
        let (mut la, lb) = MemoryLink::pair_bounded(a, b, 2);
        let wrong: SocketAddr = "10.0.0.3:4791".parse().expect("addr");
        let batch = vec![
            Datagram::to(wrong, vec![1]),
            Datagram::to(b, vec![2]),
            Datagram::to(b, vec![3]),
            Datagram::to(b, vec![4]),
        ];
        assert_eq!(la.send(&batch).expect("send"), 3);
        assert_eq!(
            la.counts(),
            MemoryLinkCounts {
                delivered: 2,
                dropped_unroutable: 1,
                refused_full: 1
            }
        );
        assert_eq!(lb.pending(), 2);
    }

    #[test]
    fn blocking_recv_wakes_and_reports_closed_peer() {
        let (a, b) = addrs();
        let (mut la, mut lb) = MemoryLink::pair(a, b);
        let sender = thread::spawn(move || {
            la.send(&[Datagram::to(b, vec![9])]).expect("send");
            // `la` dropped here.
        });
        let mut out = Vec::new();
        assert_eq!(lb.recv(&mut out, 1, None).expect("recv"), 1);
        sender.join().expect("join");
        let err = lb.recv(&mut out, 1, None).expect_err("peer gone");
        assert_eq!(err.kind(), io::ErrorKind::NotConnected);
        // Timeout path returns 0 once drained? Peer gone takes precedence.
        assert_eq!(lb.recv(&mut out, 0, None).expect("max 0"), 0);
    }

    #[test]
    fn timed_recv_returns_zero() {
        let (a, b) = addrs();
        let (_la, mut lb) = MemoryLink::pair(a, b);
        let mut out = Vec::new();
        assert_eq!(
            lb.recv(&mut out, 4, Some(Duration::from_millis(5)))
                .expect("recv"),
            0
        );
        assert!(out.is_empty());
    }
}
