//! Key paths (`auth.agents[1].id`) as segments ([`Seg`]): from serde_path_to_error's path,
//! to and from text, and the edits of a YAML value at a path the loading rounds make (find,
//! remove, set, move to the end).

use serde_yaml::Value;

/// One key path segment.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum Seg {
    /// A mapping key.
    Key(String),
    /// A sequence index, 0-based.
    Index(usize),
}

/// The key path serde_path_to_error names (an enum variant is a mapping key in YAML).
pub(super) fn segments(path: &serde_path_to_error::Path) -> Vec<Seg> {
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

/// A key path as text: keys joined by `.`, indices as `[i]` (`auth.agents[1].id`).
pub(super) fn render(path: &[Seg]) -> String {
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

/// Inverse of [`render`] for the key paths that [`Validate`](super::Validate) implementations write.
pub(super) fn parse_path(key: &str) -> Vec<Seg> {
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

/// A key path with every sequence index written `[]`, as [`Validate::renamed_keys`](super::Validate::renamed_keys) writes
/// them.
pub(super) fn generic(path: &[Seg]) -> String {
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
pub(super) fn with_indices(new: &str, path: &[Seg]) -> String {
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

/// Follows `path` from `root` (through tags), returning the node.
pub(super) fn node<'a>(root: &'a Value, path: &[Seg]) -> Option<&'a Value> {
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
pub(super) fn remove(root: &mut Value, path: &[Seg]) -> bool {
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

/// Sets the mapping entry at `path` (its parent must be a mapping). False if not possible.
pub(super) fn set(root: &mut Value, path: &[Seg], new: Value) -> bool {
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
pub(super) fn move_to_end(root: &mut Value, path: &[Seg]) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_round_trip() {
        for key in ["a", "a.b", "a[0].b", "a[1][2].c", "x.y[3]"] {
            assert_eq!(render(&parse_path(key)), key);
        }
    }
}
