//! One endpoint's shards: the series table (per-series last timestamp, its labels encoded
//! once) and the bounded queue of samples waiting to be sent, under one lock per shard.
//!
//! Rules (remote-write spec 1.0 and what receivers enforce):
//!
//! * **Identity and shard.** A series is `(agent, instance, metric name, suffix, labels)`;
//!   its hash picks the shard, so all its samples go through one queue, in order.
//! * **Labels.** Sorted by name, `__name__` first among equals as the byte order gives;
//!   `agent` and `instance` as on `/metrics`, the series' own labels of those names (and
//!   `le`) renamed `exported_…` as the series store does. A label with an empty value is
//!   left out (Prometheus treats it as absent; the spec forbids empty values).
//! * **Timestamps are the agent's**: the sample's own `timestamp_ms`, else the frame's
//!   `timestamp_ns` in ms. A sample not newer than the last one queued for its series
//!   (a late frame inside the reorder window, a restarted agent's clock) is dropped and
//!   counted `out_of_order`: Prometheus answers 400 to a request holding one and drops it
//!   all.
//! * **Invalid** (`invalid`): a label name starting with `__` (reserved), a histogram
//!   value with the stale marker's bits (it would read as a stale marker), a timestamp at
//!   or before the Unix epoch.
//! * **Bounded.** At most `capacity` samples wait per shard; a new one beyond that pushes
//!   the oldest out (`queue_full`). At most `series_cap_per_agent` series per agent are
//!   known (the series store's bound); a sample of a further new series is dropped
//!   (`series_cap`) until some of the agent's series end.
//! * **Stale markers** ([`prompb::STALE_NAN_BITS`]) end a series: when its agent says
//!   `Goodbye`, when it has not been updated for the staleness period, and when the agent
//!   sends one itself (a counter, gauge or untyped value with the marker's bits: a Slurm
//!   job or a pod that ended, as the series store reads it); the series is then forgotten.
//!   The marker is stamped after the series' last sample. The agent's marker for a series
//!   not held (ended already: agents repeat markers in case UC lost one) is dropped
//!   (`no_series`).
//! * **After the collector's own stall** longer than its dead-peer time, what it holds of
//!   its agents is dropped (`agent_moved`): the rule and its reasons are in the `stall`
//!   module.
//!
//! Counters change only under the shard lock, so a scrape that holds every shard lock reads
//! `in = sent + dropped + failed + pending` exactly.

use std::collections::HashMap;
use std::collections::VecDeque;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use foldhash::fast::RandomState;
use hashbrown::HashTable;
use uctel_protocol::borrowed::{MetricBatchView, RecordId};
use uctel_protocol::payload::{LabelParts, MetricParts, MetricType};

use super::stall::StallWatch;

use super::metrics::{Counters, Dropped};
use super::prompb::{self, Sample};

/// Which series of a metric record a sample belongs to (histograms are sent as the classic
/// `_bucket{le}`, `_sum` and `_count` series).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Suffix {
    /// The counter or gauge itself.
    None,
    /// `_bucket{le="<bound>"}` (the bound's bits; `+Inf` included).
    Bucket(u64),
    /// `_sum`.
    Sum,
    /// `_count`.
    Count,
}

impl Suffix {
    fn tag(self) -> u64 {
        match self {
            Suffix::None => 0,
            Suffix::Bucket(b) => b,
            Suffix::Sum => 1,
            Suffix::Count => 2,
        }
    }
}

/// One series of the table.
#[derive(Debug)]
struct Series {
    hash: u64,
    agent: Arc<str>,
    instance: Box<str>,
    name: Box<str>,
    suffix: Suffix,
    /// The record's labels as sent, sorted.
    labels: Box<[(Box<str>, Box<str>)]>,
    /// The `TimeSeries.labels` fields, encoded.
    wire: Arc<[u8]>,
    /// Timestamp of the last sample queued, ms.
    last_ms: i64,
    /// When it was last updated (staleness).
    seen: Instant,
    /// Its agent's series count (decremented when the series ends).
    count: Arc<AtomicUsize>,
}

/// One queued sample.
#[derive(Debug, Clone)]
pub(crate) struct Queued {
    /// The series' encoded labels.
    pub(crate) wire: Arc<[u8]>,
    /// The sample.
    pub(crate) sample: Sample,
}

/// What one shard holds.
#[derive(Debug)]
pub(crate) struct ShardState {
    table: HashTable<Series>,
    /// Samples waiting, oldest first.
    pub(crate) queue: VecDeque<Queued>,
    capacity: usize,
    /// When the queue last went from empty to non-empty (the batch deadline runs from it).
    pub(crate) oldest: Option<Instant>,
    /// Samples taken by the sender and not yet settled.
    pub(crate) in_flight: usize,
    /// The endpoint's counters (changed only under this lock).
    pub(crate) counters: Arc<Counters>,
}

/// A shard: its state and the sender's wake-up.
#[derive(Debug)]
pub(crate) struct Shard {
    state: Mutex<ShardState>,
    /// Woken when the queue gets its first sample or a full request.
    pub(crate) wake: tokio::sync::Notify,
    /// Samples per request.
    pub(crate) max_per_send: usize,
}

impl Shard {
    /// An empty shard holding at most `capacity` samples.
    pub(crate) fn new(capacity: usize, max_per_send: usize, counters: Arc<Counters>) -> Shard {
        Shard {
            state: Mutex::new(ShardState {
                table: HashTable::new(),
                queue: VecDeque::new(),
                capacity: capacity.max(1),
                oldest: None,
                in_flight: 0,
                counters,
            }),
            wake: tokio::sync::Notify::new(),
            max_per_send: max_per_send.max(1),
        }
    }

    /// The state, locked (a poisoned lock is taken over: the state stays consistent
    /// between statements).
    pub(crate) fn lock(&self) -> MutexGuard<'_, ShardState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl ShardState {
    /// Queues `sample` for `wire`, pushing the oldest out when full (counted). Returns true
    /// when the sender should be woken (first sample, or a full request waiting). The caller
    /// adds the samples it queued to `pending` before it releases the lock.
    fn enqueue(
        &mut self,
        wire: Arc<[u8]>,
        sample: Sample,
        max_per_send: usize,
        now: Instant,
    ) -> bool {
        if self.queue.len() >= self.capacity {
            self.queue.pop_front();
            self.counters.drop_queued(Dropped::QueueFull, 1);
        }
        self.queue.push_back(Queued { wire, sample });
        if self.queue.len() == 1 {
            self.oldest = Some(now);
            return true;
        }
        self.queue.len() == max_per_send
    }

