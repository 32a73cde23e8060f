//! What a failed load reports: [`Problem`] (one mistake, with its line, column and key path)
//! and [`ConfigError`] (all of a file's problems, printed one per line), and
//! [`check_startup`], the start-up check both daemons run before anything else.

use std::fmt;
use std::path::PathBuf;

/// One configuration problem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// 1-based line in the file, when known.
    pub line: Option<usize>,
    /// 1-based column (in characters), when known.
    pub column: Option<usize>,
    /// Dotted key path, sequences as `[index]`, e.g. `auth.agents[0].token_file`.
    /// Empty for the document itself.
    pub key_path: String,
    /// What is wrong, e.g. ``unknown field `bogus`, expected one of ...``.
    pub message: String,
}

/// All problems found in one configuration file.
///
/// `Display` prints one problem per line as `file:line:col: key.path: message` (the
/// `line:col` part is left out when unknown), the format editors and CI logs link to.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// The file (or name) the configuration came from.
    pub file: PathBuf,
    /// Every problem found, in file order where lines are known. Never empty.
    pub problems: Vec<Problem>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{}:", self.file.display())?;
            if let Some(line) = p.line {
                write!(f, "{line}:{}:", p.column.unwrap_or(1))?;
            }
            if !p.key_path.is_empty() {
                write!(f, " {}:", p.key_path)?;
            }
            write!(f, " {}", p.message)?;
        }
        Ok(())
    }
}

/// The start-up check both daemons run before anything else: the configuration as `loaded`
/// and the log filter of `log_level` (`--log-level`, else `RUST_LOG`, else the default).
/// Every problem of both is printed on stderr in one go, the configuration's followed by its
/// [`ConfigError::summary`]. Returns the configuration and the filter directives to start
/// logging with, or `None` when anything is wrong (the daemon then exits 2).
pub fn check_startup<T>(
    daemon: &str,
    loaded: Result<T, ConfigError>,
    log_level: Option<&str>,
) -> Option<(T, String)> {
    let env_filter = std::env::var("RUST_LOG").ok();
    let filter_source = if log_level.is_some_and(|l| !l.trim().is_empty()) {
        "--log-level"
    } else {
        "RUST_LOG"
    };
    let directives = crate::logging::choose_directives(log_level, env_filter.as_deref());
    let filter = crate::logging::filter(&directives);
    if let Err(e) = &loaded {
        eprintln!("{e}");
    }
    if let Err(e) = &filter {
        eprintln!("{daemon}: {filter_source}: {e}");
    }
    match (loaded, filter) {
        (Ok(config), Ok(_)) => Some((config, directives)),
        (loaded, _) => {
            if let Err(e) = loaded {
                eprintln!("{}", e.summary());
            }
            None
        }
    }
}

impl ConfigError {
    /// The line both daemons print after the problems:
    /// `FILE: invalid configuration (N problem[s])`.
    pub fn summary(&self) -> String {
        let n = self.problems.len();
        format!(
            "{}: invalid configuration ({n} problem{})",
            self.file.display(),
            if n == 1 { "" } else { "s" }
        )
    }
}
