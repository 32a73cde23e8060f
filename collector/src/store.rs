//! The series store: the latest sample of every series each agent sent, exposed on
//! `/metrics` through a custom `prometheus::core::Collector` (DESIGN.md §8).
//!
//! Rules, as a Prometheus operator expects from a federation-style exporter:
//!
//! * **Identity.** A series is its metric name plus label set, per agent. Every exposed series
//!   gets `agent` (the agent id) and `instance` (the hostname the agent reported in `Hello`).
//!   Labels of those names already on the incoming series are renamed `exported_agent` /
//!   `exported_instance` (prefixed again while taken), as Prometheus does with
//!   `honor_labels: false`.
//! * **Latest value wins.** Metrics carry state, not deltas (DESIGN.md §3 rule 2): a lost frame
//!   only lowers resolution. Counters are stored as sent; an agent restart makes a counter go
//!   down, which is a *counter reset* that `rate()`/`increase()` handle. The store does not fake
//!   monotonicity (that would turn a restart into a bogus spike).
//! * **Samples keep their collection time.** Each sample is exposed with the time the agent
//!   collected it (its own `timestamp_ms`, else its frame header's `timestamp_ns`), in ms
//!   after the value, as Prometheus federation does (`metrics.expose_timestamps`, default
//!   on; [`SeriesStore::with_timestamps`]). Stamped at scrape time instead, a value read up
//!   to one collection interval before the scrape is placed at the scrape, with a lag that
//!   moves with the scrape phase: `rate()` over a window of a few collection intervals then
//!   sees one step more or one fewer than the window holds (0.55 to 1.12 times the true rate
//!   through `rate(...[10s])` of a 5 s collection, `tests/tests/it/liveness.rs`). With the agent's times a late frame's
//!   older value is an out-of-order sample Prometheus drops, not a counter that seems to go
//!   back and reset. A series that leaves `/metrics` gets no staleness marker from a
//!   Prometheus before 2.48 (`track_timestamps_staleness` from 2.48 on), so liveness is read
//!   from `uctel_collector_agent_up` (`crate::liveness`), which has no timestamp. What
//!   Prometheus does with samples too old for its head or scraped twice:
//!   `crate::config::MetricsConfig::expose_timestamps`.
//! * **Staleness.** A series not updated for `staleness_seconds` disappears
//!   ([`SeriesStore::expire`], also run before every scrape).
//! * **Ended series.** A sample whose value is Prometheus's stale marker (the NaN with bits
//!   `0x7ff0000000000002`) removes its series at once: the agent's way of saying a series
//!   ended (a Slurm job's series when the job ends), as a scrape's stale marker does in
//!   Prometheus. A marker for a series not stored does nothing.
//! * **Gone agents.** When an agent's session ends (its `Goodbye`, its control connection
//!   lost, or heartbeats missed past the dead-peer rule) and no newer connection of it took
//!   over, all its series go at once ([`SeriesStore::remove_agent`]), not after
//!   `staleness_seconds`. Remote-write ends its series with stale markers on a `Goodbye`
//!   with reason `shutdown` (the agent will not come back under those labels) and after
//!   `staleness_seconds` otherwise: a stale marker is a sample in the receiver's copy of
//!   the series, which the agent may go on writing through another collector of its pool,
//!   while removing a series from this collector's `/metrics` touches nothing else.
//! * **Cardinality bound.** At most `series_cap_per_agent` series per agent; a sample for a
//!   new series beyond the cap is not stored and is counted (`series_cap`). Updates of stored
//!   series always go through.
//! * **One family per name.** All series of one metric name are emitted as one family with one
//!   HELP (the first one seen) and one TYPE (promtool rejects duplicates). A sample whose type
//!   conflicts with the family's is dropped (`type_conflict`), as is one that would collide
//!   with a histogram's `_bucket`/`_sum`/`_count` names or use the collector's own
//!   `uctel_collector_` namespace (`reserved_name`).
//! * **Scrapes barely stall ingest**: a scrape copies pointers to every series under the lock
//!   (about 20 ms for 100 000 series on the development machine) and builds the exposition
//!   outside it (about 150 ms more).
//! * **Histograms** are exposed as `_bucket{le}` (cumulative), `_sum` and `_count`; an explicit
//!   `+Inf` bucket from the agent is folded into `_count` (the encoder writes `le="+Inf"`).

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use foldhash::fast::RandomState;
use hashbrown::HashTable;
use prometheus::core::{Collector, Desc};
use prometheus::proto;
use uctel_protocol::borrowed::{MetricBatchView, RecordId};
use uctel_protocol::dict::KnownValue;
use uctel_protocol::payload::{
    is_valid_label_name, is_valid_metric_name, Bucket, LabelParts, Metric, MetricParts, MetricType,
};

/// Why [`SeriesStore::ingest`] did not store a sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SampleRejection {
    /// A new series beyond `series_cap_per_agent`.
    SeriesCap,
    /// The metric name already has another type (or HELP family shape) in the store.
    TypeConflict,
    /// Name in the collector's own namespace or clashing with a histogram's derived names.
    ReservedName,
    /// Name or label name outside the Prometheus grammar, or an unknown type (the protocol
    /// decoder already checks; kept so the store never emits an invalid exposition).
    Invalid,
}

impl SampleRejection {
    /// The collector-wide drop reason this rejection is counted under.
    pub fn drop_reason(self) -> crate::telemetry::DropReason {
        use crate::telemetry::DropReason;
        match self {
            SampleRejection::SeriesCap => DropReason::SeriesCap,
            SampleRejection::TypeConflict => DropReason::TypeConflict,
            SampleRejection::ReservedName => DropReason::ReservedName,
            SampleRejection::Invalid => DropReason::MalformedPayload,
        }
    }

    /// Reason label value.
    pub fn as_str(self) -> &'static str {
        match self {
            SampleRejection::SeriesCap => "series_cap",
            SampleRejection::TypeConflict => "type_conflict",
            SampleRejection::ReservedName => "reserved_name",
            SampleRejection::Invalid => "invalid_sample",
        }
    }
}

/// Outcome of ingesting one batch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IngestOutcome {
    /// Samples stored (new or updated series).
    pub stored: u64,
    /// Samples not stored, by reason.
    pub rejected: Vec<(SampleRejection, u64)>,
}

impl IngestOutcome {
    fn reject(&mut self, reason: SampleRejection) {
        self.reject_n(reason, 1);
    }

    /// Counts `n` samples not stored for `reason`.
    pub fn reject_n(&mut self, reason: SampleRejection, n: u64) {
        if let Some(slot) = self.rejected.iter_mut().find(|(r, _)| *r == reason) {
            slot.1 += n;
        } else {
            self.rejected.push((reason, n));
        }
    }

    /// Rejections for `reason`.
    pub fn rejected(&self, reason: SampleRejection) -> u64 {
        self.rejected
            .iter()
            .find(|(r, _)| *r == reason)
            .map_or(0, |(_, n)| *n)
    }
}

/// Series identity inside one agent: name plus sorted labels (after renaming).
type SeriesKey = (String, Vec<(String, String)>);

#[derive(Clone, Debug)]
enum Value {
    Counter(f64),
    Gauge(f64),
    Histogram {
        /// Shared so a scrape snapshot copies a pointer, not the buckets.
        buckets: Arc<[(f64, u64)]>,
        count: u64,
        sum: f64,
    },
}

#[derive(Clone, Debug)]
struct Sample {
    value: Value,
    updated: Instant,
    /// When the agent collected the value, ms since the Unix epoch (the record's own
    /// `timestamp_ms`, else its frame's `timestamp_ns`); 0 when unknown.
    collected_ms: i64,
    /// `collected_ms` is the record's own timestamp (not its frame's).
    own_time: bool,
}

impl Sample {
    /// Notes the collection time of a value just stored: the record's own `timestamp_ms`
    /// when it has one, else the frame's (`frame_ms`, 0 when unknown).
    fn collected(&mut self, record_ms: i64, frame_ms: i64) {
        self.own_time = record_ms > 0;
        self.collected_ms = if record_ms > 0 {
            record_ms
        } else {
            frame_ms.max(0)
        };
    }
}

/// One stored series.
#[derive(Debug)]
struct Series {
    /// [`series_hash`] of the key.
    hash: u64,
    /// Shared so a scrape snapshot copies a pointer, not strings.
    key: Arc<SeriesKey>,
    /// The type the series was created with; while the series exists its family (which it
    /// holds a reference on) has this type, so an update is checked here without a family
    /// lookup.
    kind: MetricType,
    sample: Sample,
}

#[derive(Debug, Default)]
struct AgentSeries {
    instance: String,
    /// Series by [`series_hash`]; looked up with borrowed name and labels, so updating an
    /// existing series allocates nothing.
    series: HashTable<Series>,
    /// Changes whenever a series is added to or removed from `series` (which may move the
    /// others): a bucket index noted at one layout names the same series while the layout
    /// is unchanged.
    layout: u64,
    /// The series each record with a [`RecordId`] was stored in, so that the same record
    /// (same name and labels) in any later batch, at the same position or not, goes
    /// straight to its series.
    recent: Recent,
}

