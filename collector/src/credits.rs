//! The collector-wide credit budget (DESIGN.md §4 "Credits").
//!
//! Every frame an agent may send travels through one receive path: on the soft transport
//! the device's UDP socket, whose receive buffer drops whatever does not fit while the
//! receive thread is behind. Per-agent windows alone cannot protect it: K agents may each
//! have their whole window in flight at the same instant (host collections aligned on the
//! interval do exactly that). So windows come from one budget of `capacity` frames, sized to
//! what the receive path holds without loss, and the collector never lets the frames its
//! agents may still send add up to more:
//!
//! ```text
//!   claim(agent) = max(highest limit the agent may still use, sent + 1) − (consumed + 1)
//!   Σ claim(agent) ≤ capacity                       (at every instant, every grant)
//! ```
//!
//! * A grant ([`CreditGrant`]) is an absolute limit: the agent sends connection sequence `c`
//!   only while `c < limit`. Grants go out in `Welcome` and `Report`s (in order, on TCP).
//! * A new grant may lower the limit (a window given back). Until the agent acknowledges it
//!   (`Heartbeat.credit_grant_applied`), it may still send under any earlier grant it has
//!   not yet replaced, so its claim is the largest of those limits; the heartbeat's
//!   `sent_conn_seq` covers the frames it sent under them.
//! * Consumed frames (read from the ring, or counted lost) leave the claim. A frame the
//!   agent's heartbeat said was sent and that has not been consumed [`GONE_AFTER`] later
//!   never will be (UC does not retransmit): [`SentTail`] counts it as consumed for credits,
//!   so a loss of a whole window (a black-holed path) cannot leave the agent without credit
//!   for good. Its loss is still counted by the trackers, as any gap.
//!
//! **Sharing.** The budget is split max-min fair among the agents by a water level:
//! each agent is entitled to `min(its want, level)` frames, where `level` is the largest
//! with `Σ min(want, level) = capacity` (every want, when they all fit). Agents that want
//! less than an equal share leave the rest to those that want more, in equal parts; an
//! agent above its entitlement shrinks back at its next grant when an agent joins or wakes
//! up. The level is a fraction of a frame as often as not (3,640 frames over 1,000 agents:
//! 3.64), and more agents than frames is a case to serve (10,000 agents: 0.364): each grant
//! carries the fraction over into the agent's *turns* (at most one frame), and a whole turn
//! buys one frame beyond the whole part (deficit round robin), so over report intervals
//! every busy agent gets `level` frames per interval, no agent taking another's because it
//! asked first or got more early reports (fractions are carried once per interval).
//!
//! An agent's want is twice the most it consumed in one report interval over the last
//! [`PEAK_INTERVALS`] intervals, at least twice the window it was last given while
//! it reports frames without credit, and at least the rate it announced at `Hello` × the
//! report interval; never more than its ring allows. An idle agent's want decays to that
//! floor: it gives the rest back. While `capacity / agents` covers an agent's whole window
//! (few agents, or a budget without a shared limit, as on verbs), its want is that window.
//! A joining agent waits for budget (its initial grant may be 0 frames) rather than
//! overflow the receive path; its frames without credit are counted at the agent
//! (`no_credit`), never lost unseen. Whatever the level, no grant takes the claims past
//! `capacity`.
//!
//! Sans-IO and lock-protected: sessions call [`CreditBudget::grant`] when they build a
//! report at the report interval, [`CreditBudget::grant_early`] for one sent early, and
//! [`CreditBudget::on_heartbeat`] for each heartbeat; nothing here waits.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use uctel_protocol::control::CreditGrant;

mod level;
use level::Wants;

/// Report intervals over which an agent's peak use is remembered (its want decays after).
pub const PEAK_INTERVALS: usize = 16;

/// What one connection may hold, from its ring and its `Hello`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnLimits {
    /// Most frames outstanding the ring allows (`slots − margin`, Send: posted buffers).
    pub window_cap: u64,
    /// Frames the agent announced per report interval (`Hello.expected_frames_per_second`
    /// × the report interval), at least 1: its want never falls below this.
    pub floor: u64,
}

#[derive(Debug)]
struct Claim {
    limits: ConnLimits,
    /// First connection sequence not yet consumed.
    consumed_next: u64,
    /// One past the last connection sequence the agent said it sent.
    sent_next: u64,
    /// Grants the agent may still send under, oldest first, limits strictly decreasing
    /// (an older grant below a newer one can never be the largest): the front is the
    /// largest usable limit.
    usable: VecDeque<CreditGrant>,
    /// The latest grant handed out.
    latest: CreditGrant,
    /// The largest limit ever granted: the agent never sends a connection sequence at or
    /// beyond it (checked at each heartbeat, [`CreditBudget::overruns`]).
    max_limit: u64,
    /// Consumed per report interval, newest last.
    used: VecDeque<u64>,
    /// `consumed_next` at the last grant.
    consumed_at_grant: u64,
    /// Frames without credit reported since the last grant.
    starved: bool,
    /// Current want in frames.
    want: u64,
    /// The window of the latest grant: its limit − `consumed_next` when it was made.
    window: u64,
    /// Current claim in frames (kept in the budget's sum).
    claim: u64,
    /// Fractions of a frame its entitlement carried over from earlier report intervals, in
    /// 1/2³² frame, at most one frame ("Sharing" in the module documentation).
    turns: u64,
    /// 1 while this report interval's window has a frame beyond the whole part, bought
    /// with a turn; else 0.
    extra: u64,
}

