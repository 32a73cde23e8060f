//! The source of a row: a log file the test writes numbered, unique lines into
//! (`row=<row> src=<src> seq=<i> pad=<seeded>`), and the rotations an operator's logrotate
//! does to it.

use std::io::Write as _;
use std::path::{Path, PathBuf};

// The sibling modules, re-exported by `faults`.
use super::*;

const PAD_ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";

/// The exact text of line `seq` of source `src` in row `row` with seed `seed` (no newline):
/// `row=<row> src=<src> seq=<seq> pad=<24..=119 seeded characters>`.
pub fn line_text(row: &str, src: &str, seed: u64, seq: u64) -> String {
    let mut r = Rng::new(seed ^ mix(seq.wrapping_add(0x5eed)));
    let n = usize::try_from(r.range(24, 119)).unwrap_or(24);
    let mut s = format!("row={row} src={src} seq={seq} pad=");
    s.reserve(n);
    for _ in 0..n {
        let i = usize::try_from(r.next_u64() % PAD_ALPHABET.len() as u64).unwrap_or(0);
        s.push(char::from(PAD_ALPHABET[i]));
    }
    s
}

/// Parses `row=<row> src=<src> seq=<seq> ...` into `(row, src, seq)`.
pub fn parse_line(message: &str) -> Option<(&str, &str, u64)> {
    let mut it = message.split(' ');
    let row = it.next()?.strip_prefix("row=")?;
    let src = it.next()?.strip_prefix("src=")?;
    let seq = it.next()?.strip_prefix("seq=")?.parse().ok()?;
    Some((row, src, seq))
}

/// A log file the test appends numbered lines to. `written` counts every line ever written
/// by this source, whatever file it went to.
#[derive(Debug)]
pub struct LineSource {
    /// Row name (first field of every line).
    pub row: String,
    /// Source tag (second field).
    pub src: String,
    /// The row's seed (padding).
    pub seed: u64,
    /// The path lines are appended to.
    pub path: PathBuf,
    /// Lines written so far; the next line is `seq = written`.
    pub written: u64,
}

impl LineSource {
    /// A source appending to `path`, created empty now.
    ///
    /// # Panics
    /// If the file cannot be created.
    pub fn create(row: &str, src: &str, seed: u64, path: &Path) -> LineSource {
        std::fs::write(path, "").unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
        LineSource {
            row: row.to_owned(),
            src: src.to_owned(),
            seed,
            path: path.to_path_buf(),
            written: 0,
        }
    }

    /// Appends the next `n` lines in one write.
    ///
    /// # Panics
    /// If the file cannot be written.
    pub fn append(&mut self, n: u64) {
        let mut buf = String::new();
        for seq in self.written..self.written + n {
            buf.push_str(&line_text(&self.row, &self.src, self.seed, seq));
            buf.push('\n');
        }
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .unwrap_or_else(|e| panic!("{}: {e}", self.path.display()));
        f.write_all(buf.as_bytes())
            .unwrap_or_else(|e| panic!("{}: {e}", self.path.display()));
        self.written += n;
    }

    /// create-rotation: `mv path to; : > path` (the writer goes on in the new file).
    ///
    /// # Panics
    /// If a file operation fails.
    pub fn rotate_create(&mut self, to: &Path) {
        std::fs::rename(&self.path, to).unwrap_or_else(|e| panic!("mv: {e}"));
        std::fs::write(&self.path, "").unwrap_or_else(|e| panic!("create: {e}"));
    }

    /// copytruncate: `cp path to; : > path` (same inode, emptied).
    ///
    /// # Panics
    /// If a file operation fails.
    pub fn rotate_copytruncate(&mut self, to: &Path) {
        std::fs::copy(&self.path, to).unwrap_or_else(|e| panic!("cp: {e}"));
        self.truncate();
    }

    /// Truncation in place (`: > path`).
    ///
    /// # Panics
    /// If the file cannot be truncated.
    pub fn truncate(&mut self) {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&self.path)
            .unwrap_or_else(|e| panic!("{}: {e}", self.path.display()));
        f.set_len(0).unwrap_or_else(|e| panic!("truncate: {e}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_unique_seeded_and_parse_back() {
        let a = line_text("r", "s", 7, 1);
        assert_eq!(a, line_text("r", "s", 7, 1));
        assert_ne!(a, line_text("r", "s", 7, 2));
        assert_ne!(a, line_text("r", "s", 8, 1));
        assert_eq!(parse_line(&a), Some(("r", "s", 1)));
        assert!(parse_line("something else").is_none());
        assert_eq!(row_seed("x"), row_seed("x"));
    }
}