/// Where records with a [`RecordId`] were stored ([`AgentSeries::recent`]): their bucket
/// indices in the agent's series table, valid while its `layout` is the one noted (a
/// series added or removed clears them). Looked up by position in the agent's last batch
/// first (a payload repeated with new values: one comparison), then by id: a host
/// collection of 442 series spans two series-dictionary frames, whose records alternate
/// at the same positions, so a look-up by position alone missed every sample of them and
/// each took the full look-up (name and label values hashed, then compared). The values of
/// series-dictionary frames ([`SeriesStore::ingest_known`]) are also noted by their
/// dictionary id, a dense index: one load and one comparison of the id instead of the
/// by-id hash probe.
#[derive(Debug, Default)]
struct Recent {
    layout: u64,
    at: Vec<Option<(RecordId, usize)>>,
    by_id: HashMap<RecordId, usize, RandomState>,
    by_entry: Vec<Option<(RecordId, usize)>>,
}

impl Recent {
    /// The bucket `id` (at `position` of its batch) was stored in at `layout`.
    #[inline]
    fn get(&self, layout: u64, position: usize, id: RecordId) -> Option<usize> {
        if self.layout != layout {
            return None;
        }
        match self.at.get(position) {
            Some(Some((at, bucket))) if *at == id => Some(*bucket),
            _ => self.by_id.get(&id).copied(),
        }
    }

    /// The bucket of a series-dictionary value (`value.entry`, `value.id`; at `position`
    /// of its frame) at `layout`: by its dictionary id, else as [`Recent::get`], and then
    /// noted by dictionary id for the next frame.
    #[inline]
    fn get_known(&mut self, layout: u64, position: usize, value: &KnownValue) -> Option<usize> {
        if self.layout != layout {
            return None;
        }
        if let Some(Some((id, bucket))) = self.by_entry.get(value.entry as usize) {
            if *id == value.id {
                return Some(*bucket);
            }
        }
        self.get_known_first(layout, position, value)
    }

    /// [`Recent::get_known`] for a value not noted by its dictionary id yet (the first
    /// frames after its definition, or after the layout changed): as [`Recent::get`], then
    /// noted by dictionary id. Out of line, so that the hit above stays small.
    #[cold]
    #[inline(never)]
    fn get_known_first(
        &mut self,
        layout: u64,
        position: usize,
        value: &KnownValue,
    ) -> Option<usize> {
        let bucket = self.get(layout, position, value.id)?;
        let entry = value.entry as usize;
        // Bounded as `by_id` (`note`): dictionary ids are dense from 0 per epoch.
        if entry < self.by_id.len().max(self.at.len()).saturating_mul(2) + 1024 {
            if self.by_entry.len() <= entry {
                self.by_entry.resize(entry + 1, None);
            }
            self.by_entry[entry] = Some((value.id, bucket));
        }
        Some(bucket)
    }

    /// Notes that `id`, at `position` of its batch, was stored in `bucket` at `layout`.
    /// Ids of records no longer sent (earlier connections' dictionaries, earlier payloads)
    /// are dropped by clearing all once there are more than `bound`, so memory stays
    /// proportional to the series and the batch size.
    fn note(&mut self, layout: u64, position: usize, id: RecordId, bucket: usize, bound: usize) {
        if self.layout != layout || self.by_id.len() >= bound {
            self.by_id.clear();
            self.at.clear();
            self.by_entry.clear();
            self.layout = layout;
        }
        if self.at.len() <= position {
            self.at.resize(position + 1, None);
        }
        if let Some(slot) = self.at.get_mut(position) {
            *slot = Some((id, bucket));
        }
        self.by_id.insert(id, bucket);
    }
}

/// A value [`SeriesStore::ingest_by_id`] stores by its [`RecordId`] alone.
trait ById {
    /// The [`MetricType`] value of its record.
    fn kind(&self) -> i32;
    /// The sample's value.
    fn value(&self) -> f64;
    /// The bucket its series was noted in (at `position` of its frame), at `layout`.
    fn bucket(&self, recent: &mut Recent, layout: u64, position: usize) -> Option<usize>;
    /// Notes the collection time of the value just stored in `sample`, from a frame opened
    /// at `frame_ms` (ms since the Unix epoch).
    fn stamp(&self, sample: &mut Sample, frame_ms: i64);
}

impl ById for KnownValue {
    #[inline]
    fn kind(&self) -> i32 {
        self.r#type
    }
    #[inline]
    fn value(&self) -> f64 {
        self.value
    }
    #[inline]
    fn bucket(&self, recent: &mut Recent, layout: u64, position: usize) -> Option<usize> {
        recent.get_known(layout, position, self)
    }
    /// Its own timestamp, else its frame's.
    #[inline]
    fn stamp(&self, sample: &mut Sample, frame_ms: i64) {
        sample.collected(self.timestamp_ms, frame_ms);
    }
}

/// A record of a payload repeated with new values ([`MetricBatchView::repeated`]).
struct Repeated {
    id: RecordId,
    kind: i32,
    value: f64,
}

impl ById for Repeated {
    #[inline]
    fn kind(&self) -> i32 {
        self.kind
    }
    #[inline]
    fn value(&self) -> f64 {
        self.value
    }
    #[inline]
    fn bucket(&self, recent: &mut Recent, layout: u64, position: usize) -> Option<usize> {
        recent.get(layout, position, self.id)
    }
    /// A repeated record has the timestamp it had ([`MetricBatchView::repeated`]): an own
    /// timestamp stays, a frame's moves on.
    #[inline]
    fn stamp(&self, sample: &mut Sample, frame_ms: i64) {
        if !sample.own_time {
            sample.collected_ms = frame_ms.max(0);
        }
    }
}

#[derive(Clone, Debug)]
struct FamilyMeta {
    kind: MetricType,
    help: String,
    /// Series (over all agents) currently using the name.
    refs: usize,
}

#[derive(Debug, Default)]
struct Inner {
    agents: HashMap<String, AgentSeries, RandomState>,
    families: HashMap<String, FamilyMeta, RandomState>,
    /// Seeds [`series_hash`] (random per store, foldhash).
    hasher: RandomState,
    /// The buckets of one frame's values, reused ([`SeriesStore::ingest_known`]).
    buckets: Vec<usize>,
}

/// Latest sample per series per agent. Cheap to clone (shared); thread-safe.
#[derive(Clone, Debug)]
pub struct SeriesStore {
    inner: Arc<Mutex<Inner>>,
    staleness: Duration,
    /// `series_cap_per_agent`, changed live by a reload ([`SeriesStore::set_cap_per_agent`]).
    cap_per_agent: Arc<std::sync::atomic::AtomicUsize>,
    /// Expose each sample with its collection time ([`SeriesStore::with_timestamps`]).
    timestamps: bool,
}

/// Names the collector's own metrics use; agents may not send them.
const RESERVED_PREFIX: &str = "uctel_collector_";
const HISTOGRAM_SUFFIXES: [&str; 3] = ["_bucket", "_sum", "_count"];

fn exported(name: &str, taken: &dyn Fn(&str) -> bool) -> String {
    let mut out = format!("exported_{name}");
    while taken(&out) {
        out = format!("exported_{out}");
    }
    out
}

/// Label names the collector renames (`agent`, `instance` are added at scrape time; `le`
/// belongs to histogram buckets).
fn is_renamed(name: &str) -> bool {
    matches!(name, "agent" | "instance" | "le")
}

/// The label set as exposed (without `agent`/`instance`, which are added at scrape time),
/// sorted by name, with clashing names renamed.
pub(crate) fn series_labels<M: MetricParts>(metric: &M) -> Vec<(String, String)> {
    let names: Vec<&str> = metric.labels().iter().map(LabelParts::name).collect();
    let taken = |n: &str| names.contains(&n) || n == "agent" || n == "instance";
    let mut labels: Vec<(String, String)> = metric
        .labels()
        .iter()
        .map(|l| {
            let name = if is_renamed(l.name()) {
                exported(l.name(), &taken)
            } else {
                l.name().to_owned()
            };
            (name, l.value().to_owned())
        })
        .collect();
    labels.sort();
    labels
}

/// Hash of a series identity: name and the sorted (renamed) label values, each value
/// preceded by `0xff` (a byte UTF-8 never contains). Label names are left out (series of
/// one metric differ in their values; [`same_series`] compares names too), which saves a
/// third of the hashing per sample.
fn series_hash<L: LabelParts>(state: &RandomState, name: &str, labels: &[L]) -> u64 {
    let mut h = state.build_hasher();
    h.write(name.as_bytes());
    for l in labels {
        h.write_u8(0xff);
        h.write(l.value().as_bytes());
    }
    h.finish()
}

fn same_series<L: LabelParts>(key: &SeriesKey, name: &str, labels: &[L]) -> bool {
    key.0 == name
        && key.1.len() == labels.len()
        && key
            .1
            .iter()
            .zip(labels)
            .all(|((n, v), l)| n == l.name() && v == l.value())
}

/// A label as `(name, value)` views: sorted or renamed label sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Pair<'a>(&'a str, &'a str);

impl LabelParts for Pair<'_> {
    fn name(&self) -> &str {
        self.0
    }
    fn value(&self) -> &str {
        self.1
    }
}

/// Empties `v` and reuses its allocation for elements of another lifetime (same layout: the
/// standard library collects a `vec::IntoIter` in place).
// `filter` would keep the input lifetime; the point is to change it.
#[allow(clippy::unnecessary_filter_map)]
fn recycle<'b>(mut v: Vec<Pair<'_>>) -> Vec<Pair<'b>> {
    v.clear();
    v.into_iter().filter_map(|_| None).collect()
}