impl Claim {
    fn compute_claim(&self) -> u64 {
        let top = self
            .usable
            .front()
            .map_or(0, |g| g.limit)
            .max(self.sent_next);
        top.saturating_sub(self.consumed_next)
    }
}

#[derive(Debug, Default)]
struct Inner {
    conns: HashMap<u32, Claim>,
    /// Σ claim.
    claimed: u64,
    /// `capacity / connections`, whole frames.
    fair: u64,
    /// The water level in 1/2³² frame: Σ min(want, level) = capacity (`u64::MAX` when
    /// every want fits); an agent is entitled to `min(want, level)`.
    level: u64,
    /// Every connection's want, for the level ([`Wants`]: O(log W) per change).
    wants: Wants,
}

/// One frame in the fixed point of [`Claim::turns`] and [`Inner::level`].
const TURN: u64 = 1 << 32;

/// The budget of one collector; see the module documentation.
#[derive(Debug)]
pub struct CreditBudget {
    capacity: u64,
    inner: Mutex<Inner>,
    /// Credit words written into agents' memory (`crate::control::credit_write`): posted,
    /// refused by the QP.
    writes: [std::sync::atomic::AtomicU64; 2],
    /// Transport calls that posted a round of credit writes together
    /// (`crate::control::credit_batch`).
    write_batches: std::sync::atomic::AtomicU64,
    /// Heartbeats of agents that take grants saying they sent at or beyond every limit they
    /// were ever granted (never, when credits hold).
    overruns: std::sync::atomic::AtomicU64,
}

/// A snapshot for self-metrics and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BudgetState {
    /// The budget in frames.
    pub capacity: u64,
    /// Frames the connected agents may still send or have in flight (Σ claims).
    pub claimed: u64,
    /// Connections holding a share.
    pub connections: u64,
}

/// One connection's share of the budget, for the status API (`crate::status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnCredit {
    /// Most frames the ring lets it have outstanding (`ConnLimits::window_cap`).
    pub window_cap: u64,
    /// The window of its latest grant, in frames.
    pub window: u64,
    /// Frames it may still send or has in flight now (its claim on the budget).
    pub claim: u64,
    /// Frames it wants per report interval (twice its recent peak use, at least its floor).
    pub want: u64,
    /// Frames it said it sent (heartbeats) that the collector has not consumed yet: how far
    /// the collector is behind the agent.
    pub in_flight: u64,
}

impl CreditBudget {
    /// Connection `id`'s share now; `None` for a connection not in the budget.
    pub fn conn(&self, id: u32) -> Option<ConnCredit> {
        let g = self.lock();
        g.conns.get(&id).map(|c| ConnCredit {
            window_cap: c.limits.window_cap,
            window: c.window,
            claim: c.claim,
            want: c.want,
            in_flight: c.sent_next.saturating_sub(c.consumed_next),
        })
    }

