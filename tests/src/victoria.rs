//! A real VictoriaMetrics single-node server for the remote-write tests: the Debian
//! package's `/usr/bin/victoria-metrics` (or `$VICTORIA_METRICS`) on a free loopback port,
//! its own data directory, `-search.latencyOffset=0s` so fresh samples are visible; raw
//! samples read back with `/api/v1/export`. Stopped with SIGTERM (and started again on the
//! same port and data: the outage test), killed on drop.
//!
//! A missing binary is a test failure, not a skip: `.ci/run` installs `victoria-metrics`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

pub use crate::prometheus::RawSeries;

/// A running (or stopped) VictoriaMetrics.
#[derive(Debug)]
pub struct Victoria {
    binary: PathBuf,
    data: PathBuf,
    log: PathBuf,
    addr: SocketAddr,
    args: Vec<String>,
    child: Option<Child>,
}

/// The binary: `$VICTORIA_METRICS` or `/usr/bin/victoria-metrics`.
///
/// # Panics
/// If it does not exist, with the install hint.
pub fn binary() -> PathBuf {
    let p = std::env::var_os("VICTORIA_METRICS")
        .map_or_else(|| "/usr/bin/victoria-metrics".into(), PathBuf::from);
    assert!(
        p.is_file(),
        "{} not found: install VictoriaMetrics (Debian: apt-get install victoria-metrics)",
        p.display()
    );
    p
}

impl Victoria {
    /// Starts it with data in `dir/victoria-data`.
    ///
    /// # Panics
    /// If the binary is missing or it is not healthy within 60 s.
    pub fn start(dir: &Path) -> Victoria {
        Victoria::start_with(dir, &[])
    }

