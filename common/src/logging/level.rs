//! The running daemon's log filter: a base (the start-up filter, then what a configuration
//! reload sets) and an operator's override on top of it, optionally for a while ("raise
//! `uctel_collector::ingest` to debug for five minutes": `PUT /api/v1/log_level`).
//!
//! The filter itself sits in tracing-subscriber's reload layer
//! (`tracing_subscriber::reload`); this module only decides which directives it holds.
//! Expiry is checked by a timer and again on every read, so a missed timer (a runtime that
//! stopped) never leaves the override in place once its time is up.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tracing_subscriber::EnvFilter;

use super::{filter, LoggingError};

/// Puts a filter in place; the reload layer's handle, or nothing for a detached level.
pub(crate) trait ApplyFilter: Send + Sync {
    fn apply(&self, filter: EnvFilter) -> Result<(), String>;
}

impl<S: 'static> ApplyFilter for tracing_subscriber::reload::Handle<EnvFilter, S> {
    fn apply(&self, filter: EnvFilter) -> Result<(), String> {
        self.reload(filter).map_err(|e| e.to_string())
    }
}

/// A level with no subscriber behind it (tests, daemons embedded in another process).
struct Detached;

impl ApplyFilter for Detached {
    fn apply(&self, _filter: EnvFilter) -> Result<(), String> {
        Ok(())
    }
}

/// The filter of the installed subscriber ([`super::init`]), if any.
static INSTALLED: OnceLock<LogLevel> = OnceLock::new();

/// Controls the daemon's log filter. Cheap to clone; clones share the filter.
#[derive(Clone)]
pub struct LogLevel {
    inner: Arc<Inner>,
}

struct Inner {
    apply: Arc<dyn ApplyFilter>,
    state: Mutex<State>,
}

#[derive(Debug, Clone)]
struct State {
    base: String,
    /// The operator's directives and when they end (`None`: until reset).
    overridden: Option<(String, Option<Instant>)>,
    /// Bumped at each change, so that a timer of an older override does nothing.
    generation: u64,
}

/// What [`LogLevel::state`] reports (the JSON of `GET /api/v1/log_level`).
#[derive(Debug, Clone, PartialEq)]
pub struct LogLevelState {
    /// The directives in force.
    pub filter: String,
    /// The base directives: `--log-level` (else `RUST_LOG`, else `info`) at start.
    pub base: String,
    /// Seconds until the override ends and `base` is back; `None` when no override is set
    /// or it has no expiry.
    pub expires_in_seconds: Option<f64>,
}

impl LogLevelState {
    /// As JSON: `{"filter":"…","base":"…","expires_in_seconds":N|null}`.
    pub fn to_json(&self) -> String {
        let q = |s: &str| {
            let mut out = String::from("\"");
            for c in s.chars() {
                match c {
                    '"' => out.push_str("\\\""),
                    '\\' => out.push_str("\\\\"),
                    c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
                    c => out.push(c),
                }
            }
            out.push('"');
            out
        };
        let expires = self
            .expires_in_seconds
            .map_or_else(|| "null".to_owned(), |s| format!("{s:.3}"));
        format!(
            "{{\"filter\":{},\"base\":{},\"expires_in_seconds\":{expires}}}\n",
            q(&self.filter),
            q(&self.base)
        )
    }
}

impl std::fmt::Debug for LogLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogLevel")
            .field("state", &self.state())
            .finish()
    }
}

impl LogLevel {
    pub(crate) fn with_apply(base: String, apply: Arc<dyn ApplyFilter>) -> LogLevel {
        let level = LogLevel {
            inner: Arc::new(Inner {
                apply,
                state: Mutex::new(State {
                    base,
                    overridden: None,
                    generation: 0,
                }),
            }),
        };
        let _ = INSTALLED.set(level.clone());
        level
    }

    /// A level that filters nothing (no subscriber behind it) but keeps and reports its
    /// directives, for daemons started inside another program (the tests).
    pub fn detached(base: &str) -> LogLevel {
        LogLevel {
            inner: Arc::new(Inner {
                apply: Arc::new(Detached),
                state: Mutex::new(State {
                    base: base.to_owned(),
                    overridden: None,
                    generation: 0,
                }),
            }),
        }
    }

