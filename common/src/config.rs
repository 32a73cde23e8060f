//! Strict YAML configuration loading that reports **every** problem at once, each with file,
//! line, column and key path (DESIGN.md §9).
//!
//! serde stops at the first error, so loading runs in rounds:
//!
//! 1. The text is parsed into a [`serde_yaml::Value`] (YAML through `serde_norway`). A syntax
//!    error ends loading with that one problem (its location comes from the YAML parser).
//! 2. A second, location-aware pass over the same text (`saphyr-parser` events) records where
//!    every key and value starts, indexed by key path (`listen.control`, `auth.agents[1].id`).
//! 3. The value is deserialized into `T` through `serde_path_to_error`, which names the key
//!    path of the failure. The problem is recorded, the offending key is removed from the value
//!    (unknown key, wrong type, bad value) or a neutral placeholder is put in for a missing one,
//!    and the next round runs, until `T` deserializes or [`MAX_ROUNDS`] is reached.
//! 4. If `T` deserialized without problems, [`Validate::validate`] runs the semantic checks
//!    (ranges, cross-field rules); they name key paths, which map to lines the same way.
//!
//! Config types should use `#[serde(deny_unknown_fields)]`, unit-suffixed keys
//! (`interval_seconds`, `max_frame_bytes`) and avoid `#[serde(flatten)]` and internally tagged
//! enums (both buffer the input, which loses key paths and disables `deny_unknown_fields`).
//!
//! ```
//! use serde::Deserialize;
//! use uctel_common::config::{self, Problems, Validate};
//!
//! #[derive(Debug, Deserialize)]
//! #[serde(deny_unknown_fields)]
//! struct Example {
//!     port: u16,
//!     #[serde(default)]
//!     slots: u32,
//! }
//! impl Validate for Example {
//!     fn validate(&self, problems: &mut Problems) {
//!         if self.slots == 1 {
//!             problems.push("slots", "must be 0 or at least 2");
//!         }
//!     }
//! }
//!
//! let err = config::from_str::<Example>("example.yaml", "port: 99999\nbogus: 1\n").unwrap_err();
//! let text = err.to_string();
//! assert!(text.contains("example.yaml:1:7: port: invalid value"), "{text}");
//! assert!(text.contains("example.yaml:2:1: bogus: unknown field"), "{text}");
//! ```

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};

use saphyr_parser::{Event, Parser, Span};
use serde::de::DeserializeOwned;
use serde_yaml::{Mapping, Value};

/// Upper bound on deserialization rounds (one problem is found per round).
pub const MAX_ROUNDS: usize = 128;

/// One configuration problem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// 1-based line in the file, when known.
    pub line: Option<usize>,
    /// 1-based column (in characters), when known.
    pub column: Option<usize>,
    /// Dotted key path, sequences as `[index]`, e.g. `auth.agents[0].token_file`.
    /// Empty for the document itself.
    pub key_path: String,
    /// What is wrong, e.g. ``unknown field `bogus`, expected one of ...``.
    pub message: String,
}

/// All problems found in one configuration file.
///
/// `Display` prints one problem per line as `file:line:col: key.path: message` (the
/// `line:col` part is left out when unknown), the format editors and CI logs link to.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// The file (or name) the configuration came from.
    pub file: PathBuf,
    /// Every problem found, in file order where lines are known. Never empty.
    pub problems: Vec<Problem>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{}:", self.file.display())?;
            if let Some(line) = p.line {
                write!(f, "{line}:{}:", p.column.unwrap_or(1))?;
            }
            if !p.key_path.is_empty() {
                write!(f, " {}:", p.key_path)?;
            }
            write!(f, " {}", p.message)?;
        }
        Ok(())
    }
}

/// Semantic problems collected by [`Validate::validate`], each naming a key path.
#[derive(Debug, Default)]
pub struct Problems {
    items: Vec<(String, String)>,
}

impl Problems {
    /// Records that the value at `key_path` (dotted, `[i]` for sequence items) is wrong.
    pub fn push(&mut self, key_path: impl Into<String>, message: impl fmt::Display) {
        self.items.push((key_path.into(), message.to_string()));
    }

    /// True when nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The recorded `(key_path, message)` pairs.
    pub fn items(&self) -> &[(String, String)] {
        &self.items
    }
}

