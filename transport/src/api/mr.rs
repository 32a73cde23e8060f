//! [`MemoryRegion`] (`struct ibv_mr`) and its backend trait [`MrOps`].

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use super::error::MemoryAccessError;
use super::types::AccessFlags;

/// A registered memory region (`struct ibv_mr`) that owns its bytes. Cheap to clone (shared).
///
/// The transport (the "NIC") may write into the region at any time while the owner reads it;
/// [`MemoryRegion::read_at`] returns a snapshot of the bytes. Use RDMA WRITE_WITH_IMM so that
/// the receive completion tells when a slot is complete, and check the frame's own sequence and
/// CRC (DESIGN.md §4).
#[derive(Clone, Debug)]
pub struct MemoryRegion {
    inner: Arc<dyn MrOps>,
}

impl MemoryRegion {
    /// Wraps a transport's MR implementation.
    pub fn from_backend(inner: Arc<dyn MrOps>) -> Self {
        Self { inner }
    }

    /// The backend object (for transport implementations).
    pub fn backend(&self) -> &Arc<dyn MrOps> {
        &self.inner
    }

    /// Virtual address of byte 0, as the remote side puts it in RETH.
    pub fn addr(&self) -> u64 {
        self.inner.addr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner.length()
    }

    /// Whether the region is empty (never true for a registered region).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Local key, used by [`Sge`](super::Sge) (implicitly through the handle).
    pub fn lkey(&self) -> u32 {
        self.inner.lkey()
    }

    /// Remote key the peer puts in RETH. Meaningful only with [`AccessFlags::REMOTE_WRITE`].
    pub fn rkey(&self) -> u32 {
        self.inner.rkey()
    }

    /// Access flags the region was registered with.
    pub fn access(&self) -> AccessFlags {
        self.inner.access()
    }

    /// Copies `out.len()` bytes starting at `offset` into `out`.
    ///
    /// # Errors
    /// [`MemoryAccessError`] when `offset + out.len()` exceeds the region.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<(), MemoryAccessError> {
        self.inner.read_at(offset, out)
    }

    /// Copies `data` into the region starting at `offset`.
    ///
    /// # Errors
    /// [`MemoryAccessError`] when `offset + data.len()` exceeds the region.
    pub fn write_at(&self, offset: usize, data: &[u8]) -> Result<(), MemoryAccessError> {
        self.inner.write_at(offset, data)
    }
}

/// A registered memory region. See [`MemoryRegion`].
pub trait MrOps: Send + Sync + fmt::Debug {
    /// See [`MemoryRegion::addr`].
    fn addr(&self) -> u64;
    /// See [`MemoryRegion::len`].
    fn length(&self) -> usize;
    /// See [`MemoryRegion::lkey`].
    fn lkey(&self) -> u32;
    /// See [`MemoryRegion::rkey`].
    fn rkey(&self) -> u32;
    /// See [`MemoryRegion::access`].
    fn access(&self) -> AccessFlags;
    /// See [`MemoryRegion::read_at`].
    fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<(), MemoryAccessError>;
    /// See [`MemoryRegion::write_at`].
    fn write_at(&self, offset: usize, data: &[u8]) -> Result<(), MemoryAccessError>;
    /// For the owning transport to recover its concrete type.
    fn as_any(&self) -> &dyn Any;
}
