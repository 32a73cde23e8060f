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
//! 4. [`Validate::validate`] runs the semantic checks (ranges, cross-field rules, files that
//!    must exist or be creatable) on the value that finally deserialized, even when earlier
//!    rounds found problems, so a file with four mistakes reports four: the checks see the
//!    offending keys at their defaults, and a semantic problem about a key (or a section
//!    around or inside it) that already has a problem is left out. Key paths map to lines
//!    the same way.
//!
//! Messages are in words for operators: `expected a whole number from 0 to 65535, found
//! 99999` rather than serde's `invalid value: integer 99999, expected u16`; an unknown key
//! says which key was probably meant (`unknown key; did you mean transport.soft.fault?`),
//! from the keys of its section or from [`Validate::renamed_keys`] for keys that moved.
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
//! assert!(
//!     text.contains("example.yaml:1:7: port: expected a whole number from 0 to 65535, found 99999"),
//!     "{text}"
//! );
//! assert!(
//!     text.contains("example.yaml:2:1: bogus: unknown key; the keys here are port, slots"),
//!     "{text}"
//! );
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

/// The start-up check both daemons run before anything else: the configuration as `loaded`
/// and the log filter of `log_level` (`--log-level`, else `RUST_LOG`, else the default).
/// Every problem of both is printed on stderr in one go, the configuration's followed by its
/// [`ConfigError::summary`]. Returns the configuration and the filter directives to start
/// logging with, or `None` when anything is wrong (the daemon then exits 2).
pub fn check_startup<T>(
    daemon: &str,
    loaded: Result<T, ConfigError>,
    log_level: Option<&str>,
) -> Option<(T, String)> {
    let env_filter = std::env::var("RUST_LOG").ok();
    let filter_source = if log_level.is_some_and(|l| !l.trim().is_empty()) {
        "--log-level"
    } else {
        "RUST_LOG"
    };
    let directives = crate::logging::choose_directives(log_level, env_filter.as_deref());
    let filter = crate::logging::filter(&directives);
    if let Err(e) = &loaded {
        eprintln!("{e}");
    }
    if let Err(e) = &filter {
        eprintln!("{daemon}: {filter_source}: {e}");
    }
    match (loaded, filter) {
        (Ok(config), Ok(_)) => Some((config, directives)),
        (loaded, _) => {
            if let Err(e) = loaded {
                eprintln!("{}", e.summary());
            }
            None
        }
    }
}

impl ConfigError {
    /// The line both daemons print after the problems:
    /// `FILE: invalid configuration (N problem[s])`.
    pub fn summary(&self) -> String {
        let n = self.problems.len();
        format!(
            "{}: invalid configuration ({n} problem{})",
            self.file.display(),
            if n == 1 { "" } else { "s" }
        )
    }
}

/// An OS error in words, without the `(os error N)` suffix.
fn os_reason(e: impl Into<std::io::Error>) -> String {
    let text = e.into().to_string();
    match text.find(" (os error ") {
        Some(at) => text[..at].to_string(),
        None => text,
    }
}

/// Whether this process may access `path` as `mode` says (access(2): the kernel's own
/// decision, ACLs and read-only mounts included).
fn may(path: &Path, mode: rustix::fs::Access) -> Result<(), String> {
    let path = if path.as_os_str().is_empty() {
        Path::new(".")
    } else {
        path
    };
    rustix::fs::access(path, mode).map_err(os_reason)
}

/// The nearest ancestor of `path` (itself excluded) that exists, `.` for a relative path
/// none of whose ancestors exist.
fn existing_ancestor(path: &Path) -> (PathBuf, Option<std::fs::Metadata>) {
    let mut dir = path.parent();
    while let Some(d) = dir {
        let d = if d.as_os_str().is_empty() {
            Path::new(".")
        } else {
            d
        };
        if let Ok(m) = std::fs::metadata(d) {
            return (d.to_path_buf(), Some(m));
        }
        dir = d.parent();
    }
    (PathBuf::from("."), std::fs::metadata(".").ok())
}

/// The error of `metadata` for a path that is not there (or under a file).
fn absent(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
    )
}

