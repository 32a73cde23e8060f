//! Decode limits: the largest frame, name, label set, log line and batch a peer accepts.
//!
//! A frame comes from the network, so nothing in it is trusted: every length the payload
//! codec reads is checked against a [`Limits`] value before it is used (DESIGN.md §3 rule 5).
//! The framer uses the same value so that an agent never builds a frame its collector
//! rejects. A violation is a [`LimitError`] naming the limit, the value seen and the bound.
//!
//! Defaults follow the deployment the design targets: one frame is one UC message of one
//! packet, so [`Limits::max_frame_bytes`] defaults to 4096 bytes (the largest RoCE path MTU,
//! IBTA vol. 1 §9.7.4.1.1: 256, 512, 1024, 2048 or 4096 bytes). String bounds follow common
//! Prometheus practice (Prometheus itself has no hard name limit; `label_name_length_limit`
//! and `label_value_length_limit` are per-scrape options in its configuration) and Fluent
//! Bit's default 32 KiB line buffer halved for one record.

use std::fmt;

/// Length of the fixed frame header in bytes (the table in [`crate::frame`]). Defined here,
/// with the bounds that count it, so that the payload codec and the limits need not import
/// the frame module that uses them both; `crate::frame::HEADER_LEN` is the same constant.
pub const HEADER_LEN: usize = 64;

/// The most samples one `crate::samples::SampleSeries` may carry (a 1 MiB frame holds at
/// most about 100 000 nine-byte samples; a record this size is already far beyond any sane
/// interval).
pub const MAX_SAMPLES_PER_SERIES: usize = 65_536;

/// Bounds checked when a payload is decoded (and honoured when one is built).
///
/// All lengths are in bytes of UTF-8 (not characters); counts are numbers of items.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest whole frame, header included (bytes). Default 4096: one packet at the largest
    /// RoCE path MTU. Must be more than [`crate::frame::HEADER_LEN`].
    pub max_frame_bytes: usize,
    /// Most records (metrics or log records) in one frame. Default 1024.
    pub max_records_per_frame: usize,
    /// Longest metric name. Default 256.
    pub max_name_len: usize,
    /// Longest metric help text. Default 1024.
    pub max_help_len: usize,
    /// Most labels on one metric. Default 64.
    pub max_labels: usize,
    /// Longest label name. Default 128.
    pub max_label_name_len: usize,
    /// Longest label value. Default 1024.
    pub max_label_value_len: usize,
    /// Most histogram buckets on one metric. Default 128.
    pub max_buckets: usize,
    /// Longest log message. Default 16 KiB.
    pub max_log_message_len: usize,
    /// Longest log source (e.g. a file path; Linux `PATH_MAX` is 4096). Default 4096.
    pub max_log_source_len: usize,
    /// Most structured fields on one log record. Default 64.
    pub max_fields: usize,
    /// Longest log field key. Default 128.
    pub max_field_key_len: usize,
    /// Longest log field value. Default 1024.
    pub max_field_value_len: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_frame_bytes: 4096,
            max_records_per_frame: 1024,
            max_name_len: 256,
            max_help_len: 1024,
            max_labels: 64,
            max_label_name_len: 128,
            max_label_value_len: 1024,
            max_buckets: 128,
            max_log_message_len: 16 * 1024,
            max_log_source_len: 4096,
            max_fields: 64,
            max_field_key_len: 128,
            max_field_value_len: 1024,
        }
    }
}

