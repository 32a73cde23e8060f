//! Waiting for the aligned instants of a source ([`crate::pacing::grid`]) and counting the
//! rounds that were late or skipped.
//!
//! Two waits: [`next_round_blocking`] for the sources on a thread of their own (host
//! metrics, fast counters: a `recv_timeout` on the stop channel, to the microsecond the
//! kernel's timer slack allows) and [`next_round`] for the async ones (scrape targets, the
//! textfile directory, self-metrics: a tokio sleep, to the millisecond).
//!
//! Host metrics split waking from collecting ([`wake_rounds`], [`Handover`]): a thread that
//! only sleeps to the grid stamps each round when it wakes and hands it to the collection
//! thread, which runs at a raised nice value ([`raise_own_nice`]). With several agents on
//! few cores, all woken at the same whole second, a collection (a few ms of `/proc` and
//! `/sys` reads) then no longer delays another agent's stamp: a woken thread at the default
//! nice value preempts nice-raised work (CFS weights, `sched(7)`).

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Duration;

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};
use uctel_common::shutdown::Shutdown;

use crate::config::WakeScheduling;
use crate::pacing::grid::{unix_now_ns, Grid, GridRound};

/// `uctel_agent_missed_rounds_total{source}` and `uctel_agent_round_lateness_seconds{source}`
/// for the aligned sources (`host_metrics`, `scrape`, `textfile`, `self_metrics`; the fast
/// counters keep their own `uctel_agent_fast_*`).
#[derive(Debug, Clone)]
pub struct RoundMetrics {
    missed: IntCounterVec,
    lateness: HistogramVec,
}

/// One round that began: its instant, and the wall-clock time it began (ns since the Unix
/// epoch; what its records are stamped with).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Began {
    /// The grid's answer.
    pub round: GridRound,
    /// When the round began, ns since the Unix epoch (≥ `round.scheduled_unix_ns`).
    pub unix_ns: u64,
}

impl Began {
    /// Milliseconds since the Unix epoch of the round's start (the records' timestamp).
    pub fn unix_ms(&self) -> i64 {
        i64::try_from(self.unix_ns / 1_000_000).unwrap_or(i64::MAX)
    }

    /// How late the round began after its instant.
    pub fn lateness(&self) -> Duration {
        Duration::from_nanos(self.unix_ns.saturating_sub(self.round.scheduled_unix_ns))
    }
}

impl RoundMetrics {
    /// Registers both families in `registry`.
    ///
    /// # Errors
    /// A registration error (the names are already registered).
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let missed = IntCounterVec::new(
            Opts::new(
                "uctel_agent_missed_rounds_total",
                "Aligned collection instants (whole multiples of the interval since the Unix \
                 epoch plus the offset) a source skipped because its previous round or its \
                 wake-up ended after them, by source. Skipped, never run late in a bunch.",
            ),
            &["source"],
        )?;
        let lateness = HistogramVec::new(
            HistogramOpts::new(
                "uctel_agent_round_lateness_seconds",
                "How late each round of an aligned source began after its instant, by \
                 source.",
            )
            .buckets(vec![
                0.000_1, 0.000_25, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.05, 0.25, 1.0,
            ]),
            &["source"],
        )?;
        registry.register(Box::new(missed.clone()))?;
        registry.register(Box::new(lateness.clone()))?;
        Ok(Self { missed, lateness })
    }

    /// Counts a round of `source`: its missed instants and its lateness.
    pub fn observe(&self, source: &str, began: &Began) {
        if began.round.missed > 0 {
            self.missed
                .with_label_values(&[source])
                .inc_by(began.round.missed);
        }
        self.lateness
            .with_label_values(&[source])
            .observe(began.lateness().as_secs_f64());
    }

    /// `uctel_agent_missed_rounds_total{source}` so far.
    pub fn missed(&self, source: &str) -> u64 {
        self.missed.with_label_values(&[source]).get()
    }
}

