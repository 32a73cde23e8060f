//! Scrape targets for the tests: a small HTTP/1.1 server on a free loopback port that answers
//! every request as a closure says (a text exposition with `Content-Length`, an endless-looking
//! chunked answer without one, or a bare status), counting what it served. It is the thing
//! the agent scrapes, not a stand-in for any part of uctel.

use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One answer of a [`Target`].
#[derive(Debug, Clone)]
pub enum Answer {
    /// `200 OK`, `text/plain; version=0.0.4`, the text with its `Content-Length`.
    Text(String),
    /// `200 OK`, `text/plain; version=0.0.4`, `Transfer-Encoding: chunked` and no
    /// `Content-Length`: `total` bytes of exposition lines (`scrape_big_answer{line="<n>"}
    /// <n>`) in chunks of `chunk` bytes, `pause` after each, as a slow exporter streams a
    /// large answer. The bytes of body it managed to write are kept
    /// ([`Target::written`]); the connection closes after it.
    Chunked {
        /// Body bytes in all.
        total: u64,
        /// Bytes per chunk (at least one line).
        chunk: usize,
        /// Pause after each chunk.
        pause: Duration,
    },
    /// The status line (e.g. `"404 Not Found"`) and a short body.
    Status(&'static str),
}

/// A running target (its threads live until the test process ends).
#[derive(Debug, Clone)]
pub struct Target {
    /// Where it listens.
    pub addr: SocketAddr,
    served: Arc<AtomicU64>,
    written: Arc<Mutex<Vec<u64>>>,
}

impl Target {
    /// `http://<addr>/metrics`.
    pub fn url(&self) -> String {
        format!("http://{}/metrics", self.addr)
    }

    /// `200 OK` answers begun so far ([`Answer::Text`] and [`Answer::Chunked`]); counted
    /// before the first byte is written.
    pub fn served(&self) -> u64 {
        self.served.load(Ordering::SeqCst)
    }

    /// Body bytes written by each [`Answer::Chunked`] that has ended (the whole `total`, or
    /// what was written before the scraper closed the connection), in the order they ended.
    pub fn written(&self) -> Vec<u64> {
        self.written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// Starts a target on a free loopback port that answers each request (any method and path)
/// with `answer()`, on every connection, keep-alive included.
///
/// # Panics
/// If no loopback port can be bound.
pub fn start(answer: impl Fn() -> Answer + Send + Sync + 'static) -> Target {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind a loopback port");
    let addr = listener.local_addr().expect("local address");
    let target = Target {
        addr,
        served: Arc::new(AtomicU64::new(0)),
        written: Arc::new(Mutex::new(Vec::new())),
    };
    let answer = Arc::new(answer);
    let t = target.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let (answer, t) = (Arc::clone(&answer), t.clone());
            std::thread::spawn(move || serve(&stream, answer.as_ref(), &t));
        }
    });
    target
}

/// Answers the requests of one connection until it closes.
fn serve(stream: &TcpStream, answer: &(dyn Fn() -> Answer + Send + Sync), t: &Target) {
    let Ok(read) = stream.try_clone() else { return };
    let mut reader = BufReader::new(read);
    let mut out = stream;
    loop {
        // The request line and headers (a scrape is a GET without a body).
        let mut line = String::new();
        loop {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            if line == "\r\n" || line == "\n" {
                break;
            }
        }
        let head = "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n";
        match answer() {
            Answer::Text(text) => {
                t.served.fetch_add(1, Ordering::SeqCst);
                let msg = format!("{head}Content-Length: {}\r\n\r\n{text}", text.len());
                if out.write_all(msg.as_bytes()).is_err() {
                    return;
                }
            }
            Answer::Status(status) => {
                let text = "refused by the test\n";
                let msg = format!(
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\n\r\n{text}",
                    text.len()
                );
                if out.write_all(msg.as_bytes()).is_err() {
                    return;
                }
            }
            Answer::Chunked {
                total,
                chunk,
                pause,
            } => {
                t.served.fetch_add(1, Ordering::SeqCst);
                let sent = chunked(out, total, chunk, pause);
                t.written
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(sent);
                return;
            }
        }
    }
}

/// Writes a chunked answer of `total` body bytes; returns the body bytes written.
fn chunked(mut out: &TcpStream, total: u64, chunk: usize, pause: Duration) -> u64 {
    let head = "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
                Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
    if out.write_all(head.as_bytes()).is_err() {
        return 0;
    }
    let (mut sent, mut n) = (0u64, 0u64);
    let mut body = Vec::with_capacity(chunk + 64);
    while sent < total {
        body.clear();
        while body.len() < chunk {
            body.extend_from_slice(format!("scrape_big_answer{{line=\"{n}\"}} {n}\n").as_bytes());
            n += 1;
        }
        let left = usize::try_from(total - sent).unwrap_or(usize::MAX);
        body.truncate(left);
        let frame = format!("{:x}\r\n", body.len());
        if out.write_all(frame.as_bytes()).is_err()
            || out.write_all(&body).is_err()
            || out.write_all(b"\r\n").is_err()
        {
            return sent;
        }
        sent += body.len() as u64;
        std::thread::sleep(pause);
    }
    let _ = out.write_all(b"0\r\n\r\n");
    sent
}
