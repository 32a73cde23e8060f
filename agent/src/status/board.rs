//! What the agent's sources and sender put on the status [`Board`] as they run: the files
//! each log source follows, the last scrape of each target, the credit window. The rest
//! of the status document comes from the self-metrics registry.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde::Serialize;

/// One file a log source follows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileView {
    /// Its path when opened (a rotated file keeps the path it had).
    pub path: String,
    /// `st_dev` of the file.
    pub dev: u64,
    /// `st_ino` of the file.
    pub inode: u64,
    /// The stable identity sent with every record (`LogRecord.file_id`, kept in the
    /// checkpoint), hex: the file's fingerprint across renames.
    pub fingerprint: String,
    /// Bytes of the file consumed into whole lines.
    pub offset_bytes: u64,
    /// The file's size when last looked at (the status request looks again).
    pub size_bytes: u64,
    /// True for a file rotated away that is still being read to its end.
    pub rotated: bool,
}

/// The last scrape of one target.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScrapeView {
    /// The target's URL.
    pub url: String,
    /// 1 when the last scrape succeeded (the `up` sample shipped with it), else 0.
    pub up: u8,
    /// How long the last scrape took, seconds (`scrape_duration_seconds`).
    pub last_duration_seconds: f64,
    /// When it ended (Unix seconds).
    pub last_scrape_unix_seconds: f64,
    /// Why it failed: the reason label of `source_errors_total{source="scrape"}` and the
    /// detail; `null` when `up` is 1.
    pub error: Option<String>,
    /// Scrapes done since start.
    pub scrapes: u64,
}

/// Where the journald source is (`sources.journald`; cursors are journalctl's `__CURSOR`,
/// sd_journal_get_cursor(3)).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct JournaldView {
    /// The cursor of the last entry read (sent on or excluded by a filter); `null` before
    /// the first.
    pub last_read_cursor: Option<String>,
    /// The cursor a restart resumes after: every record up to it is settled (sent, or
    /// dropped and counted); the state file holds it after the next checkpoint. `null`
    /// before the start position is known (or before the journal's first entry).
    pub settled_cursor: Option<String>,
    /// Entries read since the source started (sent on or excluded).
    pub entries_read: u64,
    /// Records read and not settled yet: the lag between reading and sending, records.
    /// The lag behind the journal's end is not known without asking journalctl: not given.
    pub unsettled_records: u64,
}

/// Where the kernel log source is (`sources.kmsg`; sequence numbers are the kernel's,
/// Documentation/ABI/testing/dev-kmsg).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct KmsgView {
    /// The sequence number of the last record read (or resumed after); `null` before.
    pub last_seq: Option<u64>,
    /// The first sequence number not settled yet (what a restart resumes at).
    pub settled_next_seq: Option<u64>,
    /// Records read and not settled yet.
    pub unsettled_records: u64,
}

/// The UC lane's credit window at the last heartbeat (DESIGN.md §4), frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CreditView {
    /// The window in force: the ring's, capped by the collector's latest grant.
    pub window_frames: u64,
    /// What the collector's latest grant allows.
    pub granted_window_frames: u64,
    /// Frames posted and not yet reported consumed.
    pub outstanding_frames: u64,
    /// Frames that may still be posted now.
    pub available_frames: u64,
}

#[derive(Debug, Default)]
struct Inner {
    files: BTreeMap<String, Vec<FileView>>,
    scrapes: BTreeMap<String, ScrapeView>,
    credit: Option<CreditView>,
    journald: Option<JournaldView>,
    kmsg: Option<KmsgView>,
}

/// Shared by the sources, the sender and the status route; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Board(Arc<Mutex<Inner>>);

impl Board {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The log source `source` (its first include pattern) follows `files` now.
    pub fn set_files(&self, source: &str, files: Vec<FileView>) {
        self.lock().files.insert(source.to_owned(), files);
    }

    /// A scrape of `url` ended at `at` after `seconds`: `error` is `None` when it succeeded.
    pub fn scraped(&self, url: &str, seconds: f64, at: SystemTime, error: Option<String>) {
        let mut g = self.lock();
        let scrapes = g.scrapes.get(url).map_or(0, |s| s.scrapes) + 1;
        g.scrapes.insert(
            url.to_owned(),
            ScrapeView {
                url: url.to_owned(),
                up: u8::from(error.is_none()),
                last_duration_seconds: seconds,
                last_scrape_unix_seconds: uctel_common::status::unix_seconds(at),
                error,
                scrapes,
            },
        );
    }

    /// The scrape target `url` was removed by a reload: its last scrape leaves the board.
    pub fn forget_scrape(&self, url: &str) {
        self.lock().scrapes.remove(url);
    }

    /// The journald source is at `view` now; `None`: it was removed (a reload).
    pub fn set_journald(&self, view: Option<JournaldView>) {
        self.lock().journald = view;
    }

    /// The kmsg source is at `view` now; `None`: it was removed (a reload).
    pub fn set_kmsg(&self, view: Option<KmsgView>) {
        self.lock().kmsg = view;
    }

    /// The journald source's position, `None` without one.
    pub fn journald(&self) -> Option<JournaldView> {
        self.lock().journald.clone()
    }

    /// The kmsg source's position, `None` without one.
    pub fn kmsg(&self) -> Option<KmsgView> {
        self.lock().kmsg.clone()
    }

    /// The credit window at a heartbeat; `None` when the session ended.
    pub fn set_credit(&self, credit: Option<CreditView>) {
        self.lock().credit = credit;
    }

    /// Every log source's files, by source.
    pub fn files(&self) -> BTreeMap<String, Vec<FileView>> {
        self.lock().files.clone()
    }

    /// Every scrape target's last scrape, by URL.
    pub fn scrapes(&self) -> Vec<ScrapeView> {
        self.lock().scrapes.values().cloned().collect()
    }

    /// The credit window at the last heartbeat of the session now; `None` without one.
    pub fn credit(&self) -> Option<CreditView> {
        self.lock().credit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scrapes_are_counted_and_the_last_one_kept() {
        let b = Board::default();
        b.scraped("http://a/metrics", 0.5, SystemTime::now(), None);
        b.scraped(
            "http://a/metrics",
            1.5,
            SystemTime::now(),
            Some("timeout: no answer".into()),
        );
        let s = b.scrapes();
        assert_eq!(s.len(), 1);
        assert_eq!((s[0].up, s[0].scrapes), (0, 2));
        assert_eq!(s[0].last_duration_seconds, 1.5);
        assert!(b.credit().is_none());
    }
}
