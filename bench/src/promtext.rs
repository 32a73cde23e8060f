//! A reader for the Prometheus text exposition format (version 0.0.4), enough to sum the
//! collector's `uctel_collector_*` counters by name and label. Comment lines (`# HELP`,
//! `# TYPE`) are skipped; a line that does not parse is skipped and counted, never a panic.

use std::collections::BTreeMap;

/// One sample line.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Metric name.
    pub name: String,
    /// Label pairs in the order written.
    pub labels: Vec<(String, String)>,
    /// Value.
    pub value: f64,
}

impl Sample {
    /// The value of label `name`, if present.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A parsed scrape.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Scrape {
    /// Every sample.
    pub samples: Vec<Sample>,
    /// Lines that were neither comments, blank, nor parseable samples.
    pub unparsed_lines: usize,
}

impl Scrape {
    /// Parses exposition text.
    pub fn parse(text: &str) -> Scrape {
        let mut out = Scrape::default();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            match parse_line(line) {
                Some(s) => out.samples.push(s),
                None => out.unparsed_lines += 1,
            }
        }
        out
    }

    /// Sum of every sample named `name` whose labels include all of `filter`.
    pub fn sum(&self, name: &str, filter: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|s| s.name == name && filter.iter().all(|(k, v)| s.label(k) == Some(*v)))
            .map(|s| s.value)
            .sum()
    }

    /// Sums of samples named `name`, grouped by the value of label `by` (samples without it
    /// are skipped).
    pub fn sum_by(&self, name: &str, by: &str) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for s in self.samples.iter().filter(|s| s.name == name) {
            if let Some(v) = s.label(by) {
                *out.entry(v.to_string()).or_insert(0.0) += s.value;
            }
        }
        out
    }
}

fn parse_line(line: &str) -> Option<Sample> {
    let name_end = line
        .find(|c: char| c == '{' || c.is_whitespace())
        .unwrap_or(line.len());
    let name = line.get(..name_end)?;
    if name.is_empty() {
        return None;
    }
    let mut rest = line.get(name_end..)?;
    let mut labels = Vec::new();
    if let Some(after) = rest.strip_prefix('{') {
        let (parsed, remaining) = parse_labels(after)?;
        labels = parsed;
        rest = remaining;
    }
    let value_text = rest.split_whitespace().next()?;
    let value = match value_text {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        other => other.parse::<f64>().ok()?,
    };
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// Parses `k="v",k2="v2"}` and returns the pairs and the text after `}`.
fn parse_labels(mut s: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start_matches([',', ' ']);
        if let Some(rest) = s.strip_prefix('}') {
            return Some((labels, rest));
        }
        let eq = s.find('=')?;
        let key = s.get(..eq)?.trim().to_string();
        s = s.get(eq + 1..)?.trim_start().strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = s.char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '"' => break i,
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                other => value.push(other),
            }
        };
        labels.push((key, value));
        s = s.get(end + 1..)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP uctel_collector_frames_received_total Frames accepted.
# TYPE uctel_collector_frames_received_total counter
uctel_collector_frames_received_total{agent="a1",stream="metrics"} 100
uctel_collector_frames_received_total{agent="a2",stream="metrics"} 50
uctel_collector_frames_received_total{agent="a2",stream="logs"} 5
uctel_collector_frames_dropped_total{agent="a1",reason="ring_overrun"} 3
uctel_collector_agents_connected 2
weird{label="with \"quote\" and \\ slash, and } brace"} 1.5e3
broken{x="1" 
"#;

    #[test]
    fn sums_by_name_and_labels() {
        let s = Scrape::parse(TEXT);
        assert_eq!(s.sum("uctel_collector_frames_received_total", &[]), 155.0);
        assert_eq!(
            s.sum("uctel_collector_frames_received_total", &[("agent", "a2")]),
            55.0
        );
        assert_eq!(
            s.sum(
                "uctel_collector_frames_received_total",
                &[("agent", "a2"), ("stream", "logs")]
            ),
            5.0
        );
        assert_eq!(s.sum("uctel_collector_agents_connected", &[]), 2.0);
        let by = s.sum_by("uctel_collector_frames_received_total", "agent");
        assert_eq!(by.get("a1"), Some(&100.0));
        assert_eq!(by.get("a2"), Some(&55.0));
    }

    #[test]
    fn escapes_and_bad_lines() {
        let s = Scrape::parse(TEXT);
        let w = s.samples.iter().find(|x| x.name == "weird").unwrap();
        assert_eq!(
            w.label("label"),
            Some(r#"with "quote" and \ slash, and } brace"#)
        );
        assert_eq!(w.value, 1500.0);
        assert_eq!(s.unparsed_lines, 1);
    }

    #[test]
    fn special_values() {
        let s = Scrape::parse("a +Inf\nb -Inf\nc NaN\n");
        assert_eq!(s.samples[0].value, f64::INFINITY);
        assert_eq!(s.samples[1].value, f64::NEG_INFINITY);
        assert!(s.samples[2].value.is_nan());
    }
}
