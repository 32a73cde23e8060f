//! Free loopback ports.
//!
//! Binding port 0 and closing leaves a small window in which another process may take the
//! port; ports handed out here are remembered so one test process never hands out the same
//! port twice, and the kernel's ephemeral allocation makes other collisions rare. The daemons
//! fail loudly on a taken port, so a collision shows as a clear bind error, not a wrong pass.

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
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
