//! journald source (`sources.journald`): the systemd journal's entries as log records, with
//! their own time, their priority as severity and their unit, PID, command and syslog
//! identifier as fields (DESIGN.md §7).
//!
//! # How the journal is read
//!
//! Through `journalctl --output=json --all --follow` (with `--directory` when
//! [`JournaldSection::directory`] is set), as Vector's `journald` source does, not through
//! libsystemd's `sd_journal` API: the journal file format is systemd's own and changes
//! between versions (compact mode, new compression), and journalctl is the reader systemd
//! ships and keeps in step with the files on the same host; a child process needs no C
//! library linked into the agent (the crate's `unsafe` stays in `sources::sys`), and a
//! fault in it cannot take the agent down. journalctl interleaves every journal file of the
//! directory (archived files included) in order and follows rotation and deletion
//! (vacuum) while it runs: it watches the directory and keeps deleted files open until read.
//!
//! # Position and replay
//!
//! Every entry has a cursor (`__CURSOR`, sd_journal_get_cursor(3)). The source saves, in
//! `<state_directory>/journald.json`, the cursor of the last entry *settled* (sent, or dropped
//! and counted for a reason other than `shutdown`), exactly as the file tailer checkpoints
//! offsets (`sources::logs`, "Checkpoint and delivery guarantee"; the same
//! `runners::settled_source_loop` runs both), and resumes with `--after-cursor`: a restart
//! after SIGTERM neither repeats nor skips an entry; after SIGKILL the entries sent since the
//! last checkpoint are read again, and the collector discards them as replays: each record
//! carries `file_id` = FNV-1a 64 of the cursor's sequence id (`s=`) and `end_offset` = its
//! sequence number (`i=`), which journald increases by one per entry across file rotations
//! (systemd-journal-remote starts a new sequence id per output file). A cursor whose entry
//! was vacuumed while the agent was down still places journalctl (sd_journal_seek_cursor(3)
//! seeks by sequence number, then by boot and monotonic time, then by wall time): reading
//! goes on with the first entry after it (journalctl is started with `--cursor`, and the
//! entry it prints first is skipped only when it is the saved one: `--after-cursor` would
//! skip it regardless); the entries vacuumed unread are gone, and counted (below).
//!
//! # Entries vacuumed unread
//!
//! Entries deleted from the journal before the source read them (`journalctl --vacuum-*`,
//! journald's `SystemMaxUse=`/`MaxFileSec=`, while the agent was down or behind) are found
//! from the gaps in the journal's sequence numbers ([`SeqnumGaps`]: the cursor's `s=`
//! sequence id and `i=` number, which systemd 252 prints where systemd ≥ 254 also prints
//! `__SEQNUM`/`__SEQNUM_ID`). Without `include_units`/`include_matches` journalctl prints
//! every entry still in the journal, so each gap within one sequence id is exactly the
//! entries deleted unread: counted as dropped
//! (`uctel_agent_records_dropped_total{stream="logs",reason="journal_vacuumed"}`) and logged
//! once. A new sequence id (another journal file set or machine) is not a hole. With
//! journalctl-side matches the stream skips every entry that does not match, so the hole
//! is looked for only when journalctl starts (agent start, journalctl restart): one
//! `journalctl --cursor=<last read> --lines=2` without matches finds the next entry of the
//! whole journal; the entries missing before it, of any unit, are counted in
//! `uctel_agent_journal_events_total{reason="vacuumed_unfiltered"}`, an upper bound on the
//! records lost (which of them would have matched is gone with them). Both need the
//! agent's user to read the whole journal (root or group `systemd-journal`): journalctl
//! skips the files it cannot open, and their entries would read as holes.
//!
//! The first run (no state file) starts at `start_at`: `end` (default) takes the cursor of
//! the journal's last matching entry (`journalctl -n 1`) and reads what comes after it,
//! `beginning` reads the whole journal; the position is saved at once.
//!
//! # Filters
//!
//! `include_units` and `include_matches` are passed to journalctl as matches
//! (journalctl(1) "matches": values of one field are alternatives, different fields must
//! all match), so journalctl reads only what they select; `exclude_units` and
//! `exclude_matches` are applied by the agent, on the entry's fields (an entry whose
//! `_SYSTEMD_UNIT`, or any field named in `exclude_matches`, has an excluded value is
//! skipped, counted in `uctel_agent_journal_events_total{reason="excluded"}`, not sent).
//!
//! # Faults
//!
//! journalctl never outlives the agent: it is started with `PR_SET_PDEATHSIG` (`SIGKILL`)
//! in a process group of its own ([`crate::sources::sys::child::die_with_agent`]), so a
//! SIGKILLed or crashed agent leaves no reader behind, and a restarted one does not find two.
//!
//! journalctl exiting (a missing directory, a fault) is counted
//! (`journalctl_exited`), its stderr is logged, and it is started again one second later
//! after the last entry read. An output line that is not an entry, or is longer than
//! [`MAX_ENTRY_LINE_BYTES`], is an entry lost: counted as dropped (`invalid`, `oversize`).

