//! The Prometheus text exposition format (0.0.4) as protocol records, for the sources that
//! read it (`textfile`, `scrape`).
//!
//! Types: counters, gauges and untyped samples keep their type (`untyped` travels as the
//! protocol's untyped, which the collector exposes as a gauge); a histogram becomes one
//! histogram record per label set (its `_bucket`, `_sum` and `_count`), unless a bucket count
//! is not a whole number, when its series travel one by one as untyped samples; a summary's
//! series (`{quantile}`, `_sum`, `_count`) travel one by one as untyped samples, because the
//! protocol has no summary type. Either way the collector serves the same series with the
//! same values as the source. Label values and help texts are unescaped (`\\`, `\"`, `\n`).
//!
//! Parsing is `prom_text_format_parser`'s (MIT/Apache-2.0; the text format with types, help,
//! histogram and summary grouping and timestamps). Of the crates evaluated,
//! `openmetrics-parser` is LGPL-3.0, `nom-openmetrics` drops timestamps, and
//! `prometheus-parse` splits label values at every comma and merges a histogram's label sets.

use std::collections::HashSet;

use prom_text_format_parser::{Scrape, Type, ValueType};
use uctel_protocol::payload::{Bucket, Metric, MetricType};

use super::metric::sample;

/// Longest help text kept (the protocol's limit).
const MAX_HELP_BYTES: usize = 1024;

/// What to do with samples that carry their own timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timestamps {
    /// Keep them (`timestamp_ms`), as Prometheus honours a scraped target's timestamps.
    Keep,
    /// Refuse the whole text, as node_exporter's textfile collector does.
    Refuse,
}

/// Why a text was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExpositionError {
    /// Not the text format (the parser's message), or a value that is not a number.
    #[error("not the Prometheus text format: {0}")]
    Parse(String),
    /// A sample has a timestamp and [`Timestamps::Refuse`] was asked.
    #[error("{0}")]
    Timestamps(String),
}

/// A float as the text format writes it (Go's `ParseFloat`: `NaN`, `+Inf`, `-Inf`, ...).
fn number(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => s.parse().ok(),
    }
}

/// Parses `text` (the text exposition format 0.0.4) into records: families without
/// `# HELP` get `default_help(name)`; samples with a timestamp keep it in `timestamp_ms`
/// (or make the whole text an error with [`Timestamps::Refuse`]). A series given twice is
/// kept twice (node_exporter's textfile collector fails its gather on one; see
/// [`parse_first`] for Prometheus's scrape rule).
///
/// # Errors
/// [`ExpositionError::Parse`] (not the format, or a value that is not a number),
/// [`ExpositionError::Timestamps`].
pub fn parse(
    text: &str,
    default_help: &dyn Fn(&str) -> String,
    timestamps: Timestamps,
) -> Result<Vec<Metric>, ExpositionError> {
    parse_with(text, default_help, timestamps, false).map(|p| p.metrics)
}

/// A text parsed by [`parse_first`]: its records and the samples it gave twice.
#[derive(Debug, Default)]
pub struct Exposition {
    /// The records, each series with its first sample.
    pub metrics: Vec<Metric>,
    /// One entry per sample refused as a repeat of a series given before in the same text:
    /// the name of the record it would have joined (a histogram's family name for its
    /// `_bucket`, `_sum` and `_count`, else the series name).
    pub duplicates: Vec<String>,
}

/// [`parse`], keeping only the first sample of a series (metric name and label set, labels in
/// any order) given more than once, as Prometheus's scrape loop does: it appends the first
/// and refuses the others as `duplicate` (`scrape/scrape.go`, `checkAddError`,
/// `storage.ErrDuplicateSampleForTimestamp`, counted in
/// `prometheus_target_scrapes_sample_duplicate_timestamp_total`). The refused samples are
/// listed in [`Exposition::duplicates`].
///
/// # Errors
/// As [`parse`].
pub fn parse_first(
    text: &str,
    default_help: &dyn Fn(&str) -> String,
    timestamps: Timestamps,
) -> Result<Exposition, ExpositionError> {
    parse_with(text, default_help, timestamps, true)
}

