//! Fixtures of the collectors' unit tests: a file tree laid out like `/proc` or `/sys`, and
//! samples rendered as `name{labels} type value` lines.

use uctel_protocol::payload::{Metric, MetricType};

/// A tempdir laid out like `/proc` with `files` (relative path, contents).
pub(super) fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    for (rel, text) in files {
        let path = dir.path().join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap_or_else(|e| panic!("{e}"));
        }
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("{e}"));
    }
    dir
}

/// `name{k="v",…} type value` lines of `m`, in order.
pub(super) fn lines(m: &[Metric]) -> Vec<String> {
    m.iter()
        .map(|s| {
            let labels: Vec<String> = s
                .labels
                .iter()
                .map(|l| format!("{}={:?}", l.name, l.value))
                .collect();
            let ty = match MetricType::try_from(s.r#type) {
                Ok(MetricType::Counter) => "counter",
                Ok(MetricType::Gauge) => "gauge",
                Ok(MetricType::Untyped) => "untyped",
                _ => "other",
            };
            format!("{}{{{}}} {ty} {}", s.name, labels.join(","), s.value)
        })
        .collect()
}

pub(super) fn help_of<'a>(m: &'a [Metric], name: &str) -> Option<&'a str> {
    m.iter().find(|s| s.name == name).map(|s| s.help.as_str())
}
