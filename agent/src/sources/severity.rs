//! Severity of a log line, read from where the line itself says it ([`detect`]).
//!
//! Pure and bounded: one pass over at most the first [`KEY_WINDOW`] bytes, except JSON
//! objects, which are parsed whole (a line is at most `max_line_bytes`). Never panics, on any
//! bytes. Conservative: a line that does not say its severity in one of the forms below is
//! [`Severity::Unspecified`]; a word in the middle of a message never counts.
//!
//! Forms, tried in this order; the first that applies decides:
//!
//! 1. **Syslog `<PRI>` prefix** (RFC 5424 §6.2.1, RFC 3164 §4.1.1): `<` 1–3 digits without a
//!    leading zero (PRI ≤ 191) `>` at the very start; severity = `PRI & 7`. 0–2 (emergency,
//!    alert, critical) → fatal, 3 → error, 4 → warn, 5–6 (notice, informational) → info,
//!    7 → debug.
//! 2. **JSON object** (the line starts with `{` after blanks): a top-level `level`,
//!    `severity`, `lvl`, `levelname` or `log.level` member (the first one with a known value
//!    wins) whose value is a level name (below, any case) or one of bunyan's and pino's
//!    numbers (10 trace, 20 debug, 30 info, 40 warn, 50 error, 60 fatal). A line that starts
//!    with `{` but is not valid JSON (cut at `max_line_bytes`) is searched for such a member
//!    as text, `"level":"warn"`. JSON lines are never searched for bare words: those are
//!    inside values.
//! 3. **klog / glog header** (Kubernetes components): `Lmmdd hh:mm:ss` at the start, `L` one
//!    of `I`, `W`, `E`, `F`.
//! 4. **A `level=`, `lvl=` or `severity=` key** (logfmt, logrus text) in the first
//!    [`KEY_WINDOW`] bytes, not part of a longer key, with a level name as its value,
//!    optionally quoted: `level=warn`, `lvl="ERROR"`.
//! 5. **A level word** starting in the first [`WORD_WINDOW`] bytes: `TRACE`, `DEBUG`, `INFO`,
//!    `WARN`, `WARNING`, `ERROR`, `FATAL`, `CRITICAL` in upper case only, as a whole token
//!    (bounded by bytes other than ASCII letters, digits and `_`; ANSI colour sequences count
//!    as boundaries), or a lower-case name in brackets, `[error]` (nginx, Apache). The first
//!    such token wins.
//!
//! Level names (forms 2, 4 and brackets; any case): `trace`; `debug`; `info`,
//! `information`, `informational`, `notice`; `warn`, `warning`; `error`, `err`, `severe`;
//! `fatal`, `critical`, `crit`, `panic`, `dpanic`, `alert`, `emerg`, `emergency`. `critical`
//! is fatal as in Python's `logging` (where `FATAL` is an alias of `CRITICAL`).

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use uctel_protocol::payload::Severity;

/// Level words (form 5) count only when they start in this many first bytes of the line.
pub const WORD_WINDOW: usize = 64;
/// `level=` keys (form 4) and JSON members searched as text count only in this many first
/// bytes: such keys often follow a timestamp (`time="2006-01-02T15:04:05.999999999Z"`).
pub const KEY_WINDOW: usize = 128;

/// The severity `line` states (see the module docs for the forms); `Unspecified` when it
/// states none. `line` is the line's bytes without its `\n`, in any encoding.
pub fn detect(line: &[u8]) -> Severity {
    if let Some(s) = syslog_pri(line) {
        return s;
    }
    let trimmed = trim_start(line);
    if trimmed.first() == Some(&b'{') {
        return json(trimmed)
            .or_else(|| json_text(trimmed))
            .unwrap_or(Severity::Unspecified);
    }
    klog(line)
        .or_else(|| key_value(line))
        .or_else(|| word(line))
        .unwrap_or(Severity::Unspecified)
}

fn trim_start(line: &[u8]) -> &[u8] {
    let n = line
        .iter()
        .take_while(|b| matches!(b, b' ' | b'\t'))
        .count();
    line.get(n..).unwrap_or_default()
}

