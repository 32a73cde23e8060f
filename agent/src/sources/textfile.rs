//! The textfile source: metrics from `*.prom` files in one directory, with the semantics of
//! node_exporter's textfile collector (node_exporter 1.5, `collector/textfile.go`), so the
//! cron jobs and scripts that write there today keep working unchanged.
//!
//! At every collection (every `interval_seconds`):
//!
//! - every regular file whose name ends in `.prom` is read, in name order; other names are
//!   ignored, so the atomic-rename convention works (write `name.prom.$$`, then `mv` it to
//!   `name.prom`: the half-written file is never read);
//! - a file is parsed as the Prometheus text exposition format (0.0.4). A file that does not
//!   parse, cannot be read, or carries client-side timestamps is skipped whole (node_exporter:
//!   "contains unsupported client-side timestamps, skipping entire file"), counted in
//!   `uctel_agent_source_errors_total{source="textfile",reason}` (`read_error`,
//!   `parse_error`, `timestamps`) and logged once per file and reason;
//! - `node_textfile_mtime_seconds{file="<path>"}` (whole seconds) for every file read, and
//!   `node_textfile_scrape_error` 1 when any file (or the directory) failed, else 0;
//! - a family without `# HELP` gets node_exporter's help text, `Metric read from <path>`.
//!
//! The text is turned into records by `sources::exposition` (types, histograms, summaries,
//! escapes; the parser crate and why).

use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};
use uctel_protocol::payload::{Label, Metric};

use super::exposition::{self, ExpositionError, Timestamps};
use super::metric::gauge;

/// Longest file read (larger files are skipped as `read_error`): a textfile is a few
/// kilobytes; a runaway writer must not make the agent read gigabytes.
pub const MAX_FILE_BYTES: u64 = 16 << 20;

/// `sources.textfile`: metrics from `*.prom` files, as node_exporter's textfile collector.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TextfileSection {
    /// Directory of `*.prom` files (node_exporter's `--collector.textfile.directory`;
    /// Debian's package uses `/var/lib/prometheus/node-exporter`).
    pub directory: PathBuf,
    /// Seconds between two reads of the directory. Default 15.
    #[serde(default = "default_interval")]
    pub interval_seconds: f64,
    /// Offset of the sampling instants within the interval, seconds: collections happen at
    /// whole multiples of `interval_seconds` since the Unix epoch plus this (OVIS LDMS's
    /// `interval` + `offset`), so agents with the same settings sample the same instants.
    /// 0 to below the interval. Default 0.
    #[serde(default)]
    pub offset_seconds: f64,
}

fn default_interval() -> f64 {
    15.0
}

impl TextfileSection {
    /// What `--check-config` says about the section (key suffix, problem).
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let v = self.interval_seconds;
        if v.is_finite() && (0.1..=86400.0).contains(&v) {
            Vec::new()
        } else {
            vec![(
                "interval_seconds",
                format!("must be a number of seconds in [0.1, 86400], got {v}"),
            )]
        }
    }
}

/// Why a file was skipped (`uctel_agent_source_errors_total{source="textfile",reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileError {
    /// The directory or the file could not be read, or the file is too large.
    Read,
    /// Not the text exposition format.
    Parse,
    /// A sample carries a client-side timestamp.
    Timestamps,
}

impl FileError {
    /// The `reason` label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            FileError::Read => "read_error",
            FileError::Parse => "parse_error",
            FileError::Timestamps => "timestamps",
        }
    }
}

/// A file (or the directory) skipped at one collection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// The file or directory.
    pub path: PathBuf,
    /// Why.
    pub error: FileError,
    /// The error's text.
    pub detail: String,
}

/// One collection's result.
#[derive(Debug, Default)]
pub struct Collection {
    /// The samples, then `node_textfile_mtime_seconds` and `node_textfile_scrape_error`.
    pub metrics: Vec<Metric>,
    /// What was skipped.
    pub skipped: Vec<Skipped>,
}

