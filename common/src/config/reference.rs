//! A configuration reference generated from the config types themselves, so that it cannot
//! drift from what the daemons accept: `docs/configuration.md` and both daemons'
//! `--print-default-config`.
//!
//! Where each part comes from:
//!
//! - **keys and types**: the type's own `Deserialize` implementation, driven by a tracing
//!   deserializer ([`trace`]) that records what each key asks for (`deserialize_struct` names
//!   a section's keys, `deserialize_u32` a whole number, `deserialize_enum` the choices, ...).
//!   A key that serde accepts is a key here, with the type serde checks.
//! - **units**: the key's suffix (`_seconds`, `_bytes`, ...), the project's rule (DESIGN.md §9).
//! - **defaults**: the type's `Default`/`#[serde(default)]` values, serialized back: a
//!   `minimal` document of the required keys is deserialized and serialized; a key is
//!   required when leaving it out of that document fails with "missing field".
//! - **descriptions**: the `///` doc comments of the struct fields and enum variants, read
//!   from the Rust source (`include_str!` of the config modules), so the reference says what
//!   the code's documentation says.
//! - **examples**: the YAML block in the daemon's config module docs (```` ```yaml ````),
//!   which the tests deserialize strictly, so every example is a value the daemon takes.
//!
//! # Layout
//!
//! - `tracer`: the model, [`Shape`] and [`Node`], and [`trace`], which builds it.
//! - `docs`: [`Docs`], [`plain`] and [`module_yaml`], the descriptions and examples.
//! - this module: [`Reference`] (one daemon's keys, with their docs, defaults and examples)
//!   and its renderings ([`Reference::markdown`], [`Reference::default_yaml`], [`markdown`]).

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_yaml::Value;

mod docs;
mod tracer;

pub use docs::{module_yaml, plain, Docs};
pub use tracer::{trace, Node, Shape};

/// One key of the reference.
#[derive(Clone, Debug)]
pub struct Entry {
    /// Dotted key path, sequence items as `[]`: `sources.logs[].path`.
    pub key: String,
    /// What it holds.
    pub node: Node,
    /// Its description (doc comment, rustdoc links made plain), with the choices of an enum.
    pub doc: String,
    /// True when the key has no default.
    pub required: bool,
    /// Its default (`None` when required).
    pub default: Option<Value>,
    /// Its value in the module docs' example, if there.
    pub example: Option<Value>,
}

/// The reference of one daemon's configuration.
#[derive(Clone, Debug)]
pub struct Reference {
    /// The binary, `uctel-agent`.
    pub daemon: &'static str,
    /// The traced tree.
    pub root: Node,
    /// Every key in file order (sections before their keys).
    pub entries: Vec<Entry>,
}

/// Where the parts of a [`Reference`] come from.
#[derive(Clone, Copy, Debug)]
pub struct Sources {
    /// The binary, `uctel-agent`.
    pub daemon: &'static str,
    /// The Rust sources of the config types, the daemon's config module first (its module
    /// docs hold the example).
    pub rust: &'static [&'static str],
    /// A document with the required keys (and one item in each list, one value in each
    /// optional section, so that their keys have defaults too).
    pub minimal: &'static str,
}

fn key_of(path: &[String]) -> String {
    let mut out = String::new();
    for p in path {
        if p == "[]" {
            out.push_str("[]");
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(p);
        }
    }
    out
}

/// The value at `path`, the first item of each sequence.
fn at<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, p| {
        if p == "[]" {
            v.as_sequence()?.first()
        } else {
            v.as_mapping()?.get(Value::String(p.clone()))
        }
    })
}

/// Removes the value at `path` (the first item of each sequence on the way). False if absent.
fn remove_at(v: &mut Value, path: &[String]) -> bool {
    let Some((last, parents)) = path.split_last() else {
        return false;
    };
    let mut node = v;
    for p in parents {
        let next = if p == "[]" {
            node.as_sequence_mut().and_then(|s| s.first_mut())
        } else {
            node.as_mapping_mut()
                .and_then(|m| m.get_mut(Value::String(p.clone())))
        };
        match next {
            Some(n) => node = n,
            None => return false,
        }
    }
    if last == "[]" {
        return false;
    }
    node.as_mapping_mut()
        .and_then(|m| m.remove(Value::String(last.clone())))
        .is_some()
}