mod entry;
mod holes;
mod position;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use uctel_protocol::payload::LogRecord;

pub use entry::{
    cursor_seqnum, cut, excluded, parse, priority_severity, sequence_file_id, to_record, unit_name,
    Entry, EntryError, MAX_FIELD_VALUE_BYTES, SHIPPED_FIELDS, SOURCE,
};
pub use holes::SeqnumGaps;
pub use position::Positions;

use crate::sources::start_at::StartAt;
use crate::sources::sys::child::die_with_agent;

/// Longest line of journalctl output the source takes, in bytes; a longer entry is dropped
/// and counted (`oversize`). journald itself cuts stream lines at 48 KiB (`LineMax=`).
pub const MAX_ENTRY_LINE_BYTES: usize = 1 << 20;

/// Lines of journalctl output buffered between its pipe and the source; past it journalctl
/// blocks on the pipe (the journal is the buffer).
const CHANNEL_LINES: usize = 1024;

/// How long after journalctl exited (or could not start) it is started again.
const RESTART_DELAY: Duration = Duration::from_secs(1);

/// `sources.journald`: ship the systemd journal. Off when absent.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct JournaldSection {
    /// Read the journal files of this directory (`journalctl --directory`), e.g. a
    /// container's bind mount of the host's `/var/log/journal/<machine-id>`, or a directory
    /// `systemd-journal-remote` writes. Default: the local system journal (what
    /// `journalctl` reads: `/var/log/journal` and `/run/log/journal`; the agent's user needs
    /// the `systemd-journal` group).
    #[serde(default)]
    pub directory: Option<PathBuf>,
    /// The journalctl binary. Default `journalctl` (looked up in `PATH`).
    #[serde(default = "default_journalctl")]
    pub journalctl_path: PathBuf,
    /// Only entries of these units (`_SYSTEMD_UNIT`; a name without a suffix gets
    /// `.service`). Default: every unit.
    #[serde(default)]
    pub include_units: Vec<String>,
    /// Never entries of these units (same naming).
    #[serde(default)]
    pub exclude_units: Vec<String>,
    /// Only entries matching these fields: `FIELD: [values]`; values of one field are
    /// alternatives, every field listed must match (journalctl's matches), e.g.
    /// `{PRIORITY: ["0", "1", "2", "3"]}`.
    #[serde(default)]
    pub include_matches: BTreeMap<String, Vec<String>>,
    /// Never entries where one of these fields has one of these values.
    #[serde(default)]
    pub exclude_matches: BTreeMap<String, Vec<String>>,
    /// Where the very first run starts (no state file yet): `end` (default: entries written
    /// from now on) or `beginning` (the whole journal).
    #[serde(default)]
    pub start_at: StartAt,
    /// Longest `MESSAGE` shipped, in bytes; longer ones are cut (counted). Default as
    /// `sources.logs[].max_line_bytes`: 2048, or less when the frame needs it.
    #[serde(default)]
    pub max_message_bytes: Option<usize>,
    /// Seconds between two reads of journalctl's output when it had nothing. Default 0.25.
    #[serde(default = "default_poll_interval")]
    pub poll_interval_seconds: f64,
}