/// Reads every `*.prom` file of `dir` (module docs).
pub fn collect(dir: &Path) -> Collection {
    let mut out = Collection::default();
    let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().ends_with(".prom"))
            .map(|e| e.path())
            .collect(),
        Err(e) => {
            out.skipped.push(Skipped {
                path: dir.to_path_buf(),
                error: FileError::Read,
                detail: e.to_string(),
            });
            Vec::new()
        }
    };
    files.sort();
    let mut mtimes = Vec::new();
    for path in files {
        match read_file(&path) {
            Ok((metrics, mtime)) => {
                out.metrics.extend(metrics);
                mtimes.push((path, mtime));
            }
            Err((error, detail)) => out.skipped.push(Skipped {
                path,
                error,
                detail,
            }),
        }
    }
    for (path, mtime) in mtimes {
        let file = path.display().to_string();
        out.metrics.push(gauge(
            "node_textfile_mtime_seconds",
            "Unixtime mtime of textfiles successfully read.",
            &[("file", &file)],
            mtime,
        ));
    }
    out.metrics.push(scrape_error(!out.skipped.is_empty()));
    out
}

/// `node_textfile_scrape_error`: 1 when a file (or the directory) failed, else 0.
pub fn scrape_error(errored: bool) -> Metric {
    gauge(
        "node_textfile_scrape_error",
        "1 if there was an error opening or reading a file, 0 otherwise",
        &[],
        if errored { 1.0 } else { 0.0 },
    )
}

/// One file's samples and its mtime (whole seconds, as node_exporter), or why it was skipped.
fn read_file(path: &Path) -> Result<(Vec<Metric>, f64), (FileError, String)> {
    let read = |e: std::io::Error| (FileError::Read, e.to_string());
    let file = std::fs::File::open(path).map_err(read)?;
    let meta = file.metadata().map_err(read)?;
    if !meta.is_file() {
        return Err((FileError::Read, "not a regular file".into()));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err((
            FileError::Read,
            format!("{} bytes, more than {MAX_FILE_BYTES}", meta.len()),
        ));
    }
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut std::io::Read::take(file, MAX_FILE_BYTES + 1),
        &mut text,
    )
    .map_err(read)?;
    let metrics = parse(&text, path)?;
    // Stat after a successful parse, so that a failure does not look fresh.
    #[allow(clippy::cast_precision_loss)]
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0.0, |d| d.as_secs() as f64);
    Ok((metrics, mtime))
}

/// The samples of one file's text, `path` naming it in default help texts.
///
/// # Errors
/// [`FileError::Parse`] or [`FileError::Timestamps`] with the detail.
pub fn parse(text: &str, path: &Path) -> Result<Vec<Metric>, (FileError, String)> {
    let help = |_: &str| format!("Metric read from {}", path.display());
    exposition::parse(text, &help, Timestamps::Refuse).map_err(|e| match e {
        ExpositionError::Parse(d) => (FileError::Parse, d),
        ExpositionError::Timestamps(d) => (FileError::Timestamps, d),
    })
}

