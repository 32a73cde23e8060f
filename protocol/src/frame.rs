//! The uctel frame: a fixed 64-byte header followed by a protobuf payload.
//!
//! A frame is one UC message and, by default, one packet (DESIGN.md §3). It decodes on its
//! own: nothing in it refers to another frame.
//!
//! # Header layout (version 1)
//!
//! All integers are unsigned, big-endian (network byte order). Offsets in bytes.
//!
//! | offset | size | field          | meaning |
//! |-------:|-----:|----------------|---------|
//! | 0      | 4    | `magic`        | `b"UCTL"` ([`MAGIC`]) |
//! | 4      | 1    | `version`      | `1` ([`VERSION`]); any other value is rejected |
//! | 5      | 1    | `kind`         | [`FrameKind`]: 1 metrics, 2 logs, 3 heartbeat, 4 samples, 5 metrics_dict |
//! | 6      | 2    | `flags`        | [`FrameFlags`]; bit 0 `LAST_OF_EPOCH`, other bits must be 0 |
//! | 8      | 4    | `stream_id`    | stream within the agent (one framer per stream) |
//! | 12     | 4    | `payload_len`  | payload bytes following the header |
//! | 16     | 8    | `epoch`        | random per agent start / reconnect |
//! | 24     | 8    | `conn_seq`     | connection sequence: every frame on this connection, +1 each |
//! | 32     | 8    | `stream_seq`   | stream sequence: every frame of this stream, +1 each |
//! | 40     | 8    | `timestamp_ns` | nanoseconds since the Unix epoch when the frame was opened |
//! | 48     | 8    | `record_count` | records sent on this stream so far, this frame's included |
//! | 56     | 4    | `crc32c`       | CRC32C (Castagnoli) of the 64 header bytes with this field zeroed, then the payload |
//! | 60     | 4    | `reserved`     | must be 0 |
//!
//! The payload is `payload_len` bytes: a `MetricBatch` (kind 1), `LogBatch` (kind 2) or
//! `SampleBatch` (kind 4) of `proto/uctel.proto`, a series-dictionary body (kind 5,
//! `dict`), empty for heartbeats (kind 3). On a
//! samples stream `record_count` counts samples ([`crate::samples`]).
//!
//! A frame may sit at the start of a larger buffer (a ring slot or a receive buffer):
//! `payload_len` decides where it ends and the bytes after it are ignored. For Write with
//! immediate, the immediate carries the low 32 bits of `conn_seq` (DESIGN.md §4); the
//! collector compares it with [`peek_conn_seq`] before checking the CRC, so a slot the agent
//! already overwrote (lapped ring) is told apart from a torn one.
//!
//! # Views and reprs
//!
//! Following smoltcp, [`Frame`] is a checked zero-copy view over any `AsRef<[u8]>`: once
//! [`Frame::new_checked`] succeeds no accessor can panic. [`FrameHeader`] is the owned
//! representation with [`FrameHeader::parse`] and [`FrameHeader::emit`]. [`build_frame`] /
//! [`write_frame`] make whole frames, [`verify_frame`] checks one, [`decode_frame`] checks and
//! decodes header and payload.
//!
//! CRC32C is the checksum of iSCSI (RFC 3720 §B.4) and ext4; it is computed in hardware
//! by SSE4.2 / ARMv8 CRC instructions through the `crc32c` crate.

pub use crate::limits::HEADER_LEN;
use crate::limits::{Limit, Limits};
use crate::payload::{self, LogBatch, MetricBatch, PayloadError};

/// The four bytes every frame starts with.
pub const MAGIC: [u8; 4] = *b"UCTL";
/// The header version this crate reads and writes.
pub const VERSION: u8 = 1;

/// Byte ranges of the header fields (see the module table).
mod field {
    pub(crate) const MAGIC: usize = 0;
    pub(crate) const VERSION: usize = 4;
    pub(crate) const KIND: usize = 5;
    pub(crate) const FLAGS: usize = 6;
    pub(crate) const STREAM_ID: usize = 8;
    pub(crate) const PAYLOAD_LEN: usize = 12;
    pub(crate) const EPOCH: usize = 16;
    pub(crate) const CONN_SEQ: usize = 24;
    pub(crate) const STREAM_SEQ: usize = 32;
    pub(crate) const TIMESTAMP_NS: usize = 40;
    pub(crate) const RECORD_COUNT: usize = 48;
    pub(crate) const CRC32C: usize = 56;
    pub(crate) const RESERVED: usize = 60;
}

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameKind {
    /// Payload is a `MetricBatch`.
    Metrics = 1,
    /// Payload is a `LogBatch`.
    Logs = 2,
    /// Empty payload; keeps sequence tracking alive on an idle stream.
    Heartbeat = 3,
    /// Payload is a `SampleBatch` ([`crate::samples`]): one record per sample.
    Samples = 4,
    /// Payload is a series-dictionary body (`dict`): metrics as values of series
    /// defined once per epoch; one record per value. Sent only to a collector that
    /// announced the capability in `Welcome` (`control::FEATURE_SERIES_DICTIONARY`).
    MetricsDict = 5,
}

