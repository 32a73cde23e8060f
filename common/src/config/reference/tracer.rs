//! The tracing deserializer ([`trace`]): drives a config type's own `Deserialize`
//! implementation and records what each key asks for, as a tree of [`Node`]s and their
//! [`Shape`]s (the model the reference is rendered from).

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::fmt;

use serde::de::{self, DeserializeOwned, DeserializeSeed, Visitor};

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
