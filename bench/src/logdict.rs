//! Would a dictionary for log records pay? (`uctel-bench --only log-dict`): bytes per log
//! record on the wire for a realistic line mix, today's `kind = logs` frames against the
//! same records with their repeated per-file and per-process fields interned, as the
//! series dictionary does for metrics (`uctel_protocol::dict`).
//!
//! The mix ([`line_mix`]): records as the agent's sources make them, from five files
//! read in bursts of 1 to 20 lines (syslog, an nginx access log, slurmd's log with its own
//! timestamps parsed, so each record also carries the `read_time` field, a JSON service
//! log with `parse: json`, kern.log) and the journal (its four shipped fields per entry).
//! Every file record has its path, its random 64-bit `file_id` and its `end_offset`.
//!
//! Forms, each packed into frames of `frame_bytes` (header included) as the framer packs
//! them (a record is its `LogBatch.records` field: tag, length, message):
//!
//! - **today**: the records as they are (the real [`Framer`]'s frames, cross-checked
//!   against the packing model: [`LogDictResult::framer_bytes_per_record`]);
//! - **interned per file**: `source` and `file_id` replaced by a 2-byte reference to a
//!   dictionary entry (a field key and a one-byte id: fewer than 128 files);
//! - **interned everything repeated**: also every field key a 1-byte id and the journal's
//!   four per-process fields one 2-byte reference.
//!
//! Both interned forms are in the steady state (every entry acknowledged; definitions
//! cost nothing), so they bound what such a dictionary could save from above.

use prost::Message as _;
use serde::Serialize;
use uctel_protocol::frame::HEADER_LEN;
use uctel_protocol::framer::{Framer, PushOutcome};
use uctel_protocol::limits::Limits;
use uctel_protocol::payload::{Field, LogRecord, Severity};

/// Bytes a reference to an interned entry costs in a record: a field key and a one-byte id.
const REFERENCE_BYTES: usize = 2;

/// Settings.
#[derive(Clone, Debug)]
pub struct LogDictConfig {
    /// Largest frame, header included.
    pub frame_bytes: usize,
    /// Records in the mix.
    pub records: usize,
}

/// One form's figures.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LogForm {
    /// Frames for the mix.
    pub frames: usize,
    /// Bytes on the wire for the mix (frame headers included).
    pub bytes: usize,
    /// Bytes per record.
    pub bytes_per_record: f64,
}

/// What the run measured.
#[derive(Clone, Debug, Serialize)]
pub struct LogDictResult {
    /// Largest frame.
    pub frame_bytes: usize,
    /// Records in the mix.
    pub records: usize,
    /// Mean message length, bytes.
    pub mean_message_bytes: f64,
    /// Today's frames (packing model).
    pub today: LogForm,
    /// Bytes per record of the real framer's frames for the same records.
    pub framer_bytes_per_record: f64,
    /// `source` and `file_id` interned.
    pub per_file: LogForm,
    /// Every repeated field interned.
    pub all_repeated: LogForm,
    /// Share of today's bytes the per-file dictionary saves.
    pub per_file_saving: f64,
    /// Share of today's bytes interning everything repeated saves.
    pub all_repeated_saving: f64,
    /// Per source (path, or `journal`): records, and bytes per record today, per-file
    /// interned and everything interned (records alone, no frame headers).
    pub by_source: Vec<(String, usize, f64, f64, f64)>,
}

impl LogDictResult {
    /// The report's lines: (what, figure).
    pub fn lines(&self) -> Vec<(String, String)> {
        vec![
            (
                format!(
                    "log line mix ({} records, mean message {:.0} B), {}-byte frames: bytes per record",
                    self.records, self.mean_message_bytes, self.frame_bytes
                ),
                format!(
                    "today {:.1} ({} frames; framer {:.1}); path+file_id interned {:.1} ({:+.1} %); every repeated field interned {:.1} ({:+.1} %)",
                    self.today.bytes_per_record,
                    self.today.frames,
                    self.framer_bytes_per_record,
                    self.per_file.bytes_per_record,
                    -100.0 * self.per_file_saving,
                    self.all_repeated.bytes_per_record,
                    -100.0 * self.all_repeated_saving,
                ),
            ),
        ]
        .into_iter()
        .chain(self.by_source.iter().map(|(src, n, a, b, c)| {
            (
                format!("  {src} ({n} records): record bytes"),
                format!("today {a:.1}; path+file_id interned {b:.1}; every repeated field interned {c:.1}"),
            )
        }))
        .collect()
    }
}

