//! Slurm job attribution (`sources.slurm`, off when absent): the jobs running on this host,
//! as an info series to join on and their CPU, memory and I/O from the job's cgroup (as
//! OVIS LDMS's Slurm samplers and the cgroup exporters do).
//!
//! **Which jobs.** The cgroup tree that `slurmd` builds with `ProctrackType=proctrack/cgroup`
//! and `TaskPlugin=task/cgroup` (`cgroup`: v1 and v2 layouts): a job is running here while
//! its `job_<id>` directory exists, and `slurmstepd` removes it when the job ends, so the
//! tree is the authority on "now, on this host" with no hook to install and nothing to
//! miss when the agent was down (prolog/epilog hooks, the other way Slurm documents, run
//! once per job and are lost while the agent is not running). The labels come from
//! `scontrol show job -o <id>` once per job (cached while the job runs; retried at the
//! next round when it fails, the job exported meanwhile with `user` from the cgroup's uid).
//!
//! **Series** (every `interval_seconds`, aligned like the other sources):
//!
//! | series | type | labels |
//! |---|---|---|
//! | `uctel_job_info` (1) | gauge | `job_id`, `user`, `partition`, `job_name`, `account` |
//! | `uctel_job_cpu_seconds_total` | counter | `job_id` |
//! | `uctel_job_memory_bytes` | gauge | `job_id` |
//! | `uctel_job_io_read_bytes_total`, `uctel_job_io_write_bytes_total` | counter | `job_id` (v2 `io.stat`; cgroup v1 has no Slurm blkio cgroup) |
//! | `uctel_slurm_jobs` | gauge | — (jobs found, exported or capped) |
//!
//! Join in PromQL: `uctel_job_cpu_seconds_total * on (agent, job_id) group_left (user,
//! partition) uctel_job_info`.
//!
//! **A job that ends leaves at once.** Its series are sent once more with Prometheus's
//! stale marker as the value (the NaN `0x7ff0000000000002`), at the first round that finds
//! it gone and at the next `STALE_ROUNDS`` − 1` rounds (a marker lost on UC is sent
//! again): the collector removes a series on its marker, and remote-write forwards it as
//! the series' end.
//!
//! **Cardinality.** At most `max_jobs` jobs are exported at once (the ones found first keep
//! their place); each further job is counted at every round in
//! `uctel_agent_source_errors_total{source="slurm",reason="job_cap"}`. So a host running
//! 1,000 short jobs an hour holds at most `max_jobs × 5` job series (plus the ended ones'
//! markers for `STALE_ROUNDS` rounds). A failed `scontrol` is counted as
//! `reason="scontrol"`.

pub mod cgroup;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use uctel_protocol::payload::{Label, Metric, MetricType};

/// Rounds an ended job's stale markers are sent in.
pub const STALE_ROUNDS: u32 = 3;
/// Prometheus's stale marker (`model/value.StaleNaN`).
pub const STALE_NAN_BITS: u64 = 0x7ff0_0000_0000_0002;

/// `sources.slurm`: Slurm job attribution. Off when absent.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SlurmSection {
    /// Seconds between two looks at the jobs. Default 10.
    #[serde(default = "default_interval")]
    pub interval_seconds: f64,
    /// Offset of the rounds within the interval, seconds (as `host_metrics`). Default 0.
    #[serde(default)]
    pub offset_seconds: f64,
    /// The cgroup filesystem root (`/sys/fs/cgroup`; in a container, the host's mounted).
    #[serde(default = "default_root")]
    pub cgroup_root: PathBuf,
    /// The `scontrol` command that gives a job's user, partition, name and account
    /// (`scontrol show job -o <id>`); it reads `SLURM_CONF` from the agent's environment.
    /// Default `scontrol` (from `PATH`).
    #[serde(default = "default_scontrol")]
    pub scontrol_path: PathBuf,
    /// Most jobs exported at once, 1 to 10000. Default 128.
    #[serde(default = "default_max_jobs")]
    pub max_jobs: usize,
}

fn default_interval() -> f64 {
    10.0
}
fn default_root() -> PathBuf {
    PathBuf::from("/sys/fs/cgroup")
}
fn default_scontrol() -> PathBuf {
    PathBuf::from("scontrol")
}
fn default_max_jobs() -> usize {
    128
}

