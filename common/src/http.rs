//! A small hyper 1.x HTTP/1.1 server for the Prometheus `/metrics` endpoint.
//!
//! Routes: `GET /metrics` → the text exposition format 0.0.4 produced by a [`RenderFn`]
//! (content type [`prometheus::TEXT_FORMAT`], `text/plain; version=0.0.4`), `GET /` → a short
//! text page pointing at `/metrics`, anything else → 404, non-GET/HEAD methods → 405.
//! A render failure answers 500 with the reason (and is logged), never panics the server.
//! Shutdown is graceful: the listener stops accepting, in-flight requests finish, and
//! connections still open after [`GRACE_PERIOD`] are dropped.
//!
//! A client must send a request's whole head within [`HEADER_READ_TIMEOUT`] (hyper's
//! `header_read_timeout`, which needs hyper's timer to take effect; without one it is
//! silently off): otherwise idle or half-sent requests (slowloris) would hold a connection
//! and a file descriptor for ever.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

use crate::shutdown::Shutdown;

/// How long shutdown waits for open connections before dropping them.
pub const GRACE_PERIOD: Duration = Duration::from_secs(5);

/// Longest wait for a request head, on a new connection or between keep-alive requests;
/// the connection is closed after it. Prometheus sends its scrape request at once.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Produces the exposition text for one scrape; `Err` carries a reason for the 500 answer.
pub type RenderFn = Arc<dyn Fn() -> Result<Vec<u8>, String> + Send + Sync>;

/// Encodes everything registered in `registry` with the text encoder. Errors: a collector
/// produced an invalid family (duplicate, bad name), reported by the encoder.
pub fn encode_registry(registry: &prometheus::Registry) -> Result<Vec<u8>, String> {
    use prometheus::Encoder;
    let families = registry.gather();
    let mut out = Vec::with_capacity(16 * 1024);
    prometheus::TextEncoder::new()
        .encode(&families, &mut out)
        .map_err(|e| e.to_string())?;
    Ok(out)
}

/// Registers the standard `process_*` metrics of this process in `registry`, as every
/// Prometheus client library and exporter exposes them (`process_cpu_seconds_total`,
/// `process_resident_memory_bytes`, `process_virtual_memory_bytes`, `process_open_fds`,
/// `process_max_fds`, `process_start_time_seconds`, `process_threads`), read from
/// `/proc/self` at each scrape by the `prometheus` crate's `ProcessCollector`. On systems
/// without `/proc` nothing is registered.
///
/// # Errors
/// A registration conflict (the families are already registered).
pub fn register_process_metrics(registry: &prometheus::Registry) -> Result<(), prometheus::Error> {
    #[cfg(target_os = "linux")]
    registry.register(Box::new(
        prometheus::process_collector::ProcessCollector::for_self(),
    ))?;
    #[cfg(not(target_os = "linux"))]
    let _ = registry;
    Ok(())
}

/// Registers `<namespace>_build_info{version="<version>"} 1`, the usual info metric (value
/// always 1, the facts in labels) so dashboards can show and join on the running version.
///
/// # Errors
/// A registration conflict or an invalid namespace.
pub fn register_build_info(
    registry: &prometheus::Registry,
    namespace: &str,
    version: &str,
) -> Result<(), prometheus::Error> {
    let info = prometheus::IntGaugeVec::new(
        prometheus::Opts::new(
            "build_info",
            "Always 1; the version of the running binary is in the version label.",
        )
        .namespace(namespace),
        &["version"],
    )?;
    info.with_label_values(&[version]).set(1);
    registry.register(Box::new(info))
}

/// A [`RenderFn`] over a registry.
pub fn registry_render(registry: prometheus::Registry) -> RenderFn {
    Arc::new(move || encode_registry(&registry))
}

/// Binds the listener; port 0 picks an ephemeral port (read it with `local_addr`).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

const INDEX: &str = "uctel: Prometheus metrics are served at /metrics\n";

fn respond(req: &Request<Incoming>, render: &RenderFn) -> Response<Full<Bytes>> {
    let text = |status: StatusCode, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        r
    };
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET and HEAD are served\n".into(),
        );
    }
    match req.uri().path() {
        "/metrics" => match render() {
            Ok(body) => {
                let mut r = Response::new(Full::new(Bytes::from(body)));
                r.headers_mut().insert(
                    CONTENT_TYPE,
                    HeaderValue::from_static(prometheus::TEXT_FORMAT),
                );
                r
            }
            Err(reason) => {
                tracing::error!(%reason, "rendering /metrics failed");
                text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("rendering metrics failed: {reason}\n"),
                )
            }
        },
        "/" => text(StatusCode::OK, INDEX.into()),
        _ => text(StatusCode::NOT_FOUND, "not found; try /metrics\n".into()),
    }
}

