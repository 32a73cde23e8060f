//! The worker's shared queues ([`SharedQueues`]): one protection domain, one receive CQ and
//! one send CQ for all connections, and one shared receive queue for the Write-with-immediate
//! connections (DESIGN.md §6, issue 42).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;

use uctel_transport::api::{CompletionQueue, Device, ProtectionDomain, SharedReceiveQueue};

/// Depths tried for the shared receive CQ, largest first (the soft device takes 2^20; a
/// verbs device its own maximum, rxe 2^15 − 1 … ).
const CQ_DEPTHS: [u32; 5] = [1 << 20, 1 << 18, 1 << 16, (1 << 15) - 1, 1 << 12];
/// Depths tried for the SRQ, largest first (soft: 2^22; rxe's `max_srq_wr` is 2^14 − 1).
const SRQ_DEPTHS: [u32; 5] = [1 << 22, 1 << 20, 1 << 16, (1 << 14) - 1, 1 << 12];
/// The SRQ limit the worker arms: this fraction of its target (IBTA 10.2.9 SRQ limit; the
/// device raises `srq_limit` once fewer WRs than that remain).
const SRQ_LIMIT_DIVISOR: u64 = 8;

/// Where a connection's completions and receive WRs go: the `queues` label of
/// `uctel_collector_connection_queues`, and the `queues` field of the collector's
/// `agent connected` log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QueueMode {
    /// The worker's shared CQ and its shared receive queue (a UC Write-with-immediate QP).
    SharedCqSrq,
    /// The worker's shared CQ and a receive queue of its own (the Send path, an RC lane, or a
    /// device that has no SRQ or refused a QP on it).
    SharedCq,
    /// CQs and a receive queue of its own (the shared CQ had no room, or the device refused
    /// a shared CQ), polled every round.
    Own,
}

impl QueueMode {
    /// Every mode, for pre-created zero series.
    pub const ALL: [QueueMode; 3] = [QueueMode::SharedCqSrq, QueueMode::SharedCq, QueueMode::Own];

    /// The label value: `shared_cq_srq`, `shared_cq`, `own`.
    pub const fn as_str(self) -> &'static str {
        match self {
            QueueMode::SharedCqSrq => "shared_cq_srq",
            QueueMode::SharedCq => "shared_cq",
            QueueMode::Own => "own",
        }
    }
}

/// SRQ limit states ([`SharedQueues::arm_limit_when_full`]).
const LIMIT_DISARMED: u8 = 0;
const LIMIT_ARMED: u8 = 1;
const LIMIT_UNSUPPORTED: u8 = 2;

/// Depth of the shared send CQ: the collector posts no sends (an RC lane's ACKs make none).
const SEND_CQ_DEPTH: u32 = 1024;

/// The queues every connection of one worker shares.
///
/// Exactness: a receive CQ overflow would lose a completion and fail QPs, so a connection
/// takes room on the CQ for every receive WR it may complete (its receive queue depth, or
/// its share of the SRQ) and gets CQs of its own when the shared CQ has no room left
/// ([`SharedQueues::reserve`]). The SRQ holds Σ of the depths of the connections on it
/// ([`SharedQueues::srq_deficit`]): as many WRs as their own queues would hold.
#[derive(Debug)]
pub struct SharedQueues {
    /// The PD of every connection's QP and MRs (an SRQ serves the QPs of its PD).
    pub pd: ProtectionDomain,
    /// Where every connection's receive completions go.
    pub recv_cq: CompletionQueue,
    /// Where every connection's send completions go.
    pub send_cq: CompletionQueue,
    /// The Write-with-immediate connections' receive WRs; `None` when the device has none.
    pub srq: Option<SharedReceiveQueue>,
    /// Completions of `recv_cq` not yet taken by a connection.
    cq_room: Mutex<u64>,
    /// WRs the SRQ should hold: Σ of the depths of the connections on it.
    srq_target: AtomicU64,
    /// WRs posted to the SRQ and not yet completed (the worker subtracts one per completion
    /// of a connection on it).
    srq_posted: AtomicU64,
    /// New connections may go on the SRQ: cleared for good when the device refused a QP on
    /// it or reported it failed (`srq_error`).
    srq_usable: AtomicBool,
    /// Whether the SRQ limit is armed (`LIMIT_*`).
    srq_limit: AtomicU8,
}

/// What a connection took from [`SharedQueues`]: completions of the shared CQ, and whether
/// it is on the SRQ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reservation {
    /// Receive WRs (and so completions) reserved.
    pub depth: u64,
    /// The connection's QP takes its receive WRs from the SRQ.
    pub on_srq: bool,
}

