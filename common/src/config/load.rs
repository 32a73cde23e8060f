//! Loading in rounds ([`load`], [`from_str`]): the YAML value (first of repeated keys kept),
//! then deserialization rounds that record a problem, remove the offending key or put a
//! placeholder in for a missing one, and go on, then the [`Validate`] checks; see the parent
//! module's documentation for the rules.

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::Path;

use serde::de::{self, DeserializeOwned, DeserializeSeed, IgnoredAny, Visitor};
use serde_yaml::{Mapping, Value};

use super::keypath::{move_to_end, parse_path, remove, render, segments, set, Seg};
use super::locations::{Anchor, LocationIndex};
use super::words::{in_words, unknown_key};
use super::{ConfigError, Problem, Problems, Validate};

/// Upper bound on deserialization rounds (one problem is found per round).
pub const MAX_ROUNDS: usize = 128;

/// Reads and loads `path`. Errors: unreadable file (one problem without a line), YAML syntax,
/// deserialization and [`Validate`] problems, all reported together.
pub fn load<T: DeserializeOwned + Validate>(path: &Path) -> Result<T, ConfigError> {
    load_with(path, |_| {})
}

/// [`load`] with `prepare` applied to the parsed YAML document before it is deserialized
/// and checked: a value the command line gives in the place of a key (`--agent-id`) is then
/// deserialized and checked as the file's own would be, and a key it supplies is no longer
/// missing.
///
/// # Errors
/// As [`load`].
pub fn load_with<T: DeserializeOwned + Validate>(
    path: &Path,
    prepare: impl FnOnce(&mut Value),
) -> Result<T, ConfigError> {
    match std::fs::read_to_string(path) {
        Ok(text) => from_str_with(path, &text, prepare),
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
    from_str_with(file, text, |_| {})
}

/// [`from_str`] with `prepare` applied to the parsed document first (see [`load_with`]).
///
/// # Errors
/// As [`from_str`].
pub fn from_str_with<T: DeserializeOwned + Validate>(
    file: impl AsRef<Path>,
    text: &str,
    prepare: impl FnOnce(&mut Value),
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
    prepare(&mut value);
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

    /// What `prepare` puts in the document (a command-line value in the place of a key) is
    /// deserialized as if the file had it: a required key it supplies is not missing, and
    /// the file's other problems are still reported.
    #[test]
    fn prepare_supplies_a_key_before_deserialization() {
        let set = |doc: &mut Value| {
            if let Value::Mapping(m) = doc {
                m.insert("a".into(), 1.into());
            }
        };
        let ab: Ab = from_str_with("x.yaml", "b: 2\n", set).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((ab.a, ab.b), (1, 2));
        let e = from_str::<Ab>("x.yaml", "b: 2\n")
            .err()
            .unwrap_or_else(|| panic!("a is required"));
        assert_eq!(e.problems[0].message, "required, but missing");
        let e = from_str_with::<Ab>("x.yaml", "b: nope\n", set)
            .err()
            .unwrap_or_else(|| panic!("b: nope accepted"));
        assert_eq!(e.problems.len(), 1, "{e}");
        assert_eq!(e.problems[0].key_path, "b");
    }
}
