//! Small constructors for [`Metric`] samples shared by the metric sources.

use uctel_protocol::payload::{Label, Metric, MetricType};

/// A counter sample (cumulative value) with `timestamp_ms = 0` (the frame's timestamp).
pub(crate) fn counter(
    name: impl Into<String>,
    help: &str,
    labels: &[(&str, &str)],
    value: f64,
) -> Metric {
    sample(name.into(), help, MetricType::Counter, labels, value)
}

/// A gauge sample (absolute value) with `timestamp_ms = 0` (the frame's timestamp).
pub(crate) fn gauge(
    name: impl Into<String>,
    help: &str,
    labels: &[(&str, &str)],
    value: f64,
) -> Metric {
    sample(name.into(), help, MetricType::Gauge, labels, value)
}

/// An untyped sample (node_exporter's `vmstat` and `netstat` fields) with no labels and
/// `timestamp_ms = 0` (the frame's timestamp).
pub(crate) fn untyped(name: String, help: &str, value: f64) -> Metric {
    sample(name, help, MetricType::Untyped, &[], value)
}

pub(crate) fn sample(
    name: String,
    help: &str,
    kind: MetricType,
    labels: &[(&str, &str)],
    value: f64,
) -> Metric {
    Metric {
        name,
        help: help.to_owned(),
        r#type: kind as i32,
        labels: labels
            .iter()
            .map(|(n, v)| Label {
                name: (*n).to_owned(),
                value: (*v).to_owned(),
            })
            .collect(),
        value,
        timestamp_ms: 0,
        buckets: Vec::new(),
        count: 0,
        sum: 0.0,
    }
}

/// Replaces every character outside `[a-zA-Z0-9_]` with `_`, as Prometheus client libraries
/// do for metric names built from kernel field names (e.g. `Active(anon)` keys are handled
/// separately by the caller; this is the catch-all).
pub(crate) fn sanitize_name_part(raw: &str) -> String {
    raw.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructors_set_type_labels_and_frame_timestamp() {
        let m = counter("node_x_total", "help", &[("device", "eth0")], 3.0);
        assert_eq!(m.r#type, MetricType::Counter as i32);
        assert_eq!(m.timestamp_ms, 0);
        assert_eq!(m.labels.len(), 1);
        assert_eq!(m.labels[0].name, "device");
        assert_eq!(m.labels[0].value, "eth0");
        let g = gauge("node_y", "help", &[], 1.5);
        assert_eq!(g.r#type, MetricType::Gauge as i32);
        assert_eq!(g.value, 1.5);
    }

    #[test]
    fn sanitize_replaces_invalid_characters() {
        assert_eq!(sanitize_name_part("VL15_dropped"), "VL15_dropped");
        assert_eq!(sanitize_name_part("a-b.c d"), "a_b_c_d");
    }
}
