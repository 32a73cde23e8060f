//! The kernel clock, read where no safe interface exists: the NTP discipline state of
//! adjtimex(2) and the local time zone of localtime_r(3).
//!
//! One of the modules of [`crate::sources::sys`], the agent's only `unsafe` code: two libc
//! calls on stack values, each with its `// SAFETY:` note.
//! `rustix` and `nix` wrap neither call.

use std::ffi::CStr;
use std::io;

/// `STA_NANO` in `timex.status`: `offset` and `jitter` are nanoseconds, not microseconds
/// (`include/uapi/linux/timex.h`).
pub const STA_NANO: i64 = 0x2000;

/// `TIME_ERROR`, the adjtimex(2) return value of a clock that is not synchronized.
pub const TIME_ERROR: i32 = 5;

/// The kernel's clock discipline state, as adjtimex(2) returns it in `struct timex` (units as
/// the kernel gives them: see adjtimex(2) and `include/uapi/linux/timex.h`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KernelClock {
    /// The return value: the clock state (`TIME_OK` 0 … [`TIME_ERROR`] 5).
    pub state: i32,
    /// Time offset: microseconds, or nanoseconds when `status` has [`STA_NANO`].
    pub offset: i64,
    /// Frequency offset, ppm with a 16-bit fraction (65536 = 1 ppm).
    pub freq: i64,
    /// Maximum error, microseconds.
    pub maxerror: i64,
    /// Estimated error, microseconds.
    pub esterror: i64,
    /// The `STA_*` status bits.
    pub status: i64,
    /// Phase-locked loop time constant.
    pub constant: i64,
    /// Microseconds between clock ticks.
    pub tick: i64,
    /// PPS frequency, ppm with a 16-bit fraction.
    pub ppsfreq: i64,
    /// PPS jitter: microseconds, or nanoseconds with [`STA_NANO`].
    pub jitter: i64,
    /// PPS interval duration, seconds (log2).
    pub shift: i64,
    /// PPS stability, ppm with a 16-bit fraction.
    pub stabil: i64,
    /// PPS count of jitter limit exceeded events.
    pub jitcnt: i64,
    /// PPS count of calibration intervals.
    pub calcnt: i64,
    /// PPS count of calibration errors.
    pub errcnt: i64,
    /// PPS count of stability limit exceeded events.
    pub stbcnt: i64,
    /// TAI offset, seconds.
    pub tai: i64,
}

/// Reads the kernel clock's state with adjtimex(2) in read-only mode (`modes` 0), which needs
/// no privilege.
///
/// # Errors
/// The system call's error (`EPERM` under a seccomp profile that forbids it).
pub fn kernel_clock() -> io::Result<KernelClock> {
    // SAFETY: `timex` is a plain C struct of integers; all zeroes is a valid value and, with
    // `modes` 0, asks the kernel to only read.
    let mut tx: libc::timex = unsafe { std::mem::zeroed() };
    // SAFETY: `tx` is a valid, exclusively borrowed `timex` for the duration of the call; the
    // kernel only writes into it.
    let state = unsafe { libc::adjtimex(&mut tx) };
    if state < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(KernelClock {
        state,
        offset: tx.offset,
        freq: tx.freq,
        maxerror: tx.maxerror,
        esterror: tx.esterror,
        status: i64::from(tx.status),
        constant: tx.constant,
        tick: tx.tick,
        ppsfreq: tx.ppsfreq,
        jitter: tx.jitter,
        shift: i64::from(tx.shift),
        stabil: tx.stabil,
        jitcnt: tx.jitcnt,
        calcnt: tx.calcnt,
        errcnt: tx.errcnt,
        stbcnt: tx.stbcnt,
        tai: i64::from(tx.tai),
    })
}

/// The local time zone at `unix_seconds`: its abbreviation (`"UTC"`, `"CET"`) and its offset
/// east of UTC in seconds, as localtime_r(3) finds them (the `TZ` variable, else
/// `/etc/localtime`); `None` when the C library cannot convert the time.
pub fn local_zone(unix_seconds: i64) -> Option<(String, i64)> {
    let t: libc::time_t = unix_seconds;
    // SAFETY: `tm` is a plain C struct of integers and one pointer; all zeroes (a null
    // pointer) is a valid value that localtime_r overwrites.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are to valid stack values that outlive the call; localtime_r is
    // the reentrant variant and writes only into `tm`.
    let result = unsafe { libc::localtime_r(&t, &mut tm) };
    if result.is_null() {
        return None;
    }
    let name = if tm.tm_zone.is_null() {
        String::new()
    } else {
        // SAFETY: glibc sets `tm_zone` to a NUL-terminated string in its time zone tables,
        // which live as long as the process (until the next tzset, which copies it below).
        unsafe { CStr::from_ptr(tm.tm_zone) }
            .to_string_lossy()
            .into_owned()
    };
    Some((name, tm.tm_gmtoff))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_clock_reads_with_a_tick_and_a_known_state() {
        let clock = kernel_clock().expect("adjtimex(2) read-only");
        // The tick is 10⁶ / USER_HZ microseconds, set by the kernel (10,000 at HZ 100).
        assert!(clock.tick > 0, "{clock:?}");
        assert!((0..=TIME_ERROR).contains(&clock.state), "{clock:?}");
    }

    #[test]
    fn the_local_zone_has_a_name_and_an_offset_within_a_day() {
        let (name, offset) = local_zone(1_700_000_000).expect("localtime_r");
        assert!(!name.is_empty());
        assert!(offset.abs() <= 14 * 3600 + 1800, "{offset}");
    }
}