impl SlurmSection {
    /// What `--check-config` says about the section (key suffix, problem).
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        let v = self.interval_seconds;
        if !(v.is_finite() && (0.1..=86400.0).contains(&v)) {
            out.push((
                "interval_seconds",
                format!("must be a number of seconds in [0.1, 86400], got {v}"),
            ));
        }
        if let Some(p) = crate::pacing::grid::offset_problem(self.offset_seconds, v) {
            out.push(("offset_seconds", p));
        }
        if !(1..=10_000).contains(&self.max_jobs) {
            out.push((
                "max_jobs",
                format!("must be 1 to 10000, got {}", self.max_jobs),
            ));
        }
        out
    }
}

/// A job's labels from `scontrol show job -o`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobInfo {
    /// `UserId=alice(1000)` → `alice`.
    pub user: String,
    /// `Partition=`.
    pub partition: String,
    /// `JobName=`.
    pub job_name: String,
    /// `Account=` (empty for `(null)`).
    pub account: String,
}

/// Parses one line of `scontrol show job -o` (`Key=Value` fields separated by spaces).
/// `JobName=` may hold spaces: it runs up to the next ` UserId=`.
///
/// # Errors
/// No `UserId=` field (not a job record).
pub fn parse_scontrol(line: &str) -> Result<JobInfo, String> {
    let field = |key: &str| -> Option<String> {
        let at = line
            .find(&format!(" {key}="))
            .map(|i| i + 1)
            .or_else(|| line.starts_with(&format!("{key}=")).then_some(0))?;
        let rest = &line[at + key.len() + 1..];
        let end = if key == "JobName" {
            rest.find(" UserId=").unwrap_or(rest.len())
        } else {
            rest.find(' ').unwrap_or(rest.len())
        };
        Some(rest[..end].trim().to_owned())
    };
    let user = field("UserId").ok_or_else(|| format!("no UserId in {line:?}"))?;
    let user = user.split('(').next().unwrap_or_default().to_owned();
    let null = |v: Option<String>| v.filter(|v| v != "(null)").unwrap_or_default();
    Ok(JobInfo {
        user,
        partition: null(field("Partition")),
        job_name: null(field("JobName")),
        account: null(field("Account")),
    })
}

/// Runs `scontrol show job -o <id>` and parses its answer.
///
/// # Errors
/// The command failed or printed no job.
pub fn scontrol_job(scontrol: &std::path::Path, id: u64) -> Result<JobInfo, String> {
    let out = std::process::Command::new(scontrol)
        .args(["show", "job", "-o", &id.to_string()])
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("{}: {e}", scontrol.display()))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_owned());
    }
    parse_scontrol(String::from_utf8_lossy(&out.stdout).trim())
}

/// The result of one [`SlurmJobs::collect`].
#[derive(Debug, Default)]
pub struct SlurmCollection {
    /// The series (and the stale markers of ended jobs).
    pub metrics: Vec<Metric>,
    /// Jobs found but not exported (over `max_jobs`).
    pub capped: u64,
    /// `scontrol` failures (job id, error).
    pub lookup_errors: Vec<(u64, String)>,
}

/// The jobs' state between rounds.
#[derive(Debug, Default)]
pub struct SlurmJobs {
    /// Exported jobs, with their labels once known.
    exported: BTreeMap<u64, Option<JobInfo>>,
    /// The series of exported jobs at the last round (for their markers when they end).
    last_series: HashMap<u64, Vec<Metric>>,
    /// Ended jobs' markers still to send, with the rounds left.
    ending: Vec<(Vec<Metric>, u32)>,
}

fn label(name: &str, value: &str) -> Label {
    Label {
        name: name.to_owned(),
        value: value.to_owned(),
    }
}

fn sample(name: &str, help: &str, kind: MetricType, labels: Vec<Label>, value: f64) -> Metric {
    Metric {
        name: name.to_owned(),
        help: help.to_owned(),
        r#type: kind as i32,
        labels,
        value,
        ..Default::default()
    }
}