/// Semantic checks that serde cannot express (ranges, cross-field rules, files that must
/// exist). Implementations push every problem, they do not stop at the first.
pub trait Validate {
    /// Pushes one entry per problem, naming the key path it is about.
    fn validate(&self, problems: &mut Problems);
}

/// Reads and loads `path`. Errors: unreadable file (one problem without a line), YAML syntax,
/// deserialization and [`Validate`] problems, all reported together.
pub fn load<T: DeserializeOwned + Validate>(path: &Path) -> Result<T, ConfigError> {
    match std::fs::read_to_string(path) {
        Ok(text) => from_str(path, &text),
        Err(e) => Err(ConfigError {
            file: path.to_path_buf(),
            problems: vec![Problem {
                line: None,
                column: None,
                key_path: String::new(),
                message: format!("cannot read file: {e}"),
            }],
        }),
    }
}

/// Loads configuration text; `file` is only used to name the source in problems.
/// An empty document is treated as an empty mapping (all defaults).
pub fn from_str<T: DeserializeOwned + Validate>(
    file: impl AsRef<Path>,
    text: &str,
) -> Result<T, ConfigError> {
    let file = file.as_ref().to_path_buf();
    let fail = |problems: Vec<Problem>| ConfigError {
        file: file.clone(),
        problems,
    };
    let mut value: Value = match serde_yaml::from_str(text) {
        Ok(Value::Null) => Value::Mapping(Mapping::new()),
        Ok(v) => v,
        Err(e) => {
            let loc = e.location();
            return Err(fail(vec![Problem {
                line: loc.as_ref().map(|l| l.line()),
                column: loc.as_ref().map(|l| l.column()),
                key_path: String::new(),
                message: e.to_string(),
            }]));
        }
    };
    let index = LocationIndex::build(text);
    let mut rounds = Rounds::default();
    let mut problems = Vec::new();
    let mut parsed = None;
    for _ in 0..MAX_ROUNDS {
        let err = match serde_path_to_error::deserialize::<_, T>(value.clone()) {
            Ok(t) => {
                parsed = Some(t);
                break;
            }
            Err(e) => e,
        };
        let path = segments(err.path());
        let message = err.inner().to_string();
        let go_on = match classify(&message) {
            Kind::UnknownField(name) => {
                let mut full = path;
                if full.last() != Some(&Seg::Key(name.clone())) {
                    full.push(Seg::Key(name));
                }
                if rounds.should_report(&full) {
                    problems.push(index.problem(&full, Anchor::Key, message));
                }
                remove(&mut value, &full)
            }
            Kind::MissingField(name) => {
                let mut full = path.clone();
                full.push(Seg::Key(name));
                if rounds.should_report(&full) {
                    let key = render(&full);
                    problems.push(index.problem_at(&path, &key, Anchor::Key, message));
                }
                rounds.fill(&mut value, &full)
            }
            Kind::Other if rounds.placeholders.contains_key(&path) => {
                // The placeholder put in for a missing key did not fit: try the next one.
                rounds.fill(&mut value, &path)
            }
            Kind::Other => {
                if rounds.should_report(&path) {
                    problems.push(index.problem(&path, Anchor::Value, message));
                }
                !path.is_empty() && remove(&mut value, &path)
            }
        };
        if !go_on {
            break;
        }
    }
    match parsed {
        Some(t) if problems.is_empty() => {
            let mut semantic = Problems::default();
            t.validate(&mut semantic);
            if semantic.is_empty() {
                return Ok(t);
            }
            for (key, message) in semantic.items {
                let path = parse_path(&key);
                problems.push(index.problem_at(&path, &key, Anchor::Value, message));
            }
        }
        Some(_) => {}
        None if problems.is_empty() => problems.push(Problem {
            line: None,
            column: None,
            key_path: String::new(),
            message: "configuration could not be deserialized".to_string(),
        }),
        None => {}
    }
    problems.sort_by_key(|p| (p.line.is_none(), p.line, p.column));
    Err(fail(problems))
}

/// One key path segment.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Seg {
    Key(String),
    Index(usize),
}

