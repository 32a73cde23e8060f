//! Line assembly (sans-IO): bytes → lines with [`LineSplitter`] (the long-line cut, the
//! discard of the rest of a cut line, the partial last line and its timeout, each line's start
//! and end offsets), and a line → a [`LogRecord`] (`push_record`: lossy UTF-8, the message
//! bound, severity, the read time it is given). No file, no clock: the caller feeds the bytes
//! and passes the times.

use std::borrow::Cow;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use uctel_protocol::payload::{LogRecord, Severity};

use super::{LogEvent, LogSourceCounts};
use crate::sources::severity;

/// How an emitted line ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineEnd {
    /// At a `\n`.
    Newline,
    /// Cut at `max_line_bytes`; the rest of the line is being discarded.
    Cut,
    /// A partial last line emitted without its `\n`.
    Flushed,
}

/// Splits a byte stream into lines (sans-IO). Holds at most `max_line_bytes` bytes of an
/// unfinished line. Tracks the stream offset of the next byte fed ([`LineSplitter::position`])
/// so that every emitted line comes with the offset of its first byte (where reading must
/// resume to read that line again).
#[derive(Debug, Clone)]
pub struct LineSplitter {
    max_line_bytes: usize,
    partial: Vec<u8>,
    partial_since: Option<Instant>,
    /// Stream offset of the first byte of `partial`.
    partial_start: u64,
    discarding: bool,
    /// Stream offset of the next byte to be fed.
    pos: u64,
}

/// Result of [`LineSplitter::feed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fed {
    /// Bytes of the chunk consumed (emitted, buffered as partial, or discarded).
    pub consumed: usize,
    /// Lines emitted.
    pub lines: usize,
    /// Bytes discarded (rest of over-long lines, and bytes dropped to keep a cut on a UTF-8
    /// boundary).
    pub discarded: usize,
}

impl LineSplitter {
    /// A splitter for lines of at most `max_line_bytes` bytes (at least 1).
    pub fn new(max_line_bytes: usize) -> Self {
        Self {
            max_line_bytes: max_line_bytes.max(1),
            partial: Vec::new(),
            partial_since: None,
            partial_start: 0,
            discarding: false,
            pos: 0,
        }
    }

    /// The same splitter, with the next byte fed at stream offset `offset` (where reading
    /// starts or resumes).
    #[must_use]
    pub fn at(mut self, offset: u64) -> Self {
        self.pos = offset;
        self
    }

    /// Stream offset of the next byte to be fed.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// A splitter resuming in the middle of an over-long line (from a checkpoint).
    pub fn discarding(max_line_bytes: usize) -> Self {
        Self {
            discarding: true,
            ..Self::new(max_line_bytes)
        }
    }

    /// Bytes of an unfinished line held back (not yet emitted).
    pub fn partial_len(&self) -> usize {
        self.partial.len()
    }

    /// Whether the rest of a cut line is being discarded.
    pub fn is_discarding(&self) -> bool {
        self.discarding
    }

    /// Forgets any partial line and discard state, and restarts at offset 0 (after the file
    /// was truncated).
    pub fn reset(&mut self) {
        self.partial.clear();
        self.partial_since = None;
        self.discarding = false;
        self.pos = 0;
    }

    /// Consumes `chunk` (the bytes at [`LineSplitter::position`] onwards), calling
    /// `emit(line, end, start)` for each line, `start` being the stream offset of the line's
    /// first byte; stops after `max_lines` lines; unconsumed bytes must be fed again. `now`
    /// starts the partial-line timer.
    pub fn feed(
        &mut self,
        chunk: &[u8],
        now: Instant,
        max_lines: usize,
        emit: &mut dyn FnMut(&[u8], LineEnd, u64),
    ) -> Fed {
        let mut fed = Fed::default();
        let base = self.pos;
        let mut i = 0;
        while i < chunk.len() {
            let rest = &chunk[i..];
            if self.discarding {
                match rest.iter().position(|&b| b == b'\n') {
                    Some(p) => {
                        fed.discarded += p;
                        i += p + 1;
                        self.discarding = false;
                    }
                    None => {
                        fed.discarded += rest.len();
                        i = chunk.len();
                    }
                }
                continue;
            }
            if fed.lines >= max_lines {
                break;
            }
            let room = self.max_line_bytes - self.partial.len();
            // A newline at index `room` still ends a line of exactly max_line_bytes.
            let window = &rest[..rest.len().min(room + 1)];
            let here = base + i as u64;
            if let Some(p) = window.iter().position(|&b| b == b'\n') {
                if self.partial.is_empty() {
                    emit(&rest[..p], LineEnd::Newline, here);
                } else {
                    self.partial.extend_from_slice(&rest[..p]);
                    emit(&self.partial, LineEnd::Newline, self.partial_start);
                    self.partial.clear();
                    self.partial_since = None;
                }
                fed.lines += 1;
                i += p + 1;
            } else if rest.len() > room {
                // Over-long: cut at max_line_bytes, on a UTF-8 boundary where possible.
                if self.partial.is_empty() {
                    self.partial_start = here;
                }
                self.partial.extend_from_slice(&rest[..room]);
                let cut = utf8_cut(&self.partial);
                fed.discarded += self.partial.len() - cut;
                emit(&self.partial[..cut], LineEnd::Cut, self.partial_start);
                self.partial.clear();
                self.partial_since = None;
                self.discarding = true;
                fed.lines += 1;
                i += room;
            } else {
                if self.partial.is_empty() {
                    self.partial_since = Some(now);
                    self.partial_start = here;
                }
                self.partial.extend_from_slice(rest);
                i = chunk.len();
            }
        }
        fed.consumed = i;
        self.pos = base + i as u64;
        fed
    }

