//! A network interface's driver statistics (`ethtool -S`), driver information
//! (`ethtool -i`) and legacy link settings, read with the `SIOCETHTOOL` ioctl
//! (`include/uapi/linux/ethtool.h`, `net/ethtool/ioctl.c`).
//!
//! Why an ioctl: the driver-private statistics (per-queue and per-priority counters, PFC
//! pause, ECN/CNP counters as the driver names them) exist only as `ETHTOOL_GSTRINGS` with
//! `ETH_SS_STATS` plus `ETHTOOL_GSTATS`. The ethtool netlink interface has no replacement:
//! its request translation table marks `ETHTOOL_GSTATS` "n/a", and `ETHTOOL_MSG_STATS_GET`
//! "is not a re-implementation of `ETHTOOL_GSTATS` which exposed driver-defined stats"
//! (`Documentation/networking/ethtool-netlink.rst`); netlink gives the names of the set
//! (`ETHTOOL_MSG_STRSET_GET`) but not their values. The `ethtool` crate (rust-netlink) speaks
//! only netlink, and neither `rustix` nor `nix` wraps `SIOCETHTOOL`.
//!
//! One of the modules of [`crate::sources::sys`], the agent's only `unsafe` code: the socket, the ioctl calls and the guarded buffers, each with its
//! `// SAFETY:` note.
//!
//! The kernel writes as many entries as the driver has *now* (`ethtool_get_stats` and
//! `ethtool_get_strings` take the count from the driver, not from the caller), so a driver
//! whose count grew since it was read (channels added) writes past a buffer sized for the old
//! count. Every variable-size answer therefore lands in a `GuardedBuf`, an anonymous mapping
//! followed by an inaccessible page: extra entries go into the mapping's slack or fault in the
//! kernel (`EFAULT`), never into other memory, and the count the kernel returns is checked.
//!
//! [`StatsReader`] keeps its socket and buffers, so a fast sampler can call
//! [`StatsReader::read`] repeatedly without allocating.

use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `ETHTOOL_GSET`: legacy link settings (`struct ethtool_cmd`).
const ETHTOOL_GSET: u32 = 0x0000_0001;
/// `ETHTOOL_GDRVINFO`: driver information (`struct ethtool_drvinfo`).
const ETHTOOL_GDRVINFO: u32 = 0x0000_0003;
/// `ETHTOOL_GSTRINGS`: the names of a string set (`struct ethtool_gstrings`).
const ETHTOOL_GSTRINGS: u32 = 0x0000_001b;
/// `ETHTOOL_GSTATS`: the driver statistics (`struct ethtool_stats`).
const ETHTOOL_GSTATS: u32 = 0x0000_001d;
/// `ETH_SS_STATS`: the string set of `ETHTOOL_GSTATS`.
const ETH_SS_STATS: u32 = 1;
/// `ETH_GSTRING_LEN`: bytes of one name, NUL-padded (not terminated when 32 long).
pub const ETH_GSTRING_LEN: usize = 32;
/// The most statistics [`StatsReader::open`] accepts (the limit of node_exporter 1.5.0's
/// ethtool library, `github.com/safchain/ethtool` v0.2.0 `MAX_GSTRINGS`).
pub const MAX_STATS: u32 = 32768;
/// `IFNAMSIZ`: an interface name is at most 15 bytes plus its NUL.
const IFNAMSIZ: usize = 16;

/// An ethtool request that failed: the interface, the command and the system's error. It is
/// the inner error of the [`io::Error`]s this module returns (same kind); [`os_error`] finds
/// its errno.
#[derive(Debug)]
pub struct EthtoolError {
    /// The interface name.
    pub ifname: String,
    /// The command, `ETHTOOL_GSTATS` and so on, or `socket`.
    pub command: &'static str,
    /// What failed.
    pub source: io::Error,
}

impl fmt::Display for EthtoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.ifname, self.command, self.source)
    }
}

impl std::error::Error for EthtoolError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

fn error(ifname: &str, command: &'static str, source: io::Error) -> io::Error {
    io::Error::new(
        source.kind(),
        EthtoolError {
            ifname: ifname.to_owned(),
            command,
            source,
        },
    )
}

