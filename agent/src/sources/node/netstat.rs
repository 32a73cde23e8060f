//! node_exporter's `netstat` collector (`collector/netstat_linux.go`): the default fields of
//! `<proc>/net/{netstat,snmp,snmp6}`, untyped.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::OnceLock;

use regex::Regex;
use uctel_protocol::payload::Metric;

use super::files::{format_error, read, read_optional};
use super::NodeError;
use crate::sources::metric::untyped;

/// node_exporter 1.5's default `--collector.netstat.fields`.
const NETSTAT_FIELDS: &str = "^(.*_(InErrors|InErrs)|Ip_Forwarding|Ip(6|Ext)_(InOctets|OutOctets)|Icmp6?_(InMsgs|OutMsgs)|TcpExt_(Listen.*|Syncookies.*|TCPSynRetrans|TCPTimeouts)|Tcp_(ActiveOpens|InSegs|OutSegs|OutRsts|PassiveOpens|RetransSegs|CurrEstab)|Udp6?_(InDatagrams|OutDatagrams|NoPorts|RcvbufErrors|SndbufErrors))$";

/// Whether `<Protocol>_<Field>` is in node_exporter's default netstat field set.
pub fn netstat_field_selected(key: &str) -> bool {
    static RE: OnceLock<Option<Regex>> = OnceLock::new();
    RE.get_or_init(|| Regex::new(NETSTAT_FIELDS).ok())
        .as_ref()
        .is_some_and(|re| re.is_match(key))
}

type NetStats = BTreeMap<String, BTreeMap<String, String>>;

/// `Proto: names…` / `Proto: values…` line pairs (`net/netstat`, `net/snmp`).
fn parse_net_stats(path: &Path, text: &str, into: &mut NetStats) -> Result<(), NodeError> {
    let mut lines = text.lines();
    while let Some(names) = lines.next() {
        let values = lines.next().unwrap_or("");
        let names: Vec<&str> = names.split(' ').collect();
        let values: Vec<&str> = values.split(' ').collect();
        let proto = names[0].strip_suffix(':').unwrap_or(names[0]);
        if names.len() != values.len() {
            return Err(format_error(path, format!("field count mismatch: {proto}")));
        }
        let fields = names.iter().zip(&values).skip(1);
        let map = fields.map(|(n, v)| ((*n).to_owned(), (*v).to_owned()));
        into.insert(proto.to_owned(), map.collect());
    }
    Ok(())
}

/// `Ip6InReceives 12` lines (`net/snmp6`): the protocol is the name up to its first `6`.
fn parse_snmp6(text: &str, into: &mut NetStats) {
    let mut v6 = NetStats::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 2 {
            continue;
        }
        if let Some(i) = fields[0].find('6') {
            let (proto, name) = fields[0].split_at(i + 1);
            let stats = v6.entry(proto.to_owned()).or_default();
            stats.insert(name.to_owned(), fields[1].to_owned());
        }
    }
    into.extend(v6);
}

