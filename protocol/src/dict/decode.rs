//! The receiving side of the series dictionary: [`SeriesDict`], one per stream and epoch.

use crate::borrowed::{LabelView, MetricBatchView, PushRecord, RecordId};
use crate::limits::Limits;
use crate::payload::{Bucket, Label, Metric, MetricType, PayloadError};

use super::{
    frame_ms, next_id, parse, scalar, Definition, DictError, Operand, Parsed, Reader, ValueRecord,
    DICT_BODY_VERSION, HAS_TIMESTAMP, MAX_DICT_ENTRIES, OP_DEF, OP_HIST,
};

/// One dictionary entry (an owned [`Definition`]).
#[derive(Clone, Debug, PartialEq)]
struct Entry {
    name: String,
    help: String,
    r#type: i32,
    labels: Vec<Label>,
    buckets: Vec<Bucket>,
    /// Names the entry for the series store's by-position path (not for histograms).
    record_id: Option<RecordId>,
}

impl Entry {
    fn same_as(&self, d: &Definition<'_>) -> bool {
        self.name == d.name
            && self.help == d.help
            && self.r#type == d.r#type
            && self.labels.len() == d.labels.len()
            && self
                .labels
                .iter()
                .zip(&d.labels)
                .all(|(a, b)| a.name == b.name && a.value == b.value)
            && self.buckets.len() == d.buckets.len()
            && self
                .buckets
                .iter()
                .zip(&d.buckets)
                .all(|(a, b)| a.upper_bound.to_bits() == b.upper_bound.to_bits())
    }
}

/// One value of a series the dictionary holds ([`SeriesDict::decode_known`]): what the
/// series store needs to update the series it stored before under the same id, without
/// the series' name or labels.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KnownValue {
    /// The entry's [`RecordId`]: the same for every value of the series in the epoch, and
    /// the id [`SeriesDict::decode_into`] gives its records.
    pub id: RecordId,
    /// The entry's dictionary id (its index in the agent's dictionary for the epoch: small
    /// and dense, so a reader may index a table by it; [`KnownValue::id`] tells whether
    /// what it noted there is still this entry).
    pub entry: u32,
    /// The entry's [`MetricType`] value: a counter, gauge or untyped series, never a
    /// histogram.
    pub r#type: i32,
    /// The sample's value.
    pub value: f64,
    /// The sample's own timestamp, ms since the Unix epoch; 0: the frame's
    /// (`Metric::timestamp_ms`).
    pub timestamp_ms: i64,
}

/// What a value's series is: an entry of the dictionary or a definition of the frame.
enum Series<'a, 'd> {
    Known(&'a Entry),
    Local(&'d Definition<'a>),
}

/// The series dictionary of one stream in one epoch, as the collector holds it: every
/// definition received (ids below [`MAX_DICT_ENTRIES`]), never forgotten or changed within
/// the epoch, and the acknowledgment it supports ("every id below `known_up_to` is known").
///
/// Memory: one pointer per id up to the highest id received, plus the definitions.
#[derive(Debug, Default)]
pub struct SeriesDict {
    entries: Vec<Option<Box<Entry>>>,
    known_up_to: u32,
    acked: u32,
    values: Vec<ValueRecord>,
    counts: Vec<u64>,
}

impl SeriesDict {
    /// An empty dictionary (a new epoch).
    pub fn new() -> SeriesDict {
        SeriesDict::default()
    }

    /// Every id below this is known (the contiguous prefix of received definitions).
    pub fn known_up_to(&self) -> u32 {
        self.known_up_to
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.iter().filter(|e| e.is_some()).count()
    }

    /// True when no entry is held.
    pub fn is_empty(&self) -> bool {
        self.known_up_to == 0 && self.entries.iter().all(Option::is_none)
    }

    /// The acknowledgment to send, once per advance: `Some(known_up_to)` when it moved past
    /// what was last taken, `None` otherwise.
    pub fn take_ack(&mut self) -> Option<u32> {
        (self.known_up_to > self.acked).then(|| {
            self.acked = self.known_up_to;
            self.known_up_to
        })
    }

