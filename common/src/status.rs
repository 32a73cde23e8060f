//! What both daemons' status API (`GET /api/v1/status`, `docs/status-api.md`) shares: the
//! path and schema version, a flat view of metric families ([`Samples`]) and the
//! ten-second window ([`Window`]) that turns cumulative counters into "over the last 10 s"
//! figures.
//!
//! The status document is built from the counters the daemon already exports on
//! `/metrics`, so a figure in it equals the series of the same name at the same moment.
//! Sans-IO: the window is plain data with `now` passed in; the daemons sample it once a
//! second ([`SAMPLE_EVERY`]) and at every request.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus::proto::{MetricFamily, MetricType};

/// The route of the status API on the daemons' HTTP port.
pub const PATH: &str = "/api/v1/status";

/// The schema version in every status document's `"version"` field. A new field keeps it;
/// a field removed or changed in meaning bumps it (`docs/status-api.md`).
pub const API_VERSION: u32 = 1;

/// The span of the "last 10 s" figures.
pub const WINDOW: Duration = Duration::from_secs(10);

/// How often a daemon samples its counters into its [`Window`].
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// One series of a metric family: its labels and value (a histogram contributes
/// `<name>_sum` and `<name>_count`, as in the text format).
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The label pairs, sorted by name as the registry sorts them.
    pub labels: Vec<(String, String)>,
    /// The value (a counter's count, a gauge's value).
    pub value: f64,
}

/// Series by family name, from [`prometheus::core::Collector::collect`] or
/// [`prometheus::Registry::gather`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Samples {
    families: BTreeMap<String, Vec<Sample>>,
}

impl Samples {
    /// Flattens `families` (counters and gauges; histograms as `_sum` and `_count`;
    /// summaries and untyped values are skipped).
    pub fn from_families(families: &[MetricFamily]) -> Samples {
        let mut out = Samples::default();
        for f in families {
            for m in f.get_metric() {
                let labels: Vec<(String, String)> = m
                    .get_label()
                    .iter()
                    .map(|l| (l.name().to_owned(), l.value().to_owned()))
                    .collect();
                let mut put = |name: String, value: f64| {
                    out.families.entry(name).or_default().push(Sample {
                        labels: labels.clone(),
                        value,
                    });
                };
                match f.get_field_type() {
                    MetricType::COUNTER => put(f.name().to_owned(), m.get_counter().get_value()),
                    MetricType::GAUGE => put(f.name().to_owned(), m.get_gauge().get_value()),
                    MetricType::HISTOGRAM => {
                        let h = m.get_histogram();
                        put(format!("{}_sum", f.name()), h.get_sample_sum());
                        #[allow(clippy::cast_precision_loss)]
                        put(format!("{}_count", f.name()), h.get_sample_count() as f64);
                    }
                    _ => {}
                }
            }
        }
        out
    }

    /// The series of family `name` (empty when absent).
    pub fn series(&self, name: &str) -> &[Sample] {
        self.families.get(name).map_or(&[], Vec::as_slice)
    }

    /// The sum over the series of `name` whose labels include every pair of `with`.
    pub fn sum(&self, name: &str, with: &[(&str, &str)]) -> f64 {
        self.series(name)
            .iter()
            .filter(|s| matches(s, with))
            .map(|s| s.value)
            .sum()
    }

    /// The series of `name` matching `with`, summed by the value of label `by` (a series
    /// without it is left out).
    pub fn sum_by(&self, name: &str, by: &str, with: &[(&str, &str)]) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for s in self.series(name).iter().filter(|s| matches(s, with)) {
            if let Some((_, v)) = s.labels.iter().find(|(k, _)| k == by) {
                *out.entry(v.clone()).or_insert(0.0) += s.value;
            }
        }
        out
    }

    /// Every value of label `label` among the series of `name`, sorted, once each.
    pub fn label_values(&self, name: &str, label: &str) -> Vec<String> {
        let mut v: Vec<String> = self
            .series(name)
            .iter()
            .filter_map(|s| s.labels.iter().find(|(k, _)| k == label))
            .map(|(_, v)| v.clone())
            .collect();
        v.sort();
        v.dedup();
        v
    }
}

fn matches(s: &Sample, with: &[(&str, &str)]) -> bool {
    with.iter()
        .all(|(k, v)| s.labels.iter().any(|(lk, lv)| lk == k && lv == v))
}

/// Counter snapshots of the last [`WINDOW`] and a bit, oldest first, to compute what grew
/// over the last ten seconds.
#[derive(Debug, Clone)]
pub struct Window {
    span: Duration,
    points: VecDeque<(Instant, Arc<Samples>)>,
}

impl Default for Window {
    fn default() -> Self {
        Window::new(WINDOW)
    }
}

/// The figures of one window: the snapshot at its start and how long ago that was.
#[derive(Debug, Clone)]
pub struct Since {
    /// The snapshot at the start of the window (the current one when none is older).
    pub then: Arc<Samples>,
    /// Seconds from that snapshot to now (0 when the window is empty).
    pub seconds: f64,
}

impl Since {
    /// What `name` (series matching `with`) grew by since the window's start: the current
    /// sum minus the earlier one; a counter that went down (a series that was removed and
    /// created anew) counts from zero.
    pub fn increase(&self, now: &Samples, name: &str, with: &[(&str, &str)]) -> f64 {
        let (a, b) = (self.then.sum(name, with), now.sum(name, with));
        if b >= a {
            b - a
        } else {
            b
        }
    }