/// The errno of an error from this module (`EOPNOTSUPP` for an interface without the
/// operation, `ENODEV` for one that does not exist), or of a plain OS error.
pub fn os_error(e: &io::Error) -> Option<i32> {
    e.raw_os_error().or_else(|| {
        e.get_ref()
            .and_then(|inner| inner.downcast_ref::<EthtoolError>())
            .and_then(|ctx| ctx.source.raw_os_error())
    })
}

/// Whether `e` says the interface does not support the operation (`EOPNOTSUPP`): the driver
/// has no such ethtool operation (`lo`, many virtual devices).
pub fn is_unsupported(e: &io::Error) -> bool {
    os_error(e) == Some(libc::EOPNOTSUPP)
}

/// `ethtool -i`: the fields of `struct ethtool_drvinfo`, each up to its first NUL.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriverInfo {
    /// Driver name (`virtio_net`, `mlx5_core`).
    pub driver: String,
    /// Driver version.
    pub version: String,
    /// Firmware version, empty when the driver has none.
    pub firmware_version: String,
    /// Bus address (`0000:00:03.0`), empty for virtual devices.
    pub bus_info: String,
    /// Expansion ROM version.
    pub expansion_rom_version: String,
    /// Number of `ETHTOOL_GSTATS` statistics now.
    pub n_stats: u32,
}

/// `struct ethtool_drvinfo` (196 bytes).
#[repr(C)]
struct RawDrvinfo {
    cmd: u32,
    driver: [u8; 32],
    version: [u8; 32],
    fw_version: [u8; 32],
    bus_info: [u8; 32],
    erom_version: [u8; 32],
    reserved2: [u8; 12],
    n_priv_flags: u32,
    n_stats: u32,
    testinfo_len: u32,
    eedump_len: u32,
    regdump_len: u32,
}

/// `struct ethtool_cmd` (44 bytes).
#[repr(C)]
#[derive(Default)]
struct RawCmd {
    cmd: u32,
    supported: u32,
    advertising: u32,
    speed: u16,
    duplex: u8,
    port: u8,
    phy_address: u8,
    transceiver: u8,
    autoneg: u8,
    mdio_support: u8,
    maxtxpkt: u32,
    maxrxpkt: u32,
    speed_hi: u16,
    eth_tp_mdix: u8,
    eth_tp_mdix_ctrl: u8,
    lp_advertising: u32,
    reserved: [u32; 2],
}

// The kernel's sizes of the two fixed-size answers.
const _: () = assert!(std::mem::size_of::<RawDrvinfo>() == 196);
const _: () = assert!(std::mem::size_of::<RawCmd>() == 44);

/// `ethtool` link settings from the legacy `ETHTOOL_GSET` (`struct ethtool_cmd`): only the
/// first 32 link-mode bits (`ETHTOOL_LINK_MODE_*_BIT` of `include/uapi/linux/ethtool.h`
/// below 32), as node_exporter 1.5.0 reads them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkSettings {
    /// Supported link modes, bit `n` = `ETHTOOL_LINK_MODE` bit `n`.
    pub supported: u32,
    /// Advertised link modes.
    pub advertising: u32,
    /// Link partner's advertised link modes.
    pub lp_advertising: u32,
    /// Speed in Mb/s; `u32::MAX` when unknown (`SPEED_UNKNOWN`).
    pub speed_mbps: u32,
    /// `DUPLEX_HALF` 0, `DUPLEX_FULL` 1, `DUPLEX_UNKNOWN` 0xff.
    pub duplex: u8,
    /// `PORT_TP` 0 … `PORT_OTHER` 0xff.
    pub port: u8,
    /// `AUTONEG_DISABLE` 0, `AUTONEG_ENABLE` 1.
    pub autoneg: u8,
}

/// An `AF_INET` datagram socket, the handle `SIOCETHTOOL` is issued on.
#[derive(Debug)]
struct Socket(OwnedFd);