impl Default for JournaldSection {
    /// The defaults of every key: the system journal, every entry written from now on.
    fn default() -> Self {
        Self {
            directory: None,
            journalctl_path: default_journalctl(),
            include_units: Vec::new(),
            exclude_units: Vec::new(),
            include_matches: BTreeMap::new(),
            exclude_matches: BTreeMap::new(),
            start_at: StartAt::End,
            max_message_bytes: None,
            poll_interval_seconds: default_poll_interval(),
        }
    }
}

fn default_journalctl() -> PathBuf {
    PathBuf::from("journalctl")
}
fn default_poll_interval() -> f64 {
    0.25
}

/// The source's runtime configuration (from [`JournaldSection`]).
#[derive(Debug, Clone, PartialEq)]
pub struct JournalConfig {
    /// [`JournaldSection::journalctl_path`].
    pub journalctl: PathBuf,
    /// [`JournaldSection::directory`].
    pub directory: Option<PathBuf>,
    /// `FIELD=value` matches passed to journalctl (units as `_SYSTEMD_UNIT=`).
    pub matches: Vec<String>,
    /// Excluded unit names (completed).
    pub exclude_units: Vec<String>,
    /// Excluded `(field, value)` pairs.
    pub exclude_matches: Vec<(String, String)>,
    /// [`JournaldSection::start_at`].
    pub start_at: StartAt,
    /// Longest message, bytes.
    pub max_message_bytes: usize,
    /// Where the cursor is saved; `None`: no checkpoint.
    pub state_file: Option<PathBuf>,
}

impl JournalConfig {
    /// From the section, with `max_message_bytes` resolved by the caller and the state
    /// file `journald.json` under `state_directory`.
    pub fn new(
        s: &JournaldSection,
        max_message_bytes: usize,
        state_directory: Option<&std::path::Path>,
    ) -> Self {
        let mut matches: Vec<String> = s
            .include_units
            .iter()
            .map(|u| format!("_SYSTEMD_UNIT={}", unit_name(u)))
            .collect();
        for (k, vs) in &s.include_matches {
            matches.extend(vs.iter().map(|v| format!("{k}={v}")));
        }
        Self {
            journalctl: s.journalctl_path.clone(),
            directory: s.directory.clone(),
            matches,
            exclude_units: s.exclude_units.iter().map(|u| unit_name(u)).collect(),
            exclude_matches: s
                .exclude_matches
                .iter()
                .flat_map(|(k, vs)| vs.iter().map(move |v| (k.clone(), v.clone())))
                .collect(),
            start_at: s.start_at,
            max_message_bytes,
            state_file: state_directory.map(|d| d.join("journald.json")),
        }
    }

    /// journalctl's arguments: the directory, the fields to print, the matches.
    fn base_args(&self) -> Vec<String> {
        self.args(true)
    }

    /// journalctl's arguments: the directory, the fields to print, and the matches when
    /// `matches`.
    fn args(&self, matches: bool) -> Vec<String> {
        let mut args = Vec::new();
        if let Some(d) = &self.directory {
            args.push(format!("--directory={}", d.display()));
        }
        let mut fields: Vec<&str> = vec!["MESSAGE", "PRIORITY"];
        fields.extend(SHIPPED_FIELDS);
        fields.extend(self.exclude_matches.iter().map(|(k, _)| k.as_str()));
        fields.sort_unstable();
        fields.dedup();
        args.extend([
            "--output=json".to_owned(),
            "--all".to_owned(),
            "--no-pager".to_owned(),
            "--quiet".to_owned(),
            format!("--output-fields={}", fields.join(",")),
        ]);
        if matches {
            args.extend(self.matches.iter().cloned());
        }
        args
    }
}

