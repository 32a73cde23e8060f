//! Logging setup for the daemons: `tracing` events to stderr through `tracing-subscriber`.
//!
//! The filter is an `EnvFilter` directive string (`info`, `warn,uctel_collector=debug`, ...).
//! Precedence: an explicit `--log-level` wins, else the configuration file's `log_level`
//! (which a reload can change, [`BaseRule`]), else `RUST_LOG`, else `info`. While the daemon
//! runs, [`LogLevel`] changes the filter (`PUT /api/v1/log_level`, a reload).

use tracing_subscriber::EnvFilter;

/// The filter used when neither `--log-level` nor `RUST_LOG` is given.
pub const DEFAULT_LOG_LEVEL: &str = "info";

/// Errors from [`init`].
#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    /// The directive string did not parse.
    #[error("invalid log level {directives:?}: {source}")]
    InvalidFilter {
        /// The rejected directives.
        directives: String,
        /// The parser's reason.
        source: tracing_subscriber::filter::ParseError,
    },
    /// A bare word that is not a level (probably a misspelt level).
    #[error("unknown log level {directive:?}: expected trace, debug, info, warn, error or off (or target=level directives)")]
    UnknownLevel {
        /// The rejected directive.
        directive: String,
    },
    /// A global subscriber was already installed (e.g. `init` called twice).
    #[error("logging already initialised: {0}")]
    AlreadyInitialised(String),
}

/// Chooses the filter directives: `explicit` (the `--log-level` flag), else the value of
/// `RUST_LOG` passed in as `env`, else [`DEFAULT_LOG_LEVEL`]. Empty strings count as unset.
pub fn choose_directives(explicit: Option<&str>, env: Option<&str>) -> String {
    explicit
        .filter(|s| !s.trim().is_empty())
        .or(env.filter(|s| !s.trim().is_empty()))
        .unwrap_or(DEFAULT_LOG_LEVEL)
        .to_string()
}

/// Where the daemon's base log filter comes from: `--log-level`, else the configuration
/// file's `log_level`, else `RUST_LOG`, else [`DEFAULT_LOG_LEVEL`]. The flag and the
/// environment are read once at start; the file's key again at each reload.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BaseRule {
    /// `--log-level`, when given (not empty).
    pub flag: Option<String>,
    /// `RUST_LOG`, when set (not empty).
    pub env: Option<String>,
}

impl BaseRule {
    /// The rule of this process: `flag` and the `RUST_LOG` environment variable.
    pub fn from_env(flag: Option<&str>) -> BaseRule {
        let keep = |s: Option<&str>| s.filter(|s| !s.trim().is_empty()).map(str::to_owned);
        BaseRule {
            flag: keep(flag),
            env: keep(std::env::var("RUST_LOG").ok().as_deref()),
        }
    }

    /// The base directives with `config_key` (the file's `log_level`) as the file says it.
    pub fn directives(&self, config_key: Option<&str>) -> String {
        let key = config_key.filter(|s| !s.trim().is_empty());
        match (&self.flag, key) {
            (Some(flag), _) => flag.clone(),
            (None, Some(key)) => key.to_owned(),
            (None, None) => choose_directives(None, self.env.as_deref()),
        }
    }
}

/// The bare levels a directive without `target=` may name.
const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

/// Parses directives into a filter. Errors: [`LoggingError::InvalidFilter`].
///
/// A directive without `=` must be a level (`trace`, `debug`, `info`, `warn`, `error`,
/// `off`): `EnvFilter` would take a bare word such as a misspelt `inof` as a target name and
/// silence every log line, so it is refused here.
pub fn filter(directives: &str) -> Result<EnvFilter, LoggingError> {
    for d in directives
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
    {
        if !d.contains('=')
            && !d.contains('[')
            && !LEVELS.contains(&d.to_ascii_lowercase().as_str())
        {
            return Err(LoggingError::UnknownLevel {
                directive: d.to_string(),
            });
        }
    }
    EnvFilter::builder()
        .parse(directives)
        .map_err(|source| LoggingError::InvalidFilter {
            directives: directives.to_string(),
            source,
        })
}

/// Installs the global subscriber writing human-readable lines to stderr.
/// `log_level` is the `--log-level` flag (None when not given); `RUST_LOG` is read here.
/// Colours are used only when stderr is a terminal and `NO_COLOR` is unset, so files, pipes
/// and journald get plain text.
///
/// The filter sits behind tracing-subscriber's reload layer: the returned [`LogLevel`]
/// changes it while the daemon runs (`PUT /api/v1/log_level`, a configuration reload).
pub fn init(log_level: Option<&str>) -> Result<LogLevel, LoggingError> {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let env = std::env::var("RUST_LOG").ok();
    let directives = choose_directives(log_level, env.as_deref());
    let filter = filter(&directives)?;
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let (layer, handle) = tracing_subscriber::reload::Layer::new(filter);
    tracing_subscriber::registry()
        .with(layer)
        .with(
            tracing_subscriber::fmt::layer()
                .with_ansi(ansi)
                .with_writer(std::io::stderr),
        )
        .try_init()
        .map_err(|e| LoggingError::AlreadyInitialised(e.to_string()))?;
    let handle: Arc<dyn ApplyFilter> = Arc::new(handle);
    Ok(LogLevel::with_apply(directives, handle))
}

pub use level::{LogLevel, LogLevelState};

mod level;
use level::ApplyFilter;
use std::sync::Arc;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precedence() {
        assert_eq!(choose_directives(Some("debug"), Some("warn")), "debug");
        assert_eq!(choose_directives(None, Some("warn")), "warn");
        assert_eq!(choose_directives(Some(" "), Some("warn")), "warn");
        assert_eq!(choose_directives(None, None), DEFAULT_LOG_LEVEL);
        assert_eq!(choose_directives(None, Some("")), DEFAULT_LOG_LEVEL);
        let rule = |flag: Option<&str>, env: Option<&str>| BaseRule {
            flag: flag.map(Into::into),
            env: env.map(Into::into),
        };
        assert_eq!(
            rule(Some("debug"), Some("warn")).directives(Some("error")),
            "debug"
        );
        assert_eq!(rule(None, Some("warn")).directives(Some("error")), "error");
        assert_eq!(rule(None, Some("warn")).directives(None), "warn");
        assert_eq!(rule(None, None).directives(Some(" ")), DEFAULT_LOG_LEVEL);
    }

    #[test]
    fn filters_parse_or_fail() {
        assert!(filter("info,uctel_collector=debug").is_ok());
        let err = filter("info,=[[").unwrap_err();
        assert!(err.to_string().contains("invalid log level"), "{err}");
        assert!(filter("WARN").is_ok());
        assert!(filter("off").is_ok());
        let err = filter("inof").unwrap_err();
        assert!(
            err.to_string().contains("unknown log level \"inof\""),
            "{err}"
        );
        let err = filter("warn,bogus").unwrap_err();
        assert!(matches!(err, LoggingError::UnknownLevel { .. }), "{err}");
    }

    #[test]
    fn second_init_is_an_error() {
        // The first call may or may not win against other tests in this process; the second
        // call certainly finds a subscriber installed.
        let _ = init(Some("warn"));
        assert!(matches!(
            init(Some("warn")),
            Err(LoggingError::AlreadyInitialised(_))
        ));
    }
}
