//! The collector side of the handshake (DESIGN.md §6): a thin driver of
//! `uctel_protocol::session::ServerHandshake` over the control channel, plus the checks only
//! the collector can make of a `Hello` (transport, data path, a token for the agent id) and
//! the QP endpoints both sides see.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use tokio::net::TcpStream;
use uctel_common::control::ControlChannel;
use uctel_protocol::control::{self as wire, DataPath, Hello, RefuseReason, Transport};
use uctel_protocol::session::{Refusal, ServerEvent, ServerHandshake};
use uctel_transport::api::{gid_from_ip, QpEndpoint, ROCE_V2_UDP_PORT};

use super::{until, Auth, COLLECTOR_ID};
use crate::config::{Config, DataPathConfig, Token, TransportKindConfig};

/// An authenticated agent: its `Hello` and the data path chosen for it.
#[derive(Debug)]
pub(super) struct Accepted {
    pub(super) hello: Hello,
    pub(super) data_path: DataPath,
}

/// What the collector needs to check a `Hello`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Checks<'a> {
    pub(super) config: &'a Config,
    /// The UDP address the soft device receives on (`None` for verbs).
    pub(super) collector_udp: Option<SocketAddr>,
    pub(super) auth: &'a Auth,
}

/// Runs the handshake on `ch`, accepted at `accepted_at`, until the agent is authenticated
/// or refused; the deadline is `accepted_at + timeout` (the machine's), sends included.
///
/// # Errors
/// The [`Refusal`] to send and count.
pub(super) async fn handshake(
    ch: &mut ControlChannel<TcpStream>,
    checks: Checks<'_>,
    accepted_at: Instant,
    timeout: Duration,
) -> Result<Accepted, Refusal> {
    let mut machine = ServerHandshake::new(accepted_at, timeout);
    let mut data_path = None;
    loop {
        while let Some(msg) = machine.poll_transmit() {
            match until(machine.poll_timeout(), ch.send(msg)).await {
                Some(Ok(())) => {}
                Some(Err(e)) => machine.on_error(e.to_string(), Instant::now()),
                None => machine.handle_timeout(Instant::now()),
            }
        }
        match machine.poll_event() {
            Some(ServerEvent::CheckHello(hello)) => {
                match check_hello(checks, &hello) {
                    Ok((token, chosen)) => match wire::random_nonce() {
                        Ok(nonce) => {
                            data_path = Some(chosen);
                            machine.challenge(token.as_bytes(), nonce, COLLECTOR_ID);
                        }
                        Err(e) => machine.refuse(RefuseReason::Busy, e.to_string()),
                    },
                    Err((reason, detail)) => machine.refuse(reason, detail),
                }
                continue;
            }
            Some(ServerEvent::Authenticated(hello)) => {
                return match data_path {
                    Some(data_path) => Ok(Accepted { hello, data_path }),
                    None => Err(Refusal::new(
                        RefuseReason::Busy,
                        hello.agent_id,
                        "authenticated before a data path was chosen",
                    )),
                };
            }
            Some(ServerEvent::Refused(r)) => return Err(r),
            None => {}
        }
        let received = until(machine.poll_timeout(), ch.recv()).await;
        let now = Instant::now();
        match received {
            Some(Ok(Some(msg))) => machine.on_message(msg, now),
            Some(Ok(None)) => machine.on_closed(now),
            Some(Err(e)) => machine.on_error(e.to_string(), now),
            None => machine.handle_timeout(now),
        }
    }
}

/// The collector's checks of a `Hello` of its protocol version, in order: a transport that
/// can reach this collector, a common data path, a token for the agent id. The token to
/// prove and the data path chosen, or the refusal's reason and detail.
fn check_hello<'a>(
    checks: Checks<'a>,
    hello: &Hello,
) -> Result<(&'a Token, DataPath), (RefuseReason, String)> {
    let agent_transport = Transport::try_from(hello.transport).unwrap_or(Transport::Unspecified);
    if let Some(detail) = transport_refusal(
        collector_transport(checks.config),
        checks.collector_udp,
        agent_transport,
    ) {
        return Err((RefuseReason::TransportMismatch, detail));
    }
    if let Some(detail) = rc_lane_refusal(collector_transport(checks.config), hello) {
        return Err((RefuseReason::TransportMismatch, detail));
    }
    let Some(data_path) = choose_data_path(checks.config, hello) else {
        return Err((
            RefuseReason::TransportMismatch,
            "no common data path".into(),
        ));
    };
    let Some(token) = checks.auth.token_for(&hello.agent_id) else {
        return Err((RefuseReason::UnknownAgent, "agent id not configured".into()));
    };
    Ok((token, data_path))
}

fn choose_data_path(config: &Config, hello: &Hello) -> Option<DataPath> {
    let offers = |p: DataPath| hello.capabilities.contains(&(p as i32));
    match config.ring.data_path {
        DataPathConfig::Auto if offers(DataPath::WriteWithImm) => Some(DataPath::WriteWithImm),
        DataPathConfig::Auto if offers(DataPath::Send) => Some(DataPath::Send),
        DataPathConfig::WriteWithImm if offers(DataPath::WriteWithImm) => {
            Some(DataPath::WriteWithImm)
        }
        DataPathConfig::Send if offers(DataPath::Send) => Some(DataPath::Send),
        _ => None,
    }
}