/// Cumulative counters of a [`JournalSource`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JournalCounts {
    /// Entries read from journalctl (returned or excluded).
    pub entries: u64,
    /// Records returned.
    pub records: u64,
    /// Entries skipped by `exclude_units`/`exclude_matches`.
    pub excluded: u64,
    /// Messages cut at `max_message_bytes`.
    pub message_cut: u64,
    /// Output lines that were not an entry (dropped, `invalid`).
    pub unparsable: u64,
    /// Output lines longer than [`MAX_ENTRY_LINE_BYTES`] (dropped, `oversize`).
    pub too_large: u64,
    /// journalctl exits and failed starts (restarted after `RESTART_DELAY`).
    pub journalctl_exited: u64,
    /// Failed writes of the state file.
    pub checkpoint_errors: u64,
    /// Entries deleted from the journal (vacuum, rotation away) before they were read,
    /// counted exactly from the gaps in their sequence numbers (module documentation,
    /// "Entries vacuumed unread"); only without journalctl-side matches (dropped,
    /// `journal_vacuumed`).
    pub vacuumed: u64,
    /// With `include_units`/`include_matches`: entries of the whole journal, matching or
    /// not, deleted before they were read, found when journalctl starts: an upper bound on
    /// the records lost (not dropped records: how many would have matched is unknowable).
    pub vacuumed_unfiltered: u64,
}

/// One line of journalctl's output, or the mark of a line too long.
#[derive(Debug)]
enum Line {
    Entry(Vec<u8>),
    TooLong,
}

/// A running `journalctl --follow` and the thread reading its output.
#[derive(Debug)]
struct Follower {
    child: Child,
    lines: Receiver<Line>,
    /// The cursor journalctl was started at (`--cursor`): its first entry is skipped when it
    /// is that entry.
    skip: Option<String>,
}

impl Drop for Follower {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The journald source: follows journalctl and turns entries into [`LogRecord`]s; see the
/// module documentation. Never blocks in [`JournalSource::poll`].
#[derive(Debug)]
pub struct JournalSource {
    config: JournalConfig,
    positions: Positions,
    /// The start position is known (state file, `start_at`, or the tail query done).
    started: bool,
    /// The state file existed at start (no need to save the start position).
    had_state: bool,
    follower: Option<Follower>,
    retry_at: Option<Instant>,
    failing: bool,
    saved: Option<Option<String>>,
    counts: JournalCounts,
    /// The last sequence number read per sequence id (entries vacuumed unread).
    gaps: SeqnumGaps,
    /// A vacuum hole was logged (once at `warn`, later ones at `debug`).
    hole_logged: bool,
}

/// [`JournalSource::new`] failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot load journald state file {path}: {reason}")]
pub struct JournalStateError {
    /// The state file.
    pub path: PathBuf,
    /// Why.
    pub reason: String,
}

impl JournalSource {
    /// A source that starts at the saved cursor (state file), or at `start_at` on the first
    /// run. journalctl is started by the first [`JournalSource::poll`].
    ///
    /// # Errors
    /// The state file exists and cannot be read or parsed, or its cursor is not one.
    pub fn new(config: JournalConfig) -> Result<Self, JournalStateError> {
        let saved = match &config.state_file {
            Some(p) => position::load(p).map_err(|reason| JournalStateError {
                path: p.clone(),
                reason,
            })?,
            None => None,
        };
        if let (Some(p), Some(Some(c))) = (&config.state_file, &saved) {
            // journalctl refuses a cursor it cannot parse at every start: say so now.
            if cursor_seqnum(c).is_none() {
                return Err(JournalStateError {
                    path: p.clone(),
                    reason: format!("{c:?} is not a journal cursor (s=…;i=…;…)"),
                });
            }
        }
        let had_state = saved.is_some();
        let started = saved.is_some() || config.start_at == StartAt::Beginning;
        let positions = Positions::new(saved.clone().flatten());
        let mut gaps = SeqnumGaps::default();
        gaps.reset(positions.last_read());
        Ok(Self {
            config,
            positions,
            started,
            had_state,
            follower: None,
            retry_at: None,
            failing: false,
            saved,
            counts: JournalCounts::default(),
            gaps,
            hole_logged: false,
        })
    }

