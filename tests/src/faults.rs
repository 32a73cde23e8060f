//! Support for the fault matrix (`tests/tests/fault_matrix.rs`): one row per fault, every row
//! checked against the same conservation law through the real binaries.
//!
//! Layout:
//! - [`Rng`], [`row_seed`]: the row's seed (printed; `UCTEL_FAULT_SEED` overrides it) drives
//!   the fault injector, the line padding and the burst sizes.
//! - [`LineSource`]: a log file the test writes numbered, unique lines into
//!   (`row=<row> src=<src> seq=<i> pad=<seeded>`), and the rotations an operator's logrotate
//!   does to it.
//! - [`Delivered`]: the collector's JSON Lines sink read back (rotated files included):
//!   distinct lines per agent and source, duplicates, lines whose text changed, torn lines.
//! - [`Monotonic`]: every `*_total` series of every scrape, per daemon process, must never go
//!   down.
//! - [`memory_kib`]: `VmRSS` / `VmHWM` of a daemon from `/proc/<pid>/status`.
//! - OS-level faults: [`Tmpfs`] (a small file system under the log sink, for "disk full"),
//!   [`NetNs`] (the agent in its own network namespace behind a veth pair, so an nft rule
//!   there cannot touch the host's ruleset) and [`Blackhole`] (an nft drop rule on the UDP
//!   path, in that namespace or, where namespaces are not available, on loopback).
//! - [`Row`]: a collector and its agents configured from `config/*.yaml`, every scrape
//!   recorded, quiesced the README's way (agent SIGTERM → Goodbye) and judged by
//!   [`Row::verdict`]: per agent and stream, `written = delivered + lost + dropped` (records)
//!   and `sent = received + lost + dropped` (frames), nothing delivered twice, no panic,
//!   bounded memory, `/metrics` still served. A failing row panics with the seed and a table
//!   of every term.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::io::Write as _;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_yaml::{Mapping, Value};

use crate::configs::{AgentOptions, CollectorAddrs, Yaml};
use crate::daemon::Daemon;
use crate::exposition::{scrape, Scrape};
use crate::pipeline::{strip_ansi, CollectorFigures, STREAMS};

// ---------------------------------------------------------------------------------------------
// Seeds

/// A small seeded generator (SplitMix64): the tests crate takes no RNG dependency, and the
/// same seed must give the same row on every machine.
#[derive(Debug, Clone)]
pub struct Rng(u64);

/// One SplitMix64 step of `z` (also a good 64-bit mixer).
pub fn mix(z: u64) -> u64 {
    let mut z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next_u64() % (hi - lo + 1)
    }
}

/// The seed of row `row`: `UCTEL_FAULT_SEED` (decimal or `0x` hex) when set, otherwise a hash
/// of the row name, so every run of a row is the same run unless asked otherwise. Kept below
/// 2^48 so YAML, JSON and logs carry it exactly.
pub fn row_seed(row: &str) -> u64 {
    if let Ok(v) = std::env::var("UCTEL_FAULT_SEED") {
        let v = v.trim();
        let parsed = match v.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).ok(),
            None => v.parse().ok(),
        };
        if let Some(s) = parsed {
            return s & 0xFFFF_FFFF_FFFF;
        }
    }
    // FNV-1a.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in row.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    mix(h) & 0xFFFF_FFFF_FFFF
}

// ---------------------------------------------------------------------------------------------
// The source: numbered lines

const PAD_ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";

/// The exact text of line `seq` of source `src` in row `row` with seed `seed` (no newline):
/// `row=<row> src=<src> seq=<seq> pad=<24..=119 seeded characters>`.
pub fn line_text(row: &str, src: &str, seed: u64, seq: u64) -> String {
    let mut r = Rng::new(seed ^ mix(seq.wrapping_add(0x5eed)));
    let n = usize::try_from(r.range(24, 119)).unwrap_or(24);
    let mut s = format!("row={row} src={src} seq={seq} pad=");
    s.reserve(n);
    for _ in 0..n {
        let i = usize::try_from(r.next_u64() % PAD_ALPHABET.len() as u64).unwrap_or(0);
        s.push(char::from(PAD_ALPHABET[i]));
    }
    s
}

/// Parses `row=<row> src=<src> seq=<seq> ...` into `(row, src, seq)`.
pub fn parse_line(message: &str) -> Option<(&str, &str, u64)> {
    let mut it = message.split(' ');
    let row = it.next()?.strip_prefix("row=")?;
    let src = it.next()?.strip_prefix("src=")?;
    let seq = it.next()?.strip_prefix("seq=")?.parse().ok()?;
    Some((row, src, seq))
}

/// A log file the test appends numbered lines to. `written` counts every line ever written
/// by this source, whatever file it went to.
#[derive(Debug)]
pub struct LineSource {
    /// Row name (first field of every line).
    pub row: String,
    /// Source tag (second field).
    pub src: String,
    /// The row's seed (padding).
    pub seed: u64,
    /// The path lines are appended to.
    pub path: PathBuf,
    /// Lines written so far; the next line is `seq = written`.
    pub written: u64,
}

impl LineSource {
    /// A source appending to `path`, created empty now.
    ///
    /// # Panics
    /// If the file cannot be created.
    pub fn create(row: &str, src: &str, seed: u64, path: &Path) -> LineSource {
        std::fs::write(path, "").unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
        LineSource {
            row: row.to_owned(),
            src: src.to_owned(),
            seed,
            path: path.to_path_buf(),
            written: 0,
        }
    }

    /// Appends the next `n` lines in one write.
    ///
    /// # Panics
    /// If the file cannot be written.
    pub fn append(&mut self, n: u64) {
        let mut buf = String::new();
        for seq in self.written..self.written + n {
            buf.push_str(&line_text(&self.row, &self.src, self.seed, seq));
            buf.push('\n');
        }
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .unwrap_or_else(|e| panic!("{}: {e}", self.path.display()));
        f.write_all(buf.as_bytes())
            .unwrap_or_else(|e| panic!("{}: {e}", self.path.display()));
        self.written += n;
    }

    /// create-rotation: `mv path to; : > path` (the writer goes on in the new file).
    ///
    /// # Panics
    /// If a file operation fails.
    pub fn rotate_create(&mut self, to: &Path) {
        std::fs::rename(&self.path, to).unwrap_or_else(|e| panic!("mv: {e}"));
        std::fs::write(&self.path, "").unwrap_or_else(|e| panic!("create: {e}"));
    }

    /// copytruncate: `cp path to; : > path` (same inode, emptied).
    ///
    /// # Panics
    /// If a file operation fails.
    pub fn rotate_copytruncate(&mut self, to: &Path) {
        std::fs::copy(&self.path, to).unwrap_or_else(|e| panic!("cp: {e}"));
        self.truncate();
    }

    /// Truncation in place (`: > path`).
    ///
    /// # Panics
    /// If the file cannot be truncated.
    pub fn truncate(&mut self) {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&self.path)
            .unwrap_or_else(|e| panic!("{}: {e}", self.path.display()));
        f.set_len(0).unwrap_or_else(|e| panic!("truncate: {e}"));
    }
}

// ---------------------------------------------------------------------------------------------
// The sink: the collector's JSON Lines read back

/// What the collector's JSON Lines sink holds for one row.
#[derive(Debug, Default, Clone)]
pub struct Delivered {
    /// `(agent, src)` → `seq` → how many times the line is in the sink.
    pub lines: BTreeMap<(String, String), BTreeMap<u64, u64>>,
    /// Records of this row whose message is not the line written (first few kept).
    pub mismatched: Vec<String>,
    /// How many such records.
    pub mismatched_count: u64,
    /// Lines of the sink files that are not a JSON object with `agent` and `message`
    /// (first few kept).
    pub torn: Vec<String>,
    /// How many such lines.
    pub torn_count: u64,
    /// Records from other rows or other programs.
    pub foreign: u64,
    /// Sink files read.
    pub files: Vec<PathBuf>,
}