/// The transport this collector's QPs run on.
pub(super) fn collector_transport(config: &Config) -> Transport {
    match config.transport.kind {
        TransportKindConfig::Soft => Transport::Soft,
        TransportKindConfig::Verbs => Transport::Verbs,
    }
}

/// Why an agent on `agent` cannot reach a collector on `collector` (whose soft device, if any,
/// receives on `collector_udp`), or `None` when it can. Both transports speak RoCEv2 UC on
/// the wire (DESIGN.md §2: the soft transport is wire-compatible with rxe), so:
///
/// - same transport: always;
/// - soft agent, verbs collector: always. The collector's QP only receives; the device checks
///   an arriving packet's source IP against the QP's remote GID (rxe: `check_addr` in
///   `rxe_recv.c`), never its source UDP port, so the agent may send from any port;
/// - verbs agent, soft collector: only when the soft device receives on UDP port 4791, the
///   only port an RDMA device sends RoCEv2 to (IANA; rxe's `ROCE_V2_UDP_DPORT`).
fn transport_refusal(
    collector: Transport,
    collector_udp: Option<SocketAddr>,
    agent: Transport,
) -> Option<String> {
    match (collector, agent) {
        (c, a) if c == a => None,
        (Transport::Verbs, Transport::Soft) => None,
        (Transport::Soft, Transport::Verbs) => match collector_udp {
            Some(a) if a.port() == ROCE_V2_UDP_PORT => None,
            udp => Some(format!(
                "this collector's soft transport receives on {}; a verbs agent sends RoCEv2 \
                 only to UDP port {ROCE_V2_UDP_PORT}",
                udp.map_or_else(|| "no UDP address".to_owned(), |a| a.to_string())
            )),
        },
        (c, a) => Some(format!(
            "this collector runs the {} transport; the agent offers {}",
            c.as_str(),
            a.as_str()
        )),
    }
}

/// Why a soft agent's RC lane cannot work with a verbs collector, if it cannot: an RC
/// responder answers (ACK, NAK) on UDP port 4791 of the requester's address, the only port
/// an RDMA device sends RoCEv2 to, so the agent's RC QP must receive there (its
/// `transport.soft.bind`); from any other port every request would go unacknowledged until
/// the agent's QP ran out of retries.
fn rc_lane_refusal(collector: Transport, hello: &Hello) -> Option<String> {
    let lane = hello.rc_lane.as_ref()?;
    let port = lane.qp.as_ref()?.udp_socket_addr()?.port();
    (collector == Transport::Verbs && port != ROCE_V2_UDP_PORT).then(|| {
        format!(
            "this collector's RC QP (verbs) answers RC requests on UDP port {ROCE_V2_UDP_PORT} \
             only; the agent's RC QP receives on port {port}: set transport.soft.bind to \
             <address>:{ROCE_V2_UDP_PORT} on the agent"
        )
    })
}

/// The agent's endpoint for our QP; an unspecified IP (agent bound to a wildcard) is replaced
/// by the address its TCP connection came from. A verbs collector gets the GID only: its QP
/// never sends to the agent, and an RDMA device accepts no UDP address but the GID's port
/// 4791, while a soft agent may send from any port ([`transport_refusal`]).
pub(super) fn agent_endpoint(
    hello: &Hello,
    peer: SocketAddr,
    collector: Transport,
) -> Option<QpEndpoint> {
    agent_qp_endpoint(hello.qp.as_ref()?, peer, collector)
}

/// One QP endpoint of an agent's `Hello` (its UC QP or its RC lane's), resolved as
/// [`agent_endpoint`] resolves the UC one.
pub(super) fn agent_qp_endpoint(
    qp: &wire::QpEndpoint,
    peer: SocketAddr,
    collector: Transport,
) -> Option<QpEndpoint> {
    let udp_addr = qp.udp_socket_addr().map(|a| {
        if a.ip().is_unspecified() {
            SocketAddr::new(peer.ip(), a.port())
        } else {
            a
        }
    });
    let gid = match (udp_addr, qp.gid_array()) {
        (Some(a), Some(g)) if g == [0; 16] || a.ip() != uctel_transport::api::ip_from_gid(g) => {
            gid_from_ip(a.ip())
        }
        (_, Some(g)) => g,
        (Some(a), None) => gid_from_ip(a.ip()),
        (None, None) => return None,
    };
    Some(QpEndpoint {
        gid,
        qpn: qp.qpn,
        psn: qp.psn,
        mtu: qp.mtu,
        udp_addr: udp_addr.filter(|_| collector != Transport::Verbs),
    })
}

