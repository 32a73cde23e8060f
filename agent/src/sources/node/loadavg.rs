//! node_exporter's `loadavg` collector (`collector/loadavg_linux.go`): `<proc>/loadavg`.

use std::path::Path;

use procfs::FromRead;
use uctel_protocol::payload::Metric;

use super::{parse_error, HostError};
use crate::sources::metric::gauge;

/// `f32` load averages printed back in their shortest form, so `0.52` is exported as 0.52
/// rather than 0.5199999809.
fn f32_to_f64_exact(v: f32) -> f64 {
    v.to_string().parse::<f64>().unwrap_or(f64::from(v))
}

pub(super) fn loadavg(proc: &Path, out: &mut Vec<Metric>) -> Result<(), HostError> {
    let path = proc.join("loadavg");
    let load = procfs::LoadAverage::from_file(&path).map_err(parse_error(&path))?;
    out.push(gauge(
        "node_load1",
        "1m load average.",
        &[],
        f32_to_f64_exact(load.one),
    ));
    out.push(gauge(
        "node_load5",
        "5m load average.",
        &[],
        f32_to_f64_exact(load.five),
    ));
    out.push(gauge(
        "node_load15",
        "15m load average.",
        &[],
        f32_to_f64_exact(load.fifteen),
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_average_keeps_printed_precision() {
        assert_eq!(f32_to_f64_exact(0.52), 0.52);
        assert_eq!(f32_to_f64_exact(12.5), 12.5);
    }
}
