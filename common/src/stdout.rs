//! Writing a daemon's one-shot output (`--check-config`, `--print-default-config`) to stdout
//! without `println!`, which panics when the reader has gone (`uctel-agent --check-config |
//! head`: the write fails with `EPIPE`, Rust ignores `SIGPIPE`).

use std::io::{self, Write};

/// Writes `text` to stdout and flushes. A reader that closed the pipe early (`EPIPE`,
/// [`io::ErrorKind::BrokenPipe`]) is not an error: it read what it wanted, as with `head`,
/// and the command's exit status stays that of its work.
///
/// # Errors
/// Any other write error (a full disk behind a redirection, a closed stdout).
pub fn print(text: &str) -> io::Result<()> {
    let mut out = io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}