impl FrameKind {
    /// The kind for a header byte, `None` for an unknown value.
    pub fn from_u8(value: u8) -> Option<FrameKind> {
        match value {
            1 => Some(FrameKind::Metrics),
            2 => Some(FrameKind::Logs),
            3 => Some(FrameKind::Heartbeat),
            4 => Some(FrameKind::Samples),
            5 => Some(FrameKind::MetricsDict),
            _ => None,
        }
    }

    /// A short lowercase name (`metrics`, `logs`, `heartbeat`), usable as a label value.
    pub fn as_str(self) -> &'static str {
        match self {
            FrameKind::Metrics => "metrics",
            FrameKind::Logs => "logs",
            FrameKind::Heartbeat => "heartbeat",
            FrameKind::Samples => "samples",
            FrameKind::MetricsDict => "metrics_dict",
        }
    }
}

/// Header flags (16 bits). Version 1 defines bit 0 only; a frame with any other bit set is
/// rejected ([`FrameError::UnknownFlags`]) so a later version can give them meaning safely.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FrameFlags(u16);

impl FrameFlags {
    /// No flag set.
    pub const EMPTY: FrameFlags = FrameFlags(0);
    /// The sender sends no later frame on this stream in this epoch (graceful close). The
    /// collector may then settle the stream's loss count without waiting.
    pub const LAST_OF_EPOCH: FrameFlags = FrameFlags(1);
    /// All bits version 1 defines.
    pub const KNOWN: FrameFlags = FrameFlags(1);

    /// Flags from raw bits.
    ///
    /// # Errors
    /// [`FrameError::UnknownFlags`] if a bit outside [`FrameFlags::KNOWN`] is set.
    pub fn from_bits(bits: u16) -> Result<FrameFlags, FrameError> {
        if bits & !Self::KNOWN.0 != 0 {
            Err(FrameError::UnknownFlags { bits })
        } else {
            Ok(FrameFlags(bits))
        }
    }

    /// The raw bits.
    pub fn bits(self) -> u16 {
        self.0
    }

    /// Whether every bit of `other` is set in `self`.
    pub fn contains(self, other: FrameFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// `self` with the bits of `other` set.
    #[must_use]
    pub fn with(self, other: FrameFlags) -> FrameFlags {
        FrameFlags(self.0 | other.0)
    }
}

/// Why a frame header or frame was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The buffer ends before the header or the declared payload does.
    #[error("frame truncated: need {need} bytes, have {have}")]
    Truncated {
        /// Bytes needed (header, or header + `payload_len`).
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// The first four bytes are not [`MAGIC`].
    #[error("bad frame magic {found:02x?}, expected \"UCTL\"")]
    BadMagic {
        /// The bytes found at offset 0.
        found: [u8; 4],
    },
    /// A header version this crate does not read.
    #[error("unsupported frame version {found}, this build reads version {VERSION}")]
    UnsupportedVersion {
        /// The version byte found.
        found: u8,
    },
    /// A kind byte that is not a [`FrameKind`].
    #[error("unknown frame kind {found}")]
    UnknownKind {
        /// The kind byte found.
        found: u8,
    },
    /// Flag bits version 1 does not define.
    #[error("unknown frame flags {bits:#06x}")]
    UnknownFlags {
        /// All flag bits found.
        bits: u16,
    },
    /// The reserved word is not zero.
    #[error("reserved header word is {found:#010x}, must be 0")]
    ReservedNonZero {
        /// The value found.
        found: u32,
    },
    /// The buffer is longer than the frame where an exact length was required (a Send
    /// completion's byte count), or a payload does not fit the 32-bit length field.
    #[error("payload length mismatch: header declares {declared} bytes, message has {actual}")]
    PayloadLength {
        /// Payload bytes the header declares (or, when building, the maximum `u32::MAX`).
        declared: u64,
        /// Payload bytes actually present.
        actual: u64,
    },
    /// The frame is larger than the configured `max_frame_bytes`.
    #[error("frame of {frame_len} bytes exceeds max_frame_bytes = {max_frame_bytes}")]
    TooLarge {
        /// Header plus declared payload.
        frame_len: usize,
        /// The bound.
        max_frame_bytes: usize,
    },
    /// The CRC32C does not match: a torn ring slot or corruption in flight.
    #[error("frame CRC32C mismatch: header says {expected:#010x}, computed {computed:#010x}")]
    BadCrc {
        /// The value in the header.
        expected: u32,
        /// The value computed over header (CRC zeroed) and payload.
        computed: u32,
    },
}

impl FrameError {
    /// A stable snake_case reason label for drop counters, e.g. `bad_crc`.
    pub fn reason(&self) -> &'static str {
        match self {
            FrameError::Truncated { .. } => "truncated",
            FrameError::BadMagic { .. } => "bad_magic",
            FrameError::UnsupportedVersion { .. } => "unsupported_version",
            FrameError::UnknownKind { .. } => "unknown_kind",
            FrameError::UnknownFlags { .. } => "unknown_flags",
            FrameError::ReservedNonZero { .. } => "reserved_nonzero",
            FrameError::PayloadLength { .. } => "payload_length",
            FrameError::TooLarge { .. } => "too_large",
            FrameError::BadCrc { .. } => "bad_crc",
        }
    }
}