fn job_series(
    id: u64,
    uid: Option<u32>,
    info: Option<&JobInfo>,
    u: &cgroup::JobUsage,
) -> Vec<Metric> {
    let job = id.to_string();
    let user = info.map_or_else(
        || uid.map(|u| u.to_string()).unwrap_or_default(),
        |i| i.user.clone(),
    );
    let empty = JobInfo::default();
    let i = info.unwrap_or(&empty);
    let mut labels = vec![
        label("account", &i.account),
        label("job_id", &job),
        label("job_name", &i.job_name),
        label("partition", &i.partition),
        label("user", &user),
    ];
    labels.retain(|l| !l.value.is_empty() || l.name == "job_id");
    let by_job = || vec![label("job_id", &job)];
    let mut out = vec![sample(
        "uctel_job_info",
        "A Slurm job running on this host (1); join on job_id for its user, partition, name and account.",
        MetricType::Gauge,
        labels,
        1.0,
    )];
    let mut push = |name: &str, help: &str, kind, v: Option<f64>| {
        if let Some(v) = v {
            out.push(sample(name, help, kind, by_job(), v));
        }
    };
    push(
        "uctel_job_cpu_seconds_total",
        "CPU time of the job's tasks, seconds (its cgroup).",
        MetricType::Counter,
        u.cpu_seconds,
    );
    push(
        "uctel_job_memory_bytes",
        "Memory charged to the job's cgroup, bytes.",
        MetricType::Gauge,
        u.memory_bytes,
    );
    push(
        "uctel_job_io_read_bytes_total",
        "Bytes the job's cgroup read from block devices.",
        MetricType::Counter,
        u.io_read_bytes,
    );
    push(
        "uctel_job_io_write_bytes_total",
        "Bytes the job's cgroup wrote to block devices.",
        MetricType::Counter,
        u.io_write_bytes,
    );
    out
}

