//! File identity and the rotation, truncation and start rules (sans-IO): each is a function of
//! what was observed — a file's `(dev, inode)`, its path, size and first bytes, the
//! checkpoint's entries — that returns a decision; the tailer does the stat(2)s and reads and
//! acts on the decisions. See the parent module's documentation ("Rotation and truncation",
//! "Start") for the rules in words.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use super::{StartAt, HEAD_BYTES};

/// Identity of a file: device and inode number (stat(2) `st_dev`, `st_ino`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId {
    /// The device the file is on (`st_dev`).
    pub dev: u64,
    /// The inode number on that device (`st_ino`).
    pub ino: u64,
}

/// What the size and head bytes of a followed file say (sans-IO).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Truncation {
    /// Nothing suspicious: keep reading at the offset.
    None,
    /// The file is shorter than the offset, or its first bytes changed: it was truncated
    /// (and possibly rewritten); restart at 0.
    Truncated,
}

/// Truncation rule: `size < offset`, or the first `head.len()` bytes now read `current_head`
/// instead of `head` (copytruncate followed by new writes past the old offset).
pub fn truncation_check(
    size: u64,
    offset: u64,
    head: &[u8],
    current_head: Option<&[u8]>,
) -> Truncation {
    if size < offset {
        return Truncation::Truncated;
    }
    match current_head {
        Some(cur) if !head.is_empty() && cur != head => Truncation::Truncated,
        _ => Truncation::None,
    }
}

/// A tracked file as `reconcile` sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct TrackedView {
    pub(super) id: FileId,
    pub(super) path: PathBuf,
    pub(super) orphaned: bool,
}

/// One decision of `reconcile`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Change {
    /// A tracked file is now at `path` (renamed within the watched set) and not orphaned.
    Moved { id: FileId, path: PathBuf },
    /// A tracked file is no longer at any watched path (rotated away or deleted).
    Orphaned { id: FileId },
    /// A file not tracked yet; `replaced` if the path named another file before.
    New {
        id: FileId,
        path: PathBuf,
        replaced: bool,
    },
}

/// Rotation detection from observations (sans-IO).
///
/// `observed`: every path stat'ed this poll that exists, with the file it names now.
/// `checked`: every path stat'ed this poll (existing or not). `history`: the file each path named
/// when last seen. A tracked file is orphaned when its own path was checked, no longer names it,
/// and it was not observed elsewhere.
pub(super) fn reconcile(
    tracked: &[TrackedView],
    observed: &[(PathBuf, FileId)],
    checked: &HashSet<PathBuf>,
    history: &HashMap<PathBuf, FileId>,
) -> Vec<Change> {
    let mut changes = Vec::new();
    let mut seen_at: HashMap<FileId, &PathBuf> = HashMap::new();
    for (path, id) in observed {
        // Prefer the file's current path if it is still observed there.
        let keep_current = tracked.iter().any(|t| t.id == *id && t.path == *path);
        if keep_current || !seen_at.contains_key(id) {
            seen_at.insert(*id, path);
        }
    }
    for t in tracked {
        match seen_at.get(&t.id) {
            Some(path) if **path != t.path || t.orphaned => changes.push(Change::Moved {
                id: t.id,
                path: (*path).clone(),
            }),
            Some(_) => {}
            None if !t.orphaned && checked.contains(&t.path) => {
                changes.push(Change::Orphaned { id: t.id })
            }
            None => {}
        }
    }
    let mut new_ids = HashSet::new();
    for (path, id) in observed {
        if tracked.iter().any(|t| t.id == *id) || !new_ids.insert(*id) {
            continue;
        }
        let replaced = history.get(path).is_some_and(|prev| prev != id);
        changes.push(Change::New {
            id: *id,
            path: path.clone(),
            replaced,
        });
    }
    changes
}