impl SharedQueues {
    /// Creates the PD, the CQs and (where the device has them) the SRQ; `None` (logged) when
    /// the device refuses the PD or a CQ: every connection then has queues of its own.
    pub fn open(device: &Device) -> Option<SharedQueues> {
        let built = (|| {
            let pd = device.alloc_pd().map_err(|e| e.to_string())?;
            let recv_cq = CQ_DEPTHS
                .iter()
                .find_map(|&d| device.create_cq(d).ok())
                .ok_or("no shared receive CQ")?;
            let send_cq = device.create_cq(SEND_CQ_DEPTH).map_err(|e| e.to_string())?;
            let srq = SRQ_DEPTHS.iter().find_map(|&d| pd.create_srq(d).ok());
            if srq.is_none() {
                tracing::info!(device = %device.name(), "no shared receive queue: each connection keeps its own");
            }
            let room = u64::from(recv_cq.depth());
            Ok::<_, String>(SharedQueues {
                pd,
                recv_cq,
                send_cq,
                cq_room: Mutex::new(room),
                srq_target: AtomicU64::new(0),
                srq_posted: AtomicU64::new(0),
                srq_usable: AtomicBool::new(srq.is_some()),
                srq_limit: AtomicU8::new(LIMIT_DISARMED),
                srq,
            })
        })();
        built
            .map_err(|e| tracing::warn!(device = %device.name(), error = %e, "no shared CQ: each connection polls its own"))
            .ok()
    }

    /// Takes room for `depth` receive completions on the shared CQ, on the SRQ when `srq`
    /// is wanted and it has room for `depth` more WRs; `None` when the CQ has no room.
    pub fn reserve(&self, depth: u64, srq: bool) -> Option<Reservation> {
        let mut room = self
            .cq_room
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *room < depth {
            return None;
        }
        *room -= depth;
        let on_srq = srq
            && self.srq_usable.load(Ordering::Acquire)
            && self.srq.as_ref().is_some_and(|q| {
                let target = self.srq_target.load(Ordering::Acquire);
                target + depth <= u64::from(q.max_wr())
            });
        if on_srq {
            self.srq_target.fetch_add(depth, Ordering::AcqRel);
        }
        Some(Reservation { depth, on_srq })
    }

    /// Takes connection `r` off the SRQ (it keeps its room on the shared CQ) and lets no
    /// later connection on it: the device refused a QP on the SRQ (`why`, logged once).
    pub fn leave_srq(&self, r: &mut Reservation, why: &dyn std::fmt::Display) {
        if r.on_srq {
            self.srq_target.fetch_sub(r.depth, Ordering::AcqRel);
            r.on_srq = false;
        }
        if self.srq_usable.swap(false, Ordering::AcqRel) {
            tracing::warn!(error = %why, "the device refused a QP on the shared receive queue: connections keep receive queues of their own (uctel_collector_connection_queues{{queues=\"shared_cq\"}})");
        }
    }

    /// The device reported the SRQ failed (`srq_error`): no later connection goes on it (the
    /// ones on it fail and reconnect with receive queues of their own).
    pub fn srq_failed(&self) {
        if self.srq_usable.swap(false, Ordering::AcqRel) {
            tracing::warn!(
                "the shared receive queue failed: connections keep receive queues of their own"
            );
        }
    }

    /// The SRQ's handle, as named by its async events (`None`: no SRQ).
    pub fn srq_handle(&self) -> Option<u32> {
        self.srq.as_ref().map(SharedReceiveQueue::handle)
    }

    /// The device raised `srq_limit`: the limit is disarmed until the next full top-up.
    pub fn limit_reached(&self) {
        let _ = self.srq_limit.compare_exchange(
            LIMIT_ARMED,
            LIMIT_DISARMED,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// After a top-up that left no deficit: arms the SRQ limit at an eighth of the target
    /// when it is not armed (once per `srq_limit` event, so the cost is one
    /// `ibv_modify_srq` per event, not per round). Nothing on a device without limit events.
    pub fn arm_limit_when_full(&self) {
        let Some(srq) = &self.srq else { return };
        if self.srq_limit.load(Ordering::Acquire) != LIMIT_DISARMED || self.srq_deficit() > 0 {
            return;
        }
        let target = self.srq_target.load(Ordering::Acquire);
        if target == 0 {
            return;
        }
        let limit = u32::try_from((target / SRQ_LIMIT_DIVISOR).max(1)).unwrap_or(u32::MAX);
        let state = if srq.arm_limit(limit) {
            LIMIT_ARMED
        } else {
            LIMIT_UNSUPPORTED
        };
        self.srq_limit.store(state, Ordering::Release);
    }

    /// Gives back what [`SharedQueues::reserve`] took (the connection is gone).
    pub fn release(&self, r: Reservation) {
        *self
            .cq_room
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) += r.depth;
        if r.on_srq {
            self.srq_target.fetch_sub(r.depth, Ordering::AcqRel);
        }
    }

    /// WRs to post so that the SRQ holds its target (0 when it holds enough).
    pub fn srq_deficit(&self) -> u64 {
        self.srq_target
            .load(Ordering::Acquire)
            .saturating_sub(self.srq_posted.load(Ordering::Acquire))
    }

    /// `n` WRs were posted to the SRQ.
    pub fn posted(&self, n: u64) {
        self.srq_posted.fetch_add(n, Ordering::AcqRel);
    }

    /// `n` WRs of the SRQ completed (taken by a QP on it).
    pub fn consumed(&self, n: u64) {
        let _ = self
            .srq_posted
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| {
                Some(p.saturating_sub(n))
            });
    }

    /// WRs posted to the SRQ and not yet completed (for tests and gauges).
    pub fn srq_outstanding(&self) -> u64 {
        self.srq_posted.load(Ordering::Acquire)
    }
}