impl Delivered {
    /// Reads `sink` and its rotated files `sink.1`, `sink.2`, … (oldest last).
    pub fn read(sink: &Path, row: &str, seed: u64) -> Delivered {
        let mut d = Delivered::default();
        let mut paths = vec![sink.to_path_buf()];
        for n in 1..=1000 {
            let mut p = sink.as_os_str().to_owned();
            p.push(format!(".{n}"));
            let p = PathBuf::from(p);
            if !p.exists() {
                break;
            }
            paths.push(p);
        }
        for p in paths {
            let Ok(bytes) = std::fs::read(&p) else {
                continue;
            };
            d.files.push(p);
            for raw in bytes.split(|b| *b == b'\n') {
                if raw.is_empty() {
                    continue;
                }
                d.record(raw, row, seed);
            }
        }
        d
    }

    fn record(&mut self, raw: &[u8], row: &str, seed: u64) {
        let parsed: Option<serde_json::Value> = serde_json::from_slice(raw).ok();
        let fields = parsed.as_ref().and_then(|v| {
            Some((
                v.get("agent")?.as_str()?.to_owned(),
                v.get("message")?.as_str()?.to_owned(),
            ))
        });
        let Some((agent, message)) = fields else {
            self.torn_count += 1;
            if self.torn.len() < 3 {
                let text = String::from_utf8_lossy(raw);
                self.torn.push(text.chars().take(160).collect());
            }
            return;
        };
        match parse_line(&message) {
            Some((r, src, seq)) if r == row => {
                if message != line_text(row, src, seed, seq) {
                    self.mismatched_count += 1;
                    if self.mismatched.len() < 3 {
                        self.mismatched.push(message.chars().take(160).collect());
                    }
                    return;
                }
                *self
                    .lines
                    .entry((agent, src.to_owned()))
                    .or_default()
                    .entry(seq)
                    .or_default() += 1;
            }
            _ => self.foreign += 1,
        }
    }

    /// Distinct lines of `src` delivered for `agent`.
    pub fn distinct(&self, agent: &str, src: &str) -> u64 {
        self.lines
            .get(&(agent.to_owned(), src.to_owned()))
            .map_or(0, |m| m.len() as u64)
    }

    /// Extra copies of lines of `src` delivered for `agent` (0 when nothing is repeated).
    pub fn duplicates(&self, agent: &str, src: &str) -> u64 {
        self.lines
            .get(&(agent.to_owned(), src.to_owned()))
            .map_or(0, |m| m.values().map(|n| n.saturating_sub(1)).sum())
    }

    /// Whether line `seq` of `src` reached the sink for `agent`.
    pub fn has(&self, agent: &str, src: &str, seq: u64) -> bool {
        self.lines
            .get(&(agent.to_owned(), src.to_owned()))
            .is_some_and(|m| m.contains_key(&seq))
    }

    /// Lines of `src` delivered for `agent` whose `seq` is not below `written` (never
    /// written: invented or from a wrong source).
    pub fn beyond(&self, agent: &str, src: &str, written: u64) -> u64 {
        self.lines
            .get(&(agent.to_owned(), src.to_owned()))
            .map_or(0, |m| m.range(written..).count() as u64)
    }

    /// The first few repeated `seq`s of `src` for `agent`, for failure messages.
    pub fn repeated_examples(&self, agent: &str, src: &str) -> Vec<u64> {
        self.lines
            .get(&(agent.to_owned(), src.to_owned()))
            .map(|m| {
                m.iter()
                    .filter(|(_, n)| **n > 1)
                    .map(|(s, _)| *s)
                    .take(8)
                    .collect()
            })
            .unwrap_or_default()
    }
}

// ---------------------------------------------------------------------------------------------
// Counters never go down

/// Remembers every `*_total` series per daemon process and flags a decrease.
#[derive(Debug, Default)]
pub struct Monotonic {
    last: HashMap<String, f64>,
    /// Decreases seen (first few kept).
    pub violations: Vec<String>,
    /// How many decreases.
    pub violation_count: u64,
    /// Scrapes observed.
    pub scrapes: u64,
}