impl Socket {
    fn open(ifname: &str) -> io::Result<Socket> {
        // SAFETY: socket(2) takes no pointers; the result is checked before use.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(error(ifname, "socket", io::Error::last_os_error()));
        }
        // SAFETY: `fd` is a new descriptor that nothing else owns.
        Ok(Socket(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// `SIOCETHTOOL` on `ifname` with `data` as `ifr_data`.
    ///
    /// # Safety
    /// `data` must point to writable memory that starts with the `u32` command and is large
    /// enough for everything the kernel writes for that command, and must stay valid for the
    /// call.
    unsafe fn ioctl(
        &self,
        ifname: &str,
        command: &'static str,
        data: *mut libc::c_void,
    ) -> io::Result<()> {
        let name = ifname_bytes(ifname)?;
        // SAFETY: `ifreq` is a C struct of a byte array and a union of integers and pointers;
        // all zeroes is a valid value.
        let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
        for (dst, src) in ifr.ifr_name.iter_mut().zip(name) {
            *dst = src as libc::c_char;
        }
        ifr.ifr_ifru.ifru_data = data.cast();
        // SAFETY: `ifr` is a valid `ifreq` on the stack for the call; the caller guarantees
        // `data` (the only pointer the kernel follows) as documented above.
        let rc = unsafe { libc::ioctl(self.0.as_raw_fd(), libc::SIOCETHTOOL, &mut ifr) };
        if rc < 0 {
            return Err(error(ifname, command, io::Error::last_os_error()));
        }
        Ok(())
    }

    fn drvinfo(&self, ifname: &str) -> io::Result<RawDrvinfo> {
        let mut info = RawDrvinfo {
            cmd: ETHTOOL_GDRVINFO,
            driver: [0; 32],
            version: [0; 32],
            fw_version: [0; 32],
            bus_info: [0; 32],
            erom_version: [0; 32],
            reserved2: [0; 12],
            n_priv_flags: 0,
            n_stats: 0,
            testinfo_len: 0,
            eedump_len: 0,
            regdump_len: 0,
        };
        // SAFETY: `info` is a `struct ethtool_drvinfo`, the fixed-size answer of
        // ETHTOOL_GDRVINFO, exclusively borrowed for the call.
        unsafe { self.ioctl(ifname, "ETHTOOL_GDRVINFO", (&raw mut info).cast())? };
        Ok(info)
    }
}

/// The name as `ifr_name` takes it: at most 15 bytes, no NUL.
fn ifname_bytes(ifname: &str) -> io::Result<[u8; IFNAMSIZ]> {
    let bytes = ifname.as_bytes();
    if bytes.is_empty() || bytes.len() >= IFNAMSIZ || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{ifname:?}: not an interface name (1 to 15 bytes, no NUL)"),
        ));
    }
    let mut out = [0u8; IFNAMSIZ];
    out[..bytes.len()].copy_from_slice(bytes);
    Ok(out)
}