#[inline]
fn read_array<const N: usize>(buf: &[u8], offset: usize) -> [u8; N] {
    // Never panics: an out-of-range read yields zeros. Callers check lengths first, so this
    // fallback is only reached through a pathological `AsRef` that changes its length.
    buf.get(offset..offset.saturating_add(N))
        .and_then(|s| <[u8; N]>::try_from(s).ok())
        .unwrap_or([0; N])
}

#[inline]
fn read_u16(buf: &[u8], offset: usize) -> u16 {
    u16::from_be_bytes(read_array(buf, offset))
}

#[inline]
fn read_u32(buf: &[u8], offset: usize) -> u32 {
    u32::from_be_bytes(read_array(buf, offset))
}

#[inline]
fn read_u64(buf: &[u8], offset: usize) -> u64 {
    u64::from_be_bytes(read_array(buf, offset))
}

#[inline]
fn write_bytes(buf: &mut [u8], offset: usize, bytes: &[u8]) {
    if let Some(dst) = buf.get_mut(offset..offset.saturating_add(bytes.len())) {
        dst.copy_from_slice(bytes);
    }
}

/// CRC32C of a header (with its CRC field taken as zero) followed by `payload`.
///
/// `header` shorter than [`HEADER_LEN`] is treated as zero-padded; bytes past it are ignored.
pub fn frame_crc32c(header: &[u8], payload: &[u8]) -> u32 {
    // The header is copied with its CRC field zeroed, so that it takes one pass instead of
    // three short ones.
    let mut head = [0u8; HEADER_LEN];
    let n = header.len().min(HEADER_LEN);
    if let (Some(dst), Some(src)) = (head.get_mut(..n), header.get(..n)) {
        dst.copy_from_slice(src);
    }
    if let Some(crc) = head.get_mut(field::CRC32C..field::RESERVED) {
        crc.fill(0);
    }
    let mut crc = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
    crc.update(&head);
    crc.update(payload);
    // A 32-bit CRC's value fits its 32 bits.
    crc.finalize() as u32
}

/// The connection sequence of a frame at the start of `buf`, read without any check other
/// than length and magic (no CRC). For comparing a ring slot with the Write-with-immediate
/// ImmDt (low 32 bits of `conn_seq`, DESIGN.md §4) before paying for the CRC.
///
/// Returns `None` if `buf` is shorter than [`HEADER_LEN`] or does not start with [`MAGIC`].
#[inline]
pub fn peek_conn_seq(buf: &[u8]) -> Option<u64> {
    if buf.len() < HEADER_LEN || read_array::<4>(buf, field::MAGIC) != MAGIC {
        return None;
    }
    Some(read_u64(buf, field::CONN_SEQ))
}

/// The 32-bit immediate (ImmDt) that announces the frame with connection sequence
/// `conn_seq`: its low 32 bits (DESIGN.md §4). The receiver extends it back to 64 bits.
#[inline]
pub fn conn_seq_immediate(conn_seq: u64) -> u32 {
    conn_seq as u32
}

/// A checked, zero-copy view of a frame at the start of a buffer.
///
/// After [`Frame::new_checked`] the buffer holds a whole header with known magic, version,
/// kind and flags, a zero reserved word, and at least `payload_len` payload bytes; no
/// accessor panics. The CRC is *not* checked by construction: call [`Frame::check_crc`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame<T: AsRef<[u8]>> {
    buffer: T,
    kind: FrameKind,
    flags: FrameFlags,
}

impl<T: AsRef<[u8]>> Frame<T> {
    /// Check the header and length of the frame at the start of `buffer`. Bytes after the
    /// frame (`HEADER_LEN + payload_len`) are allowed and ignored (ring slots).
    ///
    /// # Errors
    /// [`FrameError::Truncated`], [`FrameError::BadMagic`],
    /// [`FrameError::UnsupportedVersion`], [`FrameError::UnknownKind`],
    /// [`FrameError::UnknownFlags`], [`FrameError::ReservedNonZero`], checked in that order.
    pub fn new_checked(buffer: T) -> Result<Frame<T>, FrameError> {
        let buf = buffer.as_ref();
        if buf.len() < HEADER_LEN {
            return Err(FrameError::Truncated {
                need: HEADER_LEN,
                have: buf.len(),
            });
        }
        let magic = read_array::<4>(buf, field::MAGIC);
        if magic != MAGIC {
            return Err(FrameError::BadMagic { found: magic });
        }
        let version = read_array::<1>(buf, field::VERSION)[0];
        if version != VERSION {
            return Err(FrameError::UnsupportedVersion { found: version });
        }
        let kind_byte = read_array::<1>(buf, field::KIND)[0];
        let kind =
            FrameKind::from_u8(kind_byte).ok_or(FrameError::UnknownKind { found: kind_byte })?;
        let flags = FrameFlags::from_bits(read_u16(buf, field::FLAGS))?;
        let reserved = read_u32(buf, field::RESERVED);
        if reserved != 0 {
            return Err(FrameError::ReservedNonZero { found: reserved });
        }
        let need = HEADER_LEN.saturating_add(read_u32(buf, field::PAYLOAD_LEN) as usize);
        if buf.len() < need {
            return Err(FrameError::Truncated {
                need,
                have: buf.len(),
            });
        }
        Ok(Frame {
            buffer,
            kind,
            flags,
        })
    }