fn round_trip<T: DeserializeOwned + Serialize>(v: Value) -> Result<Value, String> {
    let t: T = serde_yaml::from_value(v).map_err(|e| e.to_string())?;
    serde_yaml::to_value(&t).map_err(|e| e.to_string())
}

impl Reference {
    /// Builds the reference of `T`.
    ///
    /// # Panics
    /// If `sources.minimal` is not YAML or does not deserialize into `T`, or `T`'s values
    /// cannot be serialized: programming errors the reference tests catch.
    pub fn new<T: DeserializeOwned + Serialize>(sources: Sources) -> Reference {
        let root = trace::<T>();
        let docs = Docs::parse(sources.rust);
        let example_text = sources
            .rust
            .first()
            .map(|s| module_yaml(s))
            .unwrap_or_default();
        let example: Value = serde_yaml::from_str(&example_text).unwrap_or(Value::Null);
        let minimal: Value = serde_yaml::from_str(sources.minimal)
            .unwrap_or_else(|e| panic!("{}: minimal document: {e}", sources.daemon));
        let defaults = round_trip::<T>(minimal.clone())
            .unwrap_or_else(|e| panic!("{}: minimal document: {e}", sources.daemon));
        let mut entries = Vec::new();
        let mut walk = Walk {
            docs: &docs,
            example: &example,
            minimal: &minimal,
            defaults: &defaults,
            entries: &mut entries,
            round_trip: &round_trip::<T>,
        };
        walk.section(&root, &mut Vec::new());
        Reference {
            daemon: sources.daemon,
            root,
            entries,
        }
    }

    /// The entry of `key` (`sources.logs[].path`).
    pub fn entry(&self, key: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.key == key)
    }

    /// The complete default configuration as commented YAML: every key with its default
    /// (required keys with their example), its description as a comment; optional sections
    /// that are off by default and list items are shown commented out.
    pub fn default_yaml(&self) -> String {
        let mut out = format!(
            "# {} configuration: every key at its default, described as in \
             docs/configuration.md.\n# Keys marked (required) have no default: the value \
             shown is an example;\n# sections marked (required: ...) need what they name before \
             --check-config accepts the file.\n",
            self.daemon
        );
        self.yaml_fields(&self.root, &mut Vec::new(), 0, false, false, &mut out);
        out
    }

    /// Writes the keys of the section `node` at `path`. `commented`: as comments (a section
    /// that is off by default, a list item); `item`: the keys of a list item, the first one
    /// carrying the item's `- `.
    fn yaml_fields(
        &self,
        node: &Node,
        path: &mut Vec<String>,
        indent: usize,
        commented: bool,
        item: bool,
        out: &mut String,
    ) {
        let Shape::Section { fields, .. } = &node.shape else {
            return;
        };
        for (i, (field, child)) in fields.iter().enumerate() {
            path.push((*field).to_string());
            if let Some(e) = self.entry(&key_of(path)) {
                let (spaces, dash) = if item && i == 0 {
                    (" ".repeat(indent.saturating_sub(2)), "- ")
                } else {
                    (" ".repeat(indent), "")
                };
                let line = |out: &mut String, commented: bool, rest: String| {
                    let hash = if commented { "# " } else { "" };
                    out.push_str(&format!("{spaces}{hash}{dash}{rest}\n"));
                };
                if indent == 0 {
                    out.push('\n');
                }
                let mut doc = e.doc.clone();
                if e.required {
                    doc.push_str(" (required)");
                }
                for text in wrap(&doc, 96usize.saturating_sub(indent + 2).max(40)) {
                    out.push_str(&format!("{}# {text}\n", " ".repeat(indent)));
                }
                match &child.shape {
                    Shape::Section { .. } => {
                        let off = e.default.as_ref().is_some_and(Value::is_null);
                        line(out, commented || off, format!("{field}:"));
                        self.yaml_fields(child, path, indent + 2, commented || off, false, out);
                    }
                    Shape::List(it) if matches!(it.shape, Shape::Section { .. }) => {
                        let value = e.default.clone().unwrap_or(Value::Sequence(Vec::new()));
                        line(out, commented, format!("{field}: {}", flow(&value)));
                        out.push_str(&format!(
                            "{}# An item has these keys:\n",
                            " ".repeat(indent + 2)
                        ));
                        path.push("[]".to_string());
                        self.yaml_fields(it, path, indent + 4, true, true, out);
                        path.pop();
                    }
                    _ => {
                        let value = if e.required {
                            e.example.clone()
                        } else {
                            e.default.clone()
                        };
                        match (value, &e.example) {
                            (Some(Value::Null) | None, Some(ex)) if !e.required => {
                                line(out, true, format!("{field}: {}", flow(ex)));
                            }
                            (v, _) => {
                                let v = v.unwrap_or(Value::Null);
                                line(out, commented, format!("{field}: {}", flow(&v)));
                            }
                        }
                    }
                }
            }
            path.pop();
        }
    }

    /// This daemon's part of `docs/configuration.md`: a table of every key, then the default
    /// configuration.
    pub fn markdown(&self) -> String {
        let mut out = format!(
            "## {d}\n\nEvery key of `{d}`'s configuration file. Keys of a list item are written \
             `list[].key`. Units are in the key names. `{d} --print-default-config` prints the \
             complete default configuration shown at the end.\n\n\
             | Key | Type | Default | Example | Description |\n|---|---|---|---|---|\n",
            d = self.daemon
        );
        for e in &self.entries {
            let section = matches!(e.node.shape, Shape::Section { .. });
            let key = if section {
                format!("**`{}`**", e.key)
            } else {
                format!("`{}`", e.key)
            };
            let default = match (&e.default, e.required) {
                (_, true) => "required".to_string(),
                _ if section => String::new(),
                (Some(v), false) => format!("`{}`", flow(v)),
                (None, false) => String::new(),
            };
            let list_of_sections = matches!(
                &e.node.shape,
                Shape::List(item) if matches!(item.shape, Shape::Section { .. })
            );
            let example = match &e.example {
                Some(v) if !section && !list_of_sections => format!("`{}`", flow(v)),
                _ => String::new(),
            };
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} |\n",
                key,
                cell(&type_words(&e.node, &e.key)),
                cell(&default),
                cell(&example),
                cell(&e.doc)
            ));
        }
        out.push_str(&format!(
            "\n### Default configuration of {}\n\n```yaml\n{}```\n",
            self.daemon,
            self.default_yaml()
        ));
        out
    }

    /// Keys without a description, for the tests.
    pub fn undocumented(&self) -> Vec<&str> {
        self.entries
            .iter()
            .filter(|e| e.doc.trim().is_empty())
            .map(|e| e.key.as_str())
            .collect()
    }
}

