//! node_exporter's `os` collector (`collector/os_release.go`): `os-release(5)` as
//! `node_os_info` labels and `node_os_version`.

use std::collections::BTreeMap;
use std::path::Path;
use uctel_protocol::payload::Metric;

use super::files::{read, read_optional};
use super::NodeError;
use crate::sources::metric::gauge;

/// One os-release value: `"…"` with `\` escapes, `'…'` literal, or bare.
fn os_release_value(raw: &str) -> String {
    let raw = raw.trim();
    if let Some(inner) = raw.strip_prefix('\'') {
        return inner.split('\'').next().unwrap_or("").to_owned();
    }
    let (quoted, body) = match raw.strip_prefix('"') {
        Some(inner) => (true, inner),
        None => (false, raw),
    };
    let mut value = String::with_capacity(body.len());
    let mut chars = body.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => value.extend(chars.next()),
            '"' if quoted => break,
            c => value.push(c),
        }
    }
    value
}

/// `KEY=value` pairs of an os-release file.
pub fn parse_os_release(text: &str) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        if let Some((key, value)) = line.split_once('=') {
            env.insert(key.trim().to_owned(), os_release_value(value));
        }
    }
    env
}

/// `os`: `<rootfs>/etc/os-release` (fallback `<rootfs>/usr/lib/os-release`) →
/// `node_os_info{…}` and, when `VERSION_ID` starts with a number, `node_os_version`.
pub fn os(rootfs: &Path, out: &mut Vec<Metric>) -> Result<(), NodeError> {
    let etc = rootfs.join("etc/os-release");
    let text = match read_optional(&etc)? {
        Some(text) => text,
        None => read(&rootfs.join("usr/lib/os-release"))?,
    };
    let env = parse_os_release(&text);
    let get = |k: &str| env.get(k).map_or("", String::as_str);
    const INFO: [(&str, &str); 12] = [
        ("build_id", "BUILD_ID"),
        ("id", "ID"),
        ("id_like", "ID_LIKE"),
        ("image_id", "IMAGE_ID"),
        ("image_version", "IMAGE_VERSION"),
        ("name", "NAME"),
        ("pretty_name", "PRETTY_NAME"),
        ("variant", "VARIANT"),
        ("variant_id", "VARIANT_ID"),
        ("version", "VERSION"),
        ("version_codename", "VERSION_CODENAME"),
        ("version_id", "VERSION_ID"),
    ];
    let labels: Vec<(&str, &str)> = INFO.iter().map(|(l, k)| (*l, get(k))).collect();
    out.push(gauge(
        "node_os_info",
        "A metric with a constant '1' value labeled by build_id, id, id_like, image_id, \
         image_version, name, pretty_name, variant, variant_id, version, version_codename, \
         version_id.",
        &labels,
        1.0,
    ));
    let version = os_version(get("VERSION_ID"));
    if version > 0.0 {
        out.push(gauge(
            "node_os_version",
            "Metric containing the major.minor part of the OS version.",
            &[
                ("id", get("ID")),
                ("id_like", get("ID_LIKE")),
                ("name", get("NAME")),
            ],
            version,
        ));
    }
    Ok(())
}

/// The `^[0-9]+\.?[0-9]*` prefix of `VERSION_ID` as a number, 0 when there is none.
pub fn os_version(version_id: &str) -> f64 {
    let int = version_id.bytes().take_while(u8::is_ascii_digit).count();
    if int == 0 {
        return 0.0;
    }
    let mut end = int;
    if version_id.as_bytes().get(end) == Some(&b'.') {
        end += 1;
        end += version_id[end..]
            .bytes()
            .take_while(u8::is_ascii_digit)
            .count();
    }
    version_id[..end].parse().unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{lines, tree};
    use super::*;

    #[test]
    fn os_release_labels_and_version() {
        let d = tree(&[(
            "etc/os-release",
            "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nNAME=\"Debian GNU/Linux\"\n\
             VERSION_ID=\"12\"\nVERSION=\"12 (bookworm)\"\nVERSION_CODENAME=bookworm\nID=debian\n\
             # a comment\nHOME_URL=\"https://www.debian.org/\"\n",
        )]);
        let mut out = Vec::new();
        os(d.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            lines(&out),
            [
                "node_os_info{build_id=\"\",id=\"debian\",id_like=\"\",image_id=\"\",\
                 image_version=\"\",name=\"Debian GNU/Linux\",pretty_name=\"Debian GNU/Linux 12 \
                 (bookworm)\",variant=\"\",variant_id=\"\",version=\"12 (bookworm)\",\
                 version_codename=\"bookworm\",version_id=\"12\"} gauge 1",
                "node_os_version{id=\"debian\",id_like=\"\",name=\"Debian GNU/Linux\"} gauge 12",
            ]
        );
        // The /usr/lib fallback; no numeric VERSION_ID: no node_os_version.
        let usr = tree(&[(
            "usr/lib/os-release",
            "NAME='Arch Linux'\nID=arch\nVERSION_ID=rolling\nBUILD_ID=\"a \\\"b\\\"\"\n",
        )]);
        let mut out = Vec::new();
        os(usr.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(out.len(), 1);
        let label = |n: &str| {
            out[0]
                .labels
                .iter()
                .find(|l| l.name == n)
                .map(|l| l.value.clone())
        };
        assert_eq!(label("name").as_deref(), Some("Arch Linux"));
        assert_eq!(label("build_id").as_deref(), Some("a \"b\""));
        assert!(os(tree(&[]).path(), &mut Vec::new()).is_err());
        assert_eq!(os_version("22.04"), 22.04);
        assert_eq!(os_version("8.6.2"), 8.6);
        assert_eq!(os_version("3."), 3.0);
        assert_eq!(os_version("rolling"), 0.0);
        assert_eq!(os_version(""), 0.0);
    }
}