/// Sleeps on `stop` until the next instant of `grid` and begins its round; `None` once
/// `stop`'s sender is dropped (shutdown).
pub fn next_round_blocking(grid: &mut Grid, stop: &Receiver<()>) -> Option<Began> {
    loop {
        let wait = grid.wait(unix_now_ns());
        match stop.recv_timeout(wait) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return None,
        }
        let now = unix_now_ns();
        if let Some(round) = grid.begin(now) {
            return Some(Began {
                round,
                unix_ns: now,
            });
        }
    }
}

/// Sleeps until the next instant of `grid` and begins its round; `None` at shutdown.
pub async fn next_round(grid: &mut Grid, shutdown: &mut Shutdown) -> Option<Began> {
    loop {
        let wait = grid.wait(unix_now_ns());
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = shutdown.wait() => return None,
        }
        let now = unix_now_ns();
        if let Some(round) = grid.begin(now) {
            return Some(Began {
                round,
                unix_ns: now,
            });
        }
    }
}

/// Schedules the calling thread, which wakes at a source's instants, as `scheduling` says
/// (`sources.wake_scheduling`): for [`WakeScheduling::Realtime`], `SCHED_FIFO` priority 1
/// ([`crate::sources::sys::sched::wake_in_real_time`]), logged at `debug`; where the kernel
/// refuses, a warning naming `thread` and the thread stays a normal one. Answers whether
/// the thread now runs in real time.
pub fn schedule_wake(thread: &str, scheduling: WakeScheduling) -> bool {
    if scheduling == WakeScheduling::Normal {
        return false;
    }
    match crate::sources::sys::sched::wake_in_real_time() {
        Ok(()) => {
            tracing::debug!(
                thread,
                priority = crate::sources::sys::sched::WAKE_RT_PRIORITY,
                "wakes at its sampling instants as a SCHED_FIFO thread"
            );
            true
        }
        Err(e) => {
            tracing::warn!(thread, error = %e,
                "cannot run the thread as SCHED_FIFO (sources.wake_scheduling: realtime needs CAP_SYS_NICE or LimitRTPRIO=1); it wakes as a normal thread, later on a busy host");
            false
        }
    }
}

/// How much the host-metrics collection thread raises its own nice value (Linux: 0 to 19,
/// higher yields the CPU sooner; capped at 19).
pub const COLLECTION_NICE_INCREMENT: i32 = 10;

/// Raises the calling thread's nice value by `increment`, capped at 19, and answers the new
/// value. Linux keeps the nice value per thread: `setpriority(PRIO_PROCESS, 0, n)` sets the
/// calling thread's only (setpriority(2), NOTES; `who == 0` is the caller's thread id in
/// `kernel/sys.c`), so the agent's other threads keep theirs. Raising needs no privilege.
///
/// # Errors
/// getpriority(2) or setpriority(2) failed (a seccomp profile that forbids them).
pub fn raise_own_nice(increment: i32) -> std::io::Result<i32> {
    let now = rustix::process::getpriority_process(None)?;
    let raised = now.saturating_add(increment.max(0)).min(19);
    if raised != now {
        rustix::process::setpriority_process(None, raised)?;
    }
    Ok(raised)
}

/// Rounds handed from a waking thread ([`wake_rounds`]) to a collection thread
/// ([`Handover::take`]): one slot, never a queue, so a slow collection does not bunch rounds.
///
/// - A round handed while the previous one is still waiting replaces it: the replaced
///   round is never collected, and its instant (with the instants it had missed itself)
///   counts in the new round's [`GridRound::missed`], as the grid counts instants a late
///   wake-up passed.
/// - A round keeps the stamp taken at its wake-up ([`Began::unix_ns`]) when the collection
///   thread was waiting for it. When the collection thread was still collecting the
///   previous round as it was handed, that round begins when the thread takes it, and is
///   stamped then (a collection still running at the next instant makes that round late,
///   observed in `uctel_agent_round_lateness_seconds`, as when one thread both waited and
///   collected).
#[derive(Debug, Default)]
pub struct Handover {
    slot: Mutex<Slot>,
    handed: Condvar,
}

