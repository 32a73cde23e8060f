//! `promtool check metrics`: Prometheus' own lint of an exposition, with the accepted
//! exceptions: node_exporter's own names that promtool flags in node_exporter's `/metrics`
//! too, which DESIGN.md §7 keeps on purpose so node_exporter dashboards work on uctel data:
//! the `camelCase` names (`node_memory_MemAvailable_bytes`) and `node_entropy_*_bits` ("use
//! base unit bytes instead of bits").
//!
//! promtool reads the exposition on stdin; exit 0 is clean, 1 a parse error, 3 lint problems
//! (missing HELP, counters without `_total`, non-base units, ...). A missing promtool is a
//! test failure, not a skip: `.ci/run` installs the Debian package `prometheus`.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// The promtool binary: `$PROMTOOL` or `/usr/bin/promtool`.
///
/// # Panics
/// If it does not exist, with the install hint.
pub fn binary() -> PathBuf {
    let p = std::env::var_os("PROMTOOL").map_or_else(|| "/usr/bin/promtool".into(), PathBuf::from);
    assert!(
        p.is_file(),
        "{} not found: install Prometheus (Debian: apt-get install prometheus)",
        p.display()
    );
    p
}

/// What `promtool check metrics` said about an exposition.
#[derive(Debug)]
pub struct Promtool {
    /// Exit status code: 0 clean, 3 lint problems, 1 a parse error.
    pub code: Option<i32>,
    /// Its stdout and stderr.
    pub report: String,
}

impl Promtool {
    /// Runs `promtool check metrics` on `text`.
    ///
    /// # Errors
    /// promtool could not be run.
    pub fn run(text: &str) -> Result<Promtool, String> {
        let mut child = Command::new(binary())
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("running promtool: {e}"))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(text.as_bytes())
                .map_err(|e| format!("writing to promtool: {e}"))?;
        }
        let out = child
            .wait_with_output()
            .map_err(|e| format!("waiting for promtool: {e}"))?;
        let mut report = String::from_utf8_lossy(&out.stdout).into_owned();
        report.push_str(&String::from_utf8_lossy(&out.stderr));
        Ok(Promtool {
            code: out.status.code(),
            report,
        })
    }

    /// Lint lines other than the accepted exceptions: node_exporter's own names, which
    /// promtool flags in node_exporter's `/metrics` too and which uctel keeps so Node
    /// Exporter dashboards work (`camelCase` meminfo names; `node_entropy_*_bits`, "use base
    /// unit bytes instead of bits"), and the RDMA driver counters named after their
    /// `hw_counters` file, without `_total`.
    pub fn problems(&self) -> Vec<&str> {
        self.report
            .lines()
            .filter(|l| !l.trim().is_empty())
            .filter(|l| !(l.starts_with("node_") && l.contains("'camelCase'")))
            .filter(|l| {
                !(l.starts_with("node_entropy_")
                    && l.contains("use base unit \"bytes\" instead of \"bits\""))
            })
            // RDMA driver counters keep their `hw_counters/<file>` name verbatim
            // (`node_infiniband_out_of_buffer`), as `sources::rdma` documents.
            .filter(|l| !(l.starts_with("node_infiniband_") && l.contains("_total\" suffix")))
            .collect()
    }

    /// Ok when the text parsed and every lint line is the accepted exception.
    ///
    /// # Errors
    /// A parse error (with promtool's message) or the other lint problems.
    pub fn check(&self) -> Result<(), String> {
        match self.code {
            Some(0) => Ok(()),
            Some(3) if self.problems().is_empty() => Ok(()),
            Some(3) => Err(format!(
                "promtool check metrics: {} problem(s):\n{}",
                self.problems().len(),
                self.problems().join("\n")
            )),
            code => Err(format!(
                "promtool check metrics failed (exit {code:?}):\n{}",
                self.report
            )),
        }
    }
}

/// Runs `promtool check metrics` on `text`.
///
/// # Panics
/// If promtool cannot be run.
pub fn promtool(text: &str) -> Promtool {
    Promtool::run(text).unwrap_or_else(|e| panic!("{e}"))
}

/// `promtool check metrics` on `text`, judged by [`Promtool::check`].
///
/// # Errors
/// promtool could not run, the text does not parse, or a lint problem other than the
/// accepted exception.
pub fn check_metrics(text: &str) -> Result<(), String> {
    Promtool::run(text)?.check()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// promtool exits 3 for the camelCase lint on node_exporter names as for any other lint:
    /// only the former is accepted; parse errors (exit 1) never are.
    #[test]
    fn only_node_camel_case_lint_is_accepted() {
        let node = "# HELP node_memory_MemAvailable_bytes Memory.\n# TYPE node_memory_MemAvailable_bytes gauge\nnode_memory_MemAvailable_bytes{agent=\"a\"} 1\n";
        assert_eq!(check_metrics(node), Ok(()));
        let other = format!(
            "{node}# HELP uctel_fooBar_total Camel.\n# TYPE uctel_fooBar_total counter\nuctel_fooBar_total 1\n"
        );
        let e = check_metrics(&other).unwrap_err();
        assert!(
            e.contains("uctel_fooBar_total") && !e.contains("node_memory"),
            "{e}"
        );
        let counter = format!("{node}# HELP ops Ops.\n# TYPE ops counter\nops 1\n");
        assert!(check_metrics(&counter).is_err());
        assert!(check_metrics("garbage{\n").is_err());
    }
}
