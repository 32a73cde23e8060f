//! CPU time and memory of processes and threads.
//!
//! * A child process (collector, agent): `/proc/<pid>/stat` `utime + stime` (clock ticks,
//!   `USER_HZ`, usually 100/s, so windows of a few seconds resolve to about 0.5 %), each
//!   thread's `/proc/<pid>/task/<tid>/stat` grouped by thread name, and `VmRSS`/`VmHWM` from
//!   `/proc/<pid>/status` (proc(5)).
//! * The calling thread: `getrusage(RUSAGE_THREAD)` (microsecond resolution, getrusage(2)).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use nix::sys::resource::{getrusage, UsageWho};
use serde::Serialize;

/// Why a process could not be sampled.
#[derive(Debug, thiserror::Error)]
pub enum SampleError {
    /// Reading procfs failed (the process may have exited).
    #[error("reading /proc/{pid}: {source}")]
    Proc {
        /// The process.
        pid: i32,
        /// The procfs error.
        source: procfs::ProcError,
    },
}

/// CPU time of one thread.
#[derive(Clone, Debug, PartialEq)]
pub struct ThreadCpu {
    /// Thread id.
    pub tid: i32,
    /// Thread name (`comm`, at most 15 bytes).
    pub name: String,
    /// User + system CPU seconds since the thread started.
    pub seconds: f64,
}

/// One snapshot of a process.
#[derive(Clone, Debug)]
pub struct ProcessSample {
    /// When it was taken.
    pub at: Instant,
    /// User + system CPU seconds of the whole process (all threads, live and exited).
    pub cpu_seconds: f64,
    /// Live threads.
    pub threads: Vec<ThreadCpu>,
    /// Resident set size, bytes.
    pub rss_bytes: u64,
    /// Peak resident set size, bytes.
    pub hwm_bytes: u64,
}

fn ticks_to_seconds(ticks: u64) -> f64 {
    ticks as f64 / procfs::ticks_per_second() as f64
}

/// Samples process `pid`.
///
/// # Errors
/// [`SampleError`] when procfs cannot be read.
pub fn sample_process(pid: i32) -> Result<ProcessSample, SampleError> {
    let err = |source| SampleError::Proc { pid, source };
    let at = Instant::now();
    let p = procfs::process::Process::new(pid).map_err(err)?;
    let stat = p.stat().map_err(err)?;
    let status = p.status().map_err(err)?;
    let mut threads = Vec::new();
    for task in p.tasks().map_err(err)?.flatten() {
        if let Ok(s) = task.stat() {
            threads.push(ThreadCpu {
                tid: task.tid,
                name: s.comm.clone(),
                seconds: ticks_to_seconds(s.utime + s.stime),
            });
        }
    }
    Ok(ProcessSample {
        at,
        cpu_seconds: ticks_to_seconds(stat.utime + stat.stime),
        threads,
        rss_bytes: status.vmrss.unwrap_or(0) * 1024,
        hwm_bytes: status.vmhwm.unwrap_or(0) * 1024,
    })
}

/// CPU used between two snapshots of one process.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CpuDelta {
    /// Wall seconds between the snapshots.
    pub wall_seconds: f64,
    /// CPU seconds of the process.
    pub cpu_seconds: f64,
    /// `cpu_seconds / wall_seconds`: cores kept busy.
    pub cores: f64,
    /// CPU seconds by thread name (threads sharing a name, e.g. tokio workers, summed).
    pub by_thread: BTreeMap<String, f64>,
}

/// The CPU used between `a` and `b` (same process, `a` first). Threads that exist only in
/// `b` count from zero; threads gone by `b` are only in the process total.
pub fn delta(a: &ProcessSample, b: &ProcessSample) -> CpuDelta {
    let wall = b.at.saturating_duration_since(a.at).as_secs_f64();
    let cpu = (b.cpu_seconds - a.cpu_seconds).max(0.0);
    let mut by_thread = BTreeMap::new();
    for t in &b.threads {
        let before = a
            .threads
            .iter()
            .find(|x| x.tid == t.tid)
            .map_or(0.0, |x| x.seconds);
        *by_thread.entry(t.name.clone()).or_insert(0.0) += (t.seconds - before).max(0.0);
    }
    CpuDelta {
        wall_seconds: wall,
        cpu_seconds: cpu,
        cores: crate::stats::rate(cpu, wall),
        by_thread,
    }
}

/// User + system CPU time of the calling thread (`getrusage(RUSAGE_THREAD)`); zero if the
/// call fails (it cannot for the calling thread on Linux).
pub fn thread_cpu() -> Duration {
    match getrusage(UsageWho::RUSAGE_THREAD) {
        Ok(u) => {
            let us = |t: nix::sys::time::TimeVal| {
                Duration::from_secs(u64::try_from(t.tv_sec()).unwrap_or(0))
                    + Duration::from_micros(u64::try_from(t.tv_usec()).unwrap_or(0))
            };
            us(u.user_time()) + us(u.system_time())
        }
        Err(_) => Duration::ZERO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_this_process_sees_threads_and_memory() {
        let pid = i32::try_from(std::process::id()).unwrap();
        let s = sample_process(pid).unwrap();
        assert!(s.rss_bytes > 0);
        assert!(s.hwm_bytes >= s.rss_bytes);
        assert!(!s.threads.is_empty());
    }

    #[test]
    fn thread_cpu_moves_when_the_thread_works() {
        let before = thread_cpu();
        let mut x = 0u64;
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(30) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        assert!(thread_cpu() > before);
    }

    #[test]
    fn delta_groups_threads_by_name() {
        let t0 = Instant::now();
        let a = ProcessSample {
            at: t0,
            cpu_seconds: 1.0,
            threads: vec![
                ThreadCpu {
                    tid: 1,
                    name: "main".into(),
                    seconds: 0.5,
                },
                ThreadCpu {
                    tid: 2,
                    name: "rt".into(),
                    seconds: 0.25,
                },
            ],
            rss_bytes: 0,
            hwm_bytes: 0,
        };
        let b = ProcessSample {
            at: t0 + Duration::from_secs(2),
            cpu_seconds: 2.0,
            threads: vec![
                ThreadCpu {
                    tid: 1,
                    name: "main".into(),
                    seconds: 0.75,
                },
                ThreadCpu {
                    tid: 2,
                    name: "rt".into(),
                    seconds: 0.5,
                },
                ThreadCpu {
                    tid: 3,
                    name: "rt".into(),
                    seconds: 0.5,
                },
            ],
            rss_bytes: 0,
            hwm_bytes: 0,
        };
        let d = delta(&a, &b);
        assert_eq!(d.cpu_seconds, 1.0);
        assert_eq!(d.cores, 0.5);
        assert_eq!(d.by_thread.get("main"), Some(&0.25));
        assert_eq!(d.by_thread.get("rt"), Some(&0.75));
    }
}