fn segments(path: &serde_path_to_error::Path) -> Vec<Seg> {
    use serde_path_to_error::Segment;
    path.iter()
        .filter_map(|s| match s {
            Segment::Seq { index } => Some(Seg::Index(*index)),
            Segment::Map { key } => Some(Seg::Key(key.clone())),
            // Externally tagged enums: the variant key is a real mapping key in YAML.
            Segment::Enum { variant } => Some(Seg::Key(variant.clone())),
            Segment::Unknown => None,
        })
        .collect()
}

fn render(path: &[Seg]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Seg::Index(i) => {
                out.push('[');
                out.push_str(&i.to_string());
                out.push(']');
            }
        }
    }
    out
}

/// Inverse of [`render`] for the key paths that [`Validate`] implementations write.
fn parse_path(key: &str) -> Vec<Seg> {
    let mut out = Vec::new();
    for part in key.split('.').filter(|p| !p.is_empty()) {
        let mut rest = part;
        if let Some(open) = rest.find('[') {
            let (name, idx) = rest.split_at(open);
            if !name.is_empty() {
                out.push(Seg::Key(name.to_string()));
            }
            rest = idx;
            for chunk in rest.split('[').filter(|c| !c.is_empty()) {
                match chunk.trim_end_matches(']').parse() {
                    Ok(i) => out.push(Seg::Index(i)),
                    Err(_) => out.push(Seg::Key(chunk.to_string())),
                }
            }
        } else {
            out.push(Seg::Key(rest.to_string()));
        }
    }
    out
}

/// Bookkeeping across deserialization rounds.
#[derive(Default)]
struct Rounds {
    /// Paths already reported (a removed bad value comes back as "missing field").
    reported: HashSet<Vec<Seg>>,
    /// Paths where a placeholder was put in, with the number of candidates tried.
    placeholders: HashMap<Vec<Seg>, usize>,
    /// Paths moved to the end of their parents because no placeholder fits.
    deferred: HashSet<Vec<Seg>>,
}

impl Rounds {
    /// Report once per path, and never for problems caused by our own placeholders.
    fn should_report(&mut self, path: &[Seg]) -> bool {
        let under_placeholder = (0..=path.len()).any(|n| {
            path.get(..n)
                .is_some_and(|p| self.placeholders.contains_key(p))
        });
        !under_placeholder && self.reported.insert(path.to_vec())
    }

    /// Puts the next placeholder candidate at `path`; when none fits, moves the path's
    /// ancestors to the end of their mappings so every other key is checked before the
    /// unfixable one ends the rounds. False when nothing more can be done.
    fn fill(&mut self, root: &mut Value, path: &[Seg]) -> bool {
        let tried = self.placeholders.entry(path.to_vec()).or_insert(0);
        if let Some(candidate) = placeholders().into_iter().nth(*tried) {
            *tried += 1;
            return set(root, path, candidate);
        }
        if !self.deferred.insert(path.to_vec()) {
            return false;
        }
        remove(root, path);
        for n in (1..path.len()).rev() {
            if let Some(prefix) = path.get(..n) {
                move_to_end(root, prefix);
            }
        }
        true
    }
}

enum Kind {
    UnknownField(String),
    MissingField(String),
    Other,
}

/// Classifies a serde error message (serde's own wording, `serde::de::Error` defaults).
fn classify(message: &str) -> Kind {
    let quoted = |prefix: &str| {
        message
            .strip_prefix(prefix)
            .and_then(|rest| rest.split('`').next())
            .map(str::to_string)
    };
    if let Some(name) = quoted("unknown field `") {
        Kind::UnknownField(name)
    } else if let Some(name) = quoted("missing field `") {
        Kind::MissingField(name)
    } else {
        Kind::Other
    }
}

fn key_matches(k: &Value, name: &str) -> bool {
    match k {
        Value::String(s) => s == name,
        Value::Number(n) => n.to_string() == name,
        Value::Bool(b) => b.to_string() == name,
        _ => false,
    }
}

