//! The metrics stream's framer: `kind = metrics` frames (protobuf, every series named in
//! every frame) or, once the collector offered it in its `Welcome`, series-dictionary
//! frames (`kind = metrics_dict`, `uctel_protocol::dict`: values of series defined once
//! per epoch, acknowledged by the collector's `DictAck`).

use uctel_protocol::dict::DictFramer;
use uctel_protocol::frame;
use uctel_protocol::framer::{BuiltFrame, Framer, FramerError, FramerStats, PushOutcome};
use uctel_protocol::limits::Limits;
use uctel_protocol::payload::Metric;

/// One of the two framers of the metrics stream.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // one per connection; a Box would add a hop per sample
pub(crate) enum MetricsFramer {
    /// `kind = metrics` frames.
    Plain(Framer<Metric>),
    /// `kind = metrics_dict` frames.
    Dict(DictFramer),
}

impl MetricsFramer {
    /// A `kind = metrics` framer for `stream_id` from `first_stream_seq`.
    pub(crate) fn new(
        stream_id: u32,
        first_stream_seq: u64,
        limits: Limits,
    ) -> Result<MetricsFramer, FramerError> {
        Framer::new(stream_id, first_stream_seq, limits).map(MetricsFramer::Plain)
    }

    /// Switches to series-dictionary frames, from the same stream sequence; only before the
    /// first record (the collector's `Welcome` comes before any). False when it did not.
    pub(crate) fn use_dictionary(&mut self, limits: &Limits) -> bool {
        let MetricsFramer::Plain(f) = self else {
            return true;
        };
        if f.stats().records_in != 0 || f.has_open_frame() || f.stats().frames != 0 {
            return false;
        }
        match DictFramer::new(f.stream_id(), f.next_stream_seq(), limits.clone()) {
            Ok(d) => {
                *self = MetricsFramer::Dict(d);
                true
            }
            Err(_) => false,
        }
    }

    /// Whether dictionary frames are sent.
    pub(crate) fn is_dictionary(&self) -> bool {
        matches!(self, MetricsFramer::Dict(_))
    }

    /// The collector knows every series id below `known_up_to`.
    pub(crate) fn on_ack(&mut self, known_up_to: u32) {
        if let MetricsFramer::Dict(d) = self {
            d.on_ack(known_up_to);
        }
    }

    pub(crate) fn push(&mut self, m: &Metric, unix_ns: u64) -> PushOutcome {
        match self {
            MetricsFramer::Plain(f) => f.push(m, unix_ns),
            MetricsFramer::Dict(d) => d.push(m, unix_ns),
        }
    }

    pub(crate) fn flush(&mut self) -> Option<BuiltFrame> {
        match self {
            MetricsFramer::Plain(f) => f.flush(),
            MetricsFramer::Dict(d) => d.flush(),
        }
    }

    pub(crate) fn heartbeat(&mut self, unix_ns: u64) -> BuiltFrame {
        match self {
            MetricsFramer::Plain(f) => f.heartbeat(unix_ns),
            MetricsFramer::Dict(d) => d.heartbeat(unix_ns),
        }
    }

    pub(crate) fn finish_epoch(&mut self, unix_ns: u64) -> BuiltFrame {
        match self {
            MetricsFramer::Plain(f) => f.finish_epoch(unix_ns),
            MetricsFramer::Dict(d) => d.finish_epoch(unix_ns),
        }
    }

    pub(crate) fn stats(&self) -> FramerStats {
        match self {
            MetricsFramer::Plain(f) => f.stats(),
            MetricsFramer::Dict(d) => d.stats(),
        }
    }

    pub(crate) fn has_open_frame(&self) -> bool {
        match self {
            MetricsFramer::Plain(f) => f.has_open_frame(),
            MetricsFramer::Dict(d) => d.has_open_frame(),
        }
    }

    /// The samples of a frame this framer built (unsealed), each without a timestamp given
    /// the frame's; `None` if the bytes do not decode.
    pub(crate) fn decode_built(&self, bytes: &[u8], limits: &Limits) -> Option<Vec<Metric>> {
        let frame = frame::Frame::new_checked(bytes).ok()?;
        let ts_ms = i64::try_from(frame.timestamp_ns() / 1_000_000).unwrap_or(i64::MAX);
        let mut metrics = match (self, frame.kind()) {
            (MetricsFramer::Dict(d), frame::FrameKind::MetricsDict) => d.decode_own(bytes).ok()?,
            (_, frame::FrameKind::Metrics) => {
                uctel_protocol::payload::decode_metric_batch(frame.payload(), limits)
                    .ok()?
                    .metrics
            }
            _ => return None,
        };
        for m in &mut metrics {
            if m.timestamp_ms == 0 {
                m.timestamp_ms = ts_ms;
            }
        }
        Some(metrics)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uctel_protocol::framer::PushOutcome;
    use uctel_protocol::payload::{Label, MetricType};

    fn m(i: u32, value: f64) -> Metric {
        Metric {
            name: "node_x_total".into(),
            r#type: MetricType::Counter as i32,
            labels: vec![Label {
                name: "i".into(),
                value: i.to_string(),
            }],
            value,
            ..Metric::default()
        }
    }

    #[test]
    fn frames_taken_back_decode_with_the_own_dictionary() {
        let limits = Limits::default();
        let mut f = MetricsFramer::new(1, 0, limits.clone()).unwrap();
        assert!(f.use_dictionary(&limits));
        let mut built = Vec::new();
        for round in 0..2u32 {
            for i in 0..10 {
                if let PushOutcome::Closed(b) = f.push(&m(i, f64::from(round)), 5_000_000) {
                    built.push(b);
                }
            }
            built.extend(f.flush());
            f.on_ack(10);
        }
        assert_eq!(built.len(), 2);
        // The second frame references acknowledged series only: it needs the dictionary.
        let back = f.decode_built(built[1].bytes(), &limits).unwrap();
        assert_eq!(back.len(), 10);
        assert_eq!(back[3].labels[0].value, "3");
        assert_eq!((back[3].value, back[3].timestamp_ms), (1.0, 5));
        assert!((built[1].len() - 64) * 4 < built[0].len() - 64);
    }

    #[test]
    fn the_dictionary_is_not_switched_on_after_the_first_record() {
        let limits = Limits::default();
        let mut f = MetricsFramer::new(1, 0, limits.clone()).unwrap();
        let _ = f.push(&m(0, 1.0), 1);
        assert!(!f.use_dictionary(&limits));
        assert!(!f.is_dictionary());
    }
}