fn parse_with(
    text: &str,
    default_help: &dyn Fn(&str) -> String,
    timestamps: Timestamps,
    first_only: bool,
) -> Result<Exposition, ExpositionError> {
    let scrape = Scrape::parse(text).map_err(|e| ExpositionError::Parse(format!("{e:?}")))?;
    let mut out = Vec::new();
    let mut seen: HashSet<(String, Vec<(String, String)>)> = HashSet::new();
    let mut duplicates = Vec::new();
    for family in &scrape.metrics {
        if timestamps == Timestamps::Refuse
            && family.samples.iter().any(|s| s.value.timestamp.is_some())
        {
            return Err(ExpositionError::Timestamps(format!(
                "{} carries client-side timestamps; the whole file is skipped",
                family.name
            )));
        }
        let help = family.help_desc.as_deref().map_or_else(
            || default_help(&family.name),
            |h| cut(&unescape(h), MAX_HELP_BYTES).to_owned(),
        );
        let mut samples = Vec::with_capacity(family.samples.len());
        for s in &family.samples {
            let value = number(&s.value.value)
                .ok_or_else(|| ExpositionError::Parse(format!("bad value {:?}", *s.value.value)))?;
            let labels: Vec<(String, String)> = s
                .labels
                .iter()
                .map(|l| (l.key.clone(), unescape(&l.value)))
                .collect();
            if first_only {
                let is_bucket = s.value.value_type == ValueType::Sample
                    && family.kind == Type::Histogram
                    && labels.iter().any(|(k, _)| k == "le");
                let mut key = labels.clone();
                key.sort();
                if !seen.insert((
                    series_name(&family.name, s.value.value_type, is_bucket),
                    key,
                )) {
                    duplicates.push(if family.kind == Type::Histogram {
                        family.name.clone()
                    } else {
                        series_name(&family.name, s.value.value_type, false)
                    });
                    continue;
                }
            }
            samples.push((s.value.value_type, labels, value, s.value.timestamp));
        }
        match family.kind {
            Type::Counter => {
                one_by_one(&mut out, &family.name, &help, MetricType::Counter, &samples)
            }
            Type::Gauge => one_by_one(&mut out, &family.name, &help, MetricType::Gauge, &samples),
            Type::Histogram => histograms(&mut out, &family.name, &help, &samples),
            Type::Summary | Type::Untyped => {
                one_by_one(&mut out, &family.name, &help, MetricType::Untyped, &samples);
            }
        }
    }
    Ok(Exposition {
        metrics: out,
        duplicates,
    })
}

/// One sample: its kind within the family, labels, value and timestamp (ms).
type Parsed = (ValueType, Vec<(String, String)>, f64, Option<i64>);

