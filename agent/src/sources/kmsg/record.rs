//! `/dev/kmsg` records (sans-IO, never panics on any input): the record format, the RDMA
//! device a line names, and the sequence-gap rule that counts records the ring buffer
//! overwrote before they were read.
//!
//! Format (Linux `Documentation/ABI/testing/dev-kmsg`): one record per read(2),
//! `prefix,seq,usec,flags[,…];message\n` followed by continuation lines, each a space then
//! `KEY=value\n` (`SUBSYSTEM=`, `DEVICE=` from dev_printk). `prefix` is the syslog
//! priority, `facility << 3 | level` (RFC 5424 §6.2.1); `seq` the record's 64-bit sequence
//! number, increased by one per record; `usec` the time since boot of the kernel's
//! `local_clock()`, in microseconds. Non-printable bytes of the message are escaped as
//! `\xNN` by the kernel.

use uctel_protocol::payload::Severity;

/// A parsed kernel log record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KmsgRecord {
    /// Syslog severity, 0 (emerg) … 7 (debug).
    pub level: u8,
    /// Syslog facility number (0 = kern).
    pub facility: u8,
    /// The kernel's sequence number.
    pub seq: u64,
    /// Microseconds since boot.
    pub usec: u64,
    /// The text (lossy UTF-8).
    pub message: String,
    /// Continuation `KEY=value` lines, in order.
    pub dict: Vec<(String, String)>,
}

/// Why bytes are not a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KmsgError {
    /// No `;` after the prefix.
    #[error("no ';' after the record prefix")]
    NoSeparator,
    /// The prefix is not `prio,seq,usec,…` with decimal numbers.
    #[error("bad record prefix")]
    BadPrefix,
}

/// Parses one record (the bytes of one read of `/dev/kmsg`, its trailing `\n` optional).
///
/// # Errors
/// [`KmsgError`] when the prefix is malformed.
pub fn parse(bytes: &[u8]) -> Result<KmsgRecord, KmsgError> {
    let semi = bytes
        .iter()
        .position(|b| *b == b';')
        .ok_or(KmsgError::NoSeparator)?;
    let (prefix, rest) = bytes.split_at(semi);
    let rest = rest.get(1..).unwrap_or_default();
    let mut parts = prefix.split(|b| *b == b',');
    let mut num = || -> Result<u64, KmsgError> {
        let p = parts.next().ok_or(KmsgError::BadPrefix)?;
        std::str::from_utf8(p)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or(KmsgError::BadPrefix)
    };
    let prio = num()?;
    let seq = num()?;
    let usec = num()?;
    let mut lines = rest.split(|b| *b == b'\n');
    let message = String::from_utf8_lossy(lines.next().unwrap_or_default()).into_owned();
    let dict = lines
        .filter_map(|l| l.strip_prefix(b" "))
        .filter_map(|l| {
            let eq = l.iter().position(|b| *b == b'=')?;
            Some((
                String::from_utf8_lossy(&l[..eq]).into_owned(),
                String::from_utf8_lossy(&l[eq + 1..]).into_owned(),
            ))
        })
        .collect();
    Ok(KmsgRecord {
        level: (prio & 7) as u8,
        facility: u8::try_from((prio >> 3).min(255)).unwrap_or(255),
        seq,
        usec,
        message,
        dict,
    })
}

/// Splits bytes read from a regular file or pipe (several records at once) into records:
/// a record ends at a `\n` not followed by a space (continuation lines start with one).
/// Returns the records and the length of the bytes consumed (a last record without its
/// `\n` is left for the next read).
pub fn split_records(bytes: &[u8]) -> (Vec<&[u8]>, usize) {
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while let Some(off) = bytes
        .get(i..)
        .and_then(|b| b.iter().position(|c| *c == b'\n'))
    {
        let nl = i + off;
        match bytes.get(nl + 1) {
            Some(b' ') => i = nl + 1,
            Some(_) => {
                out.push(&bytes[start..nl]);
                start = nl + 1;
                i = start;
            }
            // The next byte is unknown yet: a continuation may follow.
            None => break,
        }
    }
    (out, start)
}

