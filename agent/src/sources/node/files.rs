//! Reading kernel files as the node_exporter collectors need them: plain reads of pseudo
//! files, trimmed sysfs attributes, numbered device directories.

use std::path::Path;
use std::path::PathBuf;

use super::NodeError;

/// A kernel file's text, read with plain read(2)s into a buffer sized for a sysfs page.
/// `std::fs::read_to_string` would first ask statx(2) and lseek(2) for a size that pseudo
/// files do not have (procfs and sysfs report 0 or 4096), two system calls per file of
/// every collection.
///
/// # Errors
/// Opening or reading fails, or the text is not UTF-8 (`InvalidData`).
pub(super) fn read_text(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let file = std::fs::File::open(path)?;
    let mut text = String::with_capacity(4096);
    file.take(u64::MAX).read_to_string(&mut text)?;
    Ok(text)
}

pub(super) fn read(path: &Path) -> Result<String, NodeError> {
    read_text(path).map_err(|source| NodeError::Read {
        path: path.to_owned(),
        source,
    })
}

/// The file, or `None` when it does not exist.
pub(super) fn read_optional(path: &Path) -> Result<Option<String>, NodeError> {
    match read_text(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(NodeError::Read {
            path: path.to_owned(),
            source,
        }),
    }
}

pub(super) fn format_error(path: &Path, reason: impl Into<String>) -> NodeError {
    NodeError::Format {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

/// A file holding one unsigned decimal number (procfs' `ReadUintFromFile`).
pub(super) fn read_uint(path: &Path) -> Result<u64, NodeError> {
    let text = read(path)?;
    text.trim()
        .parse()
        .map_err(|_| format_error(path, format!("not an unsigned integer: {:?}", text.trim())))
}

/// A sysfs attribute as the `procfs` library's `SysReadFile` returns it: trimmed.
pub(super) fn read_trimmed(path: &Path) -> Result<String, NodeError> {
    Ok(read(path)?.trim().to_owned())
}

pub(super) fn parse_int<T: std::str::FromStr>(path: &Path, text: &str) -> Result<T, NodeError> {
    text.parse()
        .map_err(|_| format_error(path, format!("not an integer: {text:?}")))
}

/// The entries of `dir` whose name starts with `prefix` followed by a digit (the glob
/// `<prefix>[0-9]*`), sorted like Go's `filepath.Glob`; none when `dir` cannot be listed.
pub(super) fn glob_numbered(dir: &Path, prefix: &str) -> Vec<(String, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<(String, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let rest = name.strip_prefix(prefix)?;
            rest.starts_with(|c: char| c.is_ascii_digit())
                .then(|| (name.clone(), e.path()))
        })
        .collect();
    found.sort();
    found
}

/// The entry names of `dir`, sorted, skipping regular files when `skip_files` (as the
/// `procfs` library lists `/sys/class/net`, where `bonding_masters` is a file).
pub(super) fn list_dir(dir: &Path, skip_files: bool) -> Result<Vec<String>, NodeError> {
    let entries = std::fs::read_dir(dir).map_err(|source| NodeError::Read {
        path: dir.to_owned(),
        source,
    })?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| NodeError::Read {
            path: dir.to_owned(),
            source,
        })?;
        if skip_files && entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        if let Ok(name) = entry.file_name().into_string() {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}
