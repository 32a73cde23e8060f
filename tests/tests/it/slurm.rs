//! Slurm job attribution (`sources.slurm`) through the real binaries and a **real
//! single-node Slurm**: Debian 12's `munged`, `slurmctld` and `slurmd` (Slurm 22.05),
//! started by this test in a temporary directory (`slurm.conf` with
//! `ProctrackType=proctrack/cgroup`, `TaskPlugin=task/cgroup`, `JobAcctGatherType=
//! jobacct_gather/cgroup`, `cgroup.conf` `CgroupPlugin=autodetect`). On this development
//! machine (a container with the cgroup v1 controllers mounted, no systemd) Slurm picks
//! `cgroup/v1` and builds `/sys/fs/cgroup/{cpuacct,memory,cpuset,freezer}/slurm_<node>/
//! uid_<uid>/job_<id>`; on a cgroup v2 host with systemd it builds
//! `system.slice/slurmstepd.scope/job_<id>`, which the agent reads too (unit-tested only).
//!
//! Jobs are submitted with `sbatch`; checked at the collector's `/metrics`:
//! * each running job's `uctel_job_info{job_id,user,partition,job_name}` appears within two
//!   collection intervals (1 s) of `squeue` reporting it running, with the labels `scontrol`
//!   gives;
//! * a busy job's `uctel_job_cpu_seconds_total` grows by about its CPU time;
//! * a job that ends (by itself, or `scancel`) leaves `/metrics` within a few seconds — the
//!   collector's `staleness_seconds` is 300, so only the agent's stale markers explain it.
//!
//! Needs root (slurmd and its cgroups) and `scripts/install-deps` (slurmd slurmctld munge).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use uctel_tests::pipeline::Pipeline;
use uctel_tests::{exclusive, wait_for};

/// A single-node Slurm cluster in a temporary directory; stopped when dropped.
struct Slurm {
    dir: tempfile::TempDir,
    children: Vec<Child>,
}

fn free_port() -> u16 {
    uctel_tests::net::free_addr().port()
}