    /// Emits the partial line if it has waited `timeout` since its first byte was read.
    /// Returns whether a line was emitted.
    pub fn flush_if_stale(
        &mut self,
        now: Instant,
        timeout: Duration,
        emit: &mut dyn FnMut(&[u8], LineEnd, u64),
    ) -> bool {
        match self.partial_since {
            Some(since)
                if !self.partial.is_empty() && now.saturating_duration_since(since) >= timeout =>
            {
                self.flush(emit)
            }
            _ => false,
        }
    }

    /// Emits the partial line now, if any. Returns whether a line was emitted.
    pub fn flush(&mut self, emit: &mut dyn FnMut(&[u8], LineEnd, u64)) -> bool {
        if self.partial.is_empty() {
            return false;
        }
        emit(&self.partial, LineEnd::Flushed, self.partial_start);
        self.partial.clear();
        self.partial_since = None;
        true
    }
}

/// The longest prefix length of `buf` that does not end inside a UTF-8 sequence (so a cut does
/// not invent an invalid character). Invalid bytes earlier in `buf` are left to the lossy
/// conversion.
fn utf8_cut(buf: &[u8]) -> usize {
    match std::str::from_utf8(buf) {
        Ok(_) => buf.len(),
        Err(e) if e.error_len().is_none() && e.valid_up_to() > 0 => e.valid_up_to(),
        Err(e) if e.error_len().is_none() => {
            // Everything before the incomplete tail may itself contain invalid bytes; cut just
            // before the incomplete sequence (at most 3 bytes).
            let tail = buf.len() - e.valid_up_to();
            buf.len() - tail.min(3)
        }
        Err(_) => buf.len(),
    }
}

/// Where reading resumes after a line emitted by a [`LineSplitter`] of `max_line_bytes` that
/// started at `start` and holds `len` bytes: just after its `\n` (`Newline`), just after its
/// last byte (`Flushed`: the rest, if any, is another line), or just after the
/// `max_line_bytes` bytes taken before the cut (`Cut`: a UTF-8 back-off may have emitted
/// fewer; the rest of the line is discarded, never emitted). Increases strictly with each
/// line of a file, so it is the record's `end_offset`.
pub fn line_end_offset(start: u64, len: usize, end: LineEnd, max_line_bytes: usize) -> u64 {
    let taken = match end {
        LineEnd::Newline => len.saturating_add(1),
        LineEnd::Flushed => len,
        LineEnd::Cut => max_line_bytes.max(len),
    };
    start.saturating_add(taken as u64)
}

/// Nanoseconds since the Unix epoch at `t` (0 before 1970, saturating after 2554).
pub(super) fn unix_ns(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// What a record carries besides its line: where the line was read and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Stamp {
    /// The file's stable identity (`LogRecord::file_id`), sent for the collector's
    /// deduplication.
    pub(super) file_id: u64,
    /// Where reading resumes after the line ([`line_end_offset`]), sent with `file_id`.
    pub(super) end_offset: u64,
    /// When the line was read, in nanoseconds since the Unix epoch ([`unix_ns`]). The tailer
    /// reads its wall clock for each line, so lines read by one poll keep their order in time.
    pub(super) timestamp_ns: u64,
}