/// The bytes of `field` up to its first NUL, as text (invalid UTF-8 replaced).
fn c_text(field: &[u8]) -> String {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

/// `ethtool -i IFNAME` (`ETHTOOL_GDRVINFO`).
///
/// # Errors
/// The ioctl's error with the interface name in context: `EOPNOTSUPP` for an interface whose
/// driver has no `get_drvinfo` and no parent device (`lo`), `ENODEV` for no such interface;
/// `InvalidInput` for a name that cannot be one.
pub fn driver_info(ifname: &str) -> io::Result<DriverInfo> {
    let info = Socket::open(ifname)?.drvinfo(ifname)?;
    Ok(DriverInfo {
        driver: c_text(&info.driver),
        version: c_text(&info.version),
        firmware_version: c_text(&info.fw_version),
        bus_info: c_text(&info.bus_info),
        expansion_rom_version: c_text(&info.erom_version),
        n_stats: info.n_stats,
    })
}

/// `ethtool IFNAME`'s legacy settings (`ETHTOOL_GSET`).
///
/// # Errors
/// The ioctl's error with the interface name in context: `EOPNOTSUPP` for a driver without
/// `get_link_ksettings` (`lo`, `ifb`).
pub fn link_settings(ifname: &str) -> io::Result<LinkSettings> {
    let socket = Socket::open(ifname)?;
    let mut cmd = RawCmd {
        cmd: ETHTOOL_GSET,
        ..RawCmd::default()
    };
    // SAFETY: `cmd` is a `struct ethtool_cmd`, the fixed-size answer of ETHTOOL_GSET,
    // exclusively borrowed for the call.
    unsafe { socket.ioctl(ifname, "ETHTOOL_GSET", (&raw mut cmd).cast())? };
    let speed = (u32::from(cmd.speed_hi) << 16) | u32::from(cmd.speed);
    Ok(LinkSettings {
        supported: cmd.supported,
        advertising: cmd.advertising,
        lp_advertising: cmd.lp_advertising,
        speed_mbps: if speed == u32::from(u16::MAX) {
            u32::MAX
        } else {
            speed
        },
        duplex: cmd.duplex,
        port: cmd.port,
        autoneg: cmd.autoneg,
    })
}

/// Read-write anonymous memory of at least `len` bytes, 8-byte aligned, followed by one
/// `PROT_NONE` page, so a kernel that writes past the end faults (`EFAULT`) instead of
/// overwriting other memory.
#[derive(Debug)]
struct GuardedBuf {
    ptr: *mut u8,
    /// Read-write bytes (`len` rounded up to pages).
    usable: usize,
    /// The whole mapping, guard page included.
    mapped: usize,
}

// SAFETY: the mapping is owned by this value alone (no aliasing pointers escape it), so it may
// move to another thread.
unsafe impl Send for GuardedBuf {}

impl GuardedBuf {
    fn new(len: usize) -> io::Result<GuardedBuf> {
        // SAFETY: sysconf takes no pointers.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
            .ok()
            .filter(|&p| p > 0)
            .unwrap_or(4096);
        let too_big = || io::Error::new(io::ErrorKind::InvalidInput, "buffer too large");
        let usable = len
            .max(1)
            .checked_next_multiple_of(page)
            .ok_or_else(too_big)?;
        let mapped = usable.checked_add(page).ok_or_else(too_big)?;
        // SAFETY: a new private anonymous mapping; no existing memory is touched.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let buf = GuardedBuf {
            ptr: ptr.cast(),
            usable,
            mapped,
        };
        // SAFETY: the last page lies inside the mapping made above, which `buf` owns.
        let rc =
            unsafe { libc::mprotect(ptr.cast::<u8>().add(usable).cast(), page, libc::PROT_NONE) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(buf)
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `usable` read-write bytes while `self` lives; plain bytes
        // have no invalid values; the kernel writes into it only during `ioctl`, which holds
        // `&mut self`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.usable) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and `&mut self` makes the borrow exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.usable) }
    }

    /// `SIOCETHTOOL` with this buffer as the answer.
    fn ioctl(&mut self, socket: &Socket, ifname: &str, command: &'static str) -> io::Result<()> {
        // SAFETY: the buffer is writable for `usable` bytes and ends at the guard page, so the
        // kernel can write nothing but this mapping (a longer answer faults with EFAULT);
        // callers put the command in its first four bytes.
        unsafe { socket.ioctl(ifname, command, self.ptr.cast()) }
    }
}

impl Drop for GuardedBuf {
    fn drop(&mut self) {
        // SAFETY: `ptr` and `mapped` are the mapping made in `new`, unmapped only here.
        unsafe { libc::munmap(self.ptr.cast(), self.mapped) };
    }
}

fn put_u32(buf: &mut [u8], at: usize, v: u32) {
    if let Some(dst) = buf.get_mut(at..at + 4) {
        dst.copy_from_slice(&v.to_ne_bytes());
    }
}

fn get_u32(buf: &[u8], at: usize) -> u32 {
    buf.get(at..at + 4)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u32::from_ne_bytes)
}

/// Bytes of `struct ethtool_gstrings`'s header (`cmd`, `string_set`, `len`).
const GSTRINGS_HEADER: usize = 12;
/// Bytes of `struct ethtool_stats`'s header (`cmd`, `n_stats`).
const GSTATS_HEADER: usize = 8;

