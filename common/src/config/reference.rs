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

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::fmt;

use serde::de::{self, DeserializeOwned, DeserializeSeed, Visitor};
use serde::Serialize;
use serde_yaml::Value;

/// What a key holds, as its `Deserialize` implementation asks for it.
#[derive(Clone, Debug, PartialEq)]
pub enum Shape {
    /// `true` or `false`.
    Bool,
    /// An integer in `min..=max`.
    Whole {
        /// Smallest value.
        min: i128,
        /// Largest value.
        max: i128,
    },
    /// Any number (`f32`, `f64`).
    Number,
    /// A string (text, paths, addresses).
    Text,
    /// A sequence of items of one shape.
    List(Box<Node>),
    /// A free-form mapping.
    Mapping,
    /// A struct: its keys in declaration order.
    Section {
        /// The Rust type name.
        name: &'static str,
        /// Keys and what they hold.
        fields: Vec<(&'static str, Node)>,
    },
    /// A unit-variant enum: one of the names.
    Choice {
        /// The Rust type name.
        name: &'static str,
        /// The accepted spellings.
        variants: Vec<&'static str>,
    },
    /// Anything (a `serde_yaml::Value`), or not traced.
    Any,
}

/// One node of the traced configuration tree.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// What it holds.
    pub shape: Shape,
    /// `null` is accepted (an `Option`).
    pub nullable: bool,
}

impl Node {
    /// True for a struct (a section of keys).
    pub fn is_section(&self) -> bool {
        matches!(self.shape, Shape::Section { .. })
    }
}

#[derive(Clone, Copy, Debug)]
enum Rec {
    Bool,
    Whole(i128, i128),
    Number,
    Text,
    List,
    Mapping,
    Section(&'static str, &'static [&'static str]),
    Choice(&'static str, &'static [&'static str]),
    Any,
}

/// What the tracing runs learnt, by key path (`[]` for a sequence item).
#[derive(Default)]
struct State {
    seen: HashMap<Vec<String>, Rec>,
    nullable: HashSet<Vec<String>>,
    /// Keys whose value failed to deserialize from the tracer's neutral values (a
    /// `deserialize_with` parser refusing `""`): left out of later runs, so the keys after
    /// them are reached.
    poisoned: HashSet<Vec<String>>,
}

/// The error of a tracing run.
#[derive(Debug)]
struct Stop(String);

impl fmt::Display for Stop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Stop {}

impl de::Error for Stop {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Stop(msg.to_string())
    }
}

/// A deserializer that answers every request with a neutral value and records the request.
struct Tracer<'s> {
    state: &'s RefCell<State>,
    path: Vec<String>,
}

impl<'s> Tracer<'s> {
    fn record(&self, rec: Rec) {
        self.state
            .borrow_mut()
            .seen
            .entry(self.path.clone())
            .or_insert(rec);
    }

    fn child(&self, key: &str) -> Tracer<'s> {
        let mut path = self.path.clone();
        path.push(key.to_string());
        Tracer {
            state: self.state,
            path,
        }
    }

    fn poisoned(&self) -> bool {
        self.state.borrow().poisoned.contains(&self.path)
    }

    /// Runs `f` on this tracer; a failure that no deeper key explains poisons this key.
    fn guarded<T>(self, f: impl FnOnce(Tracer<'s>) -> Result<T, Stop>) -> Result<T, Stop> {
        let state = self.state;
        let path = self.path.clone();
        let before = state.borrow().poisoned.len();
        let result = f(self);
        if result.is_err() && state.borrow().poisoned.len() == before {
            state.borrow_mut().poisoned.insert(path);
        }
        result
    }
}

macro_rules! whole {
    ($($method:ident $visit:ident $t:ty),*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
            self.record(Rec::Whole(<$t>::MIN as i128, <$t>::MAX as i128));
            visitor.$visit(0)
        }
    )*};
}

impl<'de, 's> de::Deserializer<'de> for Tracer<'s> {
    type Error = Stop;

