//! The remote-write row: samples delivered per CPU-second into a real VictoriaMetrics, by
//! `uctel-collector` (emulated agents over the soft UC path → collector → remote-write) and
//! by `vmagent` (the same series at the same rate pushed to its remote-write input →
//! vmagent → remote-write), one after the other in the same run, against the same receiver.
//!
//! Both sides are relays that take the samples in, queue them and write them out; the
//! yardstick is the receiver's own count (`vm_rows_inserted_total{type="promremotewrite"}`)
//! over the window, divided by the relay process' `utime + stime`. The collector's figure
//! also pays for everything else it does with a frame (UC receive, CRC, sequence tracking,
//! the `/metrics` store), so the comparison is conservative for uctel; its CPU by thread
//! shows where the time goes.
//!
//! The load: `K` agents, each one frame per `gap` (11 node_exporter-style series per frame,
//! every series stamped with the frame's time, strictly increasing in ms), so
//! `K × 11 / gap` samples/s over `K × 11` series.
//!
//! With a series-dictionary template (`dict_frame`, issue 43) the row runs a second pair
//! right after the first: the collector fed steady-state `kind = metrics_dict` frames of the
//! same frame size (negotiated at `Hello`, [`crate::loadgen`]), then vmagent fed the same
//! series at the same rate. A dictionary frame holds many more samples, so that pair uses
//! fewer agents and another frame gap, chosen to keep the samples per second offered equal
//! and the series count as close as whole agents allow (`dict_load`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use uctel_collector::outputs::remote_write::prompb::{self, Sample};
use uctel_protocol::payload::MetricType;

use crate::cpu::{delta, sample_process, CpuDelta};
use crate::daemon::{
    free_tcp_port, scrape, stop_child, CollectorProcess, CollectorSettings, TOKEN,
};
use crate::loadgen::{LoadConfig, LoadGen};
use crate::workload::FrameTemplate;

/// How the row runs.
#[derive(Clone, Debug)]
pub struct RemoteWriteRunConfig {
    /// The collector binary.
    pub collector_bin: PathBuf,
    /// `victoria-metrics`.
    pub victoria_bin: PathBuf,
    /// `vmagent`.
    pub vmagent_bin: PathBuf,
    /// Work directory (configs, data, logs).
    pub workdir: PathBuf,
    /// Emulated agents.
    pub agents: usize,
    /// Frames sent.
    pub frame: Arc<FrameTemplate>,
    /// One frame per agent per this interval.
    pub gap: Duration,
    /// Ring slots per agent.
    pub slots: u32,
    /// Also measure the collector with the same load and no remote-write (its marginal
    /// cost per sample is the difference).
    pub baseline: bool,
    /// Unmeasured start of each side.
    pub warmup: Duration,
    /// Measured window of each side.
    pub duration: Duration,
    /// Also run the pair with series-dictionary frames of this template.
    pub dict_frame: Option<Arc<FrameTemplate>>,
}

/// One load: agents, their frames and the gap between an agent's frames.
#[derive(Clone, Debug)]
struct Load {
    agents: usize,
    frame: Arc<FrameTemplate>,
    gap: Duration,
    /// Names the collector's work directory.
    tag: &'static str,
}

impl Load {
    fn series(&self) -> usize {
        self.agents * self.frame.records() as usize
    }

    fn offered(&self) -> f64 {
        self.agents as f64 * f64::from(self.frame.records()) / self.gap.as_secs_f64()
    }
}

/// The dictionary pair's load for a protobuf load of `agents` agents with `plain_records`
/// samples per frame every `gap`: `agents × plain_records / dict_records` agents (rounded,
/// at least one) and the gap that offers the same samples per second.
fn dict_load(agents: usize, plain_records: u32, gap: Duration, frame: Arc<FrameTemplate>) -> Load {
    let dict_records = f64::from(frame.records().max(1));
    let per_sec = agents as f64 * f64::from(plain_records) / gap.as_secs_f64();
    let k = ((agents as f64 * f64::from(plain_records) / dict_records).round() as usize).max(1);
    Load {
        agents: k,
        gap: Duration::from_secs_f64(k as f64 * dict_records / per_sec.max(1e-9)),
        frame,
        tag: "uctel-dict",
    }
}

