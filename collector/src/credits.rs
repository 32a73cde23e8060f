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
//! **Sharing.** The budget is split max-min fair among the agents that want it: each agent
//! is entitled to `min(its want, capacity / agents)` frames, and the budget owed to agents
//! below their entitlement is kept for them, so a busy agent grows beyond its share only
//! into room nobody else is owed, and shrinks back (at its next grant) when an agent joins
//! or wakes up. An agent's want is twice the most it consumed in one report interval over
//! the last [`PEAK_INTERVALS`] intervals, doubled again while it reports frames without
//! credit, and at least the rate it announced at `Hello` × the report interval; never more
//! than its ring allows. An idle agent's want decays to that floor: it gives the rest
//! back. While the fair share covers an agent's whole window (few agents, or a budget
//! without a shared limit, as on verbs), its want is that window. A joining agent waits for budget (its initial grant may be 0 frames) rather than
//! overflow the receive path; its frames without credit are counted at the agent
//! (`no_credit`), never lost unseen.
//!
//! Sans-IO and lock-protected: sessions call [`CreditBudget::grant`] when they build a
//! report and [`CreditBudget::on_heartbeat`] for each heartbeat; nothing here waits.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use uctel_protocol::control::CreditGrant;

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
    /// Consumed per report interval, newest last.
    used: VecDeque<u64>,
    /// `consumed_next` at the last grant.
    consumed_at_grant: u64,
    /// Frames without credit reported since the last grant.
    starved: bool,
    /// Current want in frames.
    want: u64,
    /// Current claim in frames (kept in the budget's sum).
    claim: u64,
    /// What is owed to it: `min(want, fair) − claim`, saturating (kept in the budget's sum).
    owed: u64,
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
    /// Σ owed.
    owed: u64,
    /// `capacity / connections`.
    fair: u64,
}

/// The budget of one collector; see the module documentation.
#[derive(Debug)]
pub struct CreditBudget {
    capacity: u64,
    inner: Mutex<Inner>,
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

impl CreditBudget {
    /// A budget of `capacity` frames (at least 1).
    pub fn new(capacity: u64) -> Self {
        Self {
            capacity: capacity.max(1),
            inner: Mutex::new(Inner::default()),
        }
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
    /// first grant (sequence 0, for `Welcome`): as much of its want as the budget has free
    /// and nobody else is owed, possibly 0 frames.
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
            used: VecDeque::with_capacity(PEAK_INTERVALS),
            consumed_at_grant: 0,
            starved: false,
            want: want_within(limits.floor, limits, self.capacity / joined),
            claim: 0,
            owed: 0,
        };
        if let Some(old) = g.conns.insert(id, claim) {
            g.claimed -= old.claim;
            g.owed -= old.owed;
        }
        self.refair(&mut g);
        self.regrant(&mut g, id).unwrap_or(first)
    }

    /// Removes connection `id` (its session ended): its whole claim returns to the budget.
    pub fn leave(&self, id: u32) {
        let mut g = self.lock();
        if let Some(old) = g.conns.remove(&id) {
            g.claimed -= old.claim;
            g.owed -= old.owed;
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
        let fair = g.fair;
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
        }
        c.starved |= frames_without_credit > 0;
        let (dc, dow) = Self::settle(c, fair);
        g.claimed = g.claimed.wrapping_add(dc);
        g.owed = g.owed.wrapping_add(dow);
    }

    /// The report of connection `id` is being built: `consumed_next` is one past the last
    /// connection sequence consumed (0: nothing yet). Returns a new grant when the limit
    /// changes, `None` otherwise (or for an unknown id).
    pub fn grant(&self, id: u32, consumed_next: u64) -> Option<CreditGrant> {
        let mut g = self.lock();
        let fair = g.fair;
        let c = g.conns.get_mut(&id)?;
        c.consumed_next = c.consumed_next.max(consumed_next);
        let used = c.consumed_next.saturating_sub(c.consumed_at_grant);
        c.consumed_at_grant = c.consumed_next;
        if c.used.len() == PEAK_INTERVALS {
            c.used.pop_front();
        }
        c.used.push_back(used);
        let peak = c.used.iter().copied().max().unwrap_or(0);
        let window_now = c.latest.limit.saturating_sub(c.consumed_next);
        let mut want = peak.saturating_mul(2).max(c.limits.floor);
        if c.starved {
            want = want.max(window_now.max(1).saturating_mul(2));
        }
        c.starved = false;
        c.want = want_within(want, c.limits, fair);
        let (dc, dow) = Self::settle(c, fair);
        g.claimed = g.claimed.wrapping_add(dc);
        g.owed = g.owed.wrapping_add(dow);
        self.regrant(&mut g, id)
    }

    /// Recomputes the claim and owed of `c`; returns the deltas (two's complement) to add to
    /// the sums.
    fn settle(c: &mut Claim, fair: u64) -> (u64, u64) {
        let claim = c.compute_claim();
        let owed = c.want.min(fair).saturating_sub(claim);
        let d = (claim.wrapping_sub(c.claim), owed.wrapping_sub(c.owed));
        c.claim = claim;
        c.owed = owed;
        d
    }

    /// New fair share after a join or leave; every owed amount follows.
    fn refair(&self, g: &mut Inner) {
        let n = g.conns.len().max(1) as u64;
        g.fair = self.capacity / n;
        let fair = g.fair;
        let mut owed = 0u64;
        for c in g.conns.values_mut() {
            c.owed = c.want.min(fair).saturating_sub(c.claim);
            owed += c.owed;
        }
        g.owed = owed;
    }

    /// Sets the limit of `id` to what it wants, within what the budget allows, and returns
    /// the grant if the limit changed.
    fn regrant(&self, g: &mut Inner, id: u32) -> Option<CreditGrant> {
        let fair = g.fair;
        let (claimed, owed_all) = (g.claimed, g.owed);
        let c = g.conns.get_mut(&id)?;
        let others = claimed - c.claim;
        let owed_others = owed_all - c.owed;
        let hard = self.capacity.saturating_sub(others);
        let entitled = c.want.min(fair);
        let room = hard.min(entitled.max(hard.saturating_sub(owed_others)));
        // The new limit's own claim: the window beyond consumed, never more than room; the
        // frames already sent (sent_next) stay claimed whatever the limit.
        let window = c.want.min(room);
        let limit = c.consumed_next.saturating_add(window);
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
        let (dc, dow) = Self::settle(c, fair);
        g.claimed = g.claimed.wrapping_add(dc);
        g.owed = g.owed.wrapping_add(dow);
        Some(next)
    }
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
        let descs = capacity
            .desc()
            .into_iter()
            .chain(claimed.desc())
            .cloned()
            .collect();
        Self {
            budget,
            capacity,
            claimed,
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
        let mut out = self.capacity.collect();
        out.extend(self.claimed.collect());
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
