//! The checkpoint (state file): its JSON format, its load at start and its atomic save
//! (temporary file, fsync, rename), and the rule for where a restart resumes a file given the
//! records returned and not settled yet ([`ResumePoints`], sans-IO). What goes into an entry
//! (offsets, fingerprints) is decided by the tailer; see the parent module's documentation
//! ("Checkpoint and delivery guarantee").

use std::collections::HashMap;
use std::fs::File;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

use super::rotation::{FileId, Saved, SavedEntry};
use super::{CheckpointError, LogSourceError, HEAD_BYTES};

/// Version of the state file format.
const STATE_VERSION: u32 = 1;

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct StateFile {
    version: u32,
    files: Vec<StateEntry>,
}

/// One file of the state file. `head_len` and `head_hash` (the fingerprint) may be missing
/// (state files of older versions): the entry then matches on `(dev, inode)` alone.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(super) struct StateEntry {
    /// The path the file was followed at (lossy UTF-8).
    pub(super) path: String,
    /// [`FileId::dev`].
    pub(super) dev: u64,
    /// [`FileId::ino`].
    pub(super) ino: u64,
    /// Where reading resumes.
    pub(super) offset: u64,
    /// `offset` is inside an over-long line whose rest is discarded.
    #[serde(default)]
    pub(super) discarding: bool,
    /// Bytes covered by `head_hash`, at most [`HEAD_BYTES`] (64 in older versions).
    #[serde(default)]
    pub(super) head_len: usize,
    /// FNV-1a 64 of the file's first `head_len` bytes.
    #[serde(default)]
    pub(super) head_hash: u64,
    /// Bytes covered by `before_hash`: `min(offset, HEAD_BYTES)`. Missing in older versions
    /// and for files closed before the checkpoint (no recognition under another inode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) before_len: Option<usize>,
    /// FNV-1a 64 of the `before_len` bytes just before `offset`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) before_hash: Option<u64>,
    /// The file's stable identity sent with its records (`LogRecord::file_id`). Missing (0)
    /// in older versions: the file then gets a new one.
    #[serde(default)]
    pub(super) file_id: u64,
}