/// A saved position of one file (checkpoint entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Saved {
    /// Where reading resumes.
    pub(super) offset: u64,
    /// `offset` is inside an over-long line whose rest is being discarded.
    pub(super) discarding: bool,
    /// Bytes covered by `head_hash` (0: no fingerprint).
    pub(super) head_len: usize,
    /// FNV-1a 64 of the file's first `head_len` bytes.
    pub(super) head_hash: u64,
    /// `(len, FNV-1a 64)` of the `len = min(offset, HEAD_BYTES)` bytes just before `offset`;
    /// `None` when unknown (older state files, files closed before the checkpoint).
    pub(super) before: Option<(usize, u64)>,
    /// The file's stable identity (`LogRecord::file_id`); 0 in older state files.
    pub(super) file_id: u64,
}

impl Saved {
    /// Whether `head` (a file's first bytes, up to [`HEAD_BYTES`]) starts with the bytes this
    /// entry fingerprinted. No fingerprint matches anything.
    fn fingerprint_matches(&self, head: &[u8]) -> bool {
        self.head_len == 0
            || head
                .get(..self.head_len)
                .is_some_and(|h| fnv1a64(h) == self.head_hash)
    }

    /// Whether the fingerprints can recognise the file under another inode: its first
    /// [`HEAD_BYTES`] bytes and the bytes before the offset are known.
    fn names_content(&self) -> bool {
        self.head_len == HEAD_BYTES && self.before.is_some()
    }

    /// Whether this is a short file's entry whose fingerprints cover every byte read
    /// (`0 < offset ≤ head_len < HEAD_BYTES`, the bytes before the offset known): its
    /// content can be recognised in a copy only when its own inode was found truncated
    /// (the copytruncate signature), see `match_checkpoint`.
    fn names_short_content(&self) -> bool {
        self.head_len < HEAD_BYTES
            && self.offset > 0
            && self.offset <= self.head_len as u64
            && self
                .before
                .is_some_and(|(len, _)| len as u64 == self.offset)
    }
}

/// One entry of the state file loaded at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SavedEntry {
    pub(super) id: FileId,
    pub(super) path: PathBuf,
    pub(super) pos: Saved,
}

/// A file found by the first scan, as `match_checkpoint` sees it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Found<'a> {
    pub(super) id: FileId,
    pub(super) path: &'a Path,
    pub(super) size: u64,
    /// The file's first `min(size, HEAD_BYTES)` bytes.
    pub(super) head: &'a [u8],
}

/// What the checkpoint says about a file found at start (decision of `match_checkpoint`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Resume {
    /// Resume at the saved position. `copy_of`: the file was recognised by its fingerprint
    /// under another inode (a copy of the checkpointed file at that path).
    Saved {
        offset: u64,
        discarding: bool,
        copy_of: Option<PathBuf>,
        /// The entry's `file_id`, inherited by the file (0: none saved, a new one is drawn).
        file_id: u64,
    },
    /// The checkpoint knows this `(dev, inode)`, but the file's first bytes changed or it is
    /// shorter than the saved offset: truncated (or the inode reused) while the agent was down.
    Truncated { saved_offset: u64 },
    /// Not in the checkpoint.
    Unknown,
}

