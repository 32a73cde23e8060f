//! A line's own time: the formats the line may start with, and JSON time values (sans-IO: the
//! read time is passed in, it infers the RFC 3164 year).

use chrono::{
    DateTime, Datelike, FixedOffset, Local, LocalResult, NaiveDate, NaiveDateTime, NaiveTime,
    Offset, TimeZone, Utc,
};

/// The zone of line times that name none (`sources.logs[].parse.timezone`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Zone {
    /// The agent's local zone (chrono's `Local`: `TZ`, else `/etc/localtime`).
    Local,
    /// A fixed offset from UTC (`UTC` is `+00:00`).
    Fixed(FixedOffset),
}

impl Zone {
    /// Parses `local`, `UTC` (or `Z`), or `±HH:MM` (also `±HHMM`, `±HH`).
    ///
    /// # Errors
    /// A text saying what is accepted, for any other value.
    pub fn parse(s: &str) -> Result<Zone, String> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("local") {
            return Ok(Zone::Local);
        }
        if t.eq_ignore_ascii_case("utc") || t == "Z" {
            return Ok(Zone::Fixed(Utc.fix()));
        }
        let bad = || format!("{s:?}: expected local, UTC or an offset like +02:00");
        let (sign, rest) = match t.as_bytes().first() {
            Some(b'+') => (1, t.get(1..).unwrap_or("")),
            Some(b'-') => (-1, t.get(1..).unwrap_or("")),
            _ => return Err(bad()),
        };
        let digits: String = rest.chars().filter(|c| *c != ':').collect();
        if !(digits.len() == 2 || digits.len() == 4) || !digits.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(bad());
        }
        let h: i32 = digits
            .get(..2)
            .and_then(|d| d.parse().ok())
            .ok_or_else(bad)?;
        let m: i32 = digits
            .get(2..)
            .map_or(Ok(0), str::parse)
            .map_err(|_| bad())?;
        if h > 23 || m > 59 {
            return Err(bad());
        }
        FixedOffset::east_opt(sign * (h * 3600 + m * 60))
            .map(Zone::Fixed)
            .ok_or_else(bad)
    }

    /// `naive` as a time in this zone, ns since the Unix epoch; the earlier of two
    /// (a repeated hour at a DST change), `None` for a time that does not exist in it.
    fn resolve(self, naive: NaiveDateTime) -> Option<u64> {
        let utc = match self {
            Zone::Local => earliest(Local.from_local_datetime(&naive))?.naive_utc(),
            Zone::Fixed(off) => earliest(off.from_local_datetime(&naive))?.naive_utc(),
        };
        unix_ns(utc.and_utc())
    }

    /// The calendar date of `ns` (since the epoch) in this zone.
    fn date_of(self, ns: u64) -> Option<NaiveDate> {
        let utc = DateTime::<Utc>::from_timestamp_nanos(i64::try_from(ns).ok()?);
        Some(match self {
            Zone::Local => utc.with_timezone(&Local).date_naive(),
            Zone::Fixed(off) => utc.with_timezone(&off).date_naive(),
        })
    }
}

fn earliest<T: TimeZone>(r: LocalResult<DateTime<T>>) -> Option<DateTime<T>> {
    match r {
        LocalResult::Single(t) => Some(t),
        LocalResult::Ambiguous(a, _) => Some(a),
        LocalResult::None => None,
    }
}

/// Ns since the Unix epoch; `None` before 1970 or past 2262 (`i64` ns).
fn unix_ns<T: TimeZone>(t: DateTime<T>) -> Option<u64> {
    u64::try_from(t.timestamp_nanos_opt()?).ok()
}

/// Finds a line's own time at its start. `format` (a chrono `strftime` format) is tried
/// first, then RFC 5424 (`<PRI>VERSION TIMESTAMP`, RFC 5424 §6.2), RFC 3339 (§5.6, also with a
/// space for `T`, a `,` before the fraction, or no offset: then in `zone`), and RFC 3164
/// (`Mmm dd hh:mm:ss`, RFC 3164 §4.1.2, after an optional `<PRI>`; the year is the one of
/// `read_ns` in `zone`, or the year before when that would put the line more than a day after
/// its read time, as at New Year). Returns ns since the Unix epoch, `None` when no format
/// matches or the time is before 1970 or after 2262.
pub fn from_line(line: &str, format: Option<&str>, zone: Zone, read_ns: u64) -> Option<u64> {
    if let Some(f) = format {
        if let Some(t) = with_format(line, f, zone) {
            return Some(t);
        }
    }
    let after_pri = strip_pri(line);
    if after_pri.len() < line.len() {
        // RFC 5424: "<PRI>1 " then the timestamp, or "-" for none.
        if let Some(rest) = after_pri.strip_prefix("1 ") {
            return rfc3339_prefix(rest, zone);
        }
    }
    rfc3339_prefix(after_pri, zone).or_else(|| rfc3164_prefix(after_pri, zone, read_ns))
}