/// Reads the state file: `None` when there is none yet (the first run).
fn load_state(path: &Path) -> Result<Option<Vec<StateEntry>>, LogSourceError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(LogSourceError::State {
                path: path.to_owned(),
                reason: e.to_string(),
            })
        }
    };
    let state: StateFile = serde_json::from_str(&text).map_err(|e| LogSourceError::State {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    if state.version != STATE_VERSION {
        return Err(LogSourceError::State {
            path: path.to_owned(),
            reason: format!("version {} is not {STATE_VERSION}", state.version),
        });
    }
    Ok(Some(state.files))
}

/// The checkpoint found at start, as the tailer uses it.
#[derive(Debug, Default)]
pub(super) struct Loaded {
    /// The entries, for `match_checkpoint` at the first scan.
    pub(super) saved: Vec<SavedEntry>,
    /// The file each saved path named, for `reconcile`'s history (create-rotation while the
    /// agent was down).
    pub(super) history: HashMap<PathBuf, FileId>,
}

impl Loaded {
    fn from_entries(files: Vec<StateEntry>) -> Self {
        let mut loaded = Loaded::default();
        for e in files {
            let id = FileId {
                dev: e.dev,
                ino: e.ino,
            };
            let path = PathBuf::from(e.path);
            loaded.history.insert(path.clone(), id);
            loaded.saved.push(SavedEntry {
                id,
                path,
                pos: Saved {
                    offset: e.offset,
                    discarding: e.discarding,
                    // A longer fingerprint cannot be checked: it never matches.
                    head_len: e.head_len.min(HEAD_BYTES + 1),
                    head_hash: e.head_hash,
                    before: e.before_len.zip(e.before_hash),
                    file_id: e.file_id,
                },
            });
        }
        loaded
    }
}

/// Loads the checkpoint at `path`: `None` when there is none yet (the first run).
///
/// # Errors
/// [`LogSourceError::State`] when the file exists but cannot be read, does not parse, or is of
/// another version.
pub(super) fn load(path: &Path) -> Result<Option<Loaded>, LogSourceError> {
    Ok(load_state(path)?.map(Loaded::from_entries))
}

/// Writes `files` to `path` as the new checkpoint: JSON to `<path>.tmp`, fsynced, renamed
/// over `path`, then the directory fsynced (best effort).
///
/// # Errors
/// [`CheckpointError`] when the temporary file cannot be created, written or synced, or the
/// rename fails; the previous checkpoint then stays in place.
pub(super) fn save(path: &Path, files: Vec<StateEntry>) -> Result<(), CheckpointError> {
    let state = StateFile {
        version: STATE_VERSION,
        files,
    };
    let err = |source| CheckpointError {
        path: path.to_owned(),
        source,
    };
    let json = serde_json::to_vec_pretty(&state).map_err(|e| err(std::io::Error::other(e)))?;
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(".tmp");
    let tmp = PathBuf::from(tmp_name);
    {
        let mut f = File::create(&tmp).map_err(err)?;
        f.write_all(&json).map_err(err)?;
        f.sync_all().map_err(err)?;
    }
    std::fs::rename(&tmp, path).map_err(err)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        // Make the rename durable; best effort (not all filesystems allow fsync on a dir).
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// Where a record returned by `LogTailer::poll` came from: its file, the file's generation,
/// and the offset of the line's first byte (where reading resumes to read it again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RecordPos {
    /// The file.
    pub(super) id: FileId,
    /// The file's generation when the line was read (bumped at each truncation).
    pub(super) generation: u64,
    /// Offset of the line's first byte.
    pub(super) start: u64,
}

/// Where a restart resumes the files that records not settled yet came from (sans-IO): at the
/// start of each file's first unsettled line; at 0 when that line is of an older generation
/// (truncated away since: everything of the current generation is read again).
#[derive(Debug, Default)]
pub(super) struct ResumePoints {
    first: HashMap<FileId, RecordPos>,
}

impl ResumePoints {
    /// From the positions of the unsettled records, oldest first.
    pub(super) fn new<'a>(unsettled: impl IntoIterator<Item = &'a RecordPos>) -> Self {
        let mut first: HashMap<FileId, RecordPos> = HashMap::new();
        for p in unsettled {
            first.entry(p.id).or_insert(*p);
        }
        Self { first }
    }

    /// Where file `id`, now at `generation`, resumes; `None` when no unsettled record came
    /// from it (it resumes where reading is).
    pub(super) fn offset(&self, id: FileId, generation: u64) -> Option<u64> {
        self.first.get(&id).map(|p| {
            if p.generation == generation {
                p.start
            } else {
                0
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_entries_without_fingerprint_load() {
        let state: StateFile = serde_json::from_str(
            r#"{"version":1,"files":[{"path":"/l/a","dev":1,"ino":2,"offset":3}]}"#,
        )
        .expect("older state file");
        let e = state.files.first().expect("one entry");
        assert_eq!(
            (e.offset, e.head_len, e.head_hash, e.discarding, e.file_id),
            (3, 0, 0, false, 0)
        );
    }

    #[test]
    fn restart_resumes_at_the_first_unsettled_line_of_its_generation() {
        let a = FileId { dev: 1, ino: 1 };
        let b = FileId { dev: 1, ino: 2 };
        let pos = |id, generation, start| RecordPos {
            id,
            generation,
            start,
        };
        let unsettled = [pos(a, 0, 10), pos(b, 3, 7), pos(a, 0, 20), pos(a, 1, 0)];
        let points = ResumePoints::new(&unsettled);
        assert_eq!(points.offset(a, 0), Some(10), "the oldest unsettled line");
        assert_eq!(points.offset(a, 1), Some(0), "that line was truncated away");
        assert_eq!(points.offset(b, 3), Some(7));
        assert_eq!(
            points.offset(FileId { dev: 1, ino: 3 }, 0),
            None,
            "all settled"
        );
    }
}
