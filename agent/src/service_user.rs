//! What `--check-config` checks when it runs as root for a service that runs as another user
//! (`User=uctel` in the systemd unit): root reads every file, so a token file only root can
//! read passes root's check and fails under the unit's user. Here the files the agent needs
//! at start are checked for that user from their owner, group and mode bits (POSIX: the
//! owner's bits if the user owns it, else the group's if one of its groups does, else the
//! others'), every directory on the way included:
//!
//! - the configuration file: read;
//! - `auth.token_file`: read;
//! - `sources.state_directory` (with log sources): read, write and enter, or, when it does
//!   not exist yet, write and enter its nearest existing parent (to create it).
//!
//! The user's groups are its primary group and the groups of `/etc/group` that list it
//! (what systemd's `User=` gives the service; the unit's `SupplementaryGroups=` are not
//! counted). ACLs are not read: a file that an ACL opens to the user is reported as refused.
//! Accounts come from `/etc/passwd` and `/etc/group` (where `useradd --system` puts the
//! packages' `uctel`), parsed by [`Accounts`] without IO.

use std::path::{Component, Path, PathBuf};

use crate::config::AgentConfig;

/// The user the packaged systemd unit runs the agent as (`User=uctel`).
pub const SERVICE_USER: &str = "uctel";

/// The packaged unit's `StateDirectory=uctel-agent`: systemd creates it and gives it to the
/// service user when the unit starts, so a problem with it is a note, not an error.
pub const UNIT_STATE_DIRECTORY: &str = "/var/lib/uctel-agent";

/// A user as the service runs: uid, primary gid and supplementary groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// Login name.
    pub name: String,
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Ids of the other groups that list the user as a member.
    pub groups: Vec<u32>,
}

/// The texts of `/etc/passwd` and `/etc/group`, for looking up accounts and naming owners.
#[derive(Debug, Clone, Default)]
pub struct Accounts {
    passwd: String,
    group: String,
}

impl Accounts {
    /// From the two files' texts (`name:password:uid:gid:…` and `name:password:gid:members`).
    pub fn new(passwd: impl Into<String>, group: impl Into<String>) -> Accounts {
        Accounts {
            passwd: passwd.into(),
            group: group.into(),
        }
    }

    /// This host's `/etc/passwd` and `/etc/group` (empty texts where unreadable).
    pub fn system() -> Accounts {
        Accounts::new(
            std::fs::read_to_string("/etc/passwd").unwrap_or_default(),
            std::fs::read_to_string("/etc/group").unwrap_or_default(),
        )
    }

    fn passwd_entries(&self) -> impl Iterator<Item = (&str, u32, u32)> {
        self.passwd.lines().filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            Some((
                *f.first()?,
                f.get(2)?.parse().ok()?,
                f.get(3)?.parse().ok()?,
            ))
        })
    }

    fn group_entries(&self) -> impl Iterator<Item = (&str, u32, Vec<&str>)> {
        self.group.lines().filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            let members = f
                .get(3)
                .map(|m| m.split(',').filter(|m| !m.is_empty()).collect())
                .unwrap_or_default();
            Some((*f.first()?, f.get(2)?.parse().ok()?, members))
        })
    }

    /// The account `name`, with its groups; `None` if there is no such user.
    pub fn user(&self, name: &str) -> Option<Account> {
        let (_, uid, gid) = self.passwd_entries().find(|(n, _, _)| *n == name)?;
        let groups = self
            .group_entries()
            .filter(|(_, g, members)| *g != gid && members.contains(&name))
            .map(|(_, g, _)| g)
            .collect();
        Some(Account {
            name: name.to_owned(),
            uid,
            gid,
            groups,
        })
    }

    /// The name of user `uid`, or the number.
    pub fn user_name(&self, uid: u32) -> String {
        self.passwd_entries()
            .find(|(_, u, _)| *u == uid)
            .map_or_else(|| uid.to_string(), |(n, _, _)| n.to_owned())
    }

    /// The name of group `gid`, or the number.
    pub fn group_name(&self, gid: u32) -> String {
        self.group_entries()
            .find(|(_, g, _)| *g == gid)
            .map_or_else(|| gid.to_string(), |(n, _, _)| n.to_owned())
    }
}

/// One file or directory on a path: owner, group and permission bits (`st_mode & 0o7777`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// The path up to this component.
    pub path: PathBuf,
    /// Owner uid.
    pub uid: u32,
    /// Group gid.
    pub gid: u32,
    /// Permission bits.
    pub mode: u32,
}

