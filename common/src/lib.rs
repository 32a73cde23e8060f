//! `uctel-common`: plumbing shared by the two daemons, `uctel-agent` and `uctel-collector`.
//!
//! Layout:
//! - [`config`]: strict YAML loading (`serde_norway` under the name `serde_yaml`) that reports
//!   every problem at once as `file:line:col: key.path: message`, plus the [`config::Validate`]
//!   trait for semantic checks (DESIGN.md §9).
//! - [`logging`]: `tracing-subscriber` setup; `--log-level` wins over `RUST_LOG`.
//! - [`shutdown`]: a watch-based shutdown handle fired by SIGTERM/SIGINT or by hand.
//! - [`http`]: the hyper 1.x `/metrics` server (Prometheus text format 0.0.4), graceful
//!   shutdown.
//! - [`reload`]: configuration reload (`SIGHUP`, `POST /-/reload`): validate whole, apply
//!   the live keys or refuse, `*_config_last_reload_*` metrics.
//! - [`admin`]: the `/-/reload` and `/api/v1/log_level` endpoints of the metrics port.
//! - [`control`]: the framed control channel over TCP and the agent side of the handshake
//!   (`client_handshake`).
//! - [`listen`]: listen addresses in config files (`IP:PORT`, `[IPv6]:PORT`, `:PORT`).
//! - [`version`]: the `--version` text (package version, git commit, enabled features).
//! - [`status`]: what the status API (`/api/v1/status`) of both daemons shares.
//! - [`stdout`]: one-shot output that a closed pipe (`| head`) does not turn into a panic.
//!
//! A daemon's `main` is: parse flags (clap), `config::load`, `logging::init`,
//! `shutdown::on_signals`, then the library's `run(config, shutdown)`.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod admin;
pub mod config;
pub mod control;
pub mod http;
pub mod listen;
pub mod logging;
pub mod reload;
pub mod shutdown;
pub mod status;
pub mod stdout;
pub mod version;