    /// Like [`Frame::new_checked`], and the buffer must end exactly where the frame does
    /// (a Send completion's byte count or a Write-with-immediate length).
    ///
    /// # Errors
    /// As [`Frame::new_checked`], plus [`FrameError::PayloadLength`] for trailing bytes.
    pub fn new_checked_exact(buffer: T) -> Result<Frame<T>, FrameError> {
        let frame = Frame::new_checked(buffer)?;
        let have = frame.buffer.as_ref().len();
        if have != frame.frame_len() {
            return Err(FrameError::PayloadLength {
                declared: u64::from(frame.payload_len()),
                actual: have.saturating_sub(HEADER_LEN) as u64,
            });
        }
        Ok(frame)
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The frame kind.
    pub fn kind(&self) -> FrameKind {
        self.kind
    }

    /// The header flags.
    pub fn flags(&self) -> FrameFlags {
        self.flags
    }

    /// Stream id.
    pub fn stream_id(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::STREAM_ID)
    }

    /// Payload length in bytes.
    pub fn payload_len(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::PAYLOAD_LEN)
    }

    /// Agent epoch.
    pub fn epoch(&self) -> u64 {
        read_u64(self.buffer.as_ref(), field::EPOCH)
    }

    /// Connection sequence.
    pub fn conn_seq(&self) -> u64 {
        read_u64(self.buffer.as_ref(), field::CONN_SEQ)
    }

    /// Stream sequence.
    pub fn stream_seq(&self) -> u64 {
        read_u64(self.buffer.as_ref(), field::STREAM_SEQ)
    }

    /// Nanoseconds since the Unix epoch.
    pub fn timestamp_ns(&self) -> u64 {
        read_u64(self.buffer.as_ref(), field::TIMESTAMP_NS)
    }

    /// Cumulative records sent on this stream, this frame's included.
    pub fn record_count(&self) -> u64 {
        read_u64(self.buffer.as_ref(), field::RECORD_COUNT)
    }

    /// The CRC32C stored in the header.
    pub fn crc32c(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::CRC32C)
    }

    /// Header plus payload length in bytes.
    pub fn frame_len(&self) -> usize {
        HEADER_LEN.saturating_add(self.payload_len() as usize)
    }

    /// The header bytes.
    pub fn header_bytes(&self) -> &[u8] {
        self.buffer.as_ref().get(..HEADER_LEN).unwrap_or(&[])
    }

    /// The payload bytes (`payload_len` of them).
    pub fn payload(&self) -> &[u8] {
        self.buffer
            .as_ref()
            .get(HEADER_LEN..self.frame_len())
            .unwrap_or(&[])
    }

    /// The whole frame: header and payload, without trailing slot bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.buffer.as_ref().get(..self.frame_len()).unwrap_or(&[])
    }

    /// CRC32C computed over the header (CRC field zeroed) and the payload.
    pub fn compute_crc32c(&self) -> u32 {
        frame_crc32c(self.header_bytes(), self.payload())
    }

    /// Check the stored CRC32C.
    ///
    /// # Errors
    /// [`FrameError::BadCrc`] with the stored and the computed value.
    pub fn check_crc(&self) -> Result<(), FrameError> {
        let expected = self.crc32c();
        let computed = self.compute_crc32c();
        if expected == computed {
            Ok(())
        } else {
            Err(FrameError::BadCrc { expected, computed })
        }
    }

    /// The owned header.
    pub fn header(&self) -> FrameHeader {
        FrameHeader {
            kind: self.kind,
            flags: self.flags,
            stream_id: self.stream_id(),
            payload_len: self.payload_len(),
            epoch: self.epoch(),
            conn_seq: self.conn_seq(),
            stream_seq: self.stream_seq(),
            timestamp_ns: self.timestamp_ns(),
            record_count: self.record_count(),
        }
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Frame<T> {
    /// Set the epoch (CRC not updated: call [`Frame::fill_crc`]).
    pub fn set_epoch(&mut self, epoch: u64) {
        write_bytes(self.buffer.as_mut(), field::EPOCH, &epoch.to_be_bytes());
    }

    /// Set the connection sequence (CRC not updated: call [`Frame::fill_crc`]).
    pub fn set_conn_seq(&mut self, conn_seq: u64) {
        write_bytes(
            self.buffer.as_mut(),
            field::CONN_SEQ,
            &conn_seq.to_be_bytes(),
        );
    }

    /// Compute the CRC32C and store it in the header.
    pub fn fill_crc(&mut self) {
        let crc = self.compute_crc32c();
        write_bytes(self.buffer.as_mut(), field::CRC32C, &crc.to_be_bytes());
    }
}

/// The owned representation of a frame header (everything but magic, version, CRC and the
/// reserved word, which are fixed or computed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FrameHeader {
    /// What the payload is.
    pub kind: FrameKind,
    /// Header flags.
    pub flags: FrameFlags,
    /// Stream within the agent.
    pub stream_id: u32,
    /// Payload bytes. [`build_frame`] and [`write_frame`] overwrite it with the real length.
    pub payload_len: u32,
    /// Agent epoch.
    pub epoch: u64,
    /// Connection sequence.
    pub conn_seq: u64,
    /// Stream sequence.
    pub stream_seq: u64,
    /// Nanoseconds since the Unix epoch.
    pub timestamp_ns: u64,
    /// Cumulative records on this stream, this frame's included.
    pub record_count: u64,
}