/// A JSON time value: RFC 3339 text (or `format`), or a Unix time in seconds (a fraction
/// allowed), milliseconds, microseconds or nanoseconds, told apart by magnitude (below
/// 1e11: seconds, 1e14: ms, 1e17: µs, else ns).
pub fn from_json(v: &serde_json::Value, format: Option<&str>, zone: Zone) -> Option<u64> {
    match v {
        serde_json::Value::String(s) => format
            .and_then(|f| with_format(s, f, zone))
            .or_else(|| rfc3339_prefix(s, zone)),
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_u64() {
                return Some(match i {
                    i if i < 100_000_000_000 => i.checked_mul(1_000_000_000)?,
                    i if i < 100_000_000_000_000 => i.checked_mul(1_000_000)?,
                    i if i < 100_000_000_000_000_000 => i.checked_mul(1_000)?,
                    i => i,
                });
            }
            let f = n.as_f64()?;
            // Seconds with a fraction; the range check keeps the cast exact enough and in u64.
            (f.is_finite() && (0.0..1e11).contains(&f)).then_some((f * 1e9) as u64)
        }
        _ => None,
    }
}

/// `line` after a syslog `<PRI>` (1 to 3 digits, RFC 5424 §6.2.1), or `line` itself.
fn strip_pri(line: &str) -> &str {
    let Some(rest) = line.strip_prefix('<') else {
        return line;
    };
    match rest.find('>') {
        Some(end @ 1..=3)
            if rest
                .get(..end)
                .is_some_and(|d| d.bytes().all(|b| b.is_ascii_digit())) =>
        {
            rest.get(end + 1..).unwrap_or("")
        }
        _ => line,
    }
}

/// An RFC 3339 date-time at the start of `s`: `YYYY-MM-DD` then `T` or a space, then
/// `hh:mm:ss`, an optional fraction (`.` or `,`), an optional `Z` or `±hh:mm`.
fn rfc3339_prefix(s: &str, zone: Zone) -> Option<u64> {
    let b = s.as_bytes();
    let date = NaiveDate::parse_from_str(s.get(..10)?, "%Y-%m-%d").ok()?;
    if !matches!(b.get(10), Some(b'T' | b't' | b' ')) {
        return None;
    }
    let time = s.get(11..19)?;
    let time = NaiveTime::parse_from_str(time, "%H:%M:%S").ok()?;
    let mut i = 19;
    let mut nanos: u64 = 0;
    if matches!(b.get(i), Some(b'.' | b',')) {
        i += 1;
        let mut digits = 0;
        while let Some(d) = b.get(i).filter(|d| d.is_ascii_digit()) {
            if digits < 9 {
                nanos = nanos * 10 + u64::from(d - b'0');
            }
            digits += 1;
            i += 1;
        }
        if digits == 0 {
            return None;
        }
        nanos *= 10u64.pow(9u32.saturating_sub(digits));
    }
    let naive = date.and_time(time);
    let base = match b.get(i) {
        Some(b'Z' | b'z') => unix_ns(naive.and_utc())?,
        Some(b'+' | b'-') => {
            let off = Zone::parse(s.get(i..i + 6)?).ok()?;
            match off {
                Zone::Fixed(off) => unix_ns(off.from_local_datetime(&naive).single()?)?,
                Zone::Local => return None,
            }
        }
        _ => zone.resolve(naive)?,
    };
    base.checked_add(nanos)
}

/// RFC 3164's `Mmm dd hh:mm:ss` (the day space-padded) at the start of `s`.
fn rfc3164_prefix(s: &str, zone: Zone, read_ns: u64) -> Option<u64> {
    let head = s.get(..15)?;
    if s.as_bytes().get(15).is_some_and(|b| *b != b' ') {
        return None;
    }
    let today = zone.date_of(read_ns)?;
    for year in [today.year(), today.year() - 1] {
        let text = format!("{year} {head}");
        let naive = NaiveDateTime::parse_from_str(&text, "%Y %b %e %H:%M:%S").ok()?;
        let t = zone.resolve(naive)?;
        if t <= read_ns.saturating_add(86_400_000_000_000) {
            return Some(t);
        }
    }
    None
}