/// Checks, creating nothing, that this process could create `path` (a directory or file
/// that does not exist yet, with the directories above it): the nearest existing ancestor
/// must be a directory it may write to and enter.
fn check_creatable(path: &Path) -> Result<(), String> {
    use rustix::fs::Access;
    let (dir, meta) = existing_ancestor(path);
    match meta {
        Some(m) if m.is_dir() => may(&dir, Access::WRITE_OK | Access::EXEC_OK).map_err(|reason| {
            format!(
                "cannot create {}: {}: {reason}",
                path.display(),
                dir.display()
            )
        }),
        Some(_) => Err(format!(
            "cannot create {}: {} is not a directory",
            path.display(),
            dir.display()
        )),
        None => Err(format!("cannot create {}", path.display())),
    }
}

/// Checks, creating nothing, that `path` can be used as a directory this process keeps files
/// in: an existing directory it may read, write and enter, or one it could create (see the
/// daemons' `--check-config`).
///
/// # Errors
/// What stands in the way, in words, naming the path: `/var/lib/uctel-agent: Permission
/// denied`, `cannot create ./state: ./x is not a directory`.
pub fn check_directory(path: &Path) -> Result<(), String> {
    use rustix::fs::Access;
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => may(path, Access::READ_OK | Access::WRITE_OK | Access::EXEC_OK)
            .map_err(|reason| format!("{}: {reason}", path.display())),
        Ok(_) => Err(format!("{} is not a directory", path.display())),
        Err(e) if absent(&e) => check_creatable(path),
        Err(e) => Err(format!("{}: {}", path.display(), os_reason(e))),
    }
}

/// Checks, creating and changing nothing, that this process could append to the file `path`:
/// an existing file it may write, or one it could create.
///
/// # Errors
/// As [`check_directory`].
pub fn check_writable_file(path: &Path) -> Result<(), String> {
    use rustix::fs::Access;
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Err(format!(
            "{} is a directory; name a file in it",
            path.display()
        )),
        Ok(_) => {
            may(path, Access::WRITE_OK).map_err(|reason| format!("{}: {reason}", path.display()))
        }
        Err(e) if absent(&e) => check_creatable(path),
        Err(e) => Err(format!("{}: {}", path.display(), os_reason(e))),
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

    /// Keys that were spelt otherwise before, as `(old key path, new key path)`: an old key
    /// in a file is an unknown key whose message names the new one. Sequence items are
    /// written `[]` (`sources.logs[].file`).
    fn renamed_keys() -> &'static [(&'static str, &'static str)]
    where
        Self: Sized,
    {
        &[]
    }
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
    // Sequences an item was removed from: later items moved up, so semantic problems under
    // them would name the wrong index.
    let mut shifted: Vec<Vec<Seg>> = Vec::new();
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
                for (at, text) in unknown_key(&full, &value, &message, T::renamed_keys()) {
                    if rounds.should_report(&at) {
                        problems.push(index.problem(&at, Anchor::Key, text));
                    }
                }
                remove(&mut value, &full)
            }
            Kind::MissingField(name) => {
                let mut full = path.clone();
                full.push(Seg::Key(name));
                if rounds.should_report(&full) {
                    let key = render(&full);
                    let text = "required, but missing".to_string();
                    problems.push(index.problem_at(&path, &key, Anchor::Key, text));
                }
                rounds.fill(&mut value, &full)
            }
            Kind::Other if rounds.placeholders.contains_key(&path) => {
                // The placeholder put in for a missing key did not fit: try the next one.
                rounds.fill(&mut value, &path)
            }
            Kind::Other => {
                if rounds.should_report(&path) {
                    problems.push(index.problem(&path, Anchor::Value, in_words(&message)));
                }
                if let Some((Seg::Index(_), parent)) = path.split_last() {
                    shifted.push(parent.to_vec());
                }
                !path.is_empty() && remove(&mut value, &path)
            }
        };
        if !go_on {
            break;
        }
    }
    match parsed {
        Some(t) => {
            // The semantic checks run on what deserialized, the keys with problems at their
            // defaults; what they say about those keys (or sections around or inside them)
            // follows from problems already reported.
            let mut semantic = Problems::default();
            t.validate(&mut semantic);
            let related = |a: &[Seg], b: &[Seg]| a.starts_with(b) || b.starts_with(a);
            for (key, message) in semantic.items {
                let path = parse_path(&key);
                let known = rounds
                    .reported
                    .iter()
                    .chain(rounds.placeholders.keys())
                    .any(|r| related(&path, r))
                    || shifted.iter().any(|s| path.starts_with(s));
                if !known {
                    problems.push(index.problem_at(&path, &key, Anchor::Value, message));
                }
            }
            if problems.is_empty() {
                return Ok(t);
            }
        }
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

/// The texts between backticks in a serde message: ``unknown field `x`, expected `a` or `b` ``
/// gives `x`, `a`, `b`.
fn quoted_words(message: &str) -> Vec<&str> {
    message.split('`').skip(1).step_by(2).collect()
}

/// Edit distance (Levenshtein) between two key names.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (diagonal + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(above + 1);
            diagonal = above;
        }
    }
    row[b.len()]
}

