//! node_exporter's `nvme` collector (`collector/nvme_linux.go`): the identity of each
//! `<sys>/class/nvme` controller.

use std::path::Path;
use uctel_protocol::payload::Metric;

use super::files::{list_dir, read_trimmed};
use super::NodeError;
use crate::sources::metric::gauge;

/// `nvme`: `<sys>/class/nvme/<device>/{firmware_rev,model,serial,state}` →
/// `node_nvme_info{device,firmware_revision,model,serial,state}` = 1.
pub fn nvme(sys: &Path, out: &mut Vec<Metric>) -> Result<(), NodeError> {
    let class = sys.join("class/nvme");
    for device in list_dir(&class, false)? {
        let dir = class.join(&device);
        let firmware = read_trimmed(&dir.join("firmware_rev"))?;
        let model = read_trimmed(&dir.join("model"))?;
        let serial = read_trimmed(&dir.join("serial"))?;
        let state = read_trimmed(&dir.join("state"))?;
        out.push(gauge(
            "node_nvme_info",
            "Non-numeric data from /sys/class/nvme/<device>, value is always 1.",
            &[
                ("device", &device),
                ("firmware_revision", &firmware),
                ("model", &model),
                ("serial", &serial),
                ("state", &state),
            ],
            1.0,
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{help_of, lines, tree};
    use super::*;

    #[test]
    fn nvme_info_per_controller() {
        let d = tree(&[
            ("class/nvme/nvme0/firmware_rev", "1B2QEXP7\n"),
            (
                "class/nvme/nvme0/model",
                "Samsung SSD 970 PRO 512GB               \n",
            ),
            ("class/nvme/nvme0/serial", "S680HF8N190894I     \n"),
            ("class/nvme/nvme0/state", "live\n"),
        ]);
        let mut out = Vec::new();
        nvme(d.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            lines(&out),
            [
                "node_nvme_info{device=\"nvme0\",firmware_revision=\"1B2QEXP7\",\
              model=\"Samsung SSD 970 PRO 512GB\",serial=\"S680HF8N190894I\",state=\"live\"} \
              gauge 1"
            ]
        );
        assert_eq!(
            help_of(&out, "node_nvme_info"),
            Some("Non-numeric data from /sys/class/nvme/<device>, value is always 1.")
        );
        // No class/nvme: a failure, as node_exporter's "no data".
        assert!(nvme(tree(&[]).path(), &mut Vec::new()).is_err());
        let bad = tree(&[("class/nvme/nvme0/model", "x\n")]);
        assert!(nvme(bad.path(), &mut Vec::new()).is_err());
    }
}