/// A label value or help text with the text format's escapes undone (`\\`, `\"`, `\n`;
/// the parser keeps them as written). Any other backslash stays as it is.
fn unescape(s: &str) -> String {
    if !s.contains('\\') {
        return s.to_owned();
    }
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('\\') => out.push('\\'),
            Some('"') => out.push('"'),
            Some('n') => out.push('\n'),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The series name of a sample of family `name`: `_sum` and `_count` suffixed, buckets
/// `_bucket` in a histogram.
fn series_name(name: &str, kind: ValueType, bucket: bool) -> String {
    match (kind, bucket) {
        (ValueType::Sum, _) => format!("{name}_sum"),
        (ValueType::Count, _) => format!("{name}_count"),
        (ValueType::Sample, true) => format!("{name}_bucket"),
        (ValueType::Sample, false) => name.to_owned(),
    }
}

fn one_by_one(out: &mut Vec<Metric>, name: &str, help: &str, kind: MetricType, samples: &[Parsed]) {
    for (vt, labels, value, ts) in samples {
        let is_bucket = labels.iter().any(|(k, _)| k == "le");
        let series = series_name(name, *vt, is_bucket && kind == MetricType::Untyped);
        let l: Vec<(&str, &str)> = labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let mut m = sample(series, help, kind, &l, *value);
        m.timestamp_ms = ts.unwrap_or(0);
        out.push(m);
    }
}

/// A histogram family: one histogram record per label set (without `le`) when every count
/// is a whole number, else its series one by one as untyped samples.
fn histograms(out: &mut Vec<Metric>, name: &str, help: &str, samples: &[Parsed]) {
    struct Group {
        labels: Vec<(String, String)>,
        buckets: Vec<(f64, f64)>,
        sum: f64,
        count: Option<f64>,
        timestamp: Option<i64>,
    }
    let mut groups: Vec<Group> = Vec::new();
    for (vt, labels, value, ts) in samples {
        let le = labels
            .iter()
            .find(|(k, _)| k == "le")
            .map(|(_, v)| v.as_str());
        let rest: Vec<(String, String)> =
            labels.iter().filter(|(k, _)| k != "le").cloned().collect();
        let at = match groups.iter().position(|g| g.labels == rest) {
            Some(i) => i,
            None => {
                groups.push(Group {
                    labels: rest,
                    buckets: Vec::new(),
                    sum: 0.0,
                    count: None,
                    timestamp: *ts,
                });
                groups.len() - 1
            }
        };
        let g = &mut groups[at];
        match (vt, le.and_then(number)) {
            (ValueType::Sum, _) => g.sum = *value,
            (ValueType::Count, _) => g.count = Some(*value),
            (ValueType::Sample, Some(bound)) => g.buckets.push((bound, *value)),
            // A bucket without a usable `le`: not a histogram this protocol can carry.
            (ValueType::Sample, None) => {
                return one_by_one(out, name, help, MetricType::Untyped, samples)
            }
        }
    }
    let whole = |v: f64| v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v < 2f64.powi(53);
    let mut records = Vec::with_capacity(groups.len());
    for mut g in groups {
        g.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        let inf = g.buckets.iter().find(|b| b.0 == f64::INFINITY).map(|b| b.1);
        let Some(count) = g.count.or(inf) else {
            return one_by_one(out, name, help, MetricType::Untyped, samples);
        };
        let finite: Vec<(f64, f64)> = g
            .buckets
            .iter()
            .copied()
            .filter(|b| b.0.is_finite())
            .collect();
        let monotonic = finite.windows(2).all(|w| w[0].1 <= w[1].1)
            && finite.last().is_none_or(|b| b.1 <= count);
        if !whole(count) || !finite.iter().all(|b| whole(b.1)) || !monotonic {
            return one_by_one(out, name, help, MetricType::Untyped, samples);
        }
        let labels: Vec<(&str, &str)> = g
            .labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let mut m = sample(name.to_owned(), help, MetricType::Histogram, &labels, 0.0);
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        {
            m.buckets = finite
                .iter()
                .map(|(bound, c)| Bucket {
                    upper_bound: *bound,
                    cumulative_count: *c as u64,
                })
                .collect();
            m.count = count as u64;
        }
        m.sum = g.sum;
        m.timestamp_ms = g.timestamp.unwrap_or(0);
        records.push(m);
    }
    out.extend(records);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn first(text: &str) -> Exposition {
        parse_first(text, &|_| String::new(), Timestamps::Keep).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_series_given_twice_keeps_its_first_sample_and_the_repeat_is_listed() {
        let p = first(
            "# TYPE a gauge\na{x=\"1\",y=\"2\"} 1\na{y=\"2\",x=\"1\"} 2\na{x=\"2\"} 3\nb 4\nb 5\nb 6\n",
        );
        let values: Vec<(&str, f64)> = p
            .metrics
            .iter()
            .map(|m| (m.name.as_str(), m.value))
            .collect();
        assert_eq!(values, [("a", 1.0), ("a", 3.0), ("b", 4.0)]);
        assert_eq!(p.duplicates, ["a", "b", "b"]);
        // `parse` keeps both, as before.
        let all = parse("b 4\nb 5\n", &|_| String::new(), Timestamps::Keep).unwrap();
        assert_eq!(all.len(), 2);
    }

    #[test]
    fn a_histogram_bucket_given_twice_is_a_duplicate_of_the_histogram() {
        let p = first(
            "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"1\"} 9\n\
             h_bucket{le=\"+Inf\"} 2\nh_sum 3\nh_count 2\nh_count 7\n",
        );
        assert_eq!(p.duplicates, ["h", "h"]);
        assert_eq!(p.metrics.len(), 1);
        let h = &p.metrics[0];
        assert_eq!((h.count, h.buckets.len()), (2, 1));
        assert_eq!(h.buckets[0].cumulative_count, 1, "the first bucket value");
    }

    #[test]
    fn summaries_and_counters_are_told_apart_from_their_sum_and_count() {
        // `s{quantile}`, `s_sum` and `s_count` are three series, not repeats of one.
        let p = first(
            "# TYPE s summary\ns{quantile=\"0.5\"} 1\ns_sum 2\ns_count 3\n\
             # TYPE c_total counter\nc_total 1\n",
        );
        assert!(p.duplicates.is_empty(), "{:?}", p.duplicates);
        assert_eq!(p.metrics.len(), 4);
    }
}
