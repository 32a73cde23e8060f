//! The real daemons as child processes: configuration files, start, readiness, `/metrics`
//! scrapes, CPU and memory samples, and an orderly stop (SIGTERM, then SIGKILL).

use std::fs;
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::cpu::{sample_process, ProcessSample, SampleError};
use crate::promtext::Scrape;

/// The pre-shared token every bench agent proves.
pub const TOKEN: &str = "uctel-bench-token";

/// Why a daemon could not be run or read.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The binary is missing.
    #[error("{what} binary not found at {path} (build it: cargo build --release -p {package})")]
    MissingBinary {
        /// `collector` or `agent`.
        what: &'static str,
        /// Where it was looked for.
        path: PathBuf,
        /// The package that builds it.
        package: &'static str,
    },
    /// Filesystem or process error.
    #[error("{what}: {source}")]
    Io {
        /// Which step.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The daemon did not become ready.
    #[error("{what} not ready within {timeout:?}; its output is in {log}")]
    NotReady {
        /// Which daemon.
        what: &'static str,
        /// How long we waited.
        timeout: Duration,
        /// Its captured output.
        log: String,
    },
    /// The daemon exited early.
    #[error("{what} exited with {status}; its output is in {log}")]
    Exited {
        /// Which daemon.
        what: &'static str,
        /// Exit status.
        status: String,
        /// Its captured output.
        log: String,
    },
    /// Scraping `/metrics` failed.
    #[error("scraping {url}: {detail}")]
    Scrape {
        /// The URL.
        url: String,
        /// What failed.
        detail: String,
    },
    /// procfs.
    #[error(transparent)]
    Sample(#[from] SampleError),
}

/// An `io::Error` mapper naming `what` failed, for `map_err`.
pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> DaemonError {
    let what = what.into();
    move |source| DaemonError::Io { what, source }
}

/// A free TCP port on 127.0.0.1 (bound, read, released; the tiny race is acceptable here).
///
/// # Errors
/// The OS refused an ephemeral bind.
pub fn free_tcp_port() -> Result<u16, DaemonError> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(io("free TCP port"))?;
    Ok(l.local_addr().map_err(io("free TCP port"))?.port())
}

/// A free UDP port on 127.0.0.1.
///
/// # Errors
/// The OS refused an ephemeral bind.
pub fn free_udp_port() -> Result<u16, DaemonError> {
    let s = UdpSocket::bind("127.0.0.1:0").map_err(io("free UDP port"))?;
    Ok(s.local_addr().map_err(io("free UDP port"))?.port())
}

/// The smallest InfiniBand path MTU (256 … 4096) that carries `frame_bytes` in one packet.
pub fn mtu_for(frame_bytes: usize) -> u32 {
    [256u32, 512, 1024, 2048, 4096]
        .into_iter()
        .find(|m| *m as usize >= frame_bytes)
        .unwrap_or(4096)
}

/// Settings of a benchmark collector.
#[derive(Clone, Debug)]
pub struct CollectorSettings {
    /// Ring slots per agent.
    pub slots: u32,
    /// Bytes per slot (= `max_frame_bytes`).
    pub slot_bytes: u32,
    /// Credit margin (agent may have `slots - margin` frames outstanding).
    pub credit_margin_slots: u32,
    /// Poller → worker queue room beyond the credit windows (`ring.descriptor_queue`).
    pub descriptor_queue: u32,
    /// Seconds between `Report`s (which carry the credits).
    pub report_interval_seconds: f64,
    /// `auto`, `write_with_imm` or `send`.
    pub data_path: &'static str,
    /// Log records go to this JSON Lines file.
    pub log_file: PathBuf,
    /// More top-level YAML appended to the configuration (e.g. an `outputs:` section).
    pub extra_yaml: String,
    /// `control.credit_write_batching` (`None`: the collector's default).
    pub credit_write_batching: Option<bool>,
    /// `transport.soft.recv_buffer_bytes` (`None`: the collector's default).
    pub recv_buffer_bytes: Option<usize>,
    /// `ring.min_slots` (`None`: the collector's default).
    pub min_slots: Option<u32>,
    /// `transport.soft.progress` (`None`: the collector's default).
    pub progress: Option<&'static str>,
}

/// A collector child process.
#[derive(Debug)]
pub struct CollectorProcess {
    child: Child,
    /// Control-plane address.
    pub control: SocketAddr,
    /// `/metrics` address.
    pub metrics: SocketAddr,
    /// The soft device's UDP address.
    pub udp: SocketAddr,
    log: PathBuf,
    http: ureq::Agent,
}

