//! The cgroups `slurmd` builds for its jobs (`proctrack/cgroup`, `task/cgroup`,
//! `jobacct_gather/cgroup`), found and read. Both layouts of Slurm's cgroup plugins
//! (Slurm 22.05 `cgroup.conf` `CgroupPlugin=autodetect`):
//!
//! | plugin | job directory | CPU | memory | I/O |
//! |---|---|---|---|---|
//! | `cgroup/v1` | `<root>/<controller>/slurm[_<node>]/uid_<uid>/job_<id>` | `cpuacct/…/cpuacct.usage` (ns) | `memory/…/memory.usage_in_bytes` | `blkio/…/blkio.throttle.io_service_bytes` (Slurm creates no blkio job cgroup: usually absent) |
//! | `cgroup/v2` | `<root>/system.slice/slurmstepd.scope/job_<id>` | `cpu.stat` `usage_usec` | `memory.current` | `io.stat` `rbytes`, `wbytes` summed over devices |
//!
//! A job is on this host while one of its directories exists: `slurmstepd` removes them
//! when the job's last step ends, so an ended job is gone at the next look.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// How deep below a controller (v1) or the unified root (v2) a `job_<id>` directory is
/// looked for (v1: `slurm_<node>/uid_<uid>/job_<id>` is 3; v2:
/// `system.slice/slurmstepd.scope/job_<id>` is 3).
const MAX_DEPTH: usize = 4;
/// The v1 controllers read (others hold nothing the agent exports).
const V1_CONTROLLERS: [&str; 4] = ["cpuacct", "cpu,cpuacct", "memory", "blkio"];

/// The directories of one job, and its owner's uid where the path names it (v1).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobDirs {
    /// `uid_<uid>` of a v1 path.
    pub uid: Option<u32>,
    /// The job's directories (one per v1 controller; one for v2).
    pub dirs: Vec<PathBuf>,
}

/// What a job's cgroups say; `None` where no file gave it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct JobUsage {
    /// CPU time of all its tasks, seconds.
    pub cpu_seconds: Option<f64>,
    /// Memory charged to it, bytes (v1 `usage_in_bytes` includes page cache, as v2's
    /// `memory.current` does).
    pub memory_bytes: Option<f64>,
    /// Bytes read from block devices.
    pub io_read_bytes: Option<f64>,
    /// Bytes written to block devices.
    pub io_write_bytes: Option<f64>,
}

/// Every Slurm job with a cgroup under `root` (`/sys/fs/cgroup`), by job id.
pub fn discover(root: &Path) -> BTreeMap<u64, JobDirs> {
    let mut jobs = BTreeMap::new();
    let mut found = Vec::new();
    if root.join("cgroup.controllers").is_file() {
        walk(root, 0, &mut found);
    }
    for c in V1_CONTROLLERS {
        walk(&root.join(c), 0, &mut found);
    }
    for (id, dir) in found {
        let entry: &mut JobDirs = jobs.entry(id).or_default();
        if entry.uid.is_none() {
            entry.uid = dir
                .parent()
                .and_then(Path::file_name)
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix("uid_"))
                .and_then(|n| n.parse().ok());
        }
        entry.dirs.push(dir);
    }
    jobs
}

/// `job_<digits>` → the id.
fn job_id(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("job_")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

fn walk(dir: &Path, depth: usize, out: &mut Vec<(u64, PathBuf)>) {
    if depth > MAX_DEPTH {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let path = e.path();
        match e.file_name().to_str().and_then(job_id) {
            Some(id) => out.push((id, path)),
            None => walk(&path, depth + 1, out),
        }
    }
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

fn number(path: &Path) -> Option<f64> {
    read(path)?.trim().parse::<u64>().ok().map(|v| v as f64)
}

/// `key value` lines (`cpu.stat`): the value of `key`.
fn keyed(text: &str, key: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        (f.next()? == key).then_some(())?;
        f.next()?.parse::<u64>().ok().map(|v| v as f64)
    })
}

