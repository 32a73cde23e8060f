//! How many datagrams a UDP receive buffer holds before the kernel drops.
//!
//! The kernel charges a queued datagram its whole socket buffer (`skb->truesize`: the data
//! buffer rounded up to its allocation, plus `struct sk_buff` and `skb_shared_info`), not
//! its payload, against `SO_RCVBUF` (the value `getsockopt` returns, twice the request).
//! That cost depends on the kernel and the receiving device, so it is measured, not
//! computed: [`receive_capacity`] fills a loopback socket with the same buffer size and
//! counts what it kept. Loopback allocates one linear buffer per datagram; a NIC driver
//! whose receive buffers are larger (page fragments of 4 KiB for a 1 KiB packet) holds fewer,
//! one that coalesces (UDP GRO) more, so callers should leave a margin or let the operator
//! set the figure.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::sys::socket::{setsockopt, sockopt};
use socket2::{Domain, Protocol, Socket, Type};

/// What [`receive_capacity`] measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReceiveCapacity {
    /// Datagrams the probe socket held without a drop.
    pub datagrams: u64,
    /// The probe socket's `SO_RCVBUF` as the kernel reports it (bytes).
    pub probe_buffer_bytes: usize,
    /// The buffer the figure was scaled to (the caller's socket), bytes.
    pub buffer_bytes: usize,
}

/// Fills a loopback UDP socket whose receive buffer is `buffer_bytes` (as `getsockopt`
/// reports it for the socket being sized) with datagrams of `datagram_bytes` of payload
/// and returns how many it held. Where the probe cannot get the same buffer (a privileged
/// `SO_RCVBUFFORCE` refused), the count is scaled by the ratio of the two buffers. Takes a
/// few milliseconds (one send per datagram it holds, twice over).
///
/// # Errors
/// Socket creation, bind or option errors of the probe sockets.
pub fn receive_capacity(buffer_bytes: usize, datagram_bytes: usize) -> io::Result<ReceiveCapacity> {
    let datagram_bytes = datagram_bytes.clamp(1, 65_507);
    let rx = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    let request = (buffer_bytes / 2).max(1);
    if setsockopt(&rx.as_fd(), sockopt::RcvBufForce, &request).is_err() {
        rx.set_recv_buffer_size(request)?;
    }
    rx.bind(&SocketAddr::from((Ipv4Addr::LOCALHOST, 0)).into())?;
    rx.set_nonblocking(true)?;
    let probe_buffer_bytes = rx.recv_buffer_size()?;
    let rx: UdpSocket = rx.into();
    let tx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?;
    tx.set_nonblocking(true)?;
    let target = rx.local_addr()?;
    let payload = vec![0u8; datagram_bytes];
    // More datagrams than could fit even at the payload alone; the receiver keeps what its
    // buffer admits and drops the rest.
    let attempts = probe_buffer_bytes / datagram_bytes + 64;
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut sent = 0usize;
    while sent < attempts && Instant::now() < deadline {
        match tx.send_to(&payload, target) {
            Ok(_) => sent += 1,
            // The sender's own buffer is full: give the loopback a moment.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
            Err(e) if e.raw_os_error() == Some(nix::libc::ENOBUFS) => std::thread::yield_now(),
            Err(e) => return Err(e),
        }
    }
    let mut held = 0u64;
    let mut buf = vec![0u8; datagram_bytes + 1];
    loop {
        match rx.recv(&mut buf) {
            Ok(_) => held += 1,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(e),
        }
    }
    let scaled = if probe_buffer_bytes == buffer_bytes || probe_buffer_bytes == 0 {
        held
    } else {
        (held as u128 * buffer_bytes as u128 / probe_buffer_bytes as u128) as u64
    };
    Ok(ReceiveCapacity {
        datagrams: scaled,
        probe_buffer_bytes,
        buffer_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_holds_fewer_datagrams_than_its_bytes_suggest_and_scales_with_its_size() {
        let datagram = 1_060;
        let small = receive_capacity(256 << 10, datagram).expect("probe");
        let large = receive_capacity(1 << 20, datagram).expect("probe");
        assert!(small.datagrams > 0, "{small:?}");
        // The kernel charges more than the payload per datagram.
        assert!(
            (small.datagrams as usize) < small.buffer_bytes / datagram,
            "{small:?}"
        );
        // Four times the buffer holds about four times the datagrams (allocation slack).
        let ratio = large.datagrams as f64 / small.datagrams as f64;
        assert!((3.0..=5.0).contains(&ratio), "{small:?} {large:?}");
    }
}
