//! Checks of `sources.kmsg` and `sources.journald` (the part of `AgentConfig::validate`
//! for the system log sources).

use uctel_common::config::Problems;

use super::{check_seconds, AgentConfig, LOG_RECORD_OVERHEAD_BYTES};

impl AgentConfig {
    /// `sources.kmsg`: its message size and poll interval.
    pub(super) fn check_kmsg(&self, p: &mut Problems) {
        let Some(k) = &self.sources.kmsg else {
            return;
        };
        let max_line = self
            .frame_limit_bytes()
            .saturating_sub(LOG_RECORD_OVERHEAD_BYTES);
        if k.max_message_bytes
            .is_some_and(|m| !(16..=max_line.max(16)).contains(&m))
        {
            p.push(
                "sources.kmsg.max_message_bytes",
                format!("must be in 16..={max_line} so a message fits a frame"),
            );
        }
        check_seconds(
            p,
            "sources.kmsg.poll_interval_seconds",
            k.poll_interval_seconds,
            0.01,
            3600.0,
        );
    }

    /// `sources.journald`: its message size, poll interval and match names.
    pub(super) fn check_journald(&self, p: &mut Problems) {
        let Some(j) = &self.sources.journald else {
            return;
        };
        let max_line = self
            .frame_limit_bytes()
            .saturating_sub(LOG_RECORD_OVERHEAD_BYTES);
        if j.max_message_bytes
            .is_some_and(|m| !(16..=max_line.max(16)).contains(&m))
        {
            p.push(
                "sources.journald.max_message_bytes",
                format!("must be in 16..={max_line} so a message fits a frame"),
            );
        }
        check_seconds(
            p,
            "sources.journald.poll_interval_seconds",
            j.poll_interval_seconds,
            0.01,
            3600.0,
        );
        for (k, m) in [
            ("include_matches", &j.include_matches),
            ("exclude_matches", &j.exclude_matches),
        ] {
            for field in m.keys() {
                // journal field names: upper-case letters, digits, underscores
                // (systemd.journal-fields(7)).
                let ok = !field.is_empty()
                    && field
                        .bytes()
                        .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
                if !ok {
                    p.push(
                        format!("sources.journald.{k}.{field}"),
                        "must be a journal field name (A-Z, 0-9, _)",
                    );
                }
            }
        }
    }
}
