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

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use uctel_collector::outputs::remote_write::prompb::{self, Sample};
use uctel_protocol::frame::Frame;
use uctel_protocol::limits::Limits;
use uctel_protocol::payload::{decode_metric_batch, MetricType};

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
    let series = cfg.agents * cfg.frame.records() as usize;
    let offered = cfg.agents as f64 * f64::from(cfg.frame.records()) / cfg.gap.as_secs_f64();

    let baseline = if cfg.baseline {
        Some(run_uctel(cfg, &http, vm_addr, None)?.0.cpu)
    } else {
        None
    };
    let (uctel, accounting) = run_uctel(cfg, &http, vm_addr, Some(&write_url))?;
    let marginal = baseline.as_ref().and_then(|b| {
        let extra = uctel.cpu.cpu_seconds / uctel.cpu.wall_seconds.max(1e-9)
            - b.cpu_seconds / b.wall_seconds.max(1e-9);
        (extra > 0.0).then(|| uctel.samples_per_sec / extra)
    });
    let (vmagent, vmagent_error) = match run_vmagent(cfg, &http, vm_addr, &write_url) {
        Ok(s) => (Some(s), None),
        Err(e) => (None, Some(e.to_string())),
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
    })
}

fn run_uctel(
    cfg: &RemoteWriteRunConfig,
    http: &ureq::Agent,
    vm_addr: SocketAddr,
    write_url: Option<&str>,
) -> Result<(Side, Accounting), RemoteWriteError> {
    let dir = cfg.workdir.join(if write_url.is_some() {
        "uctel"
    } else {
        "uctel-baseline"
    });
    std::fs::create_dir_all(&dir).map_err(setup("work directory"))?;
    let slot_bytes = u32::try_from(cfg.frame.len()).unwrap_or(u32::MAX);
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
        agents: cfg.agents,
        control: collector.control,
        token: TOKEN.into(),
        frame: cfg.frame.clone(),
        qps_per_device: 32,
        sq_depth: 256,
        post_batch: 16,
        connect_parallelism: 32,
        pace: Some(cfg.gap),
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

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The template's series for `agents` agents: encoded labels and the value of each.
fn series_of(
    frame: &FrameTemplate,
    agents: usize,
) -> Result<Vec<(Vec<u8>, f64)>, RemoteWriteError> {
    let f = Frame::new_checked(frame.bytes()).map_err(setup("template frame"))?;
    let limits = Limits {
        max_frame_bytes: frame.len(),
        ..Limits::default()
    };
    let batch = decode_metric_batch(f.payload(), &limits).map_err(setup("template payload"))?;
    let mut out = Vec::new();
    for k in 0..agents {
        let agent = format!("bench-{k}");
        for m in &batch.metrics {
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
    Ok(out)
}

fn run_vmagent(
    cfg: &RemoteWriteRunConfig,
    http: &ureq::Agent,
    vm_addr: SocketAddr,
    write_url: &str,
) -> Result<Side, RemoteWriteError> {
    let dir = cfg.workdir.join("vmagent");
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
    let series = series_of(&cfg.frame, cfg.agents)?;
    let stop = Arc::new(AtomicBool::new(false));
    let posted = Arc::new(AtomicU64::new(0));
    let feeder = {
        let (stop, posted) = (stop.clone(), posted.clone());
        let gap_ms = i64::try_from(cfg.gap.as_millis().max(1)).unwrap_or(1);
        let url = format!("http://{addr}/api/v1/write");
        let per_frame = cfg.frame.records() as usize;
        let agents = cfg.agents;
        std::thread::Builder::new()
            .name("vmagent-feed".into())
            .spawn(move || feed(&url, &series, agents, per_frame, gap_ms, &stop, &posted))
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
    gap_ms: i64,
    stop: &AtomicBool,
    posted: &AtomicU64,
) -> Result<(), RemoteWriteError> {
    let http = http();
    let start = now_ms();
    let mut next_frame: i64 = 0;
    let mut scratch = Vec::new();
    let per_series = series.len().max(1);
    while !stop.load(Ordering::Acquire) {
        let due = (now_ms() - start) / gap_ms + 1;
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
            let ts = start + next_frame * gap_ms;
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