    /// Takes up to `max` samples for a request (they stay pending, in flight).
    pub(crate) fn take(&mut self, max: usize, now: Instant) -> Vec<Queued> {
        let n = self.queue.len().min(max);
        let batch: Vec<Queued> = self.queue.drain(..n).collect();
        self.in_flight += batch.len();
        self.oldest = (!self.queue.is_empty()).then_some(now);
        batch
    }

    /// Settles `n` in-flight samples as sent, with the newest timestamp among them.
    pub(crate) fn settle_sent(&mut self, n: usize, newest_ms: i64) {
        self.in_flight = self.in_flight.saturating_sub(n);
        self.counters.sent(n as u64, newest_ms);
    }

    /// Settles `n` in-flight samples as failed for `reason`.
    pub(crate) fn settle_failed(&mut self, n: usize, reason: super::metrics::Failed) {
        self.in_flight = self.in_flight.saturating_sub(n);
        self.counters.failed(reason, n as u64);
    }

    /// Settles `n` in-flight samples as dropped before sending (`reason`).
    pub(crate) fn settle_dropped(&mut self, n: usize, reason: Dropped) {
        self.in_flight = self.in_flight.saturating_sub(n);
        self.counters.drop_queued(reason, n as u64);
    }

    /// Drops the queued samples stamped before `before_ms` (Unix ms) as `reason`. Returns
    /// how many.
    pub(crate) fn drop_older(&mut self, before_ms: i64, reason: Dropped, now: Instant) -> usize {
        let n = self.queue.len();
        self.queue.retain(|q| q.sample.timestamp >= before_ms);
        let dropped = n - self.queue.len();
        if self.queue.is_empty() {
            self.oldest = None;
        } else if dropped > 0 {
            self.oldest = Some(now);
        }
        self.counters.drop_queued(reason, dropped as u64);
        dropped
    }

    /// Drops everything still queued (`reason`), e.g. at shutdown.
    pub(crate) fn drop_queue(&mut self, reason: Dropped) -> usize {
        let n = self.queue.len();
        self.queue.clear();
        self.oldest = None;
        self.counters.drop_queued(reason, n as u64);
        n
    }

    /// Queues a stale marker for every series `remove` selects and forgets them. Returns
    /// how many; true in the second field when the sender should be woken.
    fn end_series(
        &mut self,
        mut remove: impl FnMut(&Series) -> bool,
        now: Instant,
        now_ms: i64,
        max_per_send: usize,
    ) -> (usize, bool) {
        let mut ended = Vec::new();
        self.table.retain(|s| {
            if remove(s) {
                s.count.fetch_sub(1, Ordering::Relaxed);
                ended.push((s.wire.clone(), s.last_ms));
                false
            } else {
                true
            }
        });
        let mut wake = false;
        for (wire, last_ms) in &ended {
            let sample = Sample {
                value: prompb::stale_nan(),
                timestamp: now_ms.max(last_ms.saturating_add(1)),
            };
            wake |= self.enqueue(wire.clone(), sample, max_per_send, now);
        }
        let n = ended.len() as u64;
        self.counters.samples_in.inc_by(n);
        self.counters.stale.inc_by(n);
        self.counters.pending.add(n as i64);
        (ended.len(), wake)
    }
}

/// A sample of a record, before its series is looked up.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pending {
    hash: u64,
    shard: u32,
    record: u32,
    suffix: Suffix,
    value: f64,
    ts_ms: i64,
}

/// Per-caller scratch of [`Shards::push`] (kept between frames: no allocation per frame
/// once warm).
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    pending: Vec<Pending>,
    sorted: Vec<Vec<(usize, usize)>>,
    /// Every record's sorted label order, flat; `order_at[record]` is its `(start, len)`.
    orders: Vec<(usize, usize)>,
    order_at: Vec<(u32, u32)>,
    /// Records planned before, by id ([`Known`]).
    known: Known,
}

/// Most records [`Known`] holds; beyond it, it starts over (ids of records no longer
/// sent are not kept forever).
const MAX_KNOWN_RECORDS: usize = 1 << 16;

/// The series hash of each record planned before with a [`RecordId`] (every record with
/// that id has the same name, type and labels: `uctel_protocol::borrowed`), for one agent
/// and instance: a record sent again (a series-dictionary value, a repeated payload) is
/// neither checked, sorted nor hashed again. Only counters and gauges whose labels arrive
/// sorted, none reserved, are kept (their label order is the identity). The hash is the
/// same for every endpoint ([`series_hasher`]).
#[derive(Debug, Default)]
struct Known {
    owner: Option<(Box<str>, Box<str>)>,
    hashes: HashMap<RecordId, u64, RandomState>,
}

impl Known {
    /// Forgets everything unless the records were planned for `agent` and `instance`.
    fn own(&mut self, agent: &str, instance: &str) {
        let same = self
            .owner
            .as_ref()
            .is_some_and(|(a, i)| &**a == agent && &**i == instance);
        if !same {
            self.hashes.clear();
            self.owner = Some((Box::from(agent), Box::from(instance)));
        }
    }

    fn note(&mut self, id: RecordId, hash: u64) {
        if self.hashes.len() >= MAX_KNOWN_RECORDS {
            self.hashes.clear();
        }
        self.hashes.insert(id, hash);
    }
}

/// The hasher of series identities, one for the process: every endpoint hashes a series
/// alike, so [`Known`] serves them all.
fn series_hasher() -> &'static RandomState {
    static HASHER: std::sync::OnceLock<RandomState> = std::sync::OnceLock::new();
    HASHER.get_or_init(RandomState::default)
}

/// All shards of one endpoint.
#[derive(Debug)]
pub(crate) struct Shards {
    pub(crate) shards: Box<[Arc<Shard>]>,
    hasher: RandomState,
    counters: Arc<Counters>,
    /// Most series per agent (over all shards).
    cap_per_agent: Arc<std::sync::atomic::AtomicUsize>,
    /// Series per agent (entries of agents with none left are removed when series end).
    per_agent: Mutex<HashMap<Box<str>, Arc<AtomicUsize>>>,
    /// The collector's own stalls (`stall` module docs).
    stall: StallWatch,
    /// The endpoint, for the stall's log line.
    label: Box<str>,
}