/// Syslog facility names (RFC 5424 §6.2.1, table 1), by number.
const FACILITIES: [&str; 24] = [
    "kern",
    "user",
    "mail",
    "daemon",
    "auth",
    "syslog",
    "lpr",
    "news",
    "uucp",
    "cron",
    "authpriv",
    "ftp",
    "ntp",
    "security",
    "console",
    "solaris-cron",
    "local0",
    "local1",
    "local2",
    "local3",
    "local4",
    "local5",
    "local6",
    "local7",
];

/// The facility's name (`kern`, `user`, …, `local7`; its number beyond those).
pub fn facility_name(f: u8) -> String {
    FACILITIES
        .get(usize::from(f))
        .map_or_else(|| f.to_string(), |s| (*s).to_owned())
}

/// Syslog level → severity, as for journald's `PRIORITY`: 0–2 fatal, 3 error, 4 warn,
/// 5–6 info, 7 debug.
pub fn level_severity(level: u8) -> Severity {
    match level {
        0..=2 => Severity::Fatal,
        3 => Severity::Error,
        4 => Severity::Warn,
        5 | 6 => Severity::Info,
        _ => Severity::Debug,
    }
}

/// Driver names whose `dev_printk` lines start `<driver> <bus id>: ` for an RDMA device.
const RDMA_DRIVERS: [&str; 10] = [
    "mlx5_core",
    "mlx4_core",
    "mlx5_ib",
    "mlx4_ib",
    "bnxt_en",
    "bnxt_re",
    "irdma",
    "ice",
    "qedr",
    "hfi1",
];

/// RDMA device name prefixes (`<prefix><n>` or `<prefix>_<n>`, as `ibv_devices` lists
/// them): `mlx5_0`, `rxe0`, `siw0`, `irdma0`, `bnxt_re0`, …
const RDMA_DEVICE_PREFIXES: [&str; 12] = [
    "mlx5_", "mlx4_", "rxe", "siw", "irdma", "bnxt_re", "hfi1_", "qedr", "efa_", "erdma_", "mana_",
    "ionic_",
];

/// The RDMA device a kernel line names, if any: the `DEVICE=+infiniband:<dev>` of an ib
/// device's dev_printk; the bus id of an RDMA driver's line (`mlx5_core 0000:3b:00.0: …`);
/// else the first word of the message shaped like an RDMA device name (`mlx5_0`, `rxe0`).
pub fn rdma_device(r: &KmsgRecord) -> Option<String> {
    if let Some(dev) = r
        .dict
        .iter()
        .find(|(k, _)| k == "DEVICE")
        .and_then(|(_, v)| v.strip_prefix("+infiniband:"))
    {
        return Some(dev.to_owned());
    }
    let mut words = r.message.split(' ');
    if let (Some(driver), Some(bus)) = (words.next(), words.next()) {
        let driver_is_rdma = RDMA_DRIVERS.contains(&driver) || driver == "infiniband";
        if driver_is_rdma {
            if let Some(id) = bus.strip_suffix(':').filter(|b| !b.is_empty()) {
                return Some(id.to_owned());
            }
        }
    }
    r.message
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .find(|w| {
            RDMA_DEVICE_PREFIXES.iter().any(|p| {
                w.strip_prefix(p)
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            })
        })
        .map(str::to_owned)
}

/// The sequence-gap rule: the kernel numbers records one by one, so the records between the
/// one expected next and the one read were overwritten in the ring buffer before they were
/// read (read(2) said `EPIPE`, or they were overwritten while the agent was down).
#[derive(Debug, Clone, Default)]
pub struct SeqTracker {
    next: Option<u64>,
}

impl SeqTracker {
    /// Expects `seq` next (a restart resumes after the last record it shipped).
    pub fn expecting(seq: u64) -> Self {
        Self { next: Some(seq) }
    }

    /// Record `seq` was read; returns how many records were skipped before it (0 for the
    /// first record, a record read again, or a sequence that went back: a new boot's ring
    /// read from a file).
    pub fn read(&mut self, seq: u64) -> u64 {
        let gap = match self.next {
            Some(n) if seq > n => seq - n,
            _ => 0,
        };
        self.next = Some(seq.saturating_add(1));
        gap
    }

    /// The sequence number expected next (`None` before the first record).
    pub fn next(&self) -> Option<u64> {
        self.next
    }

