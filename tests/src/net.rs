//! Free loopback ports.
//!
//! Binding port 0 and closing leaves a small window in which another process may take the
//! port; ports handed out here are remembered so one test process never hands out the same
//! port twice, and the kernel's ephemeral allocation makes other collisions rare. The daemons
//! fail loudly on a taken port, so a collision shows as a clear bind error, not a wrong pass.

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::process::Command;
use std::sync::Mutex;

fn taken() -> &'static Mutex<HashSet<u16>> {
    static TAKEN: std::sync::OnceLock<Mutex<HashSet<u16>>> = std::sync::OnceLock::new();
    TAKEN.get_or_init(|| Mutex::new(HashSet::new()))
}

/// A loopback address whose port is currently free for both TCP and UDP.
///
/// # Panics
/// If no port could be found in 100 tries (the machine is out of ports).
pub fn free_addr() -> SocketAddr {
    for _ in 0..100 {
        let Ok(tcp) = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)) else {
            continue;
        };
        let Ok(addr) = tcp.local_addr() else {
            continue;
        };
        if UdpSocket::bind(addr).is_err() {
            continue;
        }
        let mut set = taken()
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if set.insert(addr.port()) {
            return addr;
        }
    }
    panic!("no free loopback port found");
}

/// An HTTP/1.1 server on a free loopback port that answers every request with `status`
/// (e.g. `"400 Bad Request"`) and a short body, after reading the request whole; it runs
/// until the test process ends. Returns its address.
///
/// # Panics
/// If no port can be bound.
pub fn http_answering(status: &'static str) -> SocketAddr {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind a loopback port");
    let addr = listener.local_addr().expect("local address");
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let Ok(read) = stream.try_clone() else { return };
                let (mut reader, mut out) = (BufReader::new(read), stream);
                loop {
                    let mut len = 0usize;
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    loop {
                        line.clear();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        let h = line.trim_end();
                        if h.is_empty() {
                            break;
                        }
                        if let Some((n, v)) = h.split_once(':') {
                            if n.eq_ignore_ascii_case("content-length") {
                                len = v.trim().parse().unwrap_or(0);
                            }
                        }
                    }
                    let mut body = vec![0; len];
                    if reader.read_exact(&mut body).is_err() {
                        return;
                    }
                    let text = "refused by the test\n";
                    let answer = format!(
                        "HTTP/1.1 {status}\r\ncontent-length: {}\r\n\r\n{text}",
                        text.len()
                    );
                    if out.write_all(answer.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A veth pair (real interfaces with real ethtool statistics), deleted on drop (deleting one end deletes both).
#[derive(Debug)]
pub struct Veth {
    /// One end.
    pub a: String,
    /// The other end.
    pub b: String,
}

impl Veth {
    /// Creates the pair `uctea<pid>`/`ucteb<pid>` (needs root), replacing one an earlier
    /// killed run left.
    ///
    /// # Panics
    /// If `ip link add` fails.
    // Not `Default`: it creates kernel interfaces, which no default value should.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Veth {
        let tag = std::process::id() % 100_000;
        let (a, b) = (format!("uctea{tag}"), format!("ucteb{tag}"));
        // A pair left by an earlier run that was killed.
        let _ = Command::new("ip")
            .args(["link", "del", &a])
            .stderr(std::process::Stdio::null())
            .status();
        let status = Command::new("ip")
            .args(["link", "add", &a, "type", "veth", "peer", "name", &b])
            .status()
            .unwrap_or_else(|e| panic!("ip link add: {e} (iproute2 is in scripts/install-deps)"));
        assert!(
            status.success(),
            "ip link add {a} type veth peer name {b}: {status}"
        );
        Veth { a, b }
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.a]).status();
    }
}