/// Sorted `(name, value)` views of a record's labels (indices into `labels`).
fn sorted_labels<M: MetricParts>(m: &M, out: &mut Vec<(usize, usize)>) {
    out.clear();
    out.extend((0..m.labels().len()).map(|i| (i, i)));
    let labels = m.labels();
    if !labels.is_sorted_by(|a, b| (a.name(), a.value()) <= (b.name(), b.value())) {
        out.sort_unstable_by(|a, b| {
            let (x, y) = (&labels[a.0], &labels[b.0]);
            (x.name(), x.value()).cmp(&(y.name(), y.value()))
        });
    }
}

impl Shards {
    /// `n` shards holding `capacity` samples in all, at most `cap_per_agent` series per
    /// agent.
    pub(crate) fn new(
        n: usize,
        capacity: usize,
        max_per_send: usize,
        cap_per_agent: usize,
        counters: Arc<Counters>,
    ) -> Shards {
        let n = n.max(1);
        Shards {
            shards: (0..n)
                .map(|_| {
                    Arc::new(Shard::new(
                        capacity.div_ceil(n),
                        max_per_send,
                        counters.clone(),
                    ))
                })
                .collect(),
            hasher: series_hasher().clone(),
            counters,
            cap_per_agent: Arc::new(std::sync::atomic::AtomicUsize::new(cap_per_agent)),
            per_agent: Mutex::new(HashMap::new()),
            stall: StallWatch::new(Duration::MAX, Instant::now()),
            label: Box::from(""),
        }
    }

    /// The same shards, with the series cap per agent read from `cap` (shared by every
    /// endpoint, changed live by a reload: `super::live`).
    pub(crate) fn with_shared_cap(mut self, cap: Arc<std::sync::atomic::AtomicUsize>) -> Shards {
        self.cap_per_agent = cap;
        self
    }

    /// The same shards, treating a gap longer than `dead_peer` in the collector's own run
    /// as a stall after which its agents' held samples are dropped (`stall` module docs);
    /// `label` names the endpoint in the log line.
    pub(crate) fn with_dead_peer(mut self, dead_peer: Duration, label: &str) -> Shards {
        self.stall = StallWatch::new(dead_peer, Instant::now());
        self.label = Box::from(label);
        self
    }

    /// Records that the collector runs at `now`; when that ends a stall, drops every queued
    /// sample stamped before the moment it was noticed (`agent_moved`) and logs it once.
    /// Returns the fence: samples stamped before it (Unix ms) are to be dropped, `None`
    /// when there is none.
    pub(crate) fn watch(&self, now: Instant) -> Option<i64> {
        if let Some(stall) = self
            .stall
            .check(now, super::unix_ms(std::time::SystemTime::now()))
        {
            let dropped: usize = self
                .shards
                .iter()
                .map(|s| {
                    s.lock()
                        .drop_older(stall.before_ms, Dropped::AgentMoved, now)
                })
                .sum();
            tracing::warn!(
                url = %self.label,
                stalled_ms = u64::try_from(stall.gap.as_millis()).unwrap_or(u64::MAX),
                samples = dropped,
                "the collector did not run for longer than its dead-peer time: its agents have moved to other collectors of the pool, which write their newer samples; the samples held from before are dropped, counted in samples_dropped_total{{reason=\"agent_moved\"}} (also those that arrive stamped before now, for one dead-peer time)"
            );
        }
        self.stall.fence(now)
    }

    /// The series count of `agent`.
    fn agent_count(&self, agent: &str) -> Arc<AtomicUsize> {
        let mut map = self.per_agent.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = map.get(agent) {
            return c.clone();
        }
        let c = Arc::new(AtomicUsize::new(0));
        map.insert(Box::from(agent), c.clone());
        c
    }

    fn hash<M: MetricParts>(
        &self,
        agent: &str,
        instance: &str,
        m: &M,
        order: &[(usize, usize)],
        suffix: Suffix,
    ) -> u64 {
        let mut h = self.hasher.build_hasher();
        h.write(agent.as_bytes());
        h.write_u8(0xff);
        h.write(instance.as_bytes());
        h.write_u8(0xff);
        h.write(m.name().as_bytes());
        h.write_u64(suffix.tag());
        for &(i, _) in order {
            let l = &m.labels()[i];
            h.write(l.name().as_bytes());
            h.write_u8(0xfe);
            h.write(l.value().as_bytes());
            h.write_u8(0xff);
        }
        h.finish()
    }

    /// Queues every sample of `batch` (agent `agent`, hostname `instance`, frame opened at
    /// `frame_ns`): see the module rules.
    pub(crate) fn push(
        &self,
        agent: &str,
        instance: &str,
        frame_ns: u64,
        batch: &MetricBatchView<'_>,
        scratch: &mut Scratch,
        now: Instant,
    ) {
        let frame_ms = i64::try_from(frame_ns / 1_000_000).unwrap_or(i64::MAX);
        let fence = self.watch(now);
        let invalid = self.plan(agent, instance, frame_ms, batch, scratch);
        self.enqueue_planned(agent, instance, batch, scratch, fence, now);
        if invalid > 0 {
            // Counted in and dropped together, under one shard's lock.
            let st = self.shards[0].lock();
            st.counters.samples_in.inc_by(invalid);
            st.counters.drop_queued(Dropped::Invalid, invalid);
        }
    }

