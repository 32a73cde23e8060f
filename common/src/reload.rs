//! Configuration reload without a restart: `SIGHUP` and `POST /-/reload` (behind
//! `listen.enable_lifecycle`), as Prometheus has them.
//!
//! A reload reads the configuration file again and validates it whole, with the same
//! loader as the start (every problem logged, `file:line:col: key: message`). Then it
//! compares the new configuration with the one in force, key by key ([`changed_keys`]), and
//! splits the changed keys into those the daemon applies live (its `live` key prefixes) and
//! the rest, which need a restart. It is all or nothing:
//!
//! - the file is invalid: nothing changes;
//! - a key that needs a restart changed: nothing changes, and the keys are named;
//! - otherwise the daemon's `apply` puts the live keys in force; if it fails, nothing it
//!   applied is kept in the reported state and the reload counts as failed.
//!
//! Each outcome sets `<namespace>_config_last_reload_successful` (1 or 0) and, on success,
//! `<namespace>_config_last_reload_success_timestamp_seconds` (Unix seconds), the names and
//! meaning of Prometheus's own `prometheus_config_last_reload_*`.

use std::sync::{Arc, Mutex, OnceLock};

/// Runs one reload and says what happened (a line for the log and the HTTP answer). Cheap
/// to clone.
#[derive(Clone)]
pub struct ReloadFn(Arc<dyn Fn() -> Outcome + Send + Sync>);

impl ReloadFn {
    /// A reload that runs `f`.
    pub fn new(f: impl Fn() -> Outcome + Send + Sync + 'static) -> ReloadFn {
        ReloadFn(Arc::new(f))
    }

    /// Runs one reload (blocking: it reads the file).
    pub fn run(&self) -> Outcome {
        (self.0)()
    }
}

impl std::fmt::Debug for ReloadFn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReloadFn")
    }
}

/// The result of one reload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The file is valid and nothing in it changed.
    Unchanged,
    /// These keys (dotted paths) were applied live.
    Applied(Vec<String>),
    /// The file is invalid: every problem, one per line. Nothing changed.
    Invalid(String),
    /// These changed keys need a restart. Nothing changed.
    NeedsRestart(Vec<String>),
    /// Applying the live keys failed: the reason. The previous configuration stays in force.
    ApplyFailed(String),
}

impl Outcome {
    /// Whether the reload succeeded (the new file is in force, or it changed nothing).
    pub fn is_success(&self) -> bool {
        matches!(self, Outcome::Unchanged | Outcome::Applied(_))
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Unchanged => write!(f, "configuration reloaded: nothing changed"),
            Outcome::Applied(keys) => {
                write!(f, "configuration reloaded: applied {}", keys.join(", "))
            }
            Outcome::Invalid(problems) => write!(
                f,
                "configuration reload failed: the file is invalid, nothing changed:\n{problems}"
            ),
            Outcome::NeedsRestart(keys) => write!(
                f,
                "configuration reload refused: {} need{} a restart (nothing changed; restart \
                 the daemon to apply the file)",
                keys.join(", "),
                if keys.len() == 1 { "s" } else { "" }
            ),
            Outcome::ApplyFailed(reason) => write!(
                f,
                "configuration reload failed while applying: {reason} (the previous \
                 configuration stays in force)"
            ),
        }
    }
}

/// The dotted key paths whose values differ between `old` and `new` (two configurations
/// serialised to YAML values). Mappings are compared key by key; a sequence or a scalar that
/// differs is one changed key at its path (`sources.logs` when a log source changed).
/// Sorted, without duplicates.
pub fn changed_keys(old: &serde_yaml::Value, new: &serde_yaml::Value) -> Vec<String> {
    let mut out = Vec::new();
    walk("", old, new, &mut out);
    out.sort();
    out.dedup();
    out
}

fn walk(path: &str, old: &serde_yaml::Value, new: &serde_yaml::Value, out: &mut Vec<String>) {
    use serde_yaml::Value;
    let join = |k: &Value| {
        let k = match k {
            Value::String(s) => s.clone(),
            other => serde_yaml::to_string(other)
                .unwrap_or_default()
                .trim()
                .to_owned(),
        };
        if path.is_empty() {
            k
        } else {
            format!("{path}.{k}")
        }
    };
    match (old, new) {
        (Value::Mapping(a), Value::Mapping(b)) => {
            for (k, va) in a {
                match b.get(k) {
                    Some(vb) => walk(&join(k), va, vb, out),
                    None => out.push(join(k)),
                }
            }
            for k in b.keys().filter(|k| !a.contains_key(*k)) {
                out.push(join(k));
            }
        }
        (a, b) if a == b => {}
        _ => out.push(if path.is_empty() {
            "(the whole file)".to_owned()
        } else {
            path.to_owned()
        }),
    }
}