    /// Decodes the dictionary body `body` of a frame stamped `frame_timestamp_ns` into
    /// `batch` (replacing what it held): the frame's definitions are checked against the
    /// dictionary and added to it, then every value record becomes a record of `batch`
    /// under its series' name, labels, type and help, in body order.
    ///
    /// Nothing changes unless the whole body is valid: a body that fails leaves the
    /// dictionary and `batch` (empty) as they were, so a frame is delivered whole or not at
    /// all.
    ///
    /// # Errors
    /// [`PayloadError::Dictionary`] for a malformed body, a value of an id neither defined
    /// in the frame nor known ([`DictError::UnknownSeries`]), a definition that differs
    /// from the known one ([`DictError::Conflict`]), a histogram value that does not match
    /// its definition; [`PayloadError::Record`] for an invalid definition;
    /// [`PayloadError::Batch`] for a bound of `limits`.
    pub fn decode_into<'a>(
        &'a mut self,
        body: &'a [u8],
        frame_timestamp_ns: u64,
        limits: &Limits,
        batch: &mut MetricBatchView<'a>,
    ) -> Result<(), PayloadError> {
        batch.clear_for_push();
        let SeriesDict {
            entries,
            known_up_to,
            values,
            counts,
            ..
        } = self;
        let mut defs = Vec::new();
        parse(
            body,
            frame_timestamp_ns,
            limits,
            Parsed {
                defs: &mut defs,
                values,
                counts,
            },
        )?;
        check(entries, &defs, values, counts)?;
        for (id, def) in &defs {
            let slot = *id as usize;
            if *id >= MAX_DICT_ENTRIES || entries.get(slot).is_some_and(Option::is_some) {
                continue;
            }
            if entries.len() <= slot {
                entries.resize_with(slot + 1, || None);
            }
            entries[slot] = Some(Box::new(Entry {
                name: def.name.to_owned(),
                help: def.help.to_owned(),
                r#type: def.r#type,
                labels: def.owned_labels(),
                buckets: def.buckets.clone(),
                record_id: (!def.is_histogram()).then(RecordId::fresh),
            }));
        }
        while entries
            .get(*known_up_to as usize)
            .is_some_and(Option::is_some)
        {
            *known_up_to += 1;
        }
        let entries: &'a [Option<Box<Entry>>] = entries;
        for v in values.iter() {
            let series = lookup(entries, &defs, v.id);
            push(batch, series, v, counts);
        }
        Ok(())
    }
}

impl SeriesDict {
    /// The values of `body` (a dictionary body of a frame stamped `frame_timestamp_ns`)
    /// into `out`, in body order, replacing what it held, when the body carries nothing
    /// but values of counters, gauges and untyped series this dictionary holds: the steady
    /// state once the definitions are acknowledged. Read in one pass, no record view
    /// built; the dictionary is not changed.
    ///
    /// Returns `false`, with `out` empty, for any other body: a definition, an id the
    /// dictionary does not hold, a histogram value, or a body that
    /// [`SeriesDict::decode_into`] refuses (malformed, over a bound of `limits`). Such a
    /// frame takes [`SeriesDict::decode_into`], which says why it fails. For a body it
    /// takes, `out` holds what [`SeriesDict::decode_into`] would give: the same values and
    /// timestamps in the same order, each under its entry's [`RecordId`].
    pub fn decode_known(
        &self,
        body: &[u8],
        frame_timestamp_ns: u64,
        limits: &Limits,
        out: &mut Vec<KnownValue>,
    ) -> bool {
        out.clear();
        let read = self.read_known(body, frame_timestamp_ns, limits, out);
        if read.is_none() {
            out.clear();
        }
        read.is_some()
    }