/// The stored value of a sample of `kind`. For a histogram whose stored buckets are not
/// shared with a scrape snapshot and keep their number, they are overwritten in place.
/// Whether `m` is a Prometheus stale marker (the NaN with bits `0x7ff0000000000002`, as
/// Prometheus's `value.StaleNaN`) on a counter, gauge or untyped sample: the agent says the
/// series has ended (a Slurm job that ended, `uctel_agent::sources::slurm`), and the store
/// removes it at once instead of after `staleness_seconds`. Remote-write forwards the marker
/// as the end of the series in the receiver.
fn is_stale_marker<M: MetricParts>(kind: MetricType, m: &M) -> bool {
    matches!(
        kind,
        MetricType::Counter | MetricType::Gauge | MetricType::Untyped
    ) && m.value().to_bits() == STALE_NAN_BITS
}

/// Prometheus's stale-marker NaN (`model/value.StaleNaN`).
const STALE_NAN_BITS: u64 = 0x7ff0_0000_0000_0002;

fn store_value<M: MetricParts>(slot: &mut Value, kind: MetricType, m: &M) {
    // An explicit `+Inf` bucket is `_count` (the encoder writes `le="+Inf"` itself).
    let finite = |b: &&Bucket| !(b.upper_bound.is_infinite() && b.upper_bound > 0.0);
    match kind {
        MetricType::Counter => *slot = Value::Counter(m.value()),
        MetricType::Gauge | MetricType::Untyped => *slot = Value::Gauge(m.value()),
        _ => {
            if let Value::Histogram {
                buckets,
                count,
                sum,
            } = slot
            {
                let n = m.buckets().iter().filter(finite).count();
                if let Some(stored) = Arc::get_mut(buckets).filter(|b| b.len() == n) {
                    for (s, b) in stored.iter_mut().zip(m.buckets().iter().filter(finite)) {
                        *s = (b.upper_bound, b.cumulative_count);
                    }
                    *count = m.count();
                    *sum = m.sum();
                    return;
                }
            }
            *slot = Value::Histogram {
                buckets: m
                    .buckets()
                    .iter()
                    .filter(finite)
                    .map(|b| (b.upper_bound, b.cumulative_count))
                    .collect(),
                count: m.count(),
                sum: m.sum(),
            };
        }
    }
}

/// A counter, gauge or untyped `value` of type `kind` (a `MetricType` value) stored in
/// `series`, found by its record id, at `now`; returns its sample, whose collection time
/// the caller notes. Errors: an unknown type or no series (`Invalid`), a series of
/// another type (`TypeConflict`).
fn update_scalar(
    series: Option<&mut Series>,
    kind: i32,
    value: f64,
    now: Instant,
) -> Result<&mut Sample, SampleRejection> {
    let kind = MetricType::try_from(kind)
        .ok()
        .filter(|k| *k != MetricType::Unspecified)
        .ok_or(SampleRejection::Invalid)?;
    let series = series.ok_or(SampleRejection::Invalid)?;
    if series.kind != kind {
        return Err(SampleRejection::TypeConflict);
    }
    series.sample.value = match kind {
        MetricType::Counter => Value::Counter(value),
        _ => Value::Gauge(value),
    };
    series.sample.updated = now;
    Ok(&mut series.sample)
}

impl SeriesStore {
    /// A store expiring series after `staleness` and holding at most `cap_per_agent` series per
    /// agent. Samples are exposed with their collection time (see
    /// [`SeriesStore::with_timestamps`]).
    pub fn new(staleness: Duration, cap_per_agent: usize) -> SeriesStore {
        SeriesStore {
            inner: Arc::new(Mutex::new(Inner::default())),
            staleness,
            cap_per_agent: Arc::new(std::sync::atomic::AtomicUsize::new(cap_per_agent)),
            timestamps: true,
        }
    }

    /// Sets the series cap per agent (`series_cap_per_agent`, a reload: `crate::reload`)
    /// for every clone of the store. A lower cap refuses new series only: series already
    /// stored stay until they end (staleness, `Goodbye`).
    pub fn set_cap_per_agent(&self, cap: usize) {
        self.cap_per_agent
            .store(cap, std::sync::atomic::Ordering::Relaxed);
    }

