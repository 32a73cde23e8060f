//! A JSON line into flat fields (sans-IO).

use serde_json::Value;

/// The fields of one JSON object line, flattened.
#[derive(Debug, Default, PartialEq)]
pub struct Flat {
    /// `(dotted key, value)` in key order (serde_json's map is sorted), at most `max_fields`.
    pub fields: Vec<(String, String)>,
    /// Leaf values not kept because `max_fields` was reached.
    pub dropped: u64,
}

/// Parses `line` as a JSON object (RFC 8259) and flattens it: nested object keys joined with
/// `.`, at most `max_depth` levels (an object at that depth is kept as its compact JSON text),
/// at most `max_fields` fields (the rest counted in [`Flat::dropped`]). A string value is kept
/// as is, any other value (number, `true`, `null`, array) as its compact JSON text. Returns
/// the object too, for its time keys; `None` when the line is not a JSON object.
pub fn flatten(line: &str, max_fields: usize, max_depth: usize) -> Option<(Flat, Value)> {
    let t = line.trim();
    if !t.starts_with('{') {
        return None;
    }
    let v: Value = serde_json::from_str(t).ok()?;
    let Value::Object(map) = &v else {
        return None;
    };
    let mut flat = Flat::default();
    let mut key = String::new();
    walk(map, &mut key, 1, max_depth.max(1), max_fields, &mut flat);
    Some((flat, v))
}

fn walk(
    map: &serde_json::Map<String, Value>,
    prefix: &mut String,
    depth: usize,
    max_depth: usize,
    max_fields: usize,
    out: &mut Flat,
) {
    for (k, v) in map {
        let len = prefix.len();
        if !prefix.is_empty() {
            prefix.push('.');
        }
        prefix.push_str(k);
        match v {
            Value::Object(inner) if depth < max_depth && !inner.is_empty() => {
                walk(inner, prefix, depth + 1, max_depth, max_fields, out);
            }
            _ => {
                if out.fields.len() < max_fields {
                    let text = match v {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    out.fields.push((prefix.clone(), text));
                } else {
                    out.dropped += 1;
                }
            }
        }
        prefix.truncate(len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(f: &Flat) -> Vec<(&str, &str)> {
        f.fields
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }

    #[test]
    fn nested_keys_are_dotted() {
        let (f, _) = flatten(
            r#" {"msg":"hi","http":{"status":500,"req":{"path":"/a"}},"tags":["a",1],"ok":true,"n":null,"e":{}} "#,
            64,
            8,
        )
        .unwrap_or_default();
        // serde_json's map keeps keys sorted.
        assert_eq!(
            fields(&f),
            vec![
                ("e", "{}"),
                ("http.req.path", "/a"),
                ("http.status", "500"),
                ("msg", "hi"),
                ("n", "null"),
                ("ok", "true"),
                ("tags", r#"["a",1]"#),
            ]
        );
        assert_eq!(f.dropped, 0);
    }

    #[test]
    fn depth_and_count_are_bounded_and_the_excess_counted() {
        let (f, _) = flatten(r#"{"a":{"b":{"c":1}},"d":2}"#, 64, 2).unwrap_or_default();
        assert_eq!(fields(&f), vec![("a.b", r#"{"c":1}"#), ("d", "2")]);
        let (f, _) = flatten(r#"{"a":1,"b":{"c":2,"d":3},"e":4}"#, 2, 8).unwrap_or_default();
        assert_eq!(fields(&f), vec![("a", "1"), ("b.c", "2")]);
        assert_eq!(f.dropped, 2);
    }

    #[test]
    fn not_an_object_is_none() {
        for line in [
            "",
            "plain",
            "[1,2]",
            "{broken",
            "\"s\"",
            "{\"a\":1} trailing",
        ] {
            assert!(flatten(line, 8, 8).is_none(), "{line}");
        }
    }
}