    /// A budget of `capacity` frames (at least 1).
    pub fn new(capacity: u64) -> Self {
        Self {
            capacity: capacity.max(1),
            inner: Mutex::new(Inner::default()),
            writes: Default::default(),
            write_batches: std::sync::atomic::AtomicU64::new(0),
            overruns: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Heartbeats that said the agent sent a connection sequence at or beyond the largest
    /// limit it was ever granted: 0 while every agent keeps to its credit, whatever the
    /// path its grants took (`Report`s or writes into its memory, lost or reordered).
    pub fn overruns(&self) -> u64 {
        self.overruns.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Counts one credit word write: `posted` (the QP took it) or refused (send queue full,
    /// QP in ERROR; superseded by the next write).
    pub fn count_write(&self, posted: bool) {
        self.writes[usize::from(!posted)].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Counts one transport call that posted a batch of credit word writes.
    pub fn count_batch(&self) {
        self.write_batches
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Transport calls that posted batches of credit word writes so far.
    pub fn write_batches(&self) -> u64 {
        self.write_batches
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Credit word writes posted and refused so far.
    pub fn writes(&self) -> (u64, u64) {
        let r = |i: usize| self.writes[i].load(std::sync::atomic::Ordering::Relaxed);
        (r(0), r(1))
    }

    /// The budget in frames.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Σ claims, connections.
    pub fn state(&self) -> BudgetState {
        let g = self.lock();
        BudgetState {
            capacity: self.capacity,
            claimed: g.claimed,
            connections: g.conns.len() as u64,
        }
    }

    /// Adds connection `id` whose first frame carries connection sequence 0 and returns its
    /// first grant (sequence 0, for `Welcome`): as much of its entitlement as the budget has
    /// free, possibly 0 frames.
    pub fn join(&self, id: u32, limits: ConnLimits) -> CreditGrant {
        let mut g = self.lock();
        // Connections once this one is in (a twin id replaces its predecessor).
        let joined = (g.conns.len() as u64 + u64::from(!g.conns.contains_key(&id))).max(1);
        let limits = ConnLimits {
            window_cap: limits.window_cap.max(1),
            floor: limits.floor.clamp(1, limits.window_cap.max(1)),
        };
        let first = CreditGrant {
            sequence: 0,
            limit: 0,
        };
        let claim = Claim {
            limits,
            consumed_next: 0,
            sent_next: 0,
            usable: VecDeque::from([first]),
            latest: first,
            max_limit: 0,
            used: VecDeque::with_capacity(PEAK_INTERVALS),
            consumed_at_grant: 0,
            starved: false,
            want: want_within(limits.floor, limits, self.capacity / joined),
            window: 0,
            claim: 0,
            turns: 0,
            extra: 0,
        };
        g.wants.insert(claim.want);
        if let Some(old) = g.conns.insert(id, claim) {
            g.claimed -= old.claim;
            g.wants.remove(old.want);
        }
        self.refair(&mut g);
        let level = g.level;
        if let Some(c) = g.conns.get_mut(&id) {
            c.turns = carry(c.turns, c.want, level);
        }
        self.regrant(&mut g, id, true).unwrap_or(first)
    }

    /// Removes connection `id` (its session ended): its whole claim returns to the budget.
    pub fn leave(&self, id: u32) {
        let mut g = self.lock();
        if let Some(old) = g.conns.remove(&id) {
            g.claimed -= old.claim;
            g.wants.remove(old.want);
            self.refair(&mut g);
        }
    }

    /// Takes an agent heartbeat of connection `id`: the grant it applied (`None`: an agent
    /// that takes no grants, whose claim then stays at its largest grant), the last
    /// connection sequence it sent, and whether frames found no credit since its last
    /// heartbeat.
    pub fn on_heartbeat(
        &self,
        id: u32,
        applied: Option<u64>,
        sent_conn_seq: Option<u64>,
        frames_without_credit: u64,
    ) {
        let mut g = self.lock();
        let Some(c) = g.conns.get_mut(&id) else {
            return;
        };
        if let Some(applied) = applied {
            // The agent applies grants in order: those older than the one it applied are
            // not used any more. The first usable grant left is the largest limit among
            // the applied one and those after it.
            while c.usable.front().is_some_and(|f| f.sequence < applied) {
                c.usable.pop_front();
            }
            if c.usable.is_empty() {
                c.usable.push_back(c.latest);
            }
        }
        if let Some(s) = sent_conn_seq {
            c.sent_next = c.sent_next.max(s.saturating_add(1));
            if applied.is_some() && s >= c.max_limit {
                self.overruns
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        c.starved |= frames_without_credit > 0;
        let dc = Self::settle(c);
        g.claimed = g.claimed.wrapping_add(dc);
    }

    /// The report of connection `id` for its report interval is being built:
    /// `consumed_next` is one past the last connection sequence consumed (0: nothing yet).
    /// Returns a new grant when the limit changes, `None` otherwise (or for an unknown id).
    /// Once per report interval: the fraction of a frame in the agent's entitlement is
    /// carried over into its turns here.
    pub fn grant(&self, id: u32, consumed_next: u64) -> Option<CreditGrant> {
        self.grant_at(id, consumed_next, true)
    }

    /// As [`CreditBudget::grant`], for a report sent early, between two report intervals
    /// (an agent out of credit): it refills the window but carries no fraction over, so
    /// an agent's turns come once per interval however many early reports it gets.
    pub fn grant_early(&self, id: u32, consumed_next: u64) -> Option<CreditGrant> {
        self.grant_at(id, consumed_next, false)
    }

    fn grant_at(&self, id: u32, consumed_next: u64, interval: bool) -> Option<CreditGrant> {
        let mut g = self.lock();
        self.relevel(&mut g);
        let (fair, level) = (g.fair, g.level);
        // An equal share, rounded up: what an agent out of credit wants at least.
        let share = self.capacity.div_ceil(g.conns.len().max(1) as u64).max(1);
        let c = g.conns.get_mut(&id)?;
        c.consumed_next = c.consumed_next.max(consumed_next);
        if interval {
            let used = c.consumed_next.saturating_sub(c.consumed_at_grant);
            c.consumed_at_grant = c.consumed_next;
            if c.used.len() == PEAK_INTERVALS {
                c.used.pop_front();
            }
            c.used.push_back(used);
        }
        let peak = c.used.iter().copied().max().unwrap_or(0);
        let mut want = peak.saturating_mul(2).max(c.limits.floor);
        if c.starved {
            // Out of credit: twice the window it was last given (what is left of it now
            // may be nothing, the agent having sent it all), and at least an equal share,
            // so that agents held back by the others' windows raise the water level's
            // demand on them rather than settle for what they got.
            let window_now = c.latest.limit.saturating_sub(c.consumed_next);
            want = want
                .max(c.window.max(window_now).max(1).saturating_mul(2))
                .max(share);
        }
        c.starved = false;
        let was = c.want;
        c.want = want_within(want, c.limits, fair);
        let now = c.want;
        if interval {
            c.turns = carry(c.turns, c.want, level);
        }
        let dc = Self::settle(c);
        g.claimed = g.claimed.wrapping_add(dc);
        if was != now {
            g.wants.remove(was);
            g.wants.insert(now);
        }
        self.regrant(&mut g, id, interval)
    }

    /// Recomputes the claim of `c`; returns the delta (two's complement) to add to the sum.
    fn settle(c: &mut Claim) -> u64 {
        let claim = c.compute_claim();
        let d = claim.wrapping_sub(c.claim);
        c.claim = claim;
        d
    }

    /// New fair share after a join or leave; the water level follows.
    fn refair(&self, g: &mut Inner) {
        let n = g.conns.len().max(1) as u64;
        g.fair = self.capacity / n;
        self.relevel(g);
    }

    /// The water level of max-min sharing: the largest `level` (1/2³² frame) with
    /// Σ min(want, level) ≤ capacity, from the wants kept incrementally ([`Wants`]:
    /// O(log² W) for wants up to W frames, whatever the number of connections), at every
    /// join, leave and grant.
    fn relevel(&self, g: &mut Inner) {
        g.level = g.wants.level(self.capacity);
    }

    /// Sets the limit of `id` to what it wants, within its entitlement and what the budget
    /// has free, and returns the grant if the limit changed.
    fn regrant(&self, g: &mut Inner, id: u32, interval: bool) -> Option<CreditGrant> {
        let (claimed, level) = (g.claimed, g.level);
        let c = g.conns.get_mut(&id)?;
        let hard = self.capacity.saturating_sub(claimed - c.claim);
        // Entitled to min(want, level): its whole frames, and one more when the fractions
        // carried over add up to a frame.
        let whole = entitled(c.want, level) / TURN;
        // This interval's extra frame: bought with a whole turn at the interval's report,
        // kept by the early reports until the next.
        if interval {
            c.extra = u64::from(c.turns >= TURN);
        }
        let room = hard.min(whole + c.extra);
        // The new limit's own claim: the window beyond consumed, never more than room; the
        // frames already sent (sent_next) stay claimed whatever the limit.
        let window = c.want.min(room);
        c.window = window;
        let limit = c.consumed_next.saturating_add(window);
        if interval && c.extra > 0 {
            if window > whole {
                c.turns -= TURN;
            } else {
                // No room for it: the turn waits for the next interval.
                c.extra = 0;
            }
        }
        if limit == c.latest.limit {
            return None;
        }
        let next = CreditGrant {
            sequence: c.latest.sequence + 1,
            limit,
        };
        // A raise is usable at once; a cut only once acknowledged, so older, larger limits
        // stay usable until then.
        while c.usable.back().is_some_and(|b| b.limit <= limit) {
            c.usable.pop_back();
        }
        c.usable.push_back(next);
        c.latest = next;
        c.max_limit = c.max_limit.max(limit);
        let dc = Self::settle(c);
        g.claimed = g.claimed.wrapping_add(dc);
        Some(next)
    }
}

/// `min(want, level)` in 1/2³² frame.
fn entitled(want: u64, level: u64) -> u64 {
    want.saturating_mul(TURN).min(level)
}

/// `turns` after one more report interval at `level`: plus the fraction of a frame in the
/// entitlement, at most one frame carried over.
fn carry(turns: u64, want: u64, level: u64) -> u64 {
    let frac = entitled(want, level) % TURN;
    turns.saturating_add(frac).min(TURN)
}

/// `/metrics` view of a [`CreditBudget`], read at each scrape:
/// `uctel_collector_credit_budget_frames` (the budget),
/// `uctel_collector_credit_claimed_frames` (Σ claims: frames agents have in flight or may
/// still send).
#[derive(Debug)]
pub struct BudgetCollector {
    budget: std::sync::Arc<CreditBudget>,
    capacity: prometheus::IntGauge,
    claimed: prometheus::IntGauge,
    writes: prometheus::IntCounterVec,
    write_batches: prometheus::IntCounter,
    overruns: prometheus::IntCounter,
    descs: Vec<prometheus::core::Desc>,
}

impl BudgetCollector {
    /// A collector over `budget`.
    ///
    /// # Panics
    /// Never: the metric names and help texts are constants that `prometheus` accepts.
    pub fn new(budget: std::sync::Arc<CreditBudget>) -> Self {
        use prometheus::core::Collector;
        #[allow(clippy::expect_used)]
        let capacity = prometheus::IntGauge::new(
            "uctel_collector_credit_budget_frames",
            "Collector-wide credit budget: frames all agents together may have in flight or \
             still send (what the receive path holds without loss).",
        )
        .expect("valid metric");
        #[allow(clippy::expect_used)]
        let claimed = prometheus::IntGauge::new(
            "uctel_collector_credit_claimed_frames",
            "Frames the connected agents have in flight or may still send under their credit \
             grants; never above uctel_collector_credit_budget_frames.",
        )
        .expect("valid metric");
        #[allow(clippy::expect_used)]
        let writes = prometheus::IntCounterVec::new(
            prometheus::Opts::new(
                "uctel_collector_credit_writes_total",
                "Credit words written into agents' memory by RDMA WRITE (DESIGN.md §4), by \
                 result: posted, or refused by the QP (superseded by the next write).",
            ),
            &["result"],
        )
        .expect("valid metric");
        #[allow(clippy::expect_used)]
        let write_batches = prometheus::IntCounter::new(
            "uctel_collector_credit_write_batches_total",
            "Transport calls that posted a round of credit writes of many agents together \
             (control.credit_write_batching; on the soft transport one sendmmsg per link \
             batch): credit writes per batch = the increase of \
             uctel_collector_credit_writes_total over the increase of this.",
        )
        .expect("valid metric");
        #[allow(clippy::expect_used)]
        let overruns = prometheus::IntCounter::new(
            "uctel_collector_credit_overruns_total",
            "Agent heartbeats saying the agent sent a connection sequence at or beyond the \
             largest credit limit it was ever granted: 0 unless an agent breaks the credit rule.",
        )
        .expect("valid metric");
        let descs = capacity
            .desc()
            .into_iter()
            .chain(claimed.desc())
            .chain(writes.desc())
            .chain(write_batches.desc())
            .chain(overruns.desc())
            .cloned()
            .collect();
        Self {
            budget,
            capacity,
            claimed,
            writes,
            write_batches,
            overruns,
            descs,
        }
    }
}

impl prometheus::core::Collector for BudgetCollector {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        let st = self.budget.state();
        self.capacity
            .set(i64::try_from(st.capacity).unwrap_or(i64::MAX));
        self.claimed
            .set(i64::try_from(st.claimed).unwrap_or(i64::MAX));
        let (posted, refused) = self.budget.writes();
        for (label, n) in [("posted", posted), ("refused", refused)] {
            let c = self.writes.with_label_values(&[label]);
            c.inc_by(n.saturating_sub(c.get()));
        }
        let mut out = self.capacity.collect();
        out.extend(self.claimed.collect());
        self.overruns
            .inc_by(self.budget.overruns().saturating_sub(self.overruns.get()));
        out.extend(self.writes.collect());
        self.write_batches.inc_by(
            self.budget
                .write_batches()
                .saturating_sub(self.write_batches.get()),
        );
        out.extend(self.write_batches.collect());
        out.extend(self.overruns.collect());
        out
    }
}

/// An agent's want within its limits: its whole window while the fair share covers it (few
/// agents, or a budget without a shared limit, as on verbs) — a host collection cut into
/// many small frames must not find its window shrunk to its average rate — else `want`, at
/// most the window.
fn want_within(want: u64, limits: ConnLimits, fair: u64) -> u64 {
    if fair >= limits.window_cap {
        limits.window_cap
    } else {
        want.min(limits.window_cap)
    }
}

/// How long after a heartbeat said a frame was sent the collector stops waiting for it when
/// it gives credits back ([`SentTail`]). Frames take microseconds to milliseconds from the
/// agent's post to the ring, and the worker reads them within its queue's latency; a second
/// is far past both.
pub const GONE_AFTER: Duration = Duration::from_secs(1);

/// The frames an agent's heartbeats said were sent, by when (`Heartbeat.sent_conn_seq`):
/// what the collector may count as consumed for credits once [`GONE_AFTER`] has passed.
///
/// Without it, frames lost on the wire never leave the agent's window (consumed is what
/// reached the ring), and a loss of a whole window stops the connection for good.
#[derive(Debug, Default)]
pub struct SentTail {
    /// (last connection sequence sent, when the heartbeat saying so arrived), oldest first;
    /// sequences increasing.
    heard: VecDeque<(u64, Instant)>,
    /// Highest sequence whose [`GONE_AFTER`] has passed.
    gone: Option<u64>,
}

impl SentTail {
    /// Most heartbeats remembered (early heartbeats come at most twice per report interval;
    /// only the newest one older than [`GONE_AFTER`] matters).
    const KEPT: usize = 64;

    /// A heartbeat arrived at `now` saying frames up to `sent` (inclusive) were sent.
    pub fn on_heartbeat(&mut self, sent: Option<u64>, now: Instant) {
        let Some(sent) = sent else { return };
        if self.heard.back().is_some_and(|&(s, _)| s >= sent) {
            return;
        }
        if self.heard.len() == Self::KEPT {
            self.heard.pop_front();
        }
        self.heard.push_back((sent, now));
    }

    /// The highest connection sequence the agent sent at least [`GONE_AFTER`] before `now`
    /// (`None` before any): no frame up to it is still on its way.
    pub fn gone(&mut self, now: Instant) -> Option<u64> {
        while let Some(&(seq, at)) = self.heard.front() {
            if now.saturating_duration_since(at) < GONE_AFTER {
                break;
            }
            self.gone = Some(self.gone.map_or(seq, |g| g.max(seq)));
            self.heard.pop_front();
        }
        self.gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const L: ConnLimits = ConnLimits {
        window_cap: 960,
        floor: 4,
    };

    #[test]
    fn with_room_for_every_window_each_agent_keeps_its_whole_window() {
        let b = CreditBudget::new(10_000);
        assert_eq!(b.join(1, L).limit, 960, "the whole window at once");
        // Idle: still the whole window, the budget holds it.
        for _ in 0..=PEAK_INTERVALS {
            if let Some(g) = b.grant(1, 0) {
                panic!("the window changed while idle: {g:?}");
            }
        }
        assert_eq!(b.join(2, L).limit, 960, "two windows fit too");
    }

    #[test]
    fn one_agent_grows_to_the_budget_and_idles_down_to_its_floor() {
        let b = CreditBudget::new(500);
        let g0 = b.join(1, L);
        assert_eq!(g0.limit, 4, "the floor at first");
        let mut consumed = 0;
        let mut limit = g0.limit;
        // Busy: it uses all it gets every interval.
        for _ in 0..12 {
            consumed = limit;
            if let Some(g) = b.grant(1, consumed) {
                limit = g.limit;
            }
        }
        assert_eq!(limit - consumed, 500, "grew to the whole budget");
        // Idle for longer than the peak memory.
        for _ in 0..=PEAK_INTERVALS {
            if let Some(g) = b.grant(1, consumed) {
                limit = g.limit;
            }
        }
        assert_eq!(limit - consumed, 4, "gave back all but its floor");
        // Until it acknowledges the cut, the larger limit stays claimed.
        assert!(b.state().claimed > 4);
        b.on_heartbeat(1, Some(u64::MAX), Some(consumed.saturating_sub(1)), 0);
        assert_eq!(b.state().claimed, 4);
    }

    #[test]
    fn a_joining_agent_gets_its_share_back_once_the_cut_is_acknowledged() {
        let b = CreditBudget::new(100);
        let mut lim = b.join(1, L).limit;
        let mut consumed = 0;
        let mut last_seq = 0;
        for _ in 0..10 {
            consumed = lim;
            if let Some(g) = b.grant(1, consumed) {
                lim = g.limit;
                last_seq = g.sequence;
            }
            b.on_heartbeat(1, Some(last_seq), Some(consumed.saturating_sub(1)), 0);
        }
        assert_eq!(lim - consumed, 100, "alone, it takes the whole budget");
        let wants_half = ConnLimits {
            window_cap: 960,
            floor: 60,
        };
        let g2 = b.join(2, wants_half);
        assert_eq!(g2.limit, 0, "nothing free: it waits");
        // Agent 1 has not sent its window yet; its next grant cuts it to its fair share.
        let cut = b.grant(1, consumed).expect("cut");
        assert_eq!(cut.limit - consumed, 50);
        // Until agent 1 acknowledges the cut, it may still send under the older limit.
        assert_eq!(b.state().claimed, 100);
        assert_eq!(b.grant(2, 0), None);
        b.on_heartbeat(1, Some(cut.sequence), Some(consumed - 1), 0);
        assert_eq!(b.state().claimed, 50);
        let g2 = b.grant(2, 0).expect("its share");
        assert_eq!(g2.limit, 50, "entitled to the fair share, below its want");
        assert_eq!(b.state().claimed, 100);
        // Agent 1 leaves: agent 2 may grow into the whole budget.
        b.leave(1);
        assert_eq!(b.grant(2, 50).map(|g| g.limit), Some(50 + 100));
    }

    /// Jain's fairness index of `xs`: (Σx)² / (n · Σx²), 1 when all are equal.
    fn jain(xs: &[u64]) -> f64 {
        let sum: f64 = xs.iter().map(|&x| x as f64).sum();
        let sq: f64 = xs.iter().map(|&x| (x as f64) * (x as f64)).sum();
        if sq == 0.0 {
            return 0.0;
        }
        sum * sum / (xs.len() as f64 * sq)
    }

    /// Every agent of `agents` on a budget of `cap` frames always wants more: each report
    /// interval it sends all it was granted, and the collector has consumed what it sent
    /// the interval before (the rest is in flight); every other agent gets an early report
    /// as well as its interval's; the reports are built in the same
    /// order every interval (the order that lets the first
    /// ones take everything if the budget does not share), and the agents join a few at a
    /// time while the first ones are already busy. Returns the frames each agent delivered
    /// over `rounds` intervals once all have joined; asserts at every step that the agents
    /// never hold more than the budget.
    fn busy_agents(agents: u32, cap: u64, rounds: usize) -> Vec<u64> {
        let b = CreditBudget::new(cap);
        let n = agents as usize;
        let (mut limit, mut applied, mut consumed) = (vec![0u64; n], vec![0u64; n], vec![0u64; n]);
        // What each agent had sent by the end of the interval before.
        let mut sent_before = vec![0u64; n];
        let mut delivered = vec![0u64; n];
        let mut joined = 0usize;
        let per_round = n.div_ceil(20);
        for round in 0..20 + rounds {
            for _ in 0..per_round.min(n - joined) {
                limit[joined] = b.join(joined as u32, L).limit;
                joined += 1;
            }
            for k in 0..joined {
                let i = k as u32;
                // It sends all it may; what it sent an interval ago has been consumed.
                let sent = limit[k].max(sent_before[k]);
                if round >= 20 {
                    delivered[k] += sent_before[k] - consumed[k];
                }
                consumed[k] = sent_before[k];
                sent_before[k] = sent;
                b.on_heartbeat(i, Some(applied[k]), sent.checked_sub(1), 1);
                if let Some(g) = b.grant(i, consumed[k]) {
                    limit[k] = g.limit;
                    applied[k] = g.sequence;
                }
                b.on_heartbeat(i, Some(applied[k]), sent.checked_sub(1), 1);
                if k % 2 == 0 {
                    // Half the agents run out of credit at a moment that gets them an early
                    // report as well, every interval.
                    if let Some(g) = b.grant_early(i, consumed[k]) {
                        limit[k] = g.limit;
                        applied[k] = g.sequence;
                    }
                    b.on_heartbeat(i, Some(applied[k]), sent.checked_sub(1), 1);
                }
                let held: u64 = (0..joined)
                    .map(|j| limit[j].max(sent_before[j]) - consumed[j])
                    .sum();
                assert!(held <= cap, "agents hold {held} frames > budget {cap}");
                assert!(b.state().claimed <= cap);
            }
        }
        delivered
    }

    fn assert_fair(delivered: &[u64], cap: u64, rounds: usize) {
        let total: u64 = delivered.iter().sum();
        // A frame holds its credit for two intervals (sent in one, consumed in the next).
        let offered = cap * rounds as u64 / 2;
        assert!(
            total >= offered * 8 / 10,
            "the budget stays in use: {total} of {offered} frames in {rounds} intervals"
        );
        let (min, max) = (delivered.iter().min(), delivered.iter().max());
        let j = jain(delivered);
        assert!(
            j >= 0.95,
            "Jain {j:.3} (per agent min {min:?} max {max:?}, fair share {})",
            offered / delivered.len() as u64
        );
    }

    /// Every agent of `agents` on a budget of `cap` frames, each interval: its interval
    /// report, it sends all it may, the collector consumes it at once, and it gets
    /// `early` early reports (each followed by sending all it may and the collector
    /// consuming it), agent `k` getting them only in intervals where `k + round` is even
    /// (the agents that happen to be out of credit when the collector looks). Returns the
    /// frames each agent sent over `rounds` intervals after all have joined.
    fn agents_with_early_reports(agents: u32, cap: u64, rounds: usize, early: usize) -> Vec<u64> {
        let b = CreditBudget::new(cap);
        let n = agents as usize;
        let mut limit: Vec<u64> = (0..agents).map(|k| b.join(k, L).limit).collect();
        let (mut applied, mut sent) = (vec![0u64; n], vec![0u64; n]);
        let mut delivered = vec![0u64; n];
        for round in 0..20 + rounds {
            for k in 0..n {
                let i = k as u32;
                let reports = if (k + round) % 2 == 0 { 1 + early } else { 1 };
                for r in 0..reports {
                    // Out of credit: frames found none since the last report.
                    b.on_heartbeat(i, Some(applied[k]), sent[k].checked_sub(1), 1);
                    let g = if r == 0 {
                        b.grant(i, sent[k])
                    } else {
                        b.grant_early(i, sent[k])
                    };
                    if let Some(g) = g {
                        limit[k] = g.limit;
                        applied[k] = g.sequence;
                    }
                    // It sends all it may; the collector consumes it before the next report.
                    let now = limit[k].max(sent[k]);
                    if round >= 20 {
                        delivered[k] += now - sent[k];
                    }
                    sent[k] = now;
                    b.on_heartbeat(i, Some(applied[k]), sent[k].checked_sub(1), 0);
                    assert!(b.state().claimed <= cap);
                }
            }
        }
        delivered
    }

    #[test]
    fn agents_with_and_without_early_reports_share_fairly() {
        // 1,000 agents on 100 frames: a tenth of a frame per agent and interval, in turns.
        // Early reports refill what the collector consumed since the interval's report
        // (the budget turns over faster than once per interval), and agents that get them
        // in some intervals and not in others end up with the same share.
        let d = agents_with_early_reports(1_000, 100, 400, 2);
        let total: u64 = d.iter().sum();
        assert!(
            total >= 100 * 400 * 8 / 10,
            "the budget stays in use: {total}"
        );
        let j = jain(&d);
        assert!(
            j >= 0.95,
            "Jain {j:.3} (per agent min {:?} max {:?})",
            d.iter().min(),
            d.iter().max()
        );
    }

    #[test]
    fn more_agents_than_frames_take_turns_fairly() {
        // 1,000 agents on 100 frames: a tenth of a frame per agent and interval.
        assert_fair(&busy_agents(1_000, 100, 400), 100, 400);
    }

    #[test]
    fn a_budget_not_divisible_by_the_agents_is_shared_fairly() {
        // 100 agents on 364 frames: 3.64 frames each, the 64 left over taken in turns.
        assert_fair(&busy_agents(100, 364, 200), 364, 200);
        // Many frames each.
        assert_fair(&busy_agents(10, 3_640, 100), 3_640, 100);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Join(u32),
        Leave(u32),
        /// Agent sends up to `n` frames within its limit.
        Send(u32, u64),
        /// Collector consumes `n` of the frames in flight of the agent.
        Consume(u32, u64),
        /// The collector builds a report (a grant may go out; the agent gets it later).
        Report(u32),
        /// The agent applies the oldest grant in transit.
        Deliver(u32),
        /// The agent sends a heartbeat.
        Heartbeat(u32, bool),
    }

    fn op() -> impl Strategy<Value = Op> {
        let id = 0u32..4;
        prop_oneof![
            2 => id.clone().prop_map(Op::Join),
            1 => id.clone().prop_map(Op::Leave),
            4 => (id.clone(), 0u64..200).prop_map(|(i, n)| Op::Send(i, n)),
            4 => (id.clone(), 0u64..200).prop_map(|(i, n)| Op::Consume(i, n)),
            4 => id.clone().prop_map(Op::Report),
            4 => id.clone().prop_map(Op::Deliver),
            3 => (id, any::<bool>()).prop_map(|(i, s)| Op::Heartbeat(i, s)),
        ]
    }

    #[derive(Default)]
    struct Agent {
        limit: u64,
        applied: u64,
        next: u64,
        consumed_next: u64,
        in_transit: VecDeque<CreditGrant>,
    }

    proptest! {
        /// Whatever the order of sends, consumption, reports, grant deliveries and
        /// heartbeats, the frames agents have in flight or may still send never exceed the
        /// budget: Σ (max(limit the agent uses, next) − consumed) ≤ capacity, the agent's
        /// view, not the budget's own bookkeeping.
        #[test]
        fn agents_never_hold_more_than_the_budget(
            cap in 1u64..300,
            ops in proptest::collection::vec(op(), 1..400),
        ) {
            let b = CreditBudget::new(cap);
            let mut agents: HashMap<u32, Agent> = HashMap::new();
            for op in ops {
                match op {
                    Op::Join(i) if !agents.contains_key(&i) => {
                        let g = b.join(i, ConnLimits { window_cap: 150, floor: 3 });
                        agents.insert(i, Agent { limit: g.limit, ..Agent::default() });
                    }
                    Op::Leave(i) => {
                        if agents.remove(&i).is_some() {
                            b.leave(i);
                        }
                    }
                    Op::Send(i, n) => if let Some(a) = agents.get_mut(&i) {
                        let room = a.limit.saturating_sub(a.next);
                        a.next += n.min(room);
                    },
                    Op::Consume(i, n) => if let Some(a) = agents.get_mut(&i) {
                        a.consumed_next = (a.consumed_next + n).min(a.next);
                    },
                    Op::Report(i) => if let Some(a) = agents.get_mut(&i) {
                        if let Some(g) = b.grant(i, a.consumed_next) {
                            a.in_transit.push_back(g);
                        }
                    },
                    Op::Deliver(i) => if let Some(a) = agents.get_mut(&i) {
                        if let Some(g) = a.in_transit.pop_front() {
                            a.limit = g.limit;
                            a.applied = g.sequence;
                        }
                    },
                    Op::Heartbeat(i, starved) => if let Some(a) = agents.get(&i) {
                        b.on_heartbeat(i, Some(a.applied), a.next.checked_sub(1), u64::from(starved));
                    },
                    Op::Join(_) => {}
                }
                // The agents' own exposure: what they sent and did not see consumed, plus
                // what they may still send under the limit they use or any grant in
                // transit.
                let exposure: u64 = agents.values().map(|a| {
                    let top = a.in_transit.iter().map(|g| g.limit).fold(a.limit.max(a.next), u64::max);
                    top - a.consumed_next
                }).sum();
                prop_assert!(exposure <= cap, "exposure {exposure} > capacity {cap}");
                prop_assert!(b.state().claimed <= cap);
            }
        }
    }

    #[test]
    fn sent_frames_count_as_gone_only_after_the_grace() {
        let t0 = Instant::now();
        let mut tail = SentTail::default();
        assert_eq!(tail.gone(t0), None);
        tail.on_heartbeat(None, t0);
        tail.on_heartbeat(Some(10), t0);
        tail.on_heartbeat(Some(7), t0 + Duration::from_millis(100)); // not newer: ignored
        tail.on_heartbeat(Some(20), t0 + Duration::from_millis(500));
        assert_eq!(tail.gone(t0 + GONE_AFTER - Duration::from_millis(1)), None);
        assert_eq!(tail.gone(t0 + GONE_AFTER), Some(10));
        assert_eq!(
            tail.gone(t0 + GONE_AFTER + Duration::from_millis(499)),
            Some(10)
        );
        assert_eq!(
            tail.gone(t0 + GONE_AFTER + Duration::from_millis(500)),
            Some(20)
        );
        assert_eq!(tail.gone(t0 + GONE_AFTER * 10), Some(20), "never goes back");
    }
}
