//! The system calls the agent's sources need that no safe crate wraps, and the crate's only
//! `unsafe` code (the crate is `deny(unsafe_code)`; this module alone allows it, each block with
//! its `// SAFETY:` note):
//!
//! - [`ethtool`]: a network interface's `ethtool -S` statistics, driver information and link
//!   settings over the `SIOCETHTOOL` ioctl (the `ethtool` collector,
//!   [`crate::sources::fast_counters`]).
//! - [`clock`]: the kernel clock's adjtimex(2) state and the local time zone of localtime_r(3)
//!   (the `time` and `timex` collectors).
//! - [`child`]: `PR_SET_PDEATHSIG` for the journald source's `journalctl` child, set between
//!   fork and exec (prctl(2)), so it never outlives the agent.
//! - [`sched`]: `SCHED_FIFO` for the threads that wake at the aligned sampling instants
//!   (sched_setscheduler(2)).
//!
//! Only the agent makes these calls, so they live here rather than in `uctel-common`.

pub mod child;
pub mod clock;
pub mod ethtool;
pub mod sched;