/// v2 `io.stat`: `MAJ:MIN rbytes=… wbytes=… rios=…` per device; the sums.
fn io_stat(text: &str) -> (f64, f64) {
    let mut r = 0.0;
    let mut w = 0.0;
    for field in text.split_whitespace() {
        if let Some(v) = field.strip_prefix("rbytes=") {
            r += v.parse::<u64>().unwrap_or(0) as f64;
        } else if let Some(v) = field.strip_prefix("wbytes=") {
            w += v.parse::<u64>().unwrap_or(0) as f64;
        }
    }
    (r, w)
}

/// v1 `blkio.throttle.io_service_bytes`: `MAJ:MIN Read N` … lines; the sums of `Read` and
/// `Write` over devices (the `Total` line is not a device).
fn blkio(text: &str) -> (f64, f64) {
    let mut r = 0.0;
    let mut w = 0.0;
    for l in text.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if let [_, op, n] = f.as_slice() {
            let n = n.parse::<u64>().unwrap_or(0) as f64;
            match *op {
                "Read" => r += n,
                "Write" => w += n,
                _ => {}
            }
        }
    }
    (r, w)
}

/// Reads what the job's directories hold (unreadable files give `None`).
pub fn usage(job: &JobDirs) -> JobUsage {
    let mut u = JobUsage::default();
    for d in &job.dirs {
        if let Some(ns) = number(&d.join("cpuacct.usage")) {
            u.cpu_seconds = Some(ns / 1e9);
        }
        if let Some(us) = read(&d.join("cpu.stat")).and_then(|t| keyed(&t, "usage_usec")) {
            u.cpu_seconds = Some(us / 1e6);
        }
        if let Some(b) = number(&d.join("memory.usage_in_bytes")) {
            u.memory_bytes = Some(b);
        }
        if let Some(b) = number(&d.join("memory.current")) {
            u.memory_bytes = Some(b);
        }
        let io = read(&d.join("io.stat"))
            .map(|t| io_stat(&t))
            .or_else(|| read(&d.join("blkio.throttle.io_service_bytes")).map(|t| blkio(&t)));
        if let Some((r, w)) = io {
            u.io_read_bytes = Some(r);
            u.io_write_bytes = Some(w);
        }
    }
    u
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(p: &Path, text: &str) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn v1_and_v2_job_directories_are_found_and_read() {
        let d = tempfile::tempdir().unwrap();
        let v1 = d.path().join("v1");
        let j = |c: &str| v1.join(c).join("slurm_vm/uid_1000/job_42");
        write(&j("cpuacct").join("cpuacct.usage"), "2500000000\n");
        write(&j("memory").join("memory.usage_in_bytes"), "1048576\n");
        write(&j("freezer").join("tasks"), "");
        std::fs::create_dir_all(v1.join("memory/slurm_vm/uid_1000/job_x")).unwrap();
        let jobs = discover(&v1);
        assert_eq!(jobs.keys().copied().collect::<Vec<_>>(), vec![42]);
        assert_eq!(jobs[&42].uid, Some(1000));
        let u = usage(&jobs[&42]);
        assert_eq!(u.cpu_seconds, Some(2.5));
        assert_eq!(u.memory_bytes, Some(1_048_576.0));
        assert_eq!(u.io_read_bytes, None);

        let v2 = d.path().join("v2");
        write(&v2.join("cgroup.controllers"), "cpu io memory\n");
        let j = v2.join("system.slice/slurmstepd.scope/job_7");
        write(
            &j.join("cpu.stat"),
            "usage_usec 1500000\nuser_usec 1000000\n",
        );
        write(&j.join("memory.current"), "4096\n");
        write(
            &j.join("io.stat"),
            "8:0 rbytes=100 wbytes=200 rios=1 wios=2\n8:16 rbytes=1 wbytes=2\n",
        );
        let jobs = discover(&v2);
        assert_eq!(jobs[&7].uid, None);
        let u = usage(&jobs[&7]);
        assert_eq!(
            (
                u.cpu_seconds,
                u.memory_bytes,
                u.io_read_bytes,
                u.io_write_bytes
            ),
            (Some(1.5), Some(4096.0), Some(101.0), Some(202.0))
        );
        assert_eq!(
            blkio("8:0 Read 10\n8:0 Write 20\n8:0 Total 30\nTotal 30\n"),
            (10.0, 20.0)
        );
        assert!(discover(&d.path().join("missing")).is_empty());
        assert_eq!(job_id("job_"), None);
        assert_eq!(job_id("job_12"), Some(12));
    }
}