    /// Whether record `seq` was read before (at or below the last one): skipped.
    pub fn seen(&self, seq: u64) -> bool {
        self.next.is_some_and(|n| seq < n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_with_its_dictionary() {
        let r = parse(
            b"4,1234,5678901,-;mlx5_core 0000:3b:00.0: Port module event: module 0, Cable unplugged\n \
              SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n",
        )
        .unwrap();
        assert_eq!(
            (r.level, r.facility, r.seq, r.usec),
            (4, 0, 1234, 5_678_901)
        );
        assert!(r.message.starts_with("mlx5_core 0000:3b:00.0: Port"));
        assert_eq!(
            r.dict,
            [
                ("SUBSYSTEM".to_owned(), "pci".to_owned()),
                ("DEVICE".to_owned(), "+pci:0000:3b:00.0".to_owned())
            ]
        );
        assert_eq!(rdma_device(&r).as_deref(), Some("0000:3b:00.0"));
        assert_eq!(level_severity(r.level), Severity::Warn);
        let user = parse(b"14,7,100,-;hello").unwrap();
        assert_eq!((user.facility, user.level), (1, 6));
        assert_eq!(facility_name(user.facility), "user");
        assert_eq!(facility_name(200), "200");
    }

    #[test]
    fn rdma_devices_are_found_where_lines_name_them() {
        let dev = |line: &str| rdma_device(&parse(line.as_bytes()).unwrap());
        assert_eq!(
            dev("6,1,1,-;infiniband mlx5_0: ib_mad: link up\n SUBSYSTEM=infiniband\n DEVICE=+infiniband:mlx5_0"),
            Some("mlx5_0".into())
        );
        assert_eq!(
            dev("6,1,1,-;rdma_rxe: loaded; rxe0 added to eth0"),
            Some("rxe0".into())
        );
        assert_eq!(
            dev("6,1,1,-;ib_core: mlx5_1 port 1 state ACTIVE"),
            Some("mlx5_1".into())
        );
        assert_eq!(dev("6,1,1,-;eth0: link up, rxe is not a device"), None);
        assert_eq!(dev("6,1,1,-;usb 1-1: new device"), None);
    }

    #[test]
    fn bad_records_are_errors_not_panics() {
        assert_eq!(parse(b"no separator"), Err(KmsgError::NoSeparator));
        assert_eq!(parse(b"x,1,2;m"), Err(KmsgError::BadPrefix));
        assert_eq!(parse(b"6,1;m"), Err(KmsgError::BadPrefix));
        assert_eq!(parse(b";"), Err(KmsgError::BadPrefix));
        assert!(parse(&[0xff, b';', 0xfe]).is_err());
        let r = parse(b"6,1,2,-;\xff\n bad-continuation\n").unwrap();
        assert_eq!(r.message, "\u{fffd}");
        assert!(r.dict.is_empty());
    }

    #[test]
    fn records_are_split_at_newlines_not_followed_by_a_space() {
        let (recs, used) = split_records(b"6,1,0,-;a\n SUBSYSTEM=x\n6,2,0,-;b\n6,3,0,-;c");
        assert_eq!(recs, [&b"6,1,0,-;a\n SUBSYSTEM=x"[..], &b"6,2,0,-;b"[..]]);
        assert_eq!(used, 33);
        let (recs, used) = split_records(b"6,1,0,-;a\n");
        assert!(recs.is_empty(), "a continuation may still follow");
        assert_eq!(used, 0);
    }

    #[test]
    fn sequence_gaps_count_exactly_the_records_skipped() {
        let mut t = SeqTracker::default();
        assert_eq!(t.read(100), 0, "the first record read");
        assert_eq!(t.read(101), 0);
        assert_eq!(t.read(150), 48, "102..=149 overwritten");
        assert_eq!(t.read(151), 0);
        assert!(t.seen(151) && !t.seen(152));
        let mut resumed = SeqTracker::expecting(10);
        assert!(resumed.seen(9));
        assert_eq!(resumed.read(13), 3, "10, 11, 12 overwritten while down");
        assert_eq!(t.read(5), 0, "a sequence that went back counts nothing");
        assert_eq!(t.read(6), 0);
    }
}