    /// [`SeriesDict::decode_known`]'s pass: `None` at the first record it does not take.
    fn read_known(
        &self,
        body: &[u8],
        frame_timestamp_ns: u64,
        limits: &Limits,
        out: &mut Vec<KnownValue>,
    ) -> Option<()> {
        let framed = body.len().saturating_add(crate::frame::HEADER_LEN);
        limits
            .check(crate::limits::Limit::FrameBytes, framed)
            .ok()?;
        let mut r = Reader::new(body);
        if r.byte().ok()? != DICT_BODY_VERSION {
            return None;
        }
        let base = frame_ms(frame_timestamp_ns);
        let mut previous: i64 = -1;
        while !r.is_empty() {
            let key = r.varint().ok()?;
            let id = next_id(previous, key)?;
            previous = i64::from(id);
            let flags = (key & 0xf) as u8;
            let op = flags & 7;
            if op == OP_DEF || op == OP_HIST {
                return None;
            }
            let entry = self.entries.get(id as usize)?.as_deref()?;
            let timestamp_ms = if flags & HAS_TIMESTAMP != 0 {
                base.saturating_add(super::unzigzag(r.varint().ok()?))
            } else {
                0
            };
            out.push(KnownValue {
                // Every entry but a histogram's has one.
                id: entry.record_id?,
                entry: id,
                r#type: entry.r#type,
                value: scalar(&mut r, op).ok()?,
                timestamp_ms,
            });
        }
        (out.len() <= limits.max_records_per_frame).then_some(())
    }
}

/// The series of `id`: the dictionary's entry, else the frame's last definition of it.
fn lookup<'a, 'd>(
    entries: &'a [Option<Box<Entry>>],
    defs: &'d [(u32, Definition<'a>)],
    id: u32,
) -> Option<Series<'a, 'd>> {
    if let Some(e) = entries.get(id as usize).and_then(|e| e.as_deref()) {
        return Some(Series::Known(e));
    }
    defs.iter()
        .rev()
        .find(|(i, _)| *i == id)
        .map(|(_, d)| Series::Local(d))
}

