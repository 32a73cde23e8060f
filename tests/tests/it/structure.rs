//! The shape of the source tree, checked: no import circle between sibling modules of one
//! crate, and no library or binary source file over [`MAX_CODE_LINES`] lines of code unless
//! its module docs say why it is one concept.
//!
//! Both rules read the code before a file's first `#[cfg(test)]` (unit tests may reach
//! anywhere), without blank lines and comments. A module path `a::b::c` depends on every
//! module it names through `crate::…`, `super::…` or `self::…` (in `use` trees and in
//! inline paths); an edge between two modules is counted between their children of the
//! closest common parent, so `control::session → daemon` makes `control` depend on `daemon`.
//! A child naming its parent (`super::X`) is not a circle.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Lines of code a source file may have outside its unit tests.
const MAX_CODE_LINES: usize = 900;

/// The crates whose `src/` trees are checked.
const CRATES: [&str; 9] = [
    "protocol",
    "transport",
    "common",
    "agent",
    "collector",
    "testkit",
    "tests",
    "bench",
    "xtask",
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The text before the first `#[cfg(test)]` (the unit tests).
fn before_tests(text: &str) -> &str {
    match text.find("#[cfg(test)]") {
        Some(i) => &text[..i],
        None => text,
    }
}

/// The text before the unit tests, with `//` comments (docs included) removed.
fn code_of(text: &str) -> String {
    before_tests(text)
        .lines()
        .map(|l| match l.find("//") {
            // A `//` inside a string literal ("http://…") is rare in code and only ever
            // shortens a line, which cannot add an edge.
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn code_lines(text: &str) -> usize {
    before_tests(text)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("//"))
        .count()
}

/// `src/a/b.rs` → `["a", "b"]`; `lib.rs`, `main.rs` and `mod.rs` name their directory.
/// Files under `src/bin/` are separate crates and get a `bin:` root.
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).expect("file under src");
    let mut parts: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("lib" | "main" | "mod")
    ) {
        parts.pop();
    }
    parts
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Splits a `use` tree body (`{a, b::{c, d}}` or `a::b`) into paths.
fn expand_use(prefix: &[String], tree: &str, out: &mut Vec<Vec<String>>) {
    let tree = tree.trim();
    if let Some(inner) = tree.strip_prefix('{') {
        let inner = inner.strip_suffix('}').unwrap_or(inner);
        let mut depth = 0usize;
        let mut start = 0;
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth = depth.saturating_sub(1),
                ',' if depth == 0 => {
                    expand_use(prefix, &inner[start..i], out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        expand_use(prefix, &inner[start..], out);
        return;
    }
    let head: String = tree.chars().take_while(|&c| is_ident_char(c)).collect();
    if head.is_empty() {
        if !prefix.is_empty() {
            out.push(prefix.to_vec());
        }
        return;
    }
    let mut path = prefix.to_vec();
    path.push(head.clone());
    match tree[head.len()..].trim_start().strip_prefix("::") {
        Some(rest) => expand_use(&path, rest, out),
        None => out.push(path),
    }
}

/// Every path starting with `crate`, `super` or `self` that `code` names.
fn named_paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    // `use` statements, with their trees.
    let mut rest = code;
    while let Some(i) = rest.find("use ") {
        let before_ok = i == 0 || !is_ident_char(rest[..i].chars().last().unwrap_or(' '));
        let after = &rest[i + 4..];
        let end = after.find(';').unwrap_or(after.len());
        if before_ok {
            let stmt = after[..end].trim();
            if stmt.starts_with("crate") || stmt.starts_with("super") || stmt.starts_with("self") {
                expand_use(&[], stmt, &mut out);
            }
        }
        rest = &after[end.min(after.len())..];
    }
    // Inline paths such as `crate::store::SeriesStore::new`.
    for root in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(i) = code[from..].find(root) {
            let at = from + i;
            from = at + root.len();
            if at > 0 && is_ident_char(code[..at].chars().last().unwrap_or(' ')) {
                continue;
            }
            let mut path = vec![root.trim_end_matches(':').to_string()];
            let mut tail = &code[at + root.len()..];
            loop {
                let seg: String = tail.chars().take_while(|&c| is_ident_char(c)).collect();
                if seg.is_empty() {
                    break;
                }
                tail = &tail[seg.len()..];
                path.push(seg);
                match tail.strip_prefix("::") {
                    Some(t) => tail = t,
                    None => break,
                }
            }
            out.push(path);
        }
    }
    out
}

/// Resolves `crate::…`, `super::…` and `self::…` against the module `at`.
fn resolve(at: &[String], path: &[String]) -> Vec<String> {
    let mut base: Vec<String> = at.to_vec();
    let mut rest = path;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &rest[1..];
        }
        _ => {
            while let Some(first) = rest.first() {
                match first.as_str() {
                    "super" => {
                        base.pop();
                    }
                    "self" => {}
                    _ => break,
                }
                rest = &rest[1..];
            }
        }
    }
    base.extend(rest.iter().cloned());
    base
}