impl Slurm {
    fn start() -> Slurm {
        for bin in [
            "/usr/sbin/munged",
            "/usr/sbin/slurmctld",
            "/usr/sbin/slurmd",
        ] {
            assert!(
                Path::new(bin).exists(),
                "{bin} missing: run scripts/install-deps (slurmd slurmctld munge)"
            );
        }
        let dir = tempfile::Builder::new()
            .prefix("uctel-slurm-")
            .tempdir()
            .unwrap();
        let d = dir.path();
        for sub in ["state", "spool"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        let host = String::from_utf8(Command::new("hostname").arg("-s").output().unwrap().stdout)
            .unwrap()
            .trim()
            .to_owned();
        let mut key = vec![0u8; 1024];
        std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom").unwrap(), &mut key)
            .unwrap();
        std::fs::write(d.join("munge.key"), key).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(d.join("munge.key"), std::fs::Permissions::from_mode(0o600))
            .unwrap();
        let p = |n: &str| d.join(n).display().to_string();
        std::fs::write(
            d.join("slurm.conf"),
            format!(
                "ClusterName=uctel\nSlurmctldHost={host}\nSlurmUser=root\nSlurmdUser=root\n\
                 AuthType=auth/munge\nAuthInfo=socket={sock}\nCredType=cred/munge\n\
                 StateSaveLocation={state}\nSlurmdSpoolDir={spool}\n\
                 SlurmctldPidFile={ctldpid}\nSlurmdPidFile={dpid}\n\
                 SlurmctldPort={}\nSlurmdPort={}\n\
                 SlurmctldLogFile={ctldlog}\nSlurmdLogFile={dlog}\n\
                 ProctrackType=proctrack/cgroup\nTaskPlugin=task/cgroup\n\
                 JobAcctGatherType=jobacct_gather/cgroup\n\
                 SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n\
                 ReturnToService=2\nMpiDefault=none\n\
                 NodeName={host} CPUs=2 State=UNKNOWN\n\
                 PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n",
                free_port(),
                free_port(),
                sock = p("munge.sock"),
                state = p("state"),
                spool = p("spool"),
                ctldpid = p("slurmctld.pid"),
                dpid = p("slurmd.pid"),
                ctldlog = p("slurmctld.log"),
                dlog = p("slurmd.log"),
            ),
        )
        .unwrap();
        std::fs::write(
            d.join("cgroup.conf"),
            "CgroupPlugin=autodetect\nCgroupMountpoint=/sys/fs/cgroup\nConstrainCores=yes\n\
             ConstrainRAMSpace=yes\n",
        )
        .unwrap();
        let mut s = Slurm {
            dir,
            children: Vec::new(),
        };
        let d = s.dir.path().to_path_buf();
        let spawn = |bin: &str, args: &[String], log: &str| -> Child {
            let out = std::fs::File::create(d.join(log)).unwrap();
            Command::new(bin)
                .args(args)
                .env("SLURM_CONF", d.join("slurm.conf"))
                .stdin(Stdio::null())
                .stdout(out.try_clone().unwrap())
                .stderr(out)
                .spawn()
                .unwrap_or_else(|e| panic!("{bin}: {e}"))
        };
        let ps = |n: &str| d.join(n).display().to_string();
        s.children.push(spawn(
            "/usr/sbin/munged",
            &[
                "-F".into(),
                "-f".into(),
                format!("--socket={}", ps("munge.sock")),
                format!("--key-file={}", ps("munge.key")),
                format!("--pid-file={}", ps("munged.pid")),
                format!("--log-file={}", ps("munged.log")),
                format!("--seed-file={}", ps("munge.seed")),
            ],
            "munged.out",
        ));
        wait_for(
            "munged's socket",
            Duration::from_secs(10),
            Duration::from_millis(50),
            || {
                d.join("munge.sock")
                    .exists()
                    .then_some(())
                    .ok_or_else(String::new)
            },
        )
        .unwrap();
        s.children.push(spawn(
            "/usr/sbin/slurmctld",
            &["-D".into(), "-c".into(), "-i".into()],
            "slurmctld.out",
        ));
        s.children.push(spawn(
            "/usr/sbin/slurmd",
            &["-D".into(), "-N".into(), host],
            "slurmd.out",
        ));
        wait_for(
            "the node idle in sinfo",
            Duration::from_secs(60),
            Duration::from_millis(500),
            || {
                let out = s.cmd("sinfo", &["-h", "-o", "%t"]);
                (out.trim() == "idle").then_some(()).ok_or(out)
            },
        )
        .unwrap_or_else(|e| panic!("{e}; logs in {}", s.dir.path().display()));
        s
    }

    fn conf(&self) -> PathBuf {
        self.dir.path().join("slurm.conf")
    }

    fn cmd(&self, bin: &str, args: &[&str]) -> String {
        let out = Command::new(bin)
            .args(args)
            .env("SLURM_CONF", self.conf())
            .output()
            .unwrap_or_else(|e| panic!("{bin}: {e}"));
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
    }

    /// Submits a batch job; its id.
    fn sbatch(&self, name: &str, wrap: &str) -> u64 {
        let out = self.cmd(
            "sbatch",
            &[
                "--parsable",
                "-J",
                name,
                "-p",
                "debug",
                "-o",
                "/dev/null",
                "--wrap",
                wrap,
            ],
        );
        out.trim()
            .parse()
            .unwrap_or_else(|_| panic!("sbatch: {out}"))
    }

    /// The job's state letter code in `squeue` (`R`, `PD`, …), empty once it left.
    fn state(&self, id: u64) -> String {
        self.cmd("squeue", &["-h", "-j", &id.to_string(), "-o", "%t"])
            .lines()
            .next()
            .filter(|l| !l.contains("Invalid job id"))
            .unwrap_or("")
            .trim()
            .to_owned()
    }

    /// A `scontrol` that finds this cluster (the agent's `scontrol_path`).
    fn scontrol_wrapper(&self) -> PathBuf {
        let p = self.dir.path().join("scontrol");
        std::fs::write(
            &p,
            format!(
                "#!/bin/sh\nSLURM_CONF={} exec /usr/bin/scontrol \"$@\"\n",
                self.conf().display()
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        let _ = self.cmd("scancel", &["--user=root"]);
        // slurmd, slurmctld, then munged: the reverse of their start.
        for c in self.children.iter_mut().rev() {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline && matches!(c.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn job_series(p: &Pipeline, name: &str, id: u64) -> Vec<uctel_tests::exposition::Sample> {
    p.scrape()
        .map(|s| {
            s.samples
                .into_iter()
                .filter(|x| x.name == name && x.label("job_id") == Some(id.to_string().as_str()))
                .collect()
        })
        .unwrap_or_default()
}

/// A job's CPU seconds read from its cgroup directly (v1 `cpuacct.usage` or v2 `cpu.stat`).
fn job_cpu_seconds(id: u64) -> Option<f64> {
    let job = format!("job_{id}");
    let mut stack = vec![(PathBuf::from("/sys/fs/cgroup"), 0)];
    while let Some((dir, depth)) = stack.pop() {
        for e in std::fs::read_dir(&dir).ok()?.flatten() {
            let path = e.path();
            if !path.is_dir() {
                continue;
            }
            if e.file_name().to_str() == Some(job.as_str()) {
                if let Ok(t) = std::fs::read_to_string(path.join("cpuacct.usage")) {
                    return t.trim().parse::<f64>().ok().map(|ns| ns / 1e9);
                }
                if let Ok(t) = std::fs::read_to_string(path.join("cpu.stat")) {
                    let us = t.lines().find_map(|l| l.strip_prefix("usage_usec "))?;
                    return us.trim().parse::<f64>().ok().map(|us| us / 1e6);
                }
            } else if depth < 5 {
                stack.push((path, depth + 1));
            }
        }
    }
    None
}

fn wait_running(slurm: &Slurm, id: u64) -> Instant {
    wait_for(
        "the job running",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || {
            let st = slurm.state(id);
            (st == "R").then(Instant::now).ok_or(st)
        },
    )
    .unwrap()
}

#[test]
fn slurm_jobs_appear_with_their_labels_and_usage_and_leave_when_they_end() {
    let _g = exclusive();
    let slurm = Slurm::start();
    let scontrol = slurm.scontrol_wrapper();
    let mut p = Pipeline::start();
    p.add_agent_with("slurm-node", 0.0, 5.0, |y| {
        y.set("sources.slurm.interval_seconds", 1.0).set(
            "sources.slurm.scontrol_path",
            scontrol.display().to_string(),
        );
    });
    p.wait_flowing(1, &["slurm-node"], &["metrics"], Duration::from_secs(30));

    let busy = slurm.sbatch("burn cpu", "sh -c 'while :; do :; done'");
    let short = slurm.sbatch("short", "sleep 6");
    for (id, name) in [(busy, "burn cpu"), (short, "short")] {
        let running = wait_running(&slurm, id);
        let info = wait_for(
            "uctel_job_info at the collector",
            Duration::from_secs(30),
            Duration::from_millis(100),
            || {
                job_series(&p, "uctel_job_info", id)
                    .into_iter()
                    .next()
                    .ok_or_else(String::new)
            },
        )
        .unwrap();
        let after = running.elapsed();
        eprintln!("job {id} at the collector {after:?} after squeue said running");
        assert!(
            after < Duration::from_secs(3),
            "job {id} appeared {after:?} after it ran (interval 1 s)"
        );
        assert_eq!(info.value, 1.0);
        assert_eq!(info.label("user"), Some("root"), "{info:?}");
        assert_eq!(info.label("partition"), Some("debug"));
        assert_eq!(info.label("job_name"), Some(name));
    }

    // The busy job's CPU time is its cgroup's: the collector's value catches up with what
    // the job's `cpuacct.usage` (v1) or `cpu.stat` (v2) said before, and is never ahead of
    // what it says after.
    let cpu = |p: &Pipeline| {
        job_series(p, "uctel_job_cpu_seconds_total", busy)
            .first()
            .map_or(0.0, |s| s.value)
    };
    let truth = || job_cpu_seconds(busy).expect("the busy job's cgroup CPU time");
    let before = truth();
    let seen = wait_for(
        "the collector's CPU time to reach the cgroup's",
        Duration::from_secs(10),
        Duration::from_millis(100),
        || {
            let v = cpu(&p);
            (v >= before).then_some(v).ok_or(format!("{v} < {before}"))
        },
    )
    .unwrap();
    let after = truth();
    assert!(seen > 0.0 && seen <= after, "{before} ≤ {seen} ≤ {after}");
    let mem = job_series(&p, "uctel_job_memory_bytes", busy);
    assert!(mem.first().is_some_and(|m| m.value > 0.0), "{mem:?}");

    // The short job ends by itself, the busy one is cancelled: both leave /metrics within
    // a few seconds (staleness_seconds is 300).
    slurm.cmd("scancel", &[&busy.to_string()]);
    for id in [short, busy] {
        wait_for(
            "the job gone from squeue",
            Duration::from_secs(60),
            Duration::from_millis(100),
            || {
                let st = slurm.state(id);
                st.is_empty().then_some(()).ok_or(st)
            },
        )
        .unwrap();
        let gone = Instant::now();
        wait_for(
            "its series gone",
            Duration::from_secs(15),
            Duration::from_millis(100),
            || {
                let left: Vec<_> = [
                    "uctel_job_info",
                    "uctel_job_cpu_seconds_total",
                    "uctel_job_memory_bytes",
                ]
                .iter()
                .flat_map(|n| job_series(&p, n, id))
                .collect();
                left.is_empty().then_some(()).ok_or(format!("{left:?}"))
            },
        )
        .unwrap();
        eprintln!("job {id} left /metrics {:?} after squeue", gone.elapsed());
    }
    let s = p.scrape().unwrap();
    assert_eq!(
        s.sum("uctel_agent_source_errors_total", &[("source", "slurm")]),
        0.0
    );
}
