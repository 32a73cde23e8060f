//! Step 3 of a frame, *deliver* (module documentation of `ingest`, step 4 and "Replayed log
//! records"): the payload of a tracked frame decoded with the configured limits, by frame
//! kind, and its records handed to the [`Delivery`]. Record-level drops (samples the store
//! rejected, log lines the sink failed to write) are counted here; the frame's own fate is
//! the next step's (`account`).

use std::time::Instant;

use uctel_protocol::frame::{FrameHeader, FrameKind};
use uctel_protocol::payload::{self, PayloadError};
use uctel_protocol::samples;
use uctel_protocol::stream::StreamName;

use super::{ConnectionIngest, MAX_REPLAY_FILES_PER_AGENT};
use crate::logsink::LogContext;
use crate::outputs::Delivery;
use crate::store::IngestOutcome;
use crate::telemetry::DropReason;

/// Records of one decoded frame.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Delivered {
    /// Records delivered (a samples frame counts one per sample).
    pub(super) records: u64,
    /// Log records discarded as replays of an earlier epoch (not delivered).
    pub(super) replayed: u64,
}

impl<D: Delivery> ConnectionIngest<D> {
    /// Decodes `body`, the payload of the tracked frame `header`, by its kind and delivers
    /// its records: metrics and samples to the series store (and outputs), logs past the
    /// replay check to the log sink; a heartbeat carries nothing.
    ///
    /// # Errors
    /// The payload's decode error (a malformed payload, a limit exceeded, or a heartbeat
    /// with a payload): nothing of the frame was delivered.
    pub(super) fn deliver(
        &mut self,
        header: &FrameHeader,
        body: &[u8],
        now: Instant,
    ) -> Result<Delivered, PayloadError> {
        match header.kind {
            FrameKind::Metrics => self.deliver_metrics(header, body, now),
            FrameKind::MetricsDict => self.deliver_metrics_dict(header, body, now),
            FrameKind::Logs => self.deliver_logs(header, body),
            FrameKind::Samples => self.deliver_samples(header, body, now),
            FrameKind::Heartbeat if body.is_empty() => Ok(Delivered::default()),
            FrameKind::Heartbeat => Err(PayloadError::HeartbeatPayload { len: body.len() }),
        }
    }

    /// A metrics frame, decoded into the reused [`uctel_protocol::borrowed::MetricBatchView`]
    /// (records are views into `body`): one record per metric.
    fn deliver_metrics(
        &mut self,
        header: &FrameHeader,
        body: &[u8],
        now: Instant,
    ) -> Result<Delivered, PayloadError> {
        let mut batch = std::mem::take(&mut self.metrics).recycle();
        let delivered = batch.decode_into(body, &self.limits).map(|()| {
            let out = self.delivery.metrics(
                &self.agent,
                &self.instance,
                header.timestamp_ns,
                &batch,
                now,
            );
            self.count_rejected(header, &out);
            Delivered {
                records: batch.len() as u64,
                replayed: 0,
            }
        });
        self.metrics = batch.recycle();
        delivered
    }

    /// A series-dictionary metrics frame (`uctel_protocol::dict`), decoded with the
    /// stream's dictionary of this epoch into the reused batch: one record per value. The
    /// frame's definitions join the dictionary only if the whole frame is valid; what the
    /// dictionary then knows is acknowledged in the next report
    /// ([`ConnectionIngest::take_dict_acks`](super::ConnectionIngest)).
    ///
    /// The steady state takes a shorter way: a frame of values only, every series known to
    /// the dictionary and stored before, while no output needs labels
    /// ([`Delivery::takes_known`]), is read in one pass into `(id, value, timestamp)` and
    /// stored by id ([`Delivery::metrics_known`]), no record view built. Anything else (a
    /// definition, an unknown id, a histogram, a stale marker, a malformed body, a series
    /// the store does not hold by id) stores nothing that way and takes the full decode,
    /// which stores the frame or says why not: each value is stored or counted once.
    fn deliver_metrics_dict(
        &mut self,
        header: &FrameHeader,
        body: &[u8],
        now: Instant,
    ) -> Result<Delivered, PayloadError> {
        let dict = self.dicts.entry(header.stream_id).or_default();
        if self.delivery.takes_known()
            && dict.decode_known(body, header.timestamp_ns, &self.limits, &mut self.known)
        {
            if let Some(out) = self.delivery.metrics_known(
                &self.agent,
                &self.instance,
                header.timestamp_ns,
                &self.known,
                now,
            ) {
                count_rejected(&self.tel, header, &out);
                return Ok(Delivered {
                    records: self.known.len() as u64,
                    replayed: 0,
                });
            }
        }
        let mut batch = std::mem::take(&mut self.metrics).recycle();
        let delivered = dict
            .decode_into(body, header.timestamp_ns, &self.limits, &mut batch)
            .map(|()| {
                let out = self.delivery.metrics(
                    &self.agent,
                    &self.instance,
                    header.timestamp_ns,
                    &batch,
                    now,
                );
                count_rejected(&self.tel, header, &out);
                Delivered {
                    records: batch.len() as u64,
                    replayed: 0,
                }
            });
        self.metrics = batch.recycle();
        delivered
    }

