//! Strict YAML configuration loading that reports **every** problem at once, each with file,
//! line, column and key path (DESIGN.md §9).
//!
//! serde stops at the first error, so loading runs in rounds:
//!
//! 1. The text is parsed into a [`serde_yaml::Value`] (YAML through `serde_norway`). A syntax
//!    error ends loading with that one problem (its location comes from the YAML parser). Of
//!    keys repeated in one mapping (which serde_norway refuses at the first one) the first is
//!    kept and the others are skipped, so the rest of the file is still checked.
//! 2. A second, location-aware pass over the same text (`saphyr-parser` events) records where
//!    every key and value starts, indexed by key path (`listen.control`, `auth.agents[1].id`),
//!    and finds every repeated key, nested mappings included: each is one problem at its own
//!    line and column, `a: duplicate key (first at 1:1)`. Keys are compared as serde_norway
//!    compares them (`~` and `null` are the same key, `1` and `'1'` are not).
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

use std::borrow::Cow;
use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};

use saphyr_parser::{Event, Parser, ScalarStyle, Span, Tag};
use serde::de::{self, DeserializeOwned, DeserializeSeed, IgnoredAny, Visitor};
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
    let yaml_problem = |e: serde_yaml::Error| {
        let loc = e.location();
        Problem {
            line: loc.as_ref().map(|l| l.line()),
            column: loc.as_ref().map(|l| l.column()),
            key_path: String::new(),
            message: e.to_string(),
        }
    };
    let skipped = Cell::new(0);
    let mut value: Value = match serde::de::DeserializeSeed::deserialize(
        KeepFirst { skipped: &skipped },
        serde_yaml::Deserializer::from_str(text),
    ) {
        Ok(Value::Null) => Value::Mapping(Mapping::new()),
        Ok(v) => v,
        Err(e) => return Err(fail(vec![yaml_problem(e)])),
    };
    let index = LocationIndex::build(text);
    let mut rounds = Rounds::default();
    let mut problems = Vec::new();
    if skipped.get() > 0 {
        if index.duplicates.is_empty() {
            // serde_norway saw a duplicate the location pass cannot tell (a tagged or
            // aliased key): report serde_norway's own error for it.
            if let Err(e) = serde_yaml::from_str::<Value>(text) {
                problems.push(yaml_problem(e));
            }
        }
        for d in &index.duplicates {
            problems.push(Problem {
                line: Some(d.at.0),
                column: Some(d.at.1),
                key_path: render(&d.path),
                message: format!("duplicate key (first at {}:{})", d.first.0, d.first.1),
            });
        }
    }
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

/// Builds a [`Value`] as serde_norway's own `Deserialize` does, except that of mapping keys
/// that repeat (serde_norway: "duplicate entry with key ..."), the first is kept and the later
/// ones are skipped and counted in `skipped`, so the rest of the file is still checked.
/// [`LocationIndex`] says where the duplicates are.
#[derive(Clone, Copy)]
struct KeepFirst<'a> {
    skipped: &'a Cell<usize>,
}

impl<'de> DeserializeSeed<'de> for KeepFirst<'_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for KeepFirst<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }

    fn visit_i64<E: de::Error>(self, i: i64) -> Result<Value, E> {
        Ok(Value::Number(i.into()))
    }

    fn visit_u64<E: de::Error>(self, u: u64) -> Result<Value, E> {
        Ok(Value::Number(u.into()))
    }

    fn visit_f64<E: de::Error>(self, f: f64) -> Result<Value, E> {
        Ok(Value::Number(f.into()))
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_owned()))
    }

    fn visit_string<E: de::Error>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(self)? {
            items.push(item);
        }
        Ok(Value::Sequence(items))
    }

    fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut mapping = Mapping::new();
        while let Some(key) = map.next_key_seed(self)? {
            if mapping.contains_key(&key) {
                map.next_value::<IgnoredAny>()?;
                self.skipped.set(self.skipped.get().saturating_add(1));
            } else {
                let value = map.next_value_seed(self)?;
                mapping.insert(key, value);
            }
        }
        Ok(Value::Mapping(mapping))
    }

    fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<Value, A::Error> {
        // serde_norway hands a tagged node (`!tag value`) over as an enum whose variant is
        // the tag.
        let (tag, contents) = data.variant::<String>()?;
        if tag.is_empty() {
            return Err(de::Error::custom("empty YAML tag is not allowed"));
        }
        let value = de::VariantAccess::newtype_variant_seed(contents, self)?;
        Ok(Value::Tagged(Box::new(serde_yaml::value::TaggedValue {
            tag: serde_yaml::value::Tag::new(tag),
            value,
        })))
    }
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

/// A mapping key that repeats an earlier key of the same mapping.
struct Duplicate {
    /// Key path of the duplicate (the same as the first one's).
    path: Vec<Seg>,
    /// Where the duplicate key starts (1-based line, 1-based column).
    at: (usize, usize),
    /// Where the first key of that value starts.
    first: (usize, usize),
}