    /// The samples of `batch` in `scratch.pending` (their series' hash and shard; their
    /// labels' order in `scratch.orders`); returns how many are invalid (no timestamp, no
    /// type, a reserved label, a stale-marker value): those are not planned.
    fn plan(
        &self,
        agent: &str,
        instance: &str,
        frame_ms: i64,
        batch: &MetricBatchView<'_>,
        scratch: &mut Scratch,
    ) -> u64 {
        let n_shards = self.shards.len() as u64;
        scratch.pending.clear();
        scratch.orders.clear();
        scratch.order_at.clear();
        scratch.order_at.resize(batch.len(), (0, 0));
        let mut order = Vec::new();
        let mut invalid = 0u64;
        scratch.known.own(agent, instance);
        for (ri, (m, id)) in batch.iter_with_ids().enumerate() {
            let ts_ms = if m.timestamp_ms != 0 {
                m.timestamp_ms
            } else {
                frame_ms
            };
            let known = id.and_then(|id| scratch.known.hashes.get(&id).copied());
            if let Some(hash) = known.filter(|_| ts_ms > 0) {
                // Planned before: a counter or gauge, labels sorted, none reserved. A stale
                // marker is planned like a value: it ends its series (`enqueue_planned`).
                let n = m.labels().len();
                scratch.order_at[ri] = (scratch.orders.len() as u32, n as u32);
                scratch.orders.extend((0..n).map(|i| (i, i)));
                scratch.pending.push(Pending {
                    hash,
                    shard: (hash % n_shards) as u32,
                    record: ri as u32,
                    suffix: Suffix::None,
                    value: m.value(),
                    ts_ms,
                });
                continue;
            }
            let kind = MetricType::try_from(m.kind()).unwrap_or(MetricType::Unspecified);
            let samples = match kind {
                MetricType::Histogram => m.buckets().len() + 3,
                MetricType::Unspecified => 0,
                _ => 1,
            };
            let bad = ts_ms <= 0
                || kind == MetricType::Unspecified
                || m.labels().iter().any(|l| l.name().starts_with("__"));
            if bad {
                invalid += samples.max(1) as u64;
                continue;
            }
            sorted_labels(&m, &mut order);
            scratch.order_at[ri] = (scratch.orders.len() as u32, order.len() as u32);
            scratch.orders.extend_from_slice(&order);
            let mut add = |suffix: Suffix, value: f64| {
                // The agent's stale marker ends its series (`enqueue_planned`); in a
                // histogram it is no value remote-write can carry.
                if value.to_bits() == prompb::STALE_NAN_BITS && suffix != Suffix::None {
                    invalid += 1;
                    return None;
                }
                let hash = self.hash(agent, instance, &m, &order, suffix);
                scratch.pending.push(Pending {
                    hash,
                    shard: (hash % n_shards) as u32,
                    record: ri as u32,
                    suffix,
                    value,
                    ts_ms,
                });
                Some(hash)
            };
            if kind == MetricType::Histogram {
                for b in m
                    .buckets()
                    .iter()
                    .filter(|b| b.upper_bound != f64::INFINITY)
                {
                    add(
                        Suffix::Bucket(b.upper_bound.to_bits()),
                        b.cumulative_count as f64,
                    );
                }
                add(Suffix::Bucket(f64::INFINITY.to_bits()), m.count() as f64);
                add(Suffix::Sum, m.sum());
                add(Suffix::Count, m.count() as f64);
            } else if let Some(hash) = add(Suffix::None, m.value()) {
                let identity = order.iter().enumerate().all(|(i, &(j, _))| i == j);
                if let Some(id) = id.filter(|_| identity) {
                    scratch.known.note(id, hash);
                }
            }
        }
        invalid
    }

    /// Queues the samples [`Shards::plan`] left in `scratch`, by shard (one lock each):
    /// those older than `fence` are dropped (`agent_moved`), out of order or over the
    /// agent's series cap dropped, each counted. The agent's stale marker ends its series
    /// (stamped after its last sample; `no_series` when there is none).
    fn enqueue_planned(
        &self,
        agent: &str,
        instance: &str,
        batch: &MetricBatchView<'_>,
        scratch: &mut Scratch,
        fence: Option<i64>,
        now: Instant,
    ) {
        // Group by shard (stable: per-series order kept), one lock per shard.
        scratch.sorted.resize_with(self.shards.len(), Vec::new);
        for v in &mut scratch.sorted {
            v.clear();
        }
        for (i, p) in scratch.pending.iter().enumerate() {
            scratch.sorted[p.shard as usize].push((i, 0));
        }
        let mut agent_arc: Option<Arc<str>> = None;
        let mut agent_count: Option<Arc<AtomicUsize>> = None;
        for (si, idx) in scratch.sorted.iter().enumerate() {
            if idx.is_empty() {
                continue;
            }
            let shard = &self.shards[si];
            let mut st = shard.lock();
            let mut wake = false;
            // Counted once per shard, still under its lock (scrapes read consistent sums).
            let (mut n_in, mut n_out_of_order, mut n_series_cap) = (0u64, 0u64, 0u64);
            let (mut n_moved, mut n_ended, mut n_no_series) = (0u64, 0u64, 0u64);
            for &(pi, _) in idx {
                let p = scratch.pending[pi];
                let Some(m) = batch.get(p.record as usize) else {
                    continue;
                };
                let (start, len) = scratch.order_at[p.record as usize];
                let order = &scratch.orders[start as usize..(start + len) as usize];
                n_in += 1;
                if fence.is_some_and(|f| p.ts_ms < f) {
                    n_moved += 1;
                    continue;
                }
                let same = |s: &Series| {
                    s.hash == p.hash && same_series(s, agent, instance, &m, order, p.suffix)
                };
                if p.value.to_bits() == prompb::STALE_NAN_BITS {
                    let Ok(found) = st.table.find_entry(p.hash, same) else {
                        n_no_series += 1;
                        continue;
                    };
                    let (ended, _) = found.remove();
                    ended.count.fetch_sub(1, Ordering::Relaxed);
                    n_ended += 1;
                    let sample = Sample {
                        value: prompb::stale_nan(),
                        timestamp: p.ts_ms.max(ended.last_ms.saturating_add(1)),
                    };
                    wake |= st.enqueue(ended.wire, sample, shard.max_per_send, now);
                    continue;
                }
                let found = st.table.find_mut(p.hash, same);
                let wire = match found {
                    Some(s) => {
                        if p.ts_ms <= s.last_ms {
                            n_out_of_order += 1;
                            continue;
                        }
                        s.last_ms = p.ts_ms;
                        s.seen = now;
                        s.wire.clone()
                    }
                    None => {
                        let count = agent_count
                            .get_or_insert_with(|| self.agent_count(agent))
                            .clone();
                        if count.load(Ordering::Relaxed)
                            >= self.cap_per_agent.load(Ordering::Relaxed)
                        {
                            n_series_cap += 1;
                            continue;
                        }
                        count.fetch_add(1, Ordering::Relaxed);
                        let agent = agent_arc.get_or_insert_with(|| Arc::from(agent)).clone();
                        let series = new_series(
                            p.hash, agent, count, instance, &m, order, p.suffix, p.ts_ms, now,
                        );
                        let wire = series.wire.clone();
                        st.table.insert_unique(p.hash, series, |s| s.hash);
                        wire
                    }
                };
                wake |= st.enqueue(
                    wire,
                    Sample {
                        value: p.value,
                        timestamp: p.ts_ms,
                    },
                    shard.max_per_send,
                    now,
                );
            }
            st.counters.samples_in.inc_by(n_in);
            st.counters.stale.inc_by(n_ended);
            st.counters
                .pending
                .add((n_in - n_out_of_order - n_series_cap - n_no_series) as i64);
            if n_no_series > 0 {
                st.counters.drop_queued(Dropped::NoSeries, n_no_series);
            }
            if n_out_of_order > 0 {
                st.counters.drop_queued(Dropped::OutOfOrder, n_out_of_order);
            }
            if n_series_cap > 0 {
                st.counters.drop_queued(Dropped::SeriesCap, n_series_cap);
            }
            if n_moved > 0 {
                st.counters.drop_queued(Dropped::AgentMoved, n_moved);
            }
            drop(st);
            if wake {
                shard.wake.notify_one();
            }
        }
    }