    /// A logs frame: records at or below the offsets this agent delivered in an earlier
    /// epoch are discarded as replays ([`super::DeliveredLogs`]); the others are delivered,
    /// and their offsets raise this connection's per-file highs (at most
    /// [`MAX_REPLAY_FILES_PER_AGENT`] files). Lines the sink failed to write are counted
    /// `log_sink_error`.
    fn deliver_logs(
        &mut self,
        header: &FrameHeader,
        body: &[u8],
    ) -> Result<Delivered, PayloadError> {
        let mut batch = payload::decode_log_batch(body, &self.limits)?;
        let replayed = self
            .delivered
            .discard_replays(&self.agent, self.epoch, &mut batch.records);
        for r in batch.records.iter().filter(|r| r.file_id != 0) {
            let full = self.file_highs.len() >= MAX_REPLAY_FILES_PER_AGENT;
            match self.file_highs.get_mut(&r.file_id) {
                Some(high) => *high = (*high).max(r.end_offset),
                None if !full => {
                    self.file_highs.insert(r.file_id, r.end_offset);
                }
                None => {}
            }
        }
        let ctx = LogContext {
            agent: &self.agent,
            instance: &self.instance,
            stream: header.stream_id,
            stream_seq: header.stream_seq,
            frame_timestamp_ns: header.timestamp_ns,
        };
        let (failed, err) = self.delivery.logs(&ctx, &batch.records);
        if let Some(e) = err {
            self.tel.drop_records(DropReason::LogSinkError, failed, &e);
        }
        Ok(Delivered {
            records: batch.records.len() as u64,
            replayed,
        })
    }

    /// A samples frame (`fast_counters`): a series counts one record per sample.
    fn deliver_samples(
        &mut self,
        header: &FrameHeader,
        body: &[u8],
        now: Instant,
    ) -> Result<Delivered, PayloadError> {
        let batch = samples::decode_sample_batch(body, &self.limits)?;
        let out = self
            .delivery
            .samples(&self.agent, &self.instance, &batch, now);
        self.count_rejected(header, &out);
        let n = usize::try_from(samples::batch_weight(&batch)).unwrap_or(usize::MAX);
        Ok(Delivered {
            records: n as u64,
            replayed: 0,
        })
    }

    /// Counts the samples the store rejected, by reason, as dropped records.
    fn count_rejected(&self, header: &FrameHeader, out: &IngestOutcome) {
        count_rejected(&self.tel, header, out);
    }
}