/// Follows `path` from `root` (through tags), returning the node.
fn node_mut<'a>(root: &'a mut Value, path: &[Seg]) -> Option<&'a mut Value> {
    let mut cur = root;
    for seg in path {
        while let Value::Tagged(t) = cur {
            cur = &mut t.value;
        }
        cur = match (seg, cur) {
            (Seg::Key(name), Value::Mapping(m)) => m
                .iter_mut()
                .find(|(k, _)| key_matches(k, name))
                .map(|(_, v)| v)?,
            (Seg::Index(i), Value::Sequence(s)) => s.get_mut(*i)?,
            _ => return None,
        };
    }
    while let Value::Tagged(t) = cur {
        cur = &mut t.value;
    }
    Some(cur)
}

/// Removes the node at `path` (a mapping entry or a sequence item). False if not found.
fn remove(root: &mut Value, path: &[Seg]) -> bool {
    let Some((last, parent)) = path.split_last() else {
        return false;
    };
    match (last, node_mut(root, parent)) {
        (Seg::Key(name), Some(Value::Mapping(m))) => {
            let key = m.keys().find(|k| key_matches(k, name)).cloned();
            key.and_then(|k| m.shift_remove(&k)).is_some()
        }
        (Seg::Index(i), Some(Value::Sequence(s))) if *i < s.len() => {
            s.remove(*i);
            true
        }
        _ => false,
    }
}

/// Neutral values tried, in order, for a key that is missing (or whose value was removed):
/// most required sections are mappings whose fields all have defaults.
fn placeholders() -> [Value; 6] {
    [
        Value::Mapping(Mapping::new()),
        Value::Sequence(Vec::new()),
        Value::String(String::new()),
        Value::Number(0.into()),
        Value::Bool(false),
        Value::Null,
    ]
}

/// Sets the mapping entry at `path` (its parent must be a mapping). False if not possible.
fn set(root: &mut Value, path: &[Seg], new: Value) -> bool {
    let Some((Seg::Key(name), parent)) = path.split_last() else {
        return false;
    };
    match node_mut(root, parent) {
        Some(Value::Mapping(m)) => {
            let existing = m.keys().find(|k| key_matches(k, name)).cloned();
            let k = existing.unwrap_or_else(|| Value::String(name.clone()));
            m.insert(k, new);
            true
        }
        _ => false,
    }
}

/// Moves the mapping entry at `path` to the end of its parent mapping (serde visits mapping
/// entries in order).
fn move_to_end(root: &mut Value, path: &[Seg]) {
    let Some((Seg::Key(name), parent)) = path.split_last() else {
        return;
    };
    if let Some(Value::Mapping(m)) = node_mut(root, parent) {
        if let Some(k) = m.keys().find(|k| key_matches(k, name)).cloned() {
            if let Some(v) = m.shift_remove(&k) {
                m.insert(k, v);
            }
        }
    }
}

#[derive(Clone, Copy)]
enum Anchor {
    Key,
    Value,
}

#[derive(Clone, Copy, Default)]
struct Where {
    key: Option<(usize, usize)>,
    value: Option<(usize, usize)>,
}

/// Where each key path's key and value start (1-based line, 1-based column).
#[derive(Default)]
struct LocationIndex {
    at: HashMap<Vec<Seg>, Where>,
}

enum Frame {
    Map { path: Vec<Seg>, next_is_key: bool },
    Seq { path: Vec<Seg>, next: usize },
}

