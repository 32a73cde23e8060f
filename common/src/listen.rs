//! Listen addresses as operators write them: `IP:PORT`, `[IPv6]:PORT`, or `:PORT` for every
//! (IPv4) interface, the short form of Prometheus exporters' `--web.listen-address=:9100`.
//!
//! Config fields of type `SocketAddr` opt in with
//! `#[serde(deserialize_with = "uctel_common::listen::deserialize")]` (or
//! [`deserialize_option`] for `Option<SocketAddr>`); a bad value is reported with the key's
//! line like any other problem, with a message saying what is wrong with it (no port, a port
//! out of range, not an IP address). Host names are not resolved (a configuration check has
//! no side effects, and a daemon should not bind what DNS says at start-up).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use serde::{Deserialize, Deserializer};

/// Parses a listen address (see the module docs). `:9470` is `0.0.0.0:9470`; port 0 picks a
/// free port when bound.
///
/// # Errors
/// A message naming the problem: missing port, port not a number or above 65535, host not
/// an IP address (with the accepted forms).
pub fn parse(text: &str) -> Result<SocketAddr, String> {
    let text = text.trim();
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let forms = "write IP:PORT, [IPv6]:PORT or :PORT (every interface)";
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(match text.parse::<IpAddr>() {
            Ok(_) => format!("{text:?} has no port; {forms}"),
            Err(_) => format!("{text:?} is not a listen address; {forms}"),
        });
    };
    let port = match port.parse::<u32>() {
        Ok(p) => u16::try_from(p)
            .map_err(|_| format!("port {p} in {text:?} is out of range (0 to 65535)"))?,
        Err(_) if port.is_empty() => return Err(format!("{text:?} has no port; {forms}")),
        Err(_) => return Err(format!("port {port:?} in {text:?} is not a number")),
    };
    if host.is_empty() {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port));
    }
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    match bare.parse::<IpAddr>() {
        Ok(ip) if ip.is_ipv6() && bare == host => Err(format!(
            "{text:?}: an IPv6 address takes brackets, [{host}]:{port}"
        )),
        Ok(ip) => Ok(SocketAddr::new(ip, port)),
        Err(_) if bare.contains(':') && bare == host => {
            Err(format!("{text:?} is not a listen address; {forms}"))
        }
        Err(_) => Err(format!(
            "{host:?} in {text:?} is not an IP address (host names are not resolved); {forms}"
        )),
    }
}

/// serde `deserialize_with` for a `SocketAddr` listen address ([`parse`]).
///
/// # Errors
/// Not a string, or [`parse`]'s message.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    let text = String::deserialize(d)?;
    parse(&text).map_err(serde::de::Error::custom)
}

/// serde `deserialize_with` for an `Option<SocketAddr>` listen address (`null` or absent is
/// `None`; pair it with `#[serde(default)]`).
///
/// # Errors
/// As [`deserialize`].
pub fn deserialize_option<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
    Option::<String>::deserialize(d)?
        .map(|t| parse(&t).map_err(serde::de::Error::custom))
        .transpose()
}

/// Whether `addr`'s IP is one this host can listen on: the unspecified address (every
/// interface), or an address some local interface has. Checked by binding a UDP socket to it
/// on port 0 (nothing is sent; the socket is closed at once), so another process holding the
/// port does not matter. `None` when it can be bound (or fails for another reason, which
/// binding the real port reports); otherwise why not, in words.
pub fn not_local(addr: SocketAddr) -> Option<String> {
    if addr.ip().is_unspecified() {
        return None;
    }
    let mut probe = addr;
    probe.set_port(0);
    match std::net::UdpSocket::bind(probe) {
        Err(e) if e.kind() == std::io::ErrorKind::AddrNotAvailable => Some(format!(
            "{} is not an address of this host (no local interface has it); use one of its \
             addresses, 127.0.0.1 for this host only, or 0.0.0.0 for every interface",
            addr.ip()
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_of_no_local_interface_are_not_local() {
        for local in ["127.0.0.1:9471", "0.0.0.0:1", "[::]:1", "127.0.0.2:0"] {
            let addr: SocketAddr = local.parse().unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(not_local(addr), None, "{local}");
        }
        // TEST-NET-1 (RFC 5737): documentation only, on no interface.
        let remote: SocketAddr = "192.0.2.1:9471".parse().unwrap_or_else(|e| panic!("{e}"));
        let why = not_local(remote).unwrap_or_else(|| panic!("192.0.2.1 taken for local"));
        assert!(
            why.contains("192.0.2.1 is not an address of this host"),
            "{why}"
        );
    }

    #[test]
    fn accepted_forms() {
        for (text, want) in [
            ("127.0.0.1:7400", "127.0.0.1:7400"),
            ("0.0.0.0:0", "0.0.0.0:0"),
            (":9470", "0.0.0.0:9470"),
            (" :9470 ", "0.0.0.0:9470"),
            ("[::]:9470", "[::]:9470"),
            ("[::1]:80", "[::1]:80"),
            ("[2001:db8::1]:65535", "[2001:db8::1]:65535"),
        ] {
            assert_eq!(parse(text), Ok(want.parse().unwrap()), "{text}");
        }
    }

    #[test]
    fn refused_forms_say_why() {
        for (text, says) in [
            (
                ":99999",
                "port 99999 in \":99999\" is out of range (0 to 65535)",
            ),
            (":70000", "out of range"),
            ("127.0.0.1:", "has no port"),
            ("127.0.0.1", "has no port"),
            (":", "has no port"),
            (":http", "port \"http\" in \":http\" is not a number"),
            (":-1", "is not a number"),
            (
                "localhost:9470",
                "\"localhost\" in \"localhost:9470\" is not an IP address",
            ),
            ("::1:80", "an IPv6 address takes brackets, [::1]:80"),
            ("", "is not a listen address"),
            ("nowhere", "is not a listen address"),
            ("[::1]", "is not a number"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.contains(says), "{text:?}: {e}");
        }
    }
}