/// Builds one record from a line and appends it to `out`: stamped with `at`, severity
/// detected from the line when `detect_severity` ([`severity::detect`]), lossy UTF-8, message
/// bounded by `max_line` bytes. Counts the record and what it altered in `counts`
/// ([`LogEvent::InvalidUtf8`], [`LogEvent::LineTruncated`], [`LogEvent::PartialLineFlushed`]).
#[allow(clippy::too_many_arguments)]
pub(super) fn push_record(
    out: &mut Vec<LogRecord>,
    counts: &mut LogSourceCounts,
    source: &str,
    detect_severity: bool,
    max_line: usize,
    line: &[u8],
    end: LineEnd,
    at: Stamp,
) {
    let mut message = match String::from_utf8_lossy(line) {
        Cow::Borrowed(s) => s.to_owned(),
        Cow::Owned(s) => {
            counts.bump(LogEvent::InvalidUtf8);
            s
        }
    };
    let mut cut = end == LineEnd::Cut;
    if message.len() > max_line {
        // U+FFFD replacements can make the text longer than the bytes it came from.
        let mut at = max_line;
        while !message.is_char_boundary(at) {
            at -= 1;
        }
        message.truncate(at);
        cut = true;
    }
    if cut {
        counts.bump(LogEvent::LineTruncated);
    }
    if end == LineEnd::Flushed {
        counts.bump(LogEvent::PartialLineFlushed);
    }
    counts.records += 1;
    let severity = if detect_severity {
        severity::detect(line)
    } else {
        Severity::Unspecified
    };
    out.push(LogRecord {
        timestamp_ns: at.timestamp_ns,
        severity: severity as i32,
        source: source.to_owned(),
        message,
        fields: Vec::new(),
        file_id: at.file_id,
        end_offset: at.end_offset,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(
        s: &mut LineSplitter,
        chunk: &[u8],
        max_lines: usize,
    ) -> (Vec<(Vec<u8>, LineEnd)>, Fed) {
        let mut lines = Vec::new();
        let fed = s.feed(chunk, Instant::now(), max_lines, &mut |l, e, _| {
            lines.push((l.to_vec(), e))
        });
        (lines, fed)
    }

    #[test]
    fn splits_lines_and_holds_partial() {
        let mut s = LineSplitter::new(100);
        let (lines, fed) = split(&mut s, b"a\nbb\nccc", 10);
        assert_eq!(
            lines,
            vec![
                (b"a".to_vec(), LineEnd::Newline),
                (b"bb".to_vec(), LineEnd::Newline)
            ]
        );
        assert_eq!(fed.consumed, 8);
        assert_eq!(s.partial_len(), 3);
        let (lines, _) = split(&mut s, b"c\n", 10);
        assert_eq!(lines, vec![(b"cccc".to_vec(), LineEnd::Newline)]);
        assert_eq!(s.partial_len(), 0);
    }

    #[test]
    fn stops_at_max_lines_without_consuming_more() {
        let mut s = LineSplitter::new(100);
        let (lines, fed) = split(&mut s, b"1\n2\n3\n", 2);
        assert_eq!(lines.len(), 2);
        assert_eq!(fed.consumed, 4);
        let (lines, fed) = split(&mut s, b"3\n", 2);
        assert_eq!(lines, vec![(b"3".to_vec(), LineEnd::Newline)]);
        assert_eq!(fed.consumed, 2);
        let (lines, fed) = split(&mut s, b"4\n", 0);
        assert!(lines.is_empty());
        assert_eq!(fed.consumed, 0);
    }

    #[test]
    fn line_of_exactly_max_is_whole_and_longer_is_cut() {
        let mut s = LineSplitter::new(4);
        let (lines, _) = split(&mut s, b"abcd\n", 10);
        assert_eq!(lines, vec![(b"abcd".to_vec(), LineEnd::Newline)]);
        let (lines, fed) = split(&mut s, b"abcdefgh\nnext\n", 10);
        assert_eq!(
            lines,
            vec![
                (b"abcd".to_vec(), LineEnd::Cut),
                (b"next".to_vec(), LineEnd::Newline)
            ]
        );
        assert_eq!(fed.discarded, 4);
        assert!(!s.is_discarding());
    }

    #[test]
    fn cut_spanning_chunks_discards_until_newline() {
        let mut s = LineSplitter::new(4);
        let (lines, _) = split(&mut s, b"ab", 10);
        assert!(lines.is_empty());
        let (lines, _) = split(&mut s, b"cdef", 10);
        assert_eq!(lines, vec![(b"abcd".to_vec(), LineEnd::Cut)]);
        assert!(s.is_discarding());
        let (lines, fed) = split(&mut s, b"xxxxxxxx", 10);
        assert!(lines.is_empty());
        assert_eq!(fed.discarded, 8);
        let (lines, _) = split(&mut s, b"x\nok\n", 10);
        assert_eq!(lines, vec![(b"ok".to_vec(), LineEnd::Newline)]);
    }

    #[test]
    fn cut_backs_off_to_utf8_boundary() {
        // "aé" is 61 C3 A9; a 2-byte limit would split é.
        let mut s = LineSplitter::new(2);
        let (lines, fed) = split(&mut s, "aé\n".as_bytes(), 10);
        assert_eq!(lines, vec![(b"a".to_vec(), LineEnd::Cut)]);
        assert_eq!(fed.discarded, 2);
        assert_eq!(utf8_cut(&[0xE2, 0x82]), 0);
        assert_eq!(utf8_cut(b"abc"), 3);
        assert_eq!(utf8_cut(&[0xFF, b'a']), 2);
    }

    #[test]
    fn lines_come_with_the_offset_of_their_first_byte() {
        let mut starts = Vec::new();
        let mut s = LineSplitter::new(4).at(100);
        let mut emit = |l: &[u8], e: LineEnd, start: u64| starts.push((l.to_vec(), e, start));
        // "ab\n" at 100, "cd" + "e\n" at 103 (split over two feeds), "fghijk\n" cut at 4,
        // its rest discarded, "z" flushed at 114.
        s.feed(b"ab\ncd", Instant::now(), 10, &mut emit);
        s.feed(b"e\nfghijk\nz", Instant::now(), 10, &mut emit);
        assert_eq!(s.position(), 115);
        s.flush(&mut emit);
        assert_eq!(
            starts,
            vec![
                (b"ab".to_vec(), LineEnd::Newline, 100),
                (b"cde".to_vec(), LineEnd::Newline, 103),
                (b"fghi".to_vec(), LineEnd::Cut, 107),
                (b"z".to_vec(), LineEnd::Flushed, 114),
            ]
        );
        // A cut of a line that began in an earlier feed starts where the line began.
        let mut starts = Vec::new();
        let mut s = LineSplitter::new(4);
        let mut emit = |l: &[u8], e: LineEnd, start: u64| starts.push((l.to_vec(), e, start));
        s.feed(b"x\nab", Instant::now(), 10, &mut emit);
        s.feed(b"cdef\n", Instant::now(), 10, &mut emit);
        assert_eq!(starts.last(), Some(&(b"abcd".to_vec(), LineEnd::Cut, 2)));
        s.reset();
        assert_eq!(s.position(), 0);
    }

    #[test]
    fn end_offsets_are_where_reading_resumes() {
        let mut ends = Vec::new();
        let mut s = LineSplitter::new(4).at(100);
        let mut emit = |l: &[u8], e: LineEnd, start: u64| {
            ends.push(line_end_offset(start, l.len(), e, 4));
        };
        // "ab\n" 100..103, "cde\n" 103..107, "fghi" cut (its rest "jk\n" discarded up to
        // 114), "z" flushed 114..115; then "abcé" cut to "abc" at a UTF-8 boundary still
        // ends after the 4 bytes taken (115..119).
        s.feed(b"ab\ncd", Instant::now(), 10, &mut emit);
        s.feed(b"e\nfghijk\nz", Instant::now(), 10, &mut emit);
        s.flush(&mut emit);
        s.feed("abcé".as_bytes(), Instant::now(), 10, &mut emit);
        assert_eq!(ends, vec![103, 107, 111, 115, 119]);
        assert!(ends.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn partial_flushes_after_timeout_only() {
        let mut s = LineSplitter::new(100);
        let t0 = Instant::now();
        s.feed(b"half", t0, 10, &mut |_, _, _| panic!("no line yet"));
        let mut got = Vec::new();
        assert!(!s.flush_if_stale(
            t0 + Duration::from_millis(999),
            Duration::from_secs(1),
            &mut |l, e, _| got.push((l.to_vec(), e))
        ));
        assert!(s.flush_if_stale(
            t0 + Duration::from_secs(1),
            Duration::from_secs(1),
            &mut |l, e, _| got.push((l.to_vec(), e))
        ));
        assert_eq!(got, vec![(b"half".to_vec(), LineEnd::Flushed)]);
        assert_eq!(s.partial_len(), 0);
    }

    #[test]
    fn record_message_never_exceeds_limit_after_lossy_conversion() {
        let mut out = Vec::new();
        let mut counts = LogSourceCounts::default();
        push_record(
            &mut out,
            &mut counts,
            "s",
            true,
            4,
            &[0xFF, 0xFF, 0xFF, 0xFF],
            LineEnd::Newline,
            Stamp {
                file_id: 9,
                end_offset: 5,
                timestamp_ns: 7,
            },
        );
        assert!(out[0].message.len() <= 4);
        assert_eq!((out[0].file_id, out[0].end_offset), (9, 5));
        assert_eq!(out[0].timestamp_ns, 7);
        assert_eq!(out[0].message, "\u{FFFD}");
        assert_eq!(counts.get(LogEvent::InvalidUtf8), 1);
        assert_eq!(counts.get(LogEvent::LineTruncated), 1);
        assert_eq!(counts.records, 1);
    }

    #[test]
    fn read_times_are_unix_nanoseconds() {
        assert_eq!(
            unix_ns(UNIX_EPOCH + Duration::from_millis(1500)),
            1_500_000_000
        );
        assert_eq!(
            unix_ns(UNIX_EPOCH - Duration::from_secs(1)),
            0,
            "before 1970"
        );
    }
}