/// Labels of a record as `(name, value)` pairs (tests, comparisons).
pub fn label_pairs(labels: &[Label]) -> Vec<(&str, &str)> {
    labels
        .iter()
        .map(|l| (l.name.as_str(), l.value.as_str()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use uctel_protocol::payload::MetricType;

    const FILE: &str = "\
# HELP cron_last_success_seconds Last success.
# TYPE cron_last_success_seconds gauge
cron_last_success_seconds{job=\"backup\"} 1.7e9
cron_runs_total{job=\"backup\",result=\"ok, really\"} 12
# TYPE rpc summary
rpc{quantile=\"0.5\"} 3
rpc{quantile=\"0.9\"} 5
rpc_sum 40
rpc_count 10
# TYPE lat histogram
lat_bucket{path=\"/\",le=\"0.1\"} 1
lat_bucket{path=\"/\",le=\"1\"} 3
lat_bucket{path=\"/\",le=\"+Inf\"} 4
lat_sum{path=\"/\"} 2.5
lat_count{path=\"/\"} 4
lat_bucket{path=\"/x\",le=\"0.1\"} 0
lat_bucket{path=\"/x\",le=\"1\"} 0
lat_bucket{path=\"/x\",le=\"+Inf\"} 2
lat_sum{path=\"/x\"} 9
lat_count{path=\"/x\"} 2
";

    fn find<'a>(ms: &'a [Metric], name: &str, labels: &[(&str, &str)]) -> Option<&'a Metric> {
        ms.iter().find(|m| {
            m.name == name && {
                let have = label_pairs(&m.labels);
                labels.iter().all(|l| have.contains(l)) && have.len() == labels.len()
            }
        })
    }

    #[test]
    fn types_help_histograms_and_summaries_as_node_exporter_serves_them() {
        let ms = parse(FILE, Path::new("/t/a.prom")).unwrap();
        let g = find(&ms, "cron_last_success_seconds", &[("job", "backup")]).unwrap();
        assert_eq!(
            (g.r#type, g.value, g.help.as_str()),
            (MetricType::Gauge as i32, 1.7e9, "Last success.")
        );
        let u = find(
            &ms,
            "cron_runs_total",
            &[("job", "backup"), ("result", "ok, really")],
        )
        .unwrap();
        assert_eq!((u.r#type, u.value), (MetricType::Untyped as i32, 12.0));
        assert_eq!(u.help, "Metric read from /t/a.prom");
        for (name, labels, value) in [
            ("rpc", vec![("quantile", "0.5")], 3.0),
            ("rpc", vec![("quantile", "0.9")], 5.0),
            ("rpc_sum", vec![], 40.0),
            ("rpc_count", vec![], 10.0),
        ] {
            let m = find(&ms, name, &labels).unwrap_or_else(|| panic!("{name} {labels:?}"));
            assert_eq!((m.r#type, m.value), (MetricType::Untyped as i32, value));
        }
        let h = find(&ms, "lat", &[("path", "/")]).unwrap();
        assert_eq!(h.r#type, MetricType::Histogram as i32);
        assert_eq!(
            h.buckets
                .iter()
                .map(|b| (b.upper_bound, b.cumulative_count))
                .collect::<Vec<_>>(),
            [(0.1, 1), (1.0, 3)]
        );
        assert_eq!((h.count, h.sum), (4, 2.5));
        let x = find(&ms, "lat", &[("path", "/x")]).unwrap();
        assert_eq!((x.count, x.sum), (2, 9.0));
        assert_eq!(ms.len(), 2 + 4 + 2);
    }

    #[test]
    fn escapes_in_label_values_and_help_are_undone() {
        let text = "# HELP q a \\\\ b\\nc\nq{p=\"C:\\\\X\",m=\"say \\\"hi\\\"\",n=\"a\\nb\"} 1\n";
        let ms = parse(text, Path::new("/t/q.prom")).unwrap();
        assert_eq!(ms[0].help, "a \\ b\nc");
        assert_eq!(
            label_pairs(&ms[0].labels),
            [("p", "C:\\X"), ("m", "say \"hi\""), ("n", "a\nb")]
        );
    }

    #[test]
    fn a_histogram_with_fractional_counts_travels_series_by_series() {
        let text = "# TYPE h histogram\nh_bucket{le=\"1\"} 0.5\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n";
        let ms = parse(text, Path::new("/t/h.prom")).unwrap();
        let names: Vec<_> = ms.iter().map(|m| (m.name.as_str(), m.r#type)).collect();
        let u = MetricType::Untyped as i32;
        assert_eq!(
            names,
            [
                ("h_bucket", u),
                ("h_bucket", u),
                ("h_sum", u),
                ("h_count", u)
            ]
        );
    }

    #[test]
    fn bad_files_are_skipped_whole_with_their_reason_and_the_rest_is_read() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.prom"), FILE).unwrap();
        std::fs::write(dir.path().join("b.prom"), "bad{ 1\n").unwrap();
        std::fs::write(dir.path().join("c.prom"), "ts 1 1700000000000\n").unwrap();
        std::fs::write(dir.path().join("d.prom.1234"), "half 1\n").unwrap();
        std::fs::create_dir(dir.path().join("e.prom")).unwrap();
        let c = collect(dir.path());
        let reasons: Vec<_> = c
            .skipped
            .iter()
            .map(|s| {
                (
                    s.path.file_name().unwrap().to_string_lossy().into_owned(),
                    s.error,
                )
            })
            .collect();
        assert_eq!(
            reasons,
            [
                ("b.prom".to_owned(), FileError::Parse),
                ("c.prom".to_owned(), FileError::Timestamps),
                ("e.prom".to_owned(), FileError::Read),
            ]
        );
        assert!(
            find(&c.metrics, "half", &[]).is_none(),
            "temporary files are not read"
        );
        assert!(
            find(&c.metrics, "ts", &[]).is_none(),
            "a file with timestamps is skipped whole"
        );
        let a = dir.path().join("a.prom").display().to_string();
        let mtime = find(&c.metrics, "node_textfile_mtime_seconds", &[("file", &a)]).unwrap();
        assert!(
            mtime.value > 1.6e9 && mtime.value.fract() == 0.0,
            "{}",
            mtime.value
        );
        assert_eq!(
            c.metrics
                .iter()
                .filter(|m| m.name == "node_textfile_mtime_seconds")
                .count(),
            1
        );
        assert_eq!(
            find(&c.metrics, "node_textfile_scrape_error", &[])
                .unwrap()
                .value,
            1.0
        );
        std::fs::remove_file(dir.path().join("b.prom")).unwrap();
        std::fs::remove_file(dir.path().join("c.prom")).unwrap();
        std::fs::remove_dir(dir.path().join("e.prom")).unwrap();
        let c = collect(dir.path());
        assert!(c.skipped.is_empty(), "{:?}", c.skipped);
        assert_eq!(
            find(&c.metrics, "node_textfile_scrape_error", &[])
                .unwrap()
                .value,
            0.0
        );
    }

    #[test]
    fn a_missing_directory_is_a_scrape_error_not_a_failure() {
        let c = collect(Path::new("/nonexistent/uctel-textfile"));
        assert_eq!(c.skipped.len(), 1);
        assert_eq!(c.skipped[0].error, FileError::Read);
        assert_eq!(c.metrics.len(), 1);
        assert_eq!(c.metrics[0].name, "node_textfile_scrape_error");
        assert_eq!(c.metrics[0].value, 1.0);
    }

    #[test]
    fn no_input_panics() {
        for text in [
            "",
            "\n",
            "# TYPE\n",
            "x{a=\"\\\"} 1\n",
            "x 1e999999\n",
            "x{=\"\"} 1\n",
            "# TYPE h histogram\nh_bucket{le=\"x\"} 1\n",
            "\u{0}\u{ffff}",
            "x NaN\nx +Inf\n",
        ] {
            let _ = parse(text, Path::new("/t/x.prom"));
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
        /// Any text, and any text built from the format's own pieces: an answer, no panic.
        #[test]
        fn parse_never_panics(
            text in "\\PC{0,200}",
            pieces in proptest::collection::vec(proptest::sample::select(vec![
                "# TYPE h histogram\n", "# TYPE s summary\n", "# HELP x a\\nb\n", "x", "h_bucket", "s",
                "{", "}", "le=", "quantile=", "\"", "\\", ",", " ", "1", "+Inf", "NaN", "-1e9",
                "\n", "\t", "=", "#", "_sum", "_count", " 123", "é",
            ]), 0..40),
        ) {
            let _ = parse(&text, Path::new("/t/p.prom"));
            let _ = parse(&pieces.concat(), Path::new("/t/p.prom"));
        }
    }
}