/// Walks the traced tree collecting [`Entry`]s.
struct Walk<'a> {
    docs: &'a Docs,
    example: &'a Value,
    minimal: &'a Value,
    defaults: &'a Value,
    entries: &'a mut Vec<Entry>,
    round_trip: &'a dyn Fn(Value) -> Result<Value, String>,
}

impl Walk<'_> {
    fn section(&mut self, node: &Node, path: &mut Vec<String>) {
        let Shape::Section { name, fields } = &node.shape else {
            return;
        };
        for (field, child) in fields {
            path.push((*field).to_string());
            let mut doc = self.docs.member(name, field).map(plain).unwrap_or_default();
            if doc.is_empty() {
                if let Shape::Section { name, .. } = &child.shape {
                    doc = self.docs.of_type(name).map(plain).unwrap_or_default();
                }
            }
            let choices = match &child.shape {
                Shape::Choice { name, variants } => Some((name, variants)),
                Shape::List(item) => match &item.shape {
                    Shape::Choice { name, variants } => Some((name, variants)),
                    _ => None,
                },
                _ => None,
            };
            if let Some((ty, variants)) = choices {
                let described: Vec<String> = variants
                    .iter()
                    .map(|v| match self.docs.member(ty, v).map(plain) {
                        Some(d) if !d.is_empty() => format!("`{v}`: {d}"),
                        _ => format!("`{v}`"),
                    })
                    .collect();
                doc = format!("{doc} {}", described.join(" ")).trim().to_string();
            }
            let (required, default) = self.default_of(path);
            self.entries.push(Entry {
                key: key_of(path),
                node: child.clone(),
                doc,
                required,
                default,
                example: at(self.example, path).cloned(),
            });
            match &child.shape {
                Shape::Section { .. } => self.section(child, path),
                Shape::List(item) if matches!(item.shape, Shape::Section { .. }) => {
                    path.push("[]".to_string());
                    self.section(item, path);
                    path.pop();
                }
                _ => {}
            }
            path.pop();
        }
    }

    /// (required, default) of the key at `path`.
    fn default_of(&self, path: &[String]) -> (bool, Option<Value>) {
        if at(self.minimal, path).is_some() {
            let mut without = self.minimal.clone();
            remove_at(&mut without, path);
            return match (self.round_trip)(without) {
                Ok(v) => (false, at(&v, path).cloned()),
                Err(e) if e.contains("missing field") => (true, None),
                Err(_) => (false, None),
            };
        }
        (false, at(self.defaults, path).cloned())
    }
}

