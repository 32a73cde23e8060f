//! A daemon child process: its YAML config file, its log file, and the signals an init
//! system sends.
//!
//! The child is started as `<binary> --config <file> --log-level <level>` with stdout and
//! stderr appended to `<name>.log` in the run directory. Dropping a [`Daemon`] that is still
//! running kills it with SIGKILL and reaps it, so a failing test never leaks a process.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// A running (or exited) daemon.
#[derive(Debug)]
pub struct Daemon {
    name: String,
    binary: PathBuf,
    config: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    status: Option<ExitStatus>,
}

impl Daemon {
    /// Starts `binary --config config --log-level info`, logging to `dir/<name>.log`
    /// (appended, so a restarted daemon keeps one log).
    ///
    /// # Panics
    /// If the process cannot be spawned or the log file cannot be opened.
    pub fn start(name: &str, binary: &Path, config: &Path, dir: &Path) -> Daemon {
        let log = dir.join(format!("{name}.log"));
        let mut d = Daemon {
            name: name.to_owned(),
            binary: binary.to_path_buf(),
            config: config.to_path_buf(),
            log,
            child: None,
            status: None,
        };
        d.spawn();
        d
    }

    /// Wraps an already spawned child whose output goes to `log` (for programs that take
    /// other flags than the uctel daemons, such as Prometheus). [`Daemon::restart`] is not
    /// available for it.
    pub fn adopt(name: &str, binary: &Path, config: &Path, log: &Path, child: Child) -> Daemon {
        Daemon {
            name: name.to_owned(),
            binary: binary.to_path_buf(),
            config: config.to_path_buf(),
            log: log.to_path_buf(),
            child: Some(child),
            status: None,
        }
    }

    fn spawn(&mut self) {
        let open = || -> File {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.log)
                .unwrap_or_else(|e| panic!("opening {}: {e}", self.log.display()))
        };
        let (out, err) = (open(), open());
        let child = Command::new(&self.binary)
            .arg("--config")
            .arg(&self.config)
            .arg("--log-level")
            .arg(std::env::var("UCTEL_TEST_LOG").unwrap_or_else(|_| "info".to_owned()))
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.binary.display()));
        self.child = Some(child);
        self.status = None;
    }

    /// Starts the same binary with the same config again (after it exited or was killed).
    ///
    /// # Panics
    /// If it is still running.
    pub fn restart(&mut self) {
        assert!(!self.is_running(), "{} is still running", self.name);
        self.spawn();
    }

    /// The daemon's name (log file stem).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The process id of the current child.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The log file path.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The log so far (empty if unreadable).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last `n` lines of the log, for failure messages.
    pub fn log_tail(&self, n: usize) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        let start = lines.len().saturating_sub(n);
        format!(
            "--- last {} lines of {} ---\n{}",
            lines.len() - start,
            self.log.display(),
            lines[start..].join("\n")
        )
    }

    /// Whether the child is still running (reaps it if it exited).
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            None => false,
            Some(c) => match c.try_wait() {
                Ok(Some(status)) => {
                    self.status = Some(status);
                    self.child = None;
                    false
                }
                Ok(None) => true,
                Err(_) => false,
            },
        }
    }

    /// The exit status once exited.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        self.status
    }

    /// Sends `signal` to the child.
    ///
    /// # Panics
    /// If the daemon is not running or the signal cannot be sent.
    pub fn signal(&mut self, signal: Signal) {
        let pid = self
            .pid()
            .unwrap_or_else(|| panic!("{} is not running", self.name));
        let pid = Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX));
        kill(pid, signal).unwrap_or_else(|e| panic!("kill {signal} {}: {e}", self.name));
    }

    /// Waits up to `timeout` for the child to exit; returns its status, or `None` on timeout.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if !self.is_running() {
                return self.status;
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, then waits up to `timeout` for a clean exit.
    ///
    /// # Panics
    /// If it does not exit in time (it is then killed) or exits unsuccessfully; the panic
    /// message carries the end of its log.
    pub fn stop(&mut self, timeout: Duration) -> ExitStatus {
        self.signal(Signal::SIGTERM);
        match self.wait_exit(timeout) {
            Some(status) if status.success() => status,
            Some(status) => panic!(
                "{} exited with {status} after SIGTERM\n{}",
                self.name,
                self.log_tail(40)
            ),
            None => {
                self.kill();
                panic!(
                    "{} did not exit within {timeout:?} of SIGTERM\n{}",
                    self.name,
                    self.log_tail(40)
                )
            }
        }
    }

    /// SIGKILL (no goodbye, no flush) and reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            self.status = c.wait().ok();
        }
    }

    /// The config file path.
    pub fn config_path(&self) -> &Path {
        &self.config
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `binary --config file --check-config` and returns `(exit code, stdout + stderr)`.
///
/// # Panics
/// If the binary cannot be run.
pub fn check_config(binary: &Path, config: &Path) -> (i32, String) {
    let out = Command::new(binary)
        .arg("--config")
        .arg(config)
        .arg("--check-config")
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", binary.display()));
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}
