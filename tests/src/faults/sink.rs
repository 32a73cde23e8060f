//! The sink of a row: the collector's JSON Lines read back (rotated files included):
//! distinct lines per agent and source, duplicates, lines whose text changed, torn lines.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

// The sibling modules, re-exported by `faults`.
use super::*;

/// What the collector's JSON Lines sink holds for one row.
#[derive(Debug, Default, Clone)]
pub struct Delivered {
    /// `(agent, src)` → `seq` → how many times the line is in the sink.
    pub lines: BTreeMap<(String, String), BTreeMap<u64, u64>>,
    /// Records of this row whose message is not the line written (first few kept).
    pub mismatched: Vec<String>,
    /// How many such records.
    pub mismatched_count: u64,
    /// Lines of the sink files that are not a JSON object with `agent` and `message`
    /// (first few kept).
    pub torn: Vec<String>,
    /// How many such lines.
    pub torn_count: u64,
    /// Records from other rows or other programs.
    pub foreign: u64,
    /// Sink files read.
    pub files: Vec<PathBuf>,
}

impl Delivered {
    /// Reads `sink` and its rotated files `sink.1`, `sink.2`, … (oldest last).
    pub fn read(sink: &Path, row: &str, seed: u64) -> Delivered {
        let mut d = Delivered::default();
        let mut paths = vec![sink.to_path_buf()];
        for n in 1..=1000 {
            let mut p = sink.as_os_str().to_owned();
            p.push(format!(".{n}"));
            let p = PathBuf::from(p);
            if !p.exists() {
                break;
            }
            paths.push(p);
        }
        for p in paths {
            let Ok(bytes) = std::fs::read(&p) else {
                continue;
            };
            d.files.push(p);
            for raw in bytes.split(|b| *b == b'\n') {
                if raw.is_empty() {
                    continue;
                }
                d.record(raw, row, seed);
            }
        }
        d
    }

    fn record(&mut self, raw: &[u8], row: &str, seed: u64) {
        let parsed: Option<serde_json::Value> = serde_json::from_slice(raw).ok();
        let fields = parsed.as_ref().and_then(|v| {
            Some((
                v.get("agent")?.as_str()?.to_owned(),
                v.get("message")?.as_str()?.to_owned(),
            ))
        });
        let Some((agent, message)) = fields else {
            self.torn_count += 1;
            if self.torn.len() < 3 {
                let text = String::from_utf8_lossy(raw);
                self.torn.push(text.chars().take(160).collect());
            }
            return;
        };
        match parse_line(&message) {
            Some((r, src, seq)) if r == row => {
                if message != line_text(row, src, seed, seq) {
                    self.mismatched_count += 1;
                    if self.mismatched.len() < 3 {
                        self.mismatched.push(message.chars().take(160).collect());
                    }
                    return;
                }
                *self
                    .lines
                    .entry((agent, src.to_owned()))
                    .or_default()
                    .entry(seq)
                    .or_default() += 1;
            }
            _ => self.foreign += 1,
        }
    }

    /// Distinct lines of `src` delivered for `agent`.
    pub fn distinct(&self, agent: &str, src: &str) -> u64 {
        self.lines
            .get(&(agent.to_owned(), src.to_owned()))
            .map_or(0, |m| m.len() as u64)
    }

    /// Extra copies of lines of `src` delivered for `agent` (0 when nothing is repeated).
    pub fn duplicates(&self, agent: &str, src: &str) -> u64 {
        self.lines
            .get(&(agent.to_owned(), src.to_owned()))
            .map_or(0, |m| m.values().map(|n| n.saturating_sub(1)).sum())
    }

    /// Whether line `seq` of `src` reached the sink for `agent`.
    pub fn has(&self, agent: &str, src: &str, seq: u64) -> bool {
        self.lines
            .get(&(agent.to_owned(), src.to_owned()))
            .is_some_and(|m| m.contains_key(&seq))
    }

    /// Lines of `src` delivered for `agent` whose `seq` is not below `written` (never
    /// written: invented or from a wrong source).
    pub fn beyond(&self, agent: &str, src: &str, written: u64) -> u64 {
        self.lines
            .get(&(agent.to_owned(), src.to_owned()))
            .map_or(0, |m| m.range(written..).count() as u64)
    }

    /// The first few repeated `seq`s of `src` for `agent`, for failure messages.
    pub fn repeated_examples(&self, agent: &str, src: &str) -> Vec<u64> {
        self.lines
            .get(&(agent.to_owned(), src.to_owned()))
            .map(|m| {
                m.iter()
                    .filter(|(_, n)| **n > 1)
                    .map(|(s, _)| *s)
                    .take(8)
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sink_counts_distinct_duplicates_mismatches_and_torn() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let sink = dir.path().join("s.jsonl");
        let rec = |seq: u64, msg: Option<&str>| {
            let m = msg.map_or_else(|| line_text("r", "a", 3, seq), str::to_owned);
            format!("{}\n", serde_json::json!({"agent": "x", "message": m}))
        };
        let text = [
            rec(0, None),
            rec(1, None),
            rec(1, None),
            rec(2, Some("row=r src=a seq=2 pad=zz")),
        ]
        .concat()
            + "{\"agent\":\"x\",\"mess\n";
        std::fs::write(&sink, text).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(dir.path().join("s.jsonl.1"), rec(5, None))
            .unwrap_or_else(|e| panic!("{e}"));
        let d = Delivered::read(&sink, "r", 3);
        assert_eq!(d.distinct("x", "a"), 3);
        assert_eq!(d.duplicates("x", "a"), 1);
        assert_eq!(d.mismatched_count, 1);
        assert_eq!(d.torn_count, 1);
        assert_eq!(d.beyond("x", "a", 3), 1);
        assert!(d.has("x", "a", 5));
    }
}
