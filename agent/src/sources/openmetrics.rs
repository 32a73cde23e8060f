//! OpenMetrics 1.0 text (`application/openmetrics-text`) rewritten as the Prometheus text
//! format 0.0.4 that [`crate::sources::exposition`] parses, for scrape targets that answer in
//! OpenMetrics.
//!
//! The rewrite gives the series the same target serves in the text format 0.0.4 (as the
//! official client libraries render one registry both ways):
//! - a `counter` family `x` becomes the counter `x_total`, its `x_created` samples a gauge
//!   `x_created`;
//! - `histogram` and `summary` families keep their type, their `_created` samples become a
//!   gauge `<name>_created`;
//! - `gauge`, `info` (samples `x_info`) and `stateset` families become gauges;
//! - a `gaugehistogram` becomes a histogram, its `_gcount` and `_gsum` the histogram's
//!   `_count` and `_sum` (the text format 0.0.4 and the protocol have no gauge histogram);
//! - `unknown` samples, and samples that do not fit their family's type, travel as untyped
//!   samples under their own names;
//! - `# UNIT` lines and exemplars (`# {labels} value [timestamp]` after a sample) are dropped;
//! - timestamps, seconds in OpenMetrics, become milliseconds (rounded).
//!
//! Rules from the OpenMetrics 1.0 specification (`specification/OpenMetrics.md`: "Overall
//! Structure", "Metric types", "Exemplars"): the text must end with `# EOF`, nothing may
//! follow it, and a family's samples are contiguous.

use std::fmt::Write as _;

/// Why an OpenMetrics text was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not OpenMetrics text: line {line}: {reason}")]
pub struct OpenMetricsError {
    /// 1-based line number.
    pub line: usize,
    /// What was wrong.
    pub reason: String,
}

/// The 0.0.4 family a sample goes to: its name and `# TYPE`.
fn target(family: &str, kind: &str, sample: &str) -> (String, &'static str) {
    let suffix = sample.strip_prefix(family).unwrap_or("");
    match (kind, suffix) {
        ("counter", "_total") => (sample.to_owned(), "counter"),
        ("counter" | "histogram" | "summary", "_created") => (sample.to_owned(), "gauge"),
        ("histogram", "_bucket" | "_count" | "_sum")
        | ("gaugehistogram", "_bucket" | "_gcount" | "_gsum") => (family.to_owned(), "histogram"),
        ("summary", "" | "_count" | "_sum") => (family.to_owned(), "summary"),
        ("gauge" | "stateset", "") | ("info", "_info") => (sample.to_owned(), "gauge"),
        _ => (sample.to_owned(), "untyped"),
    }
}

/// Splits a sample line into its name, its label block (`{…}` as written, or empty) and the
/// rest after it; `None` when a label block is not closed.
fn split_sample(line: &str) -> Option<(&str, &str, &str)> {
    let name_end = line.find(['{', ' ']).unwrap_or(line.len());
    let (name, rest) = line.split_at(name_end);
    if !rest.starts_with('{') {
        return Some((name, "", rest));
    }
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in rest.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return Some((name, &rest[..=i], &rest[i + 1..])),
            _ => {}
        }
    }
    None
}

/// One output family of the OpenMetrics family being read.
struct Out {
    name: String,
    kind: &'static str,
    lines: String,
}