    /// Ends every series of `agent` (stale markers). Returns how many.
    pub(crate) fn agent_left(&self, agent: &str, now: Instant, now_ms: i64) -> usize {
        self.end(|s| &*s.agent == agent, now, now_ms)
    }

    /// Ends every series not updated since `before` (stale markers). Returns how many.
    pub(crate) fn expire(&self, before: Instant, now: Instant, now_ms: i64) -> usize {
        self.end(|s| s.seen < before, now, now_ms)
    }

    fn end(&self, remove: impl Fn(&Series) -> bool, now: Instant, now_ms: i64) -> usize {
        let mut total = 0;
        for shard in self.shards.iter() {
            let (n, wake) = shard
                .lock()
                .end_series(&remove, now, now_ms, shard.max_per_send);
            total += n;
            if wake {
                shard.wake.notify_one();
            }
        }
        if total > 0 {
            self.per_agent
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|_, c| c.load(Ordering::Relaxed) > 0);
        }
        total
    }

    /// Series currently known, over all shards.
    pub(crate) fn series(&self) -> usize {
        self.shards.iter().map(|s| s.lock().table.len()).sum()
    }

    /// Drops whatever is still queued in every shard (after the senders stopped).
    pub(crate) fn drop_all(&self, reason: Dropped) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().drop_queue(reason))
            .sum()
    }

    /// The endpoint's counters.
    pub(crate) fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }
}

fn same_series<M: MetricParts>(
    s: &Series,
    agent: &str,
    instance: &str,
    m: &M,
    order: &[(usize, usize)],
    suffix: Suffix,
) -> bool {
    s.suffix == suffix
        && &*s.name == m.name()
        && &*s.agent == agent
        && &*s.instance == instance
        && s.labels.len() == order.len()
        && s.labels.iter().zip(order).all(|((n, v), &(i, _))| {
            let l = &m.labels()[i];
            &**n == l.name() && &**v == l.value()
        })
}

#[allow(clippy::too_many_arguments)]
fn new_series<M: MetricParts>(
    hash: u64,
    agent: Arc<str>,
    count: Arc<AtomicUsize>,
    instance: &str,
    m: &M,
    order: &[(usize, usize)],
    suffix: Suffix,
    ts_ms: i64,
    now: Instant,
) -> Series {
    let labels: Box<[(Box<str>, Box<str>)]> = order
        .iter()
        .map(|&(i, _)| {
            let l = &m.labels()[i];
            (Box::from(l.name()), Box::from(l.value()))
        })
        .collect();
    let name = match suffix {
        Suffix::None => m.name().to_owned(),
        Suffix::Bucket(_) => format!("{}_bucket", m.name()),
        Suffix::Sum => format!("{}_sum", m.name()),
        Suffix::Count => format!("{}_count", m.name()),
    };
    let mut all: Vec<(String, String)> = crate::store::series_labels(m);
    all.push(("__name__".into(), name));
    all.push(("agent".into(), agent.to_string()));
    all.push(("instance".into(), instance.to_owned()));
    if let Suffix::Bucket(bits) = suffix {
        all.push(("le".into(), le_value(f64::from_bits(bits))));
    }
    all.retain(|(_, v)| !v.is_empty());
    all.sort();
    let wire = prompb::encode_labels(all.iter().map(|(n, v)| (n.as_str(), v.as_str())));
    Series {
        hash,
        agent,
        instance: Box::from(instance),
        name: Box::from(m.name()),
        suffix,
        labels,
        wire: Arc::from(wire),
        last_ms: ts_ms,
        seen: now,
        count,
    }
}

/// The `le` label value of a bucket bound, as Prometheus' text format writes it (`+Inf`,
/// shortest round-trip decimal otherwise).
pub(crate) fn le_value(bound: f64) -> String {
    if bound == f64::INFINITY {
        "+Inf".to_owned()
    } else if bound == f64::NEG_INFINITY {
        "-Inf".to_owned()
    } else {
        let s = format!("{bound}");
        s
    }
}

#[cfg(test)]
mod tests {
    use super::super::metrics::{Failed, Families};
    use super::*;
    use uctel_protocol::borrowed::{LabelView, PushRecord};
    use uctel_protocol::limits::Limits;
    use uctel_protocol::payload::{encode_metric_batch, Bucket, Label, Metric, MetricBatch};

    fn gauge(name: &str, value: f64, ts: i64, labels: &[(&str, &str)]) -> Metric {
        Metric {
            name: name.into(),
            r#type: MetricType::Gauge as i32,
            labels: labels
                .iter()
                .map(|(n, v)| Label {
                    name: (*n).into(),
                    value: (*v).into(),
                })
                .collect(),
            value,
            timestamp_ms: ts,
            ..Default::default()
        }
    }

    fn shards(n: usize, capacity: usize) -> Shards {
        let f = Families::new().unwrap();
        Shards::new(
            n,
            capacity,
            1000,
            100_000,
            Arc::new(f.endpoint("http://x/")),
        )
    }

    fn push(s: &Shards, agent: &str, frame_ms: u64, metrics: Vec<Metric>) {
        let payload = encode_metric_batch(&MetricBatch { metrics });
        let batch = MetricBatchView::decode(&payload, &Limits::default()).unwrap();
        s.push(
            agent,
            "host-1",
            frame_ms * 1_000_000,
            &batch,
            &mut Scratch::default(),
            Instant::now(),
        );
    }

    /// (labels, value bits, timestamp) of one sample.
    type Decoded = (Vec<(String, String)>, u64, i64);