/// The choice closest to `given` if it is close enough to be a misspelling of it.
fn closest<'a>(given: &str, choices: &[&'a str]) -> Option<&'a str> {
    choices
        .iter()
        .map(|c| (edit_distance(given, c), *c))
        .filter(|(d, c)| *d <= (given.chars().count().max(c.chars().count()) / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// `a`, `a or b`, `a, b or c`.
fn or_list(words: &[&str]) -> String {
    match words.split_last() {
        None => "nothing".to_string(),
        Some((last, [])) => (*last).to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

/// A key path with every sequence index written `[]`, as [`Validate::renamed_keys`] writes
/// them.
fn generic(path: &[Seg]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Seg::Index(_) => out.push_str("[]"),
        }
    }
    out
}

/// `new` (written with `[]`) with the indices of `path` put back in, in order.
fn with_indices(new: &str, path: &[Seg]) -> String {
    let mut indices = path.iter().filter_map(|s| match s {
        Seg::Index(i) => Some(*i),
        Seg::Key(_) => None,
    });
    let mut out = String::new();
    let mut rest = new;
    while let Some(at) = rest.find("[]") {
        out.push_str(&rest[..at]);
        match indices.next() {
            Some(i) => out.push_str(&format!("[{i}]")),
            None => out.push_str("[]"),
        }
        rest = &rest[at + 2..];
    }
    out.push_str(rest);
    out
}

/// The problems for the unknown key at `path` (serde's `message` lists the keys that are
/// known there): one naming the key meant, when a known key or a renamed one is close; for a
/// mapping that only exists in an old spelling (`transport.soft.udp:` holding `bind`), one
/// for each key inside it.
fn unknown_key(
    path: &[Seg],
    root: &Value,
    message: &str,
    renamed: &[(&str, &str)],
) -> Vec<(Vec<Seg>, String)> {
    let did_you_mean = |new: String| format!("unknown key; did you mean {new}?");
    let here = generic(path);
    if let Some((_, new)) = renamed.iter().find(|(old, _)| *old == here) {
        return vec![(path.to_vec(), did_you_mean(with_indices(new, path)))];
    }
    let inside = format!("{here}.");
    if renamed.iter().any(|(old, _)| old.starts_with(&inside)) {
        let mut leaves = Vec::new();
        if let Some(v) = node(root, path) {
            mapping_leaves(v, path.to_vec(), &mut leaves);
        }
        if !leaves.is_empty() {
            return leaves
                .into_iter()
                .map(|leaf| {
                    let text = match renamed.iter().find(|(old, _)| *old == generic(&leaf)) {
                        Some((_, new)) => did_you_mean(with_indices(new, &leaf)),
                        None => "unknown key".to_string(),
                    };
                    (leaf, text)
                })
                .collect();
        }
    }
    let words = quoted_words(message);
    let (given, known) = match words.split_first() {
        Some((given, known)) => (*given, known),
        None => ("", &[][..]),
    };
    let parent = path.split_last().map_or(&[][..], |(_, p)| p);
    let text = if let Some(meant) = closest(given, known) {
        let mut p = parent.to_vec();
        p.push(Seg::Key(meant.to_string()));
        did_you_mean(render(&p))
    } else if known.is_empty() {
        "unknown key; this section takes no keys".to_string()
    } else {
        format!("unknown key; the keys here are {}", known.join(", "))
    };
    vec![(path.to_vec(), text)]
}

/// The key paths of the scalars and sequences inside the mapping `v` (at `path`).
fn mapping_leaves(v: &Value, path: Vec<Seg>, out: &mut Vec<Vec<Seg>>) {
    match v {
        Value::Mapping(m) if !m.is_empty() => {
            for (k, child) in m {
                let name = match k {
                    Value::String(s) => s.clone(),
                    Value::Number(n) => n.to_string(),
                    Value::Bool(b) => b.to_string(),
                    _ => continue,
                };
                let mut p = path.clone();
                p.push(Seg::Key(name));
                mapping_leaves(child, p, out);
            }
        }
        Value::Tagged(t) => mapping_leaves(&t.value, path, out),
        _ => out.push(path),
    }
}

/// serde's `expected ...` in words.
fn expected_in_words(expected: &str) -> String {
    let whole = |min: i128, max: i128| format!("a whole number from {min} to {max}");
    match expected {
        "u8" => whole(0, u8::MAX.into()),
        "u16" => whole(0, u16::MAX.into()),
        "u32" => whole(0, u32::MAX.into()),
        "u64" => whole(0, u64::MAX.into()),
        "usize" => whole(0, usize::MAX as i128),
        "i8" => whole(i8::MIN.into(), i8::MAX.into()),
        "i16" => whole(i16::MIN.into(), i16::MAX.into()),
        "i32" => whole(i32::MIN.into(), i32::MAX.into()),
        "i64" => whole(i64::MIN.into(), i64::MAX.into()),
        "isize" => whole(isize::MIN as i128, isize::MAX as i128),
        "f32" | "f64" => "a number".to_string(),
        "a boolean" => "true or false".to_string(),
        "a string" | "a borrowed string" | "path string" | "a character" => "text".to_string(),
        "socket address" => "an address IP:PORT".to_string(),
        "IP address" => "an IP address".to_string(),
        "a sequence" => "a list".to_string(),
        "unit" => "nothing (null)".to_string(),
        e if e == "a map" || e.starts_with("struct ") => "a mapping of keys".to_string(),
        e => e.to_string(),
    }
}

/// serde's description of the value found, in words.
fn found_in_words(found: &str) -> String {
    let quoted = |prefix: &str| {
        found
            .strip_prefix(prefix)
            .map(|rest| rest.trim_matches('`').to_string())
    };
    if let Some(text) = found.strip_prefix("string ") {
        return format!("the text {text}");
    }
    for prefix in ["integer ", "floating point ", "boolean "] {
        if let Some(v) = quoted(prefix) {
            return v;
        }
    }
    if let Some(c) = quoted("character ") {
        return format!("the text {c:?}");
    }
    match found {
        "unit value" => "nothing (null)".to_string(),
        "sequence" => "a list".to_string(),
        "map" => "a mapping".to_string(),
        f => f.to_string(),
    }
}

/// A serde type or value error in words for operators: ``invalid type: string "x", expected
/// u32`` is `expected a whole number from 0 to 4294967295, found the text "x"`. Messages not
/// from serde (a `deserialize_with` function's own) are returned as they are.
fn in_words(message: &str) -> String {
    let body = message
        .strip_prefix("invalid type: ")
        .or_else(|| message.strip_prefix("invalid value: "));
    if let Some((found, expected)) = body.and_then(|b| b.rsplit_once(", expected ")) {
        return format!(
            "expected {}, found {}",
            expected_in_words(expected),
            found_in_words(found)
        );
    }
    if message.starts_with("unknown variant `") {
        let words = quoted_words(message);
        if let Some((given, choices)) = words.split_first() {
            let hint = closest(given, choices)
                .map(|c| format!("; did you mean {c}?"))
                .unwrap_or_default();
            return format!("expected {}, found {given}{hint}", or_list(choices));
        }
    }
    if let Some(rest) = message.strip_prefix("invalid length ") {
        if let Some((len, expected)) = rest.split_once(", expected ") {
            return format!("expected {expected}, found {len} items");
        }
    }
    message.to_string()
}

/// Follows `path` from `root` (through tags), returning the node.
fn node<'a>(root: &'a Value, path: &[Seg]) -> Option<&'a Value> {
    let mut cur = root;
    for seg in path {
        while let Value::Tagged(t) = cur {
            cur = &t.value;
        }
        cur = match (seg, cur) {
            (Seg::Key(name), Value::Mapping(m)) => m
                .iter()
                .find(|(k, _)| key_matches(k, name))
                .map(|(_, v)| v)?,
            (Seg::Index(i), Value::Sequence(s)) => s.get(*i)?,
            _ => return None,
        };
    }
    Some(cur)
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

pub mod reference;

/// This file's text, for [`reference`]: the doc comments of [`FaultSection`] are the
/// descriptions of `transport.soft.fault.*` in both daemons' references.
pub const SOURCE: &str = include_str!("config.rs");

/// `transport.soft.fault`, the same section in both daemons: seeded fault injection on the
/// soft transport's UDP datagrams, for labs and demos (the daemons turn it into the
/// transport's `FaultConfig`). Every fault is off by default.
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct FaultSection {
    /// Probability that a datagram is dropped.
    pub drop_ratio: f64,
    /// Probability that a datagram is sent twice.
    pub duplicate_ratio: f64,
    /// Probability that a datagram is held back and released after 1 to `reorder_window`
    /// later datagrams; needs `reorder_window` above 0.
    pub reorder_ratio: f64,
    /// Most later datagrams a held-back datagram waits for; 0 turns reordering off.
    pub reorder_window: usize,
    /// Probability that one random bit of a datagram's payload is flipped (the ICRC check
    /// then drops it at the receiver).
    pub corrupt_ratio: f64,
    /// Delay added to every datagram; 0 is none.
    pub delay_milliseconds: u64,
    /// Seed of the fault generator: the same seed gives the same faults.
    pub seed: u64,
    /// Which datagrams the faults apply to.
    pub direction: FaultDirection,
}

/// `transport.soft.fault.direction`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultDirection {
    /// The datagrams this daemon sends.
    #[default]
    Send,
    /// The datagrams this daemon receives.
    Recv,
    /// Both (a datagram meets the faults once each way it takes).
    Both,
}