impl CollectorProcess {
    /// Writes a configuration into `dir` and starts `binary` on it; returns once `/metrics`
    /// answers. The ports are picked free just before the start, so another process may take
    /// one in between (an outgoing connection's ephemeral port): a start that fails with
    /// `EADDRINUSE` is tried again on fresh ports, up to 5 times.
    ///
    /// # Errors
    /// [`DaemonError`] for a missing binary, a bad start or no readiness within 15 s.
    pub fn start(
        binary: &Path,
        dir: &Path,
        s: &CollectorSettings,
    ) -> Result<CollectorProcess, DaemonError> {
        let mut tries = 0;
        loop {
            tries += 1;
            match Self::start_once(binary, dir, s) {
                Err(DaemonError::Exited { log, .. })
                    if tries < 5
                        && fs::read_to_string(&log)
                            .is_ok_and(|l| l.contains("Address already in use")) => {}
                other => return other,
            }
        }
    }

    fn start_once(
        binary: &Path,
        dir: &Path,
        s: &CollectorSettings,
    ) -> Result<CollectorProcess, DaemonError> {
        if !binary.is_file() {
            return Err(DaemonError::MissingBinary {
                what: "collector",
                path: binary.to_path_buf(),
                package: "uctel-collector",
            });
        }
        let control = SocketAddr::from(([127, 0, 0, 1], free_tcp_port()?));
        let metrics = SocketAddr::from(([127, 0, 0, 1], free_tcp_port()?));
        let udp = SocketAddr::from(([127, 0, 0, 1], free_udp_port()?));
        let mtu = mtu_for(s.slot_bytes as usize);
        let yaml = format!(
            "listen:\n  control: {control}\n  metrics: {metrics}\n\
             transport:\n  kind: soft\n  soft:\n    name: soft0\n    bind: {udp}\n    mtu_bytes: {mtu}\n{progress}{rcvbuf}\
             ring:\n  slots: {slots}\n{min_slots}  slot_bytes: {slot_bytes}\n  credit_margin_slots: {margin}\n  descriptor_queue: {queue}\n  data_path: {path}\n\
             max_frame_bytes: {slot_bytes}\n\
             auth:\n  shared:\n    token: {TOKEN}\n\
             control:\n  heartbeat_interval_seconds: 5\n  report_interval_seconds: {report}\n  dead_after_missed_heartbeats: 6\n  handshake_timeout_seconds: 30\n{batching}\
             logs:\n  sink: file\n  file:\n    path: {log_file}\n    max_file_bytes: 67108864\n    max_files: 1\n{extra}",
            slots = s.slots,
            slot_bytes = s.slot_bytes,
            margin = s.credit_margin_slots,
            queue = s.descriptor_queue,
            path = s.data_path,
            report = s.report_interval_seconds,
            log_file = s.log_file.display(),
            extra = s.extra_yaml,
            rcvbuf = s
                .recv_buffer_bytes
                .map_or(String::new(), |b| format!("    recv_buffer_bytes: {b}\n")),
            progress = s
                .progress
                .map_or(String::new(), |p| format!("    progress: {p}\n")),
            min_slots = s
                .min_slots
                .map_or(String::new(), |m| format!("  min_slots: {m}\n")),
            batching = s.credit_write_batching.map_or(String::new(), |b| {
                format!("  credit_write_batching: {b}\n")
            }),
        );
        let config = dir.join("collector.yaml");
        fs::write(&config, yaml).map_err(io("writing collector.yaml"))?;
        let log = dir.join("collector.out");
        let out = fs::File::create(&log).map_err(io("creating collector.out"))?;
        let err = out.try_clone().map_err(io("collector.out"))?;
        let child = Command::new(binary)
            .arg("--config")
            .arg(&config)
            .arg("--log-level")
            .arg("warn")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(io(format!("starting {}", binary.display())))?;
        let http = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(20)))
            .build()
            .new_agent();
        let mut p = CollectorProcess {
            child,
            control,
            metrics,
            udp,
            log,
            http,
        };
        p.wait_ready(Duration::from_secs(15))?;
        Ok(p)
    }

    fn wait_ready(&mut self, timeout: Duration) -> Result<(), DaemonError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(DaemonError::Exited {
                    what: "collector",
                    status: status.to_string(),
                    log: self.log.display().to_string(),
                });
            }
            if TcpStream::connect_timeout(&self.metrics, Duration::from_millis(100)).is_ok()
                && TcpStream::connect_timeout(&self.control, Duration::from_millis(100)).is_ok()
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(DaemonError::NotReady {
                    what: "collector",
                    timeout,
                    log: self.log.display().to_string(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The process id.
    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).unwrap_or(i32::MAX)
    }

    /// CPU and memory now.
    ///
    /// # Errors
    /// procfs could not be read.
    pub fn sample(&self) -> Result<ProcessSample, DaemonError> {
        Ok(sample_process(self.pid())?)
    }

    /// Scrapes `/metrics`.
    ///
    /// # Errors
    /// [`DaemonError::Scrape`] for HTTP failures.
    pub fn scrape(&self) -> Result<Scrape, DaemonError> {
        scrape(&self.http, self.metrics)
    }

    /// Path of the captured stdout/stderr.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// SIGTERM, wait up to 10 s, then SIGKILL.
    pub fn stop(mut self) {
        stop_child(&mut self.child);
    }
}