    /// Everything queued, decoded.
    fn drain(s: &Shards) -> Vec<Decoded> {
        let mut out = Vec::new();
        for shard in s.shards.iter() {
            let mut st = shard.lock();
            let batch = st.take(usize::MAX, Instant::now());
            st.settle_sent(batch.len(), 0);
            for q in batch {
                let mut scratch = Vec::new();
                let body = prompb::encode_request(
                    [(&q.wire[..], std::slice::from_ref(&q.sample))],
                    &mut scratch,
                )
                .unwrap();
                let req = prompb::decode_request(&body).unwrap();
                let ts = &req.timeseries[0];
                out.push((
                    ts.labels
                        .iter()
                        .map(|l| (l.name.clone(), l.value.clone()))
                        .collect(),
                    ts.samples[0].value.to_bits(),
                    ts.samples[0].timestamp,
                ));
            }
        }
        out.sort_by(|a, b| (&a.0, a.2).cmp(&(&b.0, b.2)));
        out
    }

    /// `in = sent + failed + dropped + pending`, read as a scrape would.
    fn law(s: &Shards) -> (u64, u64) {
        let c = s.counters();
        let dropped: u64 = Dropped::ALL.iter().map(|r| c.dropped(*r)).sum();
        let failed: u64 = Failed::ALL.iter().map(|r| c.failed_count(*r)).sum();
        let pending = u64::try_from(c.pending.get()).unwrap();
        (
            c.samples_in.get(),
            c.samples_sent() + dropped + failed + pending,
        )
    }

