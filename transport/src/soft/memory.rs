//! Soft memory regions: owned byte buffers behind a lock, and the key table the UC engine
//! resolves lkeys and rkeys through.
//!
//! Keys follow rxe's layout (`rxe_mr.c`): bits 31..8 are the table index (starting at 1, so key
//! 0 never resolves), bits 7..0 a per-registration variant, so a stale key of a deregistered
//! region does not resolve to a new region in the same slot. Unlike rxe, the rkey equals the
//! lkey for every region; remote access is then checked against the region's access flags
//! (`access_denied`) rather than reported as an unknown key. The soft device has one key space;
//! protection domains do not separate keys.
//!
//! Virtual addresses (what the peer puts in RETH) are assigned from a per-table counter,
//! page-aligned with a guard page between regions, and never reused.

use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::api::{AccessFlags, MemoryAccessError, RegMrError, UcDropReason};

/// Largest soft MR: 2^32 − 1 bytes (RETH DMA lengths are 32 bits).
pub const MAX_MR_LEN: usize = u32::MAX as usize;

/// Largest number of live regions per table (24-bit key index, as rxe).
pub const MAX_MRS: usize = (1 << 24) - 1;

/// First virtual address handed out.
const VA_BASE: u64 = 0x0000_7000_0000_0000;
const PAGE: u64 = 4096;

/// One registered soft region.
pub struct SoftMr {
    key: u32,
    addr: u64,
    len: usize,
    access: AccessFlags,
    bytes: Mutex<Box<[u8]>>,
}

impl fmt::Debug for SoftMr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SoftMr")
            .field("key", &format_args!("{:#x}", self.key))
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("access", &self.access)
            .finish()
    }
}

impl SoftMr {
    /// lkey (= rkey).
    pub fn key(&self) -> u32 {
        self.key
    }

    /// Virtual address of byte 0.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty (never, for a registered region).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Access flags.
    pub fn access(&self) -> AccessFlags {
        self.access
    }

    fn lock(&self) -> MutexGuard<'_, Box<[u8]>> {
        // A panic while holding the lock cannot leave the bytes inconsistent in a way that
        // matters (they are plain bytes), so a poisoned lock is used as is.
        self.bytes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn range(
        &self,
        offset: usize,
        len: usize,
    ) -> Result<std::ops::Range<usize>, MemoryAccessError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(offset..end),
            _ => Err(MemoryAccessError {
                lkey: self.key,
                offset,
                len,
                mr_len: self.len,
            }),
        }
    }

    /// Copies bytes at `offset` into `out`.
    ///
    /// # Errors
    /// Out of bounds.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<(), MemoryAccessError> {
        let r = self.range(offset, out.len())?;
        let g = self.lock();
        match g.get(r) {
            Some(src) => {
                out.copy_from_slice(src);
                Ok(())
            }
            None => Err(MemoryAccessError {
                lkey: self.key,
                offset,
                len: out.len(),
                mr_len: self.len,
            }),
        }
    }

    /// Copies `data` to `offset`.
    ///
    /// # Errors
    /// Out of bounds.
    pub fn write_at(&self, offset: usize, data: &[u8]) -> Result<(), MemoryAccessError> {
        self.copy_in(offset, data, false)
    }

    /// Copies `data` to `offset` as an RDMA WRITE places it, then asks the CPU to fetch the
    /// `data.len()` bytes after it for writing: writes into a ring arrive in order, so the
    /// next one into this region most likely lands there, and its stores then find their
    /// lines in cache. Without the hint a ring larger than the cache costs a store miss per
    /// line of every write, which the lock release right after the copy waits for (about a
    /// ninth of the collector's CPU at 10 rings of 1 MiB, BENCHMARKS.md).
    ///
    /// # Errors
    /// Out of bounds.
    pub fn place(&self, offset: usize, data: &[u8]) -> Result<(), MemoryAccessError> {
        self.copy_in(offset, data, true)
    }

    fn copy_in(
        &self,
        offset: usize,
        data: &[u8],
        prefetch_next: bool,
    ) -> Result<(), MemoryAccessError> {
        let r = self.range(offset, data.len())?;
        let end = r.end;
        let mut g = self.lock();
        match g.get_mut(r) {
            Some(dst) => {
                dst.copy_from_slice(data);
                if prefetch_next {
                    let next = end.saturating_add(data.len()).min(g.len());
                    if let Some(ahead) = g.get(end..next) {
                        crate::prefetch::for_write(ahead);
                    }
                }
                Ok(())
            }
            None => Err(MemoryAccessError {
                lkey: self.key,
                offset,
                len: data.len(),
                mr_len: self.len,
            }),
        }
    }
}

