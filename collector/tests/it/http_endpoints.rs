//! The collector's metrics port as operators of Prometheus and node_exporter expect it, over
//! real HTTP requests to an in-process collector: `/-/healthy`, `/-/ready`, an HTML index at
//! `/`, gzip on `/metrics` when the scraper asks for it, 404 for anything else.

use crate::support;

use std::io::Read;
use std::net::SocketAddr;
use std::time::Duration;

use support::collector_config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One request with `extra` header lines: (status, head, body bytes).
async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    extra: &str,
) -> (u16, String, Vec<u8>) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!("{method} {path} HTTP/1.1\r\nHost: x\r\n{extra}Connection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .expect("answered within 10 s")
        .unwrap();
    let split = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(out.len(), |i| i + 4);
    let body = out.split_off(split);
    let head = String::from_utf8_lossy(&out).into_owned();
    let status = head.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, head, body)
}

/// The exposition without sample values: every `# HELP`/`# TYPE` line and every series
/// (name and labels). Values (process CPU time, memory) move between two scrapes.
fn shape(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| {
            if l.starts_with('#') {
                l.to_owned()
            } else {
                l.rsplit_once(' ')
                    .map_or(l, |(series, _)| series)
                    .to_owned()
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthy_ready_index_and_unknown_paths() {
    let dir = tempfile::tempdir().unwrap();
    let running = uctel_collector::start(collector_config(dir.path()))
        .await
        .unwrap();
    let addr = running.metrics_addr();

    let (code, _, body) = request(addr, "GET", "/-/healthy", "").await;
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(body, b"uctel-collector is healthy.\n");
    // Transport device open and control listener bound: ready.
    let (code, _, body) = request(addr, "GET", "/-/ready", "").await;
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(body, b"uctel-collector is ready.\n");
    assert_eq!(request(addr, "HEAD", "/-/ready", "").await.0, 200);

    let (code, head, body) = request(addr, "GET", "/", "").await;
    let page = String::from_utf8_lossy(&body);
    assert_eq!(code, 200, "{page}");
    assert!(
        head.contains("content-type: text/html; charset=utf-8"),
        "{head}"
    );
    assert!(page.starts_with("<!DOCTYPE html>"), "{page}");
    assert!(page.contains("<title>uctel-collector</title>"), "{page}");
    assert!(page.contains(env!("CARGO_PKG_VERSION")), "{page}");
    for (href, path) in [
        ("metrics", "/metrics"),
        ("-/healthy", "/-/healthy"),
        ("-/ready", "/-/ready"),
    ] {
        assert!(
            page.contains(&format!("<a href=\"{href}\">")),
            "{href}: {page}"
        );
        // Each link resolves (relative to `/`) to an endpoint that answers 200.
        assert_eq!(request(addr, "GET", path, "").await.0, 200, "{path}");
    }

    for path in [
        "/nope",
        "/-/",
        "/-/reload",
        "/-/healthy/",
        "/index.html",
        "/metrics.gz",
    ] {
        let (code, _, body) = request(addr, "GET", path, "").await;
        assert_eq!(code, 404, "{path}: {}", String::from_utf8_lossy(&body));
    }
    assert_eq!(request(addr, "POST", "/-/ready", "").await.0, 405);
    running.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_gzipped_only_when_the_scraper_accepts_gzip() {
    let dir = tempfile::tempdir().unwrap();
    let running = uctel_collector::start(collector_config(dir.path()))
        .await
        .unwrap();
    let addr = running.metrics_addr();

    let (code, head, plain) = request(addr, "GET", "/metrics", "").await;
    assert_eq!(code, 200);
    assert!(!head.contains("content-encoding"), "{head}");
    let plain = String::from_utf8(plain).expect("plain text exposition");
    assert!(
        plain.contains("# TYPE uctel_collector_agents_connected gauge"),
        "{plain}"
    );

    // What Prometheus sends.
    let prometheus_accept = "Accept: application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.1\r\nAccept-Encoding: gzip\r\n";
    let (code, head, zipped) = request(addr, "GET", "/metrics", prometheus_accept).await;
    assert_eq!(code, 200, "{head}");
    assert!(head.contains("content-encoding: gzip"), "{head}");
    assert!(
        head.contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    assert!(head.contains("vary: Accept-Encoding"), "{head}");
    assert_eq!(&zipped[..2], &[0x1f, 0x8b], "a gzip member");
    let mut unzipped = String::new();
    flate2::read::GzDecoder::new(&zipped[..])
        .read_to_string(&mut unzipped)
        .expect("the body decodes as gzip");
    assert!(
        zipped.len() * 3 < unzipped.len(),
        "compressed {} -> {}",
        unzipped.len(),
        zipped.len()
    );
    assert_eq!(shape(&unzipped), shape(&plain), "the same exposition");

    // An explicit refusal of gzip, or another coding only, gets the plain text.
    for extra in [
        "Accept-Encoding: gzip;q=0\r\n",
        "Accept-Encoding: br, deflate\r\n",
        "Accept-Encoding: identity\r\n",
    ] {
        let (code, head, body) = request(addr, "GET", "/metrics", extra).await;
        assert_eq!(code, 200, "{extra}");
        assert!(!head.contains("content-encoding"), "{extra}: {head}");
        let text = String::from_utf8(body).expect("plain text");
        assert_eq!(shape(&text), shape(&plain), "{extra}");
    }
    running.stop().await.unwrap();
}