    /// Cumulative counters.
    pub fn counts(&self) -> &JournalCounts {
        &self.counts
    }

    /// Where a source started after this one goes on (a reload hands the source over):
    /// `Some(cursor)` once the start position is known, the cursor a restart would resume
    /// after ([`Positions::resume`]; `None` inside: before the journal's first entry);
    /// `None` while the first run has not found its start yet.
    pub fn hand_over(&self) -> Option<Option<String>> {
        self.started
            .then(|| self.positions.resume().map(str::to_owned))
    }

    /// This source, going on after `cursor` (what [`JournalSource::hand_over`] of the source
    /// it replaces gave) instead of the state file's cursor or `start_at`: the entry at the
    /// cursor is not read again, the first one after it is.
    #[must_use]
    pub fn resuming(mut self, cursor: Option<String>) -> Self {
        self.positions = Positions::new(cursor);
        self.started = true;
        // Saved at the start when the state file holds another cursor (a failed write).
        self.had_state = false;
        self
    }

    /// The cursor of the last entry read (returned or excluded), `None` before the first.
    pub fn last_read_cursor(&self) -> Option<&str> {
        self.positions.last_read()
    }

    /// The cursor a restart resumes after now: every record up to it is settled (sent,
    /// or dropped and counted). `None` before the journal's first entry or before the start
    /// position is known.
    pub fn settled_cursor(&self) -> Option<&str> {
        if self.started {
            self.positions.resume()
        } else {
            None
        }
    }

    /// Records returned and not settled.
    pub fn unsettled(&self) -> usize {
        self.positions.unsettled()
    }

    /// The oldest `n` unsettled records are settled (handed on for good).
    pub fn settle(&mut self, n: usize) {
        self.positions.settle(n);
    }

    /// Writes the cursor before the first unsettled record (or of the last entry read) to
    /// the state file when it changed. No state file → no-op.
    ///
    /// # Errors
    /// The write failed (the previous state file stays); counted in
    /// [`JournalCounts::checkpoint_errors`].
    pub fn checkpoint_settled(&mut self) -> std::io::Result<()> {
        let Some(path) = &self.config.state_file else {
            return Ok(());
        };
        if !self.started {
            return Ok(());
        }
        let resume = self.positions.resume().map(str::to_owned);
        if self.saved.as_ref() == Some(&resume) {
            return Ok(());
        }
        match position::save(path, resume.as_deref()) {
            Ok(()) => {
                self.saved = Some(resume);
                Ok(())
            }
            Err(e) => {
                self.counts.checkpoint_errors += 1;
                Err(e)
            }
        }
    }

    /// Reads the records not settled again (an RC lane failed): journalctl is restarted
    /// after the resume cursor. Returns 0: the journal keeps every entry not vacuumed.
    pub fn rewind(&mut self) -> u64 {
        self.positions.rewind();
        self.follower = None;
        self.retry_at = None;
        0
    }