/// Our endpoint as the agent must see it: a wildcard bind is replaced by the local address of
/// the agent's TCP connection (the address it reached us on).
pub(super) fn advertised_endpoint(ep: QpEndpoint, local_ip: IpAddr) -> wire::QpEndpoint {
    let udp_addr = ep.udp_addr.map(|a| {
        if a.ip().is_unspecified() {
            SocketAddr::new(local_ip, a.port())
        } else {
            a
        }
    });
    let gid = match udp_addr {
        Some(a) if ep.gid == gid_from_ip(IpAddr::from([0, 0, 0, 0])) || ep.gid == [0; 16] => {
            gid_from_ip(a.ip())
        }
        _ => ep.gid,
    };
    wire::QpEndpoint {
        gid: gid.to_vec(),
        qpn: ep.qpn,
        psn: ep.psn,
        mtu: ep.mtu,
        udp_addr: udp_addr.map(|a| a.to_string()).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn udp(port: u16) -> Option<SocketAddr> {
        Some(SocketAddr::from(([10, 0, 0, 1], port)))
    }

    #[test]
    fn transports_that_share_the_rocev2_wire_are_accepted() {
        for t in [Transport::Soft, Transport::Verbs] {
            assert_eq!(transport_refusal(t, udp(5000), t), None, "{t:?}");
        }
        // A host without RDMA shipping to an RDMA collector.
        assert_eq!(
            transport_refusal(Transport::Verbs, None, Transport::Soft),
            None
        );
        // An RDMA host shipping to a soft collector on the RoCEv2 port.
        assert_eq!(
            transport_refusal(Transport::Soft, udp(4791), Transport::Verbs),
            None
        );
    }

    #[test]
    fn a_verbs_agent_cannot_reach_a_soft_collector_off_port_4791() {
        let why = transport_refusal(Transport::Soft, udp(5000), Transport::Verbs);
        let why = why.unwrap_or_default();
        assert!(
            why.contains("10.0.0.1:5000") && why.contains("4791"),
            "{why}"
        );
        assert!(transport_refusal(Transport::Soft, None, Transport::Verbs).is_some());
        assert!(transport_refusal(Transport::Verbs, None, Transport::Unspecified).is_some());
    }

    #[test]
    fn a_soft_rc_lane_off_port_4791_cannot_reach_a_verbs_collector() {
        let lane = |udp: &str| Hello {
            rc_lane: Some(wire::RcLaneRequest {
                qp: Some(wire::QpEndpoint {
                    udp_addr: udp.into(),
                    ..wire::QpEndpoint::default()
                }),
                stream_ids: vec![2],
            }),
            ..Hello::default()
        };
        let why = rc_lane_refusal(Transport::Verbs, &lane("10.0.0.2:40000")).unwrap_or_default();
        assert!(
            why.contains("40000") && why.contains("transport.soft.bind"),
            "{why}"
        );
        assert_eq!(
            rc_lane_refusal(Transport::Verbs, &lane("10.0.0.2:4791")),
            None
        );
        // A soft collector sends to the port the agent names; no lane, nothing to refuse.
        assert_eq!(
            rc_lane_refusal(Transport::Soft, &lane("10.0.0.2:40000")),
            None
        );
        assert_eq!(rc_lane_refusal(Transport::Verbs, &Hello::default()), None);
    }

    fn soft_hello(udp_addr: &str, gid: [u8; 16]) -> Hello {
        Hello {
            protocol_version: wire::PROTOCOL_VERSION,
            agent_id: "a".into(),
            hostname: String::new(),
            epoch: 1,
            transport: Transport::Soft as i32,
            capabilities: vec![DataPath::WriteWithImm as i32],
            qp: Some(wire::QpEndpoint {
                gid: gid.to_vec(),
                qpn: 0x11,
                psn: 7,
                mtu: 4096,
                udp_addr: udp_addr.into(),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_verbs_collector_sees_a_soft_agent_by_gid_only() {
        let peer = SocketAddr::from(([10, 77, 0, 2], 40000));
        let agent_ip = IpAddr::from([10, 77, 0, 2]);
        for (udp_addr, gid) in [
            // Bound to an ephemeral port: no RDMA device could send there, and none has to.
            ("10.77.0.2:53211", gid_from_ip(agent_ip)),
            // Bound to a wildcard: the address the control connection came from.
            ("0.0.0.0:4791", [0; 16]),
        ] {
            let h = soft_hello(udp_addr, gid);
            let verbs = agent_endpoint(&h, peer, Transport::Verbs);
            let ep = verbs.unwrap_or_else(|| panic!("{udp_addr}: no endpoint"));
            assert_eq!(ep.udp_addr, None, "{udp_addr}");
            assert_eq!(ep.gid, gid_from_ip(agent_ip), "{udp_addr}");
            assert_eq!((ep.qpn, ep.psn, ep.mtu), (0x11, 7, 4096));
            let soft = agent_endpoint(&h, peer, Transport::Soft);
            let port = udp_addr.rsplit(':').next().and_then(|p| p.parse().ok());
            assert_eq!(
                soft.and_then(|e| e.udp_addr),
                port.map(|p| SocketAddr::new(agent_ip, p)),
                "{udp_addr}"
            );
        }
    }
}
