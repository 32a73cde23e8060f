//! Sleeping without spinning: an eventfd that other threads write to wake a sleeper, and a
//! `poll(2)` over it and the link's socket.
//!
//! The soft device's progress thread and the soft [`CompletionChannel`] sleep here while there
//! is nothing to do (DESIGN.md §2: idle means asleep). The eventfd is a counter, so a wake
//! written before the sleeper reaches `poll` is not lost: `poll` returns at once and the
//! sleeper [`WakeFd::clear`]s it before looking for work again.
//!
//! [`CompletionChannel`]: crate::api::CompletionChannel

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags, Timespec};

/// A non-blocking eventfd used as a wake-up flag, for one sleeper and any number of wakers.
///
/// `pending` says a wake was signalled and not yet taken, so repeated wakes before the
/// sleeper looks cost one `write(2)`, and a sleeper can check for a wake without a system
/// call ([`WakeFd::take`]). Invariant: `pending` is set before the eventfd is written, and
/// the sleeper reads the eventfd before it resets `pending`, so a wake is never lost: either
/// the eventfd stays readable, or the sleeper's reset reads the waker's `pending` (and, with
/// it, whatever the waker did before waking).
#[derive(Debug)]
pub(crate) struct WakeFd {
    fd: OwnedFd,
    pending: AtomicBool,
}

impl WakeFd {
    /// A new, clear eventfd (`EFD_NONBLOCK | EFD_CLOEXEC`).
    pub(crate) fn new() -> io::Result<WakeFd> {
        let fd = eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)?;
        Ok(WakeFd {
            fd,
            pending: AtomicBool::new(false),
        })
    }

    /// Makes the eventfd readable (one `write(2)` of 8 bytes unless a wake is pending
    /// already). Never blocks: a counter at its maximum is readable already.
    pub(crate) fn wake(&self) {
        if !self.pending.swap(true, Ordering::AcqRel) {
            let _ = rustix::io::write(&self.fd, &1u64.to_ne_bytes());
        }
    }

    /// Resets the eventfd: one `read(2)` (nothing to read is fine), then `pending`. Returns
    /// whether a wake was pending.
    pub(crate) fn clear(&self) -> bool {
        let mut buf = [0u8; 8];
        let _ = rustix::io::read(&self.fd, &mut buf);
        self.pending.swap(false, Ordering::AcqRel)
    }

    /// Takes a pending wake, if any: no system call when there is none.
    pub(crate) fn take(&self) -> bool {
        self.pending.load(Ordering::Acquire) && self.clear()
    }

    /// The descriptor, for [`sleep_until`].
    pub(crate) fn borrow(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// What woke a [`sleep_until`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Woken {
    /// The wake eventfd is readable (it is cleared before returning).
    pub(crate) wake: bool,
    /// The other descriptor is readable (or in error: the caller's next call finds out).
    pub(crate) other: bool,
}

/// Sleeps in `poll(2)` until `wake` or `other` is readable, or until `deadline` (`None` = no
/// deadline). A signal (`EINTR`) returns early with nothing set; the caller re-checks its
/// work anyway. Clears `wake` when it was readable.
///
/// # Errors
/// `poll(2)` failed for another reason (the descriptors are invalid).
pub(crate) fn sleep_until(
    wake: &WakeFd,
    other: Option<BorrowedFd<'_>>,
    deadline: Option<Instant>,
) -> io::Result<Woken> {
    let timeout = deadline.map(|d| {
        let left = d.saturating_duration_since(Instant::now());
        Timespec::try_from(left).unwrap_or(Timespec {
            tv_sec: i64::MAX,
            tv_nsec: 0,
        })
    });
    let mut fds = [
        PollFd::from_borrowed_fd(wake.borrow(), PollFlags::IN),
        PollFd::from_borrowed_fd(other.unwrap_or(wake.borrow()), PollFlags::IN),
    ];
    let n = if other.is_some() { 2 } else { 1 };
    let ready = |f: &PollFd<'_>| {
        f.revents()
            .intersects(PollFlags::IN | PollFlags::ERR | PollFlags::HUP | PollFlags::NVAL)
    };
    match poll(&mut fds[..n], timeout.as_ref()) {
        Ok(_) => {}
        Err(rustix::io::Errno::INTR) => return Ok(Woken::default()),
        Err(e) => return Err(e.into()),
    }
    let woken = Woken {
        wake: ready(&fds[0]),
        other: n == 2 && ready(&fds[1]),
    };
    if woken.wake {
        let _ = wake.clear();
    }
    Ok(woken)
}

/// `Some(now + d)`, or `None` when that overflows (a wait that never ends).
pub(crate) fn deadline_after(d: Duration) -> Option<Instant> {
    Instant::now().checked_add(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wake_before_the_sleep_is_not_lost_and_is_cleared() {
        let w = WakeFd::new().expect("eventfd");
        w.wake();
        w.wake();
        let start = Instant::now();
        let woken = sleep_until(&w, None, deadline_after(Duration::from_secs(5))).expect("poll");
        assert!(woken.wake && !woken.other);
        assert!(start.elapsed() < Duration::from_secs(1));
        assert!(!w.take(), "taken by the sleep");
        // Cleared: the next sleep times out.
        let woken = sleep_until(&w, None, deadline_after(Duration::from_millis(20))).expect("poll");
        assert_eq!(woken, Woken::default());
    }

    #[test]
    fn a_wake_from_another_thread_ends_the_sleep_promptly() {
        let w = std::sync::Arc::new(WakeFd::new().expect("eventfd"));
        let w2 = std::sync::Arc::clone(&w);
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            w2.wake();
        });
        let start = Instant::now();
        let woken = sleep_until(&w, None, None).expect("poll");
        assert!(woken.wake);
        assert!(start.elapsed() < Duration::from_secs(5));
        t.join().expect("join");
    }

    #[test]
    fn the_other_descriptor_wakes_too() {
        let w = WakeFd::new().expect("eventfd");
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        let to = sock.local_addr().expect("addr");
        let peer = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        let woken = sleep_until(
            &w,
            Some(sock.as_fd()),
            deadline_after(Duration::from_millis(10)),
        )
        .expect("poll");
        assert_eq!(woken, Woken::default(), "nothing arrived: timeout");
        peer.send_to(b"x", to).expect("send");
        let woken = sleep_until(&w, Some(sock.as_fd()), None).expect("poll");
        assert!(woken.other && !woken.wake);
    }
}