    /// Appends at most `max` records to `out` from what journalctl printed so far; starts
    /// journalctl first when it is not running. Returns whether more output may be waiting.
    /// Entries lost on the way are counted ([`JournalCounts::too_large`],
    /// [`JournalCounts::unparsable`]).
    pub fn poll(&mut self, out: &mut Vec<LogRecord>, max: usize) -> bool {
        let now = Instant::now();
        if self.follower.is_none() && self.retry_at.is_none_or(|t| now >= t) {
            self.start(now);
        }
        let mut returned = 0;
        // Excluded entries are not records, but bound the work of one poll anyway.
        let mut budget = max.saturating_mul(4).saturating_add(256);
        while returned < max && budget > 0 {
            budget -= 1;
            let Some(f) = &self.follower else {
                return false;
            };
            let line = f.lines.try_recv();
            let skip = match &line {
                Ok(_) => self.follower.as_mut().and_then(|f| f.skip.take()),
                Err(_) => None,
            };
            match line {
                Ok(Line::Entry(bytes)) => {
                    if self.take(&bytes, skip.as_deref(), out) {
                        returned += 1;
                    }
                }
                Ok(Line::TooLong) => self.counts.too_large += 1,
                Err(TryRecvError::Empty) => return false,
                Err(TryRecvError::Disconnected) => {
                    self.exited(now);
                    return false;
                }
            }
        }
        true
    }

    /// One entry line: a record appended to `out` (true), or excluded, unparsable, or the
    /// entry at `skip` (the one journalctl was started at, read before).
    fn take(&mut self, bytes: &[u8], skip: Option<&str>, out: &mut Vec<LogRecord>) -> bool {
        let entry = match parse(bytes) {
            Ok(e) => e,
            Err(e) => {
                self.counts.unparsable += 1;
                tracing::debug!(error = %e, "journald: journalctl printed a line that is not an entry");
                return false;
            }
        };
        let gap = self.gaps.read(&entry.cursor);
        if gap > 0 && self.config.matches.is_empty() {
            self.counts.vacuumed += gap;
            self.hole(
                gap,
                &entry.cursor,
                "uctel_agent_records_dropped_total{stream=\"logs\",reason=\"journal_vacuumed\"}",
            );
        }
        if skip == Some(entry.cursor.as_str()) {
            return false;
        }
        self.counts.entries += 1;
        if excluded(
            &entry,
            &self.config.exclude_units,
            &self.config.exclude_matches,
        ) {
            self.counts.excluded += 1;
            self.positions.read(&entry.cursor, false);
            return false;
        }
        let (record, cut) = to_record(&entry, self.config.max_message_bytes);
        self.counts.message_cut += u64::from(cut);
        self.counts.records += 1;
        self.positions.read(&entry.cursor, true);
        out.push(record);
        true
    }

    /// Finds the start position if needed, then starts journalctl after the last entry read.
    fn start(&mut self, now: Instant) {
        if !self.started {
            match self.tail_cursor() {
                Ok(c) => {
                    self.positions = Positions::new(c);
                    self.gaps.reset(self.positions.last_read());
                    self.started = true;
                }
                Err(e) => {
                    self.failed(now, &e);
                    return;
                }
            }
        }
        if !self.had_state {
            self.had_state = true;
            if let Err(e) = self.checkpoint_settled() {
                tracing::warn!(error = %e, "journald: cannot write the state file");
            }
        }
        if !self.config.matches.is_empty() {
            if let Err(e) = self.probe_hole() {
                tracing::debug!(error = %e, "journald: cannot look for entries vacuumed unread");
            }
        }
        match self.spawn() {
            Ok(f) => {
                if self.failing {
                    tracing::info!("journald: journalctl runs again");
                }
                self.failing = false;
                self.follower = Some(f);
            }
            Err(e) => self.failed(now, &e),
        }
    }

    /// `gap` entries before `cursor` were deleted unread: logged (once at `warn`).
    fn hole(&mut self, gap: u64, cursor: &str, counted_in: &str) {
        if self.hole_logged {
            tracing::debug!(
                entries = gap,
                before = cursor,
                counted_in,
                "journald: entries vacuumed before they were read"
            );
        } else {
            tracing::warn!(entries = gap, before = cursor, counted_in, "journald: entries were vacuumed (deleted from the journal) before they were read (logged once; every later hole only counted)");
            self.hole_logged = true;
        }
    }

