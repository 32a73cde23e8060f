//! node_exporter's `uname` collector (`collector/uname_linux.go`): the uname(2) fields as
//! labels of `node_uname_info`.

use uctel_protocol::payload::Metric;

use crate::sources::metric::gauge;

/// `uname`: uname(2) → `node_uname_info{sysname,release,version,machine,nodename,domainname}`.
pub fn uname(out: &mut Vec<Metric>) {
    let u = rustix::system::uname();
    let text = |s: &std::ffi::CStr| s.to_string_lossy().into_owned();
    let (sysname, release, version) = (text(u.sysname()), text(u.release()), text(u.version()));
    let (machine, nodename) = (text(u.machine()), text(u.nodename()));
    let domainname = text(u.domainname());
    out.push(gauge(
        "node_uname_info",
        "Labeled system information as provided by the uname system call.",
        &[
            ("sysname", &sysname),
            ("release", &release),
            ("version", &version),
            ("machine", &machine),
            ("nodename", &nodename),
            ("domainname", &domainname),
        ],
        1.0,
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uname_has_the_six_labels_of_the_system_call() {
        let mut out = Vec::new();
        uname(&mut out);
        assert_eq!(out.len(), 1);
        let names: Vec<&str> = out[0].labels.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "sysname",
                "release",
                "version",
                "machine",
                "nodename",
                "domainname"
            ]
        );
        assert_eq!(out[0].value, 1.0);
        assert_eq!(out[0].labels[0].value, "Linux");
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        assert_eq!(out[0].labels[1].value, release.trim());
    }
}