/// Whether `key` is `prefix` or under it (`sources.logs` is under `sources`).
fn under(key: &str, prefix: &str) -> bool {
    key == prefix
        || key
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('.'))
}

/// The metrics of the reloads.
#[derive(Debug, Clone)]
pub struct ReloadMetrics {
    successful: prometheus::IntGauge,
    timestamp: prometheus::Gauge,
}

impl ReloadMetrics {
    /// Registers `<namespace>_config_last_reload_successful` (1 at start) and
    /// `<namespace>_config_last_reload_success_timestamp_seconds` (the start time) in
    /// `registry`.
    ///
    /// # Errors
    /// A registration conflict or an invalid namespace.
    pub fn register(
        registry: &prometheus::Registry,
        namespace: &str,
    ) -> Result<ReloadMetrics, prometheus::Error> {
        let successful = prometheus::IntGauge::with_opts(
            prometheus::Opts::new(
                "config_last_reload_successful",
                "Whether the last configuration reload attempt was successful (1) or not (0).",
            )
            .namespace(namespace),
        )?;
        let timestamp = prometheus::Gauge::with_opts(
            prometheus::Opts::new(
                "config_last_reload_success_timestamp_seconds",
                "Timestamp of the last successful configuration load (the start, or a \
                 reload), in seconds since the Unix epoch.",
            )
            .namespace(namespace),
        )?;
        registry.register(Box::new(successful.clone()))?;
        registry.register(Box::new(timestamp.clone()))?;
        successful.set(1);
        timestamp.set(unix_seconds());
        Ok(ReloadMetrics {
            successful,
            timestamp,
        })
    }

    fn record(&self, outcome: &Outcome) {
        if outcome.is_success() {
            self.successful.set(1);
            self.timestamp.set(unix_seconds());
        } else {
            self.successful.set(0);
        }
    }
}

fn unix_seconds() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Reads the configuration again: the new one, or every problem as text.
pub type LoadFn<C> = Box<dyn Fn() -> Result<C, String> + Send + Sync>;

/// Puts the live keys of `new` in force (`old` is the configuration in force); `Err` with
/// the reason when it cannot (then it must have changed nothing).
pub type ApplyFn<C> = Box<dyn Fn(&C, &C) -> Result<(), String> + Send + Sync>;

/// The changed live keys whose new value still needs a restart (a source added where only
/// a change is live, a buffer made smaller), named for the refusal; `old` is in force.
pub type RestartFn<C> = Box<dyn Fn(&C, &C) -> Vec<String> + Send + Sync>;

/// A daemon's reload: how to read its configuration, which keys change live, how to apply
/// them. [`Reloader::into_fn`] makes the [`ReloadFn`] the signal handler and the HTTP
/// endpoint call.
pub struct Reloader<C> {
    /// The configuration in force.
    current: Mutex<C>,
    load: LoadFn<C>,
    live: &'static [&'static str],
    restart: Option<RestartFn<C>>,
    apply: ApplyFn<C>,
    metrics: ReloadMetrics,
}

impl<C> std::fmt::Debug for Reloader<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloader")
            .field("live", &self.live)
            .finish_non_exhaustive()
    }
}

impl<C: serde::Serialize + Send + 'static> Reloader<C> {
    /// A reloader starting from `current` (the configuration the daemon started with).
    /// `live`: the key prefixes that may change without a restart (`log_level`,
    /// `sources`); every other key needs one.
    pub fn new(
        current: C,
        load: LoadFn<C>,
        live: &'static [&'static str],
        apply: ApplyFn<C>,
        metrics: ReloadMetrics,
    ) -> Self {
        Reloader {
            current: Mutex::new(current),
            load,
            live,
            restart: None,
            apply,
            metrics,
        }
    }

    /// Also refuses (as [`Outcome::NeedsRestart`], before anything is applied) a file for
    /// which `restart` names keys: live keys whose new value needs a restart all the same.
    #[must_use]
    pub fn with_restart_keys(mut self, restart: RestartFn<C>) -> Self {
        self.restart = Some(restart);
        self
    }

    /// One reload (module docs): load, validate, compare, apply or refuse. Logs the outcome
    /// and records it in the metrics. Reloads run one at a time.
    pub fn reload(&self) -> Outcome {
        let mut current = self
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let outcome = self.reload_locked(&mut current);
        self.metrics.record(&outcome);
        if outcome.is_success() {
            tracing::info!("{outcome}");
        } else {
            tracing::error!("{outcome}");
        }
        outcome
    }

    fn reload_locked(&self, current: &mut C) -> Outcome {
        let new = match (self.load)() {
            Ok(c) => c,
            Err(problems) => return Outcome::Invalid(problems),
        };
        let (Ok(a), Ok(b)) = (serde_yaml::to_value(&*current), serde_yaml::to_value(&new)) else {
            return Outcome::ApplyFailed("cannot compare the configurations".into());
        };
        let changed = changed_keys(&a, &b);
        if changed.is_empty() {
            return Outcome::Unchanged;
        }
        let mut restart: Vec<String> = changed
            .iter()
            .filter(|k| !self.live.iter().any(|p| under(k, p)))
            .cloned()
            .collect();
        if let Some(f) = &self.restart {
            restart.extend(f(current, &new));
        }
        if !restart.is_empty() {
            return Outcome::NeedsRestart(restart);
        }
        if let Err(reason) = (self.apply)(current, &new) {
            return Outcome::ApplyFailed(reason);
        }
        *current = new;
        Outcome::Applied(changed)
    }

    /// The reload as a [`ReloadFn`].
    pub fn into_fn(self) -> ReloadFn
    where
        C: Sync,
    {
        let me = Arc::new(self);
        ReloadFn::new(move || me.reload())
    }
}

