//! node_exporter's `mdadm` collector (`collector/mdadm_linux.go` and the `procfs` library's
//! `mdstat.go`): the software RAID arrays of `<proc>/mdstat`.

use std::path::Path;
use std::sync::OnceLock;

use regex::Regex;
use uctel_protocol::payload::Metric;

use super::files::{format_error, read};
use super::NodeError;
use crate::sources::metric::gauge;

/// One array of `/proc/mdstat`.
struct MdArray<'a> {
    name: &'a str,
    state: &'a str,
    active: i64,
    total: i64,
    failed: usize,
    spare: usize,
    blocks: i64,
    synced: i64,
}

/// The second line of an array: (active, required disks, blocks), as the `procfs` library
/// reads it: `raid0` and `linear` count the `[n]` members of the first line, inactive arrays
/// have no disk counts, the others need `[required/active] [U_…]`.
fn md_status(path: &Path, device: &str, status: &str) -> Result<(i64, i64, i64), NodeError> {
    static RE: OnceLock<Option<Regex>> = OnceLock::new();
    let bad = || format_error(path, format!("unexpected status line {status:?}"));
    let first = status.split_whitespace().next().ok_or_else(bad)?;
    let blocks: i64 = first.parse().map_err(|_| bad())?;
    if device.contains("raid0") || device.contains("linear") {
        let members = device.matches('[').count() as i64;
        return Ok((members, members, blocks));
    }
    if device.contains("inactive") {
        return Ok((0, 0, blocks));
    }
    let re = RE.get_or_init(|| Regex::new(r"(\d+) blocks .*\[(\d+)/(\d+)\] \[[U_]+\]").ok());
    let caps = re
        .as_ref()
        .and_then(|re| re.captures(status))
        .ok_or_else(bad)?;
    let num = |i: usize| caps.get(i).and_then(|m| m.as_str().parse::<i64>().ok());
    let (Some(total), Some(active)) = (num(2), num(3)) else {
        return Err(bad());
    };
    Ok((active, total, blocks))
}

/// The blocks synced of a `recovery`/`resync`/`check` line, which must also give the
/// percentage, finish time and speed (the `procfs` library fails the file otherwise).
fn md_synced(path: &Path, line: &str) -> Result<i64, NodeError> {
    static RES: OnceLock<Option<[Regex; 4]>> = OnceLock::new();
    let bad = || format_error(path, format!("unexpected sync line {line:?}"));
    let res = RES.get_or_init(|| {
        let all = [
            r"\((\d+)/\d+\)",
            r"= (.+)%",
            r"finish=(.+)min",
            r"speed=(.+)[A-Z]",
        ];
        let [a, b, c, d] = all.map(|p| Regex::new(p).ok());
        Some([a?, b?, c?, d?])
    });
    let res = res.as_ref().ok_or_else(bad)?;
    let field = |re: &Regex| re.captures(line).and_then(|c| c.get(1)).map(|m| m.as_str());
    let synced = field(&res[0]).and_then(|v| v.parse::<i64>().ok());
    let synced = synced.ok_or_else(bad)?;
    for re in &res[1..] {
        let value = field(re).and_then(|v| v.trim().parse::<f64>().ok());
        value.ok_or_else(bad)?;
    }
    Ok(synced)
}

fn md_arrays<'a>(path: &Path, text: &'a str) -> Result<Vec<MdArray<'a>>, NodeError> {
    let lines: Vec<&str> = text.split('\n').collect();
    let mut arrays = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty()
            || line.starts_with(' ')
            || line.starts_with("Personalities")
            || line.starts_with("unused")
        {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(name), Some(state)) = (fields.first(), fields.get(2)) else {
            return Err(format_error(path, format!("short device line {line:?}")));
        };
        let (Some(status), Some(third)) = (lines.get(i + 1), lines.get(i + 2)) else {
            return Err(format_error(path, format!("too few lines for {name}")));
        };
        if lines.len() <= i + 3 {
            return Err(format_error(path, format!("too few lines for {name}")));
        }
        let (active, total, blocks) = md_status(path, line, status)?;
        let sync = if third.contains("bitmap") {
            lines.get(i + 3).copied().unwrap_or_default()
        } else {
            third
        };
        let (mut state, mut synced) = (*state, blocks);
        let (recovery, resync, check) = (
            sync.contains("recovery"),
            sync.contains("resync"),
            sync.contains("check"),
        );
        if recovery || resync || check {
            state = if recovery {
                "recovering"
            } else if check {
                "checking"
            } else {
                "resyncing"
            };
            synced = if sync.contains("PENDING") || sync.contains("DELAYED") {
                0
            } else {
                md_synced(path, sync)?
            };
        }
        arrays.push(MdArray {
            name,
            state,
            active,
            total,
            failed: line.matches("(F)").count(),
            spare: line.matches("(S)").count(),
            blocks,
            synced,
        });
    }
    Ok(arrays)
}