impl SlurmJobs {
    /// One round: the jobs under `section.cgroup_root`, their labels through `lookup` (for
    /// jobs without them yet), their series, and the markers of jobs that ended.
    pub fn collect(
        &mut self,
        section: &SlurmSection,
        mut lookup: impl FnMut(u64) -> Result<JobInfo, String>,
    ) -> SlurmCollection {
        let found = cgroup::discover(&section.cgroup_root);
        let mut out = SlurmCollection::default();
        // Ended: exported before, gone now. Their markers go now and in the next rounds.
        let ended: Vec<u64> = self
            .exported
            .keys()
            .filter(|id| !found.contains_key(id))
            .copied()
            .collect();
        for id in ended {
            self.exported.remove(&id);
            if let Some(series) = self.last_series.remove(&id) {
                let markers = series
                    .into_iter()
                    .map(|mut m| {
                        m.value = f64::from_bits(STALE_NAN_BITS);
                        m
                    })
                    .collect();
                self.ending.push((markers, STALE_ROUNDS));
            }
        }
        for (markers, left) in &mut self.ending {
            out.metrics.extend(markers.iter().cloned());
            *left -= 1;
        }
        self.ending.retain(|(_, left)| *left > 0);
        for (id, dirs) in &found {
            if !self.exported.contains_key(id) {
                if self.exported.len() >= section.max_jobs {
                    out.capped += 1;
                    continue;
                }
                self.exported.insert(*id, None);
            }
            let info = self.exported.get_mut(id).filter(|i| i.is_none());
            if let Some(slot) = info {
                match lookup(*id) {
                    Ok(i) => *slot = Some(i),
                    Err(e) => out.lookup_errors.push((*id, e)),
                }
            }
            let info = self.exported.get(id).and_then(Option::as_ref);
            let series = job_series(*id, dirs.uid, info, &cgroup::usage(dirs));
            // A label change (labels learnt late): the old info series ends.
            if let Some(old) = self.last_series.get(id) {
                if let (Some(o), Some(n)) = (old.first(), series.first()) {
                    if o.labels != n.labels {
                        let mut m = o.clone();
                        m.value = f64::from_bits(STALE_NAN_BITS);
                        self.ending.push((vec![m.clone()], STALE_ROUNDS - 1));
                        out.metrics.push(m);
                    }
                }
            }
            out.metrics.extend(series.iter().cloned());
            self.last_series.insert(*id, series);
        }
        out.metrics.push(sample(
            "uctel_slurm_jobs",
            "Slurm jobs with a cgroup on this host (exported or over sources.slurm.max_jobs).",
            MetricType::Gauge,
            Vec::new(),
            found.len() as f64,
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scontrol_lines_give_the_labels() {
        let line = "JobId=12 JobName=train resnet UserId=alice(1000) GroupId=alice(1000) MCS_label=N/A Priority=1 Account=(null) QOS=normal JobState=RUNNING Partition=gpu NodeList=vm";
        assert_eq!(
            parse_scontrol(line),
            Ok(JobInfo {
                user: "alice".into(),
                partition: "gpu".into(),
                job_name: "train resnet".into(),
                account: String::new(),
            })
        );
        assert!(parse_scontrol("slurm_load_jobs error: Invalid job id specified").is_err());
        assert!(parse_scontrol("").is_err());
    }

    fn job(root: &std::path::Path, id: u64, cpu_ns: u64) {
        let d = root.join(format!("cpuacct/slurm/uid_1000/job_{id}"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("cpuacct.usage"), format!("{cpu_ns}\n")).unwrap();
    }

    fn values(c: &SlurmCollection, name: &str) -> Vec<(String, f64)> {
        c.metrics
            .iter()
            .filter(|m| m.name == name)
            .map(|m| {
                let id = m
                    .labels
                    .iter()
                    .find(|l| l.name == "job_id")
                    .map(|l| l.value.clone());
                (id.unwrap_or_default(), m.value)
            })
            .collect()
    }

    #[test]
    fn ended_jobs_leave_with_stale_markers_and_the_cap_is_counted() {
        let d = tempfile::tempdir().unwrap();
        let section = SlurmSection {
            interval_seconds: 1.0,
            offset_seconds: 0.0,
            cgroup_root: d.path().to_path_buf(),
            scontrol_path: PathBuf::from("unused"),
            max_jobs: 2,
        };
        let lookup = |id: u64| {
            if id == 3 {
                Err("down".to_owned())
            } else {
                Ok(JobInfo {
                    user: "alice".into(),
                    partition: "p".into(),
                    ..Default::default()
                })
            }
        };
        let mut jobs = SlurmJobs::default();
        job(d.path(), 1, 2_000_000_000);
        job(d.path(), 2, 0);
        job(d.path(), 3, 0);
        let c = jobs.collect(&section, lookup);
        assert_eq!(
            values(&c, "uctel_job_info"),
            vec![("1".into(), 1.0), ("2".into(), 1.0)]
        );
        assert_eq!(
            values(&c, "uctel_job_cpu_seconds_total")[0],
            ("1".into(), 2.0)
        );
        assert_eq!(c.capped, 1, "job 3 is over the cap");
        assert_eq!(values(&c, "uctel_slurm_jobs"), vec![(String::new(), 3.0)]);
        // Job 1 ends: its two series are markers now and for the next rounds; job 3 takes
        // its place (labels from the uid: scontrol failed, counted).
        std::fs::remove_dir_all(d.path().join("cpuacct/slurm/uid_1000/job_1")).unwrap();
        let c = jobs.collect(&section, lookup);
        let info = values(&c, "uctel_job_info");
        assert!(
            info.iter()
                .any(|(id, v)| id == "1" && v.to_bits() == STALE_NAN_BITS),
            "{info:?}"
        );
        assert!(info.iter().any(|(id, v)| id == "3" && *v == 1.0));
        assert_eq!(c.capped, 0);
        assert_eq!(c.lookup_errors.len(), 1);
        let user3 = c
            .metrics
            .iter()
            .find(|m| m.name == "uctel_job_info" && m.labels.iter().any(|l| l.value == "3"))
            .unwrap();
        assert!(user3
            .labels
            .iter()
            .any(|l| l.name == "user" && l.value == "1000"));
        for _ in 1..STALE_ROUNDS {
            let c = jobs.collect(&section, lookup);
            assert!(values(&c, "uctel_job_cpu_seconds_total")
                .iter()
                .any(|(id, v)| id == "1" && v.is_nan()));
        }
        let c = jobs.collect(&section, lookup);
        assert!(values(&c, "uctel_job_info").iter().all(|(id, _)| id != "1"));
        // 1,000 short jobs: never more than max_jobs exported at once.
        for id in [2, 3] {
            std::fs::remove_dir_all(d.path().join(format!("cpuacct/slurm/uid_1000/job_{id}")))
                .unwrap();
        }
        for id in 10..1_010 {
            job(d.path(), id, 0);
            let c = jobs.collect(&section, lookup);
            let live = values(&c, "uctel_job_info")
                .iter()
                .filter(|(_, v)| *v == 1.0)
                .count();
            assert!(live <= 2);
            std::fs::remove_dir_all(d.path().join(format!("cpuacct/slurm/uid_1000/job_{id}")))
                .unwrap();
        }
        let c = jobs.collect(&section, lookup);
        assert!(c.metrics.len() < 40, "{}", c.metrics.len());
    }
}