/// Every definition agrees with the dictionary and with the frame's other definitions of
/// its id; every value has a series, of its kind, with consistent histogram counts.
fn check(
    entries: &[Option<Box<Entry>>],
    defs: &[(u32, Definition<'_>)],
    values: &[ValueRecord],
    counts: &[u64],
) -> Result<(), PayloadError> {
    let err = |e| Err(PayloadError::Dictionary(e));
    for (i, (id, def)) in defs.iter().enumerate() {
        let known = entries.get(*id as usize).and_then(|e| e.as_deref());
        if known.is_some_and(|e| !e.same_as(def))
            || defs[..i].iter().any(|(j, d)| j == id && d != def)
        {
            return err(DictError::Conflict { id: *id });
        }
    }
    for v in values {
        let (histogram, bounds) = match lookup(entries, defs, v.id) {
            None => return err(DictError::UnknownSeries { id: v.id }),
            Some(Series::Known(e)) => (e.r#type == MetricType::Histogram as i32, e.buckets.len()),
            Some(Series::Local(d)) => (d.is_histogram(), d.buckets.len()),
        };
        match v.operand {
            Operand::Scalar(_) if !histogram => {}
            Operand::Histogram {
                count,
                counts: (start, end),
                ..
            } if histogram => {
                let incs = counts.get(start as usize..end as usize).unwrap_or_default();
                if incs.len() != bounds {
                    return err(DictError::HistogramCounts { id: v.id });
                }
                let total = incs.iter().try_fold(0u64, |a, b| a.checked_add(*b));
                if total.is_none_or(|t| t > count) {
                    return err(DictError::HistogramCounts { id: v.id });
                }
            }
            _ => return err(DictError::TypeMismatch { id: v.id }),
        }
    }
    Ok(())
}

/// Cumulative buckets of a histogram value: `bounds` with the running sum of `incs`.
fn cumulative<'b>(bounds: &'b [Bucket], incs: &'b [u64]) -> impl Iterator<Item = Bucket> + 'b {
    bounds.iter().zip(incs).scan(0u64, |acc, (b, inc)| {
        *acc = acc.saturating_add(*inc);
        Some(Bucket {
            upper_bound: b.upper_bound,
            cumulative_count: *acc,
        })
    })
}

fn push<'a>(
    batch: &mut MetricBatchView<'a>,
    series: Option<Series<'a, '_>>,
    v: &ValueRecord,
    counts: &[u64],
) {
    let (value, count, sum, incs) = match v.operand {
        Operand::Scalar(x) => (x, 0, 0.0, &[][..]),
        Operand::Histogram {
            count,
            sum,
            counts: (s, e),
        } => (
            0.0,
            count,
            sum,
            counts.get(s as usize..e as usize).unwrap_or_default(),
        ),
    };
    match series {
        Some(Series::Known(e)) => batch.push_record(
            PushRecord {
                id: e.record_id,
                name: &e.name,
                help: &e.help,
                r#type: e.r#type,
                value,
                timestamp_ms: v.timestamp_ms,
                count,
                sum,
            },
            e.labels.iter().map(|l| LabelView {
                name: &l.name,
                value: &l.value,
            }),
            cumulative(&e.buckets, incs),
        ),
        Some(Series::Local(d)) => batch.push_record(
            PushRecord {
                id: None,
                name: d.name,
                help: d.help,
                r#type: d.r#type,
                value,
                timestamp_ms: v.timestamp_ms,
                count,
                sum,
            },
            d.labels.iter().copied(),
            cumulative(&d.buckets, incs),
        ),
        // Checked before: every value has its series.
        None => {}
    }
}

/// Decodes a dictionary body into owned metrics with `lookup` naming the series the body
/// does not define (the agent's own dictionary when it takes frames back; none for a frame
/// read alone, [`crate::frame::decode_frame`]).
///
/// # Errors
/// As [`SeriesDict::decode_into`].
pub fn resolve_owned<'k>(
    body: &[u8],
    frame_timestamp_ns: u64,
    limits: &Limits,
    lookup: &dyn Fn(u32) -> Option<Definition<'k>>,
) -> Result<Vec<Metric>, PayloadError> {
    let (mut defs, mut values, mut counts) = (Vec::new(), Vec::new(), Vec::new());
    parse(
        body,
        frame_timestamp_ns,
        limits,
        Parsed {
            defs: &mut defs,
            values: &mut values,
            counts: &mut counts,
        },
    )?;
    // Bring the series the body references but does not define in as frame definitions.
    let mut known: Vec<(u32, Definition<'_>)> = Vec::new();
    for v in &values {
        if !defs.iter().any(|(i, _)| *i == v.id) && !known.iter().any(|(i, _)| *i == v.id) {
            let d = lookup(v.id).ok_or(PayloadError::Dictionary(DictError::UnknownSeries {
                id: v.id,
            }))?;
            known.push((v.id, d));
        }
    }
    let mut all: Vec<(u32, Definition<'_>)> = known;
    all.extend(defs);
    check(&[], &all, &values, &counts)?;
    let mut out = Vec::with_capacity(values.len());
    for v in &values {
        let Some(Series::Local(d)) = lookup_local(&all, v.id) else {
            continue;
        };
        let (value, count, sum, incs) = match v.operand {
            Operand::Scalar(x) => (x, 0, 0.0, &[][..]),
            Operand::Histogram {
                count,
                sum,
                counts: (s, e),
            } => (
                0.0,
                count,
                sum,
                counts.get(s as usize..e as usize).unwrap_or_default(),
            ),
        };
        out.push(Metric {
            name: d.name.to_owned(),
            help: d.help.to_owned(),
            r#type: d.r#type,
            labels: d.owned_labels(),
            value,
            timestamp_ms: v.timestamp_ms,
            buckets: cumulative(&d.buckets, incs).collect(),
            count,
            sum,
        });
    }
    Ok(out)
}

fn lookup_local<'a, 'd>(defs: &'d [(u32, Definition<'a>)], id: u32) -> Option<Series<'a, 'd>> {
    lookup(&[], defs, id)
}
