//! The Prometheus text exposition format (version 0.0.4): the one strict parser of samples
//! that every test and the bench read `/metrics` with, lookups by name and labels, and the
//! blocking scrape helper.
//!
//! Format reference: the Prometheus "Exposition formats" documentation — one sample per line,
//! `name{label="value",...} value [timestamp]`, label values escaped with `\\`, `\"` and `\n`,
//! values as Go floats (`NaN`, `+Inf`, `-Inf`), `#` lines for `HELP`/`TYPE`/comments.

use std::collections::BTreeMap;
use std::net::SocketAddr;

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Metric name (for histograms the `_bucket`/`_sum`/`_count` name).
    pub name: String,
    /// Labels, sorted by name.
    pub labels: BTreeMap<String, String>,
    /// The value.
    pub value: f64,
}

impl Sample {
    /// The value of label `name`, if present.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels.get(name).map(String::as_str)
    }
}

/// A line that is not valid exposition text.
#[derive(Debug, thiserror::Error)]
#[error("exposition line {line}: {reason}: {text:?}")]
pub struct ParseError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub reason: &'static str,
    /// The line.
    pub text: String,
}

/// Parses a whole exposition into its samples (comment lines skipped).
///
/// # Errors
/// [`ParseError`] for the first malformed line.
pub fn parse(text: &str) -> Result<Vec<Sample>, ParseError> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let err = |reason| ParseError {
            line: i + 1,
            reason,
            text: raw.to_owned(),
        };
        let name_end = line
            .find(|c: char| c == '{' || c.is_whitespace())
            .ok_or_else(|| err("no value"))?;
        let name = &line[..name_end];
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        {
            return Err(err("bad metric name"));
        }
        let mut rest = &line[name_end..];
        let mut labels = BTreeMap::new();
        if let Some(after) = rest.strip_prefix('{') {
            let (parsed, tail) = parse_labels(after).ok_or_else(|| err("bad label set"))?;
            labels = parsed;
            rest = tail;
        }
        let mut fields = rest.split_whitespace();
        let value = fields.next().ok_or_else(|| err("no value"))?;
        let value = parse_value(value).ok_or_else(|| err("bad value"))?;
        if let Some(ts) = fields.next() {
            ts.parse::<i64>().map_err(|_| err("bad timestamp"))?;
        }
        if fields.next().is_some() {
            return Err(err("trailing fields"));
        }
        out.push(Sample {
            name: name.to_owned(),
            labels,
            value,
        });
    }
    Ok(out)
}

fn parse_value(s: &str) -> Option<f64> {
    match s {
        "NaN" => Some(f64::NAN),
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        _ => s.parse().ok(),
    }
}

/// Parses `a="x",b="y"}` and returns the labels and what follows the closing brace.
fn parse_labels(mut s: &str) -> Option<(BTreeMap<String, String>, &str)> {
    let mut labels = BTreeMap::new();
    loop {
        s = s.trim_start();
        if let Some(rest) = s.strip_prefix('}') {
            return Some((labels, rest));
        }
        let eq = s.find('=')?;
        let name = s[..eq].trim();
        if name.is_empty() {
            return None;
        }
        let mut chars = s[eq + 1..].trim_start().char_indices();
        let body = s[eq + 1..].trim_start();
        if chars.next()?.1 != '"' {
            return None;
        }
        let mut value = String::new();
        let mut end = None;
        let mut escaped = false;
        for (i, c) in chars {
            if escaped {
                value.push(match c {
                    'n' => '\n',
                    other => other,
                });
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                end = Some(i);
                break;
            } else {
                value.push(c);
            }
        }
        let end = end?;
        labels.insert(name.to_owned(), value);
        s = body.get(end + 1..)?.trim_start();
        if let Some(rest) = s.strip_prefix(',') {
            s = rest;
        }
    }
}

/// A parsed scrape with lookup helpers.
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    /// Every sample.
    pub samples: Vec<Sample>,
    /// The raw text.
    pub text: String,
}

impl Scrape {
    /// Parses a whole exposition, keeping the text.
    ///
    /// # Errors
    /// [`ParseError`] for the first malformed line.
    pub fn parse(text: &str) -> Result<Scrape, ParseError> {
        Ok(Scrape {
            samples: parse(text)?,
            text: text.to_owned(),
        })
    }

    /// Samples named `name` whose labels include every `(label, value)` of `matchers`.
    pub fn select<'a>(
        &'a self,
        name: &'a str,
        matchers: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples
            .iter()
            .filter(move |s| s.name == name && matchers.iter().all(|(k, v)| s.label(k) == Some(*v)))
    }

    /// Sum of the values of [`Scrape::select`] (0 when nothing matches).
    pub fn sum(&self, name: &str, matchers: &[(&str, &str)]) -> f64 {
        self.select(name, matchers).map(|s| s.value).sum()
    }

    /// Sum as an integer count (counters of whole frames/records).
    pub fn count(&self, name: &str, matchers: &[(&str, &str)]) -> u64 {
        let v = self.sum(name, matchers);
        if v.is_finite() && v >= 0.0 {
            // Counters of frames and records are exact integers well below 2^53.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let n = v.round() as u64;
            n
        } else {
            0
        }
    }

    /// Whether any sample is named `name` with the matchers.
    pub fn has(&self, name: &str, matchers: &[(&str, &str)]) -> bool {
        self.select(name, matchers).next().is_some()
    }

    /// Sums of the samples named `name`, grouped by the value of label `by` (samples without
    /// it are skipped).
    pub fn sum_by(&self, name: &str, by: &str) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for s in self.samples.iter().filter(|s| s.name == name) {
            if let Some(v) = s.label(by) {
                *out.entry(v.to_owned()).or_insert(0.0) += s.value;
            }
        }
        out
    }

    /// The value of the one series `series` (`name` or `name{a="x",b="y"}`, written as in
    /// the exposition): the sample with exactly that name and label set. `None` when there
    /// is no such series.
    ///
    /// # Panics
    /// If `series` is not a valid series selector (a bug in the test).
    pub fn value(&self, series: &str) -> Option<f64> {
        let (name, labels) = parse_series(series)
            .unwrap_or_else(|| panic!("{series:?} is not a series (name{{label=\"value\",...}})"));
        self.samples
            .iter()
            .find(|s| s.name == name && s.labels == labels)
            .map(|s| s.value)
    }

    /// Distinct values of `label` over samples named `name`.
    pub fn label_values(&self, name: &str, label: &str) -> Vec<String> {
        let mut v: Vec<String> = self
            .samples
            .iter()
            .filter(|s| s.name == name)
            .filter_map(|s| s.label(label).map(str::to_owned))
            .collect();
        v.sort();
        v.dedup();
        v
    }
}