/// A level name (any ASCII case) → severity.
pub fn name(s: &[u8]) -> Option<Severity> {
    if s.is_empty() || s.len() > 13 {
        return None;
    }
    let mut buf = [0u8; 13];
    let lower = buf.get_mut(..s.len())?;
    lower.copy_from_slice(s);
    lower.make_ascii_lowercase();
    Some(match &*lower {
        b"trace" => Severity::Trace,
        b"debug" => Severity::Debug,
        b"info" | b"information" | b"informational" | b"notice" => Severity::Info,
        b"warn" | b"warning" => Severity::Warn,
        b"error" | b"err" | b"severe" => Severity::Error,
        b"fatal" | b"critical" | b"crit" | b"panic" | b"dpanic" | b"alert" | b"emerg"
        | b"emergency" => Severity::Fatal,
        _ => return None,
    })
}

/// RFC 5424 / RFC 3164 `<PRI>`: severity is the low three bits.
fn syslog_pri(line: &[u8]) -> Option<Severity> {
    let rest = line.strip_prefix(b"<")?;
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if !(1..=3).contains(&digits) || rest.get(digits) != Some(&b'>') {
        return None;
    }
    let d = rest.get(..digits)?;
    if digits > 1 && d.first() == Some(&b'0') {
        return None;
    }
    let pri = d.iter().fold(0u32, |acc, b| acc * 10 + u32::from(b - b'0'));
    if pri > 191 {
        return None;
    }
    Some(match pri & 7 {
        0..=2 => Severity::Fatal,
        3 => Severity::Error,
        4 => Severity::Warn,
        5 | 6 => Severity::Info,
        _ => Severity::Debug,
    })
}

const JSON_KEYS: [&str; 5] = ["level", "severity", "lvl", "levelname", "log.level"];

/// A JSON object's top-level level member; `Some(Unspecified)` for a valid object without
/// one, `None` when `line` is not one valid JSON object.
fn json(line: &[u8]) -> Option<Severity> {
    let mut de = serde_json::Deserializer::from_slice(line);
    let found = Deserializer::deserialize_map(&mut de, ObjectLevel).ok()?;
    de.end().ok()?;
    Some(found.unwrap_or(Severity::Unspecified))
}

/// Walks the top-level members, keeping the first level member with a known value.
struct ObjectLevel;

impl<'de> Visitor<'de> for ObjectLevel {
    type Value = Option<Severity>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        while let Some(is_level) = map.next_key_seed(LevelKey)? {
            if is_level && found.is_none() {
                found = map.next_value_seed(LevelValue)?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }
}

/// Whether a member's key is one of [`JSON_KEYS`] (without allocating).
struct LevelKey;

impl<'de> DeserializeSeed<'de> for LevelKey {
    type Value = bool;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for LevelKey {
    type Value = bool;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<bool, E> {
        Ok(JSON_KEYS.contains(&v))
    }
}

/// A level member's value: a name, or a bunyan/pino number; anything else is skipped.
struct LevelValue;

impl<'de> DeserializeSeed<'de> for LevelValue {
    type Value = Option<Severity>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for LevelValue {
    type Value = Option<Severity>;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a level")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(name(v.trim().as_bytes()))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(match v {
            10 => Some(Severity::Trace),
            20 => Some(Severity::Debug),
            30 => Some(Severity::Info),
            40 => Some(Severity::Warn),
            50 => Some(Severity::Error),
            60 => Some(Severity::Fatal),
            _ => None,
        })
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        u64::try_from(v).map_or(Ok(None), |v| self.visit_u64(v))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(None)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }
}

/// `"level": "warn"` (a [`JSON_KEYS`] member with a string value) found as text in the
/// first [`KEY_WINDOW`] bytes of a line that is not valid JSON (cut short).
fn json_text(line: &[u8]) -> Option<Severity> {
    let window = line.get(..line.len().min(KEY_WINDOW))?;
    let mut i = 0;
    while let Some(off) = find_byte(window.get(i..)?, b'"') {
        let start = i + off + 1;
        let len = find_byte(window.get(start..)?, b'"')?;
        let end = start + len;
        let key = window.get(start..end)?;
        let escaped = start >= 2 && window.get(start - 2) == Some(&b'\\');
        if !escaped && JSON_KEYS.iter().any(|k| k.as_bytes() == key) {
            let rest = trim_blank(window.get(end + 1..)?);
            if let Some(rest) = rest.strip_prefix(b":") {
                if let Some(value) = trim_blank(rest).strip_prefix(b"\"") {
                    let n = value.iter().position(|&b| b == b'"')?;
                    if let Some(s) = name(value.get(..n)?) {
                        return Some(s);
                    }
                }
            }
        }
        i = end + 1;
    }
    None
}

