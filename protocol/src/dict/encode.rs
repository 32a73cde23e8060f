//! The sending side of the series dictionary: [`DictFramer`], one per stream and epoch.

use std::collections::HashMap;
use std::sync::Arc;

use crate::frame::{FrameFlags, FrameHeader, FrameKind, HEADER_LEN};
use crate::framer::{BuiltFrame, FramerError, FramerStats, PushOutcome, Rejection};
use crate::limits::Limits;
use crate::payload::{validate_metric, Metric, MetricType, PayloadError};

use super::{
    definition, frame_ms, pow10, resolve_owned, zigzag, Definition, Reader, DICT_BODY_VERSION,
    HAS_TIMESTAMP, MAX_DICT_ENTRIES, OP_DEC1, OP_DEF, OP_F64, OP_HIST, OP_NEG, OP_UINT,
};

/// A series whose definition is not acknowledged and that no value record referenced for
/// this long (ns) has its definition sent alone, so the acknowledged prefix moves past it
/// even when the series vanished right after a lost definition.
const ORPHAN_AFTER_NS: u64 = 1_000_000_000;
/// Most unacknowledged ids one frame looks at (and definitions it adds) for orphans.
const ORPHAN_SCAN: u32 = 256;
const ORPHANS_PER_FRAME: usize = 16;

fn put_varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn put_str(buf: &mut Vec<u8>, s: &str) {
    put_varint(buf, s.len() as u64);
    buf.extend_from_slice(s.as_bytes());
}

