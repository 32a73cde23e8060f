//! What the objects of one verbs device share: [`DevShared`] (the context, the port's GID and
//! limits, the QPs by number for asynchronous events) and [`QpShared`] (a QP with the
//! bookkeeping its handle and its CQs share: state, the signaling plan of unsignaled sends,
//! counters).

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::api::{ip_from_gid, Mtu, QpState, QpType};
use crate::sync::lock;

use super::codes::{state_code, state_from_code};
use super::ffi::{self, GidEntry, RecvWrRaw, SendWrRaw};

/// What every object of a device shares.
pub(super) struct DevShared {
    pub(super) ctx: Arc<ffi::Context>,
    pub(super) port: u8,
    pub(super) gid: GidEntry,
    /// Active MTU of the port.
    pub(super) active_mtu: Mtu,
    pub(super) max_msg_size: u32,
    pub(super) max_qp_wr: u32,
    pub(super) max_cqe: u32,
    pub(super) max_mr_size: u64,
    /// `max_srq` (0: no SRQs) and `max_srq_wr` of the device.
    pub(super) max_srq: u32,
    pub(super) max_srq_wr: u32,
    /// SRQs by handle, for asynchronous events.
    pub(super) srqs: Mutex<HashMap<u32, Weak<SrqShared>>>,
    /// QPs by number, for asynchronous events.
    pub(super) qps: Mutex<HashMap<u32, Weak<QpShared>>>,
}

impl fmt::Debug for DevShared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DevShared")
            .field("name", &self.ctx.name())
            .field("port", &self.port)
            .field("gid_index", &self.gid.index)
            .field("gid", &ip_from_gid(self.gid.gid))
            .field("active_mtu", &self.active_mtu)
            .finish_non_exhaustive()
    }
}

/// What an SRQ handle and the device's event loop share: the SRQ and its event counts.
pub(super) struct SrqShared {
    pub(super) srq: Arc<ffi::Srq>,
    pub(super) pd: Arc<ffi::Pd>,
    /// `IBV_EVENT_SRQ_LIMIT_REACHED` events taken.
    pub(super) limit_events: AtomicU64,
    /// `IBV_EVENT_SRQ_ERR` events taken.
    pub(super) error_events: AtomicU64,
    /// Scratch for one `ibv_post_srq_recv` batch.
    pub(super) recv_scratch: Mutex<Vec<RecvWrRaw>>,
    pub(super) dev: Arc<DevShared>,
}

impl fmt::Debug for SrqShared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerbsSrq")
            .field("handle", &self.srq.handle())
            .field("max_wr", &self.srq.max_wr())
            .field("limit_events", &self.limit_events.load(Ordering::Relaxed))
            .field("error_events", &self.error_events.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Drop for SrqShared {
    fn drop(&mut self) {
        let h = self.srq.handle();
        let mut srqs = lock(&self.dev.srqs);
        if srqs.get(&h).is_some_and(|w| w.strong_count() == 0) {
            srqs.remove(&h);
        }
    }
}

/// A signaled WR in flight: whether the caller asked for its completion, and how many WRs
/// (itself and the unsignaled ones before it) and packets its completion retires.
#[derive(Clone, Copy, Debug)]
pub(super) struct SignalMark {
    pub(super) user_signaled: bool,
    pub(super) wrs: u64,
    pub(super) packets: u64,
}

/// Decides whether one more send WR is signaled: when the caller asked, or when `force_every`
/// WRs in a row would otherwise go unsignaled (the send queue only drains through signaled
/// completions). `run`/`run_packets` count the unsignaled WRs (and their packets) since the
/// last signaled one and are reset by a signaled WR, whose mark then retires them all.
pub(super) fn plan_signal(
    run: &mut u64,
    run_packets: &mut u64,
    user_signaled: bool,
    packets: u64,
    force_every: u64,
) -> Option<SignalMark> {
    *run += 1;
    *run_packets += packets;
    if !user_signaled && *run < force_every {
        return None;
    }
    let mark = SignalMark {
        user_signaled,
        wrs: *run,
        packets: *run_packets,
    };
    *run = 0;
    *run_packets = 0;
    Some(mark)
}

/// Send-queue bookkeeping, guarded by the QP's send mutex (held across `ibv_post_send` so
/// that marks are queued in posting order before any completion can be polled).
#[derive(Debug, Default)]
pub(super) struct SendTrack {
    pub(super) marks: VecDeque<SignalMark>,
    /// Unsignaled WRs posted since the last signaled one.
    pub(super) run: u64,
    /// Packets of those WRs.
    pub(super) run_packets: u64,
    /// Scratch for one `ibv_post_send` batch: the WRs, and per WR its mark and the run
    /// counters after it (kept to avoid an allocation per post).
    pub(super) raw: Vec<SendWrRaw>,
    pub(super) pending: Vec<(Option<SignalMark>, u64, u64)>,
}

#[derive(Debug, Default)]
pub(super) struct QpCounters {
    pub(super) packets_sent: AtomicU64,
    pub(super) messages_sent: AtomicU64,
    pub(super) messages_completed: AtomicU64,
}

/// State shared by a QP handle and the CQs it uses.
pub(super) struct QpShared {
    pub(super) qp: ffi::Qp,
    /// UC or RC (with the RC attributes `connect` applies), as created.
    pub(super) qp_type: QpType,
    pub(super) dev: Arc<DevShared>,
    pub(super) pd: Arc<ffi::Pd>,
    pub(super) psn: u32,
    pub(super) local_mtu: Mtu,
    /// Path MTU in bytes once connected (the local MTU before).
    pub(super) path_mtu_bytes: AtomicU64,
    pub(super) max_send_wr: u32,
    pub(super) max_recv_wr: u32,
    /// The QP takes its receive WRs from an SRQ (`post_recv` is refused).
    pub(super) on_srq: bool,
    pub(super) state: AtomicU8,
    pub(super) send: Mutex<SendTrack>,
    /// Scratch for one `ibv_post_recv` batch.
    pub(super) recv_scratch: Mutex<Vec<RecvWrRaw>>,
    pub(super) stats: QpCounters,
}

impl fmt::Debug for QpShared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerbsQp")
            .field("qpn", &format_args!("{:#08x}", self.qp.qpn()))
            .field("type", &self.qp_type.as_str())
            .field("state", &self.cached_state())
            .field("psn", &self.psn)
            .field("mtu", &self.local_mtu)
            .finish_non_exhaustive()
    }
}