/// Where each key path's key and value start (1-based line, 1-based column), and every
/// duplicate mapping key.
#[derive(Default)]
struct LocationIndex {
    at: HashMap<Vec<Seg>, Where>,
    /// In file order.
    duplicates: Vec<Duplicate>,
}

/// An open collection during [`LocationIndex::build`]. `shadowed`: inside the value of a
/// duplicate key, which the loader discards: its positions are not indexed (the first
/// value's are), its own duplicates are still reported.
struct Frame {
    path: Vec<Seg>,
    shadowed: bool,
    kind: FrameKind,
}

enum FrameKind {
    Map {
        next_is_key: bool,
        /// Keys seen so far (as the loader compares them) and where each first appeared.
        keys: HashMap<Value, (usize, usize)>,
    },
    Seq {
        next: usize,
    },
}

/// A mapping key as serde_norway compares keys, for the scalars whose value is certain:
/// untagged plain scalars resolve as serde_norway resolves them (`~`, `null` and an empty key
/// are the same null, `0x10` and `16` the same number), quoted and block scalars are strings.
/// `None` (never reported as a duplicate) for tagged scalars.
fn key_identity(value: &str, style: ScalarStyle, tag: Option<&Cow<'_, Tag>>) -> Option<Value> {
    if tag.is_some() {
        return None;
    }
    match style {
        // The text of a plain scalar is a YAML document holding just that scalar.
        ScalarStyle::Plain => serde_yaml::from_str::<Value>(value).ok(),
        _ => Some(Value::String(value.to_string())),
    }
}