impl FrameHeader {
    /// A header of `kind` on `stream_id` with every other field zero.
    pub fn new(kind: FrameKind, stream_id: u32) -> FrameHeader {
        FrameHeader {
            kind,
            flags: FrameFlags::EMPTY,
            stream_id,
            payload_len: 0,
            epoch: 0,
            conn_seq: 0,
            stream_seq: 0,
            timestamp_ns: 0,
            record_count: 0,
        }
    }

    /// Parse the header at the start of `buf` (same checks as [`Frame::new_checked`], CRC
    /// not checked).
    ///
    /// # Errors
    /// See [`Frame::new_checked`].
    pub fn parse(buf: &[u8]) -> Result<FrameHeader, FrameError> {
        Frame::new_checked(buf).map(|f| f.header())
    }

    /// Write the 64 header bytes to the start of `buf`, with the CRC field zero.
    ///
    /// # Errors
    /// [`FrameError::Truncated`] if `buf` is shorter than [`HEADER_LEN`].
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), FrameError> {
        let have = buf.len();
        let Some(h) = buf.get_mut(..HEADER_LEN) else {
            return Err(FrameError::Truncated {
                need: HEADER_LEN,
                have,
            });
        };
        write_bytes(h, field::MAGIC, &MAGIC);
        write_bytes(h, field::VERSION, &[VERSION]);
        write_bytes(h, field::KIND, &[self.kind as u8]);
        write_bytes(h, field::FLAGS, &self.flags.bits().to_be_bytes());
        write_bytes(h, field::STREAM_ID, &self.stream_id.to_be_bytes());
        write_bytes(h, field::PAYLOAD_LEN, &self.payload_len.to_be_bytes());
        write_bytes(h, field::EPOCH, &self.epoch.to_be_bytes());
        write_bytes(h, field::CONN_SEQ, &self.conn_seq.to_be_bytes());
        write_bytes(h, field::STREAM_SEQ, &self.stream_seq.to_be_bytes());
        write_bytes(h, field::TIMESTAMP_NS, &self.timestamp_ns.to_be_bytes());
        write_bytes(h, field::RECORD_COUNT, &self.record_count.to_be_bytes());
        write_bytes(h, field::CRC32C, &[0; 4]);
        write_bytes(h, field::RESERVED, &[0; 4]);
        Ok(())
    }
}

fn payload_len_u32(len: usize) -> Result<u32, FrameError> {
    u32::try_from(len).map_err(|_| FrameError::PayloadLength {
        declared: u64::from(u32::MAX),
        actual: len as u64,
    })
}

/// Write a whole frame (header with `payload_len` set from `payload`, payload, CRC filled)
/// to the start of `out`, e.g. straight into a registered send buffer. Returns the frame
/// length.
///
/// # Errors
/// [`FrameError::Truncated`] if `out` is shorter than the frame; [`FrameError::PayloadLength`]
/// if the payload is longer than `u32::MAX`.
pub fn write_frame(
    header: &FrameHeader,
    payload: &[u8],
    out: &mut [u8],
) -> Result<usize, FrameError> {
    let payload_len = payload_len_u32(payload.len())?;
    let need = HEADER_LEN.saturating_add(payload.len());
    let have = out.len();
    let Some(frame) = out.get_mut(..need) else {
        return Err(FrameError::Truncated { need, have });
    };
    let header = FrameHeader {
        payload_len,
        ..*header
    };
    header.emit(frame)?;
    write_bytes(frame, HEADER_LEN, payload);
    let crc = frame_crc32c(frame, payload);
    write_bytes(frame, field::CRC32C, &crc.to_be_bytes());
    Ok(need)
}

/// Build a whole frame: header (with `payload_len` set from `payload`), payload, CRC filled.
///
/// # Errors
/// [`FrameError::PayloadLength`] if the payload is longer than `u32::MAX`.
pub fn build_frame(header: &FrameHeader, payload: &[u8]) -> Result<Vec<u8>, FrameError> {
    let mut out = vec![0u8; HEADER_LEN.saturating_add(payload.len())];
    write_frame(header, payload, &mut out)?;
    Ok(out)
}

/// Check the frame at the start of `buf` (header, length and CRC) and return its view.
///
/// # Errors
/// See [`Frame::new_checked`] and [`Frame::check_crc`].
pub fn verify_frame(buf: &[u8]) -> Result<Frame<&[u8]>, FrameError> {
    let frame = Frame::new_checked(buf)?;
    frame.check_crc()?;
    Ok(frame)
}

/// Recompute and store the CRC32C of the frame at the start of `buf`.
///
/// # Errors
/// See [`Frame::new_checked`].
pub fn seal(buf: &mut [u8]) -> Result<(), FrameError> {
    let mut frame = Frame::new_checked(buf)?;
    frame.fill_crc();
    Ok(())
}