/// Why a local (lkey) access failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalAccessError {
    /// No live region has this lkey.
    NoSuchKey,
    /// The range is outside the region.
    OutOfBounds,
    /// The region lacks LOCAL_WRITE.
    NoLocalWrite,
}

/// The memory the UC engine reads (requester gather) and writes (responder scatter and RDMA
/// WRITE placement) through. Implemented by [`MrTable`]; tests may provide their own.
pub trait MemoryTable {
    /// Copies `out.len()` bytes at `offset` of the region `lkey` into `out` (send gather).
    ///
    /// # Errors
    /// [`LocalAccessError`].
    fn gather(&self, lkey: u32, offset: usize, out: &mut [u8]) -> Result<(), LocalAccessError>;

    /// Copies `data` to `offset` of the region `lkey`, which needs LOCAL_WRITE (SEND scatter
    /// into a receive buffer).
    ///
    /// # Errors
    /// [`LocalAccessError`].
    fn scatter(&self, lkey: u32, offset: usize, data: &[u8]) -> Result<(), LocalAccessError>;

    /// Checks that `len` bytes at virtual address `va` may be written remotely under `rkey`
    /// (rxe `check_rkey`: key lookup, REMOTE_WRITE access, `mr_check_range`).
    ///
    /// # Errors
    /// [`UcDropReason::BadRkey`], [`UcDropReason::AccessDenied`] or
    /// [`UcDropReason::OutOfBounds`].
    fn check_remote_write(&self, rkey: u32, va: u64, len: u64) -> Result<(), UcDropReason>;

    /// Writes `data` at virtual address `va` under `rkey` (RDMA WRITE placement), with the same
    /// checks as [`MemoryTable::check_remote_write`].
    ///
    /// # Errors
    /// As [`MemoryTable::check_remote_write`].
    fn remote_write(&self, rkey: u32, va: u64, data: &[u8]) -> Result<(), UcDropReason>;
}

/// The key table of one soft device.
#[derive(Debug)]
pub struct MrTable {
    slots: RwLock<Vec<Option<Arc<SoftMr>>>>,
    variant: AtomicU32,
    next_va: Mutex<u64>,
}

impl Default for MrTable {
    fn default() -> Self {
        Self::new()
    }
}