impl Monotonic {
    /// Checks the `*_total` samples of `s` whose names start with `prefix` against the last
    /// scrape of the same process (`daemon`, `pid`).
    pub fn observe(&mut self, daemon: &str, pid: u32, prefix: &str, s: &Scrape) {
        self.scrapes += 1;
        for smp in &s.samples {
            if !(smp.name.starts_with(prefix) && smp.name.ends_with("_total")) {
                continue;
            }
            let mut key = format!("{daemon}[{pid}] {}{{", smp.name);
            for (k, v) in &smp.labels {
                let _ = write!(key, "{k}={v:?},");
            }
            key.push('}');
            if let Some(prev) = self.last.insert(key.clone(), smp.value) {
                if smp.value < prev {
                    self.violation_count += 1;
                    if self.violations.len() < 8 {
                        self.violations
                            .push(format!("{key}: {prev} -> {}", smp.value));
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Processes, privileges, tools

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

// ---------------------------------------------------------------------------------------------
// The row fixture

/// Generous memory bound for either daemon (debug build), KiB.
pub const MAX_HWM_KIB: u64 = 512 * 1024;

/// How a row's law is judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Law {
    /// Every record is accounted exactly: `written = delivered + lost + dropped`.
    Exact,
    /// A daemon died without Goodbye: `delivered + lost + dropped ≤ written`; the rest is
    /// the unknowable tail, which the collector should report (see [`UNKNOWN_TAIL_HINT`]).
    AtMost,
}

/// Substrings of a metric name (with `records` in it) that would report the unknowable tail
/// of a session that ended without Goodbye: on the collector with `agent` and `stream`
/// labels (an agent that vanished: DESIGN.md §6 has heartbeats carry the sequences for
/// that), on the agent with a `stream` label (records posted but never confirmed by a
/// collector that died). No such metric exists at the time of writing; when one appears,
/// the kill rows use the sum as the bound of what is unaccounted.
pub const UNKNOWN_TAIL_HINT: [&str; 4] = ["unknown", "unaccounted", "unreported", "unconfirmed"];

/// Sum of the samples of `s` that report an unknown tail for the log stream (see
/// [`UNKNOWN_TAIL_HINT`]), `agent` label required when `agent` is given.
fn unknown_tail(s: &Scrape, prefix: &str, agent: Option<&str>) -> Option<u64> {
    let mut total = None;
    for smp in &s.samples {
        if smp.name.starts_with(prefix)
            && smp.name.contains("records")
            && UNKNOWN_TAIL_HINT.iter().any(|h| smp.name.contains(h))
            && agent.is_none_or(|a| smp.label("agent") == Some(a))
            && smp.label("stream") == Some("logs")
        {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let v = smp.value.max(0.0).round() as u64;
            *total.get_or_insert(0) += v;
        }
    }
    total
}

/// Collector settings of a row.
#[derive(Debug, Clone, Default)]
pub struct CollectorSpec {
    /// The JSON Lines sink path (default `<dir>/collector-logs.jsonl`).
    pub sink: Option<PathBuf>,
    /// Address the control plane and the soft UDP socket listen on (default loopback).
    pub listen_ip: Option<Ipv4Addr>,
    /// Put the sink on a tmpfs of this many KiB mounted at `<dir>/sinkfs` (root).
    pub sink_tmpfs_kib: Option<u64>,
    /// Extra `key → value` settings (dotted keys).
    pub set: Vec<(String, Value)>,
}

/// What a row accepts beyond the plain law.
#[derive(Debug, Clone)]
pub struct Allow {
    /// Lines an agent never read stay in its files (a twin kept out by the collector): the
    /// law gets the term `written − read by the agent`.
    pub unread: bool,
    /// Sessions that may end without Goodbye since the frame baseline (a replaced twin);
    /// the frame rule is then not exact and only shown.
    pub sessions_without_goodbye: usize,
    /// How long [`Row::quiesce`] waits for each agent to settle.
    pub settle: Duration,
    /// Handshakes refused as `duplicate_agent_id` are expected (twin agent ids); elsewhere
    /// every agent has its own id and a refusal is a failure (an agent restarted after its
    /// Goodbye taken for a second live agent).
    pub duplicate_refusals: bool,
}

impl Default for Allow {
    fn default() -> Self {
        Allow {
            unread: false,
            sessions_without_goodbye: 0,
            settle: Duration::from_secs(10),
            duplicate_refusals: false,
        }
    }
}

/// One agent of a row.
#[derive(Debug, Clone)]
pub struct AgentSpec {
    /// Unique name in the row (log file, state directory, daemon log).
    pub name: String,
    /// `agent_id` (two agents may share it).
    pub id: String,
    /// The log glob, relative to the row directory (default `<name>.log`).
    pub glob: Option<String>,
    /// `transport.soft.fault.*` settings (seeded with the row's seed).
    pub fault: Vec<(String, Value)>,
    /// Run the agent in the row's network namespace.
    pub in_netns: bool,
    /// `start_at` of the log source (default `end`, the production default).
    pub start_at: &'static str,
}

impl AgentSpec {
    /// Agent `name` with `agent_id` = `name`, following `<name>.log`.
    pub fn new(name: &str) -> AgentSpec {
        AgentSpec {
            name: name.to_owned(),
            id: name.to_owned(),
            glob: None,
            fault: Vec::new(),
            in_netns: false,
            start_at: "end",
        }
    }

    /// Sets `transport.soft.fault.<key>`.
    pub fn fault(mut self, key: &str, v: impl Into<Value>) -> AgentSpec {
        self.fault.push((key.to_owned(), v.into()));
        self
    }
}

/// What is known of one agent process (a "life"): its last scrape.
#[derive(Debug, Clone, Default)]
struct Life {
    last: Option<Scrape>,
}

/// One agent of a row.
#[derive(Debug)]
pub struct RowAgent {
    /// Its settings.
    pub spec: AgentSpec,
    /// Local `/metrics`.
    pub metrics: SocketAddr,
    /// The process.
    pub daemon: Daemon,
    /// Sources it follows (index 0 is `<name>.log`).
    pub sources: Vec<LineSource>,
    lives: Vec<Life>,
    /// Where its log starts counting sessions for the frame rule.
    log_mark: usize,
}

impl RowAgent {
    /// Lines written by all of its sources.
    pub fn written(&self) -> u64 {
        self.sources.iter().map(|s| s.written).sum()
    }
}

/// A collector and agents for one row, every scrape recorded. Fields drop in order: the
/// daemons are killed before the namespace, mount and rules under them go.
#[derive(Debug)]
pub struct Row {
    /// Row name (first field of every line).
    pub name: String,
    /// The row's seed.
    pub seed: u64,
    /// Seeded choices of the row (burst sizes).
    pub rng: Rng,
    /// Collector addresses.
    pub addrs: CollectorAddrs,
    /// The collector.
    pub collector: Daemon,
    /// Agents.
    pub agents: Vec<RowAgent>,
    /// The JSON Lines sink.
    pub sink: PathBuf,
    /// Counter monotonicity over every scrape.
    pub mono: Monotonic,
    /// Things the row noticed on the way (timeouts, fault effects), printed with the verdict.
    pub notes: Vec<String>,
    /// Failures found on the way (not only at the verdict).
    pub failures: Vec<String>,
    /// The network namespace of agents with `in_netns`.
    pub netns: Option<NetNs>,
    /// A tmpfs under the sink.
    pub tmpfs: Option<Tmpfs>,
    /// What the row accepts beyond the plain law.
    pub allow: Allow,
    collector_lives: Vec<Life>,
    collector_log_mark: usize,
    /// Collector scrape the frame rule counts from (`None`: zero, a fresh collector).
    frame_base: Option<Scrape>,
    memory: BTreeMap<String, (u64, u64)>,
    started: Instant,
    /// The run directory (last: removed after everything else).
    pub dir: tempfile::TempDir,
}

/// Tick of every wait in a row.
pub const TICK: Duration = Duration::from_millis(150);

impl Row {
    /// Starts the collector of row `name` and prints the seed.
    ///
    /// # Panics
    /// If the collector does not come up.
    pub fn start(name: &str, spec: CollectorSpec, netns: Option<NetNs>) -> Row {
        let seed = row_seed(name);
        eprintln!(
            "row={name} seed={seed:#x} (rerun with UCTEL_FAULT_SEED={seed:#x} for the same faults)"
        );
        let dir = tempfile::Builder::new()
            .prefix(&format!("uctel-fm-{name}-"))
            .tempdir()
            .unwrap_or_else(|e| panic!("tempdir: {e}"));
        let ip = spec.listen_ip.unwrap_or(Ipv4Addr::LOCALHOST);
        let addrs = CollectorAddrs {
            control: free_addr_on(ip),
            metrics: crate::net::free_addr(),
            udp: free_addr_on(ip),
        };
        let mut tmpfs = None;
        let sink = match (&spec.sink, spec.sink_tmpfs_kib) {
            (Some(p), _) => p.clone(),
            (None, Some(kib)) => {
                let fs = Tmpfs::mount(&dir.path().join("sinkfs"), kib)
                    .unwrap_or_else(|e| panic!("mounting the sink's tmpfs: {e}"));
                let p = fs.path.join("collector-logs.jsonl");
                tmpfs = Some(fs);
                p
            }
            (None, None) => dir.path().join("collector-logs.jsonl"),
        };
        let mut y = crate::configs::collector(&addrs, dir.path());
        y.set("logs.file.path", sink.display().to_string());
        for (k, v) in &spec.set {
            y.set(k, v.clone());
        }
        let config = dir.path().join("collector.yaml");
        y.write(&config);
        let collector = Daemon::start(
            "collector",
            &crate::bins::path(crate::bins::COLLECTOR),
            &config,
            dir.path(),
        );
        let mut row = Row {
            name: name.to_owned(),
            seed,
            rng: Rng::new(seed),
            addrs,
            collector,
            agents: Vec::new(),
            sink,
            mono: Monotonic::default(),
            notes: Vec::new(),
            failures: Vec::new(),
            netns,
            tmpfs,
            allow: Allow::default(),
            collector_lives: vec![Life::default()],
            collector_log_mark: 0,
            frame_base: None,
            memory: BTreeMap::new(),
            started: Instant::now(),
            dir,
        };
        row.wait_collector_up();
        row
    }

    /// The run directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    fn wait_collector_up(&mut self) {
        let addr = self.addrs.metrics;
        if let Err(e) = crate::wait_for(
            "collector /metrics",
            Duration::from_secs(30),
            Duration::from_millis(50),
            || scrape(addr).map(|_| ()),
        ) {
            panic!("{e}\n{}", self.collector.log_tail(40));
        }
    }

    /// The directory of the log files the agents follow (`<dir>/input`; the daemons' own
    /// logs are `<dir>/<name>.log`).
    pub fn input(&self) -> PathBuf {
        self.path().join("input")
    }

    /// Adds and starts an agent; its first source is `input/<name>.log` (created empty).
    ///
    /// # Panics
    /// If the config cannot be written or the agent cannot be spawned.
    pub fn add_agent(&mut self, spec: AgentSpec) -> usize {
        let dir = self.path().to_path_buf();
        let input = self.input();
        std::fs::create_dir_all(&input).unwrap_or_else(|e| panic!("{}: {e}", input.display()));
        let source = LineSource::create(
            &self.name,
            &spec.name,
            self.seed,
            &input.join(format!("{}.log", spec.name)),
        );
        let ns = if spec.in_netns {
            self.netns.as_ref()
        } else {
            None
        };
        let metrics = match ns {
            Some(n) => SocketAddr::new(n.ns_ip.into(), free_addr_on(Ipv4Addr::LOCALHOST).port()),
            None => crate::net::free_addr(),
        };
        let options = AgentOptions {
            id: spec.id.clone(),
            metrics,
            log_file: source.path.clone(),
            drop_ratio: 0.0,
            host_interval_seconds: 1.0,
        };
        let mut y: Yaml = crate::configs::agent(&options, self.addrs.control, &dir);
        let glob = spec
            .glob
            .clone()
            .unwrap_or_else(|| format!("{}.log", spec.name));
        let mut log = Mapping::new();
        log.insert("path".into(), input.join(glob).display().to_string().into());
        // `end` (the production default) applies only to the very first run (DESIGN.md §7);
        // the files exist, empty, before the agent starts, so nothing written is skipped.
        log.insert("start_at".into(), spec.start_at.into());
        log.insert("glob_interval_seconds".into(), 0.25.into());
        log.insert("poll_interval_seconds".into(), 0.05.into());
        log.insert("rotate_wait_seconds".into(), 1.0.into());
        y.set("sources.logs", Value::Sequence(vec![Value::Mapping(log)]))
            .set(
                "sources.state_directory",
                dir.join(format!("{}-state", spec.name))
                    .display()
                    .to_string(),
            )
            .remove("transport.soft.fault");
        if !spec.fault.is_empty() {
            y.set("transport.soft.fault.seed", self.seed);
            for (k, v) in &spec.fault {
                y.set(&format!("transport.soft.fault.{k}"), v.clone());
            }
        }
        let config = dir.join(format!("{}.yaml", spec.name));
        y.write(&config);
        let agent_bin = crate::bins::path(crate::bins::AGENT);
        let binary = match ns {
            Some(n) => n.wrapper(&agent_bin, &dir),
            None => agent_bin,
        };
        let daemon = Daemon::start(&spec.name, &binary, &config, &dir);
        self.agents.push(RowAgent {
            spec,
            metrics,
            daemon,
            sources: vec![source],
            lives: vec![Life::default()],
            log_mark: 0,
        });
        self.agents.len() - 1
    }

    /// Adds another source `src` at `file` (in [`Row::input`]) to agent `i`'s list (the
    /// agent's glob must match it).
    pub fn add_source(&mut self, i: usize, src: &str, file: &str) -> usize {
        let path = self.input().join(file);
        let s = LineSource::create(&self.name, src, self.seed, &path);
        self.agents[i].sources.push(s);
        self.agents[i].sources.len() - 1
    }

    /// Appends `n` lines to source `src` of agent `i`.
    pub fn write(&mut self, i: usize, src: usize, n: u64) {
        self.agents[i].sources[src].append(n);
    }

    /// Writes `total` lines to source `src` of agent `i` in seeded bursts of 50..=400 lines
    /// with `gap` between them.
    pub fn write_bursts(&mut self, i: usize, src: usize, total: u64, gap: Duration) {
        let mut left = total;
        while left > 0 {
            let n = self.rng.range(50, 400).min(left);
            self.write(i, src, n);
            left -= n;
            if left > 0 {
                std::thread::sleep(gap);
            }
        }
    }

    /// Scrapes the collector (recording the scrape).
    ///
    /// # Errors
    /// As [`scrape`].
    pub fn scrape_collector(&mut self) -> Result<Scrape, String> {
        let s = scrape(self.addrs.metrics)?;
        if let Some(pid) = self.collector.pid() {
            self.mono.observe("collector", pid, "uctel_collector_", &s);
        }
        if let Some(life) = self.collector_lives.last_mut() {
            life.last = Some(s.clone());
        }
        Ok(s)
    }

    /// Scrapes agent `i` (recording the scrape).
    ///
    /// # Errors
    /// As [`scrape`].
    pub fn scrape_agent(&mut self, i: usize) -> Result<Scrape, String> {
        let a = &mut self.agents[i];
        let s = scrape(a.metrics)?;
        if let Some(pid) = a.daemon.pid() {
            self.mono.observe(&a.spec.name, pid, "uctel_agent_", &s);
        }
        if let Some(life) = a.lives.last_mut() {
            life.last = Some(s.clone());
        }
        Ok(s)
    }

    /// Waits until `uctel_collector_agents_connected == n` and each agent in `who` says it
    /// is connected and follows its log file.
    ///
    /// # Panics
    /// On timeout, with the logs.
    pub fn wait_connected(&mut self, n: u64, who: &[usize]) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut why = String::new();
            match self.scrape_collector() {
                Ok(s) => {
                    let c = s.count("uctel_collector_agents_connected", &[]);
                    if c != n {
                        why = format!("agents_connected = {c}, want {n}");
                    }
                }
                Err(e) => why = e,
            }
            for &i in who {
                match self.scrape_agent(i) {
                    Ok(s) => {
                        if s.count("uctel_agent_connected", &[]) != 1 {
                            why = format!("{} not connected", self.agents[i].spec.name);
                        } else if s.count("uctel_agent_log_files", &[]) == 0 {
                            why = format!("{} follows no log file yet", self.agents[i].spec.name);
                        }
                    }
                    Err(e) => why = e,
                }
            }
            if why.is_empty() {
                return;
            }
            if Instant::now() >= deadline {
                let mut logs = self.collector.log_tail(30);
                for &i in who {
                    logs.push('\n');
                    logs.push_str(&self.agents[i].daemon.log_tail(30));
                }
                panic!("row {}: not connected after 30 s: {why}\n{logs}", self.name);
            }
            std::thread::sleep(TICK);
        }
    }

    /// Waits until agent `i` has read at least `min_read` lines in this life and has been
    /// idle on its log stream (queue empty, sent + dropped unchanged) for four scrapes.
    /// Returns false (and notes it) on timeout; the verdict then shows what is missing.
    pub fn wait_settled(&mut self, i: usize, min_read: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut last: Option<(u64, u64)> = None;
        let mut stable = 0;
        let mut seen = String::new();
        while Instant::now() < deadline {
            self.check_in_flight(i);
            if let Ok(s) = self.scrape_agent(i) {
                let m = [("stream", "logs")];
                let read = s.count("uctel_agent_log_records_read_total", &[]);
                let out = s.count("uctel_agent_records_sent_total", &m)
                    + s.count("uctel_agent_records_dropped_total", &m);
                let queued = s.count("uctel_agent_queue_records", &m);
                seen = format!(
                    "read {read} (want >= {min_read}), sent+dropped {out}, queued {queued}"
                );
                if queued == 0 && read >= min_read && last == Some((read, out)) {
                    stable += 1;
                    if stable >= 4 {
                        return true;
                    }
                } else {
                    stable = 0;
                }
                last = Some((read, out));
            }
            std::thread::sleep(TICK);
        }
        let name = self.agents[i].spec.name.clone();
        self.notes
            .push(format!("{name}: not settled within {timeout:?}: {seen}"));
        false
    }

    /// README "Loss accounting": at every scrape, per stream, the collector's received + lost
    /// is at most what the agent sent (nothing to subtract, loss never counted early). Checked
    /// where both counters cover the same span: the agent's first life, the collector's
    /// first life, an agent id of its own. The collector is scraped first, so the agent's
    /// counter can only be ahead.
    pub fn check_in_flight(&mut self, i: usize) {
        let id = self.agents[i].spec.id.clone();
        let shared = self.agents.iter().filter(|a| a.spec.id == id).count() > 1;
        if shared || self.agents[i].lives.len() != 1 || self.collector_lives.len() != 1 {
            return;
        }
        let (Ok(c), Ok(a)) = (self.scrape_collector(), self.scrape_agent(i)) else {
            return;
        };
        let f = CollectorFigures::read(&c, &id);
        for st in STREAMS {
            let sent = a.count("uctel_agent_frames_sent_total", &[("stream", st)]);
            let seen = f.received[st] + f.lost[st];
            let prefix = format!("agent {id} stream {st}: at a scrape");
            if seen > sent && !self.failures.iter().any(|f| f.starts_with(&prefix)) {
                self.failures.push(format!(
                    "{prefix} the collector had received {} + lost {} = {seen} frames, more than the {sent} the agent had sent",
                    f.received[st], f.lost[st]
                ));
            }
        }
    }

    /// Waits until every line `seqs` of source `src` of agent `i` is in the sink. Returns
    /// false (and notes it) on timeout.
    pub fn wait_delivered(
        &mut self,
        i: usize,
        src: usize,
        seqs: std::ops::Range<u64>,
        timeout: Duration,
    ) -> bool {
        let deadline = Instant::now() + timeout;
        let (id, tag) = (
            self.agents[i].spec.id.clone(),
            self.agents[i].sources[src].src.clone(),
        );
        let mut have = 0;
        while Instant::now() < deadline {
            let d = Delivered::read(&self.sink, &self.name, self.seed);
            have = seqs.clone().filter(|s| d.has(&id, &tag, *s)).count() as u64;
            if have == seqs.end - seqs.start {
                return true;
            }
            let _ = self.scrape_collector();
            std::thread::sleep(TICK);
        }
        self.notes.push(format!(
            "{id}/{tag}: {have} of lines {seqs:?} in the sink after {timeout:?}"
        ));
        false
    }

    /// Samples the memory of every running daemon (kept for the verdict).
    pub fn sample_memory(&mut self) {
        let mut procs: Vec<(String, Option<u32>)> =
            vec![("collector".into(), self.collector.pid())];
        for a in &self.agents {
            procs.push((a.spec.name.clone(), a.daemon.pid()));
        }
        for (name, pid) in procs {
            let Some(pid) = pid else { continue };
            if let Some((rss, hwm)) = memory_kib(pid) {
                if hwm > MAX_HWM_KIB {
                    self.failures.push(format!(
                        "{name} (pid {pid}): peak RSS {hwm} KiB above the bound {MAX_HWM_KIB} KiB"
                    ));
                }
                let e = self.memory.entry(format!("{name}[{pid}]")).or_default();
                *e = (rss, e.1.max(hwm));
            }
        }
    }

    /// SIGKILL of agent `i` (its last scrape is what is known of that life).
    pub fn kill_agent(&mut self, i: usize) {
        let _ = self.scrape_agent(i);
        self.sample_memory();
        self.agents[i].daemon.kill();
    }

    /// SIGTERM of agent `i` and a wait for its clean exit (failure noted otherwise).
    pub fn stop_agent(&mut self, i: usize) {
        if !self.agents[i].daemon.is_running() {
            return;
        }
        if let Err(e) = self.scrape_agent(i) {
            self.failures.push(format!(
                "{}: /metrics not served before SIGTERM: {e}",
                self.agents[i].spec.name
            ));
        }
        self.sample_memory();
        let a = &mut self.agents[i];
        a.daemon.signal(Signal::SIGTERM);
        match a.daemon.wait_exit(Duration::from_secs(20)) {
            Some(st) if st.success() => {}
            Some(st) => self
                .failures
                .push(format!("{} exited with {st} after SIGTERM", a.spec.name)),
            None => {
                a.daemon.kill();
                self.failures.push(format!(
                    "{} did not exit within 20 s of SIGTERM",
                    a.spec.name
                ));
            }
        }
    }

    /// Waits until the collector has closed every session (`agents_connected == 0`); notes
    /// a timeout.
    pub fn wait_sessions_closed(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(s) = self.scrape_collector() {
                if s.count("uctel_collector_agents_connected", &[]) == 0 {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.notes.push(format!(
            "collector: sessions still open {timeout:?} after the agents left"
        ));
    }

    /// Starts agent `i` again (same config and state directory): a new life.
    pub fn restart_agent(&mut self, i: usize) {
        let a = &mut self.agents[i];
        a.lives.push(Life::default());
        a.daemon.restart();
    }

    /// SIGKILL of the collector: its last scrape is what is known of that life.
    pub fn kill_collector(&mut self) {
        let _ = self.scrape_collector();
        self.sample_memory();
        self.collector.kill();
    }

    /// Starts the collector again: a new life with counters from zero; the frame rule
    /// counts from here (sessions with the old collector ended without Goodbye).
    pub fn restart_collector(&mut self) {
        self.collector_lives.push(Life::default());
        self.collector.restart();
        self.wait_collector_up();
        self.collector_log_mark = self.collector.log().len();
        self.frame_base = None;
        for a in &mut self.agents {
            a.log_mark = a.daemon.log().len();
        }
    }

    /// The frame rule counts from now: the collector's current figures are the base and
    /// only sessions logged from here on are compared (after an agent was killed and the
    /// collector closed its session).
    pub fn frame_baseline(&mut self) {
        self.frame_base = self.scrape_collector().ok();
        self.collector_log_mark = self.collector.log().len();
        for a in &mut self.agents {
            a.log_mark = a.daemon.log().len();
        }
    }

    /// Waits until the collector has closed every session (`agents_connected == 0`) and
    /// its counters stopped moving.
    pub fn wait_collector_idle(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut prev: Option<String> = None;
        while Instant::now() < deadline {
            if let Ok(s) = self.scrape_collector() {
                let key: String = s
                    .samples
                    .iter()
                    .filter(|m| {
                        m.name.starts_with("uctel_collector_") && m.name.ends_with("_total")
                    })
                    .map(|m| format!("{}{:?}={};", m.name, m.labels, m.value))
                    .collect();
                if s.count("uctel_collector_agents_connected", &[]) == 0
                    && prev.as_deref() == Some(key.as_str())
                {
                    return;
                }
                prev = Some(key);
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        self.notes.push(
            "collector: sessions still open or counters moving 20 s after the agents stopped"
                .into(),
        );
    }

    /// The README's quiescence: every running agent settles and gets SIGTERM (Goodbye), then
    /// the collector closes the sessions; `/metrics` must still be served.
    pub fn quiesce(&mut self) {
        for i in 0..self.agents.len() {
            if self.agents[i].daemon.is_running() {
                self.wait_settled(i, 0, self.allow.settle);
                self.stop_agent(i);
            }
        }
        if self.collector.is_running() {
            self.wait_collector_idle();
            self.sample_memory();
            if let Err(e) = self.scrape_collector() {
                self.failures.push(format!(
                    "collector: /metrics not served after the fault: {e}"
                ));
            }
        } else {
            self.failures
                .push("collector: not running at the end of the row".into());
        }
    }

    /// Judges the row (see the module docs) and panics with the table on failure; prints
    /// the table in any case. The collector is stopped with SIGTERM at the end.
    ///
    /// # Panics
    /// When any check failed.
    pub fn verdict(&mut self, law: Law) {
        let delivered = Delivered::read(&self.sink, &self.name, self.seed);
        let mut out = String::new();
        let mut failures = std::mem::take(&mut self.failures);
        let _ = writeln!(
            out,
            "==== row={} seed={:#x} law={law:?} run {:.1?}",
            self.name,
            self.seed,
            self.started.elapsed()
        );
        let ids: Vec<String> = {
            let mut seen = BTreeSet::new();
            self.agents
                .iter()
                .map(|a| a.spec.id.clone())
                .filter(|id| seen.insert(id.clone()))
                .collect()
        };
        let collector_final = self
            .collector_lives
            .last()
            .and_then(|l| l.last.clone())
            .unwrap_or_default();
        for id in &ids {
            self.records_law(id, law, &delivered, &mut out, &mut failures);
            self.frames_law(id, &collector_final, &mut out, &mut failures);
        }
        if delivered.mismatched_count > 0 {
            failures.push(format!(
                "{} delivered records differ from the line written, e.g. {:?}",
                delivered.mismatched_count, delivered.mismatched
            ));
        }
        if delivered.torn_count > 0 {
            failures.push(format!(
                "{} lines of the sink are not whole JSON records, e.g. {:?}",
                delivered.torn_count, delivered.torn
            ));
        }
        let refused: u64 = self
            .collector_lives
            .iter()
            .filter_map(|l| l.last.as_ref())
            .map(|s| {
                s.count(
                    "uctel_collector_handshakes_refused_total",
                    &[("reason", "duplicate_agent_id")],
                )
            })
            .sum();
        if refused > 0 {
            let _ = writeln!(out, "  handshakes refused as duplicate_agent_id: {refused}");
            if !self.allow.duplicate_refusals {
                failures.push(format!(
                    "{refused} handshake(s) refused as duplicate_agent_id although every agent has its own id (an agent restarted after its Goodbye was taken for a second live agent and kept out for a backoff)"
                ));
            }
        }
        if self.mono.violation_count > 0 {
            failures.push(format!(
                "{} counter decreases between scrapes of one process: {:?}",
                self.mono.violation_count, self.mono.violations
            ));
        }
        let mut logs = vec![("collector".to_owned(), self.collector.log())];
        for a in &self.agents {
            logs.push((a.spec.name.clone(), a.daemon.log()));
        }
        for (name, log) in &logs {
            if let Some(l) = log.lines().find(|l| l.contains("panicked")) {
                failures.push(format!("{name} panicked: {}", strip_ansi(l)));
            }
        }
        let _ = writeln!(
            out,
            "  scrapes {} (counters monotonic: {}); memory: {}",
            self.mono.scrapes,
            self.mono.violation_count == 0,
            self.memory
                .iter()
                .map(|(p, (rss, hwm))| format!("{p} rss {rss} KiB peak {hwm} KiB"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        for n in &self.notes {
            let _ = writeln!(out, "  note: {n}");
        }
        if self.collector.is_running() {
            self.collector.signal(Signal::SIGTERM);
            match self.collector.wait_exit(Duration::from_secs(20)) {
                Some(st) if st.success() => {}
                other => failures.push(format!("collector: unclean exit after SIGTERM: {other:?}")),
            }
        }
        eprint!("{out}");
        if !failures.is_empty() {
            let mut tails = self.collector.log_tail(25);
            for a in &self.agents {
                tails.push('\n');
                tails.push_str(&a.daemon.log_tail(15));
            }
            panic!(
                "row={} seed={:#x}: {} check(s) failed:\n- {}\n{out}\n{tails}",
                self.name,
                self.seed,
                failures.len(),
                failures.join("\n- ")
            );
        }
    }

    /// `written = delivered + lost + dropped` for the log records of agent id `id`.
    fn records_law(
        &self,
        id: &str,
        law: Law,
        delivered: &Delivered,
        out: &mut String,
        failures: &mut Vec<String>,
    ) {
        let agents: Vec<&RowAgent> = self.agents.iter().filter(|a| a.spec.id == id).collect();
        let written: u64 = agents.iter().map(|a| a.written()).sum();
        let mut distinct = 0;
        let mut dups = 0;
        let mut beyond = 0;
        let mut repeated = Vec::new();
        for a in &agents {
            for s in &a.sources {
                distinct += delivered.distinct(id, &s.src);
                dups += delivered.duplicates(id, &s.src);
                beyond += delivered.beyond(id, &s.src, s.written);
                repeated.extend(
                    delivered
                        .repeated_examples(id, &s.src)
                        .into_iter()
                        .map(|q| format!("{}#{q}", s.src)),
                );
            }
        }
        // Collector terms, every life.
        let m = [("agent", id), ("stream", "logs")];
        let mut lost = 0;
        let mut sink_dropped = 0;
        let mut unknown_bound: Option<u64> = None;
        for life in &self.collector_lives {
            let Some(s) = &life.last else { continue };
            lost += s.count("uctel_collector_records_lost_total", &m);
            sink_dropped += s.count(
                "uctel_collector_records_dropped_total",
                &[("agent", id), ("reason", "log_sink_error")],
            );
            if let Some(v) = unknown_tail(s, "uctel_collector_", Some(id)) {
                *unknown_bound.get_or_insert(0) += v;
            }
        }
        for a in &agents {
            for life in &a.lives {
                if let Some(v) = life
                    .last
                    .as_ref()
                    .and_then(|s| unknown_tail(s, "uctel_agent_", None))
                {
                    *unknown_bound.get_or_insert(0) += v;
                }
            }
        }
        // Agent terms, every life of every agent with this id. A life that was followed by
        // another re-reads what it dropped at `shutdown` (not settled), so only the last
        // life's `shutdown` drops are final.
        let mut agent_dropped: BTreeMap<String, u64> = BTreeMap::new();
        for a in &agents {
            let n = a.lives.len();
            for (k, life) in a.lives.iter().enumerate() {
                let Some(s) = &life.last else { continue };
                for smp in s.select("uctel_agent_records_dropped_total", &[("stream", "logs")]) {
                    let Some(reason) = smp.label("reason") else {
                        continue;
                    };
                    if reason == "shutdown" && k + 1 < n {
                        continue;
                    }
                    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                    let v = smp.value.max(0.0).round() as u64;
                    *agent_dropped.entry(reason.to_owned()).or_default() += v;
                }
            }
        }
        let agent_total: u64 = agent_dropped.values().sum();
        // Lines the agents read (every life; lines re-read after a restart count twice).
        let mut read = 0;
        let mut unread = 0;
        for a in &agents {
            let r: u64 = a
                .lives
                .iter()
                .filter_map(|l| l.last.as_ref())
                .map(|s| s.count("uctel_agent_log_records_read_total", &[]))
                .sum();
            read += r;
            unread += a.written().saturating_sub(r);
        }
        let unread_term = if self.allow.unread { unread } else { 0 };
        let sum = distinct + lost + sink_dropped + agent_total + unread_term;
        let verdict = match law {
            Law::Exact if sum == written => "ok".to_owned(),
            Law::AtMost if sum <= written => {
                format!("ok (at most; {} unaccounted)", written - sum)
            }
            _ => format!("MISMATCH ({:+})", i128::from(sum) - i128::from(written)),
        };
        let _ = writeln!(
            out,
            "  agent {id}, stream logs, records: written = delivered + lost + dropped"
        );
        let mut t = Table::default();
        t.row("written by the source (expected)", written, "");
        t.row("delivered to the sink (distinct)", distinct, "");
        t.row("lost (collector records_lost_total)", lost, "");
        t.row("dropped collector{log_sink_error}", sink_dropped, "");
        for (r, v) in &agent_dropped {
            if *v > 0 {
                t.row(&format!("dropped agent{{{r}}}"), *v, "");
            }
        }
        if self.allow.unread {
            t.row("never read by a kept-out agent (in its file)", unread, "");
        }
        t.row("delivered + lost + dropped", sum, &verdict);
        t.row(
            "delivered twice (extra copies)",
            dups,
            if dups == 0 { "ok" } else { "FAIL" },
        );
        if beyond > 0 {
            t.row("delivered but never written", beyond, "FAIL");
        }
        t.row("(read by the agent, log_records_read_total)", read, "");
        out.push_str(&t.render());
        if !verdict.starts_with("ok") {
            failures.push(format!(
                "agent {id} logs: delivered {distinct} + lost {lost} + dropped {} = {sum}, written {written}",
                sink_dropped + agent_total
            ));
        }
        if dups > 0 {
            failures.push(format!(
                "agent {id} logs: {dups} lines delivered more than once, e.g. {repeated:?}"
            ));
        }
        if beyond > 0 {
            failures.push(format!(
                "agent {id} logs: {beyond} delivered lines were never written"
            ));
        }
        if law == Law::AtMost {
            let unaccounted = written.saturating_sub(sum);
            match unknown_bound {
                Some(b) if unaccounted > b => failures.push(format!(
                    "agent {id} logs: {unaccounted} records unaccounted, above the {b} the collector reported unknown"
                )),
                Some(b) => {
                    let _ = writeln!(
                        out,
                        "    unaccounted {unaccounted} <= reported unknown {b}"
                    );
                }
                // No collector metric reports the unknown tail of a session that ended
                // without Goodbye yet (DESIGN.md §6 asks for it): only the inequality holds.
                None => {
                    let _ = writeln!(
                        out,
                        "    unaccounted {unaccounted}: no metric reports the unknown tail of a session without Goodbye (only the inequality is asserted)"
                    );
                }
            }
        }
    }

    /// Per stream `sent = received + lost + dropped` (frames and records) for the sessions
    /// of `id` logged since the frame baseline, against the collector's figures since then.
    fn frames_law(
        &self,
        id: &str,
        collector: &Scrape,
        out: &mut String,
        failures: &mut Vec<String>,
    ) {
        let mut goodbyes: Vec<BTreeMap<String, u64>> = Vec::new();
        let mut lost_sessions = 0;
        for a in self.agents.iter().filter(|a| a.spec.id == id) {
            let log = a.daemon.log();
            let tail = log.get(a.log_mark..).unwrap_or("");
            goodbyes.extend(goodbye_lines(tail));
            lost_sessions += tail
                .lines()
                .filter(|l| l.contains("connection to the collector lost"))
                .count();
        }
        let clog = self.collector.log();
        let ctail = clog.get(self.collector_log_mark..).unwrap_or("");
        let sessions = welcomed_sessions(ctail, id);
        let fin = CollectorFigures::read(collector, id);
        let base = self
            .frame_base
            .as_ref()
            .map(|s| CollectorFigures::read(s, id))
            .unwrap_or_default();
        let sum_key = |k: &str| -> u64 { goodbyes.iter().filter_map(|g| g.get(k)).sum() };
        let d = |a: u64, b: u64| a.saturating_sub(b);
        let after = d(fin.dropped_after_tracking(), base.dropped_after_tracking());
        let exact = sessions == goodbyes.len();
        let excused = sessions <= goodbyes.len() + self.allow.sessions_without_goodbye;
        let _ = writeln!(
            out,
            "  agent {id}, frames per stream: sessions since the baseline {sessions} at the collector, {} with Goodbye, {lost_sessions} lost by the agent{}",
            goodbyes.len(),
            if exact { "" } else { " (not all accounted: rule not exact)" }
        );
        if !excused {
            failures.push(format!(
                "agent {id}: the collector saw {sessions} sessions since the baseline, {} ended with Goodbye: sessions ended without Goodbye in a row where none should",
                goodbyes.len()
            ));
        }
        let mut t = Table::default();
        t.header(&[
            "stream",
            "sent",
            "received",
            "lost",
            "drop-after",
            "sum",
            "records sent",
            "rec received",
            "rec lost",
            "rec replayed",
            "",
        ]);
        let mut sent_total = 0;
        let mut seen_total = 0;
        for s in STREAMS {
            let sent = sum_key(&format!("{s}_frames"));
            let rx = d(fin.received[s], base.received.get(s).copied().unwrap_or(0));
            let lost = d(fin.lost[s], base.lost.get(s).copied().unwrap_or(0));
            let rsent = sum_key(&format!("{s}_records"));
            let rrx = d(
                fin.records_received[s],
                base.records_received.get(s).copied().unwrap_or(0),
            );
            let rlost = d(
                fin.records_lost[s],
                base.records_lost.get(s).copied().unwrap_or(0),
            );
            // Log records sent again after a restart, discarded by the collector (README
            // "Loss accounting"): records of received frames, in no other counter.
            let replayed = |sc: &Scrape| {
                sc.count(
                    "uctel_collector_records_replayed_total",
                    &[("agent", id), ("stream", s)],
                )
            };
            let rrep = d(
                replayed(collector),
                self.frame_base.as_ref().map_or(0, replayed),
            );
            sent_total += sent;
            seen_total += rx + lost;
            let frames_ok = rx + lost <= sent && sent <= rx + lost + after;
            let records_ok = after > 0 || rsent == rrx + rlost + rrep;
            let ok = frames_ok && records_ok;
            t.cells(&[
                s.to_owned(),
                sent.to_string(),
                rx.to_string(),
                lost.to_string(),
                after.to_string(),
                (rx + lost).to_string(),
                rsent.to_string(),
                rrx.to_string(),
                rlost.to_string(),
                rrep.to_string(),
                if ok { "ok".into() } else { "MISMATCH".into() },
            ]);
            if exact && !frames_ok {
                failures.push(format!(
                    "agent {id} stream {s}: frames sent {sent} != received {rx} + lost {lost} (+ up to {after} dropped after tracking)"
                ));
            }
            if exact && !records_ok {
                failures.push(format!(
                    "agent {id} stream {s}: records sent {rsent} != received {rrx} + lost {rlost} + replayed {rrep}"
                ));
            }
        }
        out.push_str(&t.render());
        let conn_sent = sum_key("frames");
        let rx_all = d(fin.received_total(), base.received_total());
        let dropped = d(fin.dropped_total(), base.dropped_total());
        let conn_lost = d(fin.connection_lost, base.connection_lost);
        let conn_ok = conn_sent == rx_all + dropped + conn_lost;
        let streams_ok = sent_total == seen_total + after;
        let _ = writeln!(
            out,
            "    connection: sent {conn_sent} = received {rx_all} + dropped {dropped} + connection_lost {conn_lost}: {}; streams: sent {sent_total} = received+lost {seen_total} + dropped after tracking {after}: {}",
            if conn_ok { "ok" } else { "MISMATCH" },
            if streams_ok { "ok" } else { "MISMATCH" }
        );
        let mut reasons: Vec<String> = fin
            .dropped
            .iter()
            .filter(|(_, v)| **v > 0)
            .map(|(r, v)| format!("{r}={v}"))
            .collect();
        for (name, label) in [
            ("uctel_collector_frames_late_total", "late"),
            ("uctel_collector_frames_duplicate_total", "duplicate"),
            ("uctel_collector_frames_stale_total", "stale"),
        ] {
            let v = collector.count(name, &[("agent", id)]);
            if v > 0 {
                reasons.push(format!("{label}={v}"));
            }
        }
        let faults = sum_key("fault_dropped");
        if !reasons.is_empty() || faults > 0 {
            let _ = writeln!(
                out,
                "    collector frames dropped/late/duplicate: {}; agent fault injector dropped {faults}",
                reasons.join(" ")
            );
        }
        if exact && !conn_ok {
            failures.push(format!(
                "agent {id}: connection sent {conn_sent} != received {rx_all} + dropped {dropped} + connection_lost {conn_lost}"
            ));
        }
        if exact && !streams_ok {
            failures.push(format!(
                "agent {id}: frames sent {sent_total} != received+lost {seen_total} + dropped after tracking {after}"
            ));
        }
    }

    /// Σ over the Goodbye lines of agent id `id` since the baseline of `key`
    /// (`frames`, `logs_frames`, `fault_dropped`, …).
    pub fn goodbye_sum(&self, id: &str, key: &str) -> u64 {
        self.agents
            .iter()
            .filter(|a| a.spec.id == id)
            .flat_map(|a| goodbye_lines(a.daemon.log().get(a.log_mark..).unwrap_or("")))
            .filter_map(|g| g.get(key).copied())
            .sum()
    }

    /// The collector's figures for `id` now (last scrape of the current life).
    pub fn collector_figures(&self, id: &str) -> CollectorFigures {
        self.collector_lives
            .last()
            .and_then(|l| l.last.as_ref())
            .map(|s| CollectorFigures::read(s, id))
            .unwrap_or_default()
    }

    /// Agent `i`'s last scrape (of its current or last life).
    pub fn agent_last(&self, i: usize) -> Scrape {
        self.agents[i]
            .lives
            .last()
            .and_then(|l| l.last.clone())
            .unwrap_or_default()
    }

    /// The current collector life's last scrape.
    pub fn collector_last(&self) -> Scrape {
        self.collector_lives
            .last()
            .and_then(|l| l.last.clone())
            .unwrap_or_default()
    }

    /// Records a failed expectation about the fault itself (it must have happened).
    pub fn expect(&mut self, ok: bool, what: impl Into<String>) {
        let what = what.into();
        if ok {
            self.notes.push(format!("ok: {what}"));
        } else {
            self.failures.push(format!("expected: {what}"));
        }
    }
}

/// How many sessions of agent `id` the collector log `log` welcomed (its `agent connected`
/// lines; a refusal that mentions the connected agent is not one).
pub fn welcomed_sessions(log: &str, id: &str) -> usize {
    let want = format!("agent={id}");
    log.lines()
        .map(strip_ansi)
        .filter(|l| {
            l.contains(": agent connected ")
                && l.split_whitespace().any(|t| t == want)
                && l.split_whitespace().any(|t| t.starts_with("epoch="))
        })
        .count()
}

/// Numeric fields of every `goodbye sent` line of an agent log, in order.
pub fn goodbye_lines(log: &str) -> Vec<BTreeMap<String, u64>> {
    log.lines()
        .map(strip_ansi)
        .filter(|l| l.contains("goodbye sent"))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|t| t.split_once('='))
                .filter_map(|(k, v)| v.trim_matches('"').parse().ok().map(|n| (k.to_owned(), n)))
                .collect()
        })
        .collect()
}

/// A plain text table for the verdict.
#[derive(Debug, Default)]
struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    fn header(&mut self, cells: &[&str]) {
        self.rows
            .push(cells.iter().map(|c| (*c).to_owned()).collect());
    }

    fn cells(&mut self, cells: &[String]) {
        self.rows.push(cells.to_vec());
    }

    fn row(&mut self, term: &str, value: u64, verdict: &str) {
        self.rows
            .push(vec![term.to_owned(), value.to_string(), verdict.to_owned()]);
    }

    fn render(&self) -> String {
        let cols = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let mut width = vec![0; cols];
        for r in &self.rows {
            for (i, c) in r.iter().enumerate() {
                width[i] = width[i].max(c.chars().count());
            }
        }
        let mut s = String::new();
        for r in &self.rows {
            s.push_str("    ");
            for (i, c) in r.iter().enumerate() {
                let pad = width[i] - c.chars().count();
                if i > 0 && c.chars().all(|ch| ch.is_ascii_digit()) && !c.is_empty() {
                    s.push_str(&" ".repeat(pad));
                    s.push_str(c);
                } else {
                    s.push_str(c);
                    s.push_str(&" ".repeat(pad));
                }
                s.push_str("  ");
            }
            s.truncate(s.trim_end().len());
            s.push('\n');
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_unique_seeded_and_parse_back() {
        let a = line_text("r", "s", 7, 1);
        assert_eq!(a, line_text("r", "s", 7, 1));
        assert_ne!(a, line_text("r", "s", 7, 2));
        assert_ne!(a, line_text("r", "s", 8, 1));
        assert_eq!(parse_line(&a), Some(("r", "s", 1)));
        assert!(parse_line("something else").is_none());
        assert_eq!(row_seed("x"), row_seed("x"));
    }

    #[test]
    fn sink_counts_distinct_duplicates_mismatches_and_torn() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let sink = dir.path().join("s.jsonl");
        let rec = |seq: u64, msg: Option<&str>| {
            let m = msg.map_or_else(|| line_text("r", "a", 3, seq), str::to_owned);
            format!("{}\n", serde_json::json!({"agent": "x", "message": m}))
        };
        let text = [
            rec(0, None),
            rec(1, None),
            rec(1, None),
            rec(2, Some("row=r src=a seq=2 pad=zz")),
        ]
        .concat()
            + "{\"agent\":\"x\",\"mess\n";
        std::fs::write(&sink, text).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(dir.path().join("s.jsonl.1"), rec(5, None))
            .unwrap_or_else(|e| panic!("{e}"));
        let d = Delivered::read(&sink, "r", 3);
        assert_eq!(d.distinct("x", "a"), 3);
        assert_eq!(d.duplicates("x", "a"), 1);
        assert_eq!(d.mismatched_count, 1);
        assert_eq!(d.torn_count, 1);
        assert_eq!(d.beyond("x", "a", 3), 1);
        assert!(d.has("x", "a", 5));
    }

    #[test]
    fn monotonic_flags_a_decrease_per_process() {
        let s = |v: f64| Scrape {
            samples: crate::exposition::parse(&format!("x_total{{a=\"1\"}} {v}\n"))
                .unwrap_or_default(),
            text: String::new(),
        };
        let mut m = Monotonic::default();
        m.observe("d", 1, "x_", &s(5.0));
        m.observe("d", 1, "x_", &s(6.0));
        m.observe("d", 2, "x_", &s(0.0));
        assert_eq!(m.violation_count, 0);
        m.observe("d", 1, "x_", &s(4.0));
        assert_eq!(m.violation_count, 1);
    }

    #[test]
    fn goodbye_lines_are_all_read() {
        let log = "x goodbye sent epoch=1 frames=3 logs_frames=2\ny\nz goodbye sent frames=4 logs_frames=1 fault_dropped=2\n";
        let g = goodbye_lines(log);
        assert_eq!(g.len(), 2);
        assert_eq!(g[1].get("fault_dropped"), Some(&2));
        assert_eq!(g.iter().filter_map(|m| m.get("frames")).sum::<u64>(), 7);
    }
}