impl LocationIndex {
    /// Best effort: on a scan error the index built so far is kept (serde_norway already
    /// accepted the text, so this only happens on parser disagreements).
    fn build(text: &str) -> Self {
        let mut index = LocationIndex::default();
        let mut stack: Vec<Frame> = Vec::new();
        let mut current_key: Option<Vec<Seg>> = None;
        let pos = |span: &Span| (span.start.line(), span.start.col() + 1);
        for item in Parser::new_from_str(text) {
            let Ok((event, span)) = item else { break };
            // Path of the node this event starts, if it is a node in value position.
            let node_path = |stack: &mut Vec<Frame>, current_key: &mut Option<Vec<Seg>>| match stack
                .last_mut()
            {
                None => Some(Vec::new()),
                Some(Frame::Seq { path, next }) => {
                    let mut p = path.clone();
                    p.push(Seg::Index(*next));
                    *next += 1;
                    Some(p)
                }
                Some(Frame::Map { next_is_key, .. }) => {
                    if *next_is_key {
                        None
                    } else {
                        *next_is_key = true;
                        current_key.take()
                    }
                }
            };
            match event {
                Event::Scalar(value, ..) => {
                    if let Some(Frame::Map {
                        path,
                        next_is_key: next_is_key @ true,
                    }) = stack.last_mut()
                    {
                        let mut p = path.clone();
                        p.push(Seg::Key(value.to_string()));
                        index.at.entry(p.clone()).or_default().key = Some(pos(&span));
                        current_key = Some(p);
                        *next_is_key = false;
                    } else if let Some(p) = node_path(&mut stack, &mut current_key) {
                        index.at.entry(p).or_default().value = Some(pos(&span));
                    }
                }
                Event::Alias(_) => {
                    if let Some(p) = node_path(&mut stack, &mut current_key) {
                        index.at.entry(p).or_default().value = Some(pos(&span));
                    }
                }
                Event::MappingStart(..) | Event::SequenceStart(..) => {
                    let is_map = matches!(event, Event::MappingStart(..));
                    // A collection used as a mapping key: index its insides under a
                    // placeholder path that serde never reports.
                    let p = node_path(&mut stack, &mut current_key).unwrap_or_else(|| {
                        if let Some(Frame::Map { next_is_key, .. }) = stack.last_mut() {
                            *next_is_key = false;
                        }
                        vec![Seg::Key("?".to_string())]
                    });
                    index.at.entry(p.clone()).or_default().value = Some(pos(&span));
                    stack.push(if is_map {
                        Frame::Map {
                            path: p,
                            next_is_key: true,
                        }
                    } else {
                        Frame::Seq { path: p, next: 0 }
                    });
                }
                Event::MappingEnd | Event::SequenceEnd => {
                    stack.pop();
                }
                _ => {}
            }
        }
        index
    }

    /// Finds the location for `path`, walking up to the nearest ancestor that is in the file.
    fn locate(&self, path: &[Seg], anchor: Anchor) -> Option<(usize, usize)> {
        let mut len = path.len();
        loop {
            let prefix = path.get(..len)?;
            if let Some(w) = self.at.get(prefix) {
                let exact = len == path.len();
                let found = match (anchor, exact) {
                    (Anchor::Value, true) => w.value.or(w.key),
                    _ => w.key.or(w.value),
                };
                if found.is_some() {
                    return found;
                }
            }
            if len == 0 {
                return Some((1, 1));
            }
            len -= 1;
        }
    }

    fn problem(&self, path: &[Seg], anchor: Anchor, message: String) -> Problem {
        self.problem_at(path, &render(path), anchor, message)
    }