/// Strongly connected components of more than one node (the circles).
fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // Tarjan, iterative enough for a few hundred modules: recursion depth is the module count.
    struct State<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on_stack.insert(v);
        if let Some(ws) = s.edges.get(v) {
            for w in ws {
                let w = w.as_str();
                if !s.index.contains_key(w) {
                    visit(s, w);
                    let lw = s.low[w];
                    let lv = s.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if s.on_stack.contains(w) {
                    let iw = s.index[w];
                    let lv = s.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

/// Sibling-level dependency edges of one crate's `src/` tree.
fn sibling_edges(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeMap<Vec<String>, PathBuf> = files
        .into_iter()
        .filter(|f| !f.starts_with(src.join("bin")))
        .map(|f| (module_path(src, &f), f))
        .collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (at, file) in &modules {
        let text = fs::read_to_string(file).expect("read source");
        for named in named_paths(&code_of(&text)) {
            let to = resolve(at, &named);
            let common = at.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if common >= at.len() || common >= to.len() {
                continue; // the module itself, an ancestor or a descendant
            }
            let from_child = at[..=common].to_vec();
            let to_child = to[..=common].to_vec();
            if !modules.contains_key(&to_child) {
                continue; // an item of the parent (`super::Item`), not a module
            }
            edges
                .entry(from_child.join("::"))
                .or_default()
                .insert(to_child.join("::"));
        }
    }
    edges
}

#[test]
fn no_import_circle_between_sibling_modules() {
    let root = workspace();
    let mut found = Vec::new();
    for krate in CRATES {
        let src = root.join(krate).join("src");
        assert!(src.is_dir(), "{} is missing", src.display());
        for circle in circles(&sibling_edges(&src)) {
            found.push(format!("{krate}: {}", circle.join(" ↔ ")));
        }
    }
    assert!(
        found.is_empty(),
        "modules that import each other (make one of them the leaf):\n  {}",
        found.join("\n  ")
    );
}

#[test]
fn source_files_stay_under_the_size_rule() {
    let root = workspace();
    let mut over = Vec::new();
    for krate in CRATES {
        let mut files = Vec::new();
        rust_files(&root.join(krate).join("src"), &mut files);
        for f in files {
            let text = fs::read_to_string(&f).expect("read source");
            let n = code_lines(&text);
            let docs: String = text
                .lines()
                .take_while(|l| l.starts_with("//!") || l.trim().is_empty())
                .collect::<Vec<_>>()
                .join(" ");
            if n > MAX_CODE_LINES && !docs.contains("one concept") {
                let rel = f.strip_prefix(&root).unwrap_or(&f).display().to_string();
                over.push(format!("{rel}: {n} lines of code"));
            }
        }
    }
    over.sort();
    assert!(
        over.is_empty(),
        "files over {MAX_CODE_LINES} lines of code outside their unit tests; split them, or \
         say in the module docs why the file is one concept:\n  {}",
        over.join("\n  ")
    );
}

#[test]
fn the_checks_see_a_circle_and_a_long_file() {
    // The rules above must be able to fail: a two-module circle written to a scratch tree.
    let dir = std::env::temp_dir().join(format!("uctel-structure-{}", std::process::id()));
    let src = dir.join("src");
    fs::create_dir_all(src.join("a")).expect("scratch dir");
    fs::write(src.join("lib.rs"), "mod a;\nmod b;\n").expect("write");
    fs::write(
        src.join("a/mod.rs"),
        "use crate::b::{Thing, other::{X}};\npub mod inner;\n",
    )
    .expect("write");
    fs::write(src.join("a/inner.rs"), "fn f() { super::super::c::g() }\n").expect("write");
    fs::write(src.join("b.rs"), "pub fn t() { crate::a::inner::f() }\n").expect("write");
    fs::write(src.join("c.rs"), "use super::Shared; pub fn g() {}\n").expect("write");
    let edges = sibling_edges(&src);
    let found = circles(&edges);
    fs::remove_dir_all(&dir).ok();
    assert_eq!(
        found,
        vec![vec!["a".to_string(), "b".to_string()]],
        "{edges:?}"
    );
    assert_eq!(
        edges.get("a").cloned().unwrap_or_default(),
        ["b", "c"]
            .iter()
            .map(|s| s.to_string())
            .collect::<BTreeSet<_>>()
    );
    assert!(
        !edges.contains_key("c"),
        "super::Shared is an item of the root"
    );

    let long = "fn x() {}\n".repeat(MAX_CODE_LINES + 1);
    assert_eq!(code_lines(&long), MAX_CODE_LINES + 1);
    assert_eq!(
        code_lines("// c\n\nfn a() {}\n#[cfg(test)]\nmod tests {}\n"),
        1
    );
}

#[test]
fn the_transport_api_names_neither_transport() {
    // `transport::api` is the leaf every backend implements; only `transport::device`
    // chooses between `soft` and `verbs`.
    let api = workspace().join("transport/src/api");
    let mut files = Vec::new();
    rust_files(&api, &mut files);
    assert!(!files.is_empty(), "{} has no sources", api.display());
    let mut named = Vec::new();
    for f in files {
        let code = code_of(&fs::read_to_string(&f).expect("read source"));
        let at = module_path(&workspace().join("transport/src"), &f);
        for p in named_paths(&code) {
            let to = resolve(&at, &p);
            if matches!(to.first().map(String::as_str), Some("soft" | "verbs")) {
                named.push(format!("{}: {}", f.display(), to.join("::")));
            }
        }
    }
    assert!(
        named.is_empty(),
        "transport::api imports a backend:\n  {}",
        named.join("\n  ")
    );
}