/// `mdadm`: `<proc>/mdstat` → per array `node_md_disks_required`, `node_md_disks{state}`
/// (`active`, `failed`, `spare`), `node_md_state{state}` (1 for the array's one of `active`,
/// `inactive`, `recovering`, `resync`, `check`), `node_md_blocks`, `node_md_blocks_synced`.
pub fn mdadm(proc: &Path, out: &mut Vec<Metric>) -> Result<(), NodeError> {
    let path = proc.join("mdstat");
    let text = read(&path)?;
    for md in md_arrays(&path, &text)? {
        let dev = [("device", md.name)];
        let g = |name: &str, help: &str, labels: &[(&str, &str)], v: f64| {
            gauge(name.to_owned(), help, labels, v)
        };
        out.push(g(
            "node_md_disks_required",
            "Total number of disks of device.",
            &dev,
            md.total as f64,
        ));
        for (state, n) in [
            ("active", md.active as f64),
            ("failed", md.failed as f64),
            ("spare", md.spare as f64),
        ] {
            let labels = [("device", md.name), ("state", state)];
            let help = "Number of active/failed/spare disks of device.";
            out.push(g("node_md_disks", help, &labels, n));
        }
        for (state, shown) in [
            ("active", "active"),
            ("inactive", "inactive"),
            ("recovering", "recovering"),
            ("resyncing", "resync"),
            ("checking", "check"),
        ] {
            let labels = [("device", md.name), ("state", shown)];
            let v = if md.state == state { 1.0 } else { 0.0 };
            out.push(g(
                "node_md_state",
                "Indicates the state of md-device.",
                &labels,
                v,
            ));
        }
        let help = "Total number of blocks on device.";
        out.push(g("node_md_blocks", help, &dev, md.blocks as f64));
        let help = "Number of blocks synced on device.";
        out.push(g("node_md_blocks_synced", help, &dev, md.synced as f64));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{help_of, lines, tree};
    use super::*;

    /// `/proc/mdstat` of arrays in every state (the `procfs` library's fixture cases), and
    /// node_exporter 1.5's output for it, sorted.
    const MDSTAT: &str = r"Personalities : [linear] [multipath] [raid0] [raid1] [raid6] [raid5] [raid4] [raid10]
md3 : active raid6 sda1[8] sdh1[7] sdg1[6] sdf1[5] sde1[11] sdd1[3] sdc1[10] sdb1[9] sdd1[10](S) sdd2[11](S)
      5853468288 blocks super 1.2 level 6, 64k chunk, algorithm 2 [8/8] [UUUUUUUU]

md127 : active raid1 sdi2[0] sdj2[1]
      312319552 blocks [2/2] [UU]

md0 : active raid1 sdi1[0] sdj1[1]
      248896 blocks [2/2] [UU]

md4 : inactive raid1 sda3[0](F) sdb3[1](S)
      4883648 blocks [2/2] [UU]

md6 : active raid1 sdb2[2](F) sdc[1](S) sda2[0]
      195310144 blocks [2/1] [U_]
      [=>...................]  recovery =  8.5% (16775552/195310144) finish=17.0min speed=259783K/sec

md8 : active raid1 sdb1[1] sda1[0] sdc[2](S) sde[3](S)
      195310144 blocks [2/2] [UU]
      [=>...................]  resync =  8.5% (16775552/195310144) finish=17.0min speed=259783K/sec

md7 : active raid6 sdb1[0] sde1[3] sdd1[2] sdc1[1](F)
      7813735424 blocks super 1.2 level 6, 512k chunk, algorithm 2 [4/3] [U_UU]
      bitmap: 0/30 pages [0KB], 65536KB chunk

md9 : active raid1 sdc2[2] sdd2[3] sdb2[1] sda2[0] sde[4](F) sdf[5](F) sdg[6](S)
      523968 blocks super 1.2 [4/4] [UUUU]
      resync=DELAYED

md10 : active raid0 sda1[0] sdb1[1]
      314159265 blocks 64k chunks

md11 : active (auto-read-only) raid1 sdb2[0] sdc2[1](S)
      4190208 blocks super 1.2 [2/2] [UU]
      resync=PENDING

md12 : active raid0 sdc2[0] sdd2[1]
      3886394368 blocks super 1.2 512k chunks

md126 : active raid0 sdb[1] sdc[0]
      1855870976 blocks super external:/md127/0 128k chunks

md219 : inactive sdb[2](S) sdc[1](S) sda[0](S)
      7932 blocks super external:imsm

md00 : active raid0 xvdb[0]
      4186624 blocks super 1.2 256k chunks

md120 : active linear sda1[1] sdb1[0]
      2095104 blocks super 1.2 0k rounding

md101 : active (read-only) raid0 sdb[2] sdd[1] sdc[0]
      322560 blocks super 1.2 512k chunks

md201 : active raid1 sda3[0] sdb3[1]
      1993728 blocks super 1.2 [2/2] [UU]
      [=>...................]  check =  5.7% (114176/1993728) finish=0.2min speed=114176K/sec

unused devices: <none>
";

    #[test]
    fn mdadm_matches_node_exporter_on_every_array_kind() {
        let d = tree(&[("mdstat", MDSTAT)]);
        let mut out = Vec::new();
        mdadm(d.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        let mut got = lines(&out);
        got.sort();
        let want = [
            "node_md_blocks_synced{device=\"md0\"} gauge 248896",
            "node_md_blocks_synced{device=\"md00\"} gauge 4186624",
            "node_md_blocks_synced{device=\"md10\"} gauge 314159265",
            "node_md_blocks_synced{device=\"md101\"} gauge 322560",
            "node_md_blocks_synced{device=\"md11\"} gauge 0",
            "node_md_blocks_synced{device=\"md12\"} gauge 3886394368",
            "node_md_blocks_synced{device=\"md120\"} gauge 2095104",
            "node_md_blocks_synced{device=\"md126\"} gauge 1855870976",
            "node_md_blocks_synced{device=\"md127\"} gauge 312319552",
            "node_md_blocks_synced{device=\"md201\"} gauge 114176",
            "node_md_blocks_synced{device=\"md219\"} gauge 7932",
            "node_md_blocks_synced{device=\"md3\"} gauge 5853468288",
            "node_md_blocks_synced{device=\"md4\"} gauge 4883648",
            "node_md_blocks_synced{device=\"md6\"} gauge 16775552",
            "node_md_blocks_synced{device=\"md7\"} gauge 7813735424",
            "node_md_blocks_synced{device=\"md8\"} gauge 16775552",
            "node_md_blocks_synced{device=\"md9\"} gauge 0",
            "node_md_blocks{device=\"md0\"} gauge 248896",
            "node_md_blocks{device=\"md00\"} gauge 4186624",
            "node_md_blocks{device=\"md10\"} gauge 314159265",
            "node_md_blocks{device=\"md101\"} gauge 322560",
            "node_md_blocks{device=\"md11\"} gauge 4190208",
            "node_md_blocks{device=\"md12\"} gauge 3886394368",
            "node_md_blocks{device=\"md120\"} gauge 2095104",
            "node_md_blocks{device=\"md126\"} gauge 1855870976",
            "node_md_blocks{device=\"md127\"} gauge 312319552",
            "node_md_blocks{device=\"md201\"} gauge 1993728",
            "node_md_blocks{device=\"md219\"} gauge 7932",
            "node_md_blocks{device=\"md3\"} gauge 5853468288",
            "node_md_blocks{device=\"md4\"} gauge 4883648",
            "node_md_blocks{device=\"md6\"} gauge 195310144",
            "node_md_blocks{device=\"md7\"} gauge 7813735424",
            "node_md_blocks{device=\"md8\"} gauge 195310144",
            "node_md_blocks{device=\"md9\"} gauge 523968",
            "node_md_disks_required{device=\"md0\"} gauge 2",
            "node_md_disks_required{device=\"md00\"} gauge 1",
            "node_md_disks_required{device=\"md10\"} gauge 2",
            "node_md_disks_required{device=\"md101\"} gauge 3",
            "node_md_disks_required{device=\"md11\"} gauge 2",
            "node_md_disks_required{device=\"md12\"} gauge 2",
            "node_md_disks_required{device=\"md120\"} gauge 2",
            "node_md_disks_required{device=\"md126\"} gauge 2",
            "node_md_disks_required{device=\"md127\"} gauge 2",
            "node_md_disks_required{device=\"md201\"} gauge 2",
            "node_md_disks_required{device=\"md219\"} gauge 0",
            "node_md_disks_required{device=\"md3\"} gauge 8",
            "node_md_disks_required{device=\"md4\"} gauge 0",
            "node_md_disks_required{device=\"md6\"} gauge 2",
            "node_md_disks_required{device=\"md7\"} gauge 4",
            "node_md_disks_required{device=\"md8\"} gauge 2",
            "node_md_disks_required{device=\"md9\"} gauge 4",
            "node_md_disks{device=\"md0\",state=\"active\"} gauge 2",
            "node_md_disks{device=\"md0\",state=\"failed\"} gauge 0",
            "node_md_disks{device=\"md0\",state=\"spare\"} gauge 0",
            "node_md_disks{device=\"md00\",state=\"active\"} gauge 1",
            "node_md_disks{device=\"md00\",state=\"failed\"} gauge 0",
            "node_md_disks{device=\"md00\",state=\"spare\"} gauge 0",
            "node_md_disks{device=\"md10\",state=\"active\"} gauge 2",
            "node_md_disks{device=\"md10\",state=\"failed\"} gauge 0",
            "node_md_disks{device=\"md10\",state=\"spare\"} gauge 0",
            "node_md_disks{device=\"md101\",state=\"active\"} gauge 3",
            "node_md_disks{device=\"md101\",state=\"failed\"} gauge 0",
            "node_md_disks{device=\"md101\",state=\"spare\"} gauge 0",
            "node_md_disks{device=\"md11\",state=\"active\"} gauge 2",
            "node_md_disks{device=\"md11\",state=\"failed\"} gauge 0",
            "node_md_disks{device=\"md11\",state=\"spare\"} gauge 1",
            "node_md_disks{device=\"md12\",state=\"active\"} gauge 2",
            "node_md_disks{device=\"md12\",state=\"failed\"} gauge 0",
            "node_md_disks{device=\"md12\",state=\"spare\"} gauge 0",
            "node_md_disks{device=\"md120\",state=\"active\"} gauge 2",
            "node_md_disks{device=\"md120\",state=\"failed\"} gauge 0",
            "node_md_disks{device=\"md120\",state=\"spare\"} gauge 0",
            "node_md_disks{device=\"md126\",state=\"active\"} gauge 2",
            "node_md_disks{device=\"md126\",state=\"failed\"} gauge 0",
            "node_md_disks{device=\"md126\",state=\"spare\"} gauge 0",
            "node_md_disks{device=\"md127\",state=\"active\"} gauge 2",
            "node_md_disks{device=\"md127\",state=\"failed\"} gauge 0",
            "node_md_disks{device=\"md127\",state=\"spare\"} gauge 0",
            "node_md_disks{device=\"md201\",state=\"active\"} gauge 2",
            "node_md_disks{device=\"md201\",state=\"failed\"} gauge 0",
            "node_md_disks{device=\"md201\",state=\"spare\"} gauge 0",
            "node_md_disks{device=\"md219\",state=\"active\"} gauge 0",
            "node_md_disks{device=\"md219\",state=\"failed\"} gauge 0",
            "node_md_disks{device=\"md219\",state=\"spare\"} gauge 3",
            "node_md_disks{device=\"md3\",state=\"active\"} gauge 8",
            "node_md_disks{device=\"md3\",state=\"failed\"} gauge 0",
            "node_md_disks{device=\"md3\",state=\"spare\"} gauge 2",
            "node_md_disks{device=\"md4\",state=\"active\"} gauge 0",
            "node_md_disks{device=\"md4\",state=\"failed\"} gauge 1",
            "node_md_disks{device=\"md4\",state=\"spare\"} gauge 1",
            "node_md_disks{device=\"md6\",state=\"active\"} gauge 1",
            "node_md_disks{device=\"md6\",state=\"failed\"} gauge 1",
            "node_md_disks{device=\"md6\",state=\"spare\"} gauge 1",
            "node_md_disks{device=\"md7\",state=\"active\"} gauge 3",
            "node_md_disks{device=\"md7\",state=\"failed\"} gauge 1",
            "node_md_disks{device=\"md7\",state=\"spare\"} gauge 0",
            "node_md_disks{device=\"md8\",state=\"active\"} gauge 2",
            "node_md_disks{device=\"md8\",state=\"failed\"} gauge 0",
            "node_md_disks{device=\"md8\",state=\"spare\"} gauge 2",
            "node_md_disks{device=\"md9\",state=\"active\"} gauge 4",
            "node_md_disks{device=\"md9\",state=\"failed\"} gauge 2",
            "node_md_disks{device=\"md9\",state=\"spare\"} gauge 1",
            "node_md_state{device=\"md0\",state=\"active\"} gauge 1",
            "node_md_state{device=\"md0\",state=\"check\"} gauge 0",
            "node_md_state{device=\"md0\",state=\"inactive\"} gauge 0",
            "node_md_state{device=\"md0\",state=\"recovering\"} gauge 0",
            "node_md_state{device=\"md0\",state=\"resync\"} gauge 0",
            "node_md_state{device=\"md00\",state=\"active\"} gauge 1",
            "node_md_state{device=\"md00\",state=\"check\"} gauge 0",
            "node_md_state{device=\"md00\",state=\"inactive\"} gauge 0",
            "node_md_state{device=\"md00\",state=\"recovering\"} gauge 0",
            "node_md_state{device=\"md00\",state=\"resync\"} gauge 0",
            "node_md_state{device=\"md10\",state=\"active\"} gauge 1",
            "node_md_state{device=\"md10\",state=\"check\"} gauge 0",
            "node_md_state{device=\"md10\",state=\"inactive\"} gauge 0",
            "node_md_state{device=\"md10\",state=\"recovering\"} gauge 0",
            "node_md_state{device=\"md10\",state=\"resync\"} gauge 0",
            "node_md_state{device=\"md101\",state=\"active\"} gauge 1",
            "node_md_state{device=\"md101\",state=\"check\"} gauge 0",
            "node_md_state{device=\"md101\",state=\"inactive\"} gauge 0",
            "node_md_state{device=\"md101\",state=\"recovering\"} gauge 0",
            "node_md_state{device=\"md101\",state=\"resync\"} gauge 0",
            "node_md_state{device=\"md11\",state=\"active\"} gauge 0",
            "node_md_state{device=\"md11\",state=\"check\"} gauge 0",
            "node_md_state{device=\"md11\",state=\"inactive\"} gauge 0",
            "node_md_state{device=\"md11\",state=\"recovering\"} gauge 0",
            "node_md_state{device=\"md11\",state=\"resync\"} gauge 1",
            "node_md_state{device=\"md12\",state=\"active\"} gauge 1",
            "node_md_state{device=\"md12\",state=\"check\"} gauge 0",
            "node_md_state{device=\"md12\",state=\"inactive\"} gauge 0",
            "node_md_state{device=\"md12\",state=\"recovering\"} gauge 0",
            "node_md_state{device=\"md12\",state=\"resync\"} gauge 0",
            "node_md_state{device=\"md120\",state=\"active\"} gauge 1",
            "node_md_state{device=\"md120\",state=\"check\"} gauge 0",
            "node_md_state{device=\"md120\",state=\"inactive\"} gauge 0",
            "node_md_state{device=\"md120\",state=\"recovering\"} gauge 0",
            "node_md_state{device=\"md120\",state=\"resync\"} gauge 0",
            "node_md_state{device=\"md126\",state=\"active\"} gauge 1",
            "node_md_state{device=\"md126\",state=\"check\"} gauge 0",
            "node_md_state{device=\"md126\",state=\"inactive\"} gauge 0",
            "node_md_state{device=\"md126\",state=\"recovering\"} gauge 0",
            "node_md_state{device=\"md126\",state=\"resync\"} gauge 0",
            "node_md_state{device=\"md127\",state=\"active\"} gauge 1",
            "node_md_state{device=\"md127\",state=\"check\"} gauge 0",
            "node_md_state{device=\"md127\",state=\"inactive\"} gauge 0",
            "node_md_state{device=\"md127\",state=\"recovering\"} gauge 0",
            "node_md_state{device=\"md127\",state=\"resync\"} gauge 0",
            "node_md_state{device=\"md201\",state=\"active\"} gauge 0",
            "node_md_state{device=\"md201\",state=\"check\"} gauge 1",
            "node_md_state{device=\"md201\",state=\"inactive\"} gauge 0",
            "node_md_state{device=\"md201\",state=\"recovering\"} gauge 0",
            "node_md_state{device=\"md201\",state=\"resync\"} gauge 0",
            "node_md_state{device=\"md219\",state=\"active\"} gauge 0",
            "node_md_state{device=\"md219\",state=\"check\"} gauge 0",
            "node_md_state{device=\"md219\",state=\"inactive\"} gauge 1",
            "node_md_state{device=\"md219\",state=\"recovering\"} gauge 0",
            "node_md_state{device=\"md219\",state=\"resync\"} gauge 0",
            "node_md_state{device=\"md3\",state=\"active\"} gauge 1",
            "node_md_state{device=\"md3\",state=\"check\"} gauge 0",
            "node_md_state{device=\"md3\",state=\"inactive\"} gauge 0",
            "node_md_state{device=\"md3\",state=\"recovering\"} gauge 0",
            "node_md_state{device=\"md3\",state=\"resync\"} gauge 0",
            "node_md_state{device=\"md4\",state=\"active\"} gauge 0",
            "node_md_state{device=\"md4\",state=\"check\"} gauge 0",
            "node_md_state{device=\"md4\",state=\"inactive\"} gauge 1",
            "node_md_state{device=\"md4\",state=\"recovering\"} gauge 0",
            "node_md_state{device=\"md4\",state=\"resync\"} gauge 0",
            "node_md_state{device=\"md6\",state=\"active\"} gauge 0",
            "node_md_state{device=\"md6\",state=\"check\"} gauge 0",
            "node_md_state{device=\"md6\",state=\"inactive\"} gauge 0",
            "node_md_state{device=\"md6\",state=\"recovering\"} gauge 1",
            "node_md_state{device=\"md6\",state=\"resync\"} gauge 0",
            "node_md_state{device=\"md7\",state=\"active\"} gauge 1",
            "node_md_state{device=\"md7\",state=\"check\"} gauge 0",
            "node_md_state{device=\"md7\",state=\"inactive\"} gauge 0",
            "node_md_state{device=\"md7\",state=\"recovering\"} gauge 0",
            "node_md_state{device=\"md7\",state=\"resync\"} gauge 0",
            "node_md_state{device=\"md8\",state=\"active\"} gauge 0",
            "node_md_state{device=\"md8\",state=\"check\"} gauge 0",
            "node_md_state{device=\"md8\",state=\"inactive\"} gauge 0",
            "node_md_state{device=\"md8\",state=\"recovering\"} gauge 0",
            "node_md_state{device=\"md8\",state=\"resync\"} gauge 1",
            "node_md_state{device=\"md9\",state=\"active\"} gauge 0",
            "node_md_state{device=\"md9\",state=\"check\"} gauge 0",
            "node_md_state{device=\"md9\",state=\"inactive\"} gauge 0",
            "node_md_state{device=\"md9\",state=\"recovering\"} gauge 0",
            "node_md_state{device=\"md9\",state=\"resync\"} gauge 1",
        ];
        assert_eq!(got, want);
        assert_eq!(
            help_of(&out, "node_md_disks"),
            Some("Number of active/failed/spare disks of device.")
        );
        assert_eq!(
            help_of(&out, "node_md_state"),
            Some("Indicates the state of md-device.")
        );
        // No mdstat (no md driver): a failure, as node_exporter's "no data".
        assert!(mdadm(tree(&[]).path(), &mut Vec::new()).is_err());
        for bad in [
            "md0 : active raid1 sda1[0]\n      12 blocks [2/2]\n\n\n",
            "md0 : active raid1 sda1[0]\n      x blocks [2/2] [UU]\n\n\n",
            "md0 : active raid1 sda1[0]\n      12 blocks [2/2] [UU]\n",
            "md0 :\n\n\n\n",
            "md6 : active raid1 sda2[0]\n      9 blocks [2/1] [U_]\n      recovery = 8.5% (1/9)\n\n",
        ] {
            let d = tree(&[("mdstat", bad)]);
            assert!(mdadm(d.path(), &mut Vec::new()).is_err(), "{bad:?}");
        }
    }
}