/// Serves until `shutdown` fires, then drains gracefully. Accept errors (e.g. EMFILE) are
/// logged and retried after a short pause rather than ending the server. Request heads must
/// arrive within [`HEADER_READ_TIMEOUT`].
pub async fn serve(listener: TcpListener, render: RenderFn, shutdown: Shutdown) {
    serve_with_header_timeout(listener, render, shutdown, HEADER_READ_TIMEOUT).await;
}

/// [`serve`] with another limit on how long a request head may take to arrive.
pub async fn serve_with_header_timeout(
    listener: TcpListener,
    render: RenderFn,
    mut shutdown: Shutdown,
    header_read_timeout: Duration,
) {
    let graceful = GracefulShutdown::new();
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.wait() => break,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "metrics listener accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let render = render.clone();
        let service = service_fn(move |req: Request<Incoming>| {
            let response = respond(&req, &render);
            async move { Ok::<_, Infallible>(response) }
        });
        let conn = builder.serve_connection(TokioIo::new(stream), service);
        let watched = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = watched.await {
                tracing::debug!(error = %e, "metrics connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(GRACE_PERIOD, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("metrics connections still open after the grace period; dropping them");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shutdown;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr, method: &str, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[test]
    fn process_and_build_info_metrics() {
        let registry = prometheus::Registry::new();
        register_process_metrics(&registry).unwrap();
        register_build_info(&registry, "uctel_test", "1.2.3").unwrap();
        let text = String::from_utf8(encode_registry(&registry).unwrap()).unwrap();
        assert!(
            text.contains("uctel_test_build_info{version=\"1.2.3\"} 1"),
            "{text}"
        );
        for family in [
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_start_time_seconds",
        ] {
            assert!(
                text.contains(&format!("# TYPE {family} ")),
                "{family}: {text}"
            );
        }
        // Registered twice is an error, not a panic or a duplicate family.
        assert!(register_process_metrics(&registry).is_err());
    }

    #[tokio::test]
    async fn routes_and_graceful_shutdown() {
        let registry = prometheus::Registry::new();
        let c = prometheus::IntCounter::new("uctel_test_total", "A test counter.").unwrap();
        registry.register(Box::new(c.clone())).unwrap();
        c.inc_by(3);
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (trigger, sd) = shutdown::channel();
        let server = tokio::spawn(serve(listener, registry_render(registry), sd));

        let m = get(addr, "GET", "/metrics").await;
        assert!(m.starts_with("HTTP/1.1 200"), "{m}");
        assert!(m.contains("content-type: text/plain; version=0.0.4"), "{m}");
        assert!(m.contains("# TYPE uctel_test_total counter"), "{m}");
        assert!(m.contains("uctel_test_total 3"), "{m}");

        let root = get(addr, "GET", "/").await;
        assert!(
            root.starts_with("HTTP/1.1 200") && root.contains("/metrics"),
            "{root}"
        );
        assert!(get(addr, "GET", "/nope").await.starts_with("HTTP/1.1 404"));
        assert!(get(addr, "POST", "/metrics")
            .await
            .starts_with("HTTP/1.1 405"));

        trigger.trigger();
        server.await.unwrap();
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    }

    #[tokio::test]
    async fn idle_and_half_sent_requests_are_closed_after_the_header_timeout() {
        let registry = prometheus::Registry::new();
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (trigger, sd) = shutdown::channel();
        let server = tokio::spawn(serve_with_header_timeout(
            listener,
            registry_render(registry),
            sd,
            Duration::from_millis(200),
        ));
        let mut idle = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut partial = tokio::net::TcpStream::connect(addr).await.unwrap();
        partial
            .write_all(b"GET /metrics HTTP/1.1\r\nHost")
            .await
            .unwrap();
        // A keep-alive connection that finished one request and then went quiet.
        let mut kept = tokio::net::TcpStream::connect(addr).await.unwrap();
        kept.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        for s in [&mut idle, &mut partial, &mut kept] {
            let mut out = Vec::new();
            let closed = tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut out))
                .await
                .is_ok();
            assert!(closed, "connection still open: {out:?}");
        }
        // A prompt request is still served.
        assert!(get(addr, "GET", "/").await.starts_with("HTTP/1.1 200"));
        trigger.trigger();
        server.await.unwrap();
    }

    #[tokio::test]
    async fn render_failure_is_500() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (trigger, sd) = shutdown::channel();
        let render: RenderFn = Arc::new(|| Err("boom".to_string()));
        let server = tokio::spawn(serve(listener, render, sd));
        let r = get(addr, "GET", "/metrics").await;
        assert!(r.starts_with("HTTP/1.1 500") && r.contains("boom"), "{r}");
        trigger.trigger();
        server.await.unwrap();
    }
}
