//! Where each key path's key and value start in the text, and every repeated mapping key: a
//! location-aware pass over the YAML events (`saphyr-parser`), since the value serde sees has
//! no positions.

use std::borrow::Cow;
use std::collections::HashMap;

use saphyr_parser::{Event, Parser, ScalarStyle, Span, Tag};
use serde_yaml::Value;

use super::keypath::{render, Seg};
use super::Problem;

/// Which start a problem's location names: the key's, or the value's (a key that is not in
/// the file falls back to its nearest ancestor that is).
#[derive(Clone, Copy)]
pub(super) enum Anchor {
    /// Where the key starts (unknown, missing and repeated keys).
    Key,
    /// Where the value starts (wrong type or value, semantic problems).
    Value,
}

#[derive(Clone, Copy, Default)]
struct Where {
    key: Option<(usize, usize)>,
    value: Option<(usize, usize)>,
}

/// A mapping key that repeats an earlier key of the same mapping.
pub(super) struct Duplicate {
    /// Key path of the duplicate (the same as the first one's).
    pub(super) path: Vec<Seg>,
    /// Where the duplicate key starts (1-based line, 1-based column).
    pub(super) at: (usize, usize),
    /// Where the first key of that value starts.
    pub(super) first: (usize, usize),
}

/// Where each key path's key and value start (1-based line, 1-based column), and every
/// duplicate mapping key.
#[derive(Default)]
pub(super) struct LocationIndex {
    at: HashMap<Vec<Seg>, Where>,
    /// In file order.
    pub(super) duplicates: Vec<Duplicate>,
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
    pub(super) fn build(text: &str) -> Self {
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

    pub(super) fn problem(&self, path: &[Seg], anchor: Anchor, message: String) -> Problem {
        self.problem_at(path, &render(path), anchor, message)
    }

    pub(super) fn problem_at(
        &self,
        path: &[Seg],
        key: &str,
        anchor: Anchor,
        message: String,
    ) -> Problem {
        let loc = self.locate(path, anchor);
        Problem {
            line: loc.map(|l| l.0),
            column: loc.map(|l| l.1),
            key_path: key.to_string(),
            message,
        }
    }
}