/// Counts the samples the store rejected, by reason, as dropped records of `tel`.
fn count_rejected(
    tel: &crate::telemetry::AgentTelemetry,
    header: &FrameHeader,
    out: &IngestOutcome,
) {
    for (rejection, n) in &out.rejected {
        tel.drop_records(
            rejection.drop_reason(),
            *n,
            &format_args!(
                "stream {} stream_seq {}: {} sample(s) not stored ({})",
                StreamName(header.stream_id),
                header.stream_seq,
                n,
                rejection.as_str()
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::*;
    use super::*;

    #[test]
    fn a_replay_after_a_restart_is_discarded_and_counted() {
        let telemetry = Telemetry::new().unwrap();
        let delivered = DeliveredLogs::default();
        const F: u64 = 0xf11e;
        // Epoch 1 delivers lines of file F ending at 10..=50, then dies (no Goodbye).
        let mut first = log_ingest(1, &delivered, &telemetry);
        let recs: Vec<(u64, u64)> = (1..=5).map(|i| (F, i * 10)).collect();
        let out = first.on_send(&log_frame(1, 0, 0, 5, &recs), now());
        assert_eq!(out, FrameOutcome::Accepted { records: 5 });
        first.end_without_goodbye();
        drop(first);
        assert_eq!(delivered.files_of("a1"), 1);

        // Epoch 2 (the restarted agent, its checkpoint at 30) sends 40, 50 again, then 60, 70.
        let mut second = log_ingest(2, &delivered, &telemetry);
        second.set_previous_epoch(Some(1));
        let out = second.on_send(&log_frame(2, 0, 0, 3, &[(F, 40), (F, 50), (F, 60)]), now());
        assert_eq!(
            out,
            FrameOutcome::Accepted { records: 1 },
            "only 60 delivered"
        );
        let out = second.on_send(&log_frame(2, 1, 1, 4, &[(F, 70)]), now());
        assert_eq!(out, FrameOutcome::Accepted { records: 1 });
        let l = close_logs(&mut second, 1, 4);
        assert_eq!(
            (l.records_received, l.records_replayed, l.records_lost),
            (2, 2, 0)
        );
        // sent = received + lost + dropped + replayed, and the replay is in no other counter.
        assert_eq!(l.records_received + l.records_lost + l.records_replayed, 4);
        assert_eq!(replayed_total(&telemetry), 2);
        assert_eq!(
            telemetry
                .agent("a1")
                .stream(uctel_protocol::stream::LOGS)
                .records_received
                .get(),
            5 + 2
        );
        drop(second);

        // Epoch 3 after a clean stop: 70 was delivered by epoch 2, 80 is new.
        let mut third = log_ingest(3, &delivered, &telemetry);
        let out = third.on_send(&log_frame(3, 0, 0, 2, &[(F, 70), (F, 80)]), now());
        assert_eq!(out, FrameOutcome::Accepted { records: 1 });
        assert_eq!(replayed_total(&telemetry), 3);
        // Another agent id is not compared with a1's files.
        let logs = Arc::new(
            LogSink::open(&LogsConfig {
                sink: LogSinkKind::Stdout,
                ..Default::default()
            })
            .unwrap(),
        );
        let mut other = ConnectionIngest::new(
            "a2",
            "host-a2",
            4,
            Limits::default(),
            TrackerConfig::default(),
            SeriesStore::new(Duration::from_secs(60), 1000),
            logs,
            telemetry.agent("a2"),
        )
        .unwrap();
        other.share_delivered(delivered.clone());
        let out = other.on_send(&log_frame(4, 0, 0, 1, &[(F, 10)]), now());
        assert_eq!(out, FrameOutcome::Accepted { records: 1 });
    }

    /// RC lane (DESIGN.md §8b): the collector received a frame whose acknowledgement the
    /// agent never got (the data path failed on the way back), so the agent's `Goodbye`
    /// names only what was acknowledged and the next epoch sends those lines again. Nothing
    /// is counted lost, and the lines sent again are discarded as replays: written once.
    #[test]
    fn lines_sent_again_after_a_lost_acknowledgement_are_written_once() {
        let telemetry = Telemetry::new().unwrap();
        let delivered = DeliveredLogs::default();
        const F: u64 = 0xac4;
        let mut first = log_ingest(1, &delivered, &telemetry);
        let out = first.on_send(&log_frame(1, 0, 0, 2, &[(F, 10), (F, 20)]), now());
        assert_eq!(out, FrameOutcome::Accepted { records: 2 });
        let out = first.on_send(&log_frame(1, 1, 1, 4, &[(F, 30), (F, 40)]), now());
        assert_eq!(out, FrameOutcome::Accepted { records: 2 });
        // Only the first frame was acknowledged.
        let l = close_logs(&mut first, 0, 2);
        assert_eq!((l.records_received, l.records_lost), (4, 0));
        drop(first);
        // The next epoch reads 30, 40 again from the file, then 50.
        let mut second = log_ingest(2, &delivered, &telemetry);
        second.set_previous_epoch(Some(1));
        let out = second.on_send(&log_frame(2, 0, 0, 3, &[(F, 30), (F, 40), (F, 50)]), now());
        assert_eq!(
            out,
            FrameOutcome::Accepted { records: 1 },
            "only 50 delivered"
        );
        assert_eq!(replayed_total(&telemetry), 2);
        assert_eq!(logs_ledger(&second).records_lost, 0);
    }

    #[test]
    fn the_same_offsets_reordered_within_one_epoch_are_delivered() {
        let telemetry = Telemetry::new().unwrap();
        let delivered = DeliveredLogs::default();
        const F: u64 = 7;
        let mut i = log_ingest(1, &delivered, &telemetry);
        // Frame 1 (offsets 30, 40) overtakes frame 0 (offsets 10, 20): late, all delivered.
        let out = i.on_send(&log_frame(1, 1, 1, 4, &[(F, 30), (F, 40)]), now());
        assert_eq!(out, FrameOutcome::Accepted { records: 2 });
        let out = i.on_send(&log_frame(1, 0, 0, 2, &[(F, 10), (F, 20)]), now());
        assert_eq!(out, FrameOutcome::Accepted { records: 2 });
        let l = logs_ledger(&i);
        assert_eq!((l.records_received, l.records_replayed, l.late), (4, 0, 1));
        drop(i);
        // A later connection of the same epoch (not a restart) compares with nothing folded
        // by that epoch either.
        let mut again = log_ingest(1, &delivered, &telemetry);
        let out = again.on_send(&log_frame(1, 0, 0, 1, &[(F, 20)]), now());
        assert_eq!(out, FrameOutcome::Accepted { records: 1 });
        assert_eq!(replayed_total(&telemetry), 0);
    }

    #[test]
    fn records_without_a_file_id_are_never_deduplicated() {
        let telemetry = Telemetry::new().unwrap();
        let delivered = DeliveredLogs::default();
        let mut first = log_ingest(1, &delivered, &telemetry);
        let out = first.on_send(&log_frame(1, 0, 0, 2, &[(0, 10), (5, 10)]), now());
        assert_eq!(out, FrameOutcome::Accepted { records: 2 });
        first.end_without_goodbye();
        drop(first);
        assert_eq!(delivered.files_of("a1"), 1, "file_id 0 is not remembered");
        let mut second = log_ingest(2, &delivered, &telemetry);
        let out = second.on_send(&log_frame(2, 0, 0, 3, &[(0, 10), (0, 0), (5, 10)]), now());
        assert_eq!(
            out,
            FrameOutcome::Accepted { records: 2 },
            "only file 5's replay goes"
        );
        assert_eq!(replayed_total(&telemetry), 1);
    }

    #[test]
    fn delivered_offsets_are_bounded_per_agent() {
        let delivered = DeliveredLogs::default();
        let n = MAX_REPLAY_FILES_PER_AGENT as u64;
        let highs: HashMap<u64, u64> = (1..=n).map(|f| (f, 10)).collect();
        delivered.fold("a1", 1, &highs);
        assert_eq!(delivered.files_of("a1"), MAX_REPLAY_FILES_PER_AGENT);
        // Newer files push out the ones updated longest ago.
        let newer: HashMap<u64, u64> = (n + 1..=n + 10).map(|f| (f, 10)).collect();
        delivered.fold("a1", 2, &newer);
        assert_eq!(delivered.files_of("a1"), MAX_REPLAY_FILES_PER_AGENT);
        let mut recs = vec![payload::LogRecord {
            file_id: n + 5,
            end_offset: 10,
            ..Default::default()
        }];
        assert_eq!(delivered.discard_replays("a1", 3, &mut recs), 1);
    }

    #[test]
    fn in_order_frames_are_stored_and_counted() {
        let mut r = rig();
        for c in 0..3u64 {
            let out = r.ingest.on_slot(c, &slot(&frame(c, 1, c, c + 1)), now());
            assert_eq!(out, FrameOutcome::Accepted { records: 1 });
        }
        assert_eq!(r.ingest.consumed(), Some(2));
        assert_eq!(r.store.series_count("a1"), 1);
        let l = r.ingest.ledger();
        assert_eq!(l[0].1.accepted, 3);
        assert_eq!(l[0].1.lost, 0);
        let text = String::from_utf8(r.telemetry.render().unwrap()).unwrap();
        assert!(text
            .contains("uctel_collector_frames_received_total{agent=\"a1\",stream=\"metrics\"} 3"));
        r.telemetry
            .registry()
            .register(Box::new(r.store.collector()))
            .unwrap();
        let text = String::from_utf8(r.telemetry.render().unwrap()).unwrap();
        assert!(
            text.contains("node_load1{agent=\"a1\",instance=\"host-a1\"} 2"),
            "{text}"
        );
    }

    /// `deliver` by kind: a metrics payload gives one record per metric, an empty
    /// heartbeat nothing, a heartbeat with a payload and an undecodable payload their
    /// errors (nothing delivered).
    #[test]
    fn deliver_decodes_by_kind() {
        let mut r = rig();
        let t = now();
        let metrics = FrameHeader {
            epoch: EPOCH,
            ..FrameHeader::new(FrameKind::Metrics, 1)
        };
        let batch = MetricBatch {
            metrics: vec![
                Metric {
                    name: "node_load1".into(),
                    r#type: MetricType::Gauge as i32,
                    ..Default::default()
                },
                Metric {
                    name: "node_load5".into(),
                    r#type: MetricType::Gauge as i32,
                    ..Default::default()
                },
            ],
        };
        let got = r.ingest.deliver(&metrics, &encode_metric_batch(&batch), t);
        assert_eq!(
            got,
            Ok(Delivered {
                records: 2,
                replayed: 0
            })
        );
        assert_eq!(r.store.series_count("a1"), 2);
        let heartbeat = FrameHeader {
            epoch: EPOCH,
            ..FrameHeader::new(FrameKind::Heartbeat, 1)
        };
        assert_eq!(
            r.ingest.deliver(&heartbeat, &[], t),
            Ok(Delivered::default())
        );
        assert!(matches!(
            r.ingest.deliver(&heartbeat, &[1, 2], t),
            Err(payload::PayloadError::HeartbeatPayload { len: 2 })
        ));
        assert!(r.ingest.deliver(&metrics, &[0xff; 3], t).is_err());
    }
}