impl From<FaultDirection> for uctel_transport::soft::fault::FaultDirection {
    fn from(d: FaultDirection) -> Self {
        match d {
            FaultDirection::Send => Self::Send,
            FaultDirection::Recv => Self::Recv,
            FaultDirection::Both => Self::Both,
        }
    }
}

impl From<uctel_transport::soft::fault::FaultDirection> for FaultDirection {
    fn from(d: uctel_transport::soft::fault::FaultDirection) -> Self {
        use uctel_transport::soft::fault::FaultDirection as D;
        match d {
            D::Send => Self::Send,
            D::Recv => Self::Recv,
            D::Both => Self::Both,
        }
    }
}

/// The transport's fault injector configuration of a `transport.soft.fault` section.
impl From<&FaultSection> for uctel_transport::soft::fault::FaultConfig {
    fn from(f: &FaultSection) -> Self {
        Self {
            drop_ratio: f.drop_ratio,
            duplicate_ratio: f.duplicate_ratio,
            reorder_ratio: f.reorder_ratio,
            reorder_window: f.reorder_window,
            corrupt_ratio: f.corrupt_ratio,
            delay_ms: f.delay_milliseconds,
            seed: f.seed,
            direction: f.direction.into(),
        }
    }
}

/// The `transport.soft.fault` section of a transport fault injector configuration.
impl From<&uctel_transport::soft::fault::FaultConfig> for FaultSection {
    fn from(f: &uctel_transport::soft::fault::FaultConfig) -> Self {
        Self {
            drop_ratio: f.drop_ratio,
            duplicate_ratio: f.duplicate_ratio,
            reorder_ratio: f.reorder_ratio,
            reorder_window: f.reorder_window,
            corrupt_ratio: f.corrupt_ratio,
            delay_milliseconds: f.delay_ms,
            seed: f.seed,
            direction: f.direction.into(),
        }
    }
}