fn trim_blank(s: &[u8]) -> &[u8] {
    let n = s.iter().take_while(|b| matches!(b, b' ' | b'\t')).count();
    s.get(n..).unwrap_or_default()
}

/// klog/glog: `Lmmdd hh:mm:ss...` (`I0102 15:04:05.123456 ...`).
fn klog(line: &[u8]) -> Option<Severity> {
    let head = line.get(..14)?;
    let digit = |i: usize| head.get(i).is_some_and(u8::is_ascii_digit);
    let shape = (1..=4).all(digit)
        && head.get(5) == Some(&b' ')
        && digit(6)
        && digit(7)
        && head.get(8) == Some(&b':')
        && digit(9)
        && digit(10)
        && head.get(11) == Some(&b':')
        && digit(12)
        && digit(13);
    if !shape {
        return None;
    }
    match head.first() {
        Some(b'I') => Some(Severity::Info),
        Some(b'W') => Some(Severity::Warn),
        Some(b'E') => Some(Severity::Error),
        Some(b'F') => Some(Severity::Fatal),
        _ => None,
    }
}

/// Bytes that can be part of a key or word: ASCII letters, digits and `_`.
static WORDISH: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = c.is_ascii_alphanumeric() || c == b'_';
        b += 1;
    }
    t
};

fn wordish(b: u8) -> bool {
    WORDISH[usize::from(b)]
}

/// The first position of `needle` in `hay`, eight bytes at a time (the "has zero byte" test
/// on `word ^ needle×8`: the lowest flagged byte is always a real match).
fn find_byte(hay: &[u8], needle: u8) -> Option<usize> {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    let pattern = LO.wrapping_mul(u64::from(needle));
    let mut chunks = hay.chunks_exact(8);
    let mut base = 0;
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let x = u64::from_le_bytes(word) ^ pattern;
        let found = x.wrapping_sub(LO) & !x & HI;
        if found != 0 {
            return Some(base + (found.trailing_zeros() / 8) as usize);
        }
        base += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&b| b == needle)
        .map(|p| base + p)
}

/// `level=warn`, `lvl="ERROR"`, `severity=info` in the first [`KEY_WINDOW`] bytes.
fn key_value(line: &[u8]) -> Option<Severity> {
    let window = line.get(..line.len().min(KEY_WINDOW))?;
    let mut from = 0;
    while let Some(off) = find_byte(window.get(from..)?, b'=') {
        let eq = from + off;
        from = eq + 1;
        let before = window.get(..eq)?;
        let key_len = before.iter().rev().take_while(|&&b| wordish(b)).count();
        let key_start = eq - key_len;
        let key = before.get(key_start..)?;
        if !matches!(key, b"level" | b"lvl" | b"severity") {
            continue;
        }
        // Not the tail of a longer dotted or dashed key (`log.level=`, `x-level=`).
        if key_start > 0 && matches!(before.get(key_start - 1), Some(b'.' | b'-')) {
            continue;
        }
        let mut value = line.get(eq + 1..)?;
        if let Some(v) = value
            .strip_prefix(b"\"")
            .or_else(|| value.strip_prefix(b"'"))
        {
            value = v;
        }
        let len = value.iter().take_while(|b| b.is_ascii_alphabetic()).count();
        if value.get(len).is_some_and(|&b| wordish(b)) {
            continue;
        }
        if let Some(s) = name(value.get(..len)?) {
            return Some(s);
        }
    }
    None
}

