//! node_exporter's `meminfo` collector (`collector/meminfo.go`, `meminfo_linux.go`): every
//! field of `<proc>/meminfo`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use uctel_protocol::payload::Metric;

use super::HostError;
use crate::sources::metric::gauge;

/// `/proc/meminfo` read field by field, so every field the kernel exposes is exported.
/// (`procfs::Meminfo` is a fixed struct; this keeps fields it does not know, which is what
/// node_exporter's original parser in `meminfo.go` does.)
pub(super) fn meminfo(proc: &Path, out: &mut Vec<Metric>) -> Result<(), HostError> {
    let path = proc.join("meminfo");
    let file = std::fs::File::open(&path).map_err(|source| HostError::Read {
        path: path.clone(),
        source,
    })?;
    let mut parsed = 0usize;
    for line in BufReader::new(file).lines() {
        let line = line.map_err(|source| HostError::Read {
            path: path.clone(),
            source,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let Some((name, value)) = parse_meminfo_line(&line) else {
            return Err(HostError::Format {
                path,
                reason: format!("bad line {line:?}"),
            });
        };
        let help = format!("Memory information field {name}.");
        out.push(gauge(format!("node_memory_{name}"), &help, &[], value));
        parsed += 1;
    }
    if parsed == 0 {
        return Err(HostError::Format {
            path,
            reason: "no fields".to_owned(),
        });
    }
    Ok(())
}

/// One `/proc/meminfo` line → (`<Field>_bytes` or `<Field>`, value in bytes or as-is).
/// `Key(sub):` becomes `Key_sub`; a `kB` unit multiplies by 1024 and adds `_bytes`.
fn parse_meminfo_line(line: &str) -> Option<(String, f64)> {
    let mut parts = line.split_whitespace();
    let key = parts.next()?.strip_suffix(':')?;
    let value: f64 = parts.next()?.parse().ok()?;
    let unit = parts.next();
    if parts.next().is_some() {
        return None;
    }
    let mut name = String::with_capacity(key.len() + 6);
    for c in key.chars() {
        match c {
            '(' => name.push('_'),
            ')' => {}
            c if c.is_ascii_alphanumeric() || c == '_' => name.push(c),
            _ => name.push('_'),
        }
    }
    if name.is_empty() {
        return None;
    }
    match unit {
        None => Some((name, value)),
        Some("kB") => {
            name.push_str("_bytes");
            Some((name, value * 1024.0))
        }
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_lines_map_to_node_exporter_names() {
        assert_eq!(
            parse_meminfo_line("MemTotal:       16318412 kB"),
            Some(("MemTotal_bytes".to_owned(), 16318412.0 * 1024.0))
        );
        assert_eq!(
            parse_meminfo_line("Active(anon):     123 kB"),
            Some(("Active_anon_bytes".to_owned(), 123.0 * 1024.0))
        );
        assert_eq!(
            parse_meminfo_line("HugePages_Total:       0"),
            Some(("HugePages_Total".to_owned(), 0.0))
        );
        assert_eq!(
            parse_meminfo_line("NFS_Unstable:          0 kB"),
            Some(("NFS_Unstable_bytes".to_owned(), 0.0))
        );
        assert_eq!(parse_meminfo_line("garbage"), None);
        assert_eq!(parse_meminfo_line("X: 1 MB"), None);
        assert_eq!(parse_meminfo_line("X: notanumber kB"), None);
    }
}