/// An open reader of one interface's `ethtool -S` statistics: the names read once at
/// [`StatsReader::open`], then one `ETHTOOL_GSTATS` per [`StatsReader::read`] on the same
/// socket and buffer.
#[derive(Debug)]
pub struct StatsReader {
    ifname: String,
    socket: Socket,
    names: Vec<String>,
    buf: GuardedBuf,
}

impl StatsReader {
    /// Opens `ifname`: `ETHTOOL_GDRVINFO` for the count, `ETHTOOL_GSTRINGS` (`ETH_SS_STATS`)
    /// for the names (each up to its first NUL, at most [`ETH_GSTRING_LEN`] bytes; empty names
    /// are kept so positions match the values).
    ///
    /// # Errors
    /// The ioctl's error with the interface name in context (`EOPNOTSUPP`: the driver has no
    /// statistics, as `lo`); `InvalidData` for more than [`MAX_STATS`] statistics, or when the
    /// count changed between the two requests.
    pub fn open(ifname: &str) -> io::Result<StatsReader> {
        let socket = Socket::open(ifname)?;
        let n = socket.drvinfo(ifname)?.n_stats;
        if n > MAX_STATS {
            return Err(error(
                ifname,
                "ETHTOOL_GDRVINFO",
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{n} statistics, more than {MAX_STATS}"),
                ),
            ));
        }
        let count = n as usize;
        let mmap_error = |e| error(ifname, "mmap", e);
        // No request for an empty set: the kernel warns on one (`WARN_ON_ONCE` in
        // `ethtool_get_strings`).
        let names = if count == 0 {
            Vec::new()
        } else {
            let mut strings =
                GuardedBuf::new(GSTRINGS_HEADER + count * ETH_GSTRING_LEN).map_err(mmap_error)?;
            let b = strings.bytes_mut();
            put_u32(b, 0, ETHTOOL_GSTRINGS);
            put_u32(b, 4, ETH_SS_STATS);
            put_u32(b, 8, n);
            strings.ioctl(&socket, ifname, "ETHTOOL_GSTRINGS")?;
            let b = strings.bytes();
            let got = get_u32(b, 8);
            if got != n {
                return Err(changed(ifname, "ETHTOOL_GSTRINGS", n, got));
            }
            b.get(GSTRINGS_HEADER..GSTRINGS_HEADER + count * ETH_GSTRING_LEN)
                .unwrap_or_default()
                .chunks_exact(ETH_GSTRING_LEN)
                .map(c_text)
                .collect()
        };
        let buf = GuardedBuf::new(GSTATS_HEADER + count * 8).map_err(mmap_error)?;
        Ok(StatsReader {
            ifname: ifname.to_owned(),
            socket,
            names,
            buf,
        })
    }

    /// The interface name.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// The statistics' names, in the driver's order (`ethtool -S`'s order).
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// One `ETHTOOL_GSTATS`: `values` is cleared and filled with one value per
    /// [`StatsReader::names`] entry, in that order (the driver's units, mostly packets,
    /// bytes or events).
    ///
    /// # Errors
    /// The ioctl's error with the interface name in context; `InvalidData` when the driver's
    /// count is no longer the count of the names (reopen to read the new names). `values` is
    /// left empty on error.
    pub fn read(&mut self, values: &mut Vec<u64>) -> io::Result<()> {
        values.clear();
        if self.names.is_empty() {
            // The kernel warns on an ETHTOOL_GSTATS of no statistics (`WARN_ON_ONCE` in
            // `ethtool_get_stats`): only check that there are still none.
            let now = self.socket.drvinfo(&self.ifname)?.n_stats;
            return match now {
                0 => Ok(()),
                _ => Err(changed(&self.ifname, "ETHTOOL_GDRVINFO", 0, now)),
            };
        }
        let n = u32::try_from(self.names.len()).unwrap_or(u32::MAX);
        let b = self.buf.bytes_mut();
        put_u32(b, 0, ETHTOOL_GSTATS);
        put_u32(b, 4, n);
        self.buf
            .ioctl(&self.socket, &self.ifname, "ETHTOOL_GSTATS")?;
        let b = self.buf.bytes();
        let got = get_u32(b, 4);
        if got != n {
            return Err(changed(&self.ifname, "ETHTOOL_GSTATS", n, got));
        }
        let data = b
            .get(GSTATS_HEADER..GSTATS_HEADER + self.names.len() * 8)
            .unwrap_or_default();
        values.extend(data.chunks_exact(8).map(|c| {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            u64::from_ne_bytes(w)
        }));
        Ok(())
    }
}

