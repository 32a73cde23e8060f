//! Checks, creating and changing nothing, that paths a configuration names can be used
//! ([`check_directory`], [`check_writable_file`]): the kernel's own access(2) decision, for
//! `Validate` implementations and the daemons' `--check-config`.

use std::path::{Path, PathBuf};

/// An OS error in words, without the `(os error N)` suffix.
fn os_reason(e: impl Into<std::io::Error>) -> String {
    let text = e.into().to_string();
    match text.find(" (os error ") {
        Some(at) => text[..at].to_string(),
        None => text,
    }
}

/// Whether this process may access `path` as `mode` says (access(2): the kernel's own
/// decision, ACLs and read-only mounts included).
fn may(path: &Path, mode: rustix::fs::Access) -> Result<(), String> {
    let path = if path.as_os_str().is_empty() {
        Path::new(".")
    } else {
        path
    };
    rustix::fs::access(path, mode).map_err(os_reason)
}

/// The nearest ancestor of `path` (itself excluded) that exists, `.` for a relative path
/// none of whose ancestors exist.
fn existing_ancestor(path: &Path) -> (PathBuf, Option<std::fs::Metadata>) {
    let mut dir = path.parent();
    while let Some(d) = dir {
        let d = if d.as_os_str().is_empty() {
            Path::new(".")
        } else {
            d
        };
        if let Ok(m) = std::fs::metadata(d) {
            return (d.to_path_buf(), Some(m));
        }
        dir = d.parent();
    }
    (PathBuf::from("."), std::fs::metadata(".").ok())
}

/// The error of `metadata` for a path that is not there (or under a file).
fn absent(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
    )
}

/// Checks, creating nothing, that this process could create `path` (a directory or file
/// that does not exist yet, with the directories above it): the nearest existing ancestor
/// must be a directory it may write to and enter.
fn check_creatable(path: &Path) -> Result<(), String> {
    use rustix::fs::Access;
    let (dir, meta) = existing_ancestor(path);
    match meta {
        Some(m) if m.is_dir() => may(&dir, Access::WRITE_OK | Access::EXEC_OK).map_err(|reason| {
            format!(
                "cannot create {}: {}: {reason}",
                path.display(),
                dir.display()
            )
        }),
        Some(_) => Err(format!(
            "cannot create {}: {} is not a directory",
            path.display(),
            dir.display()
        )),
        None => Err(format!("cannot create {}", path.display())),
    }
}

/// Checks, creating nothing, that `path` can be used as a directory this process keeps files
/// in: an existing directory it may read, write and enter, or one it could create (see the
/// daemons' `--check-config`).
///
/// # Errors
/// What stands in the way, in words, naming the path: `/var/lib/uctel-agent: Permission
/// denied`, `cannot create ./state: ./x is not a directory`.
pub fn check_directory(path: &Path) -> Result<(), String> {
    use rustix::fs::Access;
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => may(path, Access::READ_OK | Access::WRITE_OK | Access::EXEC_OK)
            .map_err(|reason| format!("{}: {reason}", path.display())),
        Ok(_) => Err(format!("{} is not a directory", path.display())),
        Err(e) if absent(&e) => check_creatable(path),
        Err(e) => Err(format!("{}: {}", path.display(), os_reason(e))),
    }
}

/// Checks, creating and changing nothing, that this process could append to the file `path`:
/// an existing file it may write, or one it could create.
///
/// # Errors
/// As [`check_directory`].
pub fn check_writable_file(path: &Path) -> Result<(), String> {
    use rustix::fs::Access;
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Err(format!(
            "{} is a directory; name a file in it",
            path.display()
        )),
        Ok(_) => {
            may(path, Access::WRITE_OK).map_err(|reason| format!("{}: {reason}", path.display()))
        }
        Err(e) if absent(&e) => check_creatable(path),
        Err(e) => Err(format!("{}: {}", path.display(), os_reason(e))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory under the system's temporary directory, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new() -> TempDir {
            use std::sync::atomic::{AtomicU32, Ordering};
            static NEXT: AtomicU32 = AtomicU32::new(0);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let p = std::env::temp_dir().join(format!("uctel-config-{}-{n}", std::process::id()));
            std::fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }

        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(
                self.0.join("locked"),
                std::fs::Permissions::from_mode(0o700),
            );
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn directories_and_files_are_checked_without_creating_them() {
        let dir = TempDir::new();
        let file = dir.path().join("f");
        std::fs::write(&file, "x").unwrap();
        assert_eq!(check_directory(dir.path()), Ok(()));
        assert_eq!(check_directory(&dir.path().join("a/b/c")), Ok(()));
        assert!(!dir.path().join("a").exists());
        let under_file = file.join("state");
        assert_eq!(
            check_directory(&under_file),
            Err(format!(
                "cannot create {}: {} is not a directory",
                under_file.display(),
                file.display()
            ))
        );
        assert_eq!(
            check_directory(&file),
            Err(format!("{} is not a directory", file.display()))
        );
        assert_eq!(check_writable_file(&file), Ok(()));
        assert_eq!(
            check_writable_file(&dir.path().join("new/log.jsonl")),
            Ok(())
        );
        assert!(check_writable_file(dir.path())
            .unwrap_err()
            .ends_with("is a directory; name a file in it"));
        assert!(check_writable_file(&under_file.join("x"))
            .unwrap_err()
            .ends_with("is not a directory"));
        // A relative path is checked from the working directory.
        assert_eq!(
            check_directory(Path::new("uctel-surely-absent/state")),
            Ok(())
        );
        // Without write permission (root may write anywhere, so only as another user).
        use std::os::unix::fs::PermissionsExt;
        let locked = dir.path().join("locked");
        std::fs::create_dir(&locked).unwrap();
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o500)).unwrap();
        if rustix::fs::access(&locked, rustix::fs::Access::WRITE_OK).is_err() {
            let want = format!(
                "cannot create {}: {}: Permission denied",
                locked.join("state").display(),
                locked.display()
            );
            assert_eq!(check_directory(&locked.join("state")), Err(want));
            assert!(check_directory(&locked).is_err());
        }
    }
}
