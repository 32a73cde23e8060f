//! The Grafana dashboards shipped in `dashboards/`: loading, structural checks, and every
//! panel query with its template variables substituted as Grafana does before it sends the
//! query to Prometheus.
//!
//! Substitution (Grafana's documented variables): a query variable with "All" selected
//! becomes its `allValue` (`.+` in these dashboards, used with `=~`; `.*` for a variable
//! without one); `$__rate_interval` → `1m`, `$__interval` → `15s`, `$__range` → `5m` (and
//! `$__range_s`, `$__range_ms`, `$__interval_ms`); the `$name`, `${name}`, `${name:regex}`
//! and `[[name]]` spellings are all replaced.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// One panel query.
#[derive(Debug, Clone)]
pub struct PanelQuery {
    /// Dashboard file name.
    pub dashboard: String,
    /// Panel title.
    pub panel: String,
    /// Target `refId`.
    pub ref_id: String,
    /// The expression as written in the dashboard.
    pub raw: String,
    /// The expression with every variable substituted.
    pub expr: String,
}

/// Every `*.json` file in `dashboards/`, sorted.
///
/// # Panics
/// If the directory cannot be read.
pub fn files() -> Vec<PathBuf> {
    let dir = crate::workspace_root().join("dashboards");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    v.sort();
    v
}

/// Parses a dashboard file.
///
/// # Panics
/// If it cannot be read or is not JSON.
pub fn load(path: &Path) -> Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every panel, rows' nested panels included (rows themselves excluded).
pub fn panels(dashboard: &Value) -> Vec<&Value> {
    fn walk<'a>(list: &'a Value, out: &mut Vec<&'a Value>) {
        for p in list.as_array().into_iter().flatten() {
            if p.get("type").and_then(Value::as_str) == Some("row") {
                if let Some(inner) = p.get("panels") {
                    walk(inner, out);
                }
            } else {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    if let Some(list) = dashboard.get("panels") {
        walk(list, &mut out);
    }
    out
}

/// The template variables: `(name, value used for "All")`.
pub fn variables(dashboard: &Value) -> Vec<(String, String)> {
    dashboard
        .pointer("/templating/list")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| {
            let name = v.get("name")?.as_str()?.to_owned();
            let all = v
                .get("allValue")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .unwrap_or(".*")
                .to_owned();
            Some((name, all))
        })
        .collect()
}

/// Grafana's built-in interval variables with the values the tests use.
pub const BUILTINS: [(&str, &str); 7] = [
    ("__rate_interval", "1m"),
    ("__interval_ms", "15000"),
    ("__interval", "15s"),
    ("__range_ms", "300000"),
    ("__range_s", "300"),
    ("__range", "5m"),
    ("__auto", "15s"),
];

/// Substitutes every variable in `expr`. Longer names first, so `$__range_s` is not read as
/// `$__range` followed by `_s`.
pub fn substitute(expr: &str, vars: &[(String, String)]) -> String {
    let mut all: Vec<(String, String)> = vars.to_vec();
    all.extend(
        BUILTINS
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    all.sort_by_key(|v| std::cmp::Reverse(v.0.len()));
    let mut out = expr.to_owned();
    for (name, value) in &all {
        for format in ["", ":regex", ":raw", ":pipe"] {
            out = out.replace(&format!("${{{name}{format}}}"), value);
        }
        out = out.replace(&format!("[[{name}]]"), value);
        out = out.replace(&format!("${name}"), value);
    }
    out
}

/// Every panel query of `path`, substituted.
pub fn queries(path: &Path) -> Vec<PanelQuery> {
    let d = load(path);
    let vars = variables(&d);
    let file = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut out = Vec::new();
    for p in panels(&d) {
        let title = p
            .get("title")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        for t in p
            .get("targets")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let Some(raw) = t.get("expr").and_then(Value::as_str) else {
                continue;
            };
            out.push(PanelQuery {
                dashboard: file.clone(),
                panel: title.clone(),
                ref_id: t
                    .get("refId")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
                raw: raw.to_owned(),
                expr: substitute(raw, &vars),
            });
        }
    }
    out
}

/// The query of a `label_values(metric, label)` variable definition, as the PromQL series
/// selector Grafana evaluates (`metric`), with other variables substituted.
pub fn variable_selector(definition: &str, vars: &[(String, String)]) -> Option<String> {
    let inner = definition
        .trim()
        .strip_prefix("label_values(")?
        .strip_suffix(')')?;
    let (selector, _label) = inner.rsplit_once(',')?;
    Some(substitute(selector.trim(), vars))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn substitutes_every_spelling() {
        let vars = vec![("agent".to_owned(), ".*".to_owned())];
        let e = substitute(
            "rate(x{a=~\"$agent\",b=~\"${agent}\",c=~\"${agent:regex}\",d=~\"[[agent]]\"}[$__rate_interval]) + $__range_s",
            &vars,
        );
        assert_eq!(
            e,
            "rate(x{a=~\".*\",b=~\".*\",c=~\".*\",d=~\".*\"}[1m]) + 300"
        );
    }

    #[test]
    fn label_values_selector() {
        let vars = vec![("agent".to_owned(), ".*".to_owned())];
        assert_eq!(
            variable_selector(
                "label_values(node_load1{agent=~\"$agent\"}, instance)",
                &vars
            ),
            Some("node_load1{agent=~\".*\"}".to_owned())
        );
        assert_eq!(variable_selector("query_result(x)", &vars), None);
    }
}