/// What `SIGHUP` runs ([`crate::shutdown::on_signals`]): set once by the daemon's `main`.
static ON_SIGHUP: OnceLock<ReloadFn> = OnceLock::new();

/// Makes `SIGHUP` run `reload` (the first call wins; later calls are ignored).
pub fn on_sighup(reload: ReloadFn) {
    let _ = ON_SIGHUP.set(reload);
}

/// The reload `SIGHUP` runs, once the daemon has set one.
pub(crate) fn sighup_handler() -> Option<ReloadFn> {
    ON_SIGHUP.get().cloned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[derive(serde::Serialize, Clone, Debug, PartialEq)]
    struct Conf {
        log_level: String,
        listen: String,
        sources: Vec<String>,
    }

    fn conf(level: &str, listen: &str) -> Conf {
        Conf {
            log_level: level.into(),
            listen: listen.into(),
            sources: vec!["a".into()],
        }
    }

    fn reloader(next: Arc<Mutex<Result<Conf, String>>>, applied: Arc<AtomicU32>) -> Reloader<Conf> {
        let registry = prometheus::Registry::new();
        let metrics = ReloadMetrics::register(&registry, "t").unwrap();
        Reloader::new(
            conf("info", ":1"),
            Box::new(move || next.lock().unwrap().clone()),
            &["log_level", "sources"],
            Box::new(move |_, _| {
                applied.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }),
            metrics,
        )
    }

    #[test]
    fn all_or_nothing() {
        let next = Arc::new(Mutex::new(Ok(conf("info", ":1"))));
        let applied = Arc::new(AtomicU32::new(0));
        let r = reloader(next.clone(), applied.clone());
        assert_eq!(r.reload(), Outcome::Unchanged);
        *next.lock().unwrap() = Ok(conf("debug", ":2"));
        assert_eq!(r.reload(), Outcome::NeedsRestart(vec!["listen".into()]));
        assert_eq!(r.metrics.successful.get(), 0);
        assert_eq!(applied.load(Ordering::Relaxed), 0);
        *next.lock().unwrap() = Err("f:1:1: x: bad".into());
        assert!(matches!(r.reload(), Outcome::Invalid(_)));
        let mut c = conf("debug", ":1");
        c.sources.push("b".into());
        *next.lock().unwrap() = Ok(c.clone());
        assert_eq!(
            r.reload(),
            Outcome::Applied(vec!["log_level".into(), "sources".into()])
        );
        assert_eq!(r.metrics.successful.get(), 1);
        assert_eq!(applied.load(Ordering::Relaxed), 1);
        assert_eq!(*r.current.lock().unwrap(), c);
    }

    #[test]
    fn a_live_key_whose_value_needs_a_restart_is_refused_before_apply() {
        let next = Arc::new(Mutex::new(Ok(conf("debug", ":1"))));
        let applied = Arc::new(AtomicU32::new(0));
        let r = reloader(next.clone(), applied.clone()).with_restart_keys(Box::new(
            |old: &Conf, new: &Conf| {
                (old.log_level != new.log_level)
                    .then(|| "log_level (to debug)".to_owned())
                    .into_iter()
                    .collect()
            },
        ));
        assert_eq!(
            r.reload(),
            Outcome::NeedsRestart(vec!["log_level (to debug)".into()])
        );
        assert_eq!(applied.load(Ordering::Relaxed), 0);
        assert_eq!(r.metrics.successful.get(), 0);
        assert_eq!(*r.current.lock().unwrap(), conf("info", ":1"));
    }

    #[test]
    fn keys_are_paths() {
        let a: serde_yaml::Value = serde_yaml::from_str("a: {b: 1, c: [1]}\nd: 2").unwrap();
        let b: serde_yaml::Value = serde_yaml::from_str("a: {b: 2, c: [1], e: 1}\nd: 2").unwrap();
        assert_eq!(changed_keys(&a, &b), vec!["a.b", "a.e"]);
        assert!(under("sources.logs", "sources"));
        assert!(!under("sourcesx", "sources"));
    }
}