/// A small deterministic generator (SplitMix64), so every run measures the same mix.
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// One source of the mix.
struct File {
    path: &'static str,
    file_id: u64,
    offset: u64,
}

const PATHS: [&str; 5] = [
    "/var/log/syslog",
    "/var/log/nginx/access.log",
    "/var/log/slurm/slurmd.log",
    "/var/log/telemetry-api/service.json",
    "/var/log/kern.log",
];

/// `hh:mm:ss` of second `s` of the day.
fn hms(s: u64) -> String {
    format!("{:02}:{:02}:{:02}", (s / 3600) % 24, (s / 60) % 60, s % 60)
}

/// The message, severity and fields of a line of source `k` (an index of [`PATHS`], 5 the
/// journal) at second `s`.
fn line(k: usize, s: u64, g: &mut Mix) -> (String, Severity, Vec<Field>) {
    let field = |key: &str, value: String| Field {
        key: key.to_owned(),
        value,
    };
    let t = hms(s);
    match k {
        0 => {
            let m = match g.below(4) {
                0 => format!("Dec  7 {t} node017 systemd[1]: Started Session {} of User slurm.", 4000 + g.below(900)),
                1 => format!("Dec  7 {t} node017 CRON[{}]: (root) CMD (/usr/lib/sysstat/debian-sa1 1 1)", 20_000 + g.below(9000)),
                2 => format!("Dec  7 {t} node017 chronyd[812]: Selected source 10.0.0.{} (ntp{}.cluster.local)", 1 + g.below(4), g.below(4)),
                _ => format!("Dec  7 {t} node017 systemd-logind[903]: New session {} of user jdoe.", 4000 + g.below(900)),
            };
            (m, Severity::Info, Vec::new())
        }
        1 => {
            let m = format!(
                "10.1.{}.{} - - [07/Dec/2026:{t} +0000] \"GET /api/v1/jobs/{} HTTP/1.1\" {} {} \"-\" \"python-requests/2.31.0\"",
                g.below(8),
                1 + g.below(250),
                40_000 + g.below(20_000),
                [200, 200, 200, 304, 404][g.below(5) as usize],
                200 + g.below(4000)
            );
            (m, Severity::Info, Vec::new())
        }
        2 => {
            let job = 48_000 + g.below(500);
            let m = match g.below(3) {
                0 => format!("[2026-12-07T{t}.{:03}] [{job}.batch] task/cgroup: _memcg_initialize: job: alloc=64000MB mem.limit=64000MB memsw.limit=unlimited", g.below(1000)),
                1 => format!("[2026-12-07T{t}.{:03}] launch task StepId={job}.0 request from UID:{} GID:{} HOST:10.1.0.{} PORT:{}", g.below(1000), 1000 + g.below(50), 1000 + g.below(50), 1 + g.below(250), 30_000 + g.below(30_000)),
                _ => format!("[2026-12-07T{t}.{:03}] [{job}.extern] done with step", g.below(1000)),
            };
            let read = format!("2026-12-07T{t}.{:09}Z", g.below(1_000_000_000));
            (m, Severity::Info, vec![field("read_time", read)])
        }
        3 => {
            let (level, sev) = [
                ("info", Severity::Info),
                ("info", Severity::Info),
                ("warn", Severity::Warn),
                ("debug", Severity::Debug),
            ][g.below(4) as usize];
            let rid = format!("{:016x}", g.next());
            let ms = g.below(900);
            let route = ["/v1/write", "/v1/query", "/v1/series"][g.below(3) as usize];
            let m = format!(
                "{{\"ts\":\"2026-12-07T{t}.{:03}Z\",\"level\":\"{level}\",\"component\":\"http\",\"msg\":\"request done\",\"route\":\"{route}\",\"status\":200,\"duration_ms\":{ms},\"request_id\":\"{rid}\"}}",
                g.below(1000)
            );
            let fields = vec![
                field("ts", format!("2026-12-07T{t}.{:03}Z", g.below(1000))),
                field("level", level.into()),
                field("component", "http".into()),
                field("msg", "request done".into()),
                field("route", route.into()),
                field("status", "200".into()),
                field("duration_ms", ms.to_string()),
                field("request_id", rid),
                field(
                    "read_time",
                    format!("2026-12-07T{t}.{:09}Z", g.below(1_000_000_000)),
                ),
            ];
            (m, sev, fields)
        }
        4 => {
            let m = format!(
                "Dec  7 {t} node017 kernel: [{}.{:06}] mlx5_core 0000:3b:00.0: mlx5_fw_tracer_handle_traces:{}: FWTracer: Events were lost",
                800_000 + g.below(10_000),
                g.below(1_000_000),
                700 + g.below(100)
            );
            (m, Severity::Warn, Vec::new())
        }
        _ => {
            let (unit, comm, pid) = [
                ("slurmd.service", "slurmd", "1822"),
                ("sshd.service", "sshd", "1410"),
                ("uctel-agent.service", "uctel-agent", "2207"),
            ][g.below(3) as usize];
            let m = format!(
                "{comm}: operation {} finished in {} ms",
                g.below(100_000),
                g.below(5000)
            );
            let fields = vec![
                field("_SYSTEMD_UNIT", unit.into()),
                field("_PID", pid.into()),
                field("_COMM", comm.into()),
                field("SYSLOG_IDENTIFIER", comm.into()),
            ];
            (m, Severity::Info, fields)
        }
    }
}