/// Keys both daemons spelt otherwise before, for [`Validate::renamed_keys`].
pub const RENAMED_SOFT_KEYS: &[(&str, &str)] = &[
    ("transport.soft.faults", "transport.soft.fault"),
    (
        "transport.soft.fault.delay_ms",
        "transport.soft.fault.delay_milliseconds",
    ),
    ("transport.soft.udp.bind", "transport.soft.bind"),
];

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
        assert_eq!(
            p[1].message, "unknown key; the keys here are control, metrics",
            "{p:#?}"
        );
        assert_eq!(p[2].message, "expected soft or verbs, found rdma", "{p:#?}");
        assert_eq!(
            p[3].message, "expected a whole number from 0 to 4294967295, found the text \"many\"",
            "{p:#?}"
        );
        assert_eq!(
            p[4].message, "unknown key; did you mean agents[0].token_file?",
            "{p:#?}"
        );
    }

    #[test]
    fn missing_section_reported_and_rest_still_checked() {
        let p = problems("slots: x\nagents:\n  - {}\n");
        let keys: Vec<_> = p.iter().map(|p| p.key_path.as_str()).collect();
        assert_eq!(keys, vec!["listen", "slots", "agents[0].id"], "{p:#?}");
        assert_eq!(p[0].message, "required, but missing");
        // A missing key of the root has no better line than the document start.
        assert_eq!(p[0].line, Some(1));
        assert_eq!(p[2].line, Some(3));
    }

    #[test]
    fn structural_and_semantic_problems_are_reported_together() {
        // Two mistakes serde finds and two only the semantic checks find: all four at once,
        // not the second two after the first two are fixed.
        let text = "\
listen:
  control: 127.0.0.1:1
  bogus: 1
slots: 12
kind: rdma
agents:
  - id: ''
";
        let p = problems(text);
        assert_eq!(
            brief(&p),
            vec![
                (Some(3), Some(3), "listen.bogus"),
                (Some(4), Some(8), "slots"),
                (Some(5), Some(7), "kind"),
                (Some(7), Some(9), "agents[0].id"),
            ],
            "{p:#?}"
        );
    }

    #[test]
    fn semantic_problems_about_keys_with_problems_are_left_out() {
        // `slots` is of the wrong type: the check that it is a power of two would be about
        // its default, and an agent whose `id` is missing gets no "must not be empty".
        let p = problems("listen:\n  control: 127.0.0.1:1\nslots: many\nagents:\n  - {}\n");
        let keys: Vec<_> = p.iter().map(|p| p.key_path.as_str()).collect();
        assert_eq!(keys, vec!["slots", "agents[0].id"], "{p:#?}");
    }

    #[test]
    fn type_and_range_errors_are_in_words() {
        #[derive(Debug, Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Types {
            #[serde(default)]
            port: u16,
            #[serde(default)]
            ratio: f64,
            #[serde(default)]
            on: bool,
            #[serde(default)]
            name: String,
            #[serde(default)]
            list: Vec<u8>,
            #[serde(default)]
            delta: Option<i32>,
        }
        impl Validate for Types {
            fn validate(&self, _: &mut Problems) {}
        }
        let text = "port: -1\nratio: x\non: 3\nname: [1]\nlist: {a: 1}\ndelta: 1.5\n";
        let err = from_str::<Types>("t.yaml", text).unwrap_err();
        let messages: Vec<_> = err.problems.iter().map(|p| p.message.as_str()).collect();
        assert_eq!(
            messages,
            vec![
                "expected a whole number from 0 to 65535, found -1",
                "expected a number, found the text \"x\"",
                "expected true or false, found 3",
                "expected text, found a list",
                "expected a list, found a mapping",
                "expected a whole number from -2147483648 to 2147483647, found 1.5",
            ],
            "{err}"
        );
        for m in &messages {
            assert!(
                !m.contains("expected u") && !m.contains("expected i"),
                "{m}"
            );
        }
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Soft {
        #[serde(default)]
        bind: Option<String>,
        #[serde(default)]
        fault: Option<Value>,
        #[serde(default)]
        mtu_bytes: u32,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Moved {
        soft: Soft,
        #[serde(default)]
        logs: Vec<Soft>,
    }

    impl Validate for Moved {
        fn validate(&self, _: &mut Problems) {}

        fn renamed_keys() -> &'static [(&'static str, &'static str)] {
            &[
                ("soft.udp.bind", "soft.bind"),
                ("logs[].udp.bind", "logs[].bind"),
            ]
        }
    }

    #[test]
    fn unknown_keys_name_the_key_meant() {
        let text = "\
soft:
  faults:
    drop_ratio: 0.1
  udp:
    bind: 127.0.0.1:1
    batch: 4
  mtu: 1024
  colour: red
logs:
  - udp: {bind: 127.0.0.1:2}
";
        let err = from_str::<Moved>("m.yaml", text).unwrap_err();
        let got: Vec<_> = err
            .problems
            .iter()
            .map(|p| (p.line, p.key_path.as_str(), p.message.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    Some(2),
                    "soft.faults",
                    "unknown key; did you mean soft.fault?"
                ),
                (
                    Some(5),
                    "soft.udp.bind",
                    "unknown key; did you mean soft.bind?"
                ),
                (Some(6), "soft.udp.batch", "unknown key"),
                (
                    Some(7),
                    "soft.mtu",
                    "unknown key; the keys here are bind, fault, mtu_bytes"
                ),
                (
                    Some(8),
                    "soft.colour",
                    "unknown key; the keys here are bind, fault, mtu_bytes"
                ),
                (
                    Some(10),
                    "logs[0].udp.bind",
                    "unknown key; did you mean logs[0].bind?"
                ),
            ],
            "{err}"
        );
    }

    #[test]
    fn summary_counts_the_problems() {
        let err = from_str::<Cfg>("c.yaml", "a: 1\n").unwrap_err();
        assert_eq!(err.summary(), "c.yaml: invalid configuration (2 problems)");
        let err = from_str::<Cfg>("c.yaml", "listen:\n  control: x\n").unwrap_err();
        assert_eq!(err.summary(), "c.yaml: invalid configuration (1 problem)");
    }

    /// A fresh directory under the system's temporary directory, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new() -> TempDir {
            use std::sync::atomic::{AtomicU32, Ordering};
            static NEXT: AtomicU32 = AtomicU32::new(0);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let p = std::env::temp_dir().join(format!("uctel-config-{}-{n}", std::process::id()));
            std::fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }

        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(
                self.0.join("locked"),
                std::fs::Permissions::from_mode(0o700),
            );
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn directories_and_files_are_checked_without_creating_them() {
        let dir = TempDir::new();
        let file = dir.path().join("f");
        std::fs::write(&file, "x").unwrap();
        assert_eq!(check_directory(dir.path()), Ok(()));
        assert_eq!(check_directory(&dir.path().join("a/b/c")), Ok(()));
        assert!(!dir.path().join("a").exists());
        let under_file = file.join("state");
        assert_eq!(
            check_directory(&under_file),
            Err(format!(
                "cannot create {}: {} is not a directory",
                under_file.display(),
                file.display()
            ))
        );
        assert_eq!(
            check_directory(&file),
            Err(format!("{} is not a directory", file.display()))
        );
        assert_eq!(check_writable_file(&file), Ok(()));
        assert_eq!(
            check_writable_file(&dir.path().join("new/log.jsonl")),
            Ok(())
        );
        assert!(check_writable_file(dir.path())
            .unwrap_err()
            .ends_with("is a directory; name a file in it"));
        assert!(check_writable_file(&under_file.join("x"))
            .unwrap_err()
            .ends_with("is not a directory"));
        // A relative path is checked from the working directory.
        assert_eq!(
            check_directory(Path::new("uctel-surely-absent/state")),
            Ok(())
        );
        // Without write permission (root may write anywhere, so only as another user).
        use std::os::unix::fs::PermissionsExt;
        let locked = dir.path().join("locked");
        std::fs::create_dir(&locked).unwrap();
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o500)).unwrap();
        if rustix::fs::access(&locked, rustix::fs::Access::WRITE_OK).is_err() {
            let want = format!(
                "cannot create {}: {}: Permission denied",
                locked.join("state").display(),
                locked.display()
            );
            assert_eq!(check_directory(&locked.join("state")), Err(want));
            assert!(check_directory(&locked).is_err());
        }
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
            lines[1].starts_with("dir/c.yaml:3:1: foo: unknown key; the keys here are "),
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
        assert!(messages[2].starts_with("unknown key"), "{p:#?}");
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
