//! The daemons' operator endpoints on the metrics port that change the running daemon:
//! configuration reload and the log filter.
//!
//! - `POST /-/reload` (or `PUT`): runs the daemon's reload ([`crate::reload`]) and answers
//!   with its outcome: 200 when the file is in force (or changed nothing), 409 when a
//!   changed key needs a restart, 500 when the file is invalid or could not be applied
//!   (Prometheus answers a failed reload with 500). Only with `listen.enable_lifecycle`,
//!   else 403, as Prometheus without `--web.enable-lifecycle`. Other methods: 405.
//! - `GET /api/v1/log_level`: the filter in force as JSON,
//!   `{"filter":"…","base":"…","expires_in_seconds":N|null}`.
//! - `PUT /api/v1/log_level[?expire_seconds=N]`: the body (at most [`MAX_BODY_BYTES`],
//!   UTF-8) is the new filter in `--log-level` syntax (`info,uctel_collector::ingest=debug`),
//!   in force for `N` seconds (a number above 0, at most [`MAX_EXPIRE_SECONDS`]) or until
//!   `DELETE`; answers the new state (200) or why not (400: nothing changed).
//!   `DELETE /api/v1/log_level` puts the base filter back. Both only with
//!   `listen.enable_lifecycle` (403 otherwise).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};

use crate::logging::LogLevel;
use crate::reload::{Outcome, ReloadFn};

/// Largest accepted body of `PUT /api/v1/log_level`, in bytes.
pub const MAX_BODY_BYTES: usize = 4096;

/// Longest override of the log filter, in seconds (one day).
pub const MAX_EXPIRE_SECONDS: f64 = 86_400.0;

/// The reload and log-filter endpoints a daemon serves.
#[derive(Clone, Default)]
pub struct Admin {
    lifecycle: bool,
    reload: Option<ReloadFn>,
    log_level: Option<LogLevel>,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin")
            .field("lifecycle", &self.lifecycle)
            .field("reload", &self.reload.is_some())
            .field("log_level", &self.log_level)
            .finish()
    }
}

impl Admin {
    /// Endpoints that change the daemon answer only when `lifecycle`
    /// (`listen.enable_lifecycle`), else 403.
    pub fn new(lifecycle: bool) -> Admin {
        Admin {
            lifecycle,
            ..Admin::default()
        }
    }

    /// Serves `POST /-/reload` with `reload`.
    #[must_use]
    pub fn reload(mut self, reload: ReloadFn) -> Admin {
        self.reload = Some(reload);
        self
    }

    /// Serves `/api/v1/log_level` over `level`.
    #[must_use]
    pub fn log_level(mut self, level: LogLevel) -> Admin {
        self.log_level = Some(level);
        self
    }
}

type Answer = Response<Full<Bytes>>;

fn answer(status: StatusCode, content_type: &'static str, body: String) -> Answer {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn text(status: StatusCode, body: String) -> Answer {
    answer(status, "text/plain; charset=utf-8", body)
}

fn forbidden() -> Answer {
    text(
        StatusCode::FORBIDDEN,
        "the lifecycle API is not enabled (listen.enable_lifecycle)\n".into(),
    )
}

/// Answers the request when it is one of these endpoints; gives it back otherwise.
pub(crate) async fn route(
    req: Request<Incoming>,
    admin: &Admin,
) -> Result<Answer, Request<Incoming>> {
    match req.uri().path() {
        "/-/reload" if admin.reload.is_some() => Ok(reload(&req, admin).await),
        "/api/v1/log_level" => match &admin.log_level {
            Some(level) => Ok(log_level(req, admin.lifecycle, level).await),
            None => Err(req),
        },
        _ => Err(req),
    }
}

async fn reload(req: &Request<Incoming>, admin: &Admin) -> Answer {
    if req.method() != Method::POST && req.method() != Method::PUT {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "/-/reload takes POST or PUT\n".into(),
        );
    }
    let Some(reload) = admin.reload.clone().filter(|_| admin.lifecycle) else {
        return forbidden();
    };
    tracing::info!("configuration reload requested on POST /-/reload");
    let outcome = match tokio::task::spawn_blocking(move || reload.run()).await {
        Ok(o) => o,
        Err(e) => Outcome::ApplyFailed(format!("the reload task failed: {e}")),
    };
    let status = match &outcome {
        Outcome::Unchanged | Outcome::Applied(_) => StatusCode::OK,
        Outcome::NeedsRestart(_) => StatusCode::CONFLICT,
        Outcome::Invalid(_) | Outcome::ApplyFailed(_) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    text(status, format!("{outcome}\n"))
}

/// `expire_seconds` of a query string: `Ok(None)` when absent.
fn expire(query: Option<&str>) -> Result<Option<Duration>, String> {
    let Some(value) = query
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == "expire_seconds")
        .map(|(_, v)| v)
    else {
        return Ok(None);
    };
    match value.parse::<f64>() {
        Ok(s) if s > 0.0 && s <= MAX_EXPIRE_SECONDS => Ok(Some(Duration::from_secs_f64(s))),
        _ => Err(format!(
            "expire_seconds {value:?}: must be a number of seconds above 0 and at most \
             {MAX_EXPIRE_SECONDS}"
        )),
    }
}

async fn log_level(req: Request<Incoming>, lifecycle: bool, level: &LogLevel) -> Answer {
    let json =
        |s: crate::logging::LogLevelState| answer(StatusCode::OK, "application/json", s.to_json());
    let bad = |msg: String| text(StatusCode::BAD_REQUEST, format!("{msg}\n"));
    match *req.method() {
        Method::GET | Method::HEAD => json(level.state()),
        Method::PUT | Method::DELETE if !lifecycle => forbidden(),
        Method::DELETE => json(level.reset()),
        Method::PUT => {
            let expire = match expire(req.uri().query()) {
                Ok(e) => e,
                Err(msg) => return bad(msg),
            };
            let body = match Limited::new(req.into_body(), MAX_BODY_BYTES)
                .collect()
                .await
            {
                Ok(b) => b.to_bytes(),
                Err(e) => {
                    return bad(format!(
                        "cannot read the body (at most {MAX_BODY_BYTES} bytes): {e}"
                    ))
                }
            };
            let Ok(directives) = std::str::from_utf8(&body) else {
                return bad("the body is not UTF-8".into());
            };
            if directives.trim().is_empty() {
                return bad(
                    "the body is empty: send the filter, e.g. `info,uctel_collector=debug`".into(),
                );
            }
            match level.set(directives, expire) {
                Ok(s) => json(s),
                Err(e) => bad(format!("{e} (nothing changed)")),
            }
        }
        _ => text(
            StatusCode::METHOD_NOT_ALLOWED,
            "/api/v1/log_level takes GET, PUT or DELETE\n".into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expire_parses() {
        assert_eq!(expire(None), Ok(None));
        assert_eq!(expire(Some("a=1")), Ok(None));
        assert_eq!(
            expire(Some("a=1&expire_seconds=300")),
            Ok(Some(Duration::from_secs(300)))
        );
        for bad in [
            "expire_seconds=0",
            "expire_seconds=-1",
            "expire_seconds=x",
            "expire_seconds=1e9",
        ] {
            assert!(expire(Some(bad)).is_err(), "{bad}");
        }
    }
}
