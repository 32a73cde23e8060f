//! The operating system under a row: process memory (`/proc/<pid>/status`), root and the
//! tools a row needs, free ports on an address, and the OS-level faults: [`Tmpfs`] (a small
//! file system under the log sink, for "disk full"), [`NetNs`] (the agent in its own network
//! namespace behind a veth pair, so an nft rule there cannot touch the host's ruleset) and
//! [`Blackhole`] (an nft drop rule on the UDP path, in that namespace or on loopback).

use std::io::Write as _;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// `(VmRSS, VmHWM)` of process `pid` in KiB.
pub fn memory_kib(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// Whether this process runs with effective uid 0.
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

/// The path of program `name` on `PATH` or in `/usr/sbin`, `/sbin`.
pub fn tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Runs `program args…` with `stdin`, returning stdout or `program args: status: stderr`.
///
/// # Errors
/// The program could not be run or exited unsuccessfully.
pub fn run_cmd(program: &str, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
    let exe = tool(program).ok_or_else(|| format!("{program}: not installed"))?;
    let mut child = Command::new(&exe)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{program}: {e}"))?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes())
            .map_err(|e| format!("{program}: writing stdin: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{program} {}: {}: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Why a row that needs root (and `tools`) cannot run here, or `None` when it can.
pub fn root_missing(tools: &[&str]) -> Option<String> {
    if !is_root() {
        return Some("needs root (mount, network namespaces, nft)".into());
    }
    let missing: Vec<&str> = tools
        .iter()
        .copied()
        .filter(|t| tool(t).is_none())
        .collect();
    if missing.is_empty() {
        None
    } else {
        Some(format!(
            "needs {} (scripts/install-deps installs them)",
            missing.join(", ")
        ))
    }
}

/// A free TCP+UDP port on `ip`.
///
/// # Panics
/// If none is found in 100 tries.
pub fn free_addr_on(ip: Ipv4Addr) -> SocketAddr {
    if ip == Ipv4Addr::LOCALHOST {
        return crate::net::free_addr();
    }
    for _ in 0..100 {
        let Ok(l) = TcpListener::bind((ip, 0)) else {
            continue;
        };
        let Ok(a) = l.local_addr() else { continue };
        if UdpSocket::bind(a).is_ok() {
            return a;
        }
    }
    panic!("no free port on {ip}");
}

// ---------------------------------------------------------------------------------------------
// OS-level faults

/// A tmpfs mounted by the test (root), unmounted on drop (lazily if still busy).
#[derive(Debug)]
pub struct Tmpfs {
    /// The mount point.
    pub path: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size_kib` KiB at `path` (created).
    ///
    /// # Errors
    /// `mount` failed.
    pub fn mount(path: &Path, size_kib: u64) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let p = path.display().to_string();
        run_cmd(
            "mount",
            &[
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size_kib}k"),
                "tmpfs",
                &p,
            ],
            None,
        )?;
        Ok(Tmpfs {
            path: path.to_path_buf(),
        })
    }

    /// Changes the size (`mount -o remount,size=`): larger to give the sink room again.
    ///
    /// # Errors
    /// `mount` failed.
    pub fn resize(&self, size_kib: u64) -> Result<(), String> {
        let p = self.path.display().to_string();
        run_cmd(
            "mount",
            &["-o", &format!("remount,size={size_kib}k"), &p],
            None,
        )
        .map(|_| ())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let p = self.path.display().to_string();
        if run_cmd("umount", &[&p], None).is_err() {
            let _ = run_cmd("umount", &["-l", &p], None);
        }
    }
}

/// A network namespace joined to the host by a veth pair (`host_ip` ↔ `ns_ip`, a /30), for
/// the agent: the nft rule of a blackhole row lives in it and cannot touch the host's
/// ruleset, and the test process still reaches both ends. Deleted on drop (the veth pair
/// goes with it).
#[derive(Debug)]
pub struct NetNs {
    /// Namespace name.
    pub name: String,
    /// Host end address (the collector listens here).
    pub host_ip: Ipv4Addr,
    /// Namespace end address (the agent's `/metrics`).
    pub ns_ip: Ipv4Addr,
}

impl NetNs {
    /// Creates namespace `ucfm<pid>` with veth `ucfmh<pid>` (host) ↔ `ucfmn<pid>` (inside),
    /// MTU 9000 so a 4096-byte RoCEv2 packet is not fragmented, loopback up inside.
    ///
    /// # Errors
    /// An `ip` command failed (no namespaces in this container, no root); whatever was made
    /// is removed.
    pub fn create() -> Result<NetNs, String> {
        let pid = std::process::id();
        let name = format!("ucfm{}", pid % 10_000_000);
        let host_if = format!("ucfmh{}", pid % 1_000_000);
        let ns_if = format!("ucfmn{}", pid % 1_000_000);
        // 10.213.a.b/30 from the pid: two test processes at once get different links.
        let a = u8::try_from((pid >> 6) & 0xff).unwrap_or(0);
        let b = u8::try_from((pid & 0x3f) << 2).unwrap_or(0);
        let host_ip = Ipv4Addr::new(10, 213, a, b | 1);
        let ns_ip = Ipv4Addr::new(10, 213, a, b | 2);
        let _ = run_cmd("ip", &["netns", "del", &name], None);
        let ns = NetNs {
            name: name.clone(),
            host_ip,
            ns_ip,
        };
        let host_cidr = format!("{host_ip}/30");
        let ns_cidr = format!("{ns_ip}/30");
        let steps: [&[&str]; 8] = [
            &["netns", "add", &name],
            &[
                "link", "add", &host_if, "mtu", "9000", "type", "veth", "peer", "name", &ns_if,
                "mtu", "9000", "netns", &name,
            ],
            &["addr", "add", &host_cidr, "dev", &host_if],
            &["link", "set", &host_if, "up"],
            &["-n", &name, "addr", "add", &ns_cidr, "dev", &ns_if],
            &["-n", &name, "link", "set", &ns_if, "up"],
            &["-n", &name, "link", "set", "lo", "up"],
            &["-n", &name, "route", "show"],
        ];
        for args in steps {
            run_cmd("ip", args, None)?;
        }
        // Both ends answer once the link is up (DAD does not apply to IPv4).
        crate::wait_for(
            "veth up",
            Duration::from_secs(5),
            Duration::from_millis(50),
            || {
                TcpListener::bind((host_ip, 0))
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            },
        )?;
        Ok(ns)
    }

    /// A script that runs `binary` with its arguments inside the namespace
    /// (`ip netns exec` execs it, so the daemon keeps the script's pid).
    ///
    /// # Panics
    /// If the script cannot be written.
    pub fn wrapper(&self, binary: &Path, dir: &Path) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let ip = tool("ip").unwrap_or_else(|| PathBuf::from("ip"));
        let name = binary
            .file_name()
            .map_or("daemon".into(), |n| n.to_string_lossy().into_owned());
        let path = dir.join(format!("{name}-in-{}.sh", self.name));
        let script = format!(
            "#!/bin/sh\nexec {} netns exec {} {} \"$@\"\n",
            ip.display(),
            self.name,
            binary.display()
        );
        std::fs::write(&path, script).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
            .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
        path
    }

    /// Runs `nft -f -` with `script` inside the namespace.
    ///
    /// # Errors
    /// nft failed.
    pub fn nft(&self, script: &str) -> Result<String, String> {
        run_cmd(
            "ip",
            &["netns", "exec", &self.name, "nft", "-f", "-"],
            Some(script),
        )
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = run_cmd("ip", &["netns", "del", &self.name], None);
    }
}

/// An nft table whose output chain can drop every UDP datagram to one port: inside a
/// [`NetNs`], or on loopback in the host's namespace (a table of its own, deleted on drop).
#[derive(Debug)]
pub struct Blackhole {
    table: String,
    port: u16,
    netns: Option<String>,
}

impl Blackhole {
    /// Creates the (empty, accepting) table; `netns` is the namespace to create it in.
    ///
    /// # Errors
    /// nft failed.
    pub fn new(port: u16, netns: Option<&NetNs>) -> Result<Blackhole, String> {
        let b = Blackhole {
            table: format!("uctel_fault_matrix_{}", std::process::id()),
            port,
            netns: netns.map(|n| n.name.clone()),
        };
        b.nft(&format!(
            "table inet {t} {{\n  chain out {{ type filter hook output priority 0; policy accept; }}\n}}\n",
            t = b.table
        ))?;
        Ok(b)
    }

    fn nft(&self, script: &str) -> Result<String, String> {
        match &self.netns {
            Some(ns) => run_cmd("ip", &["netns", "exec", ns, "nft", "-f", "-"], Some(script)),
            None => run_cmd("nft", &["-f", "-"], Some(script)),
        }
    }

    /// Drops every UDP datagram to the port from now on.
    ///
    /// # Errors
    /// nft failed.
    pub fn engage(&self) -> Result<(), String> {
        self.nft(&format!(
            "add rule inet {} out udp dport {} counter drop\n",
            self.table, self.port
        ))
        .map(|_| ())
    }

    /// Lets datagrams through again; returns the packets the rule dropped.
    ///
    /// # Errors
    /// nft failed.
    pub fn release(&self) -> Result<u64, String> {
        let listing = match &self.netns {
            Some(ns) => run_cmd(
                "ip",
                &[
                    "netns",
                    "exec",
                    ns,
                    "nft",
                    "list",
                    "table",
                    "inet",
                    &self.table,
                ],
                None,
            )?,
            None => run_cmd("nft", &["list", "table", "inet", &self.table], None)?,
        };
        let dropped = listing
            .split_whitespace()
            .skip_while(|t| *t != "packets")
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        self.nft(&format!("flush chain inet {} out\n", self.table))?;
        Ok(dropped)
    }

    /// Where the rule lives, for the row's output.
    pub fn describe(&self) -> String {
        match &self.netns {
            Some(ns) => format!("nft table inet {} in network namespace {ns}", self.table),
            None => format!("nft table inet {} on the host (loopback)", self.table),
        }
    }
}

impl Drop for Blackhole {
    fn drop(&mut self) {
        let _ = self.nft(&format!("delete table inet {}\n", self.table));
    }
}