    fn l(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(n, v)| ((*n).into(), (*v).into()))
            .collect()
    }

    /// One gauge record with an id: (id, name, labels, value, timestamp).
    type IdRecord<'a> = (RecordId, &'a str, &'a [(&'a str, &'a str)], f64, i64);

    /// A batch of records with ids, as a series dictionary builds it.
    fn with_ids<'a>(records: &[IdRecord<'a>]) -> MetricBatchView<'a> {
        let mut batch = MetricBatchView::new();
        for &(id, name, labels, value, ts) in records {
            batch.push_record(
                PushRecord {
                    id: Some(id),
                    name,
                    help: "",
                    r#type: MetricType::Gauge as i32,
                    value,
                    timestamp_ms: ts,
                    count: 0,
                    sum: 0.0,
                },
                labels
                    .iter()
                    .map(|&(name, value)| LabelView { name, value }),
                [],
            );
        }
        batch
    }

    /// A record sent again under its id (a series-dictionary value) goes to the series it
    /// went to, from its kept hash; a record whose labels arrive unsorted is planned in
    /// full every time; another agent's records under the same ids are its own series.
    #[test]
    fn a_record_sent_again_under_its_id_goes_to_its_series() {
        let s = shards(3, 1000);
        let (sorted, unsorted) = (RecordId::fresh(), RecordId::fresh());
        let mut scratch = Scratch::default();
        let t0 = 1_700_000_000_000;
        for (i, agent) in ["a-1", "a-1", "a-1", "a-2"].into_iter().enumerate() {
            let ts = t0 + i as i64 * 1000;
            let batch = with_ids(&[
                (sorted, "temp", &[("a", "1"), ("b", "2")], i as f64, ts),
                (unsorted, "temp", &[("z", "9"), ("a", "1")], i as f64, ts),
            ]);
            s.push(agent, "host-1", 0, &batch, &mut scratch, Instant::now());
            // Only the record with sorted labels is kept, for the agent of the batch.
            assert_eq!(scratch.known.hashes.len(), 1);
        }
        assert_eq!(s.series(), 4, "two series per agent");
        let got = drain(&s);
        let series = |agent: &str, extra: (&str, &str)| {
            let mut labels = vec![
                ("__name__", "temp"),
                ("a", "1"),
                ("agent", agent),
                ("instance", "host-1"),
                extra,
            ];
            labels.sort();
            l(&labels)
        };
        let samples = |labels: Vec<(String, String)>| -> Vec<(u64, i64)> {
            got.iter()
                .filter(|(l, _, _)| *l == labels)
                .map(|(_, v, ts)| (*v, *ts))
                .collect()
        };
        let first = |n: usize| -> Vec<(u64, i64)> {
            (0..n)
                .map(|i| ((i as f64).to_bits(), t0 + i as i64 * 1000))
                .collect()
        };
        assert_eq!(samples(series("a-1", ("b", "2"))), first(3));
        assert_eq!(samples(series("a-1", ("z", "9"))), first(3));
        let fourth = vec![(3f64.to_bits(), t0 + 3000)];
        assert_eq!(samples(series("a-2", ("b", "2"))), fourth);
        assert_eq!(samples(series("a-2", ("z", "9"))), fourth);
        assert_eq!(got.len(), 8);
        assert_eq!(law(&s), (8, 8));
    }

    /// The agent's stale marker under a record id planned before (a series-dictionary
    /// value) ends its series as it does without an id: queued once, after the last sample.
    #[test]
    fn a_stale_marker_under_a_known_id_ends_its_series() {
        let s = shards(2, 1000);
        let id = RecordId::fresh();
        let stale = f64::from_bits(prompb::STALE_NAN_BITS);
        let mut scratch = Scratch::default();
        let t0 = 1_700_000_000_000;
        for (i, value) in [1.0, 2.0, stale].into_iter().enumerate() {
            let batch = with_ids(&[(id, "g", &[("pod", "p1")], value, t0 + i as i64 * 1000)]);
            s.push("a-1", "host-1", 0, &batch, &mut scratch, Instant::now());
        }
        assert_eq!(s.series(), 0, "the marker ended the series");
        assert_eq!(s.counters().stale.get(), 1);
        assert_eq!(s.counters().dropped(Dropped::Invalid), 0);
        let got = drain(&s);
        let values: Vec<u64> = got.iter().map(|x| x.1).collect();
        assert_eq!(
            values,
            vec![1f64.to_bits(), 2f64.to_bits(), prompb::STALE_NAN_BITS]
        );
        assert_eq!(law(&s), (3, 3));
    }

    #[test]
    fn labels_are_sorted_renamed_and_stamped_with_the_agents_time() {
        let s = shards(3, 1000);
        push(
            &s,
            "a-1",
            1_700_000_000_000,
            vec![
                gauge(
                    "temp",
                    1.5,
                    0,
                    &[("zone", "z"), ("instance", "own"), ("empty", "")],
                ),
                gauge("temp", 2.5, 1_700_000_000_500, &[("zone", "y")]),
            ],
        );
        let got = drain(&s);
        assert_eq!(
            got,
            vec![
                (
                    l(&[
                        ("__name__", "temp"),
                        ("agent", "a-1"),
                        ("exported_instance", "own"),
                        ("instance", "host-1"),
                        ("zone", "z")
                    ]),
                    1.5f64.to_bits(),
                    1_700_000_000_000
                ),
                (
                    l(&[
                        ("__name__", "temp"),
                        ("agent", "a-1"),
                        ("instance", "host-1"),
                        ("zone", "y")
                    ]),
                    2.5f64.to_bits(),
                    1_700_000_000_500
                ),
            ]
        );
        assert_eq!(law(&s), (2, 2));
    }

    #[test]
    fn histograms_become_bucket_sum_and_count_series() {
        let s = shards(2, 1000);
        let h = Metric {
            name: "lat".into(),
            r#type: MetricType::Histogram as i32,
            buckets: vec![
                Bucket {
                    upper_bound: 0.5,
                    cumulative_count: 2,
                },
                Bucket {
                    upper_bound: f64::INFINITY,
                    cumulative_count: 3,
                },
            ],
            count: 3,
            sum: 1.25,
            ..Default::default()
        };
        push(&s, "a", 1000, vec![h]);
        let got: Vec<(String, Option<String>, f64)> = drain(&s)
            .into_iter()
            .map(|(labels, v, ts)| {
                assert_eq!(ts, 1000);
                let get = |k: &str| labels.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
                (get("__name__").unwrap(), get("le"), f64::from_bits(v))
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("lat_bucket".into(), Some("+Inf".into()), 3.0),
                ("lat_bucket".into(), Some("0.5".into()), 2.0),
                ("lat_count".into(), None, 3.0),
                ("lat_sum".into(), None, 1.25),
            ]
        );
    }

    #[test]
    fn a_sample_not_newer_than_the_last_queued_is_dropped_out_of_order() {
        let s = shards(2, 1000);
        push(&s, "a", 10, vec![gauge("g", 1.0, 0, &[])]);
        push(&s, "a", 30, vec![gauge("g", 3.0, 0, &[])]);
        push(&s, "a", 20, vec![gauge("g", 2.0, 0, &[])]); // late frame
        push(&s, "a", 30, vec![gauge("g", 3.0, 0, &[])]); // same timestamp
        push(&s, "b", 20, vec![gauge("g", 2.0, 0, &[])]); // another agent's series
        assert_eq!(s.counters().dropped(Dropped::OutOfOrder), 2);
        let ts: Vec<i64> = drain(&s).iter().map(|x| x.2).collect();
        assert_eq!(ts, vec![10, 30, 20]);
        assert_eq!(law(&s), (5, 5));
    }

    #[test]
    fn a_full_queue_drops_the_oldest_and_counts_it() {
        let s = shards(1, 3);
        for t in 1..=5 {
            push(&s, "a", t, vec![gauge("g", t as f64, 0, &[])]);
        }
        assert_eq!(s.counters().dropped(Dropped::QueueFull), 2);
        assert_eq!(law(&s), (5, 5));
        let ts: Vec<i64> = drain(&s).iter().map(|x| x.2).collect();
        assert_eq!(ts, vec![3, 4, 5]);
        assert_eq!(law(&s), (5, 5));
    }

    #[test]
    fn what_remote_write_cannot_carry_is_dropped_invalid() {
        let s = shards(2, 1000);
        push(
            &s,
            "a",
            0, // no frame timestamp: the sample has none either
            vec![gauge("g", 1.0, 0, &[])],
        );
        push(
            &s,
            "a",
            5,
            vec![gauge("g", f64::from_bits(prompb::STALE_NAN_BITS), 0, &[])],
        );
        // (`__`-prefixed label names never get here: the protocol decoder refuses them.)
        push(&s, "a", 5, vec![gauge("ok", f64::NAN, 0, &[])]);
        assert_eq!(s.counters().dropped(Dropped::Invalid), 1);
        assert_eq!(
            s.counters().dropped(Dropped::NoSeries),
            1,
            "a marker for a series never queued ends nothing"
        );
        assert_eq!(drain(&s).len(), 1, "an ordinary NaN is a value");
        assert_eq!(law(&s), (3, 3));
    }

    #[test]
    fn the_agents_stale_marker_ends_its_series_after_its_last_sample() {
        let s = shards(2, 1000);
        let stale = f64::from_bits(prompb::STALE_NAN_BITS);
        push(
            &s,
            "a",
            2_000,
            vec![
                gauge("g", 1.0, 0, &[("pod", "p1")]),
                gauge("g", 1.0, 0, &[("pod", "p2")]),
            ],
        );
        assert_eq!(s.series(), 2);
        // The marker's own time is not after the last sample: it is stamped 1 ms after it.
        push(&s, "a", 1_500, vec![gauge("g", stale, 0, &[("pod", "p1")])]);
        assert_eq!(s.series(), 1, "p1 ended, p2 stays");
        assert_eq!(s.counters().stale.get(), 1);
        // Sent again (as agents do in case UC lost it): nothing left to end.
        push(&s, "a", 3_000, vec![gauge("g", stale, 0, &[("pod", "p1")])]);
        assert_eq!(s.counters().dropped(Dropped::NoSeries), 1);
        let got = drain(&s);
        let ended: Vec<&Decoded> = got
            .iter()
            .filter(|x| x.1 == prompb::STALE_NAN_BITS)
            .collect();
        assert_eq!(ended.len(), 1);
        assert_eq!(ended[0].2, 2_001);
        assert!(ended[0].0.contains(&("pod".into(), "p1".into())));
        // A new sample of the ended series starts it again.
        push(&s, "a", 4_000, vec![gauge("g", 2.0, 0, &[("pod", "p1")])]);
        assert_eq!(s.series(), 2);
        // Two samples, two markers, one sample: every one queued or dropped.
        assert_eq!(law(&s), (5, 5));
    }

    #[test]
    fn goodbye_and_staleness_send_stale_markers_after_the_last_sample() {
        let s = shards(2, 1000);
        push(
            &s,
            "a",
            2_000,
            vec![gauge("g", 1.0, 0, &[]), gauge("h", 1.0, 0, &[])],
        );
        push(&s, "b", 2_000, vec![gauge("g", 1.0, 0, &[])]);
        drain(&s);
        // The collector's clock is behind the agent's: the marker still follows the sample.
        assert_eq!(s.agent_left("a", Instant::now(), 1_000), 2);
        let got = drain(&s);
        assert_eq!(got.len(), 2);
        assert!(got
            .iter()
            .all(|x| x.1 == prompb::STALE_NAN_BITS && x.2 == 2_001));
        assert!(got
            .iter()
            .all(|x| x.0.contains(&("agent".into(), "a".into()))));
        assert_eq!(s.series(), 1);
        let later = Instant::now() + std::time::Duration::from_secs(1);
        assert_eq!(s.expire(later, later, 9_000), 1);
        let got = drain(&s);
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].1, got[0].2), (prompb::STALE_NAN_BITS, 9_000));
        assert_eq!(s.series(), 0);
        assert_eq!(law(&s), (6, 6));
    }

    #[test]
    fn an_agent_gets_at_most_its_series_cap_until_series_end() {
        let f = Families::new().unwrap();
        let s = Shards::new(4, 1000, 1000, 2, Arc::new(f.endpoint("http://x/")));
        let three = || {
            vec![
                gauge("x", 1.0, 0, &[]),
                gauge("y", 1.0, 0, &[]),
                gauge("z", 1.0, 0, &[]),
            ]
        };
        push(&s, "a", 10, three());
        push(&s, "b", 10, three()); // another agent has its own cap
        assert_eq!(s.series(), 4);
        assert_eq!(s.counters().dropped(Dropped::SeriesCap), 2);
        push(&s, "a", 20, three()); // the two known series update, the third is refused
        assert_eq!(s.counters().dropped(Dropped::SeriesCap), 3);
        drain(&s);
        s.agent_left("a", Instant::now(), 30);
        push(&s, "a", 40, three());
        assert_eq!(s.series(), 4, "a's series ended, so two new ones fit");
        assert_eq!(law(&s), (3 + 3 + 3 + 2 + 3, 3 + 3 + 3 + 2 + 3));
    }

    #[test]
    fn one_series_always_lands_in_one_shard_in_order() {
        let s = shards(8, 100_000);
        for t in 1..=50u64 {
            let ms: Vec<Metric> = (0..20)
                .map(|i| gauge("g", t as f64, 0, &[("i", &i.to_string())]))
                .collect();
            push(&s, "a", t, ms);
        }
        for shard in s.shards.iter() {
            let st = shard.lock();
            let mut last: std::collections::HashMap<*const u8, i64> = Default::default();
            for q in &st.queue {
                let prev = last.insert(q.wire.as_ptr(), q.sample.timestamp);
                assert!(prev.is_none_or(|p| p < q.sample.timestamp));
            }
        }
        let used = s
            .shards
            .iter()
            .filter(|sh| !sh.lock().queue.is_empty())
            .count();
        assert!(used > 1, "20 series over 8 shards used {used}");
        assert_eq!(law(&s), (1000, 1000));
    }

    fn push_at(s: &Shards, agent: &str, metrics: Vec<Metric>, now: Instant) {
        let payload = encode_metric_batch(&MetricBatch { metrics });
        let batch = MetricBatchView::decode(&payload, &Limits::default()).unwrap();
        s.push(agent, "host-1", 0, &batch, &mut Scratch::default(), now);
    }

    fn gauges(n: usize, ts: i64) -> Vec<Metric> {
        (0..n)
            .map(|i| gauge("g", 1.0, ts, &[("k", &i.to_string())]))
            .collect()
    }

    #[test]
    fn after_the_collectors_own_stall_the_samples_it_held_are_dropped_as_agent_moved() {
        let t0 = Instant::now();
        let s = shards(4, 1000).with_dead_peer(Duration::from_secs(3), "http://x/");
        let c = s.counters().clone();
        let wall = super::super::unix_ms(std::time::SystemTime::now());
        // Queued while running on time.
        push_at(&s, "a", gauges(10, wall - 5_000), t0);
        push_at(
            &s,
            "b",
            gauges(5, wall - 5_000),
            t0 + Duration::from_secs(1),
        );
        assert_eq!(s.watch(t0 + Duration::from_secs(2)), None);
        assert_eq!(c.dropped(Dropped::AgentMoved), 0);
        assert_eq!(c.pending.get(), 15);
        // Stopped 20 s: the first to run again drops all that was held.
        let t1 = t0 + Duration::from_secs(22);
        assert!(s.watch(t1).is_some());
        assert_eq!(c.dropped(Dropped::AgentMoved), 15);
        assert_eq!(c.pending.get(), 0);
        // What the kernel buffered meanwhile, decoded now: stamped before, dropped too.
        push_at(
            &s,
            "a",
            gauges(10, wall - 3_000),
            t1 + Duration::from_millis(100),
        );
        assert_eq!(c.dropped(Dropped::AgentMoved), 25);
        // A sample stamped after the stall was noticed goes out.
        push_at(
            &s,
            "c",
            gauges(1, wall + 60_000),
            t1 + Duration::from_millis(200),
        );
        assert_eq!(c.pending.get(), 1);
        // One dead-peer time later (running on time meanwhile) the fence is gone:
        // ordinary rules again.
        for k in 1..=2 {
            assert!(s.watch(t1 + Duration::from_secs(k)).is_some(), "fence held");
        }
        assert_eq!(s.watch(t1 + Duration::from_secs(3)), None);
        push_at(
            &s,
            "d",
            gauges(2, wall - 3_000),
            t1 + Duration::from_millis(3_500),
        );
        assert_eq!(c.dropped(Dropped::AgentMoved), 25);
        assert_eq!(c.pending.get(), 3);
        assert_eq!(law(&s), (28, 28));
    }

    #[test]
    fn without_a_stall_an_agent_that_leaves_without_goodbye_loses_nothing_queued() {
        let t0 = Instant::now();
        let s = shards(2, 1000).with_dead_peer(Duration::from_secs(3), "http://x/");
        let wall = super::super::unix_ms(std::time::SystemTime::now());
        for k in 0..40u32 {
            let at = t0 + stall_tick() * k;
            push_at(&s, "killed", gauges(3, wall + i64::from(k) * 250), at);
            assert_eq!(s.watch(at), None);
        }
        assert_eq!(s.counters().dropped(Dropped::AgentMoved), 0);
        assert_eq!(drain(&s).len(), 120);
        assert_eq!(law(&s), (120, 120));
    }

    fn stall_tick() -> Duration {
        super::super::stall::TICK
    }
}
