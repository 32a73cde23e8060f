//! [`UdpSink`]: a bare `recvmmsg` receiver that discards what it reads, the baseline the
//! soft path is compared with (`uctel-bench`'s UDP limit rows).

use std::io::{self, IoSliceMut};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::time::Instant;

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags};
use nix::sys::socket::{
    cmsg_space, recvmmsg, setsockopt, sockopt, ControlMessageOwned, MsgFlags, MultiHeaders,
    SockaddrStorage,
};

use super::{open_socket, poll_timeout, PollMode, UdpConfig, GRO_SLOT_BYTES, MAX_BATCH};

/// Figures from a [`UdpSink`] run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SinkStats {
    /// Datagrams read.
    pub messages: u64,
    /// Payload bytes read.
    pub bytes: u64,
    /// `recvmmsg` calls that returned at least one datagram.
    pub calls: u64,
    /// Coalesced `UDP_GRO` buffers read (their datagrams count in `messages`); 0 unless
    /// bound with [`UdpSink::bind_gro`].
    pub gro_buffers: u64,
}

/// A bare `recvmmsg` receiver that discards everything: the baseline of how many datagrams
/// per second the kernel can hand to one user-space thread at a given size; with
/// [`UdpSink::bind_gro`], the same with `UDP_GRO` coalescing.
#[derive(Debug)]
pub struct UdpSink {
    socket: UdpSocket,
    bufs: Vec<Vec<u8>>,
    /// `UDP_GRO` is on: read the segment size of each buffer.
    gro: bool,
}

impl UdpSink {
    /// Binds a non-blocking socket at `bind` with `SO_RCVBUF` `recv_buffer_bytes`, reading up
    /// to `batch` datagrams of up to `max_datagram_bytes` per call.
    pub fn bind(
        bind: SocketAddr,
        batch: usize,
        max_datagram_bytes: usize,
        recv_buffer_bytes: usize,
    ) -> io::Result<UdpSink> {
        let config = UdpConfig {
            bind,
            recv_buffer_bytes: Some(recv_buffer_bytes),
            send_buffer_bytes: None,
            batch: batch.clamp(1, MAX_BATCH),
            max_datagram_bytes: max_datagram_bytes.clamp(1, 65_535),
            poll_mode: PollMode::Blocking,
            only_v6: false,
            gso: false,
            gro: false,
        };
        let (socket, _, _) = open_socket(&config)?;
        let bufs = vec![vec![0u8; config.max_datagram_bytes]; config.batch];
        Ok(UdpSink {
            socket,
            bufs,
            gro: false,
        })
    }

    /// [`UdpSink::bind`] with `UDP_GRO` on and 64 KiB buffers: the kernel may hand several
    /// datagrams as one buffer, and [`UdpSink::drain`] counts each of its datagrams
    /// (buffer length over the segment size from the `UDP_GRO` control message, rounded up).
    ///
    /// Errors: as [`UdpSink::bind`], and the `setsockopt(UDP_GRO)` failure where the kernel
    /// has no UDP GRO (before Linux 5.0).
    pub fn bind_gro(
        bind: SocketAddr,
        batch: usize,
        recv_buffer_bytes: usize,
    ) -> io::Result<UdpSink> {
        let mut sink = UdpSink::bind(bind, batch, 65_535, recv_buffer_bytes)?;
        setsockopt(&sink.socket.as_fd(), sockopt::UdpGroSegment, &true)?;
        for b in &mut sink.bufs {
            b.resize(GRO_SLOT_BYTES, 0);
        }
        sink.gro = true;
        Ok(sink)
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.socket.local_addr()
    }

    /// Reads until `messages` datagrams were read or `deadline` passed, sleeping in `poll`
    /// when the socket is empty.
    pub fn drain(&mut self, messages: u64, deadline: Instant) -> io::Result<SinkStats> {
        let mut stats = SinkStats::default();
        let fd = self.socket.as_raw_fd();
        let n = self.bufs.len();
        // `open_socket` turns on `IP_PKTINFO`/`IPV6_RECVPKTINFO` too: room for those, or the
        // kernel truncates the control messages (`MSG_CTRUNC`) and the segment size is lost.
        let cmsg = self.gro.then(|| {
            vec![
                0u8;
                cmsg_space::<libc::c_int>()
                    + cmsg_space::<libc::in_pktinfo>()
                    + cmsg_space::<libc::in6_pktinfo>()
            ]
        });
        let mut headers = MultiHeaders::<SockaddrStorage>::preallocate(n, cmsg);
        while stats.messages < messages {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            let mut iovs: Vec<[IoSliceMut<'_>; 1]> = self
                .bufs
                .iter_mut()
                .map(|b| [IoSliceMut::new(b.as_mut_slice())])
                .collect();
            match recvmmsg(
                fd,
                &mut headers,
                iovs.iter_mut(),
                MsgFlags::MSG_DONTWAIT,
                None,
            ) {
                Ok(results) => {
                    stats.calls += 1;
                    for msg in results {
                        let mut segments = 1;
                        if let Ok(cmsgs) = msg.cmsgs() {
                            for cmsg in cmsgs {
                                if let ControlMessageOwned::UdpGroSegments(size) = cmsg {
                                    if let Ok(size @ 1..) = usize::try_from(size) {
                                        segments = msg.bytes.div_ceil(size).max(1);
                                    }
                                }
                            }
                        }
                        if segments > 1 {
                            stats.gro_buffers += 1;
                        }
                        stats.messages += segments as u64;
                        stats.bytes += msg.bytes as u64;
                    }
                }
                Err(Errno::EAGAIN) | Err(Errno::EINTR) => {
                    let mut fds = [PollFd::new(self.socket.as_fd(), PollFlags::POLLIN)];
                    match poll(&mut fds, poll_timeout(Some(deadline - now))) {
                        Ok(_) | Err(Errno::EINTR) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(stats)
    }
}