/// Matches the files found by the first scan to the checkpoint entries (sans-IO); one decision
/// per file of `found`, in its order. Rules (module documentation, "Start"): first by
/// `(dev, inode)` with a matching fingerprint; an entry whose inode no longer holds its content
/// may then be claimed by one file of another inode not in the checkpoint, at least as long as
/// the saved offset, whose first [`HEAD_BYTES`] bytes and whose bytes just before the saved
/// offset match (a copy; at the saved path first, then in path order). The entry of a file
/// shorter than [`HEAD_BYTES`] when checkpointed is claimed that way only when its own inode
/// was found truncated (copytruncate while the agent was down), by a file whose first bytes
/// are every byte read from it. Each entry resumes at most one file.
///
/// `hash_at(i, at, len)`: FNV-1a 64 of the `len` bytes of `found[i]` at offset `at`, `None` when
/// they cannot all be read (no match).
pub(super) fn match_checkpoint(
    entries: &[SavedEntry],
    found: &[Found<'_>],
    hash_at: &mut dyn FnMut(usize, u64, usize) -> Option<u64>,
) -> Vec<Resume> {
    let mut claimed = vec![false; entries.len()];
    // Entries whose own inode was found with other content or shorter than the offset.
    let mut truncated = vec![false; entries.len()];
    let mut out = vec![Resume::Unknown; found.len()];
    for (f, decision) in found.iter().zip(out.iter_mut()) {
        let Some(k) = entries
            .iter()
            .zip(&claimed)
            .position(|(e, c)| !c && e.id == f.id)
        else {
            continue;
        };
        let Some(e) = entries.get(k) else { continue };
        if e.pos.fingerprint_matches(f.head) && e.pos.offset <= f.size {
            if let Some(c) = claimed.get_mut(k) {
                *c = true;
            }
            *decision = Resume::Saved {
                offset: e.pos.offset,
                discarding: e.pos.discarding,
                copy_of: None,
                file_id: e.pos.file_id,
            };
        } else {
            // Not claimed: the content may live on in a copy.
            if let Some(t) = truncated.get_mut(k) {
                *t = true;
            }
            *decision = Resume::Truncated {
                saved_offset: e.pos.offset,
            };
        }
    }
    for ((e, c), was_truncated) in entries.iter().zip(claimed.iter_mut()).zip(&truncated) {
        let recognisable = e.pos.names_content() || (*was_truncated && e.pos.names_short_content());
        let Some((before_len, before_hash)) = e.pos.before.filter(|_| recognisable) else {
            continue;
        };
        if *c {
            continue;
        }
        let before_at = e.pos.offset.saturating_sub(before_len as u64);
        let pick = found
            .iter()
            .zip(&out)
            .enumerate()
            .filter(|(i, (f, d))| {
                **d == Resume::Unknown
                    && f.size >= e.pos.offset
                    && e.pos.fingerprint_matches(f.head)
                    && hash_at(*i, before_at, before_len) == Some(before_hash)
            })
            .min_by_key(|(_, (f, _))| (f.path != e.path, f.path))
            .map(|(i, _)| i);
        if let Some(decision) = pick.and_then(|i| out.get_mut(i)) {
            *c = true;
            *decision = Resume::Saved {
                offset: e.pos.offset,
                discarding: e.pos.discarding,
                copy_of: Some(e.path.clone()),
                file_id: e.pos.file_id,
            };
        }
    }
    out
}

/// Where to start reading a newly tracked file (sans-IO): `(offset, discarding)`. `resume` is
/// the checkpoint's word on it; `first_scan_of_first_run`: found by the first scan with no
/// state file to resume from, the only case where `start_at` applies (module documentation,
/// "Start"). Everything else the checkpoint does not know is new data, read from 0.
pub(super) fn start_position(
    resume: &Resume,
    size: u64,
    first_scan_of_first_run: bool,
    start_at: StartAt,
) -> (u64, bool) {
    match resume {
        Resume::Saved {
            offset, discarding, ..
        } => (*offset, *discarding),
        Resume::Truncated { .. } => (0, false),
        Resume::Unknown if first_scan_of_first_run && start_at == StartAt::End => (size, false),
        Resume::Unknown => (0, false),
    }
}

/// FNV-1a 64 of the head bytes (fingerprint stored in the state file).
pub(super) fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_rules() {
        assert_eq!(truncation_check(10, 20, b"", None), Truncation::Truncated);
        assert_eq!(
            truncation_check(20, 20, b"abc", Some(b"abc")),
            Truncation::None
        );
        assert_eq!(
            truncation_check(50, 20, b"abc", Some(b"xyz")),
            Truncation::Truncated
        );
        assert_eq!(truncation_check(50, 20, b"", Some(b"")), Truncation::None);
    }

    fn id(ino: u64) -> FileId {
        FileId { dev: 1, ino }
    }

    fn view(ino: u64, path: &str, orphaned: bool) -> TrackedView {
        TrackedView {
            id: id(ino),
            path: path.into(),
            orphaned,
        }
    }

    #[test]
    fn create_rotation_orphans_old_and_adds_new_as_replacement() {
        let tracked = [view(1, "/l/app.log", false)];
        let observed = [(PathBuf::from("/l/app.log"), id(2))];
        let checked: HashSet<PathBuf> = ["/l/app.log".into()].into();
        let history: HashMap<PathBuf, FileId> = [("/l/app.log".into(), id(1))].into();
        let changes = reconcile(&tracked, &observed, &checked, &history);
        assert_eq!(
            changes,
            vec![
                Change::Orphaned { id: id(1) },
                Change::New {
                    id: id(2),
                    path: "/l/app.log".into(),
                    replaced: true
                }
            ]
        );
    }

    #[test]
    fn rename_within_glob_is_a_move_not_an_orphan() {
        let tracked = [view(1, "/l/app.log", false)];
        let observed = [
            (PathBuf::from("/l/app.log"), id(2)),
            (PathBuf::from("/l/app.log.1"), id(1)),
        ];
        let checked: HashSet<PathBuf> = ["/l/app.log".into(), "/l/app.log.1".into()].into();
        let history: HashMap<PathBuf, FileId> = [("/l/app.log".into(), id(1))].into();
        let changes = reconcile(&tracked, &observed, &checked, &history);
        assert_eq!(
            changes,
            vec![
                Change::Moved {
                    id: id(1),
                    path: "/l/app.log.1".into()
                },
                Change::New {
                    id: id(2),
                    path: "/l/app.log".into(),
                    replaced: true
                }
            ]
        );
    }

    #[test]
    fn missing_path_orphans_and_unchecked_path_does_not() {
        let tracked = [view(1, "/l/a.log", false), view(2, "/l/b.log", false)];
        let checked: HashSet<PathBuf> = ["/l/a.log".into()].into();
        let changes = reconcile(&tracked, &[], &checked, &HashMap::new());
        assert_eq!(changes, vec![Change::Orphaned { id: id(1) }]);
    }

    #[test]
    fn same_file_under_two_paths_is_one_new_file() {
        let observed = [
            (PathBuf::from("/l/a"), id(7)),
            (PathBuf::from("/l/b"), id(7)),
        ];
        let changes = reconcile(&[], &observed, &HashSet::new(), &HashMap::new());
        assert_eq!(
            changes,
            vec![Change::New {
                id: id(7),
                path: "/l/a".into(),
                replaced: false
            }]
        );
    }

    #[test]
    fn orphan_seen_again_is_moved_back() {
        let tracked = [view(1, "/l/app.log", true)];
        let observed = [(PathBuf::from("/l/app.log.1"), id(1))];
        let changes = reconcile(&tracked, &observed, &HashSet::new(), &HashMap::new());
        assert_eq!(
            changes,
            vec![Change::Moved {
                id: id(1),
                path: "/l/app.log.1".into()
            }]
        );
    }

    #[test]
    fn start_position_rules() {
        let saved = Resume::Saved {
            offset: 100,
            discarding: true,
            copy_of: None,
            file_id: 7,
        };
        assert_eq!(start_position(&saved, 150, true, StartAt::End), (100, true));
        assert_eq!(
            start_position(
                &Resume::Truncated { saved_offset: 100 },
                50,
                false,
                StartAt::End
            ),
            (0, false)
        );
        assert_eq!(
            start_position(&Resume::Unknown, 150, true, StartAt::End),
            (150, false),
            "first scan of the first run"
        );
        assert_eq!(
            start_position(&Resume::Unknown, 150, true, StartAt::Beginning),
            (0, false)
        );
        assert_eq!(
            start_position(&Resume::Unknown, 150, false, StartAt::End),
            (0, false),
            "appeared later, or while the agent was down: new data"
        );
    }

    /// `n` bytes of a numbered log from line `from` on: "line 000001\n…" (12 bytes a line).
    fn numbered(from: u32, n: usize) -> Vec<u8> {
        let mut v: Vec<u8> = (from..)
            .flat_map(|i| format!("line {i:06}\n").into_bytes())
            .take(n)
            .collect();
        v.truncate(n);
        v
    }

    /// The checkpoint entry of a file holding `content` (as the agent saw it), at `offset`.
    fn entry(ino: u64, path: &str, content: &[u8], offset: u64) -> SavedEntry {
        let head = &content[..content.len().min(HEAD_BYTES)];
        let end = usize::try_from(offset).expect("small offset");
        let before = &content[end.saturating_sub(HEAD_BYTES)..end];
        SavedEntry {
            id: id(ino),
            path: path.into(),
            pos: Saved {
                offset,
                discarding: false,
                head_len: head.len(),
                head_hash: fnv1a64(head),
                before: Some((before.len(), fnv1a64(before))),
                file_id: 1000 + ino,
            },
        }
    }

    /// `match_checkpoint` over files given by (inode, path, whole content).
    fn decide(entries: &[SavedEntry], disk: &[(u64, &str, Vec<u8>)]) -> Vec<Resume> {
        let found: Vec<Found<'_>> = disk
            .iter()
            .map(|(ino, path, content)| Found {
                id: id(*ino),
                path: Path::new(path),
                size: content.len() as u64,
                head: &content[..content.len().min(HEAD_BYTES)],
            })
            .collect();
        match_checkpoint(entries, &found, &mut |i, at, len| {
            let content = &disk.get(i)?.2;
            let start = usize::try_from(at).ok()?;
            content.get(start..start.checked_add(len)?).map(fnv1a64)
        })
    }

    /// Resumed at `offset` with the `file_id` of the entry of inode 1 (every table below
    /// has one entry, of inode 1: a copy inherits its id).
    fn resume_at(offset: u64, copy_of: Option<&str>) -> Resume {
        Resume::Saved {
            offset,
            discarding: false,
            copy_of: copy_of.map(PathBuf::from),
            file_id: 1001,
        }
    }

    #[test]
    fn checkpoint_match_by_inode_and_fingerprint() {
        let old = numbered(1, 360);
        let entries = [entry(1, "/l/app.log", &old, 360)];
        // Same inode, same first bytes, grown: resume.
        assert_eq!(
            decide(&entries, &[(1, "/l/app.log", numbered(1, 420))]),
            vec![resume_at(360, None)]
        );
        // Same inode, other first bytes: truncated (and rewritten) while down.
        assert_eq!(
            decide(&entries, &[(1, "/l/app.log", numbered(36, 60))]),
            vec![Resume::Truncated { saved_offset: 360 }]
        );
        // Same inode and first bytes, but shorter than the offset: truncated too.
        assert_eq!(
            decide(&entries, &[(1, "/l/app.log", numbered(1, 300))]),
            vec![Resume::Truncated { saved_offset: 360 }]
        );
        // Another inode, not in the checkpoint: unknown.
        assert_eq!(
            decide(&entries, &[(2, "/l/b.log", numbered(36, 60))]),
            vec![Resume::Unknown]
        );
    }

    #[test]
    fn copytruncate_while_down_resumes_the_copy_and_rereads_the_original() {
        // Checkpoint: app.log (inode 1) at 360. While down: 60 more bytes; cp app.log
        // app.log.1 (inode 2, 420 bytes); : > app.log; 60 new bytes.
        let entries = [entry(1, "/l/app.log", &numbered(1, 360), 360)];
        let disk = [
            (1, "/l/app.log", numbered(36, 60)),
            (2, "/l/app.log.1", numbered(1, 420)),
        ];
        assert_eq!(
            decide(&entries, &disk),
            vec![
                Resume::Truncated { saved_offset: 360 },
                resume_at(360, Some("/l/app.log"))
            ]
        );
        // A copy shorter than the saved offset is not that file's copy.
        let disk = [(2, "/l/app.log.1", numbered(1, 300))];
        assert_eq!(decide(&entries, &disk), vec![Resume::Unknown]);
    }

    #[test]
    fn same_first_bytes_but_other_bytes_before_the_offset_is_not_a_copy() {
        // Files that open with the same 300-byte banner: app.log rotated away while down (the
        // glob does not match the rotated name) and a new app.log with the same banner.
        let banner = vec![b'#'; 300];
        let old: Vec<u8> = [banner.clone(), numbered(1, 120)].concat();
        let new: Vec<u8> = [banner, numbered(500, 240)].concat();
        let entries = [entry(1, "/l/app.log", &old, 420)];
        assert_eq!(
            decide(&entries, &[(2, "/l/app.log", new)]),
            vec![Resume::Unknown]
        );
        // Without the bytes before the offset (older state file), no recognition by content.
        let mut entries = entries;
        entries[0].pos.before = None;
        assert_eq!(
            decide(&entries, &[(2, "/l/app.log.1", old)]),
            vec![Resume::Unknown]
        );
    }

    #[test]
    fn an_entry_claimed_by_its_inode_is_not_claimed_by_a_copy_too() {
        // cp app.log app.log.1 while down, no truncation: both hold the same bytes.
        let content = numbered(1, 360);
        let entries = [entry(1, "/l/app.log", &content, 360)];
        let disk = [
            (2, "/l/app.log.1", content.clone()),
            (1, "/l/app.log", content),
        ];
        assert_eq!(
            decide(&entries, &disk),
            vec![Resume::Unknown, resume_at(360, None)]
        );
    }

    #[test]
    fn several_copies_prefer_the_saved_path_then_path_order() {
        let content = numbered(1, 300);
        let entries = [entry(1, "/l/app.log", &content, 300)];
        // The original is gone; a same-content file was moved onto its path (new inode).
        let disk = [
            (3, "/l/app.log.1", content.clone()),
            (2, "/l/app.log", content.clone()),
        ];
        assert_eq!(
            decide(&entries, &disk),
            vec![Resume::Unknown, resume_at(300, Some("/l/app.log"))]
        );
        let disk = [
            (3, "/l/app.log.2", content.clone()),
            (2, "/l/app.log.1", content),
        ];
        assert_eq!(
            decide(&entries, &disk),
            vec![Resume::Unknown, resume_at(300, Some("/l/app.log"))]
        );
    }

    #[test]
    fn short_and_missing_fingerprints_match_on_inode_only() {
        // A file of 60 bytes when checkpointed, copied while down (cp app.log app.log.1; :
        // > app.log): its inode holds other bytes now, and the copy starts with every byte
        // read: resumed at the saved offset, nothing read twice.
        let short = numbered(1, 60);
        let entries = [entry(1, "/l/app.log", &short, 60)];
        let grown = numbered(1, 84);
        let disk = [
            (1, "/l/app.log", numbered(36, 24)),
            (2, "/l/app.log.1", grown),
        ];
        assert_eq!(
            decide(&entries, &disk),
            vec![
                Resume::Truncated { saved_offset: 60 },
                resume_at(60, Some("/l/app.log"))
            ]
        );
        // Its inode gone (rotated out of the glob, or removed): a new file that starts with
        // the same few bytes is not taken for it (read from 0 rather than risk skipping
        // another file's first lines).
        let disk = [(2, "/l/app.log", short.clone())];
        assert_eq!(decide(&entries, &disk), vec![Resume::Unknown]);
        // Other bytes in the copy: not a copy.
        let disk = [
            (1, "/l/app.log", Vec::new()),
            (2, "/l/app.log.1", numbered(2, 60)),
        ];
        assert_eq!(
            decide(&entries, &disk),
            vec![Resume::Truncated { saved_offset: 60 }, Resume::Unknown]
        );
        // No fingerprint at all (older state file): the inode is trusted.
        let mut entries = [entry(1, "/l/app.log", &[], 0)];
        entries[0].pos.offset = 4;
        entries[0].pos.before = None;
        assert_eq!(
            decide(&entries, &[(1, "/l/app.log", numbered(9, 24))]),
            vec![resume_at(4, None)]
        );
        // A 64-byte fingerprint of an older version: checked on its inode, never across.
        let content = numbered(1, 320);
        let mut entries = [entry(1, "/l/app.log", &content[..64], 64)];
        entries[0].pos.offset = 300;
        entries[0].pos.before = None;
        let disk = [
            (1, "/l/app.log", content.clone()),
            (2, "/l/app.log.1", content),
        ];
        assert_eq!(
            decide(&entries, &disk),
            vec![resume_at(300, None), Resume::Unknown]
        );
    }

    #[test]
    fn fingerprint_longer_than_head_bytes_never_matches() {
        let s = Saved {
            offset: 0,
            discarding: false,
            head_len: HEAD_BYTES + 1,
            head_hash: 0,
            before: Some((0, fnv1a64(&[]))),
            file_id: 0,
        };
        assert!(!s.fingerprint_matches(&[0; HEAD_BYTES]));
        assert!(!s.names_content());
    }
}
