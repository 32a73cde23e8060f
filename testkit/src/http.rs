//! HTTP/1.1 GETs against the daemons' listeners: blocking through `ureq` (for the child
//! process tests and the bench), and a raw one-request client on tokio for in-process tests
//! that need the status line and headers as the server wrote them.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The most any GET reads: a scrape of 50 agents' series stays far below it.
const BODY_LIMIT: u64 = 256 << 20;

/// A blocking client with a 10 s overall timeout that returns non-200 answers as answers.
pub fn client() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(10)))
        .http_status_as_error(false)
        .build()
        .into()
}

/// A blocking GET of `url` through [`client`]; the body of a 200 answer.
///
/// # Errors
/// Connection or HTTP errors and non-200 statuses, as text.
pub fn get(url: &str) -> Result<String, String> {
    get_with(&client(), url)
}

/// A blocking GET of `url` through `http`; the body of a 200 answer.
///
/// # Errors
/// Connection or HTTP errors and non-200 statuses, as text.
pub fn get_with(http: &ureq::Agent, url: &str) -> Result<String, String> {
    let mut resp = http
        .get(url)
        .call()
        .map_err(|e| format!("GET {url}: {e}"))?;
    let status = resp.status();
    let body = resp
        .body_mut()
        .with_config()
        .limit(BODY_LIMIT)
        .read_to_string()
        .map_err(|e| format!("GET {url}: reading body: {e}"))?;
    if status != 200 {
        return Err(format!("GET {url}: HTTP {status}: {body}"));
    }
    Ok(body)
}

/// One answer read by [`request`].
#[derive(Debug, Clone)]
pub struct Response {
    /// The status code (0 when the status line did not parse).
    pub status: u16,
    /// Status line and headers, as sent.
    pub head: String,
    /// The body bytes, as sent (no decoding).
    pub body: Vec<u8>,
}

impl Response {
    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// `GET path HTTP/1.1` to `addr` with `extra` header lines (each ending in `\r\n`) and
/// `Connection: close`; reads the whole answer.
///
/// # Panics
/// If the connection fails or no answer is complete within 10 s.
pub async fn request(addr: SocketAddr, path: &str, extra: &str) -> Response {
    let mut s = TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    let req = format!("GET {path} HTTP/1.1\r\nHost: test\r\n{extra}Connection: close\r\n\r\n");
    s.write_all(req.as_bytes())
        .await
        .unwrap_or_else(|e| panic!("write to {addr}: {e}"));
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .unwrap_or_else(|_| panic!("no answer to {path} within 10 s"))
        .unwrap_or_else(|e| panic!("read from {addr}: {e}"));
    let split = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(out.len(), |i| i + 4);
    let body = out.split_off(split);
    let head = String::from_utf8_lossy(&out).into_owned();
    let status = head.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    Response { status, head, body }
}

/// [`request`] without extra headers: `(status, body as text)`.
///
/// # Panics
/// As [`request`].
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let r = request(addr, path, "").await;
    (r.status, r.text())
}