/// Read permission (`r`).
pub const READ: u32 = 4;
/// Write permission (`w`).
pub const WRITE: u32 = 2;
/// Enter (search) a directory, execute a file (`x`).
pub const ENTER: u32 = 1;

/// Whether `account` has every permission of `want` (a sum of [`READ`], [`WRITE`],
/// [`ENTER`]) on `node`: the owner class if it owns it, else the group class if one of its
/// groups is the node's, else the other class (POSIX.1 "file access permissions"). uid 0
/// has them all.
pub fn allowed(account: &Account, node: &Node, want: u32) -> bool {
    if account.uid == 0 {
        return true;
    }
    let bits = if node.uid == account.uid {
        node.mode >> 6
    } else if node.gid == account.gid || account.groups.contains(&node.gid) {
        node.mode >> 3
    } else {
        node.mode
    } & 7;
    bits & want == want
}

fn verb(want: u32) -> &'static str {
    match want {
        READ => "read",
        ENTER => "enter",
        w if w == READ | WRITE | ENTER => "read, write and enter",
        w if w == WRITE | ENTER => "create files in",
        _ => "use",
    }
}

/// Checks `chain` (the directories from `/` down, then the target) for `account`: every
/// directory before the last must let it enter, the last must grant `want`. The first
/// refusal in words: which path, what it needs, owner, group and mode.
///
/// # Errors
/// The refusal, e.g. `cannot read /etc/uctel/agent.token: owner root, group root, mode 0600`.
pub fn check_chain(
    accounts: &Accounts,
    account: &Account,
    chain: &[Node],
    want: u32,
) -> Result<(), String> {
    let Some((last, dirs)) = chain.split_last() else {
        return Ok(());
    };
    for (node, need) in dirs
        .iter()
        .map(|d| (d, ENTER))
        .chain(std::iter::once((last, want)))
    {
        if !allowed(account, node, need) {
            return Err(format!(
                "cannot {} {}: owner {}, group {}, mode {:04o}",
                verb(need),
                node.path.display(),
                accounts.user_name(node.uid),
                accounts.group_name(node.gid),
                node.mode
            ));
        }
    }
    Ok(())
}

/// The chain of `path` on this host: `/`, each directory down to it, and `path` itself, each
/// stat(2)ed (symbolic links followed, as an open would).
///
/// # Errors
/// stat(2)'s error for the first component that cannot be read.
pub fn chain_of(path: &Path) -> std::io::Result<Vec<Node>> {
    use std::os::unix::fs::MetadataExt;
    let absolute = std::path::absolute(path)?;
    let mut walked = PathBuf::new();
    let mut out = Vec::new();
    for c in absolute.components() {
        match c {
            Component::ParentDir => {
                walked.pop();
                continue;
            }
            Component::CurDir => continue,
            _ => walked.push(c),
        }
        let m = std::fs::metadata(&walked)?;
        out.push(Node {
            path: walked.clone(),
            uid: m.uid(),
            gid: m.gid(),
            mode: m.mode() & 0o7777,
        });
    }
    Ok(out)
}

/// What [`check`] found: problems (the service will fail: `--check-config` exits 2) and
/// notes (worth knowing, not fatal), each `(key, text)`; the key is empty for the
/// configuration file itself.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Findings {
    /// The service cannot start this way.
    pub problems: Vec<(String, String)>,
    /// Worth knowing.
    pub notes: Vec<String>,
}