/// The definition of `m` (the bytes after a definition's key).
fn encode_definition(m: &Metric, buf: &mut Vec<u8>) {
    buf.clear();
    put_varint(buf, u64::from(m.r#type as u32));
    put_str(buf, &m.name);
    put_str(buf, &m.help);
    put_varint(buf, m.labels.len() as u64);
    for l in &m.labels {
        put_str(buf, &l.name);
        put_str(buf, &l.value);
    }
    if m.r#type == MetricType::Histogram as i32 {
        put_varint(buf, m.buckets.len() as u64);
        for b in &m.buckets {
            buf.extend_from_slice(&b.upper_bound.to_le_bytes());
        }
    }
}

/// The shortest operand of a scalar: (op, operand bytes written to `buf`).
fn encode_scalar(v: f64, buf: &mut Vec<u8>) -> u8 {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    if v.fract() == 0.0 && v.abs() < EXACT && !(v == 0.0 && v.is_sign_negative()) {
        if v >= 0.0 {
            put_varint(buf, v as u64);
            return OP_UINT;
        }
        put_varint(buf, (-v) as u64);
        return OP_NEG;
    }
    // -0.0 keeps its sign only as an f64.
    if v.is_finite() && v != 0.0 {
        for k in 1..=3u8 {
            let m = (v * pow10(k)).round();
            if m.abs() < EXACT && (m / pow10(k)).to_bits() == v.to_bits() {
                let z = zigzag(m as i64);
                if varint_len(z) < 8 {
                    put_varint(buf, z);
                    return OP_DEC1 + k - 1;
                }
                break;
            }
        }
    }
    buf.extend_from_slice(&v.to_le_bytes());
    OP_F64
}

/// The frame being filled.
#[derive(Debug)]
struct OpenFrame {
    buf: Vec<u8>,
    records: u32,
    timestamp_ns: u64,
    /// The id of the frame's last record (−1 before the first).
    previous: i64,
    /// Ordinal of this frame among the framer's frames (for `defined_in`).
    ordinal: u64,
    /// The next frame-local id (from [`MAX_DICT_ENTRIES`] on).
    next_local: u32,
}

/// Packs metrics of one stream into dictionary frames (`kind = metrics_dict`, module
/// documentation of [`crate::dict`]): the interface of [`crate::framer::Framer`] plus
/// [`DictFramer::on_ack`], the collector's acknowledgment. Limits are honoured as there: a
/// frame never exceeds `max_frame_bytes` nor `max_records_per_frame`, and every record
/// passes the decoder's validation, or is refused ([`Rejection`]).
#[derive(Debug)]
pub struct DictFramer {
    stream_id: u32,
    limits: Limits,
    max_payload: usize,
    max_records: u32,
    next_stream_seq: u64,
    record_count: u64,
    open: Option<OpenFrame>,
    stats: FramerStats,
    ordinal: u64,
    /// Definition bytes → id, for ids below [`MAX_DICT_ENTRIES`].
    ids: HashMap<Arc<[u8]>, u32>,
    /// Per id: its definition, the frame that last defined it and when a value last
    /// referenced it (ns).
    defs: Vec<Arc<[u8]>>,
    defined_in: Vec<u64>,
    last_used_ns: Vec<u64>,
    last_defined_ns: Vec<u64>,
    /// Every id below this is known to the collector.
    acked: u32,
    scratch: Vec<u8>,
    record: Vec<u8>,
}

impl DictFramer {
    /// A framer for `stream_id` whose first frame gets `first_stream_seq`, with an empty
    /// dictionary (a new epoch).
    ///
    /// # Errors
    /// [`FramerError`] if `limits` allow no payload or no record per frame.
    pub fn new(stream_id: u32, first_stream_seq: u64, limits: Limits) -> Result<Self, FramerError> {
        // The same bounds as the protobuf framer.
        let _ = crate::framer::Framer::<Metric>::new(stream_id, first_stream_seq, limits.clone())?;
        Ok(DictFramer {
            stream_id,
            max_payload: limits.max_payload_bytes(),
            max_records: u32::try_from(limits.max_records_per_frame).unwrap_or(u32::MAX),
            limits,
            next_stream_seq: first_stream_seq,
            record_count: 0,
            open: None,
            stats: FramerStats::default(),
            ordinal: 0,
            ids: HashMap::new(),
            defs: Vec::new(),
            defined_in: Vec::new(),
            last_used_ns: Vec::new(),
            last_defined_ns: Vec::new(),
            acked: 0,
            scratch: Vec::new(),
            record: Vec::new(),
        })
    }

    /// The stream id.
    pub fn stream_id(&self) -> u32 {
        self.stream_id
    }

    /// The stream sequence the next closed frame will get.
    pub fn next_stream_seq(&self) -> u64 {
        self.next_stream_seq
    }

    /// Cumulative records in closed frames.
    pub fn record_count(&self) -> u64 {
        self.record_count
    }

    /// Running totals (as [`crate::framer::Framer::stats`]).
    pub fn stats(&self) -> FramerStats {
        self.stats
    }

    /// Whether a frame is open.
    pub fn has_open_frame(&self) -> bool {
        self.open.is_some()
    }

    /// Series in the dictionary (ids below [`MAX_DICT_ENTRIES`]).
    pub fn entries(&self) -> usize {
        self.defs.len()
    }

    /// Every id below this is acknowledged.
    pub fn acked(&self) -> u32 {
        self.acked
    }

    /// The collector's acknowledgment: every id below `known_up_to` is known to it (only
    /// ids this framer gave out count; a larger number is taken as the number given out).
    /// From now on those series go out without their definition.
    pub fn on_ack(&mut self, known_up_to: u32) {
        let given = u32::try_from(self.defs.len()).unwrap_or(u32::MAX);
        self.acked = self.acked.max(known_up_to.min(given));
    }

    /// Add `m` at time `now_ns` (ns since the Unix epoch). If it does not fit the open
    /// frame, that frame is closed and returned and the record opens a new one.
    pub fn push(&mut self, m: &Metric, now_ns: u64) -> PushOutcome {
        self.stats.records_in += 1;
        if let Err(e) = validate_metric(m, &self.limits) {
            self.stats.invalid += 1;
            return PushOutcome::Rejected(Rejection::Invalid(e));
        }
        let mut def = std::mem::take(&mut self.scratch);
        encode_definition(m, &mut def);
        // Worst case: version, key and timestamp varints, definition key, the operand
        // (a histogram: count, sum, bucket count, a varint per bucket).
        let worst = 1 + 3 * 10 + def.len() + 10 + 8 + 10 + 10 * m.buckets.len();
        if worst > self.max_payload {
            self.scratch = def;
            self.stats.oversize += 1;
            return PushOutcome::Rejected(Rejection::Oversize {
                encoded_len: worst,
                max_payload_bytes: self.max_payload,
            });
        }
        let id = self.id_for(&def);
        let mut closed = None;
        if !self.append(id, &def, m, now_ns, false) {
            closed = self.close(FrameFlags::EMPTY);
            self.append(id, &def, m, now_ns, true);
        }
        self.scratch = def;
        self.stats.records_open += 1;
        match closed {
            Some(f) => PushOutcome::Closed(f),
            None => PushOutcome::Appended,
        }
    }

    /// The id of the series defined by `def`: its entry, a new entry, or (the dictionary
    /// full) a frame-local id.
    fn id_for(&mut self, def: &[u8]) -> u32 {
        if let Some(id) = self.ids.get(def) {
            return *id;
        }
        let id = u32::try_from(self.defs.len()).unwrap_or(u32::MAX);
        if id >= MAX_DICT_ENTRIES {
            // Frame-local: one above the frame's last id, so its key stays short.
            return u32::MAX;
        }
        let bytes: Arc<[u8]> = Arc::from(def);
        self.ids.insert(bytes.clone(), id);
        self.defs.push(bytes);
        self.defined_in.push(u64::MAX);
        self.last_used_ns.push(0);
        self.last_defined_ns.push(0);
        id
    }

    /// Appends `m` (series `id`, definition `def`) to the open frame, opening one if none is
    /// open (`force`: always). False when it does not fit.
    fn append(&mut self, id: u32, def: &[u8], m: &Metric, now_ns: u64, force: bool) -> bool {
        let ordinal = self.ordinal;
        let open = self.open.get_or_insert_with(|| {
            let mut buf = Vec::with_capacity(HEADER_LEN + 1024);
            buf.resize(HEADER_LEN, 0);
            buf.push(DICT_BODY_VERSION);
            OpenFrame {
                buf,
                records: 0,
                timestamp_ns: now_ns,
                previous: -1,
                ordinal,
                next_local: MAX_DICT_ENTRIES,
            }
        });
        if !force && open.records >= self.max_records {
            return false;
        }
        let local = id == u32::MAX;
        // Frame-local ids count up from MAX_DICT_ENTRIES within the frame.
        let id = if local { open.next_local } else { id };
        let slot = id as usize;
        let needs_def =
            local || (id >= self.acked && self.defined_in.get(slot) != Some(&open.ordinal));
        let rec = &mut self.record;
        rec.clear();
        let mut previous = open.previous;
        if needs_def {
            put_varint(
                rec,
                (zigzag(i64::from(id) - (previous + 1)) << 4) | u64::from(OP_DEF),
            );
            rec.extend_from_slice(def);
            previous = i64::from(id);
        }
        let key_at = rec.len();
        put_varint(rec, zigzag(i64::from(id) - (previous + 1)) << 4);
        let mut flags = 0u8;
        if m.timestamp_ms != 0 {
            flags |= HAS_TIMESTAMP;
            let delta = m.timestamp_ms.saturating_sub(frame_ms(open.timestamp_ns));
            put_varint(rec, zigzag(delta));
        }
        if m.r#type == MetricType::Histogram as i32 {
            flags |= OP_HIST;
            put_varint(rec, m.count);
            rec.extend_from_slice(&m.sum.to_le_bytes());
            put_varint(rec, m.buckets.len() as u64);
            let mut prev = 0u64;
            for b in &m.buckets {
                put_varint(rec, b.cumulative_count.saturating_sub(prev));
                prev = b.cumulative_count;
            }
        } else {
            flags |= encode_scalar(m.value, rec);
        }
        // The key's low bits: the key varint is one byte or more; flags sit in its first.
        if let Some(k) = rec.get_mut(key_at) {
            *k |= flags;
        }
        let payload = open.buf.len() - HEADER_LEN;
        if !force && open.records > 0 && payload + rec.len() > self.max_payload {
            return false;
        }
        open.buf.extend_from_slice(rec);
        open.records += 1;
        open.previous = i64::from(id);
        if local {
            open.next_local = open.next_local.saturating_add(1);
        } else {
            if needs_def {
                self.defined_in[slot] = open.ordinal;
                self.last_defined_ns[slot] = open.timestamp_ns;
            }
            self.last_used_ns[slot] = now_ns;
        }
        true
    }

    /// Adds the definitions of unacknowledged series no value referenced lately (orphans),
    /// while they fit.
    fn add_orphans(&mut self, open: &mut OpenFrame) {
        let given = u32::try_from(self.defs.len()).unwrap_or(u32::MAX);
        let end = given.min(self.acked.saturating_add(ORPHAN_SCAN));
        let mut added = 0;
        for id in self.acked..end {
            let slot = id as usize;
            let stale = |t: u64| t.saturating_add(ORPHAN_AFTER_NS) <= open.timestamp_ns;
            if self.defined_in[slot] == open.ordinal
                || !stale(self.last_used_ns[slot])
                || !stale(self.last_defined_ns[slot])
            {
                continue;
            }
            let def = &self.defs[slot];
            let key = (zigzag(i64::from(id) - (open.previous + 1)) << 4) | u64::from(OP_DEF);
            if open.buf.len() - HEADER_LEN + varint_len(key) + def.len() > self.max_payload {
                break;
            }
            put_varint(&mut open.buf, key);
            open.buf.extend_from_slice(def);
            open.previous = i64::from(id);
            self.defined_in[slot] = open.ordinal;
            self.last_defined_ns[slot] = open.timestamp_ns;
            added += 1;
            if added == ORPHANS_PER_FRAME {
                break;
            }
        }
    }

    /// Close the open frame, if any, and return it.
    pub fn flush(&mut self) -> Option<BuiltFrame> {
        self.close(FrameFlags::EMPTY)
    }

    /// Close the stream for this epoch: the open frame, or an empty frame if none is open,
    /// closed with [`FrameFlags::LAST_OF_EPOCH`].
    pub fn finish_epoch(&mut self, now_ns: u64) -> BuiltFrame {
        if self.open.is_none() {
            let mut buf = vec![0; HEADER_LEN];
            buf.push(DICT_BODY_VERSION);
            self.open = Some(OpenFrame {
                buf,
                records: 0,
                timestamp_ns: now_ns,
                previous: -1,
                ordinal: self.ordinal,
                next_local: MAX_DICT_ENTRIES,
            });
        }
        // Opened just above.
        self.close(FrameFlags::LAST_OF_EPOCH)
            .unwrap_or_else(|| self.heartbeat(now_ns))
    }

    /// A heartbeat frame on this stream (as [`crate::framer::Framer::heartbeat`]).
    pub fn heartbeat(&mut self, now_ns: u64) -> BuiltFrame {
        let mut buf = vec![0; HEADER_LEN];
        let header = FrameHeader {
            timestamp_ns: now_ns,
            ..self.header(
                FrameKind::Heartbeat,
                FrameFlags::EMPTY,
                0,
                self.record_count,
            )
        };
        // `buf` is HEADER_LEN bytes: emit cannot fail.
        let _ = header.emit(&mut buf);
        self.stats.frames += 1;
        let stream_seq = self.take_stream_seq();
        BuiltFrame::from_parts(buf, stream_seq, 0, self.record_count)
    }

    fn take_stream_seq(&mut self) -> u64 {
        let seq = self.next_stream_seq;
        self.next_stream_seq = seq.wrapping_add(1);
        seq
    }

    fn header(&self, kind: FrameKind, flags: FrameFlags, len: u32, count: u64) -> FrameHeader {
        FrameHeader {
            kind,
            flags,
            stream_id: self.stream_id,
            payload_len: len,
            epoch: 0,
            conn_seq: 0,
            stream_seq: self.next_stream_seq,
            timestamp_ns: 0,
            record_count: count,
        }
    }

    fn close(&mut self, flags: FrameFlags) -> Option<BuiltFrame> {
        let mut open = self.open.take()?;
        self.add_orphans(&mut open);
        self.ordinal += 1;
        let records = open.records;
        let payload_len = u32::try_from(open.buf.len() - HEADER_LEN).unwrap_or(u32::MAX);
        let record_count = self.record_count + u64::from(records);
        let header = FrameHeader {
            timestamp_ns: open.timestamp_ns,
            ..self.header(FrameKind::MetricsDict, flags, payload_len, record_count)
        };
        // `buf` starts with HEADER_LEN placeholder bytes: emit cannot fail.
        let _ = header.emit(&mut open.buf);
        self.record_count = record_count;
        self.stats.records_open -= u64::from(records);
        self.stats.records_framed += u64::from(records);
        self.stats.frames += 1;
        let stream_seq = self.take_stream_seq();
        Some(BuiltFrame::from_parts(
            open.buf,
            stream_seq,
            records,
            record_count,
        ))
    }

    /// The definition of dictionary entry `id`, read back from its bytes.
    fn definition(&self, id: u32) -> Option<Definition<'_>> {
        let bytes = self.defs.get(id as usize)?;
        definition(&mut Reader::new(bytes), &self.limits, 0).ok()
    }

    /// The metrics of a frame this framer built (header and body), decoded with its own
    /// dictionary: what an agent takes back when a session ends with frames unsent.
    ///
    /// # Errors
    /// As [`super::SeriesDict::decode_into`] (a frame this framer built always decodes).
    pub fn decode_own(&self, frame: &[u8]) -> Result<Vec<Metric>, PayloadError> {
        let view = crate::frame::Frame::new_checked(frame)
            .map_err(|_| PayloadError::Dictionary(super::DictError::Truncated { offset: 0 }))?;
        resolve_owned(view.payload(), view.timestamp_ns(), &self.limits, &|id| {
            self.definition(id)
        })
    }
}