    whole!(
        deserialize_u8 visit_u8 u8, deserialize_u16 visit_u16 u16,
        deserialize_u32 visit_u32 u32, deserialize_u64 visit_u64 u64,
        deserialize_i8 visit_i8 i8, deserialize_i16 visit_i16 i16,
        deserialize_i32 visit_i32 i32, deserialize_i64 visit_i64 i64
    );

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        self.record(Rec::Any);
        visitor.visit_unit()
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        self.record(Rec::Bool);
        visitor.visit_bool(false)
    }

    fn deserialize_f32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        self.record(Rec::Number);
        visitor.visit_f32(0.0)
    }

    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        self.record(Rec::Number);
        visitor.visit_f64(0.0)
    }

    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        self.record(Rec::Text);
        visitor.visit_char('x')
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        self.record(Rec::Text);
        visitor.visit_str("")
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        self.deserialize_str(visitor)
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        self.record(Rec::Text);
        visitor.visit_bytes(b"")
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        self.deserialize_bytes(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        self.state.borrow_mut().nullable.insert(self.path.clone());
        visitor.visit_some(self)
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        self.record(Rec::Any);
        visitor.visit_unit()
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Stop> {
        self.deserialize_unit(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Stop> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        self.record(Rec::List);
        let item = self.child("[]");
        let item = (!item.poisoned()).then_some(item);
        visitor.visit_seq(SeqTracer { item })
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, Stop> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Stop> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        self.record(Rec::Mapping);
        visitor.visit_map(StructTracer {
            tracer: self,
            fields: &[],
            next: 0,
            current: None,
        })
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Stop> {
        self.record(Rec::Section(name, fields));
        visitor.visit_map(StructTracer {
            tracer: self,
            fields,
            next: 0,
            current: None,
        })
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Stop> {
        self.record(Rec::Choice(name, variants));
        let variant = variants
            .first()
            .ok_or_else(|| Stop(format!("enum {name} has no variants")))?;
        visitor.visit_enum(EnumTracer { variant })
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_str("")
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_unit()
    }
}

/// A sequence of one traced item (none once the item is poisoned).
struct SeqTracer<'s> {
    item: Option<Tracer<'s>>,
}

impl<'de> de::SeqAccess<'de> for SeqTracer<'_> {
    type Error = Stop;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Stop> {
        match self.item.take() {
            Some(t) => t.guarded(|t| seed.deserialize(t)).map(Some),
            None => Ok(None),
        }
    }
}

/// A struct's keys, every one that is not poisoned, each with a traced value.
struct StructTracer<'s> {
    tracer: Tracer<'s>,
    fields: &'static [&'static str],
    next: usize,
    current: Option<&'static str>,
}

impl<'de> de::MapAccess<'de> for StructTracer<'_> {
    type Error = Stop;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Stop> {
        while let Some(field) = self.fields.get(self.next) {
            self.next += 1;
            if !self.tracer.child(field).poisoned() {
                self.current = Some(field);
                return seed
                    .deserialize(de::value::BorrowedStrDeserializer::<Stop>::new(field))
                    .map(Some);
            }
        }
        Ok(None)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Stop> {
        let field = self
            .current
            .take()
            .ok_or_else(|| Stop("value without a key".to_string()))?;
        self.tracer.child(field).guarded(|t| seed.deserialize(t))
    }
}

/// The first variant of an enum, as a unit variant.
struct EnumTracer {
    variant: &'static str,
}

impl<'de> de::EnumAccess<'de> for EnumTracer {
    type Error = Stop;
    type Variant = UnitOnly;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, UnitOnly), Stop> {
        let v = seed.deserialize(de::value::BorrowedStrDeserializer::<Stop>::new(
            self.variant,
        ))?;
        Ok((v, UnitOnly))
    }
}

struct UnitOnly;

impl<'de> de::VariantAccess<'de> for UnitOnly {
    type Error = Stop;