    fn problem_at(&self, path: &[Seg], key: &str, anchor: Anchor, message: String) -> Problem {
        let loc = self.locate(path, anchor);
        Problem {
            line: loc.map(|l| l.0),
            column: loc.map(|l| l.1),
            key_path: key.to_string(),
            message,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use std::net::SocketAddr;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Listen {
        control: SocketAddr,
        #[serde(default = "default_metrics")]
        metrics: SocketAddr,
    }

    fn default_metrics() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 9470))
    }

    #[derive(Debug, Deserialize, PartialEq, Default)]
    #[serde(deny_unknown_fields, rename_all = "snake_case")]
    enum Kind {
        #[default]
        Soft,
        Verbs,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Agent {
        id: String,
        #[serde(default)]
        token_file: Option<String>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Cfg {
        listen: Listen,
        #[serde(default)]
        kind: Kind,
        #[serde(default)]
        slots: u32,
        #[serde(default)]
        agents: Vec<Agent>,
    }

    impl Validate for Cfg {
        fn validate(&self, problems: &mut Problems) {
            if self.slots != 0 && !self.slots.is_power_of_two() {
                problems.push("slots", "must be a power of two");
            }
            for (i, a) in self.agents.iter().enumerate() {
                if a.id.is_empty() {
                    problems.push(format!("agents[{i}].id"), "must not be empty");
                }
            }
        }
    }

    fn problems(text: &str) -> Vec<Problem> {
        match from_str::<Cfg>("c.yaml", text) {
            Ok(c) => panic!("expected problems, got {c:?}"),
            Err(e) => e.problems,
        }
    }

    fn brief(p: &[Problem]) -> Vec<(Option<usize>, Option<usize>, &str)> {
        p.iter()
            .map(|p| (p.line, p.column, p.key_path.as_str()))
            .collect()
    }

    #[test]
    fn valid_config_loads() {
        let c: Cfg = from_str(
            "c.yaml",
            "listen:\n  control: 127.0.0.1:7400\nkind: verbs\nslots: 64\nagents:\n  - id: a\n",
        )
        .unwrap();
        assert_eq!(c.kind, Kind::Verbs);
        assert_eq!(c.slots, 64);
        assert_eq!(c.listen.metrics, default_metrics());
        assert_eq!(c.agents.len(), 1);
    }

    #[test]
    fn collects_every_problem_with_lines() {
        let text = "\
listen:
  control: not-an-address
  bogus: 1
kind: rdma
slots: many
agents:
  - id: a
    token_fil: x
  - id: b
extra: true
";
        let p = problems(text);
        assert_eq!(
            brief(&p),
            vec![
                (Some(2), Some(12), "listen.control"),
                (Some(3), Some(3), "listen.bogus"),
                (Some(4), Some(7), "kind"),
                (Some(5), Some(8), "slots"),
                (Some(8), Some(5), "agents[0].token_fil"),
                (Some(10), Some(1), "extra"),
            ],
            "{p:#?}"
        );
        assert!(p[1].message.contains("unknown field `bogus`"), "{p:#?}");
        assert!(p[2].message.contains("unknown variant `rdma`"), "{p:#?}");
    }

    #[test]
    fn missing_section_reported_and_rest_still_checked() {
        let p = problems("slots: x\nagents:\n  - {}\n");
        let keys: Vec<_> = p.iter().map(|p| p.key_path.as_str()).collect();
        assert_eq!(keys, vec!["listen", "slots", "agents[0].id"], "{p:#?}");
        assert!(p[0].message.contains("missing field `listen`"));
        // A missing key of the root has no better line than the document start.
        assert_eq!(p[0].line, Some(1));
        assert_eq!(p[2].line, Some(3));
    }

    #[test]
    fn semantic_problems_carry_lines() {
        let p = problems("listen:\n  control: 127.0.0.1:1\nslots: 12\nagents:\n  - id: ''\n");
        assert_eq!(
            brief(&p),
            vec![
                (Some(3), Some(8), "slots"),
                (Some(5), Some(9), "agents[0].id")
            ]
        );
    }

    #[test]
    fn syntax_error_has_location() {
        let p = problems("listen:\n  control: [1, 2\n");
        assert_eq!(p.len(), 1);
        assert!(p[0].line.is_some(), "{p:?}");
    }

    #[test]
    fn empty_document_means_defaults() {
        let p = problems("");
        assert_eq!(brief(&p), vec![(Some(1), Some(1), "listen")]);
    }

    #[test]
    fn display_is_one_problem_per_line() {
        let err = from_str::<Cfg>("dir/c.yaml", "listen:\n  control: x\nfoo: 1\n").unwrap_err();
        let text = err.to_string();
        let lines: Vec<_> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(
            lines[0].starts_with("dir/c.yaml:2:12: listen.control: "),
            "{text}"
        );
        assert!(
            lines[1].starts_with("dir/c.yaml:3:1: foo: unknown field `foo`"),
            "{text}"
        );
    }

    #[test]
    fn unreadable_file_is_one_problem() {
        let err = load::<Cfg>(Path::new("/nonexistent/uctel.yaml")).unwrap_err();
        assert_eq!(err.problems.len(), 1);
        assert!(err.to_string().contains("cannot read file"));
    }

    #[test]
    fn path_round_trip() {
        for key in ["a", "a.b", "a[0].b", "a[1][2].c", "x.y[3]"] {
            assert_eq!(render(&parse_path(key)), key);
        }
    }

    #[test]
    fn bounded_on_hostile_input() {
        // Many problems: must terminate with at most MAX_ROUNDS of them.
        let mut text = String::from("listen:\n  control: 127.0.0.1:1\n");
        for i in 0..300 {
            text.push_str(&format!("k{i}: 1\n"));
        }
        let p = problems(&text);
        assert!(!p.is_empty() && p.len() <= MAX_ROUNDS);
    }
}
