//! Where the journald source resumes (sans-IO but for the state file): the cursor of the
//! last entry settled, and the positions of the records returned and not settled yet. The
//! same replay rule as the file tailer (`sources::logs`, "Checkpoint and delivery
//! guarantee"): the saved cursor covers only settled records.

use std::collections::VecDeque;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

/// Version of the journald state file.
const STATE_VERSION: u32 = 1;

/// The journald state file: `{"version":1,"cursor":"s=…"}`; `cursor` null = from the
/// journal's first entry.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct StateFile {
    version: u32,
    cursor: Option<String>,
}

/// Loads the saved cursor: `Ok(None)` when there is no state file yet (the first run),
/// `Ok(Some(None))` for "from the journal's first entry".
///
/// # Errors
/// The file exists but cannot be read or parsed, or is of another version.
pub(super) fn load(path: &Path) -> Result<Option<Option<String>>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let state: StateFile = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    if state.version != STATE_VERSION {
        return Err(format!("version {} is not {STATE_VERSION}", state.version));
    }
    Ok(Some(state.cursor))
}

/// Writes `cursor` to `path` atomically (temporary file, fsync, rename, directory fsync best
/// effort), as the file tailer writes its checkpoint.
///
/// # Errors
/// The OS error of the create, write, sync or rename; the previous file stays in place.
pub(super) fn save(path: &Path, cursor: Option<&str>) -> std::io::Result<()> {
    let state = StateFile {
        version: STATE_VERSION,
        cursor: cursor.map(str::to_owned),
    };
    let json = serde_json::to_vec(&state).map_err(std::io::Error::other)?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&json)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// The read position and the records not settled yet.
///
/// Each returned record remembers the cursor of the entry read just before it (the entries
/// between two records were excluded by the agent's filters): resuming after that cursor
/// reads the record again. `None` = before the journal's first entry.
#[derive(Debug, Clone, Default)]
pub struct Positions {
    /// Cursor before each unsettled record, oldest first.
    unsettled: VecDeque<Option<String>>,
    /// The last entry read (returned or excluded).
    last_read: Option<String>,
}

impl Positions {
    /// Starts after `cursor` (`None`: at the journal's first entry).
    pub fn new(cursor: Option<String>) -> Self {
        Self {
            unsettled: VecDeque::new(),
            last_read: cursor,
        }
    }

    /// An entry was read: `returned` when it became a record (it must be settled), not when
    /// a filter excluded it.
    pub fn read(&mut self, cursor: &str, returned: bool) {
        if returned {
            self.unsettled.push_back(self.last_read.take());
        }
        self.last_read = Some(cursor.to_owned());
    }

    /// The oldest `n` unsettled records are settled.
    pub fn settle(&mut self, n: usize) {
        let n = n.min(self.unsettled.len());
        self.unsettled.drain(..n);
    }

    /// Records returned and not settled.
    pub fn unsettled(&self) -> usize {
        self.unsettled.len()
    }

    /// The cursor a restart resumes after: before the first unsettled record, or the last
    /// entry read when every record is settled.
    pub fn resume(&self) -> Option<&str> {
        match self.unsettled.front() {
            Some(before) => before.as_deref(),
            None => self.last_read.as_deref(),
        }
    }

    /// The cursor reading goes on after (a restarted journalctl).
    pub fn last_read(&self) -> Option<&str> {
        self.last_read.as_deref()
    }

    /// Forgets the unsettled records: reading goes back to [`Positions::resume`].
    pub fn rewind(&mut self) {
        let resume = self.resume().map(str::to_owned);
        self.unsettled.clear();
        self.last_read = resume;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_resume_cursor_covers_only_settled_records() {
        let mut p = Positions::new(Some("c0".into()));
        assert_eq!(p.resume(), Some("c0"));
        p.read("c1", true);
        p.read("c2", false); // excluded
        p.read("c3", true);
        assert_eq!(p.unsettled(), 2);
        assert_eq!(
            p.resume(),
            Some("c0"),
            "c1 not settled: read again after c0"
        );
        p.settle(1);
        assert_eq!(
            p.resume(),
            Some("c2"),
            "c3 is read again, c2 excluded again"
        );
        p.settle(5);
        assert_eq!(p.resume(), Some("c3"));
        assert_eq!(p.unsettled(), 0);
    }

    #[test]
    fn from_the_first_entry_and_rewind() {
        let mut p = Positions::new(None);
        p.read("c1", true);
        p.read("c2", true);
        assert_eq!(p.resume(), None);
        p.settle(1);
        p.rewind();
        assert_eq!((p.unsettled(), p.last_read()), (0, Some("c1")));
    }

    #[test]
    fn state_file_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("journald.json");
        assert_eq!(load(&f), Ok(None));
        save(&f, Some("s=1;i=2")).unwrap();
        assert_eq!(load(&f), Ok(Some(Some("s=1;i=2".into()))));
        save(&f, None).unwrap();
        assert_eq!(load(&f), Ok(Some(None)));
        std::fs::write(&f, "{\"version\":9,\"cursor\":null}").unwrap();
        assert!(load(&f).is_err());
        std::fs::write(&f, "nonsense").unwrap();
        assert!(load(&f).is_err());
    }
}