impl Drop for CollectorProcess {
    fn drop(&mut self) {
        stop_child(&mut self.child);
    }
}

/// Scrapes `http://addr/metrics` and parses it with the tests' exposition parser.
///
/// # Errors
/// [`DaemonError::Scrape`]: the request failed, answered non-200, or the text does not
/// parse.
pub fn scrape(http: &ureq::Agent, addr: SocketAddr) -> Result<Scrape, DaemonError> {
    uctel_testkit::exposition::scrape_with(http, addr).map_err(|detail| DaemonError::Scrape {
        url: format!("http://{addr}/metrics"),
        detail,
    })
}

/// A child process with its output file, stopped (SIGTERM, then SIGKILL) when dropped.
#[derive(Debug)]
pub struct Proc {
    child: Child,
    out: PathBuf,
}

impl Proc {
    /// Starts `bin` with `args`, stdout and stderr into the file `out`.
    ///
    /// # Errors
    /// [`DaemonError::Io`] when the file cannot be created or the binary cannot be started.
    pub fn start<S: AsRef<std::ffi::OsStr>>(
        bin: &Path,
        args: &[S],
        out: PathBuf,
    ) -> Result<Proc, DaemonError> {
        let file = fs::File::create(&out).map_err(io(format!("creating {}", out.display())))?;
        let err = file
            .try_clone()
            .map_err(io("duplicating the output file"))?;
        let child = Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            .spawn()
            .map_err(io(format!("starting {}", bin.display())))?;
        Ok(Proc { child, out })
    }

    /// Its process id.
    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).unwrap_or(i32::MAX)
    }

    /// `Ok` while it runs; [`DaemonError::Exited`] (naming `what` and its output file) once
    /// it has exited.
    ///
    /// # Errors
    /// As said.
    pub fn check_alive(&mut self, what: &'static str) -> Result<(), DaemonError> {
        match self.child.try_wait() {
            Ok(Some(status)) => Err(DaemonError::Exited {
                what,
                status: status.to_string(),
                log: self.out.display().to_string(),
            }),
            _ => Ok(()),
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        stop_child(&mut self.child);
    }
}

/// Stops a child: SIGTERM, up to 10 s, then SIGKILL. Idempotent.
pub fn stop_child(child: &mut Child) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_is_the_smallest_that_fits() {
        assert_eq!(mtu_for(1024), 1024);
        assert_eq!(mtu_for(1025), 2048);
        assert_eq!(mtu_for(100), 256);
        assert_eq!(mtu_for(9000), 4096);
    }

    #[test]
    fn free_ports_are_nonzero() {
        assert_ne!(free_tcp_port().unwrap(), 0);
        assert_ne!(free_udp_port().unwrap(), 0);
    }

    #[test]
    fn a_missing_binary_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let err = CollectorProcess::start(
            &dir.path().join("nope"),
            dir.path(),
            &CollectorSettings {
                slots: 16,
                slot_bytes: 1024,
                credit_margin_slots: 4,
                descriptor_queue: 64,
                report_interval_seconds: 1.0,
                data_path: "auto",
                log_file: dir.path().join("logs.jsonl"),
                credit_write_batching: None,
                extra_yaml: String::new(),
                recv_buffer_bytes: None,
                progress: None,
                min_slots: None,
            },
        )
        .unwrap_err();
        assert!(matches!(err, DaemonError::MissingBinary { .. }), "{err}");
    }
}
