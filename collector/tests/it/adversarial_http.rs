//! Adversarial requests to the collector's `/metrics` server: odd methods, oversized request
//! lines and headers, idle and half-sent requests, many concurrent scrapes. Every answer is
//! an HTTP status or a closed connection, and the server keeps serving.

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use support::{collector_config, http_get};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Sends `request` raw and returns what came back until the server closed (or 10 s passed).
async fn raw(addr: SocketAddr, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    // The server may answer (and close) before reading everything: ignore write errors.
    let _ = s.write_all(request).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

fn status(response: &str) -> u16 {
    response
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_methods_and_paths_get_a_status() {
    let dir = tempfile::tempdir().unwrap();
    let running = uctel_collector::start(collector_config(dir.path()))
        .await
        .unwrap();
    let addr = running.metrics_addr();
    for method in ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "FOO"] {
        let r = raw(
            addr,
            format!("{method} /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await;
        assert_eq!(status(&r), 405, "{method}: {r}");
    }
    let head = raw(
        addr,
        b"HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status(&head), 200, "{head}");
    assert!(!head.contains("# TYPE"), "HEAD carries no body: {head}");
    for path in ["/metrics/../metrics", "/%00", "/metrics?x=%ff%fe", "*"] {
        let r = raw(
            addr,
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await;
        let code = status(&r);
        assert!(
            (200..500).contains(&code),
            "{path}: a status below 500 expected: {r}"
        );
    }
    // Not HTTP at all, and HTTP/2 preface on an HTTP/1 server.
    let junk = raw(
        addr,
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n",
    )
    .await;
    assert!(junk.is_empty() || status(&junk) == 400, "{junk}");
    let h2 = raw(addr, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
    assert!(h2.is_empty() || status(&h2) >= 400, "{h2}");
    assert_eq!(http_get(addr, "/metrics").await.0, 200);
    running.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_request_lines_and_headers_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let running = uctel_collector::start(collector_config(dir.path()))
        .await
        .unwrap();
    let addr = running.metrics_addr();
    let long_url = format!(
        "GET /metrics?{} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        "a".repeat(1 << 20)
    );
    let r = raw(addr, long_url.as_bytes()).await;
    assert!(
        r.is_empty() || status(&r) >= 400,
        "{}",
        &r[..r.len().min(200)]
    );
    let mut many_headers = String::from("GET /metrics HTTP/1.1\r\nHost: x\r\n");
    for i in 0..500 {
        many_headers.push_str(&format!("X-H{i}: v\r\n"));
    }
    many_headers.push_str("Connection: close\r\n\r\n");
    let r = raw(addr, many_headers.as_bytes()).await;
    assert!(r.is_empty() || status(&r) >= 400, "{r}");
    let huge_header = format!(
        "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\nConnection: close\r\n\r\n",
        "b".repeat(2 << 20)
    );
    let r = raw(addr, huge_header.as_bytes()).await;
    assert!(
        r.is_empty() || status(&r) >= 400,
        "{}",
        &r[..r.len().min(200)]
    );
    // A body on a GET is read and ignored; a lying Content-Length ends the connection.
    let r = raw(
        addr,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
    )
    .await;
    assert_eq!(status(&r), 200, "{r}");
    assert_eq!(http_get(addr, "/metrics").await.0, 200);
    running.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_do_not_block_scrapes_or_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let running = uctel_collector::start(collector_config(dir.path()))
        .await
        .unwrap();
    let addr = running.metrics_addr();
    let mut idle = Vec::new();
    for i in 0..200 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        if i % 2 == 0 {
            // Half a request line, never finished.
            s.write_all(b"GET /metr").await.unwrap();
        }
        idle.push(s);
    }
    // Many concurrent scrapes, all answered.
    let scrapes: Vec<_> = (0..64)
        .map(|_| tokio::spawn(async move { http_get(addr, "/metrics").await }))
        .collect();
    for s in scrapes {
        let (code, body) = s.await.unwrap();
        assert_eq!(code, 200);
        assert!(body.contains("uctel_collector_agents_connected"), "{body}");
    }
    // Shutdown is bounded even with connections that never finish a request.
    tokio::time::timeout(Duration::from_secs(30), running.stop())
        .await
        .expect("shutdown within the grace period")
        .unwrap();
    drop(idle);
}
