//! `streams:` of the agent's configuration: each stream's data path, what it does out of
//! credit, its source queue, the metrics buffer while disconnected, its flush deadline and
//! its reliability class (DESIGN.md §4, §8b). Field docs are the reference documentation
//! (`docs/configuration.md`).

use serde::{Deserialize, Serialize};

use crate::stream::Stream;

/// How a stream's frames travel (DESIGN.md §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DataPath {
    /// RDMA WRITE_WITH_IMM into ring slot `conn_seq mod slots`, immediate = low 32 bits of
    /// the connection sequence (memory semantics).
    WriteWithImm,
    /// SEND into a receive buffer the collector posted (channel semantics).
    Send,
}

impl DataPath {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            DataPath::WriteWithImm => "write_with_imm",
            DataPath::Send => "send",
        }
    }

    /// The control protocol's name for it.
    pub fn wire(self) -> uctel_protocol::control::DataPath {
        match self {
            DataPath::WriteWithImm => uctel_protocol::control::DataPath::WriteWithImm,
            DataPath::Send => uctel_protocol::control::DataPath::Send,
        }
    }
}

/// `streams`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StreamsSection {
    /// The metrics stream (host and self metrics).
    #[serde(default = "metrics_stream")]
    pub metrics: StreamSection,
    /// The logs stream.
    #[serde(default = "logs_stream")]
    pub logs: StreamSection,
    /// The stream of `sources.fast_counters` samples: fresh or worthless, so `drop` by
    /// default, with a queue of 4096 records (series of samples).
    #[serde(default = "fast_counters_stream")]
    pub fast_counters: StreamSection,
}

fn metrics_stream() -> StreamSection {
    StreamSection {
        on_no_credit: Some(OnNoCredit::Wait),
        queue_records: Some(65536),
        buffer_while_disconnected_records: Some(crate::buffer::DEFAULT_BUFFER_RECORDS),
        series_dictionary: Some(true),
        ..StreamSection::default()
    }
}

fn fast_counters_stream() -> StreamSection {
    StreamSection {
        on_no_credit: Some(OnNoCredit::Drop),
        queue_records: Some(4096),
        ..StreamSection::default()
    }
}

fn logs_stream() -> StreamSection {
    StreamSection {
        on_no_credit: Some(OnNoCredit::Wait),
        queue_records: Some(8192),
        ..StreamSection::default()
    }
}

impl Default for StreamsSection {
    fn default() -> Self {
        Self {
            metrics: metrics_stream(),
            logs: logs_stream(),
            fast_counters: fast_counters_stream(),
        }
    }
}

impl StreamsSection {
    /// The data paths the streams use, each once, in stream order: `Hello.capabilities`.
    pub fn data_paths(&self) -> Vec<i32> {
        let mut paths = Vec::new();
        for s in Stream::ALL {
            let d = self.get(s).data_path.wire() as i32;
            if !paths.contains(&d) {
                paths.push(d);
            }
        }
        paths
    }

    /// The section of `stream`.
    pub fn get(&self, stream: Stream) -> &StreamSection {
        match stream {
            Stream::Metrics => &self.metrics,
            Stream::Logs => &self.logs,
            Stream::FastCounters => &self.fast_counters,
        }
    }

    /// The source-queue capacity of `stream` in records, defaults applied.
    pub fn queue_records(&self, stream: Stream) -> usize {
        self.get(stream).queue_records.unwrap_or(match stream {
            Stream::Metrics => 65536,
            Stream::Logs => 8192,
            Stream::FastCounters => 4096,
        })
    }

    /// Metric samples held while disconnected (`streams.metrics.
    /// buffer_while_disconnected_records`), default applied; 0 for the other streams.
    pub fn buffer_while_disconnected_records(&self) -> usize {
        self.metrics
            .buffer_while_disconnected_records
            .unwrap_or(crate::buffer::DEFAULT_BUFFER_RECORDS)
    }

    /// Whether the metrics stream asks for the series dictionary (`streams.metrics.
    /// series_dictionary`, default true).
    pub fn series_dictionary(&self) -> bool {
        self.metrics.series_dictionary.unwrap_or(true)
    }

    /// The out-of-credit behaviour of `stream`, defaults applied.
    pub fn on_no_credit(&self, stream: Stream) -> OnNoCredit {
        self.get(stream).on_no_credit.unwrap_or(match stream {
            Stream::FastCounters => OnNoCredit::Drop,
            Stream::Metrics | Stream::Logs => OnNoCredit::Wait,
        })
    }

    /// The reliability class of `stream`.
    pub fn reliability(&self, stream: Stream) -> Reliability {
        self.get(stream).reliability
    }

    /// The streams set to `reliability: rc`, in stream order (empty: no RC lane).
    pub fn rc_streams(&self) -> Vec<Stream> {
        Stream::ALL
            .into_iter()
            .filter(|s| self.reliability(*s) == Reliability::Rc)
            .collect()
    }
}