    /// [`Since::increase`] per second over the window (0 for an empty window).
    pub fn rate(&self, now: &Samples, name: &str, with: &[(&str, &str)]) -> f64 {
        if self.seconds > 0.0 {
            self.increase(now, name, with) / self.seconds
        } else {
            0.0
        }
    }

    /// [`Since::increase`] by the value of label `by`.
    pub fn increase_by(
        &self,
        now: &Samples,
        name: &str,
        by: &str,
        with: &[(&str, &str)],
    ) -> BTreeMap<String, f64> {
        let then = self.then.sum_by(name, by, with);
        now.sum_by(name, by, with)
            .into_iter()
            .map(|(k, b)| {
                let a = then.get(&k).copied().unwrap_or(0.0);
                (k, if b >= a { b - a } else { b })
            })
            .collect()
    }
}

impl Window {
    /// A window of `span`.
    pub fn new(span: Duration) -> Window {
        Window {
            span,
            points: VecDeque::new(),
        }
    }

    /// Adds the snapshot `samples` taken at `now` (an earlier `now` than the newest point
    /// is ignored) and forgets points no longer needed: the newest one at least `span` old
    /// is kept as the window's start.
    pub fn record(&mut self, now: Instant, samples: Arc<Samples>) {
        if self.points.back().is_some_and(|(t, _)| *t > now) {
            return;
        }
        self.points.push_back((now, samples));
        while self.points.len() >= 2 && now.saturating_duration_since(self.points[1].0) >= self.span
        {
            self.points.pop_front();
        }
    }

    /// The start of the window ending at `now`: the newest point at least `span` before
    /// `now`, else the oldest point; `current` when there is none.
    pub fn since(&self, now: Instant, current: &Arc<Samples>) -> Since {
        let start = self
            .points
            .iter()
            .rev()
            .find(|(t, _)| now.saturating_duration_since(*t) >= self.span)
            .or_else(|| self.points.front());
        match start {
            Some((t, s)) => Since {
                then: s.clone(),
                seconds: now.saturating_duration_since(*t).as_secs_f64(),
            },
            None => Since {
                then: current.clone(),
                seconds: 0.0,
            },
        }
    }
}

/// Seconds since the Unix epoch of `t` (0 before it), for the documents' timestamps.
pub fn unix_seconds(t: std::time::SystemTime) -> f64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry_with(values: &[(&str, &str, u64)]) -> Samples {
        let r = prometheus::Registry::new();
        let c = prometheus::IntCounterVec::new(
            prometheus::Opts::new("t_total", "test"),
            &["agent", "reason"],
        )
        .unwrap();
        r.register(Box::new(c.clone())).unwrap();
        for (a, reason, n) in values {
            c.with_label_values(&[a, reason]).inc_by(*n);
        }
        let h = prometheus::Histogram::with_opts(prometheus::HistogramOpts::new("h", "h")).unwrap();
        r.register(Box::new(h.clone())).unwrap();
        h.observe(0.5);
        h.observe(1.5);
        Samples::from_families(&r.gather())
    }

    #[test]
    fn samples_sum_and_group_by_labels() {
        let s = registry_with(&[("a", "x", 3), ("a", "y", 4), ("b", "x", 5)]);
        assert_eq!(s.sum("t_total", &[]), 12.0);
        assert_eq!(s.sum("t_total", &[("agent", "a")]), 7.0);
        assert_eq!(s.sum("t_total", &[("agent", "a"), ("reason", "y")]), 4.0);
        assert_eq!(s.sum("nope", &[]), 0.0);
        let by = s.sum_by("t_total", "reason", &[("agent", "a")]);
        assert_eq!(by.get("x"), Some(&3.0));
        assert_eq!(by.get("y"), Some(&4.0));
        assert_eq!(s.label_values("t_total", "agent"), vec!["a", "b"]);
        assert_eq!(s.sum("h_count", &[]), 2.0);
        assert_eq!(s.sum("h_sum", &[]), 2.0);
    }

    #[test]
    fn window_starts_at_the_newest_point_at_least_a_span_old() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let snap = |n: u64| Arc::new(registry_with(&[("a", "x", n)]));
        let mut w = Window::new(Duration::from_secs(10));
        let current = snap(0);
        assert_eq!(w.since(at(0), &current).seconds, 0.0);
        for s in 0..=25 {
            w.record(at(s), snap(s * 2));
        }
        assert!(w.points.len() <= 12, "{}", w.points.len());
        let now = snap(50);
        let since = w.since(at(25), &now);
        assert_eq!(since.seconds, 10.0);
        assert_eq!(since.increase(&now, "t_total", &[]), 20.0);
        assert_eq!(since.rate(&now, "t_total", &[]), 2.0);
        // Younger than a span: from the oldest point.
        let mut young = Window::new(Duration::from_secs(10));
        young.record(at(0), snap(0));
        young.record(at(3), snap(9));
        let since = young.since(at(4), &snap(12));
        assert_eq!(since.seconds, 4.0);
        assert_eq!(since.increase(&snap(12), "t_total", &[]), 12.0);
        // A counter that restarted counts from zero, never negative.
        assert_eq!(since.increase(&snap(0), "t_total", &[]), 0.0);
        assert_eq!(
            since
                .increase_by(&snap(12), "t_total", "reason", &[])
                .get("x"),
            Some(&12.0)
        );
        // A point from the past is ignored.
        let n = young.points.len();
        young.record(at(1), snap(1));
        assert_eq!(young.points.len(), n);
    }
}