/// `name{labels}` of a series selector written as in the exposition.
fn parse_series(series: &str) -> Option<(&str, BTreeMap<String, String>)> {
    let series = series.trim();
    match series.split_once('{') {
        None => Some((series, BTreeMap::new())),
        Some((name, rest)) => {
            let (labels, tail) = parse_labels(rest)?;
            tail.trim().is_empty().then_some((name, labels))
        }
    }
}

/// The value of series `series` (as [`Scrape::value`]) in exposition `text`.
///
/// # Panics
/// If `text` is not valid exposition text (the daemon under test wrote a malformed
/// `/metrics`) or `series` is not a series selector.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    Scrape::parse(text)
        .unwrap_or_else(|e| panic!("{e}\n--- exposition ---\n{text}"))
        .value(series)
}

/// Fetches `http://<addr>/metrics` and parses it.
///
/// # Errors
/// The HTTP request failed, answered non-200, or the body does not parse.
pub fn scrape(addr: SocketAddr) -> Result<Scrape, String> {
    scrape_with(&crate::http::client(), addr)
}

/// [`scrape`] through the HTTP client `http` (its own timeouts).
///
/// # Errors
/// The HTTP request failed, answered non-200, or the body does not parse.
pub fn scrape_with(http: &ureq::Agent, addr: SocketAddr) -> Result<Scrape, String> {
    let text = crate::http::get_with(http, &format!("http://{addr}/metrics"))?;
    Scrape::parse(&text).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_labels_values_and_escapes() {
        let text = "# HELP x help\n# TYPE x counter\nx 1\n\
                    y{a=\"1\",b=\"q\\\"uo\\\\te\\n\"} 2.5 1700000000000\n\
                    z{le=\"+Inf\",} +Inf\nw NaN\n";
        let s = parse(text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.len(), 4);
        assert_eq!(s[0].name, "x");
        assert!((s[0].value - 1.0).abs() < f64::EPSILON);
        assert_eq!(s[1].label("a"), Some("1"));
        assert_eq!(s[1].label("b"), Some("q\"uo\\te\n"));
        assert!((s[1].value - 2.5).abs() < f64::EPSILON);
        assert_eq!(s[2].label("le"), Some("+Inf"));
        assert!(s[2].value.is_infinite());
        assert!(s[3].value.is_nan());
    }

    #[test]
    fn rejects_malformed_lines() {
        for bad in [
            "x",
            "x{a=1} 2",
            "x{a=\"1\" 2",
            "x 1 2 3",
            "x{=\"1\"} 1",
            "x abc",
            "-x 1",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn series_values_match_the_whole_label_set() {
        let text = "f{agent=\"a\",stream=\"1\"} 3\nf{agent=\"a\"} 4\ng 5\n";
        let s = Scrape::parse(text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.value("f{agent=\"a\",stream=\"1\"}"), Some(3.0));
        assert_eq!(s.value("f{stream=\"1\",agent=\"a\"}"), Some(3.0));
        assert_eq!(s.value("f{agent=\"a\"}"), Some(4.0));
        assert_eq!(s.value("f{agent=\"b\"}"), None);
        assert_eq!(s.value("g"), Some(5.0));
        assert_eq!(sample(text, "f"), None);
        let by = s.sum_by("f", "agent");
        assert_eq!(by.get("a"), Some(&7.0));
    }

    #[test]
    fn label_values_with_escapes_and_braces() {
        let s = Scrape::parse(
            "weird{label=\"with \\\"quote\\\" and \\\\ slash, and } brace\"} 1.5e3\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            s.samples[0].label("label"),
            Some(r#"with "quote" and \ slash, and } brace"#)
        );
        assert!((s.samples[0].value - 1500.0).abs() < f64::EPSILON);
    }

    #[test]
    fn scrape_helpers_sum_and_select() {
        let text = "f{agent=\"a\",stream=\"1\"} 3\nf{agent=\"a\",stream=\"2\"} 4\nf{agent=\"b\",stream=\"1\"} 5\n";
        let s = Scrape {
            samples: parse(text).unwrap_or_else(|e| panic!("{e}")),
            text: text.to_owned(),
        };
        assert_eq!(s.count("f", &[("agent", "a")]), 7);
        assert_eq!(s.count("f", &[]), 12);
        assert_eq!(s.count("g", &[]), 0);
        assert_eq!(s.label_values("f", "agent"), vec!["a", "b"]);
        assert!(s.has("f", &[("stream", "2")]));
    }
}