/// `format` at the start of `s`: with a zone if the format has one, else in `zone`.
fn with_format(s: &str, format: &str, zone: Zone) -> Option<u64> {
    if let Ok((t, _)) = DateTime::parse_and_remainder(s, format) {
        return unix_ns(t);
    }
    let (naive, _) = NaiveDateTime::parse_and_remainder(s, format).ok()?;
    zone.resolve(naive)
}

#[cfg(test)]
mod tests {
    use super::*;

    const UTC: Zone = Zone::Fixed(match FixedOffset::east_opt(0) {
        Some(z) => z,
        None => panic!(),
    });

    fn ns(s: &str) -> u64 {
        unix_ns(DateTime::parse_from_rfc3339(s).unwrap_or_else(|e| panic!("{s}: {e}"))).unwrap_or(0)
    }

    #[test]
    fn rfc3339_prefixes() {
        let want = ns("2026-12-07T01:02:03.123456789Z");
        for line in [
            "2026-12-07T01:02:03.123456789Z INFO started",
            "2026-12-07 01:02:03.123456789Z started",
            "2026-12-07T03:02:03.123456789+02:00 x",
            "2026-12-07T01:02:03.1234567891234Z",
        ] {
            assert_eq!(from_line(line, None, UTC, 0), Some(want), "{line}");
        }
        // No offset: in the configured zone. Python logging's comma.
        let plus2 = Zone::parse("+02:00").unwrap_or(UTC);
        assert_eq!(
            from_line("2026-12-07 03:02:03,500 ERROR x", None, plus2, 0),
            Some(ns("2026-12-07T01:02:03.5Z"))
        );
        for bad in [
            "2026-13-07T01:02:03Z",
            "2026-12-07X01:02:03Z",
            "2026-12-07T01:02",
            "x",
        ] {
            assert_eq!(from_line(bad, None, UTC, 0), None, "{bad}");
        }
    }

    #[test]
    fn syslog_headers() {
        let read = ns("2026-12-07T05:00:00Z");
        assert_eq!(
            from_line(
                "<34>1 2026-12-07T01:02:03.5Z host app - - - msg",
                None,
                UTC,
                read
            ),
            Some(ns("2026-12-07T01:02:03.5Z"))
        );
        assert_eq!(
            from_line("<34>1 - host app - - - msg", None, UTC, read),
            None
        );
        assert_eq!(
            from_line("<13>Dec  7 01:02:03 host app: x", None, UTC, read),
            Some(ns("2026-12-07T01:02:03Z"))
        );
        assert_eq!(
            from_line("Dec 17 01:02:03 host", None, UTC, read),
            Some(ns("2025-12-17T01:02:03Z")),
            "ten days ahead of the read time: last year"
        );
        // Read on 1 January: a December line is from the year before.
        let jan = ns("2027-01-01T00:00:10Z");
        assert_eq!(
            from_line("Dec 31 23:59:59 h", None, UTC, jan),
            Some(ns("2026-12-31T23:59:59Z"))
        );
        let minus5 = Zone::parse("-05:00").unwrap_or(UTC);
        assert_eq!(
            from_line("Dec  7 01:02:03 h", None, minus5, read),
            Some(ns("2026-12-07T06:02:03Z"))
        );
    }

    #[test]
    fn configured_format() {
        let f = Some("[%d/%b/%Y:%H:%M:%S %z]");
        assert_eq!(
            from_line("[07/Dec/2026:02:02:03 +0100] \"GET /\"", f, UTC, 0),
            Some(ns("2026-12-07T01:02:03Z"))
        );
        // Without a zone in the format: the configured zone.
        assert_eq!(
            from_line("07.12.2026 01:02:03 x", Some("%d.%m.%Y %H:%M:%S"), UTC, 0),
            Some(ns("2026-12-07T01:02:03Z"))
        );
    }

    #[test]
    fn json_values() {
        use serde_json::json;
        let want = ns("2026-12-07T01:02:03Z");
        let s = want / 1_000_000_000;
        for v in [
            json!("2026-12-07T01:02:03Z"),
            json!(s),
            json!(s * 1000),
            json!(s * 1_000_000),
            json!(want),
            json!(s as f64),
        ] {
            assert_eq!(from_json(&v, None, UTC), Some(want), "{v}");
        }
        assert_eq!(from_json(&json!(-1), None, UTC), None);
        assert_eq!(from_json(&json!(true), None, UTC), None);
    }

    #[test]
    fn zones() {
        assert_eq!(Zone::parse("local"), Ok(Zone::Local));
        assert_eq!(Zone::parse("UTC"), Ok(UTC));
        assert!(Zone::parse("+0530").is_ok());
        for bad in ["", "+25:00", "Europe/Paris", "+1", "+12:60"] {
            assert!(Zone::parse(bad).is_err(), "{bad}");
        }
    }
}