impl MrTable {
    /// An empty table.
    pub fn new() -> Self {
        Self {
            // Slot 0 stays empty so that key 0 never resolves.
            slots: RwLock::new(vec![None]),
            variant: AtomicU32::new(0x5a),
            next_va: Mutex::new(VA_BASE),
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, Vec<Option<Arc<SoftMr>>>> {
        self.slots.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, Vec<Option<Arc<SoftMr>>>> {
        self.slots.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Allocates `len` zeroed bytes and registers them with `access`.
    ///
    /// # Errors
    /// [`RegMrError::InvalidLength`], [`RegMrError::InvalidAccess`] (REMOTE_WRITE without
    /// LOCAL_WRITE), [`RegMrError::TooMany`].
    pub fn register(&self, len: usize, access: AccessFlags) -> Result<Arc<SoftMr>, RegMrError> {
        if len == 0 || len > MAX_MR_LEN {
            return Err(RegMrError::InvalidLength {
                len,
                max: MAX_MR_LEN,
            });
        }
        if access.contains(AccessFlags::REMOTE_WRITE) && !access.contains(AccessFlags::LOCAL_WRITE)
        {
            return Err(RegMrError::InvalidAccess { access });
        }
        let addr = {
            let mut next = self.next_va.lock().unwrap_or_else(PoisonError::into_inner);
            let addr = *next;
            let pages = (len as u64).div_ceil(PAGE).saturating_add(1);
            *next = next.saturating_add(pages.saturating_mul(PAGE));
            addr
        };
        let variant = self.variant.fetch_add(0x3b, Ordering::Relaxed) & 0xff;
        let mut slots = self.write();
        let index = match slots.iter().skip(1).position(Option::is_none) {
            Some(i) => i + 1,
            None => {
                if slots.len() > MAX_MRS {
                    return Err(RegMrError::TooMany { max: MAX_MRS });
                }
                slots.push(None);
                slots.len() - 1
            }
        };
        let key = ((index as u32) << 8) | variant;
        let mr = Arc::new(SoftMr {
            key,
            addr,
            len,
            access,
            bytes: Mutex::new(vec![0u8; len].into_boxed_slice()),
        });
        if let Some(slot) = slots.get_mut(index) {
            *slot = Some(Arc::clone(&mr));
        }
        Ok(mr)
    }

    /// Removes the region with `key`; later lookups of the key fail. Returns whether it existed.
    pub fn deregister(&self, key: u32) -> bool {
        let mut slots = self.write();
        match slots.get_mut((key >> 8) as usize) {
            Some(slot) if slot.as_ref().is_some_and(|m| m.key == key) => {
                *slot = None;
                true
            }
            _ => false,
        }
    }

    /// The live region with `key`.
    pub fn lookup(&self, key: u32) -> Option<Arc<SoftMr>> {
        let slots = self.read();
        slots
            .get((key >> 8) as usize)
            .and_then(|s| s.as_ref())
            .filter(|m| m.key == key)
            .cloned()
    }

    /// Number of live regions.
    pub fn live(&self) -> usize {
        self.read().iter().filter(|s| s.is_some()).count()
    }

    fn with_key<T>(&self, key: u32, f: impl FnOnce(&SoftMr) -> T) -> Option<T> {
        let slots = self.read();
        slots
            .get((key >> 8) as usize)
            .and_then(|s| s.as_deref())
            .filter(|m| m.key == key)
            .map(f)
    }

    fn remote_offset(mr: &SoftMr, va: u64, len: u64) -> Result<usize, UcDropReason> {
        if !mr.access.contains(AccessFlags::REMOTE_WRITE) {
            return Err(UcDropReason::AccessDenied);
        }
        let start = va.checked_sub(mr.addr).ok_or(UcDropReason::OutOfBounds)?;
        let end = start.checked_add(len).ok_or(UcDropReason::OutOfBounds)?;
        if end > mr.len as u64 {
            return Err(UcDropReason::OutOfBounds);
        }
        usize::try_from(start).map_err(|_| UcDropReason::OutOfBounds)
    }
}

impl MemoryTable for MrTable {
    fn gather(&self, lkey: u32, offset: usize, out: &mut [u8]) -> Result<(), LocalAccessError> {
        self.with_key(lkey, |mr| {
            mr.read_at(offset, out)
                .map_err(|_| LocalAccessError::OutOfBounds)
        })
        .unwrap_or(Err(LocalAccessError::NoSuchKey))
    }

    fn scatter(&self, lkey: u32, offset: usize, data: &[u8]) -> Result<(), LocalAccessError> {
        self.with_key(lkey, |mr| {
            if !mr.access.contains(AccessFlags::LOCAL_WRITE) {
                return Err(LocalAccessError::NoLocalWrite);
            }
            mr.write_at(offset, data)
                .map_err(|_| LocalAccessError::OutOfBounds)
        })
        .unwrap_or(Err(LocalAccessError::NoSuchKey))
    }

    fn check_remote_write(&self, rkey: u32, va: u64, len: u64) -> Result<(), UcDropReason> {
        self.with_key(rkey, |mr| Self::remote_offset(mr, va, len).map(|_| ()))
            .unwrap_or(Err(UcDropReason::BadRkey))
    }

    fn remote_write(&self, rkey: u32, va: u64, data: &[u8]) -> Result<(), UcDropReason> {
        self.with_key(rkey, |mr| {
            let off = Self::remote_offset(mr, va, data.len() as u64)?;
            mr.place(off, data).map_err(|_| UcDropReason::OutOfBounds)
        })
        .unwrap_or(Err(UcDropReason::BadRkey))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RW: AccessFlags = AccessFlags::LOCAL_WRITE;

    #[test]
    fn keys_resolve_until_deregistered() {
        let t = MrTable::new();
        let a = t.register(100, RW).unwrap();
        let b = t.register(100, RW | AccessFlags::REMOTE_WRITE).unwrap();
        assert_ne!(a.key(), b.key());
        assert_ne!(a.key() >> 8, 0);
        assert!(b.addr() >= a.addr() + 4096, "regions are apart");
        assert_eq!(t.lookup(a.key()).unwrap().key(), a.key());
        assert!(t.deregister(a.key()));
        assert!(t.lookup(a.key()).is_none());
        assert!(!t.deregister(a.key()));
        // The slot is reused with another variant: the stale key stays dead.
        let c = t.register(10, RW).unwrap();
        assert_eq!(c.key() >> 8, a.key() >> 8);
        assert_ne!(c.key(), a.key());
        assert!(t.lookup(a.key()).is_none());
        assert_eq!(t.live(), 2);
    }

    #[test]
    fn register_checks_length_and_access() {
        let t = MrTable::new();
        assert!(matches!(
            t.register(0, RW),
            Err(RegMrError::InvalidLength { .. })
        ));
        assert!(matches!(
            t.register(8, AccessFlags::REMOTE_WRITE),
            Err(RegMrError::InvalidAccess { .. })
        ));
    }

    #[test]
    fn remote_write_checks_key_access_and_bounds() {
        let t = MrTable::new();
        let local = t.register(64, RW).unwrap();
        let ring = t.register(64, RW | AccessFlags::REMOTE_WRITE).unwrap();
        let va = ring.addr();
        assert_eq!(t.remote_write(ring.key(), va + 60, &[1, 2, 3, 4]), Ok(()));
        let mut out = [0u8; 4];
        ring.read_at(60, &mut out).unwrap();
        assert_eq!(out, [1, 2, 3, 4]);
        assert_eq!(
            t.remote_write(ring.key(), va + 61, &[0; 4]),
            Err(UcDropReason::OutOfBounds)
        );
        assert_eq!(
            t.remote_write(ring.key(), va - 1, &[0; 1]),
            Err(UcDropReason::OutOfBounds)
        );
        assert_eq!(
            t.check_remote_write(ring.key(), u64::MAX, 2),
            Err(UcDropReason::OutOfBounds)
        );
        assert_eq!(
            t.remote_write(ring.key() ^ 1, va, &[0; 1]),
            Err(UcDropReason::BadRkey)
        );
        assert_eq!(t.remote_write(0, va, &[0; 1]), Err(UcDropReason::BadRkey));
        assert_eq!(
            t.remote_write(local.key(), local.addr(), &[0; 1]),
            Err(UcDropReason::AccessDenied)
        );
    }

    #[test]
    fn placing_writes_exactly_the_bytes_given_up_to_the_end_of_the_region() {
        let mr = MrTable::new().register(100, RW).unwrap();
        // A slot in the middle (the hint covers the next 40 bytes), one whose next slot
        // runs past the end (the hint is cut at the end), and one at the very end.
        for (offset, len) in [(20usize, 40usize), (50, 40), (90, 10)] {
            let data: Vec<u8> = (0..len).map(|i| (offset + i) as u8 | 0x80).collect();
            mr.place(offset, &data).unwrap();
        }
        let mut all = [0u8; 100];
        mr.read_at(0, &mut all).unwrap();
        for (i, b) in all.iter().enumerate() {
            let want = if i < 20 { 0 } else { i as u8 | 0x80 };
            assert_eq!(*b, want, "byte {i}");
        }
        assert!(mr.place(95, &[0; 6]).is_err(), "out of bounds, as write_at");
    }

    #[test]
    fn local_access_checks() {
        let t = MrTable::new();
        let ro = t.register(8, AccessFlags::NONE).unwrap();
        let rw = t.register(8, RW).unwrap();
        assert_eq!(
            t.scatter(ro.key(), 0, &[1]),
            Err(LocalAccessError::NoLocalWrite)
        );
        assert_eq!(
            t.scatter(rw.key(), 7, &[1, 2]),
            Err(LocalAccessError::OutOfBounds)
        );
        assert_eq!(t.scatter(rw.key(), 6, &[1, 2]), Ok(()));
        let mut out = [0u8; 2];
        assert_eq!(t.gather(rw.key(), 6, &mut out), Ok(()));
        assert_eq!(out, [1, 2]);
        assert_eq!(
            t.gather(12345, 0, &mut out),
            Err(LocalAccessError::NoSuchKey)
        );
        assert!(rw.read_at(usize::MAX, &mut out).is_err());
    }
}
