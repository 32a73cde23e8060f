//! Doc comments read from rustfmt-formatted Rust source ([`Docs`]), made plain for operators
//! ([`plain`]), and the YAML example of a module's docs ([`module_yaml`]).

use std::collections::HashMap;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_from_rustdoc() {
        assert_eq!(
            plain("See [`Foo::bar`](Self::bar) and\n[`Baz`]."),
            "See `Foo::bar` and `Baz`."
        );
    }
}