/// The first upper-case level word, or lower-case `[name]`, starting in the first
/// [`WORD_WINDOW`] bytes.
fn word(line: &[u8]) -> Option<Severity> {
    let mut i = 0;
    while i < line.len().min(WORD_WINDOW) {
        let b = *line.get(i)?;
        if b == 0x1b && line.get(i + 1) == Some(&b'[') {
            i = skip_csi(line, i + 2);
            continue;
        }
        if !wordish(b) {
            i += 1;
            continue;
        }
        let len = line.get(i..)?.iter().take_while(|&&b| wordish(b)).count();
        let token = line.get(i..i + len)?;
        let bracketed = i > 0 && line.get(i - 1) == Some(&b'[');
        if !bracketed && !matches!(b, b'T' | b'D' | b'I' | b'W' | b'E' | b'F' | b'C') {
            i += len;
            continue;
        }
        let found = match token {
            b"TRACE" => Some(Severity::Trace),
            b"DEBUG" => Some(Severity::Debug),
            b"INFO" => Some(Severity::Info),
            b"WARN" | b"WARNING" => Some(Severity::Warn),
            b"ERROR" => Some(Severity::Error),
            b"FATAL" | b"CRITICAL" => Some(Severity::Fatal),
            _ if bracketed
                && line.get(i + len) == Some(&b']')
                && token.iter().all(u8::is_ascii_lowercase) =>
            {
                name(token)
            }
            _ => None,
        };
        if found.is_some() {
            return found;
        }
        i += len;
    }
    None
}