/// `n` records of the mix (module documentation), deterministic.
pub fn line_mix(n: usize) -> Vec<LogRecord> {
    let mut g = Mix(0x1095_d1c7);
    let mut files: Vec<File> = PATHS
        .iter()
        .map(|path| File {
            path,
            file_id: g.next() | 1,
            offset: 10_000_000 + g.below(50_000_000),
        })
        .collect();
    let mut journal_seq = 1_000_000 + g.below(1_000_000);
    let journal_id = g.next() | 1;
    let mut out = Vec::with_capacity(n);
    let mut s = 3 * 3600 + 45 * 60;
    let base_ns = 1_796_600_000_000_000_000u64;
    while out.len() < n {
        let k = g.below(6) as usize;
        let burst = 1 + g.below(20) as usize;
        for _ in 0..burst.min(n - out.len()) {
            s += g.below(2);
            let (message, severity, fields) = line(k, s, &mut g);
            let ts = base_ns + s * 1_000_000_000 + g.below(1_000_000_000);
            let r = match files.get_mut(k) {
                Some(f) => {
                    f.offset += message.len() as u64 + 1;
                    LogRecord {
                        timestamp_ns: ts,
                        severity: severity as i32,
                        source: f.path.to_owned(),
                        message,
                        fields,
                        file_id: f.file_id,
                        end_offset: f.offset,
                    }
                }
                None => {
                    journal_seq += 1;
                    LogRecord {
                        timestamp_ns: ts,
                        severity: severity as i32,
                        source: "journal".to_owned(),
                        message,
                        fields,
                        file_id: journal_id,
                        end_offset: journal_seq,
                    }
                }
            };
            out.push(r);
        }
    }
    out
}

/// Bytes of a varint.
fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// Bytes of `r` in `LogBatch.records`: tag, length and the message.
fn record_bytes(r: &LogRecord) -> usize {
    let n = r.encoded_len();
    1 + varint_len(n as u64) + n
}

/// Packs records of `sizes` bytes each (as [`record_bytes`] gives them) into frames of at
/// most `frame_bytes`, as the framer does: a frame closes when the next record does not fit.
fn pack(sizes: impl Iterator<Item = usize>, frame_bytes: usize) -> LogForm {
    let room = frame_bytes.saturating_sub(HEADER_LEN);
    let (mut frames, mut bytes, mut open, mut n) = (0usize, 0usize, 0usize, 0usize);
    for size in sizes {
        n += 1;
        if open > 0 && open + size > room {
            frames += 1;
            bytes += HEADER_LEN + open;
            open = 0;
        }
        open += size;
    }
    if open > 0 {
        frames += 1;
        bytes += HEADER_LEN + open;
    }
    LogForm {
        frames,
        bytes,
        bytes_per_record: bytes as f64 / n.max(1) as f64,
    }
}

