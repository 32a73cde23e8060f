//! A session's start: the control connection, the data planes, the handshake and what it
//! agreed. A connection walk runs it right before the session; a planned move (`pool`
//! module docs, "Moving without losing the place") runs it while the current session still
//! sends, and ends the current epoch only once it returned a [`Established`].

#[allow(clippy::wildcard_imports)]
use super::*;

/// A welcomed connection whose session has not started yet: the new collector holds this
/// agent's place (it counts it against its `max_agents`) until the session runs or the
/// connection closes.
#[derive(Debug)]
pub(super) struct Established {
    /// The collector.
    pub(super) collector: SocketAddr,
    /// The new session's epoch (in its `Hello`).
    pub(super) epoch: u64,
    /// The control connection, after `Welcome`.
    pub(super) conn: ControlConn,
    /// The UC plane, its QP connected to the collector's endpoint.
    pub(super) plane: DataPlane,
    /// The RC lane's plane (streams set to `reliability: rc`), not started yet.
    pub(super) rc_plane: Option<DataPlane>,
    /// The collector's `Welcome`.
    pub(super) welcome: Welcome,
    /// The send pipeline settings agreed in `welcome`.
    pub(super) sender_config: SenderConfig,
}

/// Connects to `collector` (TCP within `collector.connect_timeout_seconds`), opens the data
/// planes, runs the handshake with `epoch` announcing `announce` frames per second, and
/// connects the UC QP to the collector's endpoint.
///
/// # Errors
/// [`SessionError::Connect`] (no TCP connection), [`SessionError::DataPlane`] (a plane could
/// not be opened or connected), [`SessionError::Control`] (a `Refuse`, with the collector's
/// reason, or a broken channel), [`SessionError::HandshakeTimeout`],
/// [`SessionError::Welcome`] (nothing agreed with its `Welcome`).
pub(super) async fn establish(
    config: &AgentConfig,
    token: &[u8],
    collector: SocketAddr,
    epoch: u64,
    announce: u32,
) -> Result<Established, SessionError> {
    let connect_timeout = seconds(config.collector.connect_timeout_seconds);
    let addr = collector.to_string();
    let stream = tokio::time::timeout(connect_timeout, tokio::net::TcpStream::connect(collector))
        .await
        .map_err(|_| SessionError::Connect {
            addr: addr.clone(),
            detail: format!("timed out after {connect_timeout:?}"),
        })?
        .map_err(|e| SessionError::Connect {
            addr: addr.clone(),
            detail: e.to_string(),
        })?;
    let mut conn = ControlConn::new(stream);
    let local_ip = conn
        .local_addr()
        .map_err(|e| SessionError::Connect {
            addr: addr.clone(),
            detail: e.to_string(),
        })?
        .ip();
    let mut plane = DataPlane::open(config, local_ip, config.max_frame_bytes, QpType::Uc)?;
    let rc_plane = lane::open_plane(config, local_ip, &plane)?;
    let hello = Hello {
        protocol_version: PROTOCOL_VERSION,
        agent_id: config.agent_id.clone(),
        hostname: hostname(),
        epoch,
        transport: plane.transport() as i32,
        capabilities: config.streams.data_paths(),
        qp: Some(plane.endpoint()),
        expected_frames_per_second: Some(announce),
        rc_lane: rc_plane.as_ref().map(|p| lane::request(p, config)),
        credit_mr: config.collector.credit_writes.then(|| control::CreditMr {
            addr: plane.credit_mr().addr(),
            rkey: plane.credit_mr().rkey(),
            length: control::CREDIT_MR_BYTES,
        }),
        features: if config.streams.series_dictionary() {
            uctel_protocol::control::FEATURE_SERIES_DICTIONARY
        } else {
            0
        },
    };
    let welcome = conn
        .handshake(hello, token, connect_timeout)
        .await
        .map_err(|e| match e {
            HandshakeFailure::Control(e) => SessionError::Control(e),
            HandshakeFailure::TimedOut(after) => SessionError::HandshakeTimeout(after),
        })?;
    let sender_config = negotiated(config, &welcome, plane.endpoint().mtu)?;
    plane.connect(&welcome)?;
    Ok(Established {
        collector,
        epoch,
        conn,
        plane,
        rc_plane,
        welcome,
        sender_config,
    })
}

/// Whether a planned move can hold two sessions' data planes at once: not on the soft
/// transport bound to a fixed UDP port (`transport.soft.bind` with a port), where the new
/// device cannot bind while the current one holds the port; such an agent ends its epoch
/// first and then connects (the walk of a lost connection).
pub(super) fn can_hand_over(config: &AgentConfig) -> bool {
    !(config.transport.kind == TransportKind::Soft
        && config.transport.soft.bind.is_some_and(|b| b.port() != 0))
}