/// Stamp a built frame for sending on a connection: write `epoch` and `conn_seq` and fill
/// the CRC32C. The framer leaves these fields zero and the CRC unfilled because both are
/// only known when the sender takes a credit and assigns the next connection sequence.
///
/// Costs one CRC32C pass over the frame (hardware CRC: tens of ns per KiB).
///
/// # Errors
/// See [`Frame::new_checked`].
pub fn stamp_connection(buf: &mut [u8], epoch: u64, conn_seq: u64) -> Result<(), FrameError> {
    let mut frame = Frame::new_checked(buf)?;
    frame.set_epoch(epoch);
    frame.set_conn_seq(conn_seq);
    frame.fill_crc();
    Ok(())
}

/// A decoded frame payload.
#[derive(Clone, Debug, PartialEq)]
pub enum Payload {
    /// Kind 1.
    Metrics(MetricBatch),
    /// Kind 2.
    Logs(LogBatch),
    /// Kind 3 (empty payload).
    Heartbeat,
    /// Kind 4.
    Samples(crate::samples::SampleBatch),
}

impl Payload {
    /// Number of records in the payload (0 for a heartbeat; a sample series counts one
    /// per sample, [`crate::samples::SampleSeries::weight`]).
    pub fn record_count(&self) -> usize {
        match self {
            Payload::Metrics(b) => b.metrics.len(),
            Payload::Logs(b) => b.records.len(),
            Payload::Heartbeat => 0,
            Payload::Samples(b) => {
                usize::try_from(crate::samples::batch_weight(b)).unwrap_or(usize::MAX)
            }
        }
    }
}

/// A frame whose header, CRC and payload all checked out.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodedFrame {
    /// The header.
    pub header: FrameHeader,
    /// The decoded payload.
    pub payload: Payload,
}

/// Why [`decode_frame`] rejected a frame.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum DecodeError {
    /// The header, length or CRC is bad.
    #[error("bad frame: {0}")]
    Frame(#[from] FrameError),
    /// Header and CRC are good but the payload is not (schema, UTF-8, grammar or limits).
    #[error("bad {kind} payload (stream {stream_id}, stream_seq {stream_seq}): {source}")]
    Payload {
        /// The frame kind.
        kind: &'static str,
        /// The frame's stream.
        stream_id: u32,
        /// The frame's stream sequence.
        stream_seq: u64,
        /// What was wrong.
        #[source]
        source: PayloadError,
    },
}

impl DecodeError {
    /// A stable snake_case reason label for drop counters: the [`FrameError::reason`] of a
    /// header/CRC failure, or `bad_payload`.
    pub fn reason(&self) -> &'static str {
        match self {
            DecodeError::Frame(e) => e.reason(),
            DecodeError::Payload { .. } => "bad_payload",
        }
    }
}

