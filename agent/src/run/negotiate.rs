//! What one session's send pipeline agrees with the collector's `Welcome`: the data path,
//! the frame size (the path MTU, the collector's `max_frame_bytes` and ring slot), the
//! credit window and the per-stream settings.

#[allow(clippy::wildcard_imports)]
use super::*;

/// The send pipeline settings agreed in `welcome`.
///
/// Frames are capped at the path MTU (the smaller of both QPs' MTUs): a frame is one UC
/// message and one packet (DESIGN.md §3), so one lost packet costs exactly one frame and the
/// next frame resyncs the PSN by itself. With `multi_packet_frames` a frame may span several
/// packets, up to the collector's `max_frame_bytes` (and ring slot).
pub(super) fn negotiated(
    config: &AgentConfig,
    welcome: &Welcome,
    local_mtu: u32,
) -> Result<SenderConfig, SessionError> {
    let chosen = match control::DataPath::try_from(welcome.data_path) {
        Ok(control::DataPath::WriteWithImm) => DataPath::WriteWithImm,
        Ok(control::DataPath::Send) => DataPath::Send,
        _ => {
            return Err(SessionError::Welcome(format!(
                "unknown data path {}",
                welcome.data_path
            )))
        }
    };
    // The collector sets up one data path per connection (a ring with zero-length receive
    // WRs, or posted receive buffers): a stream configured otherwise uses its choice.
    let data_paths = Stream::ALL.map(|s| {
        let wanted = config.streams.get(s).data_path;
        if wanted != chosen {
            tracing::warn!(
                stream = %s,
                configured = wanted.as_str(),
                collector = chosen.as_str(),
                "the collector chose another data path for this connection; using it"
            );
        }
        chosen
    });
    let remote_mtu = welcome.qp.as_ref().map_or(local_mtu, |q| q.mtu);
    let path_mtu = local_mtu.min(remote_mtu).max(256) as usize;
    let mut max_frame = config.max_frame_bytes.min(welcome.max_frame_bytes as usize);
    if !config.multi_packet_frames {
        max_frame = max_frame.min(path_mtu);
    }
    let uses_ring = chosen == DataPath::WriteWithImm;
    if uses_ring {
        max_frame = max_frame.min(welcome.slot_bytes as usize);
    }
    if max_frame <= uctel_protocol::frame::HEADER_LEN {
        return Err(SessionError::Welcome(format!(
            "max_frame_bytes {max_frame} leaves no room for a payload"
        )));
    }
    let line_room = max_frame.saturating_sub(crate::config::LOG_RECORD_OVERHEAD_BYTES);
    if let Some(longest) = config
        .sources
        .logs
        .iter()
        .map(|e| config.max_line_bytes(e))
        .max()
        .filter(|l| *l > line_room)
    {
        tracing::warn!(
            max_frame_bytes = max_frame,
            path_mtu,
            collector_max_frame_bytes = welcome.max_frame_bytes,
            "log lines up to {longest} bytes are configured, but frames on this connection carry \
             at most {line_room}: longer lines are cut (counted as truncated=\"frame\"). Raise the \
             path MTU or the collector's max_frame_bytes{}",
            if config.multi_packet_frames {
                ""
            } else {
                ", or set multi_packet_frames: true"
            }
        );
    }
    let margin = config.collector.credit_margin_slots;
    let window = welcome
        .credit_window
        .min(welcome.slots.saturating_sub(margin));
    if window == 0 {
        return Err(SessionError::Welcome(format!(
            "credit window 0 (credit_window {}, slots {}, credit_margin_slots {margin})",
            welcome.credit_window, welcome.slots
        )));
    }
    let heartbeat = Duration::from_millis(u64::from(welcome.heartbeat_interval_ms.max(1)));
    Ok(SenderConfig {
        limits: Limits {
            max_frame_bytes: max_frame,
            ..Limits::default()
        },
        pacing: Some(config.pacing_limits(max_frame)),
        credit_window: u64::from(window),
        first_conn_seq: 0,
        first_stream_seq: 0,
        data_paths,
        flush_after: Stream::ALL
            .map(|s| Duration::from_millis(config.streams.get(s).flush_milliseconds)),
        ready_frames: READY_FRAMES,
        idle_heartbeat: Some(heartbeat),
        wait_for_credit: Stream::ALL
            .map(|s| config.streams.on_no_credit(s) == crate::config::OnNoCredit::Wait),
        carries: lane::carries(config, crate::config::Reliability::Uc),
    })
}