impl LocationIndex {
    /// Best effort: on a scan error the index built so far is kept (serde_norway already
    /// accepted the text, so this only happens on parser disagreements).
    fn build(text: &str) -> Self {
        let mut index = LocationIndex::default();
        let mut stack: Vec<Frame> = Vec::new();
        // Path of the last key read, and whether its value is shadowed.
        let mut current_key: Option<(Vec<Seg>, bool)> = None;
        let pos = |span: &Span| (span.start.line(), span.start.col() + 1);
        // Path of the node an event starts if it is a node in value position (`None`: it is
        // a mapping key), and whether it is shadowed.
        let node_path = |stack: &mut Vec<Frame>, current_key: &mut Option<(Vec<Seg>, bool)>| {
            let Some(frame) = stack.last_mut() else {
                return Some((Vec::new(), false));
            };
            match &mut frame.kind {
                FrameKind::Seq { next } => {
                    let mut p = frame.path.clone();
                    p.push(Seg::Index(*next));
                    *next += 1;
                    Some((p, frame.shadowed))
                }
                FrameKind::Map { next_is_key, .. } => {
                    if *next_is_key {
                        None
                    } else {
                        *next_is_key = true;
                        // No key path (a collection or alias as the key): not indexed.
                        Some(current_key.take().unwrap_or((Vec::new(), true)))
                    }
                }
            }
        };
        let set_value = |index: &mut LocationIndex, node: (Vec<Seg>, bool), at| {
            if !node.1 {
                index.at.entry(node.0).or_default().value.get_or_insert(at);
            }
        };
        for item in Parser::new_from_str(text) {
            let Ok((event, span)) = item else { break };
            match event {
                Event::Scalar(value, style, _, tag) => {
                    let at = pos(&span);
                    if let Some(Frame {
                        path,
                        shadowed,
                        kind:
                            FrameKind::Map {
                                next_is_key: next_is_key @ true,
                                keys,
                            },
                    }) = stack.last_mut()
                    {
                        *next_is_key = false;
                        let mut p = path.clone();
                        p.push(Seg::Key(value.to_string()));
                        let mut shadow = *shadowed;
                        if let Some(id) = key_identity(&value, style, tag.as_ref()) {
                            if let Some(first) = keys.get(&id) {
                                index.duplicates.push(Duplicate {
                                    path: p.clone(),
                                    at,
                                    first: *first,
                                });
                                shadow = true;
                            } else {
                                keys.insert(id, at);
                            }
                        }
                        if !shadow {
                            index.at.entry(p.clone()).or_default().key.get_or_insert(at);
                        }
                        current_key = Some((p, shadow));
                    } else if let Some(node) = node_path(&mut stack, &mut current_key) {
                        set_value(&mut index, node, at);
                    }
                }
                Event::Alias(_) => match node_path(&mut stack, &mut current_key) {
                    Some(node) => set_value(&mut index, node, pos(&span)),
                    // An alias as a mapping key: its value has no key path.
                    None => {
                        if let Some(Frame {
                            kind: FrameKind::Map { next_is_key, .. },
                            ..
                        }) = stack.last_mut()
                        {
                            *next_is_key = false;
                        }
                        current_key = None;
                    }
                },
                Event::MappingStart(..) | Event::SequenceStart(..) => {
                    let is_map = matches!(event, Event::MappingStart(..));
                    // A collection used as a mapping key: index its insides under a
                    // placeholder path that serde never reports.
                    let (path, shadowed) =
                        node_path(&mut stack, &mut current_key).unwrap_or_else(|| {
                            let shadowed = stack.last().is_some_and(|f| f.shadowed);
                            if let Some(Frame {
                                kind: FrameKind::Map { next_is_key, .. },
                                ..
                            }) = stack.last_mut()
                            {
                                *next_is_key = false;
                            }
                            current_key = None;
                            (vec![Seg::Key("?".to_string())], shadowed)
                        });
                    set_value(&mut index, (path.clone(), shadowed), pos(&span));
                    stack.push(Frame {
                        path,
                        shadowed,
                        kind: if is_map {
                            FrameKind::Map {
                                next_is_key: true,
                                keys: HashMap::new(),
                            }
                        } else {
                            FrameKind::Seq { next: 0 }
                        },
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

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Ab {
        a: u32,
        b: u32,
    }

    impl Validate for Ab {
        fn validate(&self, _: &mut Problems) {}
    }

    /// Any YAML: shows which keys the loader takes for the same key.
    impl Validate for Value {
        fn validate(&self, _: &mut Problems) {}
    }

    #[test]
    fn duplicate_key_is_reported_where_it_is() {
        let ok = from_str::<Ab>("f.yaml", "a: 1\nb: 2\n").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((ok.a, ok.b), (1, 2));
        let err = from_str::<Ab>("f.yaml", "a: 1\nb: 2\na: 3\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "f.yaml:3:1: a: duplicate key (first at 1:1)",
            "{err:#?}"
        );
    }

    #[test]
    fn every_duplicate_key_is_reported_with_the_other_problems() {
        let text = "\
listen:
  control: 127.0.0.1:7400
  metrics: 127.0.0.1:9470
  control: 127.0.0.1:7401
slots: 4
kind: soft
slots: 8
bogus: 1
slots: 16
agents:
  - id: a
    id: b
  - {id: c, id: d}
";
        let p = problems(text);
        assert_eq!(
            brief(&p),
            vec![
                (Some(4), Some(3), "listen.control"),
                (Some(7), Some(1), "slots"),
                (Some(8), Some(1), "bogus"),
                (Some(9), Some(1), "slots"),
                (Some(12), Some(5), "agents[0].id"),
                (Some(13), Some(13), "agents[1].id"),
            ],
            "{p:#?}"
        );
        let messages: Vec<_> = p.iter().map(|p| p.message.as_str()).collect();
        assert_eq!(messages[0], "duplicate key (first at 2:3)");
        assert_eq!(messages[1], "duplicate key (first at 5:1)");
        assert!(messages[2].contains("unknown field `bogus`"), "{p:#?}");
        assert_eq!(messages[3], "duplicate key (first at 5:1)");
        assert_eq!(messages[4], "duplicate key (first at 11:5)");
        assert_eq!(messages[5], "duplicate key (first at 13:6)");
    }

    #[test]
    fn first_of_duplicate_keys_is_the_one_checked() {
        // The first `listen` is the value deserialized (and found bad); positions of the
        // duplicate's insides do not replace the first one's.
        let text = "listen:\n  control: x\nlisten:\n  control: 127.0.0.1:1\n";
        let p = problems(text);
        assert_eq!(
            brief(&p),
            vec![
                (Some(2), Some(12), "listen.control"),
                (Some(3), Some(1), "listen")
            ],
            "{p:#?}"
        );
    }

    #[test]
    fn duplicate_keys_are_yaml_equal_keys() {
        // Same resolved key: plain, quoted and null spellings.
        let p = match from_str::<Value>("c.yaml", "a: 1\n'a': 2\n~: 3\nnull: 4\n0x10: 5\n16: 6\n") {
            Ok(v) => panic!("expected duplicates, got {v:?}"),
            Err(e) => e.problems,
        };
        let at: Vec<_> = p.iter().map(|p| (p.line, p.message.as_str())).collect();
        assert_eq!(
            at,
            vec![
                (Some(2), "duplicate key (first at 1:1)"),
                (Some(4), "duplicate key (first at 3:1)"),
                (Some(6), "duplicate key (first at 5:1)"),
            ],
            "{p:#?}"
        );
        // Different keys to YAML (a number and a string) are not duplicates.
        let v = from_str::<Value>("c.yaml", "1: a\n'1': b\ntrue: c\n'true': d\n")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(v.as_mapping().map(Mapping::len), Some(4));
    }

    #[test]
    fn duplicate_in_an_aliased_mapping_is_reported_once() {
        let p = match from_str::<Value>("c.yaml", "base: &b {x: 1, x: 2}\nother: *b\n") {
            Ok(v) => panic!("expected a duplicate, got {v:?}"),
            Err(e) => e.problems,
        };
        assert_eq!(brief(&p), vec![(Some(1), Some(17), "base.x")], "{p:#?}");
    }

    #[test]
    fn duplicate_keys_the_scan_cannot_tell_still_fail() {
        // A tagged key: the location pass does not resolve tags, serde_norway does.
        let err = from_str::<Value>("c.yaml", "!!str a: 1\na: 2\n").unwrap_err();
        assert_eq!(err.problems.len(), 1, "{err:#?}");
        assert!(err.problems[0].message.contains("duplicate"), "{err:#?}");
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