/// `r` with `source` and `file_id` replaced by a reference ([`REFERENCE_BYTES`]).
fn per_file_bytes(r: &LogRecord) -> usize {
    let mut s = r.clone();
    s.source.clear();
    s.file_id = 0;
    let n = s.encoded_len() + REFERENCE_BYTES;
    1 + varint_len(n as u64) + n
}

/// `r` with every repeated field interned: the per-file reference, every field key a
/// one-byte id, the journal's per-process fields one reference.
fn all_repeated_bytes(r: &LogRecord) -> usize {
    let mut s = r.clone();
    s.source.clear();
    s.file_id = 0;
    let journal = r.source == "journal";
    let mut extra = REFERENCE_BYTES;
    if journal {
        s.fields.clear();
        extra += REFERENCE_BYTES;
    } else {
        for f in &mut s.fields {
            // The key's string (length and bytes) becomes a one-byte id.
            extra += 1;
            f.key.clear();
        }
    }
    let n = s.encoded_len() + extra;
    1 + varint_len(n as u64) + n
}

/// Measures the forms on the mix.
///
/// # Errors
/// The framer refuses the frame size, or refuses a record of the mix.
pub fn measure(cfg: &LogDictConfig) -> Result<LogDictResult, String> {
    let records = line_mix(cfg.records.max(1));
    let limits = Limits {
        max_frame_bytes: cfg.frame_bytes,
        ..Limits::default()
    };
    let mut framer = Framer::<LogRecord>::new(2, 0, limits).map_err(|e| e.to_string())?;
    let mut framer_bytes = 0usize;
    for r in &records {
        match framer.push(r, r.timestamp_ns) {
            PushOutcome::Closed(f) => framer_bytes += f.len(),
            PushOutcome::Appended => {}
            PushOutcome::Rejected(e) => return Err(format!("the framer refused a record: {e:?}")),
        }
    }
    if let Some(f) = framer.flush() {
        framer_bytes += f.len();
    }
    let n = records.len();
    let today = pack(records.iter().map(record_bytes), cfg.frame_bytes);
    let per_file = pack(records.iter().map(per_file_bytes), cfg.frame_bytes);
    let all_repeated = pack(records.iter().map(all_repeated_bytes), cfg.frame_bytes);
    let saving = |f: &LogForm| 1.0 - f.bytes as f64 / today.bytes.max(1) as f64;
    let mut by_source: Vec<(String, usize, f64, f64, f64)> = Vec::new();
    for src in PATHS.iter().copied().chain(["journal"]) {
        let of: Vec<&LogRecord> = records.iter().filter(|r| r.source == src).collect();
        let k = of.len().max(1) as f64;
        let mean = |f: fn(&LogRecord) -> usize| of.iter().map(|r| f(r)).sum::<usize>() as f64 / k;
        by_source.push((
            src.to_owned(),
            of.len(),
            mean(record_bytes),
            mean(per_file_bytes),
            mean(all_repeated_bytes),
        ));
    }
    Ok(LogDictResult {
        frame_bytes: cfg.frame_bytes,
        records: n,
        mean_message_bytes: records.iter().map(|r| r.message.len()).sum::<usize>() as f64
            / n as f64,
        framer_bytes_per_record: framer_bytes as f64 / n as f64,
        per_file_saving: saving(&per_file),
        all_repeated_saving: saving(&all_repeated),
        today,
        per_file,
        all_repeated,
        by_source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_packing_model_matches_the_framer_and_interning_saves_bytes() {
        let r = measure(&LogDictConfig {
            frame_bytes: 1024,
            records: 2000,
        })
        .unwrap_or_else(|e| panic!("{e}"));
        // The model packs as the framer does (within 1 %: the framer may close a frame a
        // record earlier for its own worst-case length bound).
        let model = r.today.bytes_per_record;
        assert!(
            (r.framer_bytes_per_record - model).abs() <= model / 100.0,
            "{r:?}"
        );
        assert!(r.per_file.bytes < r.today.bytes, "{r:?}");
        assert!(r.all_repeated.bytes < r.per_file.bytes, "{r:?}");
    }
}
