//! `uctel`: the operator's command line over the daemons' status API
//! (`GET /api/v1/status`, `docs/status-api.md`).
//!
//! - `uctel top`: a live view, refreshed every second: against a collector one row per
//!   agent (rates, loss and drops over the last 10 s, lag), against an agent one row per
//!   source (files with their lag, scrape targets, fast counters); totals and the
//!   loss-accounting sum at the bottom. Sort with `l` (loss), `r` (rate), `d` (drops),
//!   `g` (lag); `q` quits. Fits 80 columns.
//! - `uctel status`: a human summary of one document.
//! - `--once` prints one view and exits; `--json` prints the document itself.
//!
//! Layout: [`view`] turns a document into lines of text (pure, tested), [`tui`] draws
//! them with ratatui and reads keys, this file parses flags and fetches.

mod tui;
mod view;

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

/// Talks to a uctel daemon's status API.
#[derive(Debug, Parser)]
#[command(name = "uctel", version, about)]
struct Cli {
    /// The daemon's HTTP address: a collector's `listen.metrics` (default port 9470) or an
    /// agent's (9471). `host:port` or a URL.
    #[arg(
        long,
        short = 'u',
        global = true,
        env = "UCTEL_URL",
        default_value = "127.0.0.1:9470"
    )]
    url: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// A live view of what the pipeline does now, refreshed every second.
    Top {
        /// The row order.
        #[arg(long, short = 's', value_enum, default_value_t = SortKey::Loss)]
        sort: SortKey,
        /// Print one view (or with --json the document) and exit.
        #[arg(long)]
        once: bool,
        /// Print the status document as JSON (with --once; without, one document per
        /// refresh, one per line).
        #[arg(long)]
        json: bool,
        /// Seconds between refreshes.
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
    },
    /// A summary of the daemon's state.
    Status {
        /// Print the status document as JSON.
        #[arg(long)]
        json: bool,
        /// Accepted for symmetry with `top`; `status` always prints once.
        #[arg(long)]
        once: bool,
    },
}

/// How `uctel top` orders its rows (largest first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SortKey {
    /// Loss ratio over the last 10 s.
    Loss,
    /// Records per second.
    Rate,
    /// Drops over the last 10 s.
    Drops,
    /// Lag: frames not consumed yet (collector), bytes not read yet (agent).
    Lag,
}

/// `host:port`, `http://host:port` or a full URL → the status URL.
fn status_url(base: &str) -> String {
    let base = base.trim_end_matches('/');
    let base = if base.starts_with("http://") || base.starts_with("https://") {
        base.to_owned()
    } else {
        format!("http://{base}")
    };
    if base.ends_with("/api/v1/status") {
        base
    } else {
        format!("{base}/api/v1/status")
    }
}

/// One GET of the status document.
///
/// # Errors
/// The connection, a non-200 answer or a body that is not JSON, as text.
pub fn fetch(http: &ureq::Agent, url: &str) -> Result<serde_json::Value, String> {
    let mut resp = http
        .get(url)
        .call()
        .map_err(|e| format!("GET {url}: {e}"))?;
    let status = resp.status();
    let body = resp
        .body_mut()
        .with_config()
        .limit(64 << 20)
        .read_to_string()
        .map_err(|e| format!("GET {url}: {e}"))?;
    if status != 200 {
        return Err(format!(
            "GET {url}: HTTP {status}: {}",
            body.lines().next().unwrap_or("")
        ));
    }
    serde_json::from_str(&body).map_err(|e| format!("GET {url}: not a status document: {e}"))
}

fn client() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(5)))
        .http_status_as_error(false)
        .build()
        .into()
}

fn print(text: &str) -> ExitCode {
    let mut out = std::io::stdout().lock();
    // A closed pipe (`| head`) ends the output quietly.
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
    ExitCode::SUCCESS
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let url = status_url(&cli.url);
    let http = client();
    let once = |json: bool, render: &dyn Fn(&serde_json::Value) -> String| match fetch(&http, &url)
    {
        Ok(doc) if json => print(&format!(
            "{}\n",
            serde_json::to_string_pretty(&doc).unwrap_or_default()
        )),
        Ok(doc) => print(&render(&doc)),
        Err(e) => {
            eprintln!("uctel: {e}");
            ExitCode::from(1)
        }
    };
    match cli.command {
        Command::Status { json, .. } => once(json, &|d| view::summary(d).join("\n") + "\n"),
        Command::Top {
            sort,
            once: true,
            json,
            ..
        } => once(json, &|d| view::top(d, sort, 80).join("\n") + "\n"),
        Command::Top {
            json: true,
            interval,
            ..
        } => loop {
            match fetch(&http, &url) {
                Ok(doc) => {
                    if print(&format!("{doc}\n")) != ExitCode::SUCCESS {
                        return ExitCode::from(1);
                    }
                }
                Err(e) => eprintln!("uctel: {e}"),
            }
            std::thread::sleep(Duration::from_secs_f64(interval.clamp(0.1, 3600.0)));
        },
        Command::Top { sort, interval, .. } => {
            let every = Duration::from_secs_f64(interval.clamp(0.1, 3600.0));
            match tui::run(&http, &url, sort, every) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("uctel: {e}");
                    ExitCode::from(1)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_urls() {
        assert_eq!(
            status_url("127.0.0.1:9470"),
            "http://127.0.0.1:9470/api/v1/status"
        );
        assert_eq!(status_url("http://c:1/"), "http://c:1/api/v1/status");
        assert_eq!(
            status_url("http://c:1/api/v1/status"),
            "http://c:1/api/v1/status"
        );
    }
}