impl QpShared {
    pub(super) fn cached_state(&self) -> QpState {
        state_from_code(u32::from(self.state.load(Ordering::Acquire)))
    }

    pub(super) fn set_state(&self, s: QpState) {
        self.state.store(state_code(s), Ordering::Release);
    }

    /// A WR signals on its own at least this often, so the send queue always drains.
    pub(super) fn force_signal_every(&self) -> u64 {
        u64::from((self.max_send_wr / 2).max(1))
    }

    /// A successful send completion arrived: retire the oldest mark. Returns whether the caller
    /// asked for this completion.
    pub(super) fn retire_send(&self) -> bool {
        let mark = lock(&self.send).marks.pop_front();
        match mark {
            Some(m) => {
                self.stats.messages_sent.fetch_add(m.wrs, Ordering::Relaxed);
                self.stats
                    .packets_sent
                    .fetch_add(m.packets, Ordering::Relaxed);
                m.user_signaled
            }
            // Not one of ours (cannot happen while every signaled WR is marked): show it.
            None => true,
        }
    }

    /// An error completion arrived: the QP is in ERROR, every outstanding WR will be flushed
    /// with its own (error) completion, so the marks no longer mean anything.
    pub(super) fn on_error_completion(&self) {
        self.set_state(QpState::Error);
        let mut t = lock(&self.send);
        t.marks.clear();
        t.run = 0;
        t.run_packets = 0;
    }
}

impl Drop for QpShared {
    fn drop(&mut self) {
        let qpn = self.qp.qpn();
        let mut qps = lock(&self.dev.qps);
        if qps.get(&qpn).is_some_and(|w| w.strong_count() == 0) {
            qps.remove(&qpn);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsignaled_runs_are_cut_by_a_hidden_signaled_wr() {
        let (mut run, mut pk) = (0u64, 0u64);
        let mut marks = Vec::new();
        // 10 unsignaled one-packet WRs with a forced signal every 4.
        for _ in 0..10 {
            marks.push(plan_signal(&mut run, &mut pk, false, 1, 4));
        }
        let forced: Vec<usize> = marks
            .iter()
            .enumerate()
            .filter(|(_, m)| m.is_some())
            .map(|(i, _)| i)
            .collect();
        assert_eq!(forced, vec![3, 7]);
        for m in marks.iter().flatten() {
            assert!(!m.user_signaled);
            assert_eq!((m.wrs, m.packets), (4, 4));
        }
        assert_eq!((run, pk), (2, 2));
        // A caller-signaled 3-packet WR retires the two pending ones and itself.
        let m = plan_signal(&mut run, &mut pk, true, 3, 4);
        assert_eq!(
            m.map(|m| (m.user_signaled, m.wrs, m.packets)),
            Some((true, 3, 5))
        );
        assert_eq!((run, pk), (0, 0));
        // Every WR is accounted for exactly once: 2 forced marks of 4 plus 3.
        let total: u64 = marks.iter().flatten().map(|m| m.wrs).sum::<u64>() + 3;
        assert_eq!(total, 11);
    }
}