/// How a stream's frames are delivered: the QP type of the lane it travels on (DESIGN.md
/// §8b). A connection with at least one `rc` stream has two lanes, a UC QP and an RC QP,
/// each with its own connection sequence, ring and credit window; a stream travels on
/// exactly one of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reliability {
    /// Unreliable Connection: a lost frame is detected and counted (`frames_lost_total` at
    /// the collector), never repaired. For data that is fresh or worthless. Default.
    #[default]
    Uc,
    /// Reliable Connection: the NIC (or the soft transport, following rxe) acknowledges and
    /// retransmits (IBTA 9.7), so nothing is lost while `transport.rc`'s retry limits hold;
    /// the latency tail and the bytes on the wire grow with loss (BENCHMARKS.md "Reliability
    /// trade-off": at 5 % loss everything arrives, at about a quarter of the offered rate
    /// with the default `timeout`). For data that must not be lost (audit logs).
    Rc,
}

impl Reliability {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Reliability::Uc => "uc",
            Reliability::Rc => "rc",
        }
    }
}

/// What a stream does when the credit window (DESIGN.md §4) is used up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnNoCredit {
    /// Keep framing; a frame that finds no credit is dropped at the source and counted
    /// (`no_credit`). For samples that are fresh or worthless within milliseconds (default
    /// for `streams.fast_counters`).
    Drop,
    /// Take no more records while the frames already built would use up every credit; the
    /// records wait in the bounded source queue, and log lines beyond it in their files
    /// (the tailer reads only what the queue holds), until the collector's next grant (an
    /// agent out of credit asks for it at once, and gets it within half a report
    /// interval). Nothing blocks and nothing queues without bound; what overflows the queue
    /// is counted (`source_overflow`). Samples keep the time they were collected at. Default
    /// for `streams.metrics` (a host collection is a burst that may be larger than the
    /// window: its tail waits a fraction of a second instead of being dropped) and
    /// `streams.logs`.
    Wait,
}

impl OnNoCredit {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            OnNoCredit::Drop => "drop",
            OnNoCredit::Wait => "wait",
        }
    }
}

/// `streams.<name>`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StreamSection {
    /// `write_with_imm` (default) or `send`.
    #[serde(default = "default_data_path")]
    pub data_path: DataPath,
    /// `drop` or `wait` when out of credits; default `wait` for metrics and logs, `drop`
    /// for fast counters (see [`OnNoCredit`]).
    #[serde(default)]
    pub on_no_credit: Option<OnNoCredit>,
    /// Capacity of the bounded queue between the sources and the sender, in records. A
    /// source finding it full drops the records (`source_overflow`); it never blocks (the
    /// log tailer reads no more than fits). Default 65536 for metrics (about 10 MiB of
    /// samples), 8192 for logs (at most 16 MiB of 2 KiB lines).
    #[serde(default)]
    pub queue_records: Option<usize>,
    /// `streams.metrics` only: metric samples held, in records, while the agent has no
    /// connection to a collector (a collector restart, a move within the pool, a drain),
    /// and sent after the next `Welcome`, before any newer collection, each with the time
    /// it was collected. Samples still in the send pipeline when a connection ends join
    /// them. When full, the oldest samples are dropped and counted
    /// (`records_dropped_total{stream="metrics",reason="not_connected"}`): the newest state
    /// of every series is what an operator wants, and what is kept stays in collection
    /// order. The buffered samples are sent as credits allow, never dropped for lack of
    /// credit; until they are through (and every credit is back), newer collections join
    /// the buffer's tail. 0 turns buffering off (samples collected while disconnected are
    /// dropped as `not_connected`). Default 16384 (about 5 MiB: six minutes of a small
    /// server's host metrics at the default 10 s interval). Log lines need no such buffer
    /// (they wait in their files) and `fast_counters` samples are fresh or worthless: the
    /// key is refused on those streams.
    #[serde(default)]
    pub buffer_while_disconnected_records: Option<usize>,
    /// `streams.metrics` only: send metrics as values of series defined once per epoch
    /// (frame kind `metrics_dict`, `uctel_protocol::dict`) when the collector offers it in
    /// its `Welcome`: a series' name, labels, type and help travel with its value until the
    /// collector acknowledges them, then only `(id, value)`, about 5 bytes per sample of
    /// node_exporter-style host metrics instead of about 90. A collector that does not offer
    /// it gets `kind = metrics` frames as before. Default true; `false` always sends
    /// `kind = metrics` frames. Refused on the other streams.
    #[serde(default)]
    pub series_dictionary: Option<bool>,
    /// A frame that is not full is sent at the latest this long after its first record.
    /// Default 200 ms.
    #[serde(default = "default_flush_ms")]
    pub flush_milliseconds: u64,
    /// The lane the stream's frames travel on (DESIGN.md §8b). With a stream on `rc` the
    /// connection has a second QP, with its own connection sequence, ring and credit window
    /// at the collector (which must offer one; else the connection fails and is retried).
    #[serde(default)]
    pub reliability: Reliability,
}

fn default_data_path() -> DataPath {
    DataPath::WriteWithImm
}
fn default_flush_ms() -> u64 {
    200
}

impl Default for StreamSection {
    fn default() -> Self {
        Self {
            data_path: default_data_path(),
            on_no_credit: None,
            queue_records: None,
            buffer_while_disconnected_records: None,
            series_dictionary: None,
            flush_milliseconds: default_flush_ms(),
            reliability: Reliability::Uc,
        }
    }
}