/// Check and decode the frame at the start of `buf`: header checks, `max_frame_bytes`,
/// CRC32C, then payload decode with `limits`. Trailing bytes after the frame are ignored.
/// Never panics on any input.
///
/// # Errors
/// [`DecodeError::Frame`] (see [`Frame::new_checked`], [`FrameError::TooLarge`],
/// [`FrameError::BadCrc`]) or [`DecodeError::Payload`].
pub fn decode_frame(buf: &[u8], limits: &Limits) -> Result<DecodedFrame, DecodeError> {
    let frame = Frame::new_checked(buf)?;
    if frame.frame_len() > limits.max_frame_bytes {
        return Err(FrameError::TooLarge {
            frame_len: frame.frame_len(),
            max_frame_bytes: limits.bound(Limit::FrameBytes),
        }
        .into());
    }
    frame.check_crc()?;
    let header = frame.header();
    let body = frame.payload();
    let decoded = match frame.kind() {
        FrameKind::Metrics => payload::decode_metric_batch(body, limits).map(Payload::Metrics),
        FrameKind::Logs => payload::decode_log_batch(body, limits).map(Payload::Logs),
        FrameKind::Heartbeat if body.is_empty() => Ok(Payload::Heartbeat),
        FrameKind::Heartbeat => Err(PayloadError::HeartbeatPayload { len: body.len() }),
        FrameKind::Samples => {
            crate::samples::decode_sample_batch(body, limits).map(Payload::Samples)
        }
        // Needs the stream's dictionary: `dict::SeriesDict::decode_into`, or
        // `dict::decode_frame_alone` for a frame that defines every series it carries.
        FrameKind::MetricsDict => Err(PayloadError::Dictionary(
            payload::DictError::UnknownSeries { id: u32::MAX },
        )),
    };
    match decoded {
        Ok(payload) => Ok(DecodedFrame { header, payload }),
        Err(source) => Err(DecodeError::Payload {
            kind: header.kind.as_str(),
            stream_id: header.stream_id,
            stream_seq: header.stream_seq,
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payload::{encode_metric_batch, Metric, MetricType};

    fn header() -> FrameHeader {
        FrameHeader {
            kind: FrameKind::Metrics,
            flags: FrameFlags::LAST_OF_EPOCH,
            stream_id: 0x0102_0304,
            payload_len: 0,
            epoch: 0x1111_2222_3333_4444,
            conn_seq: 0x5555_6666_7777_8888,
            stream_seq: 9,
            timestamp_ns: 1_700_000_000_000_000_000,
            record_count: 12,
        }
    }

    fn metrics_payload() -> Vec<u8> {
        encode_metric_batch(&MetricBatch {
            metrics: vec![Metric {
                name: "node_load1".into(),
                r#type: MetricType::Gauge as i32,
                value: 0.5,
                ..Default::default()
            }],
        })
    }

    fn good_frame() -> Vec<u8> {
        build_frame(&header(), &metrics_payload()).unwrap()
    }

    #[test]
    fn crc32c_is_castagnoli() {
        // RFC 3720 §B.4 / the CRC catalogue check value of CRC-32C for "123456789".
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
    }

    /// The frame CRC is CRC32C over the 64 header bytes with the CRC field zeroed, then the
    /// payload: compared with the checksum of that byte string built out.
    #[test]
    fn frame_crc_covers_the_header_with_its_crc_zeroed_then_the_payload() {
        let frame = build_frame(&header(), &metrics_payload()).unwrap();
        for (header_bytes, payload) in [
            (&frame[..HEADER_LEN], &frame[HEADER_LEN..]),
            (&frame[..HEADER_LEN], &[][..]),
            (&[0xa5u8; HEADER_LEN][..], &[0x5au8; 1000][..]),
        ] {
            let mut whole = header_bytes.to_vec();
            whole[field::CRC32C..field::RESERVED].fill(0);
            whole.extend_from_slice(payload);
            assert_eq!(frame_crc32c(header_bytes, payload), crc32c::crc32c(&whole));
        }
        // A short header is zero-padded to 64 bytes.
        let mut padded = [0u8; HEADER_LEN].to_vec();
        padded[..3].copy_from_slice(b"UCT");
        padded.push(7);
        assert_eq!(frame_crc32c(b"UCT", &[7]), crc32c::crc32c(&padded));
    }

    #[test]
    fn header_layout_is_big_endian_at_documented_offsets() {
        let h = FrameHeader {
            payload_len: 3,
            ..header()
        };
        let bytes = build_frame(&h, &[0xAA, 0xBB, 0xCC]).unwrap();
        assert_eq!(bytes.len(), 67);
        assert_eq!(&bytes[0..4], b"UCTL");
        assert_eq!(bytes[4], 1);
        assert_eq!(bytes[5], 1);
        assert_eq!(&bytes[6..8], &[0, 1]);
        assert_eq!(&bytes[8..12], &[1, 2, 3, 4]);
        assert_eq!(&bytes[12..16], &[0, 0, 0, 3]);
        assert_eq!(&bytes[16..24], &0x1111_2222_3333_4444u64.to_be_bytes());
        assert_eq!(&bytes[24..32], &0x5555_6666_7777_8888u64.to_be_bytes());
        assert_eq!(&bytes[32..40], &9u64.to_be_bytes());
        assert_eq!(&bytes[40..48], &1_700_000_000_000_000_000u64.to_be_bytes());
        assert_eq!(&bytes[48..56], &12u64.to_be_bytes());
        let mut zeroed = bytes.clone();
        zeroed[56..60].fill(0);
        assert_eq!(&bytes[56..60], &crc32c::crc32c(&zeroed).to_be_bytes());
        assert_eq!(&bytes[60..64], &[0; 4]);
        assert_eq!(&bytes[64..], &[0xAA, 0xBB, 0xCC]);
    }

    #[test]
    fn parse_emit_round_trip_and_view_accessors() {
        let payload = metrics_payload();
        let bytes = good_frame();
        let frame = verify_frame(&bytes).unwrap();
        let expect = FrameHeader {
            payload_len: payload.len() as u32,
            ..header()
        };
        assert_eq!(frame.header(), expect);
        assert_eq!(FrameHeader::parse(&bytes).unwrap(), expect);
        assert_eq!(frame.payload(), &payload[..]);
        assert_eq!(frame.as_bytes(), &bytes[..]);
        let mut again = vec![0; HEADER_LEN];
        expect.emit(&mut again).unwrap();
        assert_eq!(&again[..56], &bytes[..56]);
    }

    #[test]
    fn frame_in_larger_slot_ignores_trailing_bytes() {
        let mut slot = good_frame();
        let len = slot.len();
        slot.resize(1024, 0xEE);
        let d = decode_frame(&slot, &Limits::default()).unwrap();
        assert_eq!(d.header.payload_len as usize, len - HEADER_LEN);
        assert_eq!(peek_conn_seq(&slot), Some(0x5555_6666_7777_8888));
        assert_eq!(conn_seq_immediate(0x5555_6666_7777_8888), 0x7777_8888);
        assert_eq!(
            Frame::new_checked_exact(&slot[..]).unwrap_err(),
            FrameError::PayloadLength {
                declared: (len - HEADER_LEN) as u64,
                actual: (1024 - HEADER_LEN) as u64,
            }
        );
        assert!(Frame::new_checked_exact(&slot[..len]).is_ok());
    }

    #[test]
    fn peek_conn_seq_needs_header_and_magic() {
        let bytes = good_frame();
        assert_eq!(peek_conn_seq(&bytes[..HEADER_LEN - 1]), None);
        let mut bad = bytes.clone();
        bad[0] = b'X';
        assert_eq!(peek_conn_seq(&bad), None);
    }

    #[test]
    fn each_header_error_is_reported() {
        let good = good_frame();
        let limits = Limits::default();
        let check = |mutate: &dyn Fn(&mut Vec<u8>), want: FrameError| {
            let mut b = good.clone();
            mutate(&mut b);
            assert_eq!(Frame::new_checked(&b[..]).unwrap_err(), want);
            assert!(!want.reason().is_empty());
            assert_eq!(
                decode_frame(&b, &limits).unwrap_err(),
                DecodeError::Frame(want.clone())
            );
        };
        check(
            &|b| b.truncate(10),
            FrameError::Truncated { need: 64, have: 10 },
        );
        let full = good.len();
        check(
            &|b| b.truncate(full - 1),
            FrameError::Truncated {
                need: full,
                have: full - 1,
            },
        );
        check(
            &|b| b[0..4].copy_from_slice(b"UCTX"),
            FrameError::BadMagic { found: *b"UCTX" },
        );
        check(&|b| b[4] = 2, FrameError::UnsupportedVersion { found: 2 });
        check(&|b| b[5] = 0, FrameError::UnknownKind { found: 0 });
        check(&|b| b[5] = 6, FrameError::UnknownKind { found: 6 });
        check(
            &|b| b[6..8].copy_from_slice(&[0x80, 0x01]),
            FrameError::UnknownFlags { bits: 0x8001 },
        );
        check(&|b| b[63] = 1, FrameError::ReservedNonZero { found: 1 });
    }

    #[test]
    fn too_large_and_bad_crc_are_reported() {
        let good = good_frame();
        let small = Limits {
            max_frame_bytes: good.len() - 1,
            ..Limits::default()
        };
        assert_eq!(
            decode_frame(&good, &small).unwrap_err(),
            DecodeError::Frame(FrameError::TooLarge {
                frame_len: good.len(),
                max_frame_bytes: good.len() - 1,
            })
        );
        for i in [8, 20, 57, HEADER_LEN, good.len() - 1] {
            let mut bad = good.clone();
            bad[i] ^= 0x10;
            let err = decode_frame(&bad, &Limits::default()).unwrap_err();
            assert_eq!(err.reason(), "bad_crc", "byte {i}");
            assert!(
                matches!(err, DecodeError::Frame(FrameError::BadCrc { .. })),
                "byte {i}: {err}"
            );
        }
    }

    #[test]
    fn stamp_connection_rewrites_and_reseals() {
        let mut bytes = good_frame();
        stamp_connection(&mut bytes, 77, 1 << 40).unwrap();
        let f = verify_frame(&bytes).unwrap();
        assert_eq!((f.epoch(), f.conn_seq()), (77, 1 << 40));
        bytes[30] ^= 1;
        assert!(verify_frame(&bytes).is_err());
        seal(&mut bytes).unwrap();
        assert!(verify_frame(&bytes).is_ok());
        assert_eq!(
            stamp_connection(&mut [0u8; 3], 1, 1).unwrap_err(),
            FrameError::Truncated { need: 64, have: 3 }
        );
    }

    #[test]
    fn write_frame_needs_room() {
        let mut out = [0u8; 70];
        assert_eq!(
            write_frame(&header(), &[1; 10], &mut out).unwrap_err(),
            FrameError::Truncated { need: 74, have: 70 }
        );
        assert_eq!(write_frame(&header(), &[1; 6], &mut out), Ok(70));
        assert_eq!(
            FrameHeader::new(FrameKind::Logs, 1).emit(&mut [0; 63]),
            Err(FrameError::Truncated { need: 64, have: 63 })
        );
    }

    #[test]
    fn heartbeat_must_be_empty_and_payload_errors_carry_context() {
        let hb = FrameHeader {
            kind: FrameKind::Heartbeat,
            ..header()
        };
        let d = decode_frame(&build_frame(&hb, &[]).unwrap(), &Limits::default()).unwrap();
        assert_eq!(d.payload, Payload::Heartbeat);
        assert_eq!(d.payload.record_count(), 0);
        let err = decode_frame(&build_frame(&hb, &[0]).unwrap(), &Limits::default()).unwrap_err();
        assert_eq!(err.reason(), "bad_payload");
        assert!(matches!(
            err,
            DecodeError::Payload {
                kind: "heartbeat",
                stream_id: 0x0102_0304,
                stream_seq: 9,
                source: PayloadError::HeartbeatPayload { len: 1 },
            }
        ));
        let logs = FrameHeader {
            kind: FrameKind::Logs,
            ..header()
        };
        let err =
            decode_frame(&build_frame(&logs, &[0xFF]).unwrap(), &Limits::default()).unwrap_err();
        assert!(matches!(
            err,
            DecodeError::Payload {
                source: PayloadError::Protobuf { .. },
                ..
            }
        ));
    }

    #[test]
    fn flags_reject_unknown_bits() {
        assert_eq!(FrameFlags::from_bits(1), Ok(FrameFlags::LAST_OF_EPOCH));
        assert_eq!(
            FrameFlags::from_bits(2),
            Err(FrameError::UnknownFlags { bits: 2 })
        );
        assert!(FrameFlags::EMPTY
            .with(FrameFlags::LAST_OF_EPOCH)
            .contains(FrameFlags::LAST_OF_EPOCH));
        assert!(!FrameFlags::EMPTY.contains(FrameFlags::LAST_OF_EPOCH));
    }
}