/// The state shared by [`Handover`]'s two sides.
#[derive(Debug, Default)]
struct Slot {
    /// The round waiting to be collected, and whether it was handed during a collection.
    waiting: Option<(Began, bool)>,
    /// The collection thread is collecting (between two [`Handover::take`]s).
    collecting: bool,
    /// No more rounds will be handed (shutdown).
    closed: bool,
}

impl Handover {
    /// Waking side: hands `began` to the collection thread (see [`Handover`] for a round
    /// still waiting).
    pub fn hand(&self, mut began: Began) {
        let mut slot = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((replaced, _)) = slot.waiting.take() {
            began.round.missed = began
                .round
                .missed
                .saturating_add(replaced.round.missed)
                .saturating_add(1);
        }
        slot.waiting = Some((began, slot.collecting));
        drop(slot);
        self.handed.notify_one();
    }

    /// Waking side: no more rounds; [`Handover::take`] answers `None` from now on (a round
    /// still waiting is not collected, as at shutdown).
    pub fn close(&self) {
        self.slot
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .closed = true;
        self.handed.notify_all();
    }

    /// Collection side: the previous round (if any) is collected; waits for the next and
    /// takes it, `None` once closed.
    pub fn take(&self) -> Option<Began> {
        let mut slot = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        slot.collecting = false;
        loop {
            if slot.closed {
                return None;
            }
            if let Some((mut began, during_collection)) = slot.waiting.take() {
                slot.collecting = true;
                if during_collection {
                    began.unix_ns = began.unix_ns.max(unix_now_ns());
                }
                return Some(began);
            }
            slot = self
                .handed
                .wait(slot)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// Closes a [`Handover`] when dropped: the collection thread stops also if the waking
/// thread panics.
struct CloseOnDrop<'a>(&'a Handover);

impl Drop for CloseOnDrop<'_> {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// The waking side of [`Handover`]: sleeps on `stop` to each instant of `grid`, stamps the
/// round with the wall clock read on wake-up ([`next_round_blocking`]) and hands it over;
/// closes `handover` when `stop`'s sender is dropped (shutdown).
pub fn wake_rounds(grid: &mut Grid, stop: &Receiver<()>, handover: &Handover) {
    let _close = CloseOnDrop(handover);
    while let Some(began) = next_round_blocking(grid, stop) {
        handover.hand(began);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_begin_on_the_grid_and_stop_when_the_sender_is_dropped() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let mut grid = Grid::new(Duration::from_millis(20), Duration::from_millis(7));
        let mut indices = Vec::new();
        for _ in 0..3 {
            let b = next_round_blocking(&mut grid, &rx).unwrap();
            assert_eq!(b.round.scheduled_unix_ns % 20_000_000, 7_000_000);
            assert!(b.unix_ns >= b.round.scheduled_unix_ns);
            indices.push(b.round.index);
        }
        assert!(indices.windows(2).all(|w| w[1] > w[0]));
        drop(tx);
        assert_eq!(next_round_blocking(&mut grid, &rx), None);
        let registry = Registry::new();
        let m = RoundMetrics::register(&registry).unwrap();
        let b = Began {
            round: GridRound {
                scheduled_unix_ns: 1_000,
                index: 1,
                missed: 4,
            },
            unix_ns: 2_000,
        };
        m.observe("host_metrics", &b);
        assert_eq!(m.missed("host_metrics"), 4);
        assert_eq!(b.lateness(), Duration::from_nanos(1_000));
        assert!(RoundMetrics::register(&registry).is_err());
    }

    fn began(index: u64, late_ns: u64, missed: u64) -> Began {
        let scheduled = index * 10_000_000;
        Began {
            round: GridRound {
                scheduled_unix_ns: scheduled,
                index,
                missed,
            },
            unix_ns: scheduled + late_ns,
        }
    }

    #[test]
    fn a_handed_round_keeps_its_wake_up_stamp_and_a_slow_collection_does_not_bunch() {
        let h = Handover::default();
        // The collection thread is waiting: the round keeps the stamp taken on wake-up
        // (30 µs after its instant), not its instant and not the time it was taken.
        h.hand(began(7, 30_000, 0));
        let b = h.take().unwrap();
        assert_eq!(b, began(7, 30_000, 0));
        assert_eq!(b.lateness(), Duration::from_micros(30));
        // Collecting round 7 while rounds 8 and 9 are handed (9 after missing none itself):
        // one round, 9, with 8 counted missed; stamped when taken, as it began then.
        h.hand(began(8, 10_000, 0));
        h.hand(began(9, 20_000, 2));
        let before = unix_now_ns();
        let b = h.take().unwrap();
        assert_eq!((b.round.index, b.round.missed), (9, 3));
        assert!(b.unix_ns >= before, "stamped when taken: {b:?}");
        // Handed while waiting again: its own stamp.
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(20));
                h.hand(began(10, 5_000, 0));
            });
            assert_eq!(h.take(), Some(began(10, 5_000, 0)));
        });
        h.hand(began(11, 0, 0));
        h.close();
        assert_eq!(
            h.take(),
            None,
            "closed: a round still waiting is not collected"
        );
        assert_eq!(h.take(), None);
    }

    #[test]
    fn woken_rounds_cover_every_instant_once_behind_a_slow_collection() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let handover = Handover::default();
        let mut grid = Grid::new(Duration::from_millis(10), Duration::ZERO);
        let mut rounds = Vec::new();
        std::thread::scope(|s| {
            let (g, h) = (&mut grid, &handover);
            s.spawn(move || wake_rounds(g, &rx, h));
            // Every third collection takes 25 ms: two or three instants pass during it.
            while let Some(b) = handover.take() {
                assert!(b.unix_ns >= b.round.scheduled_unix_ns, "{b:?}");
                assert_eq!(b.round.scheduled_unix_ns % 10_000_000, 0);
                rounds.push(b);
                if rounds.len() % 3 == 0 {
                    std::thread::sleep(Duration::from_millis(25));
                }
                if rounds.len() == 12 {
                    drop(tx);
                    break;
                }
            }
        });
        assert_eq!(handover.take(), None, "closed at shutdown");
        assert!(rounds
            .windows(2)
            .all(|w| w[1].round.index > w[0].round.index));
        // Each instant from the first round to the last was collected once or counted
        // missed once: none bunched, none lost from the count.
        let first = rounds[0].round.index;
        let last = rounds[rounds.len() - 1].round.index;
        let counted: u64 = rounds[1..].iter().map(|b| b.round.missed + 1).sum();
        assert_eq!(counted, last - first, "{rounds:?}");
        assert!(
            rounds.iter().any(|b| b.round.missed > 0),
            "the 25 ms collections skipped instants: {rounds:?}"
        );
    }

    #[test]
    fn raising_the_nice_value_changes_the_calling_thread_only() {
        let main = rustix::process::getpriority_process(None).unwrap();
        let (before, raised, after) = std::thread::spawn(|| {
            let before = rustix::process::getpriority_process(None).unwrap();
            let raised = raise_own_nice(3).unwrap();
            (
                before,
                raised,
                rustix::process::getpriority_process(None).unwrap(),
            )
        })
        .join()
        .unwrap();
        assert_eq!(raised, (before + 3).min(19));
        assert_eq!(after, raised);
        assert_eq!(rustix::process::getpriority_process(None).unwrap(), main);
        let capped = std::thread::spawn(|| raise_own_nice(100).unwrap())
            .join()
            .unwrap();
        assert_eq!(capped, 19);
    }
}