/// Checks what the agent needs at start (module docs) for `account`, from the files on this
/// host: `config_file` and `config`'s token file and state directory.
pub fn check(
    accounts: &Accounts,
    account: &Account,
    config_file: &Path,
    config: &AgentConfig,
) -> Findings {
    let mut f = Findings::default();
    let who = format!(
        "the service user {} (uid {}, groups {})",
        account.name,
        account.uid,
        std::iter::once(account.gid)
            .chain(account.groups.iter().copied())
            .map(|g| accounts.group_name(g))
            .collect::<Vec<_>>()
            .join(",")
    );
    let mut need = |key: &str, path: &Path, want: u32, fatal: bool, hint: &str| {
        let result = match chain_of(path) {
            Ok(chain) => check_chain(accounts, account, &chain, want),
            // What root cannot stat is reported by root's own check.
            Err(_) => Ok(()),
        };
        if let Err(why) = result {
            let text = format!("{who} {why}{hint}");
            if fatal {
                f.problems.push((key.to_owned(), text));
            } else {
                f.notes.push(format!("{key}: {text}"));
            }
        }
    };
    need("", config_file, READ, true, "");
    if let Some(token) = &config.auth.token_file {
        need(
            "auth.token_file",
            token,
            READ,
            true,
            " (the packages install it owner root, group uctel, mode 0640)",
        );
    }
    if let (Some(dir), false) = (
        &config.sources.state_directory,
        config.sources.logs.is_empty(),
    ) {
        let unit_dir = std::path::absolute(dir).is_ok_and(|d| d == Path::new(UNIT_STATE_DIRECTORY));
        let hint = if unit_dir {
            " (systemd's StateDirectory=uctel-agent gives it to the service user when the unit \
             starts; a manual run as that user fails)"
        } else {
            ""
        };
        if dir.exists() {
            need(
                "sources.state_directory",
                dir,
                READ | WRITE | ENTER,
                !unit_dir,
                hint,
            );
        } else if let Some(parent) = dir.ancestors().skip(1).find(|a| a.exists()) {
            need(
                "sources.state_directory",
                parent,
                WRITE | ENTER,
                !unit_dir,
                hint,
            );
        }
    }
    f
}

/// Whether this process runs as root (effective UID 0): only then does `--check-config`
/// check the files for the service's user.
pub fn running_as_root() -> bool {
    rustix::process::geteuid().is_root()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\n\
        uctel:x:999:990::/nonexistent:/usr/sbin/nologin\n\
        alice:x:1000:1000::/home/alice:/bin/bash\n";
    const GROUP: &str = "root:x:0:\nadm:x:4:alice,uctel\nuctel:x:990:\nalice:x:1000:\n";

    fn accounts() -> Accounts {
        Accounts::new(PASSWD, GROUP)
    }

    fn node(path: &str, uid: u32, gid: u32, mode: u32) -> Node {
        Node {
            path: path.into(),
            uid,
            gid,
            mode,
        }
    }

    #[test]
    fn accounts_come_from_passwd_and_group() {
        let a = accounts();
        let uctel = a.user("uctel").unwrap_or_else(|| panic!("no uctel"));
        assert_eq!((uctel.uid, uctel.gid, uctel.groups), (999, 990, vec![4]));
        assert_eq!(a.user("nobody"), None);
        assert_eq!(a.user_name(0), "root");
        assert_eq!(a.group_name(990), "uctel");
        assert_eq!(a.group_name(12345), "12345");
    }

    #[test]
    fn the_owner_class_then_the_group_class_then_the_others_decide() {
        let a = accounts();
        let uctel = a.user("uctel").unwrap_or_else(|| panic!("no uctel"));
        // The packaged token: root:uctel 0640.
        assert!(allowed(&uctel, &node("/t", 0, 990, 0o640), READ));
        // Only root can read it.
        assert!(!allowed(&uctel, &node("/t", 0, 0, 0o600), READ));
        // A supplementary group counts.
        assert!(allowed(&uctel, &node("/t", 0, 4, 0o640), READ));
        // The owner class applies to the owner even when the group class would allow.
        assert!(!allowed(&uctel, &node("/t", 999, 990, 0o070), READ));
        assert!(allowed(&uctel, &node("/t", 0, 0, 0o604), READ));
        assert!(!allowed(
            &uctel,
            &node("/d", 999, 990, 0o500),
            READ | WRITE | ENTER
        ));
        let root = a.user("root").unwrap_or_else(|| panic!("no root"));
        assert!(allowed(&root, &node("/t", 1, 1, 0), READ | WRITE));
    }

    #[test]
    fn a_refusal_names_the_path_owner_group_and_mode() {
        let a = accounts();
        let uctel = a.user("uctel").unwrap_or_else(|| panic!("no uctel"));
        let chain = [
            node("/", 0, 0, 0o755),
            node("/etc", 0, 0, 0o755),
            node("/etc/uctel", 0, 0, 0o700),
            node("/etc/uctel/agent.token", 0, 990, 0o640),
        ];
        assert_eq!(
            check_chain(&a, &uctel, &chain, READ),
            Err("cannot enter /etc/uctel: owner root, group root, mode 0700".to_owned())
        );
        let mut open = chain.clone();
        open[2].mode = 0o755;
        assert_eq!(check_chain(&a, &uctel, &open, READ), Ok(()));
        open[3].gid = 0;
        assert_eq!(
            check_chain(&a, &uctel, &open, READ),
            Err("cannot read /etc/uctel/agent.token: owner root, group root, mode 0640".to_owned())
        );
    }
}