    /// The same store exposing each sample with its collection time (`true`, the default:
    /// `name{labels} value timestamp_ms`, as Prometheus federation does) or without (`false`:
    /// Prometheus stamps every sample with its scrape time). The module docs say why the
    /// default is `true`. Samples whose collection time is unknown are exposed without one.
    pub fn with_timestamps(mut self, expose: bool) -> SeriesStore {
        self.timestamps = expose;
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the maps inconsistent in a way that
        // matters more than losing all metrics, so recover the guard.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Stores every sample of `metrics` for `agent` (whose hostname is `instance`). A
    /// sample's collection time is its `timestamp_ms` (0: unknown, exposed without one).
    pub fn ingest(
        &self,
        agent: &str,
        instance: &str,
        metrics: &[Metric],
        now: Instant,
    ) -> IngestOutcome {
        self.ingest_records(
            agent,
            instance,
            metrics.iter().map(|m| (m, None)),
            false,
            0,
            now,
        )
    }

    /// As [`SeriesStore::ingest`], for a batch decoded with borrowed views (the collector's
    /// worker path): updating an existing series copies no string, and the name grammars are
    /// not checked again (a `MetricBatchView` only holds records that passed the protocol's
    /// `validate_metric` rules, which include them). A record with a [`RecordId`] that was
    /// stored before (in any earlier batch of the agent, at any position) is stored in the
    /// same series without looking it up again, while no series was added or removed.
    pub fn ingest_views(
        &self,
        agent: &str,
        instance: &str,
        batch: &MetricBatchView<'_>,
        now: Instant,
    ) -> IngestOutcome {
        self.ingest_views_at(agent, instance, batch, 0, now)
    }

    /// As [`SeriesStore::ingest_views`], for a batch from a frame whose header says the
    /// agent opened it at `frame_timestamp_ns` (ns since the Unix epoch; 0: unknown): the
    /// collection time of every record without its own `timestamp_ms`.
    pub fn ingest_views_at(
        &self,
        agent: &str,
        instance: &str,
        batch: &MetricBatchView<'_>,
        frame_timestamp_ns: u64,
        now: Instant,
    ) -> IngestOutcome {
        let frame_ms = i64::try_from(frame_timestamp_ns / 1_000_000).unwrap_or(i64::MAX);
        if let Some(out) = self.ingest_repeated(agent, instance, batch, frame_ms, now) {
            return out;
        }
        self.ingest_records(agent, instance, batch.iter_with_ids(), true, frame_ms, now)
    }

    /// As [`SeriesStore::ingest_views_at`], for the values of a series-dictionary frame
    /// read by id alone (`uctel_protocol::dict::SeriesDict::decode_known`): each value goes
    /// to the series its [`RecordId`] was stored in before, no name or label read. All or
    /// nothing: `None`, nothing stored, unless every value's
    /// id names a series stored before while no series was added or removed since
    /// (`Recent`) and no value is a stale marker or a histogram (those take the full path,
    /// which ends or builds their series); else the outcome
    /// [`SeriesStore::ingest_views_at`] gives for the same frame (`frame_timestamp_ns`: its
    /// header's time, ns since the Unix epoch).
    pub fn ingest_known(
        &self,
        agent: &str,
        instance: &str,
        values: &[KnownValue],
        frame_timestamp_ns: u64,
        now: Instant,
    ) -> Option<IngestOutcome> {
        let frame_ms = i64::try_from(frame_timestamp_ns / 1_000_000).unwrap_or(i64::MAX);
        self.ingest_by_id(agent, instance, || values.iter().copied(), frame_ms, now)
    }

    /// A batch that repeats the previous payload with new values
    /// ([`MetricBatchView::repeated`]), stored from ids and values alone, no view built
    /// ([`SeriesStore::ingest_by_id`]), with the outcome [`SeriesStore::ingest_records`]
    /// would give. `None` (nothing stored) otherwise.
    fn ingest_repeated(
        &self,
        agent: &str,
        instance: &str,
        batch: &MetricBatchView<'_>,
        frame_ms: i64,
        now: Instant,
    ) -> Option<IngestOutcome> {
        // Not a repeated payload: the full path.
        let _records = batch.repeated()?;
        let values = || {
            batch
                .repeated()
                .into_iter()
                .flatten()
                .map(|(id, kind, value)| Repeated { id, kind, value })
        };
        self.ingest_by_id(agent, instance, values, frame_ms, now)
    }

    /// Stores values by their [`RecordId`] alone ([`SeriesStore::ingest_known`],
    /// [`SeriesStore::ingest_repeated`]), all or nothing: `None`, nothing stored, unless
    /// every value of `values()` (called twice, the same values each time) finds the series
    /// it was stored in before ([`ById::bucket`]: the series unmoved since) and none is a
    /// stale marker (the full path ends its series) or a histogram (the full path stores
    /// its buckets). Else each value is stored with [`update_scalar`] and stamped by
    /// [`ById::stamp`], and the outcome is the full path's for the same records.
    fn ingest_by_id<V: ById, I: Iterator<Item = V>>(
        &self,
        agent: &str,
        instance: &str,
        values: impl Fn() -> I,
        frame_ms: i64,
        now: Instant,
    ) -> Option<IngestOutcome> {
        let mut guard = self.lock();
        let Inner {
            agents, buckets, ..
        } = &mut *guard;
        let entry = agents.get_mut(agent)?;
        let (layout, recent, series) = (entry.layout, &mut entry.recent, &entry.series);
        buckets.clear();
        for (at, v) in values().enumerate() {
            if v.value().to_bits() == STALE_NAN_BITS || v.kind() == MetricType::Histogram as i32 {
                return None;
            }
            let bucket = v
                .bucket(recent, layout, at)
                .filter(|b| series.get_bucket(*b).is_some())?;
            buckets.push(bucket);
        }
        if entry.instance != instance {
            entry.instance = instance.to_string();
        }
        let mut out = IngestOutcome::default();
        for (v, bucket) in values().zip(buckets.iter()) {
            // Checked above, under the same lock: the series is where it was.
            let series = entry.series.get_bucket_mut(*bucket);
            match update_scalar(series, v.kind(), v.value(), now) {
                Ok(sample) => {
                    v.stamp(sample, frame_ms);
                    out.stored += 1;
                }
                Err(r) => out.reject(r),
            }
        }
        Some(out)
    }

    /// `validated`: the records already passed the protocol's metric rules.
    fn ingest_records<M: MetricParts>(
        &self,
        agent: &str,
        instance: &str,
        metrics: impl Iterator<Item = (M, Option<RecordId>)>,
        validated: bool,
        frame_ms: i64,
        now: Instant,
    ) -> IngestOutcome {
        let mut out = IngestOutcome::default();
        let mut guard = self.lock();
        let Inner {
            agents,
            families,
            hasher,
            ..
        } = &mut *guard;
        // Look the agent up by `&str` first: an owned key is only built for a new agent.
        if !agents.contains_key(agent) {
            agents.insert(agent.to_string(), AgentSeries::default());
        }
        let Some(entry) = agents.get_mut(agent) else {
            return out;
        };
        if entry.instance != instance {
            entry.instance = instance.to_string();
        }
        // Sorted label views of a sample whose labels arrive unsorted (allocated once per
        // batch, and only if needed).
        let mut spare: Vec<Pair<'static>> = Vec::new();
        for (position, (m, id)) in metrics.enumerate() {
            let Some(kind) = MetricType::try_from(m.kind())
                .ok()
                .filter(|k| *k != MetricType::Unspecified)
            else {
                out.reject(SampleRejection::Invalid);
                continue;
            };
            // A record stored before under the same id, the series unmoved: its series
            // (found then by the same name and labels, so not a reserved name either).
            // A stale marker ends its series here and now (below, in `upsert`), never
            // through the remembered position.
            let stale = is_stale_marker(kind, &m);
            let recent = id
                .filter(|_| !stale)
                .and_then(|id| entry.recent.get(entry.layout, position, id));
            if let Some(series) = recent.and_then(|b| entry.series.get_bucket_mut(b)) {
                if series.kind != kind {
                    out.reject(SampleRejection::TypeConflict);
                } else {
                    store_value(&mut series.sample.value, kind, &m);
                    series.sample.updated = now;
                    series.sample.collected(m.timestamp_ms(), frame_ms);
                    out.stored += 1;
                }
                continue;
            }
            let name = m.name();
            if !validated
                && (!is_valid_metric_name(name)
                    || !m.labels().iter().all(|l| is_valid_label_name(l.name())))
            {
                out.reject(SampleRejection::Invalid);
                continue;
            }
            if name.starts_with(RESERVED_PREFIX) {
                out.reject(SampleRejection::ReservedName);
                continue;
            }
            // The series identity is the sorted, renamed label set; the common case (labels
            // sent sorted, none renamed) uses the sample's labels as they are.
            let labels = m.labels();
            let result = if labels.iter().any(|l| is_renamed(l.name())) {
                // Rare: renamed labels are built owned.
                let owned = series_labels(&m);
                let renamed: Vec<Pair<'_>> = owned.iter().map(|(n, v)| Pair(n, v)).collect();
                self.upsert(entry, families, hasher, &m, kind, &renamed, frame_ms, now)
            } else if labels.is_sorted_by(|a, b| (a.name(), a.value()) <= (b.name(), b.value())) {
                self.upsert(entry, families, hasher, &m, kind, labels, frame_ms, now)
            } else {
                let mut sorted = recycle(std::mem::take(&mut spare));
                sorted.extend(labels.iter().map(|l| Pair(l.name(), l.value())));
                sorted.sort_unstable();
                let result = self.upsert(entry, families, hasher, &m, kind, &sorted, frame_ms, now);
                spare = recycle(sorted);
                result
            };
            match result {
                Ok(None) => out.stored += 1,
                Ok(Some(bucket)) => {
                    out.stored += 1;
                    if let Some(id) = id {
                        let bound = 2 * entry.series.len() + 1024;
                        entry.recent.note(entry.layout, position, id, bucket, bound);
                    }
                }
                Err(r) => out.reject(r),
            }
        }
        out
    }

    /// Updates the series `(m.name(), labels)` of `entry` in place, or creates it (series
    /// cap, family claim); returns its bucket index in `entry.series`. A stale marker
    /// ([`is_stale_marker`]) removes the series instead (nothing when there is none) and
    /// returns `None`.
    #[allow(clippy::too_many_arguments)]
    fn upsert<M: MetricParts, L: LabelParts>(
        &self,
        entry: &mut AgentSeries,
        families: &mut HashMap<String, FamilyMeta, RandomState>,
        hasher: &RandomState,
        m: &M,
        kind: MetricType,
        labels: &[L],
        frame_ms: i64,
        now: Instant,
    ) -> Result<Option<usize>, SampleRejection> {
        let name = m.name();
        let hash = series_hash(hasher, name, labels);
        if is_stale_marker(kind, m) {
            if let Ok(found) = entry.series.find_entry(hash, |s| {
                s.hash == hash && same_series(&s.key, name, labels)
            }) {
                let (gone, _) = found.remove();
                release_family(families, &gone.key.0);
                entry.layout = entry.layout.wrapping_add(1);
            }
            return Ok(None);
        }
        let stored = entry.series.len();
        let found = entry.series.find_bucket_index(hash, |s| {
            s.hash == hash && same_series(&s.key, name, labels)
        });
        if let Some((bucket, series)) =
            found.and_then(|b| Some((b, entry.series.get_bucket_mut(b)?)))
        {
            if series.kind != kind {
                return Err(SampleRejection::TypeConflict);
            }
            store_value(&mut series.sample.value, kind, m);
            series.sample.updated = now;
            series.sample.collected(m.timestamp_ms(), frame_ms);
            return Ok(Some(bucket));
        }
        if stored
            >= self
                .cap_per_agent
                .load(std::sync::atomic::Ordering::Relaxed)
        {
            return Err(SampleRejection::SeriesCap);
        }
        claim_family(families, name, kind, m.help())?;
        let key: SeriesKey = (
            name.to_owned(),
            labels
                .iter()
                .map(|l| (l.name().to_owned(), l.value().to_owned()))
                .collect(),
        );
        let mut value = Value::Gauge(0.0);
        store_value(&mut value, kind, m);
        let mut sample = Sample {
            value,
            updated: now,
            collected_ms: 0,
            own_time: false,
        };
        sample.collected(m.timestamp_ms(), frame_ms);
        entry.layout = entry.layout.wrapping_add(1);
        let inserted = entry.series.insert_unique(
            hash,
            Series {
                hash,
                key: Arc::new(key),
                kind,
                sample,
            },
            |s| s.hash,
        );
        Ok(Some(inserted.bucket_index()))
    }

    /// Removes series not updated within the staleness period; returns how many.
    pub fn expire(&self, now: Instant) -> usize {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let mut removed = 0;
        let staleness = self.staleness;
        for agent in inner.agents.values_mut() {
            let families = &mut inner.families;
            let before = removed;
            agent.series.retain(|s| {
                let keep = now.saturating_duration_since(s.sample.updated) < staleness;
                if !keep {
                    removed += 1;
                    release_family(families, &s.key.0);
                }
                keep
            });
            if removed != before {
                agent.layout = agent.layout.wrapping_add(1);
            }
        }
        inner.agents.retain(|_, a| !a.series.is_empty());
        removed
    }

    /// Removes every series of `agent` at once (the agent is gone: its `Goodbye`, or its
    /// control connection lost or silent past the dead-peer rule); returns how many. Its
    /// families are released as by [`SeriesStore::expire`].
    pub fn remove_agent(&self, agent: &str) -> usize {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let Some(gone) = inner.agents.remove(agent) else {
            return 0;
        };
        for s in gone.series.iter() {
            release_family(&mut inner.families, &s.key.0);
        }
        gone.series.len()
    }

    /// Series stored for `agent`.
    pub fn series_count(&self, agent: &str) -> usize {
        self.lock().agents.get(agent).map_or(0, |a| a.series.len())
    }

    /// Builds the metric families (one per name), expiring stale series first.
    pub fn families(&self, now: Instant) -> Vec<proto::MetricFamily> {
        self.expire(now);
        // Snapshot under the lock (pointer copies only), build the families outside it, so a
        // scrape of a large store stalls ingest for as short as possible.
        let (agents, families, snapshot) = {
            let inner = self.lock();
            let agents: Vec<(String, String)> = inner
                .agents
                .iter()
                .map(|(id, a)| (id.clone(), a.instance.clone()))
                .collect();
            let families = inner.families.clone();
            let total = inner.agents.values().map(|a| a.series.len()).sum();
            let mut snapshot: Vec<(usize, Arc<SeriesKey>, Value, i64)> = Vec::with_capacity(total);
            for (i, agent) in inner.agents.values().enumerate() {
                for s in agent.series.iter() {
                    let at = if self.timestamps {
                        s.sample.collected_ms
                    } else {
                        0
                    };
                    snapshot.push((i, Arc::clone(&s.key), s.sample.value.clone(), at));
                }
            }
            (agents, families, snapshot)
        };
        let mut by_name: BTreeMap<String, proto::MetricFamily> = BTreeMap::new();
        {
            for (agent_index, key, value, collected_ms) in &snapshot {
                let Some((agent_id, instance)) = agents.get(*agent_index) else {
                    continue;
                };
                let (name, labels) = (&key.0, &key.1);
                let sample_value = value;
                let Some(meta) = families.get(name) else {
                    continue;
                };
                let family = by_name.entry(name.clone()).or_insert_with(|| {
                    let mut f = proto::MetricFamily::default();
                    f.set_name(name.clone());
                    f.set_help(if meta.help.is_empty() {
                        format!("{name} (from uctel agents)")
                    } else {
                        meta.help.clone()
                    });
                    f.set_field_type(match meta.kind {
                        MetricType::Counter => proto::MetricType::COUNTER,
                        MetricType::Histogram => proto::MetricType::HISTOGRAM,
                        _ => proto::MetricType::GAUGE,
                    });
                    f
                });
                let mut pairs: Vec<proto::LabelPair> = Vec::with_capacity(labels.len() + 2);
                let mut push = |n: &str, v: &str| {
                    let mut lp = proto::LabelPair::default();
                    lp.set_name(n.to_string());
                    lp.set_value(v.to_string());
                    pairs.push(lp);
                };
                push("agent", agent_id);
                push("instance", instance);
                for (n, v) in labels.iter() {
                    push(n, v);
                }
                pairs.sort_by(|a, b| a.name().cmp(b.name()));
                let mut metric = proto::Metric::from_label(pairs);
                if *collected_ms > 0 {
                    // The text encoder writes it after the value (`... 42 1700000000123`).
                    metric.set_timestamp_ms(*collected_ms);
                }
                match sample_value {
                    Value::Counter(v) => {
                        let mut c = proto::Counter::default();
                        c.set_value(*v);
                        metric.set_counter(c);
                    }
                    Value::Gauge(v) => {
                        let mut g = proto::Gauge::default();
                        g.set_value(*v);
                        metric.set_gauge(g);
                    }
                    Value::Histogram {
                        buckets,
                        count,
                        sum,
                    } => {
                        let mut h = proto::Histogram::default();
                        h.set_sample_count(*count);
                        h.set_sample_sum(*sum);
                        h.set_bucket(
                            buckets
                                .iter()
                                .map(|(ub, c)| {
                                    let mut b = proto::Bucket::default();
                                    b.set_upper_bound(*ub);
                                    b.set_cumulative_count(*c);
                                    b
                                })
                                .collect(),
                        );
                        metric.set_histogram(h);
                    }
                }
                family.mut_metric().push(metric);
            }
        }
        by_name.into_values().collect()
    }

    /// The `prometheus` collector exposing this store (register it in the registry that
    /// `/metrics` encodes).
    pub fn collector(&self) -> StoreCollector {
        StoreCollector {
            store: self.clone(),
        }
    }
}

/// Reserves `name` for `kind` or refuses.
fn claim_family(
    families: &mut HashMap<String, FamilyMeta, RandomState>,
    name: &str,
    kind: MetricType,
    help: &str,
) -> Result<(), SampleRejection> {
    if let Some(f) = families.get_mut(name) {
        if f.kind != kind {
            return Err(SampleRejection::TypeConflict);
        }
        f.refs += 1;
        return Ok(());
    }
    // A histogram `h` owns `h_bucket`, `h_sum`, `h_count`.
    let clashes = if kind == MetricType::Histogram {
        HISTOGRAM_SUFFIXES
            .iter()
            .any(|s| families.contains_key(&format!("{name}{s}")))
    } else {
        HISTOGRAM_SUFFIXES.iter().any(|s| {
            name.strip_suffix(s)
                .and_then(|base| families.get(base))
                .is_some_and(|f| f.kind == MetricType::Histogram)
        })
    };
    if clashes {
        return Err(SampleRejection::ReservedName);
    }
    families.insert(
        name.to_string(),
        FamilyMeta {
            kind,
            help: help.to_string(),
            refs: 1,
        },
    );
    Ok(())
}

fn release_family(families: &mut HashMap<String, FamilyMeta, RandomState>, name: &str) {
    if let Some(f) = families.get_mut(name) {
        f.refs = f.refs.saturating_sub(1);
        if f.refs == 0 {
            families.remove(name);
        }
    }
}

/// A `prometheus::core::Collector` over a [`SeriesStore`]. It declares no descriptors (the
/// set of names is dynamic, like a federation endpoint), so the registry does not check it
/// against other collectors; the store keeps its names out of the `uctel_collector_`
/// namespace instead.
#[derive(Clone, Debug)]
pub struct StoreCollector {
    store: SeriesStore,
}

impl Collector for StoreCollector {
    fn desc(&self) -> Vec<&Desc> {
        Vec::new()
    }