    /// The level of the subscriber [`super::init`] installed, else a new detached one at
    /// `info`.
    pub fn installed_or_detached() -> LogLevel {
        INSTALLED
            .get()
            .cloned()
            .unwrap_or_else(|| LogLevel::detached(super::DEFAULT_LOG_LEVEL))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The filter in force, its base, and how long the override lasts.
    pub fn state(&self) -> LogLevelState {
        self.expire(Instant::now());
        let state = self.lock();
        let now = Instant::now();
        match &state.overridden {
            Some((directives, until)) => LogLevelState {
                filter: directives.clone(),
                base: state.base.clone(),
                expires_in_seconds: until.map(|u| u.saturating_duration_since(now).as_secs_f64()),
            },
            None => LogLevelState {
                filter: state.base.clone(),
                base: state.base.clone(),
                expires_in_seconds: None,
            },
        }
    }

    /// Puts `directives` (the syntax of `--log-level`) in force over the base, for
    /// `expire` (then the base is back) or until [`LogLevel::reset`].
    ///
    /// # Errors
    /// [`LoggingError`]: the directives do not parse (nothing changes).
    pub fn set(
        &self,
        directives: &str,
        expire: Option<Duration>,
    ) -> Result<LogLevelState, LoggingError> {
        let parsed = filter(directives)?;
        let until = expire.map(|d| Instant::now() + d);
        let generation = {
            let mut state = self.lock();
            self.put(parsed, directives);
            state.overridden = Some((directives.trim().to_owned(), until));
            state.generation += 1;
            state.generation
        };
        tracing::info!(filter = directives.trim(), expire_seconds = ?expire.map(|d| d.as_secs_f64()), "log filter changed");
        if let Some(d) = expire {
            let me = self.clone();
            let end = move || me.end(generation);
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    tokio::time::sleep(d).await;
                    end();
                });
            } else {
                std::thread::spawn(move || {
                    std::thread::sleep(d);
                    end();
                });
            }
        }
        Ok(self.state())
    }

    /// Ends the override: the base is in force again.
    pub fn reset(&self) -> LogLevelState {
        let generation = self.lock().generation;
        self.end(generation);
        self.state()
    }

    /// Sets the base (a configuration reload). Applied at once unless an override is in
    /// force, then when it ends.
    ///
    /// # Errors
    /// [`LoggingError`]: the directives do not parse (nothing changes).
    pub fn set_base(&self, directives: &str) -> Result<(), LoggingError> {
        let parsed = filter(directives)?;
        let mut state = self.lock();
        if state.overridden.is_none() {
            self.put(parsed, directives);
        }
        state.base = directives.trim().to_owned();
        Ok(())
    }

    /// Ends the override if its generation is still `generation`.
    fn end(&self, generation: u64) {
        let mut state = self.lock();
        if state.generation != generation || state.overridden.is_none() {
            return;
        }
        state.overridden = None;
        state.generation += 1;
        // The base parsed when it was set.
        if let Ok(parsed) = filter(&state.base) {
            self.put(parsed, &state.base);
        }
        tracing::info!(filter = %state.base, "log filter back to its base");
    }

    /// Ends an override whose time is up at `now`.
    fn expire(&self, now: Instant) {
        let due = {
            let state = self.lock();
            match &state.overridden {
                Some((_, Some(until))) if *until <= now => Some(state.generation),
                _ => None,
            }
        };
        if let Some(g) = due {
            self.end(g);
        }
    }

    fn put(&self, parsed: EnvFilter, directives: &str) {
        if let Err(e) = self.inner.apply.apply(parsed) {
            tracing::warn!(error = %e, filter = directives, "cannot change the log filter");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn override_expires_back_to_the_base() {
        let level = LogLevel::detached("info");
        let s = level
            .set(
                "info,uctel_collector::ingest=debug",
                Some(Duration::from_millis(50)),
            )
            .unwrap();
        assert_eq!(s.filter, "info,uctel_collector::ingest=debug");
        assert_eq!(s.base, "info");
        assert!(s.expires_in_seconds.is_some_and(|e| e <= 0.05));
        std::thread::sleep(Duration::from_millis(80));
        let s = level.state();
        assert_eq!(s.filter, "info");
        assert_eq!(s.expires_in_seconds, None);
    }

    #[test]
    fn a_newer_override_outlives_the_older_timer() {
        let level = LogLevel::detached("info");
        level.set("debug", Some(Duration::from_millis(20))).unwrap();
        let generation = level.lock().generation;
        level.set("warn", None).unwrap();
        level.end(generation);
        assert_eq!(level.state().filter, "warn");
        assert_eq!(level.reset().filter, "info");
    }

    #[test]
    fn bad_directives_change_nothing() {
        let level = LogLevel::detached("info");
        assert!(level.set("inof", None).is_err());
        assert!(level.set_base("warn,=[[").is_err());
        assert_eq!(level.state().filter, "info");
    }

    #[test]
    fn base_waits_for_the_override() {
        let level = LogLevel::detached("info");
        level.set("debug", None).unwrap();
        level.set_base("warn").unwrap();
        assert_eq!(level.state().filter, "debug");
        assert_eq!(level.reset().filter, "warn");
    }

    #[test]
    fn json_is_escaped() {
        let s = LogLevelState {
            filter: "a\"b".into(),
            base: "info".into(),
            expires_in_seconds: None,
        };
        assert_eq!(
            s.to_json(),
            "{\"filter\":\"a\\\"b\",\"base\":\"info\",\"expires_in_seconds\":null}\n"
        );
    }
}
