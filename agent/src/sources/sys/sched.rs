//! The scheduling policy of the threads that wake at the aligned sampling instants
//! (`runners::rounds`): sched_setscheduler(2) `SCHED_FIFO`, which no safe crate the agent
//! uses wraps (rustix has no scheduler-policy call).

use std::io;

/// The real-time priority the waking threads ask for: 1, the lowest of `SCHED_FIFO`'s
/// 1–99 (sched(7)), so that they preempt every normal (`SCHED_OTHER`) thread the moment
/// their timer fires and yield to every other real-time thread of the host (interrupt
/// threads, ptp4l, chronyd's).
pub const WAKE_RT_PRIORITY: i32 = 1;

/// Makes the calling thread, and only it, a `SCHED_FIFO` thread of priority
/// [`WAKE_RT_PRIORITY`], with `SCHED_RESET_ON_FORK` (a child it starts is a normal thread
/// again). A real-time thread's timers also fire without timer slack (hrtimers(7): the
/// kernel uses no slack for real-time tasks), so a sleep to the grid ends at its instant.
///
/// Linux keeps the policy per thread: sched_setscheduler(2) with pid 0 applies to the
/// calling thread. The kernel's real-time throttling (`/proc/sys/kernel/sched_rt_runtime_us`,
/// 0.95 s of each 1 s by default) bounds what a runaway real-time thread could take.
///
/// # Errors
/// `EPERM` without `CAP_SYS_NICE` or an `RLIMIT_RTPRIO` of at least 1 (setrlimit(2); the
/// systemd unit's `LimitRTPRIO=1`), or where a seccomp filter or systemd's
/// `RestrictRealtime=yes` forbids it.
pub fn wake_in_real_time() -> io::Result<()> {
    let param = libc::sched_param {
        sched_priority: WAKE_RT_PRIORITY,
    };
    // SAFETY: sched_setscheduler(2) reads `param`, a valid `sched_param` that outlives the
    // call; pid 0 is the calling thread, and the call changes nothing but its policy.
    let rc = unsafe {
        libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &param)
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The calling thread's scheduling policy, without `SCHED_RESET_ON_FORK`
/// (sched_getscheduler(2); `libc::SCHED_FIFO`, `libc::SCHED_OTHER`, …).
///
/// # Errors
/// sched_getscheduler(2) failed (a seccomp filter that forbids it).
pub fn own_policy() -> io::Result<i32> {
    // SAFETY: sched_getscheduler(2) takes no pointer; pid 0 is the calling thread.
    let policy = unsafe { libc::sched_getscheduler(0) };
    if policy < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(policy & !libc::SCHED_RESET_ON_FORK)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Root (or an `RLIMIT_RTPRIO` ≥ 1) gets the policy on its own thread only; anyone else
    /// gets `EPERM` and keeps `SCHED_OTHER`. Either way the other threads are untouched.
    #[test]
    fn only_the_calling_thread_becomes_real_time() {
        let outcome = std::thread::spawn(|| {
            let r = wake_in_real_time();
            (r.map_err(|e| e.raw_os_error()), own_policy().unwrap())
        })
        .join()
        .unwrap();
        match outcome {
            (Ok(()), policy) => assert_eq!(policy, libc::SCHED_FIFO),
            (Err(errno), policy) => {
                assert_eq!(errno, Some(libc::EPERM));
                assert_eq!(policy, libc::SCHED_OTHER);
            }
        }
        assert_eq!(
            own_policy().unwrap(),
            libc::SCHED_OTHER,
            "the test thread kept its own"
        );
    }
}
