//! Messages in words for operators: serde's type and value errors rephrased
//! (`expected a whole number from 0 to 65535, found 99999`), and what an unknown key was
//! probably meant to be (the keys of its section by edit distance, or a renamed key).

use serde_yaml::Value;

use super::keypath::{generic, node, render, with_indices, Seg};

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

/// The problems for the unknown key at `path` (serde's `message` lists the keys that are
/// known there): one naming the key meant, when a known key or a renamed one is close; for a
/// mapping that only exists in an old spelling (`transport.soft.udp:` holding `bind`), one
/// for each key inside it.
pub(super) fn unknown_key(
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
pub(super) fn in_words(message: &str) -> String {
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
