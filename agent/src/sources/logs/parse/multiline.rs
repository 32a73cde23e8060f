//! Multi-line records: joins the lines of one record by a start pattern (sans-IO).

use std::time::{Duration, Instant};

use regex::bytes::Regex;

use super::super::lines::{line_end_offset, LineEnd};

/// One record as the [`Joiner`] hands it on: its lines joined with `\n`.
#[derive(Debug, PartialEq)]
pub struct Joined<'a> {
    /// The lines, joined with `\n`, at most `max_bytes`.
    pub bytes: &'a [u8],
    /// Offset of the first line's first byte: where a restart reads the record again.
    pub start: u64,
    /// Where reading resumes after its last line ([`line_end_offset`]): the record's
    /// `end_offset`, covering every line it holds.
    pub end_offset: u64,
    /// A line of it was longer than `max_line_bytes` and was cut by the splitter (the rest
    /// of that line counted there).
    pub cut: bool,
    /// Bytes of the joined lines (with their `\n`s) past `max_bytes`, not kept (0: the
    /// record is whole).
    pub cut_bytes: u64,
    /// Its last line was emitted without its newline ([`LineEnd::Flushed`]).
    pub flushed: bool,
}

/// The record being joined.
#[derive(Debug)]
struct Pending {
    buf: Vec<u8>,
    start: u64,
    end_offset: u64,
    cut: bool,
    cut_bytes: u64,
    flushed: bool,
    last_line_at: Instant,
}

/// Joins lines into records: a line matching `start` begins a new record, any other line is
/// appended (with `\n`) to the current one. The current record is handed on when the next
/// start line arrives, at [`Joiner::flush_if_stale`] once no line was added for `timeout`,
/// or at [`Joiner::flush`]. Without a pattern every line is handed on at once, unchanged.
/// A record holds at most `max_bytes` bytes: past that, its further bytes are not kept and
/// are counted ([`Joined::cut_bytes`]), but its lines still belong to it (its `end_offset`
/// covers them), so a record is never split into two.
#[derive(Debug)]
pub struct Joiner {
    start: Option<Regex>,
    timeout: Duration,
    max_bytes: usize,
    max_line_bytes: usize,
    pending: Option<Pending>,
}

impl Joiner {
    /// A joiner with start pattern `start` (`None`: one record per line) and flush timeout
    /// `timeout`; records of at most `max_bytes` bytes, lines from a splitter of
    /// `max_line_bytes` (for their end offsets).
    pub fn new(
        start: Option<Regex>,
        timeout: Duration,
        max_bytes: usize,
        max_line_bytes: usize,
    ) -> Self {
        Self {
            start,
            timeout,
            max_bytes,
            max_line_bytes,
            pending: None,
        }
    }

    /// Where the record being joined starts: nothing before it is held, nothing from it on is
    /// handed on (a checkpoint resumes there).
    pub fn pending_start(&self) -> Option<u64> {
        self.pending.as_ref().map(|p| p.start)
    }

    /// Forgets the record being joined (its lines are read again: a rewind).
    pub fn reset(&mut self) {
        self.pending = None;
    }

    /// Takes one line that a splitter emitted (`line`, `end`, `start`) at `now`; hands on the
    /// records it completes (0 or 1, or the line itself without a pattern).
    pub fn push(
        &mut self,
        line: &[u8],
        end: LineEnd,
        start: u64,
        now: Instant,
        emit: &mut dyn FnMut(Joined<'_>),
    ) {
        let end_offset = line_end_offset(start, line.len(), end, self.max_line_bytes);
        let Some(re) = &self.start else {
            emit(Joined {
                bytes: line,
                start,
                end_offset,
                cut: end == LineEnd::Cut,
                cut_bytes: 0,
                flushed: end == LineEnd::Flushed,
            });
            return;
        };
        let starts = re.is_match(line);
        match &mut self.pending {
            Some(p) if !starts => {
                let room = self.max_bytes.saturating_sub(p.buf.len());
                let want = line.len() + 1;
                let kept = if want <= room {
                    want
                } else if room > 1 {
                    1 + utf8_floor(line, room - 1)
                } else {
                    0
                };
                if kept > 0 {
                    p.buf.push(b'\n');
                    p.buf
                        .extend_from_slice(line.get(..kept - 1).unwrap_or_default());
                }
                if kept < want {
                    p.cut_bytes += (want - kept) as u64;
                }
                p.cut |= end == LineEnd::Cut;
                p.flushed = end == LineEnd::Flushed;
                p.end_offset = end_offset;
                p.last_line_at = now;
                return;
            }
            _ => {}
        }
        self.flush(emit);
        let take = utf8_floor(line, self.max_bytes);
        self.pending = Some(Pending {
            buf: line.get(..take).unwrap_or_default().to_vec(),
            start,
            end_offset,
            cut: end == LineEnd::Cut,
            cut_bytes: (line.len() - take) as u64,
            flushed: end == LineEnd::Flushed,
            last_line_at: now,
        });
    }

    /// Hands on the record being joined if no line was added to it for the timeout. Returns
    /// whether one was.
    pub fn flush_if_stale(&mut self, now: Instant, emit: &mut dyn FnMut(Joined<'_>)) -> bool {
        match &self.pending {
            Some(p) if now.saturating_duration_since(p.last_line_at) >= self.timeout => {
                self.flush(emit)
            }
            _ => false,
        }
    }

    /// Hands on the record being joined now, if any. Returns whether one was.
    pub fn flush(&mut self, emit: &mut dyn FnMut(Joined<'_>)) -> bool {
        let Some(p) = self.pending.take() else {
            return false;
        };
        emit(Joined {
            bytes: &p.buf,
            start: p.start,
            end_offset: p.end_offset,
            cut: p.cut,
            cut_bytes: p.cut_bytes,
            flushed: p.flushed,
        });
        true
    }
}

/// The longest prefix of `b` of at most `max` bytes that does not end inside a UTF-8
/// sequence (backing off at most 3 bytes).
fn utf8_floor(b: &[u8], max: usize) -> usize {
    if b.len() <= max {
        return b.len();
    }
    let mut at = max;
    // A continuation byte (10xxxxxx) at the cut means a character spans it.
    while at > 0 && max - at < 3 && b.get(at).is_some_and(|c| c & 0xC0 == 0x80) {
        at -= 1;
    }
    if b.get(at).is_some_and(|c| c & 0xC0 == 0x80) {
        max
    } else {
        at
    }
}