    fn unit_variant(self) -> Result<(), Stop> {
        Ok(())
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, _seed: T) -> Result<T::Value, Stop> {
        Err(Stop("only unit variants are traced".to_string()))
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, _visitor: V) -> Result<V::Value, Stop> {
        Err(Stop("only unit variants are traced".to_string()))
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        _fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Stop> {
        Err(Stop("only unit variants are traced".to_string()))
    }
}

/// The configuration tree of `T`, as its `Deserialize` implementation reads it.
pub fn trace<T: DeserializeOwned>() -> Node {
    let state = RefCell::new(State::default());
    for _ in 0..1024 {
        let before = state.borrow().poisoned.len();
        let done = T::deserialize(Tracer {
            state: &state,
            path: Vec::new(),
        })
        .is_ok();
        if done || state.borrow().poisoned.len() == before {
            break;
        }
    }
    let state = state.into_inner();
    build(&state, &mut Vec::new())
}

fn build(state: &State, path: &mut Vec<String>) -> Node {
    let nullable = state.nullable.contains(path);
    let seen = state.seen.get(path.as_slice()).copied();
    let mut child = |key: &str| {
        path.push(key.to_string());
        let node = build(state, path);
        path.pop();
        node
    };
    let shape = match seen {
        Some(Rec::Bool) => Shape::Bool,
        Some(Rec::Whole(min, max)) => Shape::Whole { min, max },
        Some(Rec::Number) => Shape::Number,
        Some(Rec::Text) => Shape::Text,
        Some(Rec::List) => Shape::List(Box::new(child("[]"))),
        Some(Rec::Mapping) => Shape::Mapping,
        Some(Rec::Section(name, fields)) => Shape::Section {
            name,
            fields: fields.iter().map(|f| (*f, child(f))).collect(),
        },
        Some(Rec::Choice(name, variants)) => Shape::Choice {
            name,
            variants: variants.to_vec(),
        },
        Some(Rec::Any) | None => Shape::Any,
    };
    Node { shape, nullable }
}

/// Doc comments read from Rust source: of struct fields and enum variants by (type, serde
/// name), of the types by name.
#[derive(Debug, Default)]
pub struct Docs {
    members: HashMap<(String, String), String>,
    types: HashMap<String, String>,
}

/// `CamelCase` as serde's `rename_all = "snake_case"` spells it.
fn snake_case(ident: &str) -> String {
    let mut out = String::new();
    for (i, c) in ident.chars().enumerate() {
        if c.is_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.extend(c.to_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// The value of `name = "..."` in attribute text.
fn attr_value<'a>(attrs: &'a str, name: &str) -> Option<&'a str> {
    let pattern = format!("{name} = \"");
    let mut rest = attrs;
    while let Some(at) = rest.find(&pattern) {
        // `rename = ` but not `rename_all = `: the character before must not be part of a name.
        let before = rest[..at].chars().next_back();
        let value = &rest[at + pattern.len()..];
        if !before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            return value.split('"').next();
        }
        rest = value;
    }
    None
}

/// The name of a top-level `struct`/`enum` item that opens a braced body on this line.
fn item_name(line: &str) -> Option<(&str, bool)> {
    let rest = line.strip_prefix("pub ").unwrap_or(line);
    let (rest, is_enum) = if let Some(r) = rest.strip_prefix("struct ") {
        (r, false)
    } else if let Some(r) = rest.strip_prefix("enum ") {
        (r, true)
    } else {
        return None;
    };
    if !line.ends_with('{') {
        return None;
    }
    let end = rest
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    Some((&rest[..end], is_enum))
}

impl Docs {
    /// Reads the doc comments of rustfmt-formatted Rust sources: of every braced `struct`
    /// and `enum` and their fields and variants (the first definition of a name wins).
    pub fn parse(sources: &[&str]) -> Docs {
        let mut docs = Docs::default();
        for source in sources {
            let mut doc: Vec<String> = Vec::new();
            let mut attrs = String::new();
            let mut in_attr = false;
            // The type whose body is open, whether its variants are snake_case, and the
            // indentation of its header.
            let mut open: Option<(String, bool, usize)> = None;
            for line in source.lines() {
                let t = line.trim();
                if in_attr {
                    attrs.push_str(t);
                    in_attr = !t.ends_with(")]");
                    continue;
                }
                if let Some(d) = t.strip_prefix("///") {
                    doc.push(d.strip_prefix(' ').unwrap_or(d).to_string());
                    continue;
                }
                if t.starts_with("#[") {
                    attrs.push_str(t);
                    in_attr = !t.ends_with(']');
                    continue;
                }
                if t.is_empty() || t.starts_with("//") {
                    continue;
                }
                let depth = line.len() - line.trim_start().len();
                match &open {
                    None => {
                        if let Some((name, is_enum)) = item_name(t) {
                            let snake =
                                is_enum && attr_value(&attrs, "rename_all") == Some("snake_case");
                            docs.types
                                .entry(name.to_string())
                                .or_insert_with(|| doc.join("\n"));
                            open = Some((name.to_string(), snake, depth));
                        }
                    }
                    Some((ty, snake, at)) => {
                        if depth == *at && t.starts_with('}') {
                            open = None;
                        } else if depth == at + 4 {
                            let t = t
                                .strip_prefix("pub(crate) ")
                                .or_else(|| t.strip_prefix("pub "))
                                .unwrap_or(t);
                            let end = t
                                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                                .unwrap_or(t.len());
                            let ident = &t[..end];
                            if !ident.is_empty() {
                                let name = match attr_value(&attrs, "rename") {
                                    Some(r) => r.to_string(),
                                    None if *snake => snake_case(ident),
                                    None => ident.to_string(),
                                };
                                docs.members
                                    .entry((ty.clone(), name))
                                    .or_insert_with(|| doc.join("\n"));
                            }
                        }
                    }
                }
                doc.clear();
                attrs.clear();
            }
        }
        docs
    }