/// `netstat`: `<proc>/net/{netstat,snmp,snmp6}` → `node_netstat_<Proto>_<Field>` (untyped)
/// for the default fields; `snmp6` is skipped when it does not exist (IPv6 disabled).
pub fn netstat(proc: &Path, out: &mut Vec<Metric>) -> Result<(), NodeError> {
    let mut stats = NetStats::new();
    for file in ["netstat", "snmp"] {
        let path = proc.join("net").join(file);
        parse_net_stats(&path, &read(&path)?, &mut stats)?;
    }
    let snmp6 = proc.join("net/snmp6");
    if let Some(text) = read_optional(&snmp6)? {
        parse_snmp6(&text, &mut stats);
    }
    for (proto, fields) in &stats {
        for (name, value) in fields {
            let key = format!("{proto}_{name}");
            let v: f64 = value.parse().map_err(|_| {
                format_error(
                    &proc.join("net"),
                    format!("invalid value {value} in netstats"),
                )
            })?;
            if netstat_field_selected(&key) {
                let help = format!("Statistic {proto}{name}.");
                out.push(untyped(format!("node_netstat_{key}"), &help, v));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{help_of, lines, tree};
    use super::*;

    #[test]
    fn netstat_merges_the_three_files_and_keeps_the_default_fields() {
        let d = tree(&[
            (
                "net/netstat",
                "TcpExt: SyncookiesSent ListenDrops TCPTimeouts PruneCalled\nTcpExt: 0 22 27 5\n\
                 IpExt: InOctets OutOctets InMcastPkts\nIpExt: 66283388078 64874294099 3\n",
            ),
            (
                "net/snmp",
                "Ip: Forwarding DefaultTTL InReceives\nIp: 2 64 57624759\n\
                 Tcp: RtoAlgorithm ActiveOpens InErrs CurrEstab\nTcp: 1 76982 0 2\n\
                 Udp: InDatagrams NoPorts InErrors IgnoredMulti\nUdp: 55363795 0 470733 9\n",
            ),
            (
                "net/snmp6",
                "Ip6InReceives                   \t14909\nIp6InOctets \t1369384\n\
                 Udp6InErrors 0\nIcmp6OutMsgs 232\nnosix 1\n\n",
            ),
        ]);
        let mut out = Vec::new();
        netstat(d.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        let mut got = lines(&out);
        got.sort();
        assert_eq!(
            got,
            [
                "node_netstat_Icmp6_OutMsgs{} untyped 232",
                "node_netstat_Ip6_InOctets{} untyped 1369384",
                "node_netstat_IpExt_InOctets{} untyped 66283388078",
                "node_netstat_IpExt_OutOctets{} untyped 64874294099",
                "node_netstat_Ip_Forwarding{} untyped 2",
                "node_netstat_TcpExt_ListenDrops{} untyped 22",
                "node_netstat_TcpExt_SyncookiesSent{} untyped 0",
                "node_netstat_TcpExt_TCPTimeouts{} untyped 27",
                "node_netstat_Tcp_ActiveOpens{} untyped 76982",
                "node_netstat_Tcp_CurrEstab{} untyped 2",
                "node_netstat_Tcp_InErrs{} untyped 0",
                "node_netstat_Udp6_InErrors{} untyped 0",
                "node_netstat_Udp_InDatagrams{} untyped 55363795",
                "node_netstat_Udp_InErrors{} untyped 470733",
                "node_netstat_Udp_NoPorts{} untyped 0",
            ]
        );
        assert_eq!(
            help_of(&out, "node_netstat_Ip6_InOctets"),
            Some("Statistic Ip6InOctets.")
        );
        // No snmp6 (IPv6 disabled): skipped; no snmp: a failure.
        let v4 = tree(&[
            ("net/netstat", "TcpExt: ListenDrops\nTcpExt: 1\n"),
            ("net/snmp", "Ip: Forwarding\nIp: 1\n"),
        ]);
        let mut out = Vec::new();
        netstat(v4.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(out.len(), 2);
        let no_snmp = tree(&[("net/netstat", "TcpExt: ListenDrops\nTcpExt: 1\n")]);
        assert!(netstat(no_snmp.path(), &mut Vec::new()).is_err());
        let mismatch = tree(&[
            ("net/netstat", "TcpExt: ListenDrops TW\nTcpExt: 1\n"),
            ("net/snmp", "Ip: Forwarding\nIp: 1\n"),
        ]);
        assert!(netstat(mismatch.path(), &mut Vec::new()).is_err());
    }

    #[test]
    fn the_default_netstat_fields() {
        for (key, selected) in [
            ("Ip_Forwarding", true),
            ("Ip_DefaultTTL", false),
            ("TcpExt_ListenOverflows", true),
            ("TcpExt_TCPTimeouts", true),
            ("TcpExt_PruneCalled", false),
            ("UdpLite_InErrors", true),
            ("Icmp6_InMsgs", true),
            ("Udp6_IgnoredMulti", false),
            ("Tcp_CurrEstab", true),
            ("Tcp_CurrEstabX", false),
        ] {
            assert_eq!(netstat_field_selected(key), selected, "{key}");
        }
    }
}