    /// With journalctl-side matches the stream's sequence numbers jump at every entry not
    /// matching, so the hole after the last entry read is looked for in the whole journal:
    /// `journalctl --cursor=<last read> --lines=2` without matches prints that entry (when
    /// it is still there) and the next one; a gap up to the next one is entries vacuumed
    /// unread, of any unit ([`JournalCounts::vacuumed_unfiltered`]).
    fn probe_hole(&mut self) -> Result<(), String> {
        let Some(cursor) = self.positions.last_read().map(str::to_owned) else {
            return Ok(());
        };
        let out = die_with_agent(&mut Command::new(&self.config.journalctl))
            .args(self.config.args(false))
            .arg(format!("--cursor={cursor}"))
            .arg("--lines=2")
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .map_err(|e| format!("{}: {e}", self.config.journalctl.display()))?;
        for line in out.stdout.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let Ok(e) = parse(line) else { continue };
            let gap = self.gaps.read(&e.cursor);
            if gap > 0 {
                self.counts.vacuumed_unfiltered += gap;
                self.hole(gap, &e.cursor, "uctel_agent_journal_events_total{reason=\"vacuumed_unfiltered\"} (entries of any unit: an upper bound on the records lost)");
            }
        }
        Ok(())
    }

    fn failed(&mut self, now: Instant, e: &str) {
        self.counts.journalctl_exited += 1;
        self.retry_at = Some(now + RESTART_DELAY);
        if !self.failing {
            tracing::warn!(error = %e, "journald: journalctl failed; retried every second (logged once until it runs again)");
        }
        self.failing = true;
    }

    fn exited(&mut self, now: Instant) {
        let status = self
            .follower
            .take()
            .and_then(|mut f| f.child.wait().ok())
            .map_or_else(|| "unknown".to_owned(), |s| s.to_string());
        self.failed(now, &format!("journalctl --follow exited ({status})"));
    }