    /// The doc comment of the field or variant `member` of type `ty`.
    pub fn member(&self, ty: &str, member: &str) -> Option<&str> {
        self.members
            .get(&(ty.to_string(), member.to_string()))
            .map(String::as_str)
    }

    /// The doc comment of the type `ty`.
    pub fn of_type(&self, ty: &str) -> Option<&str> {
        self.types.get(ty).map(String::as_str)
    }
}

/// Doc comment text for operators: rustdoc links become plain code spans, lines are joined
/// into one paragraph.
pub fn plain(doc: &str) -> String {
    let mut text = doc.split_whitespace().collect::<Vec<_>>().join(" ");
    // [`X`](target) and [`X`]: keep `X`.
    while let Some(at) = text.find("`](") {
        match text[at..].find(')') {
            Some(end) => text.replace_range(at + 1..at + end + 1, ""),
            None => break,
        }
    }
    text.replace("[`", "`").replace("`]", "`")
}

/// The YAML block (```` ```yaml ````) of a module's `//!` docs.
pub fn module_yaml(source: &str) -> String {
    let mut out = String::new();
    let mut inside = false;
    for line in source.lines() {
        let Some(doc) = line.strip_prefix("//!") else {
            if inside {
                break;
            }
            continue;
        };
        let doc = doc.strip_prefix(' ').unwrap_or(doc);
        if inside {
            if doc.trim_start().starts_with("```") {
                break;
            }
            out.push_str(doc);
            out.push('\n');
        } else if doc.trim() == "```yaml" {
            inside = true;
        }
    }
    out
}

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
             shown is an example.\n",
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
         (agent/tests/config_reference.rs); do not edit: change the doc comments in \
         agent/src/config.rs, collector/src/config.rs or common/src/config.rs and run \
         `UCTEL_BLESS=1 cargo test -p uctel-agent --test config_reference`. -->\n\n\
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
    fn plain_text_from_rustdoc() {
        assert_eq!(
            plain("See [`Foo::bar`](Self::bar) and\n[`Baz`]."),
            "See `Foo::bar` and `Baz`."
        );
    }

    #[test]
    fn wraps_words() {
        assert_eq!(wrap("a bb ccc dddd", 6), ["a bb", "ccc", "dddd"]);
    }
}