/// Past an ECMA-48 CSI sequence whose parameters start at `i` (after `ESC [`): parameter
/// bytes 0x30–0x3F, intermediate bytes 0x20–0x2F, one final byte 0x40–0x7E.
fn skip_csi(line: &[u8], mut i: usize) -> usize {
    while line.get(i).is_some_and(|b| (0x20..=0x3f).contains(b)) {
        i += 1;
    }
    if line.get(i).is_some_and(|b| (0x40..=0x7e).contains(b)) {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use Severity::{Debug, Error, Fatal, Info, Trace, Unspecified, Warn};

    fn d(line: &str) -> Severity {
        detect(line.as_bytes())
    }

    #[test]
    fn syslog_pri() {
        for (line, want) in [
            ("<0>Oct 11 22:14:15 host kernel: panic", Fatal),
            ("<1>x", Fatal),
            ("<2>x", Fatal),
            ("<3>x", Error),
            ("<4>x", Warn),
            ("<5>x", Info),
            ("<6>x", Info),
            ("<7>x", Debug),
            ("<34>Oct 11 22:14:15 mymachine su: 'su root' failed", Fatal), // 4*8+2
            (
                "<165>1 2003-08-24T05:14:15.000003-07:00 host app - ID47 - msg",
                Info,
            ), // 20*8+5
            ("<191>x", Debug),
            ("<11>1 - - - - - INFO but PRI says error", Error),
        ] {
            assert_eq!(d(line), want, "{line}");
        }
        // Not a PRI: out of range, leading zero, too many digits, not at the start, no `>`.
        for line in ["<192>x", "<07>x", "<0003>x", " <3>x", "<3x", "<>x", "<-1>x"] {
            assert_eq!(d(line), Unspecified, "{line}");
        }
        // A bad PRI does not hide a level word later on.
        assert_eq!(d("<999> ERROR boom"), Error);
    }

    #[test]
    fn json_members() {
        for (line, want) in [
            (r#"{"level":"info","msg":"started"}"#, Info),
            (r#"{"ts":1.5,"level":"WARN","msg":"x"}"#, Warn),
            (r#"{"severity":"ERROR","message":"x"}"#, Error), // Google Cloud
            (r#"{"severity":"CRITICAL"}"#, Fatal),
            (r#"{"lvl":"dbug"}"#, Unspecified),
            (r#"{"lvl":"debug"}"#, Debug),
            (r#"{"levelname": "WARNING", "name": "app"}"#, Warn), // python-json-logger
            (r#"{"@timestamp":"x","log.level":"error"}"#, Error), // ECS
            (r#"{"level":30,"msg":"bunyan"}"#, Info),
            (r#"{"level":60}"#, Fatal),
            (r#"{"level":10}"#, Trace),
            (r#"{"level":35}"#, Unspecified),
            (r#"{"level":-1}"#, Unspecified),
            (r#"  {"level":"fatal"}  "#, Fatal),
            (r#"{"level":"Warning\t"}"#, Warn),
            // First level member with a known value wins; nested ones do not count.
            (r#"{"level":"x","severity":"error"}"#, Error),
            (r#"{"level":"info","severity":"error"}"#, Info),
            (r#"{"ctx":{"level":"error"},"msg":"ERROR x"}"#, Unspecified),
            (r#"{"level":{"name":"error"}}"#, Unspecified),
            (r#"{"level":["error"]}"#, Unspecified),
            (r#"{"level":null,"lvl":"warn"}"#, Warn),
            (r#"{"lev\u0065l":"error"}"#, Error), // escaped key
            // A JSON line's words are values: never matched.
            (r#"{"msg":"ERROR: disk full"}"#, Unspecified),
            ("{}", Unspecified),
        ] {
            assert_eq!(d(line), want, "{line}");
        }
    }

    #[test]
    fn json_cut_short_is_searched_as_text() {
        for (line, want) in [
            (
                r#"{"time":"2024-01-01T00:00:00Z","level":"error","msg":"very lo"#,
                Error,
            ),
            (r#"{"level" : "warn", "msg": "x"#, Warn),
            (r#"{"msg":"say \"level\":\"error\" later","#, Unspecified),
            (r#"{"msg":"ERROR everywhere ERROR"#, Unspecified),
            (r#"{"level":"#, Unspecified),
            ("{", Unspecified),
            ("{main} ERROR", Unspecified),
        ] {
            assert_eq!(d(line), want, "{line}");
        }
    }

    #[test]
    fn klog_headers() {
        for (line, want) in [
            ("I0102 15:04:05.123456    1234 main.go:42] started", Info),
            ("W1231 23:59:59.000000 1 x.go:1] careful", Warn),
            ("E0102 15:04:05.123456 1 x.go:1] failed", Error),
            ("F0102 15:04:05.123456 1 x.go:1] dying", Fatal),
            ("X0102 15:04:05.123456 1 x.go:1] ?", Unspecified),
            ("I0102 15:04 short", Unspecified),
            ("Iabcd 15:04:05 nope", Unspecified),
        ] {
            assert_eq!(d(line), want, "{line}");
        }
    }

    #[test]
    fn level_keys() {
        for (line, want) in [
            (
                r#"time="2024-01-01T00:00:00Z" level=info msg="started""#,
                Info,
            ),
            (
                r#"time="2006-01-02T15:04:05.999999999-07:00" level=warning msg=x"#,
                Warn,
            ),
            ("ts=1 lvl=error caller=x.go:1 msg=boom", Error),
            (r#"lvl="DEBUG" msg=x"#, Debug),
            ("level='crit' x", Fatal),
            ("severity=notice x", Info),
            ("level=trace", Trace),
            // Not a level: a longer key, an unknown or longer value.
            ("loglevel=error msg=x", Unspecified),
            ("log.level=error msg=x", Unspecified),
            ("my_level=error msg=x", Unspecified),
            ("level=errors happen", Unspecified),
            ("level=error2 x", Unspecified),
            ("level=5 x", Unspecified),
            // An unknown level= value does not stop the search.
            ("level=x lvl=warn", Warn),
        ] {
            assert_eq!(d(line), want, "{line}");
        }
        let far = format!("{} level=error", "x".repeat(KEY_WINDOW));
        assert_eq!(d(&far), Unspecified, "beyond the key window");
        let near = format!("{} level=error", "x".repeat(KEY_WINDOW - 20));
        assert_eq!(d(&near), Error);
    }

    #[test]
    fn level_words() {
        for (line, want) in [
            (
                "2024-01-01 00:00:00,123 ERROR [main] com.x.Y - failed",
                Error,
            ),
            (
                "2024-01-01T00:00:00.000Z  WARN uctel_agent::run: slow",
                Warn,
            ),
            ("[2024-01-01 00:00:00] INFO: started", Info),
            ("DEBUG:root:hello", Debug), // Python's basicConfig format
            ("CRITICAL:root:gone", Fatal),
            ("12:00:00 [FATAL] out of memory", Fatal),
            ("TRACE x", Trace),
            ("WARNING: deprecated", Warn),
            // The first level word wins.
            ("INFO request failed with ERROR 500", Info),
            // tracing-subscriber with colours.
            (
                "\x1b[2m2024-01-01T00:00:00Z\x1b[0m \x1b[31mERROR\x1b[0m x: y",
                Error,
            ),
            ("\x1b[32m INFO\x1b[0m started", Info),
            // nginx error log, Apache.
            ("2024/01/01 00:00:00 [error] 12#12: *1 open() failed", Error),
            ("2024/01/01 00:00:00 [notice] 1#1: start worker", Info),
            ("[Mon Jan 01 00:00:00 2024] [warn] [client 1.2.3.4] x", Warn),
            // Not a level word: other case, part of a longer token, unknown.
            ("Error: something", Unspecified),
            ("error: something", Unspecified),
            ("ERRORS: 3", Unspecified),
            ("ERROR_CODE=3", Unspecified),
            ("XERROR x", Unspecified),
            ("ERROR2 x", Unspecified),
            ("[Error] x", Unspecified),
            ("[errors] x", Unspecified),
            ("GET /index.html 200", Unspecified),
            ("", Unspecified),
        ] {
            assert_eq!(d(line), want, "{line:?}");
        }
        let late = format!("{} ERROR", "x ".repeat(WORD_WINDOW / 2));
        assert_eq!(d(&late), Unspecified, "starts past the word window");
        let edge = format!("{}ERROR", " ".repeat(WORD_WINDOW - 1));
        assert_eq!(d(&edge), Error, "starts inside the window, ends past it");
    }

    #[test]
    fn find_byte_finds_the_first() {
        for len in 0..40 {
            for at in 0..len {
                let mut hay = vec![b'a'; len];
                hay[at] = b'=';
                if at + 3 < len {
                    hay[at + 3] = b'=';
                }
                assert_eq!(find_byte(&hay, b'='), Some(at), "{len} {at}");
            }
            assert_eq!(find_byte(&vec![b'<'; len], b'='), None);
        }
        // Bytes next to the needle's value (borrows in the zero-byte test) are no match.
        assert_eq!(find_byte(b"<<<<<<<<>>>>>>>>=", b'='), Some(16));
        assert_eq!(find_byte(&[0x3c, 0x3e, 0xbd, 0x3d], b'='), Some(3));
    }

    proptest! {
        #[test]
        fn find_byte_agrees_with_position(hay in proptest::collection::vec(any::<u8>(), 0..100), needle: u8) {
            prop_assert_eq!(find_byte(&hay, needle), hay.iter().position(|&b| b == needle));
        }
    }

    #[test]
    fn names() {
        for (n, want) in [
            ("INFO", Some(Info)),
            ("Informational", Some(Info)),
            ("EMERGENCY", Some(Fatal)),
            ("emergencyx", None),
            ("", None),
            ("a-very-long-level-name", None),
        ] {
            assert_eq!(name(n.as_bytes()), want, "{n}");
        }
    }

    fn any_line() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..300),
            ".{0,200}".prop_map(String::into_bytes),
            // Near misses of every form.
            r#"(<[0-9]{0,4}>?)?\{?("?(level|lvl|severity)"?\s?[=:]\s?"?)?[A-Za-z]{0,10}"?[ -~]{0,80}"#
                .prop_map(String::into_bytes),
            r"[IWEFX][0-9]{0,4} ?[0-9:]{0,9}.{0,20}".prop_map(String::into_bytes),
            r"(\x1b\[[0-9;]{0,5}m?)?\[?[A-Za-z]{0,9}\]?.{0,40}".prop_map(String::into_bytes),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn never_panics_on_arbitrary_bytes(line in any_line()) {
            let s = detect(&line);
            // A result depends only on the line, and is a defined severity.
            prop_assert_eq!(s, detect(&line));
            prop_assert!(Severity::try_from(s as i32).is_ok());
        }

        #[test]
        fn never_panics_on_arbitrary_utf8(line in any::<String>()) {
            let _ = detect(line.as_bytes());
        }

        #[test]
        fn a_known_word_after_the_windows_never_counts(
            prefix in "[a-z ]{130,200}",
            word in "(ERROR|WARN|INFO|DEBUG|TRACE|FATAL|CRITICAL|level=error)",
        ) {
            let line = format!("{prefix} {word}");
            prop_assert_eq!(detect(line.as_bytes()), Unspecified);
        }
    }
}
