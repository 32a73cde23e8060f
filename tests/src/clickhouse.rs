//! A real ClickHouse server for the output tests: `clickhouse-server` (18.16 or later)
//! started by hand on free loopback ports with a minimal configuration in a temporary
//! directory, stopped with SIGTERM (and started again on the same ports and data). A
//! missing binary fails the test: CI installs it (`scripts/install-deps`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// The server binary.
pub const SERVER: &str = "clickhouse-server";

/// A running (or stopped) ClickHouse server.
#[derive(Debug)]
pub struct ClickHouse {
    dir: tempfile::TempDir,
    http: SocketAddr,
    child: Option<Child>,
}

impl ClickHouse {
    /// Starts a server and waits until it answers.
    ///
    /// # Panics
    /// If `clickhouse-server` is missing or does not answer within 30 s.
    pub fn start() -> ClickHouse {
        let dir = tempfile::Builder::new()
            .prefix("uctel-clickhouse-")
            .tempdir()
            .unwrap_or_else(|e| panic!("tempdir: {e}"));
        let http = crate::net::free_addr();
        let tcp = crate::net::free_addr();
        write_config(dir.path(), http, tcp);
        let mut c = ClickHouse {
            dir,
            http,
            child: None,
        };
        c.restart();
        c
    }

    /// The HTTP interface's URL (`http://127.0.0.1:PORT/`).
    pub fn url(&self) -> String {
        format!("http://{}/", self.http)
    }

    /// Starts the server again on the same ports and data (after [`Self::stop`]).
    ///
    /// # Panics
    /// As [`Self::start`].
    pub fn restart(&mut self) {
        let d = self.dir.path();
        let log = std::fs::File::create(d.join("stdout.log"))
            .unwrap_or_else(|e| panic!("clickhouse log: {e}"));
        let child = Command::new(SERVER)
            .arg(format!("--config-file={}", d.join("config.xml").display()))
            .current_dir(d)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap_or_else(|e| panic!("{e}")))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("starting {SERVER} (install clickhouse-server: scripts/install-deps): {e}")
            });
        self.child = Some(child);
        crate::wait_for(
            "clickhouse answers",
            Duration::from_secs(30),
            Duration::from_millis(100),
            || self.query("SELECT 1").map(|_| ()),
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", self.log_tail()));
    }

    /// Stops the server with SIGTERM and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Ok(pid) = i32::try_from(child.id()) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
            }
            let _ = child.wait();
        }
    }

    /// Freezes the server with SIGSTOP: it accepts no work and answers nothing (the
    /// kernel still completes TCP handshakes and buffers requests) until [`Self::resume`].
    pub fn freeze(&self) {
        self.signal(Signal::SIGSTOP);
    }

    /// Lets a frozen server run again (SIGCONT): it then works through what it buffered.
    pub fn resume(&self) {
        self.signal(Signal::SIGCONT);
    }

    fn signal(&self, signal: Signal) {
        if let Some(pid) = self.child.as_ref().and_then(|c| i32::try_from(c.id()).ok()) {
            let _ = kill(Pid::from_raw(pid), signal);
        }
    }

    /// Runs `sql` over HTTP; the answer body.
    ///
    /// # Errors
    /// A transport error or a non-2xx answer, with its body.
    pub fn query(&self, sql: &str) -> Result<String, String> {
        self.query_with(sql, &[])
    }

    /// [`Self::query`] with ClickHouse `settings` as URL parameters (18.16 has no
    /// `SETTINGS` clause in `SELECT`).
    ///
    /// # Errors
    /// As [`Self::query`].
    pub fn query_with(&self, sql: &str, settings: &[(&str, &str)]) -> Result<String, String> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(20)))
            .http_status_as_error(false)
            .build()
            .into();
        let mut request = agent.post(&self.url());
        for (k, v) in settings {
            request = request.query(*k, *v);
        }
        let mut resp = request.send(sql).map_err(|e| format!("{sql}: {e}"))?;
        let status = resp.status();
        let body = resp
            .body_mut()
            .read_to_string()
            .map_err(|e| format!("{sql}: {e}"))?;
        if status.is_success() {
            Ok(body)
        } else {
            Err(format!("{sql}: {status}: {body}"))
        }
    }

    /// The server's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let p: PathBuf = self.dir.path().join("stdout.log");
        let text = std::fs::read_to_string(&p).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for ClickHouse {
    fn drop(&mut self) {
        self.resume();
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn write_config(d: &Path, http: SocketAddr, tcp: SocketAddr) {
    let p = |name: &str| format!("{}/{name}/", d.display());
    let config = format!(
        r#"<?xml version="1.0"?>
<yandex>
  <logger><level>warning</level><console>1</console></logger>
  <http_port>{http}</http_port>
  <tcp_port>{tcp}</tcp_port>
  <listen_host>127.0.0.1</listen_host>
  <path>{data}</path>
  <tmp_path>{tmp}</tmp_path>
  <user_files_path>{files}</user_files_path>
  <users_config>{users}</users_config>
  <default_profile>default</default_profile>
  <default_database>default</default_database>
  <mark_cache_size>5368709120</mark_cache_size>
</yandex>
"#,
        http = http.port(),
        tcp = tcp.port(),
        data = p("data"),
        tmp = p("tmp"),
        files = p("user_files"),
        users = d.join("users.xml").display(),
    );
    let users = r#"<?xml version="1.0"?>
<yandex>
  <profiles><default></default></profiles>
  <users>
    <default>
      <password></password>
      <networks><ip>127.0.0.1</ip></networks>
      <profile>default</profile>
      <quota>default</quota>
    </default>
  </users>
  <quotas><default></default></quotas>
</yandex>
"#;
    std::fs::write(d.join("config.xml"), config).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(d.join("users.xml"), users).unwrap_or_else(|e| panic!("{e}"));
}