/// Rewrites OpenMetrics `text` as the text format 0.0.4 (see the module documentation).
///
/// # Errors
/// [`OpenMetricsError`]: no `# EOF` at the end, text after it, a sample line without a value,
/// an unclosed label block, or a timestamp that is not a number.
pub fn to_text(text: &str) -> Result<String, OpenMetricsError> {
    let mut out = String::with_capacity(text.len());
    let mut family = String::new();
    let mut kind = "unknown".to_owned();
    let mut help: Option<String> = None;
    let mut outs: Vec<Out> = Vec::new();
    let mut eof = false;
    let flush = |out: &mut String, outs: &mut Vec<Out>, help: &Option<String>| {
        for o in outs.drain(..) {
            if let Some(h) = help {
                let _ = writeln!(out, "# HELP {} {h}", o.name);
            }
            let _ = writeln!(out, "# TYPE {} {}", o.name, o.kind);
            out.push_str(&o.lines);
        }
    };
    for (i, raw) in text.lines().enumerate() {
        let err = |reason: &str| OpenMetricsError {
            line: i + 1,
            reason: reason.to_owned(),
        };
        if eof {
            return Err(err("text after # EOF"));
        }
        if raw == "# EOF" {
            eof = true;
            continue;
        }
        if let Some(meta) = raw.strip_prefix("# ") {
            let mut parts = meta.splitn(3, ' ');
            let (word, name, value) = (parts.next(), parts.next(), parts.next());
            let Some(name) = name else { continue };
            if name != family && matches!(word, Some("HELP" | "TYPE" | "UNIT")) {
                flush(&mut out, &mut outs, &help);
                family = name.to_owned();
                kind = "unknown".to_owned();
                help = None;
            }
            match word {
                Some("HELP") => help = Some(value.unwrap_or("").to_owned()),
                Some("TYPE") => kind = value.unwrap_or("unknown").to_owned(),
                _ => {} // # UNIT and other comments
            }
            continue;
        }
        if raw.trim().is_empty() {
            continue;
        }
        let (name, labels, rest) = split_sample(raw).ok_or_else(|| err("unclosed label set"))?;
        if !name.starts_with(family.as_str()) || family.is_empty() {
            // A sample outside the current family: a family without metadata.
            flush(&mut out, &mut outs, &help);
            family = name.to_owned();
            kind = "unknown".to_owned();
            help = None;
        }
        // Value, optional timestamp, optional exemplar after " # ".
        let sample_part = rest.split(" # ").next().unwrap_or("");
        let mut fields = sample_part.split_whitespace();
        let value = fields
            .next()
            .ok_or_else(|| err("a sample without a value"))?;
        let timestamp = match fields.next() {
            None => None,
            Some(t) => {
                let seconds: f64 = t.parse().map_err(|_| err("timestamp is not a number"))?;
                Some((seconds * 1000.0).round() as i64)
            }
        };
        let (to, to_kind) = target(&family, &kind, name);
        let index = match outs.iter().position(|o| o.name == to) {
            Some(i) => i,
            None => {
                outs.push(Out {
                    name: to,
                    kind: to_kind,
                    lines: String::new(),
                });
                outs.len() - 1
            }
        };
        let o = &mut outs[index];
        let name = match (kind.as_str(), name.strip_prefix(family.as_str())) {
            ("gaugehistogram", Some("_gcount")) => format!("{family}_count"),
            ("gaugehistogram", Some("_gsum")) => format!("{family}_sum"),
            _ => name.to_owned(),
        };
        let _ = write!(o.lines, "{name}{labels} {value}");
        if let Some(ms) = timestamp {
            let _ = write!(o.lines, " {ms}");
        }
        o.lines.push('\n');
    }
    if !eof {
        return Err(OpenMetricsError {
            line: text.lines().count(),
            reason: "no # EOF at the end".to_owned(),
        });
    }
    flush(&mut out, &mut outs, &help);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the Python client (`prometheus_client` 0.16) serves for one registry in
    /// OpenMetrics, and below what it serves for the same registry in the text format 0.0.4.
    const OM: &str = "# HELP jobs Jobs done.\n# TYPE jobs counter\n\
jobs_total{queue=\"a\"} 3.0\njobs_created{queue=\"a\"} 1.7e+09\n\
jobs_total{queue=\"b\"} 1.0 # {trace_id=\"abc\"} 1.0 1796162244.3237665\n\
jobs_created{queue=\"b\"} 1.8e+09\n\
# HELP temp_celsius A \\\"temperature\\\".\n# TYPE temp_celsius gauge\n# UNIT temp_celsius celsius\n\
temp_celsius 21.5 1700000000.123\n\
# HELP latency_seconds Latency.\n# TYPE latency_seconds histogram\n\
latency_seconds_bucket{le=\"0.1\"} 1.0\nlatency_seconds_bucket{le=\"+Inf\"} 2.0\n\
latency_seconds_count 2.0\nlatency_seconds_sum 0.55\nlatency_seconds_created 1.7e+09\n\
# HELP build Build info.\n# TYPE build info\nbuild_info{version=\"1.2\"} 1.0\n\
# HELP state State.\n# TYPE state stateset\nstate{state=\"up\"} 1.0\nstate{state=\"down\"} 0.0\n\
# HELP queue_depth Depth.\n# TYPE queue_depth gaugehistogram\n\
queue_depth_bucket{le=\"+Inf\"} 5.0\nqueue_depth_gcount 5.0\nqueue_depth_gsum 7.0\n\
bare_metric{a=\"}\\\"#\"} 4\n# EOF\n";

    #[test]
    fn families_become_the_text_formats_families() {
        let text = to_text(OM).unwrap_or_else(|e| panic!("{e}"));
        let want = "# HELP jobs_total Jobs done.\n# TYPE jobs_total counter\n\
jobs_total{queue=\"a\"} 3.0\njobs_total{queue=\"b\"} 1.0\n\
# HELP jobs_created Jobs done.\n# TYPE jobs_created gauge\n\
jobs_created{queue=\"a\"} 1.7e+09\njobs_created{queue=\"b\"} 1.8e+09\n\
# HELP temp_celsius A \\\"temperature\\\".\n# TYPE temp_celsius gauge\n\
temp_celsius 21.5 1700000000123\n\
# HELP latency_seconds Latency.\n# TYPE latency_seconds histogram\n\
latency_seconds_bucket{le=\"0.1\"} 1.0\nlatency_seconds_bucket{le=\"+Inf\"} 2.0\n\
latency_seconds_count 2.0\nlatency_seconds_sum 0.55\n\
# HELP latency_seconds_created Latency.\n# TYPE latency_seconds_created gauge\n\
latency_seconds_created 1.7e+09\n\
# HELP build_info Build info.\n# TYPE build_info gauge\nbuild_info{version=\"1.2\"} 1.0\n\
# HELP state State.\n# TYPE state gauge\nstate{state=\"up\"} 1.0\nstate{state=\"down\"} 0.0\n\
# HELP queue_depth Depth.\n# TYPE queue_depth histogram\nqueue_depth_bucket{le=\"+Inf\"} 5.0\n\
queue_depth_count 5.0\nqueue_depth_sum 7.0\n\
# TYPE bare_metric untyped\nbare_metric{a=\"}\\\"#\"} 4\n";
        assert_eq!(text, want);
        // And the result is what the exposition parser reads.
        let parsed = super::super::exposition::parse(
            &text,
            &|_| String::new(),
            super::super::exposition::Timestamps::Keep,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(parsed.iter().any(|m| m.name == "latency_seconds"));
        assert!(parsed
            .iter()
            .any(|m| m.name == "queue_depth" && m.count == 5 && m.sum == 7.0));
        assert!(parsed
            .iter()
            .any(|m| m.name == "temp_celsius" && m.timestamp_ms == 1_700_000_000_123));
    }

    #[test]
    fn an_incomplete_or_broken_text_is_refused() {
        assert!(to_text("# TYPE a gauge\na 1\n").is_err(), "no # EOF");
        assert!(to_text("a 1\n# EOF\nb 2\n").is_err(), "after # EOF");
        assert!(to_text("a{x=\"1\" 1\n# EOF\n").is_err(), "unclosed labels");
        assert!(to_text("a\n# EOF\n").is_err(), "no value");
        assert!(to_text("a 1 noon\n# EOF\n").is_err(), "bad timestamp");
        assert_eq!(to_text("# EOF\n").as_deref(), Ok(""));
    }

    #[test]
    fn no_input_panics() {
        for s in [
            "",
            "#",
            "# ",
            "# HELP",
            "# TYPE x",
            "{",
            "{}",
            "x{",
            "x{\"",
            "x{a=\"\\",
            "\u{feff}",
            "# EOF",
            "x 1 # {",
            "x 1 2 3 4",
        ] {
            let _ = to_text(s);
            let _ = to_text(&format!("{s}\n# EOF\n"));
        }
    }
}