/// Which bound of [`Limits`] a value broke.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Limit {
    /// [`Limits::max_frame_bytes`] (for a payload alone: the frame it would make).
    FrameBytes,
    /// [`Limits::max_records_per_frame`].
    RecordsPerFrame,
    /// [`Limits::max_name_len`].
    NameLen,
    /// [`Limits::max_help_len`].
    HelpLen,
    /// [`Limits::max_labels`].
    Labels,
    /// [`Limits::max_label_name_len`].
    LabelNameLen,
    /// [`Limits::max_label_value_len`].
    LabelValueLen,
    /// [`Limits::max_buckets`].
    Buckets,
    /// [`Limits::max_log_message_len`].
    LogMessageLen,
    /// [`Limits::max_log_source_len`].
    LogSourceLen,
    /// [`Limits::max_fields`].
    Fields,
    /// [`Limits::max_field_key_len`].
    FieldKeyLen,
    /// [`Limits::max_field_value_len`].
    FieldValueLen,
}

impl Limit {
    /// The configuration-style name of the limit, e.g. `max_label_value_len`.
    pub fn name(self) -> &'static str {
        match self {
            Limit::FrameBytes => "max_frame_bytes",
            Limit::RecordsPerFrame => "max_records_per_frame",
            Limit::NameLen => "max_name_len",
            Limit::HelpLen => "max_help_len",
            Limit::Labels => "max_labels",
            Limit::LabelNameLen => "max_label_name_len",
            Limit::LabelValueLen => "max_label_value_len",
            Limit::Buckets => "max_buckets",
            Limit::LogMessageLen => "max_log_message_len",
            Limit::LogSourceLen => "max_log_source_len",
            Limit::Fields => "max_fields",
            Limit::FieldKeyLen => "max_field_key_len",
            Limit::FieldValueLen => "max_field_value_len",
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A value above its bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{value} exceeds {limit} = {bound}")]
pub struct LimitError {
    /// The limit that was broken.
    pub limit: Limit,
    /// The value seen (bytes or items, as the limit counts).
    pub value: usize,
    /// The configured bound.
    pub bound: usize,
}

impl Limits {
    /// The configured bound for `limit`.
    pub fn bound(&self, limit: Limit) -> usize {
        match limit {
            Limit::FrameBytes => self.max_frame_bytes,
            Limit::RecordsPerFrame => self.max_records_per_frame,
            Limit::NameLen => self.max_name_len,
            Limit::HelpLen => self.max_help_len,
            Limit::Labels => self.max_labels,
            Limit::LabelNameLen => self.max_label_name_len,
            Limit::LabelValueLen => self.max_label_value_len,
            Limit::Buckets => self.max_buckets,
            Limit::LogMessageLen => self.max_log_message_len,
            Limit::LogSourceLen => self.max_log_source_len,
            Limit::Fields => self.max_fields,
            Limit::FieldKeyLen => self.max_field_key_len,
            Limit::FieldValueLen => self.max_field_value_len,
        }
    }

    /// `Ok` if `value <= bound(limit)`.
    ///
    /// # Errors
    /// [`LimitError`] carrying `limit`, `value` and the bound otherwise.
    #[inline]
    pub fn check(&self, limit: Limit, value: usize) -> Result<(), LimitError> {
        let bound = self.bound(limit);
        if value <= bound {
            Ok(())
        } else {
            Err(LimitError {
                limit,
                value,
                bound,
            })
        }
    }

    /// Largest payload a frame may carry: `max_frame_bytes − HEADER_LEN`, 0 if the frame
    /// bound is below the header size.
    pub fn max_payload_bytes(&self) -> usize {
        self.max_frame_bytes.saturating_sub(HEADER_LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_reports_limit_value_and_bound() {
        let limits = Limits::default();
        assert_eq!(limits.check(Limit::Labels, 64), Ok(()));
        let err = limits.check(Limit::Labels, 65).unwrap_err();
        assert_eq!(
            err,
            LimitError {
                limit: Limit::Labels,
                value: 65,
                bound: 64
            }
        );
        assert_eq!(err.to_string(), "65 exceeds max_labels = 64");
    }

    #[test]
    fn default_frame_fits_largest_roce_mtu() {
        let limits = Limits::default();
        assert_eq!(limits.max_frame_bytes, 4096);
        assert_eq!(limits.max_payload_bytes(), 4096 - 64);
    }
}