fn changed(ifname: &str, command: &'static str, want: u32, got: u32) -> io::Error {
    error(
        ifname,
        command,
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("statistics count changed from {want} to {got}"),
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_names_are_invalid_input_not_a_crash() {
        for name in ["", "a-name-of-16-byt", "nul\0in"] {
            let e = driver_info(name).expect_err(name);
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{name:?}: {e}");
            assert!(StatsReader::open(name).is_err());
        }
    }

    #[test]
    fn loopback_has_no_driver_info_or_statistics() {
        let e = driver_info("lo").expect_err("lo has no get_drvinfo");
        assert!(is_unsupported(&e), "{e}");
        assert!(e.to_string().contains("lo: ETHTOOL_GDRVINFO"), "{e}");
        let e = StatsReader::open("lo").expect_err("lo has no statistics");
        assert!(is_unsupported(&e), "{e}");
        let e = link_settings("lo").expect_err("lo has no link settings");
        assert!(is_unsupported(&e), "{e}");
    }

    #[test]
    fn a_missing_interface_is_enodev() {
        let e = StatsReader::open("uctelnone0").expect_err("no such interface");
        assert_eq!(os_error(&e), Some(libc::ENODEV), "{e}");
        assert!(e.to_string().starts_with("uctelnone0: "), "{e}");
    }

    /// Every interface of the machine that has statistics: the names and values line up and
    /// agree with `ETHTOOL_GDRVINFO`'s count.
    #[test]
    fn the_machines_interfaces_read_repeatedly() {
        let mut read_any = false;
        for entry in std::fs::read_dir("/sys/class/net").expect("/sys/class/net") {
            let name = entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned();
            let Ok(mut reader) = StatsReader::open(&name) else {
                continue;
            };
            let info = driver_info(&name).expect("driver info of an interface with stats");
            assert_eq!(reader.names().len(), info.n_stats as usize, "{name}");
            assert!(!info.driver.is_empty(), "{name}: {info:?}");
            let mut values = vec![7];
            for _ in 0..3 {
                reader.read(&mut values).expect("read");
                assert_eq!(values.len(), reader.names().len(), "{name}");
            }
            read_any = true;
        }
        // Containers without any ethtool-capable interface have nothing to check.
        if !read_any {
            eprintln!("no interface with ethtool statistics here");
        }
    }

    #[test]
    fn the_guarded_buffer_is_page_rounded_and_zeroed() {
        let buf = GuardedBuf::new(13).expect("mmap");
        assert!(buf.bytes().len() >= 13);
        assert!(buf.bytes().iter().all(|&b| b == 0));
    }

    #[test]
    fn the_kernel_stops_at_the_guard_page() {
        let buf = GuardedBuf::new(16).expect("mmap");
        let len = buf.bytes().len();
        let zero = std::fs::File::open("/dev/zero").expect("/dev/zero");
        // SAFETY: the kernel is asked to write a page more than the buffer holds, into the
        // guard page: it must stop there (a short read or EFAULT), which is what the ioctls
        // rely on.
        let n = unsafe { libc::read(zero.as_raw_fd(), buf.ptr.cast(), len + 4096) };
        assert!(n <= len as isize, "wrote {n} bytes into {len}");
    }

    #[test]
    fn names_stop_at_the_first_nul_or_take_all_32_bytes() {
        assert_eq!(c_text(b"rx_bytes\0\0junk"), "rx_bytes");
        assert_eq!(c_text(&[b'a'; 32]), "a".repeat(32));
        assert_eq!(c_text(b"\0x"), "");
    }
}