    /// [`Victoria::start`] with more command-line flags (e.g. `-dedup.minScrapeInterval=1ms`),
    /// kept for [`Victoria::restart`].
    ///
    /// # Panics
    /// As [`Victoria::start`].
    pub fn start_with(dir: &Path, args: &[&str]) -> Victoria {
        let mut v = Victoria {
            binary: binary(),
            data: dir.join("victoria-data"),
            log: dir.join("victoria.log"),
            addr: crate::net::free_addr(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            child: None,
        };
        v.spawn();
        v
    }

    fn spawn(&mut self) {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap_or_else(|e| panic!("{}: {e}", self.log.display()));
        let err = out
            .try_clone()
            .unwrap_or_else(|e| panic!("victoria.log: {e}"));
        let child = Command::new(&self.binary)
            .arg(format!("-storageDataPath={}", self.data.display()))
            .arg(format!("-httpListenAddr={}", self.addr))
            .arg("-search.latencyOffset=0s")
            .arg("-retentionPeriod=1d")
            .arg("-loggerLevel=WARN")
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.binary.display()));
        self.child = Some(child);
        let addr = self.addr;
        let ready = crate::wait_for(
            "victoria-metrics healthy",
            Duration::from_secs(60),
            Duration::from_millis(100),
            || uctel_testkit::http::get(&format!("http://{addr}/health")).map(|_| ()),
        );
        if let Err(e) = ready {
            panic!("{e}\n{}", self.log_tail());
        }
    }

    /// The remote-write URL.
    pub fn write_url(&self) -> String {
        format!("http://{}/api/v1/write", self.addr)
    }

    /// Stops it (SIGTERM, then waits).
    ///
    /// # Panics
    /// If it does not exit within 30 s.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let pid = Pid::from_raw(i32::try_from(c.id()).unwrap_or(i32::MAX));
            let _ = kill(pid, Signal::SIGTERM);
            for _ in 0..300 {
                if c.try_wait().ok().flatten().is_some() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = c.kill();
            let _ = c.wait();
            panic!(
                "victoria-metrics did not stop within 30 s\n{}",
                self.log_tail()
            );
        }
    }

    /// Freezes it (SIGSTOP): connections stay open, requests are accepted by the kernel and
    /// never answered until [`Victoria::thaw`] (a hung receiver, not a dead one).
    pub fn freeze(&self) {
        self.signal(Signal::SIGSTOP);
    }

    /// Resumes it after [`Victoria::freeze`] (SIGCONT): it then reads and stores what was
    /// sent meanwhile, including requests whose sender already gave up on them.
    pub fn thaw(&self) {
        self.signal(Signal::SIGCONT);
    }

    fn signal(&self, sig: Signal) {
        if let Some(c) = &self.child {
            let pid = Pid::from_raw(i32::try_from(c.id()).unwrap_or(i32::MAX));
            let _ = kill(pid, sig);
        }
    }

    /// Starts it again on the same port and data.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    /// Every raw sample of the series matching `selector` (`/api/v1/export`), stale
    /// markers (NaN) left out.
    ///
    /// # Errors
    /// HTTP failure or an answer that is not export JSON lines.
    pub fn export(&self, selector: &str) -> Result<RawSeries, String> {
        self.export_values(selector, false)
    }

    /// The stale markers (NaN values) VictoriaMetrics holds for `selector`, per series.
    ///
    /// # Errors
    /// As [`Victoria::export`].
    pub fn stale_markers(&self, selector: &str) -> Result<RawSeries, String> {
        self.export_values(selector, true)
    }

    /// `/api/v1/export` of `selector`: the numbers, or (`nan`) only the NaN values.
    fn export_values(&self, selector: &str, nan: bool) -> Result<RawSeries, String> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into();
        let url = format!("http://{}/api/v1/export", self.addr);
        let body = agent
            .get(&url)
            .query("match[]", selector)
            .call()
            .map_err(|e| format!("export {selector:?}: {e}"))?
            .body_mut()
            .with_config()
            .limit(1 << 30)
            .read_to_string()
            .map_err(|e| format!("export {selector:?}: {e}"))?;
        let mut out = RawSeries::new();
        for line in body.lines().filter(|l| !l.trim().is_empty()) {
            let v: Value = serde_json::from_str(line).map_err(|e| format!("{e}: {line}"))?;
            let mut labels: Vec<(String, String)> = v["metric"]
                .as_object()
                .ok_or_else(|| format!("no metric in {line}"))?
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                .collect();
            labels.sort();
            let ts = v["timestamps"].as_array().ok_or("no timestamps")?;
            let vals = v["values"].as_array().ok_or("no values")?;
            let samples = out.entry(labels).or_default();
            for (t, x) in ts.iter().zip(vals) {
                let x = match x {
                    Value::Number(n) => n.as_f64().unwrap_or(f64::NAN),
                    Value::String(s) => crate::prometheus::parse_value(s).unwrap_or(f64::NAN),
                    _ => f64::NAN,
                };
                if x.is_nan() == nan {
                    samples.push((t.as_i64().unwrap_or_default(), x));
                }
            }
            samples.sort_by_key(|s| s.0);
        }
        out.retain(|_, s| !s.is_empty());
        Ok(out)
    }

    /// [`Victoria::export`] once it holds `samples` samples, or after `timeout` (what it
    /// holds then): VictoriaMetrics makes what it just received searchable within a second
    /// or two, so an export right after the last request may miss the newest samples.
    ///
    /// # Errors
    /// As [`Victoria::export`].
    pub fn export_settled(
        &self,
        selector: &str,
        samples: u64,
        timeout: Duration,
    ) -> Result<RawSeries, String> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let r = self.export(selector)?;
            let n: u64 = r.values().map(|v| v.len() as u64).sum();
            if n == samples || std::time::Instant::now() >= deadline {
                return Ok(r);
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Evaluates the PromQL `expr` now (`/api/v1/query`) and returns `data.result`.
    ///
    /// # Errors
    /// HTTP failure or an error answer.
    pub fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        crate::prometheus::instant_query(self.addr, expr)
    }

    /// The end of its log.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Victoria {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