/// The series-dictionary pair of the row.
#[derive(Clone, Debug, Serialize)]
pub struct DictPair {
    /// Emulated agents.
    pub agents: usize,
    /// Distinct series.
    pub series: usize,
    /// Samples per steady-state frame.
    pub records_per_frame: u32,
    /// Bytes of the steady-state frame.
    pub frame_bytes: usize,
    /// Each agent's frame gap, ms.
    pub gap_ms: f64,
    /// Samples offered per second.
    pub offered_per_sec: f64,
    /// uctel-collector fed `metrics_dict` frames.
    pub uctel: Side,
    /// vmagent fed the same series at the same rate.
    pub vmagent: Option<Side>,
    /// Why vmagent is absent.
    pub vmagent_error: Option<String>,
    /// The collector's sum rule.
    pub accounting: Accounting,
}

/// One relay's figures.
#[derive(Clone, Debug, Serialize)]
pub struct Side {
    /// Samples the receiver inserted in the window.
    pub samples: f64,
    /// Per wall second.
    pub samples_per_sec: f64,
    /// Per relay CPU second.
    pub samples_per_core_sec: f64,
    /// The relay's CPU in the window.
    pub cpu: CpuDelta,
}

/// The collector's remote-write accounting after the run (all agents said `Goodbye`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Accounting {
    /// `samples_in_total`.
    pub samples_in: f64,
    /// `samples_total`.
    pub sent: f64,
    /// `samples_dropped_total` by reason.
    pub dropped: BTreeMap<String, f64>,
    /// `samples_failed_total` by reason.
    pub failed: BTreeMap<String, f64>,
    /// `samples_pending`.
    pub pending: f64,
    /// `samples_in − sent − dropped − failed − pending` (0 when the sum rule holds).
    pub unaccounted: f64,
    /// Samples in the frames the load generator posted.
    pub offered: u64,
    /// `stale_markers_total`: markers for the series that ended at the agents' `Goodbye`s,
    /// part of `samples_in` (so `samples_in = offered + stale_markers` when no frame was
    /// lost on the way).
    pub stale_markers: f64,
}

/// The row.
#[derive(Clone, Debug, Serialize)]
pub struct RemoteWriteResult {
    /// Emulated agents.
    pub agents: usize,
    /// Distinct series.
    pub series: usize,
    /// Samples offered per second.
    pub offered_per_sec: f64,
    /// uctel-collector.
    pub uctel: Side,
    /// The collector with the same load and no output: CPU only (`samples` is what it
    /// would have sent: 0).
    pub baseline: Option<CpuDelta>,
    /// Samples delivered per CPU-s of the collector's extra CPU with remote-write on
    /// (`uctel.cpu − baseline`).
    pub marginal_samples_per_core_sec: Option<f64>,
    /// vmagent (absent when it could not be run; see `vmagent_error`).
    pub vmagent: Option<Side>,
    /// Why vmagent is absent.
    pub vmagent_error: Option<String>,
    /// The collector's sum rule.
    pub accounting: Accounting,
    /// The series-dictionary pair (when asked for).
    pub dict: Option<DictPair>,
}

/// Why the row failed.
#[derive(Debug, thiserror::Error)]
pub enum RemoteWriteError {
    /// A daemon or the generator.
    #[error("{0}")]
    Setup(String),
}

fn setup<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> RemoteWriteError + '_ {
    move |e| RemoteWriteError::Setup(format!("{what}: {e}"))
}

/// A child process with its log file, killed on drop.
struct Proc {
    child: Option<Child>,
    log: PathBuf,
}

impl Proc {
    fn spawn(bin: &Path, args: &[String], log: PathBuf) -> Result<Proc, RemoteWriteError> {
        if !bin.is_file() {
            return Err(RemoteWriteError::Setup(format!(
                "{} not found (Debian: apt-get install victoria-metrics)",
                bin.display()
            )));
        }
        let out = std::fs::File::create(&log).map_err(setup("log file"))?;
        let err = out.try_clone().map_err(setup("log file"))?;
        let child = Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(setup("spawn"))?;
        Ok(Proc {
            child: Some(child),
            log,
        })
    }

    fn pid(&self) -> i32 {
        self.child
            .as_ref()
            .map_or(0, |c| i32::try_from(c.id()).unwrap_or(0))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            stop_child(&mut c);
        }
    }
}

fn http() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(20)))
        .build()
        .new_agent()
}

