//! Entries vacuumed before the source read them (sans-IO): the gaps in the journal's
//! sequence numbers.
//!
//! journald numbers every entry it writes (`__SEQNUM`, the cursor's `i=`, in hex) within a
//! sequence id (`__SEQNUM_ID`, the cursor's `s=`), one by one across file rotations: a new
//! file continues its predecessor's sequence (sd_journal_get_cursor(3); journal-file.c
//! `journal_file_entry_seqnum`). journalctl prints the entries of one sequence id in
//! sequence order, every entry still in the journal, so when it prints every entry (no
//! journalctl-side match) a jump from `n` to `n + 1 + k` within one sequence id means `k`
//! entries were deleted (vacuumed or rotated away) before they were read. A different
//! sequence id (another journal file set, another machine, a journal started afresh) is not
//! a hole. systemd 252 (Debian 12) prints no `__SEQNUM` field; the cursor carries the same
//! number and is what is read here.

use std::collections::VecDeque;

use super::entry::cursor_seqnum;

/// Sequence ids remembered at once (a journal directory interleaving several machines'
/// files); the least recently seen is forgotten past it (its next entry starts afresh).
const MAX_SEQUENCES: usize = 16;

/// The last sequence number read per sequence id.
#[derive(Debug, Clone, Default)]
pub struct SeqnumGaps {
    /// `(sequence id, last sequence number)`, most recently seen last.
    last: VecDeque<(String, u64)>,
}

impl SeqnumGaps {
    /// Starts from `cursor` (the entry read last; `None`: nothing read yet), forgetting
    /// everything else.
    pub fn reset(&mut self, cursor: Option<&str>) {
        self.last.clear();
        if let Some((id, seq)) = cursor.and_then(cursor_seqnum) {
            self.last.push_back((id.to_owned(), seq));
        }
    }

    /// The entry at `cursor` was read: returns how many sequence numbers were skipped since
    /// the last entry of its sequence id (0 for the first entry of a sequence id, an entry
    /// read again, or a cursor without `s=`/`i=`).
    pub fn read(&mut self, cursor: &str) -> u64 {
        let Some((id, seq)) = cursor_seqnum(cursor) else {
            return 0;
        };
        let (gap, last) = match self.last.iter().position(|(i, _)| i == id) {
            Some(p) => {
                let (_, prev) = self.last.remove(p).unwrap_or_default();
                (seq.saturating_sub(prev).saturating_sub(1), prev.max(seq))
            }
            None => (0, seq),
        };
        if self.last.len() >= MAX_SEQUENCES {
            self.last.pop_front();
        }
        self.last.push_back((id.to_owned(), last));
        gap
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_within_one_sequence_id_only() {
        let mut g = SeqnumGaps::default();
        g.reset(Some("s=a;i=5;b=1"));
        assert_eq!(g.read("s=a;i=5;b=1"), 0, "the saved entry itself");
        assert_eq!(g.read("s=a;i=6"), 0);
        assert_eq!(g.read("s=a;i=a"), 3, "7, 8, 9 missing");
        assert_eq!(g.read("s=b;i=64"), 0, "another sequence id is not a hole");
        assert_eq!(g.read("s=a;i=c"), 1, "11 missing, across the other id");
        assert_eq!(g.read("s=a;i=b"), 0, "read again: no hole, no step back");
        assert_eq!(g.read("s=a;i=d"), 0);
        assert_eq!(g.read("nonsense"), 0);
        g.reset(None);
        assert_eq!(g.read("s=a;i=ff"), 0, "nothing read before");
    }

    #[test]
    fn ids_are_bounded() {
        let mut g = SeqnumGaps::default();
        for i in 0..100 {
            g.read(&format!("s={i};i=1"));
        }
        assert_eq!(g.last.len(), MAX_SEQUENCES);
        assert_eq!(g.read("s=99;i=3"), 1);
    }
}