/// A value on one line, YAML flow style.
pub fn flow(v: &Value) -> String {
    match v {
        Value::Null => "null".to_string(),
        Value::Sequence(s) => format!("[{}]", s.iter().map(flow).collect::<Vec<_>>().join(", ")),
        Value::Mapping(m) => format!(
            "{{{}}}",
            m.iter()
                .map(|(k, v)| format!("{}: {}", flow(k), flow(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Value::Tagged(t) => flow(&t.value),
        scalar => serde_yaml::to_string(scalar)
            .map(|s| s.trim_end().to_string())
            .unwrap_or_default(),
    }
}

/// The unit of a key, from its suffix.
fn unit(key: &str) -> Option<&'static str> {
    let last = key.rsplit(['.', ']']).next().unwrap_or(key);
    [
        ("frames_per_second", "frames per second"),
        ("bytes_per_second", "bytes per second"),
        ("_seconds", "seconds"),
        ("_milliseconds", "milliseconds"),
        ("_microseconds", "microseconds"),
        ("_bytes", "bytes"),
        ("_slots", "ring slots"),
        ("_frames", "frames"),
        ("_records", "records"),
        ("_ratio", "probability, 0 to 1"),
    ]
    .iter()
    .find(|(suffix, _)| last.ends_with(suffix))
    .map(|(_, u)| *u)
}

/// What a key holds, in words, with its unit.
fn type_words(node: &Node, key: &str) -> String {
    fn shape(node: &Node) -> String {
        let base = match &node.shape {
            Shape::Bool => "true or false".to_string(),
            Shape::Whole { min, max } => format!("whole number, {min} to {max}"),
            Shape::Number => "number".to_string(),
            Shape::Text => "text".to_string(),
            Shape::List(item) => match item.shape {
                Shape::Section { .. } => "list of mappings".to_string(),
                _ => format!("list of {}", shape(item)),
            },
            Shape::Mapping => "mapping".to_string(),
            Shape::Section { .. } => "section".to_string(),
            Shape::Choice { variants, .. } => format!(
                "one of {}",
                variants
                    .iter()
                    .map(|v| format!("`{v}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Shape::Any => "any".to_string(),
        };
        if node.nullable {
            format!("{base}, or null")
        } else {
            base
        }
    }
    match (unit(key), &node.shape) {
        (Some(u), Shape::Whole { .. } | Shape::Number) => format!("{}; {u}", shape(node)),
        _ => shape(node),
    }
}

/// Text fit for a markdown table cell.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

/// Words of `text` in lines of at most `width` characters.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

/// `docs/configuration.md`: a short introduction and every daemon's reference.
pub fn markdown(references: &[Reference]) -> String {
    let mut out = String::from(
        "# Configuration reference\n\n\
         <!-- Generated from the config types by the test `config_reference` \
         (agent/tests/it/config_reference.rs); do not edit: change the doc comments in \
         agent/src/config.rs, collector/src/config/ or common/src/config.rs and run \
         `UCTEL_BLESS=1 cargo test -p uctel-agent --test it -- config_reference`. -->\n\n\
         Both daemons read one YAML file (`--config PATH`, `-c PATH`, or `UCTEL_AGENT_CONFIG` / \
         `UCTEL_COLLECTOR_CONFIG`). It is strict: an unknown key is an error naming the key \
         probably meant, and `--check-config` reports every problem at once as \
         `file:line:col: key.path: message`, exits 0 (valid) or 2 (invalid), and checks \
         what can be checked without starting: value ranges, files that must be readable \
         (tokens), directories and files that must be creatable (state directory, log \
         file), the transport built into the binary, and `--log-level`.\n\n\
         The same concept has the same key and syntax in both daemons: \
         `transport.soft.bind` (the soft transport's UDP socket), `transport.soft.fault` \
         (fault injection), and listen addresses written `IP:PORT`, `[IPv6]:PORT` or \
         `:PORT` (every interface). Durations are `_seconds` (fractions allowed), \
         `_milliseconds` or `_microseconds`; sizes are `_bytes`.\n\n",
    );
    for r in references {
        out.push_str(&r.markdown());
        out.push('\n');
    }
    out.trim_end().to_string() + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Default, Deserialize, Serialize)]
    #[serde(rename_all = "snake_case")]
    enum Mode {
        /// The first.
        #[default]
        First,
        /// The second.
        SecondOne,
    }

    /// Inner things.
    #[derive(Debug, Default, Deserialize, Serialize)]
    #[serde(deny_unknown_fields, default)]
    struct Inner {
        /// A port.
        port: u16,
        /// Modes.
        #[serde(rename = "how")]
        mode: Mode,
    }

    #[derive(Debug, Deserialize, Serialize)]
    #[serde(deny_unknown_fields)]
    struct Outer {
        /// The name.
        name: String,
        /// Seconds between two things.
        #[serde(default)]
        interval_seconds: f64,
        /// An address, parsed by a function that refuses the tracer's empty string.
        #[serde(default, deserialize_with = "crate::listen::deserialize_option")]
        listen: Option<std::net::SocketAddr>,
        /// After the address.
        #[serde(default)]
        inner: Inner,
        /// Items.
        #[serde(default)]
        items: Vec<Inner>,
    }

    const SOURCE: &str = include_str!("reference.rs");

    #[test]
    fn traces_every_key_past_a_refusing_parser() {
        let root = trace::<Outer>();
        let Shape::Section { name, fields } = &root.shape else {
            panic!("{root:?}");
        };
        assert_eq!(*name, "Outer");
        let keys: Vec<_> = fields.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            keys,
            ["name", "interval_seconds", "listen", "inner", "items"]
        );
        assert_eq!(fields[0].1.shape, Shape::Text);
        assert_eq!(fields[1].1.shape, Shape::Number);
        assert!(fields[2].1.nullable && fields[2].1.shape == Shape::Text);
        let Shape::Section { fields: inner, .. } = &fields[3].1.shape else {
            panic!("{:?}", fields[3]);
        };
        assert_eq!(inner[0].1.shape, Shape::Whole { min: 0, max: 65535 });
        assert_eq!(
            inner[1].1.shape,
            Shape::Choice {
                name: "Mode",
                variants: vec!["first", "second_one"]
            }
        );
        assert!(
            matches!(&fields[4].1.shape, Shape::List(item) if matches!(item.shape, Shape::Section { .. }))
        );
    }

    #[test]
    fn docs_defaults_and_required_keys() {
        let r = Reference::new::<Outer>(Sources {
            daemon: "test",
            rust: &[SOURCE],
            minimal: "name: x\nitems: [{port: 1}]\n",
        });
        let keys: Vec<_> = r.entries.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "name",
                "interval_seconds",
                "listen",
                "inner",
                "inner.port",
                "inner.how",
                "items",
                "items[].port",
                "items[].how"
            ]
        );
        let name = r.entry("name").unwrap();
        assert!(name.required && name.default.is_none());
        assert_eq!(name.doc, "The name.");
        let how = r.entry("inner.how").unwrap();
        assert_eq!(
            how.doc,
            "Modes. `first`: The first. `second_one`: The second."
        );
        assert_eq!(how.default, Some(Value::String("first".into())));
        assert_eq!(
            r.entry("items").unwrap().default,
            Some(Value::Sequence(vec![]))
        );
        assert_eq!(
            r.entry("items[].port").unwrap().default,
            Some(Value::Number(0.into()))
        );
        assert_eq!(
            type_words(
                &r.entry("interval_seconds").unwrap().node,
                "interval_seconds"
            ),
            "number; seconds"
        );
        assert!(r.undocumented().is_empty(), "{:?}", r.undocumented());
    }

    #[test]
    fn wraps_words() {
        assert_eq!(wrap("a bb ccc dddd", 6), ["a bb", "ccc", "dddd"]);
    }
}
