//! Where the tailer puts what it reads: each line through its file's [`Joiner`] (multi-line
//! records), each record built ([`push_record`]), parsed ([`Parser::apply`]) and kept with the
//! position of its first line.

use std::collections::VecDeque;
use std::time::{Instant, SystemTime};

use uctel_protocol::payload::LogRecord;

use super::checkpoint::RecordPos;
use super::lines::{push_record, unix_ns, LineEnd, Stamp};
use super::parse::{Joined, Joiner, Parser};
use super::rotation::FileId;
use super::{LogEvent, LogSourceCounts};

/// Where the tailer's `service` puts what it reads: the records, and in the same order where each
/// started; and the wall clock that stamps them.
pub(super) struct Emitted<'a> {
    pub(super) out: &'a mut Vec<LogRecord>,
    pub(super) positions: &'a mut VecDeque<RecordPos>,
    pub(super) wall: &'a mut dyn FnMut() -> SystemTime,
}

/// The file a line comes from, and the rules its record is built with.
pub(super) struct LineOrigin<'a> {
    pub(super) source: &'a str,
    pub(super) id: FileId,
    pub(super) generation: u64,
    pub(super) file_id: u64,
    pub(super) detect: bool,
    pub(super) max_line: usize,
    pub(super) parser: &'a Parser,
}

impl Emitted<'_> {
    /// Takes one line that a [`LineSplitter`] emitted (`line`, `end`, `start`) at `now`
    /// through the file's [`Joiner`] and keeps the records it completes ([`Emitted::record`]).
    pub(super) fn keep(
        &mut self,
        counts: &mut LogSourceCounts,
        from: &LineOrigin<'_>,
        joiner: &mut Joiner,
        (line, end, start): (&[u8], LineEnd, u64),
        now: Instant,
    ) {
        joiner.push(line, end, start, now, &mut |j| self.record(counts, from, j));
    }

    /// Keeps the multi-line record being joined now, if any; returns whether there was one.
    pub(super) fn flush(
        &mut self,
        counts: &mut LogSourceCounts,
        from: &LineOrigin<'_>,
        joiner: &mut Joiner,
    ) -> bool {
        joiner.flush(&mut |j| self.record(counts, from, j))
    }

    /// Keeps the multi-line record being joined if it is stale; returns whether it was.
    pub(super) fn flush_stale(
        &mut self,
        counts: &mut LogSourceCounts,
        from: &LineOrigin<'_>,
        joiner: &mut Joiner,
        now: Instant,
    ) -> bool {
        joiner.flush_if_stale(now, &mut |j| self.record(counts, from, j))
    }

    /// Keeps one record: stamped with the wall clock now ([`push_record`]), parsed
    /// ([`Parser::apply`]), and where its first line started.
    fn record(&mut self, counts: &mut LogSourceCounts, from: &LineOrigin<'_>, j: Joined<'_>) {
        let at = Stamp {
            file_id: from.file_id,
            end_offset: j.end_offset,
            timestamp_ns: unix_ns((self.wall)()),
        };
        let end = match (j.cut, j.flushed) {
            (true, _) => LineEnd::Cut,
            (false, true) => LineEnd::Flushed,
            (false, false) => LineEnd::Newline,
        };
        if j.cut && j.flushed {
            counts.bump(LogEvent::PartialLineFlushed);
        }
        if j.cut_bytes > 0 {
            counts.bump(LogEvent::RecordCut);
            counts.discarded_bytes += j.cut_bytes;
        }
        push_record(
            self.out,
            counts,
            from.source,
            from.detect,
            from.max_line,
            j.bytes,
            end,
            at,
        );
        if from.parser.is_active() {
            if let Some(r) = self.out.last_mut() {
                from.parser.apply(r, counts);
            }
        }
        self.positions.push_back(RecordPos {
            id: from.id,
            generation: from.generation,
            start: j.start,
        });
    }
}