    fn collect(&self) -> Vec<proto::MetricFamily> {
        self.store.families(Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uctel_protocol::payload::{Bucket, Label};

    fn metric(name: &str, kind: MetricType, value: f64, labels: &[(&str, &str)]) -> Metric {
        Metric {
            name: name.into(),
            help: format!("help of {name}"),
            r#type: kind as i32,
            labels: labels
                .iter()
                .map(|(n, v)| Label {
                    name: (*n).into(),
                    value: (*v).into(),
                })
                .collect(),
            value,
            ..Default::default()
        }
    }

    fn render(store: &SeriesStore) -> String {
        use prometheus::Encoder;
        let mut out = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&store.families(Instant::now()), &mut out)
            .unwrap();
        String::from_utf8(out).unwrap()
    }

    /// Two batches whose records carry ids (a host collection's two series-dictionary
    /// frames) alternate at the same positions: each record goes to its own series, found
    /// by its id once stored (the table is not searched again), with its value and its
    /// frame's time; a series added clears what was noted, and it is noted again.
    #[test]
    fn records_with_ids_alternating_at_the_same_positions_go_to_their_series() {
        use uctel_protocol::borrowed::{LabelView, PushRecord};
        let s = SeriesStore::new(Duration::from_secs(60), 100);
        let ids: Vec<RecordId> = (0..4).map(|_| RecordId::fresh()).collect();
        let devices = ["eth0", "eth1", "eth2", "eth3"];
        let batch = |first: usize, value: f64, extra: bool| {
            let mut b = MetricBatchView::new();
            let records = (first..first + 2).map(|i| (ids[i], devices[i]));
            let extra = extra.then(|| (RecordId::fresh(), "lo"));
            for (id, device) in records.chain(extra) {
                b.push_record(
                    PushRecord {
                        id: Some(id),
                        name: "node_network_receive_bytes_total",
                        help: "",
                        r#type: MetricType::Counter as i32,
                        value,
                        timestamp_ms: 0,
                        count: 0,
                        sum: 0.0,
                    },
                    [LabelView {
                        name: "device",
                        value: device,
                    }],
                    [],
                );
            }
            b
        };
        let noted = |s: &SeriesStore| s.lock().agents["a"].recent.by_id.len();
        let frame_ns = |round: u64| (1_700_000_000 + round) * 1_000_000_000;
        for round in 0..3u64 {
            for first in [0, 2] {
                let v = (round * 10 + first as u64) as f64;
                let out = s.ingest_views_at(
                    "a",
                    "h",
                    &batch(first, v, false),
                    frame_ns(round),
                    Instant::now(),
                );
                assert_eq!(out.stored, 2, "{out:?}");
            }
        }
        assert_eq!(s.series_count("a"), 4);
        assert_eq!(noted(&s), 4, "every id is noted");
        let text = render(&s);
        for (i, device) in devices.iter().enumerate() {
            let v = 20 + if i < 2 { 0 } else { 2 };
            let line = format!(
                "node_network_receive_bytes_total{{agent=\"a\",device=\"{device}\",instance=\"h\"}} {v} {}",
                frame_ns(2) / 1_000_000
            );
            assert!(text.contains(&line), "{line} in {text}");
        }
        // A new series moves the table: what was noted is cleared, then noted again.
        s.ingest_views_at("a", "h", &batch(0, 30.0, true), frame_ns(3), Instant::now());
        assert_eq!(s.series_count("a"), 5);
        assert_eq!(noted(&s), 1, "only the new series, noted after the move");
        s.ingest_views_at(
            "a",
            "h",
            &batch(2, 32.0, false),
            frame_ns(3),
            Instant::now(),
        );
        s.ingest_views_at(
            "a",
            "h",
            &batch(0, 40.0, false),
            frame_ns(4),
            Instant::now(),
        );
        assert_eq!(noted(&s), 5);
        let text = render(&s);
        assert!(
            text.contains("device=\"eth0\",instance=\"h\"} 40 "),
            "{text}"
        );
        assert!(
            text.contains("device=\"eth2\",instance=\"h\"} 32 "),
            "{text}"
        );
        assert!(text.contains("device=\"lo\",instance=\"h\"} 30 "), "{text}");
    }

    /// A batch of `node_network_receive_bytes_total` counters (value 1), one per device of
    /// `devices`, each with the id of `ids` at its position.
    fn counters_with_ids(ids: &[RecordId], devices: &[&'static str]) -> MetricBatchView<'static> {
        use uctel_protocol::borrowed::{LabelView, PushRecord};
        let mut b = MetricBatchView::new();
        for (id, device) in ids.iter().zip(devices) {
            b.push_record(
                PushRecord {
                    id: Some(*id),
                    name: "node_network_receive_bytes_total",
                    help: "",
                    r#type: MetricType::Counter as i32,
                    value: 1.0,
                    timestamp_ms: 0,
                    count: 0,
                    sum: 0.0,
                },
                [LabelView {
                    name: "device",
                    value: device,
                }],
                [],
            );
        }
        b
    }

    /// Values by id ([`SeriesStore::ingest_known`]): stored in the series their ids went
    /// to, with their own or their frame's time, a type conflict counted; `None` and
    /// nothing stored for an id not noted, a stale marker, a histogram or an agent not seen.
    #[test]
    fn known_values_go_to_their_series_all_or_nothing() {
        let s = SeriesStore::new(Duration::from_secs(60), 100);
        let ids: Vec<RecordId> = (0..2).map(|_| RecordId::fresh()).collect();
        let b = counters_with_ids(&ids, &["eth0", "eth1"]);
        // Twice: a series added clears what was noted, so the second batch notes both.
        for _ in 0..2 {
            assert_eq!(s.ingest_views_at("a", "h", &b, 0, Instant::now()).stored, 2);
        }
        let v = |id, kind: MetricType, value, timestamp_ms| KnownValue {
            id,
            entry: 0,
            r#type: kind as i32,
            value,
            timestamp_ms,
        };
        let frame_ns = 1_700_000_000_000_000_000;
        let stored = |agent: &str, values: &[KnownValue]| {
            s.ingest_known(agent, "h", values, frame_ns, Instant::now())
        };
        let (counter, gauge) = (MetricType::Counter, MetricType::Gauge);
        let before = render(&s);
        let stale = f64::from_bits(STALE_NAN_BITS);
        for values in [
            vec![
                v(ids[0], counter, 5.0, 0),
                v(RecordId::fresh(), counter, 6.0, 0),
            ],
            vec![v(ids[0], counter, 5.0, 0), v(ids[1], counter, stale, 0)],
            vec![v(ids[0], MetricType::Histogram, 5.0, 0)],
        ] {
            assert_eq!(stored("a", &values), None, "{values:?}");
        }
        assert_eq!(stored("b", &[v(ids[0], counter, 5.0, 0)]), None);
        assert_eq!(render(&s), before, "nothing stored");
        let out = stored(
            "a",
            &[
                v(ids[0], counter, 5.0, 0),
                v(ids[1], gauge, 6.0, 0),
                v(ids[1], counter, 7.0, 1_700_000_000_500),
            ],
        )
        .unwrap();
        assert_eq!(
            (out.stored, out.rejected(SampleRejection::TypeConflict)),
            (2, 1)
        );
        let text = render(&s);
        for line in [
            "device=\"eth0\",instance=\"h\"} 5 1700000000000",
            "device=\"eth1\",instance=\"h\"} 7 1700000000500",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
    }

    /// Dictionary values are found again by their dictionary id (`Recent::by_entry`), and
    /// an index noted for one entry never sends another entry's value, or the same index
    /// under another id (a new epoch's dictionary), to the wrong series.
    #[test]
    fn known_values_by_dictionary_id_follow_their_ids() {
        let s = SeriesStore::new(Duration::from_secs(60), 100);
        let batch = counters_with_ids;
        let known = |id, entry, value| KnownValue {
            id,
            entry,
            r#type: MetricType::Counter as i32,
            value,
            timestamp_ms: 0,
        };
        let value_of = |device: &str| {
            let text = render(&s);
            let line = text
                .lines()
                .find(|l| l.contains(&format!("device=\"{device}\"")))
                .unwrap_or_else(|| panic!("{device} in {text}"))
                .to_owned();
            line.split(' ').nth(1).unwrap().parse::<f64>().unwrap()
        };
        let one: Vec<RecordId> = (0..2).map(|_| RecordId::fresh()).collect();
        for _ in 0..2 {
            s.ingest_views_at("a", "h", &batch(&one, &["eth0", "eth1"]), 0, Instant::now());
        }
        // Entry 0 is eth0, entry 1 eth1; the frame lists them the other way round, so the
        // first look-up goes by id and notes the entries, the next ones by entry.
        for round in [10.0, 20.0] {
            let values = [known(one[1], 1, round + 1.0), known(one[0], 0, round)];
            let out = s
                .ingest_known("a", "h", &values, 0, Instant::now())
                .unwrap();
            assert_eq!(out.stored, 2);
            assert_eq!((value_of("eth0"), value_of("eth1")), (round, round + 1.0));
        }
        // A new epoch's dictionary: the same series under new ids and swapped entries.
        let two: Vec<RecordId> = (0..2).map(|_| RecordId::fresh()).collect();
        s.ingest_views_at("a", "h", &batch(&two, &["eth1", "eth0"]), 0, Instant::now());
        let values = [known(two[0], 0, 31.0), known(two[1], 1, 30.0)];
        let out = s
            .ingest_known("a", "h", &values, 0, Instant::now())
            .unwrap();
        assert_eq!(out.stored, 2);
        assert_eq!((value_of("eth0"), value_of("eth1")), (30.0, 31.0));
        // The first epoch's index for entry 0 is not taken for an id never stored.
        let stranger = [known(RecordId::fresh(), 0, 99.0)];
        assert_eq!(s.ingest_known("a", "h", &stranger, 0, Instant::now()), None);
        assert_eq!((value_of("eth0"), value_of("eth1")), (30.0, 31.0));
    }

    #[test]
    fn adds_agent_and_instance_and_renames_clashes() {
        let s = SeriesStore::new(Duration::from_secs(60), 100);
        let now = Instant::now();
        let m = metric(
            "node_load1",
            MetricType::Gauge,
            0.5,
            &[("instance", "orig"), ("agent", "x"), ("job", "node")],
        );
        assert_eq!(s.ingest("web-1", "web-1.example", &[m], now).stored, 1);
        let text = render(&s);
        assert!(
            text.contains(
                "node_load1{agent=\"web-1\",exported_agent=\"x\",exported_instance=\"orig\",instance=\"web-1.example\",job=\"node\"} 0.5"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_stale_marker_removes_its_series_at_once_and_nothing_else() {
        let s = SeriesStore::new(Duration::from_secs(3600), 100);
        let now = Instant::now();
        let job = |id: &str, v: f64| {
            metric(
                "uctel_job_info",
                MetricType::Gauge,
                v,
                &[("job_id", id), ("user", "alice")],
            )
        };
        let stale = f64::from_bits(STALE_NAN_BITS);
        s.ingest("a", "h", &[job("1", 1.0), job("2", 1.0)], now);
        assert_eq!(s.series_count("a"), 2);
        // Job 1 ended: its series leaves at once, job 2's stays.
        assert_eq!(
            s.ingest("a", "h", &[job("1", stale), job("2", 1.0)], now)
                .stored,
            2
        );
        assert_eq!(s.series_count("a"), 1);
        let text = render(&s);
        assert!(!text.contains("job_id=\"1\""), "{text}");
        assert!(text.contains("job_id=\"2\""), "{text}");
        // A marker for a series not stored (or a repeated one) creates nothing.
        s.ingest("a", "h", &[job("1", stale), job("3", stale)], now);
        assert_eq!(s.series_count("a"), 1);
        // Any other NaN is a value, stored as such.
        s.ingest("a", "h", &[job("4", f64::NAN)], now);
        assert_eq!(s.series_count("a"), 2);
        // The last series of a family gone: the family (HELP/TYPE) goes too.
        s.ingest("a", "h", &[job("2", stale), job("4", stale)], now);
        assert!(!render(&s).contains("uctel_job_info"));
    }

    #[test]
    fn one_family_per_name_across_agents() {
        let s = SeriesStore::new(Duration::from_secs(60), 100);
        let now = Instant::now();
        let c = |v| {
            metric(
                "node_cpu_seconds_total",
                MetricType::Counter,
                v,
                &[("cpu", "0")],
            )
        };
        s.ingest("a", "ha", &[c(1.0)], now);
        s.ingest("b", "hb", &[c(2.0)], now);
        let text = render(&s);
        assert_eq!(
            text.matches("# TYPE node_cpu_seconds_total counter")
                .count(),
            1,
            "{text}"
        );
        assert_eq!(
            text.matches("# HELP node_cpu_seconds_total").count(),
            1,
            "{text}"
        );
        assert!(text.contains("node_cpu_seconds_total{agent=\"a\",cpu=\"0\",instance=\"ha\"} 1"));
        assert!(text.contains("node_cpu_seconds_total{agent=\"b\",cpu=\"0\",instance=\"hb\"} 2"));
    }

    #[test]
    fn latest_value_wins_and_counter_resets_are_kept() {
        let s = SeriesStore::new(Duration::from_secs(60), 100);
        let now = Instant::now();
        let c = |v| metric("x_total", MetricType::Counter, v, &[]);
        s.ingest("a", "h", &[c(10.0)], now);
        s.ingest("a", "h", &[c(3.0)], now); // agent restarted: a counter reset
        let text = render(&s);
        assert!(
            text.contains("x_total{agent=\"a\",instance=\"h\"} 3"),
            "{text}"
        );
        assert_eq!(s.series_count("a"), 1);
    }

    #[test]
    fn staleness_expires_series() {
        let s = SeriesStore::new(Duration::from_secs(10), 100);
        let t0 = Instant::now();
        s.ingest("a", "h", &[metric("old", MetricType::Gauge, 1.0, &[])], t0);
        s.ingest(
            "a",
            "h",
            &[metric("fresh", MetricType::Gauge, 1.0, &[])],
            t0 + Duration::from_secs(8),
        );
        assert_eq!(s.expire(t0 + Duration::from_secs(9)), 0);
        assert_eq!(s.expire(t0 + Duration::from_secs(11)), 1);
        assert_eq!(s.series_count("a"), 1);
        // The name is free again: another type may now use it.
        let out = s.ingest(
            "b",
            "h",
            &[metric("old", MetricType::Counter, 1.0, &[])],
            t0 + Duration::from_secs(11),
        );
        assert_eq!(out.stored, 1);
    }

    #[test]
    fn series_cap_counts_excess_and_allows_updates() {
        let s = SeriesStore::new(Duration::from_secs(60), 2);
        let now = Instant::now();
        let g = |n: &str, v| metric(n, MetricType::Gauge, v, &[]);
        let out = s.ingest("a", "h", &[g("m1", 1.0), g("m2", 1.0), g("m3", 1.0)], now);
        assert_eq!(out.stored, 2);
        assert_eq!(out.rejected(SampleRejection::SeriesCap), 1);
        let out = s.ingest("a", "h", &[g("m1", 5.0)], now);
        assert_eq!(out.stored, 1);
        // Another agent has its own cap.
        assert_eq!(s.ingest("b", "h", &[g("m3", 1.0)], now).stored, 1);
    }

    #[test]
    fn a_cap_set_live_holds_for_every_clone_and_refuses_new_series_only() {
        let s = SeriesStore::new(Duration::from_secs(60), 2);
        let other = s.clone();
        let now = Instant::now();
        let g = |n: &str, v| metric(n, MetricType::Gauge, v, &[]);
        assert_eq!(
            s.ingest("a", "h", &[g("m1", 1.0), g("m2", 1.0)], now)
                .stored,
            2
        );
        other.set_cap_per_agent(3);
        let out = s.ingest("a", "h", &[g("m3", 1.0), g("m4", 1.0)], now);
        assert_eq!(out.stored, 1);
        assert_eq!(out.rejected(SampleRejection::SeriesCap), 1);
        // Lowered below what is held: the held series stay and update, no new one.
        s.set_cap_per_agent(1);
        let out = s.ingest("a", "h", &[g("m1", 2.0), g("m5", 1.0)], now);
        assert_eq!(out.stored, 1);
        assert_eq!(out.rejected(SampleRejection::SeriesCap), 1);
        assert_eq!(s.series_count("a"), 3);
    }

    #[test]
    fn type_conflicts_and_reserved_names_rejected() {
        let s = SeriesStore::new(Duration::from_secs(60), 100);
        let now = Instant::now();
        s.ingest("a", "h", &[metric("m", MetricType::Gauge, 1.0, &[])], now);
        let out = s.ingest("b", "h", &[metric("m", MetricType::Counter, 1.0, &[])], now);
        assert_eq!(out.rejected(SampleRejection::TypeConflict), 1);
        let out = s.ingest(
            "a",
            "h",
            &[metric(
                "uctel_collector_frames_received_total",
                MetricType::Counter,
                1.0,
                &[],
            )],
            now,
        );
        assert_eq!(out.rejected(SampleRejection::ReservedName), 1);
        let mut h = metric("lat", MetricType::Histogram, 0.0, &[]);
        h.count = 1;
        s.ingest("a", "h", &[h], now);
        let out = s.ingest(
            "a",
            "h",
            &[metric("lat_count", MetricType::Gauge, 1.0, &[])],
            now,
        );
        assert_eq!(out.rejected(SampleRejection::ReservedName), 1);
        let out = s.ingest(
            "a",
            "h",
            &[metric("bad-name", MetricType::Gauge, 1.0, &[])],
            now,
        );
        assert_eq!(out.rejected(SampleRejection::Invalid), 1);
    }

    #[test]
    fn histograms_expose_bucket_sum_count() {
        let s = SeriesStore::new(Duration::from_secs(60), 100);
        let mut h = metric("req_seconds", MetricType::Histogram, 0.0, &[("path", "/")]);
        h.buckets = vec![
            Bucket {
                upper_bound: 0.1,
                cumulative_count: 2,
            },
            Bucket {
                upper_bound: 1.0,
                cumulative_count: 5,
            },
            Bucket {
                upper_bound: f64::INFINITY,
                cumulative_count: 6,
            },
        ];
        h.count = 6;
        h.sum = 3.5;
        s.ingest("a", "h", &[h], Instant::now());
        let text = render(&s);
        assert!(text.contains("# TYPE req_seconds histogram"), "{text}");
        assert!(
            text.contains("req_seconds_bucket{agent=\"a\",instance=\"h\",path=\"/\",le=\"0.1\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("req_seconds_bucket{agent=\"a\",instance=\"h\",path=\"/\",le=\"1\"} 5"),
            "{text}"
        );
        assert_eq!(text.matches("le=\"+Inf\"").count(), 1, "{text}");
        assert!(!text.contains("le=\"inf\""), "{text}");
        assert!(
            text.contains("req_seconds_sum{agent=\"a\",instance=\"h\",path=\"/\"} 3.5"),
            "{text}"
        );
        assert!(
            text.contains("req_seconds_count{agent=\"a\",instance=\"h\",path=\"/\"} 6"),
            "{text}"
        );
    }

    #[test]
    fn repeated_records_go_to_their_series_as_the_store_changes() {
        use uctel_protocol::limits::Limits;
        use uctel_protocol::payload::{encode_metric_batch, MetricBatch};
        let s = SeriesStore::new(Duration::from_secs(10), 100);
        let t0 = Instant::now();
        let limits = Limits::default();
        let mut reused: MetricBatchView<'static> = MetricBatchView::new();
        let mut send = |metrics: Vec<Metric>, at: Instant| {
            let payload = encode_metric_batch(&MetricBatch { metrics });
            let mut view = std::mem::take(&mut reused).recycle();
            view.decode_into(&payload, &limits).unwrap();
            let out = s.ingest_views("a", "h", &view, at);
            reused = view.recycle();
            out
        };
        let g = |n: &str, v, l: &str| metric(n, MetricType::Gauge, v, &[("k", l)]);
        let frame = |v: f64| vec![g("m", v, "x"), g("m", v + 1.0, "y")];
        for i in 0..3 {
            assert_eq!(send(frame(f64::from(i)), t0).stored, 2);
        }
        let text = render(&s);
        assert!(
            text.contains("m{agent=\"a\",instance=\"h\",k=\"x\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("m{agent=\"a\",instance=\"h\",k=\"y\"} 3"),
            "{text}"
        );
        // New series (the table may move the others), then the same records again.
        let mut more = frame(10.0);
        more.extend((0..40).map(|i| g("n", 1.0, &i.to_string())));
        assert_eq!(send(more, t0).stored, 42);
        assert_eq!(send(frame(20.0), t0).stored, 2);
        assert_eq!(send(frame(30.0), t0).stored, 2);
        let text = render(&s);
        assert!(
            text.contains("m{agent=\"a\",instance=\"h\",k=\"x\"} 30"),
            "{text}"
        );
        assert!(
            text.contains("m{agent=\"a\",instance=\"h\",k=\"y\"} 31"),
            "{text}"
        );
        assert_eq!(s.series_count("a"), 42);
        // Everything expired: the same records make new series.
        assert_eq!(s.expire(t0 + Duration::from_secs(11)), 42);
        let later = t0 + Duration::from_secs(12);
        assert_eq!(send(frame(40.0), later).stored, 2);
        assert_eq!(send(frame(50.0), later).stored, 2);
        assert_eq!(s.series_count("a"), 2);
        let text = render(&s);
        assert!(
            text.contains("m{agent=\"a\",instance=\"h\",k=\"x\"} 50"),
            "{text}"
        );
        // Some expired: the others keep their values.
        assert_eq!(send(vec![g("o", 1.0, "z")], later).stored, 1);
        assert_eq!(s.expire(later + Duration::from_secs(9)), 0);
        assert_eq!(send(frame(60.0), later + Duration::from_secs(9)).stored, 2);
        assert_eq!(s.expire(later + Duration::from_secs(11)), 1);
        assert_eq!(send(frame(70.0), later + Duration::from_secs(11)).stored, 2);
        let text = render(&s);
        assert!(
            text.contains("m{agent=\"a\",instance=\"h\",k=\"y\"} 71"),
            "{text}"
        );
        assert!(!text.contains("o{"), "{text}");
    }

    proptest::proptest! {
        /// Any sequence of batches (the same records again, a type conflict, new series
        /// that move the others, expiry) leaves a store fed with borrowed views, whose
        /// repeated payloads take the ids-and-values path, in the state of a store fed the
        /// same batches owned, with the same outcome for every batch.
        #[test]
        fn repeated_payloads_store_what_owned_batches_store(
            ops in proptest::collection::vec((0usize..5, proptest::bool::weighted(0.15)), 1..60),
        ) {
            use uctel_protocol::limits::Limits;
            use uctel_protocol::payload::{encode_metric_batch, MetricBatch};
            let fast = SeriesStore::new(Duration::from_secs(10), 100);
            let owned = SeriesStore::new(Duration::from_secs(10), 100);
            let limits = Limits::default();
            let mut reused: MetricBatchView<'static> = MetricBatchView::new();
            let mut at = Instant::now();
            let mut repeats = 0usize;
            for (step, (pick, expire)) in ops.into_iter().enumerate() {
                let v = step as f64;
                let g = |n: &str, v, l: &str| metric(n, MetricType::Gauge, v, &[("k", l)]);
                let metrics = match pick {
                    0 | 1 => vec![g("m", v, "x"), g("m", v + 1.0, "y")],
                    // The records of 0 and 1 again, one of them a stale marker: repeated
                    // after 0 or 1, and the marker ends its series on both paths.
                    4 => vec![g("m", v, "x"), g("m", f64::from_bits(STALE_NAN_BITS), "y")],
                    // The same name as a counter: a type conflict with the gauge.
                    2 => vec![
                        metric("m", MetricType::Counter, v, &[("k", "x")]),
                        metric("u", MetricType::Untyped, v, &[("k", "z")]),
                    ],
                    _ => {
                        let mut m = vec![g("m", v, "x"), g("m", v + 1.0, "y")];
                        m.extend((0..20).map(|i| g("n", v, &i.to_string())));
                        m
                    }
                };
                if expire {
                    at += Duration::from_secs(11);
                    proptest::prop_assert_eq!(fast.expire(at), owned.expire(at));
                }
                let payload = encode_metric_batch(&MetricBatch { metrics: metrics.clone() });
                let mut view = std::mem::take(&mut reused).recycle();
                view.decode_into(&payload, &limits).unwrap();
                repeats += usize::from(view.repeated().is_some());
                let a = fast.ingest_views("a", "h", &view, at);
                reused = view.recycle();
                let b = owned.ingest("a", "h", &metrics, at);
                proptest::prop_assert_eq!(&a, &b);
                // Series come out in hash order, seeded per store.
                let lines = |s: &SeriesStore| {
                    let mut l: Vec<String> = render(s).lines().map(str::to_owned).collect();
                    l.sort_unstable();
                    l
                };
                proptest::prop_assert_eq!(lines(&fast), lines(&owned));
            }
            // Consecutive picks of 0 and 1 are the same records: most runs repeat.
            proptest::prop_assume!(repeats > 0);
        }
    }

    #[test]
    fn a_repeated_payload_is_stored_from_ids_and_values() {
        use uctel_protocol::limits::Limits;
        use uctel_protocol::payload::{encode_metric_batch, MetricBatch};
        let s = SeriesStore::new(Duration::from_secs(10), 100);
        let limits = Limits::default();
        let g = |v| metric("m", MetricType::Gauge, v, &[("k", "x")]);
        let mut reused: MetricBatchView<'static> = MetricBatchView::new();
        for v in [1.0, 2.0, 3.0] {
            let payload = encode_metric_batch(&MetricBatch {
                metrics: vec![g(v)],
            });
            let mut view = std::mem::take(&mut reused).recycle();
            view.decode_into(&payload, &limits).unwrap();
            // The third payload repeats the second (both after the first remembered it).
            assert_eq!(view.repeated().is_some(), v > 1.0, "payload {v}");
            if v > 1.0 {
                let out = s.ingest_repeated("a", "h", &view, 0, Instant::now());
                assert_eq!(out.map(|o| o.stored), Some(1));
            } else {
                assert_eq!(s.ingest_views("a", "h", &view, Instant::now()).stored, 1);
            }
            reused = view.recycle();
        }
        assert!(render(&s).contains("m{agent=\"a\",instance=\"h\",k=\"x\"} 3"));
    }

    /// Stores `metrics` as the worker does (a borrowed view of their encoding) from a frame
    /// stamped `frame_ns`, reusing `reused` so that a payload repeating the previous one
    /// takes the ids-and-values path.
    fn ingest_frame(
        s: &SeriesStore,
        reused: &mut MetricBatchView<'static>,
        metrics: Vec<Metric>,
        frame_ns: u64,
    ) -> (IngestOutcome, bool) {
        use uctel_protocol::limits::Limits;
        use uctel_protocol::payload::{encode_metric_batch, MetricBatch};
        let payload = encode_metric_batch(&MetricBatch { metrics });
        let mut view = std::mem::take(reused).recycle();
        view.decode_into(&payload, &Limits::default()).unwrap();
        let repeated = view.repeated().is_some();
        let out = s.ingest_views_at("a", "h", &view, frame_ns, Instant::now());
        *reused = view.recycle();
        (out, repeated)
    }

    #[test]
    fn samples_are_exposed_with_their_collection_time() {
        let s = SeriesStore::new(Duration::from_secs(60), 100);
        let mut reused = MetricBatchView::new();
        let g = |v| metric("m", MetricType::Gauge, v, &[("k", "x")]);
        let mut own = metric("o", MetricType::Counter, 7.0, &[]);
        own.timestamp_ms = 1_600_000_000_000;
        // The frame's time (ns) in ms for records without their own; the record's own kept.
        let frame = |v| vec![g(v), own.clone()];
        ingest_frame(&s, &mut reused, frame(1.0), 1_700_000_000_123_456_789);
        let text = render(&s);
        assert!(
            text.contains("m{agent=\"a\",instance=\"h\",k=\"x\"} 1 1700000000123\n"),
            "{text}"
        );
        assert!(
            text.contains("o{agent=\"a\",instance=\"h\"} 7 1600000000000\n"),
            "{text}"
        );
        // The same records again (the ids-and-values path): the frame's time moves on.
        ingest_frame(&s, &mut reused, frame(2.0), 1_700_000_010_000_000_000);
        let (out, repeated) = ingest_frame(&s, &mut reused, frame(3.0), 1_700_000_020_000_000_000);
        assert!(repeated);
        assert_eq!(out.stored, 2);
        let text = render(&s);
        assert!(
            text.contains("m{agent=\"a\",instance=\"h\",k=\"x\"} 3 1700000020000\n"),
            "{text}"
        );
        assert!(
            text.contains("o{agent=\"a\",instance=\"h\"} 7 1600000000000\n"),
            "{text}"
        );
        // Switched off: Prometheus stamps at scrape time.
        let off = s.clone().with_timestamps(false);
        let text = render(&off);
        assert!(
            text.contains("m{agent=\"a\",instance=\"h\",k=\"x\"} 3\n"),
            "{text}"
        );
        // Unknown time (no frame time, no own time): no timestamp.
        let t = SeriesStore::new(Duration::from_secs(60), 100);
        t.ingest("a", "h", &[g(5.0)], Instant::now());
        assert!(render(&t).contains("m{agent=\"a\",instance=\"h\",k=\"x\"} 5\n"));
    }

    #[test]
    fn histograms_carry_the_collection_time_on_every_line() {
        let s = SeriesStore::new(Duration::from_secs(60), 100);
        let mut h = metric("lat", MetricType::Histogram, 0.0, &[]);
        h.buckets = vec![Bucket {
            upper_bound: 1.0,
            cumulative_count: 2,
        }];
        h.count = 3;
        h.sum = 1.5;
        h.timestamp_ms = 1_700_000_000_500;
        s.ingest("a", "h", &[h], Instant::now());
        let text = render(&s);
        let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("lat_")).collect();
        assert_eq!(lines.len(), 4, "{text}");
        for line in lines {
            assert!(line.ends_with(" 1700000000500"), "{line}");
        }
    }

    #[test]
    fn a_gone_agent_loses_every_series_at_once() {
        let s = SeriesStore::new(Duration::from_secs(300), 100);
        let now = Instant::now();
        let g = |n: &str| metric(n, MetricType::Gauge, 1.0, &[]);
        s.ingest("a", "ha", &[g("node_load1"), g("only_a")], now);
        s.ingest("b", "hb", &[g("node_load1")], now);
        assert_eq!(s.remove_agent("a"), 2);
        assert_eq!(s.remove_agent("a"), 0);
        assert_eq!(s.series_count("a"), 0);
        let text = render(&s);
        assert!(!text.contains("agent=\"a\""), "{text}");
        assert!(!text.contains("only_a"), "{text}");
        assert!(
            text.contains("node_load1{agent=\"b\",instance=\"hb\"} 1"),
            "{text}"
        );
        // Its names are free again (released families): another type may use them.
        let out = s.ingest(
            "b",
            "hb",
            &[metric("only_a", MetricType::Counter, 1.0, &[])],
            now,
        );
        assert_eq!(out.stored, 1);
        // The agent coming back starts afresh.
        assert_eq!(s.ingest("a", "ha", &[g("node_load1")], now).stored, 1);
        assert_eq!(s.series_count("a"), 1);
    }

    #[test]
    fn collector_registers_next_to_self_metrics() {
        let registry = prometheus::Registry::new();
        let s = SeriesStore::new(Duration::from_secs(60), 100);
        registry.register(Box::new(s.collector())).unwrap();
        s.ingest(
            "a",
            "h",
            &[metric("up_like", MetricType::Gauge, 1.0, &[])],
            Instant::now(),
        );
        let text =
            String::from_utf8(uctel_common::http::encode_registry(&registry).unwrap()).unwrap();
        assert!(
            text.contains("up_like{agent=\"a\",instance=\"h\"} 1"),
            "{text}"
        );
    }

    #[test]
    fn untyped_samples_are_exposed_as_gauges() {
        // The prometheus crate's text encoder has no `untyped` (0.14 panics with
        // `unimplemented!` on one), so an untyped sample is exposed as a gauge, which is how
        // Prometheus stores and queries untyped samples anyway.
        let s = SeriesStore::new(Duration::from_secs(60), 100);
        s.ingest(
            "a",
            "h",
            &[metric(
                "cron_runs",
                MetricType::Untyped,
                12.0,
                &[("job", "backup")],
            )],
            Instant::now(),
        );
        let text = render(&s);
        assert!(text.contains("# TYPE cron_runs gauge"), "{text}");
        assert!(
            text.contains("cron_runs{agent=\"a\",instance=\"h\",job=\"backup\"} 12"),
            "{text}"
        );
    }
}