    /// The cursor of the last matching entry (`journalctl -n 1`), `None` for an empty journal.
    fn tail_cursor(&self) -> Result<Option<String>, String> {
        let out = die_with_agent(&mut Command::new(&self.config.journalctl))
            .args(self.config.base_args())
            .arg("--lines=1")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("{}: {e}", self.config.journalctl.display()))?;
        if !out.status.success() {
            return Err(format!(
                "journalctl -n 1 exited ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let last = out.stdout.split(|b| *b == b'\n').rfind(|l| !l.is_empty());
        Ok(last.and_then(|l| parse(l).ok()).map(|e| e.cursor))
    }

    /// Starts `journalctl --follow` after the last entry read (or at the first entry).
    ///
    /// With `--cursor`, not `--after-cursor`: journalctl 252's `--after-cursor` skips the
    /// first entry at the cursor's place whether or not it is the cursor's entry, so when
    /// that entry was vacuumed, the entry after it was lost. Here the first entry is
    /// skipped only when its cursor is the saved one.
    fn spawn(&self) -> Result<Follower, String> {
        let mut cmd = Command::new(&self.config.journalctl);
        die_with_agent(&mut cmd);
        // `--no-tail`: with `--follow` and a cursor journalctl 252 prints only 10 entries
        // of the backlog after it (its `--lines` default in follow mode), then waits.
        cmd.args(self.config.base_args())
            .args(["--follow", "--no-tail"]);
        let skip = self.positions.last_read().map(str::to_owned);
        match &skip {
            Some(c) => cmd.arg(format!("--cursor={c}")),
            None => cmd.arg("--lines=all"),
        };
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{}: {e}", self.config.journalctl.display()))?;
        let (tx, rx) = std::sync::mpsc::sync_channel(CHANNEL_LINES);
        let stdout = child.stdout.take().ok_or("no stdout pipe")?;
        let stderr = child.stderr.take().ok_or("no stderr pipe")?;
        let spawned = std::thread::Builder::new()
            .name("journalctl-out".into())
            .spawn(move || read_lines(stdout, &tx))
            .and_then(|_| {
                std::thread::Builder::new()
                    .name("journalctl-err".into())
                    .spawn(move || log_stderr(stderr))
            });
        let follower = Follower {
            child,
            lines: rx,
            skip,
        };
        spawned.map_err(|e| format!("cannot start the reader thread: {e}"))?;
        Ok(follower)
    }
}

/// Reads journalctl's stdout line by line into `tx` until EOF or the receiver is gone; a
/// line longer than [`MAX_ENTRY_LINE_BYTES`] is skipped and sent as [`Line::TooLong`].
fn read_lines(stdout: impl Read, tx: &SyncSender<Line>) {
    let mut r = BufReader::with_capacity(1 << 16, stdout);
    let mut line = Vec::new();
    let mut too_long = false;
    loop {
        let (done, used) = match r.fill_buf() {
            Ok([]) | Err(_) => return,
            Ok(buf) => match buf.iter().position(|b| *b == b'\n') {
                Some(i) => {
                    if !too_long {
                        line.extend_from_slice(&buf[..i]);
                    }
                    (true, i + 1)
                }
                None => {
                    if !too_long {
                        line.extend_from_slice(buf);
                    }
                    (false, buf.len())
                }
            },
        };
        r.consume(used);
        if line.len() > MAX_ENTRY_LINE_BYTES {
            too_long = true;
            line = Vec::new();
        }
        if done {
            let msg = if too_long {
                Line::TooLong
            } else {
                Line::Entry(std::mem::take(&mut line))
            };
            too_long = false;
            if tx.send(msg).is_err() {
                return;
            }
        }
    }
}

/// Logs journalctl's stderr (the first 20 lines of each run at `warn`, then at `debug`).
fn log_stderr(stderr: impl Read) {
    for (i, line) in BufReader::new(stderr)
        .lines()
        .map_while(Result::ok)
        .enumerate()
    {
        if i < 20 {
            tracing::warn!(message = %line, "journald: journalctl says");
        } else {
            tracing::debug!(message = %line, "journald: journalctl says");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_split_and_over_long_ones_marked() {
        let mut input = b"{\"a\":1}\n".to_vec();
        input.extend(vec![b'x'; MAX_ENTRY_LINE_BYTES + 10]);
        input.extend(b"\n{\"b\":2}\npartial");
        let (tx, rx) = std::sync::mpsc::sync_channel(16);
        read_lines(&input[..], &tx);
        drop(tx);
        let got: Vec<Option<Vec<u8>>> = rx
            .iter()
            .map(|l| match l {
                Line::Entry(b) => Some(b),
                Line::TooLong => None,
            })
            .collect();
        assert_eq!(
            got,
            [
                Some(b"{\"a\":1}".to_vec()),
                None,
                Some(b"{\"b\":2}".to_vec())
            ]
        );
    }

    #[test]
    fn arguments_carry_directory_fields_and_matches() {
        let s = JournaldSection {
            directory: Some("/j".into()),
            include_units: vec!["sshd".into()],
            include_matches: [("PRIORITY".to_owned(), vec!["3".to_owned()])].into(),
            exclude_matches: [("_COMM".to_owned(), vec!["cron".to_owned()])].into(),
            exclude_units: vec!["a".into()],
            ..Default::default()
        };
        let c = JournalConfig::new(&s, 100, None);
        let args = c.base_args();
        assert_eq!(args[0], "--directory=/j");
        assert!(args.contains(
            &"--output-fields=MESSAGE,PRIORITY,SYSLOG_IDENTIFIER,_COMM,_PID,_SYSTEMD_UNIT"
                .to_owned()
        ));
        assert!(args.ends_with(&["_SYSTEMD_UNIT=sshd.service".into(), "PRIORITY=3".into()]));
        assert_eq!(c.exclude_units, ["a.service"]);
    }
}
