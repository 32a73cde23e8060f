//! The hand-written prost structs checked against the schema files `proto/uctel.proto` and
//! `proto/control.proto`: the same messages, and in each the same field names with the same
//! tags (a `oneof`'s fields count as the message's own). The wire format is the tags; a
//! renamed or renumbered field on either side fails here rather than between an agent and a
//! collector of different builds.

use std::collections::BTreeMap;

/// Message name → field name → tag.
type Schema = BTreeMap<String, BTreeMap<String, u32>>;

/// Messages and fields of a `.proto` file (proto3 as these files use it: top-level
/// messages, scalar, enum and message fields, `optional`, `repeated`, one level of `oneof`).
fn parse_proto(text: &str, into: &mut Schema) {
    let mut current: Option<String> = None;
    for line in text.lines() {
        let line = line.split("//").next().unwrap_or("").trim();
        if let Some(rest) = line.strip_prefix("message ") {
            let name = rest.trim_end_matches('{').trim().to_string();
            into.entry(name.clone()).or_default();
            current = Some(name);
            continue;
        }
        if line.starts_with("enum ") {
            current = None;
            continue;
        }
        let Some(message) = &current else { continue };
        let Some((decl, tag)) = line.strip_suffix(';').and_then(|l| l.split_once('=')) else {
            continue;
        };
        let name = decl.split_whitespace().last().unwrap_or("").to_string();
        let tag: u32 = tag.trim().parse().expect("a field tag is a number");
        let fields = into.entry(message.clone()).or_default();
        assert!(fields.insert(name, tag).is_none(), "{message}: field twice");
    }
}

/// `ProbeAnswer` → `probe_answer` (a oneof variant's field name).
fn snake(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// The value of `key = "…"` in a `#[prost(…)]` attribute.
fn attr_value<'a>(attr: &'a str, key: &str) -> Option<&'a str> {
    let at = attr.find(&format!("{key} = \""))? + key.len() + 4;
    attr[at..].split('"').next()
}

/// Messages and fields of the prost structs in a Rust source file (before its unit tests):
/// each `prost::Message` struct with its `#[prost(…, tag = "N")]` fields, and each
/// `#[prost(oneof = "E", …)]` field expanded into the variants of `prost::Oneof` enum `E`.
fn parse_rust(text: &str, into: &mut Schema, oneofs: &mut Vec<(String, String)>) {
    let text = text.split("#[cfg(test)]").next().unwrap_or(text);
    let mut item: Option<(String, bool)> = None; // (name, is a oneof enum)
    let mut derive = None;
    let mut attr = String::new();
    let mut attr_done = false;
    let mut enums: BTreeMap<String, BTreeMap<String, u32>> = BTreeMap::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with("#[derive(") {
            derive = Some(line.contains("Message") || line.contains("Oneof"));
            continue;
        }
        if let Some(rest) = line
            .strip_prefix("pub struct ")
            .or_else(|| line.strip_prefix("pub enum "))
        {
            item = (derive == Some(true)).then(|| {
                let name = rest.trim_end_matches('{').trim().to_string();
                (name, line.starts_with("pub enum "))
            });
            derive = None;
            if let Some((name, false)) = &item {
                into.entry(name.clone()).or_default();
            }
            continue;
        }
        if line.starts_with("#[prost(") || !attr.is_empty() && !attr_done {
            attr.push_str(line);
            attr_done = line.ends_with(")]");
            continue;
        }
        let Some((name, is_enum)) = &item else {
            attr.clear();
            attr_done = false;
            continue;
        };
        if line == "}" {
            item = None;
            continue;
        }
        if !attr_done {
            continue;
        }
        let field = line
            .trim_start_matches("pub ")
            .split([':', '('])
            .next()
            .unwrap_or("");
        let field = field.trim().trim_start_matches("r#");
        if let Some(oneof) = attr_value(&attr, "oneof") {
            oneofs.push((name.clone(), oneof.to_string()));
        } else {
            let tag: u32 = attr_value(&attr, "tag")
                .and_then(|t| t.parse().ok())
                .expect("a prost field has a tag");
            let (key, fields) = if *is_enum {
                (snake(field), enums.entry(name.clone()).or_default())
            } else {
                (field.to_string(), into.entry(name.clone()).or_default())
            };
            assert!(fields.insert(key, tag).is_none(), "{name}: field twice");
        }
        attr.clear();
        attr_done = false;
    }
    for (message, oneof) in oneofs.iter() {
        if let Some(variants) = enums.get(oneof) {
            into.entry(message.clone())
                .or_default()
                .extend(variants.iter().map(|(k, v)| (k.clone(), *v)));
        }
    }
}

#[test]
fn prost_structs_match_the_proto_files() {
    let mut proto = Schema::new();
    parse_proto(include_str!("../proto/uctel.proto"), &mut proto);
    parse_proto(include_str!("../proto/control.proto"), &mut proto);
    let mut rust = Schema::new();
    for source in [
        include_str!("payload.rs"),
        include_str!("samples.rs"),
        include_str!("control.rs"),
        include_str!("control/counters.rs"),
        include_str!("control/probe.rs"),
        include_str!("control/credit_word.rs"),
        include_str!("control/lane.rs"),
        include_str!("control/dict_ack.rs"),
    ] {
        let mut oneofs = Vec::new();
        parse_rust(source, &mut rust, &mut oneofs);
    }
    // Both sides were read: 30 messages in the two files today.
    assert!(proto.len() >= 30, "{:?}", proto.keys());
    let names = |s: &Schema| s.keys().cloned().collect::<Vec<_>>();
    assert_eq!(names(&rust), names(&proto), "message names differ");
    for (message, fields) in &proto {
        assert_eq!(&rust[message], fields, "fields or tags of {message} differ");
    }
}

#[test]
fn the_parsers_read_fields_tags_and_oneofs() {
    let mut proto = Schema::new();
    parse_proto(
        "message A {\n  optional uint64 x = 3; // c\n  oneof body {\n    B b_c = 1;\n  }\n}\nenum E {\n  E_X = 0;\n}\n",
        &mut proto,
    );
    let mut rust = Schema::new();
    let mut oneofs = Vec::new();
    parse_rust(
        "#[derive(Clone, PartialEq, prost::Message)]\npub struct A {\n    #[prost(uint64, optional, tag = \"3\")]\n    pub x: Option<u64>,\n    #[prost(\n        oneof = \"Body\",\n        tags = \"1\"\n    )]\n    pub body: Option<Body>,\n}\n#[derive(Clone, PartialEq, prost::Oneof)]\npub enum Body {\n    #[prost(message, tag = \"1\")]\n    BC(B),\n}\n",
        &mut rust,
        &mut oneofs,
    );
    let want: Schema = [(
        "A".to_string(),
        [("x".to_string(), 3), ("b_c".to_string(), 1)].into(),
    )]
    .into();
    assert_eq!(proto, want);
    assert_eq!(rust, want);
}