fn wait_http(http: &ureq::Agent, url: &str, log: &Path) -> Result<(), RemoteWriteError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while http.get(url).call().is_err() {
        if Instant::now() >= deadline {
            return Err(RemoteWriteError::Setup(format!(
                "{url} not answering within 60 s; see {}",
                log.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// Rows VictoriaMetrics inserted from remote-write so far.
fn vm_rows(http: &ureq::Agent, addr: SocketAddr) -> Result<f64, RemoteWriteError> {
    let s = scrape(http, addr).map_err(setup("VictoriaMetrics /metrics"))?;
    Ok(s.sum("vm_rows_inserted_total", &[("type", "promremotewrite")]))
}

fn rate(n: f64, d: f64) -> f64 {
    if d > 0.0 {
        n / d
    } else {
        0.0
    }
}

/// Runs both sides.
///
/// # Errors
/// [`RemoteWriteError`] when VictoriaMetrics, the collector or the generator cannot run
/// (vmagent's failure only leaves its side out).
pub fn run(cfg: &RemoteWriteRunConfig) -> Result<RemoteWriteResult, RemoteWriteError> {
    std::fs::create_dir_all(&cfg.workdir).map_err(setup("work directory"))?;
    let http = http();
    let vm_addr = SocketAddr::from(([127, 0, 0, 1], free_tcp_port().map_err(setup("port"))?));
    let vm = Proc::spawn(
        &cfg.victoria_bin,
        &[
            format!("-storageDataPath={}", cfg.workdir.join("vm-data").display()),
            format!("-httpListenAddr={vm_addr}"),
            "-loggerLevel=WARN".into(),
        ],
        cfg.workdir.join("victoria.out"),
    )?;
    wait_http(&http, &format!("http://{vm_addr}/health"), &vm.log)?;
    let write_url = format!("http://{vm_addr}/api/v1/write");
    let load = Load {
        agents: cfg.agents,
        frame: cfg.frame.clone(),
        gap: cfg.gap,
        tag: "uctel",
    };
    let (series, offered) = (load.series(), load.offered());

    let baseline = if cfg.baseline {
        let base = Load {
            tag: "uctel-baseline",
            ..load.clone()
        };
        Some(run_uctel(cfg, &base, &http, vm_addr, None)?.0.cpu)
    } else {
        None
    };
    let (uctel, accounting) = run_uctel(cfg, &load, &http, vm_addr, Some(&write_url))?;
    let marginal = baseline.as_ref().and_then(|b| {
        let extra = uctel.cpu.cpu_seconds / uctel.cpu.wall_seconds.max(1e-9)
            - b.cpu_seconds / b.wall_seconds.max(1e-9);
        (extra > 0.0).then(|| uctel.samples_per_sec / extra)
    });
    let (vmagent, vmagent_error) = match run_vmagent(cfg, &load, &http, vm_addr, &write_url) {
        Ok(s) => (Some(s), None),
        Err(e) => (None, Some(e.to_string())),
    };
    let dict = match &cfg.dict_frame {
        Some(f) => {
            let d = dict_load(cfg.agents, cfg.frame.records(), cfg.gap, f.clone());
            let (uctel, accounting) = run_uctel(cfg, &d, &http, vm_addr, Some(&write_url))?;
            let (vmagent, vmagent_error) = match run_vmagent(cfg, &d, &http, vm_addr, &write_url) {
                Ok(s) => (Some(s), None),
                Err(e) => (None, Some(e.to_string())),
            };
            Some(DictPair {
                agents: d.agents,
                series: d.series(),
                records_per_frame: d.frame.records(),
                frame_bytes: d.frame.steady_len(),
                gap_ms: d.gap.as_secs_f64() * 1e3,
                offered_per_sec: d.offered(),
                uctel,
                vmagent,
                vmagent_error,
                accounting,
            })
        }
        None => None,
    };
    drop(vm);
    Ok(RemoteWriteResult {
        agents: cfg.agents,
        series,
        offered_per_sec: offered,
        uctel,
        baseline,
        marginal_samples_per_core_sec: marginal,
        vmagent,
        vmagent_error,
        accounting,
        dict,
    })
}

fn run_uctel(
    cfg: &RemoteWriteRunConfig,
    load: &Load,
    http: &ureq::Agent,
    vm_addr: SocketAddr,
    write_url: Option<&str>,
) -> Result<(Side, Accounting), RemoteWriteError> {
    let dir = cfg.workdir.join(load.tag);
    std::fs::create_dir_all(&dir).map_err(setup("work directory"))?;
    let slot_bytes = u32::try_from(load.frame.len()).unwrap_or(u32::MAX);
    let collector = CollectorProcess::start(
        &cfg.collector_bin,
        &dir,
        &CollectorSettings {
            slots: cfg.slots,
            slot_bytes,
            credit_margin_slots: (cfg.slots / 16).clamp(1, 64),
            descriptor_queue: 8192,
            // A window of `slots − 64` frames per report covers the paced rate (the
            // default 1024 slots against 500 frames/s at the default 2 ms).
            report_interval_seconds: 0.5,
            data_path: "write_with_imm",
            log_file: dir.join("logs.jsonl"),
            credit_write_batching: None,
            extra_yaml: write_url.map_or_else(String::new, |u| {
                format!("outputs:\n  remote_write:\n    - url: {u}\n")
            }),
            recv_buffer_bytes: None,
            progress: None,
            min_slots: None,
        },
    )
    .map_err(setup("collector"))?;
    let mut gen = LoadGen::connect(&LoadConfig {
        agents: load.agents,
        control: collector.control,
        token: TOKEN.into(),
        frame: load.frame.clone(),
        qps_per_device: 32,
        sq_depth: 256,
        post_batch: 16,
        connect_parallelism: 32,
        pace: Some(load.gap),
        expected_fps: None,
        bursts: None,
        credit_writes: false,
    })
    .map_err(setup("load generator"))?;
    gen.start_sending().map_err(setup("load generator"))?;
    std::thread::sleep(cfg.warmup);
    let (c0, r0) = (
        collector.sample().map_err(setup("collector CPU"))?,
        vm_rows(http, vm_addr)?,
    );
    let t0 = Instant::now();
    std::thread::sleep(cfg.duration);
    let (c1, r1) = (
        collector.sample().map_err(setup("collector CPU"))?,
        vm_rows(http, vm_addr)?,
    );
    let window = t0.elapsed().as_secs_f64();
    gen.stop_sending();
    gen.wait_consumed(Duration::from_secs(5));
    let offered = gen.records_sent();
    let _ = gen.finish();
    // Goodbyes settle; the queues drain (stale markers included).
    const RW: &str = "uctel_collector_remote_write_";
    let deadline = Instant::now() + Duration::from_secs(30);
    let s = loop {
        let s = collector.scrape().map_err(setup("collector /metrics"))?;
        let idle = s.sum("uctel_collector_agents_connected", &[]) <= 0.0
            && s.sum(&format!("{RW}samples_pending"), &[]) <= 0.0;
        if idle || Instant::now() >= deadline {
            break s;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    collector.stop();
    let by_reason = |name: &str| s.sum_by(&format!("{RW}{name}"), "reason");
    let mut a = Accounting {
        samples_in: s.sum(&format!("{RW}samples_in_total"), &[]),
        sent: s.sum(&format!("{RW}samples_total"), &[]),
        dropped: by_reason("samples_dropped_total"),
        failed: by_reason("samples_failed_total"),
        pending: s.sum(&format!("{RW}samples_pending"), &[]),
        unaccounted: 0.0,
        offered,
        stale_markers: s.sum(&format!("{RW}stale_markers_total"), &[]),
    };
    a.unaccounted = a.samples_in
        - a.sent
        - a.dropped.values().sum::<f64>()
        - a.failed.values().sum::<f64>()
        - a.pending
        + 0.0;
    let cpu = delta(&c0, &c1);
    let samples = r1 - r0;
    Ok((
        Side {
            samples,
            samples_per_sec: rate(samples, window),
            samples_per_core_sec: rate(samples, cpu.cpu_seconds),
            cpu,
        },
        a,
    ))
}

/// Collector samples per CPU-s with `metrics_dict` frames at least this multiple of
/// vmagent's, same load, same receiver (issue 43).
pub const DICT_REMOTE_WRITE_VS_VMAGENT: f64 = 2.0;

/// The report's rows of the dictionary pair (none when it did not run).
pub fn dict_rows(r: &RemoteWriteResult) -> Vec<[String; 4]> {
    use crate::stats::si;
    let Some(d) = &r.dict else {
        return Vec::new();
    };
    let vs = d.vmagent.as_ref().map_or_else(
        || {
            format!(
                "vmagent not run: {}",
                d.vmagent_error.clone().unwrap_or_default()
            )
        },
        |v| {
            format!(
                "{:.2}× vmagent ({} samples/s, {} per vmagent CPU-s, {:.2} cores)",
                rate(d.uctel.samples_per_core_sec, v.samples_per_core_sec),
                si(v.samples_per_sec),
                si(v.samples_per_core_sec),
                v.cpu.cores
            )
        },
    );
    let a = &d.accounting;
    vec![
        [
            format!(
                "  metrics_dict frames: K = {}, {} series, {} samples per {} B frame every {:.2} ms",
                d.agents, d.series, d.records_per_frame, d.frame_bytes, d.gap_ms
            ),
            format!(
                "{} samples/s; {} per collector CPU-s ({:.2} cores); {:.2}× the metrics frames'",
                si(d.uctel.samples_per_sec),
                si(d.uctel.samples_per_core_sec),
                d.uctel.cpu.cores,
                rate(d.uctel.samples_per_core_sec, r.uctel.samples_per_core_sec)
            ),
            vs,
            format!("offered {} samples/s", si(d.offered_per_sec)),
        ],
        [
            "  metrics_dict remote-write accounting (whole run)".into(),
            format!(
                "offered {} + stale markers {}; in {} = sent {} + dropped {} + failed {} + pending {}",
                a.offered,
                a.stale_markers,
                a.samples_in,
                a.sent,
                a.dropped.values().sum::<f64>(),
                a.failed.values().sum::<f64>(),
                a.pending
            ),
            format!("unaccounted {}", a.unaccounted),
            format!("collector threads: {}", threads_of(&d.uctel.cpu)),
        ],
    ]
}

fn threads_of(c: &CpuDelta) -> String {
    let mut v: Vec<(&String, &f64)> = c.by_thread.iter().filter(|(_, s)| **s > 0.0).collect();
    v.sort_by(|a, b| b.1.total_cmp(a.1));
    v.iter()
        .map(|(n, s)| format!("{n} {:.2}", *s / c.wall_seconds.max(1e-9)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The dictionary pair's target (none when it or vmagent did not run).
pub fn dict_targets(r: &RemoteWriteResult) -> Vec<crate::stats::Target> {
    use crate::stats::{Goal, Target, Verdict};
    let Some((d, v)) = r
        .dict
        .as_ref()
        .and_then(|d| d.vmagent.as_ref().map(|v| (d, v)))
    else {
        return Vec::new();
    };
    vec![Target {
        name: "remote-write vs vmagent per core, metrics_dict frames".into(),
        rule: format!(
            "samples delivered per collector CPU-s ≥ {DICT_REMOTE_WRITE_VS_VMAGENT} × vmagent's (issue 43)"
        ),
        verdict: Verdict::check(
            rate(d.uctel.samples_per_core_sec, v.samples_per_core_sec),
            DICT_REMOTE_WRITE_VS_VMAGENT,
            Goal::AtLeast,
        ),
    }]
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The template's series for `agents` agents: encoded labels and the value of each.
fn series_of(frame: &FrameTemplate, agents: usize) -> Vec<(Vec<u8>, f64)> {
    let mut out = Vec::new();
    for k in 0..agents {
        let agent = format!("bench-{k}");
        for m in frame.series() {
            if m.r#type == MetricType::Histogram as i32 {
                continue;
            }
            let mut labels: Vec<(&str, &str)> = m
                .labels
                .iter()
                .map(|l| (l.name.as_str(), l.value.as_str()))
                .collect();
            labels.push(("__name__", m.name.as_str()));
            labels.push(("agent", agent.as_str()));
            labels.push(("instance", "bench-host"));
            labels.sort_unstable();
            out.push((prompb::encode_labels(labels), m.value));
        }
    }
    out
}

fn run_vmagent(
    cfg: &RemoteWriteRunConfig,
    load: &Load,
    http: &ureq::Agent,
    vm_addr: SocketAddr,
    write_url: &str,
) -> Result<Side, RemoteWriteError> {
    let dir = cfg.workdir.join(format!("vmagent-{}", load.tag));
    std::fs::create_dir_all(&dir).map_err(setup("work directory"))?;
    let addr = SocketAddr::from(([127, 0, 0, 1], free_tcp_port().map_err(setup("port"))?));
    let agent = Proc::spawn(
        &cfg.vmagent_bin,
        &[
            format!("-httpListenAddr={addr}"),
            format!("-remoteWrite.url={write_url}"),
            format!("-remoteWrite.tmpDataPath={}", dir.join("queue").display()),
            "-loggerLevel=WARN".into(),
        ],
        dir.join("vmagent.out"),
    )?;
    wait_http(http, &format!("http://{addr}/health"), &agent.log)?;
    let series = series_of(&load.frame, load.agents);
    let stop = Arc::new(AtomicBool::new(false));
    let posted = Arc::new(AtomicU64::new(0));
    let feeder = {
        let (stop, posted) = (stop.clone(), posted.clone());
        let gap = load.gap;
        let url = format!("http://{addr}/api/v1/write");
        let per_frame = load.frame.records() as usize;
        let agents = load.agents;
        std::thread::Builder::new()
            .name("vmagent-feed".into())
            .spawn(move || feed(&url, &series, agents, per_frame, gap, &stop, &posted))
            .map_err(setup("feeder thread"))?
    };
    std::thread::sleep(cfg.warmup);
    let pid = agent.pid();
    let (c0, r0) = (
        sample_process(pid).map_err(setup("vmagent CPU"))?,
        vm_rows(http, vm_addr)?,
    );
    let t0 = Instant::now();
    std::thread::sleep(cfg.duration);
    let (c1, r1) = (
        sample_process(pid).map_err(setup("vmagent CPU"))?,
        vm_rows(http, vm_addr)?,
    );
    let window = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Release);
    let fed = feeder
        .join()
        .map_err(|_| RemoteWriteError::Setup("feeder panicked".into()))?;
    fed?;
    drop(agent);
    let cpu = delta(&c0, &c1);
    let samples = r1 - r0;
    Ok(Side {
        samples,
        samples_per_sec: rate(samples, window),
        samples_per_core_sec: rate(samples, cpu.cpu_seconds),
        cpu,
    })
}

/// Pushes, every 10 ms, the frames due since the last push (one per agent per `gap_ms`,
/// each series stamped with its frame's time) as remote-write requests of at most 2000
/// samples, the collector's default batch.
fn feed(
    url: &str,
    series: &[(Vec<u8>, f64)],
    agents: usize,
    per_frame: usize,
    gap: Duration,
    stop: &AtomicBool,
    posted: &AtomicU64,
) -> Result<(), RemoteWriteError> {
    let http = http();
    let start = now_ms();
    // At least 1 ms, so that every series' timestamps strictly increase.
    let gap_ms = (gap.as_secs_f64() * 1e3).max(1.0);
    let mut next_frame: i64 = 0;
    let mut scratch = Vec::new();
    let per_series = series.len().max(1);
    while !stop.load(Ordering::Acquire) {
        let due = ((now_ms() - start) as f64 / gap_ms) as i64 + 1;
        let mut pending: Vec<Vec<Sample>> = vec![Vec::new(); per_series];
        let mut n = 0usize;
        let flush = |pending: &mut Vec<Vec<Sample>>,
                     scratch: &mut Vec<u8>|
         -> Result<(), RemoteWriteError> {
            let body = prompb::encode_request(
                series
                    .iter()
                    .zip(pending.iter())
                    .filter(|(_, s)| !s.is_empty())
                    .map(|((l, _), s)| (l.as_slice(), s.as_slice())),
                scratch,
            )
            .map_err(setup("snappy"))?;
            http.post(url)
                .header("Content-Encoding", "snappy")
                .header("Content-Type", "application/x-protobuf")
                .header("X-Prometheus-Remote-Write-Version", "0.1.0")
                .send(&body[..])
                .map_err(setup("POST to vmagent"))?;
            for s in pending.iter_mut() {
                s.clear();
            }
            Ok(())
        };
        while next_frame < due {
            let ts = start + (next_frame as f64 * gap_ms) as i64;
            for k in 0..agents {
                for j in 0..per_frame {
                    let i = k * per_frame + j;
                    if let Some((_, v)) = series.get(i) {
                        pending[i].push(Sample {
                            value: *v,
                            timestamp: ts,
                        });
                        n += 1;
                    }
                }
                if n >= 2000 {
                    flush(&mut pending, &mut scratch)?;
                    posted.fetch_add(n as u64, Ordering::Relaxed);
                    n = 0;
                }
            }
            next_frame += 1;
        }
        if n > 0 {
            flush(&mut pending, &mut scratch)?;
            posted.fetch_add(n as u64, Ordering::Relaxed);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}
