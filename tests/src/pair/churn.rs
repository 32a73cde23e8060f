//! Series churn for the [`super::Pair`] with the series dictionary on
//! ([`super::PairConfig::dictionary`]): series that appear and vanish, samples whose value
//! names their own series, and an independent reader of `metrics_dict` frames that finds a
//! value referencing a dictionary entry the collector has not acknowledged.
//!
//! A churn sample of series `k` with push index `i` is `pair_churn_<k>{series="<k>"}`, help
//! `series <k>`, a counter for even `k` and a gauge for odd `k`, with the value
//! `±(k · 2^24 + i) + f`: negative for odd `k`, `f` = 0, 0.25 or 1/3 by `k mod 3` (so every
//! operand of the body format is used: unsigned, negative, decimal and f64). The collector's
//! side reads the identity back from the value alone ([`identity`]) and compares it with
//! the name, the label, the help and the type ([`check_sample`]).

use uctel_protocol::borrowed::MetricView;
use uctel_protocol::dict::MAX_DICT_ENTRIES;
use uctel_protocol::frame::{Frame, FrameKind};
use uctel_protocol::payload::{Label, Metric, MetricType};

/// Bits of a churn value below the series number: the push index (at most 2^24 pushes).
pub const INDEX_BITS: u32 = 24;

/// The churn sample of series `k` with push index `i` (module documentation).
pub fn churn_metric(k: u32, i: u64) -> Metric {
    let magnitude = ((u64::from(k) << INDEX_BITS) | (i & ((1 << INDEX_BITS) - 1))) as f64;
    let fraction = [0.0, 0.25, 1.0 / 3.0][(k % 3) as usize];
    let (r#type, value) = if k % 2 == 0 {
        (MetricType::Counter, magnitude + fraction)
    } else {
        (MetricType::Gauge, -(magnitude + fraction))
    };
    Metric {
        name: format!("pair_churn_{k}"),
        help: format!("series {k}"),
        r#type: r#type as i32,
        labels: vec![Label {
            name: "series".into(),
            value: k.to_string(),
        }],
        value,
        timestamp_ms: 0,
        buckets: vec![],
        count: 0,
        sum: 0.0,
    }
}

/// The (series, push index) a churn value encodes.
pub fn identity(value: f64) -> (u64, u64) {
    let magnitude = value.abs().trunc() as u64;
    (magnitude >> INDEX_BITS, magnitude & ((1 << INDEX_BITS) - 1))
}

/// The recording's id of a delivered churn sample (`metrics:<i>`), or why the sample is
/// under a name, label, help or type that is not its own.
///
/// # Errors
/// A description of the mismatch.
pub fn check_sample(m: &MetricView<'_>) -> Result<String, String> {
    let (k, i) = identity(m.value);
    let label = m
        .labels
        .iter()
        .find(|l| l.name == "series")
        .map(|l| l.value);
    let want_type = if k % 2 == 0 {
        MetricType::Counter
    } else {
        MetricType::Gauge
    } as i32;
    let negative = k % 2 == 1;
    let own = m.name.strip_prefix("pair_churn_") == Some(&*k.to_string())
        && label == Some(&*k.to_string())
        && m.help == format!("series {k}")
        && m.r#type == want_type
        && m.labels.len() == 1
        && (m.value < 0.0) == negative
        && m.value.to_bits() == churn_metric(k as u32, i).value.to_bits();
    if own {
        Ok(format!("metrics:{i}"))
    } else {
        Err(format!(
            "value {} (series {k}, push {i}) delivered as {}{{series={label:?}}} help {:?} type {}",
            m.value, m.name, m.help, m.r#type
        ))
    }
}

/// Reads one varint; `None` past the end.
fn varint(b: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for i in 0..10 {
        let x = *b.get(*at)?;
        *at += 1;
        v |= u64::from(x & 0x7f) << (7 * i);
        if x & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

fn skip(b: &[u8], at: &mut usize, n: u64) -> Option<()> {
    *at = at.checked_add(usize::try_from(n).ok()?)?;
    (*at <= b.len()).then_some(())
}

fn skip_str(b: &[u8], at: &mut usize) -> Option<()> {
    let n = varint(b, at)?;
    skip(b, at, n)
}

/// The ids of `body`'s value records in order, each with whether a definition of it came
/// earlier in the same body; `None` for a body this reader cannot follow. Written from the
/// format in `uctel_protocol::dict` (not with its parser), so a bug there is not copied.
pub fn references(body: &[u8]) -> Option<Vec<(u32, bool)>> {
    const OP_HIST: u64 = 3;
    const OP_DEF: u64 = 7;
    let mut at = 1usize; // version
    let mut previous: i64 = -1;
    let mut defined: Vec<u32> = Vec::new();
    let mut out = Vec::new();
    while at < body.len() {
        let key = varint(body, &mut at)?;
        let z = key >> 4;
        let delta = ((z >> 1) as i64) ^ -((z & 1) as i64);
        let id = previous.checked_add(1)?.checked_add(delta)?;
        let id = u32::try_from(id).ok()?;
        previous = i64::from(id);
        let op = key & 7;
        if op == OP_DEF {
            let r#type = varint(body, &mut at)?;
            skip_str(body, &mut at)?; // name
            skip_str(body, &mut at)?; // help
            for _ in 0..varint(body, &mut at)? {
                skip_str(body, &mut at)?;
                skip_str(body, &mut at)?;
            }
            if r#type == MetricType::Histogram as u64 {
                let n = varint(body, &mut at)?;
                skip(body, &mut at, n.checked_mul(8)?)?;
            }
            defined.push(id);
            continue;
        }
        if key & 8 != 0 {
            varint(body, &mut at)?; // timestamp
        }
        match op {
            0 => skip(body, &mut at, 8)?,
            OP_HIST => {
                varint(body, &mut at)?;
                skip(body, &mut at, 8)?;
                for _ in 0..varint(body, &mut at)? {
                    varint(body, &mut at)?;
                }
            }
            _ => {
                varint(body, &mut at)?;
            }
        }
        out.push((id, defined.contains(&id)));
    }
    Some(out)
}

/// Checks a frame the agent posts: a `metrics_dict` frame's every value record references
/// a series defined earlier in the frame or an entry below `acked` (what the collector
/// acknowledged to this agent in this epoch); a frame-local id is always defined in its
/// frame. Other kinds pass.
///
/// # Errors
/// A description of the first reference that breaks the rule.
pub fn check_posted(bytes: &[u8], acked: u32) -> Result<(), String> {
    let Ok(frame) = Frame::new_checked(bytes) else {
        return Err("the agent posted a frame that does not parse".into());
    };
    let header = frame.header();
    if header.kind != FrameKind::MetricsDict {
        return Ok(());
    }
    let Some(refs) = references(frame.payload()) else {
        return Err(format!(
            "metrics_dict frame stream_seq {} has a body this reader cannot follow",
            header.stream_seq
        ));
    };
    for (id, defined) in refs {
        let known = id < MAX_DICT_ENTRIES && id < acked;
        if !defined && !known {
            return Err(format!(
                "metrics_dict frame stream_seq {} references series id {id} without its \
                 definition, and the collector acknowledged only ids below {acked}",
                header.stream_seq
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_churn_value_names_its_series() {
        for (k, i) in [(0u32, 0u64), (1, 5), (2, 77), (3, 1 << 20), (1000, 12_345)] {
            let m = churn_metric(k, i);
            assert_eq!(identity(m.value), (u64::from(k), i), "{m:?}");
        }
    }
}
