//! The udev properties of block devices that node_exporter's `diskstats` collector exports
//! beside the I/O counters: `node_disk_info`, `node_disk_filesystem_info`,
//! `node_disk_device_mapper_info` and the `node_disk_ata_*` gauges.
//!
//! udev keeps a device's properties in `/run/udev/data/b<major>:<minor>`, one `E:KEY=value`
//! line per property (udevadm(8)). Names, labels and the properties read follow node_exporter
//! 1.5's `collector/diskstats_linux.go`.

use std::collections::HashMap;
use std::path::Path;

use uctel_protocol::payload::Metric;

use super::files::read_text;
use crate::sources::metric::gauge;

/// The `E:` properties of `<udev_data>/b<major>:<minor>`; empty when the file cannot be read
/// (no udev on the host, or in a container without `/run/udev`), as node_exporter then
/// exports the info series with empty labels.
pub fn properties(udev_data: &Path, major: i32, minor: i32) -> HashMap<String, String> {
    let path = udev_data.join(format!("b{major}:{minor}"));
    let Ok(text) = read_text(&path) else {
        return HashMap::new();
    };
    text.lines()
        .filter_map(|l| l.strip_prefix("E:"))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// Appends the udev series of block device `device` (`major`:`minor`) from `props`
/// ([`properties`]):
/// - always `node_disk_info{device,major,minor,model,path,revision,serial,wwn}` = 1
///   (`ID_MODEL`, `ID_PATH`, `ID_REVISION`, `ID_SERIAL_SHORT`, `ID_WWN`);
/// - with `ID_FS_TYPE`: `node_disk_filesystem_info{device,type,usage,uuid,version}` = 1;
/// - with `DM_NAME`: `node_disk_device_mapper_info{device,lv_layer,lv_name,name,uuid,vg_name}`
///   = 1;
/// - with `ID_ATA`: `node_disk_ata_write_cache`, `node_disk_ata_write_cache_enabled` and
///   `node_disk_ata_rotation_rate_rpm` (0 for SSDs), each where its property is a number.
pub fn disk_series(
    device: &str,
    major: i32,
    minor: i32,
    props: &HashMap<String, String>,
    out: &mut Vec<Metric>,
) {
    let get = |k: &str| props.get(k).map_or("", String::as_str);
    let (major, minor) = (major.to_string(), minor.to_string());
    out.push(gauge(
        "node_disk_info",
        "Info of /sys/block/<block_device>.",
        &[
            ("device", device),
            ("major", &major),
            ("minor", &minor),
            ("model", get("ID_MODEL")),
            ("path", get("ID_PATH")),
            ("revision", get("ID_REVISION")),
            ("serial", get("ID_SERIAL_SHORT")),
            ("wwn", get("ID_WWN")),
        ],
        1.0,
    ));
    if !get("ID_FS_TYPE").is_empty() {
        out.push(gauge(
            "node_disk_filesystem_info",
            "Info about disk filesystem.",
            &[
                ("device", device),
                ("type", get("ID_FS_TYPE")),
                ("usage", get("ID_FS_USAGE")),
                ("uuid", get("ID_FS_UUID")),
                ("version", get("ID_FS_VERSION")),
            ],
            1.0,
        ));
    }
    if !get("DM_NAME").is_empty() {
        out.push(gauge(
            "node_disk_device_mapper_info",
            "Info about disk device mapper.",
            &[
                ("device", device),
                ("lv_layer", get("DM_LV_LAYER")),
                ("lv_name", get("DM_LV_NAME")),
                ("name", get("DM_NAME")),
                ("uuid", get("DM_UUID")),
                ("vg_name", get("DM_VG_NAME")),
            ],
            1.0,
        ));
    }
    if !get("ID_ATA").is_empty() {
        let ata = [
            (
                "ID_ATA_WRITE_CACHE",
                "node_disk_ata_write_cache",
                "ATA disk has a write cache.",
            ),
            (
                "ID_ATA_WRITE_CACHE_ENABLED",
                "node_disk_ata_write_cache_enabled",
                "ATA disk has its write cache enabled.",
            ),
            (
                "ID_ATA_ROTATION_RATE_RPM",
                "node_disk_ata_rotation_rate_rpm",
                "ATA disk rotation rate in RPMs (0 for SSDs).",
            ),
        ];
        for (key, name, help) in ata {
            if let Some(v) = props.get(key).and_then(|v| v.parse::<f64>().ok()) {
                out.push(gauge(name, help, &[("device", device)], v));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::testutil::{lines, tree};

    #[test]
    fn a_disk_without_udev_data_has_an_info_series_with_empty_labels() {
        let d = tree(&[]);
        let mut out = Vec::new();
        disk_series("vda", 254, 0, &properties(d.path(), 254, 0), &mut out);
        assert_eq!(
            lines(&out),
            [
                "node_disk_info{device=\"vda\",major=\"254\",minor=\"0\",model=\"\",path=\"\",\
              revision=\"\",serial=\"\",wwn=\"\"} gauge 1"
            ]
        );
    }

    #[test]
    fn udev_properties_give_info_filesystem_mapper_and_ata_series() {
        let d = tree(&[(
            "b8:0",
            "S:disk/by-id/ata-X\nE:ID_MODEL=Samsung_SSD\nE:ID_PATH=pci-0000:00:17.0-ata-1\n\
             E:ID_SERIAL_SHORT=S3Z\nE:ID_REVISION=2B6Q\nE:ID_WWN=0x5002538e\nE:ID_ATA=1\n\
             E:ID_ATA_WRITE_CACHE=1\nE:ID_ATA_WRITE_CACHE_ENABLED=1\n\
             E:ID_ATA_ROTATION_RATE_RPM=0\nE:ID_FS_TYPE=LVM2_member\nE:ID_FS_USAGE=raid\n\
             E:ID_FS_UUID=abc\nE:ID_FS_VERSION=LVM2 001\nE:DM_NAME=vg-root\nE:DM_UUID=LVM-x\n\
             E:DM_VG_NAME=vg\nE:DM_LV_NAME=root\nE:BROKEN\n",
        )]);
        let mut out = Vec::new();
        disk_series("sda", 8, 0, &properties(d.path(), 8, 0), &mut out);
        assert_eq!(
            lines(&out),
            [
                "node_disk_info{device=\"sda\",major=\"8\",minor=\"0\",model=\"Samsung_SSD\",\
                 path=\"pci-0000:00:17.0-ata-1\",revision=\"2B6Q\",serial=\"S3Z\",\
                 wwn=\"0x5002538e\"} gauge 1",
                "node_disk_filesystem_info{device=\"sda\",type=\"LVM2_member\",usage=\"raid\",\
                 uuid=\"abc\",version=\"LVM2 001\"} gauge 1",
                "node_disk_device_mapper_info{device=\"sda\",lv_layer=\"\",lv_name=\"root\",\
                 name=\"vg-root\",uuid=\"LVM-x\",vg_name=\"vg\"} gauge 1",
                "node_disk_ata_write_cache{device=\"sda\"} gauge 1",
                "node_disk_ata_write_cache_enabled{device=\"sda\"} gauge 1",
                "node_disk_ata_rotation_rate_rpm{device=\"sda\"} gauge 0",
            ]
        );
    }
}
